//! The `tessera` binary: command-line parsing and wiring only; the work lives in the
//! library.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use k8s_model::release::{FeatureGates, KubeVersion};
use tessera::driver_root::{Layout, LayoutFlags};
use tessera::inventory::mock::StateAccess;
use tessera::node::{BackendPaths, BackendSpec, load_node};
use tessera::plugin::{PluginOptions, PluginPaths};
use tessera::prepare::failpoints::FailPoints;

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "Kubernetes DRA driver for sharing and partitioning GPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the kubelet plugin on this node.
    Plugin(Box<PluginArgs>),
    /// Check that this node can run Tessera's claims (same flags as `plugin`; run it in
    /// the plugin's pod with `kubectl exec`). Exits non-zero when a check fails.
    Doctor(Box<DoctorArgs>),
    /// Print the ResourceSlices the plugin would publish, as a v1 List.
    Inventory(InventoryArgs),
    /// Allocate claims against slices offline, as the kube-scheduler would.
    ///
    /// Every input is YAML or JSON (several documents per file; a v1 List is unpacked),
    /// and a directory stands for its *.yaml, *.yml and *.json files. Inputs may be
    /// folders of mixed manifests: --slices reads the ResourceSlices, --classes the
    /// DeviceClasses, and the claim paths the ResourceClaims, ResourceClaimTemplates
    /// and Release steps (plan.tessera.dev/v1alpha1). Other documents (a
    /// kustomization.yaml, a Pod) are skipped, each noted at debug level
    /// (RUST_LOG=debug); a document of a kind that is read but does not decode is an
    /// error.
    Plan(PlanArgs),
    /// Inject a health event into the mock node's state (mock backend only): try what an
    /// XID or a lost GPU does to the published devices without a GPU. The plugin running
    /// on the mock node picks the event up as NVML's event stream would deliver it.
    Mock(MockArgs),
}

#[derive(Args)]
struct MockArgs {
    /// The plugin's --state-dir (holding mock-node.state).
    #[arg(long, default_value = "/var/lib/tessera")]
    state_dir: PathBuf,
    #[command(subcommand)]
    event: MockEvent,
}

