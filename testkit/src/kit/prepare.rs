//! Prepare check: the plugin on `--backend nvml`, the fake API server and the kubelet
//! stand-in over the plugin's real sockets, as the demo does. Two phases, each with its
//! own plugin (a GPU is either whole or shared, by the node config):
//!
//! | phase | node config | claims |
//! |---|---|---|
//! | whole | `defaultMode: exclusive` | `whole`: one GPU |
//! | shared | `defaultMode: shared` | `share25`: 2 GiB, 25 % compute; `share60`: 2 GiB, 60 % |
//!
//! Each phase prepares its claims through gRPC, checks that every host path its CDI
//! specs name exists (device nodes as character devices with the spec's major), that
//! the specs validate (`tessera_cdi::validate::validate_json`: version, strict fields,
//! semantics), then unprepares them and checks that no spec and no claim directory is
//! left.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_model::release::{FeatureGates, KubeVersion};
use k8s_model::schedule;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, PostParams};
use serde_json::Value;
use tessera::inventory::mock::StateAccess;
use tessera::node::{BackendPaths, BackendSpec, load_node};
use tessera::plugin::{self, PluginOptions, PluginPaths};
use tessera::prepare::failpoints::FailPoints;

use super::CheckReport;
use super::discovery::{NvmlProfiles, compare_partitions, offered_partitions};
use crate::demo::{DRIVER, DemoClaim, NAMESPACE, NODE, claim_object};
use crate::fakeapi::{FakeApiConfig, FakeApiServer};
use crate::kubelet_standin::{self, DraClient, KubeletClaim};

/// Where the plugin finds the node and what the specs bind.
#[derive(Debug, Clone)]
pub struct PrepareSetup {
    pub backend: BackendSpec,
    pub backend_paths: BackendPaths,
    /// Where the device nodes are (`<dev_root>/dev`; the simulated node's dir in CI).
    pub dev_root: PathBuf,
    /// The driver's files (`/` on a real host).
    pub driver_root: PathBuf,
    /// `libtessera_cuda.so`, with its front, shims and CDI hook beside it.
    pub interception_lib: PathBuf,
    /// Device nodes may be plain files (a simulated node made without root).
    pub simulated: bool,
}

/// One phase's mode and claims.
#[derive(Default)]
struct Phase {
    mode: &'static str,
    claims: Vec<DemoClaim>,
    /// Leave the claims prepared (the interception check's sandbox binds their files).
    keep: bool,
    /// The watchdog check: the pod the claims are reserved for (its UID), with the
    /// watchdog enforcing; the plugin keeps running until stdin ends.
    watch_pod: Option<String>,
    /// Hold the prepared claims until stdin ends (printing each spec, its MIG device's
    /// UUID and memory, then `ready`), then go on (unprepare unless `keep`).
    hold: bool,
    /// The `mig` phase: NVML's MIG profiles, to compare the published partitions with.
    partitions: Option<NvmlProfiles>,
}

fn phases() -> Vec<Phase> {
    let claim = |name, share: Option<(&'static str, u32)>| DemoClaim {
        name,
        class: if share.is_some() {
            "shared.tessera.dev"
        } else {
            "gpu.tessera.dev"
        },
        wants: "",
        count: 1,
        share,
    };
    vec![
        Phase {
            mode: "exclusive",
            claims: vec![claim("whole", None)],
            keep: false,
            watch_pod: None,
            ..Phase::default()
        },
        Phase {
            mode: "shared",
            claims: vec![
                claim("share25", Some(("2Gi", 25))),
                claim("share60", Some(("2Gi", 60))),
            ],
            keep: false,
            watch_pod: None,
            ..Phase::default()
        },
    ]
}

/// What the phases found, accumulated.
#[derive(Default)]
struct Findings {
    failures: Vec<String>,
    notes: Vec<String>,
    prepared: usize,
    paths: usize,
    specs: usize,
    left: usize,
    /// The specs of claims left prepared (`Phase::keep`) or held (`Phase::hold`).
    kept: Vec<PathBuf>,
    /// The MIG profile of the claim held ([`mig_claim`]).
    held: Option<String>,
    /// [`compare_partitions`]'s figure, when the `mig` phase compared them.
    partitions: Option<String>,
}

