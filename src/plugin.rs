//! Running the kubelet plugin: recover state, serve DRA on the plugin socket, then
//! register, publish slices, and clean up claims the kubelet forgot, until shutdown.
//! Shape `run(options, node, client, shutdown)`: `main` passes a signal future, tests
//! pass a oneshot.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use sha2::{Digest, Sha256};
use tokio::net::UnixListener;
use tokio::sync::{oneshot, watch};
use tokio_stream::wrappers::UnixListenerStream;
use tracing::{info, warn};

use crate::kubelet::proto::{dra_v1, dra_v1beta1, registration};
use crate::kubelet::{DraV1, DraV1beta1, Driver, Registrar};
use crate::node::NodeModel;
use crate::prepare::cdi_spec::{self, CdiContext};
use crate::prepare::failpoints::FailPoints;
use crate::prepare::state::{DeviceState, PrepareError, StateConfig, UnknownMig};
use crate::publish::Publisher;
use crate::publish::slices::ServerFeatures;

/// The plugin's directories (the CLI's path flags).
#[derive(Debug, Clone)]
pub struct PluginPaths {
    pub plugin_registry_dir: PathBuf,
    pub plugin_dir: PathBuf,
    pub cdi_dir: PathBuf,
    pub state_dir: PathBuf,
    pub run_dir: PathBuf,
    /// The run dir as the host sees it (written into CDI specs).
    pub host_run_dir: PathBuf,
    pub dev_root: PathBuf,
    pub host_dev_root: PathBuf,
    pub driver_root: PathBuf,
    pub host_driver_root: PathBuf,
    pub proc_root: PathBuf,
}

/// Everything `run` needs besides the node and the client.
#[derive(Debug, Clone)]
pub struct PluginOptions {
    pub driver_name: String,
    pub node_name: String,
    pub paths: PluginPaths,
    /// With kubelet ≥1.33 rolling updates: the pod UID, giving per-pod socket names so
    /// that a new DaemonSet pod can take over without a gap.
    pub rolling_update_pod_uid: Option<String>,
    /// How often prepared claims are checked against the API server.
    pub stale_check_interval: Duration,
    /// Only claims prepared at least this long ago are checked.
    pub stale_min_age: Duration,
    pub publish_debounce: Duration,
    pub fail_points: FailPoints,
    /// Leave MIG devices no claim accounts for instead of destroying them.
    pub adopt_unknown_mig: bool,
    /// The interception library to install for shared-GPU claims.
    pub interception_lib: Option<PathBuf>,
    /// Where `/healthz` and `/readyz` are served (`--metrics-addr`); `None`: nowhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// `--watchdog` and `--watchdog-tolerance`.
    pub watchdog: crate::watchdog::Mode,
    pub watchdog_tolerance: u64,
}

