//! What the API server silently drops from ResourceSlices and ResourceClaims before
//! validation (`dropDisabledFields` in `pkg/registry/resource/*/strategy.go`): fields the
//! release's API does not have, and fields of disabled feature gates. Also reports which
//! gated fields a stored object lost, so the publisher can say what the server dropped.
//! Pure functions.
//!
//! On update Go keeps a gated field when the old object already used the gate ("in
//! use"); the `_on_update` variants do that. Confirmed against the 1.37-cycle
//! `resourceslice/strategy.go`; there `partitionTypeAttribute` was still gated by
//! DRAResourcePoolStatus, while the 1.37 API docs name DRAPartitionableDevicesType,
//! which is used here. The claim side is inferred from the 1.33 claim strategy plus
//! the gate notes of the v1 types (tolerations, capacity requests, share IDs,
//! binding conditions, derived attributes, skipNodeOperations).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceClaim, ResourceSlice};

use super::field::FieldPath;
use crate::release::FeatureGates;

const PARTITIONABLE: &str = "DRAPartitionableDevices";
const TAINTS: &str = "DRADeviceTaints";
const BINDING: &str = "DRADeviceBindingConditions";
const DEVICE_STATUS: &str = "DRAResourceClaimDeviceStatus";
const CONSUMABLE: &str = "DRAConsumableCapacity";
const LISTS: &str = "DRAListTypeAttributes";
const PARTITION_TYPE: &str = "DRAPartitionableDevicesType";
const SKIP_OPS: &str = "DRAOptionalNodeOperations";
const COMPAT_GROUPS: &str = "DRADeviceCompatibilityGroups";
const NODE_ALLOCATABLE: &str = "DRANodeAllocatableResources";
const PRIORITIZED_LIST: &str = "DRAPrioritizedList";
const ADMIN_ACCESS: &str = "DRAAdminAccess";
const DERIVED_ATTRIBUTES: &str = "DRADerivedAttributes";

/// A gated field a stored object lost, with the gate that guards it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedField {
    /// Kubernetes field path in the object that was sent (`spec.devices[0].taints`).
    pub path: String,
    /// The feature gate guarding the field.
    pub gate: &'static str,
}

/// Which gated slice features an object uses.
#[derive(Debug, Default, Clone, Copy)]
struct SliceFeatures {
    partitionable: bool,
    taints: bool,
    binding: bool,
    consumable: bool,
    lists: bool,
    node_allocatable: bool,
    partition_type: bool,
    skip_ops: bool,
    compat_groups: bool,
}

fn non_empty<T>(v: &Option<Vec<T>>) -> bool {
    v.as_ref().is_some_and(|v| !v.is_empty())
}

fn slice_features(slice: &ResourceSlice) -> SliceFeatures {
    let spec = &slice.spec;
    let mut f = SliceFeatures {
        partitionable: non_empty(&spec.shared_counters) || spec.per_device_node_selection.is_some(),
        partition_type: spec.partition_type_attribute.is_some(),
        skip_ops: non_empty(&spec.skip_node_operations),
        ..SliceFeatures::default()
    };
    for d in spec.devices.iter().flatten() {
        f.partitionable |= non_empty(&d.consumes_counters)
            || d.node_name.is_some()
            || d.node_selector.is_some()
            || d.all_nodes.is_some();
        f.taints |= non_empty(&d.taints);
        f.binding |= non_empty(&d.binding_conditions)
            || non_empty(&d.binding_failure_conditions)
            || d.binds_to_node.is_some();
        f.consumable |= d.allow_multiple_allocations.is_some()
            || d.capacity
                .iter()
                .flatten()
                .any(|(_, c)| c.request_policy.is_some());
        f.lists |= d.attributes.iter().flatten().any(|(_, a)| has_list(a));
        f.node_allocatable |= d
            .node_allocatable_resources
            .as_ref()
            .is_some_and(|m| !m.is_empty());
        f.compat_groups |= d
            .consumes_counters
            .iter()
            .flatten()
            .any(|c| non_empty(&c.compatibility_groups));
    }
    f
}

