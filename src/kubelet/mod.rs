//! The kubelet-facing gRPC services: DRA `v1` and `v1beta1` on the DRA socket, and
//! plugin registration on the registration socket. Handlers only translate: fetch each
//! claim from the API server (outside any lock), hand it to [`DeviceState`] on a
//! blocking thread, and encode per-claim results. Every requested claim gets an entry;
//! failures are per-claim error strings, never a whole-call error.

pub mod proto;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::{Instrument, info, info_span, warn};

use crate::claim_status::reporter::StatusQueue;
use crate::claim_status::writer::ClaimKey;
use crate::kubelet::proto::{dra_v1, dra_v1beta1, registration};
use crate::prepare::checkpoint::PreparedDevice;
use crate::prepare::state::DeviceState;

/// The services advertised at registration: the DRA versions in order of preference,
/// then the DRA health service (`crate::device_health::watcher`), as the Go helper lists them.
pub const SUPPORTED_VERSIONS: [&str; 3] = [
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1alpha1.DRAResourceHealth",
];
/// How long one claim GET may take; well inside the kubelet's 45 s call deadline.
const CLAIM_GET_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the claim GET before a prepare failed; [`FetchError::reason`] is its bounded
/// label in the error metrics.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No answer within [`CLAIM_GET_TIMEOUT`].
    #[error("getting ResourceClaim {namespace}/{name} timed out")]
    Timeout { namespace: String, name: String },
    /// The API server answered with an error, or could not be reached.
    #[error("getting ResourceClaim {namespace}/{name}")]
    Api {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The ResourceClaim does not exist (any more).
    #[error("ResourceClaim {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    /// It exists with another UID: deleted and created again.
    #[error(transparent)]
    Replaced(crate::prepare::claim_plan::ClaimError),
}

impl FetchError {
    /// The `reason` label of `tessera_claim_errors_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            FetchError::NotFound { .. } => "claim_not_found",
            FetchError::Replaced(_) => "claim_replaced",
            FetchError::Api { .. } => "claim_api",
            FetchError::Timeout { .. } => "claim_timeout",
        }
    }

    /// The kubelet's per-claim error string: this error and its direct cause (a
    /// `kube::Error` prints its own causes).
    pub fn message(&self) -> String {
        match std::error::Error::source(self) {
            Some(cause) if !matches!(self, FetchError::Replaced(_)) => format!("{self}: {cause}"),
            _ => self.to_string(),
        }
    }
}

/// A claim reference as the kubelet sends it (the same in v1 and v1beta1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub uid: String,
    pub name: String,
}

/// The shared implementation behind both DRA versions.
#[derive(Clone)]
pub struct Driver {
    state: Arc<DeviceState>,
    client: kube::Client,
    /// Where prepared and unprepared claims are reported for their `status.devices`.
    status: Option<StatusQueue>,
}

impl Driver {
    pub fn new(state: Arc<DeviceState>, client: kube::Client) -> Self {
        Driver {
            state,
            client,
            status: None,
        }
    }

    /// Reports each claim prepared or unprepared to `queue` (the `status.devices`
    /// reporter), after answering it: the status write never fails a prepare.
    pub fn reporting_to(mut self, queue: StatusQueue) -> Self {
        self.status = Some(queue);
        self
    }

    fn report(&self, c: &ClaimRef) {
        if let Some(q) = &self.status {
            q.claim_changed(ClaimKey {
                uid: c.uid.clone(),
                namespace: c.namespace.clone(),
                name: c.name.clone(),
            });
        }
    }

    /// GETs the claim the kubelet names and checks it is the one with its UID. A
    /// failure is counted in the error metrics by its bounded reason.
    ///
    /// This is the only UID check a re-prepare meets: `DeviceState::prepare` answers a
    /// claim already prepared from its checkpoint, before `claim_plan::plan_claim` (whose
    /// own check guards the pure planner) runs.
    async fn fetch(&self, c: &ClaimRef) -> Result<ResourceClaim, FetchError> {
        let r = self.fetch_inner(c).await;
        if let Err(e) = &r {
            crate::telemetry::metrics::driver().error("prepare", e.reason());
        }
        r
    }

