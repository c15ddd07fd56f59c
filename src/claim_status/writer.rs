//! The kube edge of `status.devices`: the [`ClaimStatusWriter`] seam and its API server
//! implementation, [`KubeClaimStatus`].
//!
//! The write path is the one the API server authorizes for a node-local driver: a `PUT`
//! of the `status` subresource (RBAC `update resourceclaims/status`), with the
//! resourceVersion of the GET before it, so that a concurrent writer (the scheduler,
//! another driver) is never overwritten: a conflict GETs and merges again. From 1.36
//! (DRAResourceClaimGranularStatusAuthorization) the server also checks, for each
//! driver whose entries change, the synthetic `resourceclaims/driver` subresource with
//! the driver as the name and the verb `associated-node:update` (the caller is the
//! service account of a pod on the node the claim is allocated to) or
//! `arbitrary-node:update`. Tessera's RBAC grants only the former, so the plugin can
//! write only the claims of its own node.

use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use kube::api::{Api, PostParams};

use crate::claim_status::next_devices;

/// How long one GET or PUT may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// GET-merge-PUT rounds before a run of conflicts counts as a failure (retried later).
pub const CONFLICT_ROUNDS: u32 = 3;

/// The claim a status write is for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimKey {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The claim's `status.devices` now holds exactly our entries.
    Updated,
    /// It already did (or the claim is not allocated): no write was needed.
    Unchanged,
    /// The claim is gone, or is another claim now (another UID): nothing to write.
    Gone,
}

/// Why a status write failed. The reporter retries it.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("getting ResourceClaim {namespace}/{name} for its status")]
    Get {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing the status of ResourceClaim {namespace}/{name}")]
    Put {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("ResourceClaim {namespace}/{name}: the API server did not answer within {timeout:?}")]
    Timeout {
        namespace: String,
        name: String,
        timeout: Duration,
    },
    #[error(
        "ResourceClaim {namespace}/{name} changed under each of {CONFLICT_ROUNDS} status writes"
    )]
    Conflicts { namespace: String, name: String },
}

impl StatusError {
    /// A bounded reason for the error metrics (`op="claim_status"`).
    pub fn reason(&self) -> &'static str {
        match self {
            StatusError::Get { .. } => "status_get",
            StatusError::Put { .. } => "status_put",
            StatusError::Timeout { .. } => "status_timeout",
            StatusError::Conflicts { .. } => "status_conflict",
        }
    }
}

/// Where a claim's `status.devices` is written: the API server in the plugin, a
/// recording double in tests.
pub trait ClaimStatusWriter: Send + Sync {
    /// Makes `driver`'s entries of claim `key` be `ours` (none: removes them), keeping
    /// every other driver's. Entries for devices the claim's allocation does not hold
    /// are left out.
    fn write<'a>(
        &'a self,
        key: &'a ClaimKey,
        driver: &'a str,
        ours: Vec<AllocatedDeviceStatus>,
    ) -> BoxFuture<'a, Result<Written, StatusError>>;
}

/// [`ClaimStatusWriter`] over the API server: GET, [`next_devices`], PUT `status`.
pub struct KubeClaimStatus {
    pub client: kube::Client,
}

impl KubeClaimStatus {
    async fn write_inner(
        &self,
        key: &ClaimKey,
        driver: &str,
        ours: Vec<AllocatedDeviceStatus>,
    ) -> Result<Written, StatusError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &key.namespace);
        let timeout = || StatusError::Timeout {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            timeout: CALL_TIMEOUT,
        };
        for _ in 0..CONFLICT_ROUNDS {
            let got = tokio::time::timeout(CALL_TIMEOUT, api.get_opt(&key.name))
                .await
                .map_err(|_| timeout())?
                .map_err(|source| StatusError::Get {
                    namespace: key.namespace.clone(),
                    name: key.name.clone(),
                    source,
                })?;
            let Some(mut claim) = got else {
                return Ok(Written::Gone);
            };
            if claim.metadata.uid.as_deref() != Some(key.uid.as_str()) {
                return Ok(Written::Gone);
            }
            let Some(next) = next_devices(&claim, driver, ours.clone()) else {
                return Ok(Written::Unchanged);
            };
            if let Some(s) = claim.status.as_mut() {
                s.devices = (!next.is_empty()).then_some(next);
            }
            // Only the status subresource is written; the spec and metadata are ignored
            // by it, and the resourceVersion makes a concurrent change a 409.
            let put = tokio::time::timeout(
                CALL_TIMEOUT,
                api.replace_status(&key.name, &PostParams::default(), &claim),
            )
            .await
            .map_err(|_| timeout())?;
            match put {
                Ok(_) => return Ok(Written::Updated),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Written::Gone),
                Err(source) => {
                    return Err(StatusError::Put {
                        namespace: key.namespace.clone(),
                        name: key.name.clone(),
                        source,
                    });
                }
            }
        }
        Err(StatusError::Conflicts {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
        })
    }
}

impl ClaimStatusWriter for KubeClaimStatus {
    fn write<'a>(
        &'a self,
        key: &'a ClaimKey,
        driver: &'a str,
        ours: Vec<AllocatedDeviceStatus>,
    ) -> BoxFuture<'a, Result<Written, StatusError>> {
        Box::pin(self.write_inner(key, driver, ours))
    }
}
