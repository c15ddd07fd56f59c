//! What users apply, proved without a cluster: every kustomize overlay renders and
//! survives a round trip through its k8s-openapi type (no field is silently lost),
//! the admission policies' CEL decides as intended (evaluated by Tessera's CEL engine
//! with the admission variables), and every example is allocated by `tessera plan`
//! to exactly the devices its comment promises.

use testkit::e2e;

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_model::release::{FeatureGates, KubeVersion};
use k8s_model::schedule::{self, Outcome};
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use serde_json::{Value, json};
use testkit::admission::{AdmissionPolicy, Decision};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `deploy/base` and every overlay.
fn kustomizations() -> Vec<PathBuf> {
    let mut v = vec![root().join("deploy/base")];
    let mut overlays: Vec<PathBuf> = std::fs::read_dir(root().join("deploy/overlays"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    overlays.sort();
    v.extend(overlays);
    v
}

fn kustomize(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    schedule::documents(
        &String::from_utf8_lossy(&out.stdout),
        &dir.display().to_string(),
    )
    .unwrap()
}

fn kubectl_available() -> bool {
    if Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return true;
    }
    assert!(
        !e2e::in_ci(),
        "kubectl is missing (CI=true: a missing prerequisite is a failure)"
    );
    eprintln!("SKIPPED: kubectl is missing");
    false
}

/// Deserializes into `T` and serializes back; the result must equal the input.
fn round_trip_as<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) -> Value {
    let typed: T = serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{} {}: {e}", v["kind"], v["metadata"]["name"]));
    serde_json::to_value(typed).unwrap()
}

fn round_trip(v: &Value) -> Value {
    use k8s_openapi::api::{admissionregistration, apps, core, rbac, resource};
    match v["kind"].as_str().unwrap_or_default() {
        "Namespace" => round_trip_as::<core::v1::Namespace>(v),
        "ServiceAccount" => round_trip_as::<core::v1::ServiceAccount>(v),
        "ConfigMap" => round_trip_as::<core::v1::ConfigMap>(v),
        "Pod" => round_trip_as::<core::v1::Pod>(v),
        "ClusterRole" => round_trip_as::<rbac::v1::ClusterRole>(v),
        "ClusterRoleBinding" => round_trip_as::<rbac::v1::ClusterRoleBinding>(v),
        "DaemonSet" => round_trip_as::<apps::v1::DaemonSet>(v),
        "Deployment" => round_trip_as::<apps::v1::Deployment>(v),
        "DeviceClass" => round_trip_as::<resource::v1::DeviceClass>(v),
        "ResourceClaimTemplate" => round_trip_as::<resource::v1::ResourceClaimTemplate>(v),
        "ValidatingAdmissionPolicy" => {
            round_trip_as::<admissionregistration::v1::ValidatingAdmissionPolicy>(v)
        }
        "ValidatingAdmissionPolicyBinding" => {
            round_trip_as::<admissionregistration::v1::ValidatingAdmissionPolicyBinding>(v)
        }
        other => panic!("no typed round trip for kind {other}"),
    }
}

/// Every overlay renders, and every object keeps every field through its typed form
/// (k8s-openapi ignores unknown fields, so a typo like `hostPid` would vanish here).
#[test]
fn every_overlay_renders_and_keeps_every_field() {
    if !kubectl_available() {
        return;
    }
    let mut objects = 0;
    for dir in kustomizations() {
        let docs = kustomize(&dir);
        assert!(
            docs.len() >= 14,
            "{}: {} objects",
            dir.display(),
            docs.len()
        );
        for d in &docs {
            assert_eq!(
                &round_trip(d),
                d,
                "{}: {} {}",
                dir.display(),
                d["kind"],
                d["metadata"]["name"]
            );
            objects += 1;
        }
    }
    eprintln!("objects round-tripped: {objects}");
}

