//! Assembling the node model the rest of Tessera works from: open the backend named
//! by `--backend`, discover the GPUs, load the node config (file, else the mock node's
//! embedded config, else built-in defaults) and decide each GPU's mode.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceSlice;
use tracing::warn;

use crate::config::{ConfigError, GpuMode, ManagedGpu, NodeConfig};
use crate::inventory::mock::{MockBackend, MockNode, StateAccess};
use crate::inventory::nvml::NvmlBackend;
use crate::inventory::{BackendError, GpuBackend, MigStatus, NodeInventory};
use crate::publish::slices::{self, PoolParams, ServerFeatures};
use k8s_model::release::KubeVersion;

/// The `--backend` flag: `nvml`, `nvml:LIBPATH`, `mock` or `mock:FILE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSpec {
    Nvml(Option<PathBuf>),
    Mock(Option<PathBuf>),
}

impl FromStr for BackendSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        let path = match arg {
            Some("") => return Err(format!("{s:?}: empty path after ':'")),
            Some(a) => Some(PathBuf::from(a)),
            None => None,
        };
        match kind {
            "nvml" => Ok(BackendSpec::Nvml(path)),
            "mock" => Ok(BackendSpec::Mock(path)),
            _ => Err(format!(
                "{s:?}: expected nvml, nvml:LIBPATH, mock or mock:FILE"
            )),
        }
    }
}

/// Paths the backends need.
#[derive(Debug, Clone)]
pub struct BackendPaths {
    pub state_dir: PathBuf,
    pub proc_root: PathBuf,
    pub sys_root: PathBuf,
}

impl Default for BackendPaths {
    fn default() -> Self {
        BackendPaths {
            state_dir: PathBuf::from("/var/lib/tessera"),
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/sys"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot read node config {path}")]
    ReadConfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The discovered node with each managed GPU's mode, and the backend it came from.
#[derive(Clone)]
pub struct NodeModel {
    pub inventory: NodeInventory,
    pub config: NodeConfig,
    pub gpus: Vec<ManagedGpu>,
    /// Live MIG state of each `mig`-mode GPU at discovery.
    pub mig: BTreeMap<u32, MigStatus>,
    pub backend: Arc<dyn GpuBackend>,
}

impl std::fmt::Debug for NodeModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeModel")
            .field("inventory", &self.inventory)
            .field("config", &self.config)
            .field("gpus", &self.gpus)
            .field("mig", &self.mig)
            .field("backend", &self.backend.kind())
            .finish()
    }
}

impl NodeModel {
    /// The pool this node publishes for a server (pure; see [`slices::build_pool`]).
    pub fn pool(
        &self,
        driver: &str,
        node_name: &str,
        version: KubeVersion,
        features: ServerFeatures,
    ) -> Vec<ResourceSlice> {
        self.pool_with_health(
            driver,
            node_name,
            version,
            features,
            &crate::device_health::policy::NodeHealth::default(),
        )
    }

    /// The pool with the GPUs' health (see [`slices::build_pool_with_health`]).
    pub fn pool_with_health(
        &self,
        driver: &str,
        node_name: &str,
        version: KubeVersion,
        features: ServerFeatures,
        health: &crate::device_health::policy::NodeHealth,
    ) -> Vec<ResourceSlice> {
        slices::build_pool_with_health(
            &PoolParams {
                driver,
                node_name,
                version,
                features,
                layout: self.config.slice_layout,
                shared_slots: self.config.shared_slots,
            },
            &self.inventory,
            &self.gpus,
            &self.mig,
            health,
        )
    }
}

/// Opens the backend. The mock writes its state file only with `StateAccess::ReadWrite`.
pub fn open_backend(
    spec: &BackendSpec,
    paths: &BackendPaths,
    access: StateAccess,
) -> Result<(Box<dyn GpuBackend>, Option<NodeConfig>), NodeError> {
    match spec {
        BackendSpec::Nvml(lib) => {
            let b = NvmlBackend::new(lib.clone(), paths.proc_root.clone(), paths.sys_root.clone())?;
            Ok((Box::new(b), None))
        }
        BackendSpec::Mock(file) => {
            let node = match file {
                Some(f) => MockNode::from_file(f)?,
                None => MockNode::embedded_default()?,
            };
            let embedded = NodeConfig::embedded_in(&node)?;
            Ok((
                Box::new(
                    MockBackend::new(node, paths.state_dir.clone(), access)
                        .with_proc_root(paths.proc_root.clone()),
                ),
                embedded,
            ))
        }
    }
}

/// Loads a node config file.
pub fn read_config(path: &Path) -> Result<NodeConfig, NodeError> {
    let text = std::fs::read_to_string(path).map_err(|source| NodeError::ReadConfig {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(NodeConfig::from_yaml(&text, &path.display().to_string())?)
}

/// Discovers the node and resolves modes. Config precedence: `config_path`, then the
/// mock node's embedded config, then built-in defaults.
pub fn load_node(
    spec: &BackendSpec,
    config_path: Option<&Path>,
    paths: &BackendPaths,
    access: StateAccess,
) -> Result<NodeModel, NodeError> {
    let (backend, embedded) = open_backend(spec, paths, access)?;
    let (config, source) = match config_path {
        Some(p) => (read_config(p)?, p.display().to_string()),
        None => match embedded {
            Some(c) => (c, "mock node (config)".to_string()),
            None => (NodeConfig::default(), "built-in defaults".to_string()),
        },
    };
    let inventory = backend.discover()?;
    let gpus = config.resolve(&inventory, &source)?;
    let mut mig = BTreeMap::new();
    let mut unread = Vec::new();
    for g in gpus
        .iter()
        .filter(|g| g.mode == GpuMode::Mig && g.gpu.mig_capable)
    {
        match backend.mig_status(g.gpu.minor) {
            Ok(status) => {
                mig.insert(g.gpu.minor, status);
            }
            Err(e) => unread.push(format!(
                "GPU {}: {}",
                g.gpu.minor,
                crate::error_chain::cause_chain(&e)
            )),
        }
    }
    if !unread.is_empty() {
        // One warning for the node, however many GPUs.
        warn!(errors = %unread.join("; "), "cannot read MIG state; assuming no MIG devices");
    }
    Ok(NodeModel {
        inventory,
        config,
        gpus,
        mig,
        backend: Arc::from(backend),
    })
}