/// Prepares shared claims of `memory` and each of `compute` percents on the first GPU
/// and leaves them prepared: their specs are returned, in order. Owns side effects: the
/// plugin runs in `workdir` for the preparation only; the claim files stay there.
///
/// # Errors
/// What failed, as one line.
pub async fn prepare_shared(
    setup: &PrepareSetup,
    workdir: &Path,
    memory: &'static str,
    compute: &[u32],
) -> Result<Vec<PathBuf>, String> {
    const NAMES: [&str; 4] = ["kit-share-a", "kit-share-b", "kit-share-c", "kit-share-d"];
    let claims = NAMES
        .iter()
        .zip(compute)
        .map(|(name, pct)| DemoClaim {
            name,
            class: "shared.tessera.dev",
            wants: "",
            count: 1,
            share: Some((memory, *pct)),
        })
        .collect();
    let phase = Phase {
        mode: "shared",
        claims,
        keep: true,
        watch_pod: None,
        ..Phase::default()
    };
    let mut f = Findings::default();
    run_phase(setup, workdir, &phase, &mut f).await?;
    if !f.failures.is_empty() {
        return Err(f.failures.join("; "));
    }
    Ok(f.kept)
}

/// The watchdog check's half in Rust: a 2 GiB shared claim reserved for the pod
/// `pod_uid`, prepared with the plugin's watchdog enforcing; prints `ready` on stdout
/// and keeps the plugin (and its watchdog) running until stdin ends. Owns side effects:
/// the plugin, its files in `workdir`.
///
/// # Errors
/// What failed, as one line.
pub async fn watch(setup: &PrepareSetup, workdir: &Path, pod_uid: &str) -> Result<(), String> {
    let phase = Phase {
        mode: "shared",
        claims: vec![DemoClaim {
            name: "kit-watched",
            class: "shared.tessera.dev",
            wants: "",
            count: 1,
            share: Some(("2Gi", 25)),
        }],
        keep: true,
        watch_pod: Some(pod_uid.to_string()),
        ..Phase::default()
    };
    let mut f = Findings::default();
    run_phase(setup, workdir, &phase, &mut f).await?;
    if f.failures.is_empty() {
        Ok(())
    } else {
        Err(f.failures.join("; "))
    }
}

/// The MIG check: on a GPU already in MIG mode, one claim of each MIG profile the
/// plugin publishes, prepared and unprepared in turn (a profile that does not fit the
/// free slices is noted, not failed), with the node config `defaultMode: mig` and
/// MIG devices the kit did not make adopted, never destroyed; then the GPU's MIG mode
/// and instances must be as found. Owns side effects: creates and destroys MIG
/// instances through the plugin. Never fails: what went wrong is in the report.
///
/// With `partitions` (NVML's profiles, read after an operator's `--allow-mig-changes`
/// switched MIG on), the partitions published are compared with them as the discovery
/// check does ([`compare_partitions`]).
pub async fn mig(
    setup: &PrepareSetup,
    workdir: &Path,
    partitions: Option<NvmlProfiles>,
) -> CheckReport {
    let started = Instant::now();
    let mut f = Findings::default();
    let phase = Phase {
        mode: "mig",
        partitions,
        ..Phase::default()
    };
    if let Err(e) = run_phase(setup, workdir, &phase, &mut f).await {
        f.failures.push(format!("MIG: {e}"));
    }
    let figure = format!(
        "{} MIG claim(s) prepared and unprepared, {} spec(s) valid, {} file(s) left{}; {:.1} s",
        f.prepared,
        f.specs,
        f.left,
        f.partitions.map(|p| format!("; {p}")).unwrap_or_default(),
        started.elapsed().as_secs_f64()
    );
    CheckReport::from_findings("mig", figure, f.failures, f.notes)
}

