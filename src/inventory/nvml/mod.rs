//! The production GPU backend: whole-GPU discovery through NVML (nvml-wrapper's safe
//! API), plus what NVML does not know, read from the host's `/proc` and `/sys`:
//! character-device majors, the PCIe root complex, and the NUMA node when NVML has none;
//! and the MIG operations (status, mode, create, destroy) through NVML's MIG API.
//!
//! This module is a thin edge: [`NvmlBackend`] makes the calls and maps their errors,
//! and the decisions (bus-ID normalisation, CUDA cores per SM, `/proc/devices` parsing,
//! PCIe-root extraction, which compute-instance profile spans a GPU instance) are pure
//! functions with table tests below. NVML itself judges every MIG request; its refusals
//! (codes 2, 3, 6, 19, 23) become [`MigError`]s, any other failure `NvmlCall`.
//! `/proc` and `/sys` are constructor parameters so that tests point them at a temp dir;
//! the library path is one too, so that tests load NVIDIA's models
//! (`tests/nvml-models`) or the fake `libnvidia-ml.so.1` of `tests/fakes/fake_nvml.c`
//! (what the models lack: per-process memory from the fake CUDA driver, lost GPUs).
//!
//! nvml-wrapper 0.13 wraps only part of the MIG API (and its `possible_placements`
//! always returns nothing), so the rest is called through the raw symbols of
//! nvml-wrapper-sys, reached through `Nvml::lib()`'s `Result` fields (never the
//! `NvmlLib` helper methods, which panic on a symbol an older driver lacks). The crate
//! does not depend on nvml-wrapper-sys directly, so its types are not nameable here:
//! handles are kept type-erased (`DeviceHandle`, `GiHandle`, `CiHandle`) and structs
//! are `#[repr(C)]` mirrors of nvml.h whose size is checked against the symbol's
//! parameter type at every call (`out_ptr`). This is the only `unsafe` in the crate;
//! every block says why it holds.

use std::collections::{BTreeSet, HashMap};
use std::ffi::{OsStr, c_void};
use std::path::{Component, Path, PathBuf};
use std::ptr;
use std::sync::{Mutex, MutexGuard, PoisonError};

use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::struct_wrappers::device::ProfileInfo;
use nvml_wrapper::{Device, Nvml};

use super::{
    BackendError, CharMajors, ComputeInstance, GpuBackend, GpuInfo, GpuProcess, GpuUsage,
    HealthEvent, HealthEventKind, MigInstance, MigStatus, NodeInventory, ProcessSample,
};
use crate::mig::MigError;
use crate::mig::geometry::NVML_GPU_INSTANCE_PROFILE_COUNT;

/// What `Nvml::init()` dlopens when no library path is given.
const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// `NVML_DEVICE_MIG_ENABLE` (nvml.h): the value of `MigMode::current` when MIG is on.
const NVML_DEVICE_MIG_ENABLE: u32 = 1;
/// `NVML_DEVICE_MIG_DISABLE` (nvml.h).
const NVML_DEVICE_MIG_DISABLE: u32 = 0;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT` of nvml.h API 13 (facts A1.0: `7_SLICE_NVL` is
/// 8). nvml-wrapper-sys 0.10 predates it and says 8.
const NVML_COMPUTE_INSTANCE_PROFILE_COUNT: u32 = 9;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`: the only engine profile.
const NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: u32 = 0;
/// `NVML_ERROR_INSUFFICIENT_RESOURCES`, which nvml-wrapper has no variant for: it
/// arrives as `NvmlError::UnexpectedVariant(23)`.
const NVML_ERROR_INSUFFICIENT_RESOURCES: u32 = 23;

/// The NVIDIA driver seen through NVML. Holds one initialised NVML for its whole life
/// (NVML is reference counted; `Drop` shuts it down).
pub struct NvmlBackend {
    nvml: Nvml,
    proc_root: PathBuf,
    sys_root: PathBuf,
    /// GPU handles by minor, filled by one enumeration on the first MIG operation (and
    /// again only for a minor it did not find). NVML handles stay valid until shutdown.
    gpus: Mutex<HashMap<u32, CachedGpu>>,
    /// Health monitoring: the XID event set (created on the first poll) and the events
    /// seen so far.
    health: Mutex<HealthPoll>,
}

/// A GPU's handle and NVML index (for error reports), as cached by minor.
#[derive(Debug, Clone, Copy)]
struct CachedGpu {
    index: u32,
    handle: DeviceHandle,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend")
            .field("proc_root", &self.proc_root)
            .field("sys_root", &self.sys_root)
            .finish_non_exhaustive()
    }
}

