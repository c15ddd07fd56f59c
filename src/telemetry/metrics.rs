//! Prometheus metrics, served with `/healthz` and `/readyz` on `--metrics-addr`.
//!
//! * Driver counters and histograms live for the process ([`driver`]): prepares and
//!   unprepares by device kind, their latency, errors by reason, slice publications,
//!   MIG devices created and destroyed.
//! * Per-GPU and per-claim gauges are rebuilt at each scrape from a [`NodeSnapshot`]
//!   (the checkpoint plus each shared claim's accounting region), so a claim's series
//!   disappear with its unprepare and label cardinality is bounded by what is prepared.
//!
//! Rendering a snapshot is pure; [`region_usage`] is the one edge here (file reads). The
//! snapshot is built by `prepare::snapshot::gather`, beside the state it reads.

use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The content type of the OpenMetrics exposition (for scrapers that accept it).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the classic Prometheus text format (everyone else).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Converts an OpenMetrics exposition to the classic Prometheus text format: counter
/// families are named with their `_total` suffix in `HELP`/`TYPE`, and the `UNIT` and
/// `EOF` lines go. Samples are unchanged.
pub fn to_prometheus_text(om: &str) -> String {
    let counters: std::collections::BTreeSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `whole`, `mig`, `shared` or `slot`.
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    /// `prepare` or `unprepare`.
    pub op: String,
    /// A bounded reason: a step of the state machine (`claim`, `cdi`, `checkpoint`,
    /// `gpu`, `lock`, `claim_files`, `library`, `task`), or the claim GET before it
    /// ([`crate::kubelet::FetchError::reason`]: `claim_not_found`, `claim_replaced`, `claim_api`,
    /// `claim_timeout`).
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `success` or `failure`.
    pub result: String,
}

type HistogramFamily = Family<KindLabel, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms to ~16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The process-wide driver metrics.
pub struct DriverMetrics {
    pub prepares: Family<KindLabel, Counter>,
    pub unprepares: Family<KindLabel, Counter>,
    pub prepare_seconds: HistogramFamily,
    pub unprepare_seconds: HistogramFamily,
    pub errors: Family<ErrorLabel, Counter>,
    pub publications: Family<ResultLabel, Counter>,
    pub mig_created: Counter,
    pub mig_destroyed: Counter,
    pub watchdog_actions: Family<WatchdogLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchdogLabel {
    /// `kill` or `report`.
    pub action: String,
    /// `over_budget`, `no_claim` or `zombie`.
    pub reason: String,
}

/// What the background loops (compute controller, watchdog) last found, read at each
/// scrape. Keys are looked up from the checkpoint's claims, so a claim's series vanish
/// with its unprepare even if an entry lingers here until the next tick.
#[derive(Debug, Default)]
pub struct RuntimeStatus {
    /// (claim UID, GPU UUID) → compute status.
    pub compute: BTreeMap<(String, String), ComputeStatus>,
    /// (GPU UUID, MIG GPU instance or `None` for the whole GPU) → (zombie bytes, PIDs).
    pub zombies: BTreeMap<(String, Option<u32>), (u64, Vec<u32>)>,
}

/// A claim's compute on one GPU as the controller last saw it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ComputeStatus {
    /// Share of the GPU's busy time, 0 to 1 (NVML per-process samples).
    pub achieved: Option<f64>,
    /// The controller's target, 0 to 1, while contended or capped.
    pub target: Option<f64>,
    /// Thread blocks per second allowed; 0 = unthrottled.
    pub block_rate: u64,
}

/// The process-wide runtime status.
pub fn runtime() -> &'static Mutex<RuntimeStatus> {
    static S: LazyLock<Mutex<RuntimeStatus>> = LazyLock::new(Mutex::default);
    &S
}

/// Replaces the zombie-memory table (the watchdog, each tick).
pub fn set_zombies(z: BTreeMap<(String, Option<u32>), (u64, Vec<u32>)>) {
    runtime().lock().unwrap_or_else(|p| p.into_inner()).zombies = z;
}

/// Replaces one claim's compute status (the controller, each tick).
pub fn set_compute(claim: &str, gpu: &str, st: ComputeStatus) {
    runtime()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .compute
        .insert((claim.to_string(), gpu.to_string()), st);
}

/// Forgets compute status of claims no longer present.
pub fn retain_compute(keep: impl Fn(&str) -> bool) {
    runtime()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .compute
        .retain(|(c, _), _| keep(c));
}

