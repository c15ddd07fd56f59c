//! MIG partitions in ResourceSlices for a 16× H100 node: the split layout is accepted
//! on 1.35–1.37 and the combined layout on 1.34 by the fake API server (each slice over
//! HTTP), and each is refused on the other versions with its field path. Plus the
//! dropped-counters fallback.

use std::collections::BTreeMap;

use k8s_model::release::{FeatureGates, KubeVersion};
use k8s_model::validation::validate_pool_for;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, PostParams};
use tessera::config::{NodeConfig, SliceLayout};
use tessera::inventory::mock::{MockBackend, MockNode, StateAccess};
use tessera::inventory::{GpuBackend, MigStatus};
use tessera::publish::slices::{PoolParams, ServerFeatures, build_pool};
use testkit::fakeapi::{FakeApiConfig, FakeApiServer};

const DRIVER: &str = "gpu.tessera.dev";

fn h100_node(n: u32) -> MockNode {
    let mut yaml = String::from(
        "apiVersion: mock.tessera.dev/v1alpha1\nkind: MockNode\ndriverVersion: \"580.65.06\"\ncudaDriverVersion: \"13.0\"\ncharDevices: {nvidia: 195, nvidia-uvm: 508, nvidia-caps: 511}\ngpus:\n",
    );
    for i in 0..n {
        yaml.push_str(&format!(
            "- minor: {i}\n  uuid: GPU-{i:08x}-0000-4000-8000-000000000000\n  productName: NVIDIA H100 80GB HBM3\n  brand: Nvidia\n  architecture: Hopper\n  memoryBytes: 85520809984\n  multiprocessors: 132\n  cudaComputeCapability: \"9.0\"\n  pciBusID: \"0000:{:02x}:00.0\"\n  pcieRoot: pci0000:00\n  numaNode: 0\n  migCapable: true\n",
            0x10 + i
        ));
    }
    MockNode::parse(&yaml, "16x-h100").unwrap()
}

fn pool(
    node: &MockNode,
    version: KubeVersion,
    layout: SliceLayout,
    mig: &BTreeMap<u32, MigStatus>,
    partitionable: bool,
) -> Vec<ResourceSlice> {
    let inv = node.inventory();
    let gpus = NodeConfig::default().resolve(&inv, "default").unwrap();
    build_pool(
        &PoolParams {
            driver: DRIVER,
            node_name: "big-node",
            version,
            features: ServerFeatures {
                partitionable,
                consumable_capacity: true,
                device_taints: false,
            },
            layout,
            shared_slots: 4,
        },
        &inv,
        &gpus,
        mig,
    )
}

/// Gates with partitionable devices on (off by default on 1.34 and 1.35).
fn gates(v: KubeVersion) -> FeatureGates {
    FeatureGates::parse(v, "DRAPartitionableDevices=true").unwrap()
}

/// Creates every slice over HTTP; returns the first refusal (field paths) if any.
async fn create_all(v: KubeVersion, slices: &[ResourceSlice]) -> Result<(), Vec<String>> {
    let api = FakeApiServer::start(FakeApiConfig { gates: gates(v) })
        .await
        .unwrap();
    let slices_api: Api<ResourceSlice> = Api::all(api.client().unwrap());
    for s in slices {
        match slices_api.create(&PostParams::default(), s).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) => {
                return Err(status
                    .details
                    .map(|d| d.causes.into_iter().map(|c| c.field).collect())
                    .unwrap_or_default());
            }
            Err(e) => panic!("{e}"),
        }
    }
    Ok(())
}

