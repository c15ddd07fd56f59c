//! `tessera plan`: reading slices, DeviceClasses and claims from files, allocating the
//! claims in order with [`crate::allocator::Allocator`], and rendering the outcome.
//!
//! Inputs are YAML or JSON, one or more documents per file; a `v1` `List` (what
//! `tessera inventory` prints) is unpacked. A directory stands for its `*.yaml`, `*.yml`
//! and `*.json` files by name. Each input may be a folder of mixed manifests as a user
//! keeps them (`deploy/deviceclasses/` has its `kustomization.yaml`, an example its
//! Pods): a reader takes the documents of its kinds and skips the others, noting each
//! at debug level; a document of its kind that does not decode is an error. Besides
//! ResourceClaims, a claim stream may hold release steps, so that tests and users can
//! model claims coming and going:
//!
//! ```yaml
//! apiVersion: plan.tessera.dev/v1alpha1
//! kind: Release
//! claims: [default/w1]        # namespace/name, or name in "default"
//! ```

use std::path::{Path, PathBuf};

use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimStatus, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::allocator::{AllocError, Allocator, SkippedPool};
use crate::release::FeatureGates;

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{source_name}: document {index}: {reason}")]
    Decode {
        source_name: String,
        index: usize,
        reason: String,
    },
    #[error("{path}: no {kind} among its documents ({found})")]
    NoneFound {
        path: PathBuf,
        kind: &'static str,
        /// What was there instead, for the message.
        found: String,
    },
    #[error("{source_name}: {depth}")]
    TooDeep {
        source_name: String,
        depth: yaml_guard::TooDeep,
    },
    #[error("PodGroup {namespace}/{name}: {reason}")]
    PodGroup {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error(transparent)]
    Alloc(#[from] AllocError),
}

/// One step of a plan.
#[derive(Debug, Clone)]
pub enum Step {
    Allocate(Box<ResourceClaim>),
    Release(Vec<(String, String)>),
    /// A PodGroup (`scheduling.k8s.io`) of the inputs: see [`PodGroup`].
    PodGroup(Box<PodGroup>),
}

/// A PodGroup whose pods share `spec.resourceClaims` (KEP-5729, beta in 1.37 behind
/// DRAWorkloadResourceClaims): each entry is one claim for the whole group, allocated
/// once and reserved for the group. A template such an entry names is already planned
/// as one claim (as every template is), so the group needs no allocation of its own;
/// the plan checks that it can stand for the group, and refuses what it cannot model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodGroup {
    pub namespace: String,
    pub name: String,
    /// `spec.resourceClaims`: (entry name, ResourceClaim or ResourceClaimTemplate name).
    pub claims: Vec<(String, String)>,
    /// `spec.schedulingPolicy.gang.minCount`, for a gang.
    pub gang_min_count: Option<i64>,
    /// Claims of the group's pods among the inputs (Pods, workload templates naming the
    /// group in `spec.schedulingGroup.podGroupName`) that are not the group's: each pod
    /// would get its own.
    pub per_pod_claims: Vec<String>,
}

/// Splits YAML/JSON text into JSON values, unpacking `List`s. Flow collections nested
/// deeper than the deserializer accepts are refused before the quadratic scan
/// ([`yaml_guard`]).
pub fn documents(text: &str, source_name: &str) -> Result<Vec<serde_json::Value>, PlanError> {
    yaml_guard::check(text).map_err(|depth| PlanError::TooDeep {
        source_name: source_name.into(),
        depth,
    })?;
    let mut out = Vec::new();
    for (index, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let v = serde_json::Value::deserialize(doc).map_err(|e| PlanError::Decode {
            source_name: source_name.into(),
            index,
            reason: e.to_string(),
        })?;
        if v.is_null() {
            continue;
        }
        if v["kind"] == "List" || v["kind"].as_str().is_some_and(|k| k.ends_with("List")) {
            out.extend(v["items"].as_array().cloned().unwrap_or_default());
        } else {
            out.push(v);
        }
    }
    Ok(out)
}

fn decode<T: serde::de::DeserializeOwned>(
    v: serde_json::Value,
    source_name: &str,
    index: usize,
) -> Result<T, PlanError> {
    serde_path_to_error::deserialize(v).map_err(|e| PlanError::Decode {
        source_name: source_name.into(),
        index,
        reason: format!("{}: {}", e.path(), e.inner()),
    })
}