/// `deploy/monitoring` renders the Grafana dashboard as one ConfigMap in Tessera's
/// namespace, labelled for Grafana's sidecar, that round-trips and carries the
/// dashboard file byte for byte (a JSON document with panels).
#[test]
fn the_monitoring_kustomization_ships_the_dashboard() {
    if !kubectl_available() {
        return;
    }
    let docs = kustomize(&root().join("deploy/monitoring"));
    assert_eq!(docs.len(), 1, "{docs:?}");
    let cm = &docs[0];
    assert_eq!(round_trip(cm), *cm);
    assert_eq!(cm["kind"], "ConfigMap");
    assert_eq!(cm["metadata"]["name"], "tessera-grafana-dashboard");
    assert_eq!(cm["metadata"]["namespace"], "tessera-system");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let file =
        std::fs::read_to_string(root().join("deploy/monitoring/tessera-dashboard.json")).unwrap();
    let shipped = cm["data"]["tessera-dashboard.json"].as_str().unwrap();
    assert_eq!(shipped, file);
    let dash: Value = serde_json::from_str(shipped).unwrap();
    assert!(dash["panels"].as_array().is_some_and(|p| !p.is_empty()));
}

/// The plugin's pods carry the scrape annotations, naming the container's metrics
/// port, which is the `--metrics-addr` default (the DaemonSet does not set it).
#[test]
fn the_plugin_pods_ask_prometheus_to_scrape_them() {
    if !kubectl_available() {
        return;
    }
    let docs = kustomize(&root().join("deploy/base"));
    let ds = find(&docs, "DaemonSet", "tessera-plugin");
    let a = &ds["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(a["prometheus.io/scrape"], "true");
    assert_eq!(a["prometheus.io/path"], "/metrics");
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let port = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a metrics port")["containerPort"]
        .as_u64()
        .unwrap();
    assert_eq!(a["prometheus.io/port"], port.to_string());
    assert_eq!(port, 9464, "the --metrics-addr default");
    assert!(
        !c["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a.as_str().unwrap_or_default().starts_with("--metrics-addr")),
        "a --metrics-addr here must move the annotation too"
    );
}

/// The examples' objects round-trip too.
#[test]
fn every_example_object_keeps_every_field() {
    for f in examples() {
        let text = std::fs::read_to_string(&f).unwrap();
        for d in schedule::documents(&text, &f.display().to_string()).unwrap() {
            assert_eq!(round_trip(&d), d, "{}: {}", f.display(), d["kind"]);
        }
    }
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The slice policy names the DaemonSet's own ServiceAccount, in its namespace, in
/// every overlay (the NVIDIA chart's policy names the wrong one); the binding and
/// the ClusterRoleBinding agree.
#[test]
fn the_slice_policy_names_the_plugins_service_account() {
    if !kubectl_available() {
        return;
    }
    for dir in kustomizations() {
        let docs = kustomize(&dir);
        let ds = find(&docs, "DaemonSet", "tessera-plugin");
        let ns = ds["metadata"]["namespace"].as_str().unwrap();
        let sa = ds["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap();
        let user = format!("system:serviceaccount:{ns}:{sa}");
        find(&docs, "ServiceAccount", sa);
        let crb = find(&docs, "ClusterRoleBinding", "tessera-plugin");
        assert_eq!(crb["subjects"][0]["name"], sa);
        assert_eq!(crb["subjects"][0]["namespace"], ns);
        let vap = find(
            &docs,
            "ValidatingAdmissionPolicy",
            "tessera-resourceslices-own-node",
        );
        let cond = vap["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap();
        assert!(
            cond.contains(&format!("\"{user}\"")),
            "{}: {cond}",
            dir.display()
        );
        let b = find(
            &docs,
            "ValidatingAdmissionPolicyBinding",
            "tessera-resourceslices-own-node",
        );
        assert_eq!(b["spec"]["policyName"], "tessera-resourceslices-own-node");
        assert_eq!(b["spec"]["validationActions"], json!(["Deny"]));
        assert_eq!(ds["spec"]["template"]["spec"]["hostPID"], true);
    }
}

fn policy(name: &str) -> AdmissionPolicy {
    let file = match name {
        "tessera-resourceslices-own-node" => "deploy/base/admission-resourceslices.yaml",
        "tessera-one-share-per-request" => "deploy/overlays/k8s-1.34/admission-shares.yaml",
        "tessera-tenant-pods" => "deploy/base/admission-tenant-pods.yaml",
        _ => "deploy/base/admission-gpuconfig.yaml",
    };
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    let doc = schedule::documents(&text, file)
        .unwrap()
        .into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .unwrap();
    let vap: ValidatingAdmissionPolicy = serde_json::from_value(doc).unwrap();
    assert_eq!(vap.metadata.name.as_deref(), Some(name));
    AdmissionPolicy::compile(&vap).unwrap()
}

const PLUGIN: &str = "system:serviceaccount:tessera-system:tessera-plugin";

fn slice(node: &str, driver: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("00000-{driver}-{node}-abcde")},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}
    })
}

fn request(op: &str, user: &str, node: Option<&str>, resource: &str) -> Value {
    let mut r = json!({
        "operation": op,
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": resource},
        "userInfo": {"username": user, "groups": ["system:serviceaccounts"]}
    });
    if let Some(n) = node {
        r["userInfo"]["extra"] = json!({"authentication.kubernetes.io/node-name": [n]});
    }
    r
}

/// An admission request for a pod (core group), from `user`.
fn pod_request(op: &str, user: &str) -> Value {
    let mut r = request(op, user, None, "pods");
    r["resource"] = json!({"group": "", "version": "v1", "resource": "pods"});
    r
}

/// The slice policy: the plugin writes only its own driver's slices of its own node,
/// on create, update (including a nodeName change either way) and delete (where
/// `object` is null); other users are not matched.
#[test]
fn slice_policy_keeps_the_plugin_on_its_own_node() {
    let p = policy("tessera-resourceslices-own-node");
    let own = slice("node-a", "gpu.tessera.dev");
    let other = slice("node-b", "gpu.tessera.dev");
    let foreign = slice("node-a", "other.example.com");
    let null = Value::Null;
    let rs = "resourceslices";
    let me = |op| request(op, PLUGIN, Some("node-a"), rs);
    use Expect::*;
    let cases: Vec<(&str, Decision, Expect)> = vec![
        ("create own", p.evaluate(&me("CREATE"), &own, &null), Allow),
        (
            "create on another node",
            p.evaluate(&me("CREATE"), &other, &null),
            Deny("its own node"),
        ),
        (
            "create of another driver",
            p.evaluate(&me("CREATE"), &foreign, &null),
            Deny("driver gpu.tessera.dev"),
        ),
        ("update own", p.evaluate(&me("UPDATE"), &own, &own), Allow),
        (
            "update moving another node's slice here",
            p.evaluate(&me("UPDATE"), &own, &other),
            Deny("nodeName"),
        ),
        (
            "update moving own slice away",
            p.evaluate(&me("UPDATE"), &other, &own),
            Deny("its own node"),
        ),
        ("delete own", p.evaluate(&me("DELETE"), &null, &own), Allow),
        (
            "delete another node's",
            p.evaluate(&me("DELETE"), &null, &other),
            Deny("its own node"),
        ),
        (
            "token without a node name",
            p.evaluate(&request("CREATE", PLUGIN, None, rs), &own, &null),
            Deny("no node name"),
        ),
        (
            "another user",
            p.evaluate(
                &request("CREATE", "kubernetes-admin", Some("node-b"), rs),
                &own,
                &null,
            ),
            Skip,
        ),
        (
            "a tessera-plugin account in another namespace",
            p.evaluate(
                &request(
                    "CREATE",
                    "system:serviceaccount:evil:tessera-plugin",
                    Some("node-b"),
                    rs,
                ),
                &own,
                &null,
            ),
            Skip,
        ),
    ];
    for (name, got, want) in cases {
        assert!(want.holds(&got), "{name}: want {want:?}, got {got:?}");
    }
}

/// The 1.34 share policy: a request (or subrequest) of class shared.tessera.dev takes
/// one device, as the API server defaults it or spelled out; several shares, `All`, or
/// a count on another class are decided as they should be, in claims and templates.
#[test]
fn share_policy_keeps_one_share_per_request_on_1_34() {
    let p = policy("tessera-one-share-per-request");
    let exactly = |class: &str, extra: Value| {
        let mut e = json!({"deviceClassName": class});
        e.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        e
    };
    let share =
        |extra: Value| json!({"name": "gpu", "exactly": exactly("shared.tessera.dev", extra)});
    let caps = json!({"capacity": {"requests": {"memory": "1Gi", "compute": "10"}}});
    use Expect::*;
    let cases: Vec<(&str, Vec<Value>, Expect)> = vec![
        ("one share", vec![share(json!({}))], Allow),
        (
            "one share, defaulted",
            vec![share(json!({"allocationMode": "ExactCount", "count": 1}))],
            Allow,
        ),
        ("with capacity", vec![share(caps.clone())], Allow),
        (
            "two requests, one share each",
            vec![
                share(caps.clone()),
                json!({"name": "b", "exactly": exactly("shared.tessera.dev", json!({}))}),
            ],
            Allow,
        ),
        (
            "two shares",
            vec![share(json!({"count": 2}))],
            Deny("one share"),
        ),
        (
            "all shared GPUs",
            vec![share(json!({"allocationMode": "All"}))],
            Deny("one share"),
        ),
        (
            "two whole GPUs",
            vec![
                json!({"name": "gpu", "exactly": exactly("gpu.tessera.dev", json!({"count": 2}))}),
            ],
            Allow,
        ),
        (
            "a subrequest for two shares",
            vec![json!({"name": "gpu", "firstAvailable": [
                {"name": "whole", "deviceClassName": "gpu.tessera.dev", "count": 2},
                {"name": "shares", "deviceClassName": "shared.tessera.dev", "count": 2}]})],
            Deny("subrequest"),
        ),
        (
            "a subrequest for one share",
            vec![json!({"name": "gpu", "firstAvailable": [
                {"name": "whole", "deviceClassName": "gpu.tessera.dev", "count": 2},
                {"name": "share", "deviceClassName": "shared.tessera.dev"}]})],
            Allow,
        ),
    ];
    for (name, requests, want) in cases {
        let devices = json!({"requests": requests});
        let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": devices}});
        let template = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "t", "namespace": "default"}, "spec": {"spec": {"devices": devices}}});
        for (resource, obj) in [
            ("resourceclaims", &claim),
            ("resourceclaimtemplates", &template),
        ] {
            let got = p.evaluate(
                &request("CREATE", "alice", None, resource),
                obj,
                &Value::Null,
            );
            assert!(
                want.holds(&got),
                "{name} ({resource}): want {want:?}, got {got:?}"
            );
        }
    }
}

