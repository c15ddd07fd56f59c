//! The mock backend: a simulated node described in YAML (`mock.tessera.dev/v1alpha1`,
//! kind `MockNode`), persisted as [`NodeState`] under the state dir.
//!
//! Without a file, the embedded default node is used: 2× H100 80GB HBM3 (minors 0–1,
//! MIG-capable, PCIe root `pci0000:00`, NUMA 0) and 2× Tesla T4 (minors 2–3,
//! `pci0000:80`, NUMA 1), with the default config gpu-0 `mig`, gpu-1 `shared`,
//! gpu-2/3 `exclusive`. The file format is documented by `examples/mock-node.yaml`,
//! which is exactly the embedded default.

use std::path::{Path, PathBuf};

use serde::Deserialize;

pub mod ledger;
pub mod state;

use super::{
    BackendError, CharMajors, ComputeInstance, GpuBackend, GpuInfo, GpuProcess, HealthEvent,
    HealthEventKind, MigInstance, MigStatus, NodeInventory,
};
use crate::mig::geometry::{self, GpuInstance};
use crate::mig::{GpuModel, MigError};
use state::{GpuMig, NodeState, StateError};

/// The embedded default node description.
pub const DEFAULT_NODE_YAML: &str = include_str!("../../../examples/mock-node.yaml");
pub const API_VERSION: &str = "mock.tessera.dev/v1alpha1";
pub const KIND: &str = "MockNode";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MockCharDevices {
    nvidia: u32,
    #[serde(rename = "nvidia-uvm")]
    nvidia_uvm: u32,
    #[serde(rename = "nvidia-caps", default)]
    nvidia_caps: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MockGpu {
    /// NVML index; defaults to the position in the list.
    #[serde(default)]
    index: Option<u32>,
    minor: u32,
    uuid: String,
    product_name: String,
    brand: String,
    architecture: String,
    memory_bytes: u64,
    multiprocessors: u32,
    cuda_compute_capability: String,
    #[serde(rename = "pciBusID")]
    pci_bus_id: String,
    #[serde(default)]
    pcie_root: Option<String>,
    #[serde(default)]
    numa_node: Option<i64>,
    #[serde(default)]
    mig_capable: bool,
    #[serde(default)]
    mig_enabled: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MockNodeDoc {
    api_version: String,
    kind: String,
    driver_version: String,
    cuda_driver_version: String,
    char_devices: MockCharDevices,
    gpus: Vec<MockGpu>,
    #[serde(default)]
    config: Option<serde_yaml_ng::Value>,
    /// The simulated driver's memory ledger (see [`ledger`]), as the plugin sees it;
    /// a relative path is under the state dir, beside the simulated node's state. With
    /// it the node lists each GPU's processes; without it, none.
    #[serde(default)]
    driver_ledger: Option<PathBuf>,
}

/// A parsed, validated mock node description.
#[derive(Debug, Clone)]
pub struct MockNode {
    doc: MockNodeDoc,
    source_name: String,
    digest: String,
}

/// `Err` naming `field` when `value`, published as a string attribute, is longer than
/// the API server allows (it would get the whole pool refused).
fn attribute_fits(field: &str, value: &str) -> Result<(), String> {
    let max = k8s_model::validation::DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH;
    if value.len() > max {
        return Err(format!(
            "{field}: {} bytes, more than the {max} a device attribute may have",
            value.len()
        ));
    }
    Ok(())
}

impl MockNode {
    /// Parses and validates a description. Errors name the field and the source.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, BackendError> {
        let bad = |reason: String| BackendError::MockDescription {
            path: source_name.into(),
            reason,
        };
        yaml_guard::check(text).map_err(|e| bad(e.to_string()))?;
        let de = serde_yaml_ng::Deserializer::from_str(text);
        let doc: MockNodeDoc = serde_path_to_error::deserialize(de)
            .map_err(|e| bad(format!("{}: {}", e.path(), e.inner())))?;
        if doc.api_version != API_VERSION {
            return Err(bad(format!(
                "apiVersion: unsupported {:?}, expected {API_VERSION:?}",
                doc.api_version
            )));
        }
        if doc.kind != KIND {
            return Err(bad(format!("kind: must be {KIND:?}")));
        }
        let mut minors = std::collections::BTreeSet::new();
        let mut uuids = std::collections::BTreeSet::new();
        for (i, g) in doc.gpus.iter().enumerate() {
            if !minors.insert(g.minor) {
                return Err(bad(format!("gpus[{i}].minor: duplicate minor {}", g.minor)));
            }
            if !g.uuid.starts_with("GPU-") || !uuids.insert(g.uuid.to_ascii_lowercase()) {
                return Err(bad(format!(
                    "gpus[{i}].uuid: {:?} must be a unique GPU-... UUID",
                    g.uuid
                )));
            }
            if g.mig_enabled && !g.mig_capable {
                return Err(bad(format!("gpus[{i}].migEnabled: GPU is not migCapable")));
            }
            // These become string attributes of the published devices, which the API
            // server caps at 64 bytes: a longer one would get the whole pool refused.
            for (field, value) in [
                ("uuid", Some(&g.uuid)),
                ("productName", Some(&g.product_name)),
                ("brand", Some(&g.brand)),
                ("architecture", Some(&g.architecture)),
                ("cudaComputeCapability", Some(&g.cuda_compute_capability)),
                ("pciBusID", Some(&g.pci_bus_id)),
                ("pcieRoot", g.pcie_root.as_ref()),
            ] {
                if let Some(v) = value {
                    attribute_fits(&format!("gpus[{i}].{field}"), v).map_err(bad)?;
                }
            }
        }
        // Every device carries these two as `driverVersionString` and
        // `cudaDriverVersionString`.
        for (field, v) in [
            ("driverVersion", &doc.driver_version),
            ("cudaDriverVersion", &doc.cuda_driver_version),
        ] {
            attribute_fits(field, v).map_err(bad)?;
        }
        if let Some(p) = &doc.driver_ledger
            && (p.as_os_str().is_empty()
                || p.components().any(|c| c == std::path::Component::ParentDir))
        {
            return Err(bad(format!(
                "driverLedger: {:?} must be a path without `..` (relative: under the state dir)",
                p.display()
            )));
        }
        Ok(MockNode {
            digest: fnv1a_hex(text.as_bytes()),
            doc,
            source_name: source_name.into(),
        })
    }

    /// The embedded default node.
    pub fn embedded_default() -> Result<Self, BackendError> {
        Self::parse(DEFAULT_NODE_YAML, "built-in default node")
    }

    /// Loads a description file.
    pub fn from_file(path: &Path) -> Result<Self, BackendError> {
        let text = std::fs::read_to_string(path).map_err(|e| BackendError::MockDescription {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The node's inventory as described (GPUs ordered by minor).
    pub fn inventory(&self) -> NodeInventory {
        let mut gpus: Vec<GpuInfo> = self
            .doc
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| GpuInfo {
                index: g.index.unwrap_or(i as u32),
                minor: g.minor,
                uuid: g.uuid.clone(),
                product_name: g.product_name.clone(),
                brand: Some(g.brand.clone()),
                architecture: Some(g.architecture.clone()),
                memory_bytes: g.memory_bytes,
                multiprocessors: Some(g.multiprocessors),
                cuda_compute_capability: g.cuda_compute_capability.clone(),
                pci_bus_id: g.pci_bus_id.to_ascii_lowercase(),
                pcie_root: g.pcie_root.clone(),
                numa_node: g.numa_node,
                mig_capable: g.mig_capable,
                mig_enabled: g.mig_enabled,
            })
            .collect();
        gpus.sort_by_key(|g| g.minor);
        NodeInventory {
            driver_version: self.doc.driver_version.clone(),
            cuda_driver_version: self.doc.cuda_driver_version.clone(),
            char_majors: CharMajors {
                nvidia: self.doc.char_devices.nvidia,
                nvidia_uvm: self.doc.char_devices.nvidia_uvm,
                nvidia_caps: self.doc.char_devices.nvidia_caps,
            },
            gpus,
        }
    }

    /// The node config embedded in the description, if any, undecoded (the config
    /// module decodes it: the inventory knows nothing of modes), with a name for errors.
    pub fn embedded_config_document(&self) -> Option<(&serde_yaml_ng::Value, String)> {
        self.doc
            .config
            .as_ref()
            .map(|v| (v, format!("{} (config)", self.source_name)))
    }

    /// A digest of the description text; the state file records it so that a changed
    /// description re-initialises the simulated node.
    pub fn digest(&self) -> &str {
        &self.digest
    }
}

/// Whether the backend may create the state file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateAccess {
    /// Read an existing state file if it matches the description; never write.
    /// Used by `tessera inventory`, which must run without privileges.
    ReadOnly,
    /// Create (or re-create, when the description changed) the state file.
    ReadWrite,
}

/// The mock backend over a [`MockNode`] and its state file.
pub struct MockBackend {
    node: MockNode,
    state_dir: PathBuf,
    access: StateAccess,
    /// The `/proc` whose PIDs the ledger's processes are reported in (the host's, as
    /// NVML reports them).
    proc_root: PathBuf,
    /// The last event in the state when health events were first asked for: NVML
    /// delivers XIDs only to an event set registered before them, so a restarted plugin
    /// must not see the XIDs of its previous life again (a lost GPU stays lost: that is
    /// the GPU's state, not an event).
    registered: std::sync::OnceLock<u64>,
}

impl MockBackend {
    pub fn new(node: MockNode, state_dir: PathBuf, access: StateAccess) -> Self {
        MockBackend {
            node,
            state_dir,
            access,
            proc_root: PathBuf::from("/proc"),
            registered: std::sync::OnceLock::new(),
        }
    }

    /// The simulated driver's ledger (`driverLedger`, relative to the state dir), when
    /// the description names one and this backend may write (a read-only backend, as
    /// `tessera inventory` uses, neither creates nor needs it).
    fn ledger_path(&self) -> Option<PathBuf> {
        let p = self.node.doc.driver_ledger.as_ref()?;
        (self.access == StateAccess::ReadWrite).then(|| self.state_dir.join(p))
    }

    /// Reports the ledger's processes with the PIDs of `proc_root` (`--proc-root`).
    pub fn with_proc_root(mut self, proc_root: PathBuf) -> Self {
        self.proc_root = proc_root;
        self
    }

    pub fn node(&self) -> &MockNode {
        &self.node
    }

    /// Loads the node state, creating it from the description when missing or stale
    /// (with [`StateAccess::ReadWrite`]).
    pub fn state(&self) -> Result<NodeState, StateError> {
        let existing = match NodeState::load(&self.state_dir) {
            Ok(s) => s,
            // Read-only callers must not fail on a state dir they cannot read.
            Err(StateError::Read { .. }) if self.access == StateAccess::ReadOnly => None,
            Err(e) => return Err(e),
        };
        if let Some(s) = existing
            && s.source_digest == self.node.digest()
        {
            return Ok(s);
        }
        let fresh = NodeState {
            source_digest: self.node.digest().to_string(),
            inventory: self.node.inventory(),
            mig: Default::default(),
            health: Vec::new(),
        };
        if self.access == StateAccess::ReadWrite {
            fresh.store(&self.state_dir)?;
        }
        Ok(fresh)
    }
}

impl MockBackend {
    /// Applies a MIG change to one GPU under the state lock, NVML-style: the GPU must
    /// be MIG-capable and of a catalogued model.
    fn with_gpu<T>(
        &self,
        op: &'static str,
        minor: u32,
        change: impl FnOnce(&mut GpuInfo, &mut GpuMig, &'static GpuModel) -> Result<T, MigError>,
    ) -> Result<T, BackendError> {
        // Make sure the state exists before locking it for an update.
        self.state()?;
        state::update(&self.state_dir, |st| {
            let gpu = st
                .inventory
                .gpus
                .iter_mut()
                .find(|g| g.minor == minor)
                .ok_or(BackendError::NoSuchGpu(minor))?;
            let mig_err = |source| BackendError::Mig { op, minor, source };
            if !gpu.mig_capable {
                return Err(mig_err(MigError::NotSupported(format!(
                    "{} is not MIG-capable",
                    gpu.product_name
                ))));
            }
            let model = crate::mig::model_for_product(&gpu.product_name).ok_or_else(|| {
                mig_err(MigError::NotSupported(format!(
                    "no MIG catalog for {}",
                    gpu.product_name
                )))
            })?;
            let m = st.mig.entry(minor).or_default();
            change(gpu, m, model).map_err(mig_err)
        })?
    }
}

impl GpuBackend for MockBackend {
    fn kind(&self) -> &'static str {
        "mock"
    }

    fn discover(&self) -> Result<NodeInventory, BackendError> {
        let inventory = self.state()?.inventory;
        // The simulated driver's ledger exists from the plugin's start, so that pods
        // mounting it (hostPath, type File) start whatever the watchdog's mode.
        self.ledger_path()
            .map_or(Ok(()), |p| ledger::create_if_missing(&p))?;
        Ok(inventory)
    }

    fn mig_status(&self, minor: u32) -> Result<MigStatus, BackendError> {
        let st = self.state()?;
        let gpu = st
            .inventory
            .gpus
            .iter()
            .find(|g| g.minor == minor)
            .ok_or(BackendError::NoSuchGpu(minor))?;
        Ok(MigStatus {
            enabled: gpu.mig_enabled,
            instances: st
                .mig
                .get(&minor)
                .map(|m| m.instances.clone())
                .unwrap_or_default(),
        })
    }

    fn set_mig_mode(&self, minor: u32, enabled: bool) -> Result<(), BackendError> {
        self.with_gpu("set-mode", minor, |gpu, m, model| {
            if gpu.mig_enabled == enabled {
                return Ok(());
            }
            if !model.reset_free_mig_toggle {
                return Err(MigError::NotSupported(format!(
                    "{} needs a GPU reset to change MIG mode",
                    gpu.product_name
                )));
            }
            if !enabled && !m.instances.is_empty() {
                return Err(MigError::InUse(format!(
                    "{} MIG instance(s) still exist",
                    m.instances.len()
                )));
            }
            gpu.mig_enabled = enabled;
            Ok(())
        })
    }

    fn create_mig(
        &self,
        minor: u32,
        profile_id: u32,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        self.with_gpu("create", minor, |gpu, m, model| {
            if !gpu.mig_enabled {
                return Err(MigError::NotSupported("MIG mode is disabled".into()));
            }
            let existing: Vec<GpuInstance> = m
                .instances
                .iter()
                .map(|i| GpuInstance {
                    gi_id: i.gi_id,
                    profile_id: i.profile_id,
                    start: i.start,
                    size: i.size,
                })
                .collect();
            let gi = geometry::check_create(model, &existing, profile_id, start)?;
            // The compute instance spans the whole GPU instance: CI ID 0.
            let inst = MigInstance {
                gi_id: gi.gi_id,
                profile_id: gi.profile_id,
                start: gi.start,
                size: gi.size,
                ci: Some(ComputeInstance {
                    ci_id: 0,
                    uuid: geometry::mig_uuid(&gpu.uuid, gi.gi_id, 0),
                }),
            };
            m.instances.push(inst.clone());
            m.instances.sort_by_key(|i| i.gi_id);
            Ok(inst)
        })
    }

    fn destroy_mig(&self, minor: u32, gi_id: u32) -> Result<(), BackendError> {
        self.with_gpu("destroy", minor, |_gpu, m, _model| {
            let pos = m
                .instances
                .iter()
                .position(|i| i.gi_id == gi_id)
                .ok_or_else(|| MigError::NotFound(format!("no GPU instance with ID {gi_id}")))?;
            if m.busy.contains(&gi_id) {
                return Err(MigError::InUse(format!(
                    "processes are running on GPU instance {gi_id}"
                )));
            }
            m.instances.remove(pos);
            Ok(())
        })
    }

    /// The injected events after `since`, as NVML would report them: a `clear` is a
    /// recovery only for a GPU that was lost (NVML sees a GPU answer again, nothing
    /// else), so it is dropped for any other GPU.
    ///
    /// Events from before the first call (the plugin's registration) are not reported,
    /// except the loss of a GPU still lost then.
    fn health_events(&self, since: u64) -> Result<Vec<HealthEvent>, BackendError> {
        let events = self.state()?.health;
        let start = *self
            .registered
            .get_or_init(|| events.last().map_or(0, |e| e.seq));
        // minor -> its loss, for every GPU lost at `start` and after.
        let mut lost = std::collections::BTreeMap::new();
        let mut out = Vec::new();
        for e in events {
            let seen = match e.kind {
                HealthEventKind::Lost => lost.insert(e.minor, e).is_none(),
                HealthEventKind::Recovered => lost.remove(&e.minor).is_some(),
                HealthEventKind::Xid(_) => true,
            };
            if e.seq == start {
                // Registration: what is still lost is reported, once, in minor order.
                out.extend(lost.values().copied());
            } else if seen && e.seq > start {
                out.push(e);
            }
        }
        out.retain(|e| e.seq > since);
        Ok(out)
    }

    /// From the simulated driver's ledger when the description names one: the live
    /// processes holding memory on the GPU, as NVML lists them (host PIDs, whole GPU).
    fn processes(&self, minor: u32) -> Result<Vec<GpuProcess>, BackendError> {
        let Some(path) = self.ledger_path() else {
            return Ok(Vec::new());
        };
        ledger::create_if_missing(&path)?;
        let gpu = self
            .node
            .doc
            .gpus
            .iter()
            .find(|g| g.minor == minor)
            .ok_or(BackendError::NoSuchGpu(minor))?;
        ledger::processes(&path, &gpu.uuid, &self.proc_root)
    }
}

/// Appends a health event for GPU `minor` to the simulated node under `state_dir` (whose
/// state must exist: the plugin or a backend created it) and returns its sequence
/// number. Both the mock backend and the fake `libnvidia-ml.so.1` see it.
pub fn inject(state_dir: &Path, minor: u32, kind: HealthEventKind) -> Result<u64, BackendError> {
    inject_event(state_dir, minor, None, kind)
}

fn inject_event(
    state_dir: &Path,
    minor: u32,
    gi_id: Option<u32>,
    kind: HealthEventKind,
) -> Result<u64, BackendError> {
    state::update(state_dir, |st| {
        if !st.inventory.gpus.iter().any(|g| g.minor == minor) {
            return Err(BackendError::NoSuchGpu(minor));
        }
        let seq = st.health.last().map_or(0, |e| e.seq) + 1;
        st.health.push(HealthEvent {
            seq,
            minor,
            gi_id,
            kind,
        });
        Ok(seq)
    })?
}

/// Injects an XID critical error on GPU `minor`.
pub fn inject_xid(state_dir: &Path, minor: u32, xid: u64) -> Result<u64, BackendError> {
    inject(state_dir, minor, HealthEventKind::Xid(xid))
}

/// Injects an XID critical error on MIG GPU instance `gi_id` of GPU `minor` (NVML's
/// event carries the GPU instance ID). The instance need not exist: a real event may
/// name one destroyed since.
pub fn inject_mig_xid(
    state_dir: &Path,
    minor: u32,
    gi_id: u32,
    xid: u64,
) -> Result<u64, BackendError> {
    inject_event(state_dir, minor, Some(gi_id), HealthEventKind::Xid(xid))
}

/// Makes GPU `minor` fall off the bus (NVML queries answer `GPU_IS_LOST`).
pub fn inject_lost(state_dir: &Path, minor: u32) -> Result<u64, BackendError> {
    inject(state_dir, minor, HealthEventKind::Lost)
}

/// A lost GPU `minor` answers again (a reset brought it back). Nothing happens for a
/// GPU that is not lost: NVML has no other sign of health returning.
pub fn inject_clear(state_dir: &Path, minor: u32) -> Result<u64, BackendError> {
    inject(state_dir, minor, HealthEventKind::Recovered)
}

/// FNV-1a, 64 bit: a stable digest with no dependency (not for security).
fn fnv1a_hex(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (fuzz target node_config): a mock node with a 66-byte UUID parsed,
    /// and every slice it published was refused by the API server (string attributes
    /// are at most 64 bytes). Such a field is refused when parsing, naming it.
    #[test]
    fn fields_longer_than_an_attribute_are_refused() {
        let long_uuid = DEFAULT_NODE_YAML.replace(
            "GPU-4f8d0c1e-6a2b-4c59-9e31-0a7b5d2c9f10",
            "GPU-4f8d0c1e-6aaaaaaaaaaaaaaaaaaaaaaaaaaa2b-4c59-9e31-0a7b5d2c9f10",
        );
        let err = MockNode::parse(&long_uuid, "m").unwrap_err().to_string();
        assert!(err.contains("gpus[0].uuid: 66 bytes"), "{err}");
        let long_name = DEFAULT_NODE_YAML.replace("Tesla T4", &"T".repeat(65));
        let err = MockNode::parse(&long_name, "m").unwrap_err().to_string();
        assert!(err.contains("gpus[2].productName"), "{err}");
        // Found by the node_config fuzzer: node-wide fields are device attributes too.
        let long_cuda = DEFAULT_NODE_YAML.replace(
            r#"cudaDriverVersion: "13.0""#,
            &format!("cudaDriverVersion: \"13.0 {}\"", "x".repeat(60)),
        );
        let err = MockNode::parse(&long_cuda, "m").unwrap_err().to_string();
        assert!(err.contains("cudaDriverVersion: 65 bytes"), "{err}");
        let long_driver = DEFAULT_NODE_YAML.replace("580.65.06", &"5".repeat(65));
        let err = MockNode::parse(&long_driver, "m").unwrap_err().to_string();
        assert!(err.contains("driverVersion: 65 bytes"), "{err}");
        assert!(MockNode::parse(DEFAULT_NODE_YAML, "m").is_ok());
    }

    /// Regression (fuzz target node_config): 20,000 nested flow mappings took the YAML
    /// scanner seconds. They are refused before parsing, with the place; so is the
    /// fuzzer's own input, as a mock node and as a node config.
    #[test]
    fn deeply_nested_flow_collections_are_refused_before_parsing() {
        let deep = format!("{DEFAULT_NODE_YAML}\nextra: {}", "{&a b: ".repeat(20_000));
        let err = MockNode::parse(&deep, "m").unwrap_err().to_string();
        assert!(err.contains("nested more than 128 deep at line"), "{err}");
        let found = include_str!("../../../fuzz/regressions/node_config/deep-flow-nesting.yaml");
        let err = MockNode::parse(found, "m").unwrap_err().to_string();
        assert!(err.contains("nested more than 128 deep at line 3"), "{err}");
        let err = crate::config::NodeConfig::from_yaml(found, "c").unwrap_err();
        assert!(err.message.contains("nested more than 128 deep"), "{err}");
    }

    /// The embedded default node is the one the contract describes.
    #[test]
    fn embedded_default_node_matches_the_contract() {
        let node = MockNode::embedded_default().unwrap();
        let inv = node.inventory();
        let summary: Vec<_> = inv
            .gpus
            .iter()
            .map(|g| {
                (
                    g.minor,
                    g.product_name.as_str(),
                    g.mig_capable,
                    g.pcie_root.as_deref(),
                    g.numa_node,
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    0,
                    "NVIDIA H100 80GB HBM3",
                    true,
                    Some("pci0000:00"),
                    Some(0)
                ),
                (
                    1,
                    "NVIDIA H100 80GB HBM3",
                    true,
                    Some("pci0000:00"),
                    Some(0)
                ),
                (2, "Tesla T4", false, Some("pci0000:80"), Some(1)),
                (3, "Tesla T4", false, Some("pci0000:80"), Some(1)),
            ]
        );
        let cfg = crate::config::NodeConfig::embedded_in(&node)
            .unwrap()
            .unwrap();
        let modes: Vec<_> = cfg
            .resolve(&inv, "t")
            .unwrap()
            .into_iter()
            .map(|m| m.mode.as_str())
            .collect();
        assert_eq!(modes, ["mig", "shared", "exclusive", "exclusive"]);
    }

    /// An unknown field in a description is refused with its path.
    #[test]
    fn unknown_field_in_description_is_named() {
        let text = DEFAULT_NODE_YAML.replace(
            "numaNode: 0\n  migCapable: true\n  migEnabled: false\n- minor: 1",
            "numaNode: 0\n  migCapable: true\n  migEnabled: false\n  colour: green\n- minor: 1",
        );
        let err = MockNode::parse(&text, "t").unwrap_err().to_string();
        assert!(err.contains("gpus[0]") && err.contains("colour"), "{err}");
    }

    /// Injected events come back in order after a sequence number, and survive a
    /// reload; a `clear` is a recovery only for a lost GPU (as on NVML), and an XID
    /// may name a GPU instance.
    #[test]
    fn injected_health_events_are_polled_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let b = MockBackend::new(
            MockNode::embedded_default().unwrap(),
            dir.path().into(),
            StateAccess::ReadWrite,
        );
        assert!(b.health_events(0).unwrap().is_empty());
        assert_eq!(inject_xid(dir.path(), 2, 79).unwrap(), 1);
        assert_eq!(inject_lost(dir.path(), 3).unwrap(), 2);
        assert_eq!(inject_clear(dir.path(), 3).unwrap(), 3);
        assert_eq!(inject_clear(dir.path(), 2).unwrap(), 4);
        assert_eq!(inject_mig_xid(dir.path(), 0, 3, 48).unwrap(), 5);
        assert!(matches!(
            inject_xid(dir.path(), 9, 79),
            Err(BackendError::NoSuchGpu(9))
        ));
        let all = b.health_events(0).unwrap();
        let kinds: Vec<_> = all
            .iter()
            .map(|e| (e.seq, e.minor, e.gi_id, e.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                (1, 2, None, HealthEventKind::Xid(79)),
                (2, 3, None, HealthEventKind::Lost),
                (3, 3, None, HealthEventKind::Recovered),
                (5, 0, Some(3), HealthEventKind::Xid(48)),
            ],
            "gpu-2 was never lost: its clear is no recovery"
        );
        assert_eq!(b.health_events(2).unwrap().len(), 2);
        // MIG operations keep the events (one state file).
        b.set_mig_mode(0, true).unwrap();
        assert_eq!(b.health_events(0).unwrap().len(), 4);
    }

    /// NVML reports an XID only to an event set registered before it: a backend (a
    /// restarted plugin) sees none of the XIDs of the state's history, only a GPU still
    /// lost, and everything after its first poll.
    #[test]
    fn a_new_backend_sees_no_old_xid_only_a_gpu_still_lost() {
        let dir = tempfile::tempdir().unwrap();
        let first = MockBackend::new(
            MockNode::embedded_default().unwrap(),
            dir.path().into(),
            StateAccess::ReadWrite,
        );
        assert!(first.health_events(0).unwrap().is_empty());
        inject_xid(dir.path(), 2, 79).unwrap();
        inject_lost(dir.path(), 3).unwrap();
        inject_lost(dir.path(), 1).unwrap();
        inject_clear(dir.path(), 1).unwrap();
        assert_eq!(first.health_events(0).unwrap().len(), 4);

        let restarted = MockBackend::new(
            MockNode::embedded_default().unwrap(),
            dir.path().into(),
            StateAccess::ReadWrite,
        );
        let seen = |b: &MockBackend, since| -> Vec<_> {
            b.health_events(since)
                .unwrap()
                .iter()
                .map(|e| (e.seq, e.minor, e.kind))
                .collect()
        };
        assert_eq!(seen(&restarted, 0), [(2, 3, HealthEventKind::Lost)]);
        inject_xid(dir.path(), 0, 48).unwrap();
        inject_clear(dir.path(), 3).unwrap();
        assert_eq!(
            seen(&restarted, 2),
            [
                (5, 0, HealthEventKind::Xid(48)),
                (6, 3, HealthEventKind::Recovered)
            ]
        );
    }

    /// The state file is created once and read back; a read-only backend never writes.
    #[test]
    fn state_is_persisted_only_with_write_access() {
        let dir = tempfile::tempdir().unwrap();
        let ro = MockBackend::new(
            MockNode::embedded_default().unwrap(),
            dir.path().into(),
            StateAccess::ReadOnly,
        );
        assert_eq!(ro.discover().unwrap().gpus.len(), 4);
        assert!(!dir.path().join(super::state::STATE_FILE).exists());
        let rw = MockBackend::new(
            MockNode::embedded_default().unwrap(),
            dir.path().into(),
            StateAccess::ReadWrite,
        );
        let inv = rw.discover().unwrap();
        assert!(dir.path().join(super::state::STATE_FILE).exists());
        assert_eq!(ro.discover().unwrap(), inv);
    }
}