    async fn fetch_inner(&self, c: &ClaimRef) -> Result<ResourceClaim, FetchError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        let (namespace, name) = (c.namespace.clone(), c.name.clone());
        match tokio::time::timeout(CLAIM_GET_TIMEOUT, api.get_opt(&c.name)).await {
            Err(_) => Err(FetchError::Timeout { namespace, name }),
            Ok(Err(source)) => Err(FetchError::Api {
                namespace,
                name,
                source,
            }),
            Ok(Ok(None)) => Err(FetchError::NotFound { namespace, name }),
            Ok(Ok(Some(claim))) => match claim.metadata.uid.as_deref() {
                Some(uid) if uid == c.uid => Ok(claim),
                found => Err(FetchError::Replaced(
                    crate::prepare::claim_plan::ClaimError::UidMismatch {
                        namespace,
                        name,
                        expected: c.uid.clone(),
                        found: found.unwrap_or_default().to_string(),
                    },
                )),
            },
        }
    }

    /// Prepares each claim; the result map has one entry per claim UID.
    pub async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, String>> {
        let mut out = HashMap::with_capacity(claims.len());
        for c in claims {
            let span =
                info_span!("prepare", claim = %c.uid, namespace = %c.namespace, name = %c.name);
            let result = async {
                let claim = self.fetch(&c).await.map_err(|e| e.message())?;
                let state = self.state.clone();
                let uid = c.uid.clone();
                let r = tokio::task::spawn_blocking(move || state.prepare(&claim, &uid))
                    .await
                    .map_err(|e| {
                        crate::telemetry::metrics::driver().error("prepare", "task");
                        format!("prepare task failed: {e}")
                    })?
                    .map_err(|e| e.chain());
                match &r {
                    Ok(devs) => {
                        let names: Vec<&str> =
                            devs.iter().map(|d| d.device_name.as_str()).collect();
                        info!(devices = ?names, "prepared");
                        self.report(&c);
                    }
                    Err(e) => warn!(error = %e, "prepare failed"),
                }
                r
            }
            .instrument(span)
            .await;
            out.insert(c.uid, result);
        }
        out
    }

    /// Unprepares each claim; unknown claims succeed.
    pub async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), String>> {
        let mut out = HashMap::with_capacity(claims.len());
        for c in claims {
            let state = self.state.clone();
            let uid = c.uid.clone();
            let r = tokio::task::spawn_blocking(move || state.unprepare(&uid))
                .instrument(info_span!("unprepare", claim = %c.uid))
                .await
                .map_err(|e| {
                    crate::telemetry::metrics::driver().error("unprepare", "task");
                    format!("unprepare task failed: {e}")
                })
                .and_then(|r| r.map_err(|e| e.chain()));
            match &r {
                Ok(()) => {
                    info!(claim = %c.uid, "unprepared");
                    self.report(&c);
                }
                Err(e) => warn!(claim = %c.uid, error = %e, "unprepare failed"),
            }
            out.insert(c.uid, r);
        }
        out
    }
}

/// `DRAPlugin` v1.
pub struct DraV1(pub Driver);
/// `DRAPlugin` v1beta1 (no `share_id`).
pub struct DraV1beta1(pub Driver);

macro_rules! claim_refs {
    ($claims:expr) => {
        $claims
            .into_iter()
            .map(|c| ClaimRef {
                namespace: c.namespace,
                uid: c.uid,
                name: c.name,
            })
            .collect()
    };
}

