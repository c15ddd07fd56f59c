//! Property tests of the claim planner (`tessera::prepare::claim_plan`) on the default
//! mock node (gpu-0 H100 in `mig` mode, gpu-1 H100 `shared`, gpu-2/3 T4 `exclusive`):
//! random allocation results (whole GPUs, shares with random consumed capacity and
//! shareIDs, fallback slots, MIG partitions with valid and invalid placements, other
//! pools and drivers, opaque configs valid and not) and random devices held by other
//! claims.
//!
//! * a claim the planner accepts renders a CDI spec that the cdi crate validates, with
//!   one device per result of ours, and no hold key twice;
//! * through `DeviceState::prepare` (state, CDI dir and run dir in a temp dir): a
//!   claim the planner refuses is refused with the same message and leaves no spec
//!   file and no claim directory; a prepared claim's spec file validates; unprepare
//!   removes both.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use proptest::prelude::*;
use serde_json::{Value, json};
use tessera::inventory::GpuBackend;
use tessera::inventory::mock::{MockBackend, StateAccess};
use tessera::prepare::cdi_spec;
use tessera::prepare::claim_plan::{Held, NodeView, plan_claim};
use tessera::prepare::state::{DeviceState, StateConfig, UnknownMig};
use tessera_fuzz::{DRIVER, NODE, fixture};

const UID: &str = "0b5c6e2a-1f3d-4c8e-9a7b-2d4f6e8a0c1e";

#[derive(Debug, Clone)]
struct Result_ {
    device: String,
    other_pool: bool,
    other_driver: bool,
    share: Option<(String, String, bool)>,
}

fn device_name() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u32..5).prop_map(|m| format!("gpu-{m}")),
        (0u32..3, 0u32..6).prop_map(|(m, s)| format!("gpu-{m}-slot-{s}")),
        (
            prop::sample::select(vec![
                ("1g10gb", 19),
                ("2g20gb", 14),
                ("3g40gb", 9),
                ("7g80gb", 0),
                ("1g10gb", 14)
            ]),
            0u32..8,
            0u32..2,
        )
            .prop_map(|((p, id), start, m)| format!("gpu-{m}-mig-{p}-{id}-{start}")),
        "[a-z0-9-]{0,12}",
    ]
}

fn quantity() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "1Gi", "20Gi", "40Gi", "79Gi", "200Gi", "0", "-1", "1.5", "x", "25", "100", "101",
    ])
    .prop_map(str::to_string)
}

fn result_() -> impl Strategy<Value = Result_> {
    (
        device_name(),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        prop::option::weighted(0.5, (quantity(), quantity(), prop::bool::weighted(0.8))),
    )
        .prop_map(|(device, other_pool, other_driver, share)| Result_ {
            device,
            other_pool,
            other_driver,
            share,
        })
}

fn config() -> impl Strategy<Value = Option<Value>> {
    prop::option::weighted(
        0.3,
        prop_oneof![
            Just(json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig"})),
            Just(
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "bogus": 1})
            ),
            Just(json!({"apiVersion": "other/v1", "kind": "GpuConfig"})),
            Just(json!("not an object")),
        ],
    )
}

fn claim_json(results: &[Result_], cfg: &Option<Value>) -> ResourceClaim {
    let results: Vec<Value> = results
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut v = json!({
                "request": format!("r{i}"),
                "driver": if r.other_driver { "other.dev" } else { DRIVER },
                "pool": if r.other_pool { "elsewhere" } else { NODE },
                "device": r.device,
            });
            if let Some((mem, compute, with_id)) = &r.share {
                v["consumedCapacity"] = json!({"memory": mem, "compute": compute});
                if *with_id {
                    v["shareID"] = json!(format!("7f3a9c2e-0000-4000-8000-00000000000{i}"));
                }
            }
            v
        })
        .collect();
    let mut devices = json!({ "results": results });
    if let Some(c) = cfg {
        devices["config"] =
            json!([{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": c}}]);
    }
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default", "uid": UID},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": devices}}
    }))
    .unwrap()
}

fn held_strategy() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(device_name(), Just("someone-else".to_string()), 0..3)
}

