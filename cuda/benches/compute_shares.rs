//! Compute-share accuracy on the simulated GPU (issue #9's benchmark).
//!
//! Real pieces end to end: the interception library in every client process (claim
//! files bind-mounted read-only as the plugin mounts them, `/etc/ld.so.preload`), the
//! plugin's compute controller (`tessera::compute::service`) reading the fake
//! `libnvidia-ml.so.1` through the production NVML backend, and the fake driver's
//! simulated GPU (`tests/fakes/fake_cuda.c`: one kernel at a time, round-robin between
//! processes at kernel boundaries, heavy-tailed kernels). Ground truth is the
//! simulator's own timeline, never the NVML samples the controller reads: a claim's
//! achieved share is its busy time ÷ the GPU's busy time, per 1 s window, over ten
//! windows after a 2 s warm-up.
//!
//! Rows: the five share sets (launch-then-synchronize loops), then 25/40 with
//! graphs of 50 kernels, with four processes in the 25 claim, with the 25 claim's
//! cooperative launches, `_ptsz` launches or graphs of 50 against the 40 claim's plain
//! loop (the launch paths of the `shares_under_controller` test, which bounds them
//! loosely, judged here), and with the 25 claim's thread blocks costing 3x the 40
//! claim's; then a claim going idle and active again, a claim forging its launch
//! counter or rewinding its token bucket (judged from 10 s on, by its mean and its
//! worst 10 s mean), and a `computeLimit` alone on the GPU. Each is judged by the mean of its ten windows
//! after the warm-up ("converged within 2 s" = that mean, from 2 s on, within ±2
//! points); the worst single window is reported, not judged (one 200 ms kernel is 20
//! points of a window).
//!
//! Run: `cargo bench -p tessera-interpose --bench compute_shares` (needs root for
//! `unshare -m`; without it the bench says so and stops, and fails under `CI`).
//! `TESSERA_BENCH_QUICK=1` runs one seed of two rows (25/40, and 25's blocks cost 3x;
//! four windows each)
//! and of the time-series scenarios (without the bucket rewinder, whose code paths the
//! counter forger shares, and without the forger's unthrottled run). A benchmark reports:
//! runs whose mean misses the ±2 point goal are listed as misses at the end, and the
//! functional checks (a cap on an idle GPU, a claim alone while the other idles, dearer
//! blocks) are the `compute_limit` tests'.

use testkit::interpose as support;
use testkit::interpose::shares;

use std::path::Path;

use shares::{GOAL, Nvml, Outcome, Scenario, WARMUP_S, WINDOWS, fake_nvml, mean, run, targets};

