//! Prepared claims: the prepare/unprepare state machine over the checkpoint and the
//! CDI directory, with its locking and crash recovery.
//!
//! Locking model: one in-process mutex plus an exclusive `flock` on
//! `<plugin-dir>/tessera.lock`, held for the whole prepare or unprepare of one claim,
//! so that two plugin instances overlapping in a rolling update never interleave. The
//! checkpoint is re-read under the lock for the same reason. No API call is made while
//! the lock is held: the gRPC layer fetches the claim first. All methods block (fsync)
//! and are meant to run on a blocking thread.
//!
//! Crash model: "prepare started" is recorded (with the CDI file the claim will own)
//! before any side effect, and "completed" after all of them; start-up rolls back
//! every claim left "started", sweeps temp files and removes Tessera CDI specs the
//! checkpoint does not know. Named fail points let tests abort the process at each
//! step boundary.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_cdi::{SpecWriter, WriteError};
use tracing::{info, warn};

use crate::cdispec::{self, CdiContext};
use crate::checkpoint::{
    Checkpoint, CheckpointError, CheckpointStore, ClaimRecord, ClaimState, LoadOutcome,
    PreparedDevice, unix_now,
};
use crate::claims::{ClaimError, plan_claim};
use crate::config::ManagedGpu;

/// Points where a test can make the plugin abort (`TESSERA_FAILPOINTS=a,b`).
pub const FAIL_POINTS: &[&str] = &[
    "prepare-after-started",
    "prepare-after-cdi-write",
    "prepare-before-completed",
    "unprepare-after-cdi-remove",
];

/// The set of armed fail points; empty in production.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailPoints(BTreeSet<String>);

impl FailPoints {
    /// Parses a comma-separated list; unknown names are an error so a typo in a test
    /// cannot silently disarm it.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut set = BTreeSet::new();
        for p in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !FAIL_POINTS.contains(&p) {
                return Err(format!(
                    "unknown fail point {p:?}; known: {}",
                    FAIL_POINTS.join(", ")
                ));
            }
            set.insert(p.to_string());
        }
        Ok(FailPoints(set))
    }

    fn hit(&self, point: &str) {
        if self.0.contains(point) {
            eprintln!("tessera: fail point {point} reached, aborting");
            std::process::abort();
        }
    }
}

/// Where the state lives and who we are.
#[derive(Debug, Clone)]
pub struct StateConfig {
    pub driver: String,
    /// Our pool name (the node name).
    pub pool: String,
    pub cdi_dir: PathBuf,
    /// Holds `tessera.lock`, shared by overlapping plugin instances.
    pub plugin_dir: PathBuf,
    /// Holds the checkpoint.
    pub state_dir: PathBuf,
    pub boot_id: String,
    pub fail_points: FailPoints,
}

/// Why preparing or unpreparing one claim failed; `Display` + sources go to the kubelet.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error("writing the CDI spec failed")]
    Cdi(#[source] WriteError),
    #[error("removing the CDI spec failed")]
    CdiRemove(#[source] WriteError),
    #[error("updating the checkpoint failed")]
    Checkpoint(#[from] CheckpointError),
    #[error("taking the node lock {path} failed")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl PrepareError {
    /// The error with its causes on one line, for the kubelet's per-claim error string.
    pub fn chain(&self) -> String {
        let mut s = self.to_string();
        let mut cur = std::error::Error::source(self);
        while let Some(e) = cur {
            s.push_str(": ");
            s.push_str(&e.to_string());
            cur = e.source();
        }
        s
    }
}

/// What start-up recovery did (for logs and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    pub outcome: Option<LoadOutcome>,
    pub rolled_back: Vec<String>,
    pub removed_specs: Vec<String>,
    pub removed_temp_files: Vec<String>,
}

/// The prepared claims of this node.
pub struct DeviceState {
    cfg: StateConfig,
    gpus: Vec<ManagedGpu>,
    cdi: CdiContext,
    writer: SpecWriter,
    store: CheckpointStore,
    mutex: Mutex<()>,
}

struct Locked<'a> {
    _guard: MutexGuard<'a, ()>,
    _file: File,
}

