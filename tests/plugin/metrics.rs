//! The `/metrics` endpoint as an operator sees it, scraped over HTTP from the running
//! plugin and valid for `promtool check metrics`:
//!
//! * real processes on the fake driver, through the interception library, in two
//!   shared claims of gpu-1, with the plugin on the NVML backend over the fake
//!   `libnvidia-ml.so.1`: each claim's budget, used, peak, processes and refusals, the
//!   GPU's allocation, charge and used memory (NVML, from the fake driver's ledger) as
//!   the processes made them; prepare latency per kind; a claim's series gone after
//!   its unprepare;
//! * the compute and watchdog figures over a stub backend, and the Grafana dashboard's
//!   queries against that scrape.

use testkit::e2e;
use testkit::fake_nvml;
use testkit::harness;

use std::net::SocketAddr;
use std::time::Duration;

use harness::{Harness, NODE};
use tessera::inventory::{
    BackendError, GpuBackend, GpuProcess, GpuUsage, MigInstance, MigStatus, NodeInventory,
    ProcessSample,
};

/// Status, header block and body of `GET path`.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    // A server that hangs is a failure, not a test that never ends.
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    Some((status, head.to_ascii_lowercase(), body.to_string()))
}

/// A fresh scrape: 200, not a repeat of an earlier one (no stale header, stale gauge 0).
async fn scrape(addr: SocketAddr) -> String {
    let (status, head, body) = tokio::task::spawn_blocking(move || get(addr, "/metrics"))
        .await
        .unwrap()
        .expect("the metrics endpoint answers");
    assert_eq!(status, 200, "{body}");
    assert!(!head.contains("x-tessera-scrape"), "a stale reply: {head}");
    assert!(
        body.contains("\ntessera_metrics_scrape_stale 0\n"),
        "{body}"
    );
    // Chunked transfer encoding: keep the exposition lines only.
    body.lines()
        .filter(|l| l.starts_with('#') || l.starts_with("tessera_"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The value of the series whose line starts with `prefix` (name and labels).
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn promtool(text: &str) {
    let have = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        assert!(
            !e2e::in_ci(),
            "promtool is missing (CI=true: .ci/run installs Debian's prometheus package)"
        );
        eprintln!("SKIPPED: promtool check metrics (promtool missing)");
        return;
    }
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The simulated node's backend, answering the driver's usage queries with fixed
/// figures (the NVML path of these queries runs over the fake `libnvidia-ml` in
/// `tests/plugin/watchdog.rs` and the compute benchmark): gpu-1 has 5 GiB in use and is 87 %
/// busy, and this test process, which maps the shared claim's region as a process of
/// the claim does, runs `sm` % of it (60 unless a test changes it).
struct Usage(
    std::sync::Arc<dyn GpuBackend>,
    std::sync::Arc<std::sync::atomic::AtomicU32>,
);

impl Usage {
    fn new(inner: std::sync::Arc<dyn GpuBackend>) -> Self {
        Usage(inner, std::sync::Arc::new(60.into()))
    }
}

impl GpuBackend for Usage {
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    fn discover(&self) -> Result<NodeInventory, BackendError> {
        self.0.discover()
    }
    fn mig_status(&self, minor: u32) -> Result<MigStatus, BackendError> {
        self.0.mig_status(minor)
    }
    fn set_mig_mode(&self, minor: u32, enabled: bool) -> Result<(), BackendError> {
        self.0.set_mig_mode(minor, enabled)
    }
    fn create_mig(&self, minor: u32, p: u32, s: u32) -> Result<MigInstance, BackendError> {
        self.0.create_mig(minor, p, s)
    }
    fn destroy_mig(&self, minor: u32, gi: u32) -> Result<(), BackendError> {
        self.0.destroy_mig(minor, gi)
    }
    fn process_utilization(
        &self,
        minor: u32,
        since: u64,
    ) -> Result<Vec<ProcessSample>, BackendError> {
        let ts = since + 1;
        Ok(if minor == 1 {
            vec![ProcessSample {
                pid: std::process::id(),
                timestamp_us: ts,
                sm_percent: self.1.load(std::sync::atomic::Ordering::Relaxed),
            }]
        } else {
            Vec::new()
        })
    }
    /// PID 1 (outside any pod) holds 1 GiB of gpu-1: the watchdog reports it.
    fn processes(&self, minor: u32) -> Result<Vec<GpuProcess>, BackendError> {
        Ok(if minor == 1 {
            vec![GpuProcess {
                pid: 1,
                used_bytes: Some(1 << 30),
                gi_id: None,
            }]
        } else {
            Vec::new()
        })
    }
    fn usage(&self, minor: u32) -> Result<Option<GpuUsage>, BackendError> {
        Ok((minor == 1).then_some(GpuUsage {
            used_bytes: 5 << 30,
            utilization_percent: Some(87),
        }))
    }
}

/// Over a stub backend (fixed NVML figures, this test process standing in for a
/// process of the claim): a shared claim's compute reserved, achieved and target, the
/// watchdog's report of a process of no claim, a whole GPU allocated whole, errors by
/// reason, and the dashboard's queries, each naming a metric with a sample here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root (the compute controller writes the claim's 0444 control file)"]
async fn metrics_show_budgets_usage_and_allocation() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            !e2e::in_ci(),
            "the metrics test needs root under CI (the claim's control file is 0444)"
        );
        eprintln!("SKIPPED: metrics_show_budgets_usage_and_allocation needs root");
        return;
    }
    let mut h = Harness::new().await;
    h.model.backend = std::sync::Arc::new(Usage::new(h.model.backend.clone()));
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    h.opts.metrics_addr = Some(addr);
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let shared = h
        .allocated_claim_with(
            "light",
            vec![harness::shared_result(
                "gpu",
                "gpu-1",
                "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
                "20Gi",
                "25",
            )],
            &[(
                "FromClaim",
                &[],
                serde_json::json!({
                    "apiVersion": "resource.tessera.dev/v1alpha1",
                    "kind": "GpuConfig",
                    "computeLimit": 50
                }),
            )],
        )
        .await;
    let whole = h
        .allocated_claim("whole", &[("gpu", NODE, "gpu-2", None)], &[])
        .await;
    let r = k
        .prepare_v1(&[shared.clone(), whole.clone()])
        .await
        .unwrap();
    assert!(r.claims.values().all(|c| c.error.is_empty()), "{r:?}");
    // And one refused prepare, counted by reason.
    let bad = h
        .allocated_claim("bad", &[("gpu", NODE, "gpu-9", None)], &[])
        .await;
    let r = k.prepare_v1(std::slice::from_ref(&bad)).await.unwrap();
    assert!(!r.claims[&bad.uid].error.is_empty());
    // Claims the GET cannot deliver: gone, and replaced (another UID).
    let gone = testkit::kubelet_standin::KubeletClaim {
        namespace: harness::NS.into(),
        uid: "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9".into(),
        name: "gone".into(),
    };
    let replaced = testkit::kubelet_standin::KubeletClaim {
        uid: "7a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d".into(),
        ..whole.clone()
    };
    let r = k
        .prepare_v1(&[gone.clone(), replaced.clone()])
        .await
        .unwrap();
    assert!(r.claims[&gone.uid].error.contains("not found"), "{r:?}");
    assert!(r.claims[&replaced.uid].error.contains("replaced"), "{r:?}");

    // A process of the claim: holds a slot (its OFD lock), 3 GiB charged, one refusal.
    let region = h
        .opts
        .paths
        .run_dir
        .join("claims")
        .join(&shared.uid)
        .join("region");
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .open(&region)
        .unwrap();
    let reg = tessera_abi::region::Region::map(&f, true).unwrap();
    let (start, len) = reg.layout().slot_lock_range(3);
    assert!(tessera_abi::map::try_lock_range(&f, start, len).unwrap());
    reg.occupy_slot(3, 42, 0, 1);
    reg.reserve(3, 0, 3 << 30, 20 << 30).unwrap();
    assert!(reg.reserve(3, 0, 18 << 30, 20 << 30).is_err());

    // The compute controller (every 250 ms) sees this process run 60 % of gpu-1 for the
    // claim, capped at 50 %; the watchdog (every 500 ms) reports. Polled until both
    // show (normally within a second; given up after 30 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = scrape(addr).await;
        if text.contains("tessera_claim_compute_achieved_ratio{")
            && text.contains("tessera_watchdog_actions_total{")
        {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no compute or watchdog series after 30 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("{text}");
    let gpu1 = [("uuid", "GPU-9a7e3b21-0c4d-4f8e-b6a5-2d1c0e9f8a73")];
    let claim = [("uid", shared.uid.as_str())];
    let v = |name: &str, l: &[(&str, &str)]| value(&text, name, l);
    assert_eq!(
        v("tessera_claim_memory_budget_bytes", &claim),
        Some((20u64 << 30) as f64)
    );
    assert_eq!(
        v("tessera_claim_memory_used_bytes", &claim),
        Some((3u64 << 30) as f64)
    );
    assert_eq!(
        v("tessera_claim_memory_peak_bytes", &claim),
        Some((3u64 << 30) as f64)
    );
    assert_eq!(v("tessera_claim_processes", &claim), Some(1.0));
    assert_eq!(
        v("tessera_claim_refused_allocations_total", &claim),
        Some(1.0)
    );
    assert_eq!(
        v("tessera_claim_compute_reserved_ratio", &claim),
        Some(0.25)
    );
    assert_eq!(
        v("tessera_gpu_memory_allocated_bytes", &gpu1),
        Some((20u64 << 30) as f64)
    );
    assert_eq!(
        v("tessera_gpu_memory_charged_bytes", &gpu1),
        Some((3u64 << 30) as f64)
    );
    assert_eq!(v("tessera_gpu_claims", &gpu1), Some(1.0));
    assert_eq!(
        v("tessera_gpu_memory_used_bytes", &gpu1),
        Some((5u64 << 30) as f64)
    );
    assert_eq!(v("tessera_gpu_utilization_ratio", &gpu1), Some(0.87));
    assert_eq!(v("tessera_gpu_memory_zombie_bytes", &gpu1), Some(0.0));
    // Its share of the GPU's busy time is 60 / 87; its target is its computeLimit.
    let achieved = v("tessera_claim_compute_achieved_ratio", &claim).unwrap();
    assert!((achieved - 60.0 / 87.0).abs() < 1e-9, "{achieved}");
    assert_eq!(v("tessera_claim_compute_target_ratio", &claim), Some(0.5));
    assert!(
        v(
            "tessera_watchdog_actions_total",
            &[("action", "report"), ("reason", "no_claim")]
        )
        .unwrap_or(0.0)
            >= 1.0,
        "the watchdog reports PID 1's memory as no claim's"
    );
    let gpu2 = [("minor", "2")];
    assert_eq!(
        v("tessera_gpu_memory_allocated_bytes", &gpu2),
        v("tessera_gpu_memory_total_bytes", &gpu2),
        "a whole GPU is allocated whole"
    );
    assert!(v("tessera_claim_prepares_total", &[("kind", "shared")]).unwrap() >= 1.0);
    assert!(
        v(
            "tessera_claim_errors_total",
            &[("op", "prepare"), ("reason", "claim")]
        )
        .unwrap()
            >= 1.0
    );
    assert!(v("tessera_slice_publications_total", &[("result", "success")]).unwrap() >= 1.0);
    for reason in ["claim_not_found", "claim_replaced"] {
        assert!(
            v(
                "tessera_claim_errors_total",
                &[("op", "prepare"), ("reason", reason)]
            )
            .is_some_and(|n| n >= 1.0),
            "claim GET failures are counted: {reason}"
        );
    }
    // The refused prepare of gpu-9 is labelled by the kind its allocation names.
    assert!(
        !text.contains("kind=\"unknown\""),
        "a failed prepare with a knowable kind"
    );
    promtool(&text);
    dashboard_queries_name_scraped_metrics(&text);

    // The process exits: no process, usage stays charged until the slot is reclaimed.
    drop(reg);
    drop(f);
    let text = scrape(addr).await;
    assert_eq!(value(&text, "tessera_claim_processes", &claim), Some(0.0));

    k.unprepare_v1(&[shared.clone(), whole.clone()])
        .await
        .unwrap();
    let text = scrape(addr).await;
    assert!(
        !text.contains(&shared.uid),
        "the claim's series go with its unprepare"
    );
    assert_eq!(value(&text, "tessera_gpu_claims", &gpu1), Some(0.0));
    promtool(&text);
    p.stop().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// Seconds the scribble test writes garbage into a region.
const SCRIBBLE_SECS: u64 = 30;

/// Peak resident memory of this process (the plugin runs in it), in bytes.
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

/// What a writer does to the hostile claim's region in one round.
#[derive(Debug, Clone, Copy)]
enum Scribble {
    /// A few random bytes at a random offset (a tenant: the region is mapped read-write).
    Poke,
    /// The whole file rewritten with random bytes of a random length (a tenant).
    Rewrite,
    /// Truncated to nothing (a tenant: `ftruncate` on its descriptor).
    Truncate,
    /// Grown to a sparse terabyte (a tenant).
    Sparse,
    /// A valid region whose counters are random (a tenant rewriting fields).
    WildCounters,
    /// Replaced by a FIFO (not a tenant's doing, as the file is a mount point in the
    /// container, but the plugin must not hang on it).
    Fifo,
    /// Replaced by a symlink to `/dev/zero` (likewise).
    DevZero,
}

const SCRIBBLES: [Scribble; 7] = [
    Scribble::Poke,
    Scribble::Rewrite,
    Scribble::Truncate,
    Scribble::Sparse,
    Scribble::WildCounters,
    Scribble::Fifo,
    Scribble::DevZero,
];

/// xorshift64: enough randomness for garbage, and a seed to print.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn scribble(path: &std::path::Path, what: Scribble, rng: &mut Rng, gpu_uuid: &str) {
    use std::os::unix::fs::FileExt;
    // A FIFO or symlink left by an earlier round gives way to a regular file.
    let regular = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file());
    if !regular {
        let _ = std::fs::remove_file(path);
    }
    let open = || {
        std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap()
    };
    match what {
        Scribble::Poke => {
            let n = 1 + rng.below(64) as usize;
            open()
                .write_all_at(&rng.bytes(n), rng.below(200 << 10))
                .unwrap();
        }
        Scribble::Rewrite => {
            let n = rng.below(200 << 10) as usize;
            std::fs::write(path, rng.bytes(n)).unwrap();
        }
        Scribble::Truncate => open().set_len(0).unwrap(),
        Scribble::Sparse => open().set_len(1 << 40).unwrap(),
        Scribble::WildCounters => {
            let mut b = tessera_abi::region::initial_bytes(&[gpu_uuid], 4).unwrap();
            let l = tessera_abi::region::Layout::parse(&b).unwrap();
            for off in (l.gpu_table + 64..l.gpu_table + 128).step_by(8) {
                b[off..off + 8].copy_from_slice(&rng.next().to_le_bytes());
            }
            std::fs::write(path, b).unwrap();
        }
        Scribble::Fifo => {
            let _ = std::fs::remove_file(path);
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: mkfifo with a NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        }
        Scribble::DevZero => {
            let _ = std::fs::remove_file(path);
            std::os::unix::fs::symlink("/dev/zero", path).unwrap();
        }
    }
}

