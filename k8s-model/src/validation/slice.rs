//! ResourceSlice validation as the API server of each release (1.34–1.38) performs it
//! on create (`ValidateResourceSlice` in `pkg/apis/resource/validation/validation.go`),
//! and the per-release limits a publisher must respect when it splits a pool into
//! slices. Pure and deterministic.
//!
//! Confirmed against the Go sources of 1.35 and of the 1.37 cycle; 1.34 rules come from
//! the 1.33/1.34 validation tests and the KEP-4815 text, 1.36 is interpolated (the
//! list-attribute rules match the 1.37-cycle code). Not modelled: object-meta checks
//! beyond name/generateName, node-selector term contents, update ratcheting (validation
//! of unchanged capacities and taints is skipped on update in Go) and declarative-only
//! rules of 1.37 unless noted.

use k8s_openapi::api::resource::v1::{CounterSet, ResourceSlice, ResourceSliceSpec};

use super::device::{is_list_attribute, validate_counter_set, validate_device};
use super::field::{BadValue, FieldError, FieldPath, validate_unique_list};
use super::format::{
    validate_dns_subdomain, validate_driver_name, validate_fully_qualified_name,
    validate_node_selector, validate_object_name, validate_pool_name,
};
use crate::release::{FeatureGates, KubeVersion};

/// The size limits of one release (`pkg/apis/resource/types.go`). `None` = no such limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceLimits {
    /// Devices per slice (`ResourceSliceMaxDevices`).
    pub devices: usize,
    /// Devices per slice once any device has taints or consumes counters (1.35+) or uses
    /// list attributes (1.36+).
    pub devices_with_advanced_features: usize,
    /// Attributes plus capacities per device.
    pub attributes_and_capacities: usize,
    /// Attribute values per device, list items counted singly (1.36+).
    pub attribute_values: Option<usize>,
    /// Taints per device: 4 on 1.34, 16 later.
    pub taints_per_device: usize,
    /// Counter sets per slice (1.35+).
    pub counter_sets: Option<usize>,
    /// Counters per counter set (1.35+).
    pub counters_per_set: Option<usize>,
    /// Counters in all counter sets of a slice together (1.34 only).
    pub shared_counters_total: Option<usize>,
    /// `consumesCounters` entries per device (1.35+).
    pub consumptions_per_device: Option<usize>,
    /// Counters per `consumesCounters` entry (1.35+).
    pub counters_per_consumption: Option<usize>,
    /// Counters consumed by one device in all entries (1.34 only).
    pub counters_per_device: Option<usize>,
    /// Counters consumed by all devices of a slice (1.34 only).
    pub device_counters_per_slice: Option<usize>,
    /// `bindingConditions` and `bindingFailureConditions` entries, each.
    pub binding_conditions: usize,
    /// `compatibilityGroups` per `consumesCounters` entry (1.37+).
    pub compatibility_groups: Option<usize>,
    /// Whether `sharedCounters` and `devices` must live in different slices (1.35+).
    pub counters_in_own_slices: bool,
}

impl SliceLimits {
    /// The limits of a release. Deterministic.
    pub fn for_version(v: KubeVersion) -> Self {
        let m = v.minor();
        let new_counters = m >= 35;
        SliceLimits {
            devices: 128,
            devices_with_advanced_features: if new_counters { 64 } else { 128 },
            attributes_and_capacities: 32,
            attribute_values: (m >= 36).then_some(48),
            taints_per_device: if new_counters { 16 } else { 4 },
            counter_sets: new_counters.then_some(8),
            counters_per_set: new_counters.then_some(32),
            shared_counters_total: (!new_counters).then_some(32),
            consumptions_per_device: new_counters.then_some(2),
            counters_per_consumption: new_counters.then_some(32),
            counters_per_device: (!new_counters).then_some(32),
            device_counters_per_slice: (!new_counters).then_some(1024),
            binding_conditions: 4,
            compatibility_groups: (m >= 37).then_some(2),
            counters_in_own_slices: v.counters_in_own_slices(),
        }
    }

    /// The device limit that applies to `spec`: the lower one once a device has taints
    /// or consumes counters (1.35+) or has a list attribute (1.36+).
    pub fn max_devices(&self, spec: &ResourceSliceSpec, v: KubeVersion) -> usize {
        let devices = spec.devices.as_deref().unwrap_or(&[]);
        let advanced = devices.iter().any(|d| {
            let taints = d.taints.as_ref().is_some_and(|t| !t.is_empty());
            let consumes = d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty());
            let lists = v.minor() >= 36
                && d.attributes
                    .as_ref()
                    .is_some_and(|a| a.values().any(is_list_attribute));
            taints || consumes || lists
        });
        if advanced {
            self.devices_with_advanced_features
        } else {
            self.devices
        }
    }
}

