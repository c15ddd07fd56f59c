//! An in-process fake Kubernetes API server for tests and the demo.
//!
//! It serves the calls Tessera makes, over real HTTP, with the real API's semantics
//! where they matter to Tessera: `/version`; nodes get/list; resourceslices list (label
//! and field selectors), watch, create (`generateName`, `dryRun=All`), update (409 on a
//! stale resourceVersion) and delete (preconditions); resourceclaims get, list, create,
//! update, status update and delete; pods get and list; events create and update
//! through core/v1 and events.k8s.io/v1, and merge PATCH through events.k8s.io/v1 (the
//! series updates of kube-runtime's event `Recorder`), one stored Event shown in either
//! group's shape and validated as the API server does (`events.rs`). Other PATCH formats
//! (strategic merge, JSON patch, apply) are refused with 415, and PATCH of other
//! resources with 405.
//!
//! It is parameterized by Kubernetes version (1.34–1.38) and feature gates: disabled
//! gates drop their fields silently, and ResourceSlices are validated per version
//! ([`k8s_model::validation`]) with `Status` bodies and 404/409/422 codes. Every request is
//! logged ([`RequestRecord`]) so that tests can check the plugin's calls against its RBAC;
//! with [`FakeApiServer::enforce_rbac`] it also authorizes them (403 Forbidden) and
//! answers SelfSubjectAccessReviews from the same rules.

// Handlers return a ready HTTP response as their error; its size does not matter in a
// test double, and boxing it would only add noise.
#![allow(clippy::result_large_err)]

mod events;
mod patch;
mod selectors;
mod store;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::events::v1::Event as EventV1;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use k8s_model::release::{FeatureGates, KubeVersion};
use k8s_model::validation;
pub use selectors::{FieldSelector, LabelSelector};
use store::{Key, Store, WatchEvent};

type Body = BoxBody<Bytes, Infallible>;

/// One request the server received, in the terms RBAC uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    pub query: String,
    /// RBAC verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// API group (`""` for core).
    pub group: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub dry_run: bool,
    pub status: u16,
}

impl RequestRecord {
    /// `verb group/resource[/subresource]`, e.g. `create resource.k8s.io/resourceslices`.
    pub fn rbac(&self) -> String {
        let res = match &self.subresource {
            Some(s) => format!("{}/{s}", self.resource),
            None => self.resource.clone(),
        };
        if self.group.is_empty() {
            format!("{} {res}", self.verb)
        } else {
            format!("{} {}/{res}", self.verb, self.group)
        }
    }
}

/// Server parameters.
#[derive(Debug, Clone)]
pub struct FakeApiConfig {
    pub gates: FeatureGates,
}

impl FakeApiConfig {
    pub fn new(version: KubeVersion) -> Self {
        FakeApiConfig {
            gates: FeatureGates::defaults(version),
        }
    }
}

struct Shared {
    store: Mutex<Store>,
    log: Mutex<Vec<RequestRecord>>,
    gates: FeatureGates,
    /// Injected failures: (verb, resource) answered with a status code.
    faults: Mutex<Vec<(String, String, u16)>>,
    /// The caller's RBAC rules once [`FakeApiServer::enforce_rbac`] was called:
    /// `(apiGroup, resource, verb)`, `*` matching anything. `None`: everything allowed.
    rbac: Mutex<Option<Vec<(String, String, String)>>>,
    /// The node the caller's service-account token is bound to (the node of the pod it
    /// was issued for), as the API server reads it for the `associated-node:` verbs.
    caller_node: Mutex<Option<String>>,
}

