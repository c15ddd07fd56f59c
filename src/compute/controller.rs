//! Compute shares: the pure core of the node's compute controller.
//!
//! Each claim on a shared GPU reserves a share `s` (percent; its `consumedCapacity` of
//! `compute`, or 100/N for a fallback slot). Under contention, claim *i* of the set A
//! of claims with work pending gets
//!
//! ```text
//! target_i = s_i + (100 − Σ_{j∈A} s_j) / |A|
//! ```
//!
//! and a `computeLimit` caps a claim even on an idle GPU (the excess over a cap is
//! shared equally by the uncapped claims: water-filling).
//!
//! The actuator is a launch budget in **thread blocks per second** per claim and GPU,
//! which the interception library enforces with one token bucket shared by all of the
//! claim's processes. The controller expresses every rate as a fraction of a measured
//! capacity: blocks per second retired at 100 % busy. Each claim has its own, `C_i` =
//! the blocks it launched ÷ its NVML utilization over the same windows, because a block
//! of one workload can cost many times a block of another (a claim with twice as
//! expensive blocks gets half the block rate for the same share). Until a claim has
//! [`MIN_COST_SAMPLES`] such windows the GPU's capacity `C` (all blocks ÷ the device's
//! busy fraction) stands in. Because capacities grow with the device's size (SM count,
//! clocks), that normalises the gain: the same controller runs a 1g MIG slice and an
//! H200. On top of this feed-forward, a bounded integral term per claim trims the bias
//! left (queueing behind long kernels, NVML noise) from NVML's per-process utilization.
//!
//! Expected convergence: the first tick after contention is seen sets every rate from
//! the capacity estimate (one tick, 250 ms, once the estimate has one busy second of
//! counters), so the split is on target from the first full window. The integral term
//! is slow on purpose (NVML's 1 s samples of a GPU running long kernels swing by tens of
//! points): it trims residual bias over tens of seconds, moving each rate by at most
//! [`MAX_STEP`] per tick.
//!
//! **The tenant writes the counters.** Launch counters live in the claim's region, which
//! its processes map read-write, so a tenant can forge them: more blocks make its blocks
//! look cheap and its rate high. NVML's per-process utilization is the one figure no
//! tenant writes, so it has the last word: a claim whose measured share, averaged over
//! [`EXCESS_TICKS`] ticks, stays more than [`EXCESS_POINTS`] above its target has its
//! rate cut by a guard factor (down to [`GUARD_MIN`], by `target ÷ measured` a
//! second), which relaxes back toward 1 by [`GUARD_RELAX`] per tick once the
//! claim is at or below its target (or has none). An honest claim, paced by its true
//! cost, sits at its target and its guard stays at 1; under contention the guard waits
//! for the integral term to reach its floor and for a GPU at least [`RELEASE_BUSY`]
//! busy, so neither NVML's noise nor a neighbour that leaves the GPU half idle trips
//! it. Small targets are the exception: the 2 point band is absolute, so a claim
//! capped at a few percent sees its noise cross it more often.

use std::collections::{BTreeMap, VecDeque};

/// Fraction of the measured capacity the rates of contending claims add up to. Rates
/// summing to exactly the capacity would leave the GPU the bottleneck, and its
/// round-robin (not the rates) would then decide the split; a little headroom keeps the
/// rates in charge at the cost of a few percent of idle time.
pub const HEADROOM: f64 = 0.92;
/// Largest relative rate change per tick while a claim's target stays the same (the
/// integral term and capacity drift); a new target is set at once.
pub const MAX_STEP: f64 = 0.25;
/// Bounds of the per-claim integral correction factor.
pub const CORRECTION_RANGE: (f64, f64) = (0.8, 1.25);
/// Integral gain: fraction of the share error (in points) applied per tick.
pub const GAIN: f64 = 0.001;
/// Share errors below this many points are left alone (NVML samples carry ±3 points).
pub const DEADBAND: f64 = 1.0;
/// Window over which launch counters become rates (NVML's utilization window).
pub const WINDOW_SECS: f64 = 1.0;
/// Device busy percentage from which a tick feeds the capacity estimate (below it the
/// ratio is mostly noise).
pub const CAPACITY_BUSY: f64 = 20.0;
/// Horizon of the capacity estimate.
pub const CAPACITY_SECS: f64 = 8.0;
/// A claim's utilization (percent) from which a tick feeds its own capacity estimate
/// (its cost per block); below it NVML's ±3 point noise dominates.
pub const COST_UTIL: f64 = 5.0;
/// Ticks of a claim's own capacity log needed before it replaces the GPU's (one
/// second of samples at the controller's 250 ms period).
pub const MIN_COST_SAMPLES: usize = 4;
/// Token-bucket tolerance handed to the library: how far a claim may run ahead of its
/// rate. Long enough that a claim delayed behind a neighbour's long kernel catches up
/// within the window.
pub const BURST_NS: u64 = 100_000_000;
/// Utilization (percent of the window) from which a claim that never launched through
/// the library (a bypass, or a process loaded before it) counts as active.
pub const ACTIVE_UTIL: f64 = 2.0;
/// A claim that launched or waited in its bucket within this many seconds has work
/// pending. Two ticks: a launch-then-synchronize loop queued behind a neighbour's
/// 200 ms kernel may launch nothing for one tick. The library's counters decide for
/// claims that launch through it; NVML's utilization, which trails by its 1 s window,
/// would keep a claim that went idle "active" (and its neighbours throttled) for a
/// second more.
pub const ACTIVE_SECS: f64 = 0.5;
/// Points above its target from which a claim's measured share (NVML, averaged over
/// [`EXCESS_TICKS`]) overrides what its counters say.
pub const EXCESS_POINTS: f64 = 2.0;
/// Ticks of NVML figures the excess check averages (2 s at the service's 250 ms): NVML
/// samples of one window swing by a few points, a 2 s mean much less.
pub const EXCESS_TICKS: usize = 8;
/// Exponent of a tick's cut, `(target ÷ measured)^GUARD_CUT`: the whole ratio in
/// a second of ticks at the service's 250 ms. Faster would overshoot more (NVML's
/// figures trail the rate by its 1 s window), slower would leave a forger above its
/// target for longer than 10 s.
pub const GUARD_CUT: f64 = 0.25;
/// Lowest guard factor: a tenant forging its counters 100-fold is still held.
pub const GUARD_MIN: f64 = 0.01;
/// Per-tick relaxation of the guard toward 1 while the claim is at or below its
/// target, or has no target (about 4 % a second): slow, so that a tenant who stops
/// forging for a while and starts again finds its rate still held (from the floor,
/// back to 1 takes about two minutes).
pub const GUARD_RELAX: f64 = 1.01;
/// A claim whose counters have said for [`QUIET_SECS`] that it has work pending while
/// NVML shows it below this utilization (percent), or not at all, for as long is idle:
/// a tenant forging launches or waits must not hold its neighbours to their targets on
/// a GPU it leaves idle.
pub const QUIET_UTIL: f64 = 0.5;
/// How long NVML must show a claim quiet before it overrules its counters: NVML's 1 s
/// window, and a second for a claim just starting.
pub const QUIET_SECS: f64 = 2.0;
/// Device busy percentage from which the GPU counts as contended (and, with
/// hysteresis, stops counting as contended below [`RELEASE_BUSY`]).
pub const CONTENDED_BUSY: f64 = 90.0;
pub const RELEASE_BUSY: f64 = 75.0;

