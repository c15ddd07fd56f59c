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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_budgets_usage_and_allocation() {
    let mut h = Harness::new().await;
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
            &[],
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

    let text = scrape(addr).await;
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