impl Shared {
    fn store(&self) -> MutexGuard<'_, Store> {
        // A panic while holding the lock poisons it; the data is still consistent
        // enough for a test double, so keep serving.
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running fake API server. Dropping it stops the server.
pub struct FakeApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeApiServer {
    /// Binds 127.0.0.1 on an ephemeral port and starts serving.
    pub async fn start(config: FakeApiConfig) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new()),
            log: Mutex::new(Vec::new()),
            gates: config.gates,
            faults: Mutex::new(Vec::new()),
            rbac: Mutex::new(None),
            caller_node: Mutex::new(None),
        });
        let s = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(handle(s, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(FakeApiServer { addr, shared, task })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client for this server.
    pub fn client(&self) -> Result<kube::Client, kube::Error> {
        let uri = self
            .url()
            .parse()
            .map_err(|e: http::uri::InvalidUri| kube::Error::Service(Box::new(e)))?;
        let config = kube::Config::new(uri);
        kube::Client::try_from(config)
    }

    /// A kubeconfig file's content pointing at this server (for child processes).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.url()
        )
    }

    pub fn gates(&self) -> &FeatureGates {
        &self.shared.gates
    }

    /// Seeds a Node object (cluster-scoped), as the kubelet would have registered it.
    pub fn add_node(&self, name: &str) -> Value {
        let mut st = self.shared.store();
        let uid = st.new_uid();
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": uid, "labels": {"kubernetes.io/hostname": name}},
            "spec": {}, "status": {}
        });
        st.put(key("nodes", None, name), node, "ADDED")
    }

    /// Seeds a Pod object.
    pub fn add_pod(&self, namespace: &str, pod: Value) -> Value {
        let mut st = self.shared.store();
        let mut pod = pod;
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or("pod")
            .to_string();
        let uid = st.new_uid();
        if let Some(meta) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.entry("uid").or_insert(json!(uid));
            meta.insert("namespace".into(), json!(namespace));
        }
        st.put(key("pods", Some(namespace), &name), pod, "ADDED")
    }

    /// From now on answers every `verb` on `resource` (e.g. `get`, `resourceclaims`)
    /// with `code` (an API Status with reason InternalError, Forbidden or
    /// ServiceUnavailable), to test a client's handling of a failing server.
    pub fn fail(&self, verb: &str, resource: &str, code: u16) {
        self.shared
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((verb.into(), resource.into(), code));
    }

    /// Forgets the failures injected with [`FakeApiServer::fail`]: the server answers
    /// normally again.
    pub fn clear_faults(&self) {
        self.shared
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// From now on authorizes every request as RBAC would for a caller granted exactly
    /// `rules` (`(apiGroup, resource[/subresource], verb)`, `*` a wildcard; e.g. from
    /// [`crate::rbac::allowed_by_cluster_role`]): anything else is answered 403
    /// Forbidden, and SelfSubjectAccessReviews are answered from the same rules.
    /// `/version` and creating SelfSubjectAccessReviews stay open to everyone, as the
    /// default `system:public-info-viewer` and `system:basic-user` roles keep them.
    pub fn enforce_rbac(&self, rules: Vec<(String, String, String)>) {
        *self.shared.rbac.lock().unwrap_or_else(|p| p.into_inner()) = Some(rules);
    }

    /// Makes every caller a service account of a pod on `node` (its token carries the
    /// node's name), as the plugin's DaemonSet pod is: `associated-node:` verbs then
    /// apply to claims allocated to `node`. Without it no caller is associated with a
    /// node. Only matters once [`FakeApiServer::enforce_rbac`] was called.
    pub fn set_caller_node(&self, node: &str) {
        *self
            .shared
            .caller_node
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(node.to_string());
    }

    /// Replaces a Node's `status` (e.g. `allocatable` or `nodeInfo`), as the kubelet
    /// would report it.
    pub fn set_node_status(&self, name: &str, status: Value) {
        let mut st = self.shared.store();
        let k = key("nodes", None, name);
        if let Some(mut node) = st.get(&k).cloned() {
            node["status"] = status;
            st.put(k, node, "MODIFIED");
        }
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared
            .log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Forgets the request log (to count the writes of one step).
    pub fn clear_requests(&self) {
        self.shared
            .log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Writes (create/update/patch/delete, excluding dry runs) since the last clear.
    pub fn write_count(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| {
                !r.dry_run
                    && matches!(
                        r.verb.as_str(),
                        "create" | "update" | "patch" | "delete" | "deletecollection"
                    )
            })
            .count()
    }

    /// The stored ResourceSlices, ordered by name.
    pub fn resource_slices(&self) -> Vec<ResourceSlice> {
        self.shared
            .store()
            .list("resourceslices", None)
            .into_iter()
            .filter_map(|v| serde_json::from_value(v.clone()).ok())
            .collect()
    }

    /// Deletes a ResourceSlice behind the plugin's back (as the kubelet does at start).
    pub fn delete_resource_slice(&self, name: &str) -> bool {
        self.shared
            .store()
            .remove(&key("resourceslices", None, name))
            .is_some()
    }
}

fn key(resource: &'static str, namespace: Option<&str>, name: &str) -> Key {
    Key {
        resource,
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
    }
}

/// What a URL path addresses.
struct Target {
    group: String,
    version: String,
    resource: &'static str,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

/// Resources the server knows: (group, version, plural, namespaced, kind).
const RESOURCES: &[(&str, &str, &str, bool, &str)] = &[
    ("", "v1", "nodes", false, "Node"),
    ("", "v1", "pods", true, "Pod"),
    ("", "v1", "events", true, "Event"),
    ("events.k8s.io", "v1", "events", true, "Event"),
    (
        "resource.k8s.io",
        "v1",
        "resourceslices",
        false,
        "ResourceSlice",
    ),
    (
        "resource.k8s.io",
        "v1",
        "resourceclaims",
        true,
        "ResourceClaim",
    ),
    (
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        false,
        "SelfSubjectAccessReview",
    ),
];

fn parse_target(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(s.to_string())),
        _ => return None,
    };
    let &(_, _, resource, namespaced, _) = RESOURCES
        .iter()
        .find(|(g, v, r, _, _)| *g == group && *v == version && *r == plural)?;
    if namespaced != namespace.is_some() && !(namespaced && name.is_none()) {
        return None;
    }
    Some(Target {
        group: group.into(),
        version: version.into(),
        resource,
        namespace,
        name,
        subresource: sub,
    })
}

