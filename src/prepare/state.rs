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

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceClaim, ResourceSlice};
use tessera_cdi::{SpecWriter, WriteError};
use tracing::{info, warn};

use crate::clock::unix_secs;
use crate::config::ManagedGpu;
use crate::inventory::{BackendError, GpuBackend};
use crate::mig::MigError;
use crate::prepare::cdi_spec::{self, CdiContext};
use crate::prepare::checkpoint::{
    Checkpoint, CheckpointError, CheckpointStore, ClaimRecord, ClaimState, LoadOutcome, MigRecord,
    PreparedDevice,
};
use crate::prepare::claim_plan::{Budget, ClaimError, Held, NodeView, plan_claim};
use crate::prepare::failpoints::FailPoints;

mod library;
mod mig;
mod recovery;

pub use recovery::Recovery;

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
    /// What start-up does with MIG instances on `mig`-mode GPUs that no claim accounts for.
    pub unknown_mig: UnknownMig,
    /// Per-claim directories and the installed interception library (`--run-dir`).
    pub run_dir: PathBuf,
    /// Fallback slots per shared GPU (node config `sharedSlots`).
    pub shared_slots: u32,
    /// Where the interception library is installed from, to reinstall a version that
    /// disappeared (an overlapping plugin instance's clean-up during a rolling update).
    pub interception_source: Option<PathBuf>,
    /// Write KEP-5304 device metadata files and mount them (node config
    /// `deviceMetadata`).
    pub device_metadata: bool,
}