/// The neighbour's figures in the scribble test, exact in every scrape.
fn expect_neighbour(text: &str, uid: &str) {
    let v = |name: &str| value(text, name, &[("uid", uid)]);
    assert_eq!(
        v("tessera_claim_memory_used_bytes"),
        Some((3u64 << 30) as f64)
    );
    assert_eq!(
        v("tessera_claim_memory_budget_bytes"),
        Some((20u64 << 30) as f64)
    );
    assert_eq!(v("tessera_claim_processes"), Some(1.0));
    assert_eq!(v("tessera_claim_compute_reserved_ratio"), Some(0.25));
}

/// Scrapes until the neighbour's achieved share is `sm` / 87 (the stub GPU's busy
/// percentage), checking its figures in each scrape.
async fn wait_for_share(addr: SocketAddr, uid: &str, sm: f64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let text = scrape(addr).await;
        expect_neighbour(&text, uid);
        let achieved = value(
            &text,
            "tessera_claim_compute_achieved_ratio",
            &[("uid", uid)],
        );
        if achieved.is_some_and(|a| (a - sm / 87.0).abs() < 1e-9) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the neighbour's achieved share is not {sm}/87 after 60 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A tenant scribbles its claim's region for [`SCRIBBLE_SECS`] (random bytes, random
/// rewrites, truncation, a sparse terabyte, random counters in a valid layout; and, as
/// only the host could, a FIFO and a symlink to `/dev/zero` in its place) while the
/// plugin serves metrics and controls the neighbouring claim on the same GPU. Every
/// scrape is fresh (a hung read would make it stale), the neighbour's figures stay
/// exact, its compute figures follow a change in its utilization (the controller kept
/// running), the plugin's peak memory grows by less than 64 MiB, and both claims
/// unprepare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root (the compute controller writes the claims' 0444 control files)"]
async fn a_scribbled_region_costs_only_its_own_claim_its_figures() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            !e2e::in_ci(),
            "the scribble test needs root under CI (the claims' control files are 0444)"
        );
        eprintln!("SKIPPED: a_scribbled_region_costs_only_its_own_claim_its_figures needs root");
        return;
    }
    let mut h = Harness::new().await;
    let usage = Usage::new(h.model.backend.clone());
    let sm = usage.1.clone();
    h.model.backend = std::sync::Arc::new(usage);
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    h.opts.metrics_addr = Some(addr);
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let limit = serde_json::json!({
        "apiVersion": "resource.tessera.dev/v1alpha1",
        "kind": "GpuConfig",
        "computeLimit": 50
    });
    let neighbour = h
        .allocated_claim_with(
            "neighbour",
            vec![harness::shared_result(
                "gpu",
                "gpu-1",
                "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
                "20Gi",
                "25",
            )],
            &[("FromClaim", &[], limit)],
        )
        .await;
    let hostile = h
        .allocated_claim_with(
            "hostile",
            vec![harness::shared_result(
                "gpu",
                "gpu-1",
                "1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e",
                "10Gi",
                "25",
            )],
            &[],
        )
        .await;
    let r = k
        .prepare_v1(&[neighbour.clone(), hostile.clone()])
        .await
        .unwrap();
    assert!(r.claims.values().all(|c| c.error.is_empty()), "{r:?}");
    let region = |uid: &str| h.opts.paths.run_dir.join("claims").join(uid).join("region");
    // The neighbour's process: a slot (its OFD lock) and 3 GiB charged.
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .open(region(&neighbour.uid))
        .unwrap();
    let reg = tessera_abi::region::Region::map(&f, true).unwrap();
    let (start, len) = reg.layout().slot_lock_range(3);
    assert!(tessera_abi::map::try_lock_range(&f, start, len).unwrap());
    reg.occupy_slot(3, 42, 0, 1);
    reg.reserve(3, 0, 3 << 30, 20 << 30).unwrap();

    wait_for_share(addr, &neighbour.uid, 60.0).await;
    let rss_before = peak_rss();

    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("scribble seed {seed:#x}");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, path) = (stop.clone(), region(&hostile.uid));
        std::thread::spawn(move || {
            let mut rng = Rng(seed);
            let mut rounds = [0u64; SCRIBBLES.len()];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let i = rng.below(SCRIBBLES.len() as u64) as usize;
                scribble(
                    &path,
                    SCRIBBLES[i],
                    &mut rng,
                    "GPU-9a7e3b21-0c4d-4f8e-b6a5-2d1c0e9f8a73",
                );
                rounds[i] += 1;
                // Leaves the plugin a core on a 2-core machine.
                std::thread::sleep(Duration::from_millis(1));
            }
            rounds
        })
    };
    let started = std::time::Instant::now();
    let mut scrapes = 0u32;
    while started.elapsed() < Duration::from_secs(SCRIBBLE_SECS / 2) {
        expect_neighbour(&scrape(addr).await, &neighbour.uid);
        scrapes += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The controller still runs: the neighbour's utilization halves, and so does the
    // share it reports.
    sm.store(30, std::sync::atomic::Ordering::Relaxed);
    wait_for_share(addr, &neighbour.uid, 30.0).await;
    while started.elapsed() < Duration::from_secs(SCRIBBLE_SECS) {
        expect_neighbour(&scrape(addr).await, &neighbour.uid);
        scrapes += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    let grown = peak_rss().saturating_sub(rss_before);
    println!(
        "scribbled for {:?}: rounds {:?}; {scrapes} fresh scrapes; peak memory grew {} KiB",
        started.elapsed(),
        SCRIBBLES.iter().zip(rounds).collect::<Vec<_>>(),
        grown >> 10
    );
    assert!(
        rounds.iter().all(|&n| n > 0),
        "every kind of scribble ran: {rounds:?}"
    );
    assert!(grown < 64 << 20, "peak memory grew {grown} bytes");

    drop(reg);
    drop(f);
    let r = k
        .unprepare_v1(&[neighbour.clone(), hostile.clone()])
        .await
        .unwrap();
    assert!(r.claims.values().all(|c| c.error.is_empty()), "{r:?}");
    assert!(!region(&hostile.uid).parent().unwrap().exists());
    assert!(!region(&neighbour.uid).parent().unwrap().exists());
    p.stop().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// The Grafana dashboard parses and every metric its queries name has a sample in the
/// scrape (a `# TYPE` line alone is a family with nothing to plot).
fn dashboard_queries_name_scraped_metrics(scrape: &str) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/monitoring/tessera-dashboard.json"
    );
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("dashboard JSON");
    let mut names = std::collections::BTreeSet::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(i) = rest.find("tessera_") {
                let tail = &rest[i..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                names.insert(tail[..end].to_string());
                rest = &tail[end..];
            }
        }
    }
    assert!(names.len() >= 10, "{names:?}");
    for n in &names {
        assert!(
            scrape
                .lines()
                .any(|l| l.starts_with(&format!("{n}{{")) || l.starts_with(&format!("{n} "))),
            "the dashboard queries {n}, which has no sample in the scrape"
        );
    }
}

