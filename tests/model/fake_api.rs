//! The fake API server's own contract, over real HTTP with kube-rs clients: names,
//! conflicts, preconditions, dry runs, selectors, claims with status, watch, and the
//! request log used for RBAC checks.

use std::time::Duration;

use futures::StreamExt;
use k8s_model::release::KubeVersion;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
    ResourceClaimStatus, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    Api, DeleteParams, ListParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use testkit::claims::ClaimBuilder;
use testkit::fakeapi::{FakeApiConfig, FakeApiServer};

fn slice(generate_name: &str, node: &str) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            generate_name: Some(generate_name.into()),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: "gpu.tessera.dev".into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(vec![]),
            ..Default::default()
        },
    }
}

async fn start() -> FakeApiServer {
    FakeApiServer::start(FakeApiConfig::new(KubeVersion::NEWEST))
        .await
        .unwrap()
}

/// generateName gets a 5-character suffix; a stale resourceVersion on update is a 409.
#[tokio::test]
async fn generate_name_and_stale_update_conflict() {
    let s = start().await;
    let api: Api<ResourceSlice> = Api::all(s.client().unwrap());
    let created = api
        .create(
            &PostParams::default(),
            &slice("00000-gpu.tessera.dev-n-", "n"),
        )
        .await
        .unwrap();
    let name = created.metadata.name.clone().unwrap();
    assert_eq!(name.len(), "00000-gpu.tessera.dev-n-".len() + 5);
    let mut a = created.clone();
    a.spec.pool.generation = 2;
    let updated = api
        .replace(&name, &PostParams::default(), &a)
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );
    // `a` still carries the old resourceVersion.
    let err = api
        .replace(&name, &PostParams::default(), &a)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 409 && e.reason == "Conflict"),
        "{err:?}"
    );
}

/// Delete preconditions are enforced; a missing object is a 404 Status.
#[tokio::test]
async fn delete_preconditions_and_not_found() {
    let s = start().await;
    let api: Api<ResourceSlice> = Api::all(s.client().unwrap());
    let created = api
        .create(&PostParams::default(), &slice("x-", "n"))
        .await
        .unwrap();
    let name = created.metadata.name.clone().unwrap();
    let wrong = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("not-the-uid".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let err = api.delete(&name, &wrong).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 409),
        "{err:?}"
    );
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: created.metadata.uid.clone(),
            resource_version: created.metadata.resource_version.clone(),
        }),
        ..Default::default()
    };
    api.delete(&name, &right).await.unwrap();
    let err = api.get(&name).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 404 && e.reason == "NotFound"),
        "{err:?}"
    );
}

/// Dry-run creates return the object but store nothing; selectors filter lists.
#[tokio::test]
async fn dry_run_and_field_selectors() {
    let s = start().await;
    let api: Api<ResourceSlice> = Api::all(s.client().unwrap());
    let dry = api
        .create(
            &PostParams {
                dry_run: true,
                field_manager: None,
            },
            &slice("d-", "n1"),
        )
        .await
        .unwrap();
    assert!(dry.metadata.name.is_some());
    assert!(
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    api.create(&PostParams::default(), &slice("a-", "n1"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &slice("b-", "n2"))
        .await
        .unwrap();
    let n1 = api
        .list(&ListParams::default().fields("spec.nodeName=n1,spec.driver=gpu.tessera.dev"))
        .await
        .unwrap();
    assert_eq!(n1.items.len(), 1);
    let err = api
        .list(&ListParams::default().fields("spec.colour=red"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 400),
        "{err:?}"
    );
}

/// Watches stream changes after the given resourceVersion.
#[tokio::test]
async fn watch_streams_events() {
    let s = start().await;
    let api: Api<ResourceSlice> = Api::all(s.client().unwrap());
    let list = api.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let mut stream = api
        .watch(&WatchParams::default().timeout(60), &rv)
        .await
        .unwrap()
        .boxed();
    let created = api
        .create(&PostParams::default(), &slice("w-", "n"))
        .await
        .unwrap();
    let name = created.metadata.name.clone().unwrap();
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        let ev = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        kinds.push(match ev {
            WatchEvent::Added(_) => "added",
            WatchEvent::Deleted(_) => "deleted",
            WatchEvent::Modified(_) => "modified",
            _ => "other",
        });
    }
    assert_eq!(kinds, ["added", "deleted"]);
}

fn claim(name: &str) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "gpu".into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: "gpu.tessera.dev".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }),
        status: None,
    }
}

