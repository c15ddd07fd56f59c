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
    #[error(transparent)]
    Alloc(#[from] AllocError),
}

/// One step of a plan.
#[derive(Debug, Clone)]
pub enum Step {
    Allocate(Box<ResourceClaim>),
    Release(Vec<(String, String)>),
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
    for p in paths {
        for f in files(p)? {
            let name = f.display().to_string();
            for (i, v) in documents(&read(&f)?, &name)?.into_iter().enumerate() {
                if v["kind"] == "Release" {
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
    Ok(out)
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
    let mut alloc = Allocator::new(slices, classes, gates)?;
    let mut outcomes = Vec::new();
    for step in steps {
        match step {
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
