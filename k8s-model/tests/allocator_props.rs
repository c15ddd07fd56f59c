//! Property tests of the allocator model: random small pools (attributes, a shared
//! counter set consumed by some devices, multi-allocatable devices with consumable
//! capacity) and random sequences of claims (exact counts and `All`, request selectors,
//! capacity requests, `matchAttribute`/`distinctAttribute`) with releases in between.
//!
//! Every result is checked by [`check`], written from the rules (not from the
//! allocator): each request gets its count (or every matching device), every selector
//! holds, a plain device is held by one claim only, a multi-allocatable device appears
//! once per request and within its capacity, the counter set is never exceeded, and
//! the constraints hold. A brute-force search over every assignment, using the same
//! check, must agree with the allocator on whether the claim fits.

use std::collections::{BTreeMap, BTreeSet};

use k8s_model::allocator::{AllocError, Allocator};
use k8s_model::release::{FeatureGates, KubeVersion};
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};
use proptest::prelude::*;
use serde_json::{Value, json};

const D: &str = "gpu.tessera.dev";

#[derive(Debug, Clone)]
struct Dev {
    model: u8,
    index: i64,
    /// Units of the pool's one counter this device consumes.
    counter: Option<u8>,
    multi: bool,
    /// `mem` capacity.
    cap: Option<u8>,
}

#[derive(Debug, Clone)]
struct Pool {
    devs: Vec<Dev>,
    counter_total: u8,
}

#[derive(Debug, Clone)]
enum Sel {
    Any,
    Model(u8),
    IndexAtLeast(i64),
}

#[derive(Debug, Clone)]
struct Req {
    /// `None`: allocationMode All.
    count: Option<u8>,
    sel: Sel,
    /// `mem` capacity requested.
    cap: Option<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Cons {
    None,
    MatchModel,
    DistinctIndex,
}

#[derive(Debug, Clone)]
struct Claim {
    reqs: Vec<Req>,
    cons: Cons,
}

#[derive(Debug, Clone)]
enum Step {
    Allocate(Claim),
    /// Release the n-th claim allocated so far (modulo their number).
    Release(usize),
}

fn dev() -> impl Strategy<Value = Dev> {
    (
        0u8..2,
        0i64..3,
        prop::option::of(1u8..=4),
        any::<bool>(),
        prop::option::of(1u8..=8),
    )
        .prop_map(|(model, index, counter, multi, cap)| Dev {
            model,
            index,
            counter,
            multi,
            cap,
        })
}

fn pool() -> impl Strategy<Value = Pool> {
    (prop::collection::vec(dev(), 0..=5), 1u8..=8).prop_map(|(devs, counter_total)| Pool {
        devs,
        counter_total,
    })
}

fn req() -> impl Strategy<Value = Req> {
    let sel = prop_oneof![
        2 => Just(Sel::Any),
        1 => (0u8..2).prop_map(Sel::Model),
        1 => (0i64..3).prop_map(Sel::IndexAtLeast),
    ];
    (
        prop_oneof![4 => (1u8..=3).prop_map(Some), 1 => Just(None)],
        sel,
        prop::option::of(1u8..=6),
    )
        .prop_map(|(count, sel, cap)| Req { count, sel, cap })
}

fn claim() -> impl Strategy<Value = Claim> {
    (
        prop::collection::vec(req(), 1..=2),
        prop_oneof![2 => Just(Cons::None), 1 => Just(Cons::MatchModel), 1 => Just(Cons::DistinctIndex)],
    )
        .prop_map(|(reqs, cons)| Claim { reqs, cons })
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![4 => claim().prop_map(Step::Allocate), 1 => (0usize..4).prop_map(Step::Release)],
        1..=5,
    )
}