/// The driver metrics of this process.
pub fn driver() -> &'static DriverMetrics {
    static M: LazyLock<DriverMetrics> = LazyLock::new(|| DriverMetrics {
        prepares: Family::default(),
        unprepares: Family::default(),
        prepare_seconds: Family::new_with_constructor(latency_histogram),
        unprepare_seconds: Family::new_with_constructor(latency_histogram),
        errors: Family::default(),
        publications: Family::default(),
        mig_created: Counter::default(),
        mig_destroyed: Counter::default(),
        watchdog_actions: Family::default(),
    });
    &M
}

impl DriverMetrics {
    /// Records one prepare or unprepare (`op`) of a claim of `kind` that took `secs`.
    pub fn observe(&self, op: &str, kind: &str, secs: f64, error: Option<&str>) {
        let k = KindLabel { kind: kind.into() };
        match op {
            "prepare" => {
                self.prepares.get_or_create(&k).inc();
                self.prepare_seconds.get_or_create(&k).observe(secs);
            }
            _ => {
                self.unprepares.get_or_create(&k).inc();
                self.unprepare_seconds.get_or_create(&k).observe(secs);
            }
        }
        if let Some(reason) = error {
            self.errors
                .get_or_create(&ErrorLabel {
                    op: op.into(),
                    reason: reason.into(),
                })
                .inc();
        }
    }

