//! The plugin over real Unix sockets with a test kubelet and the fake API server:
//! registration, v1 and v1beta1 prepare/unprepare, request names, idempotency,
//! restarts, concurrency, stale-claim clean-up, and every per-claim error case.

use testkit::harness;

use testkit_lite::cdi as cdi_fixtures;

use std::path::Path;
use std::time::Duration;

use harness::{DRIVER, Harness, NODE, NS};
use kube::api::DeleteParams;
use serde_json::json;
use tessera::plugin::{self, registration_socket_path};
use testkit::kubelet_standin::{self, DraClient, KubeletClaim};

fn spec_path(h: &Harness, uid: &str) -> std::path::PathBuf {
    h.opts
        .paths
        .cdi_dir
        .join(format!("tessera.dev-gpu-{uid}.json"))
}

/// Registration answers DRAPlugin, the driver name, the absolute endpoint and the
/// versions v1 then v1beta1; a kubelet that knows only v1beta1 still registers.
#[tokio::test]
async fn registration_advertises_v1_then_v1beta1() {
    let h = Harness::new().await;
    let p = h.start_plugin().await;
    let (info, version) = kubelet_standin::register(
        &h.registration_socket(),
        &["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    )
    .await
    .unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(
        info.endpoint,
        h.opts
            .paths
            .plugin_dir
            .join("dra.sock")
            .display()
            .to_string()
    );
    assert!(Path::new(&info.endpoint).is_absolute());
    // The health service comes after the DRA versions.
    assert_eq!(
        info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth"
        ]
    );
    assert_eq!(version, kubelet_standin::DraVersion::V1);
    let (_, old) = kubelet_standin::register(&h.registration_socket(), &["v1beta1.DRAPlugin"])
        .await
        .unwrap();
    assert_eq!(old, kubelet_standin::DraVersion::V1beta1);
    p.stop().await;
    assert!(
        !h.registration_socket().exists(),
        "registration socket removed at shutdown"
    );
    assert!(
        !h.opts.paths.plugin_dir.join("dra.sock").exists(),
        "DRA socket removed at shutdown"
    );
}

/// v1: a whole-GPU claim gets its device, CDI ID and a valid spec; unprepare removes it.
#[tokio::test]
async fn v1_prepare_and_unprepare_a_whole_gpu() {
    let h = Harness::new().await;
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let c = h
        .allocated_claim("w1", &[("gpu", NODE, "gpu-0", None)], &[])
        .await;
    let resp = k.prepare_v1(std::slice::from_ref(&c)).await.unwrap();
    let r = &resp.claims[&c.uid];
    assert_eq!(r.error, "");
    assert_eq!(r.devices.len(), 1);
    let d = &r.devices[0];
    assert_eq!(
        (d.pool_name.as_str(), d.device_name.as_str()),
        (NODE, "gpu-0")
    );
    assert_eq!(d.request_names, ["gpu"]);
    assert_eq!(
        d.cdi_device_ids,
        [format!("tessera.dev/gpu={}-gpu-0", c.uid)]
    );
    assert_eq!(d.share_id, None);
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(spec_path(&h, &c.uid)).unwrap()).unwrap();
    let schema_errors = cdi_fixtures::schema_errors(&cdi_fixtures::schema_validator(), &spec);
    assert!(
        schema_errors.is_empty(),
        "spec fails the CDI JSON schema: {schema_errors:?}"
    );
    let parsed = tessera_cdi::validate_json(&spec).unwrap();
    assert_eq!(parsed.cdi_version, "0.5.0");
    assert_eq!(parsed.kind, "tessera.dev/gpu");
    let resp = k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(resp.claims[&c.uid].error, "");
    assert!(h.cdi_files().is_empty(), "{:?}", h.cdi_files());
    assert!(h.checkpoint_claims().is_empty());
    p.stop().await;
}

