//! Tessera's NVML backend against NVIDIA's own NVML models: go-nvml's mock DGX A100,
//! H100, H200 and B200 systems, built as a `libnvidia-ml.so.1` by
//! `tests/nvml-models/build.sh` (a Go c-shared library; needs `go`: without it the
//! tests skip, or fail with `CI` set). What Tessera publishes must equal the model's
//! own dump (`nvml-model dump`), device by device; where its MIG partitions differ from
//! the model's tables, the difference must be one of [`KNOWN_DIFFERENCES`], each
//! judged against NVIDIA's MIG user guide.
//!
//! Every check that loads the library runs in a child process of this binary (the
//! library reads its model from the environment, and a Go runtime cannot be unloaded).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use k8s_model::release::{FeatureGates, KubeVersion};
use serde_json::{Value, json};
use tessera::inventory::mock::StateAccess;
use tessera::naming::{DeviceRef, parse_device_name};
use tessera::node::{BackendPaths, BackendSpec, load_node};
use tessera::publish::slices::{ATTR_PCI_BUS_ID, ServerFeatures};

pub(crate) const MODELS: [&str; 4] = ["dgxa100", "dgxh100", "dgxh200", "dgxb200"];

/// Set in a child: the test it runs, the library, and where it writes its results.
const CHILD_ENV: &str = "TESSERA_NVML_MODELS_CHILD";
const LIB_ENV: &str = "TESSERA_NVML_MODELS_LIB";
const OUT_ENV: &str = "TESSERA_NVML_MODELS_OUT";

/// Where each model's MIG tables differ from Tessera's catalog entry for its product
/// (what Tessera publishes for a catalogued name; for a name the catalog lacks, the
/// entry of the real product, while the partitions published are the model's own), as
/// `(model, difference, why; who is right per NVIDIA's MIG user guide)`. A difference
/// is a kind: `product name`, `profile ids`, `memory`, `multiprocessors`, `engines`,
/// `placements`, `profiles only in the model`, `profiles only in Tessera`.
const KNOWN_DIFFERENCES: &[(&str, &str, &str)] = &[
    // Sources: NVIDIA's MIG user guide, "Supported MIG Profiles"
    // (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html), and
    // the nvidia-smi transcripts in the reference facts (mig-and-cuda-facts.md, A1).
    (
        "dgxa100",
        "product name",
        "model names its GPU `Mock NVIDIA A100-SXM4-40GB`, NVML `NVIDIA A100-SXM4-40GB`: model error; partitions read from NVML (the model's tables)",
    ),
    (
        "dgxa100",
        "profile ids",
        "model's IDs are the NVML profile indices; NVML's are 19/14/9/5/0/20/15 (guide, lgip): Tessera right",
    ),
    (
        "dgxh100",
        "profile ids",
        "as for dgxa100: model uses indices as IDs; H100's IDs are 19/14/9/5/0/20/15: Tessera right",
    ),
    (
        "dgxh100",
        "memory",
        "model rounds to 10240/20480/40960/81920 MiB; NVML reports 9984/20096/40448/81152 MiB: Tessera right",
    ),
    (
        "dgxh100",
        "multiprocessors",
        "model: 3g 48, 7g 112, 1g.20gb 16 SMs; H100 has 60/132/26 (guide, lgip): Tessera right",
    ),
    (
        "dgxh100",
        "engines",
        "model lacks JPEG/OFA and has 5 NVDECs on 7g; guide: n JPEG per ng, 7g 8 CE/7 NVDEC/7 JPEG/1 OFA: Tessera right",
    ),
    (
        "dgxh100",
        "placements",
        "model: 3g size 3, 7g size 7, 1g.20gb size 1; guide: 3g {0,4}:4, 7g {0}:8, 1g.20gb {0,2,4,6}:2: Tessera right",
    ),
    (
        "dgxh200",
        "product name",
        "model says `NVIDIA H200 141GB HBM3e`; NVML says `NVIDIA H200`: model error; partitions read from NVML (the model's tables)",
    ),
    (
        "dgxh200",
        "profile ids",
        "model uses indices as IDs (as for H100); H200's 19/20/14/0 seen on hardware: Tessera right",
    ),
    (
        "dgxh200",
        "memory",
        "model 18432/35840/72704/144384 MiB; hardware 16384/33280/-/143360 MiB: Tessera right where seen",
    ),
    (
        "dgxh200",
        "multiprocessors",
        "model copies H100's wrong SM counts (48/112/16); 60/132/26 as on H100: Tessera right",
    ),
    (
        "dgxh200",
        "engines",
        "model copies H100's engines (no JPEG/OFA); guide lists JPEG and OFA as for H100: Tessera right",
    ),
    (
        "dgxh200",
        "placements",
        "model copies H100's placements (3g size 3, 7g size 7): Tessera's 8-slice geometry right",
    ),
    (
        "dgxb200",
        "product name",
        "model says `NVIDIA B200 180GB HBM3e`; NVML says `NVIDIA B200`: model error; partitions read from NVML (the model's tables)",
    ),
    (
        "dgxb200",
        "profile ids",
        "model uses indices as IDs; B200's IDs unverified (guide has none), Tessera assumes H100's",
    ),
    (
        "dgxb200",
        "memory",
        "model 23552/46080/92160/184320 MiB, Tessera 22919/45839/91679/183359: neither verified on hardware",
    ),
    (
        "dgxb200",
        "multiprocessors",
        "model 18 SMs per slice (7g 126), Tessera 21 (7g 148 = all SMs): guide gives only fractions; unverified",
    ),
    (
        "dgxb200",
        "engines",
        "guide: CE 2/3/6/8/16, 1 NVDEC, 1 JPEG, no NVENC; model has n NVDEC/NVENC/JPEG per ng: Tessera right",
    ),
    (
        "dgxb200",
        "placements",
        "guide: 3g and 4g take 4/8 of memory, 7g all 8, 1g.45gb 2/8; model: sizes 3, 7, 1: Tessera right",
    ),
];

