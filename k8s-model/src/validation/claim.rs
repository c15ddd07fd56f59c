//! ResourceClaim validation as the API server performs it: the spec on create
//! (`ValidateResourceClaim`) and the status on a status update
//! (`ValidateResourceClaimStatusUpdate`). Pure and deterministic.
//!
//! Confirmed against the 1.37-cycle `validation.go`. Applied as the API server's
//! defaulting would leave the object: a missing `allocationMode` is `ExactCount`, a
//! missing or zero count is 1, a missing toleration operator is `Equal`. Not modelled:
//! CEL compilation and cost (only presence and the 10 KiB length are checked), the
//! admin-access namespace label, metadata beyond name/generateName, node-selector term
//! contents, `metav1.Condition` syntax, and canonical-IP checks of network data.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, AllocationResult, CapacityRequirements, DeviceAllocationConfiguration,
    DeviceClaim, DeviceClaimConfiguration, DeviceConstraint, DeviceDerivedAttribute, DeviceRequest,
    DeviceRequestAllocationResult, DeviceSelector, DeviceSubRequest, DeviceToleration,
    ExactDeviceRequest, OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimConsumerReference,
    ResourceClaimStatus,
};

use super::device::{parse_quantity, taint_effects, validate_binding_conditions};
use super::field::{BadValue, FieldError, FieldPath, validate_list, validate_unique_list};
use super::format::{
    validate_dns_label, validate_dns_subdomain, validate_driver_name,
    validate_fully_qualified_name, validate_label_name, validate_label_value,
    validate_node_selector, validate_object_name, validate_pool_name, validate_qualified_name,
    validate_raw_extension, validate_uid,
};
use super::slice::validate_skip_node_operations;
use crate::release::{FeatureGates, KubeVersion};

/// `resource.DeviceRequestsMaxSize` (also constraints' and configs' request lists).
pub const DEVICE_REQUESTS_MAX: usize = 32;
/// `resource.MaxCapacityRequirements` (1.38): entries in a request's `capacity.requests`.
pub const CAPACITY_REQUIREMENTS_MAX: usize = 32;
/// `resource.FirstAvailableDeviceRequestMaxSize`.
pub const FIRST_AVAILABLE_MAX: usize = 8;
/// `resource.DeviceSelectorsMaxSize`.
pub const DEVICE_SELECTORS_MAX: usize = 32;
/// `resource.DeviceConstraintsMaxSize`.
pub const DEVICE_CONSTRAINTS_MAX: usize = 32;
/// `resource.DeviceConfigMaxSize`; allocation results may hold twice as many.
pub const DEVICE_CONFIG_MAX: usize = 32;
/// `resource.CELSelectorExpressionMaxLength`.
pub const CEL_EXPRESSION_MAX_LENGTH: usize = 10 * 1024;
/// `resource.OpaqueParametersMaxLength`.
pub const OPAQUE_PARAMETERS_MAX_LENGTH: usize = 10 * 1024;
/// `resource.AllocationResultsMaxSize`.
pub const ALLOCATION_RESULTS_MAX: usize = 32;
/// `resource.ResourceClaimReservedForMaxSize`.
pub const RESERVED_FOR_MAX: usize = 256;
/// `resource.AllocatedDeviceStatusMaxConditions`.
pub const DEVICE_STATUS_MAX_CONDITIONS: usize = 8;
/// `resource.AllocatedDeviceStatusDataMaxLength`.
pub const DEVICE_STATUS_DATA_MAX_LENGTH: usize = 10 * 1024;
const BINDING_CONDITIONS_MAX: usize = 4;
const INTERFACE_NAME_MAX: usize = 256;
const HARDWARE_ADDRESS_MAX: usize = 128;
const NETWORK_IPS_MAX: usize = 16;

const REQUEST_REF_MSG: &str = "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'";

/// Request names of a claim; `Some` lists the subrequests of a `firstAvailable` request.
struct RequestNames(BTreeMap<String, Option<BTreeSet<String>>>);

