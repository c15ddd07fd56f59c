//! MIG on demand through NVML on NVIDIA's own models (issue #41, stage 3): the real
//! `tessera plugin` binary with `--backend nvml:` on go-nvml's systems
//! (`tests/nvml-models`, MIG on), driven over the kubelet's gRPC. On every model
//! (dgxa100, dgxh100, dgxh200, dgxb200) every partition Tessera publishes for a GPU
//! prepares and unprepares, with its MIG device's UUID in the CDI spec, and claims
//! prepared at once land on distinct, non-overlapping placements. dgxh100's product
//! is in Tessera's catalog; the other three models name products it lacks, so their
//! partitions are the profiles and placements NVML (the model) lists. On dgxh100, a
//! crash at every fail point a MIG claim reaches, or a SIGKILL between any two NVML
//! calls that change MIG state (the model's `control.json`), is recovered at restart
//! with no instance leaked. The model's own state (`nvml-model dump`) is the ground
//! truth.

use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams};
use serde_json::Value;
use tessera::prepare::failpoints::FAIL_POINTS;
use testkit::harness::{ChildPlugin, Harness, NODE};
use testkit::kubelet_standin::{DraClient, KubeletClaim};

use crate::nvml_models::{MODELS, Model, built};

/// The plugin on `model`: `--backend nvml:<bridge>`, a `/proc` holding only the
/// driver's device majors, the watchdog off, and the model's environment.
pub(crate) async fn start(h: &Harness, model: &Model, fail_points: &str) -> ChildPlugin {
    let proc_root = h.dir.path().join("host-proc");
    std::fs::create_dir_all(&proc_root).unwrap();
    std::fs::write(
        proc_root.join("devices"),
        "Character devices:\n195 nvidia\n508 nvidia-uvm\n511 nvidia-caps\n",
    )
    .unwrap();
    ChildPlugin::start_with(
        Path::new(env!("CARGO_BIN_EXE_tessera")),
        &h.api,
        h.dir.path(),
        fail_points,
        &[
            "--backend".into(),
            format!("nvml:{}", model.lib.display()).into(),
            "--proc-root".into(),
            proc_root.into(),
            // The model lists no processes (NOT_SUPPORTED): nothing to watch.
            "--watchdog".into(),
            "off".into(),
        ],
        &[
            ("TESSERA_NVML_MODEL", OsString::from(model.name)),
            ("TESSERA_NVML_MODEL_STATE", model.state().into()),
        ],
    )
    .await
}

