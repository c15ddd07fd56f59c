//! Cross-slice checks of one resource pool: what the API server cannot see (it validates
//! slices one by one) but the scheduler's allocator and the Go publisher helper refuse
//! (a pool with duplicate devices or counter sets, or dangling counter references, is
//! skipped as invalid). The publisher runs these before writing. Pure functions.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::resource::v1::ResourceSlice;

use crate::release::KubeVersion;

/// One cross-slice problem of a pool. Slice numbers index the slice list passed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolProblem {
    /// A slice names another driver or pool than the first slice.
    ForeignSlice {
        slice: usize,
        driver: String,
        pool: String,
        expected_driver: String,
        expected_pool: String,
    },
    /// A slice carries another pool generation than the first slice.
    GenerationMismatch {
        slice: usize,
        generation: i64,
        expected: i64,
    },
    /// A slice's `resourceSliceCount` differs from the number of slices in the pool.
    SliceCountMismatch {
        slice: usize,
        resource_slice_count: i64,
        slices: usize,
    },
    /// A device name occurs in two slices (or twice in one).
    DuplicateDevice {
        device: String,
        first_slice: usize,
        slice: usize,
    },
    /// A counter-set name occurs in two slices (or twice in one).
    DuplicateCounterSet {
        counter_set: String,
        first_slice: usize,
        slice: usize,
    },
    /// A device consumes from a counter set no slice of the pool defines.
    UnknownCounterSet {
        slice: usize,
        device: String,
        counter_set: String,
    },
    /// A device consumes a counter its counter set does not have.
    UnknownCounter {
        slice: usize,
        device: String,
        counter_set: String,
        counter: String,
    },
    /// 1.35+: a slice holds both `devices` and `sharedCounters`.
    DevicesWithCounterSets { slice: usize },
    /// 1.34: a device consumes from a counter set defined in another slice.
    CounterSetInOtherSlice {
        slice: usize,
        device: String,
        counter_set: String,
        defined_in: usize,
    },
}

impl fmt::Display for PoolProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolProblem::ForeignSlice {
                slice,
                driver,
                pool,
                expected_driver,
                expected_pool,
            } => write!(
                f,
                "slice {slice} belongs to driver {driver:?} pool {pool:?}, not driver {expected_driver:?} pool {expected_pool:?}"
            ),
            PoolProblem::GenerationMismatch {
                slice,
                generation,
                expected,
            } => {
                write!(
                    f,
                    "slice {slice} has pool generation {generation}, expected {expected}"
                )
            }
            PoolProblem::SliceCountMismatch {
                slice,
                resource_slice_count,
                slices,
            } => write!(
                f,
                "slice {slice} declares resourceSliceCount {resource_slice_count} but the pool has {slices} slices"
            ),
            PoolProblem::DuplicateDevice {
                device,
                first_slice,
                slice,
            } => {
                write!(
                    f,
                    "device {device:?} in slice {slice} is already defined in slice {first_slice}"
                )
            }
            PoolProblem::DuplicateCounterSet {
                counter_set,
                first_slice,
                slice,
            } => {
                write!(
                    f,
                    "counter set {counter_set:?} in slice {slice} is already defined in slice {first_slice}"
                )
            }
            PoolProblem::UnknownCounterSet {
                slice,
                device,
                counter_set,
            } => {
                write!(
                    f,
                    "device {device:?} in slice {slice} consumes from unknown counter set {counter_set:?}"
                )
            }
            PoolProblem::UnknownCounter {
                slice,
                device,
                counter_set,
                counter,
            } => write!(
                f,
                "device {device:?} in slice {slice} consumes unknown counter {counter:?} of counter set {counter_set:?}"
            ),
            PoolProblem::DevicesWithCounterSets { slice } => {
                write!(
                    f,
                    "slice {slice} has both devices and sharedCounters, which Kubernetes 1.35+ forbids"
                )
            }
            PoolProblem::CounterSetInOtherSlice {
                slice,
                device,
                counter_set,
                defined_in,
            } => write!(
                f,
                "device {device:?} in slice {slice} consumes from counter set {counter_set:?} of slice {defined_in}; Kubernetes 1.34 needs it in the same slice"
            ),
        }
    }
}