impl NvmlBackend {
    /// Loads and initialises NVML from `lib_path` (or the loader's default search for
    /// `libnvidia-ml.so.1`). `proc_root` and `sys_root` stand for `/proc` and `/sys`.
    ///
    /// # Errors
    /// [`BackendError::NvmlUnavailable`] when the library cannot be loaded or
    /// `nvmlInit_v2` fails (no driver, driver not loaded, no permission); its message
    /// points at `--backend mock`.
    pub fn new(
        lib_path: Option<PathBuf>,
        proc_root: PathBuf,
        sys_root: PathBuf,
    ) -> Result<Self, BackendError> {
        let init = match &lib_path {
            Some(path) => Nvml::builder().lib_path(path.as_os_str()).init(),
            None => Nvml::init(),
        };
        let nvml = init.map_err(|e| BackendError::NvmlUnavailable {
            lib: lib_path
                .as_deref()
                .map_or_else(|| DEFAULT_LIB.to_string(), |p| p.display().to_string()),
            // NvmlError's Display already includes its libloading cause.
            reason: e.to_string(),
        })?;
        Ok(NvmlBackend {
            nvml,
            proc_root,
            sys_root,
            gpus: Mutex::new(HashMap::new()),
            health: Mutex::new(HealthPoll::default()),
        })
    }
}

/// Calls the raw NVML entry point `$sym` as `$call` (an `unsafe` call of `$f`), turning
/// a missing symbol or a failure code into [`CallFailed`] named after the symbol. Uses
/// `NvmlLib`'s `Result` field, never its helper method (which panics on a missing
/// symbol). Must be used in a function returning `Result<_, CallFailed>`.
macro_rules! nvml_call {
    ($nvml:expr, $sym:ident, |$f:ident| $call:expr) => {{
        let failed = |source| CallFailed::new(stringify!($sym), source);
        let $f = nvml_sym($nvml.lib().$sym.as_ref())
            .copied()
            .map_err(failed)?;
        nvml_try($call).map_err(failed)
    }};
}

/// Declares a type-erased NVML handle: the pointer NVML gave, cast back to the
/// symbol's parameter type at each call.
macro_rules! opaque_handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        struct $name(*mut c_void);

        impl $name {
            fn of<T>(handle: *mut T) -> Self {
                Self(handle.cast())
            }
            fn raw<T>(self) -> *mut T {
                self.0.cast()
            }
        }
    };
}

opaque_handle!(
    /// `nvmlDevice_t`: a GPU or a MIG device.
    DeviceHandle
);
opaque_handle!(
    /// `nvmlGpuInstance_t`.
    GiHandle
);
opaque_handle!(
    /// `nvmlComputeInstance_t`.
    CiHandle
);
opaque_handle!(
    /// `nvmlEventSet_t`.
    EventSetHandle
);

// SAFETY: as for DeviceHandle: an opaque token only NVML dereferences; NVML is
// thread-safe, and the set is only used under the `health` mutex.
unsafe impl Send for EventSetHandle {}
// SAFETY: as for Send.
unsafe impl Sync for EventSetHandle {}

// SAFETY: an NVML device handle is an opaque token that only the library dereferences,
// and NVML is thread-safe: any thread may pass it to any NVML call. (nvml-wrapper's
// `Device` is Send + Sync for the same reason.)
unsafe impl Send for DeviceHandle {}
// SAFETY: as for Send; the handle is never written through on our side.
unsafe impl Sync for DeviceHandle {}

/// `nvmlGpuInstancePlacement_t` (8 bytes).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct RawPlacement {
    start: u32,
    size: u32,
}

/// `nvmlGpuInstanceInfo_t` (24 bytes): `device` is the parent GPU.
#[repr(C)]
#[allow(dead_code, reason = "mirrors nvml.h, which fills every field")]
struct RawGpuInstanceInfo {
    device: *mut c_void,
    id: u32,
    profile_id: u32,
    placement: RawPlacement,
}

/// `nvmlComputeInstanceProfileInfo_t` (36 bytes).
#[repr(C)]
#[derive(Default)]
#[allow(dead_code, reason = "mirrors nvml.h, which fills every field")]
struct RawComputeInstanceProfileInfo {
    id: u32,
    slice_count: u32,
    instance_count: u32,
    multiprocessor_count: u32,
    shared_copy_engine_count: u32,
    shared_decoder_count: u32,
    shared_encoder_count: u32,
    shared_jpeg_count: u32,
    shared_ofa_count: u32,
}

/// `nvmlComputeInstanceInfo_t` (32 bytes): `device` is the MIG device of this compute
/// instance, whose UUID is the `MIG-...` one (facts A2, as the NVIDIA DRA driver reads it).
#[repr(C)]
#[allow(dead_code, reason = "mirrors nvml.h, which fills every field")]
struct RawComputeInstanceInfo {
    device: *mut c_void,
    gpu_instance: *mut c_void,
    id: u32,
    profile_id: u32,
    placement: RawPlacement,
}

