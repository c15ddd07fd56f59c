//! MIG prepare and unprepare through the plugin's state machine on simulated GPUs of
//! every modelled type: every placement of every profile prepares alone (the CDI spec
//! gets the parent and capability nodes) and unprepares cleanly; the scheduler model
//! packs seven 1g.10gb on one H100 and keeps MIG and the whole GPU apart.

use testkit::harness;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex;

use k8s_model::release::{FeatureGates, KubeVersion};
use tessera::inventory::mock::StateAccess;
use tessera::inventory::{
    BackendError, GpuBackend, GpuProcess, MigInstance, MigStatus, NodeInventory,
};
use tessera::mig::MigError;
use tessera::mig::{all_models, geometry};
use tessera::node::{BackendPaths, BackendSpec, load_node};
use tessera::plugin;
use tessera::prepare::state::UnknownMig;
use tessera::publish::slices::ServerFeatures;

fn node_yaml(product: &str, arch: &str, mig_enabled: bool) -> String {
    format!(
        "apiVersion: mock.tessera.dev/v1alpha1\nkind: MockNode\ndriverVersion: \"580.65.06\"\ncudaDriverVersion: \"13.0\"\ncharDevices: {{nvidia: 195, nvidia-uvm: 508, nvidia-caps: 511}}\ngpus:\n- minor: 0\n  uuid: GPU-00000000-0000-4000-8000-000000000001\n  productName: {product}\n  brand: Nvidia\n  architecture: {arch}\n  memoryBytes: 85520809984\n  multiprocessors: 132\n  cudaComputeCapability: \"9.0\"\n  pciBusID: \"0000:19:00.0\"\n  migCapable: true\n  migEnabled: {mig_enabled}\n"
    )
}

fn claim(uid: &str, device: &str) -> k8s_openapi::api::resource::v1::ResourceClaim {
    harness::allocated_claim_object(uid, "mig", device)
}

