//! The plugin's checkpoint: which claims are prepared (or half-prepared) and with what
//! devices, persisted so that a restarted plugin can finish or undo its work.
//!
//! * Two phases per claim, `PrepareStarted` then `PrepareCompleted`, each written
//!   atomically (temp file, fsync, rename, fsync dir) before and after the side effects.
//! * Tagged with the boot ID: after a reboot nothing prepared survives (CDI specs live
//!   on tmpfs, MIG instances are gone), so the plugin starts empty and cleans up.
//! * Schema-tolerant: versioned, unknown fields and unknown states are tolerated, and an
//!   unreadable file is moved aside rather than crash-looping the plugin (the NVIDIA
//!   driver's checksum crash loop, #1080 and #1326, is the failure this avoids).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::prepare::gpu_config::GpuConfig;

pub const CHECKPOINT_FILE: &str = "checkpoint.json";
const TEMP_FILE: &str = ".checkpoint.json.tmp";
/// Current schema version; readers accept any version and ignore unknown fields.
pub const SCHEMA_VERSION: u32 = 1;

/// Where a claim is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimState {
    /// Side effects may be partly done: the next prepare, or start-up, rolls them back.
    PrepareStarted,
    /// Everything is in place: prepare answers from the record; unprepare undoes it.
    PrepareCompleted,
    /// Unprepare began undoing the side effects: start-up (or a prepare) finishes the
    /// undo, so a half-unprepared claim never answers prepare with a missing spec.
    UnprepareStarted,
    /// A state written by a newer version that this one does not know: treated like
    /// `PrepareStarted` (rolled back), never a crash.
    #[serde(other)]
    Unknown,
}

/// One prepared device as returned to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    #[serde(default)]
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    #[serde(default)]
    pub cdi_device_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// The GPU behind the device, for conflict checks and later clean-up.
    #[serde(default)]
    pub gpu_uuid: String,
    #[serde(default)]
    pub config: GpuConfig,
    /// For a MIG partition: what was (or is to be) created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigRecord>,
    /// For a share of a shared GPU or a fallback slot: the budget it gives the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::prepare::claim_plan::Budget>,
}

/// A MIG device a claim owns, recorded before it is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigRecord {
    pub gpu_minor: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    pub gi_id: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Whether Tessera created the instance (and so destroys it at unprepare).
    #[serde(default)]
    pub created: bool,
}

/// A claim's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRecord {
    pub state: ClaimState,
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub devices: Vec<PreparedDevice>,
    /// The CDI spec file this claim owns (in `--cdi-dir`), recorded before it is written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdi_spec: Option<String>,
    /// Whether the claim owns `<run-dir>/claims/<uid>/` (recorded before it is created).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub claim_files: bool,
    /// Whether the claim owns `<run-dir>/metadata/<uid>/`, its device metadata files
    /// (recorded before they are created).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub metadata: bool,
    /// The interception library version the claim's spec mounts (kept while referenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lib_version: Option<String>,
    /// The pods the claim was reserved for when it was prepared (`status.reservedFor`):
    /// the watchdog maps a GPU process to its claim through its pod. Empty for a claim
    /// reserved for a PodGroup (its pods are found live, `watchdog::pods`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<PodRef>,
    /// Unix seconds when prepare started / completed.
    #[serde(default)]
    pub started_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<u64>,
}

/// A pod a claim is reserved for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    pub name: String,
    pub uid: String,
}

/// The whole checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    #[serde(default)]
    pub version: u32,
    #[serde(default)]
    pub boot_id: String,
    /// Keyed by claim UID.
    #[serde(default)]
    pub claims: BTreeMap<String, ClaimRecord>,
    /// GPU minors whose MIG mode Tessera switched on (and switches off again when their
    /// last MIG device goes).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub mig_enabled_by_tessera: BTreeSet<u32>,
}