/// The split layout for 16 H100s: 2 counter slices (8 sets each) and device slices of
/// at most 64, accepted on 1.35–1.37 and by the cross-slice checks; refused on 1.34,
/// whose limit is 32 counters per slice and whose devices must find their counter set
/// in their own slice.
#[tokio::test]
async fn split_layout_for_16_h100_passes_on_1_35_and_later() {
    let node = h100_node(16);
    let slices = pool(
        &node,
        KubeVersion::NEWEST,
        SliceLayout::Split,
        &BTreeMap::new(),
        true,
    );
    let counter_slices = slices
        .iter()
        .filter(|s| s.spec.shared_counters.is_some())
        .count();
    assert_eq!(counter_slices, 2);
    let devices: usize = slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    assert_eq!(devices, 16 * 26, "whole GPU + 25 partitions per H100");
    assert!(
        slices
            .iter()
            .all(|s| s.spec.devices.as_ref().is_none_or(|d| d.len() <= 64))
    );
    let refs: Vec<&ResourceSlice> = slices.iter().collect();
    for minor in [35, 36, 37] {
        let v = KubeVersion::new(minor).unwrap();
        assert_eq!(validate_pool_for(&refs, v), vec![], "1.{minor}");
        assert_eq!(create_all(v, &slices).await, Ok(()), "1.{minor}");
    }
    let v134 = KubeVersion::new(34).unwrap();
    assert!(
        !validate_pool_for(&refs, v134).is_empty(),
        "the 1.34 allocator refuses the split pool"
    );
    // The first slice holds 8 counter sets (120 counters): 1.34 allows 32 in total.
    let err = create_all(v134, &slices).await.unwrap_err();
    assert_eq!(err, ["spec.sharedCounters"]);
}

/// The combined layout keeps each H100's counter set with its devices, two GPUs
/// (30 counters) per slice: accepted on 1.34, refused from 1.35 with the field path
/// `spec` ("only one of sharedCounters or devices").
#[tokio::test]
async fn combined_layout_for_16_h100_passes_on_1_34_only() {
    let node = h100_node(16);
    let v134 = KubeVersion::new(34).unwrap();
    let slices = pool(&node, v134, SliceLayout::Combined, &BTreeMap::new(), true);
    assert_eq!(slices.len(), 8);
    for s in &slices {
        let counters: usize = s
            .spec
            .shared_counters
            .iter()
            .flatten()
            .map(|c| c.counters.len())
            .sum();
        assert!(counters <= 32, "{counters}");
    }
    let refs: Vec<&ResourceSlice> = slices.iter().collect();
    assert_eq!(validate_pool_for(&refs, v134), vec![]);
    assert_eq!(create_all(v134, &slices).await, Ok(()));
    for minor in [35, 36, 37] {
        let err = create_all(KubeVersion::new(minor).unwrap(), &slices)
            .await
            .unwrap_err();
        assert_eq!(err, ["spec"], "1.{minor}");
    }
}

/// `auto` picks the layout from the version.
#[test]
fn auto_layout_follows_the_version() {
    let node = h100_node(2);
    let auto_134 = pool(
        &node,
        KubeVersion::new(34).unwrap(),
        SliceLayout::Auto,
        &BTreeMap::new(),
        true,
    );
    assert!(auto_134.iter().all(|s| s.spec.devices.is_some()));
    let auto_137 = pool(
        &node,
        KubeVersion::NEWEST,
        SliceLayout::Auto,
        &BTreeMap::new(),
        true,
    );
    assert!(auto_137[0].spec.devices.is_none() && auto_137[0].spec.shared_counters.is_some());
}

/// When the server drops counters, a GPU with live MIG devices publishes exactly those
/// as static devices (no counters) and a GPU without them publishes the whole GPU.
#[test]
fn dropped_counters_fall_back_to_static_devices() {
    let dir = tempfile::tempdir().unwrap();
    let backend = MockBackend::new(h100_node(2), dir.path().into(), StateAccess::ReadWrite);
    backend.set_mig_mode(1, true).unwrap();
    backend.create_mig(1, 9, 4).unwrap();
    backend.create_mig(1, 19, 0).unwrap();
    let mig: BTreeMap<u32, MigStatus> = (0..2)
        .map(|m| (m, backend.mig_status(m).unwrap()))
        .collect();
    let slices = pool(
        &h100_node(2),
        KubeVersion::new(34).unwrap(),
        SliceLayout::Auto,
        &mig,
        false,
    );
    assert_eq!(slices.len(), 1);
    assert!(slices[0].spec.shared_counters.is_none());
    let names: Vec<&str> = slices[0]
        .spec
        .devices
        .iter()
        .flatten()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(
        names,
        ["gpu-0", "gpu-1-mig-3g40gb-9-4", "gpu-1-mig-1g10gb-19-0"]
    );
    assert!(
        slices[0]
            .spec
            .devices
            .iter()
            .flatten()
            .all(|d| d.consumes_counters.is_none())
    );
}