/// `mirror` as the pointer type an NVML symbol takes (`T`, inferred from the symbol).
///
/// # Panics
/// When `M` and `T` differ in size: the mirror does not match nvml-wrapper-sys, a bug
/// that the first test calling the symbol catches.
fn out_ptr<T, M>(mirror: &mut M) -> *mut T {
    assert_eq!(
        size_of::<T>(),
        size_of::<M>(),
        "{} does not mirror {}",
        std::any::type_name::<M>(),
        std::any::type_name::<T>()
    );
    ptr::from_mut(mirror).cast()
}

/// As [`out_ptr`], for an array NVML fills: a pointer to the first element.
fn out_slice<T, M>(mirrors: &mut [M]) -> *mut T {
    assert_eq!(
        size_of::<T>(),
        size_of::<M>(),
        "{} does not mirror {}",
        std::any::type_name::<M>(),
        std::any::type_name::<T>()
    );
    mirrors.as_mut_ptr().cast()
}

/// As [`out_ptr`], for an input struct.
fn in_ptr<T, M>(mirror: &M) -> *const T {
    assert_eq!(
        size_of::<T>(),
        size_of::<M>(),
        "{} does not mirror {}",
        std::any::type_name::<M>(),
        std::any::type_name::<T>()
    );
    ptr::from_ref(mirror).cast()
}

mod discovery;
mod events;
mod mig;
mod sysfs;