/// Every placement of every profile of every modelled GPU prepares alone — the GI at
/// exactly that placement, the spec with `/dev/nvidia0` and the GI/CI capability nodes —
/// and unprepares cleanly: no instance left, MIG mode back off where Tessera turned it on.
#[test]
fn every_placement_of_every_profile_prepares_and_unprepares() {
    let mut prepared = 0;
    for model in all_models() {
        let root = tempfile::tempdir().unwrap();
        harness::make_driver_root(root.path());
        // Ampere must already have MIG on (Tessera never resets it); Hopper+ toggles.
        let ampere = !model.reset_free_mig_toggle;
        let file = root.path().join("node.yaml");
        std::fs::write(
            &file,
            node_yaml(model.product_names[0], model.architecture, ampere),
        )
        .unwrap();
        let paths = BackendPaths {
            state_dir: root.path().join("state"),
            ..Default::default()
        };
        let model_node = load_node(
            &BackendSpec::Mock(Some(file)),
            None,
            &paths,
            StateAccess::ReadWrite,
        )
        .unwrap();
        let opts = harness::options(root.path());
        let state = plugin::open_state(&opts, &model_node, UnknownMig::Destroy).unwrap();
        let slices = model_node.pool(
            harness::DRIVER,
            harness::NODE,
            KubeVersion::NEWEST,
            ServerFeatures::from_gates(&FeatureGates::defaults(KubeVersion::NEWEST)),
        );
        let devices: Vec<String> = slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .filter(|d| d.name.contains("-mig-"))
            .map(|d| d.name.clone())
            .collect();
        let expected: usize = model.profiles.iter().map(|p| p.placements.len()).sum();
        assert_eq!(devices.len(), expected, "{}", model.key);
        for (i, device) in devices.iter().enumerate() {
            let uid = format!("00000000-0000-4000-8000-{i:012}");
            let devs = state
                .prepare(&claim(&uid, device), &uid)
                .unwrap_or_else(|e| panic!("{} {device}: {}", model.key, e.chain()));
            let rec = devs[0].mig.clone().expect("MIG record");
            let status = model_node.backend.mig_status(0).unwrap();
            assert!(status.enabled, "{device}");
            assert_eq!(status.instances.len(), 1, "{device}");
            let inst = &status.instances[0];
            assert_eq!(
                (inst.start, inst.profile_id),
                (rec.start, rec.profile_id),
                "{device}"
            );
            assert_eq!(Some(inst.gi_id), Some(rec.gi_id));
            assert!(
                rec.uuid.as_deref().is_some_and(|u| u.starts_with("MIG-")),
                "{device}"
            );
            let spec: serde_json::Value = serde_json::from_slice(
                &std::fs::read(
                    opts.paths
                        .cdi_dir
                        .join(format!("tessera.dev-gpu-{uid}.json")),
                )
                .unwrap(),
            )
            .unwrap();
            let nodes: Vec<&str> = spec["devices"][0]["containerEdits"]["deviceNodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n["path"].as_str().unwrap())
                .collect();
            let gi = geometry::gi_cap_minor(0, inst.gi_id);
            let ci = geometry::ci_cap_minor(0, inst.gi_id, 0);
            assert_eq!(
                nodes,
                [
                    "/dev/nvidia0".to_string(),
                    format!("/dev/nvidia-caps/nvidia-cap{gi}"),
                    format!("/dev/nvidia-caps/nvidia-cap{ci}")
                ],
                "{device}"
            );
            state.unprepare(&uid).unwrap();
            let status = model_node.backend.mig_status(0).unwrap();
            assert!(status.instances.is_empty(), "{device}");
            assert_eq!(status.enabled, ampere, "{}: MIG mode restored", model.key);
            prepared += 1;
        }
        assert!(harness::list_files(&opts.paths.cdi_dir).is_empty());
    }
    eprintln!("MIG placements prepared and unprepared: {prepared}");
    assert!(prepared > 100);
}

/// A whole-GPU claim on a GPU with live MIG devices is refused with a clear error, and
/// an overlapping partition held by another claim is refused at the node too.
#[test]
fn whole_gpu_and_overlaps_are_refused_on_the_node() {
    let root = tempfile::tempdir().unwrap();
    harness::make_driver_root(root.path());
    let model_node = harness::model(root.path());
    let opts = harness::options(root.path());
    let state = plugin::open_state(&opts, &model_node, UnknownMig::Destroy).unwrap();
    let a = "00000000-0000-4000-8000-00000000000a";
    state.prepare(&claim(a, "gpu-0-mig-3g40gb-9-4"), a).unwrap();
    let b = "00000000-0000-4000-8000-00000000000b";
    let err = state.prepare(&claim(b, "gpu-0"), b).unwrap_err().chain();
    assert!(
        err.contains("already prepared") || err.contains("MIG"),
        "{err}"
    );
    let c = "00000000-0000-4000-8000-00000000000c";
    let err = state
        .prepare(&claim(c, "gpu-0-mig-1g10gb-19-5"), c)
        .unwrap_err()
        .chain();
    assert!(err.contains("already prepared"), "{err}");
    state.unprepare(a).unwrap();
    // With the partition gone, the whole GPU prepares (MIG mode is off again).
    state.prepare(&claim(b, "gpu-0"), b).unwrap();
    assert!(!model_node.backend.mig_status(0).unwrap().enabled);
}

/// MIG devices no claim accounts for are destroyed at start-up, unless adopted.
#[test]
fn unknown_mig_devices_are_destroyed_or_adopted_at_start_up() {
    for (policy, left) in [
        (UnknownMig::Destroy, 0),
        (UnknownMig::Adopt, 1),
        (UnknownMig::Keep, 1),
    ] {
        let root = tempfile::tempdir().unwrap();
        harness::make_driver_root(root.path());
        let model_node = harness::model(root.path());
        model_node.backend.set_mig_mode(0, true).unwrap();
        model_node.backend.create_mig(0, 19, 3).unwrap();
        let opts = harness::options(root.path());
        let _state = plugin::open_state(&opts, &model_node, policy).unwrap();
        assert_eq!(
            model_node.backend.mig_status(0).unwrap().instances.len(),
            left,
            "{policy:?}"
        );
    }
}

/// A MIG device with processes on it (NVML answers IN_USE) fails the unprepare and
/// keeps the claim, so the kubelet retries; once idle, the retry succeeds.
#[test]
fn in_use_mig_device_fails_unprepare_until_idle() {
    let root = tempfile::tempdir().unwrap();
    harness::make_driver_root(root.path());
    let model_node = harness::model(root.path());
    let opts = harness::options(root.path());
    let state = plugin::open_state(&opts, &model_node, UnknownMig::Destroy).unwrap();
    let uid = "00000000-0000-4000-8000-0000000000aa";
    let devs = state
        .prepare(&claim(uid, "gpu-0-mig-2g20gb-14-4"), uid)
        .unwrap();
    let gi = devs[0].mig.as_ref().unwrap().gi_id;
    let set_busy = |busy: bool| {
        tessera::inventory::mock::state::update(&opts.paths.state_dir, |st| {
            let m = st.mig.entry(0).or_default();
            if busy {
                m.busy.insert(gi);
            } else {
                m.busy.remove(&gi);
            }
            Ok::<(), ()>(())
        })
        .unwrap()
        .unwrap();
    };
    set_busy(true);
    let err = state.unprepare(uid).unwrap_err().chain();
    assert!(err.contains("in use"), "{err}");
    assert_eq!(model_node.backend.mig_status(0).unwrap().instances.len(), 1);
    assert!(harness::checkpoint_claims(&opts.paths.state_dir).contains(&uid.to_string()));
    set_busy(false);
    state.unprepare(uid).unwrap();
    assert!(
        model_node
            .backend
            .mig_status(0)
            .unwrap()
            .instances
            .is_empty()
    );
    assert!(harness::checkpoint_claims(&opts.paths.state_dir).is_empty());
}

/// The mock node's backend with NVML's GI ID allocation: a new GPU instance gets the
/// lowest free ID, whatever its placement (the mock derives IDs from placements), and
/// destroying an instance listed as busy answers IN_USE and changes nothing.
struct NvmlGiIds {
    inner: std::sync::Arc<dyn GpuBackend>,
    /// (GPU minor, NVML's GI ID) → the mock's GI ID.
    ids: Mutex<BTreeMap<(u32, u32), u32>>,
    /// NVML GI IDs with processes on them.
    busy: Mutex<BTreeSet<u32>>,
    /// The node lock; per process listing, whether it was held then.
    lock: PathBuf,
    listed_under_lock: Mutex<Vec<bool>>,
}

impl NvmlGiIds {
    fn nvml_id(&self, minor: u32, mock: u32) -> u32 {
        let ids = self.ids.lock().unwrap();
        ids.iter()
            .find(|((m, _), v)| *m == minor && **v == mock)
            .map_or(mock, |((_, id), _)| *id)
    }
}

impl GpuBackend for NvmlGiIds {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn discover(&self) -> Result<NodeInventory, BackendError> {
        self.inner.discover()
    }
    fn mig_status(&self, minor: u32) -> Result<MigStatus, BackendError> {
        let mut st = self.inner.mig_status(minor)?;
        for i in &mut st.instances {
            i.gi_id = self.nvml_id(minor, i.gi_id);
        }
        Ok(st)
    }
    fn set_mig_mode(&self, minor: u32, enabled: bool) -> Result<(), BackendError> {
        self.inner.set_mig_mode(minor, enabled)
    }
    fn create_mig(&self, minor: u32, p: u32, s: u32) -> Result<MigInstance, BackendError> {
        let mut inst = self.inner.create_mig(minor, p, s)?;
        let mut ids = self.ids.lock().unwrap();
        let id = (1..).find(|id| !ids.contains_key(&(minor, *id))).unwrap();
        ids.insert((minor, id), inst.gi_id);
        inst.gi_id = id;
        Ok(inst)
    }
    /// One process (PID 4242, 1 GiB) on each busy GPU instance.
    fn processes(&self, _minor: u32) -> Result<Vec<GpuProcess>, BackendError> {
        let held = std::fs::File::open(&self.lock).is_ok_and(|f| f.try_lock().is_err());
        self.listed_under_lock.lock().unwrap().push(held);
        Ok(self
            .busy
            .lock()
            .unwrap()
            .iter()
            .map(|gi| GpuProcess {
                pid: 4242,
                used_bytes: Some(1 << 30),
                gi_id: Some(*gi),
            })
            .collect())
    }
    fn destroy_mig(&self, minor: u32, gi: u32) -> Result<(), BackendError> {
        let err = |source| BackendError::Mig {
            op: "destroy",
            minor,
            source,
        };
        let Some(mock) = self.ids.lock().unwrap().get(&(minor, gi)).copied() else {
            return Err(err(MigError::NotFound(format!(
                "no GPU instance with ID {gi}"
            ))));
        };
        if self.busy.lock().unwrap().contains(&gi) {
            return Err(err(MigError::InUse(format!(
                "processes are running on GPU instance {gi}"
            ))));
        }
        self.inner.destroy_mig(minor, mock)?;
        self.ids.lock().unwrap().remove(&(minor, gi));
        Ok(())
    }
}

/// Regression (a retried unprepare destroyed another claim's MIG device): claim A has
/// two MIG devices; the first is destroyed, the second answers IN_USE, so A stays
/// "unprepare started". NVML hands the first device's GI ID to claim B's new device at
/// another placement. A's retries (and a plugin restart) destroy nothing of B's: A's
/// devices are found by placement, and the destroyed one is recorded as destroyed.
/// The processes keeping the busy device are listed (for the log) outside the node
/// lock.
#[test]
fn a_retried_unprepare_never_destroys_a_device_that_got_a_recycled_gi_id() {
    let root = tempfile::tempdir().unwrap();
    harness::make_driver_root(root.path());
    let mut model = harness::model(root.path());
    let opts = harness::options(root.path());
    let backend = std::sync::Arc::new(NvmlGiIds {
        inner: model.backend.clone(),
        ids: Mutex::new(BTreeMap::new()),
        busy: Mutex::new(BTreeSet::new()),
        lock: opts.paths.plugin_dir.join("tessera.lock"),
        listed_under_lock: Mutex::new(Vec::new()),
    });
    model.backend = backend.clone();
    let open = || plugin::open_state(&opts, &model, UnknownMig::Destroy).unwrap();
    let state = open();
    let a = "00000000-0000-4000-8000-0000000000a1";
    let mut two = claim(a, "gpu-0-mig-1g10gb-19-0");
    let results = two
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.results.as_mut())
        .unwrap();
    let mut second = results[0].clone();
    second.request = "mig2".into();
    second.device = "gpu-0-mig-1g10gb-19-1".into();
    results.push(second);
    let devs = state.prepare(&two, a).unwrap();
    let gi = |i: usize| devs[i].mig.as_ref().unwrap().gi_id;
    assert_eq!((gi(0), gi(1)), (1, 2), "NVML's lowest free IDs");
    let placements = |b: &NvmlGiIds| -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = b
            .mig_status(0)
            .unwrap()
            .instances
            .iter()
            .map(|i| (i.start, i.gi_id))
            .collect();
        v.sort();
        v
    };

    backend.busy.lock().unwrap().insert(2);
    let err = state.unprepare(a).unwrap_err().chain();
    assert!(err.contains("in use"), "{err}");
    assert_eq!(placements(&backend), [(1, 2)], "the idle device is gone");
    assert_eq!(
        *backend.listed_under_lock.lock().unwrap(),
        [false],
        "the busy device's processes are listed once the node lock is released"
    );
    assert_eq!(
        harness::checkpoint_state(&opts.paths.state_dir, a).as_deref(),
        Some("UnprepareStarted")
    );

    // Claim B gets a device at placement 2, with the GI ID A's first device had.
    let b = "00000000-0000-4000-8000-0000000000b1";
    let devs_b = state
        .prepare(&claim(b, "gpu-0-mig-1g10gb-19-2"), b)
        .unwrap();
    assert_eq!(devs_b[0].mig.as_ref().unwrap().gi_id, 1, "recycled");
    assert_eq!(placements(&backend), [(1, 2), (2, 1)]);

    // The kubelet retries while A's device is still busy, across a restart too.
    let err = state.unprepare(a).unwrap_err().chain();
    assert!(err.contains("in use"), "{err}");
    assert_eq!(
        placements(&backend),
        [(1, 2), (2, 1)],
        "B's device survives"
    );
    drop(state);
    let state = open();
    assert_eq!(
        placements(&backend),
        [(1, 2), (2, 1)],
        "and across a restart"
    );

    // Idle now: A's retry finishes, B's device is untouched.
    backend.busy.lock().unwrap().clear();
    state.unprepare(a).unwrap();
    assert_eq!(placements(&backend), [(2, 1)]);
    assert_eq!(
        harness::checkpoint_claims(&opts.paths.state_dir),
        vec![b.to_string()]
    );
    state.unprepare(b).unwrap();
    assert!(placements(&backend).is_empty());
}

