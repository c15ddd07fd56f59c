//! Shared GPUs, driver side, as a specification: what the plugin publishes for a
//! `shared` GPU on each Kubernetes version, how `tessera plan` (the scheduler's rules)
//! allocates shares of it, and what preparing a share leaves for the interception
//! library: the budget from `consumedCapacity`, the per-claim files and the CDI mounts.

use testkit::harness;

use std::collections::BTreeMap;
use std::path::Path;

use harness::{Harness, InProcess, NODE};
use k8s_model::release::{FeatureGates, KubeVersion};
use k8s_model::schedule::{self, Outcome, Step};
use k8s_openapi::api::resource::v1::{
    DeviceConstraint, DeviceRequestAllocationResult, ResourceClaim, ResourceSlice,
};
use serde_json::Value;
use tessera_abi::limits::Limits;
use testkit::fakeapi::FakeApiConfig;
use testkit::kubelet_standin::{DraClient, KubeletClaim};

const GPU1_UUID: &str = "GPU-9a7e3b21-0c4d-4f8e-b6a5-2d1c0e9f8a73";
/// gpu-1's memory: 81559 MiB.
const GPU1_MEMORY: u64 = 85_520_809_984;

fn version(minor: u32) -> KubeVersion {
    KubeVersion::new(minor).unwrap()
}

/// Starts the plugin and waits for its whole pool.
async fn published(h: &Harness) -> (InProcess, Vec<ResourceSlice>) {
    let p = h.start_plugin().await;
    let mut slices = Vec::new();
    harness::wait_until("the pool", || {
        slices = h.api.resource_slices();
        slices
            .first()
            .is_some_and(|f| slices.len() as i64 == f.spec.pool.resource_slice_count)
    })
    .await;
    (p, slices)
}

fn devices(slices: &[ResourceSlice]) -> Vec<&k8s_openapi::api::resource::v1::Device> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect()
}

/// With consumable capacity kept by the server (1.36+ defaults, or the gate switched on
/// in 1.34/1.35), gpu-1 is one multi-allocatable `gpu-shared` device with request
/// policies; where the server drops it, gpu-1 is four `gpu-slot` devices.
#[tokio::test]
async fn shared_gpu_slices_on_every_version() {
    let mut seen = Vec::new();
    for minor in 34..=38 {
        for overrides in [
            "",
            "DRAConsumableCapacity=true",
            "DRAConsumableCapacity=false",
        ] {
            let gates = FeatureGates::parse(version(minor), overrides).unwrap();
            let consumable = gates.consumable_capacity();
            let h = Harness::with_config(FakeApiConfig { gates }).await;
            let (p, slices) = published(&h).await;
            let devs = devices(&slices);
            let gpu1: Vec<&str> = devs
                .iter()
                .map(|d| d.name.as_str())
                .filter(|n| n.starts_with("gpu-1"))
                .collect();
            let what = format!("1.{minor} {overrides:?}");
            if consumable {
                assert_eq!(gpu1, ["gpu-1"], "{what}");
                let d = devs.iter().find(|d| d.name == "gpu-1").unwrap();
                assert_eq!(d.allow_multiple_allocations, Some(true), "{what}");
                let cap = d.capacity.as_ref().unwrap();
                assert_eq!(cap.len(), 2, "{what}: only memory and compute");
                assert!(
                    cap.values().all(|c| c.request_policy.is_some()),
                    "{what}: the server kept the request policies"
                );
                assert_eq!(cap["memory"].value.0, GPU1_MEMORY.to_string());
            } else {
                assert_eq!(
                    gpu1,
                    [
                        "gpu-1-slot-0",
                        "gpu-1-slot-1",
                        "gpu-1-slot-2",
                        "gpu-1-slot-3"
                    ],
                    "{what}"
                );
                assert!(
                    devs.iter().all(|d| d.allow_multiple_allocations.is_none()),
                    "{what}"
                );
                let slot = devs.iter().find(|d| d.name == "gpu-1-slot-2").unwrap();
                let a = slot.attributes.as_ref().unwrap();
                assert_eq!(a["uuid"].string.as_deref(), Some(GPU1_UUID), "{what}");
                let cap = slot.capacity.as_ref().unwrap();
                assert_eq!(
                    cap["memory"].value.0,
                    ((GPU1_MEMORY / 4) >> 20 << 20).to_string()
                );
                assert_eq!(cap["compute"].value.0, "25");
            }
            seen.push((minor, consumable));
            p.stop().await;
        }
    }
    eprintln!("versions and gates checked: {seen:?}");
    assert!(seen.contains(&(34, false)) && seen.contains(&(34, true)));
    assert!(seen.contains(&(37, true)) && seen.contains(&(37, false)));
}

