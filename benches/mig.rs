//! MIG benchmarks, three figures; a missed target is reported, never a failure.
//!
//! 1. Packing: a seeded stream of MIG requests and releases on 4× H100 replayed through
//!    the scheduler model (`k8s_model::allocator`) twice, once with Tessera's device
//!    order (`slices::packing_order`) and once with each slice's devices sorted by name.
//! 2. `build_pool` for 8× H100 with every placement, plus the publisher's no-change
//!    check (two builds compared spec by spec).
//! 3. What a MIG prepare through `DeviceState` costs beyond the backend's own calls and
//!    the fsyncs it must do.
//!
//! `TESSERA_BENCH_QUICK=1` (CI) runs each part briefly (fewer steps, seeds and
//! iterations) and judges no target. Directories live under `CARGO_TARGET_TMPDIR` (on
//! disk, not a tmpfs `/tmp`).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_model::allocator::{AllocError, Allocator};
use k8s_model::release::{FeatureGates, KubeVersion};
use k8s_openapi::api::resource::v1::{
    AllocationResult, CELDeviceSelector, DeviceClaim, DeviceClass, DeviceRequest, DeviceSelector,
    ExactDeviceRequest, ResourceClaim, ResourceClaimSpec, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera::config::{NodeConfig, SliceLayout};
use tessera::inventory::mock::{MockBackend, MockNode, StateAccess};
use tessera::inventory::{BackendError, GpuBackend, MigInstance, MigStatus, NodeInventory};
use tessera::mig::GpuModel;
use tessera::naming::{DeviceRef, parse_device_name};
use tessera::prepare::cdi_spec::CdiContext;
use tessera::prepare::failpoints::FailPoints;
use tessera::prepare::state::{DeviceState, StateConfig, UnknownMig};
use tessera::publish::slices::{PoolParams, ServerFeatures, build_pool};

const DRIVER: &str = "gpu.tessera.dev";
const NODE: &str = "bench-node";
const H100: &str = "NVIDIA H100 80GB HBM3";

// 1. Packing.
const PACK_GPUS: u32 = 4;
const STEPS: usize = 2_000;
const QUICK_STEPS: usize = 200;
const SEED: u64 = 0x7e55_e7a0;
const EXTRA_SEEDS: [u64; 5] = [1, 2, 3, 4, 5];
const QUICK_EXTRA_SEEDS: [u64; 1] = [1];
const RELEASE_PROBABILITY: f64 = 0.4;
/// Request mix: profile and weight in percent.
const MIX: [(&str, u64); 6] = [
    ("1g.10gb", 40),
    ("1g.20gb", 10),
    ("2g.20gb", 20),
    ("3g.40gb", 15),
    ("4g.40gb", 5),
    ("7g.80gb", 10),
];

// 2. Pool build.
const POOL_GPUS: u32 = 8;
const POOL_ITERATIONS: usize = 200;
const QUICK_POOL_ITERATIONS: usize = 10;
const TARGET_POOL: Duration = Duration::from_millis(5);

// 3. MIG prepare.
const PREPARE_ITERATIONS: usize = 200;
const QUICK_PREPARE_ITERATIONS: usize = 10;
const MIG_DEVICE: &str = "gpu-0-mig-1g10gb-19-6";
/// Atomic writes (file fsync + rename + directory fsync) of one MIG prepare on a GPU
/// whose MIG mode is already on, counted in `src/prepare/state.rs` and
/// `src/prepare/state/mig.rs`: checkpoint "started"
/// (`prepare`), checkpoint "created" and checkpoint with the GI/CI IDs
/// (`create_mig_devices`), the CDI spec (`SpecWriter::write`), checkpoint "completed".
/// Switching MIG mode on first adds one more checkpoint store.
const MIG_PREPARE_FSYNC_PAIRS: u32 = 5;
const TARGET_OVERHEAD: Duration = Duration::from_millis(1);

/// How much of each part runs: all of it, or a quick pass (`TESSERA_BENCH_QUICK`).
struct Size {
    quick: bool,
    steps: usize,
    extra_seeds: &'static [u64],
    pool_iterations: usize,
    prepare_iterations: usize,
}

impl Size {
    fn from_env() -> Self {
        if std::env::var_os("TESSERA_BENCH_QUICK").is_some() {
            Size {
                quick: true,
                steps: QUICK_STEPS,
                extra_seeds: &QUICK_EXTRA_SEEDS,
                pool_iterations: QUICK_POOL_ITERATIONS,
                prepare_iterations: QUICK_PREPARE_ITERATIONS,
            }
        } else {
            Size {
                quick: false,
                steps: STEPS,
                extra_seeds: &EXTRA_SEEDS,
                pool_iterations: POOL_ITERATIONS,
                prepare_iterations: PREPARE_ITERATIONS,
            }
        }
    }

    /// A target's verdict, or "not judged" in a quick pass (too few samples).
    fn verdict(&self, met: bool) -> &'static str {
        if self.quick {
            "not judged"
        } else {
            verdict(met)
        }
    }
}

