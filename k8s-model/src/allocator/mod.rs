//! An offline model of the kube-scheduler's structured DRA allocator, fed with the
//! slices Tessera publishes: it answers "does this claim fit, and which devices does it
//! get" without a cluster. Pure: no I/O.
//!
//! What it models (`kubernetes-dra-api.md` §2–§5, KEP-4381/4815/5075):
//! * pools: the highest generation only, complete pools only, and pools that fail the
//!   cross-slice checks ([`crate::validation::validate_pool_for`]) are skipped with the
//!   reason;
//! * order: slices in list order, devices in slice order, nodes in order of first
//!   appearance; a depth-first search with backtracking, so the first solution found is
//!   the first-fit solution the scheduler finds, including cases plain first fit fails
//!   (`matchAttribute`, `distinctAttribute`, `firstAvailable`);
//! * node choice: the first node where the claim fits; from 1.35, for a claim with
//!   `firstAvailable`, the first node whose solution scores highest by the scheduler's
//!   DynamicResources score (earlier subrequests score more), as the real scheduler
//!   prefers nodes where a better-ranked subrequest fits;
//! * DeviceClass and request CEL selectors, `exactly` and `firstAvailable`, `count` and
//!   `allocationMode: All`;
//! * counters of partitionable devices;
//! * consumable capacity: request-policy rounding, `consumedCapacity`, a `shareID`;
//! * devices allocated earlier stay unavailable unless multi-allocatable with capacity left.
//!
//! Interpretations where the real allocator's behaviour is not spelled out:
//! * a multi-allocatable device that consumes counters consumes them once, while at
//!   least one allocation of it exists (the counters describe the physical device, not a
//!   share of it);
//! * within one request the devices are distinct, except that on 1.34/1.35 (every pick
//!   scans all devices again) one request may take a multi-allocatable device more than
//!   once; two requests of a claim may share a multi-allocatable device, each with its
//!   own shareID;
//! * `nodeSelector` slices and devices are treated as usable on every node;
//! * shareIDs are generated deterministically (a hash of the claim plus a sequence) so
//!   that plans are reproducible; the scheduler uses random UUIDs;
//! * admin access is not modelled (such requests allocate like any other);
//! * node choice ignores the scheduler's other scores (resources, spreading; the
//!   DynamicResources score has weight 2 of them), its sampling of nodes
//!   (`percentageOfNodesToScore`) and its ties, which it breaks by heap order (1.37) or
//!   at random (1.34): plan takes the first node in order.

pub mod capacity;

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, Device, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceAttribute, DeviceClass, DeviceClassConfiguration, DeviceRequestAllocationResult,
    DeviceSelector as K8sSelector, ResourceClaim, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use crate::cel::{DeviceInput, DeviceSelector};
use crate::release::FeatureGates;
use crate::validation::quantity::ParsedQuantity as Q;

/// Identity of a device: driver, pool, name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

struct Candidate {
    id: DeviceId,
    device: Device,
    /// `None`: usable on every node.
    node: Option<String>,
    multi: bool,
    /// The slice (index in the input) it is listed in.
    slice: usize,
}

/// A pool left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedPool {
    pub driver: String,
    pub pool: String,
    pub reason: String,
}

/// Why a claim could not be allocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// No set of devices satisfies the claim (the scheduler's "cannot allocate all claims").
    #[error("cannot allocate all claims: {0}")]
    Unsatisfiable(String),
    /// The claim or a class is malformed (unknown class, bad selector, bad quantity).
    #[error("{0}")]
    Invalid(String),
    /// The search exceeded its step budget.
    #[error("allocation search gave up after {0} steps")]
    SearchLimit(u64),
    /// The claim (`namespace/name`) already holds devices: a claim is allocated once,
    /// and the scheduler skips an allocated one (release it first).
    #[error("claim {0} is already allocated")]
    AlreadyAllocated(String),
    /// The release's scheduler would crash on this claim: 1.34 indexes the chosen
    /// device's slice by the pick's position in its request, past the slice's end
    /// (a Go index-out-of-range panic in kube-scheduler, not an unschedulable pod).
    #[error("the kube-scheduler would crash: {0}")]
    SchedulerCrash(String),
}

struct Class {
    /// Indices into [`Allocator::selectors`], so class and request selectors share the
    /// per-device result cache.
    selectors: Vec<usize>,
    config: Vec<DeviceClassConfiguration>,
}

#[derive(Clone)]
enum Mode {
    Exact(usize),
    All,
}

/// One way to satisfy a request: the request itself, or one `firstAvailable` subrequest.
#[derive(Clone)]
struct Spec {
    /// Name in allocation results: `req` or `req/sub`.
    name: String,
    parent: String,
    /// Its index in `firstAvailable`; `None` for an `exactly` request.
    sub_index: Option<usize>,
    class: String,
    selectors: Vec<usize>,
    mode: Mode,
    capacity: BTreeMap<String, Q>,
}

enum ConstraintKind {
    Match(String),
    Distinct(String),
}

struct Constraint {
    /// Request names (`req` or `req/sub`); empty = every request.
    requests: Vec<String>,
    kind: ConstraintKind,
}