fn slices(p: &Pool) -> Vec<ResourceSlice> {
    let devices: Vec<Value> = p
        .devs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut v = json!({"name": format!("d{i}"), "attributes": {
                "type": {"string": "gpu"},
                "model": {"string": format!("m{}", d.model)},
                "index": {"int": d.index}}});
            if d.multi {
                v["allowMultipleAllocations"] = json!(true);
            }
            if let Some(c) = d.cap {
                v["capacity"] = json!({"mem": {"value": c.to_string()}});
            }
            if let Some(c) = d.counter {
                v["consumesCounters"] =
                    json!([{"counterSet": "cs", "counters": {"units": {"value": c.to_string()}}}]);
            }
            v
        })
        .collect();
    let counters = json!({"sharedCounters": [{"name": "cs", "counters": {"units": {"value": p.counter_total.to_string()}}}]});
    let parts = [counters, json!({ "devices": devices })];
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            let mut spec = json!({"driver": D, "nodeName": "n",
                "pool": {"name": "n", "generation": 1, "resourceSliceCount": 2}});
            spec.as_object_mut()
                .unwrap()
                .extend(part.as_object().unwrap().clone());
            serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice", "metadata": {"name": format!("n-{i}")}, "spec": spec}))
            .unwrap()
        })
        .collect()
}