/// Claims are created without status; status is set only through the subresource;
/// the spec is immutable.
#[tokio::test]
async fn claims_with_status_subresource() {
    let s = start().await;
    let api: Api<ResourceClaim> = Api::namespaced(s.client().unwrap(), "default");
    let mut c = claim("c1");
    c.status = Some(ResourceClaimStatus::default());
    let created = api.create(&PostParams::default(), &c).await.unwrap();
    assert!(created.status.is_none());
    let mut with_status = ClaimBuilder::from_claim(created.clone())
        .device("gpu", "node-a", "gpu-0")
        .build();
    // The main resource ignores status changes.
    let same = api
        .replace("c1", &PostParams::default(), &with_status)
        .await
        .unwrap();
    assert!(same.status.is_none());
    with_status.metadata.resource_version = same.metadata.resource_version.clone();
    let allocated = api
        .replace_status("c1", &PostParams::default(), &with_status)
        .await
        .unwrap();
    assert_eq!(
        allocated
            .status
            .unwrap()
            .allocation
            .unwrap()
            .devices
            .unwrap()
            .results
            .unwrap()[0]
            .device,
        "gpu-0"
    );
    // Changing the spec is refused.
    let mut changed = api.get("c1").await.unwrap();
    changed
        .spec
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .requests
        .as_mut()
        .unwrap()[0]
        .name = "other".into();
    let err = api
        .replace("c1", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 422),
        "{err:?}"
    );
    api.delete("c1", &DeleteParams::default()).await.unwrap();
    assert!(api.get_opt("c1").await.unwrap().is_none());
}

/// Nodes and pods are served read-only; every request is logged with its RBAC verb.
#[tokio::test]
async fn nodes_pods_and_the_request_log() {
    let s = start().await;
    s.add_node("node-a");
    s.add_pod("default", serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}));
    let client = s.client().unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    assert!(nodes.get("node-a").await.unwrap().metadata.uid.is_some());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    assert!(pods.get("p").await.is_ok());
    let err = nodes
        .delete("node-a", &DeleteParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 405),
        "{err:?}"
    );
    let verbs: Vec<String> = s.requests().iter().map(|r| r.rbac()).collect();
    assert_eq!(
        verbs,
        ["get nodes", "list pods", "get pods", "delete nodes"]
    );
}

/// An events.k8s.io/v1 Event as kube-runtime's Recorder posts it, on pod `default/p`.
fn recorded_event(name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "default"},
        "eventTime": "2026-01-01T00:00:00.123456Z",
        "regarding": {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "default", "uid": "u-1"},
        "reportingController": "tessera.dev/watchdog", "reportingInstance": "node-a",
        "type": "Warning", "reason": "GpuMemoryOverBudget", "action": "CheckGpuMemory",
        "note": "over budget"
    })
}

