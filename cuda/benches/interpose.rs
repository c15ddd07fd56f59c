//! The library's cost per call against the fake driver, measured in one run for the
//! previous design (the front library in `/etc/ld.so.preload`, the driver itself at
//! `libcuda.so.1`) and the new one (Tessera's soname shim at `libcuda.so.1`, the driver
//! behind it at `/usr/local/tessera/driver/libcuda.real`, the front preloaded as well),
//! each printed beside direct calls (the fake's own entry points) with the added cost,
//! the target and whether the new design meets it:
//! * an alloc+free pair (charged: a claim budgets the GPU);
//! * `cuLaunchKernel` unthrottled (no claim, and a claim with rate 0) and throttled with
//!   tokens available (the fast path: one clock read and one compare-and-swap);
//! * `cuMemGetInfo` (virtualized), alone and while 7 more processes hold slots;
//! * 8 processes allocating at once: CPU time per pair against one process;
//! * `/bin/true` started under the preload (median of paired batches).
//!
//! Run with `cargo bench -p tessera-interpose` (root, unshare and cc needed, as for the tests);
//! `TESSERA_BENCH_LIB=<path>` measures that library file instead of a fresh release build,
//! `TESSERA_BENCH_ROUNDS=<n>` keeps the best of n rounds instead of 3, and
//! `TESSERA_BENCH_QUICK=1` (CI) runs one round (the figures are noisier). The verdict
//! column is printed, never an exit code: a benchmark on a shared machine judges
//! nothing by itself.

use testkit::interpose as support;

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

/// A target, as the issue states it, and how a row is judged against it.
#[derive(Clone, Copy)]
enum Target {
    /// The added cost (new design minus direct) at most this much (ns, or us for
    /// start-up).
    Added(f64),
    /// The CPU per call of 8 processes at most this many times that of one.
    Ratio(f64),
    /// Shown for comparison; not judged.
    Info(&'static str),
}

impl Target {
    fn text(self, unit: &str) -> String {
        match self {
            Target::Added(v) => format!("<= +{v} {unit}"),
            Target::Ratio(v) => format!("<= x{v}"),
            Target::Info(t) => t.to_string(),
        }
    }

    /// "met" / "not met" for a figure of the new design (the added cost, or the
    /// ratio); "-" when nothing is judged or the figure is missing.
    fn verdict(self, figure: f64) -> &'static str {
        let limit = match self {
            Target::Added(v) | Target::Ratio(v) => v,
            Target::Info(_) => return "-",
        };
        if !figure.is_finite() {
            "-"
        } else if figure <= limit {
            "met"
        } else {
            "not met"
        }
    }
}

/// The two layouts compared, each in its own process on the same sandbox: the front
/// library in `/etc/ld.so.preload` in both; the previous design loads the (fake) driver
/// itself at `libcuda.so.1`, the new one Tessera's soname shim there, which NEEDs the
/// driver at `/usr/local/tessera/driver/libcuda.real`.
struct Designs {
    previous: RunOpts,
    new: RunOpts,
}

/// One measure's figures: (direct, intercepted) in the previous design's process and
/// in the new design's.
#[derive(Clone, Copy)]
struct Pair2 {
    previous: (f64, f64),
    new: (f64, f64),
}

impl Pair2 {
    const NONE: Pair2 = Pair2 {
        previous: (f64::MAX, f64::MAX),
        new: (f64::MAX, f64::MAX),
    };

    fn min(self, previous: (f64, f64), new: (f64, f64)) -> Pair2 {
        let m = |a: (f64, f64), b: (f64, f64)| (a.0.min(b.0), a.1.min(b.1));
        Pair2 {
            previous: m(self.previous, previous),
            new: m(self.new, new),
        }
    }
}

const HEADER_WIDTH: usize = 44;

fn header(unit: &str) {
    println!(
        "{:<HEADER_WIDTH$} {:>10} {:>10} {:>10} {:>10} {:>10}  {:<22} verdict",
        "",
        format!("direct {unit}"),
        "previous",
        "added",
        "new",
        "added",
        "target"
    );
}