impl Constraint {
    fn applies(&self, spec: &Spec) -> bool {
        self.requests.is_empty()
            || self
                .requests
                .iter()
                .any(|r| *r == spec.name || *r == spec.parent)
    }
}

/// One device chosen for a claim.
#[derive(Debug, Clone)]
struct Pick {
    cand: usize,
    spec_name: String,
    consumed: BTreeMap<String, Q>,
    share_id: Option<String>,
}

/// Allocations of one claim, kept for releases.
struct Held {
    picks: Vec<Pick>,
}

/// The allocator with the state of everything allocated so far.
pub struct Allocator {
    candidates: Vec<Candidate>,
    nodes: Vec<Option<String>>,
    /// Per entry of `nodes`: the candidates usable there, in candidate order (a node's
    /// search scans its own devices, not the whole cluster's).
    node_candidates: Vec<Vec<usize>>,
    counter_sets: HashMap<(String, String, String), BTreeMap<String, Q>>,
    skipped: Vec<SkippedPool>,
    classes: BTreeMap<String, Class>,
    selectors: Vec<DeviceSelector>,
    /// Index in `selectors` of each expression compiled so far: claims from one
    /// template share their selectors, and with them the results cache.
    selector_index: HashMap<String, usize>,
    /// Selector results by (selector, candidate), kept across claims: a device's
    /// attributes and capacities do not change during a plan, and evaluating every
    /// selector on every device of a large cluster for each claim would dominate.
    selector_results: HashMap<(usize, usize), bool>,
    gates: FeatureGates,
    exclusive: HashSet<usize>,
    shared_use: HashMap<usize, BTreeMap<String, Q>>,
    shared_count: HashMap<usize, usize>,
    counters_used: HashMap<(String, String, String), BTreeMap<String, Q>>,
    /// Candidates by (slice, index in the slice's devices).
    by_position: HashMap<(usize, usize), usize>,
    held: BTreeMap<String, Held>,
    share_seq: u64,
    /// Step budget per claim (a guard against pathological searches).
    pub step_limit: u64,
}

fn parse_q(s: &str) -> Result<Q, String> {
    Q::parse(s).map_err(|e| format!("invalid quantity {s:?}: {}", e.go_message()))
}

fn attr_value(device: &Device, driver: &str, name: &str) -> Option<DeviceAttribute> {
    let attrs = device.attributes.as_ref()?;
    if let Some(a) = attrs.get(name) {
        return Some(a.clone());
    }
    let (domain, id) = name.split_once('/')?;
    if domain == driver {
        attrs.get(id).cloned()
    } else {
        None
    }
}

fn claim_key(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or("default"),
        claim.metadata.name.as_deref().unwrap_or("")
    )
}

fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Allocator {
    /// Builds the allocator from slices (in list order) and DeviceClasses. Invalid or
    /// incomplete pools are skipped and reported by [`Allocator::skipped_pools`]; class
    /// selectors that do not compile are an error.
    pub fn new(
        slices: &[ResourceSlice],
        classes: &[DeviceClass],
        gates: &FeatureGates,
    ) -> Result<Self, AllocError> {
        let mut a = Allocator {
            candidates: Vec::new(),
            nodes: Vec::new(),
            node_candidates: Vec::new(),
            counter_sets: HashMap::new(),
            skipped: Vec::new(),
            classes: BTreeMap::new(),
            selectors: Vec::new(),
            selector_index: HashMap::new(),
            selector_results: HashMap::new(),
            gates: gates.clone(),
            exclusive: HashSet::new(),
            shared_use: HashMap::new(),
            shared_count: HashMap::new(),
            counters_used: HashMap::new(),
            by_position: HashMap::new(),
            held: BTreeMap::new(),
            share_seq: 0,
            step_limit: 1_000_000,
        };
        for c in classes {
            let name = c.metadata.name.clone().unwrap_or_default();
            let spec = c.spec.clone().unwrap_or_default();
            let selectors = a.compile_selectors(
                spec.selectors.as_deref().unwrap_or_default(),
                &format!("DeviceClass {name}"),
            )?;
            a.classes.insert(
                name,
                Class {
                    selectors,
                    config: spec.config.unwrap_or_default(),
                },
            );
        }
        a.load_pools(slices);
        Ok(a)
    }

    fn compile_selectors(
        &mut self,
        sels: &[K8sSelector],
        what: &str,
    ) -> Result<Vec<usize>, AllocError> {
        let mut out = Vec::new();
        for (i, s) in sels.iter().enumerate() {
            let Some(cel) = &s.cel else { continue };
            if let Some(&known) = self.selector_index.get(&cel.expression) {
                out.push(known);
                continue;
            }
            let compiled = DeviceSelector::compile(&cel.expression)
                .map_err(|e| AllocError::Invalid(format!("{what}: selector #{i}: {e}")))?;
            self.selectors.push(compiled);
            self.selector_index
                .insert(cel.expression.clone(), self.selectors.len() - 1);
            out.push(self.selectors.len() - 1);
        }
        Ok(out)
    }

    fn load_pools(&mut self, slices: &[ResourceSlice]) {
        // Group by (driver, pool) in first-appearance order.
        let mut order: Vec<(String, String)> = Vec::new();
        let mut groups: HashMap<(String, String), Vec<&ResourceSlice>> = HashMap::new();
        for s in slices {
            let k = (s.spec.driver.clone(), s.spec.pool.name.clone());
            if !groups.contains_key(&k) {
                order.push(k.clone());
            }
            groups.entry(k).or_default().push(s);
        }
        let mut valid: HashSet<(String, String)> = HashSet::new();
        for k in &order {
            let all = &groups[k];
            let max_gen = all
                .iter()
                .map(|s| s.spec.pool.generation)
                .max()
                .unwrap_or(0);
            let current: Vec<&ResourceSlice> = all
                .iter()
                .copied()
                .filter(|s| s.spec.pool.generation == max_gen)
                .collect();
            let want = current
                .first()
                .map(|s| s.spec.pool.resource_slice_count)
                .unwrap_or(0);
            let skip = |reason: String| SkippedPool {
                driver: k.0.clone(),
                pool: k.1.clone(),
                reason,
            };
            if current.len() as i64 != want {
                self.skipped.push(skip(format!(
                    "incomplete pool: {} of {} slices of generation {max_gen}",
                    current.len(),
                    want
                )));
                continue;
            }
            let problems = crate::validation::validate_pool_for(&current, self.gates.version());
            if !problems.is_empty() {
                let reasons: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
                self.skipped
                    .push(skip(format!("invalid pool: {}", reasons.join("; "))));
                continue;
            }
            for s in &current {
                for cs in s.spec.shared_counters.iter().flatten() {
                    let counters = cs
                        .counters
                        .iter()
                        .filter_map(|(n, c)| parse_q(&c.value.0).ok().map(|q| (n.clone(), q)))
                        .collect();
                    self.counter_sets
                        .insert((k.0.clone(), k.1.clone(), cs.name.clone()), counters);
                }
            }
            valid.insert(k.clone());
        }
        let consumable = self.gates.consumable_capacity();
        for (slice_index, s) in slices.iter().enumerate() {
            let k = (s.spec.driver.clone(), s.spec.pool.name.clone());
            if !valid.contains(&k) {
                continue;
            }
            let max_gen = groups[&k]
                .iter()
                .map(|x| x.spec.pool.generation)
                .max()
                .unwrap_or(0);
            if s.spec.pool.generation != max_gen {
                continue;
            }
            for (index, d) in s.spec.devices.iter().flatten().enumerate() {
                let node = if s.spec.all_nodes == Some(true) || s.spec.node_selector.is_some() {
                    None
                } else if s.spec.per_device_node_selection == Some(true) {
                    d.node_name.clone()
                } else {
                    s.spec.node_name.clone()
                };
                if !self.nodes.contains(&node) && node.is_some() {
                    self.nodes.push(node.clone());
                }
                self.candidates.push(Candidate {
                    id: DeviceId {
                        driver: k.0.clone(),
                        pool: k.1.clone(),
                        device: d.name.clone(),
                    },
                    device: d.clone(),
                    node,
                    multi: consumable && d.allow_multiple_allocations == Some(true),
                    slice: slice_index,
                });
                self.by_position
                    .insert((slice_index, index), self.candidates.len() - 1);
            }
        }
        if self.nodes.is_empty() {
            self.nodes.push(None);
        }
        let index: HashMap<&Option<String>, usize> =
            self.nodes.iter().enumerate().map(|(i, n)| (n, i)).collect();
        let mut per_node = vec![Vec::new(); self.nodes.len()];
        for (cand, c) in self.candidates.iter().enumerate() {
            match index.get(&c.node) {
                Some(&i) if c.node.is_some() => per_node[i].push(cand),
                // Usable on every node (or there are no nodes: the one `None` entry).
                _ => per_node.iter_mut().for_each(|l| l.push(cand)),
            }
        }
        self.node_candidates = per_node;
    }

    /// Pools left out, with the reason (incomplete, or failing the cross-slice checks).
    pub fn skipped_pools(&self) -> &[SkippedPool] {
        &self.skipped
    }

    fn expand(
        &mut self,
        claim: &ResourceClaim,
    ) -> Result<(Vec<Vec<Spec>>, Vec<Constraint>), AllocError> {
        let devices = claim
            .spec
            .as_ref()
            .and_then(|s| s.devices.clone())
            .unwrap_or_default();
        let mut reqs = Vec::new();
        for r in devices.requests.unwrap_or_default() {
            let mut alts = Vec::new();
            let mut push = |this: &mut Self,
                            name: String,
                            sub_index: Option<usize>,
                            class: &str,
                            sels: &[K8sSelector],
                            mode: Option<&str>,
                            count: Option<i64>,
                            cap: Option<&BTreeMap<String, K8sQuantity>>|
             -> Result<(), AllocError> {
                if !this.classes.contains_key(class) {
                    return Err(AllocError::Invalid(format!(
                        "request {name}: device class {class} does not exist"
                    )));
                }
                let selectors = this.compile_selectors(sels, &format!("request {name}"))?;
                let mode = match mode.unwrap_or("ExactCount") {
                    "All" => Mode::All,
                    _ => Mode::Exact(count.unwrap_or(1).max(1) as usize),
                };
                let mut capacity = BTreeMap::new();
                for (k, v) in cap.into_iter().flatten() {
                    capacity.insert(
                        k.clone(),
                        parse_q(&v.0)
                            .map_err(|e| AllocError::Invalid(format!("request {name}: {e}")))?,
                    );
                }
                alts.push(Spec {
                    parent: name.split('/').next().unwrap_or(&name).to_string(),
                    name,
                    sub_index,
                    class: class.to_string(),
                    selectors,
                    mode,
                    capacity,
                });
                Ok(())
            };
            if let Some(e) = &r.exactly {
                push(
                    self,
                    r.name.clone(),
                    None,
                    &e.device_class_name,
                    e.selectors.as_deref().unwrap_or_default(),
                    e.allocation_mode.as_deref(),
                    e.count,
                    e.capacity.as_ref().and_then(|c| c.requests.as_ref()),
                )?;
            }
            for (i, sub) in r.first_available.iter().flatten().enumerate() {
                push(
                    self,
                    format!("{}/{}", r.name, sub.name),
                    Some(i),
                    &sub.device_class_name,
                    sub.selectors.as_deref().unwrap_or_default(),
                    sub.allocation_mode.as_deref(),
                    sub.count,
                    sub.capacity.as_ref().and_then(|c| c.requests.as_ref()),
                )?;
            }
            if alts.is_empty() {
                return Err(AllocError::Invalid(format!(
                    "request {}: neither exactly nor firstAvailable",
                    r.name
                )));
            }
            reqs.push(alts);
        }
        let mut constraints = Vec::new();
        for c in devices.constraints.unwrap_or_default() {
            let kind = match (c.match_attribute, c.distinct_attribute) {
                (Some(m), None) => ConstraintKind::Match(m),
                (None, Some(d)) => ConstraintKind::Distinct(d),
                _ => {
                    return Err(AllocError::Invalid(
                        "a constraint needs exactly one of matchAttribute, distinctAttribute"
                            .into(),
                    ));
                }
            };
            constraints.push(Constraint {
                requests: c.requests.unwrap_or_default(),
                kind,
            });
        }
        Ok((reqs, constraints))
    }

    fn selector_ok(
        &self,
        cache: &mut HashMap<(usize, usize), bool>,
        sel: usize,
        cand: usize,
    ) -> Result<bool, AllocError> {
        if let Some(v) = cache.get(&(sel, cand)) {
            return Ok(*v);
        }
        let c = &self.candidates[cand];
        let input = DeviceInput {
            driver: &c.id.driver,
            device: &c.device,
            consumable_capacity: self.gates.consumable_capacity(),
        };
        let ok = self.selectors[sel].matches(&input).map_err(|e| {
            AllocError::Invalid(format!(
                "device {}: selector {:?}: {e}",
                c.id,
                self.selectors[sel].expression()
            ))
        })?;
        cache.insert((sel, cand), ok);
        Ok(ok)
    }

    fn matches(
        &self,
        cache: &mut HashMap<(usize, usize), bool>,
        spec: &Spec,
        cand: usize,
    ) -> Result<bool, AllocError> {
        for &s in &self.classes[&spec.class].selectors {
            if !self.selector_ok(cache, s, cand)? {
                return Ok(false);
            }
        }
        for &s in &spec.selectors {
            if !self.selector_ok(cache, s, cand)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Capacity this pick would consume, or `None` when the device cannot serve it.
    fn capacity_fit(
        &self,
        spec: &Spec,
        cand: usize,
        picks: &[Pick],
    ) -> Option<BTreeMap<String, Q>> {
        let c = &self.candidates[cand];
        let caps = c.device.capacity.clone().unwrap_or_default();
        let requests: BTreeMap<String, Q> = spec
            .capacity
            .iter()
            .filter_map(|(k, v)| capacity::local_name(k, &c.id.driver).map(|n| (n.to_string(), *v)))
            .collect();
        if requests.len() != spec.capacity.len() {
            return None;
        }
        let rules = capacity::Rounding::for_gates(&self.gates);
        if self.gates.version().checks_capacity_at_pick_index() && self.gates.consumable_capacity()
        {
            // 1.34's allocator checks the chosen device in its search loop, then again in
            // `allocateDevice` on `slice.Spec.Devices[r.deviceIndex]`: the device at the
            // index of this pick within its request (0 for the first) in the chosen
            // device's slice. Both must pass; what is consumed is computed from the
            // chosen device. An index past the slice's end is `available`'s concern.
            if let Some(&checked) = self
                .by_position
                .get(&(c.slice, self.pick_index(spec, picks)))
                && !self.capacity_left(checked, &requests, picks, rules)
            {
                return None;
            }
        }
        if requests.keys().any(|k| !caps.contains_key(k)) {
            return None;
        }
        if !c.multi {
            // Plain devices: each requested capacity must be at least the request.
            let fits = requests
                .iter()
                .all(|(k, r)| parse_q(&caps[k].value.0).is_ok_and(|v| v >= *r));
            return fits.then(BTreeMap::new);
        }
        let consumed = capacity::consumed_capacity(&caps, &requests, rules).ok()?;
        for (name, want) in &consumed {
            let total = parse_q(&caps[name].value.0).ok()?;
            let mut used = self
                .shared_use
                .get(&cand)
                .and_then(|m| m.get(name))
                .cloned()
                .unwrap_or_else(|| Q::from_i64(0));
            for p in picks.iter().filter(|p| p.cand == cand) {
                if let Some(q) = p.consumed.get(name) {
                    used = used.checked_add(q)?;
                }
            }
            if used.checked_add(want)? > total {
                return None;
            }
        }
        Some(consumed)
    }

    /// The scheduler's capacity check (`CmpRequestOverCapacity`) on device `cand`:
    /// every requested capacity exists there, and for each of its capacities what this
    /// request consumes by its policy, added to what earlier claims and this claim's
    /// picks consume of `cand`, stays within the capacity's value.
    fn capacity_left(
        &self,
        cand: usize,
        requests: &BTreeMap<String, Q>,
        picks: &[Pick],
        rules: capacity::Rounding,
    ) -> bool {
        let caps = self.candidates[cand]
            .device
            .capacity
            .clone()
            .unwrap_or_default();
        if requests.keys().any(|k| !caps.contains_key(k)) {
            return false;
        }
        let zero = Q::from_i64(0);
        for (name, cap) in &caps {
            let Ok(Some(want)) = capacity::consumed_by_policy(cap, requests.get(name), rules)
            else {
                return false;
            };
            let Ok(total) = parse_q(&cap.value.0) else {
                return false;
            };
            let mut used = *self
                .shared_use
                .get(&cand)
                .and_then(|m| m.get(name))
                .unwrap_or(&zero);
            for p in picks.iter().filter(|p| p.cand == cand) {
                if let Some(q) = p.consumed.get(name) {
                    match used.checked_add(q) {
                        Some(u) => used = u,
                        None => return false,
                    }
                }
            }
            match used.checked_add(&want) {
                Some(sum) if sum <= total => {}
                _ => return false,
            }
        }
        true
    }

    fn counters_fit(&self, cand: usize, picks: &[Pick]) -> bool {
        let c = &self.candidates[cand];
        let Some(cons) = &c.device.consumes_counters else {
            return true;
        };

        // A multi-allocatable device holds its counters once.
        if c.multi
            && (self.shared_count.get(&cand).copied().unwrap_or(0) > 0
                || picks.iter().any(|p| p.cand == cand))
        {
            return true;
        }
        let mut extra: HashMap<(String, String, String), BTreeMap<String, Q>> = HashMap::new();
        let mut seen = HashSet::new();
        for p in picks {
            if !seen.insert(p.cand) {
                continue;
            }
            let pc = &self.candidates[p.cand];
            if pc.multi && self.shared_count.get(&p.cand).copied().unwrap_or(0) > 0 {
                continue;
            }
            for cc in pc.device.consumes_counters.iter().flatten() {
                let key = (
                    pc.id.driver.clone(),
                    pc.id.pool.clone(),
                    cc.counter_set.clone(),
                );
                let e = extra.entry(key).or_default();
                for (n, v) in &cc.counters {
                    if let Ok(q) = parse_q(&v.value.0) {
                        let cur = e.get(n).cloned().unwrap_or_else(|| Q::from_i64(0));
                        if let Some(sum) = cur.checked_add(&q) {
                            e.insert(n.clone(), sum);
                        }
                    }
                }
            }
        }
        for cc in cons {
            let key = (
                c.id.driver.clone(),
                c.id.pool.clone(),
                cc.counter_set.clone(),
            );
            let Some(set) = self.counter_sets.get(&key) else {
                return false;
            };
            for (n, v) in &cc.counters {
                let (Some(total), Ok(need)) = (set.get(n), parse_q(&v.value.0)) else {
                    return false;
                };
                let zero = Q::from_i64(0);
                let used = self
                    .counters_used
                    .get(&key)
                    .and_then(|m| m.get(n))
                    .unwrap_or(&zero);
                let pending = extra.get(&key).and_then(|m| m.get(n)).unwrap_or(&zero);
                match used.checked_add(pending).and_then(|u| u.checked_add(&need)) {
                    Some(sum) if sum <= *total => {}
                    _ => return false,
                }
            }
        }
        true
    }

    fn constraints_ok(
        &self,
        constraints: &[Constraint],
        spec: &Spec,
        cand: usize,
        picks: &[Pick],
        specs_of: &HashMap<String, Spec>,
    ) -> bool {
        let c = &self.candidates[cand];
        for k in constraints.iter().filter(|k| k.applies(spec)) {
            let name = match &k.kind {
                ConstraintKind::Match(n) | ConstraintKind::Distinct(n) => n,
            };
            let Some(mine) = attr_value(&c.device, &c.id.driver, name) else {
                return false;
            };
            for p in picks {
                let Some(pspec) = specs_of.get(&p.spec_name) else {
                    continue;
                };
                if !k.applies(pspec) {
                    continue;
                }
                let pc = &self.candidates[p.cand];
                let theirs = attr_value(&pc.device, &pc.id.driver, name);
                let same = theirs.as_ref() == Some(&mine);
                match k.kind {
                    ConstraintKind::Match(_) if !same => return false,
                    ConstraintKind::Distinct(_) if same => return false,
                    _ => {}
                }
            }
        }
        true
    }

    /// Index of the next pick of `spec` within its request (the scheduler's
    /// `deviceIndex`).
    fn pick_index(&self, spec: &Spec, picks: &[Pick]) -> usize {
        picks.iter().filter(|p| p.spec_name == spec.name).count()
    }

    /// Whether a device is free for a pick of `spec`, given earlier picks of this claim.
    /// Errs where 1.34's scheduler would index past the chosen device's slice
    /// ([`KubeVersion::checks_capacity_at_pick_index`]): it panics there.
    fn available(
        &self,
        spec: &Spec,
        cand: usize,
        picks: &[Pick],
    ) -> Result<Option<BTreeMap<String, Q>>, AllocError> {
        let c = &self.candidates[cand];
        if c.multi {
            if !self.gates.version().rescans_each_pick()
                && picks
                    .iter()
                    .any(|p| p.cand == cand && p.spec_name == spec.name)
            {
                return Ok(None);
            }
        } else if self.exclusive.contains(&cand) || picks.iter().any(|p| p.cand == cand) {
            return Ok(None);
        }
        let Some(consumed) = self.capacity_fit(spec, cand, picks) else {
            return Ok(None);
        };
        if !self.counters_fit(cand, picks) {
            return Ok(None);
        }
        let k = self.pick_index(spec, picks);
        if self.gates.version().checks_capacity_at_pick_index()
            && self.gates.consumable_capacity()
            && !self.by_position.contains_key(&(c.slice, k))
        {
            return Err(AllocError::SchedulerCrash(format!(
                "request {:?}, device {}: the {} scheduler checks capacity on device index {k} \
                 of the device's slice, which has fewer devices (index out of range)",
                spec.name,
                c.id,
                self.gates.version()
            )));
        }
        Ok(Some(consumed))
    }
}

/// Search context for one claim on one node.
struct Search<'a> {
    alloc: &'a Allocator,
    /// The candidates usable on the node, in order.
    cands: &'a [usize],
    reqs: &'a [Vec<Spec>],
    constraints: &'a [Constraint],
    specs_of: HashMap<String, Spec>,
    cache: HashMap<(usize, usize), bool>,
    steps: u64,
    limit: u64,
}

impl Search<'_> {
    fn tick(&mut self) -> Result<(), AllocError> {
        self.steps += 1;
        if self.steps > self.limit {
            return Err(AllocError::SearchLimit(self.limit));
        }
        Ok(())
    }

    fn solve(&mut self, r: usize, picks: &mut Vec<Pick>) -> Result<bool, AllocError> {
        if r == self.reqs.len() {
            return Ok(true);
        }
        for spec in self.reqs[r].clone() {
            match spec.mode {
                Mode::Exact(n) => {
                    if self.fill(r, &spec, n, 0, picks)? {
                        return Ok(true);
                    }
                }
                Mode::All => {
                    let before = picks.len();
                    let mut ok = true;
                    let mut any = false;
                    let cands = self.cands;
                    for &cand in cands {
                        self.tick()?;
                        if !self.alloc.matches(&mut self.cache, &spec, cand)? {
                            continue;
                        }
                        any = true;
                        match self.alloc.available(&spec, cand, picks)? {
                            Some(consumed)
                                if self.alloc.constraints_ok(
                                    self.constraints,
                                    &spec,
                                    cand,
                                    picks,
                                    &self.specs_of,
                                ) =>
                            {
                                picks.push(Pick {
                                    cand,
                                    spec_name: spec.name.clone(),
                                    consumed,
                                    share_id: None,
                                });
                            }
                            _ => {
                                ok = false;
                                break;
                            }
                        }
                    }
                    if ok && any && self.solve(r + 1, picks)? {
                        return Ok(true);
                    }
                    picks.truncate(before);
                }
            }
        }
        Ok(false)
    }

    fn fill(
        &mut self,
        r: usize,
        spec: &Spec,
        remaining: usize,
        start: usize,
        picks: &mut Vec<Pick>,
    ) -> Result<bool, AllocError> {
        if remaining == 0 {
            return self.solve(r + 1, picks);
        }
        for pos in start..self.cands.len() {
            let cand = self.cands[pos];
            self.tick()?;
            if !self.alloc.matches(&mut self.cache, spec, cand)? {
                continue;
            }
            let Some(consumed) = self.alloc.available(spec, cand, picks)? else {
                continue;
            };
            if !self
                .alloc
                .constraints_ok(self.constraints, spec, cand, picks, &self.specs_of)
            {
                continue;
            }
            picks.push(Pick {
                cand,
                spec_name: spec.name.clone(),
                consumed,
                share_id: None,
            });
            // 1.34/1.35 scan from the first device for every pick; later releases
            // go on after this one (combinations, not permutations).
            let next = if self.alloc.gates.version().rescans_each_pick() {
                0
            } else {
                pos + 1
            };
            if self.fill(r, spec, remaining - 1, next, picks)? {
                return Ok(true);
            }
            picks.pop();
        }
        Ok(false)
    }
}

