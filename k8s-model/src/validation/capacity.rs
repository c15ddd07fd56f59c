//! Validation of a device's `capacity` entries and their consumable-capacity
//! `requestPolicy` (`validateMultiAllocatableDeviceCapacity`, `validateRequestPolicy`,
//! `validateRequestPolicyRange` in Go). Pure functions.
//!
//! Paths and messages follow the 1.35 source for 1.34–1.35 and the 1.37-cycle source for
//! 1.36–1.37 (1.36 itself not confirmed): up to 1.35 a default below `min` or above `max`
//! is reported on `validRange.min`/`validRange.max`, later on `validRange.default`. The
//! 1.37 guards (step must be positive, bounds within `[0, 2^63-1]` on the integer path)
//! are applied on every release, because the older Go code divides by zero or overflows
//! there. Quantities print in Go's canonical form.

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, DeviceCapacity,
};

use super::device::parse_quantity;
use super::field::{BadValue, FieldError, FieldPath, validate_unique_list};
use super::quantity::ParsedQuantity;
use super::slice::SliceContext;

/// `resource.CapacityRequestPolicyDiscreteMaxOptions`.
pub const CAPACITY_REQUEST_POLICY_MAX_VALID_VALUES: usize = 10;

/// One capacity entry at `path` (`capacity[memory]`): a parsable value, and a request
/// policy only on devices with `allowMultipleAllocations: true`.
pub(super) fn validate_capacity(
    cap: &DeviceCapacity,
    path: &FieldPath,
    multi_allocatable: bool,
    ctx: &SliceContext<'_>,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let value = parse_quantity(&cap.value.0, &path.child("value"), &mut errs);
    let Some(policy) = &cap.request_policy else {
        return errs;
    };
    let policy_path = path.child("requestPolicy");
    if !multi_allocatable {
        errs.push(FieldError::forbidden(
            &policy_path,
            "allowMultipleAllocations must be true",
        ));
        return errs;
    }
    if let Some(value) = value {
        errs.extend(validate_request_policy(&value, policy, &policy_path, ctx));
    }
    errs
}

fn q_str(q: &ParsedQuantity) -> BadValue {
    BadValue::Str(q.to_string())
}

fn validate_request_policy(
    capacity: &ParsedQuantity,
    policy: &CapacityRequestPolicy,
    path: &FieldPath,
    ctx: &SliceContext<'_>,
) -> Vec<FieldError> {
    let values = policy.valid_values.as_deref().unwrap_or(&[]);
    if !values.is_empty() && policy.valid_range.is_some() {
        return vec![FieldError::forbidden(
            path,
            r#"exactly one policy can be specified, cannot specify "validValues" and "validRange" at the same time"#,
        )];
    }
    let mut errs = Vec::new();
    let default = match &policy.default {
        Some(d) => parse_quantity(&d.0, &path.child("default"), &mut errs),
        None => None,
    };
    if !values.is_empty() {
        match (&policy.default, default) {
            (None, _) => errs.push(FieldError::required(
                path.child("default"),
                "required when validValues is defined",
            )),
            (Some(_), Some(d)) => errs.extend(validate_valid_values(
                &d,
                capacity,
                values,
                &path.child("validValues"),
                ctx,
            )),
            (Some(_), None) => {}
        }
    } else if let Some(range) = &policy.valid_range {
        match (&policy.default, default) {
            (None, _) => errs.push(FieldError::required(
                path.child("default"),
                "required when validRange is defined",
            )),
            (Some(_), Some(d)) => errs.extend(validate_range(
                &d,
                capacity,
                range,
                &path.child("validRange"),
                ctx,
            )),
            (Some(_), None) => {}
        }
    }
    errs
}

fn fractional_enabled(ctx: &SliceContext<'_>) -> bool {
    ctx.version.minor() >= 37 && ctx.gates.enabled("DRAFractionalCapacityRange")
}

/// `validValues`: ascending, unique, at most 10, none above the capacity, containing the
/// default. Uniqueness compares `Value()` (exact decimals with DRAFractionalCapacityRange).
fn validate_valid_values(
    default: &ParsedQuantity,
    capacity: &ParsedQuantity,
    raw: &[k8s_openapi::apimachinery::pkg::api::resource::Quantity],
    path: &FieldPath,
    ctx: &SliceContext<'_>,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let parsed: Vec<Option<ParsedQuantity>> = raw
        .iter()
        .enumerate()
        .map(|(i, q)| parse_quantity(&q.0, &path.index(i), &mut errs))
        .collect();
    for i in 0..parsed.len().saturating_sub(1) {
        if let (Some(a), Some(b)) = (&parsed[i], &parsed[i + 1])
            && a > b
        {
            errs.push(FieldError::invalid(
                path.index(i + 1),
                q_str(b),
                "values must be sorted in ascending order",
            ));
        }
    }
    let exact_keys = fractional_enabled(ctx);
    let mut found_default = false;
    let items: Vec<ParsedQuantity> = parsed.iter().flatten().copied().collect();
    if items.len() == parsed.len() {
        errs.extend(validate_unique_list(
            &items,
            Some(CAPACITY_REQUEST_POLICY_MAX_VALID_VALUES),
            path,
            |option, p| {
                let mut e = Vec::new();
                if option > capacity {
                    e.push(FieldError::invalid(
                        p,
                        q_str(option),
                        format!("option is larger than capacity value: {capacity}"),
                    ));
                }
                found_default |= option == default;
                e
            },
            |q| {
                if exact_keys {
                    q.to_decimal_string()
                } else {
                    q.to_i64_value()
                        .map_or_else(|| q.to_decimal_string(), |v| v.to_string())
                }
            },
            |k| BadValue::str(k),
        ));
    } else {
        found_default = items.contains(default);
    }
    if !found_default {
        errs.push(FieldError::invalid(
            path,
            q_str(default),
            "default value is not valid according to the requestPolicy",
        ));
    }
    errs
}

