//! The publisher against the fake API server, on every supported Kubernetes version:
//! create, no-op resync with zero writes, change, external deletion, dropped gated
//! fields, and the `tessera inventory` output passing the server's validation.

use std::time::Duration;

use k8s_model::release::FeatureGates;
use k8s_model::release::KubeVersion;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, PostParams};
use tessera::config::{GpuMode, ManagedGpu, NodeConfig};
use tessera::inventory::GpuInfo;
use tessera::inventory::mock::StateAccess;
use tessera::node::{BackendPaths, BackendSpec, NodeModel, load_node};
use tessera::publish::Publisher;
use tessera::publish::slices::ServerFeatures;
use testkit::fakeapi::{FakeApiConfig, FakeApiServer};

const DRIVER: &str = "gpu.tessera.dev";
const NODE: &str = "node-a";

fn default_model() -> NodeModel {
    let dir = tempfile::tempdir().unwrap();
    let paths = BackendPaths {
        state_dir: dir.path().into(),
        ..Default::default()
    };
    load_node(
        &BackendSpec::Mock(None),
        None,
        &paths,
        StateAccess::ReadOnly,
    )
    .unwrap()
}

/// The default node with every GPU `exclusive`: a one-slice pool on every version,
/// for the tests about the publisher's bookkeeping rather than the pool's shape.
fn exclusive_model() -> NodeModel {
    let mut model = default_model();
    model
        .gpus
        .iter_mut()
        .for_each(|g| g.mode = GpuMode::Exclusive);
    model
}

fn pool(model: &NodeModel, version: KubeVersion) -> Vec<ResourceSlice> {
    model.pool(
        DRIVER,
        NODE,
        version,
        ServerFeatures::from_gates(&FeatureGates::defaults(version)),
    )
}

async fn server(version: KubeVersion) -> FakeApiServer {
    let s = FakeApiServer::start(FakeApiConfig::new(version))
        .await
        .unwrap();
    s.add_node(NODE);
    s
}

/// First sync creates the pool owned by the Node; a second sync writes nothing.
#[tokio::test]
async fn publisher_creates_then_resyncs_with_zero_writes_on_every_version() {
    for version in KubeVersion::ALL {
        let api = server(version).await;
        let model = default_model();
        let desired = pool(&model, version);
        let mut p = Publisher::new(api.client().unwrap(), DRIVER, NODE)
            .await
            .unwrap();
        assert_eq!(p.version(), version);
        // 1.36+ keep counters: gpu-0's counter set gets a slice of its own (MIG).
        let want_slices = if version.minor() >= 36 { 2 } else { 1 };
        assert_eq!(desired.len(), want_slices, "{version}");
        let r = p.sync(&desired).await.unwrap();
        assert_eq!(
            (r.created, r.updated, r.deleted, r.generation),
            (want_slices, 0, 0, 1),
            "{version}"
        );
        let stored = api.resource_slices();
        assert_eq!(stored.len(), want_slices);
        let s = &stored[0];
        let name = s.metadata.name.as_deref().unwrap();
        assert!(
            name.starts_with("00000-gpu.tessera.dev-node-a-") && name.len() == 34,
            "{name}"
        );
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", NODE));
        assert!(!owner.uid.is_empty());
        let devices: usize = stored
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .sum();
        assert_eq!(
            devices,
            // 1.34/1.35 defaults drop counters and consumable capacity: 3 whole GPUs
            // and gpu-1's 4 fallback slots.
            if version.minor() >= 36 { 29 } else { 7 },
            "{version}"
        );

        api.clear_requests();
        let r = p.sync(&desired).await.unwrap();
        assert_eq!(r.writes(), 0, "{version}");
        assert_eq!(api.write_count(), 0, "{version}: {:?}", api.requests());
    }
}

