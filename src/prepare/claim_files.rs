//! The per-claim files of shared-GPU claims under `<run-dir>/claims/<uid>/`: `limits`,
//! `control` and `region` (formats in the `tessera-abi` crate and docs/design.md).
//! Rendering is pure; the directory is made and removed atomically by `claim_dir`
//! (each file fsynced at full size before the rename). A region still mapped by a
//! running process is unlinked like any file on removal: its pages live on until the
//! last mapping goes, and nothing here touches them.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tessera_abi::control::{self, GpuControl};
use tessera_abi::limits::Limits;
use tessera_abi::region;

use crate::prepare::claim_dir;
use crate::prepare::claim_plan::ClaimPlan;

/// Why a claim's files could not be rendered, written or removed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimFilesError {
    /// The claim's plan does not make valid files (no shared device, a budget the
    /// formats cannot hold).
    #[error("rendering the claim files: {0}")]
    Render(String),
    /// A filesystem call failed; `what` says which step, `path` where.
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// `claims/` under the run dir.
pub const CLAIMS_DIR: &str = "claims";

/// The rendered contents of a claim's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimFiles {
    pub limits: Limits,
    pub control: Vec<GpuControl>,
    /// The region's initial bytes (full size, zeroed counters).
    pub region: Vec<u8>,
}

/// Renders a shared claim's files: budgets summed per GPU UUID (sorted), `scrubOnFree`
/// if any shared device asks for it, and per GPU the compute share and the tightest
/// `computeLimit`. The block rate starts unthrottled (the compute controller sets it).
pub fn render(plan: &ClaimPlan) -> Result<ClaimFiles, ClaimFilesError> {
    let budgets = plan.budgets_by_uuid();
    if budgets.is_empty() {
        return Err(ClaimFilesError::Render(
            "the claim has no shared-GPU devices".into(),
        ));
    }
    let shared = plan.devices.iter().filter(|d| d.budget.is_some());
    let scrub = shared.clone().any(|d| d.config.scrub_on_free);
    let limits = Limits::merged(
        &plan.uid,
        scrub,
        budgets.iter().map(|(u, b)| (u.clone(), b.memory_bytes)),
    )
    .map_err(|e| ClaimFilesError::Render(format!("limits: {e}")))?;
    let control: Vec<GpuControl> = budgets
        .iter()
        .map(|(uuid, b)| GpuControl {
            uuid: uuid.clone(),
            share: b.compute_percent,
            compute_limit: shared
                .clone()
                .filter(|d| &d.gpu_uuid == uuid)
                .filter_map(|d| d.config.compute_limit)
                .map(u32::from)
                .min()
                .unwrap_or(100),
            block_rate: 0,
            burst_ns: 0,
            updates: 0,
        })
        .collect();
    control::initial_bytes(&control)
        .map_err(|e| ClaimFilesError::Render(format!("control: {e}")))?;
    let uuids: Vec<&str> = budgets.iter().map(|(u, _)| u.as_str()).collect();
    let region = region::initial_bytes(&uuids, region::DEFAULT_SLOTS)
        .map_err(|e| ClaimFilesError::Render(format!("region: {e}")))?;
    Ok(ClaimFiles {
        limits,
        control,
        region,
    })
}

/// `<run-dir>/claims/<uid>`.
pub fn claim_dir(run_dir: &Path, uid: &str) -> PathBuf {
    run_dir.join(CLAIMS_DIR).join(uid)
}

fn write_file(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let path = dir.join(name);
    let mut f = File::options().write(true).create_new(true).open(&path)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    // Explicit mode: the plugin's umask must not decide what containers may do.
    fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
    Ok(())
}

impl From<claim_dir::DirError> for ClaimFilesError {
    fn from(e: claim_dir::DirError) -> Self {
        ClaimFilesError::Io {
            what: e.what,
            path: e.path,
            source: e.source,
        }
    }
}

/// Creates `claims/<uid>` atomically with the rendered files. `limits` and `control`
/// are 0444 (mounted read-only; the plugin, as root, still updates `control`), the
/// region 0666 (containers may run as any user).
pub fn create(run_dir: &Path, uid: &str, files: &ClaimFiles) -> Result<PathBuf, ClaimFilesError> {
    let control = control::initial_bytes(&files.control)
        .map_err(|e| ClaimFilesError::Render(format!("control: {e}")))?;
    let root = run_dir.join(CLAIMS_DIR);
    Ok(claim_dir::create(
        &root,
        uid,
        "writing claim files in",
        |tmp| {
            write_file(
                tmp,
                tessera_abi::LIMITS_FILE,
                files.limits.render().as_bytes(),
                0o444,
            )?;
            write_file(tmp, tessera_abi::CONTROL_FILE, &control, 0o444)?;
            write_file(tmp, tessera_abi::REGION_FILE, &files.region, 0o666)
        },
    )?)
}