/// The built models: the directory holding `libnvidia-ml.so.1` and `nvml-model`, or
/// `None` (skipped) when `go` is missing and `CI` is unset.
pub(crate) fn built() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let have_go = Command::new("go")
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success());
            if !have_go {
                testkit::prereq::skip_or_fail(
                    "nvml_models: `go` is not on PATH",
                    "install Go (1.24 or later) to build tests/nvml-models",
                );
                return None;
            }
            let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nvml-models");
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nvml-models/build.sh");
            let started = std::time::Instant::now();
            let run = Command::new(&script)
                .arg(&out)
                .output()
                .expect("run tests/nvml-models/build.sh");
            assert!(
                run.status.success(),
                "tests/nvml-models/build.sh failed ({})\n{}{}",
                run.status,
                String::from_utf8_lossy(&run.stdout),
                String::from_utf8_lossy(&run.stderr)
            );
            testkit::prereq::report(format_args!(
                "nvml_models: build.sh {:.1}s: {}",
                started.elapsed().as_secs_f64(),
                String::from_utf8_lossy(&run.stdout).trim()
            ));
            Some(out)
        })
        .as_deref()
}

/// A model with its own state dir (so its UUIDs are fixed for the test).
pub(crate) struct Model {
    pub(crate) name: &'static str,
    pub(crate) dir: tempfile::TempDir,
    bin: PathBuf,
    pub(crate) lib: PathBuf,
}

impl Model {
    /// `name`, with MIG mode `mig` on every GPU.
    pub(crate) fn new(built: &Path, name: &'static str, mig: bool) -> Self {
        let m = Model {
            name,
            dir: tempfile::tempdir().expect("temp dir"),
            bin: built.join("nvml-model"),
            lib: built.join("libnvidia-ml.so.1"),
        };
        m.cli(&["mig-mode", if mig { "on" } else { "off" }]);
        m
    }

    pub(crate) fn state(&self) -> PathBuf {
        self.dir.path().join("model")
    }

    fn cli(&self, args: &[&str]) -> Vec<u8> {
        let out = Command::new(&self.bin)
            .args(args)
            .env("TESSERA_NVML_MODEL", self.name)
            .env("TESSERA_NVML_MODEL_STATE", self.state())
            .output()
            .expect("run nvml-model");
        assert!(
            out.status.success(),
            "nvml-model {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// `nvml-model dump`: the ground truth.
    pub(crate) fn dump(&self) -> Value {
        serde_json::from_slice(&self.cli(&["dump"])).expect("dump is JSON")
    }

    /// Replaces `control.json` whole (temp file + rename: a call reads one state or
    /// the next, never half of one).
    pub(crate) fn control(&self, control: &Value) {
        let path = self.state().join("control.json");
        let tmp = self.state().join(".control.json.tmp");
        std::fs::write(&tmp, control.to_string()).expect("write control.json");
        std::fs::rename(&tmp, &path).expect("rename control.json");
    }

    /// `control.json`: the exports the model refuses.
    fn refuse(&self, symbols: &[&str]) {
        self.control(&json!({ "refuse": symbols }));
    }

    /// Tessera's discovery and slices in a child process: `Ok((inventory, slices,
    /// warnings))` or `Err(the discovery error)`.
    fn publish(&self, test_name: &str) -> Result<(Value, Value, Vec<String>), String> {
        let out = self.dir.path().join("out");
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).expect("out dir");
        let run = Command::new(std::env::current_exe().expect("test binary"))
            .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, test_name)
            .env(LIB_ENV, &self.lib)
            .env(OUT_ENV, &out)
            .env("TESSERA_NVML_MODEL", self.name)
            .env("TESSERA_NVML_MODEL_STATE", self.state())
            .output()
            .expect("spawn the child");
        let stdout = String::from_utf8_lossy(&run.stdout);
        assert!(
            run.status.success() && stdout.contains("test result: ok. 1 passed"),
            "child for `{test_name}` failed ({})\n{stdout}\n{}",
            run.status,
            String::from_utf8_lossy(&run.stderr)
        );
        let read = |f: &str| std::fs::read_to_string(out.join(f));
        let warnings: Vec<String> = read("warnings.log")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("WARN"))
            .map(str::to_string)
            .collect();
        if let Ok(error) = read("error.txt") {
            return Err(error);
        }
        let json = |f: &str| serde_json::from_str(&read(f).expect(f)).expect(f);
        Ok((json("inventory.json"), json("slices.json"), warnings))
    }
}