/// One changed slice is updated in place at the same generation; a change in the
/// number of slices bumps the generation and deletes the surplus slice.
#[tokio::test]
async fn publisher_updates_changed_slices_and_bumps_generation_on_reshape() {
    let version = KubeVersion::NEWEST;
    let api = server(version).await;
    let mut model = exclusive_model();
    let mut p = Publisher::new(api.client().unwrap(), DRIVER, NODE)
        .await
        .unwrap();
    p.sync(&pool(&model, version)).await.unwrap();

    // Exclude gpu-3: one slice changes in place.
    let cfg = NodeConfig::from_yaml(
        "apiVersion: config.tessera.dev/v1alpha1\nkind: NodeConfig\ngpus:\n- match: {product: NVIDIA H100 80GB HBM3}\n  mode: exclusive\nexclude:\n- minor: 3\n",
        "test",
    )
    .unwrap();
    model.gpus = cfg.resolve(&model.inventory, "test").unwrap();
    let r = p.sync(&pool(&model, version)).await.unwrap();
    assert_eq!(
        (r.created, r.updated, r.deleted, r.generation),
        (0, 1, 0, 1)
    );
    assert_eq!(
        api.resource_slices()[0]
            .spec
            .devices
            .as_ref()
            .unwrap()
            .len(),
        3
    );

    // 130 GPUs need two slices: generation 2, one updated, one created.
    let template = model.inventory.gpus[2].clone();
    let many: Vec<ManagedGpu> = (0..130)
        .map(|i| ManagedGpu {
            gpu: GpuInfo {
                minor: i,
                index: i,
                uuid: format!("GPU-{i:08x}-0000-4000-8000-000000000000"),
                ..template.clone()
            },
            mode: GpuMode::Exclusive,
        })
        .collect();
    model.gpus = many;
    let r = p.sync(&pool(&model, version)).await.unwrap();
    assert_eq!(
        (r.created, r.updated, r.deleted, r.generation),
        (1, 1, 0, 2)
    );
    let stored = api.resource_slices();
    assert_eq!(stored.len(), 2);
    assert!(
        stored
            .iter()
            .all(|s| s.spec.pool.generation == 2 && s.spec.pool.resource_slice_count == 2)
    );

    // Back to one slice: the surplus slice is deleted and the one remaining slice is
    // the only change, so the generation stays (the Go helper's rule: no new slices and
    // at most one changed slice).
    model.gpus.truncate(4);
    let r = p.sync(&pool(&model, version)).await.unwrap();
    assert_eq!(
        (r.created, r.updated, r.deleted, r.generation),
        (0, 1, 1, 2)
    );
    assert_eq!(api.resource_slices().len(), 1);
}

/// When somebody deletes our slice (the kubelet does at its start), the running
/// publisher puts it back.
#[tokio::test]
async fn publisher_republishes_after_external_deletion() {
    for version in KubeVersion::ALL {
        let api = server(version).await;
        let model = exclusive_model();
        let p = Publisher::new(api.client().unwrap(), DRIVER, NODE)
            .await
            .unwrap();
        let (_tx, rx) = tokio::sync::watch::channel(pool(&model, version));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(p.run(rx, Duration::from_millis(50), async {
            let _ = stop_rx.await;
        }));
        let first = wait_for_slices(&api, 1).await;
        let name = first[0].metadata.name.clone().unwrap();
        assert!(api.delete_resource_slice(&name));
        let again = wait_for_slices(&api, 1).await;
        assert_ne!(
            again[0].metadata.name.as_deref(),
            Some(name.as_str()),
            "{version}"
        );
        assert_eq!(again[0].spec.devices.as_ref().unwrap().len(), 4);
        let _ = stop_tx.send(());
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .unwrap()
            .unwrap();
    }
}

/// Polls the fake API server until it stores `n` slices (normally within ms of a
/// change; given up after 30 s).
async fn wait_for_slices(api: &FakeApiServer, n: usize) -> Vec<ResourceSlice> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let s = api.resource_slices();
        if s.len() == n {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "timed out waiting for {n} slices; have {:?}",
        api.resource_slices().len()
    );
}

/// A slice using consumable capacity, to see whether the server keeps the gated fields.
fn shared_slice(model: &NodeModel, version: KubeVersion) -> Vec<ResourceSlice> {
    let mut slices = pool(model, version);
    let dev = &mut slices[0].spec.devices.as_mut().unwrap()[1];
    dev.allow_multiple_allocations = Some(true);
    let mut cap = dev.capacity.clone().unwrap();
    let mem = cap.get_mut("memory").unwrap();
    mem.value = Quantity("85520809984".into());
    mem.request_policy = Some(CapacityRequestPolicy {
        default: Some(Quantity("85520809984".into())),
        valid_range: Some(CapacityRequestPolicyRange {
            min: Quantity("1048576".into()),
            max: None,
            step: Some(Quantity("1048576".into())),
        }),
        valid_values: None,
    });
    dev.capacity = Some(cap);
    slices
}

/// The dry-run probe reports exactly the fields a server with the gate off drops.
#[tokio::test]
async fn publisher_detects_dropped_gated_fields() {
    let model = exclusive_model();
    for version in KubeVersion::ALL {
        let api = server(version).await;
        let p = Publisher::new(api.client().unwrap(), DRIVER, NODE)
            .await
            .unwrap();
        api.clear_requests();
        let dropped = p
            .detect_dropped_fields(&shared_slice(&model, version))
            .await
            .unwrap();
        let gate_on = version.minor() >= 36;
        if gate_on {
            assert!(dropped.is_empty(), "{version}: {dropped:?}");
        } else {
            let text = dropped.join(" ");
            assert!(
                text.contains("allowMultipleAllocations"),
                "{version}: {dropped:?}"
            );
            assert!(text.contains("requestPolicy"), "{version}: {dropped:?}");
        }
        assert_eq!(api.write_count(), 0, "dry runs store nothing");
        assert!(api.resource_slices().is_empty());
    }
}

