//! The compute controller's edge: each tick it reads NVML (per-process utilization,
//! device busy), the claims' regions (blocks launched, time waited in the bucket) and
//! controls (share, `computeLimit`), runs [`crate::compute::controller::GpuController`] per GPU,
//! and writes each claim's block rate into its `control` file, which the interception
//! library reads on every launch.
//!
//! NVML reports host PIDs; a PID belongs to the claim whose region it has mapped
//! (`/proc/<pid>/maps`, as [`crate::compute::procmap`]). Only the PIDs NVML lists are read, and
//! each PID's answer is cached for [`PID_CACHE`].

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_abi::control::Control;
use tracing::{debug, info, warn};

use crate::compute::controller::{
    BURST_NS, ClaimObservation, Decision, GpuController, GpuObservation,
};
use crate::inventory::GpuBackend;

/// How long a PID's claim is remembered.
pub const PID_CACHE: Duration = Duration::from_secs(5);
/// How long a PID found in no claim is remembered.
pub const NO_CLAIM_CACHE: Duration = Duration::from_secs(1);
/// Controller period.
pub const INTERVAL: Duration = Duration::from_millis(250);
/// Samples older than this (relative to the newest) no longer count.
const SAMPLE_AGE_US: u64 = 1_200_000;

/// A claim the controller drives: its UID and the directory holding its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlledClaim {
    pub uid: String,
    pub dir: PathBuf,
}

struct OpenClaim {
    control: Control,
    /// The region is read with read(2), never mapped: a tenant can shrink it, and a
    /// mapping would then fault the plugin.
    region: PathBuf,
    /// `(dev, ino)` of the region file, as `/proc/<pid>/maps` shows it.
    ident: (u64, u64),
    /// GPU UUIDs in file order.
    uuids: Vec<String>,
    /// Last rate written per GPU index.
    written: Vec<Option<u64>>,
}

impl OpenClaim {
    fn open(dir: &Path) -> Result<Self, String> {
        let cpath = dir.join(tessera_abi::CONTROL_FILE);
        let rpath = dir.join(tessera_abi::REGION_FILE);
        let cf = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&cpath)
            .map_err(|e| format!("{}: {e}", cpath.display()))?;
        let meta = std::fs::metadata(&rpath).map_err(|e| format!("{}: {e}", rpath.display()))?;
        let control = Control::map(&cf, true).map_err(|e| format!("{}: {e}", cpath.display()))?;
        let uuids: Vec<String> = control
            .read()
            .map_err(|e| format!("{}: {e}", cpath.display()))?
            .into_iter()
            .map(|g| g.uuid)
            .collect();
        Ok(OpenClaim {
            written: vec![None; uuids.len()],
            control,
            region: rpath,
            ident: (meta.dev(), meta.ino()),
            uuids,
        })
    }
}

/// `(dev, ino)` pairs a process has mapped, from its maps file.
fn mapped_files(proc_root: &Path, pid: u32) -> Vec<(u64, u64)> {
    let Ok(maps) = std::fs::read_to_string(proc_root.join(pid.to_string()).join("maps")) else {
        return Vec::new();
    };
    maps.lines()
        .filter_map(crate::compute::procmap::parse_maps_identity)
        .collect()
}

/// Per PID: (timestamp µs, SM percent) of its latest sample.
type LatestSamples = HashMap<u32, (u64, u32)>;

/// The controller service for one node.
pub struct ComputeService {
    backend: Arc<dyn GpuBackend>,
    proc_root: PathBuf,
    /// (minor, UUID) of the GPUs to control.
    gpus: Vec<(u32, String)>,
    controllers: BTreeMap<String, GpuController>,
    claims: BTreeMap<String, OpenClaim>,
    pid_claim: HashMap<u32, (Option<String>, Instant)>,
    /// Per GPU minor: newest sample timestamp seen, and the latest sample per PID.
    samples: HashMap<u32, (u64, LatestSamples)>,
    /// Per GPU minor: when NVML last returned a fresh sample (samples stop when all
    /// processes go idle; the cached ones must not keep claims "active").
    fresh_at: HashMap<u32, Instant>,
    start: Instant,
}

