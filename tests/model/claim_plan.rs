//! The claim planner's rules (`tessera::prepare::claim_plan::plan_claim`), one test
//! each, on the embedded mock node: gpu-0 an H100 in `mig` mode, gpu-1 an H100 in
//! `shared` mode, gpu-2 and gpu-3 T4s in `exclusive` mode. Pure: no files, no server.

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};
use tessera::config::{ManagedGpu, NodeConfig};
use tessera::inventory::mock::MockNode;
use tessera::prepare::claim_plan::{
    Budget, ClaimError, ClaimPlan, Held, MigTarget, NodeView, PlannedDevice, plan_claim,
};
use tessera::prepare::gpu_config::GpuConfig;

const D: &str = "gpu.tessera.dev";
const POOL: &str = "node-a";
const UID: &str = "uid-1";
const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;
/// gpu-1's memory as published and budgeted: 81559 MiB.
const H100_BYTES: u64 = 85_520_809_984;

/// The embedded mock node's GPUs with the modes its embedded config gives them.
fn gpus() -> Vec<ManagedGpu> {
    let node = MockNode::embedded_default().unwrap();
    let config = NodeConfig::embedded_in(&node).unwrap().unwrap();
    config.resolve(&node.inventory(), "embedded").unwrap()
}

fn uuid_of(gpus: &[ManagedGpu], minor: u32) -> String {
    let gpu = gpus.iter().find(|g| g.gpu.minor == minor).unwrap();
    gpu.gpu.uuid.clone()
}

/// This node: our driver, pool `node-a`, four fallback slots per shared GPU.
fn node(gpus: &[ManagedGpu]) -> NodeView<'_> {
    NodeView {
        driver: D,
        pool: POOL,
        gpus,
        shared_slots: 4,
    }
}

/// An allocation result of our driver and pool.
fn result(request: &str, device: &str) -> Value {
    json!({"request": request, "driver": D, "pool": POOL, "device": device})
}

/// A share of gpu-1 as the scheduler allocates it: a shareID and consumedCapacity.
fn share(request: &str, share_id: &str, memory: &str, compute: &str) -> Value {
    let mut r = result(request, "gpu-1");
    r["shareID"] = json!(share_id);
    r["consumedCapacity"] = json!({"memory": memory, "compute": compute});
    r
}

/// An opaque GpuConfig entry for our driver.
fn config(source: &str, requests: &[&str], fields: Value) -> Value {
    let mut params = json!({"apiVersion": "resource.tessera.dev/v1alpha1", "kind": "GpuConfig"});
    params
        .as_object_mut()
        .unwrap()
        .extend(fields.as_object().unwrap().clone());
    json!({"source": source, "requests": requests, "opaque": {"driver": D, "parameters": params}})
}

/// Claim `default/c` with UID `uid-1`, allocated with these results and configs.
fn claim_with(results: Vec<Value>, configs: Vec<Value>) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default", "uid": UID},
        "spec": {"devices": {}},
        "status": {"allocation": {"devices": {"results": results, "config": configs}}}
    }))
    .unwrap()
}

fn claim(results: Vec<Value>) -> ResourceClaim {
    claim_with(results, vec![])
}

fn plan(claim: &ResourceClaim) -> Result<ClaimPlan, ClaimError> {
    plan_claim(claim, UID, node(&gpus()), &Held::default())
}

fn plan_held(claim: &ResourceClaim, held: &Held) -> Result<ClaimPlan, ClaimError> {
    plan_claim(claim, UID, node(&gpus()), held)
}

/// The single planned device of a plan.
fn only(plan: Result<ClaimPlan, ClaimError>) -> PlannedDevice {
    let mut devices = plan.unwrap().devices;
    assert_eq!(devices.len(), 1, "{devices:?}");
    devices.remove(0)
}

