//! Device health against the fake API server: taints in the published pool pass the
//! server's validation, servers that drop taints get the unhealthy GPU left out, and a
//! large pool re-splits at 64 devices once a device is tainted. And the running
//! plugin: an XID or a device loss injected into the simulated node reaches the
//! republished slice and the DRA health stream over the real socket; recovery too.

use testkit::harness;

use std::collections::BTreeMap;

use k8s_model::release::KubeVersion;
use tessera::config::{GpuMode, ManagedGpu, SliceLayout};
use tessera::device_health::policy::{NodeHealth, TAINT_KEY};
use tessera::inventory::mock::MockNode;
use tessera::inventory::{GpuInfo, HealthEvent, HealthEventKind};
use tessera::publish::Publisher;
use tessera::publish::slices::{PoolParams, build_pool_with_health};
use testkit::fakeapi::{FakeApiConfig, FakeApiServer};

use harness::{DRIVER, Harness, NODE};
use tessera::device_health::policy::Quiet;
use tessera::inventory::mock::{inject_clear, inject_lost, inject_mig_xid, inject_xid};
use tessera::kubelet::proto::health_v1alpha1 as pb;
use testkit::kubelet_standin;

fn health(events: &[(u32, HealthEventKind)]) -> NodeHealth {
    let mut h = NodeHealth::default();
    for (i, (minor, kind)) in events.iter().enumerate() {
        h.apply(
            &HealthEvent {
                seq: i as u64 + 1,
                minor: *minor,
                gi_id: None,
                kind: *kind,
            },
            tessera::device_health::policy::At::now(),
        );
    }
    h
}

