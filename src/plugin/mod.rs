//! Running the kubelet plugin: recover state, serve DRA on the plugin socket, then
//! register, publish slices, and clean up claims the kubelet forgot, until shutdown.
//! Shape `run(options, node, client, shutdown)`: `main` passes a signal future, tests
//! pass a oneshot. The services run under one [`supervisor::Supervisor`]: one
//! cancellation token, and any service that fails, panics or ends early stops the
//! plugin with its name as the cause.

mod sockets;
mod stale;
pub mod supervisor;

pub use sockets::{dra_socket_path, registration_socket_path};
pub use stale::{cleanup_once, stale_claim_cleanup};

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::kubelet::proto::{dra_v1, dra_v1beta1, registration};
use crate::kubelet::{DraV1, DraV1beta1, Driver, Registrar};
use crate::node::NodeModel;
use crate::prepare::cdi_spec::{self, CdiContext};
use crate::prepare::failpoints::FailPoints;
use crate::prepare::state::{DeviceState, PrepareError, StateConfig, UnknownMig};
use crate::publish::Publisher;
use crate::publish::slices::ServerFeatures;
use crate::telemetry::http::Health;
use sockets::listen;
use supervisor::{STOP_GRACE, Supervisor, TaskFailed};

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
    #[error("plugin service stopped: {0}")]
    Service(#[from] TaskFailed),
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
        device_metadata: model.config.device_metadata,
    };
    let (state, _recovery) =
        DeviceState::open(cfg, model.gpus.clone(), model.backend.clone(), cdi)?;
    Ok(state)
}

/// Runs the plugin until `shutdown` resolves. Order: recover state, serve DRA, then
/// register (so the kubelet only sees a ready plugin), then publish and clean up. On
/// shutdown both sockets are removed; ResourceSlices stay (the kubelet wipes them).
/// A service that stops on its own stops the plugin: `run` returns its cause.
pub async fn run(
    opts: PluginOptions,
    model: NodeModel,
    client: kube::Client,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PluginError> {
    let mut services = Supervisor::new();
    let stop = services.token();
    let health = Arc::new(Health::default());
    if let Some(addr) = opts.metrics_addr {
        services.spawn_loop("metrics server", serve_metrics(addr, &health, &stop).await?);
    }
    // Gate detection comes before the state: whether Tessera owns MIG state depends on
    // whether the server keeps counters.
    let (publisher, features) = connect_api(&opts, &model, &client, &health).await?;
    let state = Arc::new(open_state_off_runtime(&opts, &model, features).await?);
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
    let devices_rx_for_status = devices_rx.clone();
    let (scrape_state, node) = (state.clone(), opts.node_name.clone());
    health.set_scraper(Box::new(move || {
        crate::telemetry::metrics::render(&crate::prepare::snapshot::gather(&scrape_state, &node))
    }));

    // The pool to publish, followed by the state from before the first prepare (the
    // devices' attributes in their metadata files).
    let (slices_tx, slices_rx) = watch::channel(health_watcher.pool());
    state.follow_published(slices_rx.clone());
    let dra_path = dra_socket_path(&opts);
    let (status_queue, status_queue_rx) = crate::claim_status::reporter::queue();
    let driver = Driver::new(state.clone(), client.clone()).reporting_to(status_queue);
    services.spawn(
        "DRA gRPC server",
        serve_dra(listen(&dra_path)?, driver, devices_rx, stop.clone()),
    );
    let reg_path = registration_socket_path(
        &opts.paths.plugin_registry_dir,
        &opts.driver_name,
        opts.rolling_update_pod_uid.as_deref(),
    );
    let (status_tx, status_rx) = watch::channel(None);
    let registrar = Registrar {
        driver_name: opts.driver_name.clone(),
        endpoint: dra_path.display().to_string(),
        status: status_tx,
    };
    services.spawn(
        "registration gRPC server",
        serve_registration(listen(&reg_path)?, registrar, stop.clone()),
    );
    services.spawn_loop(
        "registration status",
        forward_registration(status_rx, health.clone(), stop.clone()),
    );
    info!(dra = %dra_path.display(), registration = %reg_path.display(), "serving the kubelet");
    health.set_serving(true);

    publisher.prevalidate(&slices_rx.borrow())?;
    services.spawn_loop(
        "device health",
        health_watcher.run(
            crate::device_health::watcher::POLL_INTERVAL,
            slices_tx,
            devices_tx,
            stop.clone(),
        ),
    );
    services.spawn_loop(
        "publisher",
        publisher.run(
            slices_rx,
            opts.publish_debounce,
            stop.clone().cancelled_owned(),
        ),
    );
    services.spawn_loop(
        "compute shares",
        crate::compute::service::run(
            compute_service(&model, &state, &opts),
            state.clone(),
            stop.clone(),
        ),
    );
    if opts.watchdog != crate::watchdog::Mode::Off {
        services.spawn_loop(
            "watchdog",
            watchdog(&opts, &state, &client).run(stop.clone()),
        );
    }
    services.spawn_loop(
        "claim status",
        crate::claim_status::reporter::Reporter::new(
            state.clone(),
            Box::new(crate::claim_status::writer::KubeClaimStatus {
                client: client.clone(),
            }),
            status_queue_rx,
            devices_rx_for_status,
        )
        .run(stop.clone()),
    );
    services.spawn_loop(
        "stale claim clean-up",
        stale_claim_cleanup(
            state.clone(),
            client.clone(),
            opts.stale_check_interval,
            opts.stale_min_age,
            stop.clone(),
        ),
    );

    let ended = services
        .run_until(
            async {
                shutdown.await;
                health.set_serving(false);
            },
            STOP_GRACE,
        )
        .await;
    health.set_serving(false);
    for path in [&reg_path, &dra_path] {
        let _ = std::fs::remove_file(path);
    }
    Ok(ended?)
}

/// Binds `/healthz`, `/readyz` and `/metrics`; the returned server stops with `stop`.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    health: &Arc<Health>,
    stop: &CancellationToken,
) -> Result<impl Future<Output = ()> + use<>, PluginError> {
    let (bound, serve) =
        crate::telemetry::http::bind(addr, health.clone(), stop.clone().cancelled_owned())
            .await
            .map_err(|source| PluginError::Listen {
                path: PathBuf::from(addr.to_string()),
                source,
            })?;
    info!(addr = %bound, "serving /healthz, /readyz and /metrics");
    Ok(serve)
}