fn main() {
    // Root, unshare and cc, as for the tests: skipped (saying why) outside CI only.
    if !support::require("compute_shares bench") {
        return;
    }
    let quick = std::env::var_os("TESSERA_BENCH_QUICK").is_some();
    let seeds: Vec<u64> = if quick { vec![1] } else { vec![1, 2, 3] };
    // Quick mode: four windows after the warm-up instead of ten (CI reads none of the
    // figures; every code path still runs).
    let row_secs = WARMUP_S + if quick { 4.0 } else { WINDOWS as f64 };
    let dir = tempfile::tempdir().unwrap();
    let nvml = fake_nvml(dir.path());
    let mut misses = Vec::new();
    println!(
        "compute shares on the simulated GPU: achieved share of GPU busy time, windows {}..{} s, {} seed(s)",
        WARMUP_S,
        row_secs,
        seeds.len()
    );
    println!(
        "{:<28} {:>7} {:>12} {:>10} {:>10} {:>7} {:>10} {:>9}",
        "scenario",
        "target",
        "unthrottled",
        "throttled",
        "worst run",
        "2-4 s",
        "worst 1 s",
        "GPU busy"
    );
    let mut scenarios: Vec<Scenario> = [
        &[25u32, 40][..],
        &[10, 90],
        &[30, 70],
        &[20, 30, 50],
        &[25, 40, 0],
    ]
    .iter()
    .map(|s| Scenario::row(s))
    .collect();
    let mut g = Scenario::row(&[25, 40]);
    g.name = "25/40 graphs of 50".into();
    g.workloads = vec!["graph50".into(); 2];
    scenarios.push(g);
    let mut m = Scenario::row(&[25, 40]);
    m.name = "25/40, 4 processes in 25".into();
    m.procs = vec![4, 1];
    scenarios.push(m);
    // The launch paths HAMi never throttles, one process against a plain loop.
    for (name, workload) in [
        ("25/40, 25 cooperative", "coop"),
        ("25/40, 25 _ptsz", "ptsz"),
        ("25/40, 25 graphs vs loop", "graph50"),
    ] {
        let mut p = Scenario::row(&[25, 40]);
        p.name = name.into();
        p.workloads = vec![workload.into(), "loop".into()];
        scenarios.push(p);
    }
    // Workloads differ in what a thread block costs: the 25 claim's blocks take 3x as
    // long as the 40 claim's, so a block rate that ignored it would give it 3x its time.
    let mut c = Scenario::row(&[25, 40]);
    c.name = "25/40, 25's blocks cost 3x".into();
    c.block_ns = vec![3 * shares::BLOCK_NS, shares::BLOCK_NS];
    scenarios.push(c);
    if quick {
        // Two rows, so that CI runs every code path of the bench in under a minute: the
        // plain split and the one where the claims' blocks cost differently.
        scenarios.retain(|s| s.name == "25/40" || s.name == "25/40, 25's blocks cost 3x");
    }
    for s in &mut scenarios {
        s.secs = row_secs;
    }
    let only = std::env::var("TESSERA_BENCH_ONLY").ok();
    for sc in &scenarios {
        if only.as_ref().is_some_and(|o| o != &sc.name) {
            continue;
        }
        let tg = targets(sc);
        let free = run(dir.path(), &nvml, sc, seeds[0], false);
        let outs: Vec<Outcome> = seeds
            .iter()
            .map(|&s| run(dir.path(), &nvml, sc, s, true))
            .collect();
        for (i, t) in tg.iter().enumerate() {
            let w0 = WARMUP_S as usize;
            let free_mean = mean(&free.windows[i][w0..]);
            let all: Vec<f64> = outs
                .iter()
                .flat_map(|o| o.windows[i][w0..].to_vec())
                .collect();
            let m = mean(&all);
            let worst = all
                .iter()
                .copied()
                .max_by(|a, b| (a - t).abs().total_cmp(&(b - t).abs()))
                .unwrap_or(0.0);
            // Convergence: the mean of the first two windows after the warm-up (2..4 s),
            // over the runs; single windows swing with the heavy-tailed kernels.
            let early = mean(
                &outs
                    .iter()
                    .flat_map(|o| o.windows[i][w0..w0 + 2].to_vec())
                    .collect::<Vec<_>>(),
            );
            let worst_run = outs
                .iter()
                .map(|o| mean(&o.windows[i][w0..]))
                .max_by(|a, b| (a - t).abs().total_cmp(&(b - t).abs()))
                .unwrap_or(0.0);
            let busy = mean(
                &outs
                    .iter()
                    .flat_map(|o| o.busy[w0..].to_vec())
                    .collect::<Vec<_>>(),
            );
            println!(
                "{:<28} {:>7.1} {:>12.1} {:>10.1} {:>10.1} {:>7.1} {:>10.1} {:>8.0}%",
                if i == 0 { sc.name.as_str() } else { "" },
                t,
                free_mean,
                m,
                worst_run,
                early,
                worst,
                100.0 * busy
            );
            for (k, o) in outs.iter().enumerate() {
                let mk = mean(&o.windows[i][w0..]);
                if (mk - t).abs() > GOAL {
                    misses.push(format!(
                        "{} claim {i} seed {}: mean {mk:.1} vs target {t:.1}",
                        sc.name, seeds[k]
                    ));
                }
            }
        }
    }
    if only.as_deref().is_none_or(|o| o == "special") {
        for &seed in &seeds {
            special(dir.path(), &nvml, seed, &mut misses);
        }
    }
    if misses.is_empty() {
        println!("\nevery run's mean within ±{GOAL} points of its target");
    } else {
        println!(
            "\nmissed the ±{GOAL} point goal:\n  {}",
            misses.join("\n  ")
        );
    }
}