const GPU1_UUID: &str = "GPU-9a7e3b21-0c4d-4f8e-b6a5-2d1c0e9f8a73";
const GPU1_MEMORY: u64 = 85_520_809_984;
const MIB: u64 = 1 << 20;
/// What the library charges a context it cannot measure (the region's default).
const CONTEXT: u64 = tessera_abi::region::DEFAULT_CONTEXT_BYTES;
const GIB: u64 = 1 << 30;

/// The fake driver, its ledger and the interception library, for processes of
/// prepared claims.
struct Workload {
    client: std::path::PathBuf,
    /// Holds `libcuda.so.1` (the fake driver).
    libcuda_dir: std::path::PathBuf,
    ledger: std::path::PathBuf,
    run_dir: std::path::PathBuf,
    scratch: std::path::PathBuf,
}

/// A client process holding what it allocated; killed on drop.
struct Holder {
    child: std::process::Child,
    /// The client's result lines (`ok <id>`, `err <code>`).
    results: Vec<String>,
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Workload {
    /// Runs the fake driver's client with `commands` then `hold`, in a mount namespace
    /// where claim `uid`'s files are mounted as the CDI spec mounts them
    /// (`/run/tessera/claims/<uid>/`: `limits` and `control` read-only, `region`
    /// read-write) and the interception library preloaded; returns once it holds.
    fn hold(&self, uid: &str, commands: &[&str]) -> Holder {
        use std::io::BufRead;
        let src = self.run_dir.join("claims").join(uid);
        let t = format!("/run/tessera/claims/{uid}");
        let mut script = format!("set -e\nmount -t tmpfs tmpfs /run\nmkdir -p {t}\n");
        for (f, ro) in [("limits", true), ("control", true), ("region", false)] {
            script += &format!(
                "touch {t}/{f}\nmount --bind {} {t}/{f}\n",
                src.join(f).display()
            );
            if ro {
                script += &format!("mount -o remount,bind,ro {t}/{f}\n");
            }
        }
        script += "exec \"$@\"\n";
        // The library as the plugin installed it (`<run>/lib/<version>/`): it trusts
        // only claims mounted from its own run directory.
        let installed = std::fs::read_dir(self.run_dir.join("lib"))
            .expect("the plugin installed its library")
            .flatten()
            .map(|e| e.path().join("libtessera_cuda.so"))
            .find(|p| p.is_file())
            .expect("an installed library version");
        let mut child = std::process::Command::new("unshare")
            .args(["-m", "sh", "-c", &script, "sh"])
            .arg(&self.client)
            .args(["gpa", "ctx", "0"])
            .args(commands)
            .arg("hold")
            .env("LD_LIBRARY_PATH", &self.libcuda_dir)
            .env("LD_PRELOAD", &installed)
            .env("FAKE_CUDA_LEDGER", &self.ledger)
            .env("FAKE_CUDA_DEVICES", format!("{GPU1_UUID}:{GPU1_MEMORY}"))
            // Each context holds what the library charges a context it cannot measure
            // (a process's first), so its charge and NVML's used memory agree.
            .env("FAKE_CUDA_CONTEXT_BYTES", CONTEXT.to_string())
            .env("TMPDIR", &self.scratch)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("unshare runs");
        let mut seen = Vec::new();
        for l in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
            let l = l.unwrap();
            if l == "holding" {
                return Holder {
                    child,
                    results: seen,
                };
            }
            seen.push(l);
        }
        let status = child.wait();
        panic!("client {commands:?} ended before holding ({status:?}): {seen:?}");
    }
}

