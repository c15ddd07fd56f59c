//! The simulated GPU (tests/fakes/fakesim.h) on its own, without the interception
//! library: processes of `sim_client` load the fake driver directly, share one GPU
//! through the simulator's state file, and are judged by the simulator's timeline
//! (`testkit::interpose::timeline`) and the fake driver's ledger; the fake NVML is read through
//! `sim_client nvml`.
//!
//! The tests run one at a time (they measure wall-clock shares on a 2-core machine)
//! and need no root. The simulated GPU runs on the real clock and its clients need the
//! CPU to relaunch: on a loaded machine their wake-ups come late, the GPU idles more
//! and a late client loses turns. So what the tests assert is either exact (the
//! accounting, the order of kernels, NVML's samples against the timeline they are
//! computed from) or bounded far outside what load does (GPU busy at least half the
//! time, shares within 10 points), with the figures printed; a broken model (a client
//! that sleeps past its kernel, no round-robin, spinning clients) lands far beyond.

use testkit::interpose as support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use support::timeline::{SECOND, Timeline, consecutive, now_ns};
use support::{GPU0, GPU1, MIB, artifacts, fake_nvml, lines, sim_env};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const GPU_BYTES: u64 = 80 << 30;

/// A simulated node: GPUs, the simulator's state file and log, a ledger, and a state
/// dir for the fake NVML.
struct Sim {
    dir: tempfile::TempDir,
    devices: Vec<(String, u64)>,
}

/// A sim_client's final line.
#[derive(Debug, Clone, Copy)]
struct Done {
    pid: u32,
    launches: u64,
    kernels: u64,
    blocks: u64,
    cpu_us: u64,
}