/// Events through events.k8s.io/v1: one stored Event shown in either group's shape;
/// a merge PATCH adds a series (what the Recorder sends for a repeated Event), while
/// changing what the Event says is refused (422); other patch formats get 415, a
/// missing Event 404, a PATCH through core/v1 405.
#[tokio::test]
async fn events_k8s_io_events_are_created_patched_and_shown_in_both_groups() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event;
    use kube::api::{Patch, PatchParams};
    let s = start().await;
    let client = s.client().unwrap();
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let ev: Event = serde_json::from_value(recorded_event("p.1")).unwrap();
    let created = events.create(&PostParams::default(), &ev).await.unwrap();
    assert_eq!(created.note.as_deref(), Some("over budget"));
    assert!(created.metadata.uid.is_some());
    // The same Event through core/v1.
    let old_style = core.get("p.1").await.unwrap();
    assert_eq!(old_style.involved_object.uid.as_deref(), Some("u-1"));
    assert_eq!(old_style.message.as_deref(), Some("over budget"));
    assert_eq!(
        old_style.reporting_component.as_deref(),
        Some("tessera.dev/watchdog")
    );
    // A series.
    let series = serde_json::json!({
        "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"}
    });
    let patched = events
        .patch("p.1", &PatchParams::default(), &Patch::Merge(&series))
        .await
        .unwrap();
    assert_eq!(patched.series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(patched.note.as_deref(), Some("over budget"));
    assert_eq!(events.get("p.1").await.unwrap().series, patched.series);
    // The whole Event with a series, as the Recorder sends it, is a series update too.
    let mut whole = recorded_event("p.1");
    whole["series"] =
        serde_json::json!({"count": 3, "lastObservedTime": "2026-01-01T00:02:00.000000Z"});
    let patched = events
        .patch("p.1", &PatchParams::default(), &Patch::Merge(&whole))
        .await
        .unwrap();
    assert_eq!(patched.series.map(|s| s.count), Some(3));
    fn code<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> u16 {
        match r {
            Err(kube::Error::Api(s)) => s.code,
            other => panic!("{other:?}"),
        }
    }
    let renote = serde_json::json!({"note": "something else"});
    let err = events
        .patch("p.1", &PatchParams::default(), &Patch::Merge(&renote))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(status.code, 422, "{status:?}");
    assert!(
        status.message.contains("message: Invalid value"),
        "{status:?}"
    );
    assert_eq!(
        code(
            events
                .patch("p.1", &PatchParams::default(), &Patch::Strategic(&series))
                .await
        ),
        415
    );
    assert_eq!(
        code(
            events
                .patch("p.2", &PatchParams::default(), &Patch::Merge(&series))
                .await
        ),
        404
    );
    assert_eq!(
        code(
            core.patch("p.1", &PatchParams::default(), &Patch::Merge(&series))
                .await
        ),
        405
    );
    // Creation is validated strictly: no eventTime, a type other than Normal or Warning.
    let mut bad = recorded_event("p.3");
    bad.as_object_mut().unwrap().remove("eventTime");
    bad["type"] = serde_json::json!("Error");
    let bad: Event = serde_json::from_value(bad).unwrap();
    let err = events
        .create(&PostParams::default(), &bad)
        .await
        .unwrap_err();
    let kube::Error::Api(status) = &err else {
        panic!("{err:?}")
    };
    let fields: Vec<&str> = status
        .details
        .iter()
        .flat_map(|d| &d.causes)
        .map(|c| c.field.as_str())
        .collect();
    assert_eq!(fields, ["eventTime", "type"], "{status:?}");
    let verbs: Vec<String> = s
        .requests()
        .iter()
        .map(|r| format!("{} {}", r.rbac(), r.status))
        .collect();
    assert_eq!(
        verbs,
        [
            "create events.k8s.io/events 201",
            "get events 200",
            "patch events.k8s.io/events 200",
            "get events.k8s.io/events 200",
            "patch events.k8s.io/events 200",
            "patch events.k8s.io/events 422",
            "patch events.k8s.io/events 415",
            "patch events.k8s.io/events 404",
            "patch events 405",
            "create events.k8s.io/events 422",
        ]
    );
}

/// With RBAC enforced, a request the rules do not grant is refused 403 as the API
/// server words it, and SelfSubjectAccessReviews answer from the same rules (creating
/// them is open to everyone, as `system:basic-user` allows).
#[tokio::test]
async fn enforced_rbac_forbids_and_access_reviews_answer_from_the_same_rules() {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let s = FakeApiServer::start(FakeApiConfig::new(KubeVersion::NEWEST))
        .await
        .unwrap();
    s.add_node("n1");
    s.enforce_rbac(vec![
        ("".into(), "nodes".into(), "get".into()),
        ("resource.k8s.io".into(), "*".into(), "list".into()),
    ]);
    let client = s.client().unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.get("n1").await.unwrap();
    let err = nodes.list(&ListParams::default()).await.unwrap_err();
    let kube::Error::Api(status) = &err else {
        panic!("{err:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        status.message,
        "nodes is forbidden: User \"system:serviceaccount:tessera-system:tessera-plugin\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
    );
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client);
    let ask = |group: &str, resource: &str, verb: &str| SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.into()),
                resource: Some(resource.into()),
                verb: Some(verb.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut answers = Vec::new();
    for (g, r, v) in [
        ("", "nodes", "get"),
        ("", "nodes", "list"),
        ("resource.k8s.io", "resourceslices", "list"),
        ("resource.k8s.io", "resourceslices", "create"),
    ] {
        let review = reviews
            .create(&PostParams::default(), &ask(g, r, v))
            .await
            .unwrap();
        answers.push(review.status.unwrap().allowed);
    }
    assert_eq!(answers, [true, false, true, false]);
    let empty = reviews
        .create(&PostParams::default(), &SelfSubjectAccessReview::default())
        .await
        .unwrap_err();
    assert!(
        matches!(empty, kube::Error::Api(ref s) if s.code == 422),
        "{empty:?}"
    );
}

