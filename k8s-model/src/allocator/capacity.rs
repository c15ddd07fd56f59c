//! Consumable capacity (KEP-5075) as the allocator applies it: rounding a request by a
//! capacity's request policy, and deciding what an allocation of a multi-allocatable
//! device consumes. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, DeviceCapacity};

use crate::validation::quantity::{ParsedQuantity as Q, QuantityFormat};

fn parse(s: &str) -> Result<Q, String> {
    Q::parse(s).map_err(|e| format!("invalid quantity {s:?}: {}", e.go_message()))
}

fn milli(q: &Q) -> Result<i128, String> {
    q.to_milli_value()
        .map(i128::from)
        .ok_or_else(|| format!("quantity {q} is out of range"))
}

/// A quantity of `m` milli-units, written in the style of `like` (binary suffixes for a
/// binary-SI step, so `20Gi` stays `20Gi`), then canonicalized by the parser.
fn from_milli(m: i128, like: &Q) -> Result<Q, String> {
    if m % 1000 != 0 {
        return parse(&format!("{m}m"));
    }
    let v = m / 1000;
    if like.format() == QuantityFormat::BinarySI && v != 0 {
        for (suffix, pow) in [
            ("Ei", 60),
            ("Pi", 50),
            ("Ti", 40),
            ("Gi", 30),
            ("Mi", 20),
            ("Ki", 10),
        ] {
            let unit = 1i128 << pow;
            if v % unit == 0 {
                return parse(&format!("{}{suffix}", v / unit));
            }
        }
    }
    parse(&v.to_string())
}

/// What one request consumes of a capacity under its policy, or `Err` when the device
/// is ineligible (request above `max`, or no valid value large enough).
///
/// Rules (KEP-5075, `kubernetes-dra-api.md` §2.1): no request → the policy default (or
/// the full value without a policy); below `min` → `min`; with `step` → rounded up to
/// `min + n·step`; above `max` → ineligible; with `validValues` → the smallest valid
/// value not below the request. Without a policy the request is consumed as asked.
pub fn consumed_by_policy(cap: &DeviceCapacity, request: Option<&Q>) -> Result<Option<Q>, String> {
    let value = parse(&cap.value.0)?;
    let Some(policy) = &cap.request_policy else {
        return Ok(Some(request.copied().unwrap_or(value)));
    };
    round_by_policy(policy, &value, request).map(Some)
}

fn round_by_policy(
    policy: &CapacityRequestPolicy,
    value: &Q,
    request: Option<&Q>,
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
        let mut amount = if *req < min { min } else { *req };
        if let Some(step) = &range.step {
            let step = parse(&step.0)?;
            let (s, m, a) = (milli(&step)?, milli(&min)?, milli(&amount)?);
            if s > 0 && (a - m) % s != 0 {
                let n = (a - m + s - 1).div_euclid(s);
                amount = from_milli(m + n * s, &step)?;
            }
        }
        if let Some(max) = &range.max {
            let max = parse(&max.0)?;
            if amount > max {
                return Err(format!(
                    "request {req} rounds to {amount}, above the maximum {max}"
                ));
            }
        }
        return Ok(amount);
    }
    Ok(*req)
}

/// The capacities one allocation of a multi-allocatable device consumes: every
/// capacity the device publishes, each rounded by its policy (absent requests take the
/// default). `Err` names the capacity that makes the device ineligible.
pub fn consumed_capacity(
    capacity: &BTreeMap<String, DeviceCapacity>,
    requests: &BTreeMap<String, Q>,
) -> Result<BTreeMap<String, Q>, String> {
    let mut out = BTreeMap::new();
    for (name, cap) in capacity {
        let req = requests.get(name);
        match consumed_by_policy(cap, req) {
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
            let got = consumed_by_policy(cap, req.map(q).as_ref());
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
            consumed_by_policy(&cap, Some(&q("20"))).unwrap().unwrap(),
            q("50")
        );
        assert!(consumed_by_policy(&cap, Some(&q("101"))).is_err());
    }
}