impl RequestNames {
    fn of(devices: &DeviceClaim) -> Self {
        let mut names = BTreeMap::new();
        for r in devices.requests.iter().flatten() {
            let subs = r.first_available.as_ref().filter(|fa| !fa.is_empty());
            names.insert(
                r.name.clone(),
                subs.map(|fa| fa.iter().map(|s| s.name.clone()).collect()),
            );
        }
        RequestNames(names)
    }

    /// `req` or `req/sub`.
    fn has(&self, reference: &str) -> bool {
        let segments: Vec<&str> = reference.split('/').collect();
        match segments.as_slice() {
            [req] => self.0.contains_key(*req),
            [req, sub] => self
                .0
                .get(*req)
                .is_some_and(|s| s.as_ref().is_some_and(|s| s.contains(*sub))),
            _ => false,
        }
    }
}

fn validate_request_ref(
    reference: &str,
    path: &FieldPath,
    names: &RequestNames,
) -> Vec<FieldError> {
    let segments: Vec<&str> = reference.split('/').collect();
    if segments.len() > 2 {
        return vec![FieldError::invalid(
            path,
            BadValue::str(reference),
            REQUEST_REF_MSG,
        )];
    }
    let mut errs: Vec<FieldError> = segments
        .iter()
        .flat_map(|s| validate_dns_label(s, path))
        .collect();
    if !names.has(reference) {
        errs.push(FieldError::invalid(
            path,
            BadValue::str(reference),
            REQUEST_REF_MSG,
        ));
    }
    errs
}

fn validate_request_refs(
    refs: Option<&[String]>,
    path: &FieldPath,
    names: &RequestNames,
) -> Vec<FieldError> {
    validate_unique_list(
        refs.unwrap_or(&[]),
        Some(DEVICE_REQUESTS_MAX),
        path,
        |r, p| validate_request_ref(r, p, names),
        Clone::clone,
        |k| BadValue::str(k),
    )
}

/// Validates a ResourceClaim for creation on `gates.version()`: name, and the spec's
/// requests (at most 32, unique DNS-label names, exactly one of `exactly` and
/// `firstAvailable`, device class, allocation mode and count, selectors, tolerations,
/// 1.37 derived attributes), constraints and configs (at most 32 each, references to
/// existing requests, opaque parameters a JSON object of at most 10 KiB). Assumes
/// disabled fields were dropped ([`super::drop_disabled_claim_fields`]). Pure.
pub fn validate_resource_claim(claim: &ResourceClaim, gates: &FeatureGates) -> Vec<FieldError> {
    let mut errs = validate_object_name(&claim.metadata, &FieldPath::new("metadata"));
    let empty = DeviceClaim::default();
    let devices = claim
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .unwrap_or(&empty);
    errs.extend(validate_device_claim(
        devices,
        &FieldPath::new("spec").child("devices"),
        gates,
    ));
    errs
}

/// Attribute names constraints refer to, per request reference (`""` = all requests).
fn constraint_attributes(constraints: &[DeviceConstraint]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for c in constraints {
        let Some(attr) = c.match_attribute.as_ref().or(c.distinct_attribute.as_ref()) else {
            continue;
        };
        let requests = c.requests.as_deref().unwrap_or(&[]);
        if requests.is_empty() {
            out.entry(String::new()).or_default().insert(attr.clone());
        }
        for r in requests {
            out.entry(r.clone()).or_default().insert(attr.clone());
        }
    }
    out
}

struct ClaimContext<'a> {
    gates: &'a FeatureGates,
    constraint_attributes: BTreeMap<String, BTreeSet<String>>,
}

