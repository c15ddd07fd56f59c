//! The library's cost per call against the fake driver, measured in one run and
//! printed as differences and ratios to direct calls (no preload):
//! * an alloc+free pair (charged: a claim budgets the GPU);
//! * `cuLaunchKernel` unthrottled (no claim, and a claim with rate 0) and throttled with
//!   tokens available (the fast path: one clock read and one compare-and-swap);
//! * `cuMemGetInfo` (virtualized);
//! * 8 processes allocating at once: CPU time per pair against one process;
//! * `/bin/true` started under the preload.
//!
//! Run with `cargo bench -p tessera-cuda` (root, unshare and cc needed, as for the tests);
//! `TESSERA_BENCH_LIB=<path>` measures that library file instead of a fresh release build,
//! `TESSERA_BENCH_ROUNDS=<n>` keeps the best of n rounds instead of 3.

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Stdio;

use support::*;

/// Parses "ok <wall> <cpu>".
fn times(line: &str) -> (f64, f64) {
    let f: Vec<f64> = line
        .split(' ')
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    (
        f.first().copied().unwrap_or(f64::NAN),
        f.get(1).copied().unwrap_or(f64::NAN),
    )
}

/// Runs the client in the sandbox with (`preload`) or without the preload line:
/// everything else (mounts, overlays, fake driver) is the same in both.
fn run(sb: &Sandbox, o: &RunOpts, preload: bool, args: &[&str]) -> Vec<String> {
    sb.set_preload(if preload { PRELOAD_PATH } else { "" });
    sb.client(o, args)
}

fn row(what: &str, base: f64, with: f64, target: &str) {
    println!(
        "{what:<34} {base:>10.1} ns {with:>10.1} ns  {:>+9.1} ns  x{:.2}   (target {target})",
        with - base,
        with / base
    );
}