/// The MIG partitions the plugin published for GPU `minor` (waits for its slices).
async fn published_mig(h: &Harness, minor: u32) -> Vec<String> {
    let api: Api<ResourceSlice> = Api::all(h.api.client().unwrap());
    let prefix = format!("gpu-{minor}-mig-");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let slices = api.list(&ListParams::default()).await.unwrap();
        let mut names: Vec<String> = slices
            .items
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .map(|d| d.name.clone())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        if !names.is_empty() {
            names.sort();
            return names;
        }
        assert!(Instant::now() < deadline, "the plugin published no slices");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The memory slice a partition's name places it at (`gpu-0-mig-3g40gb-9-4`: 4).
fn start_of(device: &str) -> u64 {
    device.rsplit('-').next().unwrap().parse().unwrap()
}

/// GPU `minor`'s GPU instances in the model's state, by ID.
fn instances(model: &Model, minor: u64) -> Vec<Value> {
    let dump = model.dump();
    dump["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["minor"] == minor)
        .unwrap()["gpuInstances"]
        .as_array()
        .unwrap()
        .clone()
}

/// Every GPU instance of every GPU in the model's state, as `(minor, instance)`.
fn all_instances(model: &Model) -> Vec<(u64, Value)> {
    let dump = model.dump();
    dump["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| {
            let minor = g["minor"].as_u64().unwrap();
            g["gpuInstances"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |i| (minor, i.clone()))
        })
        .collect()
}

/// The one MIG device (compute instance) of a GPU instance: (GI ID, CI ID, UUID).
fn mig_device(gi: &Value) -> (u64, u64, String) {
    let cis = gi["computeInstances"].as_array().unwrap();
    assert_eq!(cis.len(), 1, "one compute instance: {gi:#}");
    let uuid = cis[0]["uuid"].as_str().unwrap().to_string();
    assert!(
        uuid.starts_with("MIG-") && uuid.len() == 40,
        "a MIG device UUID: {uuid:?}"
    );
    (
        gi["id"].as_u64().unwrap(),
        cis[0]["id"].as_u64().unwrap(),
        uuid,
    )
}

/// Asserts that the claim's CDI spec names the MIG device of GPU instance `gi` on GPU 0.
fn assert_spec_names(h: &Harness, c: &KubeletClaim, gi: &Value, when: &str) -> String {
    let (gi_id, ci_id, uuid) = mig_device(gi);
    let spec = std::fs::read_to_string(h.spec_path(&c.uid))
        .unwrap_or_else(|e| panic!("{when}: the claim's spec: {e}"));
    let env = format!("TESSERA_MIG_UUID_0_{gi_id}_{ci_id}={uuid}");
    assert!(spec.contains(&env), "{when}: {env} not in the spec\n{spec}");
    uuid
}

async fn prepare_ok(k: &DraClient, c: &KubeletClaim, when: &str) {
    let resp = k
        .prepare_v1(std::slice::from_ref(c))
        .await
        .unwrap_or_else(|e| panic!("{when}: prepare call failed: {e}"));
    assert_eq!(resp.claims[&c.uid].error, "", "{when}: prepare error");
    assert!(
        !resp.claims[&c.uid].devices.is_empty(),
        "{when}: no devices"
    );
}

async fn unprepare_ok(k: &DraClient, c: &KubeletClaim, when: &str) {
    let resp = k
        .unprepare_v1(std::slice::from_ref(c))
        .await
        .unwrap_or_else(|e| panic!("{when}: unprepare call failed: {e}"));
    assert_eq!(resp.claims[&c.uid].error, "", "{when}: unprepare error");
}

async fn claim(h: &Harness, name: &str, device: &str) -> KubeletClaim {
    h.allocated_claim(name, &[("gpu", NODE, device, None)], &[])
        .await
}

/// Tessera's spec files and temp files in the CDI dir.
fn tessera_cdi_files(h: &Harness) -> Vec<String> {
    h.cdi_files()
        .into_iter()
        .filter(|n| n.starts_with("tessera.dev-gpu-") || n.starts_with(".tessera-"))
        .collect()
}

/// The partitions Tessera publishes per GPU on each model: dgxh100 by its H100 catalog
/// (1g.10gb 7, 1g.10gb+me 7, 1g.20gb 4, 2g.20gb 3, 3g.40gb 2, 4g 1, 7g 1); the others,
/// whose product names the catalog lacks, one per placement of the model's tables
/// (dgxh200 and dgxb200 list seven 1-slice placements for their 1g.Ngb double-memory
/// profile, where the guide has four of two slices).
const PARTITIONS_PER_GPU: [(&str, usize); 4] = [
    ("dgxa100", 25),
    ("dgxh100", 25),
    ("dgxh200", 28),
    ("dgxb200", 28),
];

/// Every partition Tessera publishes for GPU 0 of each model prepares alone through
/// NodePrepareResources: the model then holds exactly one GPU instance, at the
/// partition's memory slice, with one compute instance whose MIG device UUID is in the
/// claim's CDI spec; NodeUnprepareResources leaves no instance and no spec.
#[tokio::test]
async fn every_published_partition_prepares_and_unprepares_on_every_model() {
    let Some(built) = built() else { return };
    assert_eq!(PARTITIONS_PER_GPU.map(|(m, _)| m), MODELS);
    for (name, count) in PARTITIONS_PER_GPU {
        let model = Model::new(built, name, true);
        let h = Harness::new().await;
        let child = start(&h, &model, "").await;
        let devices = published_mig(&h, 0).await;
        assert_eq!(devices.len(), count, "{name}: {devices:?}");
        let k = h.kubelet().await;
        let mut uuids = std::collections::BTreeSet::new();
        for (i, device) in devices.iter().enumerate() {
            let when = format!("{name}: {device}");
            let c = claim(&h, &format!("mig-{i}"), device).await;
            prepare_ok(&k, &c, &when).await;
            let gis = instances(&model, 0);
            assert_eq!(gis.len(), 1, "{when}: {gis:#?}");
            assert_eq!(gis[0]["placement"]["start"], start_of(device), "{when}");
            let uuid = assert_spec_names(&h, &c, &gis[0], &when);
            assert!(uuids.insert(uuid), "{when}: a MIG UUID seen before");
            unprepare_ok(&k, &c, &when).await;
            assert_eq!(all_instances(&model), [], "{when}: left behind");
            assert!(!h.spec_path(&c.uid).exists(), "{when}: spec removed");
        }
        // Tessera found MIG on and leaves it on.
        let dump = model.dump();
        for g in dump["gpus"].as_array().unwrap() {
            assert_eq!(g["migEnabled"], true, "{name}: {}", g["minor"]);
        }
        assert_eq!(tessera_cdi_files(&h), Vec::<String>::new(), "{name}");
        assert_eq!(h.checkpoint_claims(), Vec::<String>::new(), "{name}");
        child.terminate().await;
    }
}

/// Per model: four claims on GPU 0 whose placements are disjoint both in Tessera's
/// geometry and the model's, one more that overlaps the last of them, and its memory
/// slice. dgxh100's names are its catalog's (NVML's IDs); the other models' are the
/// model's own (profile ID = index; memory rounded up to GiB in the name).
struct Parallel {
    model: &'static str,
    devices: [&'static str; 4],
    overlapping: &'static str,
}

const PARALLEL: [Parallel; 4] = [
    Parallel {
        model: "dgxa100",
        devices: [
            "gpu-0-mig-1g5gb-0-0",
            "gpu-0-mig-1g5gb-0-1",
            "gpu-0-mig-2g10gb-1-2",
            "gpu-0-mig-3g20gb-2-4",
        ],
        overlapping: "gpu-0-mig-1g5gb-0-5",
    },
    Parallel {
        model: "dgxh100",
        devices: [
            "gpu-0-mig-1g10gb-19-0",
            "gpu-0-mig-1g10gb-19-1",
            "gpu-0-mig-2g20gb-14-2",
            "gpu-0-mig-3g40gb-9-4",
        ],
        overlapping: "gpu-0-mig-1g10gb-19-5",
    },
    Parallel {
        model: "dgxh200",
        devices: [
            "gpu-0-mig-1g18gb-0-0",
            "gpu-0-mig-1g18gb-0-1",
            "gpu-0-mig-2g35gb-1-2",
            "gpu-0-mig-3g71gb-2-4",
        ],
        overlapping: "gpu-0-mig-1g18gb-0-5",
    },
    Parallel {
        model: "dgxb200",
        devices: [
            "gpu-0-mig-1g23gb-0-0",
            "gpu-0-mig-1g23gb-0-1",
            "gpu-0-mig-2g45gb-1-2",
            "gpu-0-mig-3g90gb-2-4",
        ],
        overlapping: "gpu-0-mig-1g23gb-0-5",
    },
];

/// Claims on one GPU prepared at once (concurrent NodePrepareResources calls, then all
/// in one call) land on their own placements, which do not overlap, each with its own
/// MIG device; a claim overlapping them is refused and changes nothing; unprepared at
/// once, none is left. Of two overlapping claims prepared at once, exactly one lands.
/// On every model.
#[tokio::test]
async fn parallel_placements_on_one_gpu_of_every_model() {
    let Some(built) = built() else { return };
    assert_eq!(PARALLEL.map(|p| p.model), MODELS);
    for case in PARALLEL {
        parallel_placements(built, &case).await;
    }
}

async fn parallel_placements(built: &Path, case: &Parallel) {
    let Parallel {
        model: name,
        devices,
        overlapping,
    } = *case;
    let model = Model::new(built, name, true);
    let h = Harness::new().await;
    let child = start(&h, &model, "").await;
    let published = published_mig(&h, 0).await;
    let mut claims = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        assert!(
            published.iter().any(|p| p == d),
            "{name}: {d} in {published:?}"
        );
        claims.push(claim(&h, &format!("par-{i}"), d).await);
    }
    let k = h.kubelet().await;
    tokio::join!(
        prepare_ok(&k, &claims[0], devices[0]),
        prepare_ok(&k, &claims[1], devices[1]),
        prepare_ok(&k, &claims[2], devices[2]),
        prepare_ok(&k, &claims[3], devices[3]),
    );

    let gis = instances(&model, 0);
    assert_eq!(gis.len(), devices.len(), "{name}: {gis:#?}");
    let spans: Vec<(u64, u64)> = gis
        .iter()
        .map(|g| {
            let p = &g["placement"];
            (p["start"].as_u64().unwrap(), p["size"].as_u64().unwrap())
        })
        .collect();
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            assert!(
                a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0,
                "{name}: overlapping placements {a:?} {b:?}"
            );
        }
    }
    let mut uuids = std::collections::BTreeSet::new();
    for (c, device) in claims.iter().zip(devices) {
        let gi = gis
            .iter()
            .find(|g| g["placement"]["start"] == start_of(device))
            .unwrap_or_else(|| panic!("{device}: no GPU instance at its slice: {gis:#?}"));
        uuids.insert(assert_spec_names(&h, c, gi, device));
    }
    assert_eq!(uuids.len(), devices.len(), "{name}: distinct MIG devices");

    // Memory slice 5 is the 3g's.
    let late = claim(&h, "overlapping", overlapping).await;
    let resp = k.prepare_v1(std::slice::from_ref(&late)).await.unwrap();
    assert_ne!(
        resp.claims[&late.uid].error, "",
        "{name}: an overlapping claim"
    );
    assert_eq!(
        instances(&model, 0),
        gis,
        "{name}: the refusal changed nothing"
    );

    tokio::join!(
        unprepare_ok(&k, &claims[0], devices[0]),
        unprepare_ok(&k, &claims[1], devices[1]),
        unprepare_ok(&k, &claims[2], devices[2]),
        unprepare_ok(&k, &claims[3], devices[3]),
    );
    assert_eq!(all_instances(&model), [], "{name}");

    // The same claims in one NodePrepareResources call, then one unprepare call.
    let resp = k.prepare_v1(&claims).await.unwrap();
    for c in &claims {
        assert_eq!(resp.claims[&c.uid].error, "", "{name}: {}", c.name);
    }
    let batch = instances(&model, 0);
    let mut starts: Vec<u64> = batch
        .iter()
        .map(|g| g["placement"]["start"].as_u64().unwrap())
        .collect();
    starts.sort_unstable();
    assert_eq!(starts, [0, 1, 2, 4], "{name}: {batch:#?}");
    for (c, device) in claims.iter().zip(devices) {
        let gi = batch
            .iter()
            .find(|g| g["placement"]["start"] == start_of(device))
            .unwrap();
        assert_spec_names(&h, c, gi, device);
    }
    let resp = k.unprepare_v1(&claims).await.unwrap();
    for c in &claims {
        assert_eq!(resp.claims[&c.uid].error, "", "{name}: {}", c.name);
    }
    assert_eq!(all_instances(&model), [], "{name}");

    // Two overlapping claims at once: exactly one gets its device, whichever it is.
    let rivals = [
        claim(&h, "rival-a", devices[3]).await,
        claim(&h, "rival-b", overlapping).await,
    ];
    let (a, b) = tokio::join!(
        k.prepare_v1(std::slice::from_ref(&rivals[0])),
        k.prepare_v1(std::slice::from_ref(&rivals[1])),
    );
    let won: Vec<&KubeletClaim> = [(a.unwrap(), &rivals[0]), (b.unwrap(), &rivals[1])]
        .into_iter()
        .filter(|(resp, c)| resp.claims[&c.uid].error.is_empty())
        .map(|(_, c)| c)
        .collect();
    assert_eq!(
        won.len(),
        1,
        "{name}: exactly one of two overlapping claims"
    );
    let gis = instances(&model, 0);
    assert_eq!(gis.len(), 1, "{name}: {gis:#?}");
    assert_spec_names(&h, won[0], &gis[0], &won[0].name);
    for c in &rivals {
        unprepare_ok(&k, c, &c.name).await;
    }
    assert_eq!(all_instances(&model), [], "{name}");
    assert_eq!(tessera_cdi_files(&h), Vec::<String>::new(), "{name}");
    child.terminate().await;
}