fn allocated(outcomes: &[Outcome]) -> Vec<(String, Option<String>)> {
    outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Allocated(c) => Some((c.metadata.name.clone().unwrap(), None)),
            Outcome::Failed { claim, reason } => {
                Some((claim.metadata.name.clone().unwrap(), Some(reason.clone())))
            }
            Outcome::Released { .. } => None,
        })
        .collect()
}

fn consumed(c: &ResourceClaim) -> Vec<BTreeMap<String, String>> {
    c.status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .map(|r| {
            r.consumed_capacity
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect()
        })
        .collect()
}

/// `tessera plan` over the published slices and `examples/claims/shared-gpus.yaml`:
/// shares fit until memory (too-big) or compute (too-busy) runs out, `fill` takes what
/// is left, and after the release a claim that asks for nothing takes all the memory.
#[tokio::test]
async fn plan_fits_shares_until_memory_or_compute_runs_out() {
    let h = Harness::new().await;
    let (p, slices) = published(&h).await;
    p.stop().await;
    let steps = schedule::read_steps(&[
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/claims/shared-gpus.yaml")
    ])
    .unwrap();
    let classes = tessera::device_classes::read(None).unwrap();
    let r = schedule::run(
        &slices,
        &classes,
        &steps,
        &FeatureGates::defaults(KubeVersion::NEWEST),
    )
    .unwrap();
    let got = allocated(&r.outcomes);
    let ok: Vec<&str> = got
        .iter()
        .filter(|(_, e)| e.is_none())
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(ok, ["light", "heavy", "fill", "whole"]);
    let failed: Vec<&str> = got
        .iter()
        .filter(|(_, e)| e.is_some())
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(failed, ["too-big", "too-busy"]);
    let whole = r
        .outcomes
        .iter()
        .find_map(|o| match o {
            Outcome::Allocated(c) if c.metadata.name.as_deref() == Some("whole") => Some(c),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        consumed(whole),
        [BTreeMap::from([
            ("compute".to_string(), "0".to_string()),
            ("memory".to_string(), GPU1_MEMORY.to_string()),
        ])]
    );
}

/// Runs `examples/claims/shared-gpus.yaml` through `tessera plan` on `gates`:
/// (claim, failure reason) in order.
fn plan_shared_gpus(
    slices: &[ResourceSlice],
    gates: &FeatureGates,
) -> Vec<(String, Option<String>)> {
    let steps = schedule::read_steps(&[
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/claims/shared-gpus.yaml")
    ])
    .unwrap();
    let classes = tessera::device_classes::read(None).unwrap();
    allocated(
        &schedule::run(slices, &classes, &steps, gates)
            .unwrap()
            .outcomes,
    )
}

/// 1.34 with every DRA gate on: its scheduler checks a share's capacity on the device
/// at the pick's index in the chosen device's slice. The plugin publishes gpu-1 alone
/// in a slice of its own, so the check lands on gpu-1 and `plan --k8s-version 1.34`
/// allocates the shares as on 1.35+; the same devices in one slice (the layout before)
/// would have had gpu-0 checked, which has no `compute`: every share with a request
/// unschedulable.
#[tokio::test]
async fn on_1_34_shares_fit_because_the_shared_gpu_is_alone_in_its_slice() {
    let gates = FeatureGates::parse(
        version(34),
        "DRAPartitionableDevices=true,DRAConsumableCapacity=true",
    )
    .unwrap();
    let h = Harness::with_config(FakeApiConfig {
        gates: gates.clone(),
    })
    .await;
    let (p, slices) = published(&h).await;
    p.stop().await;
    let gpu1: Vec<usize> = slices
        .iter()
        .enumerate()
        .filter(|(_, s)| s.spec.devices.iter().flatten().any(|d| d.name == "gpu-1"))
        .map(|(i, _)| i)
        .collect();
    let [at] = gpu1[..] else {
        panic!("gpu-1 in slices {gpu1:?}")
    };
    let alone: Vec<&str> = slices[at]
        .spec
        .devices
        .iter()
        .flatten()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(alone, ["gpu-1"]);

    let got = plan_shared_gpus(&slices, &gates);
    let outcome = |ok: bool| -> Vec<&str> {
        got.iter()
            .filter(|(_, e)| e.is_none() == ok)
            .map(|(n, _)| n.as_str())
            .collect()
    };
    assert_eq!(
        outcome(true),
        ["light", "heavy", "fill", "whole"],
        "{got:?}"
    );
    assert_eq!(outcome(false), ["too-big", "too-busy"]);

    // The layout before: gpu-1 after gpu-0's partitions in the one combined slice.
    let mut before = slices.clone();
    let moved = before.remove(at).spec.devices.unwrap();
    let first = before[0].spec.devices.get_or_insert_with(Vec::new);
    let pos = first.iter().position(|d| d.name == "gpu-2").unwrap();
    first.splice(pos..pos, moved);
    for s in &mut before {
        s.spec.pool.resource_slice_count = 1;
    }
    assert_eq!(before.len(), 1);
    let got = plan_shared_gpus(&before, &gates);
    let failed: Vec<&str> = got
        .iter()
        .filter(|(_, e)| e.is_some())
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(
        failed,
        ["light", "heavy", "too-big", "too-busy", "fill"],
        "{got:?}"
    );
}

/// A claim with two shared requests, parsed from YAML like a user's.
fn two_share_claim() -> ResourceClaim {
    let yaml = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: twice, namespace: default}
spec:
  devices:
    requests:
    - name: a
      exactly:
        deviceClassName: shared.tessera.dev
        capacity: {requests: {memory: 1G, compute: "10"}}
    - name: b
      exactly:
        deviceClassName: shared.tessera.dev
        capacity: {requests: {memory: 1500Mi, compute: "5"}}
"#;
    serde_yaml_ng::from_str(yaml).unwrap()
}

