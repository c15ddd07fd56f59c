//! Validation of one `Device` of a ResourceSlice (`validateDevice` and what it calls in
//! `pkg/apis/resource/validation/validation.go`): name, attribute and capacity counts,
//! attribute values, taints, counter consumption, per-device node selection, binding
//! conditions and (1.37) node-allocatable resources. Pure functions.
//!
//! Confirmed against the 1.35 and 1.37-cycle Go sources unless noted. 1.34-only rules
//! (per-device and same-slice counter references) come from the 1.33/1.34 test tables.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceAttribute, DeviceCounterConsumption, DeviceTaint,
    NodeAllocatableResource,
};

use super::capacity::validate_capacity;
use super::field::{BadValue, FieldError, FieldPath, validate_list, validate_unique_list};
use super::format::{
    DEVICE_MAX_DOMAIN_LENGTH, DEVICE_MAX_ID_LENGTH, DNS1123_LABEL_MAX_LENGTH, truncate_key,
    validate_dns_label, validate_label_name, validate_label_value, validate_node_selector,
    validate_qualified_name,
};
use super::quantity::ParsedQuantity;
use super::slice::SliceContext;
use crate::attribute_version::is_semver;
use crate::release::KubeVersion;

/// `resource.DeviceAttributeMaxValueLength`.
pub const DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH: usize = 64;
/// Keys of attribute and capacity maps are shortened beyond this in field paths.
const ATTRIBUTE_KEY_PATH_LENGTH: usize = DEVICE_MAX_DOMAIN_LENGTH + 1 + DEVICE_MAX_ID_LENGTH;

/// Where key errors of a map go: the entry (`attributes[k]`) up to 1.36, the map itself
/// from 1.37, where key checks moved to declarative validation.
pub(super) fn key_error_path(
    map: &FieldPath,
    entry: &FieldPath,
    version: KubeVersion,
) -> FieldPath {
    if version.minor() >= 37 {
        map.clone()
    } else {
        entry.clone()
    }
}

/// Parses a quantity or records `Invalid` with Go's parse error at `path`. A real API
/// server refuses such objects while decoding (HTTP 400) before validation runs.
pub(super) fn parse_quantity(
    raw: &str,
    path: &FieldPath,
    errs: &mut Vec<FieldError>,
) -> Option<ParsedQuantity> {
    match ParsedQuantity::parse(raw) {
        Ok(q) => Some(q),
        Err(e) => {
            errs.push(FieldError::invalid(
                path,
                BadValue::str(raw),
                e.go_message(),
            ));
            None
        }
    }
}

/// `validateDevice` for a device at `path` of a slice described by `ctx`.
pub(super) fn validate_device(
    device: &Device,
    path: &FieldPath,
    ctx: &SliceContext<'_>,
) -> Vec<FieldError> {
    let v = ctx.version;
    let limits = &ctx.limits;
    let mut errs = validate_dns_label(&device.name, &path.child("name"));

    let empty_attrs = BTreeMap::new();
    let empty_caps = BTreeMap::new();
    let attributes = device.attributes.as_ref().unwrap_or(&empty_attrs);
    let capacity = device.capacity.as_ref().unwrap_or(&empty_caps);
    let total = attributes.len() + capacity.len();
    if total > limits.attributes_and_capacities {
        errs.push(FieldError::invalid(
            path,
            BadValue::from(total),
            format!(
                "the total number of attributes and capacities must not exceed {}",
                limits.attributes_and_capacities
            ),
        ));
    }
    if let Some(max) = limits.attribute_values {
        let values = attribute_value_count(attributes.values());
        if values > max {
            errs.push(FieldError::invalid(
                path,
                BadValue::from(values),
                format!("the total number of attribute values must not exceed {max}"),
            ));
        }
    }

    let attrs_path = path.child("attributes");
    for (key, attribute) in attributes {
        let entry = attrs_path.key(&truncate_key(key, ATTRIBUTE_KEY_PATH_LENGTH));
        errs.extend(validate_qualified_name(
            key,
            &key_error_path(&attrs_path, &entry, v),
            v,
        ));
        errs.extend(validate_attribute(attribute, &entry, v));
    }

    let multi = device.allow_multiple_allocations == Some(true);
    let caps_path = path.child("capacity");
    for (key, cap) in capacity {
        let entry = caps_path.key(&truncate_key(key, ATTRIBUTE_KEY_PATH_LENGTH));
        errs.extend(validate_qualified_name(
            key,
            &key_error_path(&caps_path, &entry, v),
            v,
        ));
        errs.extend(validate_capacity(cap, &entry, multi, ctx));
    }

    let taints = device.taints.as_deref().unwrap_or(&[]);
    errs.extend(validate_list(
        taints,
        Some(limits.taints_per_device),
        &path.child("taints"),
        |t, p| validate_taint(t, p, v),
    ));

    errs.extend(validate_counter_consumption(device, path, ctx));
    errs.extend(validate_device_node_selection(
        device,
        path,
        ctx.per_device_node_selection,
    ));
    errs.extend(validate_binding_conditions(
        device.binding_conditions.as_deref(),
        device.binding_failure_conditions.as_deref(),
        path,
        limits.binding_conditions,
    ));
    if v.minor() >= 37
        && let Some(resources) = &device.node_allocatable_resources
    {
        errs.extend(validate_node_allocatable_resources(
            resources,
            capacity,
            &path.child("nodeAllocatableResources"),
        ));
    }
    errs
}