fn validate_device_claim(
    devices: &DeviceClaim,
    path: &FieldPath,
    gates: &FeatureGates,
) -> Vec<FieldError> {
    let names = RequestNames::of(devices);
    let constraints = devices.constraints.as_deref().unwrap_or(&[]);
    let ctx = ClaimContext {
        gates,
        constraint_attributes: constraint_attributes(constraints),
    };
    let mut errs = validate_unique_list(
        devices.requests.as_deref().unwrap_or(&[]),
        Some(DEVICE_REQUESTS_MAX),
        &path.child("requests"),
        |r, p| validate_request(r, p, &ctx),
        |r| r.name.clone(),
        |k| BadValue::str(k),
    );
    errs.extend(validate_list(
        constraints,
        Some(DEVICE_CONSTRAINTS_MAX),
        &path.child("constraints"),
        |c, p| validate_constraint(c, p, &names, gates),
    ));
    errs.extend(validate_list(
        devices.config.as_deref().unwrap_or(&[]),
        Some(DEVICE_CONFIG_MAX),
        &path.child("config"),
        |c: &DeviceClaimConfiguration, p| {
            let mut e = validate_request_refs(c.requests.as_deref(), &p.child("requests"), &names);
            e.extend(validate_opaque(c.opaque.as_ref(), p));
            e
        },
    ));
    errs
}

const EXACTLY_ONE_REQUEST_MSG: &str = "exactly one of `exactly` or `firstAvailable` is required";

fn validate_request(
    r: &DeviceRequest,
    path: &FieldPath,
    ctx: &ClaimContext<'_>,
) -> Vec<FieldError> {
    let mut errs = validate_dns_label(&r.name, &path.child("name"));
    let first_available = r.first_available.as_deref().filter(|fa| !fa.is_empty());
    match (first_available, &r.exactly) {
        (Some(_), Some(_)) => errs.push(FieldError::invalid(
            path,
            BadValue::Null,
            format!("{EXACTLY_ONE_REQUEST_MSG}, but multiple fields are set"),
        )),
        (None, None) => errs.push(FieldError::required(path, EXACTLY_ONE_REQUEST_MSG)),
        (Some(subs), None) => errs.extend(validate_unique_list(
            subs,
            Some(FIRST_AVAILABLE_MAX),
            &path.child("firstAvailable"),
            |s, p| validate_sub_request(s, p, &r.name, ctx),
            |s| s.name.clone(),
            |k| BadValue::str(k),
        )),
        (None, Some(e)) => errs.extend(validate_exact_request(
            e,
            &path.child("exactly"),
            &r.name,
            ctx,
        )),
    }
    errs
}

fn validate_exact_request(
    e: &ExactDeviceRequest,
    path: &FieldPath,
    name: &str,
    ctx: &ClaimContext<'_>,
) -> Vec<FieldError> {
    let mut errs = validate_device_class(&e.device_class_name, &path.child("deviceClassName"));
    errs.extend(validate_selectors(
        e.selectors.as_deref(),
        &path.child("selectors"),
    ));
    errs.extend(validate_derived_attributes(
        e.derived_attributes.as_deref(),
        &path.child("derivedAttributes"),
        name,
        ctx,
    ));
    errs.extend(validate_allocation_mode(
        e.allocation_mode.as_deref(),
        e.count,
        path,
    ));
    errs.extend(validate_tolerations(
        e.tolerations.as_deref(),
        &path.child("tolerations"),
        ctx.gates.version(),
    ));
    errs.extend(validate_capacity_requirements(
        e.capacity.as_ref(),
        &path.child("capacity"),
        ctx.gates.version(),
    ));
    errs
}

fn validate_sub_request(
    s: &DeviceSubRequest,
    path: &FieldPath,
    parent: &str,
    ctx: &ClaimContext<'_>,
) -> Vec<FieldError> {
    let mut errs = validate_dns_label(&s.name, &path.child("name"));
    errs.extend(validate_device_class(
        &s.device_class_name,
        &path.child("deviceClassName"),
    ));
    errs.extend(validate_selectors(
        s.selectors.as_deref(),
        &path.child("selectors"),
    ));
    errs.extend(validate_derived_attributes(
        s.derived_attributes.as_deref(),
        &path.child("derivedAttributes"),
        &format!("{parent}/{}", s.name),
        ctx,
    ));
    errs.extend(validate_allocation_mode(
        s.allocation_mode.as_deref(),
        s.count,
        path,
    ));
    errs.extend(validate_tolerations(
        s.tolerations.as_deref(),
        &path.child("tolerations"),
        ctx.gates.version(),
    ));
    errs.extend(validate_capacity_requirements(
        s.capacity.as_ref(),
        &path.child("capacity"),
        ctx.gates.version(),
    ));
    errs
}

