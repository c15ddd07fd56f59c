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
    contended: bool,
    /// When contention began: NVML's samples lag a window, so the integral term waits
    /// one window after the rates were first set.
    contended_since: Option<f64>,
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
        for c in &obs.claims {
            let (short_rate, short_wait) = delta(&recent, &c.key).unwrap_or((0.0, 0.0));
            let a = short_rate > 0.0
                || short_wait > 0.0
                || (c.blocks == 0 && c.util.is_some_and(|u| u >= ACTIVE_UTIL));
            waiting |= short_wait > 0.0;
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
                    let want = target / 100.0 * cap * headroom * corr;
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
}