/// Removes `claims/<uid>` (idempotent): renamed aside first, so that a crash leaves
/// either the whole directory or a `.del` that start-up deletes.
pub fn remove(run_dir: &Path, uid: &str) -> Result<(), ClaimFilesError> {
    Ok(claim_dir::remove(&run_dir.join(CLAIMS_DIR), uid)?)
}

/// Removes every entry of `claims/` that is not the directory of a claim in `known`:
/// half-made, half-removed and orphaned directories. Returns what it removed.
pub fn sweep(run_dir: &Path, known: &BTreeSet<String>) -> Result<Vec<String>, ClaimFilesError> {
    Ok(claim_dir::sweep(&run_dir.join(CLAIMS_DIR), known)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::claim_plan::{Budget, PlannedDevice};
    use crate::prepare::gpu_config::GpuConfig;

    fn dev(uuid: &str, share: &str, mem: u64, compute: u32, cfg: GpuConfig) -> PlannedDevice {
        PlannedDevice {
            request: "r".into(),
            pool: "n".into(),
            device: "gpu-1".into(),
            share_id: Some(share.into()),
            gpu_minor: 1,
            gpu_uuid: uuid.into(),
            config: cfg,
            mig: None,
            budget: Some(Budget {
                memory_bytes: mem,
                compute_percent: compute,
            }),
        }
    }

    fn plan(devices: Vec<PlannedDevice>) -> ClaimPlan {
        ClaimPlan {
            uid: "u-1".into(),
            namespace: "ns".into(),
            name: "c".into(),
            devices,
        }
    }

    /// The same GPU twice: budgets and shares add up, the tightest computeLimit wins,
    /// scrub if any device asks.
    #[test]
    fn two_shares_of_one_gpu_sum() {
        let limited = GpuConfig {
            scrub_on_free: true,
            compute_limit: Some(30),
        };
        let f = render(&plan(vec![
            dev("GPU-b", "s1", 10 << 20, 10, GpuConfig::default()),
            dev("GPU-b", "s2", 5 << 20, 15, limited),
        ]))
        .unwrap();
        assert_eq!(
            f.limits.render(),
            format!(
                "tessera-limits 1\nclaim u-1\nscrub-on-free true\ngpu GPU-b {}\n",
                15u64 << 20
            )
        );
        assert_eq!((f.control[0].share, f.control[0].compute_limit), (25, 30));
        let snap = region::Snapshot::parse(&f.region).unwrap();
        assert_eq!(snap.gpus[0].uuid, "GPU-b");
        assert_eq!(snap.layout.slot_count, region::DEFAULT_SLOTS as usize);
    }

    /// Create writes the three files with their modes; remove and sweep leave nothing.
    #[test]
    fn create_remove_and_sweep() {
        let run = tempfile::tempdir().unwrap();
        let f = render(&plan(vec![dev(
            "GPU-a",
            "s",
            1 << 20,
            0,
            GpuConfig::default(),
        )]))
        .unwrap();
        let d = create(run.path(), "u-1", &f).unwrap();
        let mode = |n: &str| fs::metadata(d.join(n)).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            (mode("limits"), mode("control"), mode("region")),
            (0o444, 0o444, 0o666)
        );
        assert_eq!(
            fs::metadata(d.join("region")).unwrap().len() as usize,
            f.region.len()
        );
        // A second create replaces the directory (a retried prepare).
        create(run.path(), "u-1", &f).unwrap();
        fs::create_dir(run.path().join("claims/.u-2.tmp")).unwrap();
        fs::create_dir(run.path().join("claims/u-3")).unwrap();
        let mut swept = sweep(run.path(), &BTreeSet::from(["u-1".to_string()])).unwrap();
        swept.sort();
        assert_eq!(swept, [".u-2.tmp", "u-3"]);
        remove(run.path(), "u-1").unwrap();
        remove(run.path(), "u-1").unwrap();
        assert_eq!(fs::read_dir(run.path().join("claims")).unwrap().count(), 0);
    }
}