/// Start-up policy for MIG instances the checkpoint does not account for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownMig {
    /// Destroy them: Tessera owns MIG on its `mig`-mode GPUs (dynamic MIG).
    Destroy,
    /// Leave them and log (`--adopt-unknown-mig`).
    Adopt,
    /// Never touch them: the server drops counters, so MIG devices are published as
    /// static devices and are not Tessera's to destroy.
    Keep,
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
    #[error("GPU operation failed")]
    Backend(#[from] BackendError),
    #[error("the claim's files failed")]
    ClaimFiles(#[from] crate::prepare::claim_files::ClaimFilesError),
    #[error("removing unused interception library versions failed")]
    LibraryGc(#[source] std::io::Error),
    #[error(transparent)]
    Library(#[from] crate::prepare::library::InstallError),
    #[error(transparent)]
    Metadata(#[from] crate::prepare::device_metadata::MetadataError),
    #[error("taking the node lock {path} failed")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl PrepareError {
    /// A bounded reason for the error metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PrepareError::Claim(_) => "claim",
            PrepareError::Cdi(_) | PrepareError::CdiRemove(_) => "cdi",
            PrepareError::Checkpoint(_) => "checkpoint",
            PrepareError::Backend(_) => "gpu",
            PrepareError::ClaimFiles(_) => "claim_files",
            PrepareError::LibraryGc(_) => "library",
            PrepareError::Library(_) => "library",
            PrepareError::Lock { .. } => "lock",
            PrepareError::Metadata(_) => "metadata",
        }
    }

    /// The error with its causes on one line, for the kubelet's per-claim error string.
    pub fn chain(&self) -> String {
        crate::error_chain::cause_chain(self)
    }
}

/// The prepared claims of this node.
pub struct DeviceState {
    cfg: StateConfig,
    gpus: Vec<ManagedGpu>,
    backend: Arc<dyn GpuBackend>,
    cdi: CdiContext,
    writer: SpecWriter,
    store: CheckpointStore,
    mutex: Mutex<()>,
    /// The installed interception library version (installed under the node lock).
    library: Mutex<Option<String>>,
    /// Claims unprepared lately, newest last (bounded): the watchdog attributes memory
    /// still held after an unprepare (zombie memory) to them.
    unprepared: Mutex<std::collections::VecDeque<Unprepared>>,
    /// MIG devices whose destroy answered IN_USE under the node lock: (claim, GPU
    /// minor, GI ID), whose processes are listed and logged once the lock is released
    /// (no NVML call under the lock).
    busy_mig: Mutex<Vec<(String, u32, u32)>>,
    /// The pool as last published, once the plugin follows it: the devices' attributes
    /// for their metadata files.
    published: std::sync::OnceLock<tokio::sync::watch::Receiver<Vec<ResourceSlice>>>,
}

/// A claim unprepared by this process, remembered for [`RECENT_UNPREPARED`] entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unprepared {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub pods: Vec<crate::prepare::checkpoint::PodRef>,
    /// UUIDs of the GPUs its devices were on.
    pub gpus: Vec<String>,
    /// Unix seconds.
    pub at: u64,
}

/// How many unprepared claims the state remembers for zombie attribution.
pub const RECENT_UNPREPARED: usize = 256;

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
        backend: Arc<dyn GpuBackend>,
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
            backend,
            cdi,
            mutex: Mutex::new(()),
            library: Mutex::new(None),
            unprepared: Mutex::new(std::collections::VecDeque::new()),
            busy_mig: Mutex::new(Vec::new()),
            published: std::sync::OnceLock::new(),
        };
        let recovery = state.recover();
        state.log_mig_holders();
        let recovery = recovery?;
        Ok((state, recovery))
    }

    pub fn config(&self) -> &StateConfig {
        &self.cfg
    }

    /// From now on, devices' metadata files carry the attributes of the pool `slices`
    /// holds (the last published). Only the first call counts.
    pub fn follow_published(&self, slices: tokio::sync::watch::Receiver<Vec<ResourceSlice>>) {
        let _ = self.published.set(slices);
    }

    /// A prepared device's attributes for its metadata file: those its ResourceSlice
    /// publishes, plus `uuid` (`MIG-…`) for a MIG device; without a published pool (or
    /// a device missing from it), the GPU's `uuid` and `productName` (and `parentUUID`
    /// for a MIG device).
    fn device_attributes(
        &self,
        d: &PreparedDevice,
    ) -> std::collections::BTreeMap<String, DeviceAttribute> {
        let string = |s: &str| DeviceAttribute {
            string: Some(s.to_string()),
            ..Default::default()
        };
        let published = self.published.get().and_then(|rx| {
            rx.borrow()
                .iter()
                .filter(|s| s.spec.driver == self.cfg.driver && s.spec.pool.name == self.cfg.pool)
                .flat_map(|s| s.spec.devices.iter().flatten())
                .find(|dev| dev.name == d.device_name)
                .map(|dev| dev.attributes.clone().unwrap_or_default())
        });
        let mut attrs = published.unwrap_or_else(|| {
            let mut a = std::collections::BTreeMap::new();
            if let Some(g) = self.gpus.iter().find(|g| g.gpu.uuid == d.gpu_uuid) {
                a.insert("productName".to_string(), string(&g.gpu.product_name));
            }
            let key = if d.mig.is_some() {
                "parentUUID"
            } else {
                "uuid"
            };
            a.insert(key.to_string(), string(&d.gpu_uuid));
            a
        });
        if let Some(uuid) = d.mig.as_ref().and_then(|m| m.uuid.as_deref()) {
            attrs.insert("uuid".to_string(), string(uuid));
        }
        attrs
    }

    /// The GPUs this state manages.
    pub fn gpus(&self) -> &[ManagedGpu] {
        &self.gpus
    }

    /// The GPU backend (the compute controller and the watchdog query it).
    pub fn backend(&self) -> &Arc<dyn GpuBackend> {
        &self.backend
    }

    /// Claims this process unprepared lately, oldest first.
    pub fn recently_unprepared(&self) -> Vec<Unprepared> {
        self.unprepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// The claims in the checkpoint, as last stored (no lock: the file is replaced
    /// atomically, so a reader sees one whole version). For metrics.
    pub fn prepared(
        &self,
    ) -> Result<std::collections::BTreeMap<String, ClaimRecord>, PrepareError> {
        Ok(self.load()?.0.claims)
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

    /// Prepares one claim (already fetched from the API server). Idempotent: a claim
    /// prepared before returns its recorded devices without doing any work. On error
    /// nothing of this claim remains on disk. Counted and timed in the metrics.
    pub fn prepare(
        &self,
        claim: &ResourceClaim,
        uid: &str,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let t = std::time::Instant::now();
        let r = self.prepare_inner(claim, uid);
        self.log_mig_holders();
        let kind = r.as_ref().map_or_else(
            |_| crate::prepare::claim_plan::allocation_kind(claim, &self.cfg.driver),
            |d| crate::prepare::checkpoint::claim_kind(d),
        );
        crate::telemetry::metrics::driver().observe(
            "prepare",
            kind,
            t.elapsed().as_secs_f64(),
            r.as_ref().err().map(PrepareError::reason),
        );
        r
    }

    fn prepare_inner(
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
        let held = held_by_others(&cp, uid, &self.gpus);
        let plan = plan_claim(
            claim,
            uid,
            NodeView {
                driver: &self.cfg.driver,
                pool: &self.cfg.pool,
                gpus: &self.gpus,
                shared_slots: self.cfg.shared_slots,
            },
            &held,
        )?;
        for d in plan.devices.iter().filter(|d| d.mig.is_none()) {
            self.check_whole_gpu(&mut cp, &d.device, d.gpu_minor)?;
        }
        // Refuse an invalid spec before recording anything (MIG caps predicted from the
        // placement; the final spec uses the IDs NVML returns).
        let predicted: Vec<Option<cdi_spec::MigCaps>> = plan
            .devices
            .iter()
            .map(|d| d.mig.map(|m| (m.gi_id, 0, None)))
            .collect();
        let shared = plan.is_shared();
        if shared && let Err(e) = self.ensure_library() {
            warn!(claim = uid, error = %e, "the interception library is not installed");
        }
        let cdi = self.cdi_context();
        let spec = cdi_spec::render_claim_spec(&plan, &cdi, &predicted).map_err(ClaimError::Cdi)?;
        let names = cdi_spec::spec_file_names(uid).map_err(PrepareError::Cdi)?;
        tessera_cdi::render_spec(&spec, cdi_spec::VERSION_POLICY, names.file_name())
            .map_err(PrepareError::Cdi)?;
        let identity = crate::prepare::device_metadata::ClaimIdentity::of(claim, uid);
        let metadata = self.cfg.device_metadata;
        let claim_files = if shared {
            Some(
                crate::prepare::claim_files::render(&plan)
                    .map_err(|e| ClaimError::Cdi(e.to_string()))?,
            )
        } else {
            None
        };
        let devices: Vec<PreparedDevice> = plan
            .devices
            .iter()
            .map(|d| PreparedDevice {
                request_names: vec![d.request.clone()],
                pool_name: d.pool.clone(),
                device_name: d.device.clone(),
                cdi_device_ids: vec![cdi_spec::cdi_device_id(&d.cdi_name(uid))],
                share_id: d.share_id.clone(),
                gpu_uuid: d.gpu_uuid.clone(),
                config: d.config,
                mig: d.mig.map(|m| MigRecord {
                    gpu_minor: d.gpu_minor,
                    profile_id: m.profile_id,
                    start: m.start,
                    size: m.size,
                    gi_id: m.gi_id,
                    ci_id: None,
                    uuid: None,
                    created: false,
                }),
                budget: d.budget,
            })
            .collect();
        if metadata {
            // Refuse names that cannot be paths before recording anything.
            crate::prepare::device_metadata::render(&self.cfg.driver, &identity, &devices, &|d| {
                self.device_attributes(d)
            })?;
        }
        cp.claims.insert(
            uid.to_string(),
            ClaimRecord {
                state: ClaimState::PrepareStarted,
                namespace: plan.namespace.clone(),
                name: plan.name.clone(),
                devices: devices.clone(),
                cdi_spec: Some(names.file_name().to_string()),
                claim_files: shared,
                metadata,
                // Every spec rendered with the library mounts its version (the
                // soname shims and the library directory: `cdi_spec::driver_mounts`),
                // whole-GPU ones included, so every such claim keeps it installed.
                lib_version: cdi.interception.clone(),
                pods: reserved_pods(claim),
                started_at: unix_secs(),
                completed_at: None,
            },
        );
        self.store.store(&cp)?;
        self.cfg.fail_points.hit("prepare-after-started");
        let result = (|| {
            let caps = self.create_mig_devices(&mut cp, uid)?;
            if let Some(files) = &claim_files {
                let dir = crate::prepare::claim_files::create(&self.cfg.run_dir, uid, files)
                    .map_err(PrepareError::ClaimFiles)?;
                info!(claim = uid, dir = %dir.display(), budgets = ?plan.budgets_by_uuid(), "wrote claim files");
                self.cfg.fail_points.hit("prepare-after-claim-files");
            }
            let mut spec =
                cdi_spec::render_claim_spec(&plan, &cdi, &caps).map_err(ClaimError::Cdi)?;
            if metadata {
                use crate::prepare::device_metadata as dm;
                let devices = cp
                    .claims
                    .get(uid)
                    .map(|r| r.devices.clone())
                    .unwrap_or_default();
                let files = dm::render(&self.cfg.driver, &identity, &devices, &|d| {
                    self.device_attributes(d)
                })?;
                dm::create(&self.cfg.run_dir, uid, &self.cfg.driver, &files)?;
                self.cfg.fail_points.hit("prepare-after-metadata");
                dm::add_mounts(&mut spec, &files, &self.cfg.driver, &cdi.host_run_dir, uid);
            }
            self.writer
                .write(&names, &spec, cdi_spec::VERSION_POLICY)
                .map_err(PrepareError::Cdi)?;
            self.cfg.fail_points.hit("prepare-after-cdi-write");
            self.cfg.fail_points.hit("prepare-before-completed");
            if let Some(r) = cp.claims.get_mut(uid) {
                r.state = ClaimState::PrepareCompleted;
                r.completed_at = Some(unix_secs());
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
        Ok(cp
            .claims
            .get(uid)
            .map(|r| r.devices.clone())
            .unwrap_or(devices))
    }

    /// Unprepares one claim: removes its CDI spec and forgets it. An unknown or
    /// never-prepared claim is a success. Counted and timed in the metrics.
    pub fn unprepare(&self, uid: &str) -> Result<(), PrepareError> {
        let t = std::time::Instant::now();
        let mut kind = "unknown";
        let r = self.unprepare_inner(uid, &mut kind);
        self.log_mig_holders();
        crate::telemetry::metrics::driver().observe(
            "unprepare",
            kind,
            t.elapsed().as_secs_f64(),
            r.as_ref().err().map(PrepareError::reason),
        );
        r
    }

    fn unprepare_inner(&self, uid: &str, kind: &mut &'static str) -> Result<(), PrepareError> {
        let _l = self.lock()?;
        let (mut cp, _) = self.load()?;
        let Some(rec) = cp.claims.get(uid).cloned() else {
            return Ok(());
        };
        *kind = crate::prepare::checkpoint::claim_kind(&rec.devices);
        // Recorded first: from here on the claim is being undone, whatever happens.
        if let Some(r) = cp.claims.get_mut(uid) {
            r.state = ClaimState::UnprepareStarted;
        }
        self.store.store(&cp)?;
        // MIG devices first: an IN_USE answer fails the call (the claim stays
        // "unprepare started" and is not prepared again until undone), so the kubelet
        // retries; devices destroyed before it are recorded as such.
        self.destroy_claim_mig(&mut cp, uid, Some("unprepare-after-mig-destroy"))?;
        if let Some(spec) = &rec.cdi_spec {
            remove_spec_file(&self.cfg.cdi_dir, spec)?;
        }
        self.cfg.fail_points.hit("unprepare-after-cdi-remove");
        if rec.claim_files {
            crate::prepare::claim_files::remove(&self.cfg.run_dir, uid)
                .map_err(PrepareError::ClaimFiles)?;
            self.cfg
                .fail_points
                .hit("unprepare-after-claim-files-remove");
        }
        if rec.metadata {
            crate::prepare::device_metadata::remove(&self.cfg.run_dir, uid)?;
            self.cfg.fail_points.hit("unprepare-after-metadata-remove");
        }
        cp.claims.remove(uid);
        self.release_mig_mode(&mut cp)?;
        self.store.store(&cp)?;
        if rec.lib_version.is_some() {
            self.gc_libraries(&cp)?;
        }
        let mut recent = self.unprepared.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() >= RECENT_UNPREPARED {
            recent.pop_front();
        }
        let mut gpus: Vec<String> = rec.devices.iter().map(|d| d.gpu_uuid.clone()).collect();
        gpus.sort();
        gpus.dedup();
        recent.push_back(Unprepared {
            uid: uid.to_string(),
            namespace: rec.namespace.clone(),
            name: rec.name.clone(),
            pods: rec.pods.clone(),
            gpus,
            at: unix_secs(),
        });
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
        let now = unix_secs();
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
                .trim_start_matches(cdi_spec::SPEC_FILE_PREFIX)
                .trim_end_matches(".json")
        ),
    )
    .map_err(PrepareError::CdiRemove)?;
    SpecWriter::new(cdi_dir.to_path_buf())
        .remove(&names)
        .map_err(PrepareError::CdiRemove)
}

/// The pods in a claim's `status.reservedFor`.
fn reserved_pods(claim: &ResourceClaim) -> Vec<crate::prepare::checkpoint::PodRef> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
        .map(|r| crate::prepare::checkpoint::PodRef {
            name: r.name.clone(),
            uid: r.uid.clone(),
        })
        .collect()
}

/// What the other prepared claims hold: their hold keys and, per GPU minor, the sum of
/// their shared-GPU budgets.
fn held_by_others(cp: &Checkpoint, uid: &str, gpus: &[ManagedGpu]) -> Held {
    let mut held = Held::default();
    for (owner, r) in &cp.claims {
        for d in &r.devices {
            let key = match &d.share_id {
                Some(s) => format!("{}#{s}", d.device_name),
                None => d.device_name.clone(),
            };
            held.devices.insert(key, owner.clone());
            if owner == uid {
                continue;
            }
            let (Some(b), Some(g)) = (d.budget, gpus.iter().find(|g| g.gpu.uuid == d.gpu_uuid))
            else {
                continue;
            };
            let e = held.budgets.entry(g.gpu.minor).or_insert(Budget::default());
            e.memory_bytes = e.memory_bytes.saturating_add(b.memory_bytes);
            e.compute_percent = e.compute_percent.saturating_add(b.compute_percent);
        }
    }
    held
}
