//! Device health against the fake API server: taints in the published pool pass the
//! server's validation, servers that drop taints get the unhealthy GPU left out, and a
//! large pool re-splits at 64 devices once a device is tainted. And the running
//! plugin: an XID or a device loss injected into the simulated node reaches the
//! republished slice and the DRA health stream over the real socket; recovery too.

#[path = "support/harness.rs"]
mod harness;

use std::collections::BTreeMap;

use tessera::backend::mock::MockNode;
use tessera::backend::{GpuInfo, HealthEvent, HealthEventKind};
use tessera::config::{GpuMode, ManagedGpu, SliceLayout};
use tessera::devhealth::{NodeHealth, TAINT_KEY};
use tessera::fakeapi::{FakeApiConfig, FakeApiServer};
use tessera::kubever::KubeVersion;
use tessera::publish::Publisher;
use tessera::slices::{PoolParams, build_pool_with_health};

use harness::{DRIVER, Harness, NODE};
use tessera::backend::mock::{inject_clear, inject_lost, inject_xid};
use tessera::kubelet;
use tessera::proto::health_v1alpha1 as pb;

fn health(events: &[(u32, HealthEventKind)]) -> NodeHealth {
    let mut h = NodeHealth::default();
    for (i, (minor, kind)) in events.iter().enumerate() {
        h.apply(
            &HealthEvent {
                seq: i as u64 + 1,
                minor: *minor,
                kind: *kind,
            },
            1_800_000_000,
        );
    }
    h
}

/// `n` exclusive T4s, minors 0..n.
fn exclusive_node(n: u32) -> (tessera::backend::NodeInventory, Vec<ManagedGpu>) {
    let mut inv = MockNode::embedded_default().unwrap().inventory();
    let template = inv.gpus[2].clone();
    inv.gpus = (0..n)
        .map(|i| GpuInfo {
            minor: i,
            index: i,
            uuid: format!("GPU-{i:08x}-0000-4000-8000-000000000000"),
            ..template.clone()
        })
        .collect();
    let gpus = inv
        .gpus
        .iter()
        .map(|g| ManagedGpu {
            gpu: g.clone(),
            mode: GpuMode::Exclusive,
        })
        .collect();
    (inv, gpus)
}

async fn server(version: KubeVersion) -> FakeApiServer {
    let s = FakeApiServer::start(FakeApiConfig::new(version))
        .await
        .unwrap();
    s.add_node(NODE);
    s
}

/// A node of 130 GPUs publishes 128 + 2 devices on 1.37; once gpu-5 is tainted the
/// pool is republished as 64 + 64 + 2, every slice passes the server's validation and
/// the stored taint is the one Tessera wrote.
#[tokio::test]
async fn a_taint_resplits_a_large_pool_and_passes_validation() {
    let version = KubeVersion::NEWEST;
    let api = server(version).await;
    let mut p = Publisher::new(api.client().unwrap(), DRIVER, NODE)
        .await
        .unwrap();
    let features = p.probe_features().await.unwrap();
    assert!(features.device_taints);
    let (inv, gpus) = exclusive_node(130);
    let params = PoolParams {
        driver: DRIVER,
        node_name: NODE,
        version,
        features,
        layout: SliceLayout::Auto,
        shared_slots: 4,
    };
    let sizes = |api: &FakeApiServer| {
        let mut s: Vec<_> = api
            .resource_slices()
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .collect();
        s.sort();
        s
    };
    let healthy = build_pool_with_health(&params, &inv, &gpus, &BTreeMap::new(), &health(&[]));
    p.prevalidate(&healthy).unwrap();
    p.sync(&healthy).await.unwrap();
    assert_eq!(sizes(&api), [2, 128]);

    let sick = health(&[(5, HealthEventKind::Xid(79))]);
    let tainted = build_pool_with_health(&params, &inv, &gpus, &BTreeMap::new(), &sick);
    p.prevalidate(&tainted).unwrap();
    let r = p.sync(&tainted).await.unwrap();
    assert_eq!(r.generation, 2, "a reshape bumps the generation");
    assert_eq!(sizes(&api), [2, 64, 64]);
    let stored = api.resource_slices();
    let taints: Vec<_> = stored
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter_map(|d| d.taints.as_ref().map(|t| (d.name.clone(), t.clone())))
        .collect();
    assert_eq!(taints.len(), 1);
    let (name, t) = &taints[0];
    assert_eq!(name, "gpu-5");
    assert_eq!(
        (
            t[0].key.as_str(),
            t[0].value.as_deref(),
            t[0].effect.as_str()
        ),
        (TAINT_KEY, Some("xid-79"), "NoExecute")
    );
    assert!(
        api.resource_slices()
            .iter()
            .all(|s| s.spec.pool.generation == 2)
    );
    // Unchanged health: nothing to write.
    api.clear_requests();
    assert_eq!(p.sync(&tainted).await.unwrap().writes(), 0);
}