/// A pod as the tenant-pods policy wants it: a claim, an init container and a container,
/// each dropping ALL, and seccomp RuntimeDefault on the pod.
fn hardened_pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "p", "namespace": "tenants"},
    "spec": {
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "share"}],
        "initContainers": [{"name": "init", "image": "i",
            "securityContext": {"capabilities": {"drop": ["ALL"]}}}],
        "containers": [{"name": "app", "image": "i", "resources": {"claims": [{"name": "gpu"}]},
            "securityContext": {"capabilities": {"drop": ["ALL"]}}}],
        "volumes": [{"name": "scratch", "emptyDir": {}}]
    }})
}

/// A tenant-pods case: its name, the change to a hardened pod, the decision wanted.
type PodCase = (&'static str, fn(&mut Value), Expect);

/// The app container's securityContext.
fn app_context(pod: &mut Value) -> &mut Value {
    &mut pod["spec"]["containers"][0]["securityContext"]
}

/// The tenant-pods policy: a pod that can leave the interception library's reach
/// (chroot, a user namespace, CAP_SYS_ADMIN) or reach the run directory (privileged, the
/// host's PID namespace, a hostPath volume) is refused, naming the container or volume;
/// every container kind counts; capabilities are read as spelled, and what a runtime
/// might read otherwise is refused. Which requests reach the policy (pods created,
/// ephemeral containers added, in labelled namespaces) is the API server's part: checked
/// here as written, and run by tests/cluster's rules scenario on the real server.
#[test]
fn tenant_pod_policy_refuses_what_escapes_the_budget() {
    let text =
        std::fs::read_to_string(root().join("deploy/base/admission-tenant-pods.yaml")).unwrap();
    let docs = schedule::documents(&text, "admission-tenant-pods.yaml").unwrap();
    let vap = find(&docs, "ValidatingAdmissionPolicy", "tessera-tenant-pods");
    assert_eq!(
        vap["spec"]["matchConstraints"]["resourceRules"],
        json!([
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                "resources": ["pods/ephemeralcontainers"]}
        ])
    );
    assert_eq!(vap["spec"]["failurePolicy"], "Fail");
    let binding = find(
        &docs,
        "ValidatingAdmissionPolicyBinding",
        "tessera-tenant-pods",
    );
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(
        binding["spec"]["matchResources"]["namespaceSelector"],
        json!({"matchLabels": {"gpu.tessera.dev/tenant-pods": "hardened"}})
    );
    let p = policy("tessera-tenant-pods");
    use Expect::*;
    let cases: Vec<PodCase> = vec![
        ("hardened", |_| {}, Allow),
        (
            "SYS_CHROOT dropped, seccomp Localhost on the container",
            |pod| {
                pod["spec"]["securityContext"] = json!({});
                for c in ["initContainers", "containers"] {
                    pod["spec"][c][0]["securityContext"] = json!({
                        "capabilities": {"drop": ["NET_RAW", "SYS_CHROOT"]},
                        "seccompProfile": {"type": "Localhost", "localhostProfile": "tenant.json"}});
                }
            },
            Allow,
        ),
        (
            "a baseline capability added back",
            |pod| app_context(pod)["capabilities"]["add"] = json!(["NET_BIND_SERVICE", "CHOWN"]),
            Allow,
        ),
        (
            "no securityContext",
            |pod| {
                pod["spec"]["containers"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("securityContext");
            },
            Deny("container app: securityContext.capabilities.drop must have ALL or SYS_CHROOT"),
        ),
        (
            "the init container keeps SYS_CHROOT",
            |pod| {
                pod["spec"]["initContainers"][0]["securityContext"]["capabilities"]["drop"] =
                    json!(["NET_RAW"])
            },
            Deny("container init: securityContext.capabilities.drop"),
        ),
        (
            "ALL spelled in lower case",
            |pod| app_context(pod)["capabilities"]["drop"] = json!(["all"]),
            Deny("container app: securityContext.capabilities.drop"),
        ),
        (
            "CAP_SYS_CHROOT dropped (not a spelling every runtime reads)",
            |pod| app_context(pod)["capabilities"]["drop"] = json!(["CAP_SYS_CHROOT"]),
            Deny("container app: securityContext.capabilities.drop"),
        ),
        (
            "SYS_CHROOT added back after ALL",
            |pod| app_context(pod)["capabilities"]["add"] = json!(["SYS_CHROOT"]),
            Deny("container app: securityContext.capabilities.add may only have"),
        ),
        (
            "ALL added back",
            |pod| app_context(pod)["capabilities"]["add"] = json!(["ALL"]),
            Deny("container app: securityContext.capabilities.add"),
        ),
        (
            "seccomp Localhost on the pod",
            |pod| {
                pod["spec"]["securityContext"]["seccompProfile"] =
                    json!({"type": "Localhost", "localhostProfile": "tenant.json"})
            },
            Allow,
        ),
        (
            "SYS_ADMIN added",
            |pod| app_context(pod)["capabilities"]["add"] = json!(["SYS_ADMIN"]),
            Deny("container app: securityContext.capabilities.add"),
        ),
        (
            "sys_admin added, in lower case",
            |pod| app_context(pod)["capabilities"]["add"] = json!(["sys_admin"]),
            Deny("container app: securityContext.capabilities.add"),
        ),
        (
            "privileged",
            |pod| app_context(pod)["privileged"] = json!(true),
            Deny("container app: privileged"),
        ),
        (
            "privileged: false",
            |pod| app_context(pod)["privileged"] = json!(false),
            Allow,
        ),
        (
            "no seccomp profile",
            |pod| pod["spec"]["securityContext"] = json!({}),
            Deny("container app: seccompProfile.type must be RuntimeDefault or Localhost"),
        ),
        (
            "seccomp Unconfined on the pod",
            |pod| pod["spec"]["securityContext"]["seccompProfile"]["type"] = json!("Unconfined"),
            Deny("seccompProfile.type must be"),
        ),
        (
            "seccomp Unconfined on a container, RuntimeDefault on the pod",
            |pod| app_context(pod)["seccompProfile"] = json!({"type": "Unconfined"}),
            Deny("container app: seccompProfile.type must be"),
        ),
        (
            "seccomp Unconfined on the pod, RuntimeDefault on every container",
            |pod| {
                pod["spec"]["securityContext"]["seccompProfile"]["type"] = json!("Unconfined");
                for c in ["initContainers", "containers"] {
                    pod["spec"][c][0]["securityContext"]["seccompProfile"] =
                        json!({"type": "RuntimeDefault"});
                }
            },
            Allow,
        ),
        (
            "hostPID",
            |pod| pod["spec"]["hostPID"] = json!(true),
            Deny("hostPID"),
        ),
        (
            "hostPID: false",
            |pod| pod["spec"]["hostPID"] = json!(false),
            Allow,
        ),
        (
            "a hostPath volume",
            |pod| {
                pod["spec"]["volumes"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "run", "hostPath": {"path": "/run/tessera"}}))
            },
            Deny("volume run: hostPath volumes"),
        ),
        (
            "kubectl debug --profile=sysadmin (a privileged ephemeral container)",
            |pod| {
                pod["spec"]["ephemeralContainers"] = json!([{"name": "debugger", "image": "i",
                    "securityContext": {"privileged": true, "capabilities": {"drop": ["ALL"]}}}])
            },
            Deny("container debugger: privileged"),
        ),
        (
            "an ephemeral container that keeps SYS_CHROOT",
            |pod| pod["spec"]["ephemeralContainers"] = json!([{"name": "debugger", "image": "i"}]),
            Deny("container debugger: securityContext.capabilities.drop"),
        ),
    ];
    for (name, change, want) in cases {
        let mut pod = hardened_pod();
        change(&mut pod);
        let (op, subresource) = if pod["spec"]["ephemeralContainers"].is_null() {
            ("CREATE", "")
        } else {
            ("UPDATE", "ephemeralcontainers")
        };
        let mut req = pod_request(op, "alice");
        req["subResource"] = json!(subresource);
        let got = p.evaluate(&req, &pod, &Value::Null);
        assert!(want.holds(&got), "{name}: want {want:?}, got {got:?}");
    }
}