fn read(path: &Path) -> Result<String, PlanError> {
    if path == Path::new("-") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|source| {
            PlanError::Read {
                path: path.into(),
                source,
            }
        })?;
        return Ok(s);
    }
    std::fs::read_to_string(path).map_err(|source| PlanError::Read {
        path: path.into(),
        source,
    })
}

/// Files of a path: the file itself, or a directory's `*.yaml|*.yml|*.json` by name.
fn files(path: &Path) -> Result<Vec<PathBuf>, PlanError> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut v: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|source| PlanError::Read {
            path: path.into(),
            source,
        })?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
        })
        .collect();
    v.sort();
    Ok(v)
}

/// The API group whose kinds the readers take (`DeviceClass`, `ResourceSlice`,
/// `ResourceClaim`, `ResourceClaimTemplate`).
pub const RESOURCE_GROUP: &str = "resource.k8s.io";

/// Whether document `v` is a `kind` of [`RESOURCE_GROUP`]: its kind matches and its
/// group is that one, or it names no `apiVersion` at all (decoding then says what is
/// missing, rather than the document vanishing).
fn is_resource_kind(v: &serde_json::Value, kind: &str) -> bool {
    if v["kind"] != kind {
        return false;
    }
    match v.get("apiVersion").and_then(|a| a.as_str()) {
        None => true,
        Some(api_version) => api_version
            .split_once('/')
            .is_some_and(|(group, _)| group == RESOURCE_GROUP),
    }
}

/// Splits documents (as [`documents`] returns them) into those of `kind` in the
/// `resource.k8s.io` group and the others, each with its index: what a reader takes
/// and what it skips. Pure: reading, decoding and reporting are the caller's.
#[allow(clippy::type_complexity)]
pub fn split_kind(
    docs: Vec<serde_json::Value>,
    kind: &str,
) -> (
    Vec<(usize, serde_json::Value)>,
    Vec<(usize, serde_json::Value)>,
) {
    docs.into_iter()
        .enumerate()
        .partition(|(_, v)| is_resource_kind(v, kind))
}

/// How a skipped document is named in notes and errors: `apiVersion kind name`, with
/// `?` for what it lacks (a kustomization.yaml may have no kind at all).
fn describe(v: &serde_json::Value) -> String {
    let field = |s: Option<&str>| s.unwrap_or("?").to_string();
    format!(
        "{} {} {}",
        field(v["apiVersion"].as_str()),
        field(v["kind"].as_str()),
        field(v["metadata"]["name"].as_str()),
    )
}

/// Notes, at debug level, a document a reader passed over.
fn note_skipped(source_name: &str, index: usize, v: &serde_json::Value, reader: &str) {
    tracing::debug!(
        source = source_name,
        document = index,
        skipped = %describe(v),
        "not read as {reader}: skipped"
    );
}

/// Every `kind` document of `path` (a file, a directory, or `-`), decoded; other
/// documents are skipped with a debug note. Finding none at all is an error: the path
/// is not what the caller meant it to be.
fn read_kind<T: serde::de::DeserializeOwned>(
    path: &Path,
    kind: &'static str,
) -> Result<Vec<T>, PlanError> {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for f in files(path)? {
        let name = f.display().to_string();
        let (take, skip) = split_kind(documents(&read(&f)?, &name)?, kind);
        for (i, v) in &skip {
            note_skipped(&name, *i, v, kind);
            skipped.push(describe(v));
        }
        for (i, v) in take {
            out.push(decode(v, &name, i)?);
        }
    }
    if out.is_empty() {
        return Err(PlanError::NoneFound {
            path: path.into(),
            kind,
            found: if skipped.is_empty() {
                "it holds no documents".into()
            } else {
                format!("skipped: {}", skipped.join(", "))
            },
        });
    }
    Ok(out)
}

/// ResourceSlices from a file, a directory or `-` (stdin), in document order; other
/// kinds are skipped.
pub fn read_slices(path: &Path) -> Result<Vec<ResourceSlice>, PlanError> {
    read_kind(path, "ResourceSlice")
}

/// DeviceClasses from a directory or file; other kinds (a `kustomization.yaml`) are
/// skipped.
pub fn read_classes(path: &Path) -> Result<Vec<DeviceClass>, PlanError> {
    read_kind(path, "DeviceClass")
}