/// The prepare check on a GPU already in MIG mode. There Tessera offers whole-GPU and
/// shared claims only by switching MIG mode off first (a reset-free GPU without MIG
/// devices; refused while MIG devices exist, or on a GPU that needs a reset), a change
/// the kit never makes: so it prepares what Tessera does offer, one MIG device created
/// on demand: a claim of the smallest published profile that fits the free slices,
/// through the plugin's gRPC (node config `defaultMode: mig`, MIG devices the kit did
/// not make adopted), its spec checked as the prepare check's. It prints `spec PATH`,
/// `mig-uuid UUID` (the spec's `TESSERA_MIG_UUID_*`), `memory-mib N` (the partition's)
/// and `ready` on stdout, holds the claim until stdin ends (run.sh runs the cuda-kernel
/// and costs checks in the MIG instance meanwhile), then unprepares it: nothing may be
/// left, and the GPU's MIG mode and instances must be as found. Owns side effects: a
/// MIG instance for the time held. Never fails: what went wrong is in the report.
pub async fn mig_claim(setup: &PrepareSetup, workdir: &Path) -> CheckReport {
    let started = Instant::now();
    let mut f = Findings::default();
    let phase = Phase {
        mode: "mig",
        hold: true,
        ..Phase::default()
    };
    if let Err(e) = run_phase(setup, workdir, &phase, &mut f).await {
        f.failures.push(format!("MIG claim: {e}"));
    }
    f.notes.push(
        "whole-GPU and shared claims not run: with MIG mode on, Tessera offers them only by switching MIG mode off (refused while MIG devices exist or where that needs a GPU reset), a change the kit does not make"
            .into(),
    );
    let figure = format!(
        "MIG mode on: {} MIG claim(s) ({}) prepared, held and unprepared, {} spec(s) valid, {} host path(s) exist, {} file(s) left; whole-GPU and shared claims need MIG off: not run; {:.1} s",
        f.prepared,
        f.held.as_deref().unwrap_or("none"),
        f.specs,
        f.paths,
        f.left,
        started.elapsed().as_secs_f64()
    );
    CheckReport::from_findings("prepare", figure, f.failures, f.notes)
}

/// Each MIG-mode GPU's MIG state, described for comparison.
fn mig_layout(
    backend: &dyn tessera::inventory::GpuBackend,
    mig: &BTreeMap<u32, tessera::inventory::MigStatus>,
) -> Vec<(u32, String)> {
    mig.keys()
        .map(|m| (*m, describe_mig(backend, *m)))
        .collect()
}

/// One GPU's MIG mode and instances (GI, profile, placement), as text. Deterministic
/// for an unchanged GPU.
fn describe_mig(backend: &dyn tessera::inventory::GpuBackend, minor: u32) -> String {
    match backend.mig_status(minor) {
        Ok(st) => {
            let mut inst: Vec<String> = st
                .instances
                .iter()
                .map(|i| format!("GI {} profile {} at {}", i.gi_id, i.profile_id, i.start))
                .collect();
            inst.sort();
            format!(
                "mode {} with [{}]",
                if st.enabled { "on" } else { "off" },
                inst.join(", ")
            )
        }
        Err(e) => format!("unknown ({e})"),
    }
}

/// The MIG profiles published, smallest memory first (then by name).
fn published_profiles(slices: &[ResourceSlice]) -> Vec<String> {
    let mut by_memory: BTreeMap<String, u64> = BTreeMap::new();
    for d in slices.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
        let Some(a) = d.attributes.as_ref() else {
            continue;
        };
        if a.get("type").and_then(|t| t.string.as_deref()) != Some("mig") {
            continue;
        }
        let Some(p) = a.get("profile").and_then(|p| p.string.clone()) else {
            continue;
        };
        by_memory.insert(p, device_memory(d).unwrap_or(u64::MAX));
    }
    let mut profiles: Vec<(u64, String)> = by_memory.into_iter().map(|(p, m)| (m, p)).collect();
    profiles.sort();
    profiles.into_iter().map(|(_, p)| p).collect()
}

/// A device's published `memory` capacity in bytes.
fn device_memory(d: &k8s_openapi::api::resource::v1::Device) -> Option<u64> {
    d.capacity.as_ref()?.get("memory")?.value.0.parse().ok()
}