/// Allocates `claim` with `tessera plan` against `slices`, creates it in the fake API
/// server with that allocation, and returns the kubelet's view of it.
async fn plan_and_create(
    h: &Harness,
    slices: &[ResourceSlice],
    claim: ResourceClaim,
) -> (KubeletClaim, Vec<DeviceRequestAllocationResult>) {
    let name = claim.metadata.name.clone().unwrap();
    let r = schedule::run(
        slices,
        &tessera::device_classes::read(None).unwrap(),
        &[Step::Allocate(Box::new(claim))],
        &h.api_gates(),
    )
    .unwrap();
    let results = match &r.outcomes[0] {
        Outcome::Allocated(c) => c
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.clone())
            .unwrap(),
        other => panic!("{name} not allocated: {other:?}"),
    };
    (
        h.allocated_claim_with(&name, results.clone(), &[]).await,
        results,
    )
}

trait Gates {
    fn api_gates(&self) -> FeatureGates;
}
impl Gates for Harness {
    fn api_gates(&self) -> FeatureGates {
        self.api.gates().clone()
    }
}

async fn prepare(k: &DraClient, c: &KubeletClaim) -> Vec<String> {
    let resp = k.prepare_v1(std::slice::from_ref(c)).await.unwrap();
    let r = &resp.claims[&c.uid];
    assert_eq!(r.error, "", "prepare {}", c.name);
    r.devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.clone())
        .collect()
}

fn claim_file(h: &Harness, uid: &str, name: &str) -> std::path::PathBuf {
    h.opts.paths.run_dir.join("claims").join(uid).join(name)
}

