//! The `tessera` binary: command-line parsing and wiring only; the work lives in the
//! library.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use tessera::backend::mock::StateAccess;
use tessera::kubever::{FeatureGates, KubeVersion};
use tessera::node::{BackendPaths, BackendSpec, load_node};
use tessera::publish::Publisher;
use tessera::slices::{PoolParams, build_pool};

#[derive(Parser)]
#[command(name = "tessera", version, about = "Kubernetes DRA driver for sharing and partitioning GPUs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the kubelet plugin on this node (publishes the node's ResourceSlices).
    Plugin(Box<PluginArgs>),
    /// Print the ResourceSlices the plugin would publish, as a v1 List.
    Inventory(InventoryArgs),
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
    /// Where the plugin finds device nodes.
    #[arg(long, default_value = "/")]
    dev_root: PathBuf,
    /// The same directory as seen by the host (written into CDI specs); default: --dev-root.
    #[arg(long)]
    host_dev_root: Option<PathBuf>,
    /// NVIDIA user-space driver files as the plugin sees them.
    #[arg(long, default_value = "/")]
    driver_root: PathBuf,
    /// The same as seen by the host; default: --driver-root.
    #[arg(long)]
    host_driver_root: Option<PathBuf>,
    /// /proc (for /proc/driver/nvidia* and /proc/devices).
    #[arg(long, default_value = "/proc")]
    proc_root: PathBuf,
    /// The interception library to install into the run dir; default: next to the binary.
    #[arg(long)]
    interception_lib: Option<PathBuf>,
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
    #[arg(short = 'o', long = "output", value_enum, default_value = "yaml")]
    output: OutputFormat,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Inventory(a) => inventory(a),
        Command::Plugin(a) => {
            let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            rt.block_on(plugin(*a))
        }
    }
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
        ..Default::default()
    };
    let model = load_node(&a.backend, a.config.as_deref(), &paths, StateAccess::ReadOnly)?;
    let slices = build_pool(
        &PoolParams {
            driver: &a.driver_name,
            node_name: &node_name,
            version: gates.version(),
        },
        &model.inventory,
        &model.gpus,
    );
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {},
        "items": slices,
    });
    let out = match a.output {
        OutputFormat::Json => serde_json::to_string_pretty(&list)? + "\n",
        OutputFormat::Yaml => serde_yaml::to_string(&list)?,
    };
    print!("{out}");
    Ok(())
}

async fn plugin(a: PluginArgs) -> Result<()> {
    tracing::debug!(args = ?a, "plugin configuration");
    let paths = BackendPaths {
        state_dir: a.state_dir.clone(),
        proc_root: a.proc_root.clone(),
        ..Default::default()
    };
    let model = load_node(&a.backend, a.config.as_deref(), &paths, StateAccess::ReadWrite)?;
    let client = match &a.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            kube::Client::try_from(cfg)?
        }
        None => kube::Client::try_default().await.context("in-cluster Kubernetes config")?,
    };
    let publisher = Publisher::new(client, &a.driver_name, &a.node_name)
        .await
        .context("connecting to the API server")?;
    let slices = build_pool(
        &PoolParams {
            driver: &a.driver_name,
            node_name: &a.node_name,
            version: publisher.version(),
        },
        &model.inventory,
        &model.gpus,
    );
    publisher.prevalidate(&slices)?;
    if slices.is_empty() {
        bail!("no slices to publish");
    }
    tracing::info!(
        node = %a.node_name,
        gpus = model.gpus.len(),
        kubernetes = %publisher.version(),
        "publishing ResourceSlices; kubelet gRPC serving is not part of this build yet"
    );
    let (_tx, rx) = tokio::sync::watch::channel(slices);
    publisher
        .run(rx, Duration::from_millis(500), async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    Ok(())
}