    /// Records one failure outside a prepare or unprepare attempt (the claim could not
    /// be fetched, or the blocking task died): `tessera_claim_errors_total` only.
    pub fn error(&self, op: &str, reason: &str) {
        self.errors
            .get_or_create(&ErrorLabel {
                op: op.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Records one watchdog action.
    pub fn watchdog_action(&self, action: &str, reason: &str) {
        self.watchdog_actions
            .get_or_create(&WatchdogLabel {
                action: action.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Records one publication of the pool.
    pub fn published(&self, ok: bool) {
        self.publications
            .get_or_create(&ResultLabel {
                result: if ok { "success" } else { "failure" }.into(),
            })
            .inc();
    }

    fn register(&self, r: &mut Registry) {
        r.register(
            "tessera_claim_prepares",
            "Claims prepared (attempts), by device kind",
            self.prepares.clone(),
        );
        r.register(
            "tessera_claim_unprepares",
            "Claims unprepared (attempts), by device kind",
            self.unprepares.clone(),
        );
        r.register_with_unit(
            "tessera_claim_prepare_duration",
            "Time to prepare a claim, by device kind",
            Unit::Seconds,
            self.prepare_seconds.clone(),
        );
        r.register_with_unit(
            "tessera_claim_unprepare_duration",
            "Time to unprepare a claim, by device kind",
            Unit::Seconds,
            self.unprepare_seconds.clone(),
        );
        r.register(
            "tessera_claim_errors",
            "Failed prepares and unprepares, by operation and reason",
            self.errors.clone(),
        );
        r.register(
            "tessera_slice_publications",
            "ResourceSlice pool publications, by result",
            self.publications.clone(),
        );
        r.register(
            "tessera_mig_devices_created",
            "MIG devices created for claims",
            self.mig_created.clone(),
        );
        r.register(
            "tessera_mig_devices_destroyed",
            "MIG devices destroyed (unprepare, rollback, start-up clean-up)",
            self.mig_destroyed.clone(),
        );
        r.register(
            "tessera_watchdog_actions",
            "Watchdog actions, by action (kill, report) and reason (over_budget, no_claim, zombie)",
            self.watchdog_actions.clone(),
        );
    }
}

/// One GPU as the metrics see it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRow {
    pub uuid: String,
    pub minor: u32,
    pub model: String,
    /// `exclusive`, `mig` or `shared`.
    pub mode: String,
    pub memory_total: u64,
    /// Memory allocated to prepared claims: whole GPUs count whole, MIG devices their
    /// profile's memory, shares and slots their budgets.
    pub memory_allocated: u64,
    /// Bytes the interception library has charged on this GPU (all shared claims).
    pub memory_charged: u64,
    pub claims: u64,
    /// Reserved compute of shared claims, 0 to 1.
    pub compute_reserved: f64,
    /// Memory in use on the device, from the driver (NVML); `None` without one.
    pub memory_used: Option<u64>,
    /// Busy ratio over the driver's last sample window, 0 to 1.
    pub utilization: Option<f64>,
    /// Memory held by vanished processes or processes of unprepared claims (watchdog),
    /// on the whole GPU and its MIG devices together.
    pub memory_zombie: u64,
    /// The part of `memory_zombie` held in MIG GPU instances: (GI ID, bytes), by GI.
    pub mig_zombie: Vec<(u32, u64)>,
}

/// One (claim, GPU) pair of a prepared claim.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRow {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The GPU's UUID.
    pub device: String,
    /// `whole`, `mig`, `shared` or `slot`.
    pub kind: String,
    /// The memory budget (shares and slots), or the device's memory.
    pub memory_budget: u64,
    /// From the accounting region (shares and slots only).
    pub usage: Option<ClaimUsage>,
    pub compute_reserved: f64,
    /// From the compute controller (shares and slots only).
    pub compute: Option<ComputeStatus>,
}

/// What a shared claim's region says about one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClaimUsage {
    pub used: u64,
    pub peak: u64,
    pub refused: u64,
    /// Processes holding a slot (their OFD lock is alive).
    pub processes: u64,
}

/// Everything the per-scrape metrics show.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeSnapshot {
    pub node: String,
    pub gpus: Vec<GpuRow>,
    pub claims: Vec<ClaimRow>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    node: String,
    uuid: String,
    minor: String,
    model: String,
    mode: String,
}

/// A MIG GPU instance of a GPU: the GPU's labels and the GI ID (at most a few per GPU,
/// so bounded).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MigLabels {
    node: String,
    uuid: String,
    minor: String,
    model: String,
    mode: String,
    gi: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimLabels {
    namespace: String,
    name: String,
    uid: String,
    device: String,
    kind: String,
}

fn gauge_family<L, F>(
    r: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    rows: impl Iterator<Item = (L, F)>,
) where
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
    F: Into<f64>,
{
    let fam: Family<L, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default();
    for (l, v) in rows {
        fam.get_or_create(&l).set(v.into());
    }
    match unit {
        Some(u) => r.register_with_unit(name, help, u, fam),
        None => r.register(name, help, fam),
    }
}

/// The text exposition of the driver metrics plus `snap`. Pure apart from reading the
/// process-wide driver counters.
pub fn render(snap: &NodeSnapshot) -> String {
    let mut r = Registry::default();
    driver().register(&mut r);
    let gl = |g: &GpuRow| GpuLabels {
        node: snap.node.clone(),
        uuid: g.uuid.clone(),
        minor: g.minor.to_string(),
        model: g.model.clone(),
        mode: g.mode.clone(),
    };
    let gpus = &snap.gpus;
    gauge_family(
        &mut r,
        "tessera_gpu_memory_total",
        "GPU memory",
        Some(Unit::Bytes),
        gpus.iter().map(|g| (gl(g), g.memory_total as f64)),
    );
    gauge_family(
        &mut r,
        "tessera_gpu_memory_allocated",
        "GPU memory allocated to prepared claims (sum of budgets; whole GPUs and MIG devices count their memory)",
        Some(Unit::Bytes),
        gpus.iter().map(|g| (gl(g), g.memory_allocated as f64)),
    );
    gauge_family(
        &mut r,
        "tessera_gpu_memory_charged",
        "GPU memory the interception library has charged to shared claims",
        Some(Unit::Bytes),
        gpus.iter().map(|g| (gl(g), g.memory_charged as f64)),
    );
    gauge_family(
        &mut r,
        "tessera_gpu_memory_used",
        "GPU memory in use, as the driver reports it (all processes)",
        Some(Unit::Bytes),
        gpus.iter()
            .filter_map(|g| g.memory_used.map(|u| (gl(g), u as f64))),
    );
    gauge_family(
        &mut r,
        "tessera_gpu_memory_zombie",
        "GPU memory held by processes that no longer exist or whose claim was unprepared",
        Some(Unit::Bytes),
        gpus.iter().map(|g| (gl(g), g.memory_zombie as f64)),
    );
    gauge_family(
        &mut r,
        "tessera_mig_memory_zombie",
        "GPU memory held in a MIG GPU instance by processes that no longer exist or whose claim was unprepared (or is being unprepared)",
        Some(Unit::Bytes),
        gpus.iter().flat_map(|g| {
            g.mig_zombie.iter().map(move |(gi, bytes)| {
                (
                    MigLabels {
                        node: snap.node.clone(),
                        uuid: g.uuid.clone(),
                        minor: g.minor.to_string(),
                        model: g.model.clone(),
                        mode: g.mode.clone(),
                        gi: gi.to_string(),
                    },
                    *bytes as f64,
                )
            })
        }),
    );
    gauge_family(
        &mut r,
        "tessera_gpu_utilization",
        "Ratio of the driver's last sample window a kernel was running",
        Some(Unit::Other("ratio".into())),
        gpus.iter()
            .filter_map(|g| g.utilization.map(|u| (gl(g), u))),
    );
    gauge_family(
        &mut r,
        "tessera_gpu_claims",
        "Prepared claims using the GPU",
        None,
        gpus.iter().map(|g| (gl(g), g.claims as f64)),
    );
    gauge_family(
        &mut r,
        "tessera_gpu_compute_reserved",
        "Compute reserved by shared claims, as a ratio of the GPU",
        Some(Unit::Other("ratio".into())),
        gpus.iter().map(|g| (gl(g), g.compute_reserved)),
    );
    let cl = |c: &ClaimRow| ClaimLabels {
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        uid: c.uid.clone(),
        device: c.device.clone(),
        kind: c.kind.clone(),
    };
    let claims = &snap.claims;
    gauge_family(
        &mut r,
        "tessera_claim_memory_budget",
        "A claim's memory budget on a GPU (its device's memory for whole GPUs and MIG)",
        Some(Unit::Bytes),
        claims.iter().map(|c| (cl(c), c.memory_budget as f64)),
    );
    let used = || claims.iter().filter_map(|c| c.usage.map(|u| (c, u)));
    gauge_family(
        &mut r,
        "tessera_claim_memory_used",
        "Memory a shared claim's processes hold on a GPU (interception library accounting)",
        Some(Unit::Bytes),
        used().map(|(c, u)| (cl(c), u.used as f64)),
    );
    gauge_family(
        &mut r,
        "tessera_claim_memory_peak",
        "Peak memory a shared claim's processes held on a GPU, including what they reserved ahead of small allocations (at most one pool per process)",
        Some(Unit::Bytes),
        used().map(|(c, u)| (cl(c), u.peak as f64)),
    );
    gauge_family(
        &mut r,
        "tessera_claim_processes",
        "Live processes of a shared claim (slots whose lock is held)",
        None,
        used().map(|(c, u)| (cl(c), u.processes as f64)),
    );
    // Counted by the library in the region; a fresh family per scrape carries it.
    let refused: Family<ClaimLabels, Counter> = Family::default();
    for (c, u) in used() {
        refused.get_or_create(&cl(c)).inc_by(u.refused);
    }
    r.register(
        "tessera_claim_refused_allocations",
        "Allocations refused over a shared claim's budget",
        refused,
    );
    gauge_family(
        &mut r,
        "tessera_claim_compute_reserved",
        "Compute reserved by a shared claim, as a ratio of the GPU",
        Some(Unit::Other("ratio".into())),
        claims.iter().map(|c| (cl(c), c.compute_reserved)),
    );
    let compute = || claims.iter().filter_map(|c| c.compute.map(|s| (c, s)));
    gauge_family(
        &mut r,
        "tessera_claim_compute_achieved",
        "A shared claim's share of the GPU's busy time, as a ratio (NVML per-process samples)",
        Some(Unit::Other("ratio".into())),
        compute().filter_map(|(c, s)| s.achieved.map(|a| (cl(c), a))),
    );
    gauge_family(
        &mut r,
        "tessera_claim_compute_target",
        "The compute controller's target share for a claim under contention or a cap, as a ratio",
        Some(Unit::Other("ratio".into())),
        compute().filter_map(|(c, s)| s.target.map(|t| (cl(c), t))),
    );
    gauge_family(
        &mut r,
        "tessera_claim_block_rate",
        "Thread blocks per second the controller allows a claim (0 = unthrottled)",
        Some(Unit::Other("blocks_per_second".into())),
        compute().map(|(c, s)| (cl(c), s.block_rate as f64)),
    );
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &r);
    out
}

/// Reads a shared claim's region: usage per GPU UUID. `None` if unreadable. The region
/// is tenant-writable, so it is read as hostile input (bounded, never a FIFO,
/// [`tessera_abi::untrusted::read_bounded`]): a scribbled region costs its own claim
/// its figures, and nothing else.
pub fn region_usage(path: &std::path::Path) -> Option<Vec<(String, ClaimUsage)>> {
    let (f, bytes) =
        tessera_abi::untrusted::read_bounded(path, tessera_abi::region::MAX_READ).ok()?;
    let snap = tessera_abi::region::Snapshot::parse(&bytes).ok()?;
    // A slot whose lock is held belongs to a live process (asked of the file read).
    let live = snap
        .slots
        .iter()
        .filter(|s| {
            let (start, len) = snap.layout.slot_lock_range(s.index);
            tessera_abi::map::range_locked(&f, start, len).unwrap_or(false)
        })
        .count() as u64;
    Some(
        snap.gpus
            .iter()
            .map(|g| {
                (
                    g.uuid.clone(),
                    ClaimUsage {
                        used: g.used,
                        peak: g.peak,
                        refused: g.refused,
                        processes: live,
                    },
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot() -> NodeSnapshot {
        NodeSnapshot {
            node: "n".into(),
            gpus: vec![GpuRow {
                uuid: "GPU-a".into(),
                minor: 1,
                model: "NVIDIA H100 80GB HBM3".into(),
                mode: "shared".into(),
                memory_total: 80 << 30,
                memory_allocated: 50 << 30,
                memory_charged: 3 << 30,
                claims: 2,
                compute_reserved: 0.65,
                memory_used: Some(5 << 30),
                utilization: Some(0.875),
                memory_zombie: 1 << 30,
                mig_zombie: vec![(3, 512 << 20)],
            }],
            claims: vec![ClaimRow {
                namespace: "ns".into(),
                name: "light".into(),
                uid: "u1".into(),
                device: "GPU-a".into(),
                kind: "shared".into(),
                memory_budget: 20 << 30,
                usage: Some(ClaimUsage {
                    used: 3 << 30,
                    peak: 4 << 30,
                    refused: 2,
                    processes: 1,
                }),
                compute_reserved: 0.25,
                compute: Some(ComputeStatus {
                    achieved: Some(0.4),
                    target: Some(0.425),
                    block_rate: 12000,
                }),
            }],
        }
    }

    /// A snapshot renders as the documented series, with units in the names.
    #[test]
    fn renders_gpu_and_claim_series() {
        driver().observe("prepare", "shared", 0.004, None);
        driver().observe("prepare", "whole", 0.002, Some("claim"));
        let text = render(&snapshot());
        for line in [
            "tessera_gpu_memory_total_bytes{node=\"n\",uuid=\"GPU-a\",minor=\"1\",model=\"NVIDIA H100 80GB HBM3\",mode=\"shared\"} 85899345920.0",
            "tessera_gpu_compute_reserved_ratio{node=\"n\",uuid=\"GPU-a\",minor=\"1\",model=\"NVIDIA H100 80GB HBM3\",mode=\"shared\"} 0.65",
            "tessera_claim_memory_used_bytes{namespace=\"ns\",name=\"light\",uid=\"u1\",device=\"GPU-a\",kind=\"shared\"} 3221225472.0",
            "tessera_claim_refused_allocations_total{namespace=\"ns\",name=\"light\",uid=\"u1\",device=\"GPU-a\",kind=\"shared\"} 2",
            "tessera_claim_processes{namespace=\"ns\",name=\"light\",uid=\"u1\",device=\"GPU-a\",kind=\"shared\"} 1.0",
            "tessera_gpu_memory_zombie_bytes{node=\"n\",uuid=\"GPU-a\",minor=\"1\",model=\"NVIDIA H100 80GB HBM3\",mode=\"shared\"} 1073741824.0",
            "tessera_mig_memory_zombie_bytes{node=\"n\",uuid=\"GPU-a\",minor=\"1\",model=\"NVIDIA H100 80GB HBM3\",mode=\"shared\",gi=\"3\"} 536870912.0",
            "tessera_gpu_utilization_ratio{node=\"n\",uuid=\"GPU-a\",minor=\"1\",model=\"NVIDIA H100 80GB HBM3\",mode=\"shared\"} 0.875",
            "tessera_claim_compute_achieved_ratio{namespace=\"ns\",name=\"light\",uid=\"u1\",device=\"GPU-a\",kind=\"shared\"} 0.4",
        ] {
            assert!(text.contains(line), "missing {line}\n{text}");
        }
        assert!(text.contains("tessera_claim_errors_total{op=\"prepare\",reason=\"claim\"}"));
        assert!(text.contains(
            "tessera_claim_prepare_duration_seconds_bucket{le=\"0.004\",kind=\"shared\"}"
        ));
        assert!(text.ends_with("# EOF\n"));
        let classic = to_prometheus_text(&text);
        assert!(classic.contains("# TYPE tessera_claim_prepares_total counter\n"));
        assert!(classic.contains("# HELP tessera_claim_prepares_total Claims prepared"));
        assert!(!classic.contains("# EOF") && !classic.contains("# UNIT"));
        // A claim gone from the snapshot has no series.
        let mut empty = snapshot();
        empty.claims.clear();
        assert!(!render(&empty).contains("uid=\"u1\""));
    }
}