/// A request's `capacity.requests`, checked from 1.38 on (`validateCapacityRequirements`
/// and the declarative `maxProperties=32`, `minimum=0`; 1.37 stored any names and
/// values): at most 32 entries (short-circuits the rest), each name a qualified name
/// (reported on the map, as `validateMap` does), each quantity at least 0.
fn validate_capacity_requirements(
    capacity: Option<&CapacityRequirements>,
    path: &FieldPath,
    v: KubeVersion,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(requests) = capacity.and_then(|c| c.requests.as_ref()) else {
        return errs;
    };
    if v.minor() < 38 {
        return errs;
    }
    let path = path.child("requests");
    if requests.len() > CAPACITY_REQUIREMENTS_MAX {
        errs.push(FieldError::too_many(
            &path,
            requests.len(),
            CAPACITY_REQUIREMENTS_MAX,
        ));
        return errs;
    }
    for (name, q) in requests {
        errs.extend(validate_qualified_name(name, &path, v));
        let entry = path.key(name);
        if let Some(q) = parse_quantity(&q.0, &entry, &mut errs)
            && q.sign() < 0
        {
            errs.push(FieldError::invalid(
                &entry,
                BadValue::Str(q.to_string()),
                "must be greater than or equal to 0",
            ));
        }
    }
    errs
}

fn validate_device_class(name: &str, path: &FieldPath) -> Vec<FieldError> {
    if name.is_empty() {
        vec![FieldError::required(path, "")]
    } else {
        validate_dns_subdomain(name, path)
    }
}

fn validate_selectors(selectors: Option<&[DeviceSelector]>, path: &FieldPath) -> Vec<FieldError> {
    validate_list(
        selectors.unwrap_or(&[]),
        Some(DEVICE_SELECTORS_MAX),
        path,
        |s, p| match &s.cel {
            None => vec![FieldError::required(p.child("cel"), "")],
            Some(cel) => {
                validate_cel_expression(&cel.expression, &p.child("cel").child("expression"))
            }
        },
    )
}

/// Length only; an empty expression is refused as CEL compilation would (message inferred).
fn validate_cel_expression(expression: &str, path: &FieldPath) -> Vec<FieldError> {
    if expression.len() > CEL_EXPRESSION_MAX_LENGTH {
        vec![FieldError::too_long(path, CEL_EXPRESSION_MAX_LENGTH)]
    } else if expression.trim().is_empty() {
        vec![FieldError::required(path, "")]
    } else {
        Vec::new()
    }
}

/// 1.37 derived attributes: unique names, each used by a constraint on this request
/// (or on all requests, or on the parent request of a subrequest).
fn validate_derived_attributes(
    attrs: Option<&[DeviceDerivedAttribute]>,
    path: &FieldPath,
    request: &str,
    ctx: &ClaimContext<'_>,
) -> Vec<FieldError> {
    if ctx.gates.version().minor() < 37 {
        return Vec::new();
    }
    let used = |name: &str| {
        let in_key = |k: &str| {
            ctx.constraint_attributes
                .get(k)
                .is_some_and(|s| s.contains(name))
        };
        in_key("")
            || in_key(request)
            || request
                .split_once('/')
                .is_some_and(|(parent, _)| in_key(parent))
    };
    validate_unique_list(
        attrs.unwrap_or(&[]),
        None,
        path,
        |a, p| {
            let mut errs = Vec::new();
            if !a.name.is_empty() && !used(&a.name) {
                errs.push(FieldError::invalid(
                    p.child("name"),
                    BadValue::str(&a.name),
                    "must be referenced by at least one matchAttribute or distinctAttribute constraint targeting this request",
                ));
            }
            if !a.expression.is_empty() {
                errs.extend(validate_cel_expression(
                    &a.expression,
                    &p.child("expression"),
                ));
            }
            errs
        },
        |a| a.name.clone(),
        |k| BadValue::str(k),
    )
}

