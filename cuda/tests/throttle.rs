//! Compute rates through the library, judged by the clock and by the region's
//! counters: each launch entry point obeys the claim's block rate (N blocks take at
//! least (N − last launch)/rate − burst), the processes of a claim share one bucket,
//! rate 0 is unthrottled, a rate change applies to launches already waiting, a
//! SIGKILLed process leaves the bucket usable, and the throttled fast path makes no
//! system call (a seccomp filter kills the process at the first one).
//!
//! The launches go through `tests/fakes/launch_client.c`, built here. Entry points the
//! fake driver does not export yet (the simulated GPU adds them) are skipped, with a
//! `tessera-cuda SKIP` line.

use testkit::interpose as support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use support::*;
use tessera_abi::control::Control;

const LAUNCH_SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fakes/launch_client.c");

/// The launch client, built once per test binary beside the other fixtures.
fn launch_client() -> &'static Path {
    static C: OnceLock<PathBuf> = OnceLock::new();
    C.get_or_init(|| {
        let out = artifacts().client.with_file_name("launch_client");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let mut w = cc.split_whitespace();
        let o = Command::new(w.next().unwrap_or("cc"))
            .args(w)
            .args([
                "-std=gnu11",
                "-O1",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pthread",
                "-o",
            ])
            .arg(&out)
            .arg(LAUNCH_SRC)
            .arg("-ldl")
            .output()
            .expect("run cc");
        assert!(
            o.status.success(),
            "building launch_client failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    })
}

fn run(sb: &Sandbox, mode: &str, args: &[&str]) -> Output {
    let mut a = vec![mode];
    a.extend_from_slice(args);
    sb.command(&opts(), launch_client(), &a)
        .output()
        .expect("run launch_client")
}

fn run_ok(sb: &Sandbox, mode: &str, args: &[&str]) -> Vec<String> {
    let out = run(sb, mode, args);
    assert!(
        out.status.success(),
        "launch_client {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    lines(&out.stdout)
}

/// (start ns, end ns, errors) of an "ok <start> <end> <errors>" line.
fn span(line: &str) -> (u64, u64, u64) {
    let f: Vec<u64> = line
        .split(' ')
        .skip(1)
        .map(|x| x.parse().unwrap_or_else(|_| panic!("{line}")))
        .collect();
    assert_eq!(f.len(), 3, "{line}");
    (f[0], f[1], f[2])
}

const CLAIM: &str = "claim-t";

fn sandbox(gpus: &[&str]) -> Sandbox {
    let devices: Vec<(&str, u64)> = [GPU0, GPU1].iter().map(|u| (*u, 80u64 << 30)).collect();
    let budgets: Vec<(&str, u64)> = gpus.iter().map(|u| (*u, 1u64 << 30)).collect();
    Sandbox::new(&devices, vec![ClaimSpec::new(CLAIM, &budgets)])
}

/// Sets the claim's rate on every GPU of its control file, as the plugin does.
fn set_rate(sb: &Sandbox, block_rate: u64, burst_ns: u64) {
    let p = sb.dir.path().join("claims").join(CLAIM).join("control");
    let f = fs::File::options()
        .read(true)
        .write(true)
        .open(&p)
        .expect("control");
    let c = Control::map(&f, true).expect("map control");
    for g in 0..c.gpu_count() {
        c.set_rate(g, block_rate, burst_ns).expect("set_rate");
    }
}

/// Whether the fake driver answers `base` (at `version`, `flags`) at all.
fn driver_has(sb: &Sandbox, base: &str, version: &str, flags: &str) -> bool {
    run_ok(sb, "gpa", &["has", base, version, flags])
        .first()
        .is_some_and(|l| l.starts_with("yes"))
}

/// Blocks the fake driver saw launched per device, summed over its per-process ledger
/// records (`36864 + 64·record`: u64 blocks per device): the driver's own count.
fn ledger_blocks(sb: &Sandbox) -> [u64; 2] {
    let b = fs::read(sb.dir.path().join("ledger")).expect("ledger");
    let mut out = [0u64; 2];
    for rec in 0..256 {
        for (d, o) in out.iter_mut().enumerate() {
            let at = 36864 + 64 * rec + 8 * d;
            if let Some(x) = b.get(at..at + 8) {
                *o += u64::from_le_bytes(x.try_into().expect("8 bytes"));
            }
        }
    }
    out
}

const RATE: u64 = 20_000;
const BURST: u64 = 20_000_000;

/// Asserts `blocks` in `last` per launch took at least (blocks − last)/rate − burst
/// (a bound no load can break: a busy machine only slows the launches) and not
/// absurdly longer (10 s more: a bucket off by an order of magnitude, not a slow
/// machine); prints the figure.
fn assert_paced(what: &str, ns: u64, blocks: u64, last: u64) {
    let min = ((blocks - last) as f64 / RATE as f64 - BURST as f64 / 1e9 - 0.002).max(0.0);
    let secs = ns as f64 / 1e9;
    println!("{what}: {blocks} blocks at {RATE}/s in {secs:.3} s (at least {min:.3} s)");
    assert!(
        secs >= min,
        "{what}: {blocks} blocks at {RATE}/s took {secs:.3} s, less than {min:.3} s"
    );
    let max = blocks as f64 / RATE as f64 + 10.0;
    assert!(secs <= max, "{what}: {secs:.3} s, more than {max:.3} s");
}

/// Every launch entry point, through `cuGetProcAddress` (flag 2 for `_ptsz`) and by
/// exact name, is paced by the claim's rate; the region counts its blocks, launches
/// and the time it waited.
#[test]
#[ignore = "needs root (unshare -m)"]
fn every_entry_point_obeys_the_rate() {
    if !require("every_entry_point_obeys_the_rate") {
        return;
    }
    // (mode, entry, symbol the driver must have, version, flags, launches, blocks per
    // launch, kernels per launch)
    type Case<'a> = (&'a str, &'a str, &'a str, &'a str, &'a str, u64, u64, u64);
    let cases: &[Case] = &[
        ("gpa", "kernel", "cuLaunchKernel", "12000", "0", 100, 100, 1),
        (
            "gpa",
            "kernel_ptsz",
            "cuLaunchKernel",
            "12000",
            "2",
            100,
            100,
            1,
        ),
        (
            "dlsym",
            "kernel_ptsz",
            "cuLaunchKernel",
            "12000",
            "2",
            100,
            100,
            1,
        ),
        ("gpa", "ex", "cuLaunchKernelEx", "12000", "0", 100, 100, 1),
        (
            "gpa",
            "ex_ptsz",
            "cuLaunchKernelEx",
            "12000",
            "2",
            100,
            100,
            1,
        ),
        (
            "gpa",
            "coop",
            "cuLaunchCooperativeKernel",
            "12000",
            "0",
            100,
            100,
            1,
        ),
        (
            "gpa",
            "coop_ptsz",
            "cuLaunchCooperativeKernel",
            "12000",
            "2",
            100,
            100,
            1,
        ),
        (
            "gpa",
            "graph50",
            "cuGraphAddKernelNode",
            "12000",
            "0",
            4,
            2500,
            50,
        ),
    ];
    let probe = sandbox(&[GPU0]);
    let mut ran = 0;
    for &(mode, entry, sym, ver, flags, n, blocks, kernels) in cases {
        if !driver_has(&probe, sym, ver, flags) {
            skip(format!(
                "every_entry_point_obeys_the_rate: {entry}: the fake driver has no {sym}"
            ));
            continue;
        }
        let sb = sandbox(&[GPU0]);
        set_rate(&sb, RATE, BURST);
        let per = blocks / kernels;
        let out = run_ok(
            &sb,
            mode,
            &[
                "ctx",
                "0",
                "launch",
                entry,
                &n.to_string(),
                &per.to_string(),
            ],
        );
        let (t0, t1, errors) = span(&out[1]);
        assert_eq!(errors, 0, "{entry}: launches failed");
        let total = n * blocks;
        assert_paced(&format!("{mode} {entry}"), t1 - t0, total, blocks);
        let g = &sb.region(CLAIM).gpus[0];
        assert_eq!(
            (g.blocks, g.launches),
            (total, n * kernels),
            "{mode} {entry}: the region's counters"
        );
        assert_eq!(
            ledger_blocks(&sb)[0],
            total,
            "{mode} {entry}: what the driver ran"
        );
        assert!(g.waited_ns > 0, "{mode} {entry}: no wait counted");
        ran += 1;
    }
    assert!(ran >= 2, "no entry point could be tested");
}

/// Three processes of one claim launching at once share its bucket: together they
/// take at least their total blocks over the rate.
#[test]
#[ignore = "needs root (unshare -m)"]
fn processes_of_a_claim_share_one_bucket() {
    if !require("processes_of_a_claim_share_one_bucket") {
        return;
    }
    let sb = sandbox(&[GPU0]);
    set_rate(&sb, RATE, BURST);
    let kids: Vec<_> = (0..3)
        .map(|_| {
            sb.command(
                &opts(),
                launch_client(),
                &["gpa", "ctx", "0", "launch", "kernel", "100", "40"],
            )
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn")
        })
        .collect();
    let spans: Vec<(u64, u64, u64)> = kids
        .into_iter()
        .map(|k| {
            let out = k.wait_with_output().expect("wait");
            assert!(out.status.success(), "{}", out.status);
            span(&lines(&out.stdout)[1])
        })
        .collect();
    let start = spans.iter().map(|s| s.0).min().unwrap_or(0);
    let end = spans.iter().map(|s| s.1).max().unwrap_or(0);
    assert!(spans.iter().all(|s| s.2 == 0));
    assert_paced("3 processes", end - start, 3 * 100 * 40, 40);
    let g = &sb.region(CLAIM).gpus[0];
    assert_eq!((g.blocks, g.launches), (12_000, 300));
}

/// Sixteen threads of one process launching at once: each has counters of its own,
/// none is lost, and together they obey the rate; unthrottled, the counts are exact
/// too.
#[test]
#[ignore = "needs root (unshare -m)"]
fn threads_of_a_process_are_counted_and_paced() {
    if !require("threads_of_a_process_are_counted_and_paced") {
        return;
    }
    let sb = sandbox(&[GPU0]);
    set_rate(&sb, 0, 0);
    let out = run_ok(&sb, "gpa", &["ctx", "0", "threads", "16", "20000", "3"]);
    assert_eq!(span(&out[1]).2, 0);
    let g = &sb.region(CLAIM).gpus[0];
    assert_eq!((g.blocks, g.launches), (16 * 20_000 * 3, 16 * 20_000));
    set_rate(&sb, RATE, BURST);
    let out = run_ok(&sb, "gpa", &["ctx", "0", "threads", "16", "25", "25"]);
    let (t0, t1, errors) = span(&out[1]);
    assert_eq!(errors, 0);
    assert_paced("16 threads", t1 - t0, 16 * 25 * 25, 25);
    let g = &sb.region(CLAIM).gpus[0];
    assert_eq!(g.blocks, 16 * 20_000 * 3 + 16 * 25 * 25);
    assert_eq!(ledger_blocks(&sb)[0], g.blocks, "what the driver ran");
}

/// A forked child counts its own launches (it starts its own flusher), and nothing
/// the parent launched before the fork is counted twice.
#[test]
#[ignore = "needs root (unshare -m)"]
fn a_forked_child_counts_its_own_launches() {
    if !require("a_forked_child_counts_its_own_launches") {
        return;
    }
    let sb = sandbox(&[GPU0]);
    set_rate(&sb, 0, 0);
    let out = run_ok(
        &sb,
        "gpa",
        &[
            "ctx", "0", "launch", "kernel", "1000", "7", "fork", "3000", "5", "launch", "kernel",
            "10", "7",
        ],
    );
    assert_eq!(out[2], "ok 0", "the child failed");
    let g = &sb.region(CLAIM).gpus[0];
    assert_eq!((g.blocks, g.launches), (1000 * 7 + 3000 * 5 + 10 * 7, 4010));
    assert_eq!(ledger_blocks(&sb)[0], g.blocks, "what the driver ran");
}

/// Rate 0 (the plugin's default) is unthrottled: 200 000 launches of 1000 blocks go
/// at the fake driver's speed (no launch waited: `waited_ns` is 0; the time is printed,
/// and only bounded far above a loaded machine's, where a rate of any size would
/// take 1000 s), and are still counted.
#[test]
#[ignore = "needs root (unshare -m)"]
fn rate_zero_is_unthrottled() {
    if !require("rate_zero_is_unthrottled") {
        return;
    }
    let sb = sandbox(&[GPU0]);
    set_rate(&sb, 0, 0);
    let out = run_ok(
        &sb,
        "gpa",
        &["ctx", "0", "launch", "kernel", "200000", "1000"],
    );
    let (t0, t1, errors) = span(&out[1]);
    assert_eq!(errors, 0);
    println!("rate 0: 200 000 launches in {} ms", (t1 - t0) / 1_000_000);
    assert!(
        t1 - t0 < 30_000_000_000,
        "rate 0 took {} ms",
        (t1 - t0) / 1_000_000
    );
    let g = &sb.region(CLAIM).gpus[0];
    assert_eq!(
        (g.blocks, g.launches, g.waited_ns),
        (200_000_000, 200_000, 0)
    );
}

/// A launch waiting in the bucket re-reads the rate: a client paced at 100 blocks/s
/// (40 s of work) finishes soon after the rate is raised (well within the 20 s it
/// would still take at the old rate, however loaded the machine); and lowering the rate
/// of an unthrottled claim paces its next launches.
#[test]
#[ignore = "needs root (unshare -m)"]
fn a_rate_change_applies() {
    if !require("a_rate_change_applies") {
        return;
    }
    let sb = sandbox(&[GPU0]);
    set_rate(&sb, 100, 10_000_000);
    let started = Instant::now();
    let child = sb
        .command(
            &opts(),
            launch_client(),
            &["gpa", "ctx", "0", "launch", "kernel", "400", "10"],
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    // Launching, and paced: its first launches are counted (the region is flushed every
    // few ms), so its next one waits in the bucket.
    let mid = loop {
        let blocks = sb.region(CLAIM).gpus[0].blocks;
        if blocks > 0 {
            break blocks;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the client never launched"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let raised = Instant::now();
    set_rate(&sb, 10_000_000, 0);
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success());
    let took = raised.elapsed();
    println!(
        "{mid} blocks launched at the old rate in {:?}; the rest {took:?} after the raise",
        raised - started
    );
    assert!(
        mid < 2000,
        "the old rate was not applied ({mid} blocks before the raise)"
    );
    assert!(
        took < Duration::from_secs(20),
        "still paced at the old rate: {took:?}"
    );
    assert_eq!(sb.region(CLAIM).gpus[0].blocks, 4000);
    // From unthrottled to paced: the next launches wait.
    set_rate(&sb, 0, 0);
    run_ok(&sb, "gpa", &["ctx", "0", "launch", "kernel", "1000", "10"]);
    set_rate(&sb, RATE, BURST);
    let out = run_ok(&sb, "gpa", &["ctx", "0", "launch", "kernel", "100", "100"]);
    let (t0, t1, _) = span(&out[1]);
    assert_paced("after the change", t1 - t0, 10_000, 100);
}

/// A process SIGKILLed while launching (and waiting in the bucket) leaves the bucket
/// usable: the next process is paced by the rate, not blocked.
#[test]
#[ignore = "needs root (unshare -m)"]
fn a_killed_process_leaves_the_bucket_usable() {
    if !require("a_killed_process_leaves_the_bucket_usable") {
        return;
    }
    let sb = sandbox(&[GPU0]);
    set_rate(&sb, RATE, BURST);
    let mut spin = sb
        .command(
            &opts(),
            launch_client(),
            &["gpa", "ctx", "0", "spin", "500"],
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    // Killed once a few of its launches are counted: each of 500 blocks exceeds the
    // 400-block burst, so from the second on it waits in the bucket (~25 ms a launch).
    let t = Instant::now();
    while sb.region(CLAIM).gpus[0].blocks < 4 * 500 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the spinning process launched only {} blocks",
            sb.region(CLAIM).gpus[0].blocks
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    spin.kill().expect("kill");
    let _ = spin.wait();
    let before = sb.region(CLAIM).gpus[0].blocks;
    let out = run_ok(&sb, "gpa", &["ctx", "0", "launch", "kernel", "100", "100"]);
    let (t0, t1, errors) = span(&out[1]);
    assert_eq!(errors, 0);
    // At most the killed process's last launch (25 ms) of debt is left over.
    assert_paced("after a SIGKILL", t1 - t0, 10_000, 100);
    assert!(
        sb.region(CLAIM).gpus[0].blocks >= before + 10_000,
        "the next process's launches were not counted"
    );
}

/// The throttled fast path (tokens available) and the unthrottled path make no system
/// call: 100 000 launches in a thread under a seccomp filter that kills the process at
/// any system call but exit(2). (`clock_gettime` goes through the vDSO; a clock source
/// without one would fail this.) The filter's own check: a launch that must wait
/// (sleeps) is killed.
#[test]
#[ignore = "needs root (unshare -m)"]
fn the_fast_paths_make_no_system_call() {
    if !require("the_fast_paths_make_no_system_call") {
        return;
    }
    let sb = sandbox(&[GPU0]);
    set_rate(&sb, 1000, 1_000_000);
    let out = run(&sb, "gpa", &["ctx", "0", "nosys", "100", "10"]);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSYS),
        "a waiting launch sleeps: the filter must have killed it ({})",
        out.status
    );
    for (rate, burst) in [(1_000_000_000u64, 1_000_000_000u64), (0, 0)] {
        let sb = sandbox(&[GPU0]);
        set_rate(&sb, rate, burst);
        let out = run(&sb, "gpa", &["ctx", "0", "nosys", "100000", "1"]);
        assert!(
            out.status.success(),
            "rate {rate}: the launch loop made a system call ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(lines(&out.stdout)[1], "ok 0", "rate {rate}");
        let g = &sb.region(CLAIM).gpus[0];
        assert_eq!((g.blocks, g.waited_ns), (100_010, 0), "rate {rate}");
    }
}

/// `cuLaunchCooperativeKernelMultiDevice` charges each device its own kernel: with
/// both GPUs in the claim at the same rate, the launches are paced by one device's
/// share, and each GPU's counters get their own blocks. (The library finds an entry's
/// device from its stream with `cuStreamGetDevice`, or `cuStreamGetCtx` and the
/// context's device; a driver with neither gets everything charged to the current
/// device.)
#[test]
#[ignore = "needs root (unshare -m)"]
fn multi_device_launches_charge_each_device() {
    if !require("multi_device_launches_charge_each_device") {
        return;
    }
    let sb = sandbox(&[GPU0, GPU1]);
    for sym in ["cuLaunchCooperativeKernelMultiDevice", "cuStreamCreate"] {
        if !driver_has(&sb, sym, "12000", "0") {
            skip(format!(
                "multi_device_launches_charge_each_device: the fake driver has no {sym}"
            ));
            return;
        }
    }
    // The fake driver answers both, as a 12.8+ driver does; the library asks
    // cuStreamGetDevice first.
    assert!(
        driver_has(&sb, "cuStreamGetDevice", "12080", "0")
            && driver_has(&sb, "cuStreamGetCtx", "9020", "0"),
        "the fake driver resolves a stream's device"
    );
    set_rate(&sb, RATE, BURST);
    let out = run_ok(&sb, "gpa", &["launch", "multi", "100", "100"]);
    let (t0, t1, errors) = span(&out[0]);
    assert_eq!(errors, 0);
    assert_eq!(ledger_blocks(&sb), [10_000, 10_000], "what the driver ran");
    let r = sb.region(CLAIM);
    assert_paced("multi-device", t1 - t0, 10_000, 100);
    assert_eq!(
        (r.gpus[0].blocks, r.gpus[1].blocks),
        (10_000, 10_000),
        "each device's kernel on its own bucket"
    );
}