/// `validRange`: `min <= default <= max <= capacity`, `step > 0`, `min + step <=
/// capacity`, and default and max reachable as `min + n·step`.
fn validate_range(
    default: &ParsedQuantity,
    capacity: &ParsedQuantity,
    range: &CapacityRequestPolicyRange,
    path: &FieldPath,
    ctx: &SliceContext<'_>,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if range.min.0.trim().is_empty() {
        errs.push(FieldError::required(
            path.child("min"),
            "required when validRange is defined",
        ));
        return errs;
    }
    let Some(min) = parse_quantity(&range.min.0, &path.child("min"), &mut errs) else {
        return errs;
    };
    let max = match &range.max {
        Some(m) => match parse_quantity(&m.0, &path.child("max"), &mut errs) {
            Some(m) => Some(m),
            None => return errs,
        },
        None => None,
    };
    let step = match &range.step {
        Some(s) => match parse_quantity(&s.0, &path.child("step"), &mut errs) {
            Some(s) => Some(s),
            None => return errs,
        },
        None => None,
    };
    let newer_paths = ctx.version.minor() >= 36;
    if min > *capacity {
        errs.push(FieldError::invalid(
            path.child("min"),
            q_str(&min),
            format!("min is larger than capacity value: {capacity}"),
        ));
    }
    if *default < min {
        let at = if newer_paths { "default" } else { "min" };
        errs.push(FieldError::invalid(
            path.child(at),
            q_str(default),
            format!("default is less than min: {min}"),
        ));
    }
    if let Some(max) = &max {
        if min > *max {
            errs.push(FieldError::invalid(
                path.child("max"),
                q_str(&min),
                format!("min is larger than max: {max}"),
            ));
        }
        if max > capacity {
            errs.push(FieldError::invalid(
                path.child("max"),
                q_str(max),
                format!("max is larger than capacity value: {capacity}"),
            ));
        }
        if default > max {
            let at = if newer_paths { "default" } else { "max" };
            errs.push(FieldError::invalid(
                path.child(at),
                q_str(default),
                format!("default is more than max: {max}"),
            ));
        }
    }
    let named = [
        ("default", Some(*default)),
        ("min", Some(min)),
        ("max", max),
        ("step", step),
    ];
    let use_milli = fractional_enabled(ctx)
        && named
            .iter()
            .any(|(_, q)| q.is_some_and(|q| !q.is_integer()));
    if use_milli {
        let mut unsafe_value = false;
        for (name, q) in named {
            if let Some(q) = q
                && (!q.fits_milli() || q.to_milli_value().is_none())
            {
                errs.push(FieldError::invalid(
                    path.child(name),
                    q_str(&q),
                    "value cannot be represented as a milli value",
                ));
                unsafe_value = true;
            }
        }
        if unsafe_value {
            return errs;
        }
    }
    let Some(step) = step else {
        return errs;
    };
    let step_path = path.child("step");
    if step.sign() <= 0 {
        errs.push(FieldError::invalid(
            &step_path,
            q_str(&step),
            "must be greater than zero",
        ));
        return errs;
    }
    match min.checked_add(&step) {
        Some(added) if added > *capacity => errs.push(FieldError::invalid(
            &step_path,
            q_str(&step),
            format!("one step {added} is larger than capacity value: {capacity}"),
        )),
        _ => {}
    }
    if !use_milli {
        let mut unsafe_value = false;
        for (name, q) in named {
            let Some(q) = q else { continue };
            let negative = q.sign() < 0 && ctx.version.minor() >= 37;
            if negative {
                errs.push(FieldError::invalid(
                    path.child(name),
                    q_str(&q),
                    "must be greater than or equal to 0",
                ));
                unsafe_value = true;
            } else if q.to_i64_value().is_none() {
                errs.push(FieldError::invalid(
                    path.child(name),
                    q_str(&q),
                    "must not be larger than 9223372036854775807",
                ));
                unsafe_value = true;
            }
        }
        if unsafe_value {
            return errs;
        }
    }
    errs.extend(check_step(default, &min, &step, use_milli, &step_path));
    if let Some(max) = &max {
        errs.extend(check_step(max, &min, &step, use_milli, &step_path));
    }
    errs
}

/// `(value - min) % step == 0` on `Value()` (or `MilliValue()` with fractions).
fn check_step(
    value: &ParsedQuantity,
    min: &ParsedQuantity,
    step: &ParsedQuantity,
    use_milli: bool,
    path: &FieldPath,
) -> Vec<FieldError> {
    let view = |q: &ParsedQuantity| {
        if use_milli {
            q.to_milli_value()
        } else {
            q.to_i64_value()
        }
    };
    let (Some(v), Some(m), Some(s)) = (view(value), view(min), view(step)) else {
        return Vec::new();
    };
    if s == 0 || (i128::from(v) - i128::from(m)) % i128::from(s) == 0 {
        return Vec::new();
    }
    vec![FieldError::invalid(
        path,
        q_str(value),
        format!("value is not a multiple of a given step ({step}) from ({min})"),
    )]
}
