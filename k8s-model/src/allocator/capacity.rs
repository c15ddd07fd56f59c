//! Consumable capacity (KEP-5075) as the allocator applies it: rounding a request by a
//! capacity's request policy, and deciding what an allocation of a multi-allocatable
//! device consumes. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, DeviceCapacity};

use crate::release::{FeatureGates, KubeVersion};
use crate::validation::quantity::{ParsedQuantity as Q, QuantityFormat};

fn parse(s: &str) -> Result<Q, String> {
    Q::parse(s).map_err(|e| format!("invalid quantity {s:?}: {}", e.go_message()))
}

/// The release-dependent parts of the scheduler's rounding (`roundUpRange` in
/// k8s.io/dynamic-resource-allocation/structured/internal/{experimental,incubating}/
/// consumable_capacity.go).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rounding {
    /// 1.37+: a value rounded to a step is written in the step's format
    /// (`NewQuantity(v, validRange.Step.Format)`); 1.34–1.36 write it in BinarySI
    /// (`NewQuantity(v, resource.BinarySI)`).
    pub step_format: bool,
    /// DRAFractionalCapacityRange (1.37+): milli-unit arithmetic when min, max and step
    /// are exact in milli-units; otherwise (and before) Go's `Value()`, which rounds
    /// each quantity up to an integer first.
    pub fractional_range: bool,
}

impl Rounding {
    /// The rules of the release and gates the scheduler runs with.
    pub fn for_gates(gates: &FeatureGates) -> Self {
        Rounding {
            step_format: gates.version().minor() >= 37,
            fractional_range: gates.enabled("DRAFractionalCapacityRange"),
        }
    }

    /// The newest release's rules with its default gates.
    pub fn newest() -> Self {
        Self::for_gates(&FeatureGates::defaults(KubeVersion::NEWEST))
    }
}

/// `q` in milli-units if exact (Go's `safeMilliValue`).
fn exact_milli(q: &Q) -> Option<i64> {
    if q.fits_milli() {
        q.to_milli_value()
    } else {
        None
    }
}

/// What one request consumes of a capacity under its policy, or `Err` when the device
/// is ineligible (request above `max`, or no valid value large enough).
///
/// Rules (KEP-5075, `kubernetes-dra-api.md` §2.1), as the scheduler's
/// `calculateConsumedCapacity`: no request → the policy default (or the full value
/// without a policy); below `min` → `min`; with `step` → rounded up to `min + n·step`,
/// always a new quantity, even for a request already on a step (its format per
/// [`Rounding`]: `20Gi` on a `1048576` step is written `21474836480` by 1.37); above
/// `max` → ineligible; with `validValues` → the smallest valid value not below the
/// request. Without a policy the request is consumed as asked.
pub fn consumed_by_policy(
    cap: &DeviceCapacity,
    request: Option<&Q>,
    rules: Rounding,
) -> Result<Option<Q>, String> {
    let value = parse(&cap.value.0)?;
    let Some(policy) = &cap.request_policy else {
        return Ok(Some(request.copied().unwrap_or(value)));
    };
    round_by_policy(policy, &value, request, rules).map(Some)
}

fn round_by_policy(
    policy: &CapacityRequestPolicy,
    value: &Q,
    request: Option<&Q>,
    rules: Rounding,
) -> Result<Q, String> {
    let default = match &policy.default {
        Some(d) => parse(&d.0)?,
        None => *value,
    };
    let Some(req) = request else {
        return Ok(default);
    };
    if let Some(valid) = &policy.valid_values {
        let mut values: Vec<Q> = valid
            .iter()
            .map(|v| parse(&v.0))
            .collect::<Result<_, _>>()?;
        values.sort();
        return values
            .into_iter()
            .find(|v| v >= req)
            .ok_or_else(|| format!("request {req} is above every valid value"));
    }
    if let Some(range) = &policy.valid_range {
        let min = parse(&range.min.0)?;
        let max = range.max.as_ref().map(|m| parse(&m.0)).transpose()?;
        let amount = match &range.step {
            _ if *req < min => min,
            None => *req,
            Some(step) => round_up_to_step(req, &min, max.as_ref(), &parse(&step.0)?, rules)?,
        };
        if let Some(max) = max
            && amount > max
        {
            return Err(format!(
                "request {req} rounds to {amount}, above the maximum {max}"
            ));
        }
        return Ok(amount);
    }
    Ok(*req)
}