/// v1beta1 works the same way (without share IDs).
#[tokio::test]
async fn v1beta1_prepare_and_unprepare() {
    let h = Harness::new().await;
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let c = h
        .allocated_claim(
            "w2",
            &[("gpu", NODE, "gpu-2", None), ("gpu", NODE, "gpu-3", None)],
            &[],
        )
        .await;
    let resp = k.prepare_v1beta1(std::slice::from_ref(&c)).await.unwrap();
    let r = &resp.claims[&c.uid];
    assert_eq!(r.error, "");
    let names: Vec<_> = r.devices.iter().map(|d| d.device_name.as_str()).collect();
    assert_eq!(names, ["gpu-2", "gpu-3"]);
    assert!(spec_path(&h, &c.uid).exists());
    let resp = k.unprepare_v1beta1(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(resp.claims[&c.uid].error, "");
    assert!(h.cdi_files().is_empty());
    p.stop().await;
}

/// A claim with two requests: each device carries its own request name, subrequest
/// suffixes stripped.
#[tokio::test]
async fn two_requests_get_their_own_request_names() {
    let h = Harness::new().await;
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let c = h
        .allocated_claim(
            "two",
            &[
                ("big", NODE, "gpu-0", None),
                ("small/t4", NODE, "gpu-2", None),
            ],
            &[],
        )
        .await;
    let resp = k.prepare_v1(std::slice::from_ref(&c)).await.unwrap();
    let r = &resp.claims[&c.uid];
    assert_eq!(r.error, "");
    let pairs: Vec<_> = r
        .devices
        .iter()
        .map(|d| (d.device_name.as_str(), d.request_names.clone()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("gpu-0", vec!["big".to_string()]),
            ("gpu-2", vec!["small".to_string()])
        ]
    );
    p.stop().await;
}

/// A file's identity and modification time: a rewrite (temp file, then rename) makes
/// a new inode whatever the clock's granularity, and an in-place write a new mtime
/// (the caller sleeps 20 ms, above the file system's timestamp granularity).
fn stamp(path: &Path) -> (u64, std::time::SystemTime) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    (m.ino(), m.modified().unwrap())
}

