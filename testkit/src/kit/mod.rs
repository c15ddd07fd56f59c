//! The GPU acceptance kit's Rust half (`tessera-kit`, driven by `tests/gpu/run.sh`): the
//! checks that need the plugin's own code, each returning a [`CheckReport`] that the
//! script prints in its verdict table and writes to its JSON.
//!
//! * [`discovery`]: what the NVML backend finds against a reference (`nvidia-smi -q -x`
//!   on a real host, the simulated node's own state otherwise), and with MIG on the MIG
//!   partitions published against NVML's profiles (`kit_nvml mig-profiles`);
//! * [`prepare`]: a whole-GPU claim and two shared claims through the plugin's gRPC, with
//!   the fake API server and the kubelet stand-in, as the demo does, on `--backend nvml`;
//!   on a GPU in MIG mode one MIG claim held, and the MIG check;
//! * [`mig_mode`]: `--allow-mig-changes`, the operator's MIG lifecycle (MIG mode
//!   switched on for the MIG check and back to the mode found);
//! * [`sim_host`]: the simulated node the kit runs against in CI (`--simulated`).

pub mod discovery;
pub mod doctor;
pub mod mig_mode;
pub mod prepare;
pub mod sim_host;

use serde::Serialize;

/// A check's verdict, as the verdict table prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    /// The check ran and its invariant held.
    Pass,
    /// The check ran and its invariant did not hold (or it could not run).
    Fail,
    /// The check does not apply to this host (e.g. MIG mode off).
    Skip,
}

/// One check's outcome: its verdict, a one-line figure and the details behind it.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub check: String,
    pub verdict: Verdict,
    /// The figure printed in the table, e.g. `1 GPU; 6 fields equal`.
    pub figure: String,
    /// Every finding, failed ones first.
    pub details: Vec<String>,
}

impl CheckReport {
    /// A report whose verdict is `Fail` when any of `failures` exists, else `Pass`.
    /// Deterministic.
    pub fn from_findings(
        check: &str,
        figure: String,
        failures: Vec<String>,
        notes: Vec<String>,
    ) -> Self {
        let verdict = if failures.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Fail
        };
        let mut details = failures;
        details.extend(notes);
        CheckReport {
            check: check.into(),
            verdict,
            figure,
            details,
        }
    }

    /// A failed report for a check that could not run at all.
    pub fn could_not_run(check: &str, why: String) -> Self {
        CheckReport {
            check: check.into(),
            verdict: Verdict::Fail,
            figure: format!("could not run: {why}"),
            details: vec![why],
        }
    }
}

/// A CDI spec's container edits as `tests/gpu/sandbox.sh` applies them, one per line:
/// `mount HOST CONTAINER OPTIONS` (comma-separated, `-` for none), `env KEY=VALUE`; the spec's own edits first, then each
/// device's. Deterministic.
pub fn sandbox_edits(spec: &serde_json::Value) -> String {
    let mut edits = vec![&spec["containerEdits"]];
    if let Some(devs) = spec["devices"].as_array() {
        edits.extend(devs.iter().map(|d| &d["containerEdits"]));
    }
    let mut out = String::new();
    for e in edits {
        for m in e["mounts"].as_array().into_iter().flatten() {
            let (Some(h), Some(c)) = (m["hostPath"].as_str(), m["containerPath"].as_str()) else {
                continue;
            };
            let opts: Vec<&str> = m["options"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|o| o.as_str())
                .collect();
            let opts = if opts.is_empty() {
                "-".to_string()
            } else {
                opts.join(",")
            };
            out += &format!("mount {h} {c} {opts}\n");
        }
        for v in e["env"].as_array().into_iter().flatten() {
            if let Some(v) = v.as_str() {
                out += &format!("env {v}\n");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sandbox gets the spec's mounts with their options and its environment, the
    /// spec's own edits before its devices'.
    #[test]
    fn sandbox_edits_list_mounts_with_options_then_env() {
        let spec = serde_json::json!({
            "containerEdits": {
                "mounts": [{"hostPath": "/h/lib", "containerPath": "/c/lib", "options": ["ro", "bind"]}],
                "env": ["A=1"]
            },
            "devices": [{"name": "d", "containerEdits": {
                "mounts": [{"hostPath": "/h/limits", "containerPath": "/c/limits"}]
            }}]
        });
        assert_eq!(
            sandbox_edits(&spec),
            "mount /h/lib /c/lib ro,bind\nenv A=1\nmount /h/limits /c/limits -\n"
        );
    }

    /// A report fails exactly when it has a failure; notes follow the failures.
    #[test]
    fn reports_fail_on_any_failure() {
        let ok = CheckReport::from_findings("c", "f".into(), vec![], vec!["note".into()]);
        assert_eq!(ok.verdict, Verdict::Pass);
        let bad =
            CheckReport::from_findings("c", "f".into(), vec!["bad".into()], vec!["note".into()]);
        assert_eq!(bad.verdict, Verdict::Fail);
        assert_eq!(bad.details, ["bad", "note"]);
    }
}
