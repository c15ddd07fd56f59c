//! Running compute-share scenarios on the simulated GPU: claims' files in sandboxes
//! (the interception library preloaded, claim files bind-mounted read-only as the
//! plugin mounts them), `sim_client` workloads, the plugin's compute controller
//! (`tessera::compute::service`) over the fake `libnvidia-ml.so.1` through the production
//! NVML backend, and achieved shares from the simulator's own timeline. Used by the
//! `compute_shares` benchmark and the `compute_limit` and `shares_under_controller`
//! tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::Instant;

use super::{self as support, ClaimSpec, RunOpts, Sandbox};
use tessera::compute::service::{ComputeService, ControlledClaim};
use tessera::inventory::GpuBackend;
use tessera::inventory::mock::{MockBackend, MockNode, StateAccess};
use tessera::inventory::nvml::NvmlBackend;
use tessera_abi::control::{self, GpuControl};

pub const GPU: &str = "GPU-5c0de000-0000-4000-8000-00000000c0de";
pub const GPU_BYTES: u64 = 80 << 30;
/// Per-block cost of the simulated GPU.
pub const BLOCK_NS: u64 = 1000;
pub const WARMUP_S: f64 = 2.0;
pub const WINDOWS: usize = 10;
pub const GOAL: f64 = 2.0;

/// One scenario: claims with their share, cap, process count and workload.
#[derive(Clone)]
pub struct Scenario {
    pub name: String,
    pub shares: Vec<u32>,
    pub limits: Vec<u32>,
    pub procs: Vec<usize>,
    pub workloads: Vec<String>,
    /// Per claim: the simulated GPU's cost of one of its thread blocks, ns. Its
    /// client sizes grids with the same figure, so kernel durations stay the same and
    /// a claim with dearer blocks launches fewer of them.
    pub block_ns: Vec<u64>,
    /// Per claim: a tenant's forgery, as extra thread blocks written into its region's
    /// launch counter per block really launched (0 = an honest claim). A thread of the
    /// runner, mapping the region as the claim's processes do, adds them every 5 ms.
    pub inflate: Vec<u64>,
    /// Per claim: a tenant rewriting its token bucket's TAT word every millisecond
    /// (zeroed, beyond any debt, or a little later at rate code 0: each would refill
    /// the bucket).
    pub rewind: Vec<bool>,
    pub secs: f64,
}

impl Scenario {
    pub fn row(shares: &[u32]) -> Self {
        Scenario {
            name: shares
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join("/"),
            shares: shares.to_vec(),
            limits: vec![100; shares.len()],
            procs: vec![1; shares.len()],
            workloads: vec!["loop".into(); shares.len()],
            block_ns: vec![BLOCK_NS; shares.len()],
            inflate: vec![0; shares.len()],
            rewind: vec![false; shares.len()],
            secs: WARMUP_S + WINDOWS as f64,
        }
    }
}

/// The fake NVML over a simulated node holding the one simulated GPU.
pub struct Nvml {
    lib: PathBuf,
    state_dir: PathBuf,
}

pub fn fake_nvml(dir: &Path) -> Nvml {
    let lib = crate::fake_nvml::build_fake_nvml(dir);
    let state_dir = dir.join("nvml-state");
    let yaml = format!(
        "apiVersion: mock.tessera.dev/v1alpha1\nkind: MockNode\ndriverVersion: \"580.65.06\"\ncudaDriverVersion: \"13.0\"\ncharDevices: {{nvidia: 195, nvidia-uvm: 508}}\ngpus:\n- minor: 0\n  uuid: {GPU}\n  productName: NVIDIA H100 80GB HBM3\n  brand: Nvidia\n  architecture: Hopper\n  memoryBytes: {GPU_BYTES}\n  multiprocessors: 132\n  cudaComputeCapability: \"9.0\"\n  pciBusID: \"0000:19:00.0\"\n  migCapable: false\n"
    );
    let node = MockNode::parse(&yaml, "bench node").expect("node");
    MockBackend::new(node, state_dir.clone(), StateAccess::ReadWrite)
        .discover()
        .expect("state file");
    Nvml { lib, state_dir }
}