/// Connects the publisher, checks the node config against the server, probes its
/// features and warns about other drivers claiming these GPUs.
async fn connect_api(
    opts: &PluginOptions,
    model: &NodeModel,
    client: &kube::Client,
    health: &Arc<Health>,
) -> Result<(Publisher, ServerFeatures), PluginError> {
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
    Ok((publisher, features))
}

/// [`open_state`] on the blocking pool (it takes the node lock and may touch MIG).
async fn open_state_off_runtime(
    opts: &PluginOptions,
    model: &NodeModel,
    features: ServerFeatures,
) -> Result<DeviceState, PluginError> {
    let (opts, model) = (opts.clone(), model.clone());
    tokio::task::spawn_blocking(move || open_state(&opts, &model, opts.unknown_mig(features)))
        .await
        .map_err(|e| PluginError::Join(e.to_string()))?
}

/// The kubelet-facing server: DRA v1 and v1beta1, and resource health.
async fn serve_dra(
    listener: UnixListener,
    driver: Driver,
    devices: watch::Receiver<Vec<crate::kubelet::proto::health_v1alpha1::DeviceHealth>>,
    stop: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    use crate::kubelet::proto::health_v1alpha1::dra_resource_health_server::DraResourceHealthServer;
    tonic::transport::Server::builder()
        .add_service(dra_v1::dra_plugin_server::DraPluginServer::new(DraV1(
            driver.clone(),
        )))
        .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(
            DraV1beta1(driver),
        ))
        .add_service(DraResourceHealthServer::new(
            crate::device_health::watcher::HealthService::new(devices),
        ))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.cancelled_owned())
        .await
}

/// The kubelet's plugin-registration server.
async fn serve_registration(
    listener: UnixListener,
    registrar: Registrar,
    stop: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(registration::registration_server::RegistrationServer::new(
            registrar,
        ))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.cancelled_owned())
        .await
}

/// Feeds the kubelet's registration status to `/readyz`.
async fn forward_registration(
    mut status: watch::Receiver<Option<Result<(), String>>>,
    health: Arc<Health>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            changed = status.changed() => {
                if changed.is_err() {
                    // The registration server is gone; its own task reports why.
                    return stop.cancelled().await;
                }
                if let Some(s) = status.borrow_and_update().clone() {
                    health.set_registered(s);
                }
            }
            () = stop.cancelled() => return,
        }
    }
}

/// The compute-share controller of this node's shared GPUs.
fn compute_service(
    model: &NodeModel,
    state: &Arc<DeviceState>,
    opts: &PluginOptions,
) -> crate::compute::service::ComputeService {
    let shared: Vec<(u32, String)> = model
        .gpus
        .iter()
        .filter(|g| g.mode == crate::config::GpuMode::Shared)
        .map(|g| (g.gpu.minor, g.gpu.uuid.clone()))
        .collect();
    crate::compute::service::ComputeService::new(
        state.backend().clone(),
        opts.paths.proc_root.clone(),
        shared,
    )
}

/// The budget watchdog, reporting through Kubernetes events and finding pods by PID.
fn watchdog(
    opts: &PluginOptions,
    state: &Arc<DeviceState>,
    client: &kube::Client,
) -> crate::watchdog::Watchdog {
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
}