/// The time-series scenarios: a claim going idle and active again, a claim forging its
/// launch counter, and a capped claim alone on an idle GPU.
fn special(dir: &Path, nvml: &Nvml, seed: u64, misses: &mut Vec<String>) {
    // 25/40: the 40 claim runs 4 s, idles 3 s, runs again. While it idles the 25 claim
    // is alone (no contention: it may use the whole GPU); afterwards the split returns.
    let mut ia = Scenario::row(&[25, 40]);
    ia.name = "25/40, 40 idle 4-7 s".into();
    ia.workloads = vec!["loop".into(), "idle-active active=4 idle=3".into()];
    // Ten windows after the return, as for the rows: 4 s running, 3 idle, 3 for the
    // split to return, 10 measured.
    ia.secs = 20.0;
    let o = run(dir, nvml, &ia, seed, true);
    println!("\n{} (seed {seed}): per 1 s window from 0 s", ia.name);
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:5.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("  25 claim share   {}", fmt(&o.windows[0]));
    println!("  40 claim share   {}", fmt(&o.windows[1]));
    println!(
        "  GPU busy %       {}",
        fmt(&o.busy.iter().map(|b| b * 100.0).collect::<Vec<_>>())
    );
    // The windows in which the 40 claim ran nothing; the last of them must show the 25
    // claim alone on a busy GPU (the compute_limit test asserts it).
    let idle: Vec<usize> = (1..o.windows[1].len())
        .filter(|&w| o.windows[1][w] < 2.0)
        .collect();
    let last = idle.last().copied().unwrap_or(0);
    println!(
        "  40 claim idle in windows {idle:?}; in window {last} the 25 claim had {:.1} % of a {:.0} % busy GPU",
        o.windows[0][last],
        o.busy[last] * 100.0
    );
    let from = (last + 3).min(o.windows[0].len() - 1);
    let to = (from + WINDOWS).min(o.windows[0].len());
    let after = mean(&o.windows[0][from..to]);
    println!("  after the return (windows {from}..{to}): 25 claim mean {after:.1} (target 42.5)");
    if (after - 42.5).abs() > GOAL {
        misses.push(format!(
            "{}: after the return the 25 claim had {after:.1}",
            ia.name
        ));
    }
    // A tenant forging its launch counter (4 extra blocks per block: its rate, believed,
    // would be 5x its due) in a 25 claim of 3 processes against a 40 claim's loop. The
    // issue's bound: no more than 2 points above its target for longer than 10 s,
    // judged by the worst mean of 10 consecutive windows from 10 s on (single windows
    // swing by tens of points with the heavy-tailed kernels).
    // The same claim rewinding its token bucket every millisecond instead (not in quick
    // mode: the same code paths, 22 s more).
    let quick = std::env::var_os("TESSERA_BENCH_QUICK").is_some();
    let mut forgers = Vec::new();
    let mut fc = Scenario::row(&[25, 40]);
    fc.name = "25/40, 25 forges its counters".into();
    fc.procs = vec![3, 1];
    fc.inflate = vec![4, 0];
    fc.secs = 22.0;
    forgers.push(fc.clone());
    if !quick {
        fc.name = "25/40, 25 rewinds its bucket".into();
        fc.inflate = vec![0, 0];
        fc.rewind = vec![true, false];
        forgers.push(fc);
    }
    for fc in &forgers {
        let o = run(dir, nvml, fc, seed, true);
        // Unthrottled, for comparison (not in quick mode: 22 s more).
        let free = (!quick).then(|| run(dir, nvml, fc, seed, false));
        println!("\n{} (seed {seed}): per 1 s window from 0 s", fc.name);
        println!("  25 claim share   {}", fmt(&o.windows[0]));
        let tail = &o.windows[0][10..];
        assert!(
            tail.len() >= 10,
            "{}: {} windows from 10 s",
            fc.name,
            tail.len()
        );
        let worst10 = tail.windows(10).map(mean).fold(f64::NEG_INFINITY, f64::max);
        let m = mean(tail);
        let free = free.map_or("not run".into(), |f| {
            format!("{:.1}", mean(&f.windows[0][10..]))
        });
        println!(
            "  from 10 s: mean {m:.1}, worst 10 s mean {worst10:.1} (target 42.5; unthrottled {free})"
        );
        if m - 42.5 > GOAL || worst10 - 42.5 > GOAL {
            misses.push(format!(
                "{}: from 10 s mean {m:.1}, worst 10 s mean {worst10:.1}",
                fc.name
            ));
        }
    }
    // computeLimit 30 on an otherwise idle GPU: the GPU is busy about 30 % of the time.
    let mut cap = Scenario::row(&[25]);
    cap.name = "computeLimit 30, alone".into();
    cap.limits = vec![30];
    let o = run(dir, nvml, &cap, seed, true);
    let w0 = WARMUP_S as usize;
    let busy = 100.0 * mean(&o.busy[w0..]);
    println!(
        "\n{} (seed {seed}): GPU busy {busy:.1} % over windows {w0}..{} s (windows: {})",
        cap.name,
        o.busy.len(),
        fmt(&o.busy.iter().map(|b| b * 100.0).collect::<Vec<_>>())
    );
    if (busy - 30.0).abs() > GOAL {
        misses.push(format!("{}: GPU busy {busy:.1} %, cap 30", cap.name));
    }
}