/// What device-level checks need to know about the slice and release.
pub(super) struct SliceContext<'a> {
    pub version: KubeVersion,
    pub gates: &'a FeatureGates,
    pub limits: SliceLimits,
    pub per_device_node_selection: bool,
    /// 1.34: the slice's own counter sets, which `consumesCounters` must reference.
    pub same_slice_counters: Option<&'a [CounterSet]>,
}

const NODE_SELECTION_MSG: &str =
    "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required";

/// Validates a ResourceSlice for creation on the release `gates.version()` with these
/// gates, returning every violation in Go's order (map entries in key order). Assumes
/// fields of disabled gates were already dropped ([`super::drop_disabled_fields`]);
/// fields the release does not have are ignored. Pure and deterministic.
pub fn validate_resource_slice(slice: &ResourceSlice, gates: &FeatureGates) -> Vec<FieldError> {
    let v = gates.version();
    let limits = SliceLimits::for_version(v);
    let spec = &slice.spec;
    let path = FieldPath::new("spec");
    let mut errs = validate_object_name(&slice.metadata, &FieldPath::new("metadata"));
    errs.extend(validate_driver_name(&spec.driver, &path.child("driver")));
    errs.extend(validate_resource_pool(spec, &path.child("pool")));
    errs.extend(validate_node_selection(spec, &path));

    if limits.counters_in_own_slices && spec.shared_counters.is_some() && spec.devices.is_some() {
        errs.push(FieldError::invalid(
            &path,
            BadValue::str(""),
            "only one of `sharedCounters` or `devices` is allowed",
        ));
    }

    let shared = spec.shared_counters.as_deref().unwrap_or(&[]);
    let ctx = SliceContext {
        version: v,
        gates,
        limits,
        per_device_node_selection: spec.per_device_node_selection == Some(true),
        same_slice_counters: (!limits.counters_in_own_slices).then_some(shared),
    };
    let devices = spec.devices.as_deref().unwrap_or(&[]);
    let devices_path = path.child("devices");
    errs.extend(validate_unique_list(
        devices,
        Some(limits.max_devices(spec, v)),
        &devices_path,
        |d, p| validate_device(d, p, &ctx),
        |d| d.name.clone(),
        |k| BadValue::str(k),
    ));
    if let Some(max) = limits.device_counters_per_slice {
        let total: usize = devices
            .iter()
            .flat_map(|d| d.consumes_counters.iter().flatten())
            .map(|c| c.counters.len())
            .sum();
        if total > max {
            errs.push(FieldError::invalid(
                &devices_path,
                BadValue::from(total),
                format!("the total number of counters in devices must not exceed {max}"),
            ));
        }
    }

    let sc_path = path.child("sharedCounters");
    if let Some(max) = limits.shared_counters_total {
        let total: usize = shared.iter().map(|s| s.counters.len()).sum();
        if total > max {
            errs.push(FieldError::invalid(
                &sc_path,
                BadValue::from(total),
                format!("the total number of shared counters must not exceed {max}"),
            ));
        }
    }
    errs.extend(validate_unique_list(
        shared,
        limits.counter_sets,
        &sc_path,
        |s, p| validate_counter_set(s, p, &ctx),
        |s| s.name.clone(),
        |k| BadValue::str(k),
    ));

    if v.minor() >= 37 {
        if let Some(attr) = &spec.partition_type_attribute {
            errs.extend(validate_partition_type_attribute(spec, attr, &path, v));
        }
        errs.extend(validate_skip_node_operations(
            spec.skip_node_operations.as_deref(),
            &path.child("skipNodeOperations"),
        ));
    }
    errs
}

fn validate_resource_pool(spec: &ResourceSliceSpec, path: &FieldPath) -> Vec<FieldError> {
    let pool = &spec.pool;
    let mut errs = validate_pool_name(&pool.name, &path.child("name"));
    if pool.resource_slice_count <= 0 {
        errs.push(FieldError::invalid(
            path.child("resourceSliceCount"),
            BadValue::Int(pool.resource_slice_count),
            "must be greater than zero",
        ));
    }
    if pool.generation < 0 {
        errs.push(FieldError::invalid(
            path.child("generation"),
            BadValue::Int(pool.generation),
            "must be greater than or equal to zero",
        ));
    }
    errs
}

