//! Prepare/unprepare latency through the real gRPC path, per kind of claim: whole GPUs,
//! shares of the mock node's shared GPU (gpu-1, with their claim files), and MIG
//! partitions of its H100 (gpu-0). The in-process plugin (`tessera::plugin::run`) runs
//! on the mock node with a test kubelet over the Unix sockets and the fake API server.
//! Claims are allocated as the kube-scheduler would, by `tessera plan`'s model of it
//! (`k8s_model::schedule`) over the slices the plugin published, with releases
//! interleaved: a share gets its own shareID and consumedCapacity, a MIG claim a free
//! placement. Reports percentiles per kind next to the file system's fsync cost and
//! checks whole-GPU prepare against its targets; a miss is reported, never a failure.
//!
//! `TESSERA_BENCH_QUICK=1` (CI) runs a few claims per kind and judges no target.
//! Directories live under `CARGO_TARGET_TMPDIR` (on disk, not a tmpfs `/tmp`), or
//! under `TESSERA_BENCH_DIR` when set (keep it short: socket paths must fit 108 bytes).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_model::schedule::{self, Outcome, Step};
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use testkit::harness::{self, Harness};
use testkit::kubelet_standin::{DraClient, KubeletClaim};

const CLAIMS: usize = 1_000;
const QUICK_CLAIMS: usize = 12;
const FSYNC_SAMPLES: usize = 200;
const QUICK_FSYNC_SAMPLES: usize = 20;
/// fsync pairs (file + directory) on the whole-GPU prepare path: checkpoint "started"
/// (`CheckpointStore::store`), the CDI spec (`SpecWriter::write`), checkpoint "completed";
/// each is `tessera_cdi::atomic::write_atomic` = file fsync, rename, directory fsync.
const PREPARE_FSYNC_PAIRS: u32 = 3;
const TARGET_P50: Duration = Duration::from_millis(1);
const TARGET_P99: Duration = Duration::from_millis(3);

/// One kind of claim: the request a user writes, and how many such claims are held
/// (prepared) at once: claim i is unprepared, and released, before claim i + `held` is
/// allocated and prepared.
struct Kind {
    name: &'static str,
    /// The `exactly` of the claim's one request, `gpu`.
    request: &'static str,
    held: usize,
}

const KINDS: [Kind; 3] = [
    // The mock node's whole GPUs: gpu-0 (the H100 in `mig` mode, whole while no
    // partition is taken), gpu-2 and gpu-3 (T4s).
    Kind {
        name: "whole",
        request: "{deviceClassName: gpu.tessera.dev}",
        held: 3,
    },
    // Four shares of gpu-1 at once: 4 x 16 GiB of its 79.6 GiB, 4 x 20 % compute.
    Kind {
        name: "shared",
        request: "{deviceClassName: shared.tessera.dev, capacity: {requests: {memory: 16Gi, compute: '20'}}}",
        held: 4,
    },
    // Four 1g.10gb partitions of gpu-0 at once (it has seven placements).
    Kind {
        name: "mig",
        request: r#"{deviceClassName: mig.tessera.dev, selectors: [{cel: {expression: 'device.attributes["gpu.tessera.dev"].profile == "1g.10gb"'}}]}"#,
        held: 4,
    },
];

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(bench());
}

/// A user's claim of `kind`, named `name`, parsed from YAML.
fn claim(kind: &Kind, name: &str) -> ResourceClaim {
    let yaml = format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}, namespace: {}}}\n\
         spec: {{devices: {{requests: [{{name: gpu, exactly: {}}}]}}}}\n",
        harness::NS,
        kind.request
    );
    serde_yaml_ng::from_str(&yaml).expect("bench claim")
}

/// The allocation results of `n` claims of `kind`, from the scheduler model over
/// the published `slices`: allocate claim i after releasing claim i - `held`.
fn schedule_kind(
    h: &Harness,
    slices: &[k8s_openapi::api::resource::v1::ResourceSlice],
    kind: &Kind,
    n: usize,
) -> Vec<(String, Vec<DeviceRequestAllocationResult>)> {
    let name = |i: usize| format!("bench-{}-{i}", kind.name);
    let mut steps = Vec::with_capacity(2 * n);
    for i in 0..n {
        if i >= kind.held {
            steps.push(Step::Release(vec![(
                harness::NS.to_string(),
                name(i - kind.held),
            )]));
        }
        steps.push(Step::Allocate(Box::new(claim(kind, &name(i)))));
    }
    let classes = tessera::device_classes::read(None).expect("built-in classes");
    let plan = schedule::run(slices, &classes, &steps, h.api.gates()).expect("plan");
    plan.outcomes
        .into_iter()
        .filter_map(|o| match o {
            Outcome::Allocated(c) => {
                let results = c
                    .status
                    .and_then(|s| s.allocation)
                    .and_then(|a| a.devices)
                    .and_then(|d| d.results)
                    .expect("allocation results");
                Some((c.metadata.name.expect("name"), results))
            }
            Outcome::Failed { claim, reason } => panic!(
                "{}: the scheduler model could not allocate {:?}: {reason}",
                kind.name, claim.metadata.name
            ),
            Outcome::Released { .. } => None,
        })
        .collect()
}

/// One kind's figures.
struct Figures {
    kind: &'static str,
    prepare: Vec<Duration>,
    unprepare: Vec<Duration>,
    run: Duration,
    devices: Vec<String>,
}