/// The budget is what the scheduler consumed, not what was asked: 1G rounds up to the
/// 1 MiB step (954 MiB), and the same GPU twice in one claim adds up (memory and
/// compute) under its UUID.
#[tokio::test]
async fn budgets_come_from_consumed_capacity() {
    let h = Harness::new().await;
    let (p, slices) = published(&h).await;
    let k = h.kubelet().await;
    let (c, results) = plan_and_create(&h, &slices, two_share_claim()).await;
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|r| r.device == "gpu-1"));
    assert_ne!(results[0].share_id, results[1].share_id);
    assert_eq!(
        results[0].consumed_capacity.as_ref().unwrap()["memory"].0,
        (954u64 << 20).to_string(),
        "1G = 953.7 MiB, rounded up to the 1 MiB step"
    );
    let ids = prepare(&k, &c).await;
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1], "one CDI device per share");

    let limits = std::fs::read_to_string(claim_file(&h, &c.uid, "limits")).unwrap();
    let l = Limits::parse(&limits).unwrap();
    assert_eq!(l.claim_uid, c.uid);
    assert_eq!(l.gpus.len(), 1);
    assert_eq!(l.gpus[0].uuid, GPU1_UUID);
    assert_eq!(l.gpus[0].memory_bytes, (954 + 1500) << 20);
    let control =
        tessera_abi::control::parse(&std::fs::read(claim_file(&h, &c.uid, "control")).unwrap())
            .unwrap();
    assert_eq!((control[0].share, control[0].compute_limit), (15, 100));
    let region = std::fs::read(claim_file(&h, &c.uid, "region")).unwrap();
    let snap = tessera_abi::region::Snapshot::parse(&region).unwrap();
    assert_eq!(snap.gpus[0].uuid, GPU1_UUID);
    assert_eq!(snap.gpus[0].used, 0);
    assert!(snap.slots.is_empty());

    k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
    assert!(!claim_file(&h, &c.uid, "limits").exists());
    p.stop().await;
}

/// Mount table of a spec: container path to (host path, options), spec-level and
/// device-level together.
fn mounts(spec: &Value) -> BTreeMap<String, (String, Vec<String>)> {
    let mut out = BTreeMap::new();
    let mut edits = vec![&spec["containerEdits"]];
    for d in spec["devices"].as_array().unwrap() {
        edits.push(&d["containerEdits"]);
    }
    for e in edits {
        for m in e["mounts"].as_array().into_iter().flatten() {
            let opts = m["options"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o.as_str().unwrap().to_string())
                .collect();
            let prev = out.insert(
                m["containerPath"].as_str().unwrap().to_string(),
                (m["hostPath"].as_str().unwrap().to_string(), opts),
            );
            assert!(prev.is_none(), "a spec mounts one path twice");
        }
    }
    out
}

/// One pod, three claims: a share of gpu-1, the whole gpu-2, and another share of
/// gpu-1. Paths the specs have in common mount the same thing the same way; each
/// claim's files sit at their own path, as single files, the region alone writable.
#[tokio::test]
async fn claims_in_one_pod_do_not_collide() {
    let h = Harness::new().await;
    let (p, _) = published(&h).await;
    let k = h.kubelet().await;
    let a = h
        .allocated_claim_with(
            "share-a",
            vec![harness::shared_result(
                "gpu",
                "gpu-1",
                "11111111-1111-4111-8111-111111111111",
                "20Gi",
                "25",
            )],
            &[],
        )
        .await;
    let b = h
        .allocated_claim("whole-b", &[("gpu", NODE, "gpu-2", None)], &[])
        .await;
    let c = h
        .allocated_claim_with(
            "share-c",
            vec![harness::shared_result(
                "gpu",
                "gpu-1",
                "22222222-2222-4222-8222-222222222222",
                "30Gi",
                "40",
            )],
            &[],
        )
        .await;
    for claim in [&a, &b, &c] {
        prepare(&k, claim).await;
    }
    let spec = |uid: &str| -> Value {
        serde_json::from_slice(&std::fs::read(h.spec_path(uid)).unwrap()).unwrap()
    };
    let (ma, mb, mc) = (
        mounts(&spec(&a.uid)),
        mounts(&spec(&b.uid)),
        mounts(&spec(&c.uid)),
    );
    for (x, y) in [(&ma, &mb), (&ma, &mc), (&mb, &mc)] {
        for (path, m) in x {
            if let Some(other) = y.get(path) {
                assert_eq!(m, other, "{path} is mounted differently by two claims");
            }
        }
    }
    // The preload file of the library version the spec mounts, naming its front.
    let lib_dir = &ma["/usr/local/tessera/lib"].0;
    assert_eq!(
        ma["/etc/ld.so.preload"].0,
        format!("{lib_dir}/ld.so.preload")
    );
    assert_eq!(
        std::fs::read_to_string(format!("{lib_dir}/ld.so.preload")).unwrap(),
        "/usr/local/tessera/lib/libtessera_preload.so\n"
    );
    assert!(ma.contains_key("/usr/local/tessera/lib"));
    assert!(
        !mb.contains_key("/etc/ld.so.preload"),
        "a whole GPU gets no interception library"
    );
    for (claim, m) in [(&a, &ma), (&c, &mc)] {
        let base = format!("/run/tessera/claims/{}", claim.uid);
        let own: Vec<(&String, &(String, Vec<String>))> = m
            .iter()
            .filter(|(p, _)| p.starts_with("/run/tessera"))
            .collect();
        let names: Vec<&str> = own.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            names,
            [
                format!("{base}/control"),
                format!("{base}/limits"),
                format!("{base}/region")
            ]
        );
        for (path, (host, opts)) in own {
            assert!(Path::new(host).is_file(), "{host} is a single file");
            let writable = opts.contains(&"rw".to_string());
            assert_eq!(writable, path.ends_with("/region"), "{path}: {opts:?}");
            assert!(opts.contains(&if writable { "rw" } else { "ro" }.to_string()));
        }
    }
    k.unprepare_v1(&[a.clone(), b.clone(), c.clone()])
        .await
        .unwrap();
    assert_eq!(
        harness::list_files(&h.opts.paths.run_dir.join("claims")),
        Vec::<String>::new()
    );
    p.stop().await;
}