pub use discovery::{attribute_string, cuda_cores_per_sm, cuda_version_string, normalize_bus_id};
use events::*;
pub use mig::full_gi_ci_profile;
use mig::*;
use sysfs::*;
pub use sysfs::{parse_char_majors, pcie_root_in_path};

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        let set = self.health_poll().set.take();
        if let Some(set) = set
            && let Err(CallFailed { call, source }) = self.free_event_set(set)
        {
            tracing::warn!(call, error = %source, "cannot free the NVML event set");
        }
    }
}

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    /// MIG mode and live MIG devices, read from NVML: GPU instances of every profile
    /// the GPU has, each with its compute instance (the lowest CI ID) and that MIG
    /// device's UUID. A GPU that is not MIG-capable reports MIG off and no instances.
    /// Side effects: NVML reads only.
    ///
    /// # Errors
    /// `NoSuchGpu`; `Mig` for a MIG refusal by NVML; `NvmlCall` for other failures.
    fn mig_status(&self, minor: u32) -> Result<MigStatus, BackendError> {
        let gpu = self.gpu(minor)?;
        let op = MigOp::new("status", minor, gpu.index, "the MIG status".into());
        self.read_mig_status(gpu).map_err(|f| op.judge(f))
    }

    /// Switches MIG mode with `nvmlDeviceSetMigMode` and checks its activation status.
    /// A no-op when the mode already is `enabled`. Refused with `NotSupported` on a GPU
    /// that is not MIG-capable or needs a reset to switch (before Hopper), and with
    /// `InUse` when NVML refuses to disable MIG while GPU instances exist.
    fn set_mig_mode(&self, minor: u32, enabled: bool) -> Result<(), BackendError> {
        let gpu = self.gpu(minor)?;
        let state = if enabled { "on" } else { "off" };
        let op = MigOp::new("set-mode", minor, gpu.index, format!("MIG mode {state}"));
        let dev = self.device(gpu);
        let want = if enabled {
            NVML_DEVICE_MIG_ENABLE
        } else {
            NVML_DEVICE_MIG_DISABLE
        };
        let mode = match dev.mig_mode() {
            Ok(mode) => mode,
            Err(e) if is_unsupported(&e) => {
                return Err(op.refused(MigError::NotSupported("the GPU is not MIG-capable".into())));
            }
            Err(source) => return Err(op.judge(CallFailed::new("nvmlDeviceGetMigMode", source))),
        };
        if mode.current == want && mode.pending == want {
            return Ok(());
        }
        let arch = dev
            .architecture()
            .map_err(|source| op.judge(CallFailed::new("nvmlDeviceGetArchitecture", source)))?;
        if !switches_mig_without_reset(&arch) {
            return Err(op.refused(MigError::NotSupported(format!(
                "{arch:?} GPUs need a GPU reset to change MIG mode"
            ))));
        }
        let status = dev
            .set_mig_mode(enabled)
            .map_err(|source| op.judge(CallFailed::new("nvmlDeviceSetMigMode", source)))?;
        if status != 0 {
            let failed =
                CallFailed::new("nvmlDeviceSetMigMode activation", NvmlError::from(status));
            return Err(op.judge(failed));
        }
        // Reset-free GPUs switch at once; a mode left pending would need a reset.
        let after = dev
            .mig_mode()
            .map_err(|source| op.judge(CallFailed::new("nvmlDeviceGetMigMode", source)))?;
        if after.current != want {
            return Err(op.refused(MigError::NotSupported(
                "the MIG mode change is pending a GPU reset".into(),
            )));
        }
        Ok(())
    }

    /// Creates a GPU instance of `profile_id` at memory slice `start` (its size from the
    /// profile's possible placements), then the compute instance spanning it; if
    /// anything after the GPU instance fails, what was made is destroyed again.
    ///
    /// # Errors
    /// `Mig`: `NotSupported` when the GPU is not MIG-capable or MIG is off;
    /// `InvalidArgument` for an unknown profile or a placement the profile cannot take;
    /// `InsufficientResources` for an occupied placement or a full profile. `NvmlCall`
    /// for other NVML failures.
    fn create_mig(
        &self,
        minor: u32,
        profile_id: u32,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        let gpu = self.gpu(minor)?;
        let subject = format!("profile {profile_id} at memory slice {start}");
        let op = MigOp::new("create", minor, gpu.index, subject);
        let dev = self.device(gpu);
        self.require_mig_on(&dev, &op)?;
        let judge = |f: CallFailed| op.judge(f);
        // `profile_id` is Tessera's (the partition's name); NVML is asked by its own.
        let catalog_id = profile_id;
        let profile_id = nvml_profile_id(&profile_ids(&dev).map_err(judge)?, catalog_id);
        let size = self.placement_size(gpu.handle, profile_id).map_err(judge)?;
        let size = size.ok_or_else(|| {
            op.refused(MigError::InvalidArgument(format!(
                "profile {profile_id} has no placements"
            )))
        })?;
        let sm_slices = gi_profiles(&dev)
            .map_err(judge)?
            .into_iter()
            .find(|p| p.id == profile_id)
            .map(|p| p.slice_count);
        let ci_profile = sm_slices.and_then(full_gi_ci_profile).ok_or_else(|| {
            op.refused(MigError::NotSupported(format!(
                "no compute-instance profile spans profile {profile_id}"
            )))
        })?;
        let gi = self
            .create_gi(gpu.handle, profile_id, RawPlacement { start, size })
            .map_err(judge)?;
        let mut ci = None;
        let made = (|| -> Result<MigInstance, CallFailed> {
            let handle = self.create_ci(gi, ci_profile)?;
            ci = Some(handle);
            Ok(MigInstance {
                ci: Some(self.ci_info(handle)?),
                profile_id: catalog_id,
                ..self.gi_info(gi)?
            })
        })();
        made.map_err(|failed| {
            self.undo_create(gi, ci, &op);
            op.judge(failed)
        })
    }

    /// Destroys the compute instances of GPU instance `gi_id`, then the GPU instance.
    ///
    /// # Errors
    /// `Mig`: `NotFound` for no such GPU instance (none exist while MIG is off), `InUse`
    /// while processes run on it (nothing is destroyed then), `NotSupported` on a GPU
    /// that is not MIG-capable. `NvmlCall` for other NVML failures.
    fn destroy_mig(&self, minor: u32, gi_id: u32) -> Result<(), BackendError> {
        let gpu = self.gpu(minor)?;
        let op = MigOp::new("destroy", minor, gpu.index, format!("GPU instance {gi_id}"));
        let dev = self.device(gpu);
        match mig_enabled(&dev).map_err(|f| op.judge(f))? {
            None => Err(op.refused(MigError::NotSupported("the GPU is not MIG-capable".into()))),
            Some(false) => Err(op.refused(MigError::NotFound(format!(
                "no GPU instance with ID {gi_id}: MIG mode is off"
            )))),
            Some(true) => self.destroy_gi(gpu.handle, gi_id).map_err(|f| op.judge(f)),
        }
    }

    /// Enumerates every GPU NVML reports, ordered by minor. Reads NVML,
    /// `<proc_root>/devices` and `<sys_root>/bus/pci/devices/<bdf>`; writes nothing.
    ///
    /// # Errors
    /// [`BackendError::NvmlSystem`] / [`BackendError::NvmlCall`] when a required NVML
    /// call fails (optional ones only leave attributes out, with one warning for the
    /// node: see `gpu_info`), and
    /// [`BackendError::CharMajor`] when `/proc/devices` lacks `nvidia` or `nvidia-uvm`.
    fn discover(&self) -> Result<NodeInventory, BackendError> {
        let sys = |call: &'static str| move |source| BackendError::NvmlSystem { call, source };
        let driver_version = attribute_string(
            "driverVersion",
            self.nvml
                .sys_driver_version()
                .map_err(sys("nvmlSystemGetDriverVersion"))?,
        );
        let cuda = self
            .nvml
            .sys_cuda_driver_version()
            .map_err(sys("nvmlSystemGetCudaDriverVersion_v2"))?;
        let char_majors = read_char_majors(&self.proc_root.join("devices"))?;
        let count = self
            .nvml
            .device_count()
            .map_err(sys("nvmlDeviceGetCount_v2"))?;
        let mut gpus = Vec::new();
        let mut unanswered = Vec::new();
        for i in 0..count {
            let (gpu, missing) = self.gpu_info(i)?;
            unanswered.extend(missing.into_iter().map(|m| format!("GPU {i}: {m}")));
            gpus.push(gpu);
        }
        if !unanswered.is_empty() {
            // One warning per node, however many GPUs and queries.
            tracing::warn!(
                unanswered = %unanswered.join("; "),
                "NVML did not answer optional queries; their attributes are left out of the slices"
            );
        }
        gpus.sort_by_key(|g| g.minor);
        Ok(NodeInventory {
            driver_version,
            cuda_driver_version: cuda_version_string(cuda),
            char_majors,
            gpus,
        })
    }

    /// Drains the XID event set (created, with every GPU registered, on the first
    /// call), then asks each GPU for its minor number: `GPU_IS_LOST` makes it lost, an
    /// answer from a lost GPU makes it recovered (the only reset indication NVML
    /// gives). An XID on a MIG device carries its GPU instance ID; the event is still
    /// reported on the parent GPU, whose handle NVML names.
    ///
    /// # Errors
    /// `NvmlSystem` when the event set cannot be created or read.
    fn health_events(&self, since: u64) -> Result<Vec<HealthEvent>, BackendError> {
        let failed = |CallFailed { call, source }| BackendError::NvmlSystem { call, source };
        let mut p = self.health_poll();
        if p.set.is_none() {
            self.start_health(&mut p).map_err(failed)?;
        }
        if let Some(set) = p.set {
            while let Some(e) = self.next_event(set).map_err(failed)? {
                if e.event_type & NVML_EVENT_TYPE_XID_CRITICAL_ERROR == 0 {
                    continue;
                }
                let handle = DeviceHandle(e.device);
                match p.gpus.iter().find(|(_, h)| *h == handle).map(|(m, _)| *m) {
                    Some(minor) => p.push(
                        minor,
                        gpu_instance(e.gpu_instance_id),
                        HealthEventKind::Xid(e.event_data),
                    ),
                    None => tracing::warn!(xid = e.event_data, "XID event for an unknown device"),
                }
            }
        }
        let gpus = p.gpus.clone();
        for (minor, handle) in gpus {
            let lost = matches!(self.wrap(handle).minor_number(), Err(NvmlError::GpuLost));
            if lost && p.lost.insert(minor) {
                p.push(minor, None, HealthEventKind::Lost);
            } else if !lost && p.lost.remove(&minor) {
                p.push(minor, None, HealthEventKind::Recovered);
            }
        }
        Ok(p.log.iter().filter(|e| e.seq > since).copied().collect())
    }

    /// `nvmlDeviceGetComputeRunningProcesses_v3`, plus the graphics list
    /// (`nvmlDeviceGetGraphicsRunningProcesses_v3`, where the driver has it): on a
    /// MIG-enabled GPU the parent handle lists the processes of every MIG device, with
    /// their GPU instance.
    fn processes(&self, minor: u32) -> Result<Vec<GpuProcess>, BackendError> {
        let gpu = self.gpu(minor)?;
        let list = self
            .device(gpu)
            .running_compute_processes()
            .map_err(nvml_call(
                "nvmlDeviceGetComputeRunningProcesses_v3",
                gpu.index,
            ))?;
        // Graphics contexts hold device memory too. A process with both kinds is in
        // both lists with the same figure; a driver or library without the graphics
        // call (the fake NVML), or a GPU without it, leaves the compute list as it is.
        // Any other failure is logged (at most once a minute: the watchdog asks every
        // 500 ms) and the compute list stands alone.
        let graphics = match self.device(gpu).running_graphics_processes() {
            Ok(v) => v,
            Err(
                NvmlError::NotSupported
                | NvmlError::FunctionNotFound
                | NvmlError::FailedToLoadSymbol(_),
            ) => Vec::new(),
            Err(e) => {
                static LAST_WARNED: std::sync::atomic::AtomicU64 =
                    std::sync::atomic::AtomicU64::new(0);
                let now = crate::clock::unix_secs();
                let last = LAST_WARNED.load(std::sync::atomic::Ordering::Relaxed);
                if now.saturating_sub(last) >= 60 || last == 0 {
                    LAST_WARNED.store(now, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(gpu = minor, error = %e, "nvmlDeviceGetGraphicsRunningProcesses_v3 failed; graphics contexts' memory is not seen");
                }
                Vec::new()
            }
        };
        let mut out: Vec<GpuProcess> = Vec::with_capacity(list.len() + graphics.len());
        for p in list.into_iter().chain(graphics) {
            if out
                .iter()
                .any(|o| o.pid == p.pid && o.gi_id == p.gpu_instance_id)
            {
                continue;
            }
            out.push(GpuProcess {
                pid: p.pid,
                used_bytes: match p.used_gpu_memory {
                    nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                    nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                },
                gi_id: p.gpu_instance_id,
            });
        }
        Ok(out)
    }

    /// `nvmlDeviceGetProcessUtilization`; NVML's `NOT_FOUND` (no sample newer than
    /// `since_us`) is an empty list.
    fn process_utilization(
        &self,
        minor: u32,
        since_us: u64,
    ) -> Result<Vec<ProcessSample>, BackendError> {
        let gpu = self.gpu(minor)?;
        match self.device(gpu).process_utilization_stats(since_us) {
            Ok(v) => Ok(v
                .into_iter()
                .map(|s| ProcessSample {
                    pid: s.pid,
                    timestamp_us: s.timestamp,
                    sm_percent: s.sm_util,
                })
                .collect()),
            Err(NvmlError::NotFound) => Ok(Vec::new()),
            Err(e) => Err(nvml_call("nvmlDeviceGetProcessUtilization", gpu.index)(e)),
        }
    }

    /// `nvmlDeviceGetMemoryInfo` and `nvmlDeviceGetUtilizationRates` (the latter may be
    /// unsupported, e.g. with MIG on).
    fn usage(&self, minor: u32) -> Result<Option<GpuUsage>, BackendError> {
        let gpu = self.gpu(minor)?;
        let dev = self.device(gpu);
        let mem = dev
            .memory_info()
            .map_err(nvml_call("nvmlDeviceGetMemoryInfo", gpu.index))?;
        let utilization_percent = match dev.utilization_rates() {
            Ok(u) => Some(u.gpu),
            Err(NvmlError::NotSupported | NvmlError::FunctionNotFound) => None,
            Err(e) => return Err(nvml_call("nvmlDeviceGetUtilizationRates", gpu.index)(e)),
        };
        Ok(Some(GpuUsage {
            used_bytes: mem.used,
            utilization_percent,
        }))
    }
}