async fn bench() {
    let quick = std::env::var_os("TESSERA_BENCH_QUICK").is_some();
    let (claims, fsync_samples) = if quick {
        (QUICK_CLAIMS, QUICK_FSYNC_SAMPLES)
    } else {
        (CLAIMS, FSYNC_SAMPLES)
    };
    if quick {
        println!("quick mode (TESSERA_BENCH_QUICK): {claims} claims per kind, targets not judged");
    }
    let parent = std::env::var_os("TESSERA_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    let h = Harness::new_in(&parent).await;
    let plugin = h.start_plugin().await;
    let mut slices = Vec::new();
    harness::wait_until("the published pool", || {
        slices = h.api.resource_slices();
        slices
            .first()
            .is_some_and(|f| slices.len() as i64 == f.spec.pool.resource_slice_count)
    })
    .await;
    let k = h.kubelet().await;

    let mut all = Vec::new();
    for kind in &KINDS {
        let setup = Instant::now();
        let mut planned = Vec::with_capacity(claims);
        let mut devices = std::collections::BTreeSet::new();
        for (name, results) in schedule_kind(&h, &slices, kind, claims) {
            devices.extend(results.iter().map(|r| r.device.clone()));
            planned.push(h.allocated_claim_with(&name, results, &[]).await);
        }
        println!(
            "setup: {claims} {} claims allocated by the scheduler model and created in {:.1} s (not timed)",
            kind.name,
            setup.elapsed().as_secs_f64()
        );
        let (prepare, unprepare, run) = cycle(&k, &planned, kind.held).await;
        assert!(
            h.cdi_files().is_empty(),
            "{}: CDI dir not empty after the run",
            kind.name
        );
        assert!(
            harness::list_files(&h.opts.paths.run_dir.join("claims")).is_empty(),
            "{}: claim files left after the run",
            kind.name
        );
        all.push(Figures {
            kind: kind.name,
            prepare,
            unprepare,
            run,
            devices: devices.into_iter().collect(),
        });
    }
    plugin.stop().await;

    let state_dir = &h.opts.paths.state_dir;
    let (fs_type, mount_point) = file_system_of(state_dir);
    let fsync = measure_fsync(state_dir, fsync_samples);

    for f in &mut all {
        println!(
            "{}: {} claims on {} ({} held at once), each prepared and unprepared, in {:.2} s: {:.0} claims/s",
            f.kind,
            f.prepare.len(),
            f.devices.join(", "),
            KINDS
                .iter()
                .find(|k| k.name == f.kind)
                .map_or(0, |k| k.held),
            f.run.as_secs_f64(),
            f.prepare.len() as f64 / f.run.as_secs_f64()
        );
        print_stats(&format!("{} prepare", f.kind), &mut f.prepare);
        print_stats(&format!("{} unprepare", f.kind), &mut f.unprepare);
    }
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
        "fsync floor of a whole-GPU prepare: {PREPARE_FSYNC_PAIRS} x (file {} + dir {}) = {} ({} fsyncs)",
        ms(file_p50),
        ms(dir_p50),
        ms(floor),
        2 * PREPARE_FSYNC_PAIRS
    );
    let whole = &mut all[0].prepare;
    let p50 = percentile(whole, 50.0);
    let p99 = percentile(whole, 99.0);
    let beyond_p50 = p50.saturating_sub(floor);
    let beyond_p99 = p99.saturating_sub(floor);
    let judge = |met: bool| if quick { "not judged" } else { verdict(met) };
    println!(
        "whole-GPU prepare beyond the floor: p50 {} (target <= {}: {}), p99 {} (target <= {}: {})",
        ms(beyond_p50),
        ms(TARGET_P50),
        judge(beyond_p50 <= TARGET_P50),
        ms(beyond_p99),
        ms(TARGET_P99),
        judge(beyond_p99 <= TARGET_P99),
    );
}

/// Prepares the claims in order, unpreparing claim i - `held` before claim i (as the
/// scheduler model released it before allocating claim i), then the last `held`.
/// Returns the prepare and unprepare latencies and the whole run's time.
async fn cycle(
    k: &DraClient,
    claims: &[KubeletClaim],
    held: usize,
) -> (Vec<Duration>, Vec<Duration>, Duration) {
    let run = Instant::now();
    let mut prepare = Vec::with_capacity(claims.len());
    let mut unprepare = Vec::with_capacity(claims.len());
    for i in 0..claims.len() {
        if i >= held {
            unprepare.push(timed_unprepare(k, &claims[i - held]).await);
        }
        prepare.push(timed_prepare(k, &claims[i]).await);
    }
    for c in &claims[claims.len().saturating_sub(held)..] {
        unprepare.push(timed_unprepare(k, c).await);
    }
    (prepare, unprepare, run.elapsed())
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
    let (p50, p95, p99) = (
        percentile(v, 50.0),
        percentile(v, 95.0),
        percentile(v, 99.0),
    );
    let max = v.last().copied().unwrap_or_default();
    let mean = v.iter().sum::<Duration>() / v.len().max(1) as u32;
    println!(
        "{what:<26} n={:<5} p50 {:>9}  p95 {:>9}  p99 {:>9}  mean {:>9}  max {:>9}",
        v.len(),
        ms(p50),
        ms(p95),
        ms(p99),
        ms(mean),
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

/// Replays the atomic-write pattern `samples` times in `dir`, timing the file
/// fsync (with its 4 KiB write) and the directory fsync separately.
fn measure_fsync(dir: &Path, samples: usize) -> FsyncCost {
    let tmp = dir.join(".bench-fsync.tmp");
    let target = dir.join("bench-fsync");
    let block = [0x5au8; 4096];
    let mut cost = FsyncCost {
        file: Vec::with_capacity(samples),
        dir: Vec::with_capacity(samples),
    };
    for _ in 0..samples {
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