#[derive(Subcommand)]
enum MockEvent {
    /// An XID error on GPU MINOR, or on its MIG GPU instance --gi.
    Xid {
        /// The GPU's minor number (/dev/nvidia<MINOR>).
        #[arg(long)]
        gpu: u32,
        /// The XID (79: fallen off the bus, 48: double-bit ECC, 13: an application fault).
        #[arg(long)]
        xid: u64,
        /// The MIG GPU instance ID the event names.
        #[arg(long)]
        gi: Option<u32>,
    },
    /// GPU MINOR falls off the bus (NVML answers GPU_IS_LOST).
    Lost {
        #[arg(long)]
        gpu: u32,
    },
    /// A lost GPU MINOR answers again (a reset brought it back).
    Recover {
        #[arg(long)]
        gpu: u32,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum PlanOutput {
    Yaml,
    Table,
}

#[derive(Args)]
struct PlanArgs {
    /// ResourceSlices: a file (a v1 List as `tessera inventory` prints, or YAML documents), a directory, or - for stdin; other kinds are skipped.
    #[arg(long)]
    slices: PathBuf,
    /// DeviceClasses: a file or a directory such as deploy/deviceclasses (its kustomization.yaml and other kinds are skipped); default: the built-in copy of deploy/deviceclasses.
    #[arg(long)]
    classes: Option<PathBuf>,
    /// Kubernetes version whose allocator rules apply.
    #[arg(long, default_value = "1.37")]
    k8s_version: KubeVersion,
    /// Feature gate overrides: A=true,B=false.
    #[arg(long, default_value = "")]
    gates: String,
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    output: PlanOutput,
    /// Claim files or directories: ResourceClaims and ResourceClaimTemplates, allocated in order, and Release documents that free claims; other kinds are skipped.
    #[arg(required = true)]
    claims: Vec<PathBuf>,
}

#[derive(Args, Debug)]
struct PluginArgs {
    /// This node's name (pool name and Node owner of the slices).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The DRA driver name.
    #[arg(long, env = "DRIVER_NAME", default_value = "gpu.tessera.dev")]
    driver_name: String,
    /// Node config file (config.tessera.dev/v1alpha1 NodeConfig); built-in defaults when absent.
    #[arg(long, env = "TESSERA_CONFIG")]
    config: Option<PathBuf>,
    /// GPU backend: nvml, nvml:LIBPATH, mock or mock:FILE.
    #[arg(long, env = "TESSERA_BACKEND", default_value = "nvml")]
    backend: BackendSpec,
    /// kubeconfig; in-cluster config when absent.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Where the kubelet watches for plugin registration sockets.
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    plugin_registry_dir: PathBuf,
    /// The plugin's own directory (DRA socket); default /var/lib/kubelet/plugins/<driver-name>.
    #[arg(long)]
    plugin_dir: Option<PathBuf>,
    /// Where CDI specs are written.
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// Checkpoint and mock node state.
    #[arg(long, default_value = "/var/lib/tessera")]
    state_dir: PathBuf,
    /// Per-claim directories and the installed interception library (tmpfs).
    #[arg(long, default_value = "/run/tessera")]
    run_dir: PathBuf,
    /// The same directory as seen by the host (written into CDI specs); default: --run-dir.
    #[arg(long)]
    host_run_dir: Option<PathBuf>,
    /// The host's / as the plugin sees it (a read-only mount in the pod): where the
    /// driver-root candidates, the dev root and the runtime's config are looked for.
    #[arg(long, env = "TESSERA_HOST_ROOT", default_value = "/")]
    host_root: PathBuf,
    /// Where the plugin finds device nodes (<dev-root>/dev); default: the driver root
    /// when it has dev/nvidiactl (a driver container), else --host-root.
    #[arg(long)]
    dev_root: Option<PathBuf>,
    /// The same directory as seen by the host (written into CDI specs); default: --dev-root.
    #[arg(long)]
    host_dev_root: Option<PathBuf>,
    /// NVIDIA user-space driver files as the plugin sees them; default: the first known
    /// layout under --host-root where NVML loads (host /, /run/nvidia/driver,
    /// /home/kubernetes/bin/nvidia, /usr/local/glibc; `tessera doctor` lists them).
    #[arg(long)]
    driver_root: Option<PathBuf>,
    /// The same as seen by the host; default: --driver-root.
    #[arg(long)]
    host_driver_root: Option<PathBuf>,
    /// /proc (for /proc/driver/nvidia* and /proc/devices).
    #[arg(long, default_value = "/proc")]
    proc_root: PathBuf,
    /// The interception library to install into the run dir, with the front library
    /// libtessera_preload.so from the same directory; default: next to the binary.
    #[arg(long)]
    interception_lib: Option<PathBuf>,
    /// Rolling updates (kubelet >=1.33): this pod's UID, for per-pod socket names.
    #[arg(long, env = "POD_UID")]
    rolling_update_pod_uid: Option<String>,
    /// Leave MIG devices that no claim accounts for instead of destroying them at start-up.
    #[arg(long)]
    adopt_unknown_mig: bool,
    /// Where /metrics, /healthz and /readyz are served (host:port or :port); "off" to disable.
    #[arg(long, env = "TESSERA_METRICS_ADDR", default_value = ":9464")]
    metrics_addr: String,
    /// Seconds between checks of prepared claims against the API server.
    #[arg(long, default_value = "600")]
    stale_claim_check_seconds: u64,
    /// The memory watchdog: enforce (kill processes of a shared claim over its budget),
    /// report (only report), or off.
    #[arg(long, env = "TESSERA_WATCHDOG", default_value = "enforce")]
    watchdog: tessera::watchdog::Mode,
    /// How far above its budget a shared claim's real usage may go before the watchdog acts.
    #[arg(long, default_value = "256Mi", value_parser = tessera::watchdog::parse_tolerance)]
    watchdog_tolerance: u64,
}

#[derive(Args)]
struct DoctorArgs {
    #[command(flatten)]
    plugin: PluginArgs,
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    output: DoctorOutput,
    /// Where the container runtime's process is looked for (to read the config it was
    /// started with); default: --proc-root.
    #[arg(long)]
    runtime_proc: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum DoctorOutput {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum OutputFormat {
    Yaml,
    Json,
}

#[derive(Args)]
struct InventoryArgs {
    /// GPU backend: nvml, nvml:LIBPATH, mock or mock:FILE.
    #[arg(long, env = "TESSERA_BACKEND", default_value = "nvml")]
    backend: BackendSpec,
    /// Node config file; default: the mock node's embedded config, else built-in defaults.
    #[arg(long, env = "TESSERA_CONFIG")]
    config: Option<PathBuf>,
    /// Node name (pool name); default: $NODE_NAME, else this host's name.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// The DRA driver name.
    #[arg(long, env = "DRIVER_NAME", default_value = "gpu.tessera.dev")]
    driver_name: String,
    /// Kubernetes server version the slices are built for.
    #[arg(long, default_value = "1.37")]
    k8s_version: KubeVersion,
    /// Feature gate overrides, Kubernetes syntax: A=true,B=false.
    #[arg(long, default_value = "")]
    gates: String,
    /// Read-only: an existing mock node state here is used, nothing is written.
    #[arg(long, default_value = "/var/lib/tessera")]
    state_dir: PathBuf,
    /// /proc (for /proc/devices: the driver's device majors).
    #[arg(long, default_value = "/proc")]
    proc_root: PathBuf,
    /// /sys (for each GPU's PCIe root and NUMA node).
    #[arg(long, default_value = "/sys")]
    sys_root: PathBuf,
    #[arg(short = 'o', long = "output", value_enum, default_value = "yaml")]
    output: OutputFormat,
}

/// How long the plugin's exit waits for blocking tasks (NVML calls) still running.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

fn main() -> Result<std::process::ExitCode> {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // `kubectl exec <plugin pod> -- tessera doctor`: the flags of the plugin beside it.
    let mut adopted = None;
    if argv.get(1).is_some_and(|a| a == "doctor")
        && let Some((pid, plugin)) =
            tessera::doctor::flags::find_plugin(std::path::Path::new("/proc"))
        && let Some(with) = tessera::doctor::flags::adopt(&argv, &plugin)
    {
        argv = with;
        adopted = Some(pid);
    }
    let cli = Cli::parse_from(argv);
    let default_level = "info";
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: a container log (`kubectl logs`) gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Some(pid) = adopted {
        tracing::info!(
            pid,
            "using the flags of the `tessera plugin` process in this container"
        );
    }
    let ok = std::process::ExitCode::SUCCESS;
    match cli.command {
        Command::Inventory(a) => inventory(a).map(|()| ok),
        Command::Plan(a) => plan(a).map(|()| ok),
        Command::Mock(a) => mock(a).map(|()| ok),
        Command::Plugin(a) => {
            let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            let result = rt.block_on(plugin(*a));
            // Dropping a runtime waits for every blocking task: one stuck in a hung NVML
            // call (a health poll) would keep SIGTERM from ever finishing.
            rt.shutdown_timeout(SHUTDOWN_GRACE);
            result.map(|()| ok)
        }
        Command::Doctor(a) => {
            let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            let result = rt.block_on(doctor(*a));
            rt.shutdown_timeout(SHUTDOWN_GRACE);
            result
        }
    }
}

/// `tessera mock`: appends a health event to the mock node's state, under its lock.
fn mock(a: MockArgs) -> Result<()> {
    use tessera::inventory::mock;
    let dir = &a.state_dir;
    // Checked first so that a wrong directory gets nothing written into it (not even the
    // writers' lock file).
    let state = dir.join(mock::state::STATE_FILE);
    if !state.is_file() {
        anyhow::bail!(
            "no mock node state at {} (is the plugin running with --backend mock and this --state-dir?)",
            state.display()
        );
    }
    let (seq, what) = match a.event {
        MockEvent::Xid { gpu, xid, gi: None } => (
            mock::inject_xid(dir, gpu, xid),
            format!("XID {xid} on GPU {gpu}"),
        ),
        MockEvent::Xid {
            gpu,
            xid,
            gi: Some(gi),
        } => (
            mock::inject_mig_xid(dir, gpu, gi, xid),
            format!("XID {xid} on GPU {gpu}, GPU instance {gi}"),
        ),
        MockEvent::Lost { gpu } => (mock::inject_lost(dir, gpu), format!("GPU {gpu} lost")),
        MockEvent::Recover { gpu } => (
            mock::inject_clear(dir, gpu),
            format!("GPU {gpu} answering again"),
        ),
    };
    let seq = seq.with_context(|| {
        format!(
            "injecting {what} into the mock node state in {}",
            dir.display()
        )
    })?;
    println!("injected event {seq}: {what}");
    Ok(())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

fn inventory(a: InventoryArgs) -> Result<()> {
    let gates = FeatureGates::parse(a.k8s_version, &a.gates).context("--gates")?;
    let node_name = a.node_name.unwrap_or_else(hostname);
    let paths = BackendPaths {
        state_dir: a.state_dir,
        proc_root: a.proc_root,
        sys_root: a.sys_root,
    };
    let model = load_node(
        &a.backend,
        a.config.as_deref(),
        &paths,
        StateAccess::ReadOnly,
    )?;
    if let Some(problem) = model.config.slice_layout.problem_for(gates.version()) {
        anyhow::bail!("the node config does not fit --k8s-version: {problem}");
    }
    let slices = model.pool(
        &a.driver_name,
        &node_name,
        gates.version(),
        tessera::publish::slices::ServerFeatures::from_gates(&gates),
    );
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {},
        "items": slices,
    });
    let out = match a.output {
        OutputFormat::Json => serde_json::to_string_pretty(&list)? + "\n",
        OutputFormat::Yaml => serde_yaml_ng::to_string(&list)?,
    };
    print!("{out}");
    Ok(())
}

fn plan(a: PlanArgs) -> Result<()> {
    let gates = FeatureGates::parse(a.k8s_version, &a.gates).context("--gates")?;
    let slices = k8s_model::schedule::read_slices(&a.slices)?;
    let classes = tessera::device_classes::read(a.classes.as_deref())?;
    let steps = k8s_model::schedule::read_steps(&a.claims)?;
    let result = k8s_model::schedule::run(&slices, &classes, &steps, &gates)?;
    match a.output {
        PlanOutput::Table => print!("{}", k8s_model::schedule::render_table(&result)),
        PlanOutput::Yaml => print!("{}", k8s_model::schedule::render_yaml(&result)?),
    }
    Ok(())
}

/// The driver and dev roots: as the flags give them, else discovered.
fn layout(a: &PluginArgs, paths: &BackendPaths) -> Layout {
    tessera::driver_root::discover(
        &LayoutFlags {
            host_root: a.host_root.clone(),
            driver_root: a.driver_root.clone(),
            host_driver_root: a.host_driver_root.clone(),
            dev_root: a.dev_root.clone(),
            host_dev_root: a.host_dev_root.clone(),
            backend: a.backend.clone(),
        },
        &paths.proc_root,
        &paths.sys_root,
    )
}

fn backend_paths(a: &PluginArgs) -> BackendPaths {
    BackendPaths {
        state_dir: a.state_dir.clone(),
        proc_root: a.proc_root.clone(),
        ..Default::default()
    }
}

async fn kube_client(a: &PluginArgs) -> Result<kube::Client> {
    Ok(match &a.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            kube::Client::try_from(cfg)?
        }
        None => kube::Client::try_default()
            .await
            .context("in-cluster Kubernetes config")?,
    })
}

fn plugin_options(a: &PluginArgs, layout: &Layout) -> Result<PluginOptions> {
    let fail_points = FailPoints::from_env().map_err(anyhow::Error::msg)?;
    let plugin_dir = a
        .plugin_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/var/lib/kubelet/plugins").join(&a.driver_name));
    Ok(PluginOptions {
        driver_name: a.driver_name.clone(),
        node_name: a.node_name.clone(),
        paths: PluginPaths {
            plugin_registry_dir: a.plugin_registry_dir.clone(),
            plugin_dir,
            cdi_dir: a.cdi_dir.clone(),
            state_dir: a.state_dir.clone(),
            run_dir: a.run_dir.clone(),
            host_run_dir: a.host_run_dir.clone().unwrap_or_else(|| a.run_dir.clone()),
            dev_root: layout.dev_root.clone(),
            host_dev_root: layout.host_dev_root.clone(),
            driver_root: layout.driver_root.clone(),
            host_driver_root: layout.host_driver_root.clone(),
            proc_root: a.proc_root.clone(),
        },
        rolling_update_pod_uid: a.rolling_update_pod_uid.clone(),
        stale_check_interval: Duration::from_secs(a.stale_claim_check_seconds.max(1)),
        stale_min_age: Duration::from_secs(60),
        publish_debounce: Duration::from_millis(500),
        fail_points,
        adopt_unknown_mig: a.adopt_unknown_mig,
        interception_lib: a
            .interception_lib
            .clone()
            .or_else(tessera::prepare::library::default_source),
        metrics_addr: match a.metrics_addr.as_str() {
            "off" | "" => None,
            s => Some(tessera::telemetry::http::parse_addr(s).map_err(anyhow::Error::msg)?),
        },
        watchdog: a.watchdog,
        watchdog_tolerance: a.watchdog_tolerance,
    })
}

async fn plugin(a: PluginArgs) -> Result<()> {
    tracing::debug!(args = ?a, "plugin configuration");
    let paths = backend_paths(&a);
    let layout = layout(&a, &paths);
    let model = load_node(
        &layout.backend,
        a.config.as_deref(),
        &paths,
        StateAccess::ReadWrite,
    )?;
    let client = kube_client(&a).await?;
    let opts = plugin_options(&a, &layout)?;
    tessera::plugin::run(opts, model, client, shutdown_signal()).await?;
    Ok(())
}

/// `tessera doctor`: the plugin's view of this node, checked; exit 1 on any fail.
async fn doctor(d: DoctorArgs) -> Result<std::process::ExitCode> {
    let a = &d.plugin;
    let paths = backend_paths(a);
    let layout = layout(a, &paths);
    let opts = plugin_options(a, &layout)?;
    // Read-only: doctor may run beside the plugin; it writes no state.
    let node = load_node(
        &layout.backend,
        a.config.as_deref(),
        &paths,
        StateAccess::ReadOnly,
    )
    .map_err(|e| format!("{:#}", anyhow::Error::from(e)));
    let client = kube_client(a).await.map_err(|e| format!("{e:#}"));
    let input = tessera::doctor::DoctorInput {
        opts,
        host_root: a.host_root.clone(),
        runtime_proc: d
            .runtime_proc
            .clone()
            .unwrap_or_else(|| a.proc_root.clone()),
        layout,
        node,
        client,
    };
    let report = tessera::doctor::run(&input).await;
    match d.output {
        DoctorOutput::Text => print!("{}", report.render_text()),
        DoctorOutput::Json => print!("{}", report.render_json()),
    }
    Ok(if report.worst() == tessera::doctor::Verdict::Fail {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    })
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