/// From 1.36 (DRAResourceClaimGranularStatusAuthorization) a change of
/// `status.devices` also needs, per driver, `associated-node:update` on
/// `resourceclaims/driver` for a claim allocated to the caller's node (its token's
/// node) or `arbitrary-node:update` for any claim; a refusal is a 422 naming the
/// permission. On 1.34 the status update alone suffices. Other status changes are not
/// affected.
#[tokio::test]
async fn device_status_writes_are_authorized_per_driver_and_node() {
    use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;
    let rules = |extra: &[&str]| {
        let mut r = vec![
            (
                "resource.k8s.io".into(),
                "resourceclaims".into(),
                "*".into(),
            ),
            (
                "resource.k8s.io".into(),
                "resourceclaims/status".into(),
                "update".into(),
            ),
        ];
        r.extend(extra.iter().map(|v| {
            (
                "resource.k8s.io".into(),
                "resourceclaims/driver".into(),
                v.to_string(),
            )
        }));
        r
    };
    // (version, verbs granted on resourceclaims/driver, allocated node) -> allowed
    let cases: [(KubeVersion, &[&str], &str, bool); 6] = [
        (KubeVersion::NEWEST, &["associated-node:update"], "n1", true),
        (
            KubeVersion::NEWEST,
            &["associated-node:update"],
            "n2",
            false,
        ),
        (KubeVersion::NEWEST, &["arbitrary-node:update"], "n2", true),
        (KubeVersion::NEWEST, &[], "n1", false),
        (KubeVersion::OLDEST, &[], "n1", true),
        (KubeVersion::OLDEST, &[], "n2", true),
    ];
    for (version, verbs, node, allowed) in cases {
        let s = FakeApiServer::start(FakeApiConfig::new(version))
            .await
            .unwrap();
        s.set_caller_node("n1");
        let api: Api<ResourceClaim> = Api::namespaced(s.client().unwrap(), "default");
        let b = ClaimBuilder::new("c")
            .device("gpu", node, "gpu-0")
            .requests_of_results();
        let mut claim = b.clone().build();
        claim.status = None;
        let mut created = api.create(&PostParams::default(), &claim).await.unwrap();
        let mut status = b.status();
        status.allocation.as_mut().unwrap().node_selector =
            Some(testkit::harness::node_selector(node));
        created.status = Some(status);
        let mut stored = api
            .replace_status("c", &PostParams::default(), &created)
            .await
            .unwrap();
        s.enforce_rbac(rules(verbs));
        stored.status.as_mut().unwrap().devices = Some(vec![AllocatedDeviceStatus {
            driver: "gpu.tessera.dev".into(),
            pool: node.into(),
            device: "gpu-0".into(),
            ..Default::default()
        }]);
        let r = api
            .replace_status("c", &PostParams::default(), &stored)
            .await;
        let what = format!("{version} {verbs:?} claim on {node}");
        match (&r, allowed) {
            (Ok(c), true) => assert_eq!(
                c.status.as_ref().unwrap().devices.as_ref().unwrap().len(),
                1,
                "{what}"
            ),
            (Err(kube::Error::Api(e)), false) => {
                assert_eq!(e.code, 422, "{what}");
                assert!(
                    e.message.contains("resourceclaims/driver"),
                    "{what}: {}",
                    e.message
                );
            }
            _ => panic!("{what}: {r:?}"),
        }
    }
}