/// Runs `test_name` in a child with the model's environment and `step` (what the
/// child does, see [`mig_step`]); returns its exit status and output.
fn run_child(model: &Model, test_name: &str, step: &str) -> (std::process::ExitStatus, String) {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, test_name)
        .env(LIB_ENV, &model.lib)
        .env(OUT_ENV, model.dir.path())
        .env(STEP_ENV, step)
        .env("TESSERA_NVML_MODEL", model.name)
        .env("TESSERA_NVML_MODEL_STATE", model.state())
        .output()
        .expect("spawn the child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

/// The step a MIG child runs.
const STEP_ENV: &str = "TESSERA_NVML_MODELS_STEP";

/// In a child: `create` makes a MIG device (1g, placement 3) on GPU 0 through Tessera's
/// NVML backend and dies by SIGKILL without shutting NVML down; `destroy` reads the
/// MIG status, checks the device is there and destroys it.
fn mig_step() {
    use tessera::inventory::GpuBackend;
    let lib = PathBuf::from(std::env::var_os(LIB_ENV).expect("library"));
    let dir = PathBuf::from(std::env::var_os(OUT_ENV).expect("dir"));
    let nvml =
        tessera::inventory::nvml::NvmlBackend::new(Some(lib), dir.join("proc"), dir.join("sys"))
            .expect("NVML initialises");
    match std::env::var(STEP_ENV).as_deref() {
        Ok("create") => {
            // 1g.10gb by Tessera's (and NVML's) ID, 19; the backend asks the model for
            // its own ID of that profile (its index, 0).
            let made = nvml.create_mig(0, 19, 3).expect("create_mig");
            assert_eq!((made.start, made.size), (3, 1), "{made:?}");
            println!("created GI {}", made.gi_id);
            // SAFETY: kill(2) on our own pid: the child dies as by `kill -9`.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            unreachable!("SIGKILL");
        }
        Ok("destroy") => {
            let status = nvml.mig_status(0).expect("mig_status");
            assert!(status.enabled);
            let [gi] = status.instances.as_slice() else {
                panic!("want one MIG device, got {status:?}")
            };
            assert_eq!((gi.profile_id, gi.start, gi.size), (19, 3, 1), "{gi:?}");
            let ci = gi.ci.as_ref().expect("a compute instance");
            assert!(ci.uuid.starts_with("MIG-"), "{ci:?}");
            println!("MIG device {}", ci.uuid);
            // The model refuses what overlaps it, as NVML does: the same placement, and
            // 2g.20gb (ID 14) at slices 2-3.
            for (profile, start) in [(19, 3), (14, 2)] {
                let refused = nvml.create_mig(0, profile, start).unwrap_err();
                assert!(
                    matches!(
                        refused,
                        tessera::inventory::BackendError::Mig {
                            source: tessera::mig::MigError::InsufficientResources(_),
                            ..
                        }
                    ),
                    "profile {profile} at {start}: {refused:?}"
                );
            }
            nvml.destroy_mig(0, gi.gi_id).expect("destroy_mig");
            assert!(nvml.mig_status(0).unwrap().instances.is_empty());
        }
        Ok("usage") => {
            // What the watchdog and the compute controller read, as JSON lines.
            for minor in [0, 1] {
                let processes: Vec<_> = match nvml.processes(minor) {
                    Ok(v) => v
                        .iter()
                        .map(|p| json!([p.pid, p.used_bytes, p.gi_id]))
                        .collect(),
                    Err(e) => vec![json!(format!("{e:?}"))],
                };
                let samples: Vec<_> = match nvml.process_utilization(minor, 1000) {
                    Ok(v) => v
                        .iter()
                        .map(|s| json!([s.pid, s.timestamp_us, s.sm_percent]))
                        .collect(),
                    Err(e) => vec![json!(format!("{e:?}"))],
                };
                let usage = match nvml.usage(minor) {
                    Ok(u) => json!(u.map(|u| u.utilization_percent)),
                    Err(e) => json!(format!("{e:?}")),
                };
                println!(
                    "USAGE {}",
                    json!({"gpu": minor, "processes": processes, "samples": samples, "utilization": usage})
                );
            }
        }
        other => panic!("unknown step {other:?}"),
    }
}

/// In a child started by [`Model::publish`] for `test_name`: discovers the node through
/// the model's library, writes the inventory and slices (or the error) and the log's
/// warnings, and returns `true`. In the parent: `false`.
fn child(test_name: &str) -> bool {
    if std::env::var(CHILD_ENV).ok().as_deref() != Some(test_name) {
        return false;
    }
    let lib = PathBuf::from(std::env::var_os(LIB_ENV).expect("library"));
    let out = PathBuf::from(std::env::var_os(OUT_ENV).expect("out dir"));
    let log = std::fs::File::create(out.join("warnings.log")).expect("log file");
    tracing_subscriber::fmt()
        .with_writer(std::sync::Mutex::new(log))
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .init();
    let proc_root = out.join("proc");
    let sys_root = out.join("sys");
    std::fs::create_dir_all(&proc_root).unwrap();
    std::fs::create_dir_all(&sys_root).unwrap();
    std::fs::write(
        proc_root.join("devices"),
        "Character devices:\n195 nvidia\n508 nvidia-uvm\n511 nvidia-caps\n",
    )
    .unwrap();
    let paths = BackendPaths {
        state_dir: out.join("tessera"),
        proc_root,
        sys_root,
    };
    match load_node(
        &BackendSpec::Nvml(Some(lib)),
        None,
        &paths,
        StateAccess::ReadOnly,
    ) {
        Ok(node) => {
            let version = KubeVersion::NEWEST;
            let features = ServerFeatures::from_gates(&FeatureGates::defaults(version));
            let slices = node.pool("gpu.tessera.dev", "node-a", version, features);
            let write = |f: &str, v: String| std::fs::write(out.join(f), v).unwrap();
            write(
                "inventory.json",
                serde_json::to_string(&node.inventory).unwrap(),
            );
            write("slices.json", serde_json::to_string(&slices).unwrap());
        }
        Err(e) => std::fs::write(out.join("error.txt"), format!("{e:#}")).unwrap(),
    }
    true
}

/// The published devices of all slices, by name.
fn devices(slices: &Value) -> BTreeMap<String, Value> {
    slices
        .as_array()
        .expect("slices")
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| (d["name"].as_str().unwrap().to_string(), d))
        .collect()
}