/// Scalars count one, lists count their items (`numEntriesDeviceAttribute`, 1.36+).
pub(super) fn attribute_value_count<'a>(
    attributes: impl Iterator<Item = &'a DeviceAttribute>,
) -> usize {
    attributes
        .map(|a| {
            let lists = a.bools.as_ref().map_or(0, Vec::len)
                + a.ints.as_ref().map_or(0, Vec::len)
                + a.strings.as_ref().map_or(0, Vec::len)
                + a.versions.as_ref().map_or(0, Vec::len);
            if lists == 0 { 1 } else { lists }
        })
        .sum()
}

/// Whether an attribute uses a list variant (1.36+ API).
pub(super) fn is_list_attribute(a: &DeviceAttribute) -> bool {
    a.bools.is_some() || a.ints.is_some() || a.strings.is_some() || a.versions.is_some()
}

/// `validateDeviceAttribute`: exactly one value; strings and versions at most 64 bytes,
/// versions semver 2.0.0 (checked with `attribute_version::is_semver`, which also refuses numeric
/// components beyond `u64` that Go's regex would accept). List variants exist from 1.36.
fn validate_attribute(a: &DeviceAttribute, path: &FieldPath, v: KubeVersion) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut fields = 0;
    fields += usize::from(a.bool.is_some()) + usize::from(a.int.is_some());
    if let Some(s) = &a.string {
        fields += 1;
        errs.extend(check_string_value(s, &path.child("string")));
    }
    if let Some(s) = &a.version {
        fields += 1;
        errs.extend(check_version_value(s, &path.child("version")));
    }
    if v.minor() >= 36 {
        let empty = |p: FieldPath, go_type: &str| {
            FieldError::invalid(
                &p,
                BadValue::Raw(format!("[]{go_type}{{}}")),
                "must not be empty if specified",
            )
        };
        if let Some(l) = &a.bools {
            fields += 1;
            if l.is_empty() {
                errs.push(empty(path.child("bools"), "bool"));
            }
        }
        if let Some(l) = &a.ints {
            fields += 1;
            if l.is_empty() {
                errs.push(empty(path.child("ints"), "int64"));
            }
        }
        if let Some(l) = &a.strings {
            fields += 1;
            if l.is_empty() {
                errs.push(empty(path.child("strings"), "string"));
            }
            for (i, s) in l.iter().enumerate() {
                errs.extend(check_string_value(s, &path.child("strings").index(i)));
            }
        }
        if let Some(l) = &a.versions {
            fields += 1;
            if l.is_empty() {
                errs.push(empty(path.child("versions"), "string"));
            }
            for (i, s) in l.iter().enumerate() {
                errs.extend(check_version_value(s, &path.child("versions").index(i)));
            }
        }
    }
    match fields {
        0 => errs.push(FieldError::invalid(
            path,
            BadValue::str(""),
            "exactly one value must be specified",
        )),
        1 => {}
        _ => {
            let shown = serde_json::to_string(a).unwrap_or_default();
            errs.push(FieldError::invalid(
                path,
                BadValue::Raw(shown),
                "exactly one value must be specified",
            ));
        }
    }
    errs
}

fn check_string_value(s: &str, path: &FieldPath) -> Vec<FieldError> {
    if s.len() > DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH {
        vec![FieldError::too_long(
            path,
            DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH,
        )]
    } else {
        Vec::new()
    }
}

fn check_version_value(s: &str, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if !is_semver(s) {
        errs.push(FieldError::invalid(
            path,
            BadValue::str(s),
            "must be a string compatible with semver.org spec 2.0.0",
        ));
    }
    errs.extend(check_string_value(s, path));
    errs
}

