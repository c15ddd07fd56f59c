//! The API server's checks: reachable (and its version), the plugin's RBAC (one
//! SelfSubjectAccessReview per verb the shipped ClusterRole grants, so the list follows
//! `deploy/base/rbac.yaml`), the DRA features the server keeps (the publisher's dry-run
//! probe), and no other owner of this node's GPUs (`publish::conflicts`).
//!
//! [`gather`] makes the calls (reads, dry-run creates, access reviews; nothing is
//! stored); [`check`] is pure.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde::Deserialize;

use super::{DoctorInput, Finding};
use crate::config::GpuMode;
use crate::error_chain::cause_chain;
use crate::publish::Publisher;
use crate::publish::slices::ServerFeatures;

/// The shipped RBAC manifest: its ClusterRole is what the plugin needs.
const RBAC_MANIFEST: &str = include_str!("../../deploy/base/rbac.yaml");

/// One permission: `verb` on `group`/`resource` (`resource/subresource` for a
/// subresource), cluster-wide, on the object `name` where the rule names one
/// (`resourceNames`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Access {
    pub group: String,
    pub resource: String,
    pub verb: String,
    pub name: Option<String>,
}

impl std::fmt::Display for Access {
    /// `verb resource[.group][/subresource][ (name)]`, e.g.
    /// `update resourceclaims.resource.k8s.io/status`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (resource, sub) = match self.resource.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (self.resource.as_str(), None),
        };
        write!(f, "{} {resource}", self.verb)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if let Some(sub) = sub {
            write!(f, "/{sub}")?;
        }
        if let Some(name) = &self.name {
            write!(f, " ({name})")?;
        }
        Ok(())
    }
}