fn classes() -> Vec<DeviceClass> {
    vec![
        serde_json::from_value(
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "gpu"}, "spec": {"selectors": [
            {"cel": {"expression": format!(r#"device.driver == "{D}""#)}},
            {"cel": {"expression": format!(r#"device.attributes["{D}"].type == "gpu""#)}}]}}),
        )
        .unwrap(),
    ]
}

fn gates() -> FeatureGates {
    FeatureGates::parse(
        KubeVersion::NEWEST,
        "DRAPartitionableDevices=true,DRAConsumableCapacity=true",
    )
    .unwrap_or_else(|_| FeatureGates::defaults(KubeVersion::NEWEST))
}

fn to_claim(name: &str, c: &Claim) -> ResourceClaim {
    let requests: Vec<Value> = c
        .reqs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut e = json!({"deviceClassName": "gpu"});
            match r.count {
                Some(n) => e["count"] = json!(n),
                None => e["allocationMode"] = json!("All"),
            }
            let expr = match r.sel {
                Sel::Any => None,
                Sel::Model(m) => Some(format!(r#"device.attributes["{D}"].model == "m{m}""#)),
                Sel::IndexAtLeast(k) => Some(format!(r#"device.attributes["{D}"].index >= {k}"#)),
            };
            if let Some(expr) = expr {
                e["selectors"] = json!([{"cel": {"expression": expr}}]);
            }
            if let Some(c) = r.cap {
                e["capacity"] = json!({"requests": {"mem": c.to_string()}});
            }
            json!({"name": format!("r{i}"), "exactly": e})
        })
        .collect();
    let mut devices = json!({ "requests": requests });
    match c.cons {
        Cons::None => {}
        Cons::MatchModel => {
            devices["constraints"] = json!([{"matchAttribute": format!("{D}/model")}])
        }
        Cons::DistinctIndex => {
            devices["constraints"] = json!([{"distinctAttribute": format!("{D}/index")}])
        }
    }
    serde_json::from_value(
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"}, "spec": {"devices": devices}}),
    )
    .unwrap()
}

/// What earlier claims hold.
#[derive(Debug, Clone, Default)]
struct State {
    plain: BTreeSet<usize>,
    /// Multi-allocatable device → (allocations, `mem` consumed).
    multi: BTreeMap<usize, (u32, u32)>,
    counters: u32,
}

fn selected(s: &Sel, d: &Dev) -> bool {
    match s {
        Sel::Any => true,
        Sel::Model(m) => d.model == *m,
        Sel::IndexAtLeast(k) => d.index >= *k,
    }
}

/// What a pick of `d` for `r` consumes of `mem` (multi-allocatable devices), or `None`
/// when `d` cannot serve `r`'s capacity request at all.
fn consumes(r: &Req, d: &Dev) -> Option<u32> {
    match (r.cap, d.cap) {
        (Some(_), None) => None,
        (Some(want), Some(have)) => (want <= have).then_some(u32::from(want)),
        (None, have) => Some(have.map_or(0, u32::from)),
    }
}

/// Checks a claim's picks (request index, device index) against the rules and the
/// state; returns the `mem` each pick consumes.
fn check(p: &Pool, c: &Claim, picks: &[(usize, usize)], st: &State) -> Result<Vec<u32>, String> {
    let mut consumed = Vec::new();
    for (ri, r) in c.reqs.iter().enumerate() {
        let mine: Vec<usize> = picks
            .iter()
            .filter(|(q, _)| *q == ri)
            .map(|(_, d)| *d)
            .collect();
        let distinct: BTreeSet<usize> = mine.iter().copied().collect();
        if distinct.len() != mine.len() {
            return Err(format!("request {ri} has a device twice"));
        }
        match r.count {
            Some(n) if mine.len() != usize::from(n) => {
                return Err(format!("request {ri}: {} devices, not {n}", mine.len()));
            }
            None => {
                let all: BTreeSet<usize> = (0..p.devs.len())
                    .filter(|&i| selected(&r.sel, &p.devs[i]))
                    .collect();
                if all.is_empty() || all != distinct {
                    return Err(format!(
                        "request {ri} (All): {distinct:?}, matching {all:?}"
                    ));
                }
            }
            _ => {}
        }
    }
    let mut plain_seen = BTreeSet::new();
    let mut mem: BTreeMap<usize, u32> = BTreeMap::new();
    let mut counted = BTreeSet::new();
    let mut counters = st.counters;
    for &(ri, di) in picks {
        let (r, d) = (&c.reqs[ri], &p.devs[di]);
        if !selected(&r.sel, d) {
            return Err(format!("d{di} does not match request {ri}'s selector"));
        }
        let want = consumes(r, d).ok_or(format!("d{di} cannot serve request {ri}'s capacity"))?;
        if d.multi {
            let (n, used) = st.multi.get(&di).copied().unwrap_or_default();
            let total = mem.entry(di).or_insert(used);
            *total += want;
            if d.cap.is_some_and(|cap| *total > u32::from(cap)) {
                return Err(format!("d{di}: mem {total} over its capacity"));
            }
            if n == 0 && counted.insert(di) {
                counters += d.counter.map_or(0, u32::from);
            }
            consumed.push(want);
        } else {
            if st.plain.contains(&di) || !plain_seen.insert(di) {
                return Err(format!("plain device d{di} allocated twice"));
            }
            counters += d.counter.map_or(0, u32::from);
            consumed.push(0);
        }
    }
    if counters > u32::from(p.counter_total) {
        return Err(format!("counter at {counters}, over {}", p.counter_total));
    }
    for (i, &(_, a)) in picks.iter().enumerate() {
        for &(_, b) in &picks[..i] {
            let (a, b) = (&p.devs[a], &p.devs[b]);
            match c.cons {
                Cons::MatchModel if a.model != b.model => return Err("models differ".into()),
                Cons::DistinctIndex if a.index == b.index => return Err("indexes repeat".into()),
                _ => {}
            }
        }
    }
    Ok(consumed)
}

fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    if k == 0 {
        return vec![vec![]];
    }
    if n < k {
        return vec![];
    }
    let mut out = combinations(n - 1, k);
    for mut c in combinations(n - 1, k - 1) {
        c.push(n - 1);
        out.push(c);
    }
    out
}

/// Whether any assignment of devices to the claim's requests passes [`check`].
fn brute_force(p: &Pool, c: &Claim, st: &State) -> bool {
    let options: Vec<Vec<Vec<usize>>> = c
        .reqs
        .iter()
        .map(|r| match r.count {
            Some(n) => combinations(p.devs.len(), usize::from(n)),
            None => vec![
                (0..p.devs.len())
                    .filter(|&i| selected(&r.sel, &p.devs[i]))
                    .collect(),
            ],
        })
        .collect();
    if options.iter().any(|o| o.is_empty()) {
        return false;
    }
    let mut idx = vec![0; options.len()];
    loop {
        let picks: Vec<(usize, usize)> = idx
            .iter()
            .enumerate()
            .flat_map(|(ri, &o)| options[ri][o].iter().map(move |&d| (ri, d)))
            .collect();
        if check(p, c, &picks, st).is_ok() {
            return true;
        }
        // Next combination of options.
        let mut i = 0;
        loop {
            if i == idx.len() {
                return false;
            }
            idx[i] += 1;
            if idx[i] < options[i].len() {
                break;
            }
            idx[i] = 0;
            i += 1;
        }
    }
}

/// The picks of an allocation result, and the `mem` it says each consumes.
fn picks_of(r: &AllocationResult) -> Vec<((usize, usize), Option<u32>)> {
    let results = r
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_deref()
        .unwrap_or_default();
    results
        .iter()
        .map(|x| {
            assert_eq!(x.driver, D);
            assert_eq!(x.pool, "n");
            let ri = x.request.strip_prefix('r').unwrap().parse().unwrap();
            let di = x.device.strip_prefix('d').unwrap().parse().unwrap();
            let mem = x
                .consumed_capacity
                .as_ref()
                .map(|m| m.get("mem").map_or(0, |q| q.0.parse().unwrap()));
            ((ri, di), mem)
        })
        .collect()
}

fn apply(p: &Pool, st: &mut State, picks: &[(usize, usize)], consumed: &[u32], sign: i64) {
    let mut counted = BTreeSet::new();
    for (&(_, di), &mem) in picks.iter().zip(consumed) {
        let d = &p.devs[di];
        if d.multi {
            let e = st.multi.entry(di).or_default();
            let was = e.0;
            e.0 = (i64::from(e.0) + sign) as u32;
            e.1 = (i64::from(e.1) + sign * i64::from(mem)) as u32;
            // The counters are held while at least one allocation exists.
            let first = sign > 0 && was == 0 && counted.insert(di);
            let last = sign < 0 && e.0 == 0 && counted.insert(di);
            if first || last {
                st.counters =
                    (i64::from(st.counters) + sign * i64::from(d.counter.unwrap_or(0))) as u32;
            }
        } else {
            if sign > 0 {
                st.plain.insert(di);
            } else {
                st.plain.remove(&di);
            }
            st.counters =
                (i64::from(st.counters) + sign * i64::from(d.counter.unwrap_or(0))) as u32;
        }
    }
}

/// A claim allocated and not released: name, picks, `mem` consumed per pick.
type Held = (String, Vec<(usize, usize)>, Vec<u32>);

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Every allocation obeys the rules; the allocator finds one exactly when one exists.
    #[test]
    fn allocations_obey_the_rules_and_agree_with_brute_force(p in pool(), steps in steps()) {
        let mut a = Allocator::new(&slices(&p), &classes(), &gates()).unwrap();
        prop_assert_eq!(a.skipped_pools(), &[]);
        let mut st = State::default();
        let mut held: Vec<Held> = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Allocate(c) => {
                    let name = format!("c{i}");
                    let fits = brute_force(&p, c, &st);
                    match a.allocate(&to_claim(&name, c)) {
                        Ok(r) => {
                            let got = picks_of(&r);
                            let picks: Vec<(usize, usize)> = got.iter().map(|x| x.0).collect();
                            let consumed = check(&p, c, &picks, &st)
                                .map_err(|e| TestCaseError::fail(format!("{name}: {e}; picks {picks:?}")))?;
                            for ((&(_, di), mem), want) in picks.iter().zip(got.iter().map(|x| x.1)).zip(&consumed) {
                                if p.devs[di].multi {
                                    prop_assert_eq!(mem, Some(*want), "consumedCapacity of d{}", di);
                                } else {
                                    prop_assert_eq!(mem, None);
                                }
                            }
                            prop_assert!(fits, "{}: allocated {:?}, brute force found nothing", name, picks);
                            apply(&p, &mut st, &picks, &consumed, 1);
                            held.push((name, picks, consumed));
                        }
                        Err(AllocError::Unsatisfiable(why)) => {
                            prop_assert!(!fits, "{}: unsatisfiable ({}) but brute force fits", name, why);
                        }
                        Err(e) => prop_assert!(false, "{}: {}", name, e),
                    }
                }
                Step::Release(n) if !held.is_empty() => {
                    let (name, picks, consumed) = held.remove(n % held.len());
                    prop_assert!(a.release("default", &name));
                    apply(&p, &mut st, &picks, &consumed, -1);
                }
                Step::Release(_) => {}
            }
        }
    }
}