/// The feature gates whose fields `slice` sets, each once, in a fixed order. On create
/// the API server drops a gate's fields from every object or from none, so one dry run
/// of a slice per gate tells what it keeps of a whole pool.
pub fn gates_used(slice: &ResourceSlice) -> Vec<&'static str> {
    let f = slice_features(slice);
    [
        (f.partitionable, PARTITIONABLE),
        (f.taints, TAINTS),
        (f.binding, BINDING),
        (f.consumable, CONSUMABLE),
        (f.lists, LISTS),
        (f.node_allocatable, NODE_ALLOCATABLE),
        (f.partition_type, PARTITION_TYPE),
        (f.skip_ops, SKIP_OPS),
        (f.compat_groups, COMPAT_GROUPS),
    ]
    .into_iter()
    .filter_map(|(used, gate)| used.then_some(gate))
    .collect()
}

fn has_list(a: &DeviceAttribute) -> bool {
    a.bools.is_some() || a.ints.is_some() || a.strings.is_some() || a.versions.is_some()
}

/// Which slice features survive: the release has the field and the gate is on (or the
/// old object used it).
fn slice_keep(gates: &FeatureGates, old: SliceFeatures) -> SliceFeatures {
    let m = gates.version().minor();
    let on = |gate: &str, used: bool| gates.enabled(gate) || used;
    SliceFeatures {
        partitionable: on(PARTITIONABLE, old.partitionable),
        taints: on(TAINTS, old.taints),
        binding: (gates.enabled(BINDING) && gates.enabled(DEVICE_STATUS)) || old.binding,
        consumable: on(CONSUMABLE, old.consumable),
        lists: m >= 36 && on(LISTS, old.lists),
        node_allocatable: m >= 37 && on(NODE_ALLOCATABLE, old.node_allocatable),
        partition_type: m >= 37 && on(PARTITION_TYPE, old.partition_type),
        skip_ops: m >= 37 && on(SKIP_OPS, old.skip_ops),
        compat_groups: m >= 37 && on(COMPAT_GROUPS, old.compat_groups),
    }
}

/// Drops from a ResourceSlice being created what the API server of `gates.version()`
/// with these gates drops: fields the release does not have and fields of disabled
/// gates. An attribute whose only value was a dropped list stays, empty, and then fails
/// validation as on the real server. Deterministic.
pub fn drop_disabled_fields(slice: &mut ResourceSlice, gates: &FeatureGates) {
    apply_slice_drops(slice, slice_keep(gates, SliceFeatures::default()));
}

/// Like [`drop_disabled_fields`] for an update: a gated field is kept when `old`
/// already used its gate. Deterministic.
pub fn drop_disabled_fields_on_update(
    slice: &mut ResourceSlice,
    old: &ResourceSlice,
    gates: &FeatureGates,
) {
    apply_slice_drops(slice, slice_keep(gates, slice_features(old)));
}

fn apply_slice_drops(slice: &mut ResourceSlice, keep: SliceFeatures) {
    let spec = &mut slice.spec;
    if !keep.partitionable {
        spec.shared_counters = None;
        spec.per_device_node_selection = None;
    }
    if !keep.partition_type {
        spec.partition_type_attribute = None;
    }
    if !keep.skip_ops {
        spec.skip_node_operations = None;
    }
    for d in spec.devices.iter_mut().flatten() {
        drop_device_fields(d, keep);
    }
}

fn drop_device_fields(d: &mut Device, keep: SliceFeatures) {
    if !keep.partitionable {
        d.consumes_counters = None;
        d.node_name = None;
        d.node_selector = None;
        d.all_nodes = None;
    }
    if !keep.compat_groups {
        for c in d.consumes_counters.iter_mut().flatten() {
            c.compatibility_groups = None;
        }
    }
    if !keep.taints {
        d.taints = None;
    }
    if !keep.binding {
        d.binds_to_node = None;
        d.binding_conditions = None;
        d.binding_failure_conditions = None;
    }
    if !keep.consumable {
        d.allow_multiple_allocations = None;
        for c in d.capacity.iter_mut().flat_map(|m| m.values_mut()) {
            c.request_policy = None;
        }
    }
    if !keep.lists {
        for a in d.attributes.iter_mut().flat_map(|m| m.values_mut()) {
            a.bools = None;
            a.ints = None;
            a.strings = None;
            a.versions = None;
        }
    }
    if !keep.node_allocatable {
        d.node_allocatable_resources = None;
    }
}

