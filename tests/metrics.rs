//! The `/metrics` endpoint as an operator sees it: a shared claim's budget, usage,
//! peak, processes and refusals (from its accounting region) and a whole GPU's
//! allocation, scraped over HTTP from the running plugin, valid for `promtool check
//! metrics`, and the claim's series gone after its unprepare.

#[path = "support/e2e.rs"]
mod e2e;
#[path = "support/harness.rs"]
mod harness;

use std::net::SocketAddr;
use std::time::Duration;

use harness::{Harness, NODE};
use tessera::backend::{
    BackendError, GpuBackend, GpuProcess, GpuUsage, MigInstance, MigStatus, NodeInventory,
    ProcessSample,
};

fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

async fn scrape(addr: SocketAddr) -> String {
    let (status, body) = tokio::task::spawn_blocking(move || get(addr, "/metrics"))
        .await
        .unwrap()
        .expect("the metrics endpoint answers");
    assert_eq!(status, 200, "{body}");
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
/// `tests/watchdog.rs` and the compute benchmark): gpu-1 has 5 GiB in use and is 87 %
/// busy, and this test process, which maps the shared claim's region as a process of
/// the claim does, runs 60 % of it.
struct Usage(std::sync::Arc<dyn GpuBackend>);

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
                sm_percent: 60,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_budgets_usage_and_allocation() {
    let mut h = Harness::new().await;
    h.model.backend = std::sync::Arc::new(Usage(h.model.backend.clone()));
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
    // claim, capped at 50 %.
    let mut text = String::new();
    for _ in 0..100 {
        text = scrape(addr).await;
        if text.contains("tessera_claim_compute_achieved_ratio{")
            && text.contains("tessera_watchdog_actions_total{")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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

/// The Grafana dashboard parses and every metric its queries name is in the scrape.
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
            scrape.lines().any(|l| l.starts_with(&format!("{n}{{"))
                || l.starts_with(&format!("{n} "))
                || l.starts_with(&format!("# TYPE {n} "))),
            "the dashboard queries {n}, which the scrape does not have"
        );
    }
}
