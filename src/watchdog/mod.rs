//! The node-side watchdog behind the interception library's memory wall.
//!
//! The library cannot see a statically linked program, a custom loader, allocations
//! outside its scope, or a tenant who corrupts its own region. The driver can: NVML
//! lists every process with a context and the memory it holds. The watchdog maps each
//! of those processes to a claim **by host PID and cgroup**, never through the
//! library's registry (a process that bypassed the library is not in it): the pod UID
//! from `<proc-root>/<pid>/cgroup`, then the prepared claims reserved for that pod in
//! the checkpoint merged with the claims the API server says the pod uses ([`pods`]:
//! a pod may join a claim after its prepare, or join a second one).
//!
//! Per tick and GPU it finds:
//! * **over budget**: a shared claim whose processes hold more than its budget plus
//!   the tolerance. `--watchdog=enforce` (default) kills the largest offenders until
//!   the claim is back within budget ([`kill_checked`]; enforce needs the plugin's
//!   PID namespace in the proc root, else it reports); `report` only reports. Either
//!   way a new finding is a Warning Event on the offending pods and a log line naming
//!   the PIDs; a failed kill is retried with backoff.
//! * **no claim**: a GPU process in no pod, or in a pod with no prepared claim on the
//!   GPU. Reported (log, metric) once per process.
//! * **zombie memory**: memory held by a process that no longer exists, or by a process
//!   of a claim this plugin unprepared or is unpreparing (a MIG device still in use).
//!   Reported (log naming the PIDs, gauges per GPU and per MIG GPU instance).
//!
//! The decisions ([`mod@judge`]) are pure; [`Watchdog`] is the edge (NVML, procfs, kill,
//! Events, and the live pod lookup of [`pods`]).

pub mod events;
pub mod judge;
pub mod kill;
pub mod pods;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use tracing::{info, warn};

use crate::error_chain::cause_chain as chain;
use crate::prepare::checkpoint::ClaimRecord;
use crate::prepare::state::{DeviceState, Unprepared};
pub use events::{EventSink, KubeEvents};
pub use judge::{
    ClaimView, Finding, ProcessView, add_live_pod, claims_on_gpu, judge, pod_uid_from_cgroup,
    unpreparing_on_gpu,
};
pub use kill::{KillError, kill_checked, proc_root_matches_pid_namespace};
pub use pods::{KubePods, LiveClaim, LivePod, LookupError, NodePods, PodCache, PodLookup};

/// What the watchdog does about a claim over its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Kill the offending processes (default).
    Enforce,
    /// Only report them.
    Report,
    /// No watchdog at all.
    Off,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "enforce" => Ok(Mode::Enforce),
            "report" => Ok(Mode::Report),
            "off" => Ok(Mode::Off),
            other => Err(format!(
                "unknown watchdog mode {other:?} (enforce, report or off)"
            )),
        }
    }
}

/// The watchdog's settings.
#[derive(Debug, Clone)]
pub struct WatchdogConfig {
    pub mode: Mode,
    /// Bytes a shared claim may hold above its budget before the watchdog acts.
    pub tolerance: u64,
    pub proc_root: PathBuf,
    pub interval: std::time::Duration,
}

/// Watchdog period: a process over budget is killed within two of them plus NVML's
/// reporting delay.
pub const INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// Parses `--watchdog-tolerance`: a byte quantity (`256Mi`, `1G`, `0`).
pub fn parse_tolerance(s: &str) -> Result<u64, String> {
    let q = k8s_model::validation::quantity::Quantity::parse(s)
        .map_err(|e| format!("--watchdog-tolerance {s:?}: {}", e.go_message()))?;
    q.to_i64_value()
        .filter(|v| *v >= 0 && q.is_integer())
        .map(|v| v as u64)
        .ok_or_else(|| format!("--watchdog-tolerance {s:?}: not a whole number of bytes"))
}

/// Default tolerance: NVML's per-process figure includes the process's context and the
/// driver's own reservations, which the library's charges match only approximately
/// (context creation is charged per the interception library's estimate).
pub const DEFAULT_TOLERANCE: u64 = 256 << 20;

