//! MIG through NVML's raw symbols: status, mode, create and destroy of GPU and compute
//! instances. NVML judges every request; [`MigOp::judge`] turns its refusals into
//! [`crate::mig::MigError`]s and any other failure into a `NvmlCall` error.

use super::*;

/// An NVML call that failed during a MIG operation, before [`MigOp::judge`] decides
/// whether it is a MIG refusal.
#[derive(Debug)]
pub(super) struct CallFailed {
    pub(super) call: &'static str,
    pub(super) source: NvmlError,
}

impl CallFailed {
    pub(super) fn new(call: &'static str, source: NvmlError) -> Self {
        CallFailed { call, source }
    }
}

/// One MIG operation on one GPU, for turning NVML failures into `BackendError`s.
pub(super) struct MigOp {
    pub(super) op: &'static str,
    pub(super) minor: u32,
    pub(super) index: u32,
    /// What the operation was about, for messages: `profile 19 at memory slice 6`.
    pub(super) subject: String,
}

impl MigOp {
    pub(super) fn new(op: &'static str, minor: u32, index: u32, subject: String) -> Self {
        MigOp {
            op,
            minor,
            index,
            subject,
        }
    }

    pub(super) fn refused(&self, source: MigError) -> BackendError {
        BackendError::Mig {
            op: self.op,
            minor: self.minor,
            source,
        }
    }

    /// NVML's MIG refusals (codes 2, 3, 6, 19, 23) as `BackendError::Mig`; any other
    /// failure (including a symbol the driver lacks) as `BackendError::NvmlCall`.
    pub(super) fn judge(&self, failed: CallFailed) -> BackendError {
        let CallFailed { call, source } = failed;
        let what = format!("{call} refused {}", self.subject);
        let refusal = match source {
            NvmlError::InvalidArg => MigError::InvalidArgument(what),
            NvmlError::NotSupported => MigError::NotSupported(what),
            NvmlError::NotFound => MigError::NotFound(what),
            NvmlError::InUse => MigError::InUse(what),
            NvmlError::UnexpectedVariant(NVML_ERROR_INSUFFICIENT_RESOURCES) => {
                MigError::InsufficientResources(what)
            }
            source => {
                return BackendError::NvmlCall {
                    call,
                    index: self.index,
                    source,
                };
            }
        };
        self.refused(refusal)
    }
}

/// MIG mode of a GPU: `None` when it cannot do MIG, else whether MIG is on.
pub(super) fn mig_enabled(dev: &Device<'_>) -> Result<Option<bool>, CallFailed> {
    match dev.mig_mode() {
        Ok(mode) => Ok(Some(mode.current == NVML_DEVICE_MIG_ENABLE)),
        Err(e) if is_unsupported(&e) => Ok(None),
        Err(source) => Err(CallFailed::new("nvmlDeviceGetMigMode", source)),
    }
}

/// Every GPU-instance profile the GPU has: NVML profile indices
/// 0..`NVML_GPU_INSTANCE_PROFILE_COUNT`, skipping those NVML answers NOT_SUPPORTED
/// (the GPU lacks it) or INVALID_ARGUMENT (beyond this driver's count).
pub(super) fn gi_profiles(dev: &Device<'_>) -> Result<Vec<ProfileInfo>, CallFailed> {
    (0..NVML_GPU_INSTANCE_PROFILE_COUNT)
        .filter_map(|index| match dev.profile_info(index) {
            Ok(profile) => Some(Ok(profile)),
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => None,
            Err(source) => Some(Err(CallFailed::new(
                "nvmlDeviceGetGpuInstanceProfileInfo",
                source,
            ))),
        })
        .collect()
}

/// The `NVML_COMPUTE_INSTANCE_PROFILE_*` index of the compute instance spanning a whole
/// GPU instance of `sm_slices` compute slices (its profile's `sliceCount`): 1g→0,
/// 2g→1, 3g→2, 4g→3, 7g→4, 8g→5, 6g→6 (facts A1.0). `None` for other counts.
pub use crate::mig::catalog::full_gi_ci_profile;

/// Whether MIG mode switches without a GPU reset (Hopper and later, as the NVIDIA DRA
/// driver decides with `arch >= HOPPER`; an architecture nvml-wrapper does not know is
/// newer). Deterministic.
pub(super) fn switches_mig_without_reset(arch: &DeviceArchitecture) -> bool {
    matches!(
        arch,
        DeviceArchitecture::Hopper | DeviceArchitecture::Blackwell | DeviceArchitecture::Unknown
    )
}