/// `validateDeviceAllocationMode` after defaulting.
fn validate_allocation_mode(
    mode: Option<&str>,
    count: Option<i64>,
    path: &FieldPath,
) -> Vec<FieldError> {
    let mode = mode.unwrap_or("ExactCount");
    match mode {
        "All" => {
            let count = count.unwrap_or(0);
            if count != 0 {
                return vec![FieldError::invalid(
                    path.child("count"),
                    BadValue::Int(count),
                    "must not be specified when allocationMode is 'All'",
                )];
            }
        }
        "ExactCount" => {
            let count = count.filter(|c| *c != 0).unwrap_or(1);
            if count <= 0 {
                return vec![FieldError::invalid(
                    path.child("count"),
                    BadValue::Int(count),
                    "must be greater than zero",
                )];
            }
        }
        other => {
            return vec![FieldError::not_supported(
                path.child("allocationMode"),
                BadValue::str(other),
                &["All", "ExactCount"],
            )];
        }
    }
    Vec::new()
}

fn validate_tolerations(
    tolerations: Option<&[DeviceToleration]>,
    path: &FieldPath,
    v: KubeVersion,
) -> Vec<FieldError> {
    tolerations
        .unwrap_or(&[])
        .iter()
        .enumerate()
        .flat_map(|(i, t)| validate_toleration(t, &path.index(i), v))
        .collect()
}

/// `validateDeviceToleration` after defaulting the operator to `Equal`.
fn validate_toleration(t: &DeviceToleration, path: &FieldPath, v: KubeVersion) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(key) = t.key.as_deref().filter(|k| !k.is_empty()) {
        errs.extend(validate_label_name(key, &path.child("key")));
    }
    let value = t.value.as_deref().unwrap_or("");
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => {
            if !value.is_empty() {
                errs.push(FieldError::invalid(
                    path.child("value"),
                    BadValue::str(value),
                    "must be empty for operator `Exists`",
                ));
            }
        }
        "Equal" => errs.extend(validate_label_value(value, &path.child("value"))),
        other => errs.push(FieldError::not_supported(
            path.child("operator"),
            BadValue::str(other),
            &["Equal", "Exists"],
        )),
    }
    let effects = taint_effects(v);
    if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty())
        && !effects.contains(&effect)
    {
        errs.push(FieldError::not_supported(
            path.child("effect"),
            BadValue::str(effect),
            effects,
        ));
    }
    errs
}

const MATCH_OR_DISTINCT_MSG: &str = r#"exactly one of "matchAttribute" or "distinctAttribute" is required, but multiple fields are set"#;

fn validate_constraint(
    c: &DeviceConstraint,
    path: &FieldPath,
    names: &RequestNames,
    gates: &FeatureGates,
) -> Vec<FieldError> {
    let v = gates.version();
    let mut errs = validate_request_refs(c.requests.as_deref(), &path.child("requests"), names);
    match (&c.match_attribute, &c.distinct_attribute) {
        (Some(_), Some(_)) => {
            // A declarative union in Go; reported here with the handwritten text (inferred).
            errs.push(FieldError::invalid(
                path,
                BadValue::str("{`matchAttribute`, `distinctAttribute`}"),
                MATCH_OR_DISTINCT_MSG,
            ))
        }
        (Some(m), None) => errs.extend(validate_fully_qualified_name(
            m,
            &path.child("matchAttribute"),
            v,
        )),
        (None, Some(d)) => errs.extend(validate_fully_qualified_name(
            d,
            &path.child("distinctAttribute"),
            v,
        )),
        (None, None) if gates.consumable_capacity() => {
            errs.push(FieldError::required(path, MATCH_OR_DISTINCT_MSG))
        }
        (None, None) => errs.push(FieldError::required(path.child("matchAttribute"), "")),
    }
    errs
}