impl ComputeService {
    pub fn new(backend: Arc<dyn GpuBackend>, proc_root: PathBuf, gpus: Vec<(u32, String)>) -> Self {
        ComputeService {
            backend,
            proc_root,
            gpus,
            controllers: BTreeMap::new(),
            claims: BTreeMap::new(),
            pid_claim: HashMap::new(),
            samples: HashMap::new(),
            fresh_at: HashMap::new(),
            start: Instant::now(),
        }
    }

    fn sync_claims(&mut self, claims: &[ControlledClaim]) {
        self.claims
            .retain(|uid, _| claims.iter().any(|c| &c.uid == uid));
        for c in claims {
            if self.claims.contains_key(&c.uid) {
                continue;
            }
            match OpenClaim::open(&c.dir) {
                Ok(o) => {
                    debug!(claim = %c.uid, gpus = ?o.uuids, "compute controller: claim opened");
                    self.claims.insert(c.uid.clone(), o);
                }
                Err(e) => {
                    warn!(claim = %c.uid, error = %e, "compute controller: cannot open the claim's files")
                }
            }
        }
    }

    fn claim_of(&mut self, pid: u32) -> Option<String> {
        // A PID found in no claim is asked again soon: a process that just started may
        // map its claim's region a moment later.
        if let Some((c, at)) = self.pid_claim.get(&pid)
            && at.elapsed()
                < if c.is_some() {
                    PID_CACHE
                } else {
                    NO_CLAIM_CACHE
                }
        {
            return c.clone();
        }
        let mapped = mapped_files(&self.proc_root, pid);
        let c = self
            .claims
            .iter()
            .find(|(_, o)| mapped.contains(&o.ident))
            .map(|(u, _)| u.clone());
        self.pid_claim.insert(pid, (c.clone(), Instant::now()));
        c
    }

    /// The capacity estimate of GPU `uuid` (blocks per second at 100 % busy).
    pub fn capacity(&self, uuid: &str) -> Option<f64> {
        self.controllers.get(uuid).and_then(GpuController::capacity)
    }