/// The shared-GPU example's pods are hardened as the tenant-pods policy asks, so it
/// can be copied into a labelled namespace as it is.
#[test]
fn the_shared_gpu_example_passes_the_tenant_pod_policy() {
    let p = policy("tessera-tenant-pods");
    let file = "examples/workloads/06-two-inference-workers-share-a-gpu.yaml";
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    let deployments: Vec<Value> = schedule::documents(&text, file)
        .unwrap()
        .into_iter()
        .filter(|d| d["kind"] == "Deployment")
        .collect();
    assert_eq!(deployments.len(), 2);
    for d in deployments {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": d["metadata"]["name"], "namespace": "tenants"},
            "spec": d["spec"]["template"]["spec"]});
        let req = pod_request(
            "CREATE",
            "system:serviceaccount:kube-system:replicaset-controller",
        );
        let got = p.evaluate(&req, &pod, &Value::Null);
        assert_eq!(got, Decision::Allowed, "{}", d["metadata"]["name"]);
    }
}

#[derive(Debug)]
enum Expect {
    Allow,
    /// Denied with a message containing this.
    Deny(&'static str),
    /// The policy does not apply.
    Skip,
}

impl Expect {
    /// Whether the policy decided as wanted.
    fn holds(&self, got: &Decision) -> bool {
        match (self, got) {
            (Expect::Allow, Decision::Allowed) | (Expect::Skip, Decision::NotMatched) => true,
            (Expect::Deny(text), Decision::Denied { message, .. }) => message.contains(text),
            _ => false,
        }
    }
}

#[derive(serde::Deserialize)]
struct ConfigCase {
    name: String,
    parameters: Value,
    #[serde(default)]
    error: Option<String>,
}

/// The claim policy accepts and rejects exactly what the plugin's decoder does, on
/// the decoder's own cases, for claims and claim templates, naming the same field.
#[test]
fn gpuconfig_policy_agrees_with_the_decoder() {
    let p = policy("tessera-gpuconfig");
    let text = std::fs::read_to_string(root().join("tests/data/gpuconfig-cases.yaml")).unwrap();
    let cases: Vec<ConfigCase> = serde_yaml_ng::from_str(&text).unwrap();
    assert!(cases.len() >= 14);
    for c in &cases {
        let config = json!([
            {"opaque": {"driver": "other.example.com", "parameters": {"anything": "goes"}}},
            {"requests": ["gpu"], "opaque": {"driver": "gpu.tessera.dev", "parameters": c.parameters}}
        ]);
        let devices = json!({"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}], "config": config});
        let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": devices}});
        let template = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "t", "namespace": "default"}, "spec": {"spec": {"devices": devices}}});
        let decoder_ok = tessera::prepare::gpu_config::decode(&c.parameters).is_ok();
        assert_eq!(
            decoder_ok,
            c.error.is_none(),
            "{}: the case file and the decoder",
            c.name
        );
        for (resource, obj) in [
            ("resourceclaims", &claim),
            ("resourceclaimtemplates", &template),
        ] {
            let d = p.evaluate(
                &request("CREATE", "alice", None, resource),
                obj,
                &Value::Null,
            );
            match (&c.error, &d) {
                (None, Decision::Allowed) => {}
                (Some(field), Decision::Denied { message, .. }) => assert!(
                    message.starts_with(&format!("{field}:")),
                    "{} ({resource}): names {field}: {message}",
                    c.name
                ),
                _ => panic!(
                    "{} ({resource}): decoder ok={decoder_ok}, policy {d:?}",
                    c.name
                ),
            }
        }
    }
    // No config at all, and a claim with only another driver's config, are allowed.
    let bare = json!({"spec": {"devices": {"requests": []}}});
    assert_eq!(
        p.evaluate(
            &request("CREATE", "alice", None, "resourceclaims"),
            &bare,
            &Value::Null
        ),
        Decision::Allowed
    );
}

