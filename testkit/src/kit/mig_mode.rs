//! MIG mode for `tests/gpu/run.sh --allow-mig-changes`, the operator's full MIG
//! lifecycle: each MIG-capable GPU's mode as found ([`found`], written to a file that
//! run.sh's exit trap restores from), switched with Tessera's own backend
//! ([`switch`]: `GpuBackend::set_mig_mode`, which on NVML calls `nvmlDeviceSetMigMode`,
//! judges its activation status and refuses a change left pending a GPU reset), and put
//! back exactly ([`restore`]). Without that flag nothing here runs: the kit never changes
//! MIG mode otherwise.

use std::path::{Path, PathBuf};

use tessera::inventory::mock::StateAccess;
use tessera::inventory::{BackendError, GpuBackend};
use tessera::mig::MigError;
use tessera::node::open_backend;

use super::discovery::{NvmlProfiles, parse_kit_nvml_profiles};
use super::prepare::{PrepareSetup, mig};
use super::{CheckReport, Verdict};

/// Each MIG-capable GPU's MIG mode (minor, on), in minor order. Reads only.
///
/// # Errors
/// Discovery through the backend failed.
pub fn found(backend: &dyn GpuBackend) -> Result<Vec<(u32, bool)>, BackendError> {
    Ok(backend
        .discover()?
        .gpus
        .iter()
        .filter(|g| g.mig_capable)
        .map(|g| (g.minor, g.mig_enabled))
        .collect())
}

/// Modes as run.sh keeps them: `MINOR on|off` lines. Deterministic.
pub fn render(modes: &[(u32, bool)]) -> String {
    modes
        .iter()
        .map(|(m, on)| format!("{m} {}\n", if *on { "on" } else { "off" }))
        .collect()
}

/// Parses [`render`]'s lines. Deterministic.
///
/// # Errors
/// A line that is not `MINOR on|off`, naming it.
pub fn parse(text: &str) -> Result<Vec<(u32, bool)>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [m, mode @ ("on" | "off")] => m
                .parse()
                .map(|m| (m, mode == "on"))
                .map_err(|_| format!("not a GPU minor: {l:?}")),
            _ => Err(format!("not `MINOR on|off`: {l:?}")),
        })
        .collect()
}

/// How a switch of MIG mode ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Switch {
    /// The GPU is in the mode asked for (it may have been already).
    Done,
    /// The GPU cannot switch without a reset (a GPU before Hopper, an activation status
    /// of RESET_REQUIRED, or a change left pending): what it said, and whether the mode
    /// it had was put back (any pending change withdrawn). The kit never resets a GPU.
    NeedsReset {
        why: String,
        restored: Result<(), String>,
    },
    /// Any other failure, and whether the mode it had was put back.
    Failed {
        why: String,
        restored: Result<(), String>,
    },
}

/// An error with its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s += &format!(": {c}");
        cur = c.source();
    }
    s
}

/// Switches gpu `minor`'s MIG mode to `on` and checks that it took effect; on any
/// failure puts back the mode it had (which also withdraws a pending change). Owns
/// side effects: MIG mode. Never fails: the outcome says what happened.
pub fn switch(backend: &dyn GpuBackend, minor: u32, on: bool) -> Switch {
    let before = match backend.mig_status(minor) {
        Ok(s) => s.enabled,
        Err(e) => {
            return Switch::Failed {
                why: format!("reading its MIG mode: {}", chain(&e)),
                restored: Ok(()),
            };
        }
    };
    let (why, needs_reset) = match backend.set_mig_mode(minor, on) {
        Ok(()) => match backend.mig_status(minor) {
            Ok(s) if s.enabled == on => return Switch::Done,
            Ok(_) => ("the change did not take effect".to_string(), true),
            Err(e) => (format!("reading it back: {}", chain(&e)), false),
        },
        Err(e) => {
            let text = chain(&e);
            let reset = matches!(
                &e,
                BackendError::Mig {
                    source: MigError::NotSupported(_),
                    ..
                }
            ) || text.to_ascii_lowercase().contains("reset");
            (text, reset)
        }
    };
    let restored = put_back(backend, minor, before);
    if needs_reset {
        Switch::NeedsReset { why, restored }
    } else {
        Switch::Failed { why, restored }
    }
}