/// A row: the direct figure (the mean of the two processes' own direct batches), what
/// each design adds to the direct batches of its own process and the direct figure
/// plus that (so that the columns add up; the raw figures with
/// `TESSERA_BENCH_VERBOSE=1`), the target and the new design's verdict.
fn row(what: &str, f: Pair2, unit: &str, target: Target) {
    let added = |(d, p): (f64, f64)| p - d;
    let (ap, an) = (added(f.previous), added(f.new));
    let direct = (f.previous.0 + f.new.0) / 2.0;
    println!(
        "{what:<HEADER_WIDTH$} {direct:>10.1} {:>10.1} {ap:>+10.1} {:>10.1} {an:>+10.1}  {:<22} {}",
        direct + ap,
        direct + an,
        target.text(unit),
        target.verdict(an)
    );
    if std::env::var_os("TESSERA_BENCH_VERBOSE").is_some() {
        let (p, n) = (f.previous, f.new);
        eprintln!(
            "  {what}: previous process {:.1} direct, {:.1} intercepted; new process {:.1} direct, {:.1} intercepted",
            p.0, p.1, n.0, n.1
        );
    }
}

/// The 8-process row: each design's ratio of CPU per pair at 8 processes to one.
fn ratio_row(what: &str, previous: ((f64, f64), (f64, f64)), new: ((f64, f64), (f64, f64))) {
    let r = |((_, p1), (_, p8)): ((f64, f64), (f64, f64))| p8 / p1;
    let d = |((d1, _), (d8, _)): ((f64, f64), (f64, f64))| d8 / d1;
    let t = Target::Ratio(1.5);
    println!(
        "{what:<HEADER_WIDTH$} {:>10} {:>10} {:>10} {:>10} {:>10}  {:<22} {}",
        format!("x{:.2}", (d(previous) + d(new)) / 2.0),
        format!("x{:.2}", r(previous)),
        "",
        format!("x{:.2}", r(new)),
        "",
        t.text(""),
        t.verdict(r(new))
    );
}