/// DeviceClasses from YAML texts compiled into a program (`what` names them in errors).
pub fn parse_classes(texts: &[&str], what: &str) -> Result<Vec<DeviceClass>, PlanError> {
    let mut out = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        for v in documents(text, what)? {
            out.push(decode(v, what, i)?);
        }
    }
    Ok(out)
}

/// Claims and release steps from files or directories, in order. A
/// ResourceClaimTemplate stands for one claim named after it, and a document with no
/// kind is read as a claim; other documents (an example's Pods and Deployments, a
/// `kustomization.yaml`) are skipped with a debug note.
pub fn read_steps(paths: &[PathBuf]) -> Result<Vec<Step>, PlanError> {
    let mut out = Vec::new();
    // (namespace, group) -> claim names the group's pods give (name, claim or template).
    let mut members: Vec<Member> = Vec::new();
    for p in paths {
        for f in files(p)? {
            let name = f.display().to_string();
            for (i, v) in documents(&read(&f)?, &name)?.into_iter().enumerate() {
                if let Some(m) = pod_group_member(&v) {
                    members.push(m);
                }
                if is_pod_group(&v) {
                    out.push(Step::PodGroup(Box::new(pod_group(&v, &name, i)?)));
                } else if v["kind"] == "Release" {
                    let claims = v["claims"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|c| c.as_str())
                                .map(|c| match c.split_once('/') {
                                    Some((ns, n)) => (ns.to_string(), n.to_string()),
                                    None => ("default".to_string(), c.to_string()),
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    out.push(Step::Release(claims));
                } else if is_resource_kind(&v, "ResourceClaimTemplate") {
                    // One claim as the template would stamp out, named after it.
                    let t: ResourceClaimTemplate = decode(v, &name, i)?;
                    let claim = ResourceClaim {
                        metadata: ObjectMeta {
                            name: t.metadata.name,
                            namespace: t.metadata.namespace.or_else(|| Some("default".into())),
                            ..Default::default()
                        },
                        spec: t.spec.and_then(|s| s.spec),
                        status: None,
                    };
                    out.push(Step::Allocate(Box::new(claim)));
                } else if is_resource_kind(&v, "ResourceClaim") || v.get("kind").is_none() {
                    let mut claim: ResourceClaim = decode(v, &name, i)?;
                    if claim.metadata.namespace.is_none() {
                        claim.metadata.namespace = Some("default".into());
                    }
                    out.push(Step::Allocate(Box::new(claim)));
                } else {
                    note_skipped(&name, i, &v, "a claim or release step");
                }
            }
        }
    }
    for step in &mut out {
        let Step::PodGroup(g) = step else { continue };
        for ((ns, group), claims) in &members {
            if (ns, group) != (&g.namespace, &g.name) {
                continue;
            }
            for c in claims {
                if !g.claims.contains(c) && !g.per_pod_claims.contains(&c.1) {
                    g.per_pod_claims.push(c.1.clone());
                }
            }
        }
    }
    Ok(out)
}

/// A pod (or pod template) of a PodGroup: ((namespace, group), its claims as
/// (entry name, claim or template name)).
type Member = ((String, String), Vec<(String, String)>);

fn is_pod_group(v: &serde_json::Value) -> bool {
    v["kind"] == "PodGroup"
        && v["apiVersion"]
            .as_str()
            .is_some_and(|a| a.starts_with("scheduling.k8s.io/"))
}

fn namespace_of(v: &serde_json::Value) -> String {
    v["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_string()
}

/// The claims (entry name, claim or template name) of `entries`, a `resourceClaims`
/// list of a PodGroup or a pod spec.
fn claim_entries(entries: &serde_json::Value) -> Vec<(String, String)> {
    entries
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let target = e["resourceClaimName"]
                .as_str()
                .or(e["resourceClaimTemplateName"].as_str())?;
            Some((e["name"].as_str()?.to_string(), target.to_string()))
        })
        .collect()
}

fn pod_group(
    v: &serde_json::Value,
    source_name: &str,
    index: usize,
) -> Result<PodGroup, PlanError> {
    let name = v["metadata"]["name"]
        .as_str()
        .ok_or_else(|| PlanError::Decode {
            source_name: source_name.into(),
            index,
            reason: "a PodGroup without metadata.name".into(),
        })?;
    let gang = &v["spec"]["schedulingPolicy"]["gang"];
    Ok(PodGroup {
        namespace: namespace_of(v),
        name: name.into(),
        claims: claim_entries(&v["spec"]["resourceClaims"]),
        gang_min_count: gang
            .is_object()
            .then(|| gang["minCount"].as_i64().unwrap_or(0)),
        per_pod_claims: Vec::new(),
    })
}

/// ((namespace, group), claims) of a Pod, or of a workload's pod template, that names a
/// PodGroup in `spec.schedulingGroup.podGroupName`.
fn pod_group_member(v: &serde_json::Value) -> Option<Member> {
    let spec = match v["kind"].as_str()? {
        "Pod" => &v["spec"],
        _ => &v["spec"]["template"]["spec"],
    };
    let group = spec["schedulingGroup"]["podGroupName"].as_str()?;
    Some((
        (namespace_of(v), group.to_string()),
        claim_entries(&spec["resourceClaims"]),
    ))
}

/// Why the plan cannot stand for PodGroup `g` on a server with `gates`, if it cannot.
/// `planned`: the claims and templates of the inputs, by (namespace, name).
fn pod_group_refusal(
    g: &PodGroup,
    gates: &FeatureGates,
    planned: &[(String, String)],
) -> Option<String> {
    if !g.claims.is_empty() && !gates.enabled("DRAWorkloadResourceClaims") {
        return Some(format!(
            "spec.resourceClaims needs the DRAWorkloadResourceClaims gate (beta in 1.37, off by \
             default; give --gates DRAWorkloadResourceClaims=true where the cluster turns it on); \
             without it the API server drops the field and each pod gets claims of its own, \
             which the plan does not model (Kubernetes {})",
            gates.version()
        ));
    }
    if let Some(missing) = g
        .claims
        .iter()
        .find(|(_, c)| !planned.contains(&(g.namespace.clone(), c.clone())))
    {
        return Some(format!(
            "spec.resourceClaims[{}] names {}, which is not among the inputs (a ResourceClaim or \
             ResourceClaimTemplate): its one allocation for the group cannot be planned",
            missing.0, missing.1
        ));
    }
    match g.gang_min_count {
        Some(n) if !g.per_pod_claims.is_empty() => Some(format!(
            "a gang (minCount {n}) whose pods have claims of their own ({}): the scheduler \
             places all {n} pods or none, and the plan allocates one claim per template, not \
             one per pod, so it cannot tell whether the gang fits",
            g.per_pod_claims.join(", ")
        )),
        _ => None,
    }
}

/// The outcome of one step.
#[derive(Debug, Clone)]
pub enum Outcome {
    Allocated(Box<ResourceClaim>),
    Failed {
        claim: Box<ResourceClaim>,
        reason: String,
    },
    Released {
        claims: Vec<String>,
    },
}

/// The result of a whole plan.
#[derive(Debug, Clone)]
pub struct PlanResult {
    pub skipped_pools: Vec<SkippedPool>,
    pub outcomes: Vec<Outcome>,
}

/// Why the API server would refuse to store `claim`, if it would: such a claim never
/// reaches the scheduler, so it is not planned either. Fields of disabled gates are
/// dropped first, as the server drops them (found by fuzzing `plan`: a request named
/// `gpuubernetes.io/` was planned, and its result read as a subrequest).
fn api_refusal(claim: &ResourceClaim, gates: &FeatureGates) -> Option<String> {
    let mut stored = claim.clone();
    crate::validation::drop_disabled_claim_fields(&mut stored, gates);
    let errors = crate::validation::validate_resource_claim(&stored, gates);
    (!errors.is_empty()).then(|| {
        let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
        format!(
            "the API server would refuse this claim: {}",
            errors.join("; ")
        )
    })
}

/// Runs the steps in order. Claims that cannot be allocated are reported and do not
/// stop the plan; malformed classes are an error. Deterministic.
pub fn run(
    slices: &[ResourceSlice],
    classes: &[DeviceClass],
    steps: &[Step],
    gates: &FeatureGates,
) -> Result<PlanResult, PlanError> {
    let planned: Vec<(String, String)> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Allocate(c) => Some((
                c.metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
                c.metadata.name.clone().unwrap_or_default(),
            )),
            _ => None,
        })
        .collect();
    for step in steps {
        if let Step::PodGroup(g) = step
            && let Some(reason) = pod_group_refusal(g, gates, &planned)
        {
            return Err(PlanError::PodGroup {
                namespace: g.namespace.clone(),
                name: g.name.clone(),
                reason,
            });
        }
    }
    let mut alloc = Allocator::new(slices, classes, gates)?;
    let mut outcomes = Vec::new();
    for step in steps {
        match step {
            // Checked above; its claims are planned once, as their own documents.
            Step::PodGroup(_) => {}
            Step::Allocate(claim) if let Some(reason) = api_refusal(claim, gates) => {
                outcomes.push(Outcome::Failed {
                    claim: claim.clone(),
                    reason,
                })
            }
            Step::Allocate(claim) => match alloc.allocate(claim) {
                Ok(result) => {
                    let mut c = (**claim).clone();
                    let mut status = c.status.take().unwrap_or_else(ResourceClaimStatus::default);
                    status.allocation = Some(result);
                    c.status = Some(status);
                    outcomes.push(Outcome::Allocated(Box::new(c)));
                }
                Err(e @ (AllocError::Unsatisfiable(_) | AllocError::SearchLimit(_))) => outcomes
                    .push(Outcome::Failed {
                        claim: claim.clone(),
                        reason: e.to_string(),
                    }),
                Err(
                    e @ (AllocError::Invalid(_)
                    | AllocError::AlreadyAllocated(_)
                    | AllocError::SchedulerCrash(_)),
                ) => outcomes.push(Outcome::Failed {
                    claim: claim.clone(),
                    reason: e.to_string(),
                }),
            },
            Step::Release(names) => {
                let mut released = Vec::new();
                for (ns, n) in names {
                    if alloc.release(ns, n) {
                        released.push(format!("{ns}/{n}"));
                    }
                }
                outcomes.push(Outcome::Released { claims: released });
            }
        }
    }
    Ok(PlanResult {
        skipped_pools: alloc.skipped_pools().to_vec(),
        outcomes,
    })
}