/// `validateDeviceConfiguration` for a config entry at `path` (new objects only).
fn validate_opaque(
    opaque: Option<&OpaqueDeviceConfiguration>,
    path: &FieldPath,
) -> Vec<FieldError> {
    let Some(o) = opaque else {
        return vec![FieldError::required(path.child("opaque"), "")];
    };
    let op = path.child("opaque");
    let mut errs = validate_driver_name(&o.driver, &op.child("driver"));
    errs.extend(validate_raw_extension(
        &o.parameters,
        &op.child("parameters"),
        false,
        OPAQUE_PARAMETERS_MAX_LENGTH,
    ));
    errs
}

/// Validates a status update of a claim (`new` against the stored `old`): reservations
/// (at most 256, unique by UID, only while allocated, none added once the claim is being
/// deleted), device statuses (allocated devices only), and either an unchanged
/// allocation or, when newly set, a valid one: at most 32 results whose request names a
/// request (`req` or `req/sub`) of the spec, valid driver, pool and device names, share
/// IDs as lowercase UUIDs, at most 64 configs. Pure and deterministic.
pub fn validate_resource_claim_status(new: &ResourceClaim, old: &ResourceClaim) -> Vec<FieldError> {
    let empty_status = ResourceClaimStatus::default();
    let status = new.status.as_ref().unwrap_or(&empty_status);
    let old_status = old.status.as_ref().unwrap_or(&empty_status);
    let empty_claim = DeviceClaim::default();
    let names = RequestNames::of(
        new.spec
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .unwrap_or(&empty_claim),
    );
    let path = FieldPath::new("status");

    let reserved = status.reserved_for.as_deref().unwrap_or(&[]);
    let reserved_path = path.child("reservedFor");
    let mut errs = validate_unique_list(
        reserved,
        Some(RESERVED_FOR_MAX),
        &reserved_path,
        validate_consumer_reference,
        |r| r.uid.clone(),
        |k| BadValue::str(k),
    );

    let allocated: BTreeSet<String> = status
        .allocation
        .iter()
        .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
        .map(|r| shared_device_id(&r.driver, &r.pool, &r.device, r.share_id.as_deref()))
        .collect();
    errs.extend(validate_unique_list(
        status.devices.as_deref().unwrap_or(&[]),
        None,
        &path.child("devices"),
        |d, p| validate_device_status(d, p, &allocated),
        |d| shared_device_id(&d.driver, &d.pool, &d.device, d.share_id.as_deref()),
        |k| BadValue::Raw(k.clone()),
    ));

    if !reserved.is_empty() {
        if status.allocation.is_none() {
            errs.push(FieldError::forbidden(
                &reserved_path,
                "may not be specified when `allocated` is not set",
            ));
        } else if new.metadata.deletion_timestamp.is_some() {
            let old_reserved = old_status.reserved_for.as_deref().unwrap_or(&[]);
            if reserved.iter().any(|r| !old_reserved.contains(r)) {
                errs.push(FieldError::forbidden(
                    &reserved_path,
                    "new entries may not be added while `deallocationRequested` or `deletionTimestamp` are set",
                ));
            }
        }
    }

    let allocation_path = path.child("allocation");
    match (&old_status.allocation, &status.allocation) {
        (Some(old_a), Some(new_a)) if old_a != new_a => {
            let shown = serde_json::to_string(new_a).unwrap_or_default();
            errs.push(FieldError::invalid(
                &allocation_path,
                BadValue::Raw(shown),
                "field is immutable",
            ));
        }
        (None, Some(new_a)) => errs.extend(validate_allocation(new_a, &allocation_path, &names)),
        _ => {}
    }
    errs
}

/// `structured.SharedDeviceID` as a string: `driver/pool/device[/shareID]`.
fn shared_device_id(driver: &str, pool: &str, device: &str, share_id: Option<&str>) -> String {
    match share_id {
        Some(s) => format!("{driver}/{pool}/{device}/{s}"),
        None => format!("{driver}/{pool}/{device}"),
    }
}