/// The phase of one claim of MIG profile `p`.
fn mig_profile_phase(p: &str, hold: bool) -> Phase {
    // Claim names and selectors live as long as the process (a CLI's few).
    let name: &'static str =
        Box::leak(format!("kit-mig-{}", p.replace(['.', '+'], "-")).into_boxed_str());
    let wants: &'static str = Box::leak(p.to_string().into_boxed_str());
    Phase {
        mode: "mig-profile",
        claims: vec![DemoClaim {
            name,
            class: "mig.tessera.dev",
            wants,
            count: 1,
            share: None,
        }],
        hold,
        ..Phase::default()
    }
}

async fn published_slices(api: &FakeApiServer) -> Result<Vec<ResourceSlice>, String> {
    wait_for("the ResourceSlices", || {
        let s = api.resource_slices();
        let complete = s
            .first()
            .is_some_and(|f| s.len() as i64 == f.spec.pool.resource_slice_count);
        complete.then_some(s)
    })
    .await
}

/// One claim per MIG profile published, prepared and unprepared in turn; or, for a
/// holding phase, one claim of the smallest profile that fits, held (see
/// [`mig_claim`]). With `phase.partitions`, the published partitions are compared with
/// NVML's profiles first.
#[allow(clippy::too_many_arguments)]
async fn drive_mig(
    setup: &PrepareSetup,
    api: &FakeApiServer,
    client: kube::Client,
    paths: &PluginPaths,
    reg_socket: &Path,
    phase: &Phase,
    version: KubeVersion,
    f: &mut Findings,
) -> Result<(), String> {
    let slices = published_slices(api).await?;
    if let Some(nvml) = &phase.partitions {
        let json = serde_json::to_value(&slices).map_err(err("the slices as JSON"))?;
        let c = compare_partitions(&offered_partitions(&json), nvml);
        f.failures.extend(c.failures);
        f.notes.extend(c.notes);
        f.partitions = Some(c.figure);
    }
    let profiles = published_profiles(&slices);
    if profiles.is_empty() {
        return Err("no MIG partition published".into());
    }
    for p in profiles {
        let one = mig_profile_phase(&p, phase.hold);
        match drive(
            setup,
            api,
            client.clone(),
            paths,
            reg_socket,
            &one,
            version,
            f,
        )
        .await
        {
            Ok(()) if phase.hold => {
                f.held = Some(p);
                return Ok(());
            }
            Ok(()) => {}
            Err(e) if e.contains("cannot be allocated") => {
                f.notes
                    .push(format!("{p}: does not fit the free slices ({e})"));
            }
            Err(e) if phase.hold => return Err(format!("{p}: {e}")),
            Err(e) => f.failures.push(format!("{p}: {e}")),
        }
    }
    if phase.hold {
        return Err("no MIG profile published fits the free slices".into());
    }
    Ok(())
}

/// Runs both phases in `workdir` (one subdirectory each). Owns side effects: starts a
/// fake API server and the plugin per phase, writes specs and claim files under
/// `workdir`, and removes them through unprepare. Never fails: what went wrong is in
/// the report.
pub async fn run(setup: &PrepareSetup, workdir: &Path) -> CheckReport {
    let started = Instant::now();
    let mut f = Findings::default();
    for phase in phases() {
        if let Err(e) = run_phase(setup, &workdir.join(phase.mode), &phase, &mut f).await {
            f.failures.push(format!("phase {}: {e}", phase.mode));
        }
    }
    let figure = format!(
        "{} claim(s) prepared (1 whole, 2 shared), {} spec(s) valid, {} host path(s) exist, {} file(s) left; {:.1} s",
        f.prepared,
        f.specs,
        f.paths,
        f.left,
        started.elapsed().as_secs_f64()
    );
    CheckReport::from_findings("prepare", figure, f.failures, f.notes)
}

async fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> Result<T, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = probe() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn err<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// The MIG phases' node config rules that keep every GPU whose MIG mode is off
/// `exclusive`: in `mig` mode the plugin would switch MIG on for a MIG claim allocated
/// there (dynamic MIG on Hopper and later), and the kit changes MIG mode only through
/// `--allow-mig-changes`, which switches it on first. Reads only.
fn mig_off_rules(setup: &PrepareSetup) -> Result<String, String> {
    let (backend, _) =
        tessera::node::open_backend(&setup.backend, &setup.backend_paths, StateAccess::ReadOnly)
            .map_err(err("the backend"))?;
    let inv = backend.discover().map_err(err("discovery"))?;
    let off: Vec<String> = inv
        .gpus
        .iter()
        .filter(|g| !g.mig_enabled)
        .map(|g| format!("- match: {{uuid: {}}}\n  mode: exclusive\n", g.uuid))
        .collect();
    Ok(if off.is_empty() {
        String::new()
    } else {
        format!("gpus:\n{}", off.concat())
    })
}