/// Where the server drops consumable capacity (1.34 defaults), a whole-GPU user asks
/// the `slot.tessera.dev` class for `count: 4` with `matchAttribute` on uuid: `tessera
/// plan` gives it all four slots of gpu-1, and the budget is all four slots.
#[tokio::test]
async fn slot_fallback_gives_a_whole_gpu_claim_all_slots_of_one_gpu() {
    let h = Harness::with_config(FakeApiConfig::new(version(34))).await;
    let (p, slices) = published(&h).await;
    let k = h.kubelet().await;
    let yaml = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: all-slots, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: slot.tessera.dev, count: 4}
    constraints:
    - requests: [gpu]
      matchAttribute: gpu.tessera.dev/uuid
"#;
    let claim: ResourceClaim = serde_yaml_ng::from_str(yaml).unwrap();
    let constraint: &DeviceConstraint = &claim
        .spec
        .as_ref()
        .unwrap()
        .devices
        .as_ref()
        .unwrap()
        .constraints
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        constraint.match_attribute.as_deref(),
        Some("gpu.tessera.dev/uuid")
    );
    let (c, results) = plan_and_create(&h, &slices, claim).await;
    let mut got: Vec<&str> = results.iter().map(|r| r.device.as_str()).collect();
    got.sort();
    assert_eq!(
        got,
        [
            "gpu-1-slot-0",
            "gpu-1-slot-1",
            "gpu-1-slot-2",
            "gpu-1-slot-3"
        ]
    );
    assert_eq!(prepare(&k, &c).await.len(), 4);
    let l =
        Limits::parse(&std::fs::read_to_string(claim_file(&h, &c.uid, "limits")).unwrap()).unwrap();
    assert_eq!(l.gpus[0].memory_bytes, 4 * ((GPU1_MEMORY / 4) >> 20 << 20));
    let control =
        tessera_abi::control::parse(&std::fs::read(claim_file(&h, &c.uid, "control")).unwrap())
            .unwrap();
    assert_eq!(control[0].share, 100);
    // A fifth slot claim finds none left.
    let more: ResourceClaim = serde_yaml_ng::from_str(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: one-more, namespace: default}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {deviceClassName: slot.tessera.dev}\n",
    )
    .unwrap();
    let claim_a: ResourceClaim = serde_yaml_ng::from_str(yaml).unwrap();
    let r = schedule::run(
        &slices,
        &tessera::device_classes::read(None).unwrap(),
        &[
            Step::Allocate(Box::new(claim_a)),
            Step::Allocate(Box::new(more)),
        ],
        &h.api_gates(),
    )
    .unwrap();
    assert!(matches!(r.outcomes[1], Outcome::Failed { .. }));
    k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
    p.stop().await;

    // N must divide 100: each slot's compute share is 100/N.
    let err = tessera::config::NodeConfig::from_yaml(
        "apiVersion: config.tessera.dev/v1alpha1\nkind: NodeConfig\nsharedSlots: 3\n",
        "node.yaml",
    )
    .unwrap_err();
    assert!(err.to_string().contains("sharedSlots"), "{err}");
}