impl Checkpoint {
    pub fn empty(boot_id: &str) -> Self {
        Checkpoint {
            version: SCHEMA_VERSION,
            boot_id: boot_id.into(),
            claims: BTreeMap::new(),
            mig_enabled_by_tessera: BTreeSet::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot read checkpoint {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write checkpoint {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What loading found, so the caller can log and clean up accordingly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    /// No checkpoint yet.
    Fresh,
    /// Read as is.
    Loaded,
    /// Written before the last reboot: discarded.
    OtherBoot { previous: String },
    /// Unparsable: moved aside to the given file and discarded.
    Corrupt { moved_to: PathBuf, reason: String },
}

/// The checkpoint file in a directory.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
}

impl CheckpointStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CheckpointStore { dir: dir.into() }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(CHECKPOINT_FILE)
    }

    /// Loads the checkpoint for this boot. Never fails on content: a checkpoint from
    /// another boot or one that does not parse yields an empty checkpoint (a corrupt one
    /// is kept aside for inspection). Fails only when the file exists but cannot be read.
    pub fn load(&self, boot_id: &str) -> Result<(Checkpoint, LoadOutcome), CheckpointError> {
        let path = self.path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((Checkpoint::empty(boot_id), LoadOutcome::Fresh));
            }
            Err(source) => return Err(CheckpointError::Read { path, source }),
        };
        match serde_json::from_slice::<Checkpoint>(&bytes) {
            Ok(cp) if cp.boot_id == boot_id => Ok((cp, LoadOutcome::Loaded)),
            Ok(cp) => Ok((
                Checkpoint::empty(boot_id),
                LoadOutcome::OtherBoot {
                    previous: cp.boot_id,
                },
            )),
            Err(e) => {
                let moved_to = self.dir.join(format!(
                    "{CHECKPOINT_FILE}.corrupt-{}",
                    crate::clock::unix_secs()
                ));
                std::fs::rename(&path, &moved_to).map_err(|source| CheckpointError::Write {
                    path: moved_to.clone(),
                    source,
                })?;
                Ok((
                    Checkpoint::empty(boot_id),
                    LoadOutcome::Corrupt {
                        moved_to,
                        reason: e.to_string(),
                    },
                ))
            }
        }
    }

    /// Atomically replaces the checkpoint on disk.
    pub fn store(&self, cp: &Checkpoint) -> Result<(), CheckpointError> {
        let write = |source| CheckpointError::Write {
            path: self.path(),
            source,
        };
        let bytes = serde_json::to_vec(cp).map_err(|e| write(std::io::Error::other(e)))?;
        tessera_cdi::atomic::write_atomic(&self.dir, CHECKPOINT_FILE, TEMP_FILE, &bytes)
            .map_err(write)
    }

    /// Removes a stray temp file left by a crash mid-write.
    pub fn sweep_temp(&self) {
        let _ = std::fs::remove_file(self.dir.join(TEMP_FILE));
    }
}

/// This boot's ID (`/proc/sys/kernel/random/boot_id` under `proc_root`); empty when
/// unavailable, which makes every checkpoint count as this boot's.
pub fn boot_id(proc_root: &Path) -> String {
    std::fs::read_to_string(proc_root.join("sys/kernel/random/boot_id"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The device kind of a prepared device, for labels.
pub fn device_kind(d: &PreparedDevice) -> &'static str {
    match (&d.mig, &d.budget, &d.share_id) {
        (Some(_), _, _) => "mig",
        (None, Some(_), Some(_)) => "shared",
        (None, Some(_), None) => "slot",
        (None, None, _) => "whole",
    }
}

/// A prepared claim's kind: the kind of its first device (claims mixing kinds are
/// labelled by that one).
pub fn claim_kind(devices: &[PreparedDevice]) -> &'static str {
    devices.first().map_or("whole", device_kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: ClaimState) -> ClaimRecord {
        ClaimRecord {
            state,
            namespace: "ns".into(),
            name: "c".into(),
            devices: vec![],
            cdi_spec: Some("tessera.dev-gpu-u1.json".into()),
            claim_files: false,
            metadata: false,
            lib_version: None,
            pods: Vec::new(),
            started_at: 1,
            completed_at: None,
        }
    }

    /// A stored checkpoint loads back identically in the same boot.
    #[test]
    fn checkpoint_round_trips_within_a_boot() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        let mut cp = Checkpoint::empty("boot-a");
        cp.claims
            .insert("u1".into(), record(ClaimState::PrepareCompleted));
        store.store(&cp).unwrap();
        let (back, outcome) = store.load("boot-a").unwrap();
        assert_eq!(outcome, LoadOutcome::Loaded);
        assert_eq!(back, cp);
    }

    /// After a reboot the checkpoint starts empty.
    #[test]
    fn another_boot_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        let mut cp = Checkpoint::empty("boot-a");
        cp.claims
            .insert("u1".into(), record(ClaimState::PrepareCompleted));
        store.store(&cp).unwrap();
        let (back, outcome) = store.load("boot-b").unwrap();
        assert!(back.claims.is_empty());
        assert!(matches!(outcome, LoadOutcome::OtherBoot { ref previous } if previous == "boot-a"));
    }

    /// A newer writer's unknown fields and states never stop the plugin.
    #[test]
    fn unknown_fields_and_states_are_tolerated() {
        let dir = tempfile::tempdir().unwrap();
        let text = r#"{"version": 7, "bootId": "b", "futureField": {"x": 1},
            "claims": {"u1": {"state": "PrepareValidating", "namespace": "n", "name": "c", "newThing": 3,
              "devices": [{"poolName": "p", "deviceName": "gpu-0", "laterField": true}]}}}"#;
        std::fs::write(dir.path().join(CHECKPOINT_FILE), text).unwrap();
        let (cp, outcome) = CheckpointStore::new(dir.path()).load("b").unwrap();
        assert_eq!(outcome, LoadOutcome::Loaded);
        assert_eq!(cp.claims["u1"].state, ClaimState::Unknown);
        assert_eq!(cp.claims["u1"].devices[0].device_name, "gpu-0");
    }

    /// A corrupt checkpoint is moved aside and the plugin starts empty (no crash loop).
    #[test]
    fn corrupt_checkpoint_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CHECKPOINT_FILE), b"{not json").unwrap();
        let store = CheckpointStore::new(dir.path());
        let (cp, outcome) = store.load("b").unwrap();
        assert!(cp.claims.is_empty());
        let LoadOutcome::Corrupt { moved_to, .. } = outcome else {
            panic!("{outcome:?}")
        };
        assert!(moved_to.exists());
        assert!(!store.path().exists());
    }
}