/// Target shares (percent of the GPU's busy time) of the active claims, given each
/// claim's reserved share and cap, both in percent. Pure and deterministic.
///
/// Shares that add up to more than 100 (which the scheduler prevents) are scaled down
/// proportionally.
pub fn targets(claims: &[(f64, f64)]) -> Vec<f64> {
    let n = claims.len();
    let mut out = vec![0.0; n];
    if n == 0 {
        return out;
    }
    let total: f64 = claims.iter().map(|c| c.0.max(0.0)).sum();
    let scale = if total > 100.0 { 100.0 / total } else { 1.0 };
    let share: Vec<f64> = claims.iter().map(|c| c.0.max(0.0) * scale).collect();
    let cap: Vec<f64> = claims.iter().map(|c| c.1.clamp(0.0, 100.0)).collect();
    let mut free: Vec<usize> = (0..n).collect();
    let mut pool = 100.0;
    loop {
        let reserved: f64 = free.iter().map(|&i| share[i]).sum();
        let spare = ((pool - reserved) / free.len() as f64).max(0.0);
        let over: Vec<usize> = free
            .iter()
            .copied()
            .filter(|&i| share[i] + spare > cap[i] + 1e-9)
            .collect();
        if over.is_empty() {
            for &i in &free {
                out[i] = share[i] + spare;
            }
            return out;
        }
        for &i in &over {
            out[i] = cap[i];
            pool -= cap[i];
        }
        free.retain(|i| !over.contains(i));
        if free.is_empty() {
            return out;
        }
    }
}

/// What the controller observes of one claim on one GPU at a tick.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimObservation {
    /// Stable key (claim UID).
    pub key: String,
    /// Reserved share, percent.
    pub share: f64,
    /// `computeLimit`, percent (100 = none).
    pub limit: f64,
    /// The claim's utilization of the GPU (percent), summed over its processes from
    /// NVML's per-process samples; `None` when no sample covers the claim.
    pub util: Option<f64>,
    /// Cumulative thread blocks the claim's processes launched on the GPU (region).
    pub blocks: u64,
    /// Cumulative nanoseconds the claim's launches waited in its token bucket.
    pub waited_ns: u64,
}

/// One tick's input for one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuObservation {
    /// Seconds on a monotonic clock.
    pub now: f64,
    /// Device busy percentage over the last window (NVML); `None` when unsupported, in
    /// which case the claims' utilizations are summed.
    pub busy: Option<f64>,
    pub claims: Vec<ClaimObservation>,
}

/// The controller's decision for one claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub key: String,
    /// Thread blocks per second; 0 = unthrottled.
    pub block_rate: u64,
    /// The target share under contention (or the cap when capped on an idle GPU).
    pub target: Option<f64>,
    /// Whether the claim counted as having work pending.
    pub active: bool,
    /// The claim's measured share of the GPU's busy time (percent), when measured.
    pub achieved: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
struct Counters {
    blocks: u64,
    waited_ns: u64,
}

