//! Device metadata files (KEP-5304, "DRA Device Attributes Downward API"): per claim
//! and request, a JSON file describing the allocated devices, mounted read-only into
//! the containers that use the request, at the path the KEP fixes:
//!
//! * a claim the pod names (`resourceClaimName`):
//!   `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/gpu.tessera.dev-metadata.json`;
//! * a claim made from a template: `…/resourceclaimtemplates/<pod claim name>/<request>/…`,
//!   the pod claim name being the claim's `resource.kubernetes.io/pod-claim-name`
//!   annotation (what `pod.spec.resourceClaims[].name` says).
//!
//! The file is a JSON stream: the same `DeviceMetadata` object once per API version,
//! newest first (`metadata.resource.k8s.io/v1beta1`, then `v1alpha1`), each indented
//! by two spaces and followed by a newline, as the Go helper library
//! (`k8s.io/dynamic-resource-allocation/kubeletplugin`, 1.37) writes it, so that its
//! `devicemetadata` decoder and older consumers both read it. Each device carries its
//! ResourceSlice attributes, plus `uuid` (`MIG-…`) for a MIG device, known only once
//! created.
//!
//! Rendering is pure ([`render`], [`add_mounts`]); the files live on the host under
//! `<run-dir>/metadata/<claim uid>/<request>/`, one directory per claim made and
//! removed atomically by `claim_dir`, as the claim files are; start-up ([`sweep`])
//! removes half-made, half-removed and unknown ones.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceClaim};
use serde::Serialize;
use tessera_cdi::{Mount, Spec};

use crate::prepare::checkpoint::PreparedDevice;
use crate::prepare::claim_dir;

/// Where the files are mounted in containers (`metadata.ContainerDir`).
pub const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// `metadata/` under the run dir.
pub const METADATA_DIR: &str = "metadata";
/// The API versions written, newest first.
pub const API_VERSIONS: [&str; 2] = [
    "metadata.resource.k8s.io/v1beta1",
    "metadata.resource.k8s.io/v1alpha1",
];
/// The annotation a claim made from a template carries: the pod's name for it.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// Why a claim's metadata files could not be rendered, written or removed.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// A name that would become a path segment is not a DNS label.
    #[error("device metadata: {what} {value:?} is not a DNS label")]
    Name { what: &'static str, value: String },
    #[error("device metadata: encoding the file of request {request}")]
    Encode {
        request: String,
        #[source]
        source: serde_json::Error,
    },
    /// A filesystem call failed; `what` says which step, `path` where.
    #[error("device metadata: {what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Who a claim is, as the metadata names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimIdentity {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// For a claim made from a template: the pod's name for it.
    pub pod_claim_name: Option<String>,
    /// Each allocation result's full request (`req` or `req/sub`), by (pool, device,
    /// share ID).
    requests: BTreeMap<(String, String, Option<String>), String>,
}

impl ClaimIdentity {
    /// The identity of `claim` (with UID `uid`). Deterministic.
    pub fn of(claim: &ResourceClaim, uid: &str) -> Self {
        let requests = claim
            .status
            .iter()
            .filter_map(|s| s.allocation.as_ref())
            .filter_map(|a| a.devices.as_ref())
            .flat_map(|d| d.results.iter().flatten())
            .map(|r| {
                (
                    (r.pool.clone(), r.device.clone(), r.share_id.clone()),
                    r.request.clone(),
                )
            })
            .collect();
        ClaimIdentity {
            namespace: claim.metadata.namespace.clone().unwrap_or_default(),
            name: claim.metadata.name.clone().unwrap_or_default(),
            uid: uid.to_string(),
            pod_claim_name: claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION))
                .filter(|n| !n.is_empty())
                .cloned(),
            requests,
        }
    }
}

/// One request's file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataFile {
    /// The base request name: the file's directory.
    pub request: String,
    /// Where containers see it.
    pub container_path: String,
    /// The CDI device (name within Tessera's kind) that mounts it: the request's first.
    pub cdi_device: String,
    pub bytes: Vec<u8>,
}

/// `<driver>-metadata.json`.
pub fn file_name(driver: &str) -> String {
    format!("{driver}-metadata.json")
}

/// The in-container path of request `request`'s file of `claim`. Deterministic.
pub fn container_path(driver: &str, claim: &ClaimIdentity, request: &str) -> String {
    let (dir, name) = match &claim.pod_claim_name {
        Some(pod_name) => ("resourceclaimtemplates", pod_name.as_str()),
        None => ("resourceclaims", claim.name.as_str()),
    };
    format!(
        "{CONTAINER_DIR}/{dir}/{name}/{request}/{}",
        file_name(driver)
    )
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Doc<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: Meta<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_claim_name: Option<&'a str>,
    requests: Vec<Request<'a>>,
}

/// `ObjectMeta`'s fields in Go's order.
#[derive(Serialize)]
struct Meta<'a> {
    name: &'a str,
    namespace: &'a str,
    uid: &'a str,
    generation: i64,
}

#[derive(Serialize)]
struct Request<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    devices: Vec<DeviceDoc<'a>>,
}

#[derive(Serialize)]
struct DeviceDoc<'a> {
    driver: &'a str,
    pool: &'a str,
    name: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    attributes: BTreeMap<String, DeviceAttribute>,
}

/// The CDI device name of a device's first CDI device ID (`kind=name`).
fn cdi_name(d: &PreparedDevice) -> Option<&str> {
    d.cdi_device_ids.first()?.split_once('=').map(|(_, n)| n)
}