/// A readable table: one line per allocated device, or the failure reason.
pub fn render_table(r: &PlanResult) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    for p in &r.skipped_pools {
        let _ = writeln!(s, "skipped pool {}/{}: {}", p.driver, p.pool, p.reason);
    }
    let _ = writeln!(
        s,
        "{:<24} {:<16} {:<26} {:<14} DETAILS",
        "CLAIM", "REQUEST", "DEVICE", "POOL"
    );
    for o in &r.outcomes {
        match o {
            Outcome::Allocated(c) => {
                let name = c.metadata.name.clone().unwrap_or_default();
                let results = c
                    .status
                    .as_ref()
                    .and_then(|s| s.allocation.as_ref())
                    .and_then(|a| a.devices.as_ref())
                    .and_then(|d| d.results.clone())
                    .unwrap_or_default();
                for res in results {
                    let mut details = Vec::new();
                    if let Some(cc) = &res.consumed_capacity {
                        details.push(
                            cc.iter()
                                .map(|(k, v)| format!("{k}={}", v.0))
                                .collect::<Vec<_>>()
                                .join(","),
                        );
                    }
                    if let Some(sid) = &res.share_id {
                        details.push(format!("share={}", &sid[..8.min(sid.len())]));
                    }
                    let _ = writeln!(
                        s,
                        "{:<24} {:<16} {:<26} {:<14} {}",
                        name,
                        res.request,
                        res.device,
                        res.pool,
                        details.join(" ")
                    );
                }
            }
            Outcome::Failed { claim, reason } => {
                let name = claim.metadata.name.clone().unwrap_or_default();
                let _ = writeln!(
                    s,
                    "{name:<24} {:<16} {:<26} {:<14} {reason}",
                    "-", "UNSCHEDULABLE", "-"
                );
            }
            Outcome::Released { claims } => {
                let _ = writeln!(s, "{:<24} released {}", "-", claims.join(", "));
            }
        }
    }
    s
}