/// `FirstAvailableDeviceRequestMaxSize`: the most subrequests a request may list.
const FIRST_AVAILABLE_MAX: u64 = 8;

/// The score the scheduler's DynamicResources plugin gives a node (`computeScore`,
/// 1.35+): for each `firstAvailable` request, [`FIRST_AVAILABLE_MAX`] minus the index of
/// the subrequest the node's solution uses; `exactly` requests add nothing.
fn prioritized_score<'s>(used: impl Iterator<Item = &'s Spec>) -> u64 {
    used.filter_map(|s| s.sub_index)
        .map(|i| FIRST_AVAILABLE_MAX.saturating_sub(i as u64))
        .sum()
}

/// The (sub)request of each request that a solution allocated.
fn used_specs<'s>(reqs: &'s [Vec<Spec>], picks: &[Pick]) -> impl Iterator<Item = &'s Spec> {
    reqs.iter().filter_map(|alts| {
        alts.iter()
            .find(|s| picks.iter().any(|p| p.spec_name == s.name))
    })
}

impl Allocator {
    /// Allocates one claim against everything allocated so far and records it (so
    /// later claims see its devices as taken). Returns the allocation result as it
    /// would appear in `status.allocation`.
    pub fn allocate(&mut self, claim: &ResourceClaim) -> Result<AllocationResult, AllocError> {
        let key = claim_key(claim);
        if self.held.contains_key(&key) {
            return Err(AllocError::AlreadyAllocated(key));
        }
        let (reqs, constraints) = self.expand(claim)?;
        let specs_of: HashMap<String, Spec> = reqs
            .iter()
            .flatten()
            .map(|s| (s.name.clone(), s.clone()))
            .collect();
        // Node choice. Where the scheduler scores firstAvailable (1.35+), the node
        // whose solution uses the best-ranked subrequests wins, the first such node in
        // order; elsewhere the first node where the claim fits.
        let scored = self.gates.version().scores_prioritized_list()
            && self.gates.prioritized_list()
            && reqs.iter().flatten().any(|s| s.sub_index.is_some());
        let best_possible = prioritized_score(reqs.iter().map(|alts| &alts[0]));
        let mut found: Option<(usize, u64, Vec<Pick>)> = None;
        let mut cache = std::mem::take(&mut self.selector_results);
        for (node, cands) in self.node_candidates.iter().enumerate() {
            let mut search = Search {
                alloc: self,
                cands,
                reqs: &reqs,
                constraints: &constraints,
                specs_of: specs_of.clone(),
                cache: std::mem::take(&mut cache),
                steps: 0,
                limit: self.step_limit,
            };
            let mut picks = Vec::new();
            let solved = search.solve(0, &mut picks);
            cache = search.cache;
            if !solved? {
                continue;
            }
            let score = if scored {
                prioritized_score(used_specs(&reqs, &picks))
            } else {
                best_possible
            };
            if found.as_ref().is_none_or(|(_, best, _)| score > *best) {
                found = Some((node, score, picks));
            }
            if score == best_possible {
                break;
            }
        }
        self.selector_results = cache;
        let Some((node, _, mut picks)) = found else {
            return Err(AllocError::Unsatisfiable(self.diagnose(&reqs)?));
        };
        let node = self.nodes[node].clone();
        for p in picks.iter_mut() {
            if self.candidates[p.cand].multi {
                self.share_seq += 1;
                p.share_id = Some(format!(
                    "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
                    (fnv(&key) >> 32) as u32,
                    (fnv(&key) >> 16) as u16,
                    (self.share_seq >> 12) & 0xfff,
                    self.share_seq & 0xfff,
                    fnv(&format!("{key}/{}", self.share_seq)) & 0xffff_ffff_ffff
                ));
            }
        }
        self.commit(&picks);
        let result = self.render(claim, &reqs, &picks, node.as_deref());
        self.held.insert(key, Held { picks });
        Ok(result)
    }