/// The metadata files of a prepared claim: one per request with devices of `driver`,
/// in request order of first appearance, listing that request's devices with
/// `attributes(device)`. Deterministic.
///
/// # Errors
/// [`MetadataError::Name`] when the claim name, pod claim name or a request name is not
/// a DNS label (it would be a path segment); nothing is rendered then.
pub fn render(
    driver: &str,
    claim: &ClaimIdentity,
    devices: &[PreparedDevice],
    attributes: &dyn Fn(&PreparedDevice) -> BTreeMap<String, DeviceAttribute>,
) -> Result<Vec<MetadataFile>, MetadataError> {
    let label = |what: &'static str, value: &str| {
        if crate::naming::is_dns_label(value) {
            Ok(())
        } else {
            Err(MetadataError::Name {
                what,
                value: value.to_string(),
            })
        }
    };
    match &claim.pod_claim_name {
        Some(n) => label("pod claim name", n)?,
        None => label("claim name", &claim.name)?,
    }
    let mut order: Vec<&str> = Vec::new();
    let mut by_request: BTreeMap<&str, Vec<&PreparedDevice>> = BTreeMap::new();
    for d in devices {
        let Some(request) = d.request_names.first() else {
            continue;
        };
        let base = request.split('/').next().unwrap_or(request);
        label("request name", base)?;
        if !by_request.contains_key(base) {
            order.push(base);
        }
        by_request.entry(base).or_default().push(d);
    }
    let mut files = Vec::with_capacity(order.len());
    for base in order {
        let devs = &by_request[base];
        let Some(first) = devs.first() else { continue };
        let full = claim
            .requests
            .get(&(
                first.pool_name.clone(),
                first.device_name.clone(),
                first.share_id.clone(),
            ))
            .map_or(base, String::as_str);
        let request = Request {
            name: full,
            devices: devs
                .iter()
                .map(|d| DeviceDoc {
                    driver,
                    pool: &d.pool_name,
                    name: &d.device_name,
                    attributes: attributes(d),
                })
                .collect(),
        };
        let mut bytes = Vec::new();
        let mut requests = vec![request];
        for api_version in API_VERSIONS {
            let doc = Doc {
                kind: "DeviceMetadata",
                api_version,
                metadata: Meta {
                    name: &claim.name,
                    namespace: &claim.namespace,
                    uid: &claim.uid,
                    generation: 1,
                },
                pod_claim_name: claim.pod_claim_name.as_deref(),
                requests: std::mem::take(&mut requests),
            };
            serde_json::to_writer_pretty(&mut bytes, &doc).map_err(|source| {
                MetadataError::Encode {
                    request: base.to_string(),
                    source,
                }
            })?;
            bytes.push(b'\n');
            requests = doc.requests;
        }
        files.push(MetadataFile {
            request: base.to_string(),
            container_path: container_path(driver, claim, base),
            cdi_device: cdi_name(first).unwrap_or_default().to_string(),
            bytes,
        });
    }
    Ok(files)
}

/// `<run-dir>/metadata/<uid>`.
pub fn claim_dir(run_dir: &Path, uid: &str) -> PathBuf {
    run_dir.join(METADATA_DIR).join(uid)
}

/// Adds to `spec` a read-only mount of each file, on its request's first CDI device
/// (so only the containers that use the request get it); `host_run_dir` is the run dir
/// as the host sees it. A file whose device is not in the spec is left out.
/// Deterministic.
pub fn add_mounts(
    spec: &mut Spec,
    files: &[MetadataFile],
    driver: &str,
    host_run_dir: &Path,
    uid: &str,
) {
    for f in files {
        if let Some(d) = spec.devices.iter_mut().find(|d| d.name == f.cdi_device) {
            let host = crate::prepare::cdi_spec::join_host(
                host_run_dir,
                &format!("{METADATA_DIR}/{uid}/{}/{}", f.request, file_name(driver)),
            );
            d.container_edits
                .mounts
                .push(Mount::bind_ro(host, f.container_path.clone()));
        }
    }
}

impl From<claim_dir::DirError> for MetadataError {
    fn from(e: claim_dir::DirError) -> Self {
        MetadataError::Io {
            what: e.what,
            path: e.path,
            source: e.source,
        }
    }
}

/// Creates `metadata/<uid>/<request>/<driver>-metadata.json` for each file, as one
/// directory made atomically (a retried prepare replaces it). Files 0444, directories
/// 0755: containers may run as any user.
pub fn create(
    run_dir: &Path,
    uid: &str,
    driver: &str,
    files: &[MetadataFile],
) -> Result<PathBuf, MetadataError> {
    let root = run_dir.join(METADATA_DIR);
    Ok(claim_dir::create(
        &root,
        uid,
        "writing device metadata in",
        |tmp| {
            for f in files {
                let dir = tmp.join(&f.request);
                fs::create_dir(&dir)?;
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
                let path = dir.join(file_name(driver));
                let mut out = File::options().write(true).create_new(true).open(&path)?;
                out.write_all(&f.bytes)?;
                out.sync_all()?;
                fs::set_permissions(&path, fs::Permissions::from_mode(0o444))?;
                tessera_cdi::atomic::sync_dir(&dir)?;
            }
            Ok(())
        },
    )?)
}

/// Removes `metadata/<uid>` (idempotent): renamed aside first, so that a crash leaves
/// either the whole directory or a `.del` that start-up deletes.
pub fn remove(run_dir: &Path, uid: &str) -> Result<(), MetadataError> {
    Ok(claim_dir::remove(&run_dir.join(METADATA_DIR), uid)?)
}

/// Removes every entry of `metadata/` that is not the directory of a claim in `known`.
/// Returns what it removed.
pub fn sweep(run_dir: &Path, known: &BTreeSet<String>) -> Result<Vec<String>, MetadataError> {
    Ok(claim_dir::sweep(&run_dir.join(METADATA_DIR), known)?)
}

#[cfg(test)]
mod tests;