/// Held devices: hold key → holder UID.
fn held(devices: &[(&str, &str)]) -> Held {
    Held {
        devices: devices
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn unknown(request: &str, device: &str) -> ClaimError {
    ClaimError::UnknownDevice {
        request: request.into(),
        device: device.into(),
    }
}

/// A whole GPU is planned as that GPU (minor and UUID), with no MIG target, no budget,
/// no shareID and the default config; the plan carries the claim's identity.
#[test]
fn a_whole_gpu_is_planned_as_that_gpu_alone() {
    let gpus = gpus();
    let p = plan_claim(
        &claim(vec![result("gpu", "gpu-2")]),
        UID,
        node(&gpus),
        &Held::default(),
    )
    .unwrap();
    let device = PlannedDevice {
        request: "gpu".into(),
        pool: POOL.into(),
        device: "gpu-2".into(),
        share_id: None,
        gpu_minor: 2,
        gpu_uuid: uuid_of(&gpus, 2),
        config: GpuConfig::default(),
        mig: None,
        budget: None,
    };
    let want = ClaimPlan {
        uid: UID.into(),
        namespace: "default".into(),
        name: "c".into(),
        devices: vec![device],
    };
    assert_eq!(p, want);
    assert!(!p.is_shared());
    assert_eq!(p.devices[0].cdi_name(UID), "uid-1-gpu-2");
}

/// A `mig`-mode GPU allocated whole is planned as a whole GPU: the planner does not
/// look at live MIG instances (the state machine refuses those at prepare).
#[test]
fn a_mig_mode_gpu_allocated_whole_is_planned_whole() {
    let d = only(plan(&claim(vec![result("gpu", "gpu-0")])));
    assert_eq!((d.gpu_minor, d.mig, d.budget), (0, None, None));
}

/// A MIG partition is planned from its name: profile ID, placement start, the
/// profile's placement size, and the GI ID NVML gives that placement (its heap index).
#[test]
fn a_mig_partition_is_planned_with_its_placement_and_gi_id() {
    let mig = |profile_id, start, size, gi_id| MigTarget {
        profile_id,
        start,
        size,
        gi_id,
    };
    for (device, want) in [
        ("gpu-0-mig-7g80gb-0-0", mig(0, 0, 8, 0)),
        ("gpu-0-mig-3g40gb-9-4", mig(9, 4, 4, 2)),
        ("gpu-0-mig-1g20gb-15-6", mig(15, 6, 2, 6)),
        ("gpu-0-mig-1g10gb-19-5", mig(19, 5, 1, 12)),
        ("gpu-0-mig-1g10gb-me-20-3", mig(20, 3, 1, 10)),
    ] {
        let d = only(plan(&claim(vec![result("part", device)])));
        assert_eq!(
            (d.gpu_minor, d.mig, d.budget),
            (0, Some(want), None),
            "{device}"
        );
    }
}

/// A MIG name is refused as unknown unless it names a catalogued profile by its ID and
/// name, at one of its placements, on a `mig`-mode GPU of this node.
#[test]
fn a_mig_name_outside_the_catalog_or_the_mig_gpus_is_unknown() {
    for device in [
        "gpu-0-mig-1g10gb-9-4",  // profile 9 is 3g.40gb
        "gpu-0-mig-3g40gb-9-2",  // 3g.40gb starts at 0 or 4
        "gpu-0-mig-9g99gb-99-0", // no profile 99
        "gpu-1-mig-1g10gb-19-0", // an H100 in shared mode
        "gpu-2-mig-1g10gb-19-0", // a T4 in exclusive mode
        "gpu-9-mig-1g10gb-19-0", // no GPU 9
    ] {
        let err = plan(&claim(vec![result("part", device)])).unwrap_err();
        assert_eq!(err, unknown("part", device));
    }
}

/// A device name that is not one Tessera publishes, or names a GPU this node does not
/// have, is refused with the request and device.
#[test]
fn an_unknown_device_name_is_refused() {
    for device in ["gpu-9", "nvidia0", "gpu-02", "gpu-2-extra", "gpu-"] {
        let err = plan(&claim(vec![result("gpu", device)])).unwrap_err();
        assert_eq!(err, unknown("gpu", device));
    }
    let err = plan(&claim(vec![result("gpu", "gpu-9")])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "device gpu-9 of request gpu does not exist on this node"
    );
}

/// A share of a shared GPU gets its budget from the allocation's consumedCapacity:
/// memory in bytes (rounded down to a whole byte), compute in percent; the shareID is
/// kept and names its hold key and CDI device.
#[test]
fn a_shared_gpu_share_gets_its_budget_from_consumed_capacity() {
    let gpus = gpus();
    for (memory, compute, bytes, percent) in [
        ("20Gi", "25", 20 * GI, 25),
        ("1500Ki", "0", 1_536_000, 0),
        ("1536001m", "100", 1536, 100),
        ("81559Mi", "1", H100_BYTES, 1),
    ] {
        let c = claim(vec![share("gpu", "s-1", memory, compute)]);
        let p = plan_claim(&c, UID, node(&gpus), &Held::default()).unwrap();
        let d = &p.devices[0];
        let budget = Budget {
            memory_bytes: bytes,
            compute_percent: percent,
        };
        assert_eq!(
            (d.budget, d.mig, d.gpu_minor),
            (Some(budget), None, 1),
            "{memory}"
        );
        assert!(p.is_shared());
        assert_eq!(p.budgets_by_uuid(), [(uuid_of(&gpus, 1), budget)]);
    }
    let d = only(plan(&claim(vec![share("gpu", "s-1", "1Gi", "5")])));
    assert_eq!(d.share_id.as_deref(), Some("s-1"));
    assert_eq!(d.hold_key(), "gpu-1#s-1");
    assert_eq!(d.cdi_name(UID), "uid-1-gpu-1-s-1");
}

/// A shared GPU allocated without a shareID (a server that dropped consumable
/// capacity) is refused with a message saying so.
#[test]
fn a_shared_gpu_without_a_share_id_is_refused() {
    let mut r = share("gpu", "s-1", "20Gi", "25");
    r.as_object_mut().unwrap().remove("shareID");
    let err = plan(&claim(vec![r])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "device gpu-1 of request gpu: a shared GPU allocated without a shareID (the server dropped consumable capacity?)"
    );
}

/// A share whose consumedCapacity is missing, lacks memory or compute, or holds a
/// value outside 1 byte..the GPU's memory or 0..100 percent is refused, naming why.
#[test]
fn a_share_with_unusable_consumed_capacity_is_refused() {
    let without_cc = {
        let mut r = share("gpu", "s-1", "1Gi", "1");
        r.as_object_mut().unwrap().remove("consumedCapacity");
        r
    };
    let memory_only = {
        let mut r = share("gpu", "s-1", "1Gi", "1");
        r["consumedCapacity"] = json!({"memory": "1Gi"});
        r
    };
    let outside = format!(
        "consumed memory {} is outside 1..={H100_BYTES} bytes",
        H100_BYTES + MI
    );
    let cases = [
        (
            without_cc,
            "no consumedCapacity in the allocation result".to_string(),
        ),
        (memory_only, "consumedCapacity has no compute".into()),
        (
            share("gpu", "s-1", "0", "10"),
            format!("consumed memory 0 is outside 1..={H100_BYTES} bytes"),
        ),
        (share("gpu", "s-1", "81560Mi", "10"), outside),
        (
            share("gpu", "s-1", "-1Gi", "10"),
            r#"consumedCapacity memory "-1Gi" is not a size"#.into(),
        ),
        (
            share("gpu", "s-1", "1Gi", "101"),
            "consumed compute 101 is above 100 percent".into(),
        ),
    ];
    for (r, reason) in cases {
        let err = plan(&claim(vec![r])).unwrap_err();
        let want = ClaimError::BadShare {
            request: "gpu".into(),
            device: "gpu-1".into(),
            reason,
        };
        assert_eq!(err, want);
    }
}

/// A fallback slot of a shared GPU gets 1/N of it: memory rounded down to a whole MiB
/// and 100/N percent of compute, N being the node's slot count; it has no shareID.
#[test]
fn a_fallback_slot_gets_its_part_of_the_gpu() {
    let gpus = gpus();
    for (slots, device, bytes, percent) in [
        (4, "gpu-1-slot-2", 20_389 * MI, 25),
        (2, "gpu-1-slot-1", 40_779 * MI, 50),
    ] {
        let view = NodeView {
            shared_slots: slots,
            ..node(&gpus)
        };
        let c = claim(vec![result("slot", device)]);
        let p = plan_claim(&c, UID, view, &Held::default()).unwrap();
        let d = &p.devices[0];
        let budget = Budget {
            memory_bytes: bytes,
            compute_percent: percent,
        };
        assert_eq!(
            (d.budget, d.share_id.as_deref(), d.gpu_minor),
            (Some(budget), None, 1),
            "{device}"
        );
        assert!(p.is_shared());
    }
}

/// A slot index at or beyond the node's slot count, or a slot of a GPU that is not
/// shared, is unknown.
#[test]
fn a_slot_beyond_the_count_or_of_an_unshared_gpu_is_unknown() {
    for device in ["gpu-1-slot-4", "gpu-2-slot-0", "gpu-0-slot-0"] {
        let err = plan(&claim(vec![result("slot", device)])).unwrap_err();
        assert_eq!(err, unknown("slot", device));
    }
}

/// The opaque GpuConfigs of our driver that apply to a device's request (by name or
/// parent request) merge class configs first, then claim configs, field by field,
/// whatever their order in the list; other requests' and other drivers' configs are
/// left out; the planned request drops its `/subrequest`.
#[test]
fn gpu_configs_merge_class_then_claim_per_request() {
    let foreign = json!({"source": "FromClaim", "requests": ["gpu"],
        "opaque": {"driver": "other.example.com", "parameters": {"anything": 1}}});
    let configs = vec![
        config("FromClaim", &["gpu"], json!({"computeLimit": 30})),
        config(
            "FromClass",
            &["gpu/whole"],
            json!({"scrubOnFree": true, "computeLimit": 50}),
        ),
        config("FromClaim", &["other"], json!({"computeLimit": 90})),
        foreign,
    ];
    let c = claim_with(
        vec![result("gpu/whole", "gpu-2"), result("other", "gpu-3")],
        configs,
    );
    let p = plan(&c).unwrap();
    let got: Vec<(&str, &str, GpuConfig)> = p
        .devices
        .iter()
        .map(|d| (d.request.as_str(), d.device.as_str(), d.config))
        .collect();
    let cfg = |scrub_on_free, limit| GpuConfig {
        scrub_on_free,
        compute_limit: Some(limit),
    };
    assert_eq!(
        got,
        [
            ("gpu", "gpu-2", cfg(true, 30)),
            ("other", "gpu-3", cfg(false, 90))
        ]
    );
}

/// Every opaque config of our driver must decode, even one for a request no device of
/// this claim has: a bad one fails the claim, naming the entry and the field.
#[test]
fn an_invalid_config_fails_the_claim_even_if_no_device_uses_it() {
    let configs = vec![config("FromClaim", &["nobody"], json!({"computeLimit": 0}))];
    let err = plan(&claim_with(vec![result("gpu", "gpu-2")], configs)).unwrap_err();
    assert_eq!(
        err,
        ClaimError::Config(
            "config[0] (FromClaim): computeLimit: must be between 1 and 100, got 0".into()
        )
    );
}

/// Results of other drivers are left to them; a claim with none of ours has no devices
/// here and is refused as such.
#[test]
fn results_of_other_drivers_are_ignored() {
    let mut foreign = result("nic", "gpu-0");
    foreign["driver"] = json!("net.example.com");
    foreign["pool"] = json!("elsewhere");
    let d = only(plan(&claim(vec![foreign.clone(), result("gpu", "gpu-2")])));
    assert_eq!(d.device, "gpu-2");
    let err = plan(&claim(vec![foreign])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "ResourceClaim default/c has no devices of driver gpu.tessera.dev in pool node-a"
    );
}

/// A result of our driver in another pool (another node's) is refused, not ignored.
#[test]
fn a_result_of_our_driver_in_another_pool_is_refused() {
    let mut r = result("gpu", "gpu-2");
    r["pool"] = json!("node-b");
    let err = plan(&claim(vec![r])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "device gpu-2 of request gpu is in pool node-b, which is not this node's pool node-a"
    );
}

/// A claim whose UID is not the one the kubelet asked for (deleted and recreated under
/// the same name) is refused before anything else, even before its allocation.
#[test]
fn a_replaced_claim_is_refused_by_its_uid() {
    let c = claim(vec![result("gpu", "gpu-2")]);
    let err = plan_claim(&c, "uid-0", node(&gpus()), &Held::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "ResourceClaim default/c has UID uid-1, expected uid-0: it was replaced"
    );
    let mut unallocated = c;
    unallocated.status = None;
    let err = plan_claim(&unallocated, "uid-0", node(&gpus()), &Held::default()).unwrap_err();
    assert!(matches!(err, ClaimError::UidMismatch { .. }), "{err}");
}

/// A claim without an allocation is refused.
#[test]
fn an_unallocated_claim_is_refused() {
    let mut c = claim(vec![]);
    c.status = None;
    assert_eq!(
        plan(&c).unwrap_err().to_string(),
        "ResourceClaim default/c is not allocated"
    );
}

/// A device another prepared claim holds is refused, naming the holder; held by this
/// same claim (a repeated prepare) it is planned again.
#[test]
fn a_device_held_by_another_claim_is_refused() {
    let c = claim(vec![result("gpu", "gpu-2")]);
    let err = plan_held(&c, &held(&[("gpu-2", "uid-other")])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "device gpu-2 is already prepared for claim uid-other"
    );
    assert_eq!(
        only(plan_held(&c, &held(&[("gpu-2", UID)]))).device,
        "gpu-2"
    );
}

/// A whole GPU and its partitions, or two partitions whose memory slices overlap, are
/// never held by two claims; partitions beside each other and other GPUs' devices are.
#[test]
fn a_whole_gpu_and_overlapping_partitions_exclude_each_other() {
    let refused = [
        ("gpu-0", "gpu-0-mig-1g10gb-19-6"),
        ("gpu-0-mig-1g10gb-19-6", "gpu-0"),
        ("gpu-0-mig-1g10gb-19-5", "gpu-0-mig-3g40gb-9-4"),
        ("gpu-0-mig-3g40gb-9-0", "gpu-0-mig-1g20gb-15-2"),
    ];
    for (planned, other) in refused {
        let err = plan_held(
            &claim(vec![result("r", planned)]),
            &held(&[(other, "uid-other")]),
        );
        let want = ClaimError::DeviceInUse {
            device: planned.into(),
            holder: format!("uid-other (through {other})"),
        };
        assert_eq!(err.unwrap_err(), want, "{planned} beside {other}");
    }
    let allowed = [
        ("gpu-0-mig-1g10gb-19-3", "gpu-0-mig-3g40gb-9-4"),
        ("gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"),
        ("gpu-0", "gpu-2"),
        ("gpu-0-mig-1g10gb-19-0", "gpu-1-slot-0"),
    ];
    for (planned, other) in allowed {
        let p = plan_held(
            &claim(vec![result("r", planned)]),
            &held(&[(other, "uid-other")]),
        );
        assert_eq!(only(p).device, planned, "{planned} beside {other}");
    }
}

/// Shares of a shared GPU are held by (device, shareID): another claim's share of the
/// same GPU does not exclude this one, the same shareID does.
#[test]
fn shares_are_held_by_share_id() {
    let c = claim(vec![share("gpu", "s-1", "10Gi", "10")]);
    let others = held(&[("gpu-1#s-2", "uid-other"), ("gpu-1-slot-0", "uid-3")]);
    assert_eq!(
        only(plan_held(&c, &others)).share_id.as_deref(),
        Some("s-1")
    );
    let err = plan_held(&c, &held(&[("gpu-1#s-1", "uid-other")])).unwrap_err();
    assert_eq!(
        err,
        ClaimError::DeviceInUse {
            device: "gpu-1".into(),
            holder: "uid-other".into()
        }
    );
}

/// One claim cannot list a device twice; two shares of one GPU (different shareIDs)
/// are two devices, and the claim's budget for that GPU is their sum.
#[test]
fn a_device_twice_in_a_claim_is_refused_but_two_shares_add_up() {
    let twice = claim(vec![result("a", "gpu-2"), result("b", "gpu-2")]);
    assert_eq!(
        plan(&twice).unwrap_err().to_string(),
        "device gpu-2 is allocated twice in this claim"
    );
    let same_share = claim(vec![
        share("a", "s-1", "1Gi", "1"),
        share("b", "s-1", "1Gi", "1"),
    ]);
    assert!(matches!(
        plan(&same_share),
        Err(ClaimError::DuplicateDevice { .. })
    ));
    let two = claim(vec![
        share("a", "s-a", "10Gi", "20"),
        share("b", "s-b", "30Gi", "30"),
    ]);
    let p = plan(&two).unwrap();
    let sum = Budget {
        memory_bytes: 40 * GI,
        compute_percent: 50,
    };
    assert_eq!(p.budgets_by_uuid(), [(uuid_of(&gpus(), 1), sum)]);
}

/// The budgets of all prepared claims on a shared GPU, this one's included (shares and
/// slots alike), stay within its memory and 100 % compute: exactly full is accepted,
/// one byte or one percent more is refused with the totals.
#[test]
fn a_shared_gpu_is_never_over_committed() {
    let with_budget = |memory_bytes, compute_percent| Held {
        budgets: [(
            1,
            Budget {
                memory_bytes,
                compute_percent,
            },
        )]
        .into(),
        ..Default::default()
    };
    let c = claim(vec![share("gpu", "s-1", "20Gi", "25")]);
    let full = with_budget(H100_BYTES - 20 * GI, 75);
    assert_eq!(only(plan_held(&c, &full)).share_id.as_deref(), Some("s-1"));
    let err = plan_held(&c, &with_budget(H100_BYTES - 20 * GI + 1, 0)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "GPU 1 would be over-committed: memory (bytes) of prepared claims plus this one is {}, more than its {H100_BYTES}",
            H100_BYTES + 1
        )
    );
    let err = plan_held(&c, &with_budget(GI, 76)).unwrap_err();
    assert_eq!(
        err,
        ClaimError::OverCommitted {
            minor: 1,
            what: "compute (percent)",
            total: 101,
            capacity: 100
        }
    );
    // A slot counts the same way: 25 % of compute on top of 80 %.
    let slot = claim(vec![result("slot", "gpu-1-slot-0")]);
    let err = plan_held(&slot, &with_budget(GI, 80)).unwrap_err();
    assert!(
        matches!(err, ClaimError::OverCommitted { total: 105, .. }),
        "{err}"
    );
}