/// The fail points a MIG claim passes, in order: no claim files, and no device
/// metadata (off in the built-in node config these runs use).
fn mig_fail_points() -> Vec<&'static str> {
    FAIL_POINTS
        .iter()
        .copied()
        .filter(|p| !p.contains("claim-files") && !p.contains("metadata"))
        .collect()
}

/// The partition each model's crash runs prepare (a 3g at memory slice 4), and its
/// fail points: every one on dgxh100; elsewhere (the same code, about 3 s a run) a
/// crash with the instance made and the claim not complete, and one with the instance
/// destroyed and the claim not unprepared.
const CRASHING: [(&str, &str, Option<[&str; 2]>); 4] = [
    ("dgxa100", "gpu-0-mig-3g20gb-2-4", Some(SOME_POINTS)),
    ("dgxh100", "gpu-0-mig-3g40gb-9-4", None),
    ("dgxh200", "gpu-0-mig-3g71gb-2-4", Some(SOME_POINTS)),
    ("dgxb200", "gpu-0-mig-3g90gb-2-4", Some(SOME_POINTS)),
];
const SOME_POINTS: [&str; 2] = ["prepare-after-mig-create", "unprepare-after-mig-destroy"];

/// The plugin dies (abort, as a kill: nothing runs after it) at every fail point of a
/// MIG prepare and unprepare (dgxh100; two of them on the other models); a fresh
/// process reconciles with the model's state: a half-prepared claim's instance is
/// destroyed, a half-unprepared one is finished; the kubelet's retries succeed, the MIG
/// device's UUID stays the same across a restart, and nothing is leaked in the model,
/// the CDI dir or the checkpoint.
#[tokio::test]
async fn a_crash_at_every_mig_step_leaks_no_instance_on_every_model() {
    let Some(built) = built() else { return };
    let points = mig_fail_points();
    assert_eq!(points.len(), 6, "{points:?}");
    assert!(SOME_POINTS.iter().all(|p| points.contains(p)));
    assert_eq!(CRASHING.map(|(m, ..)| m), MODELS);
    for (name, device, some) in CRASHING {
        let run: Vec<&str> = some.map_or_else(|| points.clone(), |p| p.to_vec());
        for point in run {
            crash_at(built, name, device, point).await;
        }
    }
}