fn main() {
    let started = Instant::now();
    let size = Size::from_env();
    if size.quick {
        println!(
            "quick mode (TESSERA_BENCH_QUICK): fewer steps, seeds and iterations; targets not judged"
        );
    }
    packing(&size);
    pool_build(&size);
    mig_prepare(&size);
    println!("total bench time {:.1} s", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------
// 1. Packing comparison
// ---------------------------------------------------------------------------------

/// What one replay of the stream ended with.
#[derive(Debug, Clone, Copy, Default)]
struct Outcome {
    admitted_before_first_refusal: usize,
    first_refused: Option<&'static str>,
    admitted: usize,
    refused: usize,
    free_slices: u32,
    stranded_slices: u32,
}

impl Outcome {
    fn fragmentation(&self) -> f64 {
        if self.free_slices == 0 {
            0.0
        } else {
            f64::from(self.stranded_slices) / f64::from(self.free_slices)
        }
    }
}

fn packing(size: &Size) {
    let node = h100_node(PACK_GPUS, false);
    let version = KubeVersion::NEWEST;
    let gates = FeatureGates::parse(version, "DRAPartitionableDevices=true").expect("gates");
    let tessera_order = pool(&node, version, &gates);
    let name_order: Vec<ResourceSlice> = tessera_order
        .iter()
        .cloned()
        .map(|mut s| {
            if let Some(d) = s.spec.devices.as_mut() {
                d.sort_by(|a, b| a.name.cmp(&b.name));
            }
            s
        })
        .collect();
    let classes = tessera::device_classes::read(None).expect("built-in classes");
    let model = tessera::mig::model_for_product(H100).expect("H100 in the catalog");

    println!(
        "== 1. MIG packing: {PACK_GPUS}x H100 80GB (mig), 1.{} split layout, {} steps ==",
        version.minor(),
        size.steps
    );
    let mix: Vec<String> = MIX.iter().map(|(p, w)| format!("{p} {w}%")).collect();
    println!(
        "stream: release a random live claim with p={RELEASE_PROBABILITY} (when any), else request {}",
        mix.join(", ")
    );
    println!("frag = free memory slices outside a fully free aligned 4-slice block (0-3 or 4-7,");
    println!("       the only homes of 3g/4g/7g) / all free memory slices, at the end");
    let orders = [("tessera", &tessera_order), ("name", &name_order)];
    println!("seed {SEED:#x}:");
    print_header();
    for (label, slices) in orders {
        let o = replay(slices, &classes, &gates, model, SEED, size.steps);
        print_outcome(label, &o);
    }
    println!(
        "average of {} more seeds {:?}:",
        size.extra_seeds.len(),
        size.extra_seeds
    );
    print_header();
    for (label, slices) in orders {
        let runs: Vec<Outcome> = size
            .extra_seeds
            .iter()
            .map(|&s| replay(slices, &classes, &gates, model, s, size.steps))
            .collect();
        print_average(label, &runs);
    }
}

fn print_header() {
    println!(
        "  {:<8} {:>12} {:>9} {:>8} {:>6} {:>9} {:>7}",
        "order", "before-fail", "admitted", "refused", "free", "stranded", "frag"
    );
}

fn print_outcome(label: &str, o: &Outcome) {
    println!(
        "  {label:<8} {:>12} {:>9} {:>8} {:>6} {:>9} {:>6.1}%  first refused: {}",
        o.admitted_before_first_refusal,
        o.admitted,
        o.refused,
        o.free_slices,
        o.stranded_slices,
        100.0 * o.fragmentation(),
        o.first_refused.unwrap_or("none")
    );
}

fn print_average(label: &str, runs: &[Outcome]) {
    let n = runs.len() as f64;
    let avg = |f: fn(&Outcome) -> f64| runs.iter().map(f).sum::<f64>() / n;
    println!(
        "  {label:<8} {:>12.1} {:>9.1} {:>8.1} {:>6.1} {:>9.1} {:>6.1}%",
        avg(|o| o.admitted_before_first_refusal as f64),
        avg(|o| o.admitted as f64),
        avg(|o| o.refused as f64),
        avg(|o| f64::from(o.free_slices)),
        avg(|o| f64::from(o.stranded_slices)),
        100.0 * avg(Outcome::fragmentation)
    );
}

/// Replays the stream of `seed` through a fresh allocator on `slices`. Every step
/// draws the same three numbers whatever the order, so both orders see one stream;
/// which live claim a release hits is drawn as an index into the live claims.
fn replay(
    slices: &[ResourceSlice],
    classes: &[DeviceClass],
    gates: &FeatureGates,
    model: &GpuModel,
    seed: u64,
    steps: usize,
) -> Outcome {
    let mut alloc = Allocator::new(slices, classes, gates).expect("allocator");
    assert!(
        alloc.skipped_pools().is_empty(),
        "{:?}",
        alloc.skipped_pools()
    );
    let claims: Vec<ResourceClaim> = MIX.iter().map(|(p, _)| mig_request(p)).collect();
    let total_weight: u64 = MIX.iter().map(|(_, w)| w).sum();
    let mut rng = XorShift::new(seed);
    // Memory slices in use per GPU (bit k = slice k), and the live claims.
    let mut used = vec![0u8; PACK_GPUS as usize];
    let mut live: Vec<(String, usize, u8)> = Vec::new();
    let mut out = Outcome::default();
    for step in 0..steps {
        let (release, pick, which) = (rng.unit(), rng.next() % total_weight, rng.next());
        if !live.is_empty() && release < RELEASE_PROBABILITY {
            let (name, gpu, mask) = live.swap_remove((which % live.len() as u64) as usize);
            assert!(alloc.release("default", &name), "release {name}");
            used[gpu] &= !mask;
            continue;
        }
        let mut claim = claims[mix_index(pick)].clone();
        let name = format!("c{step}");
        claim.metadata.name = Some(name.clone());
        match alloc.allocate(&claim) {
            Ok(result) => {
                let (gpu, mask) = placement(model, &result);
                assert_eq!(used[gpu] & mask, 0, "{name}: overlapping placement");
                used[gpu] |= mask;
                live.push((name, gpu, mask));
                out.admitted += 1;
                if out.refused == 0 {
                    out.admitted_before_first_refusal += 1;
                }
            }
            Err(AllocError::Unsatisfiable(_)) => {
                out.first_refused.get_or_insert(MIX[mix_index(pick)].0);
                out.refused += 1;
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
    for mask in used {
        let free = 8 - mask.count_ones();
        let in_free_blocks = 4 * u32::from(mask & 0x0f == 0) + 4 * u32::from(mask & 0xf0 == 0);
        out.free_slices += free;
        out.stranded_slices += free - in_free_blocks;
    }
    out
}

/// Index into [`MIX`] of a draw in `0..total weight`.
fn mix_index(mut pick: u64) -> usize {
    for (i, (_, w)) in MIX.iter().enumerate() {
        if pick < *w {
            return i;
        }
        pick -= w;
    }
    unreachable!("draw beyond the total weight")
}

/// The GPU and memory-slice mask of the one MIG device in an allocation.
fn placement(model: &GpuModel, result: &AllocationResult) -> (usize, u8) {
    let results = result
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .expect("allocation results");
    assert_eq!(results.len(), 1);
    let Some(DeviceRef::Mig {
        minor,
        gi_profile_id,
        placement_start,
        ..
    }) = parse_device_name(&results[0].device)
    else {
        panic!("not a MIG device: {}", results[0].device);
    };
    let size = model
        .profile_by_id(gi_profile_id)
        .expect("catalogued profile")
        .placement_size();
    let mask = ((1u16 << size) - 1) << placement_start;
    (minor as usize, u8::try_from(mask).expect("within 8 slices"))
}

/// A claim for one MIG device of `profile` (its name is set per step).
fn mig_request(profile: &str) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "mig".into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: "mig.tessera.dev".into(),
                        count: Some(1),
                        selectors: Some(vec![DeviceSelector {
                            cel: Some(CELDeviceSelector {
                                expression: format!(
                                    "device.attributes[\"{DRIVER}\"].profile == \"{profile}\""
                                ),
                            }),
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                constraints: None,
                config: None,
            }),
        }),
        status: None,
    }
}

/// xorshift64 seeded through splitmix64, so that small seeds give good streams.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        XorShift((z ^ (z >> 31)).max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

// ---------------------------------------------------------------------------------
// Shared node builders
// ---------------------------------------------------------------------------------

/// A node of `n` H100 80GB, MIG-capable, MIG mode as given.
fn h100_node(n: u32, mig_enabled: bool) -> MockNode {
    let mut yaml = String::from(
        "apiVersion: mock.tessera.dev/v1alpha1\nkind: MockNode\ndriverVersion: \"580.65.06\"\ncudaDriverVersion: \"13.0\"\ncharDevices: {nvidia: 195, nvidia-uvm: 508, nvidia-caps: 511}\ngpus:\n",
    );
    for i in 0..n {
        yaml.push_str(&format!(
            "- minor: {i}\n  uuid: GPU-{i:08x}-0000-4000-8000-000000000000\n  productName: {H100}\n  brand: Nvidia\n  architecture: Hopper\n  memoryBytes: 85520809984\n  multiprocessors: 132\n  cudaComputeCapability: \"9.0\"\n  pciBusID: \"0000:{:02x}:00.0\"\n  pcieRoot: pci0000:00\n  numaNode: 0\n  migCapable: true\n  migEnabled: {mig_enabled}\n",
            0x10 + i
        ));
    }
    MockNode::parse(&yaml, "bench-h100").expect("mock node")
}

/// The node's pool in the split layout, every GPU in `mig` mode (the default for
/// MIG-capable GPUs), with names as the server would give them.
fn pool(node: &MockNode, version: KubeVersion, gates: &FeatureGates) -> Vec<ResourceSlice> {
    let inv = node.inventory();
    let gpus = NodeConfig::default()
        .resolve(&inv, "default")
        .expect("config");
    let mut slices = build_pool(
        &PoolParams {
            driver: DRIVER,
            node_name: NODE,
            version,
            features: ServerFeatures::from_gates(gates),
            layout: SliceLayout::Split,
            shared_slots: 4,
        },
        &inv,
        &gpus,
        &BTreeMap::new(),
    );
    for s in &mut slices {
        s.metadata.name = s
            .metadata
            .generate_name
            .as_ref()
            .map(|g| format!("{g}bench"));
    }
    slices
}

// ---------------------------------------------------------------------------------
// 2. Pool build
// ---------------------------------------------------------------------------------

fn pool_build(size: &Size) {
    let node = h100_node(POOL_GPUS, false);
    let inv = node.inventory();
    let gpus = NodeConfig::default()
        .resolve(&inv, "default")
        .expect("config");
    let version = KubeVersion::NEWEST;
    let gates = FeatureGates::parse(version, "DRAPartitionableDevices=true").expect("gates");
    let params = PoolParams {
        driver: DRIVER,
        node_name: NODE,
        version,
        features: ServerFeatures::from_gates(&gates),
        layout: SliceLayout::Split,
        shared_slots: 4,
    };
    let no_mig = BTreeMap::new();
    // What the publisher compares against: the pool it wrote last time.
    let stored = build_pool(&params, &inv, &gpus, &no_mig);
    let mut build = Vec::with_capacity(size.pool_iterations);
    let mut diff = Vec::with_capacity(size.pool_iterations);
    let mut total = Vec::with_capacity(size.pool_iterations);
    let cpu_start = on_cpu();
    let loop_start = Instant::now();
    for _ in 0..size.pool_iterations {
        let t = Instant::now();
        let desired = build_pool(&params, &inv, &gpus, &no_mig);
        let built = t.elapsed();
        // The publisher's own no-change check, slice by slice.
        let same = desired.len() == stored.len()
            && desired
                .iter()
                .zip(&stored)
                .all(|(x, y)| tessera::publish::same_ignoring_generation(&x.spec, &y.spec));
        let elapsed = t.elapsed();
        assert!(same, "two builds of one node differ");
        build.push(built);
        diff.push(elapsed - built);
        total.push(elapsed);
    }
    let loop_wall = loop_start.elapsed();
    let cpu = on_cpu().zip(cpu_start).map(|(end, start)| end - start);
    let devices: usize = stored
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    println!(
        "== 2. build_pool: {POOL_GPUS}x H100 (mig, 1.{} split layout): {devices} devices in {} slices ==",
        version.minor(),
        stored.len()
    );
    print_stats("build_pool", &mut build);
    print_stats("spec diff vs stored", &mut diff);
    print_stats("build + diff", &mut total);
    let (p50, p99) = (percentile(&mut total, 50.0), percentile(&mut total, 99.0));
    println!(
        "  build + diff p50 {}, p99 {} (target <= {}: {})",
        ms(p50),
        ms(p99),
        ms(TARGET_POOL),
        size.verdict(p99 <= TARGET_POOL)
    );
    if let Some(cpu) = cpu {
        // Whole iterations (they also drop the pool): was the wall time spent computing?
        let n = u32::try_from(size.pool_iterations).expect("iterations");
        println!(
            "  per loop iteration: on-CPU {}, wall {}",
            ms(cpu / n),
            ms(loop_wall / n)
        );
    }
}

/// Time this thread has spent on a CPU (`/proc/thread-self/schedstat`, updated at
/// scheduler ticks: exact over many iterations, not per iteration).
fn on_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

// ---------------------------------------------------------------------------------
// 3. MIG prepare overhead
// ---------------------------------------------------------------------------------

/// Forwards every call to the inner backend and adds up the time spent inside it.
struct TimedBackend<B> {
    inner: B,
    nanos: AtomicU64,
    calls: AtomicU64,
}

impl<B: GpuBackend> TimedBackend<B> {
    fn new(inner: B) -> Self {
        TimedBackend {
            inner,
            nanos: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        }
    }

    fn timed<T>(&self, f: impl FnOnce(&B) -> T) -> T {
        let t = Instant::now();
        let out = f(&self.inner);
        let spent = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(spent, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        out
    }

    /// Time spent in the inner backend and calls made since the last take.
    fn take(&self) -> (Duration, u64) {
        (
            Duration::from_nanos(self.nanos.swap(0, Ordering::Relaxed)),
            self.calls.swap(0, Ordering::Relaxed),
        )
    }
}

impl<B: GpuBackend> GpuBackend for TimedBackend<B> {
    fn kind(&self) -> &'static str {
        self.timed(|b| b.kind())
    }

    fn discover(&self) -> Result<NodeInventory, BackendError> {
        self.timed(|b| b.discover())
    }

    fn mig_status(&self, minor: u32) -> Result<MigStatus, BackendError> {
        self.timed(|b| b.mig_status(minor))
    }

    fn set_mig_mode(&self, minor: u32, enabled: bool) -> Result<(), BackendError> {
        self.timed(|b| b.set_mig_mode(minor, enabled))
    }

    fn create_mig(
        &self,
        minor: u32,
        profile_id: u32,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        self.timed(|b| b.create_mig(minor, profile_id, start))
    }

    fn destroy_mig(&self, minor: u32, gi_id: u32) -> Result<(), BackendError> {
        self.timed(|b| b.destroy_mig(minor, gi_id))
    }
}

fn mig_prepare(size: &Size) {
    let root = tempfile::Builder::new()
        .prefix("mig-bench-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temp dir");
    // MIG mode already on, as on a busy `mig` GPU: no mode switch per prepare.
    let node = h100_node(1, true);
    let inv = node.inventory();
    let gpus = NodeConfig::default()
        .resolve(&inv, "default")
        .expect("config");
    let backend = Arc::new(TimedBackend::new(MockBackend::new(
        node,
        root.path().join("mock"),
        StateAccess::ReadWrite,
    )));
    let cfg = StateConfig {
        driver: DRIVER.into(),
        pool: NODE.into(),
        cdi_dir: root.path().join("cdi"),
        plugin_dir: root.path().join("plugin"),
        state_dir: root.path().join("state"),
        boot_id: "bench-boot".into(),
        fail_points: FailPoints::default(),
        unknown_mig: UnknownMig::Destroy,
        run_dir: root.path().join("run"),
        shared_slots: 4,
        interception_source: None,
        device_metadata: false,
    };
    let cdi = CdiContext {
        host_dev_root: PathBuf::from("/"),
        majors: inv.char_majors,
        driver_files: Vec::new(),
        host_run_dir: root.path().join("run"),
        interception: None,
    };
    let state_dir = cfg.state_dir.clone();
    let (state, _) = DeviceState::open(cfg, gpus, backend.clone(), cdi).expect("open state");

    let mut total = Vec::with_capacity(size.prepare_iterations);
    let mut inside = Vec::with_capacity(size.prepare_iterations);
    let mut beyond = Vec::with_capacity(size.prepare_iterations);
    let mut floors = Vec::with_capacity(size.prepare_iterations);
    let mut overhead_ms = Vec::with_capacity(size.prepare_iterations);
    let mut fsync = FsyncCost::default();
    let mut calls = 0;
    for i in 0..size.prepare_iterations {
        let uid = format!("00000000-0000-4000-8000-{i:012x}");
        let claim = allocated_mig_claim(&format!("mig-{i}"), &uid);
        backend.take();
        let t = Instant::now();
        let devices = state.prepare(&claim, &uid).expect("prepare");
        let elapsed = t.elapsed();
        let (in_backend, n) = backend.take();
        assert_eq!(devices.len(), 1);
        total.push(elapsed);
        inside.push(in_backend);
        beyond.push(elapsed.saturating_sub(in_backend));
        calls = n;
        state.unprepare(&uid).expect("unprepare");
        // The floor: as many atomic writes as a prepare does, right after it, so that
        // both see the same disk load (it drifts while other work shares the disk).
        let floor: Duration = (0..MIG_PREPARE_FSYNC_PAIRS)
            .map(|_| fsync.sample(&state_dir))
            .sum();
        floors.push(floor);
        overhead_ms
            .push((elapsed.as_secs_f64() - in_backend.as_secs_f64() - floor.as_secs_f64()) * 1e3);
    }
    let (fs_type, _) = file_system_of(&state_dir);

    println!(
        "== 3. MIG prepare of {MIG_DEVICE} via DeviceState (mock H100, MIG on), {}x ==",
        size.prepare_iterations
    );
    println!("  state dir on {fs_type}; backend calls per prepare: {calls}");
    print_stats("prepare total", &mut total);
    print_stats("inside the backend", &mut inside);
    print_stats("total - backend", &mut beyond);
    print_stats("write 4 KiB + fsync", &mut fsync.file);
    print_stats("directory fsync", &mut fsync.dir);
    print_stats("atomic write (+rename)", &mut fsync.atomic);
    println!(
        "  floor = {MIG_PREPARE_FSYNC_PAIRS} atomic writes ({} fsyncs), timed after each prepare:",
        2 * MIG_PREPARE_FSYNC_PAIRS
    );
    print_stats("floor", &mut floors);
    // Per prepare: total - backend - its own floor; negative when the floor was slower.
    overhead_ms.sort_unstable_by(f64::total_cmp);
    let pct = |p: f64| {
        let rank = ((p / 100.0) * overhead_ms.len() as f64).ceil() as usize;
        overhead_ms[rank.clamp(1, overhead_ms.len()) - 1]
    };
    let (p50, p99) = (pct(50.0), pct(99.0));
    println!(
        "  overhead beyond backend + floor: p50 {p50:.3} ms (target <= {}: {}), p99 {p99:.3} ms",
        ms(TARGET_OVERHEAD),
        size.verdict(p50 <= TARGET_OVERHEAD.as_secs_f64() * 1e3)
    );
}

/// A claim allocated [`MIG_DEVICE`] on this node, as the scheduler would write it.
fn allocated_mig_claim(name: &str, uid: &str) -> ResourceClaim {
    testkit::claims::ClaimBuilder::new(name)
        .uid(uid)
        .spec(mig_request("1g.10gb").spec.expect("spec"))
        .device("mig", NODE, MIG_DEVICE)
        .build()
}

/// The cost of the atomic-write pattern (`tessera_cdi::atomic::write_atomic`) in a
/// directory, one sample per call.
#[derive(Default)]
struct FsyncCost {
    /// Write 4 KiB to a fresh temp file and fsync it.
    file: Vec<Duration>,
    /// fsync the directory after the rename.
    dir: Vec<Duration>,
    /// The whole pattern: write + fsync, rename over the target, directory fsync.
    atomic: Vec<Duration>,
}

impl FsyncCost {
    /// Takes one sample; returns the whole pattern's time.
    fn sample(&mut self, dir: &Path) -> Duration {
        let tmp = dir.join(".bench-fsync.tmp");
        let block = [0x5au8; 4096];
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .expect("open temp");
        let t = Instant::now();
        f.write_all(&block).expect("write");
        f.sync_all().expect("fsync file");
        self.file.push(t.elapsed());
        drop(f);
        std::fs::rename(&tmp, dir.join("bench-fsync")).expect("rename");
        let d = Instant::now();
        File::open(dir)
            .and_then(|d| d.sync_all())
            .expect("fsync dir");
        self.dir.push(d.elapsed());
        let atomic = t.elapsed();
        self.atomic.push(atomic);
        atomic
    }
}

/// The file system type and mount point holding `dir` (longest mount-point prefix in
/// `/proc/self/mounts`; escaped mount points are not unescaped).
fn file_system_of(dir: &Path) -> (String, PathBuf) {
    let path = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut best: Option<(usize, String, PathBuf)> = None;
    for line in mounts.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_), Some(mp), Some(fs)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let mp = PathBuf::from(mp);
        let len = mp.as_os_str().len();
        if path.starts_with(&mp) && best.as_ref().is_none_or(|(l, ..)| len >= *l) {
            best = Some((len, fs.to_string(), mp));
        }
    }
    best.map(|(_, fs, mp)| (fs, mp))
        .unwrap_or_else(|| ("unknown".into(), PathBuf::from("/")))
}

// ---------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------

/// Nearest-rank percentile; sorts `v`.
fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort_unstable();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn print_stats(what: &str, v: &mut [Duration]) {
    let (p50, p99) = (percentile(v, 50.0), percentile(v, 99.0));
    println!(
        "  {what:<24} n={:<4} p50 {:>9}  p99 {:>9}",
        v.len(),
        ms(p50),
        ms(p99)
    );
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}