    /// One control step over every GPU; returns the decisions per GPU UUID.
    pub fn tick(&mut self, claims: &[ControlledClaim]) -> Vec<(String, Vec<Decision>)> {
        self.sync_claims(claims);
        self.pid_claim
            .retain(|_, (_, at)| at.elapsed() < PID_CACHE * 2);
        let now = self.start.elapsed().as_secs_f64();
        let mut out = Vec::new();
        for (minor, uuid) in self.gpus.clone() {
            let on: Vec<String> = self
                .claims
                .iter()
                .filter(|(_, o)| o.uuids.contains(&uuid))
                .map(|(u, _)| u.clone())
                .collect();
            if on.is_empty() {
                self.controllers.remove(&uuid);
                continue;
            }
            // Per-process samples since the newest seen.
            let (since, latest) = self.samples.entry(minor).or_default().clone();
            let fresh = match self.backend.process_utilization(minor, since) {
                Ok(s) => s,
                Err(e) => {
                    warn!(gpu = %uuid, error = %e, "compute controller: no per-process utilization");
                    Vec::new()
                }
            };
            let mut latest = latest;
            let mut newest = since;
            if !fresh.is_empty() {
                self.fresh_at.insert(minor, Instant::now());
            } else if self
                .fresh_at
                .get(&minor)
                .is_none_or(|t| t.elapsed().as_micros() as u64 > SAMPLE_AGE_US)
            {
                latest.clear();
            }
            for s in fresh {
                newest = newest.max(s.timestamp_us);
                let e = latest.entry(s.pid).or_insert((0, 0));
                if s.timestamp_us >= e.0 {
                    *e = (s.timestamp_us, s.sm_percent);
                }
            }
            latest.retain(|_, (ts, _)| newest.saturating_sub(*ts) <= SAMPLE_AGE_US);
            self.samples.insert(minor, (newest, latest.clone()));
            let mut util: BTreeMap<String, f64> = BTreeMap::new();
            for (&pid, &(_, sm)) in &latest {
                if let Some(c) = self.claim_of(pid) {
                    *util.entry(c).or_default() += f64::from(sm);
                }
            }
            let busy = match self.backend.usage(minor) {
                Ok(u) => u.and_then(|u| u.utilization_percent).map(f64::from),
                Err(e) => {
                    debug!(gpu = %uuid, error = %e, "compute controller: no device utilization");
                    None
                }
            };
            let mut obs = GpuObservation {
                now,
                busy,
                claims: Vec::new(),
            };
            let mut index = Vec::new();
            for uid in &on {
                let stats = self
                    .claims
                    .get(uid)
                    .and_then(|o| tessera_abi::region::read_gpu_stats(&o.region).ok());
                let Some(o) = self.claims.get(uid) else {
                    continue;
                };
                let Some(g) = o.uuids.iter().position(|u| u == &uuid) else {
                    continue;
                };
                let Ok(ctl) = o.control.read() else {
                    continue;
                };
                let Some(entry) = ctl.get(g) else {
                    continue;
                };
                let stats = stats
                    .as_ref()
                    .and_then(|v| v.get(g).copied())
                    .unwrap_or_default();
                obs.claims.push(ClaimObservation {
                    key: uid.clone(),
                    share: f64::from(entry.share),
                    limit: f64::from(entry.compute_limit),
                    util: util.get(uid).copied(),
                    blocks: stats.blocks,
                    waited_ns: stats.waited_ns,
                });
                index.push((uid.clone(), g));
            }
            let ctl = self.controllers.entry(uuid.clone()).or_default();
            let was = ctl.contended();
            let decisions = ctl.step(&obs);
            if ctl.contended() != was {
                info!(gpu = %uuid, contended = ctl.contended(), capacity = ?ctl.capacity(), "compute controller: contention changed");
            }
            for (d, (uid, g)) in decisions.iter().zip(&index) {
                let Some(o) = self.claims.get_mut(uid) else {
                    continue;
                };
                if o.written[*g] != Some(d.block_rate) {
                    match o.control.set_rate(*g, d.block_rate, BURST_NS) {
                        Ok(()) => o.written[*g] = Some(d.block_rate),
                        Err(e) => {
                            warn!(claim = %uid, gpu = %uuid, error = %e, "compute controller: cannot write the rate")
                        }
                    }
                }
                crate::telemetry::metrics::set_compute(
                    uid,
                    &uuid,
                    crate::telemetry::metrics::ComputeStatus {
                        achieved: d.achieved.map(|a| a / 100.0),
                        target: d.target.map(|t| t / 100.0),
                        block_rate: d.block_rate,
                    },
                );
            }
            out.push((uuid, decisions));
        }
        let live: Vec<String> = self.claims.keys().cloned().collect();
        crate::telemetry::metrics::retain_compute(|c| live.iter().any(|l| l == c));
        out
    }
}

/// The plugin's loop: every [`INTERVAL`], the shared claims of the checkpoint.
pub async fn run(
    mut svc: ComputeService,
    state: Arc<crate::prepare::state::DeviceState>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut iv = tokio::time::interval(INTERVAL);
    iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = iv.tick() => {
                let st = state.clone();
                svc = match tokio::task::spawn_blocking(move || {
                    let claims: Vec<ControlledClaim> = st
                        .prepared()
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|(_, r)| r.claim_files && r.state == crate::prepare::checkpoint::ClaimState::PrepareCompleted)
                        .map(|(uid, _)| ControlledClaim {
                            dir: crate::prepare::claim_files::claim_dir(&st.config().run_dir, &uid),
                            uid,
                        })
                        .collect();
                    svc.tick(&claims);
                    svc
                })
                .await
                {
                    Ok(s) => s,
                    Err(e) => {
                        warn!(error = %e, "compute controller tick failed");
                        return;
                    }
                };
            }
            () = stop.cancelled() => return,
        }
    }
}