/// The gated fields set in `before` (what was sent) that are missing in `after` (what
/// the server stored), as Kubernetes paths in `before`. Devices are matched by name.
/// Deterministic.
pub fn dropped_fields(before: &ResourceSlice, after: &ResourceSlice) -> Vec<String> {
    dropped_fields_with_gates(before, after)
        .into_iter()
        .map(|d| d.path)
        .collect()
}

/// [`dropped_fields`] with the gate guarding each field. Deterministic.
pub fn dropped_fields_with_gates(
    before: &ResourceSlice,
    after: &ResourceSlice,
) -> Vec<DroppedField> {
    let mut out = Vec::new();
    let spec = FieldPath::new("spec");
    let (b, a) = (&before.spec, &after.spec);
    let mut lost = |present: bool, kept: bool, path: FieldPath, gate: &'static str| {
        if present && !kept {
            out.push(DroppedField {
                path: path.to_string(),
                gate,
            });
        }
    };
    lost(
        non_empty(&b.shared_counters),
        non_empty(&a.shared_counters),
        spec.child("sharedCounters"),
        PARTITIONABLE,
    );
    lost(
        b.per_device_node_selection.is_some(),
        a.per_device_node_selection.is_some(),
        spec.child("perDeviceNodeSelection"),
        PARTITIONABLE,
    );
    lost(
        b.partition_type_attribute.is_some(),
        a.partition_type_attribute.is_some(),
        spec.child("partitionTypeAttribute"),
        PARTITION_TYPE,
    );
    lost(
        non_empty(&b.skip_node_operations),
        non_empty(&a.skip_node_operations),
        spec.child("skipNodeOperations"),
        SKIP_OPS,
    );
    let after_devices: BTreeMap<&str, &Device> = a
        .devices
        .iter()
        .flatten()
        .map(|d| (d.name.as_str(), d))
        .collect();
    for (i, bd) in b.devices.iter().flatten().enumerate() {
        let Some(ad) = after_devices.get(bd.name.as_str()) else {
            continue;
        };
        let p = spec.child("devices").index(i);
        let had_counters = non_empty(&bd.consumes_counters);
        lost(
            had_counters,
            non_empty(&ad.consumes_counters),
            p.child("consumesCounters"),
            PARTITIONABLE,
        );
        lost(
            bd.node_name.is_some(),
            ad.node_name.is_some(),
            p.child("nodeName"),
            PARTITIONABLE,
        );
        lost(
            bd.node_selector.is_some(),
            ad.node_selector.is_some(),
            p.child("nodeSelector"),
            PARTITIONABLE,
        );
        lost(
            bd.all_nodes.is_some(),
            ad.all_nodes.is_some(),
            p.child("allNodes"),
            PARTITIONABLE,
        );
        if had_counters && non_empty(&ad.consumes_counters) {
            for (j, bc) in bd.consumes_counters.iter().flatten().enumerate() {
                let kept = ad
                    .consumes_counters
                    .iter()
                    .flatten()
                    .find(|c| c.counter_set == bc.counter_set)
                    .is_some_and(|c| non_empty(&c.compatibility_groups));
                lost(
                    non_empty(&bc.compatibility_groups),
                    kept,
                    p.child("consumesCounters")
                        .index(j)
                        .child("compatibilityGroups"),
                    COMPAT_GROUPS,
                );
            }
        }
        lost(
            non_empty(&bd.taints),
            non_empty(&ad.taints),
            p.child("taints"),
            TAINTS,
        );
        lost(
            bd.binds_to_node.is_some(),
            ad.binds_to_node.is_some(),
            p.child("bindsToNode"),
            BINDING,
        );
        lost(
            non_empty(&bd.binding_conditions),
            non_empty(&ad.binding_conditions),
            p.child("bindingConditions"),
            BINDING,
        );
        lost(
            non_empty(&bd.binding_failure_conditions),
            non_empty(&ad.binding_failure_conditions),
            p.child("bindingFailureConditions"),
            BINDING,
        );
        lost(
            bd.allow_multiple_allocations.is_some(),
            ad.allow_multiple_allocations.is_some(),
            p.child("allowMultipleAllocations"),
            CONSUMABLE,
        );
        for (key, cap) in bd.capacity.iter().flatten() {
            let kept = ad
                .capacity
                .as_ref()
                .and_then(|m| m.get(key))
                .is_some_and(|c| c.request_policy.is_some());
            lost(
                cap.request_policy.is_some(),
                kept,
                p.child("capacity").key(key).child("requestPolicy"),
                CONSUMABLE,
            );
        }
        for (key, attr) in bd.attributes.iter().flatten() {
            let other = ad.attributes.as_ref().and_then(|m| m.get(key));
            for (name, present, kept) in [
                (
                    "bools",
                    attr.bools.is_some(),
                    other.is_some_and(|o| o.bools.is_some()),
                ),
                (
                    "ints",
                    attr.ints.is_some(),
                    other.is_some_and(|o| o.ints.is_some()),
                ),
                (
                    "strings",
                    attr.strings.is_some(),
                    other.is_some_and(|o| o.strings.is_some()),
                ),
                (
                    "versions",
                    attr.versions.is_some(),
                    other.is_some_and(|o| o.versions.is_some()),
                ),
            ] {
                lost(
                    present,
                    kept,
                    p.child("attributes").key(key).child(name),
                    LISTS,
                );
            }
        }
        lost(
            bd.node_allocatable_resources
                .as_ref()
                .is_some_and(|m| !m.is_empty()),
            ad.node_allocatable_resources
                .as_ref()
                .is_some_and(|m| !m.is_empty()),
            p.child("nodeAllocatableResources"),
            NODE_ALLOCATABLE,
        );
    }
    out
}