fn examples() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("examples/workloads"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    v.sort();
    assert!(v.len() >= 8);
    v
}

/// The default mock node's pool on `version` with its default gates.
fn pool(
    version: KubeVersion,
) -> (
    Vec<k8s_openapi::api::resource::v1::ResourceSlice>,
    FeatureGates,
) {
    let dir = tempfile::tempdir().unwrap();
    let model = tessera::node::load_node(
        &tessera::node::BackendSpec::Mock(None),
        None,
        &tessera::node::BackendPaths {
            state_dir: dir.path().to_path_buf(),
            ..Default::default()
        },
        tessera::inventory::mock::StateAccess::ReadOnly,
    )
    .unwrap();
    let gates = FeatureGates::defaults(version);
    let slices = model.pool(
        "gpu.tessera.dev",
        "node-a",
        version,
        tessera::publish::slices::ServerFeatures::from_gates(&gates),
    );
    (slices, gates)
}

/// `(claim, devices)` allocated by `tessera plan`, failures as `Err(reason)`.
fn plan_file(f: &Path, version: KubeVersion) -> Vec<(String, Result<Vec<String>, String>)> {
    let (slices, gates) = pool(version);
    let steps = schedule::read_steps(&[f.to_path_buf()]).unwrap();
    let r = schedule::run(
        &slices,
        &tessera::device_classes::read(None).unwrap(),
        &steps,
        &gates,
    )
    .unwrap();
    r.outcomes
        .into_iter()
        .filter_map(|o| match o {
            Outcome::Allocated(c) => {
                let devs = c
                    .status
                    .and_then(|s| s.allocation)
                    .and_then(|a| a.devices)
                    .and_then(|d| d.results)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|r| r.device)
                    .collect();
                Some((c.metadata.name.unwrap(), Ok(devs)))
            }
            Outcome::Failed { claim, reason } => Some((claim.metadata.name.unwrap(), Err(reason))),
            Outcome::Released { .. } => None,
        })
        .collect()
}