    fn commit(&mut self, picks: &[Pick]) {
        for p in picks {
            let c = &self.candidates[p.cand];
            let first_share = c.multi && self.shared_count.get(&p.cand).copied().unwrap_or(0) == 0;
            if !c.multi || first_share {
                for cc in c.device.consumes_counters.iter().flatten() {
                    let key = (
                        c.id.driver.clone(),
                        c.id.pool.clone(),
                        cc.counter_set.clone(),
                    );
                    let e = self.counters_used.entry(key).or_default();
                    for (n, v) in &cc.counters {
                        if let Ok(q) = parse_q(&v.value.0) {
                            let cur = e.get(n).cloned().unwrap_or_else(|| Q::from_i64(0));
                            if let Some(sum) = cur.checked_add(&q) {
                                e.insert(n.clone(), sum);
                            }
                        }
                    }
                }
            }
            if c.multi {
                *self.shared_count.entry(p.cand).or_default() += 1;
                let e = self.shared_use.entry(p.cand).or_default();
                for (n, q) in &p.consumed {
                    let cur = e.get(n).cloned().unwrap_or_else(|| Q::from_i64(0));
                    if let Some(sum) = cur.checked_add(q) {
                        e.insert(n.clone(), sum);
                    }
                }
            } else {
                self.exclusive.insert(p.cand);
            }
        }
    }