fn validate_consumer_reference(
    r: &ResourceClaimConsumerReference,
    path: &FieldPath,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (field, value) in [
        ("resource", &r.resource),
        ("name", &r.name),
        ("uid", &r.uid),
    ] {
        if value.is_empty() {
            errs.push(FieldError::required(path.child(field), ""));
        }
    }
    errs
}

fn validate_allocation(
    a: &AllocationResult,
    path: &FieldPath,
    names: &RequestNames,
) -> Vec<FieldError> {
    let devices_path = path.child("devices");
    let results = a
        .devices
        .as_ref()
        .and_then(|d| d.results.as_deref())
        .unwrap_or(&[]);
    let configs = a
        .devices
        .as_ref()
        .and_then(|d| d.config.as_deref())
        .unwrap_or(&[]);
    let mut errs = validate_list(
        results,
        Some(ALLOCATION_RESULTS_MAX),
        &devices_path.child("results"),
        |r, p| validate_result(r, p, names),
    );
    errs.extend(validate_list(
        configs,
        Some(2 * DEVICE_CONFIG_MAX),
        &devices_path.child("config"),
        |c, p| validate_allocation_config(c, p, names),
    ));
    if let Some(sel) = &a.node_selector {
        errs.extend(validate_node_selector(sel, &path.child("nodeSelector")));
    }
    errs
}

fn validate_result(
    r: &DeviceRequestAllocationResult,
    path: &FieldPath,
    names: &RequestNames,
) -> Vec<FieldError> {
    let mut errs = validate_request_ref(&r.request, &path.child("request"), names);
    errs.extend(validate_driver_name(&r.driver, &path.child("driver")));
    errs.extend(validate_pool_name(&r.pool, &path.child("pool")));
    errs.extend(validate_dns_label(&r.device, &path.child("device")));
    errs.extend(validate_binding_conditions(
        r.binding_conditions.as_deref(),
        r.binding_failure_conditions.as_deref(),
        path,
        BINDING_CONDITIONS_MAX,
    ));
    errs.extend(validate_tolerations(
        r.tolerations.as_deref(),
        &path.child("tolerations"),
        KubeVersion::NEWEST,
    ));
    if let Some(id) = &r.share_id {
        errs.extend(validate_uid(id, &path.child("shareID")));
    }
    errs.extend(validate_skip_node_operations(
        r.skip_node_operations.as_deref(),
        &path.child("skipNodeOperations"),
    ));
    errs
}

fn validate_allocation_config(
    c: &DeviceAllocationConfiguration,
    path: &FieldPath,
    names: &RequestNames,
) -> Vec<FieldError> {
    let source_path = path.child("source");
    let mut errs = match c.source.as_str() {
        "" => vec![FieldError::required(&source_path, "")],
        "FromClaim" | "FromClass" => Vec::new(),
        other => vec![FieldError::not_supported(
            &source_path,
            BadValue::str(other),
            &["FromClaim", "FromClass"],
        )],
    };
    errs.extend(validate_request_refs(
        c.requests.as_deref(),
        &path.child("requests"),
        names,
    ));
    errs.extend(validate_opaque(c.opaque.as_ref(), path));
    errs
}

/// The drivers whose `status.devices` entries a status update adds, removes or
/// changes (entries keyed by driver, pool, device and share ID): each needs the
/// `resourceclaims/driver` permission named for it when
/// DRAResourceClaimGranularStatusAuthorization is on (`getModifiedDrivers` in
/// `pkg/registry/resource/utils.go`). Pure and deterministic.
pub fn device_status_drivers_changed(new: &ResourceClaim, old: &ResourceClaim) -> BTreeSet<String> {
    let entries = |c: &ResourceClaim| -> BTreeMap<String, AllocatedDeviceStatus> {
        c.status
            .iter()
            .flat_map(|s| s.devices.iter().flatten())
            .map(|d| {
                (
                    shared_device_id(&d.driver, &d.pool, &d.device, d.share_id.as_deref()),
                    d.clone(),
                )
            })
            .collect()
    };
    let (new, mut old) = (entries(new), entries(old));
    let mut out = BTreeSet::new();
    for (k, d) in new {
        if old.remove(&k).as_ref() != Some(&d) {
            out.insert(d.driver);
        }
    }
    out.extend(old.into_values().map(|d| d.driver));
    out
}

