//! Health events on NVML: one event set with every GPU registered for XID critical
//! errors, drained without waiting on each poll; a GPU answering `GPU_IS_LOST` is lost,
//! and answering again is recovery.

use super::*;

/// `nvmlEventTypeXidCriticalError` (nvml.h).
pub(super) const NVML_EVENT_TYPE_XID_CRITICAL_ERROR: u64 = 8;

/// The state of [`GpuBackend::health_events`] on NVML.
#[derive(Default)]
pub(super) struct HealthPoll {
    pub(super) set: Option<EventSetHandle>,
    /// GPUs registered for XID events (minor, handle); also checked for loss.
    pub(super) gpus: Vec<(u32, DeviceHandle)>,
    /// Every event reported so far, numbered from 1.
    pub(super) log: Vec<HealthEvent>,
    /// GPUs currently answering `GPU_IS_LOST`.
    pub(super) lost: BTreeSet<u32>,
}

impl HealthPoll {
    pub(super) fn push(&mut self, minor: u32, gi_id: Option<u32>, kind: HealthEventKind) {
        let seq = self.log.len() as u64 + 1;
        self.log.push(HealthEvent {
            seq,
            minor,
            gi_id,
            kind,
        });
    }
}

/// `gpuInstanceId` of an event that is not about one MIG GPU instance.
pub(super) const NVML_NO_GPU_INSTANCE: u32 = 0xFFFF_FFFF;

/// The GPU instance an event names, if it names one.
pub(super) fn gpu_instance(id: u32) -> Option<u32> {
    (id != NVML_NO_GPU_INSTANCE).then_some(id)
}

/// `nvmlEventData_t` (32 bytes).
#[repr(C)]
#[allow(dead_code, reason = "mirrors nvml.h, which fills every field")]
pub(super) struct RawEventData {
    pub(super) device: *mut c_void,
    pub(super) event_type: u64,
    pub(super) event_data: u64,
    pub(super) gpu_instance_id: u32,
    pub(super) compute_instance_id: u32,
}

/// Health monitoring: one event set with every GPU registered for XID critical
/// errors, drained without waiting on each poll; loss is a query answering
/// `GPU_IS_LOST` (and recovery the same query answering again).
impl NvmlBackend {
    pub(super) fn health_poll(&self) -> MutexGuard<'_, HealthPoll> {
        self.health.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates the event set and registers every GPU NVML lists for XID events. A GPU
    /// that cannot be registered (no XID events on this GPU or driver) is still checked
    /// for loss.
    pub(super) fn start_health(&self, p: &mut HealthPoll) -> Result<(), CallFailed> {
        let mut set = ptr::null_mut();
        // SAFETY: `set` receives a new event set handle.
        nvml_call!(self.nvml, nvmlEventSetCreate, |f| unsafe { f(&mut set) })?;
        let set = EventSetHandle::of(set);
        p.set = Some(set);
        let count = self
            .nvml
            .device_count()
            .map_err(|e| CallFailed::new("nvmlDeviceGetCount_v2", e))?;
        for index in 0..count {
            let dev = self
                .nvml
                .device_by_index(index)
                .map_err(|e| CallFailed::new("nvmlDeviceGetHandleByIndex_v2", e))?;
            let minor = match dev.minor_number() {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(index, error = %e, "cannot monitor the health of a GPU that does not answer");
                    continue;
                }
            };
            // SAFETY: `handle` only copies the pointer out.
            let handle = DeviceHandle::of(unsafe { dev.handle() });
            p.gpus.push((minor, handle));
            let registered: Result<(), CallFailed> = (|| {
                // SAFETY: `handle` and `set` are live handles of this NVML.
                nvml_call!(self.nvml, nvmlDeviceRegisterEvents, |f| unsafe {
                    f(handle.raw(), NVML_EVENT_TYPE_XID_CRITICAL_ERROR, set.raw())
                })
            })();
            if let Err(CallFailed { call, source }) = registered {
                tracing::warn!(gpu = minor, call, error = %source, "cannot watch XID events of this GPU; only its loss is detected");
            }
        }
        Ok(())
    }

    /// The next pending event of the set, without waiting; `None` when there is none.
    pub(super) fn next_event(
        &self,
        set: EventSetHandle,
    ) -> Result<Option<RawEventData>, CallFailed> {
        let mut data = RawEventData {
            device: ptr::null_mut(),
            event_type: 0,
            event_data: 0,
            gpu_instance_id: 0,
            compute_instance_id: 0,
        };
        let waited: Result<(), CallFailed> = (|| {
            // SAFETY: `set` is a live event set; `data` mirrors nvmlEventData_t
            // (checked by out_ptr).
            nvml_call!(self.nvml, nvmlEventSetWait_v2, |f| unsafe {
                f(set.raw(), out_ptr(&mut data), 0)
            })
        })();
        match waited {
            Ok(()) => Ok(Some(data)),
            // Nothing pending; a lost GPU is found by the query below.
            Err(CallFailed {
                source: NvmlError::Timeout | NvmlError::GpuLost,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) fn free_event_set(&self, set: EventSetHandle) -> Result<(), CallFailed> {
        // SAFETY: `set` is a live event set; it is not used afterwards.
        nvml_call!(self.nvml, nvmlEventSetFree, |f| unsafe { f(set.raw()) })
    }
}