/// Exactly one of `nodeName`, `nodeSelector` (one term), `allNodes`, `perDeviceNodeSelection`.
fn validate_node_selection(spec: &ResourceSliceSpec, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut set = Vec::new();
    if let Some(name) = &spec.node_name {
        if name.is_empty() {
            errs.push(FieldError::invalid(
                path.child("nodeName"),
                BadValue::str(""),
                "must be either unset or set to a non-empty string",
            ));
        } else {
            set.push("`nodeName`");
            errs.extend(validate_dns_subdomain(name, &path.child("nodeName")));
        }
    }
    if let Some(sel) = &spec.node_selector {
        set.push("`nodeSelector`");
        let sel_path = path.child("nodeSelector");
        errs.extend(validate_node_selector(sel, &sel_path));
        if sel.node_selector_terms.len() != 1 {
            let shown = serde_json::to_string(&sel.node_selector_terms).unwrap_or_default();
            errs.push(FieldError::invalid(
                sel_path.child("nodeSelectorTerms"),
                BadValue::Raw(shown),
                "must have exactly one node selector term",
            ));
        }
    }
    for (field, value, name) in [
        ("allNodes", spec.all_nodes, "`allNodes`"),
        (
            "perDeviceNodeSelection",
            spec.per_device_node_selection,
            "`perDeviceNodeSelection`",
        ),
    ] {
        match value {
            Some(true) => set.push(name),
            Some(false) => errs.push(FieldError::invalid(
                path.child(field),
                BadValue::Bool(false),
                "must be either unset or set to true",
            )),
            None => {}
        }
    }
    match set.len() {
        0 => errs.push(FieldError::required(path, NODE_SELECTION_MSG)),
        1 => {}
        _ => errs.push(FieldError::invalid(
            path,
            BadValue::str(&format!("{{{}}}", set.join(", "))),
            format!("{NODE_SELECTION_MSG}, but multiple fields are set"),
        )),
    }
    errs
}

/// 1.37 `partitionTypeAttribute`: only on slices whose devices consume counters; each
/// such device must carry it (qualified or bare in the driver's domain) as a string.
/// The name format is declarative in Go and reported here directly.
fn validate_partition_type_attribute(
    spec: &ResourceSliceSpec,
    name: &str,
    path: &FieldPath,
    v: KubeVersion,
) -> Vec<FieldError> {
    let devices = spec.devices.as_deref().unwrap_or(&[]);
    let consumes = |d: &k8s_openapi::api::resource::v1::Device| {
        d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
    };
    let attr_path = path.child("partitionTypeAttribute");
    if !devices.iter().any(consumes) {
        return vec![FieldError::invalid(
            &attr_path,
            BadValue::str(name),
            "may only be set on a slice which declares devices that consume counters",
        )];
    }
    let name_errs = validate_fully_qualified_name(name, &attr_path, v);
    if !name_errs.is_empty() {
        return name_errs;
    }
    let bare = name
        .strip_prefix(&format!("{}/", spec.driver))
        .unwrap_or("");
    let mut errs = Vec::new();
    for (i, d) in devices.iter().enumerate().filter(|(_, d)| consumes(d)) {
        let at = path.child("devices").index(i).child("attributes").key(name);
        let attrs = d.attributes.as_ref();
        let found = attrs.and_then(|a| {
            a.get(name)
                .or_else(|| (!bare.is_empty()).then(|| a.get(bare)).flatten())
        });
        match found {
            None => errs.push(FieldError::required(
                &at,
                "device consumes counters and `partitionTypeAttribute` names this attribute, so it must be set",
            )),
            Some(a) if a.string.is_none() => errs.push(FieldError::invalid(
                &at,
                BadValue::Raw(serde_json::to_string(a).unwrap_or_default()),
                "must be a string value because `partitionTypeAttribute` names this attribute",
            )),
            Some(_) => {}
        }
    }
    errs
}

/// 1.37 `skipNodeOperations` (slices and allocation results): `NodePrepareResources`
/// only together with `NodeUnprepareResources` or `*`.
pub(crate) fn validate_skip_node_operations(
    ops: Option<&[String]>,
    path: &FieldPath,
) -> Vec<FieldError> {
    let ops = ops.unwrap_or(&[]);
    let has = |s: &str| ops.iter().any(|o| o == s);
    if has("NodePrepareResources") && !has("NodeUnprepareResources") && !has("*") {
        let quoted: Vec<String> = ops.iter().map(|o| super::field::go_quote(o)).collect();
        return vec![FieldError::invalid(
            path,
            BadValue::Raw(format!(
                "[]resource.SkipNodeOperation{{{}}}",
                quoted.join(", ")
            )),
            "NodePrepareResources cannot be skipped unless NodeUnprepareResources is also skipped",
        )];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limits table follows the release notes of KEP-4815 and the types.go constants.
    #[test]
    fn limits_follow_the_release_table() {
        let l34 = SliceLimits::for_version(KubeVersion::new(34).unwrap());
        let l35 = SliceLimits::for_version(KubeVersion::new(35).unwrap());
        let l37 = SliceLimits::for_version(KubeVersion::new(37).unwrap());
        assert_eq!(
            (l34.devices_with_advanced_features, l34.taints_per_device),
            (128, 4)
        );
        assert_eq!(l34.shared_counters_total, Some(32));
        assert_eq!(
            (l35.devices_with_advanced_features, l35.taints_per_device),
            (64, 16)
        );
        assert_eq!(
            (l35.counter_sets, l35.consumptions_per_device),
            (Some(8), Some(2))
        );
        assert!(l35.counters_in_own_slices && !l34.counters_in_own_slices);
        assert_eq!(
            (l35.attribute_values, l37.attribute_values),
            (None, Some(48))
        );
        assert_eq!(l37.compatibility_groups, Some(2));
    }
}