#[tonic::async_trait]
impl dra_v1::dra_plugin_server::DraPlugin for DraV1 {
    async fn node_prepare_resources(
        &self,
        req: Request<dra_v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodePrepareResourcesResponse>, Status> {
        let results = self.0.prepare(claim_refs!(req.into_inner().claims)).await;
        let claims = results
            .into_iter()
            .map(|(uid, r)| {
                let resp = match r {
                    Ok(devs) => dra_v1::NodePrepareResourceResponse {
                        devices: devs
                            .into_iter()
                            .map(|d| dra_v1::Device {
                                request_names: d.request_names,
                                pool_name: d.pool_name,
                                device_name: d.device_name,
                                cdi_device_ids: d.cdi_device_ids,
                                share_id: d.share_id,
                            })
                            .collect(),
                        error: String::new(),
                    },
                    Err(e) => dra_v1::NodePrepareResourceResponse {
                        devices: vec![],
                        error: e,
                    },
                };
                (uid, resp)
            })
            .collect();
        Ok(Response::new(dra_v1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<dra_v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodeUnprepareResourcesResponse>, Status> {
        let results = self.0.unprepare(claim_refs!(req.into_inner().claims)).await;
        let claims = results
            .into_iter()
            .map(|(uid, r)| {
                (
                    uid,
                    dra_v1::NodeUnprepareResourceResponse {
                        error: r.err().unwrap_or_default(),
                    },
                )
            })
            .collect();
        Ok(Response::new(dra_v1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

#[tonic::async_trait]
impl dra_v1beta1::dra_plugin_server::DraPlugin for DraV1beta1 {
    async fn node_prepare_resources(
        &self,
        req: Request<dra_v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1beta1::NodePrepareResourcesResponse>, Status> {
        let results = self.0.prepare(claim_refs!(req.into_inner().claims)).await;
        let claims = results
            .into_iter()
            .map(|(uid, r)| {
                let resp = match r {
                    Ok(devs) => dra_v1beta1::NodePrepareResourceResponse {
                        devices: devs
                            .into_iter()
                            .map(|d| dra_v1beta1::Device {
                                request_names: d.request_names,
                                pool_name: d.pool_name,
                                device_name: d.device_name,
                                cdi_device_ids: d.cdi_device_ids,
                            })
                            .collect(),
                        error: String::new(),
                    },
                    Err(e) => dra_v1beta1::NodePrepareResourceResponse {
                        devices: vec![],
                        error: e,
                    },
                };
                (uid, resp)
            })
            .collect();
        Ok(Response::new(dra_v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<dra_v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let results = self.0.unprepare(claim_refs!(req.into_inner().claims)).await;
        let claims = results
            .into_iter()
            .map(|(uid, r)| {
                (
                    uid,
                    dra_v1beta1::NodeUnprepareResourceResponse {
                        error: r.err().unwrap_or_default(),
                    },
                )
            })
            .collect();
        Ok(Response::new(dra_v1beta1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

/// The registration service the kubelet's plugin watcher talks to.
pub struct Registrar {
    pub driver_name: String,
    /// Absolute path of the DRA socket.
    pub endpoint: String,
    /// Last status the kubelet reported: `Some(Ok(()))` once registered.
    pub status: watch::Sender<Option<Result<(), String>>>,
}

#[tonic::async_trait]
impl registration::registration_server::Registration for Registrar {
    async fn get_info(
        &self,
        _req: Request<registration::InfoRequest>,
    ) -> Result<Response<registration::PluginInfo>, Status> {
        Ok(Response::new(registration::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: self.driver_name.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<registration::RegistrationStatus>,
    ) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            info!("registered with the kubelet");
            self.status.send_replace(Some(Ok(())));
            Ok(Response::new(registration::RegistrationStatusResponse {}))
        } else {
            warn!(error = %s.error, "the kubelet refused the registration");
            self.status.send_replace(Some(Err(s.error.clone())));
            Err(Status::internal(format!(
                "registration failed: {}",
                s.error
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each claim GET failure has its own bounded reason, and the kubelet's message
    /// names the claim once (a replaced claim: the UID check's own message).
    #[test]
    fn fetch_errors_have_bounded_reasons_and_plain_messages() {
        let (namespace, name) = ("ns".to_string(), "c".to_string());
        let cases = [
            (
                FetchError::Timeout {
                    namespace: namespace.clone(),
                    name: name.clone(),
                },
                "claim_timeout",
                "getting ResourceClaim ns/c timed out",
            ),
            (
                FetchError::NotFound {
                    namespace: namespace.clone(),
                    name: name.clone(),
                },
                "claim_not_found",
                "ResourceClaim ns/c not found",
            ),
        ];
        for (e, reason, message) in cases {
            assert_eq!((e.reason(), e.message().as_str()), (reason, message));
        }
        let mismatch = crate::prepare::claim_plan::ClaimError::UidMismatch {
            namespace,
            name,
            expected: "a".into(),
            found: "b".into(),
        };
        let want = mismatch.to_string();
        let e = FetchError::Replaced(mismatch);
        assert_eq!((e.reason(), e.message()), ("claim_replaced", want));
    }
}