/// One crash run: `device` on model `name`, the plugin dying at fail point `point`.
async fn crash_at(built: &Path, name: &'static str, device: &str, point: &str) {
    let when = format!("{name}: {point}");
    let when = when.as_str();
    let model = Model::new(built, name, true);
    let h = Harness::new().await;
    let unprepare = point.starts_with("unprepare-");
    let mut child = start(&h, &model, point).await;
    let c = claim(&h, "crashing", device).await;
    let k = h.kubelet().await;
    if unprepare {
        prepare_ok(&k, &c, when).await;
        let gis = instances(&model, 0);
        assert_spec_names(&h, &c, &gis[0], when);
        assert!(k.unprepare_v1(std::slice::from_ref(&c)).await.is_err());
    } else {
        assert!(k.prepare_v1(std::slice::from_ref(&c)).await.is_err());
    }
    assert!(child.wait_aborted().await, "{when}: the plugin died");
    drop(child);
    let at_crash = all_instances(&model).len();
    let want = match point {
        "prepare-after-started" | "unprepare-after-mig-destroy" | "unprepare-after-cdi-remove" => 0,
        _ => 1,
    };
    assert_eq!(at_crash, want, "{when}: instances at the crash");

    let child = start(&h, &model, "").await;
    let k = h.kubelet().await;
    assert_eq!(
        all_instances(&model),
        [],
        "{when}: the restart left an instance"
    );
    assert!(
        !h.checkpoint_claims().contains(&c.uid),
        "{when}: recovery settled the claim"
    );
    if unprepare {
        unprepare_ok(&k, &c, when).await;
    }
    assert_eq!(tessera_cdi_files(&h), Vec::<String>::new(), "{when}");

    prepare_ok(&k, &c, when).await;
    let gis = instances(&model, 0);
    assert_eq!(gis.len(), 1, "{when}: {gis:#?}");
    assert_eq!(gis[0]["placement"]["start"], start_of(device), "{when}");
    let uuid = assert_spec_names(&h, &c, &gis[0], when);
    child.terminate().await;

    // A clean restart keeps the prepared claim's MIG device as it is.
    let child = start(&h, &model, "").await;
    let k = h.kubelet().await;
    prepare_ok(&k, &c, when).await;
    let again = instances(&model, 0);
    assert_eq!(again, gis, "{when}: the device survives a restart");
    assert_eq!(assert_spec_names(&h, &c, &again[0], when), uuid);
    unprepare_ok(&k, &c, when).await;
    assert_eq!(all_instances(&model), [], "{when}: leaked");
    assert_eq!(tessera_cdi_files(&h), Vec::<String>::new(), "{when}");
    assert_eq!(h.checkpoint_claims(), Vec::<String>::new(), "{when}");
    child.terminate().await;
}