fn attr<'a>(device: &'a Value, name: &str) -> &'a Value {
    let a = &device["attributes"][name];
    a.get("string")
        .or_else(|| a.get("int"))
        .or_else(|| a.get("bool"))
        .or_else(|| a.get("version"))
        .unwrap_or(&Value::Null)
}

/// A whole GPU as both sides see it.
fn gpu_facts(
    uuid: &Value,
    name: &Value,
    memory: u64,
    bus: &Value,
    cc: &Value,
    capable: bool,
    enabled: bool,
) -> Value {
    json!({ "uuid": uuid, "name": name, "memory": memory, "pciBusId": bus,
            "cudaComputeCapability": cc, "migCapable": capable, "migEnabled": enabled })
}

/// The whole-GPU devices Tessera published (and the MIG mode its inventory read),
/// against the model's dump, GPU by GPU.
fn assert_gpus_match(model: &str, dump: &Value, inventory: &Value, slices: &Value) {
    let devices = devices(slices);
    let gpus = dump["gpus"].as_array().unwrap();
    assert_eq!(inventory["gpus"].as_array().unwrap().len(), gpus.len());
    for g in gpus {
        let minor = g["minor"].as_u64().unwrap();
        let inv = inventory["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["minor"] == minor)
            .unwrap();
        let published = match devices.get(&format!("gpu-{minor}")) {
            Some(d) => gpu_facts(
                attr(d, "uuid"),
                attr(d, "productName"),
                d["capacity"]["memory"]["value"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap(),
                attr(d, ATTR_PCI_BUS_ID),
                attr(d, "cudaComputeCapabilityString"),
                attr(d, "migCapable").as_bool().unwrap(),
                inv["migEnabled"].as_bool().unwrap(),
            ),
            // A MIG-on GPU whose mode Tessera never toggles (Ampere, or a product it
            // knows only from NVML) is published as its partitions alone: their parent
            // attributes, and the inventory's memory.
            None => {
                let d = devices
                    .iter()
                    .find(|(n, _)| n.starts_with(&format!("gpu-{minor}-mig-")))
                    .map(|(_, d)| d)
                    .unwrap_or_else(|| panic!("{model}: no device gpu-{minor} nor partitions"));
                gpu_facts(
                    attr(d, "parentUUID"),
                    attr(d, "productName"),
                    inv["memoryBytes"].as_u64().unwrap_or(0),
                    attr(d, ATTR_PCI_BUS_ID),
                    attr(d, "cudaComputeCapabilityString"),
                    true,
                    inv["migEnabled"].as_bool().unwrap(),
                )
            }
        };
        let truth = gpu_facts(
            &g["uuid"],
            &g["name"],
            g["memoryBytes"].as_u64().unwrap(),
            &g["pciBusId"],
            &g["cudaComputeCapability"],
            g["migCapable"].as_bool().unwrap(),
            g["migEnabled"].as_bool().unwrap(),
        );
        assert_eq!(published, truth, "{model}: gpu-{minor}");
    }
}

/// One GPU-instance profile, keyed by NVML profile index: ID, memory (MiB), SMs,
/// engines (CE, dec, enc, JPEG, OFA), placements (start, size).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Profile {
    id: u64,
    memory_mib: u64,
    multiprocessors: u64,
    engines: [u64; 5],
    placements: BTreeSet<(u64, u64)>,
}

fn model_profiles(gpu: &Value) -> BTreeMap<u64, Profile> {
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap();
    gpu["migProfiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let placements = p["placements"]
                .as_array()
                .unwrap()
                .iter()
                .map(|pl| (n(pl, "start"), n(pl, "size")))
                .collect();
            let engines = [
                "copyEngineCount",
                "decoderCount",
                "encoderCount",
                "jpegCount",
                "ofaCount",
            ]
            .map(|k| n(p, k));
            let profile = Profile {
                id: n(p, "id"),
                memory_mib: n(p, "memorySizeMB"),
                multiprocessors: n(p, "multiprocessorCount"),
                engines,
                placements,
            };
            (n(p, "index"), profile)
        })
        .collect()
}

/// The partitions Tessera published for GPU `minor`, per NVML profile index: a
/// catalogued product's by its catalog, one the catalog lacks by the model's own IDs
/// (its partitions carry NVML's).
fn published_profiles(
    devices: &BTreeMap<String, Value>,
    minor: u32,
    product: &str,
    model: &BTreeMap<u64, Profile>,
) -> BTreeMap<u64, Profile> {
    let catalog = tessera::mig::catalog::catalogued(product);
    let mut out: BTreeMap<u64, Profile> = BTreeMap::new();
    for (name, d) in devices {
        let Some(DeviceRef::Mig {
            minor: m,
            profile,
            gi_profile_id,
            placement_start,
        }) = parse_device_name(name)
        else {
            continue;
        };
        if m != minor {
            continue;
        }
        let index = match catalog {
            Some(catalog) => u64::from(
                catalog
                    .profiles
                    .iter()
                    .find(|p| p.name == attr(d, "profile").as_str().unwrap())
                    .unwrap_or_else(|| panic!("{name}: profile {profile} not in the catalog"))
                    .nvml_index,
            ),
            None => {
                *model
                    .iter()
                    .find(|(_, p)| p.id == u64::from(gi_profile_id))
                    .unwrap_or_else(|| {
                        panic!("{name}: profile ID {gi_profile_id} not in the model")
                    })
                    .0
            }
        };
        let cap = |k: &str| -> u64 { d["capacity"][k]["value"].as_str().unwrap().parse().unwrap() };
        let size = d["consumesCounters"][0]["counters"]
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| k.starts_with("memory-slice-"))
            .count() as u64;
        let e = out.entry(index).or_insert_with(|| Profile {
            id: u64::from(gi_profile_id),
            memory_mib: cap("memory") >> 20,
            multiprocessors: cap("multiprocessors"),
            engines: [
                "copyEngines",
                "decoders",
                "encoders",
                "jpegEngines",
                "ofaEngines",
            ]
            .map(cap),
            placements: BTreeSet::new(),
        });
        e.placements.insert((u64::from(placement_start), size));
    }
    out
}