/// The controller of one GPU. Holds the counter history (to turn cumulative counters
/// into rates), the capacity estimate and each claim's correction factor.
#[derive(Debug, Default)]
pub struct GpuController {
    history: VecDeque<(f64, BTreeMap<String, Counters>)>,
    capacity: Option<f64>,
    correction: BTreeMap<String, f64>,
    /// Per tick: (time, blocks launched per second, busy fraction) over the last window.
    cap_log: VecDeque<(f64, f64, f64)>,
    /// The same per claim: (time, its blocks per second, its utilization fraction).
    claim_cap_log: BTreeMap<String, VecDeque<(f64, f64, f64)>>,
    /// Last rate and the target it was set for, per claim.
    rates: BTreeMap<String, (f64, f64)>,
    /// Per claim: the guard against forged counters, from NVML's figures.
    guards: BTreeMap<String, Guard>,
    /// Per claim: since when NVML has shown it quiet ([`QUIET_UTIL`]).
    quiet_since: BTreeMap<String, f64>,
    /// Per claim: since when its counters have shown work, when they last did, and
    /// whether NVML has seen it working since. A gap longer than [`QUIET_SECS`] starts a
    /// new stretch only after NVML saw the last one work.
    counting: BTreeMap<String, (f64, f64, bool)>,
    contended: bool,
    /// When contention began: NVML's samples lag a window, so the integral term waits
    /// one window after the rates were first set.
    contended_since: Option<f64>,
}

/// What NVML says of one claim against its target: the last [`EXCESS_TICKS`] measured
/// shares less their ticks' targets, and the factor its rate is held by (1 = its
/// counters are believed).
#[derive(Debug, Clone)]
struct Guard {
    factor: f64,
    target: f64,
    /// The target before the last change, and when it changed: for one window (NVML's
    /// figures trail the rate by that much) an excess counts against the higher of the
    /// two. Before the first target, 100: the claim ran unthrottled until then.
    previous: f64,
    changed_at: f64,
    excess: VecDeque<f64>,
}

impl Default for Guard {
    fn default() -> Self {
        Guard {
            factor: 1.0,
            target: f64::NAN,
            previous: 100.0,
            changed_at: f64::NEG_INFINITY,
            excess: VecDeque::new(),
        }
    }
}

impl Guard {
    /// Records the measured share at `now` against `target` (both percent) and updates
    /// the factor. The average carries over a target change, and so does the factor (a
    /// forger's counters do not become honest when a neighbour leaves, and a tenant
    /// making its targets move, with another claim of its own going on and off, keeps
    /// no average from filling). A mean beyond `target + EXCESS_POINTS` cuts the factor
    /// by `target ÷ mean` a second, a mean at or below the target relaxes it, and in
    /// between nothing moves: NVML's noise alone seldom crosses the line, and then by
    /// little (a cut of about 1.2 % a tick just above it).
    fn observe(&mut self, now: f64, target: f64, measured: f64, may_cut: bool) -> f64 {
        if self.target.is_nan() {
            self.target = target;
            self.changed_at = now;
        } else if (self.target - target).abs() >= 0.5 {
            self.previous = self.target;
            self.target = target;
            self.changed_at = now;
        }
        let reference = if now - self.changed_at < WINDOW_SECS {
            target.max(self.previous)
        } else {
            target
        };
        self.excess.push_back(measured - reference);
        while self.excess.len() > EXCESS_TICKS {
            self.excess.pop_front();
        }
        if self.excess.len() == EXCESS_TICKS {
            let mean = target + self.excess.iter().sum::<f64>() / EXCESS_TICKS as f64;
            if mean > target + EXCESS_POINTS && may_cut {
                let cut = (target.max(1.0) / mean).powf(GUARD_CUT);
                self.factor = (self.factor * cut).max(GUARD_MIN);
            } else if mean <= target {
                self.factor = (self.factor * GUARD_RELAX).min(1.0);
            }
        }
        self.factor
    }

    /// No figure that counts this tick (a half-idle GPU under contention, or no target
    /// at all): the average starts again, so that old figures never cut later.
    fn forget(&mut self) {
        self.excess.clear();
    }
}

impl GpuController {
    pub fn new() -> Self {
        Self::default()
    }

    /// The capacity estimate, thread blocks per second at 100 % busy.
    pub fn capacity(&self) -> Option<f64> {
        self.capacity
    }

    /// A claim's own capacity (blocks per second it would retire alone on the whole
    /// GPU), once it has [`MIN_COST_SAMPLES`] windows of samples.
    pub fn claim_capacity(&self, key: &str) -> Option<f64> {
        let log = self.claim_cap_log.get(key)?;
        if log.len() < MIN_COST_SAMPLES {
            return None;
        }
        let (b, u) = log
            .iter()
            .fold((0.0, 0.0), |(b, u), (_, db, du)| (b + db, u + du));
        (b > 0.0 && u > 0.0).then(|| b / u)
    }

    /// The factor NVML's figures hold a claim's rate by (1 = its counters believed).
    pub fn guard(&self, key: &str) -> f64 {
        self.guards.get(key).map_or(1.0, |g| g.factor)
    }

    /// Whether the last tick found the GPU contended.
    pub fn contended(&self) -> bool {
        self.contended
    }