fn kind_of(resource: &str) -> &'static str {
    RESOURCES
        .iter()
        .find(|r| r.2 == resource)
        .map(|r| r.4)
        .unwrap_or("Unknown")
}

/// Whether the target is events.k8s.io's view of Events.
fn is_events_v1(t: &Target) -> bool {
    t.resource == "events" && t.group == "events.k8s.io"
}

/// A stored object as the target's group shows it: Events are stored in the core/v1
/// shape and converted for events.k8s.io. Pure.
fn present(t: &Target, obj: Value) -> Value {
    if is_events_v1(t) {
        events::core_to_events_v1(obj)
    } else {
        obj
    }
}

fn query_map(query: &str) -> BTreeMap<String, String> {
    form_urlencoded_parse(query)
}

/// Minimal `application/x-www-form-urlencoded` decoding.
fn form_urlencoded_parse(q: &str) -> BTreeMap<String, String> {
    fn dec(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < b.len() => {
                    let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                    match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                        Some(v) => {
                            out.push(v);
                            i += 2;
                        }
                        None => out.push(b'%'),
                    }
                }
                c => out.push(c),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (dec(k), dec(v)),
            None => (dec(p), String::new()),
        })
        .collect()
}

fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

/// A `Status` failure body as the API server sends it.
fn status(
    code: StatusCode,
    reason: &str,
    message: String,
    details: Option<Value>,
) -> Response<Body> {
    let mut v = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16()
    });
    if let Some(d) = details {
        v["details"] = d;
    }
    json_response(code, &v)
}

fn not_found(t: &Target, name: &str) -> Response<Body> {
    let gr = if t.group.is_empty() {
        t.resource.to_string()
    } else {
        format!("{}.{}", t.resource, t.group)
    };
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{gr} \"{name}\" not found"),
        Some(json!({"name": name, "group": t.group, "kind": t.resource})),
    )
}

fn invalid(t: &Target, name: &str, errs: &[validation::FieldError]) -> Response<Body> {
    let kind = kind_of(t.resource);
    let gk = if t.group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{}", t.group)
    };
    let msgs: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
    let joined = if msgs.len() == 1 {
        msgs[0].clone()
    } else {
        format!("[{}]", msgs.join(", "))
    };
    let causes: Vec<Value> = errs
        .iter()
        .map(|e| {
            let full = e.to_string();
            let msg = full
                .strip_prefix(&format!("{}: ", e.field))
                .unwrap_or(&full)
                .to_string();
            json!({"reason": e.reason(), "message": msg, "field": e.field})
        })
        .collect();
    status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("{gk} \"{name}\" is invalid: {joined}"),
        Some(json!({"name": name, "group": t.group, "kind": kind, "causes": causes})),
    )
}

fn bad_request(msg: String) -> Response<Body> {
    status(StatusCode::BAD_REQUEST, "BadRequest", msg, None)
}

/// The response of a failure injected with [`FakeApiServer::fail`], if one matches.
/// Whether the RBAC rules (if enforced) allow `verb` on `group`/`resource`
/// (`resource/subresource` for a subresource). Deterministic.
fn rbac_allows(shared: &Shared, group: &str, resource: &str, verb: &str) -> bool {
    let rules = shared.rbac.lock().unwrap_or_else(|p| p.into_inner());
    let Some(rules) = rules.as_ref() else {
        return true;
    };
    let m = |rule: &str, want: &str| rule == "*" || rule == want;
    rules
        .iter()
        .any(|(g, r, v)| m(g, group) && m(r, resource) && m(v, verb))
}

/// The API server's 403 for a request RBAC does not allow, worded as it words it.
fn forbidden(shared: &Shared, t: &Target, verb: &str) -> Option<Response<Body>> {
    let res = match &t.subresource {
        Some(s) => format!("{}/{s}", t.resource),
        None => t.resource.to_string(),
    };
    if rbac_allows(shared, &t.group, &res, verb) {
        return None;
    }
    let gr = if t.group.is_empty() {
        t.resource.to_string()
    } else {
        format!("{}.{}", t.resource, t.group)
    };
    let named = t
        .name
        .as_ref()
        .map_or(String::new(), |n| format!(" \"{n}\""));
    let scope = match &t.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".into(),
    };
    Some(status(
        StatusCode::FORBIDDEN,
        "Forbidden",
        format!(
            "{gr}{named} is forbidden: User \"system:serviceaccount:tessera-system:tessera-plugin\" cannot {verb} resource \"{res}\" in API group \"{}\" {scope}",
            t.group
        ),
        Some(
            json!({"name": t.name.clone().unwrap_or_default(), "group": t.group, "kind": t.resource}),
        ),
    ))
}