    /// Releases a claim's devices (`namespace/name`); `false` if it held none.
    pub fn release(&mut self, namespace: &str, name: &str) -> bool {
        let Some(held) = self.held.remove(&format!("{namespace}/{name}")) else {
            return false;
        };
        for p in &held.picks {
            let c = &self.candidates[p.cand];
            let last_share = if c.multi {
                let n = self.shared_count.entry(p.cand).or_default();
                *n = n.saturating_sub(1);
                if let Some(e) = self.shared_use.get_mut(&p.cand) {
                    for (k, q) in &p.consumed {
                        if let Some(cur) = e.get(k).and_then(|c| c.checked_sub(q)) {
                            e.insert(k.clone(), cur);
                        }
                    }
                }
                *n == 0
            } else {
                self.exclusive.remove(&p.cand);
                true
            };
            if last_share {
                for cc in c.device.consumes_counters.iter().flatten() {
                    let key = (
                        c.id.driver.clone(),
                        c.id.pool.clone(),
                        cc.counter_set.clone(),
                    );
                    if let Some(e) = self.counters_used.get_mut(&key) {
                        for (n, v) in &cc.counters {
                            if let (Some(cur), Ok(q)) = (e.get(n).cloned(), parse_q(&v.value.0))
                                && let Some(left) = cur.checked_sub(&q)
                            {
                                e.insert(n.clone(), left);
                            }
                        }
                    }
                }
            }
        }
        true
    }