fn open_state(dir: &std::path::Path) -> DeviceState {
    let f = fixture();
    let backend: Arc<dyn GpuBackend> = Arc::new(MockBackend::new(
        f.node.clone(),
        dir.join("mock"),
        StateAccess::ReadWrite,
    ));
    let cfg = StateConfig {
        driver: DRIVER.into(),
        pool: NODE.into(),
        cdi_dir: dir.join("cdi"),
        plugin_dir: dir.join("plugin"),
        state_dir: dir.join("state"),
        boot_id: "props".into(),
        fail_points: Default::default(),
        unknown_mig: UnknownMig::Destroy,
        run_dir: dir.join("run"),
        shared_slots: f.config.shared_slots,
        interception_source: None,
        device_metadata: false,
    };
    let mut cdi = f.cdi.clone();
    cdi.interception = None;
    DeviceState::open(cfg, f.gpus.clone(), backend, cdi)
        .unwrap()
        .0
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// An accepted claim renders a valid spec with its devices; hold keys are unique.
    #[test]
    fn accepted_claims_render_valid_specs(
        results in prop::collection::vec(result_(), 0..4),
        cfg in config(),
        held in held_strategy(),
    ) {
        let f = fixture();
        let claim = claim_json(&results, &cfg);
        let node = NodeView { driver: DRIVER, pool: NODE, gpus: &f.gpus, shared_slots: f.config.shared_slots };
        let held = Held { devices: held, budgets: BTreeMap::new() };
        let Ok(plan) = plan_claim(&claim, UID, node, &held) else { return Ok(()); };
        let ours = results.iter().filter(|r| !r.other_driver).count();
        prop_assert_eq!(plan.devices.len(), ours);
        let mut keys: Vec<String> = plan.devices.iter().map(|d| d.hold_key()).collect();
        keys.sort();
        keys.dedup();
        prop_assert_eq!(keys.len(), plan.devices.len());
        for d in &plan.devices {
            prop_assert!(!held.devices.contains_key(&d.hold_key()), "{} is held", d.device);
        }
        let caps: Vec<_> = plan.devices.iter().map(|d| d.mig.map(|m| (m.gi_id, 0, None))).collect();
        let spec = cdi_spec::render_claim_spec(&plan, &f.cdi, &caps)
            .map_err(|e| TestCaseError::fail(format!("render: {e}")))?;
        let names = cdi_spec::spec_file_names(UID).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let writer = tessera_cdi::writer::SpecWriter::new(dir.path());
        writer.write(&names, &spec, cdi_spec::VERSION_POLICY)
            .map_err(|e| TestCaseError::fail(format!("write: {e}")))?;
        let back: Value = serde_json::from_slice(&std::fs::read(writer.path_of(&names)).unwrap()).unwrap();
        let parsed = tessera_cdi::validate::validate_json(&back)
            .map_err(|e| TestCaseError::fail(format!("validate: {e}")))?;
        for d in &plan.devices {
            prop_assert!(parsed.device(&d.cdi_name(UID)).is_some());
        }
    }

    /// Through the state: refusals leave nothing and say what the planner says;
    /// prepared claims have a valid spec; unprepare removes everything.
    #[test]
    fn refused_claims_leave_no_file(
        results in prop::collection::vec(result_(), 0..4),
        cfg in config(),
    ) {
        let f = fixture();
        let claim = claim_json(&results, &cfg);
        let node = NodeView { driver: DRIVER, pool: NODE, gpus: &f.gpus, shared_slots: f.config.shared_slots };
        let planned = plan_claim(&claim, UID, node, &Held::default());
        let dir = tempfile::tempdir().unwrap();
        let state = open_state(dir.path());
        let spec = dir.path().join("cdi").join(cdi_spec::spec_file_names(UID).unwrap().file_name());
        let claim_dir = tessera::prepare::claim_files::claim_dir(&dir.path().join("run"), UID);
        match state.prepare(&claim, UID) {
            Ok(devices) => {
                prop_assert!(planned.is_ok(), "prepared a claim the planner refuses");
                prop_assert_eq!(devices.len(), planned.unwrap().devices.len());
                let back: Value = serde_json::from_slice(&std::fs::read(&spec).unwrap()).unwrap();
                prop_assert!(tessera_cdi::validate::validate_json(&back).is_ok());
                state.unprepare(UID).unwrap();
                prop_assert!(!spec.exists() && !claim_dir.exists());
            }
            Err(e) => {
                if let Err(p) = &planned {
                    prop_assert_eq!(e.to_string(), p.to_string());
                }
                prop_assert!(!spec.exists(), "a refused claim left {:?}", spec);
                prop_assert!(!claim_dir.exists(), "a refused claim left its claim directory");
                let left: Vec<_> = std::fs::read_dir(dir.path().join("cdi")).unwrap().flatten().collect();
                prop_assert!(left.is_empty(), "CDI dir not empty: {:?}", left);
            }
        }
    }
}