/// Sets gpu `minor` to `on` and checks it. Owns side effects: MIG mode.
fn put_back(backend: &dyn GpuBackend, minor: u32, on: bool) -> Result<(), String> {
    backend.set_mig_mode(minor, on).map_err(|e| chain(&e))?;
    match backend.mig_status(minor) {
        Ok(s) if s.enabled == on => Ok(()),
        Ok(_) => Err(format!(
            "still MIG {} after setting it back",
            if on { "off" } else { "on" }
        )),
        Err(e) => Err(chain(&e)),
    }
}

/// Puts every GPU of `modes` back in its mode where it differs now. A GPU found with
/// MIG off had no MIG device then, so any it has now was made during the run (by the
/// kit's MIG check, killed before it cleaned up): those are destroyed first (a device
/// still in use fails, and is reported). Returns one line per GPU, and whether every
/// one is as found. Owns side effects: MIG devices and mode.
pub fn restore(backend: &dyn GpuBackend, modes: &[(u32, bool)]) -> (Vec<String>, bool) {
    let mut lines = Vec::new();
    let mut all = true;
    for &(minor, on) in modes {
        let mode = if on { "on" } else { "off" };
        let now = backend.mig_status(minor);
        let outcome = match now {
            Ok(n) if n.enabled == on => Ok(format!("gpu-{minor}: MIG {mode}, as found")),
            Ok(n) if !on && !n.instances.is_empty() => {
                let destroyed: Result<Vec<String>, String> = n
                    .instances
                    .iter()
                    .map(|i| {
                        backend
                            .destroy_mig(minor, i.gi_id)
                            .map(|()| format!("GI {} (profile {})", i.gi_id, i.profile_id))
                            .map_err(|e| chain(&e))
                    })
                    .collect();
                destroyed.and_then(|d| {
                    put_back(backend, minor, on).map(|()| {
                        format!(
                            "gpu-{minor}: destroyed the MIG device(s) made during the run ({}), MIG switched back {mode}, as found",
                            d.join(", ")
                        )
                    })
                })
            }
            _ => put_back(backend, minor, on)
                .map(|()| format!("gpu-{minor}: MIG switched back {mode}, as found")),
        };
        match outcome {
            Ok(l) => lines.push(l),
            Err(e) => {
                all = false;
                lines.push(format!(
                    "gpu-{minor}: NOT as found: could not set MIG {mode} again: {e} (`nvidia-smi -i <index> -mig {}` once its MIG devices are gone)",
                    u8::from(on)
                ));
            }
        }
    }
    (lines, all)
}

/// The kit's NVML reader (`tests/gpu/progs/kit_nvml.c`), run as a child process.
#[derive(Debug, Clone)]
pub struct KitNvml {
    pub program: PathBuf,
    /// Where its `libnvidia-ml.so.1` is (`LD_LIBRARY_PATH`), when not the system's.
    pub lib_dir: Option<PathBuf>,
}