/// The node a claim is allocated to, when its allocation's node selector names exactly
/// one node by `metadata.name` (one term, one `In` field requirement with one value, no
/// expressions): what the API server compares with a service account's node for the
/// `associated-node:` verbs (`nodeNameFromAllocation`). Pure and deterministic.
pub fn allocated_node(claim: &ResourceClaim) -> Option<String> {
    let sel = claim
        .status
        .as_ref()?
        .allocation
        .as_ref()?
        .node_selector
        .as_ref()?;
    let [term] = sel.node_selector_terms.as_slice() else {
        return None;
    };
    if term
        .match_expressions
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        return None;
    }
    let [f] = term.match_fields.as_deref()? else {
        return None;
    };
    match f.values.as_deref() {
        Some([v]) if f.key == "metadata.name" && f.operator == "In" => Some(v.clone()),
        _ => None,
    }
}

fn validate_device_status(
    d: &AllocatedDeviceStatus,
    path: &FieldPath,
    allocated: &BTreeSet<String>,
) -> Vec<FieldError> {
    let mut errs = validate_driver_name(&d.driver, &path.child("driver"));
    errs.extend(validate_pool_name(&d.pool, &path.child("pool")));
    errs.extend(validate_dns_label(&d.device, &path.child("device")));
    if let Some(id) = &d.share_id {
        errs.extend(validate_uid(id, &path.child("shareID")));
    }
    let id = shared_device_id(&d.driver, &d.pool, &d.device, d.share_id.as_deref());
    if !allocated.contains(&id) {
        errs.push(FieldError::invalid(
            path,
            BadValue::Raw(id),
            "must be an allocated device in the claim",
        ));
    }
    let conditions = d.conditions.as_ref().map_or(0, Vec::len);
    if conditions > DEVICE_STATUS_MAX_CONDITIONS {
        errs.push(FieldError::too_many(
            path.child("conditions"),
            conditions,
            DEVICE_STATUS_MAX_CONDITIONS,
        ));
    }
    if let Some(data) = d.data.as_ref().filter(|raw| !raw.0.is_null()) {
        errs.extend(validate_raw_extension(
            data,
            &path.child("data"),
            false,
            DEVICE_STATUS_DATA_MAX_LENGTH,
        ));
    }
    if let Some(n) = &d.network_data {
        let np = path.child("networkData");
        if n.interface_name
            .as_ref()
            .is_some_and(|s| s.len() > INTERFACE_NAME_MAX)
        {
            errs.push(FieldError::too_long(
                np.child("interfaceName"),
                INTERFACE_NAME_MAX,
            ));
        }
        if n.hardware_address
            .as_ref()
            .is_some_and(|s| s.len() > HARDWARE_ADDRESS_MAX)
        {
            errs.push(FieldError::too_long(
                np.child("hardwareAddress"),
                HARDWARE_ADDRESS_MAX,
            ));
        }
        errs.extend(validate_unique_list(
            n.ips.as_deref().unwrap_or(&[]),
            Some(NETWORK_IPS_MAX),
            &np.child("ips"),
            |ip, p| {
                if is_interface_address(ip) {
                    Vec::new()
                } else {
                    vec![FieldError::invalid(
                        p,
                        BadValue::str(ip),
                        "must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)",
                    )]
                }
            },
            Clone::clone,
            |k| BadValue::str(k),
        ));
    }
    errs
}

/// `<ip>/<prefix>` with a prefix that fits the address family.
fn is_interface_address(s: &str) -> bool {
    let Some((ip, prefix)) = s.split_once('/') else {
        return false;
    };
    let Ok(prefix) = prefix.parse::<u8>() else {
        return false;
    };
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => prefix <= 32,
        Ok(std::net::IpAddr::V6(_)) => prefix <= 128,
        Err(_) => false,
    }
}