/// A `kill -9` of the plugin between two NVML calls of a MIG create or destroy, where
/// no fail point is: the model's `control.json` SIGKILLs the process on entering an
/// export (`killBefore`) or once its change is saved (`killAfter`). The GPU instance
/// may be left without its compute instance, or the claim's record without its GI ID;
/// the restart (with the kill disarmed) must still leave no instance, and the retries
/// must succeed.
#[tokio::test]
async fn a_kill_between_nvml_calls_of_a_mig_step_leaks_no_instance_on_the_dgxh100_model() {
    const DEVICE: &str = "gpu-0-mig-2g20gb-14-2";
    // (export, killed after it succeeded, during unprepare, GPU instances at the kill)
    const CASES: &[(&str, bool, bool, usize)] = &[
        ("nvmlDeviceCreateGpuInstanceWithPlacement", false, false, 0),
        ("nvmlDeviceCreateGpuInstanceWithPlacement", true, false, 1),
        ("nvmlGpuInstanceCreateComputeInstance", true, false, 1),
        ("nvmlComputeInstanceDestroy", false, true, 1),
        ("nvmlComputeInstanceDestroy", true, true, 1),
        ("nvmlGpuInstanceDestroy", true, true, 0),
    ];
    let Some(built) = built() else { return };
    for &(export, after, unprepare, left) in CASES {
        let when = format!("{export} (after: {after})");
        let model = Model::new(built, "dgxh100", true);
        let control = model.state().join("control.json");
        let key = if after { "killAfter" } else { "killBefore" };
        let arm = || model.control(&serde_json::json!({ key: [export] }));
        let h = Harness::new().await;
        if !unprepare {
            arm();
        }
        let mut child = start(&h, &model, "").await;
        let c = claim(&h, "killed", DEVICE).await;
        let k = h.kubelet().await;
        if unprepare {
            prepare_ok(&k, &c, &when).await;
            arm();
            assert!(k.unprepare_v1(std::slice::from_ref(&c)).await.is_err());
        } else {
            assert!(k.prepare_v1(std::slice::from_ref(&c)).await.is_err());
        }
        assert!(child.wait_aborted().await, "{when}: the plugin was killed");
        drop(child);
        std::fs::remove_file(&control).unwrap();
        let gis = instances(&model, 0);
        assert_eq!(gis.len(), left, "{when}: at the kill: {gis:#?}");

        let child = start(&h, &model, "").await;
        let k = h.kubelet().await;
        if unprepare {
            unprepare_ok(&k, &c, &when).await;
        }
        assert_eq!(all_instances(&model), [], "{when}: left after the restart");
        assert_eq!(tessera_cdi_files(&h), Vec::<String>::new(), "{when}");
        prepare_ok(&k, &c, &when).await;
        let gis = instances(&model, 0);
        assert_eq!(gis.len(), 1, "{when}: {gis:#?}");
        assert_spec_names(&h, &c, &gis[0], &when);
        unprepare_ok(&k, &c, &when).await;
        assert_eq!(all_instances(&model), [], "{when}: leaked");
        assert_eq!(h.checkpoint_claims(), Vec::<String>::new(), "{when}");
        child.terminate().await;
    }
}