pub struct Outcome {
    /// Per claim: achieved share per 1 s window from t = 0 (percent of GPU busy).
    pub windows: Vec<Vec<f64>>,
    /// GPU busy fraction per window.
    pub busy: Vec<f64>,
}

fn sim_client() -> PathBuf {
    support::artifacts().sim_client.clone()
}

#[allow(unsafe_code)] // set_var: the in-process controller's fake NVML reads it at init.
pub fn run(dir: &Path, nvml: &Nvml, sc: &Scenario, seed: u64, throttle: bool) -> Outcome {
    let run_dir = dir.join(format!(
        "run-{}-{seed}-{throttle}",
        sc.name.replace('/', "_")
    ));
    std::fs::create_dir_all(&run_dir).unwrap();
    let sim = run_dir.join("sim");
    let log = run_dir.join("timeline");
    // SAFETY: the bench is single-threaded here; the fake NVML reads these at init.
    unsafe {
        std::env::set_var("TESSERA_FAKE_NVML_STATE_DIR", &nvml.state_dir);
        std::env::set_var("FAKE_CUDA_SIM", &sim);
        std::env::set_var("FAKE_CUDA_DEVICES", format!("{GPU}:{GPU_BYTES}"));
        std::env::set_var("FAKE_SIM_SEED", seed.to_string());
    }
    let mut boxes = Vec::new();
    let mut claims = Vec::new();
    for (i, &share) in sc.shares.iter().enumerate() {
        let uid = format!("00000000-0000-4000-8000-{:012}", i + 1);
        let sb = Sandbox::new(
            &[(GPU, GPU_BYTES)],
            vec![ClaimSpec::new(&uid, &[(GPU, GPU_BYTES)])],
        );
        let cdir = sb.dir.path().join("claims").join(&uid);
        std::fs::write(
            cdir.join("control"),
            control::initial_bytes(&[GpuControl {
                uuid: GPU.into(),
                share,
                compute_limit: sc.limits[i],
                block_rate: 0,
                burst_ns: 0,
                updates: 0,
            }])
            .unwrap(),
        )
        .unwrap();
        claims.push(ControlledClaim { uid, dir: cdir });
        boxes.push(sb);
    }
    let backend: Arc<dyn GpuBackend> = Arc::new(
        NvmlBackend::new(Some(nvml.lib.clone()), "/proc".into(), "/sys".into()).expect("fake NVML"),
    );
    let mut svc = ComputeService::new(backend, PathBuf::from("/proc"), vec![(0, GPU.into())]);
    // The fixtures (library, fake driver, clients) are built at their first use: before
    // the clock starts, or the first scenario of a run would lose its first seconds.
    let client = sim_client();
    let t0 = support::timeline::now_ns();
    let mut children: Vec<Child> = Vec::new();
    for (i, sb) in boxes.iter().enumerate() {
        for p in 0..sc.procs[i] {
            let opts = RunOpts {
                env: vec![
                    ("FAKE_CUDA_SIM".into(), sim.display().to_string()),
                    ("FAKE_CUDA_SIM_LOG".into(), log.display().to_string()),
                    ("FAKE_SIM_BLOCK_NS".into(), sc.block_ns[i].to_string()),
                    ("FAKE_SIM_TAG".into(), (i + 1).to_string()),
                ],
                ..Default::default()
            };
            let wl = &sc.workloads[i];
            let client_seed = seed * 1000 + (i as u64) * 10 + p as u64;
            let args = sim_args(wl, client_seed, sc.secs + 1.0);
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let child = sb
                .command(&opts, &client, &argv)
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn sim client");
            children.push(child);
        }
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let forgers: Vec<_> = claims
        .iter()
        .zip(sc.inflate.iter().zip(&sc.rewind))
        .filter(|(_, (k, r))| **k > 0 || **r)
        .map(|(c, (&k, &r))| forge(c.dir.join("region"), k, r, stop.clone()))
        .collect();
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < sc.secs {
        if throttle {
            let d = svc.tick(&claims);
            if std::env::var_os("TESSERA_BENCH_TRACE").is_some() {
                for (_, ds) in &d {
                    let v: Vec<String> = ds
                        .iter()
                        .map(|x| {
                            format!(
                                "{}:{:?}/{:.1?}/{:.1?}",
                                x.block_rate, x.active, x.target, x.achieved
                            )
                        })
                        .collect();
                    eprintln!(
                        "    t={:.2} cap {:?} {}",
                        start.elapsed().as_secs_f64(),
                        svc.capacity(GPU).map(|c| c as u64),
                        v.join("  ")
                    );
                }
            }
        }
        std::thread::sleep(tessera::compute::service::INTERVAL);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for f in forgers {
        f.join().expect("counter forger");
    }
    for c in &mut children {
        let _ = c.kill();
    }
    for c in &mut children {
        let _ = c.wait();
    }
    let tl = support::timeline::Timeline::read(&log).expect("timeline");
    let n = sc.secs.floor() as usize;
    let mut windows = vec![Vec::new(); sc.shares.len()];
    let mut busy = Vec::new();
    for w in 0..n {
        let (a, b) = (
            t0 + w as u64 * 1_000_000_000,
            t0 + (w as u64 + 1) * 1_000_000_000,
        );
        let wb = tl.window(0, a, b);
        busy.push(wb.gpu_ns as f64 / 1e9);
        for (i, win) in windows.iter_mut().enumerate() {
            let t = wb.tag_ns((i + 1) as u32);
            win.push(if wb.gpu_ns > 0 {
                100.0 * t as f64 / wb.gpu_ns as f64
            } else {
                0.0
            });
        }
    }
    if std::env::var_os("TESSERA_BENCH_VERBOSE").is_some() {
        let all = tl.window(0, t0, t0 + n as u64 * 1_000_000_000);
        eprintln!(
            "  {} seed {seed} throttle {throttle}: busy by tag {:?}",
            sc.name, all.by_tag
        );
        for (i, w) in windows.iter().enumerate() {
            let v: Vec<String> = w.iter().map(|x| format!("{x:.1}")).collect();
            eprintln!("    claim {i}: {}", v.join(" "));
        }
    }
    Outcome { windows, busy }
}

/// A tenant forging its region: every millisecond, `factor` forged blocks in its launch
/// counter for each block its processes really launched since (the counter's growth
/// less the forgeries), and with `rewind` its bucket's TAT word rewritten.
fn forge(
    region: PathBuf,
    factor: u64,
    rewind: bool,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&region)
            .expect("the claim's region");
        let reg = tessera_abi::region::Region::map(&f, true).expect("map the region");
        let tat = (reg.layout().gpu_offset(0) + tessera_abi::region::gpu::TAT) as u64;
        let (mut forged, mut real_seen, mut rewinds) = (0u64, 0u64, 0u64);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let blocks = reg.gpu_stats(0).expect("GPU 0").blocks;
            let real = blocks.saturating_sub(forged);
            let extra = real.saturating_sub(real_seen) * factor;
            real_seen = real;
            reg.bucket(0).expect("GPU 0").count(extra, 0);
            forged += extra;
            if rewind {
                // In turn: zero (an empty bucket), beyond any debt (read as corrupt, so
                // as now), a little later at rate code 0 (a debt rescaled to nothing).
                rewinds += 1;
                let word = match rewinds % 3 {
                    0 => 0,
                    1 => {
                        support::timeline::now_ns()
                            + tessera_abi::region::MAX_DEBT_NS
                            + 1_000_000_000
                    }
                    _ => {
                        (reg.bucket(0).expect("GPU 0").tat() + 256)
                            & !tessera_abi::region::CODE_MASK
                    }
                };
                f.write_all_at(&word.to_le_bytes(), tat)
                    .expect("rewrite the bucket");
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    })
}

/// `sim_client <workload> <seed> <seconds> 0 [key=value...]`; a scenario's workload
/// string is the name followed by its keys.
fn sim_args(workload: &str, seed: u64, secs: f64) -> Vec<String> {
    let mut words = workload.split_whitespace();
    let mut v = vec![
        words.next().unwrap_or("loop").to_string(),
        seed.to_string(),
        format!("{secs}"),
        "0".to_string(),
    ];
    v.extend(words.map(str::to_string));
    v
}

pub fn targets(sc: &Scenario) -> Vec<f64> {
    tessera::compute::controller::targets(
        &sc.shares
            .iter()
            .zip(&sc.limits)
            .map(|(&s, &l)| (f64::from(s), f64::from(l)))
            .collect::<Vec<_>>(),
    )
}

pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}