/// The edge: one tick reads NVML and procfs, judges each GPU, acts and reports.
pub struct Watchdog {
    cfg: WatchdogConfig,
    state: Arc<DeviceState>,
    events: Option<Box<dyn EventSink>>,
    /// Lists this node's pods with their claims, merged with the checkpoint's records
    /// (pods that joined a claim after its prepare); `None`: the checkpoint only.
    pods: Option<Arc<dyn PodLookup>>,
    pod_cache: PodCache,
    /// How long a tick waits for a pod list in flight.
    lookup_wait: std::time::Duration,
    /// (pid, kind) already reported, so reports are made once per process.
    reported: BTreeSet<(u32, &'static str)>,
    /// PIDs killed lately: a killed process stays in NVML's list (and as a zombie in
    /// procfs) until its context is torn down; it is not killed or reported again.
    killed: BTreeMap<u32, std::time::Instant>,
    /// PIDs whose kill failed: (attempts, next attempt), backing off.
    failing: BTreeMap<u32, (u32, std::time::Instant)>,
}

/// When to try again to kill a PID whose kill failed `attempts` times: the tick
/// interval, doubling, at most 30 s. Deterministic.
pub fn kill_retry_after(attempts: u32) -> std::time::Duration {
    let max = std::time::Duration::from_secs(30);
    INTERVAL
        .checked_mul(1u32 << attempts.saturating_sub(1).min(16))
        .map_or(max, |d| d.min(max))
}

/// How long a killed PID is left alone.
const KILL_QUIET: std::time::Duration = std::time::Duration::from_secs(10);

/// Zombie memory found in one tick: (GPU UUID, MIG GI or `None`) → (bytes, PIDs).
pub type Zombies = BTreeMap<(String, Option<u32>), (u64, Vec<u32>)>;

impl Watchdog {
    /// A watchdog in `cfg.mode`, except that enforce falls back to report (with an
    /// error log) when `cfg.proc_root` does not show the plugin's own PID namespace:
    /// PIDs from it could not be signalled safely.
    pub fn new(
        mut cfg: WatchdogConfig,
        state: Arc<DeviceState>,
        events: Option<Box<dyn EventSink>>,
    ) -> Self {
        if cfg.mode == Mode::Enforce {
            match proc_root_matches_pid_namespace(&cfg.proc_root) {
                Ok(true) => {}
                Ok(false) => {
                    tracing::error!(proc_root = %cfg.proc_root.display(), "watchdog: the proc root shows another PID namespace than the plugin's (run the plugin with hostPID); reporting instead of killing");
                    cfg.mode = Mode::Report;
                }
                Err(e) => {
                    tracing::error!(proc_root = %cfg.proc_root.display(), error = %e, "watchdog: cannot tell the proc root's PID namespace; reporting instead of killing");
                    cfg.mode = Mode::Report;
                }
            }
        }
        Watchdog {
            cfg,
            state,
            events,
            pods: None,
            pod_cache: PodCache::default(),
            lookup_wait: pods::TICK_WAIT,
            reported: BTreeSet::new(),
            killed: BTreeMap::new(),
            failing: BTreeMap::new(),
        }
    }

    /// Also maps processes to claims through `lookup` (this node's pods and their
    /// claims, merged with the checkpoint's records).
    pub fn with_pods(mut self, lookup: Box<dyn PodLookup>) -> Self {
        self.pods = Some(Arc::from(lookup));
        self
    }

    /// How long a tick waits for a pod list in flight ([`pods::TICK_WAIT`] unless set;
    /// tests that judge a single tick wait longer).
    pub fn with_lookup_wait(mut self, wait: std::time::Duration) -> Self {
        self.lookup_wait = wait;
        self
    }

    fn view(&self, pid: u32, used: u64, gi: Option<u32>) -> ProcessView {
        let dir = self.cfg.proc_root.join(pid.to_string());
        let cgroup = std::fs::read_to_string(dir.join("cgroup")).ok();
        ProcessView {
            pid,
            used_bytes: used,
            exists: dir.exists(),
            pod: cgroup.as_deref().and_then(pod_uid_from_cgroup),
            gi,
        }
    }