impl DeviceState {
    /// Opens the state and recovers from whatever a previous run left: see the module
    /// doc. Creates the directories it needs.
    pub fn open(
        cfg: StateConfig,
        gpus: Vec<ManagedGpu>,
        cdi: CdiContext,
    ) -> Result<(Self, Recovery), PrepareError> {
        for dir in [&cfg.cdi_dir, &cfg.plugin_dir, &cfg.state_dir] {
            std::fs::create_dir_all(dir).map_err(|source| PrepareError::Lock {
                path: dir.clone(),
                source,
            })?;
        }
        let state = DeviceState {
            writer: SpecWriter::new(cfg.cdi_dir.clone()),
            store: CheckpointStore::new(cfg.state_dir.clone()),
            cfg,
            gpus,
            cdi,
            mutex: Mutex::new(()),
        };
        let recovery = state.recover()?;
        Ok((state, recovery))
    }

    pub fn config(&self) -> &StateConfig {
        &self.cfg
    }

    fn lock(&self) -> Result<Locked<'_>, PrepareError> {
        let guard = self.mutex.lock().unwrap_or_else(|p| p.into_inner());
        let path = self.cfg.plugin_dir.join("tessera.lock");
        let lock_err = |source| PrepareError::Lock {
            path: path.clone(),
            source,
        };
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(lock_err)?;
        file.lock().map_err(lock_err)?;
        Ok(Locked {
            _guard: guard,
            _file: file,
        })
    }

    fn load(&self) -> Result<(Checkpoint, LoadOutcome), PrepareError> {
        Ok(self.store.load(&self.cfg.boot_id)?)
    }

    fn recover(&self) -> Result<Recovery, PrepareError> {
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
            self.roll_back(&mut cp, &uid)?;
            rec.rolled_back.push(uid);
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
                    name.starts_with(cdispec::SPEC_FILE_PREFIX) && name.ends_with(".json");
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
        self.store.store(&cp)?;
        if !rec.rolled_back.is_empty() || !rec.removed_specs.is_empty() {
            info!(rolled_back = ?rec.rolled_back, removed_specs = ?rec.removed_specs, "recovered from an interrupted run");
        }
        Ok(rec)
    }

    /// Undoes a claim's side effects and forgets it (in `cp`, stored by the caller).
    fn roll_back(&self, cp: &mut Checkpoint, uid: &str) -> Result<(), PrepareError> {
        if let Some(rec) = cp.claims.get(uid) {
            if let Some(spec) = &rec.cdi_spec {
                remove_spec_file(&self.cfg.cdi_dir, spec)?;
            }
            cp.claims.remove(uid);
            self.store.store(cp)?;
        }
        Ok(())
    }

    /// Prepares one claim (already fetched from the API server). Idempotent: a claim
    /// prepared before returns its recorded devices without doing any work. On error
    /// nothing of this claim remains on disk.
    pub fn prepare(
        &self,
        claim: &ResourceClaim,
        uid: &str,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let _l = self.lock()?;
        let (mut cp, _) = self.load()?;
        match cp.claims.get(uid).map(|r| r.state) {
            Some(ClaimState::PrepareCompleted) => return Ok(cp.claims[uid].devices.clone()),
            Some(_) => self.roll_back(&mut cp, uid)?,
            None => {}
        }
        let held: BTreeMap<String, String> = cp
            .claims
            .iter()
            .flat_map(|(owner, r)| {
                r.devices.iter().map(move |d| {
                    let key = match &d.share_id {
                        Some(s) => format!("{}#{s}", d.device_name),
                        None => d.device_name.clone(),
                    };
                    (key, owner.clone())
                })
            })
            .collect();
        let plan = plan_claim(
            claim,
            uid,
            &self.cfg.driver,
            &self.cfg.pool,
            &self.gpus,
            &held,
        )?;
        let spec = cdispec::render_claim_spec(&plan, &self.cdi);
        let names = cdispec::spec_file_names(uid).map_err(PrepareError::Cdi)?;
        // Refuse an invalid spec before recording anything.
        tessera_cdi::render_spec(&spec, cdispec::VERSION_POLICY, names.file_name())
            .map_err(PrepareError::Cdi)?;
        let devices: Vec<PreparedDevice> = plan
            .devices
            .iter()
            .map(|d| PreparedDevice {
                request_names: vec![d.request.clone()],
                pool_name: d.pool.clone(),
                device_name: d.device.clone(),
                cdi_device_ids: vec![cdispec::cdi_device_id(&d.cdi_name(uid))],
                share_id: d.share_id.clone(),
                gpu_uuid: d.gpu_uuid.clone(),
                config: d.config,
            })
            .collect();
        cp.claims.insert(
            uid.to_string(),
            ClaimRecord {
                state: ClaimState::PrepareStarted,
                namespace: plan.namespace.clone(),
                name: plan.name.clone(),
                devices: devices.clone(),
                cdi_spec: Some(names.file_name().to_string()),
                started_at: unix_now(),
                completed_at: None,
            },
        );
        self.store.store(&cp)?;
        self.cfg.fail_points.hit("prepare-after-started");
        let result = (|| {
            self.writer
                .write(&names, &spec, cdispec::VERSION_POLICY)
                .map_err(PrepareError::Cdi)?;
            self.cfg.fail_points.hit("prepare-after-cdi-write");
            self.cfg.fail_points.hit("prepare-before-completed");
            if let Some(r) = cp.claims.get_mut(uid) {
                r.state = ClaimState::PrepareCompleted;
                r.completed_at = Some(unix_now());
            }
            self.store.store(&cp)?;
            Ok(())
        })();
        if let Err(e) = result {
            // Best effort: leave nothing of this claim behind; start-up retries otherwise.
            if let Err(rb) = self.roll_back(&mut cp, uid) {
                warn!(claim = uid, error = %rb, "rollback after a failed prepare failed");
            }
            return Err(e);
        }
        Ok(devices)
    }

    /// Unprepares one claim: removes its CDI spec and forgets it. An unknown or
    /// never-prepared claim is a success.
    pub fn unprepare(&self, uid: &str) -> Result<(), PrepareError> {
        let _l = self.lock()?;
        let (mut cp, _) = self.load()?;
        let Some(rec) = cp.claims.get(uid) else {
            return Ok(());
        };
        if let Some(spec) = &rec.cdi_spec {
            remove_spec_file(&self.cfg.cdi_dir, spec)?;
        }
        self.cfg.fail_points.hit("unprepare-after-cdi-remove");
        cp.claims.remove(uid);
        self.store.store(&cp)?;
        Ok(())
    }

    /// Claims prepared at least `min_age_secs` ago: (uid, namespace, name). The stale
    /// claim clean-up checks each against the API server.
    pub fn prepared_claims(
        &self,
        min_age_secs: u64,
    ) -> Result<Vec<(String, String, String)>, PrepareError> {
        let (cp, _) = {
            let _l = self.lock()?;
            self.load()?
        };
        let now = unix_now();
        Ok(cp
            .claims
            .into_iter()
            .filter(|(_, r)| now.saturating_sub(r.started_at) >= min_age_secs)
            .map(|(u, r)| (u, r.namespace, r.name))
            .collect())
    }
}

fn remove_spec_file(cdi_dir: &Path, file_name: &str) -> Result<(), PrepareError> {
    let names = tessera_cdi::SpecFileNames::new(
        file_name.to_string(),
        format!(
            ".tessera-{}.tmp",
            file_name
                .trim_start_matches(cdispec::SPEC_FILE_PREFIX)
                .trim_end_matches(".json")
        ),
    )
    .map_err(PrepareError::CdiRemove)?;
    SpecWriter::new(cdi_dir.to_path_buf())
        .remove(&names)
        .map_err(PrepareError::CdiRemove)
}