/// Answers a SelfSubjectAccessReview from the RBAC rules: `status.allowed` for its
/// resource attributes (non-resource attributes are not modelled: denied with an
/// evaluation error). Nothing is stored.
fn access_review(shared: &Shared, body: &Bytes) -> Response<Body> {
    let mut review: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("the body of the request could not be decoded: {e}")),
    };
    let attrs = &review["spec"]["resourceAttributes"];
    let status_v = if attrs.is_object() {
        let s = |k: &str| attrs[k].as_str().unwrap_or("").to_string();
        let mut resource = s("resource");
        if !s("subresource").is_empty() {
            resource = format!("{resource}/{}", s("subresource"));
        }
        if s("verb").is_empty() || resource.is_empty() {
            return invalid_review("spec.resourceAttributes: verb and resource are required");
        }
        if rbac_allows(shared, &s("group"), &resource, &s("verb")) {
            json!({"allowed": true, "reason": "allowed by the fake API server's rules"})
        } else {
            json!({"allowed": false})
        }
    } else if review["spec"]["nonResourceAttributes"].is_object() {
        json!({"allowed": false, "evaluationError": "non-resource attributes are not modelled by the fake API server"})
    } else {
        return invalid_review(
            "spec: exactly one of resourceAttributes or nonResourceAttributes is required",
        );
    };
    review["status"] = status_v;
    review["metadata"] = json!({"creationTimestamp": null});
    json_response(StatusCode::CREATED, &review)
}

fn invalid_review(message: &str) -> Response<Body> {
    status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid: {message}"),
        None,
    )
}

fn injected_fault(shared: &Shared, verb: &str, resource: &str) -> Option<Response<Body>> {
    let faults = shared.faults.lock().unwrap_or_else(|p| p.into_inner());
    let &(_, _, code) = faults.iter().find(|(v, r, _)| v == verb && r == resource)?;
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let reason = match code {
        StatusCode::FORBIDDEN => "Forbidden",
        StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
        _ => "InternalError",
    };
    Some(status(
        code,
        reason,
        format!("injected failure of {verb} {resource}"),
        None,
    ))
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return bad_request(format!("cannot read body: {e}")),
    };
    let q = query_map(&query);
    let target = parse_target(&path);
    let watch = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    let dry_run = q.get("dryRun").is_some_and(|v| v == "All");
    let verb = match (&method, target.as_ref().and_then(|t| t.name.as_ref())) {
        (&Method::GET, Some(_)) => "get",
        (&Method::GET, None) if watch => "watch",
        (&Method::GET, None) => "list",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, Some(_)) => "delete",
        (&Method::DELETE, None) => "deletecollection",
        _ => "unknown",
    };
    let response = match &target {
        _ if path == "/version" => json_response(
            StatusCode::OK,
            &json!({
                "major": "1",
                "minor": shared.gates.version().minor().to_string(),
                "gitVersion": shared.gates.version().git_version(),
                "platform": "linux/amd64"
            }),
        ),
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource".into(),
            None,
        ),
        Some(t) if t.resource == "selfsubjectaccessreviews" => {
            match injected_fault(&shared, verb, t.resource) {
                Some(r) => r,
                None if verb == "create" => access_review(&shared, &body),
                None => status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    format!(
                        "the server does not allow this method on the requested resource ({verb} selfsubjectaccessreviews)"
                    ),
                    None,
                ),
            }
        }
        Some(t) => match injected_fault(&shared, verb, t.resource) {
            Some(r) => r,
            None => match forbidden(&shared, t, verb) {
                Some(r) => r,
                None => route(&shared, t, verb, &q, &body, &content_type, dry_run).await,
            },
        },
    };
    let record = RequestRecord {
        method: method.to_string(),
        path: path.clone(),
        query,
        verb: verb.into(),
        group: target.as_ref().map(|t| t.group.clone()).unwrap_or_default(),
        resource: target
            .as_ref()
            .map(|t| t.resource.to_string())
            .unwrap_or(path),
        subresource: target.as_ref().and_then(|t| t.subresource.clone()),
        namespace: target.as_ref().and_then(|t| t.namespace.clone()),
        name: target.as_ref().and_then(|t| t.name.clone()),
        dry_run,
        status: response.status().as_u16(),
    };
    tracing::debug!(verb = %record.verb, path = %record.path, status = record.status, "fake api request");
    shared
        .log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(record);
    response
}

