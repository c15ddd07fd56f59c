//! The library's cost per call against the fake driver, measured in one run and
//! printed as differences and ratios to direct calls (no preload):
//! * an alloc+free pair (charged: a claim budgets the GPU);
//! * `cuLaunchKernel` unthrottled (no claim, and a claim with rate 0) and throttled with
//!   tokens available (the fast path: one clock read and one compare-and-swap);
//! * `cuMemGetInfo` (virtualized);
//! * 8 processes allocating at once: CPU time per pair against one process;
//! * `/bin/true` started under the preload (median of paired batches).
//!
//! Run with `cargo bench -p tessera-cuda` (root, unshare and cc needed, as for the tests);
//! `TESSERA_BENCH_LIB=<path>` measures that library file instead of a fresh release build,
//! `TESSERA_BENCH_ROUNDS=<n>` keeps the best of n rounds instead of 3, and
//! `TESSERA_BENCH_QUICK=1` (CI) runs one round (the figures are noisier; nothing here is
//! judged, the targets are printed beside them).

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

/// Each run times BATCHES short batches of each call and keeps the fastest, so that a
/// batch the scheduler interrupted (the machine may be shared) does not count.
const BATCHES: usize = 20;

/// Runs `rounds` preloaded clients, each timing BATCHES alternating batches of every
/// (call, count) in `calls`, direct then intercepted; returns the fastest batch of each
/// as (direct, intercepted) CPU ns per call.
fn paired(sb: &Sandbox, o: &RunOpts, calls: &[(&str, &str)], rounds: usize) -> Vec<(f64, f64)> {
    let names: Vec<(String, String)> = calls
        .iter()
        .map(|(c, _)| (format!("bench-direct-{c}"), format!("bench-{c}")))
        .collect();
    let mut cmds = vec!["ctx", "0"];
    for ((d, p), (_, n)) in names.iter().zip(calls) {
        for _ in 0..BATCHES {
            cmds.extend_from_slice(&[d, n, p, n]);
        }
    }
    let mut best = vec![(f64::MAX, f64::MAX); calls.len()];
    for _ in 0..rounds {
        let out = run(sb, o, true, &cmds);
        for (k, b) in best.iter_mut().enumerate() {
            for i in 0..BATCHES {
                let at = 1 + 2 * (BATCHES * k + i);
                b.0 = b.0.min(out.get(at).map_or(f64::MAX, |l| times(l).1));
                b.1 = b.1.min(out.get(at + 1).map_or(f64::MAX, |l| times(l).1));
            }
        }
    }
    best
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
    install_libs(&release, &lib_dir);
    let sb = Sandbox::new(&[(GPU0, 80 << 30)], vec![production_claim()]);
    let o = RunOpts {
        lib_dir: Some(lib_dir),
        env: vec![("FAKE_CUDA_NO_BACKING".into(), "1".into())],
        ..RunOpts::default()
    };
    // TESSERA_BENCH_PERF=<file>: record a profile of preloaded alloc+free pairs with
    // perf(1) into <file> and stop (for finding where the added time goes);
    // TESSERA_BENCH_PERF_CALL picks another call (bench-launch, bench-meminfo).
    if let Some(out) = std::env::var_os("TESSERA_BENCH_PERF") {
        let out = out.to_string_lossy().into_owned();
        let client = artifacts().client.to_string_lossy().into_owned();
        let what = std::env::var("TESSERA_BENCH_PERF_CALL").unwrap_or("bench-pair".into());
        sb.set_preload(PRELOAD_PATH);
        let st = sb
            .command(
                &o,
                std::path::Path::new("perf"),
                &[
                    "record", "-q", "-o", &out, "--", &client, "gpa", "ctx", "0", &what, "5000000",
                ],
            )
            .status()
            .expect("perf");
        println!("perf record: {st}; see perf report -i {out}");
        return;
    }
    let quick = std::env::var_os("TESSERA_BENCH_QUICK").is_some();
    let rounds: usize = std::env::var("TESSERA_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1 } else { 3 })
        .max(1);
    if quick {
        println!("quick mode (TESSERA_BENCH_QUICK): {rounds} round(s)");
    }
    // Direct and intercepted calls are timed in the same preloaded process, in
    // alternating batches: the direct ones through the fake driver's own entry points
    // (`fakecuda_lookup`, past the library), so both see the same address layout, CPU
    // and cache (separate processes differ by tens of ns per pair from run to run).
    // Pairs and memory queries first: the library starts its launch-counter flusher
    // thread at a process's first launch, and a second thread turns off glibc's
    // single-thread fast paths (malloc without locks), which the fake driver's
    // allocation path uses. A real CUDA process always has the driver's own threads,
    // so the pair is measured before any launch, and once more after (last row).
    let best = paired(
        &sb,
        &o,
        &[
            ("pair", "10000"),
            ("meminfo", "10000"),
            ("launch", "100000"),
            ("pair", "10000"),
        ],
        rounds,
    );
    println!(
        "CPU time per call, fastest of {rounds} x {BATCHES} alternating batches in one process (fake driver without host pages; direct = the fake's own entry points):"
    );
    println!(
        "{:<34} {:>13} {:>13} {:>12}  ratio",
        "", "direct", "preloaded", "added"
    );
    row(
        "alloc+free pair (4 KiB, charged)",
        best[0].0,
        best[0].1,
        "<= +50 ns",
    );
    row(
        "cuLaunchKernel (claim, rate 0)",
        best[2].0,
        best[2].1,
        "<= +10 ns",
    );
    row(
        "cuMemGetInfo (virtualized)",
        best[1].0,
        best[1].1,
        "HAMi ~ +1 us",
    );
    row(
        "alloc+free pair, flusher running",
        best[3].0,
        best[3].1,
        "(2nd thread: glibc)",
    );

    // Launches without a claim, and throttled with tokens always available (rate
    // 10^12 blocks/s): the same alternation, launches only.
    let none = Sandbox::new(&[(GPU0, 80 << 30)], vec![]);
    let fast = Sandbox::new(&[(GPU0, 80 << 30)], vec![production_claim()]);
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
    for (what, sb, target) in [
        ("cuLaunchKernel (no claim)", &none, "<= +10 ns"),
        (
            "cuLaunchKernel (throttled, tokens)",
            &fast,
            "no syscall (tests)",
        ),
    ] {
        let b = paired(sb, &o, &[("launch", "100000")], rounds);
        row(what, b[0].0, b[0].1, target);
    }

    // 8 processes at once against one, each alternating direct and intercepted batches
    // as above (so that both kinds of batch meet the same competition for the two
    // cores and their caches): CPU time per pair through the library, and through the
    // fake's own entry points (whose shared ledger contends too). Best of the rounds.
    let calls = [("pair", "10000")];
    let (mut one, mut eight) = ((f64::MAX, f64::MAX), (f64::MAX, f64::MAX));
    for _ in 0..rounds {
        let b = paired(&sb, &o, &calls, 1)[0];
        one = (one.0.min(b.0), one.1.min(b.1));
        sb.set_preload(PRELOAD_PATH);
        let mut args = vec!["gpa", "ctx", "0"];
        for _ in 0..BATCHES {
            args.extend_from_slice(&["bench-direct-pair", "10000", "bench-pair", "10000"]);
        }
        let kids: Vec<_> = (0..8)
            .map(|_| {
                sb.command(&o, &artifacts().client, &args)
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("spawn")
            })
            .collect();
        let (mut d, mut p) = (0.0, 0.0);
        for k in kids {
            let out = k.wait_with_output().expect("wait");
            let l = lines(&out.stdout);
            let best = |first: usize| {
                (0..BATCHES)
                    .map(|i| l.get(first + 2 * i).map_or(f64::NAN, |x| times(x).1))
                    .fold(f64::MAX, f64::min)
            };
            d += best(1) / 8.0;
            p += best(2) / 8.0;
        }
        // A run with a failed child (NaN) is left out.
        eight = (eight.0.min(d), eight.1.min(p));
    }
    let ((d1, p1), (d8, p8)) = (one, eight);
    println!(
        "8 processes allocating at once, preloaded: {p8:.1} ns CPU per pair vs {p1:.1} alone: x{:.2} (target <= 1.5)",
        p8 / p1
    );
    println!(
        "  the fake driver alone (direct): {d8:.1} vs {d1:.1}: x{:.2}; the library's added CPU per pair: {:+.1} ns at 8 vs {:+.1} ns alone: x{:.2}",
        d8 / d1,
        p8 - d8,
        p1 - d1,
        (p8 - d8) / (p1 - d1)
    );

    // Process start-up: /bin/true in the same sandbox, with the front library in
    // ld.so.preload as the plugin installs it (the row the target is for), and, for
    // comparison, with the interception library preloaded directly.
    let (base, with, diff) = startup(&sb, &o, rounds, PRELOAD_PATH);
    println!(
        "/bin/true posix_spawn+wait, medians of {} paired batches: {:.1} us direct, {:.1} us preloaded (front library): {:+.1} us x{:.2} (target < +100 us)",
        50 * rounds,
        base / 1e3,
        with / 1e3,
        diff / 1e3,
        with / base
    );
    let (base, with, diff) = startup(&sb, &o, rounds, CORE_PATH);
    println!(
        "  the same with libtessera_cuda.so preloaded directly (no front): {:.1} us direct, {:.1} us preloaded: {:+.1} us x{:.2}",
        base / 1e3,
        with / 1e3,
        diff / 1e3,
        with / base
    );
}

/// `/bin/true` started in adjacent pairs of batches of 20 with and without `line` in
/// the sandbox's `/etc/ld.so.preload` (the client rewrites the host file that is the
/// sandbox's read-only `/etc/ld.so.preload` between them; its overlays cost the same
/// either way). This machine's speed drifts over seconds, so the figure is the median
/// of the paired differences, not a difference of minimums; the pairs alternate which
/// goes first, so that a steady drift cancels too. Returns the medians (ns) of the
/// batches without, with, and of the differences.
fn startup(sb: &Sandbox, o: &RunOpts, rounds: usize, line: &str) -> (f64, f64, f64) {
    let pairs = 50 * rounds;
    let host_preload = sb.dir.path().join("ld.so.preload");
    let host_preload = host_preload.to_str().expect("utf-8 path");
    let mut spawn = Vec::new();
    for k in 0..pairs {
        for with in [k % 2 == 1, k % 2 == 0] {
            spawn.extend_from_slice(&["writefile", host_preload, if with { line } else { "-" }]);
            spawn.extend_from_slice(&["spawn", "20", "/bin/true"]);
        }
    }
    let out = run(sb, o, true, &spawn);
    let walls: Vec<f64> = out
        .iter()
        .filter(|l| l.split(' ').count() == 3)
        .map(|l| times(l).0)
        .collect();
    assert_eq!(walls.len(), 2 * pairs, "spawn batches: {out:?}");
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // Pair k: direct first when k is even.
    let (direct, preloaded): (Vec<f64>, Vec<f64>) = walls
        .chunks(2)
        .enumerate()
        .map(|(k, w)| {
            if k % 2 == 0 {
                (w[0], w[1])
            } else {
                (w[1], w[0])
            }
        })
        .unzip();
    let added: Vec<f64> = direct.iter().zip(&preloaded).map(|(d, p)| p - d).collect();
    if std::env::var_os("TESSERA_BENCH_VERBOSE").is_some() {
        let q = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let n = v.len();
            format!(
                "{:.0} {:.0} {:.0} {:.0} {:.0}",
                v[0] / 1e3,
                v[n / 4] / 1e3,
                v[n / 2] / 1e3,
                v[3 * n / 4] / 1e3,
                v[n - 1] / 1e3
            )
        };
        eprintln!("  {line}:");
        eprintln!("  direct    min/q1/median/q3/max us: {}", q(direct.clone()));
        eprintln!(
            "  preloaded min/q1/median/q3/max us: {}",
            q(preloaded.clone())
        );
        eprintln!("  added     min/q1/median/q3/max us: {}", q(added.clone()));
    }
    (median(direct), median(preloaded), median(added))
}

/// The claim the benchmarks charge: a 64 GiB budget in a region with as many slots as
/// the plugin makes ([`tessera_abi::region::DEFAULT_SLOTS`]), since memory queries
/// read every slot.
fn production_claim() -> ClaimSpec {
    let mut c = ClaimSpec::new("claim-a", &[(GPU0, 64 << 30)]);
    c.slots = tessera_abi::region::DEFAULT_SLOTS;
    c
}