/// A second prepare returns the same answer and rewrites nothing.
#[tokio::test]
async fn prepare_is_idempotent() {
    let h = Harness::new().await;
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let c = h
        .allocated_claim("w1", &[("gpu", NODE, "gpu-2", None)], &[])
        .await;
    let first = k.prepare_v1(std::slice::from_ref(&c)).await.unwrap();
    let cp = h.opts.paths.state_dir.join("checkpoint.json");
    let (spec_t, cp_t) = (stamp(&spec_path(&h, &c.uid)), stamp(&cp));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = k.prepare_v1(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(stamp(&spec_path(&h, &c.uid)), spec_t, "spec not rewritten");
    assert_eq!(stamp(&cp), cp_t, "checkpoint not rewritten");
    // Unprepare twice, and of a claim never prepared, succeeds.
    let never = KubeletClaim {
        namespace: NS.into(),
        uid: "00000000-0000-4000-8000-000000000000".into(),
        name: "never".into(),
    };
    for _ in 0..2 {
        let r = k.unprepare_v1(&[c.clone(), never.clone()]).await.unwrap();
        assert_eq!(r.claims.len(), 2);
        assert!(r.claims.values().all(|x| x.error.is_empty()));
    }
    p.stop().await;
}

/// A claim reserved for a PodGroup (1.37, DRAWorkloadResourceClaims) lists no pod in
/// `status.reservedFor`: it is prepared like any other, recorded with no pods (the
/// watchdog finds the group's pods through the pods themselves), prepared once however
/// many of the group's pods the kubelet starts, and unprepared when the kubelet says so.
#[tokio::test]
async fn a_claim_reserved_for_a_pod_group_is_prepared_once_and_unprepared_on_request() {
    let h = Harness::new().await;
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let c = h
        .allocated_group_claim("gang", &[("gpu", "gpu-0")], "trainers")
        .await;
    let first = k.prepare_v1(std::slice::from_ref(&c)).await.unwrap();
    let r = &first.claims[&c.uid];
    assert_eq!(r.error, "");
    assert_eq!(r.devices.len(), 1);
    assert_eq!(r.devices[0].device_name, "gpu-0");
    let cp: serde_json::Value = serde_json::from_slice(
        &std::fs::read(h.opts.paths.state_dir.join("checkpoint.json")).unwrap(),
    )
    .unwrap();
    let record = &cp["claims"][&c.uid];
    assert_eq!(record["state"], "PrepareCompleted", "{record}");
    assert!(record.get("pods").is_none(), "no pods recorded: {record}");
    let spec_t = stamp(&spec_path(&h, &c.uid));
    tokio::time::sleep(Duration::from_millis(20)).await;
    // A second pod of the group on this node: the same answer, nothing rewritten.
    let second = k.prepare_v1(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(stamp(&spec_path(&h, &c.uid)), spec_t, "spec not rewritten");
    let r = k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(r.claims[&c.uid].error, "");
    assert!(h.cdi_files().is_empty(), "{:?}", h.cdi_files());
    assert!(h.checkpoint_claims().is_empty());
    p.stop().await;
}

/// After a plugin restart, a prepared claim is still known: prepare answers the same,
/// unprepare cleans up.
#[tokio::test]
async fn prepared_claims_survive_a_restart() {
    let h = Harness::new().await;
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let c = h
        .allocated_claim("w1", &[("gpu", NODE, "gpu-0", None)], &[])
        .await;
    let before = k.prepare_v1(std::slice::from_ref(&c)).await.unwrap();
    p.stop().await;
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let after = k.prepare_v1(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(before, after);
    k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
    assert!(h.cdi_files().is_empty());
    p.stop().await;
}

/// Concurrent prepares: different claims all succeed; the same claim twice at once
/// yields one spec and the same answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_prepares() {
    let h = Harness::new().await;
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let mut claims = Vec::new();
    for (i, dev) in ["gpu-0", "gpu-2", "gpu-3"].iter().enumerate() {
        claims.push(
            h.allocated_claim(&format!("c{i}"), &[("gpu", NODE, dev, None)], &[])
                .await,
        );
    }
    // And a share of the shared gpu-1.
    let share = harness::shared_result(
        "gpu",
        "gpu-1",
        "5a0c2f7e-8b1d-4e39-a6c4-2f9d0b7e1a53",
        "8Gi",
        "10",
    );
    claims.push(h.allocated_claim_with("c3", vec![share], &[]).await);
    let calls = claims.iter().map(|c| {
        let k = k.clone();
        let c = c.clone();
        async move { k.prepare_v1(&[c]).await.unwrap() }
    });
    let results = futures::future::join_all(calls).await;
    for (c, r) in claims.iter().zip(&results) {
        assert_eq!(r.claims[&c.uid].error, "", "{}", c.name);
    }
    assert_eq!(h.checkpoint_claims().len(), 4);
    k.unprepare_v1(&claims).await.unwrap();

    let same = h
        .allocated_claim("same", &[("gpu", NODE, "gpu-2", None)], &[])
        .await;
    let (a, b) = tokio::join!(
        k.prepare_v1(std::slice::from_ref(&same)),
        k.prepare_v1(std::slice::from_ref(&same))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.claims[&same.uid].error, "");
    assert_eq!(a, b);
    assert_eq!(
        h.cdi_files(),
        [format!("tessera.dev-gpu-{}.json", same.uid)]
    );
    p.stop().await;
}

/// Claims whose ResourceClaim is gone, or replaced by one with a new UID, are
/// unprepared by the plugin itself.
#[tokio::test]
async fn stale_claims_are_cleaned_up() {
    let h = Harness::new().await;
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let gone = h
        .allocated_claim("gone", &[("gpu", NODE, "gpu-0", None)], &[])
        .await;
    let replaced = h
        .allocated_claim("replaced", &[("gpu", NODE, "gpu-2", None)], &[])
        .await;
    let live = h
        .allocated_claim("live", &[("gpu", NODE, "gpu-3", None)], &[])
        .await;
    k.prepare_v1(&[gone.clone(), replaced.clone(), live.clone()])
        .await
        .unwrap();
    p.stop().await;
    let api = h.claims();
    api.delete("gone", &DeleteParams::default()).await.unwrap();
    api.delete("replaced", &DeleteParams::default())
        .await
        .unwrap();
    h.allocated_claim("replaced", &[("gpu", NODE, "gpu-2", None)], &[])
        .await;

    let state = std::sync::Arc::new(
        plugin::open_state(
            &h.opts,
            &h.model,
            tessera::prepare::state::UnknownMig::Destroy,
        )
        .unwrap(),
    );
    let mut removed = plugin::cleanup_once(&state, &h.api.client().unwrap(), Duration::ZERO)
        .await
        .unwrap();
    removed.sort();
    let mut want = vec![gone.uid.clone(), replaced.uid.clone()];
    want.sort();
    assert_eq!(removed, want);
    assert_eq!(h.checkpoint_claims(), std::slice::from_ref(&live.uid));
    assert_eq!(
        h.cdi_files(),
        [format!("tessera.dev-gpu-{}.json", live.uid)]
    );
}

async fn expect_error(h: &Harness, k: &DraClient, c: &KubeletClaim, needle: &str) {
    let resp = k.prepare_v1(std::slice::from_ref(c)).await.unwrap();
    let err = &resp.claims[&c.uid].error;
    assert!(
        err.contains(needle),
        "claim {}: error {err:?} lacks {needle:?}",
        c.name
    );
    assert!(resp.claims[&c.uid].devices.is_empty());
    let files = h.cdi_files();
    assert!(
        !files.iter().any(|f| f.contains(&c.uid)),
        "no spec for {}: {files:?}",
        c.name
    );
    assert!(
        !h.checkpoint_claims().contains(&c.uid),
        "no checkpoint entry for {}",
        c.name
    );
}

/// Each bad claim gets a per-claim error naming the problem, and leaves nothing behind.
#[tokio::test]
async fn bad_claims_fail_alone_and_leave_nothing() {
    let h = Harness::new().await;
    let p = h.start_plugin().await;
    let k = h.kubelet().await;

    let missing = KubeletClaim {
        namespace: NS.into(),
        uid: "11111111-1111-4111-8111-111111111111".into(),
        name: "missing".into(),
    };
    expect_error(&h, &k, &missing, "not found").await;

    let real = h
        .allocated_claim("uid", &[("gpu", NODE, "gpu-0", None)], &[])
        .await;
    let wrong_uid = KubeletClaim {
        uid: "22222222-2222-4222-8222-222222222222".into(),
        ..real.clone()
    };
    expect_error(&h, &k, &wrong_uid, "was replaced").await;

    // Not allocated: created without status.
    let api = h.claims();
    let mut unalloc = api.get("uid").await.unwrap();
    unalloc.metadata = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: Some("unallocated".into()),
        namespace: Some(NS.into()),
        ..Default::default()
    };
    unalloc.status = None;
    let created = api.create(&Default::default(), &unalloc).await.unwrap();
    let unalloc = KubeletClaim {
        namespace: NS.into(),
        uid: created.metadata.uid.unwrap(),
        name: "unallocated".into(),
    };
    expect_error(&h, &k, &unalloc, "not allocated").await;

    let other_pool = h
        .allocated_claim("otherpool", &[("gpu", "node-b", "gpu-0", None)], &[])
        .await;
    expect_error(&h, &k, &other_pool, "not this node's pool").await;

    let unknown = h
        .allocated_claim("unknown", &[("gpu", NODE, "gpu-9", None)], &[])
        .await;
    expect_error(&h, &k, &unknown, "does not exist on this node").await;

    let holder = h
        .allocated_claim("holder", &[("gpu", NODE, "gpu-3", None)], &[])
        .await;
    assert_eq!(
        k.prepare_v1(std::slice::from_ref(&holder))
            .await
            .unwrap()
            .claims[&holder.uid]
            .error,
        ""
    );
    let thief = h
        .allocated_claim("thief", &[("gpu", NODE, "gpu-3", None)], &[])
        .await;
    expect_error(
        &h,
        &k,
        &thief,
        &format!("already prepared for claim {}", holder.uid),
    )
    .await;

    let bad_value = h
        .allocated_claim(
            "badcfg",
            &[("gpu", NODE, "gpu-2", None)],
            &[("FromClaim", &[], json!({"apiVersion": "resource.tessera.dev/v1alpha1", "kind": "GpuConfig", "computeLimit": 0}))],
        )
        .await;
    expect_error(&h, &k, &bad_value, "computeLimit").await;

    let unknown_field = h
        .allocated_claim(
            "unknownfield",
            &[("gpu", NODE, "gpu-2", None)],
            &[("FromClass", &["gpu"], json!({"apiVersion": "resource.tessera.dev/v1alpha1", "kind": "GpuConfig", "colour": "blue"}))],
        )
        .await;
    expect_error(&h, &k, &unknown_field, "colour").await;

    // A good claim in the same call as a bad one still succeeds.
    let good = h
        .allocated_claim(
            "good",
            &[("gpu", NODE, "gpu-2", None)],
            &[("FromClaim", &[], json!({"apiVersion": "resource.tessera.dev/v1alpha1", "kind": "GpuConfig", "scrubOnFree": true, "computeLimit": 50}))],
        )
        .await;
    let resp = k.prepare_v1(&[good.clone(), thief.clone()]).await.unwrap();
    assert_eq!(resp.claims.len(), 2);
    assert_eq!(resp.claims[&good.uid].error, "");
    assert!(!resp.claims[&thief.uid].error.is_empty());
    p.stop().await;
}

/// Rolling updates use per-pod socket names that fit the 108-byte limit.
#[test]
fn rolling_update_socket_names() {
    let uid = "0b5c6e2a-1f3d-4c8e-9a7b-2d4f6e8a0c1e";
    let dir = Path::new("/var/lib/kubelet/plugins_registry");
    assert_eq!(
        registration_socket_path(dir, DRIVER, None),
        dir.join("gpu.tessera.dev-reg.sock")
    );
    let name = registration_socket_path(dir, DRIVER, Some(uid));
    assert_eq!(name, dir.join(format!("gpu.tessera.dev-{uid}-reg.sock")));
    // Too long with the full UID: the hashed 8-byte form is used.
    let long_dir = Path::new("/var/lib/kubelet/plugins_registry/long-dir-for-tests");
    let short = registration_socket_path(long_dir, DRIVER, Some(uid));
    assert!(short.as_os_str().len() <= 108, "{}", short.display());
    let name = short.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("gpu.tessera.dev-") && name.ends_with("-reg.sock") && !name.contains(uid),
        "{name}"
    );
    assert_eq!(
        name.len(),
        "gpu.tessera.dev-".len() + 11 + "-reg.sock".len()
    );
}

