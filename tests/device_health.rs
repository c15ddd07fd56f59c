//! Device health against the fake API server: taints in the published pool pass the
//! server's validation, servers that drop taints get the unhealthy GPU left out, and a
//! large pool re-splits at 64 devices once a device is tainted.

use std::collections::BTreeMap;

use tessera::backend::mock::MockNode;
use tessera::backend::{GpuInfo, HealthEvent, HealthEventKind};
use tessera::config::{GpuMode, ManagedGpu, SliceLayout};
use tessera::devhealth::{NodeHealth, TAINT_KEY};
use tessera::fakeapi::{FakeApiConfig, FakeApiServer};
use tessera::kubever::KubeVersion;
use tessera::publish::Publisher;
use tessera::slices::{PoolParams, build_pool_with_health};

const DRIVER: &str = "gpu.tessera.dev";
const NODE: &str = "node-a";

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