/// Tessera's catalog entry for `product`, in the same form (for GPUs it publishes whole).
fn catalog_profiles(product: &str) -> BTreeMap<u64, Profile> {
    let catalog = tessera::mig::model_for_product(product).expect("catalogued product");
    catalog
        .profiles
        .iter()
        .map(|p| {
            let profile = Profile {
                id: u64::from(p.profile_id),
                memory_mib: p.memory_mib,
                multiprocessors: u64::from(p.multiprocessors),
                engines: [
                    p.copy_engines,
                    p.decoders,
                    p.encoders,
                    p.jpeg_engines,
                    p.ofa_engines,
                ]
                .map(u64::from),
                placements: p
                    .placements
                    .iter()
                    .map(|s| (u64::from(*s), u64::from(p.memory_slices)))
                    .collect(),
            };
            (u64::from(p.nvml_index), profile)
        })
        .collect()
}

/// The kinds of difference between two profile tables, with the details.
fn profile_differences(
    model: &BTreeMap<u64, Profile>,
    tessera: &BTreeMap<u64, Profile>,
) -> BTreeMap<&'static str, Vec<String>> {
    let mut d: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for (index, m) in model {
        let Some(t) = tessera.get(index) else {
            d.entry("profiles only in the model")
                .or_default()
                .push(format!("index {index} (ID {})", m.id));
            continue;
        };
        let mut diff = |kind, same: bool, what: String| {
            if !same {
                d.entry(kind)
                    .or_default()
                    .push(format!("index {index}: {what}"));
            }
        };
        diff(
            "profile ids",
            m.id == t.id,
            format!("model {} vs Tessera {}", m.id, t.id),
        );
        diff(
            "memory",
            m.memory_mib == t.memory_mib,
            format!("model {} MiB vs Tessera {} MiB", m.memory_mib, t.memory_mib),
        );
        diff(
            "multiprocessors",
            m.multiprocessors == t.multiprocessors,
            format!(
                "model {} vs Tessera {}",
                m.multiprocessors, t.multiprocessors
            ),
        );
        diff(
            "engines",
            m.engines == t.engines,
            format!("model {:?} vs Tessera {:?}", m.engines, t.engines),
        );
        diff(
            "placements",
            m.placements == t.placements,
            format!("model {:?} vs Tessera {:?}", m.placements, t.placements),
        );
    }
    for (index, t) in tessera {
        if !model.contains_key(index) {
            d.entry("profiles only in Tessera")
                .or_default()
                .push(format!("index {index} (ID {})", t.id));
        }
    }
    d
}

/// The real product name Tessera's catalog should know each model's GPU by.
fn catalog_product(model: &str) -> &'static str {
    match model {
        "dgxa100" => "NVIDIA A100-SXM4-40GB",
        "dgxh100" => "NVIDIA H100 80GB HBM3",
        "dgxh200" => "NVIDIA H200",
        "dgxb200" => "NVIDIA B200",
        other => panic!("unknown model {other}"),
    }
}

/// For each model with MIG off and on: every GPU Tessera publishes equals the model's
/// dump (UUID, name, memory, PCI bus ID, compute capability, MIG capable and mode);
/// discovery logs no warning, since every optional query the model answers.
#[test]
fn published_gpus_equal_each_models_dump() {
    const NAME: &str = "nvml_models::published_gpus_equal_each_models_dump";
    if child(NAME) {
        return;
    }
    let Some(built) = built() else { return };
    for name in MODELS {
        for mig in [false, true] {
            let model = Model::new(built, name, mig);
            let dump = model.dump();
            let (inventory, slices, warnings) = model
                .publish(NAME)
                .unwrap_or_else(|e| panic!("{name} (MIG {mig}): discovery failed: {e}"));
            assert_gpus_match(name, &dump, &inventory, &slices);
            // go-nvml's models have no core count: the one warning names it, and, with
            // MIG off, a product the catalog lacks (its profiles are NVML's, read only
            // with MIG on): its GPUs are published whole, without partitions.
            assert_eq!(warnings.len(), 1, "{name}: {warnings:#?}");
            assert!(
                warnings[0].contains("nvmlDeviceGetNumGpuCores"),
                "{name}: {warnings:#?}"
            );
            let product = dump["gpus"][0]["name"].as_str().unwrap();
            let unknown = tessera::mig::catalog::catalogued(product).is_none();
            let named = warnings[0].matches("not in Tessera's catalog").count();
            assert_eq!(
                named,
                if unknown && !mig {
                    dump["gpus"].as_array().unwrap().len()
                } else {
                    0
                },
                "{name} (MIG {mig}): {warnings:#?}"
            );
            let partitions = devices(&slices)
                .keys()
                .filter(|n| n.contains("-mig-"))
                .count();
            if unknown && !mig {
                assert_eq!(partitions, 0, "{name}: MIG off, not catalogued");
            } else {
                assert!(partitions > 0, "{name} (MIG {mig}): no partitions");
            }
        }
    }
}