    fn render(
        &self,
        claim: &ResourceClaim,
        reqs: &[Vec<Spec>],
        picks: &[Pick],
        node: Option<&str>,
    ) -> AllocationResult {
        let results = picks
            .iter()
            .map(|p| {
                let c = &self.candidates[p.cand];
                DeviceRequestAllocationResult {
                    request: p.spec_name.clone(),
                    driver: c.id.driver.clone(),
                    pool: c.id.pool.clone(),
                    device: c.id.device.clone(),
                    share_id: p.share_id.clone(),
                    consumed_capacity: c.multi.then(|| {
                        p.consumed
                            .iter()
                            .map(|(k, v)| (k.clone(), K8sQuantity(v.to_string())))
                            .collect()
                    }),
                    ..Default::default()
                }
            })
            .collect();
        // Class configs first (per request actually allocated), then the claim's own.
        let mut config = Vec::new();
        let mut used: Vec<&Spec> = Vec::new();
        for alts in reqs {
            if let Some(s) = alts
                .iter()
                .find(|s| picks.iter().any(|p| p.spec_name == s.name))
            {
                used.push(s);
            }
        }
        for s in &used {
            for c in &self.classes[&s.class].config {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClass".into(),
                    requests: Some(vec![s.name.clone()]),
                    opaque: c.opaque.clone(),
                });
            }
        }
        let claim_cfg = claim
            .spec
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.config.clone())
            .unwrap_or_default();
        for c in claim_cfg {
            config.push(DeviceAllocationConfiguration {
                source: "FromClaim".into(),
                requests: c.requests,
                opaque: c.opaque,
            });
        }
        AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(results),
                config: (!config.is_empty()).then_some(config),
            }),
            node_selector: node.map(|n| NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![n.to_string()]),
                    }]),
                    match_expressions: None,
                }],
            }),
            allocation_timestamp: None,
        }
    }

    /// Explains a failure request by request: how many devices match, how many are
    /// free, how many are needed.
    fn diagnose(&self, reqs: &[Vec<Spec>]) -> Result<String, AllocError> {
        let mut cache = HashMap::new();
        let mut parts = Vec::new();
        let mut each_alone_ok = true;
        for alts in reqs {
            let mut alt_msgs = Vec::new();
            let mut any_ok = false;
            for spec in alts {
                let mut matching = 0;
                let mut free = 0;
                for cand in 0..self.candidates.len() {
                    if self.matches(&mut cache, spec, cand)? {
                        matching += 1;
                        if self.available(spec, cand, &[]).is_ok_and(|c| c.is_some()) {
                            free += 1;
                        }
                    }
                }
                let (need, ok) = match spec.mode {
                    Mode::Exact(n) => (n.to_string(), free >= n),
                    Mode::All => ("all".to_string(), matching > 0 && free == matching),
                };
                any_ok |= ok;
                alt_msgs.push(format!(
                    "request {:?} (class {}): {matching} device(s) match, {free} available, {need} needed",
                    spec.name, spec.class
                ));
            }
            each_alone_ok &= any_ok;
            parts.push(alt_msgs.join(" / "));
        }
        if each_alone_ok {
            parts.push("the requests cannot be satisfied together (constraints, counters or shared capacity)".into());
        }
        Ok(parts.join("; "))
    }
}
