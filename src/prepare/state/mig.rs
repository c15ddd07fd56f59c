//! The MIG lifecycle of claims: devices created at the allocated placement when a claim
//! is prepared, destroyed by placement when it is unprepared, MIG mode switched on and
//! off again, and instances no claim accounts for reconciled at start-up.

use super::*;

impl DeviceState {
    /// Destroys the MIG devices claim `uid` created, each found **by placement** (GPU,
    /// start, profile), never by a recorded GI ID: NVML hands GI IDs out regardless of
    /// placement, so an ID recorded before a crash, or of a device destroyed in an
    /// earlier attempt, may name another claim's device by now. A placement another
    /// claim of the checkpoint also records is left alone. After each destroy (or an
    /// instance already gone) the record's `created` is cleared and the checkpoint
    /// stored before the next device, so that a retry after an IN_USE answer on a later
    /// device never comes back to it. The placement stays recorded (and held) until
    /// the claim is forgotten. Owns side effects (NVML, checkpoint writes).
    pub(super) fn destroy_claim_mig(
        &self,
        cp: &mut Checkpoint,
        uid: &str,
        fail_point: Option<&str>,
    ) -> Result<(), PrepareError> {
        let count = cp.claims.get(uid).map_or(0, |r| r.devices.len());
        #[allow(clippy::needless_range_loop)] // `i` indexes the checkpoint record.
        for i in 0..count {
            let Some(m) = cp
                .claims
                .get(uid)
                .and_then(|r| r.devices[i].mig.clone())
                .filter(|m| m.created)
            else {
                continue;
            };
            let placement = (m.gpu_minor, m.start, m.profile_id);
            let shared_with = cp.claims.iter().find(|(owner, r)| {
                owner.as_str() != uid
                    && r.devices
                        .iter()
                        .filter_map(|d| d.mig.as_ref())
                        .any(|o| (o.gpu_minor, o.start, o.profile_id) == placement)
            });
            if let Some((owner, _)) = shared_with {
                warn!(
                    claim = uid,
                    other = %owner,
                    gpu = m.gpu_minor,
                    start = m.start,
                    profile = m.profile_id,
                    "not destroying a MIG placement another claim also records"
                );
            } else {
                let status = self.backend.mig_status(m.gpu_minor)?;
                if let Some(inst) = status
                    .instances
                    .iter()
                    .find(|i| i.start == m.start && i.profile_id == m.profile_id)
                {
                    match self.backend.destroy_mig(m.gpu_minor, inst.gi_id) {
                        Ok(()) => {
                            crate::telemetry::metrics::driver().mig_destroyed.inc();
                            info!(
                                claim = uid,
                                gpu = m.gpu_minor,
                                gi = inst.gi_id,
                                start = m.start,
                                profile = m.profile_id,
                                "destroyed MIG device"
                            )
                        }
                        Err(BackendError::Mig {
                            source: MigError::NotFound(_),
                            ..
                        }) => {}
                        Err(
                            e @ BackendError::Mig {
                                source: MigError::InUse(_),
                                ..
                            },
                        ) => {
                            self.busy_mig
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push((uid.to_string(), m.gpu_minor, inst.gi_id));
                            return Err(e.into());
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            if let Some(point) = fail_point {
                self.cfg.fail_points.hit(point);
            }
            if let Some(r) = cp
                .claims
                .get_mut(uid)
                .and_then(|r| r.devices[i].mig.as_mut())
            {
                r.created = false;
            }
            self.store.store(cp)?;
        }
        Ok(())
    }

    /// Destroys (or, per policy, leaves) MIG devices on dynamic-MIG GPUs that no claim
    /// in the checkpoint accounts for. Returns what it destroyed.
    pub(super) fn reconcile_mig(&self, cp: &Checkpoint) -> Result<Vec<(u32, u32)>, PrepareError> {
        let mut destroyed = Vec::new();
        if self.cfg.unknown_mig == UnknownMig::Keep {
            return Ok(destroyed);
        }
        let owned: BTreeSet<(u32, u32, u32)> = cp
            .claims
            .values()
            .flat_map(|r| r.devices.iter().filter_map(|d| d.mig.as_ref()))
            .map(|m| (m.gpu_minor, m.start, m.profile_id))
            .collect();
        for gpu in self.gpus.iter().filter(|g| g.mig_model().is_some()) {
            let minor = gpu.gpu.minor;
            let status = self.backend.mig_status(minor)?;
            for inst in status.instances {
                if owned.contains(&(minor, inst.start, inst.profile_id)) {
                    continue;
                }
                if self.cfg.unknown_mig == UnknownMig::Adopt {
                    warn!(
                        gpu = minor,
                        gi = inst.gi_id,
                        "leaving a MIG device no claim accounts for (adopt mode)"
                    );
                    continue;
                }
                self.backend.destroy_mig(minor, inst.gi_id)?;
                crate::telemetry::metrics::driver().mig_destroyed.inc();
                warn!(
                    gpu = minor,
                    gi = inst.gi_id,
                    profile = inst.profile_id,
                    "destroyed a MIG device no claim accounts for"
                );
                destroyed.push((minor, inst.gi_id));
            }
        }
        Ok(destroyed)
    }

    /// Switches MIG mode off again on GPUs where Tessera switched it on and no MIG
    /// device of any claim remains (Hopper and later toggle without a reset).
    pub(super) fn release_mig_mode(&self, cp: &mut Checkpoint) -> Result<(), PrepareError> {
        let in_use: BTreeSet<u32> = cp
            .claims
            .values()
            .flat_map(|r| {
                r.devices
                    .iter()
                    .filter_map(|d| d.mig.as_ref().map(|m| m.gpu_minor))
            })
            .collect();
        for minor in cp.mig_enabled_by_tessera.clone() {
            if in_use.contains(&minor) {
                continue;
            }
            let status = self.backend.mig_status(minor)?;
            if status.instances.is_empty() {
                if status.enabled {
                    self.backend.set_mig_mode(minor, false)?;
                    info!(gpu = minor, "switched MIG mode off (no MIG device left)");
                }
                cp.mig_enabled_by_tessera.remove(&minor);
            }
        }
        Ok(())
    }

    /// Refuses a whole-GPU claim on a GPU with live MIG devices, and switches MIG mode
    /// off first where Tessera may (reset-free GPUs with no instances).
    pub(super) fn check_whole_gpu(
        &self,
        cp: &mut Checkpoint,
        device: &str,
        minor: u32,
    ) -> Result<(), PrepareError> {
        let Some(gpu) = self.gpus.iter().find(|g| g.gpu.minor == minor) else {
            return Ok(());
        };
        if !gpu.gpu.mig_capable {
            return Ok(());
        }
        let status = self.backend.mig_status(minor)?;
        if !status.instances.is_empty() {
            return Err(ClaimError::MigInUse {
                device: device.into(),
                count: status.instances.len(),
            }
            .into());
        }
        if status.enabled {
            let reset_free = crate::mig::model_for_product(&gpu.gpu.product_name)
                .is_some_and(|m| m.reset_free_mig_toggle);
            if !reset_free {
                return Err(ClaimError::MigInUse {
                    device: device.into(),
                    count: 0,
                }
                .into());
            }
            self.backend.set_mig_mode(minor, false)?;
            cp.mig_enabled_by_tessera.remove(&minor);
        }
        Ok(())
    }

    /// Creates (or adopts) the MIG devices of a claim in `Started` state, recording
    /// each intent before acting. Returns the (GI ID, CI ID, UUID) per device, in plan
    /// order.
    pub(super) fn create_mig_devices(
        &self,
        cp: &mut Checkpoint,
        uid: &str,
    ) -> Result<Vec<Option<cdi_spec::MigCaps>>, PrepareError> {
        let count = cp.claims.get(uid).map_or(0, |r| r.devices.len());
        let mut caps = vec![None; count];
        #[allow(clippy::needless_range_loop)] // `i` indexes the checkpoint record too.
        for i in 0..count {
            let Some(m) = cp.claims.get(uid).and_then(|r| r.devices[i].mig.clone()) else {
                continue;
            };
            let status = self.backend.mig_status(m.gpu_minor)?;
            let existing = status.instances.iter().find(|inst| {
                inst.start == m.start && inst.profile_id == m.profile_id && inst.ci.is_some()
            });
            let record = |cp: &mut Checkpoint, f: &dyn Fn(&mut MigRecord)| {
                if let Some(r) = cp
                    .claims
                    .get_mut(uid)
                    .and_then(|r| r.devices[i].mig.as_mut())
                {
                    f(r);
                }
            };
            let inst = match existing {
                Some(inst) => inst.clone(),
                None => {
                    if !status.enabled {
                        // Recorded before switching, so a crash leaves a known owner.
                        cp.mig_enabled_by_tessera.insert(m.gpu_minor);
                        self.store.store(cp)?;
                        self.backend.set_mig_mode(m.gpu_minor, true)?;
                        info!(gpu = m.gpu_minor, "switched MIG mode on");
                    }
                    record(cp, &|r| r.created = true);
                    self.store.store(cp)?;
                    let inst = self
                        .backend
                        .create_mig(m.gpu_minor, m.profile_id, m.start)?;
                    crate::telemetry::metrics::driver().mig_created.inc();
                    inst
                }
            };
            let ci = inst.ci.clone();
            record(cp, &|r| {
                r.gi_id = inst.gi_id;
                r.ci_id = ci.as_ref().map(|c| c.ci_id);
                r.uuid = ci.as_ref().map(|c| c.uuid.clone());
            });
            self.store.store(cp)?;
            self.cfg.fail_points.hit("prepare-after-mig-create");
            caps[i] = Some(match ci {
                Some(c) => (inst.gi_id, c.ci_id, Some(c.uuid)),
                None => (inst.gi_id, 0, None),
            });
        }
        Ok(caps)
    }

    /// Logs the processes that keep claims' MIG devices in use (their destroy answered
    /// IN_USE): the claim stays "unprepare started", and the watchdog reports their
    /// memory as zombie memory of the claim until they exit. Called after the node
    /// lock is released: listing the processes is an NVML call.
    pub(super) fn log_mig_holders(&self) {
        let busy = std::mem::take(&mut *self.busy_mig.lock().unwrap_or_else(|p| p.into_inner()));
        for (uid, minor, gi) in busy {
            match self.backend.processes(minor) {
                Ok(procs) => {
                    let on_gi = || procs.iter().filter(|p| p.gi_id == Some(gi));
                    let pids: Vec<u32> = on_gi().map(|p| p.pid).collect();
                    let bytes: u64 = on_gi().filter_map(|p| p.used_bytes).sum();
                    warn!(claim = %uid, gpu = minor, gi, pids = ?pids, bytes, "cannot destroy the claim's MIG device: processes still use it (zombie memory)");
                }
                Err(e) => {
                    warn!(claim = %uid, gpu = minor, gi, error = %e, "cannot destroy the claim's MIG device: in use, and its processes cannot be listed")
                }
            }
        }
    }
}