fn mig_claim(
    name: &str,
    class: &str,
    selector: &str,
) -> k8s_openapi::api::resource::v1::ResourceClaim {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {
            "deviceClassName": class,
            "selectors": [{"cel": {"expression": selector}}]
        }}]}}
    }))
    .unwrap()
}

fn default_allocator() -> k8s_model::allocator::Allocator {
    let root = tempfile::tempdir().unwrap();
    let model = tessera::node::load_node(
        &tessera::node::BackendSpec::Mock(None),
        None,
        &tessera::node::BackendPaths {
            state_dir: root.path().into(),
            ..Default::default()
        },
        StateAccess::ReadOnly,
    )
    .unwrap();
    let v = KubeVersion::NEWEST;
    let slices = model.pool(
        DRIVER,
        "node-a",
        v,
        ServerFeatures::from_gates(&FeatureGates::defaults(v)),
    );
    k8s_model::allocator::Allocator::new(
        &slices,
        &tessera::device_classes::read(None).unwrap(),
        &FeatureGates::defaults(v),
    )
    .unwrap()
}

fn got(r: &k8s_openapi::api::resource::v1::AllocationResult) -> String {
    r.devices.as_ref().unwrap().results.as_ref().unwrap()[0]
        .device
        .clone()
}

/// Seven 1g.10gb fit on the default node's H100 (gpu-0), packed from its end; an eighth
/// does not fit (the other H100 is in shared mode).
#[test]
fn seven_1g10gb_pack_one_h100() {
    let mut a = default_allocator();
    let sel = r#"device.attributes["gpu.tessera.dev"].profile == "1g.10gb""#;
    let starts: Vec<String> = (0..7)
        .map(|i| {
            got(&a
                .allocate(&mig_claim(&format!("m{i}"), "mig.tessera.dev", sel))
                .unwrap())
        })
        .collect();
    assert_eq!(
        starts,
        (0..7)
            .rev()
            .map(|s| format!("gpu-0-mig-1g10gb-19-{s}"))
            .collect::<Vec<_>>()
    );
    assert!(
        a.allocate(&mig_claim("m7", "mig.tessera.dev", sel))
            .is_err()
    );
}

/// MIG partitions and the whole GPU exclude each other through counters.
#[test]
fn mig_and_whole_gpu_exclude_each_other() {
    let h100 = r#"device.attributes["gpu.tessera.dev"].productName.startsWith("NVIDIA H100")"#;
    let any_mig = r#"device.attributes["gpu.tessera.dev"].profile == "1g.10gb""#;
    let mut a = default_allocator();
    // The whole gpu-0 first: then no partition of it is available.
    assert_eq!(
        got(&a
            .allocate(&mig_claim("whole", "gpu.tessera.dev", h100))
            .unwrap()),
        "gpu-0"
    );
    assert!(
        a.allocate(&mig_claim("part", "mig.tessera.dev", any_mig))
            .is_err()
    );
    a.release("default", "whole");
    // A partition first: no whole H100 is left (gpu-1 is shared, not a `gpu`).
    assert_eq!(
        got(&a
            .allocate(&mig_claim("part", "mig.tessera.dev", any_mig))
            .unwrap()),
        "gpu-0-mig-1g10gb-19-6"
    );
    assert!(
        a.allocate(&mig_claim("whole", "gpu.tessera.dev", h100))
            .is_err()
    );
}