    /// Refreshes this node's pod list if due (one list for all `wanted` pods, waiting
    /// at most `lookup_wait`; see [`pods`]). A no-op without a lookup.
    fn refresh_pods(&mut self, wanted: &BTreeSet<String>, claims: &BTreeMap<String, ClaimRecord>) {
        let Some(lookup) = self.pods.as_ref() else {
            return;
        };
        let now = std::time::Instant::now();
        if let Some(e) = self.pod_cache.refresh(
            wanted,
            pods::wanted_claims(claims),
            lookup,
            now,
            self.lookup_wait,
        ) {
            warn!(error = %chain(&e), "watchdog: cannot list the node's pods");
        }
    }

    /// Adds to `on_gpu` every pod of `views` the last pod list has, to each claim there
    /// it uses (merged with the checkpoint's records: a pod recorded for one claim may
    /// have joined another since).
    fn join_live_pods(
        &self,
        views: &[ProcessView],
        on_gpu: &mut [ClaimView],
        claims: &BTreeMap<String, ClaimRecord>,
    ) {
        let pods: BTreeSet<&str> = views
            .iter()
            .filter(|v| v.exists)
            .filter_map(|v| v.pod.as_deref())
            .collect();
        for pod in pods {
            let Some(live) = self.pod_cache.get(pod) else {
                continue;
            };
            let uids = pods::claims_of(live, claims);
            if !uids.is_empty() {
                add_live_pod(on_gpu, live, &uids);
            }
        }
    }

