//! Launch paths that HAMi never throttles cannot beat their share under the plugin's
//! compute controller, as a specification on the simulated GPU (the controller over
//! the fake NVML, the interception library in every client, ground truth from the
//! simulator's timeline; see `support/shares.rs`).
//!
//! A 25-share claim runs cooperative launches, `_ptsz` launches, graphs of 50 kernels,
//! or 4 processes, against a 40-share claim running a plain launch loop. Targets are
//! 42.5 / 57.5 (each claim's share plus half of the unreserved 35); the 25 claim's
//! achieved share (its busy time ÷ the GPU's, mean of ten 1 s windows after a 2 s
//! warm-up) must be within target ± 2 points, and the simulator's timeline must show
//! the workload ran (kernels of the 25 claim, from each of its processes): a workload
//! that launched nothing would score ~0 and a bound on one side would pass it. This
//! guards against a launch path that escapes the token bucket, and against one the
//! throttle starves.
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

/// A 25-share claim gets its target (42.5) within ± 2 points, whichever launch path or
/// process count it uses, and its workload really ran.
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
        let seed = 11 + i as u64;
        let o = run(dir.path(), &nvml, sc, seed, true);
        // The run's timeline (as `shares::run` names it): one interval per kernel.
        let timeline = dir
            .path()
            .join(format!("run-{}-{seed}-true", sc.name.replace('/', "_")))
            .join("timeline");
        let tl = support::timeline::Timeline::read(&timeline).expect("timeline");
        let kernels: Vec<_> = tl.on_gpu(0).filter(|k| k.tag == 1).collect();
        let pids: std::collections::BTreeSet<u32> = kernels.iter().map(|k| k.pid).collect();
        let w = &o.windows[0][first..first + WINDOWS];
        let achieved = mean(w);
        let worst = w.iter().cloned().fold(f64::MIN, f64::max);
        let busy = 100.0 * mean(&o.busy[first..first + WINDOWS]);
        println!(
            "{:<12} 25-share claim: achieved {achieved:5.1} (target {:.1}, worst window {worst:5.1}); {} kernels from {} processes; GPU busy {busy:5.1} %",
            sc.name,
            want[0],
            kernels.len(),
            pids.len()
        );
        assert!(
            !kernels.is_empty() && pids.len() == sc.procs[0],
            "{}: the 25 claim's workload did not run in all {} processes ({} kernels, {} processes)",
            sc.name,
            sc.procs[0],
            kernels.len(),
            pids.len()
        );
        // Contended: both claims kept the GPU busy, so the split is the controller's.
        assert!(busy >= 80.0, "{}: GPU busy only {busy:.1} %", sc.name);
        if (achieved - want[0]).abs() > GOAL {
            failures.push(format!(
                "{}: {achieved:.1} not within {:.1} ± {GOAL}",
                sc.name, want[0]
            ));
        }
    }
    assert!(failures.is_empty(), "off their share: {failures:?}");
}