/// Regression (one busy claim stopped the stale-claim clean-up: every pass aborted at
/// it): of two stale MIG claims, the one whose device is in use stays for the next
/// pass and the other is unprepared.
#[test]
fn a_busy_claim_does_not_stop_the_stale_claim_clean_up() {
    let root = tempfile::tempdir().unwrap();
    harness::make_driver_root(root.path());
    let mut model = harness::model(root.path());
    let opts = harness::options(root.path());
    let backend = std::sync::Arc::new(NvmlGiIds {
        inner: model.backend.clone(),
        ids: Mutex::new(BTreeMap::new()),
        busy: Mutex::new(BTreeSet::new()),
        lock: opts.paths.plugin_dir.join("tessera.lock"),
        listed_under_lock: Mutex::new(Vec::new()),
    });
    model.backend = backend.clone();
    let state =
        std::sync::Arc::new(plugin::open_state(&opts, &model, UnknownMig::Destroy).unwrap());
    // Neither claim exists in the API server any more; the busy one sorts first.
    let busy = "00000000-0000-4000-8000-0000000000a2";
    let idle = "00000000-0000-4000-8000-0000000000b2";
    let devs = state
        .prepare(&claim(busy, "gpu-0-mig-1g10gb-19-0"), busy)
        .unwrap();
    state
        .prepare(&claim(idle, "gpu-0-mig-1g10gb-19-1"), idle)
        .unwrap();
    backend
        .busy
        .lock()
        .unwrap()
        .insert(devs[0].mig.as_ref().unwrap().gi_id);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let api = rt
        .block_on(testkit::fakeapi::FakeApiServer::start(
            testkit::fakeapi::FakeApiConfig::new(KubeVersion::NEWEST),
        ))
        .unwrap();
    let client = {
        let _guard = rt.enter();
        api.client().unwrap()
    };
    let removed = rt
        .block_on(plugin::cleanup_once(
            &state,
            &client,
            std::time::Duration::ZERO,
        ))
        .unwrap();
    assert_eq!(removed, vec![idle.to_string()]);
    assert_eq!(
        harness::checkpoint_claims(&opts.paths.state_dir),
        vec![busy.to_string()]
    );
    backend.busy.lock().unwrap().clear();
    let removed = rt
        .block_on(plugin::cleanup_once(
            &state,
            &client,
            std::time::Duration::ZERO,
        ))
        .unwrap();
    assert_eq!(removed, vec![busy.to_string()], "retried next pass");
}