/// The node refuses what the scheduler should never have allocated: shares of one GPU
/// beyond its memory or 100 % compute, a share without `consumedCapacity`, and one
/// with a zero budget. Each fails alone, leaving nothing behind.
#[tokio::test]
async fn impossible_shares_are_refused_and_leave_nothing() {
    let h = Harness::new().await;
    let (p, _) = published(&h).await;
    let k = h.kubelet().await;
    let share = |id: &str, mem: &str, compute: &str| {
        harness::shared_result("gpu", "gpu-1", id, mem, compute)
    };
    let big = h
        .allocated_claim_with(
            "big",
            vec![share("33333333-3333-4333-8333-333333333333", "60Gi", "50")],
            &[],
        )
        .await;
    prepare(&k, &big).await;
    let cases = [
        (
            "too-much-memory",
            share("44444444-4444-4444-8444-444444444444", "20Gi", "10"),
            "over-committed: memory",
        ),
        (
            "too-much-compute",
            share("55555555-5555-4555-8555-555555555555", "1Gi", "51"),
            "over-committed: compute",
        ),
        (
            "zero-memory",
            share("66666666-6666-4666-8666-666666666666", "0", "0"),
            "outside 1..=",
        ),
        (
            "no-consumed",
            DeviceRequestAllocationResult {
                consumed_capacity: None,
                ..share("77777777-7777-4777-8777-777777777777", "1Gi", "0")
            },
            "no consumedCapacity",
        ),
    ];
    for (name, result, want) in cases {
        let c = h.allocated_claim_with(name, vec![result], &[]).await;
        let resp = k.prepare_v1(std::slice::from_ref(&c)).await.unwrap();
        let err = &resp.claims[&c.uid].error;
        assert!(err.contains(want), "{name}: {err}");
        assert!(!h.spec_path(&c.uid).exists(), "{name}: no spec");
        assert!(
            !claim_file(&h, &c.uid, "limits").exists(),
            "{name}: no files"
        );
        assert!(!h.checkpoint_claims().contains(&c.uid), "{name}");
    }
    assert_eq!(
        harness::list_files(&h.opts.paths.run_dir.join("claims")),
        std::slice::from_ref(&big.uid)
    );
    k.unprepare_v1(std::slice::from_ref(&big)).await.unwrap();
    p.stop().await;
}

/// A process still mapping the claim's region (and holding a slot lock) when the claim
/// is unprepared: the unprepare succeeds, the directory is gone, and the process keeps
/// a readable mapping.
#[tokio::test]
async fn unprepare_with_the_region_still_mapped() {
    let h = Harness::new().await;
    let (p, _) = published(&h).await;
    let k = h.kubelet().await;
    let c = h
        .allocated_claim_with(
            "mapped",
            vec![harness::shared_result(
                "gpu",
                "gpu-1",
                "88888888-8888-4888-8888-888888888888",
                "2Gi",
                "0",
            )],
            &[],
        )
        .await;
    prepare(&k, &c).await;
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .open(claim_file(&h, &c.uid, "region"))
        .unwrap();
    let region = tessera_abi::region::Region::map(&f, true).unwrap();
    let (start, len) = region.layout().slot_lock_range(0);
    assert!(tessera_abi::map::try_lock_range(&f, start, len).unwrap());
    region.occupy_slot(0, 7, 0, 1);
    region.reserve(0, 0, 1 << 20, 2 << 30).unwrap();
    let resp = k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(resp.claims[&c.uid].error, "");
    assert!(!claim_file(&h, &c.uid, "region").exists());
    assert_eq!(region.snapshot().unwrap().gpus[0].used, 1 << 20);
    p.stop().await;
}

