//! Prepare/unprepare latency through the real gRPC path: the in-process plugin
//! (`tessera::plugin::run`) on the mock node, a test kubelet over the Unix sockets, and
//! the fake API server. Reports percentiles next to the file system's fsync cost and
//! checks them against the targets; a miss is reported, never a failure.
//!
//! Directories live under `CARGO_TARGET_TMPDIR` (on disk, not a tmpfs `/tmp`), or
//! under `TESSERA_BENCH_DIR` when set (keep it short: socket paths must fit 108 bytes).

#[path = "../tests/support/harness.rs"]
mod harness;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use harness::{Harness, NODE};
use testkit::kubelet_standin::{DraClient, KubeletClaim};

const CLAIMS: usize = 1_000;
const GPUS: usize = 4;
const FSYNC_SAMPLES: usize = 200;
/// fsync pairs (file + directory) on the prepare path: checkpoint "started"
/// (`CheckpointStore::store`), the CDI spec (`SpecWriter::write`), checkpoint "completed";
/// each is `tessera_cdi::atomic::write_atomic` = file fsync, rename, directory fsync.
const PREPARE_FSYNC_PAIRS: u32 = 3;
const TARGET_P50: Duration = Duration::from_millis(1);
const TARGET_P99: Duration = Duration::from_millis(3);

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(bench());
}

async fn bench() {
    let parent = std::env::var_os("TESSERA_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    let h = Harness::new_in(&parent).await;
    let plugin = h.start_plugin().await;
    let k = h.kubelet().await;

    let setup = Instant::now();
    let mut claims = Vec::with_capacity(CLAIMS);
    for i in 0..CLAIMS {
        let gpu = format!("gpu-{}", i % GPUS);
        claims.push(
            h.allocated_claim(&format!("bench-{i}"), &[("gpu", NODE, &gpu, None)], &[])
                .await,
        );
    }
    println!(
        "setup: {CLAIMS} claims created and allocated in {:.1} s (not timed)",
        setup.elapsed().as_secs_f64()
    );

    // Claim i holds gpu-(i % 4) until claim i + 4 needs it: up to 4 claims prepared.
    let run = Instant::now();
    let mut prepare = Vec::with_capacity(CLAIMS);
    let mut unprepare = Vec::with_capacity(CLAIMS);
    for i in 0..CLAIMS {
        if i >= GPUS {
            unprepare.push(timed_unprepare(&k, &claims[i - GPUS]).await);
        }
        prepare.push(timed_prepare(&k, &claims[i]).await);
    }
    for c in &claims[CLAIMS - GPUS..] {
        unprepare.push(timed_unprepare(&k, c).await);
    }
    let run = run.elapsed();
    assert!(h.cdi_files().is_empty(), "CDI dir not empty after the run");
    plugin.stop().await;

    let state_dir = &h.opts.paths.state_dir;
    let (fs_type, mount_point) = file_system_of(state_dir);
    let fsync = measure_fsync(state_dir);

    println!(
        "prepare+unprepare of {CLAIMS} claims over {GPUS} GPUs in {:.1} s",
        run.as_secs_f64()
    );
    print_stats("prepare", &mut prepare);
    print_stats("unprepare", &mut unprepare);
    println!(
        "state dir: {} on {fs_type} (mounted at {})",
        state_dir.display(),
        mount_point.display()
    );
    print_stats("write 4 KiB + file fsync", &mut fsync.file.clone());
    print_stats("directory fsync", &mut fsync.dir.clone());
    let file_p50 = percentile(&mut fsync.file.clone(), 50.0);
    let dir_p50 = percentile(&mut fsync.dir.clone(), 50.0);
    let floor = (file_p50 + dir_p50) * PREPARE_FSYNC_PAIRS;
    println!(
        "fsync floor of prepare: {PREPARE_FSYNC_PAIRS} x (file {} + dir {}) = {} ({} fsyncs)",
        ms(file_p50),
        ms(dir_p50),
        ms(floor),
        2 * PREPARE_FSYNC_PAIRS
    );
    let p50 = percentile(&mut prepare, 50.0);
    let p99 = percentile(&mut prepare, 99.0);
    let beyond_p50 = p50.saturating_sub(floor);
    let beyond_p99 = p99.saturating_sub(floor);
    println!(
        "prepare beyond the floor: p50 {} (target <= {}: {}), p99 {} (target <= {}: {})",
        ms(beyond_p50),
        ms(TARGET_P50),
        verdict(beyond_p50 <= TARGET_P50),
        ms(beyond_p99),
        ms(TARGET_P99),
        verdict(beyond_p99 <= TARGET_P99),
    );
}

async fn timed_prepare(k: &DraClient, c: &KubeletClaim) -> Duration {
    let t = Instant::now();
    let resp = k.prepare_v1(std::slice::from_ref(c)).await;
    let d = t.elapsed();
    let resp = resp.expect("prepare call");
    assert_eq!(resp.claims[&c.uid].error, "", "prepare {}", c.name);
    d
}

async fn timed_unprepare(k: &DraClient, c: &KubeletClaim) -> Duration {
    let t = Instant::now();
    let resp = k.unprepare_v1(std::slice::from_ref(c)).await;
    let d = t.elapsed();
    let resp = resp.expect("unprepare call");
    assert_eq!(resp.claims[&c.uid].error, "", "unprepare {}", c.name);
    d
}

/// Nearest-rank percentile; sorts `v`.
fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort_unstable();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn print_stats(what: &str, v: &mut [Duration]) {
    let (p50, p90, p99) = (
        percentile(v, 50.0),
        percentile(v, 90.0),
        percentile(v, 99.0),
    );
    let max = v.last().copied().unwrap_or_default();
    println!(
        "{what:<26} n={:<5} p50 {:>9}  p90 {:>9}  p99 {:>9}  max {:>9}",
        v.len(),
        ms(p50),
        ms(p90),
        ms(p99),
        ms(max)
    );
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// The file system type and mount point holding `dir`: the mount (in
/// `/proc/self/mounts`, last one wins) whose mount point is the longest prefix of the
/// canonical path.
fn file_system_of(dir: &Path) -> (String, PathBuf) {
    let path = std::fs::canonicalize(dir).expect("canonical state dir");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut best: Option<(usize, String, PathBuf)> = None;
    for line in mounts.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_dev), Some(mp), Some(fs)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let mp = PathBuf::from(unescape_mount(mp));
        if path.starts_with(&mp) {
            let len = mp.as_os_str().len();
            if best.as_ref().is_none_or(|(l, ..)| len >= *l) {
                best = Some((len, fs.to_string(), mp));
            }
        }
    }
    best.map(|(_, fs, mp)| (fs, mp))
        .unwrap_or_else(|| ("unknown".into(), PathBuf::from("/")))
}