/// 1.35 defaults drop taints (DRADeviceTaints off): the probe says so, and the
/// unhealthy GPU is left out of the published pool instead.
#[tokio::test]
async fn without_taints_the_unhealthy_gpu_is_left_out() {
    let version = KubeVersion::new(35).unwrap();
    let api = server(version).await;
    let mut p = Publisher::new(api.client().unwrap(), DRIVER, NODE)
        .await
        .unwrap();
    let features = p.probe_features().await.unwrap();
    assert!(!features.device_taints);
    let (inv, gpus) = exclusive_node(4);
    let params = PoolParams {
        driver: DRIVER,
        node_name: NODE,
        version,
        features,
        layout: SliceLayout::Auto,
        shared_slots: 4,
    };
    let sick = health(&[(2, HealthEventKind::Lost)]);
    let pool = build_pool_with_health(&params, &inv, &gpus, &BTreeMap::new(), &sick);
    p.prevalidate(&pool).unwrap();
    p.sync(&pool).await.unwrap();
    let names: Vec<String> = api
        .resource_slices()
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| d.name.clone())
        .collect();
    assert_eq!(names, ["gpu-0", "gpu-1", "gpu-3"]);
    // Had Tessera sent the taint, the server would have dropped it: the dry run agrees.
    let with_taint_params = PoolParams {
        features: tessera::slices::ServerFeatures {
            device_taints: true,
            ..features
        },
        ..params
    };
    let tainted = build_pool_with_health(&with_taint_params, &inv, &gpus, &BTreeMap::new(), &sick);
    let dropped = p.detect_dropped_fields(&tainted).await.unwrap();
    assert_eq!(dropped, ["spec.devices[2].taints"]);
}

/// The taints of every stored device named `name`.
fn stored_taints(api: &FakeApiServer, name: &str) -> Option<Option<Vec<(String, String)>>> {
    api.resource_slices()
        .iter()
        .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        .find(|d| d.name == name)
        .map(|d| {
            d.taints.map(|t| {
                t.into_iter()
                    .map(|t| (t.value.unwrap_or_default(), t.effect))
                    .collect()
            })
        })
}

