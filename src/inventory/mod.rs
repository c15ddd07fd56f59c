//! The GPU backend seam: what Tessera needs to know about the node's GPUs, behind a
//! small trait with two implementations.
//!
//! * [`nvml::NvmlBackend`] talks to the NVIDIA driver through nvml-wrapper (optionally a
//!   given `libnvidia-ml.so.1`, which is how tests point it at a fake library).
//! * [`mock::MockBackend`] reads a YAML node description and keeps the simulated node's
//!   state in [`mock::state::NodeState`] under `--state-dir`. The fake `libnvidia-ml.so.1`
//!   used in tests reads the very same state file, so the simulated node has one source
//!   of truth.

pub mod mock;
pub mod nvml;
pub mod sizing;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Everything discovery learns about one physical GPU. Backend-neutral: both the
/// NVML and the mock backend fill exactly these fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    /// NVML enumeration index (not stable across reboots; the minor is).
    pub index: u32,
    /// Device minor number: `/dev/nvidia<minor>`. Device names derive from it.
    pub minor: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// NVML product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub product_name: String,
    /// NVML brand, e.g. `Nvidia`, `Tesla`; `None` when NVML does not say (the
    /// attribute is then left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brand: Option<String>,
    /// Architecture name, e.g. `Hopper`, `Turing`; `None` when NVML does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Total device memory in bytes, as NVML reports it.
    pub memory_bytes: u64,
    /// Streaming multiprocessor count; `None` when NVML has no core count or the
    /// compute capability is not in the cores-per-SM table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiprocessors: Option<u32>,
    /// CUDA compute capability as `major.minor`, e.g. `9.0`.
    pub cuda_compute_capability: String,
    /// PCI bus ID in the canonical `dddd:bb:dd.f` form, lower case.
    pub pci_bus_id: String,
    /// PCIe root complex (`pci0000:00`), when it could be resolved.
    pub pcie_root: Option<String>,
    /// NUMA node, when known.
    pub numa_node: Option<i64>,
    /// Whether the GPU supports MIG at all.
    pub mig_capable: bool,
    /// Whether MIG mode is currently enabled.
    pub mig_enabled: bool,
}

/// Character-device majors of the NVIDIA driver, as listed in `/proc/devices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CharMajors {
    /// `nvidia` (or `nvidia-frontend` before driver 550.40): `/dev/nvidia<N>`, `nvidiactl`.
    pub nvidia: u32,
    /// `nvidia-uvm`: `/dev/nvidia-uvm` (minor 0) and `/dev/nvidia-uvm-tools` (minor 1).
    pub nvidia_uvm: u32,
    /// `nvidia-caps`: MIG capability nodes `/dev/nvidia-caps/nvidia-cap<m>`.
    pub nvidia_caps: Option<u32>,
}

/// A snapshot of the node: driver facts plus every GPU, ordered by minor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInventory {
    /// Kernel driver version as NVML prints it, e.g. `580.65.06`.
    pub driver_version: String,
    /// CUDA driver API version as `major.minor`, e.g. `13.0`.
    pub cuda_driver_version: String,
    pub char_majors: CharMajors,
    pub gpus: Vec<GpuInfo>,
}

/// Errors of a GPU backend. `Display` says what failed here; causes are in `source`.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// NVML could not be loaded or initialised (no driver on this machine).
    #[error(
        "cannot load NVML from {lib}: {reason}; no NVIDIA driver here? Use `--backend mock` to run on a simulated node"
    )]
    NvmlUnavailable { lib: String, reason: String },
    /// An NVML call failed on a device.
    #[error("NVML call {call} failed on GPU {index}")]
    NvmlCall {
        call: &'static str,
        index: u32,
        #[source]
        source: ::nvml_wrapper::error::NvmlError,
    },
    /// An NVML call failed that is not about a single device.
    #[error("NVML call {call} failed")]
    NvmlSystem {
        call: &'static str,
        #[source]
        source: ::nvml_wrapper::error::NvmlError,
    },
    /// `/proc/devices` lacks a driver major or cannot be read.
    #[error("cannot find the character-device major of {name} in {path}")]
    CharMajor { name: &'static str, path: PathBuf },
    /// The mock node description is unreadable or invalid.
    #[error("mock node description {path}: {reason}")]
    MockDescription { path: String, reason: String },
    /// The simulated driver's ledger (`driverLedger`) cannot be created, or its
    /// records cannot be read.
    #[error("simulated driver ledger {path}: {reason}")]
    MockLedger { path: String, reason: String },
    /// The simulated driver's ledger cannot be opened as a regular file (the error
    /// begins with the path).
    #[error("simulated driver ledger {0}")]
    MockLedgerUnopenable(tessera_abi::AbiError),
    /// The simulated node's state file is unreadable, malformed or cannot be written.
    #[error(transparent)]
    State(#[from] mock::state::StateError),
    /// A MIG operation was refused, with the NVML return code it stands for.
    #[error("MIG {op} on gpu-{minor} failed")]
    Mig {
        op: &'static str,
        minor: u32,
        #[source]
        source: crate::mig::MigError,
    },
    /// No GPU with this minor.
    #[error("no GPU with minor {0}")]
    NoSuchGpu(u32),
}

/// A live MIG device: one GPU instance with the compute instance spanning it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigInstance {
    pub gi_id: u32,
    /// The profile ID `nvidia-smi mig -lgip` shows (19, 9, 0 ...), not the NVML index.
    pub profile_id: u32,
    /// First memory slice and number of memory slices.
    pub start: u32,
    pub size: u32,
    /// The compute instance; `None` for a GPU instance left without one (a crash
    /// between the two creations), which clean-up destroys.
    pub ci: Option<ComputeInstance>,
}