impl PluginOptions {
    /// The start-up MIG policy for a server with these features: Tessera owns MIG on
    /// `mig`-mode GPUs only when the server keeps counters (dynamic MIG).
    pub fn unknown_mig(&self, features: ServerFeatures) -> UnknownMig {
        match (features.partitionable, self.adopt_unknown_mig) {
            (false, _) => UnknownMig::Keep,
            (true, true) => UnknownMig::Adopt,
            (true, false) => UnknownMig::Destroy,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("state recovery failed")]
    State(#[from] PrepareError),
    #[error("cannot listen on {path}")]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("publisher start-up failed")]
    Publish(#[from] crate::publish::PublishError),
    #[error("gRPC server failed")]
    Serve(#[from] tonic::transport::Error),
    #[error("start-up task failed: {0}")]
    Join(String),
    #[error("the node config does not fit this API server: {0}")]
    Config(String),
}

/// `dra.sock`, or `dra-<podUID>.sock` with rolling updates.
pub fn dra_socket_path(opts: &PluginOptions) -> PathBuf {
    match &opts.rolling_update_pod_uid {
        Some(uid) => opts.paths.plugin_dir.join(format!("dra-{uid}.sock")),
        None => opts.paths.plugin_dir.join("dra.sock"),
    }
}

/// Maximum AF_UNIX path length the kubelet accepts.
const MAX_SOCKET_PATH: usize = 108;

/// `<driver>-reg.sock`; with rolling updates the first of the 1.37 helper's candidates
/// whose full path fits in 108 bytes: `<driver>-<podUID>-reg.sock`,
/// `<driver>-<b64url(sha256(uid))[:8 bytes]>-reg.sock`,
/// `dra-<b64url(sha256(driver "\0" uid))[:16 bytes]>-reg.sock` (base64url without
/// padding of the first 8 or 16 bytes of the digest).
pub fn registration_socket_path(dir: &Path, driver: &str, pod_uid: Option<&str>) -> PathBuf {
    let Some(uid) = pod_uid else {
        return dir.join(format!("{driver}-reg.sock"));
    };
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let short = b64.encode(&Sha256::digest(uid.as_bytes())[..8]);
    let mut both = Vec::from(driver.as_bytes());
    both.push(0);
    both.extend_from_slice(uid.as_bytes());
    let shortest = b64.encode(&Sha256::digest(&both)[..16]);
    let candidates = [
        format!("{driver}-{uid}-reg.sock"),
        format!("{driver}-{short}-reg.sock"),
        format!("dra-{shortest}-reg.sock"),
    ];
    let fits = |name: &String| dir.join(name).as_os_str().len() <= MAX_SOCKET_PATH;
    let chosen = candidates
        .iter()
        .find(|c| fits(c))
        .unwrap_or(&candidates[2]);
    dir.join(chosen)
}

fn listen(path: &Path) -> Result<UnixListener, PluginError> {
    let err = |source| PluginError::Listen {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    // A socket left by a crashed instance of ours would make bind fail.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    UnixListener::bind(path).map_err(err)
}

/// Opens the device state: discovers driver files and recovers from the previous run.
pub fn open_state(
    opts: &PluginOptions,
    model: &NodeModel,
    unknown_mig: UnknownMig,
) -> Result<DeviceState, PluginError> {
    let driver_files = cdi_spec::discover_driver_files(
        &opts.paths.driver_root,
        &opts.paths.host_driver_root,
        &model.inventory.driver_version,
    );
    if !driver_files
        .iter()
        .any(|f| f.container_path.ends_with("/libcuda.so.1"))
    {
        warn!(driver_root = %opts.paths.driver_root.display(), "libcuda not found under the driver root; containers will lack the CUDA driver library");
    }
    let cdi = CdiContext {
        host_dev_root: opts.paths.host_dev_root.clone(),
        majors: model.inventory.char_majors,
        driver_files,
        host_run_dir: opts.paths.host_run_dir.clone(),
        // Installed by `DeviceState::open` under the node lock.
        interception: None,
    };
    let cfg = StateConfig {
        driver: opts.driver_name.clone(),
        pool: opts.node_name.clone(),
        cdi_dir: opts.paths.cdi_dir.clone(),
        plugin_dir: opts.paths.plugin_dir.clone(),
        state_dir: opts.paths.state_dir.clone(),
        boot_id: crate::prepare::checkpoint::boot_id(&opts.paths.proc_root),
        fail_points: opts.fail_points.clone(),
        unknown_mig,
        run_dir: opts.paths.run_dir.clone(),
        shared_slots: model.config.shared_slots,
        interception_source: opts.interception_lib.clone(),
    };
    let (state, _recovery) =
        DeviceState::open(cfg, model.gpus.clone(), model.backend.clone(), cdi)?;
    Ok(state)
}

/// Runs the plugin until `shutdown` resolves. Order: recover state, serve DRA, then
/// register (so the kubelet only sees a ready plugin), then publish and clean up. On
/// shutdown both sockets are removed; ResourceSlices stay (the kubelet wipes them).
pub async fn run(
    opts: PluginOptions,
    model: NodeModel,
    client: kube::Client,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PluginError> {
    // Gate detection comes first: whether Tessera owns MIG state depends on whether
    // the server keeps counters.
    let health = Arc::new(crate::telemetry::http::Health::default());
    let (health_stop_tx, health_stop_rx) = oneshot::channel::<()>();
    let health_task = match opts.metrics_addr {
        Some(addr) => {
            let (bound, serve) = crate::telemetry::http::bind(addr, health.clone(), async {
                let _ = health_stop_rx.await;
            })
            .await
            .map_err(|source| PluginError::Listen {
                path: PathBuf::from(addr.to_string()),
                source,
            })?;
            info!(addr = %bound, "serving /healthz, /readyz and /metrics");
            Some(tokio::spawn(serve))
        }
        None => None,
    };
    let mut publisher = Publisher::new(client.clone(), &opts.driver_name, &opts.node_name).await?;
    if let Some(problem) = model.config.slice_layout.problem_for(publisher.version()) {
        return Err(PluginError::Config(problem));
    }
    publisher.report_to(health.clone());
    let features = publisher.probe_features().await?;
    let uuids: Vec<String> = model.gpus.iter().map(|g| g.gpu.uuid.clone()).collect();
    match publisher.conflicts(&uuids).await {
        Ok(found) => {
            for c in found {
                tracing::error!(conflict = %c.0, "another component manages this node's GPUs");
            }
        }
        Err(e) => warn!(error = %e, "cannot check for other GPU drivers on this node"),
    }
    let shared_gpus = model
        .gpus
        .iter()
        .filter(|g| g.mode == crate::config::GpuMode::Shared)
        .count();
    if shared_gpus > 0 && !features.consumable_capacity {
        info!(
            kubernetes = %publisher.version(),
            shared_gpus,
            slots_per_gpu = model.config.shared_slots,
            compute_per_slot = crate::inventory::sizing::slot_compute(model.config.shared_slots),
            "the API server drops consumable capacity (DRAConsumableCapacity off; a dry-run create lost allowMultipleAllocations): shared GPUs are published as fallback slots gpu-<minor>-slot-<k>"
        );
    }
    let state_opts = opts.clone();
    let state_model = model.clone();
    let state = Arc::new(
        tokio::task::spawn_blocking(move || {
            open_state(&state_opts, &state_model, state_opts.unknown_mig(features))
        })
        .await
        .map_err(|e| PluginError::Join(e.to_string()))??,
    );
    let driver = Driver::new(state.clone(), client.clone());
    let mut health_watcher = crate::device_health::watcher::HealthWatcher::new(
        model.clone(),
        &opts.driver_name,
        &opts.node_name,
        publisher.version(),
        features,
    );
    // The first poll registers for health events (NVML's event set, the mock's starting
    // point) before anything is served or published: no event after start-up is missed,
    // and a GPU lost at start is unhealthy in the first pool.
    if let Err(e) = health_watcher.poll().await {
        warn!(error = %e, "cannot read GPU health events");
    }
    let (devices_tx, devices_rx) =
        watch::channel(health_watcher.device_list(crate::clock::unix_secs() as i64));
    let (scrape_state, node) = (state.clone(), opts.node_name.clone());
    health.set_scraper(Box::new(move || {
        crate::telemetry::metrics::render(&crate::prepare::snapshot::gather(&scrape_state, &node))
    }));

    let dra_path = dra_socket_path(&opts);
    let dra_listener = listen(&dra_path)?;
    let (dra_stop_tx, dra_stop_rx) = oneshot::channel::<()>();
    let dra_server = tonic::transport::Server::builder()
        .add_service(dra_v1::dra_plugin_server::DraPluginServer::new(DraV1(
            driver.clone(),
        )))
        .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(
            DraV1beta1(driver.clone()),
        ))
        .add_service(
            crate::kubelet::proto::health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                crate::device_health::watcher::HealthService::new(devices_rx),
            ),
        )
        .serve_with_incoming_shutdown(UnixListenerStream::new(dra_listener), async {
            let _ = dra_stop_rx.await;
        });
    let dra_task = tokio::spawn(dra_server);

    let reg_path = registration_socket_path(
        &opts.paths.plugin_registry_dir,
        &opts.driver_name,
        opts.rolling_update_pod_uid.as_deref(),
    );
    let reg_listener = listen(&reg_path)?;
    let (status_tx, mut status_rx) = watch::channel(None);
    // The kubelet's registration status feeds /readyz.
    {
        let health = health.clone();
        tokio::spawn(async move {
            while status_rx.changed().await.is_ok() {
                let status = status_rx.borrow_and_update().clone();
                if let Some(status) = status {
                    health.set_registered(status);
                }
            }
        });
    }
    let registrar = Registrar {
        driver_name: opts.driver_name.clone(),
        endpoint: dra_path.display().to_string(),
        status: status_tx,
    };
    let (reg_stop_tx, reg_stop_rx) = oneshot::channel::<()>();
    let reg_server = tonic::transport::Server::builder()
        .add_service(registration::registration_server::RegistrationServer::new(
            registrar,
        ))
        .serve_with_incoming_shutdown(UnixListenerStream::new(reg_listener), async {
            let _ = reg_stop_rx.await;
        });
    let reg_task = tokio::spawn(reg_server);
    info!(dra = %dra_path.display(), registration = %reg_path.display(), "serving the kubelet");
    health.set_serving(true);

    let (bg_stop_tx, bg_stop_rx) = watch::channel(false);
    let slices = health_watcher.pool();
    publisher.prevalidate(&slices)?;
    let (slices_tx, slices_rx) = watch::channel(slices);
    let devhealth_task = tokio::spawn(health_watcher.run(
        crate::device_health::watcher::POLL_INTERVAL,
        slices_tx,
        devices_tx,
        bg_stop_rx.clone(),
    ));
    let mut stop = bg_stop_rx.clone();
    let publish_task = tokio::spawn(publisher.run(slices_rx, opts.publish_debounce, async move {
        let _ = stop.wait_for(|s| *s).await;
    }));
    let shared: Vec<(u32, String)> = model
        .gpus
        .iter()
        .filter(|g| g.mode == crate::config::GpuMode::Shared)
        .map(|g| (g.gpu.minor, g.gpu.uuid.clone()))
        .collect();
    let compute_task = tokio::spawn(crate::compute::service::run(
        crate::compute::service::ComputeService::new(
            state.backend().clone(),
            opts.paths.proc_root.clone(),
            shared,
        ),
        state.clone(),
        bg_stop_rx.clone(),
    ));
    let watchdog_task = tokio::spawn(
        crate::watchdog::Watchdog::new(
            crate::watchdog::WatchdogConfig {
                mode: opts.watchdog,
                tolerance: opts.watchdog_tolerance,
                proc_root: opts.paths.proc_root.clone(),
                interval: crate::watchdog::INTERVAL,
            },
            state.clone(),
            Some(Box::new(crate::watchdog::KubeEvents::new(
                client.clone(),
                &opts.node_name,
                tokio::runtime::Handle::current(),
            ))),
        )
        .with_pods(Box::new(crate::watchdog::KubePods {
            client: client.clone(),
            node: opts.node_name.clone(),
            handle: tokio::runtime::Handle::current(),
            timeout: crate::watchdog::pods::LOOKUP_TIMEOUT,
        }))
        .run(bg_stop_rx.clone()),
    );
    let cleanup_task = tokio::spawn(stale_claim_cleanup(
        state.clone(),
        client.clone(),
        opts.stale_check_interval,
        opts.stale_min_age,
        bg_stop_rx,
    ));

    shutdown.await;
    info!("shutting down");
    health.set_serving(false);
    let _ = health_stop_tx.send(());
    if let Some(t) = health_task {
        let _ = t.await;
    }
    let _ = reg_stop_tx.send(());
    let _ = dra_stop_tx.send(());
    let _ = bg_stop_tx.send(true);
    for (path, task) in [(&reg_path, reg_task), (&dra_path, dra_task)] {
        match task.await {
            Ok(Err(e)) => warn!(error = %e, "gRPC server ended with an error"),
            Err(e) => warn!(error = %e, "gRPC server task failed"),
            Ok(Ok(())) => {}
        }
        let _ = std::fs::remove_file(path);
    }
    let _ = devhealth_task.await;
    let _ = compute_task.await;
    let _ = watchdog_task.await;
    let _ = publish_task.await;
    let _ = cleanup_task.await;
    Ok(())
}

/// Periodically (and at start-up) unprepares claims prepared long ago whose
/// ResourceClaim no longer exists or has a new UID: the plugin may have been down when
/// the kubelet tried to unprepare them.
pub async fn stale_claim_cleanup(
    state: Arc<DeviceState>,
    client: kube::Client,
    interval: Duration,
    min_age: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if let Err(e) = cleanup_once(&state, &client, min_age).await {
            warn!(error = %e, "stale claim clean-up failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// One clean-up pass; returns the UIDs it unprepared. A claim whose unprepare fails is
/// logged and left for the next pass; only a failure to list the candidates is an error.
pub async fn cleanup_once(
    state: &Arc<DeviceState>,
    client: &kube::Client,
    min_age: Duration,
) -> Result<Vec<String>, String> {
    let s = state.clone();
    let secs = min_age.as_secs();
    let candidates = tokio::task::spawn_blocking(move || s.prepared_claims(secs))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.chain())?;
    let mut removed = Vec::new();
    for (uid, ns, name) in candidates {
        let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
        let gone = match api.get_opt(&name).await {
            Ok(None) => true,
            Ok(Some(c)) => c.metadata.uid.as_deref() != Some(uid.as_str()),
            // Unknown: keep it; better a late clean-up than unpreparing a live claim.
            Err(e) => {
                warn!(claim = %uid, error = %e, "cannot check claim; keeping it");
                false
            }
        };
        if gone {
            let s = state.clone();
            let u = uid.clone();
            let done = tokio::task::spawn_blocking(move || s.unprepare(&u))
                .await
                .map_err(|e| e.to_string())?;
            // One claim that cannot be undone yet (a MIG device still in use) must not
            // stop the clean-up of the others: the next pass retries it.
            match done {
                Ok(()) => {
                    info!(claim = %uid, namespace = %ns, name = %name, "unprepared a claim that no longer exists");
                    removed.push(uid);
                }
                Err(e) => {
                    warn!(claim = %uid, namespace = %ns, name = %name, error = %e.chain(), "cannot unprepare a claim that no longer exists yet; retrying next pass")
                }
            }
        }
    }
    Ok(removed)
}