async fn route(
    shared: &Arc<Shared>,
    t: &Target,
    verb: &str,
    q: &BTreeMap<String, String>,
    body: &Bytes,
    content_type: &str,
    dry_run: bool,
) -> Response<Body> {
    let writable = matches!(
        (t.resource, t.subresource.as_deref()),
        ("resourceslices", None)
            | ("resourceclaims", None)
            | ("resourceclaims", Some("status"))
            | ("events", None)
    );
    match verb {
        "get" => get(shared, t),
        "list" => list(shared, t, q),
        "watch" => watch(shared, t, q),
        "create" if writable && t.name.is_none() => create(shared, t, body, dry_run),
        "update" if writable => update(shared, t, body, dry_run),
        "patch" if is_events_v1(t) && t.subresource.is_none() => {
            patch(shared, t, body, content_type, dry_run)
        }
        "delete" if writable && t.resource != "events" => delete(shared, t, body, dry_run),
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({verb} {})",
                t.resource
            ),
            None,
        ),
    }
}

fn get(shared: &Arc<Shared>, t: &Target) -> Response<Body> {
    let name = t.name.as_deref().unwrap_or_default();
    let st = shared.store();
    match st.get(&key(t.resource, t.namespace.as_deref(), name)) {
        Some(obj) => json_response(StatusCode::OK, &present(t, obj.clone())),
        None => not_found(t, name),
    }
}

fn selectors(
    q: &BTreeMap<String, String>,
) -> Result<(LabelSelector, FieldSelector), Response<Body>> {
    let labels = LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
        .map_err(|e| bad_request(format!("unable to parse requirement: {e}")))?;
    let fields = FieldSelector::parse(q.get("fieldSelector").map(String::as_str).unwrap_or(""))
        .map_err(|e| bad_request(format!("invalid field selector: {e}")))?;
    Ok((labels, fields))
}

fn check_field_selector(
    t: &Target,
    fields: &FieldSelector,
    version: KubeVersion,
) -> Result<(), Response<Body>> {
    let mut allowed = vec!["metadata.name", "metadata.namespace"];
    match t.resource {
        "resourceslices" => {
            allowed.extend(["spec.nodeName", "spec.driver"]);
            if version.minor() >= 37 {
                allowed.push("spec.pool.name");
            }
        }
        "pods" => allowed.extend(["spec.nodeName", "status.phase"]),
        _ => {}
    }
    for f in fields.keys() {
        if !allowed.contains(&f.as_str()) {
            return Err(bad_request(format!("field label not supported: {f}")));
        }
    }
    Ok(())
}

fn list(shared: &Arc<Shared>, t: &Target, q: &BTreeMap<String, String>) -> Response<Body> {
    let (labels, fields) = match selectors(q) {
        Ok(s) => s,
        Err(r) => return r,
    };
    if let Err(r) = check_field_selector(t, &fields, shared.gates.version()) {
        return r;
    }
    let st = shared.store();
    let items: Vec<Value> = st
        .list(t.resource, t.namespace.as_deref())
        .into_iter()
        .filter(|o| labels.matches(o) && fields.matches(o))
        .map(|o| present(t, o.clone()))
        .collect();
    let kind = format!("{}List", kind_of(t.resource));
    let api_version = if t.group.is_empty() {
        t.version.clone()
    } else {
        format!("{}/{}", t.group, t.version)
    };
    json_response(
        StatusCode::OK,
        &json!({
            "kind": kind, "apiVersion": api_version,
            "metadata": {"resourceVersion": st.current_rv().to_string()},
            "items": items
        }),
    )
}