/// `(apiGroup, resource, verb)` triples the ClusterRole in `deploy/base/rbac.yaml` allows.
fn allowed_by_cluster_role() -> Vec<(String, String, String)> {
    testkit::rbac::allowed_by_cluster_role(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/base/rbac.yaml"
    )))
}

/// Every request the plugin makes (publish, prepare, unprepare, clean-up) is allowed by
/// the ClusterRole we ship.
#[tokio::test]
async fn plugin_requests_stay_within_its_cluster_role() {
    let h = Harness::new().await;
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let c = h
        .allocated_claim("rbac", &[("gpu", NODE, "gpu-0", None)], &[])
        .await;
    harness::wait_until("slices", || !h.api.resource_slices().is_empty()).await;
    let name = h.api.resource_slices()[0].metadata.name.clone().unwrap();
    let count = h.api.resource_slices().len();
    // The test's own calls so far are not the plugin's.
    h.api.clear_requests();
    h.api.delete_resource_slice(&name);
    // Republished: the pool whole again, the deleted slice replaced by a new one (the
    // pool may have other slices, so "not empty" would not wait).
    harness::wait_until("republish", || {
        let now = h.api.resource_slices();
        now.len() == count
            && now
                .iter()
                .all(|s| s.metadata.name.as_deref() != Some(&name))
    })
    .await;
    k.prepare_v1(std::slice::from_ref(&c)).await.unwrap();
    k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
    let state = std::sync::Arc::new(
        plugin::open_state(
            &h.opts,
            &h.model,
            tessera::prepare::state::UnknownMig::Destroy,
        )
        .unwrap(),
    );
    plugin::cleanup_once(&state, &h.api.client().unwrap(), Duration::ZERO)
        .await
        .unwrap();
    p.stop().await;
    let allowed = allowed_by_cluster_role();
    let used: std::collections::BTreeSet<(String, String, String)> = h
        .api
        .requests()
        .iter()
        .filter(|r| r.path != "/version")
        .map(|r| {
            let resource = match &r.subresource {
                Some(sub) => format!("{}/{sub}", r.resource),
                None => r.resource.clone(),
            };
            (r.group.clone(), resource, r.verb.clone())
        })
        .collect();
    for u in &used {
        assert!(
            allowed.contains(u),
            "request {u:?} is not allowed by deploy/base/rbac.yaml"
        );
    }
    assert!(used.contains(&(
        "resource.k8s.io".into(),
        "resourceclaims".into(),
        "get".into()
    )));
    assert!(used.contains(&(
        "resource.k8s.io".into(),
        "resourceslices".into(),
        "create".into()
    )));
}