/// Valid taint effects: `None` exists from 1.35.
pub fn taint_effects(v: KubeVersion) -> &'static [&'static str] {
    if v.minor() >= 35 {
        &["NoExecute", "NoSchedule", "None"]
    } else {
        &["NoExecute", "NoSchedule"]
    }
}

/// `validateDeviceTaint` for a new taint.
fn validate_taint(t: &DeviceTaint, path: &FieldPath, v: KubeVersion) -> Vec<FieldError> {
    let mut errs = validate_label_name(&t.key, &path.child("key"));
    if let Some(value) = t.value.as_deref().filter(|s| !s.is_empty()) {
        errs.extend(validate_label_value(value, &path.child("value")));
    }
    let effects = taint_effects(v);
    if t.effect.is_empty() {
        errs.push(FieldError::required(path.child("effect"), ""));
    } else if !effects.contains(&t.effect.as_str()) {
        errs.push(FieldError::not_supported(
            path.child("effect"),
            BadValue::str(&t.effect),
            effects,
        ));
    }
    errs
}

/// `consumesCounters` of one device. From 1.35: at most 2 entries with unique counter
/// sets, each with at most 32 counters. 1.34: unlimited entries but at most 32 counters
/// per device, and every reference must resolve in the slice's own `sharedCounters`.
fn validate_counter_consumption(
    device: &Device,
    path: &FieldPath,
    ctx: &SliceContext<'_>,
) -> Vec<FieldError> {
    let consumptions = device.consumes_counters.as_deref().unwrap_or(&[]);
    let cc_path = path.child("consumesCounters");
    let limits = &ctx.limits;
    let entry = |c: &DeviceCounterConsumption, p: &FieldPath| validate_consumption_entry(c, p, ctx);
    let mut errs = if limits.consumptions_per_device.is_some() {
        validate_unique_list(
            consumptions,
            limits.consumptions_per_device,
            &cc_path,
            entry,
            |c| c.counter_set.clone(),
            |k| BadValue::str(k),
        )
    } else {
        // 1.34: no entry limit and (not confirmed) no uniqueness rule.
        validate_list(consumptions, None, &cc_path, entry)
    };
    if let Some(max) = limits.counters_per_device {
        let total: usize = consumptions.iter().map(|c| c.counters.len()).sum();
        if total > max {
            errs.push(FieldError::invalid(
                path,
                BadValue::from(total),
                format!("the total number of counters must not exceed {max}"),
            ));
        }
    }
    if let Some(sets) = ctx.same_slice_counters {
        for (i, c) in consumptions.iter().enumerate() {
            let entry = cc_path.index(i);
            match sets.iter().find(|s| s.name == c.counter_set) {
                None => errs.push(FieldError::invalid(
                    entry.child("counterSet"),
                    BadValue::str(&c.counter_set),
                    "must reference a counterSet defined in the ResourceSlice sharedCounters",
                )),
                Some(set) => {
                    for name in c.counters.keys().filter(|n| !set.counters.contains_key(*n)) {
                        errs.push(FieldError::invalid(
                            entry.child("counters"),
                            BadValue::str(name),
                            "must reference a counter defined in the ResourceSlice sharedCounters",
                        ));
                    }
                }
            }
        }
    }
    errs
}

fn validate_consumption_entry(
    c: &DeviceCounterConsumption,
    path: &FieldPath,
    ctx: &SliceContext<'_>,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if c.counter_set.is_empty() {
        errs.push(FieldError::required(path.child("counterSet"), ""));
    } else {
        errs.extend(validate_dns_label(
            &c.counter_set,
            &path.child("counterSet"),
        ));
    }
    if c.counters.is_empty() {
        errs.push(FieldError::required(path.child("counters"), ""));
    } else {
        errs.extend(validate_counter_map(
            &c.counters,
            ctx.limits.counters_per_consumption,
            &path.child("counters"),
            ctx.version,
        ));
    }
    if let (Some(max), Some(groups)) = (ctx.limits.compatibility_groups, &c.compatibility_groups) {
        // Declarative in Go (maxItems, listType=set); messages inferred.
        errs.extend(validate_unique_list(
            groups,
            Some(max),
            &path.child("compatibilityGroups"),
            |_, _| Vec::new(),
            Clone::clone,
            |k| BadValue::str(k),
        ));
    }
    errs
}