/// The permissions the ClusterRoles in `manifest` grant, rule by rule, expanded to
/// one per (group, resource, verb). Deterministic.
///
/// # Errors
/// The YAML does not parse or a rule lacks its lists.
pub fn cluster_role_access(manifest: &str) -> Result<Vec<Access>, String> {
    #[derive(Deserialize)]
    struct Rule {
        #[serde(rename = "apiGroups")]
        api_groups: Vec<String>,
        resources: Vec<String>,
        verbs: Vec<String>,
        #[serde(rename = "resourceNames", default)]
        resource_names: Vec<String>,
    }
    #[derive(Deserialize)]
    struct Doc {
        kind: String,
        #[serde(default)]
        rules: Vec<Rule>,
    }
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(manifest) {
        let d = Doc::deserialize(doc).map_err(|e| e.to_string())?;
        if d.kind != "ClusterRole" {
            continue;
        }
        for r in d.rules {
            for g in &r.api_groups {
                for res in &r.resources {
                    for v in &r.verbs {
                        let names = if r.resource_names.is_empty() {
                            vec![None]
                        } else {
                            r.resource_names.iter().cloned().map(Some).collect()
                        };
                        for name in names {
                            out.push(Access {
                                group: g.clone(),
                                resource: res.clone(),
                                verb: v.clone(),
                                name,
                            });
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The plugin's permissions: the shipped ClusterRole's.
pub fn required_access() -> Result<Vec<Access>, String> {
    cluster_role_access(RBAC_MANIFEST)
}

/// One access review's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Review {
    Allowed,
    Denied(String),
    Error(String),
}

/// What the API checks saw. `Err` strings are cause chains.
#[derive(Debug, Clone)]
pub struct SeenApi {
    /// The server's `gitVersion`, or why it could not be reached.
    pub reachable: Result<String, String>,
    /// Each required permission and the review's answer (or why the list is unknown).
    pub rbac: Result<Vec<(Access, Review)>, String>,
    /// The probe's features, or why it failed.
    pub features: Option<Result<ServerFeatures, String>>,
    /// The modes of this node's GPUs (for what the features mean here).
    pub modes: Vec<GpuMode>,
    /// Other owners of our GPUs, or why the check failed; `None`: not run.
    pub conflicts: Option<Result<Vec<String>, String>>,
    /// The Node's `containerRuntimeVersion`.
    pub runtime_version: Option<String>,
}

/// Calls the API server as the plugin would (the plugin's own client and node name).
pub async fn gather(input: &DoctorInput) -> SeenApi {
    let modes: Vec<GpuMode> = input
        .node
        .as_ref()
        .map(|m| m.gpus.iter().map(|g| g.mode).collect())
        .unwrap_or_default();
    let mut seen = SeenApi {
        reachable: Err(String::new()),
        rbac: Err("not checked".into()),
        features: None,
        modes,
        conflicts: None,
        runtime_version: None,
    };
    let client = match &input.client {
        Ok(c) => c.clone(),
        Err(e) => {
            seen.reachable = Err(e.clone());
            return seen;
        }
    };
    seen.reachable = match client.apiserver_version().await {
        Ok(v) => Ok(v.git_version),
        Err(e) => Err(cause_chain(&e)),
    };
    if seen.reachable.is_err() {
        return seen;
    }
    seen.rbac = match required_access() {
        Ok(list) => {
            let mut out = Vec::new();
            for a in list {
                let r = review(&client, &a).await;
                out.push((a, r));
            }
            Ok(out)
        }
        Err(e) => Err(format!("the built-in ClusterRole does not parse: {e}")),
    };
    let nodes: Api<Node> = Api::all(client.clone());
    if let Ok(n) = nodes.get(&input.opts.node_name).await {
        seen.runtime_version = n
            .status
            .and_then(|s| s.node_info)
            .map(|i| i.container_runtime_version);
    }
    match Publisher::new(client, &input.opts.driver_name, &input.opts.node_name).await {
        Ok(p) => {
            seen.features = Some(p.probe_features().await.map_err(|e| cause_chain(&e)));
            if let Ok(model) = &input.node {
                let uuids: Vec<String> = model.gpus.iter().map(|g| g.gpu.uuid.clone()).collect();
                seen.conflicts = Some(
                    p.conflicts(&uuids)
                        .await
                        .map(|c| c.into_iter().map(|c| c.0).collect())
                        .map_err(|e| cause_chain(&e)),
                );
            }
        }
        Err(e) => seen.features = Some(Err(cause_chain(&e))),
    }
    seen
}

/// One SelfSubjectAccessReview: may this identity `a.verb` `a.resource` cluster-wide?
async fn review(client: &kube::Client, a: &Access) -> Review {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let (resource, subresource) = match a.resource.split_once('/') {
        Some((r, s)) => (r.to_string(), Some(s.to_string())),
        None => (a.resource.clone(), None),
    };
    let req = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(a.group.clone()),
                resource: Some(resource),
                subresource,
                name: a.name.clone(),
                verb: Some(a.verb.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &req).await {
        Ok(r) => match r.status {
            Some(s) if s.allowed => Review::Allowed,
            Some(s) => Review::Denied(s.reason.unwrap_or_default()),
            None => Review::Error("the review came back without a status".into()),
        },
        Err(e) => Review::Error(cause_chain(&e)),
    }
}

/// The API findings: `api-server`, then (when it answered) `rbac`, `dra-features` and
/// `gpu-owners`. Deterministic.
pub fn check(seen: &SeenApi) -> Vec<Finding> {
    let version = match &seen.reachable {
        Ok(v) => v,
        Err(e) => {
            return vec![Finding::fail(
                "api-server",
                vec![
                    format!("unreachable: {e}"),
                    "RBAC, DRA features and other GPU owners not checked".into(),
                ],
                "in the pod: the ServiceAccount token and KUBERNETES_SERVICE_HOST/PORT (Helm: apiServer.host/port on clusters without kube-proxy); elsewhere: --kubeconfig / KUBECONFIG",
            )];
        }
    };
    let mut out = vec![Finding::pass(
        "api-server",
        vec![format!("reachable, Kubernetes {version}")],
    )];
    out.push(check_rbac(&seen.rbac));
    if let Some(f) = &seen.features {
        out.push(check_features(f, &seen.modes));
    }
    match &seen.conflicts {
        Some(Ok(c)) if c.is_empty() => out.push(Finding::pass(
            "gpu-owners",
            vec!["no device plugin's nvidia.com/gpu on the Node; no other DRA driver publishes these GPUs".into()],
        )),
        Some(Ok(c)) => out.push(Finding::fail(
            "gpu-owners",
            c.clone(),
            "one owner per GPU: uninstall the NVIDIA device plugin from the nodes Tessera manages (or exclude them with its nodeSelector), and stop the other DRA driver publishing these GPUs",
        )),
        Some(Err(e)) => out.push(Finding::warn(
            "gpu-owners",
            vec![format!("cannot list this node's ResourceSlices: {e}")],
            "grant the plugin list on resourceslices (see rbac)",
        )),
        None => {}
    }
    out
}

fn check_rbac(rbac: &Result<Vec<(Access, Review)>, String>) -> Finding {
    const CHECK: &str = "rbac";
    let list = match rbac {
        Ok(l) => l,
        Err(e) => return Finding::fail(CHECK, vec![e.clone()], "report this as a bug"),
    };
    let (mut allowed, mut denied, mut errors) = (Vec::new(), Vec::new(), Vec::new());
    for (a, r) in list {
        match r {
            Review::Allowed => allowed.push(a.to_string()),
            Review::Denied(_) => denied.push(a.to_string()),
            Review::Error(e) => errors.push(format!("{a}: {e}")),
        }
    }
    let mut saw = vec![format!("allowed: {}", allowed.join(", "))];
    if !denied.is_empty() {
        saw.push(format!("denied: {}", denied.join(", ")));
        return Finding::fail(
            CHECK,
            saw,
            "the plugin's ServiceAccount lacks these: apply the ClusterRole tessera-plugin and its ClusterRoleBinding as shipped (deploy/base/rbac.yaml; the Helm chart's templates/rbac.yaml) and check nothing edited them",
        );
    }
    if !errors.is_empty() {
        saw.push(format!("not reviewed: {}", errors.join("; ")));
        return Finding::warn(
            CHECK,
            saw,
            "the server refused SelfSubjectAccessReviews (every authenticated user may create them by default): check the system:basic-user binding",
        );
    }
    Finding::pass(CHECK, saw)
}

fn check_features(f: &Result<ServerFeatures, String>, modes: &[GpuMode]) -> Finding {
    const CHECK: &str = "dra-features";
    let feat = match f {
        Ok(f) => f,
        Err(e) => {
            return Finding::fail(
                CHECK,
                vec![format!("the dry-run probe failed: {e}")],
                "check NODE_NAME names this Node, that resource.k8s.io/v1 is served (Kubernetes 1.34+) and the plugin may create resourceslices",
            );
        }
    };
    let on = |b: bool| if b { "kept" } else { "dropped" };
    let saw = vec![
        format!(
            "counter sets (DRAPartitionableDevices): {}",
            on(feat.partitionable)
        ),
        format!(
            "multi-allocatable devices (DRAConsumableCapacity): {}",
            on(feat.consumable_capacity)
        ),
        format!(
            "device taints (DRADeviceTaints): {}",
            on(feat.device_taints)
        ),
    ];
    let mut notes = Vec::new();
    if modes.contains(&GpuMode::Shared) && !feat.consumable_capacity {
        notes.push("shared GPUs are published as fixed slots (enable DRAConsumableCapacity for memory and compute shares)");
    }
    if modes.contains(&GpuMode::Mig) && !feat.partitionable {
        notes.push("mig-mode GPUs publish their live MIG devices only (enable DRAPartitionableDevices for dynamic MIG)");
    }
    if notes.is_empty() {
        Finding::pass(CHECK, saw)
    } else {
        Finding::warn(CHECK, saw, notes.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped ClusterRole expands to one permission per verb.
    #[test]
    fn the_shipped_cluster_role_expands_per_verb() {
        let access = required_access().unwrap();
        let names: Vec<String> = access.iter().map(ToString::to_string).collect();
        assert!(names.contains(&"get nodes".to_string()), "{names:?}");
        assert!(names.contains(&"watch resourceslices.resource.k8s.io".to_string()));
        assert!(names.contains(&"patch events.events.k8s.io".to_string()));
        assert!(names.contains(&"update resourceclaims.resource.k8s.io/status".to_string()));
        assert!(
            names.contains(
                &"associated-node:update resourceclaims.resource.k8s.io/driver (gpu.tessera.dev)"
                    .to_string()
            )
        );
        assert_eq!(names.len(), 14, "{names:?}");
    }
}