/// A plain HTTP GET; the status code, or `None` when nothing listens.
fn http_status(addr: std::net::SocketAddr, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_whitespace().nth(1)?.parse().ok()
}

/// `--metrics-addr` serves `/healthz` (alive) and `/readyz` (sockets served, the pool
/// published, and registered by the kubelet: 503 before the stand-in registers), which
/// the DaemonSet probes; nothing listens after shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_endpoints_follow_the_plugin() {
    let mut h = Harness::new().await;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    h.opts.metrics_addr = Some(addr);
    let p = h.start_plugin().await;
    // Published but not registered with the kubelet: not ready (a rolling update must
    // not remove the old pod for a plugin the kubelet cannot call yet).
    for _ in 0..1000 {
        if !h.api.resource_slices().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!h.api.resource_slices().is_empty(), "the pool is published");
    let before = tokio::task::spawn_blocking(move || http_status(addr, "/readyz"))
        .await
        .unwrap();
    assert_eq!(
        before,
        Some(503),
        "/readyz before the kubelet's registration"
    );
    let _kubelet = h.kubelet().await;
    let ready = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if http_status(addr, "/readyz") == Some(200) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    })
    .await
    .unwrap();
    assert!(
        ready,
        "/readyz turns 200 once the pool is published and the kubelet registered the plugin"
    );
    assert!(!h.api.resource_slices().is_empty());
    let (live, missing) = tokio::task::spawn_blocking(move || {
        (http_status(addr, "/healthz"), http_status(addr, "/nope"))
    })
    .await
    .unwrap();
    assert_eq!((live, missing), (Some(200), Some(404)));
    p.stop().await;
    let after = tokio::task::spawn_blocking(move || http_status(addr, "/healthz"))
        .await
        .unwrap();
    assert_eq!(after, None, "the endpoint closes with the plugin");
}