    /// One pass over every managed GPU. Returns the findings (for tests and logs).
    pub fn tick(&mut self) -> Vec<(String, Finding)> {
        if self.cfg.mode == Mode::Off {
            return Vec::new();
        }
        let claims = self.state.prepared().unwrap_or_default();
        let unprepared = self.state.recently_unprepared();
        let mut all = Vec::new();
        let mut seen: BTreeSet<(u32, &'static str)> = BTreeSet::new();
        let mut zombies = Zombies::new();
        let state = self.state.clone();
        // (GPU UUID, its processes, claims unprepared or being unprepared there).
        let mut gpus: Vec<(String, Vec<ProcessView>, Vec<Unprepared>)> = Vec::new();
        for g in state.gpus() {
            let uuid = g.gpu.uuid.clone();
            let procs = match state.backend().processes(g.gpu.minor) {
                Ok(p) => p,
                Err(e) => {
                    warn!(gpu = %uuid, error = %e, "watchdog: cannot list the GPU's processes");
                    continue;
                }
            };
            let views: Vec<ProcessView> = procs
                .iter()
                .map(|p| self.view(p.pid, p.used_bytes.unwrap_or(0), p.gi_id))
                .collect();
            let mut gone: Vec<Unprepared> = unprepared
                .iter()
                .filter(|u| u.gpus.contains(&uuid))
                .cloned()
                .collect();
            gone.extend(unpreparing_on_gpu(&claims, &uuid));
            gpus.push((uuid, views, gone));
        }
        // Pods with GPU processes, except those of claims unprepared there (their
        // pods are usually deleted: no list would find them).
        let wanted: BTreeSet<String> = gpus
            .iter()
            .flat_map(|(_, views, gone)| {
                views
                    .iter()
                    .filter(|v| v.exists)
                    .filter_map(|v| v.pod.as_ref())
                    .filter(|pod| !gone.iter().any(|u| u.pods.iter().any(|r| &r.uid == *pod)))
            })
            .cloned()
            .collect();
        self.refresh_pods(&wanted, &claims);
        for (uuid, views, gone) in gpus {
            let mut on_gpu = claims_on_gpu(&claims, &uuid);
            self.join_live_pods(&views, &mut on_gpu, &claims);
            let pod_of: BTreeMap<u32, Option<String>> =
                views.iter().map(|v| (v.pid, v.pod.clone())).collect();
            for f in judge(&views, &on_gpu, &gone, self.cfg.tolerance) {
                self.act(&uuid, &f, &pod_of, &mut seen);
                if let Finding::Zombie { pid, used, gi, .. } = &f {
                    let z = zombies.entry((uuid.clone(), *gi)).or_default();
                    z.0 += used;
                    z.1.push(*pid);
                }
                all.push((uuid.clone(), f));
            }
        }
        self.reported.retain(|k| seen.contains(k));
        self.failing.retain(|pid, _| seen.contains(&(*pid, "over")));
        crate::telemetry::metrics::set_zombies(zombies);
        all
    }

    fn act(
        &mut self,
        gpu: &str,
        f: &Finding,
        pod_of: &BTreeMap<u32, Option<String>>,
        seen: &mut BTreeSet<(u32, &'static str)>,
    ) {
        let m = crate::telemetry::metrics::driver();
        match f {
            Finding::OverBudget {
                claim,
                namespace,
                name,
                pods,
                used,
                budget,
                pids,
                kill,
            } => {
                let now = std::time::Instant::now();
                for &p in kill {
                    seen.insert((p, "over"));
                }
                self.killed.retain(|_, at| at.elapsed() < KILL_QUIET);
                if kill.iter().all(|p| self.killed.contains_key(p)) {
                    return; // killed already; its memory is on its way out
                }
                // New: a PID to kill that no earlier tick reported.
                let new = kill.iter().any(|p| !self.reported.contains(&(*p, "over")));
                let enforce = self.cfg.mode == Mode::Enforce;
                let mut killed = Vec::new();
                let mut failed = Vec::new();
                let mut withheld = Vec::new();
                if enforce {
                    // PID 0 and 1 are never a pod's workload as the host sees it.
                    for &pid in kill.iter().filter(|p| **p > 1) {
                        if self.killed.contains_key(&pid)
                            || self.failing.get(&pid).is_some_and(|(_, next)| *next > now)
                        {
                            continue; // killed, or a failed kill backing off
                        }
                        let pod = pod_of.get(&pid).cloned().flatten();
                        // A kill never rests on missing data: a pod some of whose
                        // claims could not be read may hold a larger budget.
                        let unread = pod
                            .as_deref()
                            .and_then(|p| self.pod_cache.get(p))
                            .is_some_and(|p| !p.unread.is_empty());
                        if unread {
                            withheld.push(pid);
                            continue;
                        }
                        // A process in no pod is never a claim's; never signalled.
                        let Some(pod) = pod else {
                            failed.push(pid);
                            continue;
                        };
                        match kill_checked(&self.cfg.proc_root, pid, &pod) {
                            Ok(()) => {
                                killed.push(pid);
                                self.killed.insert(pid, now);
                                self.failing.remove(&pid);
                            }
                            Err(e) => {
                                let (attempts, next) = self.failing.entry(pid).or_insert((0, now));
                                *attempts += 1;
                                *next = now + kill_retry_after(*attempts);
                                warn!(pid, attempts = *attempts, retry_in = ?kill_retry_after(*attempts), error = %chain(&e), "watchdog: kill failed");
                                failed.push(pid);
                            }
                        }
                    }
                }
                for &p in kill {
                    self.reported.insert((p, "over"));
                }
                if !new && killed.is_empty() {
                    return; // reported already, nothing done now: no log line, no Event
                }
                let action = if enforce && !withheld.is_empty() {
                    format!(
                        "killed {killed:?}; could not kill {failed:?}; not killed {withheld:?} (claims of its pod could not be read)"
                    )
                } else if enforce {
                    format!("killed {killed:?}; could not kill {failed:?}")
                } else {
                    format!("would kill {kill:?} (report mode)")
                };
                let msg = format!(
                    "claim {namespace}/{name} holds {used} bytes on GPU {gpu}, over its budget of {budget} bytes (+{} tolerance); processes {pids:?}; {action}",
                    self.cfg.tolerance
                );
                warn!(claim = %claim, gpu, used, budget, pids = ?pids, killed = ?killed, failed = ?failed, withheld = ?withheld, "watchdog: memory over budget");
                if enforce {
                    for _ in &killed {
                        m.watchdog_action("kill", "over_budget");
                    }
                } else {
                    m.watchdog_action("report", "over_budget");
                }
                // Only the pods whose processes are to be killed get the Event.
                let offending: BTreeSet<&str> = kill
                    .iter()
                    .filter_map(|p| pod_of.get(p).and_then(|o| o.as_deref()))
                    .collect();
                if let Some(ev) = &self.events {
                    for pod in pods.iter().filter(|r| offending.contains(r.uid.as_str())) {
                        ev.warn(namespace, pod, "GpuMemoryOverBudget", &msg);
                    }
                }
            }
            Finding::NoClaim { pid, used, pod } => {
                seen.insert((*pid, "noclaim"));
                if self.reported.insert((*pid, "noclaim")) {
                    warn!(pid, gpu, used, pod = ?pod, "watchdog: GPU process belongs to no prepared claim");
                    m.watchdog_action("report", "no_claim");
                }
            }
            Finding::Zombie {
                pid,
                used,
                gi,
                claim,
                vanished,
            } => {
                seen.insert((*pid, "zombie"));
                if self.reported.insert((*pid, "zombie")) {
                    if *vanished {
                        warn!(
                            pid,
                            gpu,
                            gi = ?gi,
                            used,
                            "zombie memory: GPU memory held by a process that no longer exists"
                        );
                    } else {
                        warn!(pid, gpu, gi = ?gi, used, claim = ?claim, "zombie memory: GPU memory still held by a process of an unprepared claim");
                    }
                    m.watchdog_action("report", "zombie");
                }
            }
        }
    }

    /// Ticks every `interval` until `stop` is cancelled.
    pub async fn run(mut self, stop: tokio_util::sync::CancellationToken) {
        if self.cfg.mode == Mode::Off {
            // Nothing to watch; a supervised service still ends only when stopped.
            return stop.cancelled().await;
        }
        info!(mode = ?self.cfg.mode, tolerance = self.cfg.tolerance, "watchdog running");
        let mut iv = tokio::time::interval(self.cfg.interval);
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = iv.tick() => {
                    self = match tokio::task::spawn_blocking(move || { self.tick(); self }).await {
                        Ok(s) => s,
                        Err(e) => { warn!(error = %e, "watchdog tick failed"); return; }
                    };
                }
                () = stop.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::checkpoint::{ClaimState, PodRef};
    use std::path::Path;

    const POD: &str = "4b2f6c1e-8d3a-4f5b-9c7e-1a2b3c4d5e6f";

    #[test]
    fn finds_the_pod_in_every_cgroup_layout() {
        for text in [
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod4b2f6c1e_8d3a_4f5b_9c7e_1a2b3c4d5e6f.slice/cri-containerd-abc.scope\n",
            "0::/kubepods.slice/kubepods-pod4b2f6c1e_8d3a_4f5b_9c7e_1a2b3c4d5e6f.slice/crio-1.scope\n",
            "12:memory:/kubepods/besteffort/pod4b2f6c1e-8d3a-4f5b-9c7e-1a2b3c4d5e6f/0123abcd\n11:cpu:/kubepods/besteffort/pod4b2f6c1e-8d3a-4f5b-9c7e-1a2b3c4d5e6f/0123abcd\n",
            "0::/kubepods/pod4b2f6c1e-8d3a-4f5b-9c7e-1a2b3c4d5e6f/ctr\n",
        ] {
            assert_eq!(pod_uid_from_cgroup(text).as_deref(), Some(POD), "{text}");
        }
        assert_eq!(
            pod_uid_from_cgroup("0::/user.slice/user-0.slice/session-1.scope\n"),
            None
        );
        assert_eq!(
            pod_uid_from_cgroup("0::/kubepods.slice/kubepods-podnotauid.slice\n"),
            None
        );
    }

    fn claim(uid: &str, pod: &str, budget: Option<u64>) -> ClaimView {
        ClaimView {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("c-{uid}"),
            pods: vec![PodRef {
                name: format!("p-{pod}"),
                uid: pod.into(),
            }],
            budget,
        }
    }

    fn proc(pid: u32, gib: u64, pod: Option<&str>) -> ProcessView {
        ProcessView {
            pid,
            used_bytes: gib << 30,
            exists: true,
            pod: pod.map(Into::into),
            gi: None,
        }
    }

    /// A claim of 4 GiB whose two processes hold 3 + 2 GiB: the larger is killed.
    #[test]
    fn over_budget_kills_the_largest_until_within_budget() {
        let f = judge(
            &[proc(10, 3, Some(POD)), proc(11, 2, Some(POD))],
            &[claim("u1", POD, Some(4 << 30))],
            &[],
            DEFAULT_TOLERANCE,
        );
        match &f[..] {
            [Finding::OverBudget { kill, used, .. }] => {
                assert_eq!(kill, &vec![10]);
                assert_eq!(*used, 5 << 30);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn below_tolerance_nothing_happens() {
        let f = judge(
            &[ProcessView {
                pid: 10,
                used_bytes: (4 << 30) + (200 << 20),
                exists: true,
                pod: Some(POD.into()),
                gi: None,
            }],
            &[claim("u1", POD, Some(4 << 30))],
            &[],
            DEFAULT_TOLERANCE,
        );
        assert!(f.is_empty(), "{f:?}");
    }

    #[test]
    fn whole_gpu_claims_have_no_budget_to_exceed() {
        let f = judge(
            &[proc(10, 70, Some(POD))],
            &[claim("u1", POD, None)],
            &[],
            0,
        );
        assert!(f.is_empty());
    }

    #[test]
    fn strangers_and_zombies_are_reported() {
        let gone = Unprepared {
            uid: "old".into(),
            namespace: "ns".into(),
            name: "old".into(),
            pods: vec![PodRef {
                name: "p".into(),
                uid: POD.into(),
            }],
            gpus: vec!["GPU-a".into()],
            at: 0,
        };
        let mut vanished = proc(12, 1, None);
        vanished.exists = false;
        let f = judge(
            &[proc(10, 1, None), proc(11, 2, Some(POD)), vanished],
            &[],
            &[gone],
            0,
        );
        assert_eq!(
            f,
            vec![
                Finding::NoClaim {
                    pid: 10,
                    used: 1 << 30,
                    pod: None
                },
                Finding::Zombie {
                    pid: 11,
                    used: 2 << 30,
                    gi: None,
                    claim: Some("old".into()),
                    vanished: false
                },
                Finding::Zombie {
                    pid: 12,
                    used: 1 << 30,
                    gi: None,
                    claim: None,
                    vanished: true
                },
            ]
        );
    }

    /// Regression (a pod joining a shared claim after its prepare was never mapped):
    /// once the live lookup adds the pod to the claim, its processes count against
    /// the claim's budget and the largest is killed.
    #[test]
    fn a_pod_joining_later_is_held_to_the_claims_budget() {
        const LATE: &str = "7d0e2a9b-1c3f-4e5d-8a6b-9c0d1e2f3a4b";
        let procs = [proc(10, 1, Some(POD)), proc(20, 3, Some(LATE))];
        let mut views = vec![claim("u1", POD, Some(2 << 30))];
        assert!(matches!(
            &judge(&procs, &views, &[], 0)[..],
            [Finding::NoClaim { pid: 20, .. }]
        ));
        let live = LivePod {
            uid: LATE.into(),
            namespace: "ns".into(),
            name: "late".into(),
            claims: vec![],
            unread: vec![],
        };
        add_live_pod(&mut views, &live, &["u1".into()]);
        add_live_pod(&mut views, &live, &["u1".into()]);
        assert_eq!(views[0].pods.len(), 2, "added once");
        match &judge(&procs, &views, &[], 0)[..] {
            [Finding::OverBudget { kill, pids, .. }] => {
                assert_eq!(kill, &vec![20]);
                assert_eq!(pids, &vec![10, 20]);
            }
            other => panic!("{other:?}"),
        }
    }

    /// A claim whose unprepare has begun (its MIG device still in use) has zombie
    /// processes, keyed by the GPU instance they run on.
    #[test]
    fn processes_of_a_claim_being_unprepared_are_zombies_of_their_gpu_instance() {
        use crate::prepare::checkpoint::{MigRecord, PreparedDevice};
        let device = PreparedDevice {
            request_names: vec!["gpu".into()],
            pool_name: "node".into(),
            device_name: "gpu-0-mig-1g.10gb-3".into(),
            cdi_device_ids: vec![],
            share_id: None,
            gpu_uuid: "GPU-a".into(),
            config: Default::default(),
            mig: Some(MigRecord {
                gpu_minor: 0,
                profile_id: 19,
                start: 3,
                size: 1,
                gi_id: 9,
                ci_id: Some(0),
                uuid: None,
                created: true,
            }),
            budget: None,
        };
        let rec = |state| ClaimRecord {
            state,
            namespace: "ns".into(),
            name: "mig".into(),
            devices: vec![device.clone()],
            cdi_spec: None,
            claim_files: false,
            metadata: false,
            lib_version: None,
            pods: vec![PodRef {
                name: "p".into(),
                uid: POD.into(),
            }],
            started_at: 0,
            completed_at: None,
        };
        let mut claims = BTreeMap::new();
        claims.insert("u1".to_string(), rec(ClaimState::UnprepareStarted));
        assert!(claims_on_gpu(&claims, "GPU-a").is_empty());
        let gone = unpreparing_on_gpu(&claims, "GPU-a");
        assert_eq!(gone.len(), 1);
        assert!(unpreparing_on_gpu(&claims, "GPU-b").is_empty());
        let mut p = proc(10, 1, Some(POD));
        p.gi = Some(9);
        assert_eq!(
            judge(&[p], &[], &gone, 0),
            vec![Finding::Zombie {
                pid: 10,
                used: 1 << 30,
                gi: Some(9),
                claim: Some("u1".into()),
                vanished: false
            }]
        );
        claims.insert("u1".to_string(), rec(ClaimState::PrepareCompleted));
        assert!(unpreparing_on_gpu(&claims, "GPU-a").is_empty());
        assert_eq!(claims_on_gpu(&claims, "GPU-a").len(), 1);
    }

    /// A PID whose cgroup no longer names the expected pod is not signalled.
    #[test]
    fn a_reused_pid_is_not_killed() {
        let root = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let dir = root.path().join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup"), "0::/system.slice/other.service\n").unwrap();
        let r = kill_checked(root.path(), pid, POD);
        assert!(matches!(r, Err(KillError::Reused { .. })), "{r:?}");
        assert!(child.try_wait().unwrap().is_none(), "still running");
        std::fs::write(dir.join("cgroup"), format!("0::/kubepods/pod{POD}/ctr\n")).unwrap();
        kill_checked(root.path(), pid, POD).unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    }

    /// Regression (a process outside any pod passed the pod check, and the plugin
    /// could signal itself): the plugin's own PID is never signalled, even when its
    /// cgroup names the expected pod.
    #[test]
    fn the_plugin_never_kills_itself() {
        let root = tempfile::tempdir().unwrap();
        let own = std::process::id();
        let dir = root.path().join(own.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup"), format!("0::/kubepods/pod{POD}/ctr\n")).unwrap();
        let r = kill_checked(root.path(), own, POD);
        assert!(matches!(r, Err(KillError::Own { .. })), "{r:?}");
    }

    /// The proc root must show the plugin's PID namespace: the real /proc does; one
    /// whose `self` names another PID (the host's procfs seen from a pod without
    /// hostPID), or has no `self`, does not.
    #[test]
    fn a_proc_root_of_another_pid_namespace_is_refused() {
        assert!(proc_root_matches_pid_namespace(Path::new("/proc")).unwrap());
        let root = tempfile::tempdir().unwrap();
        assert!(proc_root_matches_pid_namespace(root.path()).is_err());
        let other = (std::process::id() + 1).to_string();
        std::os::unix::fs::symlink(&other, root.path().join("self")).unwrap();
        assert!(!proc_root_matches_pid_namespace(root.path()).unwrap());
        let root = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(std::process::id().to_string(), root.path().join("self"))
            .unwrap();
        assert!(proc_root_matches_pid_namespace(root.path()).unwrap());
    }

    /// A kill that keeps failing is retried with backoff: 0.5, 1, 2, 4 s ... at most
    /// 30 s apart.
    #[test]
    fn failed_kills_back_off() {
        let secs: Vec<f64> = (1..=8).map(|n| kill_retry_after(n).as_secs_f64()).collect();
        assert_eq!(secs, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]);
        assert_eq!(kill_retry_after(u32::MAX).as_secs(), 30);
    }
}