/// The compute instance of a MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComputeInstance {
    pub ci_id: u32,
    /// `MIG-...` UUID of the MIG device (one CI per GI).
    pub uuid: String,
}

/// A GPU's MIG mode and live instances.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigStatus {
    pub enabled: bool,
    pub instances: Vec<MigInstance>,
}

/// One health event of a GPU, numbered by the backend in the order it saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthEvent {
    /// Increasing, starting at 1; [`GpuBackend::health_events`] returns those after a
    /// given number.
    pub seq: u64,
    pub minor: u32,
    /// The MIG GPU instance an XID happened on (NVML's `gpuInstanceId` when valid);
    /// `None` for the whole GPU. Losses and recoveries are always the GPU's.
    pub gi_id: Option<u32>,
    pub kind: HealthEventKind,
}

/// What happened to a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthEventKind {
    /// An XID critical error (NVML `nvmlEventTypeXidCriticalError`).
    Xid(u64),
    /// The GPU fell off the bus (NVML `GPU_IS_LOST` on queries).
    Lost,
    /// The GPU answers again after it was lost (a reset or re-attach brought it
    /// back). Backends report it only for a GPU they reported lost.
    Recovered,
}

/// A process with a context on a GPU, as the driver lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuProcess {
    /// Host PID (the driver sees the host PID namespace).
    pub pid: u32,
    /// Device memory the process holds; `None` when the driver cannot say (NVML
    /// reports "not available" in some configurations).
    pub used_bytes: Option<u64>,
    /// The MIG GPU instance the process runs on; `None` for the whole GPU.
    pub gi_id: Option<u32>,
}

/// One per-process utilization sample (NVML `nvmlProcessUtilizationSample_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessSample {
    pub pid: u32,
    /// Driver timestamp in microseconds; pass the largest seen as `since_us` next time.
    pub timestamp_us: u64,
    /// Share of the sample window the process had a kernel running, in percent.
    pub sm_percent: u32,
}

/// A GPU's device-wide usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuUsage {
    /// Device memory in use, all processes (and the driver's own reservations).
    pub used_bytes: u64,
    /// Percent of the last sample window a kernel was running; `None` when unsupported.
    pub utilization_percent: Option<u32>,
}

/// The narrow interface Tessera needs from a GPU driver. Later issues add MIG
/// operations and health events here, shaped by what Tessera does, not by NVML.
pub trait GpuBackend: Send + Sync {
    /// A short name for logs (`nvml`, `mock`).
    fn kind(&self) -> &'static str;
    /// Enumerates the node's GPUs. Deterministic for an unchanged node; GPUs are
    /// ordered by minor number.
    fn discover(&self) -> Result<NodeInventory, BackendError>;

    /// MIG mode and live MIG devices of one GPU (empty when MIG is off).
    fn mig_status(&self, minor: u32) -> Result<MigStatus, BackendError>;

    /// Switches MIG mode. Only reset-free GPUs (Hopper and later) may be switched by
    /// Tessera; callers check the architecture.
    fn set_mig_mode(&self, minor: u32, enabled: bool) -> Result<(), BackendError>;

    /// Creates a GPU instance of `profile_id` at exactly `start`, then the compute
    /// instance spanning it. On a failed compute-instance creation the GPU instance is
    /// destroyed again, so nothing half-made remains.
    fn create_mig(
        &self,
        minor: u32,
        profile_id: u32,
        start: u32,
    ) -> Result<MigInstance, BackendError>;

    /// Destroys the compute instance(s) of GPU instance `gi_id`, then the GPU instance.
    /// `IN_USE` (processes still running) fails the call and changes nothing.
    fn destroy_mig(&self, minor: u32, gi_id: u32) -> Result<(), BackendError>;

    /// Health events with a sequence number above `since`, oldest first. Poll-based:
    /// returns at once (an empty list when nothing happened). The default is a backend
    /// that never reports any.
    fn health_events(&self, since: u64) -> Result<Vec<HealthEvent>, BackendError> {
        let _ = since;
        Ok(Vec::new())
    }

    /// Processes with a compute context on GPU `minor` (and its MIG devices). The
    /// default is a node without CUDA processes (the mock backend without a
    /// `driverLedger`; the fake `libnvidia-ml` lists them over the NVML backend).
    fn processes(&self, minor: u32) -> Result<Vec<GpuProcess>, BackendError> {
        let _ = minor;
        Ok(Vec::new())
    }

    /// Per-process utilization samples of GPU `minor` taken after `since_us`.
    fn process_utilization(
        &self,
        minor: u32,
        since_us: u64,
    ) -> Result<Vec<ProcessSample>, BackendError> {
        let _ = (minor, since_us);
        Ok(Vec::new())
    }

    /// Device-wide memory use and utilization of GPU `minor`; `None` when the backend
    /// has no usage to report (the mock backend).
    fn usage(&self, minor: u32) -> Result<Option<GpuUsage>, BackendError> {
        let _ = minor;
        Ok(None)
    }
}