/// Reads stream messages until one satisfies `ok` (each is the complete list).
async fn next_until(
    stream: &mut tonic::Streaming<pb::NodeWatchResourcesResponse>,
    what: &str,
    ok: impl Fn(&[pb::DeviceHealth]) -> bool,
) -> Vec<pb::DeviceHealth> {
    let deadline = std::time::Duration::from_secs(20);
    tokio::time::timeout(deadline, async {
        loop {
            let m = stream.message().await.unwrap().expect("stream open");
            if ok(&m.devices) {
                return m.devices;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn status_of(devices: &[pb::DeviceHealth], name: &str) -> (pb::HealthStatus, String) {
    let d = devices
        .iter()
        .find(|d| d.device.as_ref().unwrap().device_name == name)
        .unwrap_or_else(|| panic!("{name} not in the health list"));
    (d.health(), d.message.clone())
}

/// On 1.37: the health service is advertised after the DRA versions; the stream lists
/// every device of the pool; an XID on gpu-2 taints gpu-2 (NoExecute for 79) in the
/// republished slice and turns it Unhealthy in the stream; an application XID changes
/// nothing; a loss of the shared gpu-1 taints it; clearing both brings everything back.
#[tokio::test]
async fn injected_xid_and_loss_reach_the_slice_and_the_health_stream() {
    let h = Harness::new().await;
    let plugin = h.start_plugin().await;
    let (info, _) = kubelet::register(&h.registration_socket(), &["v1.DRAPlugin"])
        .await
        .unwrap();
    assert_eq!(
        info.supported_versions.last().map(String::as_str),
        Some(kubelet::HEALTH_SERVICE)
    );
    let mut stream = kubelet::watch_health(std::path::Path::new(&info.endpoint))
        .await
        .unwrap();
    let first = stream.message().await.unwrap().unwrap().devices;
    // gpu-0 whole + 25 partitions, gpu-1 shared, gpu-2, gpu-3.
    assert_eq!(first.len(), 29);
    assert!(
        first
            .iter()
            .all(|d| d.health() == pb::HealthStatus::Healthy)
    );
    assert!(
        first
            .iter()
            .all(|d| d.device.as_ref().unwrap().pool_name == NODE)
    );
    assert!(first.iter().all(|d| d.health_check_timeout_seconds > 0));
    harness::wait_until("slices published", || {
        stored_taints(&h.api, "gpu-2").is_some()
    })
    .await;
    assert_eq!(stored_taints(&h.api, "gpu-2"), Some(None));

    let state = &h.opts.paths.state_dir;
    inject_xid(state, 2, 13).unwrap();
    inject_xid(state, 2, 79).unwrap();
    let list = next_until(&mut stream, "gpu-2 unhealthy", |d| {
        status_of(d, "gpu-2").0 == pb::HealthStatus::Unhealthy
    })
    .await;
    let (_, msg) = status_of(&list, "gpu-2");
    assert!(msg.contains("XID 79") && msg.contains("NoExecute"), "{msg}");
    assert_eq!(status_of(&list, "gpu-3").0, pb::HealthStatus::Healthy);
    harness::wait_until("gpu-2 tainted", || {
        stored_taints(&h.api, "gpu-2") == Some(Some(vec![("xid-79".into(), "NoExecute".into())]))
    })
    .await;
    assert_eq!(stored_taints(&h.api, "gpu-3"), Some(None));

    inject_lost(state, 1).unwrap();
    let list = next_until(&mut stream, "gpu-1 unhealthy", |d| {
        status_of(d, "gpu-1").0 == pb::HealthStatus::Unhealthy
    })
    .await;
    assert!(status_of(&list, "gpu-1").1.contains("lost"));
    harness::wait_until("gpu-1 tainted", || {
        stored_taints(&h.api, "gpu-1") == Some(Some(vec![("gpu-lost".into(), "NoExecute".into())]))
    })
    .await;

    inject_clear(state, 2).unwrap();
    inject_clear(state, 1).unwrap();
    next_until(&mut stream, "all healthy", |d| {
        d.iter().all(|d| d.health() == pb::HealthStatus::Healthy)
    })
    .await;
    harness::wait_until("taints cleared", || {
        stored_taints(&h.api, "gpu-1") == Some(None) && stored_taints(&h.api, "gpu-2") == Some(None)
    })
    .await;
    drop(stream);
    plugin.stop().await;
}

/// On 1.35 defaults the server drops taints: a lost GPU disappears from the slice (the
/// stream still lists it, Unhealthy), and comes back when it recovers.
#[tokio::test]
async fn without_taints_a_lost_gpu_leaves_the_slice_until_it_recovers() {
    let h = Harness::with_config(FakeApiConfig::new(KubeVersion::new(35).unwrap())).await;
    let plugin = h.start_plugin().await;
    let (info, _) = kubelet::register(&h.registration_socket(), &["v1.DRAPlugin"])
        .await
        .unwrap();
    let mut stream = kubelet::watch_health(std::path::Path::new(&info.endpoint))
        .await
        .unwrap();
    harness::wait_until("slices published", || {
        stored_taints(&h.api, "gpu-3").is_some()
    })
    .await;
    inject_lost(&h.opts.paths.state_dir, 3).unwrap();
    let list = next_until(&mut stream, "gpu-3 unhealthy", |d| {
        status_of(d, "gpu-3").0 == pb::HealthStatus::Unhealthy
    })
    .await;
    assert!(status_of(&list, "gpu-3").1.contains("left out"));
    harness::wait_until("gpu-3 left out", || {
        stored_taints(&h.api, "gpu-3").is_none()
    })
    .await;
    assert_eq!(stored_taints(&h.api, "gpu-2"), Some(None));
    inject_clear(&h.opts.paths.state_dir, 3).unwrap();
    harness::wait_until("gpu-3 back", || {
        stored_taints(&h.api, "gpu-3") == Some(None)
    })
    .await;
    // The plugin stops with the kubelet's stream still open; the stream then ends.
    plugin.stop().await;
    let end = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while let Ok(Some(_)) = stream.message().await {}
    })
    .await;
    assert!(end.is_ok(), "the health stream outlived the plugin");
}