/// Processes of two shared claims of gpu-1, on the NVML backend over the fake NVML:
///
/// * `light` (budget 4 GiB): one process holding 1 GiB, one holding 512 MiB that is
///   refused 8 GiB more;
/// * `heavy` (budget 8 GiB): one process holding 3 GiB;
///
/// and each process's context, 300 MiB (the library's estimate, which the fake driver
/// is told to hold). The scrape shows each claim's budget, used (what its processes
/// hold), peak (used plus at most one small-allocation pool per process), processes
/// and refusals; gpu-1 allocated 12 GiB (the budgets), charged 4.5 GiB plus three
/// contexts, two claims, and the same used as NVML reports it (the fake driver's ledger); prepare latency histograms for the
/// shared, whole and MIG claims prepared. After the processes end and `heavy` is
/// unprepared, its series are gone and gpu-1 counts one claim.
#[test]
#[ignore = "needs root (unshare -m)"]
fn metrics_match_the_processes_of_shared_claims() {
    let name = &testkit::test_name!("metrics_match_the_processes_of_shared_claims");
    // Root for the mount namespaces (unshare -m); skipped locally without it.
    if fake_nvml::FakeHost::from_env(name).is_none()
        && e2e::prerequisites(name, &["unshare"]).is_err()
    {
        return;
    }
    // The MIG claim's instance is made by NVIDIA's DGX H100 model (the fake does no MIG).
    let mig_lib = || crate::nvml_models::built().map(|dir| dir.join("libnvidia-ml.so.1"));
    let node = tessera::inventory::mock::DEFAULT_NODE_YAML;
    fake_nvml::with_fake_host_and_mig(name, node, mig_lib, |host| {
        let tmp = tempfile::tempdir().unwrap();
        let ledger = tmp.path().join("ledger");
        std::fs::write(&ledger, vec![0u8; 65536]).unwrap();
        // SAFETY: the child test runs single-threaded here, before NVML is loaded and
        // before the runtime starts.
        unsafe {
            std::env::set_var("FAKE_CUDA_LEDGER", &ledger);
            std::env::set_var("FAKE_CUDA_DEVICES", format!("{GPU1_UUID}:{GPU1_MEMORY}"));
        }
        let fakes = e2e::cuda_fakes(&tmp.path().join("fakes"));
        let libcuda_dir = tmp.path().join("libcuda");
        std::fs::create_dir_all(&libcuda_dir).unwrap();
        std::os::unix::fs::symlink(&fakes.libcuda, libcuda_dir.join("libcuda.so.1")).unwrap();
        let library = e2e::interception_library(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
        let scratch = tmp.path().join("scratch");
        std::fs::create_dir_all(&scratch).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut h = Harness::new().await;
            let config = h.dir.path().join("node-config.yaml");
            std::fs::write(
                &config,
                "apiVersion: config.tessera.dev/v1alpha1\nkind: NodeConfig\ngpus:\n- match: {minor: 1}\n  mode: shared\n",
            )
            .unwrap();
            h.model = tessera::node::load_node(
                &tessera::node::BackendSpec::Nvml(Some(host.lib_path())),
                Some(&config),
                &tessera::node::BackendPaths {
                    state_dir: host.state_dir(),
                    proc_root: host.proc_root(),
                    sys_root: host.sys_root(),
                },
                tessera::inventory::mock::StateAccess::ReadWrite,
            )
            .expect("NVML backend over the fake library");
            h.opts.interception_lib = Some(library.clone());
            h.opts.watchdog = tessera::watchdog::Mode::Report;
            let addr = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap();
            h.opts.metrics_addr = Some(addr);
            let p = h.start_plugin().await;
            let k = h.kubelet().await;
            let share = |id: &str, memory: &str, compute: &str| {
                vec![harness::shared_result("gpu", "gpu-1", id, memory, compute)]
            };
            let light = h
                .allocated_claim_with("light", share("0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", "4Gi", "25"), &[])
                .await;
            let heavy = h
                .allocated_claim_with("heavy", share("1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e", "8Gi", "50"), &[])
                .await;
            let whole = h
                .allocated_claim("whole", &[("gpu", NODE, "gpu-2", None)], &[])
                .await;
            let mig = h
                .allocated_claim("mig", &[("mig", NODE, "gpu-0-mig-1g10gb-19-5", None)], &[])
                .await;
            let all = [light.clone(), heavy.clone(), whole.clone(), mig.clone()];
            let r = k.prepare_v1(&all).await.unwrap();
            assert!(r.claims.values().all(|c| c.error.is_empty()), "{r:?}");

            let w = Workload {
                client: fakes.client.clone(),
                libcuda_dir: libcuda_dir.clone(),
                ledger: ledger.clone(),
                run_dir: h.opts.paths.run_dir.clone(),
                scratch: scratch.clone(),
            };
            let gib = GIB.to_string();
            let half = (512 * MIB).to_string();
            let eight = (8 * GIB).to_string();
            let three = (3 * GIB).to_string();
            let l1 = w.hold(&light.uid, &["alloc", &gib]);
            let l2 = w.hold(&light.uid, &["alloc", &half, "alloc", &eight]);
            let h1 = w.hold(&heavy.uid, &["alloc", &three]);
            assert!(l1.results[1].starts_with("ok "), "{:?}", l1.results);
            assert!(l2.results[1].starts_with("ok "), "{:?}", l2.results);
            assert_eq!(l2.results[2], "err 2", "8 GiB over a 4 GiB budget: OUT_OF_MEMORY");
            assert!(h1.results[1].starts_with("ok "), "{:?}", h1.results);

            let text = scrape(addr).await;
            eprintln!("{text}");
            let v = |name: &str, l: &[(&str, &str)]| value(&text, name, l);
            let of = |c: &testkit::kubelet_standin::KubeletClaim| [("uid", c.uid.clone())];
            let check = |c: &testkit::kubelet_standin::KubeletClaim,
                         budget: u64,
                         used: u64,
                         processes: f64,
                         refused: f64| {
                let l = of(c);
                let l = [(l[0].0, l[0].1.as_str())];
                assert_eq!(
                    v("tessera_claim_memory_budget_bytes", &l),
                    Some(budget as f64),
                    "{} budget",
                    c.name
                );
                assert_eq!(
                    v("tessera_claim_memory_used_bytes", &l),
                    Some(used as f64),
                    "{} used",
                    c.name
                );
                let peak = v("tessera_claim_memory_peak_bytes", &l).unwrap();
                // A process keeps at most min(32 MiB, budget/256) reserved ahead.
                let pools = processes * (32 * MIB).min(budget / 256) as f64;
                assert!(
                    peak >= used as f64 && peak <= used as f64 + pools,
                    "{} peak {peak} for used {used}",
                    c.name
                );
                assert_eq!(v("tessera_claim_processes", &l), Some(processes), "{}", c.name);
                assert_eq!(
                    v("tessera_claim_refused_allocations_total", &l),
                    Some(refused),
                    "{} refusals",
                    c.name
                );
                assert_eq!(
                    v("tessera_claim_compute_reserved_ratio", &l),
                    Some(if budget == 4 * GIB { 0.25 } else { 0.5 })
                );
            };
            // Used: the allocations plus one context per process.
            check(&light, 4 * GIB, GIB + 512 * MIB + 2 * CONTEXT, 2.0, 1.0);
            check(&heavy, 8 * GIB, 3 * GIB + CONTEXT, 1.0, 0.0);
            let gpu1 = [("uuid", GPU1_UUID)];
            let held = (4 * GIB + 512 * MIB + 3 * CONTEXT) as f64;
            assert_eq!(v("tessera_gpu_memory_allocated_bytes", &gpu1), Some((12 * GIB) as f64));
            assert_eq!(v("tessera_gpu_memory_charged_bytes", &gpu1), Some(held));
            assert_eq!(
                v("tessera_gpu_memory_used_bytes", &gpu1),
                Some(held),
                "NVML's used memory is what the fake driver handed out"
            );
            assert_eq!(v("tessera_gpu_claims", &gpu1), Some(2.0));
            assert_eq!(v("tessera_gpu_compute_reserved_ratio", &gpu1), Some(0.75));
            for kind in ["shared", "whole", "mig"] {
                assert!(
                    v("tessera_claim_prepare_duration_seconds_count", &[("kind", kind)])
                        .is_some_and(|n| n >= 1.0),
                    "no prepare latency for kind {kind}"
                );
                assert!(
                    text.contains(&format!(
                        "tessera_claim_prepare_duration_seconds_bucket{{le=\"+Inf\",kind=\"{kind}\"}}"
                    )),
                    "{kind}"
                );
            }
            promtool(&text);

            drop((l1, l2, h1));
            k.unprepare_v1(std::slice::from_ref(&heavy)).await.unwrap();
            let text = scrape(addr).await;
            assert!(
                !text.contains(&heavy.uid),
                "the claim's series go with its unprepare"
            );
            assert!(text.contains(&light.uid));
            assert_eq!(value(&text, "tessera_gpu_claims", &gpu1), Some(1.0));
            assert_eq!(
                value(&text, "tessera_gpu_memory_allocated_bytes", &gpu1),
                Some((4 * GIB) as f64)
            );
            assert_eq!(
                value(&text, "tessera_claim_processes", &[("uid", light.uid.as_str())]),
                Some(0.0),
                "the processes ended"
            );
            assert!(
                value(&text, "tessera_claim_unprepares_total", &[("kind", "shared")])
                    .is_some_and(|n| n >= 1.0)
            );
            promtool(&text);
            k.unprepare_v1(&[light, whole, mig]).await.unwrap();
            p.stop().await;
        });
    });
}