async fn run_phase(
    setup: &PrepareSetup,
    dir: &Path,
    phase: &Phase,
    f: &mut Findings,
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(err("work dir"))?;
    let config = dir.join("node-config.yaml");
    let mut text = format!(
        "apiVersion: config.tessera.dev/v1alpha1\nkind: NodeConfig\ndefaultMode: {}\n",
        phase.mode
    );
    if phase.mode == "mig" {
        text += &mig_off_rules(setup)?;
    }
    std::fs::write(&config, text).map_err(err("node config"))?;
    let model = load_node(
        &setup.backend,
        Some(&config),
        &setup.backend_paths,
        StateAccess::ReadWrite,
    )
    .map_err(err("discovery"))?;
    let version = KubeVersion::NEWEST;
    let api = FakeApiServer::start(FakeApiConfig::new(version))
        .await
        .map_err(err("fake API server"))?;
    api.add_node(NODE);
    let client = api.client().map_err(err("API client"))?;
    let paths = PluginPaths {
        plugin_registry_dir: dir.join("plugins_registry"),
        plugin_dir: dir.join("plugins").join(DRIVER),
        cdi_dir: dir.join("cdi"),
        state_dir: dir.join("state"),
        run_dir: dir.join("run"),
        host_run_dir: dir.join("run"),
        dev_root: setup.dev_root.clone(),
        host_dev_root: setup.dev_root.clone(),
        driver_root: setup.driver_root.clone(),
        host_driver_root: setup.driver_root.clone(),
        proc_root: setup.backend_paths.proc_root.clone(),
    };
    let opts = PluginOptions {
        driver_name: DRIVER.into(),
        node_name: NODE.into(),
        paths: paths.clone(),
        rolling_update_pod_uid: None,
        stale_check_interval: Duration::from_secs(600),
        stale_min_age: Duration::from_secs(600),
        publish_debounce: Duration::from_millis(100),
        fail_points: FailPoints::default(),
        // Never destroy MIG devices the kit did not make: the GPU is left as found.
        adopt_unknown_mig: true,
        interception_lib: Some(setup.interception_lib.clone()),
        metrics_addr: None,
        watchdog: if phase.watch_pod.is_some() {
            tessera::watchdog::Mode::Enforce
        } else {
            tessera::watchdog::Mode::Off
        },
        watchdog_tolerance: tessera::watchdog::DEFAULT_TOLERANCE,
    };
    let reg_socket = plugin::registration_socket_path(&paths.plugin_registry_dir, DRIVER, None);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let backend = model.backend.clone();
    let mig_before: Vec<(u32, String)> = mig_layout(&*backend, &model.mig);
    let plugin_task = tokio::spawn(plugin::run(opts, model, client.clone(), async {
        let _ = stop_rx.await;
    }));
    let result = if phase.mode == "mig" {
        drive_mig(setup, &api, client, &paths, &reg_socket, phase, version, f).await
    } else {
        drive(setup, &api, client, &paths, &reg_socket, phase, version, f).await
    };
    let _ = stop_tx.send(());
    match plugin_task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => f
            .failures
            .push(format!("phase {}: plugin: {e}", phase.mode)),
        Err(e) => f
            .failures
            .push(format!("phase {}: plugin task: {e}", phase.mode)),
    }
    if phase.mode == "mig" {
        for (m, b) in &mig_before {
            let a = describe_mig(&*backend, *m);
            if &a != b {
                f.failures
                    .push(format!("gpu-{m}: MIG was {b} before the check, {a} after"));
            } else {
                f.notes.push(format!("gpu-{m}: MIG {a}, as found"));
            }
        }
    }
    result
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    setup: &PrepareSetup,
    api: &FakeApiServer,
    client: kube::Client,
    paths: &PluginPaths,
    reg_socket: &Path,
    phase: &Phase,
    version: KubeVersion,
    f: &mut Findings,
) -> Result<(), String> {
    wait_for("the registration socket", || {
        reg_socket.exists().then_some(())
    })
    .await?;
    let (info, _) = kubelet_standin::register(reg_socket, &["v1.DRAPlugin"])
        .await
        .map_err(err("registration"))?;
    let dra = DraClient::connect(Path::new(&info.endpoint))
        .await
        .map_err(err("connect"))?;
    let slices = wait_for("the ResourceSlices", || {
        let s = api.resource_slices();
        let complete = s
            .first()
            .is_some_and(|f| s.len() as i64 == f.spec.pool.resource_slice_count);
        complete.then_some(s)
    })
    .await?;
    let classes = tessera::device_classes::read(None).map_err(err("device classes"))?;
    let steps: Vec<schedule::Step> = phase
        .claims
        .iter()
        .map(|c| schedule::Step::Allocate(Box::new(claim_object(c))))
        .collect();
    let planned = schedule::run(&slices, &classes, &steps, &FeatureGates::defaults(version))
        .map_err(err("plan"))?;
    let claims_api: Api<ResourceClaim> = Api::namespaced(client, NAMESPACE);
    let mut kclaims = Vec::new();
    for (c, o) in phase.claims.iter().zip(planned.outcomes) {
        let allocation = match o {
            schedule::Outcome::Allocated(a) => {
                a.status.and_then(|s| s.allocation).unwrap_or_default()
            }
            schedule::Outcome::Failed { reason, .. } => {
                return Err(format!("claim {} cannot be allocated: {reason}", c.name));
            }
            schedule::Outcome::Released { .. } => continue,
        };
        let created = claims_api
            .create(&PostParams::default(), &claim_object(c))
            .await
            .map_err(err("create claim"))?;
        let mut allocated = crate::claims::ClaimBuilder::from_claim(created.clone())
            .allocation(allocation)
            .reserved_for_its_pod()
            .build();
        if let (Some(uid), Some(status)) = (&phase.watch_pod, allocated.status.as_mut()) {
            for r in status.reserved_for.iter_mut().flatten() {
                r.uid = uid.clone();
            }
        }
        claims_api
            .replace_status(c.name, &PostParams::default(), &allocated)
            .await
            .map_err(err("allocate claim"))?;
        kclaims.push(KubeletClaim {
            namespace: NAMESPACE.into(),
            uid: created.metadata.uid.clone().unwrap_or_default(),
            name: c.name.into(),
        });
    }
    let resp = dra.prepare_v1(&kclaims).await.map_err(err("prepare"))?;
    let mut held_lines = Vec::new();
    for kc in &kclaims {
        let Some(r) = resp.claims.get(&kc.uid) else {
            f.failures
                .push(format!("{}: no answer from prepare", kc.name));
            continue;
        };
        if !r.error.is_empty() {
            f.failures
                .push(format!("{}: prepare: {}", kc.name, r.error));
            continue;
        }
        f.prepared += 1;
        let devices: Vec<&str> = r.devices.iter().map(|d| d.device_name.as_str()).collect();
        f.notes
            .push(format!("{}: devices {}", kc.name, devices.join(", ")));
        let spec = paths
            .cdi_dir
            .join(format!("tessera.dev-gpu-{}.json", kc.uid));
        check_spec(setup, &spec, &kc.name, f);
        if phase.hold {
            held_lines.push(format!("spec {}", spec.display()));
            match spec_mig_uuid(&spec) {
                Some(uuid) => held_lines.push(format!("mig-uuid {uuid}")),
                None => f.failures.push(format!(
                    "{}: its spec names no MIG device UUID (TESSERA_MIG_UUID_*)",
                    kc.name
                )),
            }
            let memory = slices
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .find(|d| devices.contains(&d.name.as_str()))
                .and_then(device_memory);
            if let Some(bytes) = memory {
                held_lines.push(format!("memory-mib {}", bytes >> 20));
            }
        }
        f.kept.push(spec);
        let claim_dir = tessera::prepare::claim_files::claim_dir(&paths.run_dir, &kc.uid);
        if let Ok(limits) = std::fs::read_to_string(claim_dir.join(tessera_abi::LIMITS_FILE)) {
            f.notes.push(format!(
                "{}: limits {}",
                kc.name,
                limits.trim().replace('\n', "; ")
            ));
        }
    }
    if phase.watch_pod.is_some() || (phase.hold && !held_lines.is_empty()) {
        for l in &held_lines {
            println!("{l}");
        }
        println!("ready");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        let _ = tokio::task::spawn_blocking(|| {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        })
        .await;
    }
    if phase.keep {
        return Ok(());
    }
    let resp = dra.unprepare_v1(&kclaims).await.map_err(err("unprepare"))?;
    for (uid, r) in &resp.claims {
        if !r.error.is_empty() {
            f.failures.push(format!("unprepare {uid}: {}", r.error));
        }
    }
    for d in [paths.cdi_dir.clone(), paths.run_dir.join("claims")] {
        let left: Vec<String> = std::fs::read_dir(&d)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        f.left += left.len();
        if !left.is_empty() {
            f.failures
                .push(format!("after unprepare, {} holds {left:?}", d.display()));
        }
    }
    Ok(())
}