/// A counter map (`sharedCounters[i].counters`, `consumesCounters[j].counters`): at most
/// `max` entries (short-circuits), DNS-label keys, parsable values.
pub(super) fn validate_counter_map(
    counters: &BTreeMap<String, Counter>,
    max: Option<usize>,
    path: &FieldPath,
    v: KubeVersion,
) -> Vec<FieldError> {
    if let Some(max) = max
        && counters.len() > max
    {
        return vec![FieldError::too_many(path, counters.len(), max)];
    }
    let mut errs = Vec::new();
    for (name, counter) in counters {
        let entry = path.key(&truncate_key(name, DNS1123_LABEL_MAX_LENGTH));
        errs.extend(validate_dns_label(name, &key_error_path(path, &entry, v)));
        parse_quantity(&counter.value.0, &entry.child("value"), &mut errs);
    }
    errs
}

/// `validateCounterSet`: DNS-label name, non-empty counters.
pub(super) fn validate_counter_set(
    set: &CounterSet,
    path: &FieldPath,
    ctx: &SliceContext<'_>,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if set.name.is_empty() {
        errs.push(FieldError::required(path.child("name"), ""));
    } else {
        errs.extend(validate_dns_label(&set.name, &path.child("name")));
    }
    if set.counters.is_empty() {
        errs.push(FieldError::required(path.child("counters"), ""));
    } else {
        errs.extend(validate_counter_map(
            &set.counters,
            ctx.limits.counters_per_set,
            &path.child("counters"),
            ctx.version,
        ));
    }
    errs
}

const PER_DEVICE_NODE_MSG: &str = "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` is set to true in the ResourceSlice spec";

/// Per-device `nodeName`/`nodeSelector`/`allNodes`: exactly one with
/// `perDeviceNodeSelection: true`, none otherwise.
fn validate_device_node_selection(
    device: &Device,
    path: &FieldPath,
    per_device: bool,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if !per_device {
        if device.node_name.is_some()
            || device.node_selector.is_some()
            || device.all_nodes.is_some()
        {
            errs.push(FieldError::invalid(
                path,
                BadValue::Null,
                "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec",
            ));
        }
        return errs;
    }
    let mut set = Vec::new();
    if let Some(name) = &device.node_name {
        if name.is_empty() {
            errs.push(FieldError::invalid(
                path.child("nodeName"),
                BadValue::str(""),
                "must not be empty",
            ));
        } else {
            set.push("`nodeName`");
            errs.extend(super::format::validate_dns_subdomain(
                name,
                &path.child("nodeName"),
            ));
        }
    }
    if let Some(sel) = &device.node_selector {
        set.push("`nodeSelector`");
        errs.extend(validate_node_selector(sel, &path.child("nodeSelector")));
    }
    if let Some(all) = device.all_nodes {
        if all {
            set.push("`allNodes`");
        } else {
            errs.push(FieldError::invalid(
                path.child("allNodes"),
                BadValue::Bool(false),
                "must be either unset or set to true",
            ));
        }
    }
    match set.len() {
        0 => errs.push(FieldError::required(path, PER_DEVICE_NODE_MSG)),
        1 => {}
        _ => errs.push(FieldError::invalid(
            path,
            BadValue::str(&format!("{{{}}}", set.join(", "))),
            PER_DEVICE_NODE_MSG,
        )),
    }
    errs
}

fn go_string_slice(list: Option<&[String]>) -> BadValue {
    match list {
        None => BadValue::Raw("[]string(nil)".into()),
        Some(l) => {
            let quoted: Vec<String> = l.iter().map(|s| super::field::go_quote(s)).collect();
            BadValue::Raw(format!("[]string{{{}}}", quoted.join(", ")))
        }
    }
}