    /// One control step. Pure apart from the controller's own memory.
    pub fn step(&mut self, obs: &GpuObservation) -> Vec<Decision> {
        let now = obs.now;
        let counters: BTreeMap<String, Counters> = obs
            .claims
            .iter()
            .map(|c| {
                (
                    c.key.clone(),
                    Counters {
                        blocks: c.blocks,
                        waited_ns: c.waited_ns,
                    },
                )
            })
            .collect();
        // Rates over about one window, and activity over the last ACTIVE_SECS.
        let window_start = self
            .history
            .iter()
            .find(|(t, _)| now - t <= 1.2 * WINDOW_SECS)
            .cloned();
        let recent = self
            .history
            .iter()
            .find(|(t, _)| now - t <= ACTIVE_SECS + 0.05)
            .cloned();
        self.history.push_back((now, counters.clone()));
        while self
            .history
            .front()
            .is_some_and(|(t, _)| now - t > WINDOW_SECS + 0.5)
        {
            self.history.pop_front();
        }
        let delta = |from: &Option<(f64, BTreeMap<String, Counters>)>, key: &str| {
            let (t0, m) = from.as_ref()?;
            let dt = now - t0;
            if dt <= 0.0 {
                return None;
            }
            let (a, b) = (m.get(key)?, counters.get(key)?);
            Some((
                b.blocks.saturating_sub(a.blocks) as f64 / dt,
                b.waited_ns.saturating_sub(a.waited_ns) as f64,
            ))
        };
        let mut active = Vec::with_capacity(obs.claims.len());
        let mut launched = 0.0;
        let mut waiting = false;
        let mut claim_launched = Vec::with_capacity(obs.claims.len());
        // NVML overrules counters only when it reports per-process samples at all.
        let nvml_sees = obs.claims.iter().any(|c| c.util.is_some());
        for c in &obs.claims {
            let (short_rate, short_wait) = delta(&recent, &c.key).unwrap_or((0.0, 0.0));
            let counts = short_rate > 0.0 || short_wait > 0.0;
            // How long the counters have shown work: a claim starting (or back from a
            // pause after work NVML saw) gets QUIET_SECS before NVML's silence counts
            // against it; a forger pausing its fake waits gains nothing, however long
            // the pause, as NVML never saw its fakes work.
            let working = c.util.is_some_and(|u| u >= QUIET_UTIL);
            let counting_for = if counts {
                let e = self
                    .counting
                    .entry(c.key.clone())
                    .or_insert((now, now, false));
                if now - e.1 > QUIET_SECS && e.2 {
                    *e = (now, now, false);
                }
                e.1 = now;
                e.2 |= working;
                now - e.0
            } else {
                if let Some(e) = self.counting.get_mut(&c.key) {
                    e.2 |= working;
                }
                0.0
            };
            let quiet = nvml_sees && c.util.is_none_or(|u| u < QUIET_UTIL);
            let silenced = if quiet {
                let since = *self.quiet_since.entry(c.key.clone()).or_insert(now);
                now - since >= QUIET_SECS && counting_for >= QUIET_SECS
            } else {
                self.quiet_since.remove(&c.key);
                false
            };
            let counted = counts && !silenced;
            let a = counted || (c.blocks == 0 && c.util.is_some_and(|u| u >= ACTIVE_UTIL));
            waiting |= short_wait > 0.0 && !silenced;
            active.push(a);
            let l = delta(&window_start, &c.key).map_or(0.0, |d| d.0);
            claim_launched.push(l);
            launched += l;
        }
        let claims_util: f64 = obs.claims.iter().filter_map(|c| c.util).sum();
        let busy = obs.busy.unwrap_or(claims_util).clamp(0.0, 100.0);
        // Capacity: blocks launched per second over the last window ÷ the busy fraction
        // NVML reports for (about) the same window, averaged over CAPACITY_SECS so that a
        // few long kernels charged at launch do not swing it. Both sides cover the same
        // second, so ramps up and down (throttling starting) do not bias it.
        let full_window = window_start
            .as_ref()
            .is_some_and(|(t, _)| now - t >= 0.9 * WINDOW_SECS);
        if full_window && busy >= CAPACITY_BUSY {
            self.cap_log.push_back((now, launched, busy / 100.0));
        }
        while self
            .cap_log
            .front()
            .is_some_and(|(t, _, _)| now - t > CAPACITY_SECS)
        {
            self.cap_log.pop_front();
        }
        // Each claim's own cost per block: its blocks over the window against its own
        // utilization of (about) the same window.
        for (c, &l) in obs.claims.iter().zip(&claim_launched) {
            let log = self.claim_cap_log.entry(c.key.clone()).or_default();
            if full_window
                && l > 0.0
                && let Some(u) = c.util.filter(|&u| u >= COST_UTIL)
            {
                log.push_back((now, l, u / 100.0));
            }
            while log.front().is_some_and(|(t, _, _)| now - t > CAPACITY_SECS) {
                log.pop_front();
            }
        }
        let (blocks, busy_sum) = self
            .cap_log
            .iter()
            .fold((0.0, 0.0), |(b, s), (_, db, ds)| (b + db, s + ds));
        if busy_sum > 0.0 && blocks > 0.0 {
            self.capacity = Some(blocks / busy_sum);
        }
        let n_active = active.iter().filter(|a| **a).count();
        self.contended = n_active >= 2
            && if self.contended {
                busy >= RELEASE_BUSY || waiting
            } else {
                busy >= CONTENDED_BUSY
            };
        if !self.contended {
            self.contended_since = None;
        } else if self.contended_since.is_none() {
            self.contended_since = Some(now);
        }
        let settled = self
            .contended_since
            .is_some_and(|t0| now - t0 >= WINDOW_SECS);
        let act: Vec<(usize, &ClaimObservation)> = obs
            .claims
            .iter()
            .enumerate()
            .filter(|(i, _)| active[*i])
            .collect();
        let t: Vec<f64> = targets(
            &act.iter()
                .map(|(_, c)| (c.share, c.limit))
                .collect::<Vec<_>>(),
        );
        let busy_sum: f64 = act.iter().filter_map(|(_, c)| c.util).sum();
        let mut out = Vec::with_capacity(obs.claims.len());
        for (i, c) in obs.claims.iter().enumerate() {
            let achieved = match (c.util, busy_sum > 0.0) {
                (Some(u), true) => Some(100.0 * u / busy_sum.max(busy)),
                _ => None,
            };
            let target = act
                .iter()
                .position(|(j, _)| *j == i)
                .map(|p| t[p])
                .filter(|_| self.contended)
                .or_else(|| (c.limit < 100.0).then_some(c.limit));
            let capacity = self.claim_capacity(&c.key).or(self.capacity);
            let rate = match (target, capacity) {
                (Some(target), Some(cap)) => {
                    let corr = self.correction.entry(c.key.clone()).or_insert(1.0);
                    // Integral term: only under contention, from one window after it
                    // began, on the claim's measured share (NVML) against its target.
                    if settled && let Some(ach) = achieved {
                        let err = target - ach;
                        if err.abs() > DEADBAND {
                            *corr = (*corr * (1.0 + GAIN * err))
                                .clamp(CORRECTION_RANGE.0, CORRECTION_RANGE.1);
                        }
                    }
                    // The correction learned under contention never loosens a cap on an
                    // idle GPU.
                    let (headroom, corr) = if self.contended {
                        (HEADROOM, *corr)
                    } else {
                        (1.0, 1.0)
                    };
                    // NVML's word against the counters: under contention the claim's
                    // share of the busy time (from one window after it began), on an
                    // idle GPU its utilization against its cap.
                    let measured = if self.contended {
                        achieved.filter(|_| settled)
                    } else {
                        c.util
                    };
                    // Under contention the integral term answers a bias first, both
                    // ways; the guard cuts only once that term is at its floor (an
                    // excess it cannot trim is no noise), so that NVML's noise never
                    // costs an honest claim its share; and only on a busy GPU: a share
                    // of the busy time above target on a GPU a neighbour leaves partly
                    // idle takes nothing from anyone.
                    let saturated = !self.contended || busy >= RELEASE_BUSY;
                    let may_cut = !self.contended || corr <= CORRECTION_RANGE.0 + 1e-9;
                    let guard = self.guards.entry(c.key.clone()).or_default();
                    let guard = match measured {
                        Some(m) if saturated => guard.observe(now, target, m, may_cut),
                        Some(_) => {
                            guard.forget();
                            guard.factor
                        }
                        None => guard.factor,
                    };
                    let want = target / 100.0 * cap * headroom * corr * guard;
                    // Bounded steps for the same target (the integral term, capacity
                    // drift); a new target (claims came or went) is set at once.
                    let r = match self.rates.get(&c.key) {
                        Some(&(prev, prev_target))
                            if prev > 0.0 && (prev_target - target).abs() < 0.5 =>
                        {
                            want.clamp(prev * (1.0 - MAX_STEP), prev * (1.0 + MAX_STEP))
                        }
                        _ => want,
                    };
                    self.rates.insert(c.key.clone(), (r, target));
                    r.max(1.0)
                }
                _ => {
                    self.rates.remove(&c.key);
                    // Unchecked (no contention, no cap), the guard relaxes as it would
                    // at its target: an honest claim once cut is not held for good.
                    if let Some(g) = self.guards.get_mut(&c.key) {
                        g.factor = (g.factor * GUARD_RELAX).min(1.0);
                        g.forget();
                    }
                    0.0
                }
            };
            out.push(Decision {
                key: c.key.clone(),
                block_rate: rate.round() as u64,
                target,
                active: active[i],
                achieved,
            });
        }
        // Forget claims that left.
        self.correction
            .retain(|k, _| obs.claims.iter().any(|c| &c.key == k));
        self.rates
            .retain(|k, _| obs.claims.iter().any(|c| &c.key == k));
        self.guards
            .retain(|k, _| obs.claims.iter().any(|c| &c.key == k));
        self.quiet_since
            .retain(|k, _| obs.claims.iter().any(|c| &c.key == k));
        self.counting
            .retain(|k, _| obs.claims.iter().any(|c| &c.key == k));
        self.claim_cap_log
            .retain(|k, _| obs.claims.iter().any(|c| &c.key == k));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(v: Vec<f64>) -> Vec<f64> {
        v.into_iter().map(|x| (x * 10.0).round() / 10.0).collect()
    }

    /// The issue's table of expected targets.
    #[test]
    fn targets_follow_the_reservation_plus_equal_spare_rule() {
        let t = |s: &[f64]| round(targets(&s.iter().map(|&x| (x, 100.0)).collect::<Vec<_>>()));
        assert_eq!(t(&[25.0, 40.0]), vec![42.5, 57.5]);
        assert_eq!(t(&[10.0, 90.0]), vec![10.0, 90.0]);
        assert_eq!(t(&[30.0, 70.0]), vec![30.0, 70.0]);
        assert_eq!(t(&[20.0, 30.0, 50.0]), vec![20.0, 30.0, 50.0]);
        assert_eq!(t(&[25.0, 40.0, 0.0]), vec![36.7, 51.7, 11.7]);
        assert_eq!(t(&[60.0]), vec![100.0]);
        assert_eq!(t(&[50.0, 50.0, 0.0]), vec![50.0, 50.0, 0.0]);
    }

    #[test]
    fn caps_are_water_filled() {
        // 25/40 with the second capped at 45: it gets 45, the first the rest.
        assert_eq!(
            round(targets(&[(25.0, 100.0), (40.0, 45.0)])),
            vec![55.0, 45.0]
        );
        // A lone capped claim gets its cap, not 100.
        assert_eq!(round(targets(&[(10.0, 30.0)])), vec![30.0]);
        // Over-reserved shares are scaled down.
        assert_eq!(
            round(targets(&[(80.0, 100.0), (80.0, 100.0)])),
            vec![50.0, 50.0]
        );
    }

    fn obs(now: f64, busy: f64, claims: &[(&str, f64, f64, u64, u64)]) -> GpuObservation {
        GpuObservation {
            now,
            busy: Some(busy),
            claims: claims
                .iter()
                .map(|&(k, share, util, blocks, waited)| ClaimObservation {
                    key: k.into(),
                    share,
                    limit: 100.0,
                    util: Some(util),
                    blocks,
                    waited_ns: waited,
                })
                .collect(),
        }
    }

    /// Two claims saturating a GPU that retires 10 000 blocks/s, split evenly before
    /// throttling: the controller sets rates in the 42.5 : 57.5 proportion, summing to
    /// the headroom fraction of capacity.
    #[test]
    fn contention_sets_rates_from_capacity() {
        let mut c = GpuController::new();
        let mut d = Vec::new();
        for k in 0..=4u64 {
            let t = k as f64 * 0.25;
            d = c.step(&obs(
                t,
                100.0,
                &[
                    ("a", 25.0, 50.0, 1250 * k, 0),
                    ("b", 40.0, 50.0, 1250 * k, 0),
                ],
            ));
            if c.contended() && c.capacity().is_some() {
                break;
            }
        }
        assert!(c.contended());
        let cap = c.capacity().unwrap();
        assert!((cap - 10_000.0).abs() < 1.0, "capacity {cap}");
        let (a, b) = (d[0].block_rate as f64, d[1].block_rate as f64);
        assert!((a / (a + b) - 0.425).abs() < 0.01, "{a} {b}");
        assert!(((a + b) / cap - HEADROOM).abs() < 0.02, "{a} {b}");
    }

    /// Claim a's blocks cost twice claim b's (a alone would retire 5 000 blocks/s, b
    /// 10 000). Observed at the target split of time, 42.5 : 57.5, a launches 2 125
    /// blocks/s and b 5 750. Each claim's own capacity keeps the rates at that split of
    /// *time*; the GPU-wide figure (7 875 blocks/s) would give a 27 % too much and b 21 %
    /// too little.
    #[test]
    fn each_claim_is_paced_by_its_own_cost_per_block() {
        let mut c = GpuController::new();
        let mut d = Vec::new();
        for k in 0..=12u64 {
            d = c.step(&obs(
                k as f64 * 0.25,
                100.0,
                &[
                    ("a", 25.0, 42.5, 2125 * k / 4, 0),
                    ("b", 40.0, 57.5, 5750 * k / 4, 0),
                ],
            ));
        }
        let (ca, cb) = (
            c.claim_capacity("a").unwrap(),
            c.claim_capacity("b").unwrap(),
        );
        assert!((ca - 5_000.0).abs() < 5.0, "a alone: {ca} blocks/s");
        assert!((cb - 10_000.0).abs() < 5.0, "b alone: {cb} blocks/s");
        let cap = c.capacity().unwrap();
        assert!((cap - 7_875.0).abs() < 5.0, "GPU: {cap}");
        // Shares of GPU time the rates allow: rate ÷ own capacity.
        let (ta, tb) = (d[0].block_rate as f64 / ca, d[1].block_rate as f64 / cb);
        assert!((ta / (ta + tb) - 0.425).abs() < 0.005, "{d:?}");
        assert!(((ta + tb) - HEADROOM).abs() < 0.01, "{d:?}");
    }

    /// A lone active claim is not throttled; an idle GPU with a capped claim is.
    #[test]
    fn no_contention_means_no_throttle_unless_capped() {
        let mut c = GpuController::new();
        let mut d = Vec::new();
        for k in 0..=4u64 {
            d = c.step(&obs(
                k as f64 * 0.25,
                95.0,
                &[("a", 25.0, 95.0, 2000 * k, 0), ("b", 40.0, 0.0, 0, 0)],
            ));
        }
        assert!(!c.contended());
        assert_eq!(d[0].block_rate, 0);
        assert!(!d[1].active);
        let mut c = GpuController::new();
        for k in 0..=4u64 {
            let mut o = obs(k as f64 * 0.25, 95.0, &[("a", 25.0, 95.0, 2000 * k, 0)]);
            o.claims[0].limit = 30.0;
            d = c.step(&o);
        }
        let cap = c.capacity().unwrap();
        assert_eq!(d[0].target, Some(30.0));
        assert!((d[0].block_rate as f64 / cap - 0.30).abs() < 0.01);
    }

    /// A claim that stops launching goes inactive from its counters within
    /// ACTIVE_SECS, although NVML's 1 s window still shows it busy; its neighbour,
    /// alone, is then released at once.
    #[test]
    fn a_claim_that_stops_launching_is_idle_before_nvml_says_so() {
        let mut c = GpuController::new();
        let (mut a, mut b) = (0u64, 0u64);
        let mut d = Vec::new();
        for k in 0..=8u64 {
            a += 1250;
            b += 1250;
            d = c.step(&obs(
                k as f64 * 0.25,
                100.0,
                &[("a", 25.0, 50.0, a, 0), ("b", 40.0, 50.0, b, 0)],
            ));
        }
        assert!(c.contended());
        assert!(d[0].block_rate > 0);
        // b goes idle; NVML keeps reporting its last second.
        for k in 9..=11u64 {
            a += 1250;
            d = c.step(&obs(
                k as f64 * 0.25,
                100.0,
                &[("a", 25.0, 50.0, a, 1), ("b", 40.0, 50.0, b, 0)],
            ));
        }
        assert!(!d[1].active, "{d:?}");
        assert!(!c.contended());
        assert_eq!(d[0].block_rate, 0, "the lone claim is unthrottled");
        // A claim with no counted launches (a bypass) is judged by NVML.
        let d = c.step(&obs(
            3.0,
            100.0,
            &[("a", 25.0, 50.0, a, 1), ("x", 0.0, 30.0, 0, 0)],
        ));
        assert!(d[1].active);
    }

    /// The integral term moves a rate by at most MAX_STEP per tick.
    #[test]
    fn steps_are_bounded() {
        let mut c = GpuController::new();
        let mut prev = 0.0;
        for k in 0..=20u64 {
            // Claim a measures far below its target every tick.
            let d = c.step(&obs(
                k as f64 * 0.25,
                100.0,
                &[
                    ("a", 50.0, 10.0, 5000 * k / 4, 1),
                    ("b", 50.0, 90.0, 5000 * k / 4, 1),
                ],
            ));
            let r = d[0].block_rate as f64;
            if prev > 0.0 {
                assert!(r <= prev * (1.0 + MAX_STEP) + 1.0, "{prev} -> {r}");
            }
            prev = r;
        }
    }

    /// A closed loop on a model GPU (no noise): two claims whose blocks each cost
    /// 100 µs (10 000 blocks/s fill the GPU), launching as fast as their rates allow, in
    /// `procs` processes each (the GPU's round-robin splits what the rates leave by
    /// process); claim a writes `forge` extra blocks into its counter per block it
    /// launched. NVML reports each claim's utilization over the last second. Returns
    /// claim a's share of the busy time per tick, and the controller.
    fn closed_loop(forge: f64, procs: [f64; 2], secs: f64) -> (Vec<f64>, GpuController) {
        const C: f64 = 10_000.0;
        const DT: f64 = 0.25;
        let mut c = GpuController::new();
        let (mut rates, mut blocks, mut waited) = ([0u64; 2], [0.0f64; 2], [0u64; 2]);
        let mut util_log: VecDeque<[f64; 2]> = VecDeque::new();
        let mut shares = Vec::new();
        for k in 0..(secs / DT) as usize {
            // Throttled claims run at their rate; unthrottled ones split the rest.
            let mut u = [0.0; 2];
            for i in 0..2 {
                if rates[i] > 0 {
                    u[i] = rates[i] as f64 / C;
                }
            }
            let throttled: f64 = u.iter().sum();
            if throttled > 1.0 {
                u = [u[0] / throttled, u[1] / throttled];
            }
            let free: f64 = (0..2).filter(|&i| rates[i] == 0).map(|i| procs[i]).sum();
            for i in 0..2 {
                if rates[i] == 0 {
                    u[i] = (1.0 - throttled).max(0.0) * procs[i] / free;
                }
                let launched = u[i] * C * DT;
                blocks[i] += launched * if i == 0 { 1.0 + forge } else { 1.0 };
                if rates[i] > 0 {
                    waited[i] += 1_000_000;
                }
            }
            util_log.push_back(u);
            if util_log.len() > 4 {
                util_log.pop_front();
            }
            let util = |i: usize| 100.0 * util_log.iter().map(|u| u[i]).sum::<f64>() / 4.0;
            let busy = util(0) + util(1);
            shares.push(100.0 * util(0) / busy);
            let d = c.step(&GpuObservation {
                now: k as f64 * DT,
                busy: Some(busy),
                claims: ["a", "b"]
                    .iter()
                    .zip([25.0, 40.0])
                    .enumerate()
                    .map(|(i, (key, share))| ClaimObservation {
                        key: (*key).into(),
                        share,
                        limit: 100.0,
                        util: Some(util(i)),
                        blocks: blocks[i] as u64,
                        waited_ns: waited[i],
                    })
                    .collect(),
            });
            rates = [d[0].block_rate, d[1].block_rate];
        }
        (shares, c)
    }

    /// A claim forging 4 extra blocks per block launched (its rate, from its counters,
    /// would be 5x too high) is held to its target (42.5) by NVML's figures within 10 s:
    /// from then on no 2 s mean of its share is more than EXCESS_POINTS above it.
    /// Believed, its counters would give it its 3 processes' 75 % of the round-robin.
    #[test]
    fn forged_counters_are_overruled_by_nvml_within_ten_seconds() {
        let (shares, c) = closed_loop(4.0, [3.0, 1.0], 40.0);
        println!("claim a share per tick: {shares:.1?}");
        let tail = &shares[40..];
        for (k, w) in tail.windows(8).enumerate() {
            let m = w.iter().sum::<f64>() / 8.0;
            assert!(
                m <= 42.5 + EXCESS_POINTS,
                "2 s mean {m:.2} from {:.2} s: {shares:.1?}",
                10.0 + k as f64 * 0.25
            );
        }
        let last = tail.iter().sum::<f64>() / tail.len() as f64;
        assert!(last > 42.5 - 5.0, "held, not starved: {last:.2}");
        assert!(c.guard("a") < 0.5, "guard {}", c.guard("a"));
        assert_eq!(c.guard("b"), 1.0);
    }

    /// Honest claims never trip the guard: their counters pace them at their targets.
    #[test]
    fn honest_claims_keep_their_counters_believed() {
        let (shares, c) = closed_loop(0.0, [3.0, 1.0], 40.0);
        let tail = &shares[20..];
        let m = tail.iter().sum::<f64>() / tail.len() as f64;
        assert!((m - 42.5).abs() < 1.0, "{m:.2}: {shares:.1?}");
        assert_eq!((c.guard("a"), c.guard("b")), (1.0, 1.0));
    }

    /// Two claims "a" and "b" with these shares, both saturating the GPU and waiting
    /// for 2 s (ticks 0..=8): contended, capacity known. Returns their block counters.
    fn both_busy(c: &mut GpuController, shares: (f64, f64)) -> (u64, u64) {
        let (mut a, mut b) = (0u64, 0u64);
        for k in 0..=8u64 {
            a += 1250;
            b += 1250;
            c.step(&obs(
                k as f64 * 0.25,
                100.0,
                &[("a", shares.0, 50.0, a, 1), ("b", shares.1, 50.0, b, 1)],
            ));
        }
        assert!(c.contended());
        (a, b)
    }

    /// A claim that forges waits (and a trickle of launches) while NVML shows it idle
    /// stops counting as active after QUIET_SECS: its busy neighbour, alone in fact, is
    /// released instead of being held to its target on a GPU half idle.
    #[test]
    fn forged_waits_do_not_hold_a_neighbour_back() {
        let mut c = GpuController::new();
        let mut d = Vec::new();
        let (mut a, mut b) = both_busy(&mut c, (25.0, 40.0));
        let mut bw = 0u64;
        // b stops running but keeps writing waits and one block a tick into its region;
        // NVML shows b at 0 and a, throttled to its target, at 42.5 % of the GPU.
        let mut released_at = None;
        for k in 9..=40u64 {
            a += 1000;
            b += 1;
            bw += 1_000_000;
            let t = k as f64 * 0.25;
            d = c.step(&obs(
                t,
                if released_at.is_some() { 100.0 } else { 42.5 },
                &[("a", 25.0, 42.5, a, 1), ("b", 40.0, 0.0, b, bw)],
            ));
            if released_at.is_none() && d[0].block_rate == 0 {
                released_at = Some(t);
            }
        }
        let t = released_at.expect("a is released");
        assert!(t <= 2.25 + QUIET_SECS + 0.5, "released at {t} s");
        assert!(!d[1].active && !c.contended(), "{d:?}");
    }

    /// A claim back from a long pause counts as active from its first launches,
    /// although NVML, a window behind, still shows it idle: the quiet rule waits
    /// QUIET_SECS of counted work before NVML's silence counts.
    #[test]
    fn a_claim_back_from_a_pause_is_active_before_nvml_sees_it() {
        let mut c = GpuController::new();
        let (mut a, mut b) = (0u64, 0u64);
        // a alone for 5 s; b idle (NVML: 0).
        for k in 0..20u64 {
            a += 2500;
            c.step(&obs(
                k as f64 * 0.25,
                100.0,
                &[("a", 25.0, 100.0, a, 0), ("b", 40.0, 0.0, b, 0)],
            ));
        }
        // b launches again; NVML shows it at 0 for its first 1.75 s.
        for k in 20..27u64 {
            a += 1250;
            b += 1250;
            let d = c.step(&obs(
                k as f64 * 0.25,
                100.0,
                &[("a", 25.0, 100.0, a, 1), ("b", 40.0, 0.0, b, 1)],
            ));
            assert!(d[1].active, "tick {k}: {d:?}");
        }
    }

    /// Contended 50/50, but the neighbour uses only 20 % of the GPU: the busy claim's
    /// share of the busy time (46 of 66) is far above its target, yet it takes nothing
    /// from anyone, so the guard leaves it alone (only a busy GPU's shares count).
    #[test]
    fn a_share_above_target_on_a_half_idle_gpu_is_not_cut() {
        let mut c = GpuController::new();
        let (mut a, mut b) = both_busy(&mut c, (50.0, 50.0));
        for k in 9..=60u64 {
            a += 1150;
            b += 500;
            c.step(&obs(
                k as f64 * 0.25,
                66.0,
                &[("a", 50.0, 46.0, a, 1_000_000 * k), ("b", 50.0, 20.0, b, 0)],
            ));
        }
        assert!(c.contended(), "a still waits in its bucket");
        assert_eq!(c.guard("a"), 1.0);
    }

    /// A claim that fakes waits in bursts (2 s on, 2.5 s off) while NVML shows it idle
    /// gets no new grace at each burst: one burst after its real work may have one
    /// (NVML saw that work), every later burst is idle at once, and its busy neighbour
    /// runs unthrottled.
    #[test]
    fn bursts_of_forged_waits_get_no_new_grace() {
        let mut c = GpuController::new();
        let (mut a, mut b) = both_busy(&mut c, (25.0, 40.0));
        let mut bw = 0u64;
        let mut k = 9u64;
        for burst in 0..4 {
            for tick in 0..18 {
                a += 2500;
                let on = tick < 8;
                if on {
                    b += 1;
                    bw += 1_000_000;
                }
                let d = c.step(&obs(
                    k as f64 * 0.25,
                    100.0,
                    &[("a", 25.0, 100.0, a, 1), ("b", 40.0, 0.0, b, bw)],
                ));
                if burst >= 2 {
                    assert!(!d[1].active, "burst {burst}, tick {tick}: {d:?}");
                    assert_eq!(d[0].block_rate, 0, "burst {burst}, tick {tick}: {d:?}");
                }
                k += 1;
            }
        }
    }

    /// A tenant that makes its target move every half second (another claim of its own
    /// going on and off) does not keep the guard from judging: a claim at 75 % against
    /// targets of 42.5 and 36.7 in turn is cut well below 1 within 10 s.
    #[test]
    fn moving_targets_do_not_blind_the_guard() {
        let mut g = Guard::default();
        let mut factor = 1.0;
        for k in 0..40u64 {
            let target = if (k / 2) % 2 == 0 { 42.5 } else { 36.7 };
            factor = g.observe(k as f64 * 0.25, target, 75.0, true);
        }
        assert!(factor < 0.3, "factor {factor}");
    }
}
