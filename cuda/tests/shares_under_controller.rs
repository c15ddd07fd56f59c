//! Launch paths that HAMi never throttles cannot beat their share under the plugin's
//! compute controller, as a specification on the simulated GPU (the controller over
//! the fake NVML, the interception library in every client, ground truth from the
//! simulator's timeline; see `support/shares.rs`).
//!
//! A 25-share claim runs cooperative launches, `_ptsz` launches, graphs of 50 kernels,
//! or 4 processes, against a 40-share claim running a plain launch loop. Targets are
//! 42.5 / 57.5 (each claim's share plus half of the unreserved 35); the 25 claim's
//! achieved share (its busy time ÷ the GPU's, mean of ten 1 s windows after a 2 s
//! warm-up) must stay within target + 2 points. Whether the split is accurate in both
//! directions is the `compute_shares` benchmark's; this guards against a launch path
//! that escapes the token bucket.
//!
//! The scenarios run one at a time (wall-clock shares on a small machine), about 12 s
//! each.

#[path = "support/shares.rs"]
mod shares;
mod support;

use shares::{GOAL, Scenario, WARMUP_S, WINDOWS, fake_nvml, mean, run, targets};

/// One row: the 25 claim running `workload` in `procs` processes against a plain loop.
fn row(name: &str, workload: &str, procs: usize) -> Scenario {
    let mut sc = Scenario::row(&[25, 40]);
    sc.name = name.into();
    sc.workloads = vec![workload.into(), "loop".into()];
    sc.procs = vec![procs, 1];
    sc
}

#[test]
fn launch_paths_and_process_counts_cannot_beat_their_share() {
    if !support::require("launch_paths_and_process_counts_cannot_beat_their_share") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nvml = fake_nvml(dir.path());
    let rows = [
        row("cooperative", "coop", 1),
        row("ptsz", "ptsz", 1),
        row("graph50", "graph50", 1),
        row("4 processes", "loop", 4),
    ];
    let first = WARMUP_S as usize;
    let mut failures = Vec::new();
    for (i, sc) in rows.iter().enumerate() {
        let want = targets(sc);
        assert!((want[0] - 42.5).abs() < 1e-9 && (want[1] - 57.5).abs() < 1e-9);
        let o = run(dir.path(), &nvml, sc, 11 + i as u64, true);
        let w = &o.windows[0][first..first + WINDOWS];
        let achieved = mean(w);
        let worst = w.iter().cloned().fold(f64::MIN, f64::max);
        let busy = 100.0 * mean(&o.busy[first..first + WINDOWS]);
        println!(
            "{:<12} 25-share claim: achieved {achieved:5.1} (target {:.1}, worst window {worst:5.1}); GPU busy {busy:5.1} %",
            sc.name, want[0]
        );
        // Contended: both claims kept the GPU busy, so the split is the controller's.
        assert!(busy >= 80.0, "{}: GPU busy only {busy:.1} %", sc.name);
        if achieved > want[0] + GOAL {
            failures.push(format!(
                "{}: {achieved:.1} > {:.1} + {GOAL}",
                sc.name, want[0]
            ));
        }
    }
    assert!(failures.is_empty(), "beat their share: {failures:?}");
}