/// Device health on the model: XID critical errors written to `control.json` reach the
/// plugin through NVML's event set (`nvmlDeviceRegisterEvents`, `nvmlEventSetWait_v2`).
/// An application XID (13, on gpu-3) changes nothing; XID 79 (fallen off the bus) on
/// gpu-2 taints gpu-2 NoExecute in the published slice and no other GPU.
#[tokio::test]
async fn an_xid_on_the_dgxh100_model_taints_its_gpu() {
    let Some(built) = built() else { return };
    let model = Model::new(built, "dgxh100", false);
    let dump = model.dump();
    let index_of = |minor: u64| {
        dump["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["minor"] == minor)
            .unwrap()["index"]
            .clone()
    };
    let h = Harness::new().await;
    let child = start(&h, &model, "").await;
    let api: Api<ResourceSlice> = Api::all(h.api.client().unwrap());
    let taints = || async {
        let slices = api.list(&ListParams::default()).await.unwrap();
        slices
            .items
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .filter_map(|d| {
                let t = d.taints.as_ref()?;
                let t: Vec<String> = t
                    .iter()
                    .map(|t| {
                        format!(
                            "{}={}:{}",
                            t.key,
                            t.value.as_deref().unwrap_or(""),
                            t.effect
                        )
                    })
                    .collect();
                (!t.is_empty()).then(|| (d.name.clone(), t.join(",")))
            })
            .collect::<Vec<_>>()
    };
    published_mig(&h, 0).await;
    assert_eq!(taints().await, [], "healthy at the start");
    model.control(&serde_json::json!({ "xid": [
        { "seq": 1, "gpu": index_of(3), "xid": 13 },
        { "seq": 2, "gpu": index_of(2), "xid": 79 },
    ]}));
    let deadline = Instant::now() + Duration::from_secs(60);
    let tainted = loop {
        let t = taints().await;
        if t.iter().any(|(n, _)| n == "gpu-2") {
            break t;
        }
        assert!(Instant::now() < deadline, "gpu-2 was never tainted: {t:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // gpu-2 and its partitions (which share its hardware), nothing else.
    for (name, taint) in &tainted {
        assert!(
            name == "gpu-2" || name.starts_with("gpu-2-mig-"),
            "{name} tainted: {tainted:?}"
        );
        assert_eq!(
            taint, "gpu.tessera.dev/unhealthy=xid-79:NoExecute",
            "{name}"
        );
    }
    child.terminate().await;
}