/// Every example is allocated, at the version its comment names, to exactly the
/// devices its comment promises.
#[test]
fn every_example_gets_what_its_comment_promises() {
    for f in examples() {
        let text = std::fs::read_to_string(&f).unwrap();
        let version = text
            .lines()
            .find_map(|l| l.strip_prefix("# plan: k8s 1."))
            .and_then(|m| KubeVersion::new(m.trim().parse().unwrap()))
            .unwrap_or_else(|| panic!("{}: no `# plan: k8s 1.N` line", f.display()));
        let want: Vec<(String, Result<Vec<String>, String>)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# expect: "))
            .map(|l| {
                let (name, devs) = l.split_once(": ").unwrap();
                (
                    name.to_string(),
                    Ok(devs.split(", ").map(str::to_string).collect()),
                )
            })
            .collect();
        assert!(!want.is_empty(), "{}: no `# expect:` line", f.display());
        assert_eq!(plan_file(&f, version), want, "{}", f.display());
    }
}

/// A claim that cannot fit says why: a second big-memory GPU on the default node
/// (gpu-0 is taken; gpu-1 is shared, not a `gpu`; the T4s are too small).
#[test]
fn a_claim_that_cannot_fit_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("twice.yaml");
    let one =
        std::fs::read_to_string(root().join("examples/workloads/03-gpu-memory-at-least.yaml"))
            .unwrap();
    std::fs::write(
        &f,
        format!(
            "{one}\n---\n{}",
            one.replace(
                "name: big-memory\nspec:\n  spec",
                "name: big-memory-2\nspec:\n  spec"
            )
        ),
    )
    .unwrap();
    let got = plan_file(&f, KubeVersion::NEWEST);
    assert_eq!(
        got[0],
        ("big-memory".to_string(), Ok(vec!["gpu-0".to_string()]))
    );
    let (name, second) = &got[1];
    assert_eq!(name, "big-memory-2");
    let reason = second.as_ref().unwrap_err();
    assert!(
        reason.contains("1 device(s) match, 0 available, 1 needed"),
        "{reason}"
    );
}