fn main() {
    if !require("bench") {
        return;
    }
    // TESSERA_BENCH_LIB measures another build of the library (an older commit, the
    // zig release artifact) in the same conditions.
    let release = std::env::var_os("TESSERA_BENCH_LIB")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| built_library_with("release", &["--release"]));
    let lib_dir = release.parent().expect("dir").join("preload");
    std::fs::create_dir_all(&lib_dir).expect("mkdir");
    std::fs::copy(&release, lib_dir.join("libtessera_cuda.so")).expect("copy");
    let sb = Sandbox::new(
        &[(GPU0, 80 << 30)],
        vec![ClaimSpec::new("claim-a", &[(GPU0, 64 << 30)])],
    );
    let o = RunOpts {
        lib_dir: Some(lib_dir),
        env: vec![("FAKE_CUDA_NO_BACKING".into(), "1".into())],
        ..RunOpts::default()
    };
    let n = "200000";
    // Each run times 20 short batches of each call and keeps the fastest batch, so that
    // a batch the scheduler interrupted (the machine may be shared) does not count.
    const BATCHES: usize = 20;
    // Pairs and memory queries first: the library starts its launch-counter flusher
    // thread at a process's first launch, and a second thread turns off glibc's
    // single-thread fast paths (malloc without locks), which the fake driver's
    // allocation path uses. A real CUDA process always has the driver's own threads,
    // so the pair is measured before any launch, and once more after (last row).
    let kinds = ["bench-pair", "bench-meminfo", "bench-launch", "bench-pair"];
    let sizes = ["10000", "10000", "100000", "10000"];
    let mut cmds = vec!["ctx", "0"];
    for (k, n) in kinds.iter().zip(sizes) {
        for _ in 0..BATCHES {
            cmds.extend_from_slice(&[k, n]);
        }
    }
    // Alternate direct and preloaded runs, keeping the best of each (three rounds, or
    // TESSERA_BENCH_ROUNDS).
    let rounds: usize = std::env::var("TESSERA_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let mut best_d = [f64::MAX; 4];
    let mut best_p = [f64::MAX; 4];
    for _ in 0..rounds {
        let d = run(&sb, &o, false, &cmds);
        let p = run(&sb, &o, true, &cmds);
        for k in 0..kinds.len() {
            for b in 0..BATCHES {
                let i = 1 + BATCHES * k + b;
                best_d[k] = best_d[k].min(d.get(i).map_or(f64::MAX, |l| times(l).1));
                best_p[k] = best_p[k].min(p.get(i).map_or(f64::MAX, |l| times(l).1));
            }
        }
    }
    println!(
        "CPU time per call, fastest batch of {rounds} x {BATCHES} (fake driver without host pages; direct = no preload):"
    );
    println!(
        "{:<34} {:>13} {:>13} {:>12}  ratio",
        "", "direct", "preloaded", "added"
    );
    row(
        "alloc+free pair (4 KiB, charged)",
        best_d[0],
        best_p[0],
        "<= +50 ns",
    );
    row(
        "cuLaunchKernel (claim, rate 0)",
        best_d[2],
        best_p[2],
        "<= +10 ns",
    );
    row(
        "cuMemGetInfo (virtualized)",
        best_d[1],
        best_p[1],
        "HAMi ~ +1 us",
    );
    row(
        "alloc+free pair, flusher running",
        best_d[3],
        best_p[3],
        "(2nd thread: glibc)",
    );

    // Launches without a claim, and throttled with tokens always available (rate
    // 10^12 blocks/s): the same alternation, launches only.
    let none = Sandbox::new(&[(GPU0, 80 << 30)], vec![]);
    let fast = Sandbox::new(
        &[(GPU0, 80 << 30)],
        vec![ClaimSpec::new("claim-a", &[(GPU0, 64 << 30)])],
    );
    {
        let p = fast.dir.path().join("claims/claim-a/control");
        let f = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&p)
            .expect("control");
        tessera_abi::control::Control::map(&f, true)
            .and_then(|c| c.set_rate(0, 1_000_000_000_000, 1_000_000_000))
            .expect("set the rate");
    }
    let mut launch = vec!["ctx", "0"];
    for _ in 0..BATCHES {
        launch.extend_from_slice(&["bench-launch", "100000"]);
    }
    for (what, sb, target) in [
        ("cuLaunchKernel (no claim)", &none, "<= +10 ns"),
        (
            "cuLaunchKernel (throttled, tokens)",
            &fast,
            "no syscall (tests)",
        ),
    ] {
        let (mut d, mut p) = (f64::MAX, f64::MAX);
        for _ in 0..rounds {
            for l in run(sb, &o, false, &launch).iter().skip(1) {
                d = d.min(times(l).1);
            }
            for l in run(sb, &o, true, &launch).iter().skip(1) {
                p = p.min(times(l).1);
            }
        }
        row(what, d, p, target);
    }

    // 8 processes at once against one: CPU time per pair, with and without the
    // library (the fake driver's own shared ledger contends too).
    // Best of the rounds for each figure (the machine may be shared).
    for preload in [false, true] {
        let (mut one, mut eight) = (f64::MAX, f64::MAX);
        for _ in 0..rounds {
            one = one.min(times(&run(&sb, &o, preload, &["ctx", "0", "bench-pair", n])[1]).1);
            let kids: Vec<_> = (0..8)
                .map(|_| {
                    sb.command(
                        &o,
                        &artifacts().client,
                        &["gpa", "ctx", "0", "bench-pair", n],
                    )
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("spawn")
                })
                .collect();
            let mut sum = 0.0;
            for k in kids {
                let out = k.wait_with_output().expect("wait");
                let l = lines(&out.stdout);
                sum += l.get(1).map_or(f64::NAN, |l| times(l).1) / 8.0;
            }
            // A run with a failed child (NaN) is left out.
            eight = eight.min(sum);
        }
        println!(
            "8 processes allocating at once, {}: {eight:.1} ns CPU per pair vs {one:.1} alone: x{:.2} (target <= 1.5 preloaded)",
            if preload { "preloaded" } else { "direct" },
            eight / one
        );
    }

    // Process start-up: /bin/true in the same sandbox with and without the preload
    // line (the sandbox's overlays cost the same either way): 20 batches of 20 per
    // run, the fastest batch kept, as above.
    let mut spawn = Vec::new();
    for _ in 0..BATCHES {
        spawn.extend_from_slice(&["spawn", "20", "/bin/true"]);
    }
    let mut base = f64::MAX;
    let mut with = f64::MAX;
    for _ in 0..rounds {
        for l in run(&sb, &o, false, &spawn) {
            base = base.min(times(&l).0);
        }
        for l in run(&sb, &o, true, &spawn) {
            with = with.min(times(&l).0);
        }
    }
    println!(
        "/bin/true fork+exec+wait: {:.1} us direct, {:.1} us preloaded: {:+.1} us (target < +100 us)",
        base / 1e3,
        with / 1e3,
        (with - base) / 1e3
    );
}
