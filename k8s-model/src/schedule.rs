//! `tessera plan`: reading slices, DeviceClasses and claims from files, allocating the
//! claims in order with [`crate::allocator::Allocator`], and rendering the outcome.
//!
//! Inputs are YAML or JSON, one or more documents per file; a `v1` `List` (what
//! `tessera inventory` prints) is unpacked. Besides ResourceClaims, a claim stream may
//! hold release steps, so that tests and users can model claims coming and going:
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
    #[error(transparent)]
    Alloc(#[from] AllocError),
}

/// One step of a plan.
#[derive(Debug, Clone)]
pub enum Step {
    Allocate(Box<ResourceClaim>),
    Release(Vec<(String, String)>),
}

/// Splits YAML/JSON text into JSON values, unpacking `List`s.
pub fn documents(text: &str, source_name: &str) -> Result<Vec<serde_json::Value>, PlanError> {
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

/// ResourceSlices from a file (or `-`), in document order.
pub fn read_slices(path: &Path) -> Result<Vec<ResourceSlice>, PlanError> {
    let name = path.display().to_string();
    documents(&read(path)?, &name)?
        .into_iter()
        .enumerate()
        .map(|(i, v)| decode(v, &name, i))
        .collect()
}

/// DeviceClasses from a directory or file; the built-in ones when `None`.
pub fn read_classes(path: &Path) -> Result<Vec<DeviceClass>, PlanError> {
    let mut out = Vec::new();
    for f in files(path)? {
        let name = f.display().to_string();
        for (i, v) in documents(&read(&f)?, &name)?.into_iter().enumerate() {
            out.push(decode(v, &name, i)?);
        }
    }
    Ok(out)
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

/// Kinds that may sit beside claims in a file (an example's Pod or Deployment) and are
/// skipped.
const WORKLOAD_KINDS: &[&str] = &[
    "Pod",
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "Job",
    "CronJob",
];

/// Claims and release steps from files or directories, in order. A
/// ResourceClaimTemplate stands for one claim named after it; workloads are skipped.
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
                } else if v["kind"] == "ResourceClaimTemplate" {
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
                } else if v["kind"] == "ResourceClaim" || v.get("kind").is_none() {
                    let mut claim: ResourceClaim = decode(v, &name, i)?;
                    if claim.metadata.namespace.is_none() {
                        claim.metadata.namespace = Some("default".into());
                    }
                    out.push(Step::Allocate(Box::new(claim)));
                } else if !WORKLOAD_KINDS.contains(&v["kind"].as_str().unwrap_or_default()) {
                    return Err(PlanError::Decode {
                        source_name: name.clone(),
                        index: i,
                        reason: format!(
                            "kind {} is not a ResourceClaim, ResourceClaimTemplate, Release or workload",
                            v["kind"]
                        ),
                    });
                }
                // Workloads (the Pods and Deployments of an example) are not steps.
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