/// Without an interception library the plugin serves whole GPUs but refuses shares:
/// an unenforced budget is never handed out.
#[tokio::test]
async fn without_the_library_shares_are_refused() {
    let mut h = Harness::new().await;
    h.opts.interception_lib = None;
    let (p, _) = published(&h).await;
    let k = h.kubelet().await;
    let c = h
        .allocated_claim_with(
            "unenforced",
            vec![harness::shared_result(
                "gpu",
                "gpu-1",
                "99999999-9999-4999-8999-999999999999",
                "2Gi",
                "0",
            )],
            &[],
        )
        .await;
    let resp = k.prepare_v1(std::slice::from_ref(&c)).await.unwrap();
    assert!(
        resp.claims[&c.uid]
            .error
            .contains("no interception library"),
        "{}",
        resp.claims[&c.uid].error
    );
    assert!(!h.spec_path(&c.uid).exists());
    let whole = h
        .allocated_claim("whole", &[("gpu", NODE, "gpu-3", None)], &[])
        .await;
    prepare(&k, &whole).await;
    assert_eq!(h.checkpoint_claims(), std::slice::from_ref(&whole.uid));
    p.stop().await;
}

/// An upgraded plugin installs its library beside the old one; the old version stays
/// while a prepared claim's spec mounts it and goes with that claim's unprepare.
#[tokio::test]
async fn library_versions_stay_while_a_claim_references_them() {
    let h = Harness::new().await;
    let c = h
        .allocated_claim_with(
            "old-lib",
            vec![harness::shared_result(
                "gpu",
                "gpu-1",
                "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa",
                "2Gi",
                "0",
            )],
            &[],
        )
        .await;
    library_version_outlives_an_upgrade(h, c).await;
}

/// A whole-GPU claim's spec mounts the library too (the soname shims at the driver's
/// sonames, the library directory), so its version stays as well: a restarted
/// container of that claim must find every file its spec mounts.
#[tokio::test]
async fn a_whole_gpu_claim_keeps_its_library_version_too() {
    let h = Harness::new().await;
    let c = h
        .allocated_claim("old-lib-whole", &[("gpu", NODE, "gpu-2", None)], &[])
        .await;
    library_version_outlives_an_upgrade(h, c).await;
}

/// Prepares `c`, restarts the plugin with a new build of the library and checks that
/// the old version stays while `c`'s spec mounts it and goes with `c`'s unprepare.
async fn library_version_outlives_an_upgrade(mut h: Harness, c: KubeletClaim) {
    let (p, _) = published(&h).await;
    let k = h.kubelet().await;
    prepare(&k, &c).await;
    p.stop().await;
    let libs = || harness::list_files(&h.opts.paths.run_dir.join("lib"));
    let old = libs();
    assert_eq!(old.len(), 1);

    // A new build of the library: same file, other bytes.
    let newer = h.dir.path().join("newer/libtessera_cuda.so");
    std::fs::create_dir_all(newer.parent().unwrap()).unwrap();
    let current = h.opts.interception_lib.clone().unwrap();
    let mut bytes = std::fs::read(&current).unwrap();
    bytes.extend_from_slice(b"v2");
    std::fs::write(&newer, bytes).unwrap();
    use tessera::prepare::library::{FRONT_FILE, HOOK_FILE, SHIM_CUDA_FILE, SHIM_NVML_FILE};
    for f in [FRONT_FILE, SHIM_CUDA_FILE, SHIM_NVML_FILE, HOOK_FILE] {
        std::fs::copy(current.with_file_name(f), newer.with_file_name(f)).unwrap();
    }
    h.opts.interception_lib = Some(newer);
    let (p, _) = published(&h).await;
    let k = h.kubelet().await;
    let both = libs();
    assert_eq!(both.len(), 2, "{both:?}");
    assert!(both.contains(&old[0]));
    let spec = std::fs::read_to_string(h.spec_path(&c.uid)).unwrap();
    assert!(
        spec.contains(&format!("lib/{}", old[0])),
        "the spec mounts the old version"
    );

    k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
    let now = libs();
    assert_eq!(now.len(), 1);
    assert_ne!(now, old, "the old version went with its last claim");
    p.stop().await;
}