/// Which gated claim features an object uses.
#[derive(Debug, Default, Clone, Copy)]
struct ClaimFeatures {
    prioritized_list: bool,
    admin_access: bool,
    taints: bool,
    consumable: bool,
    binding: bool,
    device_status: bool,
    derived_attributes: bool,
    skip_ops: bool,
}

fn claim_features(claim: &ResourceClaim) -> ClaimFeatures {
    let mut f = ClaimFeatures::default();
    let devices = claim.spec.as_ref().and_then(|s| s.devices.as_ref());
    for r in devices.iter().flat_map(|d| d.requests.iter().flatten()) {
        f.prioritized_list |= non_empty(&r.first_available);
        if let Some(e) = &r.exactly {
            f.admin_access |= e.admin_access.is_some();
            f.taints |= non_empty(&e.tolerations);
            f.consumable |= e.capacity.is_some();
            f.derived_attributes |= non_empty(&e.derived_attributes);
        }
        for s in r.first_available.iter().flatten() {
            f.taints |= non_empty(&s.tolerations);
            f.consumable |= s.capacity.is_some();
            f.derived_attributes |= non_empty(&s.derived_attributes);
        }
    }
    for c in devices.iter().flat_map(|d| d.constraints.iter().flatten()) {
        f.consumable |= c.distinct_attribute.is_some();
    }
    let status = claim.status.as_ref();
    let allocation = status.and_then(|s| s.allocation.as_ref());
    f.binding |= allocation.is_some_and(|a| a.allocation_timestamp.is_some());
    for r in allocation
        .iter()
        .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
    {
        f.admin_access |= r.admin_access.is_some();
        f.taints |= non_empty(&r.tolerations);
        f.consumable |= r.share_id.is_some() || r.consumed_capacity.is_some();
        f.binding |= non_empty(&r.binding_conditions) || non_empty(&r.binding_failure_conditions);
        f.skip_ops |= non_empty(&r.skip_node_operations);
    }
    f.device_status = status.is_some_and(|s| non_empty(&s.devices));
    f
}