impl KitNvml {
    /// Runs `kit_nvml WHAT` and returns its stdout. Owns side effects: a process.
    ///
    /// # Errors
    /// It could not start or exited non-zero (its output in the error).
    pub fn run(&self, what: &str) -> Result<String, String> {
        let mut cmd = std::process::Command::new(&self.program);
        cmd.arg(what);
        if let Some(dir) = &self.lib_dir {
            cmd.env("LD_LIBRARY_PATH", dir);
        }
        let out = cmd
            .output()
            .map_err(|e| format!("{}: {e}", self.program.display()))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!(
                "kit_nvml {what}: {}: {}{}",
                out.status,
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

/// The GPUs of `kit_nvml mig-modes`'s output whose MIG mode change is pending (current
/// and pending differ: it waits for a GPU reset), described. Deterministic.
pub fn pending_changes(mig_modes: &str) -> Vec<String> {
    mig_modes
        .lines()
        .filter_map(|l| {
            let f: std::collections::BTreeMap<&str, &str> = l
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .collect();
            let (cur, pend) = (f.get("current")?, f.get("pending")?);
            (cur != pend).then(|| {
                format!(
                    "{} (index {}): MIG current {cur}, pending {pend}",
                    f.get("gpu").unwrap_or(&"?"),
                    f.get("index").unwrap_or(&"?")
                )
            })
        })
        .collect()
}

fn report(verdict: Verdict, figure: String, details: Vec<String>) -> CheckReport {
    CheckReport {
        check: "mig".into(),
        verdict,
        figure,
        details,
    }
}

/// The MIG check with `--allow-mig-changes` on a host whose GPUs have MIG mode off:
/// the full lifecycle an operator may run on their own machine. Refuses to change
/// anything while a MIG mode change is already pending (SKIP); records each
/// MIG-capable GPU's mode in `found_file` (run.sh's exit trap restores from it if this
/// process dies); switches MIG on where it is off ([`switch`]: a GPU that needs a reset
/// is a SKIP, its mode put back); reads NVML's MIG profiles (`kit_nvml`) for the
/// partitions' comparison; runs the MIG check ([`mig`]); and puts every GPU back in
/// the mode found ([`restore`]), whatever the check's outcome: a GPU not as found
/// fails the check. Owns side effects: MIG mode and instances. Never fails: what went
/// wrong is in the report.
pub async fn mig_lifecycle(
    setup: &PrepareSetup,
    workdir: &Path,
    found_file: &Path,
    kit_nvml: &KitNvml,
) -> CheckReport {
    let modes_text = match kit_nvml.run("mig-modes") {
        Ok(t) => t,
        Err(e) => return CheckReport::could_not_run("mig", format!("reading MIG modes: {e}")),
    };
    let pending = pending_changes(&modes_text);
    if !pending.is_empty() {
        return report(
            Verdict::Skip,
            format!(
                "--allow-mig-changes: a MIG mode change is already pending a GPU reset ({}): the kit changes nothing",
                pending.join("; ")
            ),
            pending,
        );
    }
    let backend = match open_backend(&setup.backend, &setup.backend_paths, StateAccess::ReadWrite) {
        Ok((b, _)) => b,
        Err(e) => return CheckReport::could_not_run("mig", format!("the backend: {}", chain(&e))),
    };
    let modes = match found(&*backend) {
        Ok(m) => m,
        Err(e) => return CheckReport::could_not_run("mig", format!("discovery: {}", chain(&e))),
    };
    if let Err(e) = std::fs::write(found_file, render(&modes)) {
        return CheckReport::could_not_run(
            "mig",
            format!("recording the MIG modes in {}: {e}", found_file.display()),
        );
    }
    if modes.is_empty() {
        return report(
            Verdict::Skip,
            "--allow-mig-changes: no MIG-capable GPU".into(),
            Vec::new(),
        );
    }
    let mut switched = Vec::new();
    for &(minor, on) in &modes {
        if on {
            continue;
        }
        let outcome = switch(&*backend, minor, true);
        if outcome == Switch::Done {
            switched.push(format!("gpu-{minor}"));
            continue;
        }
        let (lines, all) = restore(&*backend, &modes);
        let (verdict, what, why, restored) = match outcome {
            Switch::NeedsReset { why, restored } => (
                Verdict::Skip,
                "cannot switch MIG mode on without a GPU reset, which the kit never does",
                why,
                restored,
            ),
            Switch::Failed { why, restored } => {
                (Verdict::Fail, "switching MIG mode on failed", why, restored)
            }
            Switch::Done => unreachable!("handled above"),
        };
        let as_found = all && restored.is_ok();
        let mut details = vec![format!("gpu-{minor}: {why}")];
        if let Err(e) = restored {
            details.insert(0, format!("gpu-{minor}: putting its mode back failed: {e}"));
        }
        details.extend(lines);
        return report(
            if as_found { verdict } else { Verdict::Fail },
            format!(
                "--allow-mig-changes: gpu-{minor} {what}: {why}; {}",
                if as_found {
                    "every GPU's MIG mode as found"
                } else {
                    "a GPU is NOT as found (see details)"
                }
            ),
            details,
        );
    }
    let profiles: Result<NvmlProfiles, String> = kit_nvml
        .run("mig-profiles")
        .and_then(|t| parse_kit_nvml_profiles(&t));
    let mut r = match &profiles {
        Ok(p) => mig(setup, workdir, Some(p.clone())).await,
        Err(_) => mig(setup, workdir, None).await,
    };
    let (lines, all) = restore(&*backend, &modes);
    let mut failures = Vec::new();
    if let Err(e) = profiles {
        failures.push(format!("NVML's MIG profiles (kit_nvml): {e}"));
    }
    if !all {
        failures.extend(lines.iter().filter(|l| l.contains("NOT as found")).cloned());
    }
    r.figure = format!(
        "MIG mode switched on for the check ({}), then {}; {}",
        if switched.is_empty() {
            "none was off".to_string()
        } else {
            switched.join(", ")
        },
        if all {
            "every GPU as found"
        } else {
            "a GPU NOT as found"
        },
        r.figure
    );
    if !failures.is_empty() {
        r.verdict = Verdict::Fail;
    }
    failures.append(&mut r.details);
    failures.extend(lines);
    r.details = failures;
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera::inventory::mock::{MockBackend, MockNode, StateAccess};

    fn backend(dir: &std::path::Path, product: &str) -> MockBackend {
        let mut text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/gpu/sim-node.yaml"
        ))
        .unwrap();
        text = text.replace("NVIDIA H100 80GB HBM3", product);
        let file = dir.join("node.yaml");
        std::fs::write(&file, text).unwrap();
        MockBackend::new(
            MockNode::from_file(&file).unwrap(),
            dir.join("state"),
            StateAccess::ReadWrite,
        )
    }

    /// The found modes round-trip through run.sh's file; a bad line is refused by name.
    #[test]
    fn found_modes_round_trip_through_their_file() {
        let modes = vec![(0, false), (3, true)];
        assert_eq!(render(&modes), "0 off\n3 on\n");
        assert_eq!(parse(&render(&modes)).unwrap(), modes);
        assert!(parse("0 maybe\n").unwrap_err().contains("0 maybe"));
        assert!(parse("x on\n").unwrap_err().contains("not a GPU minor"));
    }

    /// A reset-free GPU (H100) switches on, and restore puts it back off: as found.
    #[test]
    fn a_reset_free_gpu_switches_on_and_is_restored_as_found() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path(), "NVIDIA H100 80GB HBM3");
        let modes = found(&b).unwrap();
        assert_eq!(modes, [(0, false)]);
        assert_eq!(switch(&b, 0, true), Switch::Done);
        assert!(b.mig_status(0).unwrap().enabled);
        let (lines, ok) = restore(&b, &modes);
        assert!(ok, "{lines:?}");
        assert_eq!(lines, ["gpu-0: MIG switched back off, as found"]);
        assert_eq!(found(&b).unwrap(), modes);
        // Restoring again changes nothing.
        assert_eq!(restore(&b, &modes).0, ["gpu-0: MIG off, as found"]);
    }

    /// A GPU that needs a reset to switch (A100) is reported as such, and left as it
    /// was.
    #[test]
    fn a_gpu_that_needs_a_reset_is_reported_and_left_as_found() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path(), "NVIDIA A100-SXM4-80GB");
        match switch(&b, 0, true) {
            Switch::NeedsReset { why, restored } => {
                assert!(why.contains("reset"), "{why}");
                assert_eq!(restored, Ok(()));
            }
            other => panic!("{other:?}"),
        }
        assert!(!b.mig_status(0).unwrap().enabled);
    }

    /// A GPU whose current and pending MIG modes differ is named; others are not.
    #[test]
    fn pending_mig_changes_are_found_by_gpu() {
        let text = "gpu=GPU-a index=0 current=0 pending=0\ngpu=GPU-b index=1 current=0 pending=1\ngpu=GPU-c index=2 mig=none\n";
        assert_eq!(
            pending_changes(text),
            ["GPU-b (index 1): MIG current 0, pending 1"]
        );
    }

    /// A MIG device left by a killed check on a GPU found with MIG off is destroyed,
    /// and MIG mode put back off.
    #[test]
    fn restore_destroys_devices_made_during_the_run_on_a_gpu_found_off() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path(), "NVIDIA H100 80GB HBM3");
        let modes = found(&b).unwrap();
        assert_eq!(switch(&b, 0, true), Switch::Done);
        b.create_mig(0, 19, 0).unwrap();
        let (lines, ok) = restore(&b, &modes);
        assert!(ok, "{lines:?}");
        assert!(
            lines[0].contains("destroyed the MIG device(s)"),
            "{lines:?}"
        );
        assert_eq!(found(&b).unwrap(), modes);
        assert!(b.mig_status(0).unwrap().instances.is_empty());
    }
}