/// `tessera inventory` for the default node is accepted by the fake server's
/// validation for every version (the CLI output, created verbatim).
#[tokio::test]
async fn inventory_output_passes_server_validation_on_every_version() {
    for version in KubeVersion::ALL {
        let state = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args([
                "inventory",
                "--backend",
                "mock",
                "--node-name",
                NODE,
                "-o",
                "json",
            ])
            .args(["--k8s-version", &version.to_string()])
            .arg("--state-dir")
            .arg(state.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(list["kind"], "List");
        let items = list["items"].as_array().unwrap();
        assert!(!items.is_empty());
        let api = server(version).await;
        let slices: Api<ResourceSlice> = Api::all(api.client().unwrap());
        for item in items {
            let s: ResourceSlice = serde_json::from_value(item.clone()).unwrap();
            let created = slices.create(&PostParams::default(), &s).await;
            assert!(created.is_ok(), "{version}: {created:?}");
        }
        assert!(
            std::fs::read_dir(state.path()).unwrap().next().is_none(),
            "inventory writes no state"
        );
    }
}

/// An invalid pool is refused before any write, with the reason.
#[tokio::test]
async fn publisher_refuses_an_invalid_pool_without_writing() {
    let api = server(KubeVersion::NEWEST).await;
    let model = exclusive_model();
    let mut desired = pool(&model, KubeVersion::NEWEST);
    let devs = desired[0].spec.devices.as_mut().unwrap();
    let mut attrs = devs[0].attributes.clone().unwrap_or_default();
    attrs.insert(
        "productName".into(),
        k8s_openapi::api::resource::v1::DeviceAttribute {
            string: Some("x".repeat(65)),
            ..Default::default()
        },
    );
    devs[0].attributes = Some(attrs);
    let mut p = Publisher::new(api.client().unwrap(), DRIVER, NODE)
        .await
        .unwrap();
    api.clear_requests();
    let err = p.sync(&desired).await.unwrap_err().to_string();
    assert!(err.contains("productName"), "{err}");
    assert_eq!(api.write_count(), 0);
}

/// A plugin's whole start-up from scratch, as `tessera plugin` makes it, costs exactly
/// these requests: at 1,000 nodes starting at once every extra one is a thousand.
/// The dropped-field check dry-runs one slice per gate the pool uses, the first sync
/// works from the watch's own list, and our writes coming back through the watch cause
/// no further LIST.
#[tokio::test]
async fn publishing_from_scratch_costs_these_calls() {
    let version = KubeVersion::NEWEST;
    let api = server(version).await;
    let p = Publisher::new(api.client().unwrap(), DRIVER, NODE)
        .await
        .unwrap();
    let features = p.probe_features().await.unwrap();
    let model = default_model();
    let desired = model.pool(DRIVER, NODE, version, features);
    assert_eq!(
        desired.len(),
        2,
        "a MIG-mode GPU's counters have a slice of their own"
    );
    let uuids: Vec<String> = model
        .inventory
        .gpus
        .iter()
        .map(|g| g.uuid.clone())
        .collect();
    assert!(p.conflicts(&uuids).await.unwrap().is_empty());
    let (_tx, rx) = tokio::sync::watch::channel(desired);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(p.run(rx, Duration::from_millis(20), async {
        let _ = stop_rx.await;
    }));
    wait_for_slices(&api, 2).await;
    // Long enough for the echoes of both creates to come back and, were they taken for
    // somebody else's change, for the resync they would cause (20 ms debounce).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap();
    let mut calls = std::collections::BTreeMap::<String, usize>::new();
    for r in api.requests() {
        let what = match (&r.name, r.dry_run) {
            _ if r.path == "/version" => "get /version".to_string(),
            (_, true) => format!("{} {} (dry run)", r.verb, r.resource),
            (Some(_), _) if r.verb == "get" => format!("get {}/<name>", r.resource),
            _ => format!("{} {}", r.verb, r.resource),
        };
        *calls.entry(what).or_default() += 1;
    }
    let want: std::collections::BTreeMap<String, usize> = [
        ("get /version", 1),
        ("get nodes/<name>", 1),
        // Two feature probes, then one slice per gate the pool uses (here one gate,
        // DRAPartitionableDevices, in both slices).
        ("create resourceslices (dry run)", 3),
        // The conflict check (every driver on the node), and the watch's list.
        ("list resourceslices", 2),
        ("watch resourceslices", 1),
        ("create resourceslices", 2),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(calls, want, "{:#?}", api.requests());
    // Both LISTs come from the API server's watch cache: a consistent read it cannot
    // serve in time goes to etcd, which reads every node's slices to filter ours.
    for r in api
        .requests()
        .iter()
        .filter(|r| r.verb == "list" && r.resource == "resourceslices")
    {
        assert!(
            r.query.contains("resourceVersion=0"),
            "an uncached LIST: {r:?}"
        );
    }
}