/// One round of 8 processes at once against one, each alternating direct and
/// intercepted batches (so that both kinds of batch meet the same competition for the
/// two cores and their caches): ((direct, intercepted) CPU ns per pair alone, the same
/// at 8). A failed child gives NaN.
fn eight_processes(sb: &Sandbox, o: &RunOpts) -> ((f64, f64), (f64, f64)) {
    let one = paired(sb, o, &[("pair", "10000")], 1)[0];
    sb.set_preload(PRELOAD_PATH);
    let mut args = vec!["gpa", "ctx", "0"];
    for _ in 0..BATCHES {
        args.extend_from_slice(&["bench-direct-pair", "10000", "bench-pair", "10000"]);
    }
    let kids: Vec<_> = (0..8)
        .map(|_| {
            sb.command(o, &artifacts().client, &args)
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
    (one, (d, p))
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
    let designs = Designs {
        previous: RunOpts {
            no_shims: true,
            ..o.clone()
        },
        new: o.clone(),
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
    // Each design runs in its own process, one after the other in every round.
    // Pairs and memory queries first: the library starts its launch-counter flusher
    // thread at a process's first launch, and a second thread turns off glibc's
    // single-thread fast paths (malloc without locks), which the fake driver's
    // allocation path uses. A real CUDA process always has the driver's own threads,
    // so the pair is measured before any launch, and once more after (last row).
    let calls = [
        ("pair", "10000"),
        ("meminfo", "10000"),
        ("launch", "100000"),
        ("pair", "10000"),
    ];
    let both = |sb: &Sandbox, calls: &[(&str, &str)]| {
        let mut best = vec![Pair2::NONE; calls.len()];
        for _ in 0..rounds {
            let p = paired(sb, &designs.previous, calls, 1);
            let n = paired(sb, &designs.new, calls, 1);
            for (k, b) in best.iter_mut().enumerate() {
                *b = b.min(p[k], n[k]);
            }
        }
        best
    };
    let best = both(&sb, &calls);
    println!(
        "CPU time per call, fastest of {rounds} x {BATCHES} alternating batches per process (fake driver without host pages; direct = the fake's own entry points, in the same process).\n\
         previous = front library only (the driver at libcuda.so.1); new = the soname shim at libcuda.so.1, the driver behind it at {REAL_CUDA}; \
         the front in /etc/ld.so.preload in both. added = against the direct batches of the same process; verdict = the new design's."
    );
    header("ns");
    row(
        "alloc+free pair (4 KiB, charged to the pool)",
        best[0],
        "ns",
        Target::Added(50.0),
    );
    row(
        "cuLaunchKernel (claim, rate 0)",
        best[2],
        "ns",
        Target::Added(10.0),
    );
    row(
        "cuMemGetInfo (virtualized)",
        best[1],
        "ns",
        Target::Added(50.0),
    );
    row(
        "alloc+free pair, flusher running",
        best[3],
        "ns",
        Target::Info("(2nd thread: glibc)"),
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
        ("cuLaunchKernel (no claim)", &none, Target::Added(10.0)),
        (
            "cuLaunchKernel (throttled, tokens)",
            &fast,
            Target::Info("no syscall (tests)"),
        ),
    ] {
        let b = both(sb, &[("launch", "100000")]);
        row(what, b[0], "ns", target);
    }

    // Memory queries while 7 more processes of the claim hold a slot each, with
    // memory from their pools: the query reads the pools of the slots in use.
    {
        sb.set_preload(PRELOAD_PATH);
        let holders: Vec<_> = (0..7)
            .map(|_| {
                let (h, got) =
                    sb.spawn_client(&designs.new, &["ctx", "0", "alloc", "4096", "hold"], 3);
                assert_eq!(got.get(2).map(String::as_str), Some("holding"), "{got:?}");
                h
            })
            .collect();
        let b = both(&sb, &[("meminfo", "10000")]);
        row(
            "cuMemGetInfo, 8 processes hold slots",
            b[0],
            "ns",
            Target::Added(50.0),
        );
        drop(holders);
    }

    // 8 processes at once against one: CPU time per pair through the library, and
    // through the fake's own entry points (whose shared ledger contends too). Best of
    // the rounds, each design in turn.
    let none2 = ((f64::MAX, f64::MAX), (f64::MAX, f64::MAX));
    let (mut prev8, mut new8) = (none2, none2);
    let keep = |acc: &mut ((f64, f64), (f64, f64)), (one, eight): ((f64, f64), (f64, f64))| {
        acc.0 = (acc.0.0.min(one.0), acc.0.1.min(one.1));
        // A run with a failed child (NaN) is left out.
        acc.1 = (acc.1.0.min(eight.0), acc.1.1.min(eight.1));
    };
    for _ in 0..rounds {
        keep(&mut prev8, eight_processes(&sb, &designs.previous));
        keep(&mut new8, eight_processes(&sb, &designs.new));
    }
    ratio_row("8 processes at once, CPU per pair vs one", prev8, new8);
    for (name, ((d1, p1), (d8, p8))) in [("previous", prev8), ("new", new8)] {
        println!(
            "  {name}: {p8:.1} ns per pair at 8 vs {p1:.1} alone; the fake driver alone (direct): {d8:.1} vs {d1:.1}: x{:.2}; the library's added CPU per pair: {:+.1} ns at 8 vs {:+.1} ns alone",
            d8 / d1,
            p8 - d8,
            p1 - d1,
        );
    }

    // Process start-up: /bin/true in the same sandbox with the front library in
    // ld.so.preload as the plugin installs it (the row the target is for), in each
    // layout, and, for comparison, with the interception library preloaded directly.
    println!(
        "/bin/true posix_spawn+wait in the sandbox, {} paired batches of 20 per layout (direct = no preload line; added = the median of the paired differences):",
        50 * rounds
    );
    header("us");
    let (pb, _, pd) = startup(&sb, &designs.previous, rounds, PRELOAD_PATH);
    let (nb, _, nd) = startup(&sb, &designs.new, rounds, PRELOAD_PATH);
    // Added is the median of the paired differences, which the drift of this
    // machine's speed does not bias; a design's column is its direct median plus it.
    let us = |b: f64, d: f64| (b / 1e3, (b + d) / 1e3);
    row(
        "front library in ld.so.preload",
        Pair2 {
            previous: us(pb, pd),
            new: us(nb, nd),
        },
        "us",
        Target::Added(100.0),
    );
    let (cb, _, cd) = startup(&sb, &designs.previous, rounds, CORE_PATH);
    println!(
        "  libtessera_cuda.so in ld.so.preload directly (no front; previous layout): {:.1} us direct, {:+.1} us",
        cb / 1e3,
        cd / 1e3
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