fn watch(shared: &Arc<Shared>, t: &Target, q: &BTreeMap<String, String>) -> Response<Body> {
    let (labels, fields) = match selectors(q) {
        Ok(s) => s,
        Err(r) => return r,
    };
    if let Err(r) = check_field_selector(t, &fields, shared.gates.version()) {
        return r;
    }
    let rv: Option<u64> = q
        .get("resourceVersion")
        .filter(|v| !v.is_empty() && v.as_str() != "0")
        .and_then(|v| v.parse().ok());
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1800);
    let resource = t.resource;
    let namespace = t.namespace.clone();
    let events_v1 = is_events_v1(t);
    let (backlog, mut rx) = {
        let st = shared.store();
        let backlog: Vec<WatchEvent> = match rv {
            Some(rv) => match st.events_since(rv) {
                Some(b) => b,
                None => {
                    return status(
                        StatusCode::GONE,
                        "Expired",
                        format!("too old resource version: {rv} ({})", st.current_rv()),
                        None,
                    );
                }
            },
            // No resourceVersion: synthetic ADDED events for the current state.
            None => st
                .list(resource, namespace.as_deref())
                .into_iter()
                .map(|o| WatchEvent {
                    resource,
                    namespace: namespace.clone(),
                    kind: "ADDED",
                    object: o.clone(),
                    resource_version: st.current_rv(),
                })
                .collect(),
        };
        (backlog, st.subscribe())
    };
    let (tx, out) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    let wanted = move |e: &WatchEvent| {
        e.resource == resource
            && namespace
                .as_ref()
                .is_none_or(|ns| e.namespace.as_ref() == Some(ns))
            && labels.matches(&e.object)
            && fields.matches(&e.object)
    };
    tokio::spawn(async move {
        let line = |e: &WatchEvent| {
            let object = if events_v1 {
                events::core_to_events_v1(e.object.clone())
            } else {
                e.object.clone()
            };
            let mut v =
                serde_json::to_vec(&json!({"type": e.kind, "object": object})).unwrap_or_default();
            v.push(b'\n');
            Ok(Frame::data(Bytes::from(v)))
        };
        for e in backlog.iter().filter(|e| wanted(e)) {
            if tx.send(line(e)).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                ev = rx.recv() => match ev {
                    Ok(e) if wanted(&e) => {
                        if tx.send(line(&e)).await.is_err() { return; }
                    }
                    Ok(_) => {}
                    // Lagged or closed: end the watch; the client re-lists.
                    Err(_) => return,
                }
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(out);
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

/// Admission for typed resources: drop disabled fields, validate. Returns the object
/// to store, or the error response.
fn admit(
    shared: &Arc<Shared>,
    t: &Target,
    name: &str,
    obj: Value,
    old: Option<&Value>,
) -> Result<Value, Response<Body>> {
    let gates = &shared.gates;
    let decode_err = |e: serde_json::Error| {
        bad_request(format!("the body of the request could not be decoded: {e}"))
    };
    match (t.resource, t.subresource.as_deref()) {
        ("resourceslices", None) => {
            let mut slice: ResourceSlice = serde_json::from_value(obj).map_err(decode_err)?;
            validation::drop_disabled_fields(&mut slice, gates);
            let mut errs = validation::validate_resource_slice(&slice, gates);
            if let Some(old) =
                old.and_then(|o| serde_json::from_value::<ResourceSlice>(o.clone()).ok())
            {
                errs.extend(slice_immutable_fields(&old, &slice));
            }
            if !errs.is_empty() {
                return Err(invalid(t, name, &errs));
            }
            serde_json::to_value(&slice).map_err(|e| bad_request(e.to_string()))
        }
        ("resourceclaims", None) => {
            let mut claim: ResourceClaim = serde_json::from_value(obj).map_err(decode_err)?;
            validation::drop_disabled_claim_fields(&mut claim, gates);
            let mut errs = validation::validate_resource_claim(&claim, gates);
            if let Some(old) =
                old.and_then(|o| serde_json::from_value::<ResourceClaim>(o.clone()).ok())
            {
                // The spec is immutable, and the main resource cannot change status.
                if old.spec != claim.spec {
                    errs.push(validation::FieldError::invalid_immutable("spec"));
                }
                claim.status = old.status.clone();
            } else {
                claim.status = None;
            }
            if !errs.is_empty() {
                return Err(invalid(t, name, &errs));
            }
            serde_json::to_value(&claim).map_err(|e| bad_request(e.to_string()))
        }
        ("resourceclaims", Some("status")) => {
            let new: ResourceClaim = serde_json::from_value(obj).map_err(decode_err)?;
            let Some(old_v) = old else {
                return Err(not_found(t, name));
            };
            let old: ResourceClaim = serde_json::from_value(old_v.clone()).map_err(decode_err)?;
            let mut errs = device_status_authorization(shared, &new, &old);
            errs.extend(validation::validate_resource_claim_status(&new, &old));
            if !errs.is_empty() {
                return Err(invalid(t, name, &errs));
            }
            // Only status changes through this subresource.
            let mut stored = old;
            stored.status = new.status;
            stored.metadata.resource_version = new.metadata.resource_version;
            serde_json::to_value(&stored).map_err(|e| bad_request(e.to_string()))
        }
        ("events", None) if t.group.is_empty() => {
            let ev: k8s_openapi::api::core::v1::Event =
                serde_json::from_value(obj.clone()).map_err(decode_err)?;
            let msgs = events::path_segment_name_errors(name);
            if !msgs.is_empty() {
                return Err(bad_request(format!(
                    "Name parameter invalid: {name:?}: {}",
                    msgs.join(";")
                )));
            }
            let errs = events::validate_event(&ev);
            if !errs.is_empty() {
                return Err(invalid(t, name, &errs));
            }
            Ok(obj)
        }
        ("events", None) => {
            // events.k8s.io/v1: validated in its own shape, stored in core/v1's.
            let msgs = events::path_segment_name_errors(name);
            if !msgs.is_empty() {
                return Err(bad_request(format!(
                    "Name parameter invalid: {name:?}: {}",
                    msgs.join(";")
                )));
            }
            let ev: EventV1 = serde_json::from_value(obj.clone()).map_err(decode_err)?;
            let errs = match old {
                None => events::validate_events_v1_create(&ev),
                Some(old) => {
                    let old: EventV1 =
                        serde_json::from_value(events::core_to_events_v1(old.clone()))
                            .map_err(decode_err)?;
                    events::validate_events_v1_update(&ev, &old)
                }
            };
            if !errs.is_empty() {
                return Err(invalid(t, name, &errs));
            }
            Ok(events::events_v1_to_core(obj))
        }
        _ => Ok(obj),
    }
}

/// The API server's check of a status update that changes `status.devices` when
/// DRAResourceClaimGranularStatusAuthorization is on (`AuthorizedForDeviceStatus`):
/// for each driver whose entries change, the caller needs the `resourceclaims/driver`
/// subresource with verb `associated-node:update` (its token is bound to the node the
/// claim is allocated to) or `arbitrary-node:update`. A `Forbidden` field error per
/// driver without it (a 422, as the real server answers). Resource names are not
/// modelled: a rule allows every driver. Deterministic.
fn device_status_authorization(
    shared: &Shared,
    new: &ResourceClaim,
    old: &ResourceClaim,
) -> Vec<validation::FieldError> {
    let gates = &shared.gates;
    let allocated = new.status.as_ref().is_some_and(|s| s.allocation.is_some());
    if !gates.enabled("DRAResourceClaimGranularStatusAuthorization")
        || !gates.enabled("DRAResourceClaimDeviceStatus")
        || !allocated
    {
        return Vec::new();
    }
    let caller = shared
        .caller_node
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let associated = caller.is_some() && caller == validation::allocated_node(new);
    let mut verbs = vec!["arbitrary-node:update"];
    if associated {
        verbs.insert(0, "associated-node:update");
    }
    validation::device_status_drivers_changed(new, old)
        .into_iter()
        .filter(|_| {
            !verbs
                .iter()
                .any(|v| rbac_allows(shared, "resource.k8s.io", "resourceclaims/driver", v))
        })
        .map(|_| {
            validation::FieldError::forbidden(
                "status.devices",
                format!(
                    "changing status.devices requires resource=\"resourceclaims/driver\", verb=\"[{}]\" permission",
                    verbs.join(" ")
                ),
            )
        })
        .collect()
}

fn slice_immutable_fields(old: &ResourceSlice, new: &ResourceSlice) -> Vec<validation::FieldError> {
    let mut errs = Vec::new();
    if old.spec.driver != new.spec.driver {
        errs.push(validation::FieldError::invalid_immutable("spec.driver"));
    }
    if old.spec.pool.name != new.spec.pool.name {
        errs.push(validation::FieldError::invalid_immutable("spec.pool.name"));
    }
    if old.spec.node_name != new.spec.node_name {
        errs.push(validation::FieldError::invalid_immutable("spec.nodeName"));
    }
    errs
}

/// Characters the API server uses for `generateName` suffixes.
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn create(shared: &Arc<Shared>, t: &Target, body: &Bytes, dry_run: bool) -> Response<Body> {
    let mut obj: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("the body of the request could not be decoded: {e}")),
    };
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    let mut st = shared.store();
    let name = match obj["metadata"]["name"].as_str().filter(|s| !s.is_empty()) {
        Some(n) => n.to_string(),
        None => match obj["metadata"]["generateName"]
            .as_str()
            .filter(|s| !s.is_empty())
        {
            Some(prefix) => {
                // Retry on collision like the real server would.
                let mut name;
                loop {
                    let suffix: String = (0..5)
                        .map(|_| NAME_ALPHABET[fastrand::usize(..NAME_ALPHABET.len())] as char)
                        .collect();
                    name = format!("{prefix}{suffix}");
                    if !st.contains(&key(t.resource, t.namespace.as_deref(), &name)) {
                        break;
                    }
                }
                name
            }
            None => {
                return invalid(
                    t,
                    "",
                    &[validation::FieldError::required(
                        "metadata.name",
                        "name or generateName is required",
                    )],
                );
            }
        },
    };
    obj["metadata"]["name"] = json!(name);
    if let Some(ns) = &t.namespace {
        obj["metadata"]["namespace"] = json!(ns);
    }
    let k = key(t.resource, t.namespace.as_deref(), &name);
    if st.contains(&k) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{}.{} \"{name}\" already exists", t.resource, t.group),
            Some(json!({"name": name, "group": t.group, "kind": t.resource})),
        );
    }
    let mut obj = match admit(shared, t, &name, obj, None) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let uid = st.new_uid();
    let meta = &mut obj["metadata"];
    meta["uid"] = json!(uid);
    meta["creationTimestamp"] = json!(now_rfc3339());
    meta["generation"] = json!(1);
    if dry_run {
        meta["resourceVersion"] = json!("");
        return json_response(StatusCode::CREATED, &present(t, obj));
    }
    let stored = st.put(k, obj, "ADDED");
    json_response(StatusCode::CREATED, &present(t, stored))
}