/// `min + n·step` for the smallest `n` reaching `req` (`req >= min`), as `roundUpRange`.
fn round_up_to_step(
    req: &Q,
    min: &Q,
    max: Option<&Q>,
    step: &Q,
    rules: Rounding,
) -> Result<Q, String> {
    let format = if rules.step_format {
        step.format()
    } else {
        QuantityFormat::BinarySI
    };
    let too_big = || format!("request {req} cannot be rounded to a step of {step} from {min}");
    let up = |r: i64, m: i64, s: i64| -> Option<i64> {
        if s <= 0 {
            return None;
        }
        let added = r.checked_sub(m)?;
        let n = added / s + i64::from(added % s != 0);
        m.checked_add(s.checked_mul(n)?)
    };
    let milli_range = rules.fractional_range
        && [Some(min), max, Some(step)]
            .into_iter()
            .flatten()
            .all(|q| exact_milli(q).is_some())
        && exact_milli(step).is_some_and(|s| s >= 1);
    if milli_range {
        let r =
            exact_milli(req).ok_or_else(|| format!("request {req} is not exact in milli-units"))?;
        let v = up(
            r,
            exact_milli(min).unwrap_or(0),
            exact_milli(step).unwrap_or(0),
        )
        .ok_or_else(too_big)?;
        return Ok(if v % 1000 == 0 {
            Q::from_i64_in(v / 1000, format)
        } else {
            Q::from_milli_in(v, format)
        });
    }
    let int = |q: &Q| q.to_i64_value().ok_or_else(too_big);
    let v = up(int(req)?, int(min)?, int(step)?).ok_or_else(too_big)?;
    Ok(Q::from_i64_in(v, format))
}

/// The capacities one allocation of a multi-allocatable device consumes: every
/// capacity the device publishes, each rounded by its policy (absent requests take the
/// default). `Err` names the capacity that makes the device ineligible.
pub fn consumed_capacity(
    capacity: &BTreeMap<String, DeviceCapacity>,
    requests: &BTreeMap<String, Q>,
    rules: Rounding,
) -> Result<BTreeMap<String, Q>, String> {
    let mut out = BTreeMap::new();
    for (name, cap) in capacity {
        let req = requests.get(name);
        match consumed_by_policy(cap, req, rules) {
            Ok(Some(q)) => {
                out.insert(name.clone(), q);
            }
            Ok(None) => {}
            Err(e) => return Err(format!("capacity {name}: {e}")),
        }
    }
    Ok(out)
}

/// The unqualified capacity name of a request key (`gpu.tessera.dev/memory` or `memory`
/// for driver `gpu.tessera.dev` → `memory`); `None` for another domain.
pub fn local_name<'a>(key: &'a str, driver: &str) -> Option<&'a str> {
    match key.split_once('/') {
        Some((domain, name)) if domain == driver => Some(name),
        Some(_) => None,
        None => Some(key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::CapacityRequestPolicyRange;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn q(s: &str) -> Q {
        Q::parse(s).unwrap()
    }

    fn ranged(
        value: &str,
        default: &str,
        min: &str,
        step: Option<&str>,
        max: Option<&str>,
    ) -> DeviceCapacity {
        DeviceCapacity {
            value: Quantity(value.into()),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(Quantity(default.into())),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: Quantity(min.into()),
                    max: max.map(|m| Quantity(m.into())),
                    step: step.map(|s| Quantity(s.into())),
                }),
                valid_values: None,
            }),
        }
    }

    /// Requests round up to min + n·step, absent requests take the default, and a
    /// request above max makes the device ineligible.
    #[test]
    fn policy_rounding_table() {
        let mem = ranged("80Gi", "80Gi", "1Mi", Some("1Mi"), None);
        let compute = ranged("100", "0", "0", Some("1"), Some("100"));
        let cases: &[(&DeviceCapacity, Option<&str>, Result<&str, ()>)] = &[
            (&mem, Some("20Gi"), Ok("20Gi")),
            (&mem, Some("1500Ki"), Ok("2Mi")),
            (&mem, Some("1"), Ok("1Mi")),
            (&mem, None, Ok("80Gi")),
            (&compute, Some("25"), Ok("25")),
            (&compute, None, Ok("0")),
            (&compute, Some("101"), Err(())),
            (&compute, Some("500m"), Ok("1")),
        ];
        for (cap, req, want) in cases {
            let got = consumed_by_policy(cap, req.map(q).as_ref(), Rounding::newest());
            match want {
                Ok(w) => assert_eq!(got.unwrap().unwrap(), q(w), "{req:?}"),
                Err(()) => assert!(got.is_err(), "{req:?}"),
            }
        }
    }

    /// Valid values pick the smallest one not below the request.
    #[test]
    fn valid_values_pick_the_next_value() {
        let cap = DeviceCapacity {
            value: Quantity("100".into()),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(Quantity("10".into())),
                valid_range: None,
                valid_values: Some(vec![
                    Quantity("10".into()),
                    Quantity("50".into()),
                    Quantity("100".into()),
                ]),
            }),
        };
        assert_eq!(
            consumed_by_policy(&cap, Some(&q("20")), Rounding::newest())
                .unwrap()
                .unwrap(),
            q("50")
        );
        assert!(consumed_by_policy(&cap, Some(&q("101")), Rounding::newest()).is_err());
    }
}