/// YAML documents: each claim with `status.allocation` filled in (failed claims are
/// emitted unallocated, with the reason as a comment).
pub fn render_yaml(r: &PlanResult) -> Result<String, serde_yaml_ng::Error> {
    let mut s = String::new();
    for o in &r.outcomes {
        match o {
            Outcome::Allocated(c) => {
                s.push_str("---\n");
                s.push_str(&serde_yaml_ng::to_string(c)?);
            }
            Outcome::Failed { claim, reason } => {
                s.push_str("---\n");
                for line in reason.lines() {
                    s.push_str(&format!("# unschedulable: {line}\n"));
                }
                s.push_str(&serde_yaml_ng::to_string(claim)?);
            }
            Outcome::Released { .. } => {}
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs(text: &str) -> Vec<serde_json::Value> {
        documents(text, "test").unwrap()
    }

    /// A plan input nested deeper than the deserializer accepts is refused before the
    /// scanner's quadratic work, naming the file and the place; a long flat one is not.
    #[test]
    fn deep_flow_nesting_is_refused_before_parsing() {
        let deep = format!("kind: List\nitems: {}", "[".repeat(50_000));
        let e = documents(&deep, "pool.yaml").unwrap_err().to_string();
        assert!(e.starts_with("pool.yaml: YAML flow collections"), "{e}");
        assert!(e.contains("line 2, column 136"), "{e}");
        let flat = format!("kind: List\nitems: [{}]", "{a: [1]}, ".repeat(50_000));
        assert_eq!(docs(&flat).len(), 50_000);
    }

    /// A claim the API server would refuse to store is not planned: it fails with the
    /// server's reasons (fields of disabled gates dropped first, as the server does).
    /// Found by fuzzing `plan`: a request named `gpuubernetes.io/` was allocated.
    #[test]
    fn a_claim_the_api_server_would_refuse_is_not_planned() {
        let claim = |request: &str| -> Step {
            Step::Allocate(Box::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "c", "namespace": "default"},
                    "spec": {"devices": {"requests": [{"name": request, "exactly": {
                        "deviceClassName": "gpu.example.com",
                        "capacity": {"requests": {"memory": "1Gi"}}}}]}}
                }))
                .unwrap(),
            ))
        };
        let gates = FeatureGates::defaults(crate::release::KubeVersion::OLDEST);
        let reasons = |steps: &[Step]| -> Vec<String> {
            run(&[], &[], steps, &gates)
                .unwrap()
                .outcomes
                .into_iter()
                .map(|o| match o {
                    Outcome::Failed { reason, .. } => reason,
                    _ => panic!("nothing can be allocated without devices"),
                })
                .collect()
        };
        let r = reasons(&[claim("gpuubernetes.io/"), claim("gpu")]);
        assert!(
            r[0].starts_with(
                "the API server would refuse this claim: spec.devices.requests[0].name"
            ),
            "{}",
            r[0]
        );
        // The same claim with a valid name goes to the allocator (and finds no device).
        assert!(!r[1].contains("API server"), "{}", r[1]);
    }

    const GROUP_POOL: &str = "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\n\
        metadata: {name: s}\nspec: {driver: gpu.tessera.dev, nodeName: n, \
        pool: {name: n, generation: 1, resourceSliceCount: 1}, devices: [{name: gpu-0}, {name: gpu-1}]}\n";
    const GROUP_CLASS: &str = "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\n\
        metadata: {name: gpu.tessera.dev}\nspec: {}\n";

    /// The plan of `claims` (a file's text, or the repository's PodGroup example) on two
    /// GPUs, with Kubernetes 1.37 and `gates`.
    fn plan_group(claims: Option<&str>, gates: &str) -> Result<PlanResult, PlanError> {
        let d = dir_with(&[("slices.yaml", GROUP_POOL), ("classes.yaml", GROUP_CLASS)]);
        let input = match claims {
            Some(text) => {
                std::fs::write(d.path().join("claims.yaml"), text).unwrap();
                d.path().join("claims.yaml")
            }
            None => Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../examples/workload-claims/pod-group-shares-a-claim.yaml"),
        };
        let v137: crate::release::KubeVersion = "1.37".parse().unwrap();
        let gates = FeatureGates::parse(v137, gates).unwrap();
        let slices = read_slices(&d.path().join("slices.yaml")).unwrap();
        let classes = read_classes(&d.path().join("classes.yaml")).unwrap();
        run(&slices, &classes, &read_steps(&[input])?, &gates)
    }

    fn group_refusal(r: Result<PlanResult, PlanError>) -> String {
        match r {
            Err(e @ PlanError::PodGroup { .. }) => e.to_string(),
            other => panic!("want a PodGroup refusal, got {other:?}"),
        }
    }

    /// The example's two pods share one claim reserved for their PodGroup: the plan
    /// allocates it once, one GPU for the whole group.
    #[test]
    fn a_pod_group_s_shared_claim_is_one_allocation_for_the_group() {
        let r = plan_group(None, "DRAWorkloadResourceClaims=true").unwrap();
        let allocated: Vec<_> = r
            .outcomes
            .iter()
            .map(|o| match o {
                Outcome::Allocated(c) => c.metadata.name.clone().unwrap_or_default(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(allocated, ["gang-gpu"]);
    }

    /// Without DRAWorkloadResourceClaims the server drops the group's claims and each
    /// pod would need its own: refused, saying which gate.
    #[test]
    fn a_pod_group_s_claims_without_the_gate_are_refused_with_the_reason() {
        let why = group_refusal(plan_group(None, ""));
        assert!(
            why.starts_with("PodGroup default/trainers: spec.resourceClaims needs the DRAWorkloadResourceClaims gate"),
            "{why}"
        );
    }

    /// A gang whose pods each have a claim of their own (from a template) must place all
    /// of them at once; the plan has one claim per template, so it refuses the gang.
    #[test]
    fn a_gang_whose_pods_have_claims_of_their_own_is_refused() {
        let text = "apiVersion: scheduling.k8s.io/v1beta1\nkind: PodGroup\nmetadata: {name: g}\n\
            spec: {schedulingPolicy: {gang: {minCount: 3}}}\n---\n\
            apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: own}\n\
            spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.tessera.dev}}]}}}\n---\n\
            apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: 3, selector: {}, \
            template: {spec: {schedulingGroup: {podGroupName: g}, \
            resourceClaims: [{name: gpu, resourceClaimTemplateName: own}], containers: []}}}\n";
        let why = group_refusal(plan_group(Some(text), "DRAWorkloadResourceClaims=true"));
        assert!(
            why.contains("a gang (minCount 3) whose pods have claims of their own (own)"),
            "{why}"
        );
        // The same gang whose pods claim nothing of their own: only the group's claims,
        // none here, so nothing to refuse and nothing but the template to plan.
        let shared_only = text.replace(
            ", \
            resourceClaims: [{name: gpu, resourceClaimTemplateName: own}]",
            "",
        );
        assert!(shared_only.len() < text.len());
        let r = plan_group(Some(&shared_only), "DRAWorkloadResourceClaims=true").unwrap();
        assert_eq!(r.outcomes.len(), 1);
    }

    /// A group's claim must be among the inputs: its one allocation is what the plan is for.
    #[test]
    fn a_pod_group_naming_a_claim_not_among_the_inputs_is_refused() {
        let text = "apiVersion: scheduling.k8s.io/v1beta1\nkind: PodGroup\nmetadata: {name: g, namespace: ml}\n\
            spec: {schedulingPolicy: {basic: {}}, resourceClaims: [{name: gpu, resourceClaimTemplateName: absent}]}\n";
        let why = group_refusal(plan_group(Some(text), "DRAWorkloadResourceClaims=true"));
        assert!(
            why.starts_with("PodGroup ml/g: spec.resourceClaims[gpu] names absent, which is not among the inputs"),
            "{why}"
        );
    }

    fn names(taken: &[(usize, serde_json::Value)]) -> Vec<(usize, String)> {
        taken
            .iter()
            .map(|(i, v)| (*i, describe(v)))
            .collect::<Vec<_>>()
    }

    /// A folder as `deploy/deviceclasses/` holds it: the kustomization (with or without
    /// its own kind) and a Namespace are set aside, the DeviceClasses taken in order,
    /// each with its index in the stream for error messages.
    #[test]
    fn split_takes_the_kind_and_sets_the_rest_aside() {
        let (take, skip) = split_kind(
            docs(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [a.yaml]\n\
                 ---\napiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: a}\n\
                 ---\nresources: [b.yaml]\n\
                 ---\napiVersion: v1\nkind: Namespace\nmetadata: {name: gpu}\n\
                 ---\napiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: b}\n",
            ),
            "DeviceClass",
        );
        assert_eq!(
            names(&take),
            [
                (1, "resource.k8s.io/v1 DeviceClass a".to_string()),
                (4, "resource.k8s.io/v1 DeviceClass b".to_string())
            ]
        );
        assert_eq!(
            names(&skip),
            [
                (
                    0,
                    "kustomize.config.k8s.io/v1beta1 Kustomization ?".to_string()
                ),
                (2, "? ? ?".to_string()),
                (3, "v1 Namespace gpu".to_string())
            ]
        );
    }

    /// A document of the kind in another version of the group, or with no apiVersion,
    /// is taken, so that decoding reports it; the same kind name in another API group
    /// (a CRD called DeviceClass) is someone else's and set aside.
    #[test]
    fn split_takes_a_malformed_document_of_the_kind_and_leaves_other_groups() {
        let (take, skip) = split_kind(
            docs(
                "apiVersion: resource.k8s.io/v1beta1\nkind: DeviceClass\nmetadata: {name: old}\n\
                 ---\nkind: DeviceClass\nmetadata: {name: bare}\n\
                 ---\napiVersion: example.com/v1\nkind: DeviceClass\nmetadata: {name: crd}\n",
            ),
            "DeviceClass",
        );
        assert_eq!(
            names(&take),
            [
                (0, "resource.k8s.io/v1beta1 DeviceClass old".to_string()),
                (1, "? DeviceClass bare".to_string())
            ]
        );
        assert_eq!(
            names(&skip),
            [(2, "example.com/v1 DeviceClass crd".to_string())]
        );
    }

    /// A `List` (what `tessera inventory` prints) is unpacked before the split, so its
    /// items count one by one.
    #[test]
    fn split_sees_the_items_of_a_list() {
        let (take, skip) = split_kind(
            docs(
                "apiVersion: v1\nkind: List\nitems:\n\
                 - {apiVersion: resource.k8s.io/v1, kind: ResourceSlice, metadata: {name: s0}}\n\
                 - {apiVersion: v1, kind: ConfigMap, metadata: {name: c}}\n",
            ),
            "ResourceSlice",
        );
        assert_eq!(
            names(&take),
            [(0, "resource.k8s.io/v1 ResourceSlice s0".to_string())]
        );
        assert_eq!(names(&skip), [(1, "v1 ConfigMap c".to_string())]);
    }

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(d.path().join(name), text).unwrap();
        }
        d
    }

    const CLASS: &str = "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: gpu.example.com}\nspec: {}\n";
    const KUSTOMIZATION: &str =
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [gpu.yaml]\n";

    /// A DeviceClass with the right kind and bad content is an error naming the file,
    /// the document and the field, even with a kustomization beside it.
    #[test]
    fn a_malformed_device_class_is_an_error_naming_where() {
        let d = dir_with(&[
            (
                "gpu.yaml",
                "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: bad}\nspec: {selectors: 3}\n",
            ),
            ("kustomization.yaml", KUSTOMIZATION),
        ]);
        let err = read_classes(d.path()).unwrap_err().to_string();
        assert!(err.contains("gpu.yaml: document 0"), "{err}");
        assert!(err.contains("spec.selectors"), "{err}");
    }

    /// A folder of classes with its kustomization reads as its classes; a folder with
    /// no class at all is an error that says what it found instead.
    #[test]
    fn classes_folder_reads_its_classes_and_an_empty_one_says_what_it_held() {
        let d = dir_with(&[("gpu.yaml", CLASS), ("kustomization.yaml", KUSTOMIZATION)]);
        let classes = read_classes(d.path()).unwrap();
        assert_eq!(
            classes
                .iter()
                .map(|c| c.metadata.name.clone().unwrap())
                .collect::<Vec<_>>(),
            ["gpu.example.com"]
        );
        let only = dir_with(&[("kustomization.yaml", KUSTOMIZATION)]);
        let err = read_classes(only.path()).unwrap_err().to_string();
        assert!(err.contains("no DeviceClass"), "{err}");
        assert!(err.contains("Kustomization"), "{err}");
    }

    /// Claims beside other manifests: the kustomization and a ConfigMap are no steps,
    /// and a claim in a version the model does not read is still an error.
    #[test]
    fn claim_streams_skip_other_kinds_but_not_bad_claims() {
        let claim = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c1}\nspec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.example.com}}]}}\n";
        let d = dir_with(&[
            ("claims.yaml", claim),
            ("kustomization.yaml", KUSTOMIZATION),
            (
                "config.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
            ),
        ]);
        let steps = read_steps(&[d.path().to_path_buf()]).unwrap();
        assert_eq!(steps.len(), 1);
        let old = dir_with(&[(
            "old.yaml",
            &claim.replace("resource.k8s.io/v1", "resource.k8s.io/v1beta1"),
        )]);
        let err = read_steps(&[old.path().to_path_buf()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("old.yaml: document 0"), "{err}");
        assert!(err.contains("resource.k8s.io/v1beta1"), "{err}");
    }
}