/// `validateDeviceBindingParameters` (devices and allocation results): at most `max`
/// of each, label-name syntax, no duplicates, no overlap, both or neither.
pub(crate) fn validate_binding_conditions(
    conditions: Option<&[String]>,
    failure_conditions: Option<&[String]>,
    path: &FieldPath,
    max: usize,
) -> Vec<FieldError> {
    let bc = conditions.unwrap_or(&[]);
    let bfc = failure_conditions.unwrap_or(&[]);
    let bc_path = path.child("bindingConditions");
    let bfc_path = path.child("bindingFailureConditions");
    let mut errs = validate_list(bc, Some(max), &bc_path, |c, p| validate_label_name(c, p));
    errs.extend(validate_list(bfc, Some(max), &bfc_path, |c, p| {
        validate_label_name(c, p)
    }));
    for (i, c) in bc.iter().enumerate() {
        if bc[..i].contains(c) {
            errs.push(FieldError::duplicate(bc_path.index(i), BadValue::str(c)));
        }
    }
    for (i, c) in bfc.iter().enumerate() {
        if bfc[..i].contains(c) {
            errs.push(FieldError::duplicate(bfc_path.index(i), BadValue::str(c)));
        }
        if bc.contains(c) {
            errs.push(FieldError::invalid(
                bfc_path.index(i),
                BadValue::str(c),
                "bindingFailureConditions must not overlap with bindingConditions",
            ));
        }
    }
    if bc.is_empty() && !bfc.is_empty() {
        errs.push(FieldError::invalid(
            &bc_path,
            go_string_slice(conditions),
            "bindingConditions are required to use bindingFailureConditions",
        ));
    }
    if bfc.is_empty() && !bc.is_empty() {
        errs.push(FieldError::invalid(
            &bfc_path,
            go_string_slice(failure_conditions),
            "bindingFailureConditions are required to use bindingConditions",
        ));
    }
    errs
}

/// Node-allocatable resource names. Inferred from `IsNodeAllocatableResourceName`:
/// `cpu`, `memory`, `ephemeral-storage` and `hugepages-<size>`.
fn is_node_allocatable_resource_name(name: &str) -> bool {
    matches!(name, "cpu" | "memory" | "ephemeral-storage") || name.starts_with("hugepages-")
}

/// `validateNodeAllocatableResources` (1.37, gate DRANodeAllocatableResources).
fn validate_node_allocatable_resources(
    resources: &BTreeMap<String, NodeAllocatableResource>,
    capacity: &BTreeMap<String, k8s_openapi::api::resource::v1::DeviceCapacity>,
    path: &FieldPath,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (name, r) in resources {
        let entry = path.key(name);
        if !is_node_allocatable_resource_name(name) {
            errs.push(FieldError::invalid(
                &entry,
                BadValue::str(name),
                "must be a node allocatable resource name",
            ));
        }
        if r.mapping.is_none() && r.overhead.is_none() {
            errs.push(FieldError::required(
                &entry,
                "at least one of mapping or overhead must be set",
            ));
        }
        if let Some(m) = &r.mapping {
            let mp = entry.child("mapping");
            if let Some(key) = &m.capacity_key {
                if key.is_empty() {
                    errs.push(FieldError::invalid(
                        mp.child("capacityKey"),
                        BadValue::str(""),
                        "capacityKey must not be an empty string",
                    ));
                } else if !capacity.contains_key(key) {
                    errs.push(FieldError::not_found(
                        mp.child("capacityKey"),
                        BadValue::str(key),
                    ));
                }
                match &m.capacity_multiplier {
                    None => errs.push(FieldError::required(
                        mp.child("capacityMultiplier"),
                        "capacityMultiplier is required when capacityKey is set",
                    )),
                    Some(q) => {
                        let p = mp.child("capacityMultiplier");
                        if let Some(v) = parse_quantity(&q.0, &p, &mut errs)
                            && v.sign() <= 0
                        {
                            errs.push(FieldError::invalid(
                                &p,
                                BadValue::str(&v.to_string()),
                                "must be positive",
                            ));
                        }
                    }
                }
            }
            if let Some(q) = &m.device_multiplier {
                let p = mp.child("deviceMultiplier");
                if let Some(v) = parse_quantity(&q.0, &p, &mut errs)
                    && v.sign() <= 0
                {
                    errs.push(FieldError::invalid(
                        &p,
                        BadValue::str(&v.to_string()),
                        "must be positive",
                    ));
                }
            }
            if m.capacity_multiplier.is_some() && m.capacity_key.is_none() {
                errs.push(FieldError::required(
                    mp.child("capacityKey"),
                    "capacityKey is required when capacityMultiplier is set",
                ));
            }
        }
        if let Some(o) = &r.overhead {
            let op = entry.child("overhead");
            if o.per_pod.is_none() && o.per_container.is_none() {
                errs.push(FieldError::invalid(
                    &op,
                    BadValue::str(""),
                    "at least one of perPod or perContainer must be set",
                ));
            }
            for (field, q) in [("perPod", &o.per_pod), ("perContainer", &o.per_container)] {
                if let Some(q) = q {
                    let p = op.child(field);
                    if let Some(v) = parse_quantity(&q.0, &p, &mut errs)
                        && v.sign() < 0
                    {
                        errs.push(FieldError::invalid(
                            &p,
                            BadValue::str(&v.to_string()),
                            "must be non-negative",
                        ));
                    }
                }
            }
        }
    }
    errs
}