/// Maps a failed NVML call on the GPU at `index` to [`BackendError::NvmlCall`].
fn nvml_call(call: &'static str, index: u32) -> impl FnOnce(NvmlError) -> BackendError {
    move |source| BackendError::NvmlCall {
        call,
        index,
        source,
    }
}

/// Errors that mean "this driver or GPU cannot answer", not "the call broke": the
/// feature is unsupported, or the symbol is missing from an older library.
fn is_unsupported(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVML's 8-digit upper-case bus IDs become sysfs names; garbage is refused.
    #[test]
    fn bus_ids_are_normalised_to_the_sysfs_form() {
        let cases = [
            ("00000000:19:00.0", Some("0000:19:00.0")),
            ("00000000:AF:00.0", Some("0000:af:00.0")),
            ("0000:3B:00.0", Some("0000:3b:00.0")),
            ("00000001:0A:1F.7", Some("0001:0a:1f.7")),
            ("00010000:00:00.0", Some("10000:00:00.0")),
            (" 00000000:19:00.0 ", Some("0000:19:00.0")),
            ("00000000:19:00", None),
            ("00000000:19.00.0", None),
            ("0000:100:00.0", None),
            ("0000:19:20.0", None),
            ("0000:19:00.8", None),
            ("0000:g9:00.0", None),
            ("", None),
        ];
        for (input, want) in cases {
            assert_eq!(normalize_bus_id(input).as_deref(), want, "{input:?}");
        }
    }

    /// The cores-per-SM table matches helper_cuda.h and refuses unknown capabilities.
    #[test]
    fn cuda_cores_per_sm_follows_the_table() {
        let cases = [
            ((5, 2), Some(128)),
            ((6, 0), Some(64)),
            ((6, 1), Some(128)),
            ((7, 0), Some(64)),
            ((7, 5), Some(64)),
            ((8, 0), Some(64)),
            ((8, 6), Some(128)),
            ((8, 7), Some(128)),
            ((8, 9), Some(128)),
            ((9, 0), Some(128)),
            ((10, 0), Some(128)),
            ((10, 3), Some(128)),
            ((11, 0), Some(128)),
            ((12, 0), Some(128)),
            ((12, 1), Some(128)),
            ((3, 5), None),
            ((7, 1), None),
            ((8, 8), None),
            ((9, 1), None),
            ((13, 0), None),
            ((10, -1), None),
        ];
        for ((major, minor), want) in cases {
            assert_eq!(cuda_cores_per_sm(major, minor), want, "{major}.{minor}");
        }
        // H100 SXM5: 16896 cores / 132 SMs; T4: 2560 / 40; A100: 6912 / 108.
        assert_eq!(16896 / cuda_cores_per_sm(9, 0).unwrap(), 132);
        assert_eq!(2560 / cuda_cores_per_sm(7, 5).unwrap(), 40);
        assert_eq!(6912 / cuda_cores_per_sm(8, 0).unwrap(), 108);
    }

    /// A string NVML could return longer than an attribute may be is cut to 64 bytes,
    /// at a character boundary; shorter ones are kept whole.
    #[test]
    fn nvml_strings_longer_than_an_attribute_are_cut_to_64_bytes() {
        assert_eq!(
            attribute_string("productName", "NVIDIA H100".into()),
            "NVIDIA H100"
        );
        assert_eq!(
            attribute_string("productName", "x".repeat(80)),
            "x".repeat(64)
        );
        // 63 ASCII bytes then a two-byte character: cut before it.
        let v = format!("{}é", "x".repeat(63));
        assert_eq!(attribute_string("driverVersion", v), "x".repeat(63));
    }

    /// NVML's integer CUDA version prints as `major.minor`, the form `mock/state.rs` parses.
    #[test]
    fn cuda_driver_versions_print_as_major_dot_minor() {
        for (v, want) in [
            (13000, "13.0"),
            (12090, "12.9"),
            (12020, "12.2"),
            (11080, "11.8"),
        ] {
            assert_eq!(cuda_version_string(v), want);
            assert_eq!(
                crate::inventory::mock::state::cuda_version_to_int(want),
                v as u32
            );
        }
    }

    const PROC_DEVICES: &str = "Character devices:\n  1 mem\n  4 /dev/vc/0\n195 nvidia\n\
                                 235 nvidia-caps-imex-channels\n508 nvidia-uvm\n511 nvidia-caps\n\n\
                                 Block devices:\n  7 loop\n  8 sd\n";

    /// Majors come from the character section only; legacy and optional names work.
    #[test]
    fn char_majors_are_parsed_from_proc_devices() {
        let want = CharMajors {
            nvidia: 195,
            nvidia_uvm: 508,
            nvidia_caps: Some(511),
        };
        assert_eq!(parse_char_majors(PROC_DEVICES), Ok(want));

        let legacy = "Character devices:\n195 nvidia-frontend\n250 nvidia-uvm\n";
        let want_legacy = CharMajors {
            nvidia: 195,
            nvidia_uvm: 250,
            nvidia_caps: None,
        };
        assert_eq!(parse_char_majors(legacy), Ok(want_legacy));

        let both = "Character devices:\n196 nvidia-frontend\n195 nvidia\n250 nvidia-uvm\n";
        assert_eq!(parse_char_majors(both).map(|m| m.nvidia), Ok(195));

        let block_only =
            "Character devices:\n  1 mem\n508 nvidia-uvm\nBlock devices:\n195 nvidia\n";
        assert_eq!(parse_char_majors(block_only), Err("nvidia"));
        assert_eq!(
            parse_char_majors("Character devices:\n195 nvidia\n"),
            Err("nvidia-uvm")
        );
        assert_eq!(parse_char_majors(""), Err("nvidia"));
    }

    /// The root complex is the component after `devices`, and only a `pciDDDD:BB` one.
    #[test]
    fn pcie_root_is_read_from_the_canonical_device_path() {
        let cases = [
            (
                "/sys/devices/pci0000:00/0000:00:01.0/0000:19:00.0",
                Some("pci0000:00"),
            ),
            (
                "devices/pci0000:80/0000:80:01.0/0000:86:00.0",
                Some("pci0000:80"),
            ),
            (
                "/sys/devices/pci10000:00/10000:00:02.0/10000:01:00.0",
                Some("pci10000:00"),
            ),
            ("/sys/devices/platform/0000:19:00.0", None),
            ("/sys/bus/pci/devices/0000:19:00.0", None),
            ("/sys/devices", None),
        ];
        for (path, want) in cases {
            assert_eq!(
                pcie_root_in_path(Path::new(path)).as_deref(),
                want,
                "{path}"
            );
        }
    }

    /// sysfs lookups follow the symlink, ignore a sys root's own ancestors, and read
    /// `numa_node` with -1 meaning unknown.
    #[test]
    fn sysfs_lookups_follow_the_device_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        // A sys root that itself lives below `devices/pci...` must not confuse it.
        let sys = tmp.path().join("devices/pci0000:ff/sys");
        let dev = sys.join("devices/pci0000:80/0000:80:01.0/0000:86:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("numa_node"), "1\n").unwrap();
        let odd = sys.join("devices/platform/0000:af:00.0");
        std::fs::create_dir_all(&odd).unwrap();
        std::fs::write(odd.join("numa_node"), "-1\n").unwrap();
        let links = sys.join("bus/pci/devices");
        std::fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:80/0000:80:01.0/0000:86:00.0",
            links.join("0000:86:00.0"),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/platform/0000:af:00.0",
            links.join("0000:af:00.0"),
        )
        .unwrap();

        assert_eq!(
            sysfs_pcie_root(&sys, "0000:86:00.0").as_deref(),
            Some("pci0000:80")
        );
        assert_eq!(sysfs_numa_node(&sys, "0000:86:00.0"), Some(1));
        assert_eq!(sysfs_pcie_root(&sys, "0000:af:00.0"), None);
        assert_eq!(sysfs_numa_node(&sys, "0000:af:00.0"), None);
        assert_eq!(sysfs_pcie_root(&sys, "0000:01:00.0"), None);
        assert_eq!(sysfs_numa_node(&sys, "0000:01:00.0"), None);
    }

    /// The full-GI compute-instance profile follows the GI's compute slices, and agrees
    /// with the catalog's `ci_profile_index` for every profile of every modelled GPU.
    #[test]
    fn full_gi_compute_instance_profile_follows_the_slice_count() {
        let cases = [
            (1, Some(0)),
            (2, Some(1)),
            (3, Some(2)),
            (4, Some(3)),
            (7, Some(4)),
            (8, Some(5)),
            (6, Some(6)),
            (0, None),
            (5, None),
            (9, None),
        ];
        for (slices, want) in cases {
            assert_eq!(full_gi_ci_profile(slices), want, "{slices} slices");
        }
        for model in crate::mig::all_models() {
            for p in model.profiles {
                let g: u32 = p
                    .name
                    .split('g')
                    .next()
                    .and_then(|g| g.parse().ok())
                    .unwrap();
                assert_eq!(
                    full_gi_ci_profile(g),
                    Some(p.ci_profile_index),
                    "{} {}",
                    model.key,
                    p.name
                );
            }
        }
    }

    /// Only Hopper and later (and architectures newer than nvml-wrapper knows) switch
    /// MIG mode without a reset, as the mock's catalog says per model.
    #[test]
    fn mig_mode_switches_without_reset_from_hopper_on() {
        use DeviceArchitecture::*;
        for (arch, want) in [
            (Ampere, false),
            (Ada, false),
            (Turing, false),
            (Volta, false),
            (Hopper, true),
            (Blackwell, true),
            (Unknown, true),
        ] {
            assert_eq!(switches_mig_without_reset(&arch), want, "{arch:?}");
        }
        for model in crate::mig::all_models() {
            let arch = match model.architecture {
                "Ampere" => Ampere,
                "Hopper" => Hopper,
                "Blackwell" => Blackwell,
                other => panic!("{}: unexpected architecture {other}", model.key),
            };
            assert_eq!(
                switches_mig_without_reset(&arch),
                model.reset_free_mig_toggle,
                "{}",
                model.key
            );
        }
    }

    /// NVML's MIG refusals become `Mig` errors with the same code; every other failure
    /// (including a missing symbol and codes nvml-wrapper has no variant for) stays an
    /// `NvmlCall` naming the call.
    #[test]
    fn nvml_refusals_map_to_mig_errors_and_other_failures_to_nvml_calls() {
        let op = MigOp::new("create", 3, 1, "profile 19 at memory slice 6".into());
        let refusals = [
            (NvmlError::InvalidArg, 2),
            (NvmlError::NotSupported, 3),
            (NvmlError::NotFound, 6),
            (NvmlError::InUse, 19),
            (NvmlError::UnexpectedVariant(23), 23),
        ];
        for (error, code) in refusals {
            match op.judge(CallFailed::new("nvmlX", error)) {
                BackendError::Mig {
                    op: "create",
                    minor: 3,
                    source,
                } => {
                    assert_eq!(source.nvml_code(), code);
                    assert!(
                        source.to_string().contains("nvmlX refused profile 19"),
                        "{source}"
                    );
                }
                other => panic!("code {code}: {other:?}"),
            }
        }
        let failures = [
            NvmlError::NoPermission,
            NvmlError::Unknown,
            NvmlError::GpuLost,
            NvmlError::UnexpectedVariant(25),
            NvmlError::FailedToLoadSymbol("nvmlX".into()),
        ];
        for error in failures {
            let shown = format!("{error:?}");
            match op.judge(CallFailed::new("nvmlX", error)) {
                BackendError::NvmlCall {
                    call: "nvmlX",
                    index: 1,
                    ..
                } => {}
                other => panic!("{shown}: {other:?}"),
            }
        }
    }

    /// A missing or incomplete `/proc/devices` is a CharMajor error naming the file.
    #[test]
    fn missing_proc_devices_is_a_char_major_error() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("devices");
        let err = read_char_majors(&path).unwrap_err();
        assert!(
            matches!(&err, BackendError::CharMajor { name: "nvidia", path: p } if *p == path),
            "{err:?}"
        );
        std::fs::write(&path, "Character devices:\n195 nvidia\n").unwrap();
        let err = read_char_majors(&path).unwrap_err();
        assert!(
            matches!(
                err,
                BackendError::CharMajor {
                    name: "nvidia-uvm",
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