/// The MIG device UUID a claim's spec gives its container (`TESSERA_MIG_UUID_*`), if
/// any.
fn spec_mig_uuid(spec: &Path) -> Option<String> {
    let json: Value = serde_json::from_slice(&std::fs::read(spec).ok()?).ok()?;
    json["devices"]
        .as_array()?
        .iter()
        .flat_map(|d| d["containerEdits"]["env"].as_array().into_iter().flatten())
        .filter_map(|e| e.as_str()?.strip_prefix("TESSERA_MIG_UUID_"))
        .find_map(|e| e.split_once('=').map(|(_, uuid)| uuid.to_string()))
}

/// Checks one claim's spec: it validates, and every host path it names exists.
fn check_spec(setup: &PrepareSetup, spec: &Path, claim: &str, f: &mut Findings) {
    let json: Value = match std::fs::read(spec)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(v) => v,
        Err(e) => {
            f.failures
                .push(format!("{claim}: spec {}: {e}", spec.display()));
            return;
        }
    };
    match tessera_cdi::validate::validate_json(&json) {
        Ok(_) => f.specs += 1,
        Err(e) => f
            .failures
            .push(format!("{claim}: spec does not validate: {e}")),
    }
    let mut edits: Vec<&Value> = vec![&json["containerEdits"]];
    if let Some(devs) = json["devices"].as_array() {
        edits.extend(devs.iter().map(|d| &d["containerEdits"]));
    }
    for e in edits {
        for n in e["deviceNodes"].as_array().into_iter().flatten() {
            let path = n["hostPath"].as_str().or(n["path"].as_str()).unwrap_or("");
            check_device_node(setup, Path::new(path), n["major"].as_u64(), claim, f);
        }
        for m in e["mounts"].as_array().into_iter().flatten() {
            check_exists(m["hostPath"].as_str().unwrap_or(""), claim, f);
        }
        for h in e["hooks"].as_array().into_iter().flatten() {
            check_exists(h["path"].as_str().unwrap_or(""), claim, f);
        }
    }
}

fn check_exists(path: &str, claim: &str, f: &mut Findings) {
    f.paths += 1;
    if !Path::new(path).exists() {
        f.failures.push(format!("{claim}: {path:?} does not exist"));
    }
}

fn check_device_node(
    setup: &PrepareSetup,
    path: &Path,
    major: Option<u64>,
    claim: &str,
    f: &mut Findings,
) {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::fs::MetadataExt;
    f.paths += 1;
    let Ok(meta) = std::fs::metadata(path) else {
        f.failures.push(format!(
            "{claim}: device node {} does not exist",
            path.display()
        ));
        return;
    };
    if !meta.file_type().is_char_device() {
        if !setup.simulated {
            f.failures.push(format!(
                "{claim}: {} is not a character device",
                path.display()
            ));
        }
        return;
    }
    let found = (meta.rdev() >> 8) & 0xfff;
    if let Some(want) = major
        && want != found
    {
        f.failures.push(format!(
            "{claim}: {} has major {found}, the spec says {want}",
            path.display()
        ));
    }
}