/// Tessera's profile IDs (its catalog's, which the published partitions name) and the
/// IDs NVML gives the same profiles on this GPU, as `(nvml_id, catalog_id)` pairs, one
/// per catalogued profile the GPU has: NVML's ID is what
/// `nvmlDeviceGetGpuInstanceProfileInfo` answers for the profile's index, which is how
/// NVML's API means profile IDs to be found. Empty for a GPU not in the catalog (its
/// partitions are NVML's own profiles, named by NVML's IDs). The two agree on the GPUs
/// the catalog was checked against; go-nvml's models use indices as IDs.
pub(super) fn profile_ids(dev: &Device<'_>) -> Result<Vec<(u32, u32)>, CallFailed> {
    let Some(model) = dev
        .name()
        .ok()
        .and_then(|name| crate::mig::model_for_product(&name))
    else {
        return Ok(Vec::new());
    };
    let mut ids = Vec::new();
    for p in model.profiles {
        match dev.profile_info(p.nvml_index) {
            Ok(info) => ids.push((info.id, p.profile_id)),
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {}
            Err(source) => {
                return Err(CallFailed::new(
                    "nvmlDeviceGetGpuInstanceProfileInfo",
                    source,
                ));
            }
        }
    }
    Ok(ids)
}

/// NVML's ID of Tessera's profile `catalog_id` (itself when unmapped).
pub(super) fn nvml_profile_id(ids: &[(u32, u32)], catalog_id: u32) -> u32 {
    ids.iter()
        .find(|(_, c)| *c == catalog_id)
        .map_or(catalog_id, |(n, _)| *n)
}

/// Tessera's ID of NVML's profile `nvml_id` (itself when unmapped).
pub(super) fn catalog_profile_id(ids: &[(u32, u32)], nvml_id: u32) -> u32 {
    ids.iter()
        .find(|(n, _)| *n == nvml_id)
        .map_or(nvml_id, |(_, c)| *c)
}

/// The MIG implementation: NVML calls only, errors as [`CallFailed`] for the caller's
/// [`MigOp`] to judge.
impl NvmlBackend {
    pub(super) fn cached_gpus(&self) -> MutexGuard<'_, HashMap<u32, CachedGpu>> {
        // The map is valid whatever a panicking holder did: entries are only inserted.
        self.gpus.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached handle of GPU `minor`. Enumerates all GPUs (NVML calls, without the
    /// cache lock) when it is not cached yet.
    ///
    /// # Errors
    /// `NoSuchGpu`, or `NvmlSystem`/`NvmlCall` when enumeration fails.
    pub(super) fn gpu(&self, minor: u32) -> Result<CachedGpu, BackendError> {
        if let Some(gpu) = self.cached_gpus().get(&minor) {
            return Ok(*gpu);
        }
        let count = self
            .nvml
            .device_count()
            .map_err(|source| BackendError::NvmlSystem {
                call: "nvmlDeviceGetCount_v2",
                source,
            })?;
        let mut found = Vec::new();
        for index in 0..count {
            let call = |call: &'static str| nvml_call(call, index);
            let dev = self
                .nvml
                .device_by_index(index)
                .map_err(call("nvmlDeviceGetHandleByIndex_v2"))?;
            let gpu_minor = dev
                .minor_number()
                .map_err(call("nvmlDeviceGetMinorNumber"))?;
            // SAFETY: `handle` only copies the pointer out; it is unsafe to discourage
            // use, not because reading it can go wrong.
            let handle = DeviceHandle::of(unsafe { dev.handle() });
            found.push((gpu_minor, CachedGpu { index, handle }));
        }
        let mut cache = self.cached_gpus();
        cache.extend(found);
        cache
            .get(&minor)
            .copied()
            .ok_or(BackendError::NoSuchGpu(minor))
    }

    /// The wrapper's view of a cached GPU (or MIG device) handle.
    pub(super) fn device(&self, gpu: CachedGpu) -> Device<'_> {
        self.wrap(gpu.handle)
    }

