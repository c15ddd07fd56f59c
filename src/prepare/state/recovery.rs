//! Start-up recovery: whatever a previous run left (a crash mid-prepare or
//! mid-unprepare, a changed node) is finished or undone before the first request.

use super::*;

/// What start-up recovery did (for logs and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    pub outcome: Option<LoadOutcome>,
    pub rolled_back: Vec<String>,
    pub removed_specs: Vec<String>,
    pub removed_temp_files: Vec<String>,
    /// MIG devices destroyed because no claim accounted for them: (GPU minor, GI ID).
    pub destroyed_mig: Vec<(u32, u32)>,
    /// Claim directories no claim owned (half-made, half-removed or orphaned).
    pub removed_claim_dirs: Vec<String>,
    /// Device metadata directories no claim owned.
    pub removed_metadata_dirs: Vec<String>,
    /// Interception library versions no claim referenced.
    pub removed_lib_versions: Vec<String>,
    /// Unfinished claims left "unprepare started" because processes still use their
    /// MIG devices.
    pub kept_in_use: Vec<String>,
}

impl DeviceState {
    pub(super) fn recover(&self) -> Result<Recovery, PrepareError> {
        let _l = self.lock()?;
        let (mut cp, outcome) = self.load()?;
        match &outcome {
            LoadOutcome::OtherBoot { previous } => {
                info!(previous, "checkpoint is from another boot; starting empty")
            }
            LoadOutcome::Corrupt { moved_to, reason } => {
                warn!(moved_to = %moved_to.display(), reason, "checkpoint unreadable; moved aside, starting empty")
            }
            _ => {}
        }
        let mut rec = Recovery {
            outcome: Some(outcome),
            ..Default::default()
        };
        self.store.sweep_temp();
        let unfinished: Vec<String> = cp
            .claims
            .iter()
            .filter(|(_, r)| r.state != ClaimState::PrepareCompleted)
            .map(|(u, _)| u.clone())
            .collect();
        for uid in unfinished {
            match self.roll_back(&mut cp, &uid) {
                Ok(()) => rec.rolled_back.push(uid),
                // Processes still use one of its MIG devices: the claim stays, being
                // unprepared, so that the plugin starts (and its watchdog reports the
                // memory as zombie memory); the kubelet's next unprepare finishes it.
                Err(PrepareError::Backend(BackendError::Mig {
                    source: MigError::InUse(_),
                    ..
                })) => {
                    if let Some(r) = cp.claims.get_mut(&uid) {
                        r.state = ClaimState::UnprepareStarted;
                    }
                    self.store.store(&cp)?;
                    rec.kept_in_use.push(uid);
                }
                Err(e) => return Err(e),
            }
        }
        let known: BTreeSet<String> = cp
            .claims
            .values()
            .filter_map(|r| r.cdi_spec.clone())
            .collect();
        if let Ok(entries) = std::fs::read_dir(&self.cfg.cdi_dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let ours_temp = name.starts_with(".tessera-") && name.ends_with(".tmp");
                let ours_spec =
                    name.starts_with(cdi_spec::SPEC_FILE_PREFIX) && name.ends_with(".json");
                if ours_temp || (ours_spec && !known.contains(&name)) {
                    tessera_cdi::atomic::remove_durable(&self.cfg.cdi_dir, &name).map_err(|e| {
                        PrepareError::CdiRemove(WriteError::Remove {
                            path: self.cfg.cdi_dir.join(&name),
                            source: e,
                        })
                    })?;
                    if ours_temp {
                        rec.removed_temp_files.push(name);
                    } else {
                        rec.removed_specs.push(name);
                    }
                }
            }
        }
        let owners: BTreeSet<String> = cp
            .claims
            .iter()
            .filter(|(_, r)| r.claim_files)
            .map(|(u, _)| u.clone())
            .collect();
        rec.removed_claim_dirs = crate::prepare::claim_files::sweep(&self.cfg.run_dir, &owners)
            .map_err(PrepareError::ClaimFiles)?;
        let metadata_owners: BTreeSet<String> = cp
            .claims
            .iter()
            .filter(|(_, r)| r.metadata)
            .map(|(u, _)| u.clone())
            .collect();
        rec.removed_metadata_dirs =
            crate::prepare::device_metadata::sweep(&self.cfg.run_dir, &metadata_owners)?;
        if let Err(e) = self.install_library() {
            let shared = self
                .gpus
                .iter()
                .any(|g| g.mode == crate::config::GpuMode::Shared);
            if shared {
                warn!(error = %e, "no interception library: shared-GPU claims are refused until it installs");
            }
        } else if self.cfg.interception_source.is_none()
            && self
                .gpus
                .iter()
                .any(|g| g.mode == crate::config::GpuMode::Shared)
        {
            warn!(
                "no interception library (--interception-lib): shared-GPU claims will be refused"
            );
        }
        self.repair_controls(&cp);
        rec.removed_lib_versions = self.gc_libraries(&cp)?;
        rec.destroyed_mig = self.reconcile_mig(&cp)?;
        self.release_mig_mode(&mut cp)?;
        self.store.store(&cp)?;
        if !rec.rolled_back.is_empty()
            || !rec.removed_specs.is_empty()
            || !rec.destroyed_mig.is_empty()
            || !rec.removed_claim_dirs.is_empty()
            || !rec.kept_in_use.is_empty()
        {
            info!(rolled_back = ?rec.rolled_back, kept_in_use = ?rec.kept_in_use, removed_specs = ?rec.removed_specs, destroyed_mig = ?rec.destroyed_mig, removed_claim_dirs = ?rec.removed_claim_dirs, "recovered from an interrupted run");
        }
        Ok(rec)
    }

    /// Undoes a claim's side effects (MIG instances it created, its CDI spec) and
    /// forgets it, storing the checkpoint.
    pub(super) fn roll_back(&self, cp: &mut Checkpoint, uid: &str) -> Result<(), PrepareError> {
        let Some(rec) = cp.claims.get(uid).cloned() else {
            return Ok(());
        };
        self.destroy_claim_mig(cp, uid, None)?;
        if let Some(spec) = &rec.cdi_spec {
            remove_spec_file(&self.cfg.cdi_dir, spec)?;
        }
        if rec.claim_files {
            crate::prepare::claim_files::remove(&self.cfg.run_dir, uid)
                .map_err(PrepareError::ClaimFiles)?;
        }
        if rec.metadata {
            crate::prepare::device_metadata::remove(&self.cfg.run_dir, uid)?;
        }
        cp.claims.remove(uid);
        self.release_mig_mode(cp)?;
        self.store.store(cp)?;
        Ok(())
    }

    /// Repairs the `control` files of prepared shared claims whose writer died mid
    /// update (sequence left odd), so that tenant readers see consistent values.
    pub(super) fn repair_controls(&self, cp: &Checkpoint) {
        for (uid, _) in cp.claims.iter().filter(|(_, r)| r.claim_files) {
            let path = crate::prepare::claim_files::claim_dir(&self.cfg.run_dir, uid)
                .join(tessera_abi::CONTROL_FILE);
            let repaired = File::options()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| e.to_string())
                .and_then(|f| {
                    tessera_abi::control::Control::map(&f, true).map_err(|e| e.to_string())
                })
                .and_then(|c| c.repair_sequence().map_err(|e| e.to_string()));
            match repaired {
                Ok(true) => warn!(claim = %uid, "repaired a control file left mid-update"),
                Ok(false) => {}
                Err(e) => {
                    warn!(claim = %uid, path = %path.display(), error = %e, "cannot check a control file")
                }
            }
        }
    }
}