/// `n` exclusive T4s, minors 0..n.
fn exclusive_node(n: u32) -> (tessera::inventory::NodeInventory, Vec<ManagedGpu>) {
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
        features: tessera::publish::slices::ServerFeatures {
            device_taints: true,
            ..features
        },
        ..params
    };
    let tainted = build_pool_with_health(&with_taint_params, &inv, &gpus, &BTreeMap::new(), &sick);
    let dropped = p.detect_dropped_fields(&tainted).await.unwrap();
    assert_eq!(dropped, ["slice 0: spec.devices[2].taints"]);
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
/// nothing; a loss of the shared gpu-1 taints it, and it recovers when it answers
/// again. The fatal XID stays through a `clear` of a GPU that was never lost (NVML
/// shows no sign of health returning) and goes with a reset: gpu-2 lost, then back.
#[tokio::test]
async fn injected_xid_and_loss_reach_the_slice_and_the_health_stream() {
    let h = Harness::new().await;
    let plugin = h.start_plugin().await;
    let (info, _) = kubelet_standin::register(&h.registration_socket(), &["v1.DRAPlugin"])
        .await
        .unwrap();
    assert_eq!(
        info.supported_versions.last().map(String::as_str),
        Some(kubelet_standin::HEALTH_SERVICE)
    );
    let mut stream = kubelet_standin::watch_health(std::path::Path::new(&info.endpoint))
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
    let list = next_until(&mut stream, "gpu-1 healthy", |d| {
        status_of(d, "gpu-1").0 == pb::HealthStatus::Healthy
    })
    .await;
    assert_eq!(
        status_of(&list, "gpu-2").0,
        pb::HealthStatus::Unhealthy,
        "a clear without a loss is no recovery"
    );
    assert_eq!(
        stored_taints(&h.api, "gpu-2"),
        Some(Some(vec![("xid-79".into(), "NoExecute".into())]))
    );
    // The mock replays its log, so the loss is seen even if no poll falls between the
    // two (NVML needs one: tests/plugin/nvml_backend.rs).
    inject_lost(state, 2).unwrap();
    inject_clear(state, 2).unwrap();
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
    let (info, _) = kubelet_standin::register(&h.registration_socket(), &["v1.DRAPlugin"])
        .await
        .unwrap();
    let mut stream = kubelet_standin::watch_health(std::path::Path::new(&info.endpoint))
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

/// A NoSchedule XID (63) clears once gpu-3 was quiet for `xidClearAfter` (2 s here),
/// not before: every read of the stored slice made before the period ended finds the
/// taint; then it leaves the stored slice and the stream turns the device Healthy,
/// while a fatal XID on gpu-2 injected at the same time stays. Runs on the real clock
/// (the plugin's), so the test asserts only order: the period starts at the plugin's
/// first poll after the injection, so any read completed before `injected + 2 s` must
/// find the taint, and the device cannot turn Healthy before then; how long after the
/// period the clear came is printed, not judged (a loaded machine delays polls).
#[tokio::test]
async fn a_noschedule_xid_clears_after_the_quiet_period() {
    const QUIET: std::time::Duration = std::time::Duration::from_secs(2);
    let mut h = Harness::new().await;
    h.model.config.health.xid_clear_after = Some(Quiet::After(QUIET.as_secs()));
    let plugin = h.start_plugin().await;
    let (info, _) = kubelet_standin::register(&h.registration_socket(), &["v1.DRAPlugin"])
        .await
        .unwrap();
    let mut stream = kubelet_standin::watch_health(std::path::Path::new(&info.endpoint))
        .await
        .unwrap();
    harness::wait_until("slices published", || {
        stored_taints(&h.api, "gpu-3").is_some()
    })
    .await;
    let state = &h.opts.paths.state_dir;
    // The plugin applies the XID at a poll after this, so its period ends after
    // `injected + QUIET`.
    let injected = std::time::Instant::now();
    inject_xid(state, 3, 63).unwrap();
    inject_xid(state, 2, 79).unwrap();
    let tainted = || {
        stored_taints(&h.api, "gpu-3") == Some(Some(vec![("xid-63".into(), "NoSchedule".into())]))
    };
    harness::wait_until("gpu-3 tainted", tainted).await;
    next_until(&mut stream, "gpu-3 unhealthy", |d| {
        status_of(d, "gpu-3").0 == pb::HealthStatus::Unhealthy
    })
    .await;
    // Reads of the stored taint until the period ends: each one that completed before
    // then must find it (a read completing later may find it either way).
    let (mut reads, mut last_read) = (0, std::time::Duration::ZERO);
    loop {
        let still = tainted();
        let at = injected.elapsed();
        if at >= QUIET {
            break;
        }
        assert!(
            still,
            "cleared {at:?} after the injection, before its quiet period ({QUIET:?}) ended"
        );
        (reads, last_read) = (reads + 1, at);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let list = next_until(&mut stream, "gpu-3 healthy again", |d| {
        status_of(d, "gpu-3").0 == pb::HealthStatus::Healthy
    })
    .await;
    let took = injected.elapsed();
    println!(
        "gpu-3 still tainted at {reads} reads up to {last_read:?} after the injection; \
         Healthy in the stream {took:?} after it (quiet period {QUIET:?})"
    );
    assert!(took >= QUIET, "cleared after {took:?}");
    assert_eq!(status_of(&list, "gpu-2").0, pb::HealthStatus::Unhealthy);
    harness::wait_until("gpu-3 untainted", || {
        stored_taints(&h.api, "gpu-3") == Some(None)
    })
    .await;
    assert_eq!(
        stored_taints(&h.api, "gpu-2"),
        Some(Some(vec![("xid-79".into(), "NoExecute".into())]))
    );
    drop(stream);
    plugin.stop().await;
}

/// An XID on one MIG device: a claim prepared `gpu-0-mig-1g10gb-19-5` (memory slice
/// 5), and an XID 48 naming its GPU instance. The republished pool (stored by the
/// fake API server, so it passed validation) taints exactly the devices that consume
/// memory slice 5 (that partition, the larger ones overlapping it, the whole GPU);
/// the partitions beside it and the other GPUs stay untainted, and the health stream
/// reports exactly those devices Unhealthy.
#[tokio::test]
async fn an_xid_on_a_mig_device_taints_only_the_devices_it_overlaps() {
    let h = Harness::new().await;
    let plugin = h.start_plugin().await;
    let k = h.kubelet().await;
    let (info, _) = kubelet_standin::register(&h.registration_socket(), &["v1.DRAPlugin"])
        .await
        .unwrap();
    let mut stream = kubelet_standin::watch_health(std::path::Path::new(&info.endpoint))
        .await
        .unwrap();
    let claim = h
        .allocated_claim("mig", &[("mig", NODE, "gpu-0-mig-1g10gb-19-5", None)], &[])
        .await;
    let r = k.prepare_v1(std::slice::from_ref(&claim)).await.unwrap();
    assert!(r.claims[&claim.uid].error.is_empty(), "{r:?}");
    let gi = h
        .model
        .backend
        .mig_status(0)
        .unwrap()
        .instances
        .iter()
        .find(|i| i.start == 5 && i.size == 1)
        .expect("the prepared MIG device")
        .gi_id;
    inject_mig_xid(&h.opts.paths.state_dir, 0, gi, 48).unwrap();

    let list = next_until(&mut stream, "the MIG device unhealthy", |d| {
        status_of(d, "gpu-0-mig-1g10gb-19-5").0 == pb::HealthStatus::Unhealthy
    })
    .await;
    let consumes_slice_5 = |d: &k8s_openapi::api::resource::v1::Device| {
        d.consumes_counters
            .iter()
            .flatten()
            .any(|c| c.counter_set == "gpu-0-counters" && c.counters.contains_key("memory-slice-5"))
    };
    let mut overlapping = Vec::new();
    harness::wait_until("the MIG device tainted", || {
        let devices: Vec<_> = h
            .api
            .resource_slices()
            .into_iter()
            .flat_map(|s| s.spec.devices.unwrap_or_default())
            .collect();
        overlapping = devices
            .iter()
            .filter(|d| consumes_slice_5(d))
            .map(|d| d.name.clone())
            .collect();
        let tainted: Vec<String> = devices
            .iter()
            .filter(|d| d.taints.is_some())
            .map(|d| d.name.clone())
            .collect();
        !tainted.is_empty() && tainted == overlapping
    })
    .await;
    assert!(overlapping.contains(&"gpu-0-mig-1g10gb-19-5".to_string()));
    assert!(overlapping.contains(&"gpu-0".to_string()));
    assert!(
        overlapping.len() < 10,
        "most partitions are beside it: {overlapping:?}"
    );
    assert_eq!(
        stored_taints(&h.api, "gpu-0-mig-1g10gb-19-5"),
        Some(Some(vec![("xid-48".into(), "NoExecute".into())]))
    );
    let unhealthy: Vec<String> = list
        .iter()
        .filter(|d| d.health() == pb::HealthStatus::Unhealthy)
        .map(|d| d.device.as_ref().unwrap().device_name.clone())
        .collect();
    assert_eq!(unhealthy, overlapping);
    let (_, msg) = status_of(&list, "gpu-0-mig-1g10gb-19-5");
    assert!(msg.contains(&format!("GPU instance {gi}")), "{msg}");
    assert_eq!(stored_taints(&h.api, "gpu-1"), Some(None));
    drop(stream);
    k.unprepare_v1(std::slice::from_ref(&claim)).await.unwrap();
    plugin.stop().await;
}

/// Regression (an XID on a MIG instance was matched to a placement only when polled, so
/// an instance destroyed by then, the common case since a fatal XID kills the pod and
/// its unprepare destroys the instance, was charged to the whole GPU and evicted every
/// tenant): the watcher keeps the placement the instance had at its previous poll, so
/// the XID still taints only the devices overlapping that placement.
#[tokio::test]
async fn an_xid_on_a_mig_instance_destroyed_before_the_poll_taints_only_its_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let model = harness::model(dir.path());
    let backend = model.backend.clone();
    assert!(model.mig.contains_key(&0), "gpu-0 is a mig-mode GPU");
    backend.set_mig_mode(0, true).unwrap();
    let inst = backend.create_mig(0, 19, 5).unwrap();
    let features = tessera::publish::slices::ServerFeatures {
        partitionable: true,
        consumable_capacity: true,
        device_taints: true,
    };
    let mut watcher = tessera::device_health::watcher::HealthWatcher::new(
        model,
        DRIVER,
        NODE,
        KubeVersion::NEWEST,
        features,
    );
    assert!(!watcher.poll().await.unwrap(), "nothing happened yet");
    // The XID, then the instance's destruction, both before the next poll.
    inject_mig_xid(&dir.path().join("state"), 0, inst.gi_id, 48).unwrap();
    backend.destroy_mig(0, inst.gi_id).unwrap();
    assert!(watcher.poll().await.unwrap());

    assert_eq!(watcher.health().unhealthy(0), None, "not the whole GPU");
    let unhealthy: Vec<String> = watcher
        .device_list(0)
        .into_iter()
        .filter(|d| d.health() == pb::HealthStatus::Unhealthy)
        .map(|d| d.device.unwrap().device_name)
        .collect();
    for overlapping in ["gpu-0-mig-1g10gb-19-5", "gpu-0"] {
        assert!(unhealthy.iter().any(|d| d == overlapping), "{unhealthy:?}");
    }
    for beside in ["gpu-0-mig-1g10gb-19-4", "gpu-0-mig-1g10gb-19-6", "gpu-1"] {
        assert!(
            !unhealthy.iter().any(|d| d == beside),
            "{beside}: {unhealthy:?}"
        );
    }
    assert!(
        unhealthy.len() < 10,
        "most partitions are beside it: {unhealthy:?}"
    );
}

/// `tessera mock` (what the real-cluster scenario runs in the plugin's pod) appends
/// exactly the event it names to the node state the running plugin polls; a GPU the
/// node does not have, or a state directory with no mock node, is a clear error that
/// writes nothing.
#[test]
fn tessera_mock_injects_the_event_it_names_and_nothing_on_error() {
    use tessera::inventory::GpuBackend;
    use tessera::inventory::mock::{MockBackend, StateAccess};
    let tessera = env!("CARGO_BIN_EXE_tessera");
    let run = |dir: &std::path::Path, args: &[&str]| {
        let out = std::process::Command::new(tessera)
            .arg("mock")
            .arg("--state-dir")
            .arg(dir)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let backend = MockBackend::new(
        MockNode::embedded_default().unwrap(),
        dir.path().into(),
        StateAccess::ReadWrite,
    );
    backend.discover().unwrap();
    // Registers for events, as the plugin does at start.
    assert!(backend.health_events(0).unwrap().is_empty());

    let (ok, out, err) = run(dir.path(), &["xid", "--gpu", "2", "--xid", "79"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "injected event 1: XID 79 on GPU 2");
    let (ok, _, err) = run(
        dir.path(),
        &["xid", "--gpu", "0", "--xid", "48", "--gi", "3"],
    );
    assert!(ok, "{err}");
    let (ok, _, err) = run(dir.path(), &["lost", "--gpu", "3"]);
    assert!(ok, "{err}");
    let (ok, _, err) = run(dir.path(), &["recover", "--gpu", "3"]);
    assert!(ok, "{err}");
    let seen = |b: &MockBackend| -> Vec<_> {
        b.health_events(0)
            .unwrap()
            .iter()
            .map(|e| (e.seq, e.minor, e.gi_id, e.kind))
            .collect()
    };
    let expected = vec![
        (1, 2, None, HealthEventKind::Xid(79)),
        (2, 0, Some(3), HealthEventKind::Xid(48)),
        (3, 3, None, HealthEventKind::Lost),
        (4, 3, None, HealthEventKind::Recovered),
    ];
    assert_eq!(seen(&backend), expected);

    let (ok, _, err) = run(dir.path(), &["xid", "--gpu", "9", "--xid", "79"]);
    assert!(!ok);
    assert!(
        err.contains("XID 79 on GPU 9") && err.contains("9"),
        "{err}"
    );
    assert_eq!(seen(&backend), expected, "a refused event writes nothing");

    let empty = tempfile::tempdir().unwrap();
    let (ok, _, err) = run(empty.path(), &["lost", "--gpu", "0"]);
    assert!(!ok);
    assert!(
        err.contains("no mock node state at") && err.contains("--backend mock"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(empty.path()).unwrap().count(),
        0,
        "nothing written"
    );
}