fn update(shared: &Arc<Shared>, t: &Target, body: &Bytes, dry_run: bool) -> Response<Body> {
    let obj: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("the body of the request could not be decoded: {e}")),
    };
    replace(shared, &mut shared.store(), t, obj, dry_run)
}

/// A merge PATCH (the only format served): the stored object as the target's group
/// shows it, with `body` merged in, then replaced as by an update (validation,
/// resourceVersion precondition if the patch sets one).
fn patch(
    shared: &Arc<Shared>,
    t: &Target,
    body: &Bytes,
    content_type: &str,
    dry_run: bool,
) -> Response<Body> {
    let name = t.name.clone().unwrap_or_default();
    // Parameters such as `; charset=utf-8` do not change the format.
    let media_type = content_type.split(';').next().unwrap_or("").trim();
    if media_type != patch::MERGE_PATCH {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {} (the fake API server's only patch format)",
                patch::MERGE_PATCH
            ),
            None,
        );
    }
    let body: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("the body of the request could not be decoded: {e}")),
    };
    let mut st = shared.store();
    let Some(old) = st
        .get(&key(t.resource, t.namespace.as_deref(), &name))
        .cloned()
    else {
        return not_found(t, &name);
    };
    let merged = patch::merge_patch(present(t, old), &body);
    replace(shared, &mut st, t, merged, dry_run)
}