/// For each model with MIG on: Tessera's catalog entry for the model's GPU against the
/// model's tables; every difference is listed in KNOWN_DIFFERENCES, and every entry
/// there is still a difference. A catalogued product is published as its catalog says;
/// one the catalog lacks is published exactly as the model's tables say (read from
/// NVML: every profile, placement, ID, memory, SM and engine count).
#[test]
fn mig_partitions_differ_from_the_models_only_as_known() {
    const NAME: &str = "nvml_models::mig_partitions_differ_from_the_models_only_as_known";
    if child(NAME) {
        return;
    }
    let Some(built) = built() else { return };
    let mut found: BTreeMap<(&str, &str), Vec<String>> = BTreeMap::new();
    for name in MODELS {
        let model = Model::new(built, name, true);
        let dump = model.dump();
        let (_, slices, _) = model
            .publish(NAME)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let devices = devices(&slices);
        let gpu = &dump["gpus"][0];
        let product = gpu["name"].as_str().unwrap();
        let model_tables = model_profiles(gpu);
        let published = published_profiles(&devices, 0, product, &model_tables);
        let tessera = if tessera::mig::catalog::catalogued(product).is_some() {
            published
        } else {
            assert_eq!(
                profile_differences(&model_tables, &published),
                BTreeMap::new(),
                "{name}: {product:?} is not catalogued: its partitions are NVML's"
            );
            found
                .entry((name, "product name"))
                .or_default()
                .push(format!("{product:?}: not in the catalog"));
            catalog_profiles(catalog_product(name))
        };
        for (kind, details) in profile_differences(&model_tables, &tessera) {
            found.entry((name, kind)).or_default().extend(details);
        }
        // Every GPU of the system is the same part: the rest publish as GPU 0 does.
        for g in dump["gpus"].as_array().unwrap().iter().skip(1) {
            let minor = g["minor"].as_u64().unwrap();
            let mig = devices
                .keys()
                .filter(|n| n.starts_with(&format!("gpu-{minor}-mig-")))
                .count();
            let first = devices
                .keys()
                .filter(|n| n.starts_with("gpu-0-mig-"))
                .count();
            assert_eq!(mig, first, "{name}: gpu-{minor}");
        }
    }
    for ((model, kind), details) in &found {
        testkit::prereq::report(format_args!(
            "nvml_models: {model}: {kind}: {}",
            details.join("; ")
        ));
    }
    let found_keys: BTreeSet<(&str, &str)> = found.keys().copied().collect();
    let known: BTreeSet<(&str, &str)> =
        KNOWN_DIFFERENCES.iter().map(|(m, k, _)| (*m, *k)).collect();
    let unknown: Vec<_> = found_keys
        .difference(&known)
        .map(|k| (k, &found[k]))
        .collect();
    let gone: Vec<_> = known.difference(&found_keys).collect();
    assert!(
        unknown.is_empty(),
        "differences not in KNOWN_DIFFERENCES: {unknown:#?}"
    );
    assert!(
        gone.is_empty(),
        "KNOWN_DIFFERENCES that are no longer found: {gone:?}"
    );
}

/// Optional queries refused one at a time (control.json) still publish every GPU,
/// without that query's attribute, with one warning for the node; a refused required
/// query fails discovery, naming the call.
#[test]
fn discovery_degrades_on_optional_queries_and_fails_on_required_ones() {
    const NAME: &str =
        "nvml_models::discovery_degrades_on_optional_queries_and_fails_on_required_ones";
    if child(NAME) {
        return;
    }
    let Some(built) = built() else { return };
    let model = Model::new(built, "dgxh100", true);
    let dump = model.dump();
    // (refused call, the whole-GPU attribute or capacity it leaves out)
    let optional = [
        ("nvmlDeviceGetBrand", Some("brand")),
        ("nvmlDeviceGetArchitecture", Some("architecture")),
        ("nvmlDeviceGetNumGpuCores", Some("multiprocessors")),
        ("nvmlDeviceGetNumaNodeId", None),
        ("nvmlDeviceGetMigMode", None),
        ("nvmlDeviceGetGpuInstanceProfileInfo", None),
        ("nvmlDeviceGetGpuInstancePossiblePlacements_v2", None),
        ("nvmlDeviceGetGpuInstances", None),
    ];
    for (call, left_out) in optional {
        model.refuse(&[call]);
        let (inventory, slices, warnings) = model
            .publish(NAME)
            .unwrap_or_else(|e| panic!("refusing {call} broke discovery: {e}"));
        let devices = devices(&slices);
        for g in dump["gpus"].as_array().unwrap() {
            let d = &devices[&format!("gpu-{}", g["minor"])];
            assert_eq!(attr(d, "uuid"), &g["uuid"], "{call}");
            if let Some(what) = left_out {
                assert!(
                    d["attributes"].get(what).is_none(),
                    "{call}: {what} published"
                );
                assert!(
                    d["capacity"].get(what).is_none(),
                    "{call}: {what} published"
                );
            }
        }
        assert_eq!(
            inventory["gpus"].as_array().unwrap().len(),
            dump["gpus"].as_array().unwrap().len()
        );
        // One warning per node and source, whatever the number of GPUs: discovery's
        // optional queries (the models never answer the core count, so it is always
        // there), and the MIG state of the node's MIG-mode GPUs.
        let count = |what: &str| warnings.iter().filter(|w| w.contains(what)).count();
        assert_eq!(count("optional queries"), 1, "{call}: {warnings:#?}");
        assert!(count("MIG state") <= 1, "{call}: {warnings:#?}");
        assert_eq!(
            warnings.len(),
            count("optional queries") + count("MIG state"),
            "{call}: {warnings:#?}"
        );
        if warnings.iter().all(|w| !w.contains(call)) {
            testkit::prereq::report(format_args!(
                "nvml_models: refusing {call} leaves no warning naming it (NOT_SUPPORTED is an answer there)"
            ));
        }
    }
    for call in [
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetPciInfo_v3",
    ] {
        model.refuse(&[call]);
        let err = model
            .publish(NAME)
            .err()
            .unwrap_or_else(|| panic!("refusing {call} still published"));
        assert!(err.contains(call), "{call}: {err}");
    }
}

