//! Which of a pool's slices the publisher dry-runs to learn which gated fields the
//! API server drops. On create the server drops a gate's fields from every object or
//! from none, so one slice per gate the pool uses is enough: a MIG-mode node's five
//! slices need one dry run, not five (at 1,000 plugins starting at once, thousands of
//! requests fewer).

use std::collections::BTreeSet;

use k8s_model::validation::gates_used;
use k8s_openapi::api::resource::v1::ResourceSlice;

/// The indices, ascending, of a few slices that together use every gate `desired`
/// uses (greedy: each pick covers the most gates not yet covered, the first slice on a
/// tie). Empty when the pool sets no gated field: then the server drops nothing.
pub fn slices_to_probe(desired: &[ResourceSlice]) -> Vec<usize> {
    let used: Vec<Vec<&'static str>> = desired.iter().map(gates_used).collect();
    let mut left: BTreeSet<&'static str> = used.iter().flatten().copied().collect();
    let mut picked = Vec::new();
    while !left.is_empty() {
        let mut best: Option<(usize, usize)> = None;
        for (i, gates) in used.iter().enumerate() {
            let n = gates.iter().filter(|g| left.contains(*g)).count();
            if n > best.map_or(0, |(_, b)| b) {
                best = Some((i, n));
            }
        }
        let Some((i, _)) = best else { break };
        for g in &used[i] {
            left.remove(g);
        }
        picked.push(i);
    }
    picked.sort_unstable();
    picked
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        Counter, CounterSet, Device, DeviceCounterConsumption, DeviceTaint, ResourceSliceSpec,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::collections::BTreeMap;

    fn slice(devices: Vec<Device>, counters: bool) -> ResourceSlice {
        ResourceSlice {
            spec: ResourceSliceSpec {
                devices: Some(devices),
                shared_counters: counters.then(|| {
                    vec![CounterSet {
                        name: "gpu-0".into(),
                        counters: BTreeMap::from([(
                            "memory".to_string(),
                            Counter {
                                value: Quantity("80Gi".into()),
                            },
                        )]),
                    }]
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn plain(name: &str) -> Device {
        Device {
            name: name.into(),
            ..Default::default()
        }
    }

    fn consuming(name: &str) -> Device {
        Device {
            consumes_counters: Some(vec![DeviceCounterConsumption {
                counter_set: "gpu-0".into(),
                counters: BTreeMap::from([(
                    "memory".to_string(),
                    Counter {
                        value: Quantity("10Gi".into()),
                    },
                )]),
                ..Default::default()
            }]),
            ..plain(name)
        }
    }

    fn tainted(name: &str) -> Device {
        Device {
            taints: Some(vec![DeviceTaint {
                key: "gpu.tessera.dev/unhealthy".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..plain(name)
        }
    }

    #[test]
    fn a_pool_without_gated_fields_needs_no_dry_run() {
        let pool = vec![slice(vec![plain("gpu-0"), plain("gpu-1")], false)];
        assert!(slices_to_probe(&pool).is_empty());
    }

    #[test]
    fn a_mig_pool_of_five_slices_needs_one_dry_run() {
        // The counter set's slice and four slices of devices consuming from it: one gate.
        let mut pool = vec![slice(vec![], true)];
        pool.extend((0..4).map(|i| slice(vec![consuming(&format!("mig-{i}"))], false)));
        assert_eq!(slices_to_probe(&pool), vec![0]);
    }

    #[test]
    fn each_gate_is_probed_once_by_the_slice_that_covers_most() {
        let pool = vec![
            slice(vec![tainted("gpu-0")], false),
            slice(vec![consuming("mig-0"), tainted("gpu-1")], false),
            slice(vec![consuming("mig-1")], false),
            slice(vec![plain("gpu-2")], false),
        ];
        assert_eq!(slices_to_probe(&pool), vec![1]);
        let pool = vec![
            slice(vec![tainted("gpu-0")], false),
            slice(vec![plain("gpu-1")], false),
            slice(vec![consuming("mig-1")], false),
        ];
        assert_eq!(slices_to_probe(&pool), vec![0, 2]);
    }
}