/// Replaces the object the target names with `obj` (in the target group's shape), as
/// an update does: 400 on a name other than the URL's, 404, 409 on a stale
/// resourceVersion, 422 from admission.
fn replace(
    shared: &Arc<Shared>,
    st: &mut Store,
    t: &Target,
    obj: Value,
    dry_run: bool,
) -> Response<Body> {
    let name = t.name.clone().unwrap_or_default();
    if obj["metadata"]["name"].as_str() != Some(name.as_str()) {
        return bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            obj["metadata"]["name"].as_str().unwrap_or("")
        ));
    }
    let k = key(t.resource, t.namespace.as_deref(), &name);
    let Some(old) = st.get(&k).cloned() else {
        return not_found(t, &name);
    };
    let sent_rv = obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .to_string();
    if !sent_rv.is_empty() && Some(sent_rv.as_str()) != old["metadata"]["resourceVersion"].as_str()
    {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {}.{} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                t.resource, t.group
            ),
            Some(json!({"name": name, "group": t.group, "kind": t.resource})),
        );
    }
    let mut obj = match admit(shared, t, &name, obj, Some(&old)) {
        Ok(o) => o,
        Err(r) => return r,
    };
    // Server-owned metadata is kept from the stored object.
    for f in ["uid", "creationTimestamp"] {
        obj["metadata"][f] = old["metadata"][f].clone();
    }
    if let Some(ns) = &t.namespace {
        obj["metadata"]["namespace"] = json!(ns);
    }
    let spec_changed = old.get("spec") != obj.get("spec");
    let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
    obj["metadata"]["generation"] = json!(if spec_changed {
        generation + 1
    } else {
        generation
    });
    if dry_run {
        return json_response(StatusCode::OK, &present(t, obj));
    }
    let stored = st.put(k, obj, "MODIFIED");
    json_response(StatusCode::OK, &present(t, stored))
}

fn delete(shared: &Arc<Shared>, t: &Target, body: &Bytes, dry_run: bool) -> Response<Body> {
    let name = t.name.clone().unwrap_or_default();
    let mut st = shared.store();
    let k = key(t.resource, t.namespace.as_deref(), &name);
    let Some(old) = st.get(&k).cloned() else {
        return not_found(t, &name);
    };
    let opts: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let pre = &opts["preconditions"];
    let conflict = |what: &str, want: &str, have: &str| {
        status(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {}.{} \"{name}\": Precondition failed: {what}: {want}, {what} in object meta: {have}",
                t.resource, t.group
            ),
            Some(json!({"name": name, "group": t.group, "kind": t.resource})),
        )
    };
    if let Some(uid) = pre["uid"].as_str() {
        let have = old["metadata"]["uid"].as_str().unwrap_or("");
        if uid != have {
            return conflict("UID", uid, have);
        }
    }
    if let Some(rv) = pre["resourceVersion"].as_str() {
        let have = old["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if rv != have {
            return conflict("ResourceVersion", rv, have);
        }
    }
    if dry_run {
        return json_response(StatusCode::OK, &old);
    }
    match st.remove(&k) {
        Some(o) => json_response(StatusCode::OK, &o),
        None => not_found(t, &name),
    }
}

fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Civil-from-days (Howard Hinnant), UTC.
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}