impl Sim {
    fn new(gpus: &[&str]) -> Self {
        artifacts(); // built now, not inside a test's measured time
        let dir = tempfile::tempdir().expect("temp dir");
        let mut ledger = vec![0u8; support::LEDGER_SIZE];
        ledger[..8].copy_from_slice(b"FAKECUDA");
        std::fs::write(dir.path().join("ledger"), ledger).expect("ledger");
        Sim {
            dir,
            devices: gpus.iter().map(|u| (u.to_string(), GPU_BYTES)).collect(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn timeline(&self) -> Timeline {
        Timeline::read(&self.path("log")).expect("timeline log")
    }

    /// `program args` on this node, on the simulated GPU with tag `tag`.
    fn command(&self, program: &Path, args: &[&str], tag: u32) -> Command {
        let devices: Vec<String> = self
            .devices
            .iter()
            .map(|(u, b)| format!("{u}:{b}"))
            .collect();
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("LD_LIBRARY_PATH", &artifacts().fake_dir)
            .env("FAKE_CUDA_DEVICES", devices.join(","))
            .env("FAKE_CUDA_LEDGER", self.path("ledger"))
            .env("FAKE_SIM_SEED", "7")
            .env("TESSERA_FAKE_NVML_STATE_DIR", self.path("nvml"))
            .envs(sim_env(&self.path("sim"), &self.path("log"), tag))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn spawn(&self, tag: u32, args: &[&str]) -> Child {
        self.command(&artifacts().sim_client, args, tag)
            .spawn()
            .expect("spawn sim_client")
    }

    /// The fake NVML's answer (`sim_client nvml ...`), with or without
    /// FAKE_CUDA_DEVICES in its environment.
    fn nvml(&self, args: &[&str], with_devices: bool) -> Vec<String> {
        let mut full = vec!["nvml"];
        full.extend_from_slice(args);
        let mut cmd = self.command(&artifacts().sim_client, &full, 0);
        if !with_devices {
            cmd.env_remove("FAKE_CUDA_DEVICES");
        }
        let out = cmd.output().expect("run the NVML probe");
        assert!(
            out.status.success(),
            "nvml {args:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        lines(&out.stdout)
    }

    /// Blocks the fake driver counted for `pid` on ledger device `dev`.
    fn ledger_blocks(&self, pid: u32, dev: usize) -> Option<u64> {
        let b = std::fs::read(self.path("ledger")).expect("ledger");
        let rd = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        (0..256)
            .find(|r| rd(4096 + 128 * r) != 0 && rd(4096 + 128 * r + 72) == pid as u64)
            .map(|r| rd(36864 + 64 * r + 8 * dev))
    }
}

/// Waits for a sim_client and parses its final line.
fn finish(child: Child) -> Done {
    let out = child.wait_with_output().expect("wait for sim_client");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "sim_client failed ({}):\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let last = text.lines().last().unwrap_or_default();
    let f: Vec<&str> = last.split_whitespace().collect();
    assert_eq!(f.len(), 10, "final line: {last:?}");
    let n = |i: usize| f[i].parse::<u64>().unwrap_or_else(|_| panic!("{last:?}"));
    Done {
        pid: n(1) as u32,
        launches: n(3),
        kernels: n(5),
        blocks: n(7),
        cpu_us: n(9),
    }
}

/// The timeline agrees with what a client says it launched: every kernel ran (the
/// client synchronised before exiting), with its blocks' worth of GPU time, and the
/// fake driver's ledger counted its blocks.
fn check_accounting(sim: &Sim, t: &Timeline, d: &Done, gpus: &[u32], block_ns: u64) {
    let mine: Vec<_> = t
        .intervals
        .iter()
        .filter(|i| i.pid == d.pid && gpus.contains(&i.gpu))
        .collect();
    assert_eq!(
        mine.len() as u64,
        d.kernels,
        "kernels of {d:?} in the timeline"
    );
    let busy: u64 = mine.iter().map(|i| i.end - i.start).sum();
    assert_eq!(busy, d.blocks * block_ns, "busy time of {d:?}");
    let counted: u64 = gpus
        .iter()
        .map(|&g| sim.ledger_blocks(d.pid, g as usize).expect("ledger record"))
        .sum();
    assert_eq!(counted, d.blocks, "ledger blocks of {d:?}");
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// (a) Two equal launch-then-synchronize loops share the GPU evenly, and keep it busy.
#[test]
fn equal_loops_share_the_gpu_evenly_and_keep_it_busy() {
    let _s = serial();
    let sim = Sim::new(&[GPU0]);
    let t0 = now_ns();
    let kids = [
        sim.spawn(1, &["loop", "1", "3", "min=0.5", "max=2", "tail=0"]),
        sim.spawn(2, &["loop", "2", "3", "min=0.5", "max=2", "tail=0"]),
    ];
    let done: Vec<Done> = kids.into_iter().map(finish).collect();
    let t = sim.timeline();
    assert_eq!(t.overlaps(0), 0, "one kernel at a time");
    for d in &done {
        check_accounting(&sim, &t, d, &[0], 1000);
    }
    let windows = t.windows(0, &consecutive(t0 + SECOND / 2, SECOND, 2));
    for w in &windows {
        println!(
            "window: tag1 {} tag2 {} busy {}",
            pct(w.share(1)),
            pct(w.share(2)),
            pct(w.utilization())
        );
        // Each process runs every other kernel; kernels of 0.5-2 ms (mean 1.08 ms) give
        // ~460 kernels each per second, a share within ~1 point of 50% (2 on a loaded
        // machine; without round-robin one loop would take the GPU).
        assert!(
            (w.share(1) - 0.5).abs() <= 0.10,
            "share {}",
            pct(w.share(1))
        );
        // A synchroniser wakes at its kernel's projected end and relaunches while the
        // other's kernel (>= 0.5 ms) runs: no idle gaps beyond wake-up misses (over 95 %
        // busy on an idle machine, 85-90 % on a loaded one; a client that slept past its
        // kernel's end by a few ms would leave the GPU idle most of the time).
        assert!(w.utilization() >= 0.5, "GPU busy {}", pct(w.utilization()));
    }
}

/// (b) Round-robin at kernel boundaries: 10 ms kernels against 1 ms kernels, both
/// keeping their queues full, get the model's 10:1.
#[test]
fn round_robin_gives_long_kernels_their_length_ratio() {
    let _s = serial();
    let sim = Sim::new(&[GPU0]);
    let t0 = now_ns();
    let long = sim.spawn(
        1,
        &["burst", "1", "3", "min=10", "max=10", "tail=0", "burst=50"],
    );
    let short = sim.spawn(
        2,
        &["burst", "2", "3", "min=1", "max=1", "tail=0", "burst=50"],
    );
    let (long, short) = (finish(long), finish(short));
    let t = sim.timeline();
    check_accounting(&sim, &t, &long, &[0], 1000);
    check_accounting(&sim, &t, &short, &[0], 1000);
    // While both have work: from the later first kernel to the earlier last one (on a
    // loaded machine one client may start or end a good part of a second before the
    // other, and runs alone then).
    let first = |pid: u32| t.on_gpu(0).filter(|i| i.pid == pid).map(|i| i.start).min();
    let last = |pid: u32| t.on_gpu(0).filter(|i| i.pid == pid).map(|i| i.end).max();
    let from = first(long.pid).max(first(short.pid)).unwrap();
    let to = last(long.pid).min(last(short.pid)).unwrap();
    let w = t.window(0, from, to);
    let ratio = w.tag_ns(1) as f64 / w.tag_ns(2) as f64;
    let mut seq: Vec<_> = t
        .on_gpu(0)
        .filter(|i| i.start >= from && i.end <= to)
        .collect();
    seq.sort_by_key(|i| i.start);
    let same = seq.windows(2).filter(|p| p[0].pid == p[1].pid).count();
    println!(
        "10 ms : 1 ms busy ratio {ratio:.2} over {:.2} s from {:.2} s, GPU busy {}, {same} of \
         {} consecutive pairs from one process",
        (to - from) as f64 / 1e9,
        from.saturating_sub(t0) as f64 / 1e9,
        pct(w.utilization()),
        seq.len()
    );
    // One 10 ms kernel per 1 ms kernel; a burst boundary (every 50 turns, ~0.55 s)
    // may let one side run a kernel or two alone, and a late refill more on a loaded
    // machine; a first-come order would give whole bursts in turn.
    assert!((7.0..=14.0).contains(&ratio), "ratio {ratio:.2}");
    // Alternation: consecutive kernels of one process only around burst boundaries and
    // late refills (a few per boundary; whole bursts in turn would make nearly all).
    assert!(
        same * 10 <= seq.len(),
        "{same} of {} consecutive pairs from one process",
        seq.len()
    );
}

/// (c) The fake NVML's per-process smUtil is the timeline's busy share of the second
/// before each sample's tick, within the +-3 points of noise (and the GPU utilisation
/// follows the GPU's busy time).
#[test]
fn nvml_process_utilization_tracks_the_timeline() {
    let _s = serial();
    let sim = Sim::new(&[GPU0]);
    fake_nvml(&sim.path("nvml"), &sim.devices);
    let t0 = now_ns();
    let a = sim.spawn(1, &["loop", "1", "3.5", "min=3", "max=3", "tail=0"]);
    let b = sim.spawn(2, &["loop", "2", "3.5", "min=1", "max=1", "tail=0"]);
    let probe = sim
        .command(
            &artifacts().sim_client,
            &["nvml", "util", "3.3", "100", "0"],
            0,
        )
        .spawn()
        .expect("spawn the NVML probe");
    let out = probe.wait_with_output().expect("NVML probe");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (a, b) = (finish(a), finish(b));
    let t = sim.timeline();
    let mut devs: Vec<i64> = Vec::new();
    let mut truth_by_pid = std::collections::BTreeMap::<u32, Vec<f64>>::new();
    let mut gpu_checked = 0;
    for l in lines(&out.stdout) {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f[..] {
            ["sample", pid, ts, sm] => {
                let (pid, ts_ns, sm) = (
                    pid.parse::<u32>().unwrap(),
                    ts.parse::<u64>().unwrap() * 1000,
                    sm.parse::<i64>().unwrap(),
                );
                assert!(pid == a.pid || pid == b.pid, "unknown pid in {l}");
                let w = t.window(0, ts_ns - SECOND, ts_ns);
                let truth = 100.0 * w.pid_ns(pid) as f64 / SECOND as f64;
                // Noise is an integer in [-3, 3] on top of the rounded truth; the
                // sample's microsecond timestamp moves the window by < 1 us.
                assert!(
                    (sm as f64 - truth).abs() <= 3.5 + 1e-3,
                    "sample {l}: smUtil {sm} vs timeline {truth:.2}"
                );
                devs.push(sm - truth.round() as i64);
                if ts_ns >= t0 + 3 * SECOND / 2 && ts_ns <= t0 + 3 * SECOND {
                    truth_by_pid.entry(pid).or_default().push(truth);
                }
            }
            ["gpu", now_us, util] => {
                let now = now_us.parse::<u64>().unwrap() * 1000;
                let util = util.parse::<f64>().unwrap();
                // A whole second of load behind the latest tick (tick k at k/6 s of the
                // clock): the GPU's busy share of that second, within the noise. The
                // probe printed `now` after its query, so the query's tick is the last
                // one at or before `now`, or the one before.
                if now >= t0 + 3 * SECOND / 2 && now <= t0 + 3 * SECOND {
                    // fakesim.h's fakesim_tick_of and fakesim_tick_ns.
                    let half = SECOND / 2;
                    let (q, r) = (now / half, now % half);
                    let k = 3 * q + u64::from(r >= 333_333_333) + u64::from(r >= 166_666_666);
                    let truth = |k: u64| {
                        let tick = k / 3 * half + (k % 3) * half / 3;
                        100.0 * t.window(0, tick - SECOND, tick).gpu_ns as f64 / SECOND as f64
                    };
                    let (last, before) = (truth(k), truth(k - 1));
                    assert!(
                        (util - last).abs() <= 3.5 + 1e-3 || (util - before).abs() <= 3.5 + 1e-3,
                        "GPU utilization {util} at {l}: timeline {last:.2} (or {before:.2})"
                    );
                    gpu_checked += 1;
                }
            }
            _ => panic!("unexpected probe line {l:?}"),
        }
    }
    let n = devs.len();
    let mean = devs.iter().sum::<i64>() as f64 / n as f64;
    let mut distinct = devs.clone();
    distinct.sort();
    distinct.dedup();
    // 3 ms against 1 ms kernels, alternating: 75% and 25% of the GPU's busy time.
    let w = t.window(0, t0 + 3 * SECOND / 2, t0 + 3 * SECOND);
    let share = |pid: u32| 100.0 * w.pid_ns(pid) as f64 / w.gpu_ns as f64;
    println!(
        "{n} samples, noise mean {mean:.2}, values {distinct:?}; truth by pid {:?}; \
         shares of busy time {:.1} / {:.1} %, GPU busy {}",
        truth_by_pid
            .iter()
            .map(|(p, v)| (p, v.iter().sum::<f64>() / v.len() as f64))
            .collect::<Vec<_>>(),
        share(a.pid),
        share(b.pid),
        pct(w.utilization())
    );
    // About 20 ticks in the probe's 3.3 s, two samples each; a probe held up on a
    // loaded machine may miss a tick or two.
    assert!(
        n >= 24,
        "only {n} samples (ticks every 1/6 s, two processes)"
    );
    assert!(
        distinct.len() >= 4,
        "noise takes several values: {distinct:?}"
    );
    // Uniform on [-3, 3]: the mean of 24 or more is within 2 at about 5 standard
    // deviations; a noise biased by a point or two would not be.
    assert!(mean.abs() <= 2.0, "noise is centred: mean {mean:.2}");
    assert!(
        gpu_checked >= 5,
        "{gpu_checked} GPU utilization polls checked"
    );
    // Within 10 points (a late client loses turns on a loaded machine; without
    // round-robin by kernel the split would not follow the kernels' lengths).
    assert!(
        (share(a.pid) - 75.0).abs() <= 10.0,
        "A's share {:.1}",
        share(a.pid)
    );
    assert!(
        (share(b.pid) - 25.0).abs() <= 10.0,
        "B's share {:.1}",
        share(b.pid)
    );
}

/// A process that allocates on `dev` and holds it; returns once it holds.
fn holder(sim: &Sim, dev: u32, bytes: u64) -> Child {
    let dev = dev.to_string();
    let bytes = bytes.to_string();
    let mut child = sim
        .command(
            &artifacts().client,
            &["dlsym", "ctx", &dev, "alloc", &bytes, "hold"],
            0,
        )
        .spawn()
        .expect("spawn cuda_client");
    let mut r = BufReader::new(child.stdout.take().expect("stdout"));
    let mut seen = Vec::new();
    loop {
        let mut l = String::new();
        if r.read_line(&mut l).unwrap_or(0) == 0 {
            panic!("holder exited: {seen:?}");
        }
        seen.push(l.trim_end().to_string());
        if seen.last().map(String::as_str) == Some("holding") {
            break;
        }
    }
    assert_eq!(seen, ["ok", "ok 0", "holding"]);
    child
}

/// (d) nvmlDeviceGetComputeRunningProcesses_v3 lists the ledger's records with bytes
/// on the GPU, by UUID, live or dead, and memory info's `used` is the ledger's.
#[test]
fn running_processes_are_the_ledgers_pids_and_bytes() {
    let _s = serial();
    let sim = Sim::new(&[GPU0, GPU1]);
    // NVML enumerates the GPUs in the other order: only UUIDs can map them.
    let reversed: Vec<(String, u64)> = sim.devices.iter().rev().cloned().collect();
    fake_nvml(&sim.path("nvml"), &reversed);
    let mut a = holder(&sim, 0, 6 * MIB);
    let mut b = holder(&sim, 1, 10 * MIB);
    let mut gone = holder(&sim, 0, 3 * MIB + 1);
    let gone_pid = gone.id();
    gone.kill().expect("SIGKILL");
    gone.wait().expect("reap");
    let procs = |index: &str| {
        let mut v: Vec<(u32, u64, String)> = sim
            .nvml(&["procs", index], false)
            .iter()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                assert_eq!(f.len(), 5, "{l}");
                assert_eq!(f[0], "proc");
                (
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                    format!("{} {}", f[3], f[4]),
                )
            })
            .collect();
        v.sort();
        v
    };
    let not_mig = "4294967295 4294967295".to_string();
    // NVML index 1 is GPU0 (ledger device 0).
    let mut want0 = vec![
        (a.id(), 6 * MIB, not_mig.clone()),
        (gone_pid, 4 * MIB, not_mig.clone()),
    ];
    want0.sort();
    assert_eq!(
        procs("1"),
        want0,
        "GPU0: a live holder and a dead one's memory"
    );
    assert_eq!(procs("0"), vec![(b.id(), 10 * MIB, not_mig)], "GPU1");
    let mem = sim.nvml(&["mem", "1"], true);
    assert_eq!(
        mem,
        [format!(
            "mem {GPU_BYTES} {} {}",
            GPU_BYTES - 10 * MIB,
            10 * MIB
        )]
    );
    for c in [&mut a, &mut b] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// (e) A SIGKILLed process's pending kernels vanish (only the kernel running when it
/// died completes), and the GPU keeps serving the others.
#[test]
fn killed_process_kernels_vanish_and_the_gpu_serves_the_rest() {
    let _s = serial();
    let sim = Sim::new(&[GPU0]);
    let t0 = now_ns();
    // 40 kernels of 50 ms per burst: 2 s of queued work, alternating with 2 ms kernels.
    let mut victim = sim.spawn(
        1,
        &["burst", "1", "10", "min=50", "max=50", "tail=0", "burst=40"],
    );
    let survivor = sim.spawn(2, &["loop", "2", "3", "min=2", "max=2", "tail=0"]);
    let victim_pid = victim.id();
    // Killed once it has run a few kernels (about 0.5 s in on an idle machine), with
    // most of its 40 still queued.
    let started = std::time::Instant::now();
    let ran_yet = || {
        Timeline::read(&sim.path("log"))
            .map_or(0, |t| t.on_gpu(0).filter(|i| i.pid == victim_pid).count())
    };
    while ran_yet() < 8 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the victim never ran"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    victim.kill().expect("SIGKILL");
    victim.wait().expect("reap");
    let killed = now_ns();
    let survivor = finish(survivor);
    let t = sim.timeline();
    check_accounting(&sim, &t, &survivor, &[0], 1000);
    let v: Vec<_> = t.on_gpu(0).filter(|i| i.pid == victim_pid).collect();
    let ran = v.len();
    println!("victim ran {ran} of its 40 queued kernels");
    assert!(ran >= 5, "the victim ran before it was killed: {ran}");
    assert!(ran < 40, "its pending kernels vanished: {ran} ran");
    for i in &v {
        assert!(
            i.start < killed,
            "a victim kernel started after its death: {i:?}"
        );
    }
    assert_eq!(t.overlaps(0), 0);
    let end = t.on_gpu(0).map(|i| i.end).max().unwrap();
    let w = t.window(0, killed + SECOND / 10, end - SECOND / 10);
    println!(
        "after the kill: GPU busy {}, survivor {}",
        pct(w.utilization()),
        pct(w.share(2))
    );
    assert_eq!(w.tag_ns(1), 0, "no victim work after its last kernel");
    // A GPU stuck behind the dead process's kernels (1.5 s of them queued) would sit
    // idle; the survivor's own launch-then-synchronize gaps depend on the CPU it gets
    // (its busy share drops to 40 % under load), so the test bounds the longest idle
    // gap after the kill, not the busy time: a few ms normally, 1 s bounds it.
    let mut after: Vec<_> = t.on_gpu(0).filter(|i| i.end > killed).collect();
    after.sort_by_key(|i| i.start);
    let gap = after
        .windows(2)
        .map(|p| p[1].start.saturating_sub(p[0].end))
        .max()
        .unwrap_or(0);
    println!(
        "killed {} ms after the start; longest idle gap after it {:.1} ms",
        (killed - t0) / 1_000_000,
        gap as f64 / 1e6
    );
    assert!(
        after.len() >= 10,
        "the survivor ran on: {} kernels",
        after.len()
    );
    assert!(gap < SECOND, "the GPU sat idle {gap} ns after the kill");
}

/// Six launch-then-synchronize loops with 0.05-2 ms kernels keep the GPU busy and
/// share it evenly, while the six processes together use little CPU (they sleep
/// until their kernel's projected end instead of spinning).
#[test]
fn six_loops_share_evenly_at_low_cpu() {
    let _s = serial();
    let sim = Sim::new(&[GPU0]);
    let t0 = now_ns();
    let kids: Vec<Child> = (1..=6)
        .map(|k| {
            let seed = k.to_string();
            sim.spawn(k, &["loop", &seed, "3", "min=0.05", "max=2", "tail=0"])
        })
        .collect();
    let done: Vec<Done> = kids.into_iter().map(finish).collect();
    let t = sim.timeline();
    for d in &done {
        check_accounting(&sim, &t, d, &[0], 1000);
    }
    let cpu: u64 = done.iter().map(|d| d.cpu_us).sum();
    let w = t.window(0, t0 + SECOND / 2, t0 + 5 * SECOND / 2);
    let shares: Vec<String> = (1..=6).map(|k| pct(w.share(k))).collect();
    println!(
        "6 loops: CPU {:.1} ms in 3 s, GPU busy {}, shares {shares:?}",
        cpu as f64 / 1e3,
        pct(w.utilization())
    );
    // 2 cores x 3 s = 6 s of CPU; sleeping clients take 200-250 ms of it, spinning
    // ones would take seconds: 1 s bounds it, whatever the load.
    assert!(cpu <= 1_000_000, "CPU {cpu} us");
    // Over 90 % busy and shares within 2 points on an idle machine; a loaded one makes
    // wake-ups late (a late client loses turns).
    assert!(w.utilization() >= 0.5, "GPU busy {}", pct(w.utilization()));
    for k in 1..=6 {
        assert!(
            (w.share(k) - 1.0 / 6.0).abs() <= 0.08,
            "share of {k}: {}",
            pct(w.share(k))
        );
    }
}

/// Every launch entry point puts its kernels on the simulated GPU: the ex, coop and
/// ptsz variants, graphs of 50 kernel nodes, the heavy-tail mix, and the multi-device
/// cooperative launch (one kernel per GPU).
#[test]
fn every_launch_entry_point_reaches_the_gpu() {
    let _s = serial();
    let sim = Sim::new(&[GPU0, GPU1]);
    let mut idle_active = 0;
    for (work, gpus, extra) in [
        ("ex", vec![0u32], vec!["min=0.2", "max=0.5"]),
        ("coop", vec![0], vec!["min=0.2", "max=0.5"]),
        ("ptsz", vec![0], vec!["min=0.2", "max=0.5"]),
        ("graph50", vec![1], vec!["1"]),
        ("loop", vec![1], vec!["1", "load=dlsym"]),
        ("burst", vec![0], vec!["burst=20"]),
        // 300 launches without a synchronisation: the 257th waits for a queue slot.
        (
            "burst",
            vec![1],
            vec!["1", "burst=300", "min=0.05", "max=0.1", "tail=0"],
        ),
        (
            "idle-active",
            vec![0],
            vec!["active=0.1", "idle=0.2", "min=0.2", "max=0.5", "tail=0"],
        ),
        ("multidev", vec![0, 1], vec!["min=0.2", "max=0.5"]),
    ] {
        let mut args = vec![work, "5", "0.4"];
        args.extend(extra);
        let d = finish(sim.spawn(9, &args));
        assert!(d.launches > 0, "{work}: {d:?}");
        if work == "idle-active" {
            idle_active = d.pid;
        }
        let per_launch = match work {
            "graph50" => 50,
            "multidev" => 2,
            _ => 1,
        };
        assert_eq!(d.kernels, per_launch * d.launches, "{work}: {d:?}");
        let t = sim.timeline();
        check_accounting(&sim, &t, &d, &gpus, 1000);
        for g in [0, 1] {
            let n = t.on_gpu(g).filter(|i| i.pid == d.pid).count();
            assert_eq!(n > 0, gpus.contains(&g), "{work} on GPU {g}: {n} kernels");
        }
        println!("{work}: {d:?}");
    }
    let t = sim.timeline();
    assert_eq!((t.overlaps(0), t.overlaps(1)), (0, 0));
    // idle-active went idle for 0.2 s between its two active phases.
    let idle = t
        .on_gpu(0)
        .filter(|i| i.pid == idle_active)
        .collect::<Vec<_>>()
        .windows(2)
        .map(|p| p[1].start.saturating_sub(p[0].end))
        .max()
        .unwrap_or(0);
    // At least 0.2 s, less the end of the last kernel launched before the idle phase
    // (<= 0.5 ms): a sleep is never short. Plus the wake-up after it: a few ms, more on
    // a loaded machine, so the bound above is 0.5 s (the gap is printed).
    println!("idle-active: longest gap {:.1} ms", idle as f64 / 1e6);
    assert!(
        (19 * SECOND / 100..SECOND / 2).contains(&idle),
        "longest gap {idle} ns"
    );
}

/// The timeline splits intervals across window edges.
#[test]
fn timeline_splits_intervals_at_window_edges() {
    let mut log = Vec::new();
    for (pid, tag, s, e) in [
        (7u32, 1u32, 0u64, 150u64),
        (8, 2, 150, 260),
        (7, 1, 300, 400),
    ] {
        for v in [0u32, pid, tag, 0] {
            log.extend_from_slice(&v.to_le_bytes());
        }
        log.extend_from_slice(&s.to_le_bytes());
        log.extend_from_slice(&e.to_le_bytes());
    }
    log.extend_from_slice(&[1, 2, 3]); // a record being written
    let t = Timeline::parse(&log);
    assert_eq!(t.intervals.len(), 3);
    let w = t.windows(0, &consecutive(100, 100, 3));
    assert_eq!(w[0].gpu_ns, 100);
    assert_eq!((w[0].tag_ns(1), w[0].tag_ns(2)), (50, 50));
    assert_eq!((w[1].gpu_ns, w[1].tag_ns(2)), (60, 60));
    assert_eq!((w[2].gpu_ns, w[2].pid_ns(7)), (100, 100));
    assert!((w[0].share(1) - 0.5).abs() < 1e-9);
    assert!((w[2].utilization() - 1.0).abs() < 1e-9);
    assert_eq!(t.overlaps(0), 0);
}