    pub(super) fn wrap(&self, handle: DeviceHandle) -> Device<'_> {
        // SAFETY: the handle was obtained from this `Nvml`, and NVML handles stay valid
        // until `nvmlShutdown`, which only `self.nvml`'s drop calls; the returned
        // `Device` borrows `self.nvml`, so it cannot outlive it.
        unsafe { Device::new(handle.raw(), &self.nvml) }
    }

    /// `NotSupported` unless the GPU can do MIG and MIG mode is on.
    pub(super) fn require_mig_on(&self, dev: &Device<'_>, op: &MigOp) -> Result<(), BackendError> {
        match mig_enabled(dev).map_err(|f| op.judge(f))? {
            None => Err(op.refused(MigError::NotSupported("the GPU is not MIG-capable".into()))),
            Some(false) => Err(op.refused(MigError::NotSupported("MIG mode is off".into()))),
            Some(true) => Ok(()),
        }
    }

    pub(super) fn read_mig_status(&self, gpu: CachedGpu) -> Result<MigStatus, CallFailed> {
        let dev = self.device(gpu);
        let Some(enabled) = mig_enabled(&dev)? else {
            return Ok(MigStatus::default());
        };
        let mut instances = Vec::new();
        if enabled {
            let ids = profile_ids(&dev)?;
            for profile in gi_profiles(&dev)? {
                for gi in self.gpu_instances(gpu.handle, &profile)? {
                    let cis = self
                        .compute_instances(gi)?
                        .into_iter()
                        .map(|ci| self.ci_info(ci))
                        .collect::<Result<Vec<_>, _>>()?;
                    let info = self.gi_info(gi)?;
                    instances.push(MigInstance {
                        ci: cis.into_iter().min_by_key(|ci| ci.ci_id),
                        profile_id: catalog_profile_id(&ids, info.profile_id),
                        ..info
                    });
                }
            }
        }
        instances.sort_by_key(|i| i.gi_id);
        Ok(MigStatus { enabled, instances })
    }

    /// The GPU instances of one profile.
    pub(super) fn gpu_instances(
        &self,
        dev: DeviceHandle,
        profile: &ProfileInfo,
    ) -> Result<Vec<GiHandle>, CallFailed> {
        let mut handles = vec![ptr::null_mut(); profile.instance_count as usize];
        let mut count = 0u32;
        // SAFETY: `dev` is a live device handle of this NVML; `handles` holds the
        // profile's `instanceCount` handles, the buffer size NVML requires.
        nvml_call!(self.nvml, nvmlDeviceGetGpuInstances, |f| unsafe {
            f(dev.raw(), profile.id, handles.as_mut_ptr(), &mut count)
        })?;
        handles.truncate(count as usize);
        Ok(handles.into_iter().map(GiHandle::of).collect())
    }

    /// A GPU instance's ID, profile ID and placement, as a `MigInstance` without CI.
    pub(super) fn gi_info(&self, gi: GiHandle) -> Result<MigInstance, CallFailed> {
        let mut info = RawGpuInstanceInfo {
            device: ptr::null_mut(),
            id: 0,
            profile_id: 0,
            placement: RawPlacement::default(),
        };
        // SAFETY: `gi` is a live GPU-instance handle from NVML; `info` mirrors
        // `nvmlGpuInstanceInfo_t` (size checked by `out_ptr`).
        nvml_call!(self.nvml, nvmlGpuInstanceGetInfo, |f| unsafe {
            f(gi.raw(), out_ptr(&mut info))
        })?;
        Ok(MigInstance {
            gi_id: info.id,
            profile_id: info.profile_id,
            start: info.placement.start,
            size: info.placement.size,
            ci: None,
        })
    }

    /// The compute instances of a GPU instance, over every compute-instance profile it
    /// supports (indices NVML answers NOT_SUPPORTED or INVALID_ARGUMENT are skipped).
    pub(super) fn compute_instances(&self, gi: GiHandle) -> Result<Vec<CiHandle>, CallFailed> {
        let mut all = Vec::new();
        for index in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            let profile = match self.ci_profile(gi, index) {
                Ok(profile) => profile,
                Err(CallFailed {
                    source: NvmlError::NotSupported | NvmlError::InvalidArg,
                    ..
                }) => continue,
                Err(failed) => return Err(failed),
            };
            let mut handles = vec![ptr::null_mut(); profile.instance_count as usize];
            let mut count = 0u32;
            // SAFETY: `gi` is a live GPU-instance handle; `handles` holds the profile's
            // `instanceCount` handles.
            nvml_call!(self.nvml, nvmlGpuInstanceGetComputeInstances, |f| unsafe {
                f(gi.raw(), profile.id, handles.as_mut_ptr(), &mut count)
            })?;
            handles.truncate(count as usize);
            all.extend(handles.into_iter().map(CiHandle::of));
        }
        Ok(all)
    }

    /// The compute-instance profile at `index` of a GPU instance (shared engines).
    pub(super) fn ci_profile(
        &self,
        gi: GiHandle,
        index: u32,
    ) -> Result<RawComputeInstanceProfileInfo, CallFailed> {
        let mut info = RawComputeInstanceProfileInfo::default();
        // SAFETY: `gi` is a live GPU-instance handle; `info` mirrors
        // `nvmlComputeInstanceProfileInfo_t` (size checked by `out_ptr`).
        nvml_call!(
            self.nvml,
            nvmlGpuInstanceGetComputeInstanceProfileInfo,
            |f| unsafe {
                f(
                    gi.raw(),
                    index,
                    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    out_ptr(&mut info),
                )
            }
        )?;
        Ok(info)
    }

    /// A compute instance's ID and the UUID of its MIG device.
    pub(super) fn ci_info(&self, ci: CiHandle) -> Result<ComputeInstance, CallFailed> {
        let mut info = RawComputeInstanceInfo {
            device: ptr::null_mut(),
            gpu_instance: ptr::null_mut(),
            id: 0,
            profile_id: 0,
            placement: RawPlacement::default(),
        };
        // SAFETY: `ci` is a live compute-instance handle; `info` mirrors
        // `nvmlComputeInstanceInfo_t` (size checked by `out_ptr`).
        nvml_call!(self.nvml, nvmlComputeInstanceGetInfo_v2, |f| unsafe {
            f(ci.raw(), out_ptr(&mut info))
        })?;
        let uuid = self
            .wrap(DeviceHandle::of(info.device))
            .uuid()
            .map_err(|source| CallFailed::new("nvmlDeviceGetUUID", source))?;
        Ok(ComputeInstance {
            ci_id: info.id,
            uuid,
        })
    }

    /// The placement size of `profile_id` (all its placements share it); `None` when
    /// the profile has no placements.
    pub(super) fn placement_size(
        &self,
        dev: DeviceHandle,
        profile_id: u32,
    ) -> Result<Option<u32>, CallFailed> {
        Ok(self.placements(dev, profile_id)?.first().map(|p| p.size))
    }

    /// The possible placements of `profile_id`, from
    /// `nvmlDeviceGetGpuInstancePossiblePlacements_v2` (raw: nvml-wrapper 0.13's
    /// `possible_placements` never sets the length of its result).
    pub(super) fn placements(
        &self,
        dev: DeviceHandle,
        profile_id: u32,
    ) -> Result<Vec<RawPlacement>, CallFailed> {
        let mut count = 0u32;
        // SAFETY: `dev` is a live device handle; a null buffer asks for the count only.
        nvml_call!(
            self.nvml,
            nvmlDeviceGetGpuInstancePossiblePlacements_v2,
            |f| unsafe { f(dev.raw(), profile_id, ptr::null_mut(), &mut count) }
        )?;
        let mut placements = vec![RawPlacement::default(); count as usize];
        // SAFETY: `placements` holds `count` elements mirroring
        // `nvmlGpuInstancePlacement_t` (size checked by `out_slice`), and `count` says so.
        nvml_call!(
            self.nvml,
            nvmlDeviceGetGpuInstancePossiblePlacements_v2,
            |f| unsafe {
                f(
                    dev.raw(),
                    profile_id,
                    out_slice(&mut placements),
                    &mut count,
                )
            }
        )?;
        placements.truncate(count as usize);
        Ok(placements)
    }

    /// Every GPU-instance profile NVML lists for the GPU (indices it answers
    /// NOT_SUPPORTED or INVALID_ARGUMENT skipped), with its placements: what a GPU the
    /// catalog lacks is partitioned by. Meaningful only with MIG on.
    pub(super) fn nvml_profiles(
        &self,
        dev: &Device<'_>,
    ) -> Result<Vec<crate::mig::discovered::NvmlProfile>, CallFailed> {
        // SAFETY: `handle` only copies the pointer out.
        let handle = DeviceHandle::of(unsafe { dev.handle() });
        let mut out = Vec::new();
        for index in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
            let p = match dev.profile_info(index) {
                Ok(p) => p,
                Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
                Err(source) => {
                    return Err(CallFailed::new(
                        "nvmlDeviceGetGpuInstanceProfileInfo",
                        source,
                    ));
                }
            };
            let placements = self
                .placements(handle, p.id)?
                .into_iter()
                .map(|pl| (pl.start, pl.size))
                .collect();
            out.push(crate::mig::discovered::NvmlProfile {
                nvml_index: index,
                profile_id: p.id,
                slice_count: p.slice_count,
                instance_count: p.instance_count,
                memory_mib: p.memory_size_mb,
                multiprocessors: p.multiprocessor_count,
                copy_engines: p.copy_engine_count,
                decoders: p.decoder_count,
                encoders: p.encoder_count,
                jpeg_engines: p.jpeg_count,
                ofa_engines: p.ofa_count,
                placements,
            });
        }
        Ok(out)
    }

    pub(super) fn create_gi(
        &self,
        dev: DeviceHandle,
        profile_id: u32,
        placement: RawPlacement,
    ) -> Result<GiHandle, CallFailed> {
        let mut gi = ptr::null_mut();
        // SAFETY: `dev` is a live device handle; `placement` mirrors
        // `nvmlGpuInstancePlacement_t` (size checked by `in_ptr`); `gi` receives a handle.
        nvml_call!(
            self.nvml,
            nvmlDeviceCreateGpuInstanceWithPlacement,
            |f| unsafe { f(dev.raw(), profile_id, in_ptr(&placement), &mut gi) }
        )?;
        Ok(GiHandle::of(gi))
    }

    /// Creates the compute instance of CI profile index `ci_profile` (its ID is looked
    /// up in the GPU instance's profile info).
    pub(super) fn create_ci(&self, gi: GiHandle, ci_profile: u32) -> Result<CiHandle, CallFailed> {
        let profile = self.ci_profile(gi, ci_profile)?;
        let mut ci = ptr::null_mut();
        // SAFETY: `gi` is a live GPU-instance handle; `ci` receives a handle.
        nvml_call!(
            self.nvml,
            nvmlGpuInstanceCreateComputeInstance,
            |f| unsafe { f(gi.raw(), profile.id, &mut ci) }
        )?;
        Ok(CiHandle::of(ci))
    }

    pub(super) fn destroy_ci(&self, ci: CiHandle) -> Result<(), CallFailed> {
        // SAFETY: `ci` is a live compute-instance handle; it is not used afterwards.
        nvml_call!(self.nvml, nvmlComputeInstanceDestroy, |f| unsafe {
            f(ci.raw())
        })
    }

    pub(super) fn destroy_gi_handle(&self, gi: GiHandle) -> Result<(), CallFailed> {
        // SAFETY: `gi` is a live GPU-instance handle; it is not used afterwards.
        nvml_call!(self.nvml, nvmlGpuInstanceDestroy, |f| unsafe {
            f(gi.raw())
        })
    }

    /// Destroys the compute instances of GPU instance `gi_id`, then the GPU instance.
    pub(super) fn destroy_gi(&self, dev: DeviceHandle, gi_id: u32) -> Result<(), CallFailed> {
        let mut gi = ptr::null_mut();
        // SAFETY: `dev` is a live device handle; `gi` receives a handle.
        nvml_call!(self.nvml, nvmlDeviceGetGpuInstanceById, |f| unsafe {
            f(dev.raw(), gi_id, &mut gi)
        })?;
        let gi = GiHandle::of(gi);
        for ci in self.compute_instances(gi)? {
            self.destroy_ci(ci)?;
        }
        self.destroy_gi_handle(gi)
    }

    /// Rolls back a half-made MIG device: its compute instance, if any, then the GPU
    /// instance. Failures are logged; the caller reports the original error.
    pub(super) fn undo_create(&self, gi: GiHandle, ci: Option<CiHandle>, op: &MigOp) {
        let undone = ci
            .map_or(Ok(()), |ci| self.destroy_ci(ci))
            .and_then(|()| self.destroy_gi_handle(gi));
        if let Err(CallFailed { call, source }) = undone {
            tracing::warn!(
                minor = op.minor,
                subject = %op.subject,
                call,
                error = %source,
                "cannot roll back a half-made MIG device; clean-up destroys it later"
            );
        }
    }
}