/// `/proc/self/mounts` escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(u8::is_ascii_digit));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct FsyncCost {
    /// Write 4 KiB to a fresh temp file and fsync it.
    file: Vec<Duration>,
    /// fsync the directory after renaming the temp file into place.
    dir: Vec<Duration>,
}

/// Replays the atomic-write pattern `FSYNC_SAMPLES` times in `dir`, timing the file
/// fsync (with its 4 KiB write) and the directory fsync separately.
fn measure_fsync(dir: &Path) -> FsyncCost {
    let tmp = dir.join(".bench-fsync.tmp");
    let target = dir.join("bench-fsync");
    let block = [0x5au8; 4096];
    let mut cost = FsyncCost {
        file: Vec::with_capacity(FSYNC_SAMPLES),
        dir: Vec::with_capacity(FSYNC_SAMPLES),
    };
    for _ in 0..FSYNC_SAMPLES {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .expect("open temp");
        let t = Instant::now();
        f.write_all(&block).expect("write");
        f.sync_all().expect("fsync file");
        cost.file.push(t.elapsed());
        drop(f);
        std::fs::rename(&tmp, &target).expect("rename");
        let t = Instant::now();
        File::open(dir)
            .and_then(|d| d.sync_all())
            .expect("fsync dir");
        cost.dir.push(t.elapsed());
    }
    let _ = std::fs::remove_file(&target);
    cost
}