fn claim_keep(gates: &FeatureGates, old: ClaimFeatures) -> ClaimFeatures {
    let m = gates.version().minor();
    let on = |gate: &str, used: bool| gates.enabled(gate) || used;
    ClaimFeatures {
        prioritized_list: on(PRIORITIZED_LIST, old.prioritized_list),
        admin_access: on(ADMIN_ACCESS, old.admin_access),
        taints: on(TAINTS, old.taints),
        consumable: on(CONSUMABLE, old.consumable),
        binding: (gates.enabled(BINDING) && gates.enabled(DEVICE_STATUS)) || old.binding,
        device_status: on(DEVICE_STATUS, old.device_status),
        derived_attributes: m >= 37 && on(DERIVED_ATTRIBUTES, old.derived_attributes),
        skip_ops: m >= 37 && on(SKIP_OPS, old.skip_ops),
    }
}

/// Drops from a ResourceClaim being created what the API server of `gates.version()`
/// drops: `firstAvailable` (DRAPrioritizedList), `adminAccess` (DRAAdminAccess),
/// tolerations (DRADeviceTaints), capacity requests, `distinctAttribute`, share IDs and
/// consumed capacity (DRAConsumableCapacity), binding conditions and the allocation
/// timestamp (DRADeviceBindingConditions), `status.devices`
/// (DRAResourceClaimDeviceStatus), and the 1.37-only `derivedAttributes` and
/// `skipNodeOperations`. Deterministic.
pub fn drop_disabled_claim_fields(claim: &mut ResourceClaim, gates: &FeatureGates) {
    apply_claim_drops(claim, claim_keep(gates, ClaimFeatures::default()));
}

/// Like [`drop_disabled_claim_fields`] for an update (spec or status): a gated field is
/// kept when `old` already used its gate. Deterministic.
pub fn drop_disabled_claim_fields_on_update(
    claim: &mut ResourceClaim,
    old: &ResourceClaim,
    gates: &FeatureGates,
) {
    apply_claim_drops(claim, claim_keep(gates, claim_features(old)));
}

fn apply_claim_drops(claim: &mut ResourceClaim, keep: ClaimFeatures) {
    if let Some(devices) = claim.spec.as_mut().and_then(|s| s.devices.as_mut()) {
        for r in devices.requests.iter_mut().flatten() {
            if !keep.prioritized_list {
                r.first_available = None;
            }
            if let Some(e) = r.exactly.as_mut() {
                if !keep.admin_access {
                    e.admin_access = None;
                }
                if !keep.taints {
                    e.tolerations = None;
                }
                if !keep.consumable {
                    e.capacity = None;
                }
                if !keep.derived_attributes {
                    e.derived_attributes = None;
                }
            }
            for s in r.first_available.iter_mut().flatten() {
                if !keep.taints {
                    s.tolerations = None;
                }
                if !keep.consumable {
                    s.capacity = None;
                }
                if !keep.derived_attributes {
                    s.derived_attributes = None;
                }
            }
        }
        if !keep.consumable {
            for c in devices.constraints.iter_mut().flatten() {
                c.distinct_attribute = None;
            }
        }
    }
    let Some(status) = claim.status.as_mut() else {
        return;
    };
    if !keep.device_status {
        status.devices = None;
    }
    if !keep.consumable {
        for d in status.devices.iter_mut().flatten() {
            d.share_id = None;
        }
    }
    let Some(allocation) = status.allocation.as_mut() else {
        return;
    };
    if !keep.binding {
        allocation.allocation_timestamp = None;
    }
    for r in allocation
        .devices
        .iter_mut()
        .flat_map(|d| d.results.iter_mut().flatten())
    {
        if !keep.admin_access {
            r.admin_access = None;
        }
        if !keep.taints {
            r.tolerations = None;
        }
        if !keep.consumable {
            r.share_id = None;
            r.consumed_capacity = None;
        }
        if !keep.binding {
            r.binding_conditions = None;
            r.binding_failure_conditions = None;
        }
        if !keep.skip_ops {
            r.skip_node_operations = None;
        }
    }
}