/// Checks the slices of one pool (the desired slices of one generation) for problems
/// that hold on every release: consistent driver/pool/generation/count, device and
/// counter-set names unique across the pool, and every `consumesCounters` reference
/// resolving to a counter set and counter somewhere in the pool. Deterministic; problems
/// are listed in slice order.
pub fn validate_pool(slices: &[&ResourceSlice]) -> Vec<PoolProblem> {
    let mut problems = Vec::new();
    let Some(first) = slices.first() else {
        return problems;
    };
    let (driver, pool) = (&first.spec.driver, &first.spec.pool);
    for (i, s) in slices.iter().enumerate() {
        let sp = &s.spec;
        if sp.driver != *driver || sp.pool.name != pool.name {
            problems.push(PoolProblem::ForeignSlice {
                slice: i,
                driver: sp.driver.clone(),
                pool: sp.pool.name.clone(),
                expected_driver: driver.clone(),
                expected_pool: pool.name.clone(),
            });
        }
        if sp.pool.generation != pool.generation {
            problems.push(PoolProblem::GenerationMismatch {
                slice: i,
                generation: sp.pool.generation,
                expected: pool.generation,
            });
        }
        if usize::try_from(sp.pool.resource_slice_count).ok() != Some(slices.len()) {
            problems.push(PoolProblem::SliceCountMismatch {
                slice: i,
                resource_slice_count: sp.pool.resource_slice_count,
                slices: slices.len(),
            });
        }
    }

    let mut devices: BTreeMap<&str, usize> = BTreeMap::new();
    let mut sets: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, s) in slices.iter().enumerate() {
        for d in s.spec.devices.iter().flatten() {
            match devices.get(d.name.as_str()) {
                Some(&first_slice) => problems.push(PoolProblem::DuplicateDevice {
                    device: d.name.clone(),
                    first_slice,
                    slice: i,
                }),
                None => {
                    devices.insert(&d.name, i);
                }
            }
        }
        for c in s.spec.shared_counters.iter().flatten() {
            match sets.get(c.name.as_str()) {
                Some(&first_slice) => problems.push(PoolProblem::DuplicateCounterSet {
                    counter_set: c.name.clone(),
                    first_slice,
                    slice: i,
                }),
                None => {
                    sets.insert(&c.name, i);
                }
            }
        }
    }

    for (i, s) in slices.iter().enumerate() {
        for d in s.spec.devices.iter().flatten() {
            for c in d.consumes_counters.iter().flatten() {
                let Some(&at) = sets.get(c.counter_set.as_str()) else {
                    problems.push(PoolProblem::UnknownCounterSet {
                        slice: i,
                        device: d.name.clone(),
                        counter_set: c.counter_set.clone(),
                    });
                    continue;
                };
                let set = slices[at]
                    .spec
                    .shared_counters
                    .iter()
                    .flatten()
                    .find(|cs| cs.name == c.counter_set);
                for counter in c.counters.keys() {
                    if !set.is_some_and(|cs| cs.counters.contains_key(counter)) {
                        problems.push(PoolProblem::UnknownCounter {
                            slice: i,
                            device: d.name.clone(),
                            counter_set: c.counter_set.clone(),
                            counter: counter.clone(),
                        });
                    }
                }
            }
        }
    }
    problems
}

/// [`validate_pool`] plus the pool layout of a release (KEP-4815): from 1.35 no slice
/// may hold both devices and counter sets; on 1.34 devices must find their counter sets
/// in their own slice. Deterministic.
pub fn validate_pool_for(slices: &[&ResourceSlice], version: KubeVersion) -> Vec<PoolProblem> {
    let mut problems = validate_pool(slices);
    for (i, s) in slices.iter().enumerate() {
        let has_devices = s.spec.devices.as_ref().is_some_and(|d| !d.is_empty());
        let has_sets = s
            .spec
            .shared_counters
            .as_ref()
            .is_some_and(|c| !c.is_empty());
        if version.counters_in_own_slices() {
            if has_devices && has_sets {
                problems.push(PoolProblem::DevicesWithCounterSets { slice: i });
            }
            continue;
        }
        for d in s.spec.devices.iter().flatten() {
            for c in d.consumes_counters.iter().flatten() {
                let own = s
                    .spec
                    .shared_counters
                    .iter()
                    .flatten()
                    .any(|cs| cs.name == c.counter_set);
                let elsewhere = slices.iter().enumerate().find(|(j, o)| {
                    *j != i
                        && o.spec
                            .shared_counters
                            .iter()
                            .flatten()
                            .any(|cs| cs.name == c.counter_set)
                });
                if let (false, Some((j, _))) = (own, elsewhere) {
                    problems.push(PoolProblem::CounterSetInOtherSlice {
                        slice: i,
                        device: d.name.clone(),
                        counter_set: c.counter_set.clone(),
                        defined_in: j,
                    });
                }
            }
        }
    }
    problems
}
