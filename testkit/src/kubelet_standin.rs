//! A kubelet stand-in for tests and the demo: it talks to the plugin over the real
//! sockets exactly as the kubelet does (registration `GetInfo` and
//! `NotifyRegistrationStatus`, then DRA `v1` or `v1beta1`, and the DRA health stream
//! `v1alpha1.DRAResourceHealth` when the plugin advertises it).

use std::path::Path;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use tessera::kubelet::proto::{dra_v1, dra_v1beta1, health_v1alpha1, registration};

#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("cannot connect to {path}")]
    Connect {
        path: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("gRPC call {call} failed")]
    Call {
        call: &'static str,
        #[source]
        source: tonic::Status,
    },
    #[error("the plugin offers none of the kubelet's versions: {0:?}")]
    NoCommonVersion(Vec<String>),
}

/// How long the registration dial keeps trying, as the kubelet's (`dialTimeoutDuration`
/// in pkg/kubelet/pluginmanager/operationexecutor: a blocking gRPC dial).
pub const REGISTRATION_DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to the registration socket as the kubelet's plugin watcher does: a refused
/// connection or a missing file is tried again until `REGISTRATION_DIAL_TIMEOUT`. A
/// socket's file exists from `bind`, before `listen` accepts, and the watcher reacts to
/// the file. Only registration blocks so: the kubelet's DRA and health clients
/// (`grpc.NewClient`) fail at once, as `connect_unix` does.
async fn dial_blocking(path: &Path) -> std::io::Result<tokio::net::UnixStream> {
    let deadline = Instant::now() + REGISTRATION_DIAL_TIMEOUT;
    let mut pause = Duration::from_millis(5);
    loop {
        match tokio::net::UnixStream::connect(path).await {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                ) && Instant::now() < deadline =>
            {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

/// Opens a gRPC channel over a Unix socket; `blocking`: dial as the registration does.
async fn channel(path: &Path, blocking: bool) -> Result<Channel, KubeletError> {
    let p = path.to_path_buf();
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = p.clone();
            async move {
                let stream = if blocking {
                    dial_blocking(&p).await?
                } else {
                    tokio::net::UnixStream::connect(&p).await?
                };
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|source| KubeletError::Connect {
            path: path.display().to_string(),
            source,
        })
}

/// Opens a gRPC channel over a Unix socket, failing at once when nothing listens.
pub async fn connect_unix(path: &Path) -> Result<Channel, KubeletError> {
    channel(path, false).await
}

/// Which DRA API version the kubelet picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraVersion {
    V1,
    V1beta1,
}

/// Registers like the kubelet's plugin watcher: `GetInfo`, then choose the first of the
/// plugin's versions that this kubelet supports, then `NotifyRegistrationStatus`.
/// Returns the plugin's info and the chosen version.
pub async fn register(
    registration_socket: &Path,
    kubelet_versions: &[&str],
) -> Result<(registration::PluginInfo, DraVersion), KubeletError> {
    let ch = channel(registration_socket, true).await?;
    let mut c = registration::registration_client::RegistrationClient::new(ch);
    let info = c
        .get_info(registration::InfoRequest {})
        .await
        .map_err(|source| KubeletError::Call {
            call: "GetInfo",
            source,
        })?
        .into_inner();
    let chosen = info
        .supported_versions
        .iter()
        .find(|v| kubelet_versions.contains(&v.as_str()))
        .cloned();
    let version = match chosen.as_deref() {
        Some("v1.DRAPlugin") => DraVersion::V1,
        Some("v1beta1.DRAPlugin") => DraVersion::V1beta1,
        _ => {
            let _ = c
                .notify_registration_status(registration::RegistrationStatus {
                    plugin_registered: false,
                    error: "no supported version".into(),
                })
                .await;
            return Err(KubeletError::NoCommonVersion(info.supported_versions));
        }
    };
    c.notify_registration_status(registration::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .map_err(|source| KubeletError::Call {
        call: "NotifyRegistrationStatus",
        source,
    })?;
    Ok((info, version))
}

/// One DRA call wrapper: the request and response shapes are identical in both
/// versions apart from their package.
macro_rules! dra_call {
    ($(#[$doc:meta])* $fn_name:ident, $client:ident, $pkg:ident, $rpc:ident, $req:ident, $resp:ident, $label:literal) => {
        $(#[$doc])*
        pub async fn $fn_name(&self, claims: &[KubeletClaim]) -> Result<$pkg::$resp, KubeletError> {
            let req = $pkg::$req {
                claims: claims
                    .iter()
                    .map(|c| $pkg::Claim {
                        namespace: c.namespace.clone(),
                        uid: c.uid.clone(),
                        name: c.name.clone(),
                    })
                    .collect(),
            };
            Ok(self
                .$client
                .clone()
                .$rpc(req)
                .await
                .map_err(|source| KubeletError::Call { call: $label, source })?
                .into_inner())
        }
    };
}

/// A DRA client on the plugin's endpoint.
#[derive(Clone)]
pub struct DraClient {
    v1: dra_v1::dra_plugin_client::DraPluginClient<Channel>,
    v1beta1: dra_v1beta1::dra_plugin_client::DraPluginClient<Channel>,
}

/// One claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletClaim {
    pub namespace: String,
    pub uid: String,
    pub name: String,
}

impl DraClient {
    pub async fn connect(endpoint: &Path) -> Result<Self, KubeletError> {
        let ch = connect_unix(endpoint).await?;
        Ok(DraClient {
            v1: dra_v1::dra_plugin_client::DraPluginClient::new(ch.clone()),
            v1beta1: dra_v1beta1::dra_plugin_client::DraPluginClient::new(ch),
        })
    }

    dra_call!(
        /// `NodePrepareResources` over v1.
        prepare_v1, v1, dra_v1, node_prepare_resources, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
        "v1.NodePrepareResources"
    );
    dra_call!(
        /// `NodeUnprepareResources` over v1.
        unprepare_v1, v1, dra_v1, node_unprepare_resources, NodeUnprepareResourcesRequest,
        NodeUnprepareResourcesResponse, "v1.NodeUnprepareResources"
    );
    dra_call!(
        /// `NodePrepareResources` over v1beta1.
        prepare_v1beta1, v1beta1, dra_v1beta1, node_prepare_resources, NodePrepareResourcesRequest,
        NodePrepareResourcesResponse, "v1beta1.NodePrepareResources"
    );
    dra_call!(
        /// `NodeUnprepareResources` over v1beta1.
        unprepare_v1beta1, v1beta1, dra_v1beta1, node_unprepare_resources, NodeUnprepareResourcesRequest,
        NodeUnprepareResourcesResponse, "v1beta1.NodeUnprepareResources"
    );
}

/// The service name the kubelet looks for in `supported_versions` to open the health
/// stream.
pub const HEALTH_SERVICE: &str = "v1alpha1.DRAResourceHealth";

/// Opens the DRA health stream (`NodeWatchResources`) on the plugin's endpoint, as a
/// kubelet with `ResourceHealthStatus` does after registration. Each message is the
/// driver's complete device list.
pub async fn watch_health(
    endpoint: &Path,
) -> Result<tonic::Streaming<health_v1alpha1::NodeWatchResourcesResponse>, KubeletError> {
    let ch = connect_unix(endpoint).await?;
    let mut c = health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(ch);
    Ok(
        c.node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
            .await
            .map_err(|source| KubeletError::Call {
                call: "v1alpha1.NodeWatchResources",
                source,
            })?
            .into_inner(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket file nobody listens on (bound, then its listener dropped): a connect
    /// is refused, as between another process's `bind` and `listen`.
    fn refusing_socket(path: &Path) {
        drop(std::os::unix::net::UnixListener::bind(path).unwrap());
    }

    #[tokio::test]
    async fn the_registration_dial_waits_for_the_socket_to_listen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reg.sock");
        refusing_socket(&path);
        let listening = path.clone();
        let listener = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            std::fs::remove_file(&listening).unwrap();
            tokio::net::UnixListener::bind(&listening).unwrap()
        });
        let t = Instant::now();
        let dialed = dial_blocking(&path).await;
        let _listener = listener.await.unwrap();
        assert!(dialed.is_ok(), "{dialed:?}");
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
    }

    #[tokio::test]
    async fn the_registration_dial_waits_for_the_socket_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reg.sock");
        let listening = path.clone();
        let listener = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            tokio::net::UnixListener::bind(&listening).unwrap()
        });
        let dialed = dial_blocking(&path).await;
        let _listener = listener.await.unwrap();
        assert!(dialed.is_ok(), "{dialed:?}");
    }

    #[tokio::test]
    async fn other_dials_fail_at_once_when_nothing_listens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dra.sock");
        refusing_socket(&path);
        let t = Instant::now();
        assert!(connect_unix(&path).await.is_err());
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
}