/// A MIG device Tessera creates through the model outlives the process that made it,
/// even one killed with SIGKILL: the next process (and `nvml-model dump`) sees it, and
/// destroying it there leaves none.
#[test]
fn mig_devices_outlive_a_killed_process() {
    const NAME: &str = "nvml_models::mig_devices_outlive_a_killed_process";
    if std::env::var(CHILD_ENV).ok().as_deref() == Some(NAME) {
        mig_step();
        return;
    }
    let Some(built) = built() else { return };
    let model = Model::new(built, "dgxh100", true);
    let (status, out) = run_child(&model, NAME, "create");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "create: {status}\n{out}"
    );
    assert!(out.contains("created GI"), "{out}");
    let dump = model.dump();
    let gis = dump["gpus"][0]["gpuInstances"].as_array().unwrap();
    assert_eq!(gis.len(), 1, "{dump:#}");
    assert_eq!(gis[0]["placement"], json!({"start": 3, "size": 1}));
    let uuid = gis[0]["computeInstances"][0]["uuid"].as_str().unwrap();
    let (status, out) = run_child(&model, NAME, "destroy");
    assert!(
        status.success() && out.contains("1 passed"),
        "destroy: {status}\n{out}"
    );
    assert!(
        out.contains(&format!("MIG device {uuid}")),
        "the MIG UUID outlives the process: {uuid}\n{out}"
    );
    assert!(
        model.dump()["gpus"][0]["gpuInstances"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

/// `tessera inventory --backend nvml:LIB` itself (the CLI, a child process with the
/// model's environment): dgxh100 with MIG on publishes the model's GPUs, and its
/// partitions as the in-process pool does.
#[test]
fn tessera_inventory_on_the_dgxh100_model_publishes_its_gpus() {
    let Some(built) = built() else { return };
    let model = Model::new(built, "dgxh100", true);
    let dump = model.dump();
    let host = model.dir.path().join("host");
    std::fs::create_dir_all(host.join("proc")).unwrap();
    std::fs::create_dir_all(host.join("sys")).unwrap();
    std::fs::write(
        host.join("proc/devices"),
        "Character devices:\n195 nvidia\n508 nvidia-uvm\n511 nvidia-caps\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("inventory")
        .arg(format!("--backend=nvml:{}", model.lib.display()))
        .arg("--proc-root")
        .arg(host.join("proc"))
        .arg("--sys-root")
        .arg(host.join("sys"))
        .arg("--state-dir")
        .arg(host.join("state"))
        .args(["--node-name", "node-a", "-o", "json"])
        .env("TESSERA_NVML_MODEL", model.name)
        .env("TESSERA_NVML_MODEL_STATE", model.state())
        .env_remove("TESSERA_BACKEND")
        .env_remove("TESSERA_CONFIG")
        .output()
        .expect("run tessera inventory");
    assert!(
        out.status.success(),
        "tessera inventory: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_slice(&out.stdout).expect("a JSON List");
    let slices = &list["items"];
    // The CLI does not print the inventory; MIG mode is the dump's own.
    let inventory = json!({ "gpus": dump["gpus"].as_array().unwrap().iter()
        .map(|g| json!({ "minor": g["minor"], "migEnabled": g["migEnabled"] })).collect::<Vec<_>>() });
    assert_gpus_match("dgxh100", &dump, &inventory, slices);
    let devices = devices(slices);
    // 8 GPUs, each whole plus one device per profile and placement (Tessera's H100
    // catalog: 1g.10gb 7, 1g.10gb+me 7, 1g.20gb 4, 2g.20gb 3, 3g.40gb 2, 4g 1, 7g 1).
    let partitions = devices.keys().filter(|n| n.contains("-mig-")).count();
    assert_eq!(
        partitions,
        8 * 25,
        "{:?}",
        devices.keys().collect::<Vec<_>>()
    );
    assert_eq!(devices.len(), 8 + 8 * 25);
    // The counters add up: each partition consumes only counters of its GPU's set, never
    // more than the set holds, and 7g.80gb consumes all 8 memory slices.
    let sets: BTreeMap<String, BTreeMap<String, u64>> = slices
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| {
            s["spec"]["sharedCounters"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|c| {
            let counters = c["counters"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v["value"].as_str().unwrap().parse().unwrap()))
                .collect();
            (c["name"].as_str().unwrap().to_string(), counters)
        })
        .collect();
    assert_eq!(sets.len(), 8, "{:?}", sets.keys().collect::<Vec<_>>());
    for (name, d) in devices.iter().filter(|(n, _)| n.contains("-mig-")) {
        let minor = name.split('-').nth(1).unwrap();
        let use_ = &d["consumesCounters"][0];
        assert_eq!(
            use_["counterSet"],
            format!("gpu-{minor}-counters"),
            "{name}"
        );
        let set = &sets[use_["counterSet"].as_str().unwrap()];
        assert_eq!(
            set.keys()
                .filter(|k| k.starts_with("memory-slice-"))
                .count(),
            8
        );
        for (k, v) in use_["counters"].as_object().unwrap() {
            let v: u64 = v["value"].as_str().unwrap().parse().unwrap();
            assert!(v <= set[k], "{name}: {k} {v} > {}", set[k]);
        }
        if name.contains("-mig-7g80gb-") {
            let slices = use_["counters"]
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| k.starts_with("memory-slice-"))
                .count();
            assert_eq!(slices, 8, "{name}");
        }
    }
}

/// What go-nvml's models lack comes from `control.json`, through Tessera's own NVML
/// calls: without it (or with a GPU not listed) processes and utilization are
/// NOT_SUPPORTED, as the models ship; listed, a GPU's processes (memory unavailable as
/// `None`, a MIG device's GPU instance), its utilization rate, and the process samples
/// newer than the time asked (1000 µs here) are what the file says.
#[test]
fn processes_and_utilization_come_from_the_control_file() {
    const NAME: &str = "nvml_models::processes_and_utilization_come_from_the_control_file";
    if std::env::var(CHILD_ENV).ok().as_deref() == Some(NAME) {
        mig_step();
        return;
    }
    let Some(built) = built() else { return };
    let model = Model::new(built, "dgxh100", false);
    // A refused call: Tessera's error names NVML's NOT_SUPPORTED.
    let unsupported = |s: &Value| s.as_str().is_some_and(|s| s.contains("NotSupported"));
    /// GPU 0's processes, samples and utilization rate.
    type Gpu0 = (Value, Value, Value);
    // (control.json, GPU 0's answers (None: NOT_SUPPORTED), GPU 1's processes)
    let cases: Vec<(Value, Option<Gpu0>, Value)> = vec![
        (json!({}), None, Value::Null),
        (
            json!({
                "processes": {"0": [
                    {"pid": 41, "usedBytes": 1048576},
                    {"pid": 42, "usedBytes": null, "gpuInstanceId": 3, "computeInstanceId": 0}
                ]},
                "utilization": {"0": {"gpu": 57, "memory": 12, "samples": [
                    {"pid": 41, "timestampUs": 500, "sm": 90},
                    {"pid": 41, "timestampUs": 2000, "sm": 30},
                    {"pid": 42, "timestampUs": 3000, "sm": 20}
                ]}}
            }),
            Some((
                json!([[41, 1048576, null], [42, null, 3]]),
                json!([[41, 2000, 30], [42, 3000, 20]]),
                json!(57),
            )),
            json!([]),
        ),
    ];
    for (control, gpu0, gpu1_processes) in cases {
        model.control(&control);
        let (status, out) = run_child(&model, NAME, "usage");
        assert!(
            status.success() && out.contains("1 passed"),
            "{control}: {status}\n{out}"
        );
        let lines: Vec<Value> = out
            .lines()
            .filter_map(|l| l.split_once("USAGE ").map(|(_, j)| j))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{out}");
        match gpu0 {
            None => {
                for l in &lines {
                    assert!(unsupported(&l["processes"][0]), "{control}: {l}");
                    assert!(unsupported(&l["samples"][0]), "{control}: {l}");
                    // Utilization NOT_SUPPORTED is no utilization, not an error.
                    assert_eq!(l["utilization"], Value::Null, "{control}: {l}");
                }
            }
            Some((processes, samples, utilization)) => {
                assert_eq!(lines[0]["processes"], processes, "{control}");
                assert_eq!(lines[0]["samples"], samples, "{control}");
                assert_eq!(lines[0]["utilization"], utilization, "{control}");
                assert_eq!(lines[1]["processes"], gpu1_processes, "{control}");
                assert!(
                    unsupported(&lines[1]["samples"][0]),
                    "{control}: {}",
                    lines[1]
                );
            }
        }
    }
}

/// A product the catalog lacks (dgxh200's), MIG on, whose profiles NVML does not list:
/// every GPU is still published whole, without partitions, with one warning for the
/// node saying why (the refused call, or that no profile is usable).
#[test]
fn an_uncatalogued_gpu_whose_profiles_nvml_refuses_is_published_whole() {
    const NAME: &str =
        "nvml_models::an_uncatalogued_gpu_whose_profiles_nvml_refuses_is_published_whole";
    if child(NAME) {
        return;
    }
    let Some(built) = built() else { return };
    let model = Model::new(built, "dgxh200", true);
    let dump = model.dump();
    let gpus = dump["gpus"].as_array().unwrap().len();
    // (refused call, what the warning says for each GPU)
    let cases = [
        (
            "nvmlDeviceGetGpuInstanceProfileInfo",
            "NVML lists none usable",
        ),
        (
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2 (",
        ),
    ];
    for (call, why) in cases {
        model.refuse(&[call]);
        let (_, slices, warnings) = model
            .publish(NAME)
            .unwrap_or_else(|e| panic!("refusing {call} broke discovery: {e}"));
        let devices = devices(&slices);
        for g in dump["gpus"].as_array().unwrap() {
            let d = &devices[&format!("gpu-{}", g["minor"])];
            assert_eq!(attr(d, "uuid"), &g["uuid"], "{call}");
        }
        assert_eq!(devices.len(), gpus, "{call}: only whole GPUs");
        assert_eq!(warnings.len(), 1, "{call}: {warnings:#?}");
        assert_eq!(
            warnings[0].matches(why).count(),
            gpus,
            "{call}: {warnings:#?}"
        );
        assert_eq!(
            warnings[0].matches("published whole").count(),
            gpus,
            "{call}: {warnings:#?}"
        );
    }
}
