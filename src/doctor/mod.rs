//! `tessera doctor`: checks that this node can run Tessera's claims, each with a
//! verdict (pass / warn / fail), what it saw and how to fix it.
//!
//! Every check is a pure function from what was seen (a plain struct) to
//! [`Finding`]s; the gathering is thin and lives beside it (`gather_*`). The files:
//! `node.rs` (driver root, driver, device nodes, driver files, directories, watchdog
//! prerequisites), `runtime.rs` (containerd and CRI-O applying CDI), `api.rs` (the API
//! server: reachability, RBAC, DRA features, other owners of the GPUs), `flags.rs`
//! (a bare `tessera doctor` in the plugin's container takes the plugin's flags),
//! `interception.rs` (the interception library on this host's glibc). [`run`] runs
//! them all in order and never stops early: a failing check is a finding.

pub mod api;
pub mod flags;
pub mod interception;
pub mod node;
pub mod runtime;

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use crate::driver_root::Layout;
use crate::node::NodeModel;
use crate::plugin::PluginOptions;

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Warn,
    Fail,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

/// One check's outcome: what it saw, and the fix when it is not a pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The check's name, e.g. `driver-files`.
    pub check: &'static str,
    pub verdict: Verdict,
    /// What the check saw, one line per fact.
    pub saw: Vec<String>,
    /// What to do; empty on a pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    pub fn pass(check: &'static str, saw: Vec<String>) -> Self {
        Finding {
            check,
            verdict: Verdict::Pass,
            saw,
            fix: None,
        }
    }
    pub fn warn(check: &'static str, saw: Vec<String>, fix: impl Into<String>) -> Self {
        Finding {
            check,
            verdict: Verdict::Warn,
            saw,
            fix: Some(fix.into()),
        }
    }
    pub fn fail(check: &'static str, saw: Vec<String>, fix: impl Into<String>) -> Self {
        Finding {
            check,
            verdict: Verdict::Fail,
            saw,
            fix: Some(fix.into()),
        }
    }
}

/// All findings of one run, in check order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub node: String,
    pub findings: Vec<Finding>,
}

impl Report {
    /// The worst verdict (a report without findings passes).
    pub fn worst(&self) -> Verdict {
        self.findings
            .iter()
            .map(|f| f.verdict)
            .max()
            .unwrap_or(Verdict::Pass)
    }

    /// The finding of `check`, if it ran.
    pub fn get(&self, check: &str) -> Option<&Finding> {
        self.findings.iter().find(|f| f.check == check)
    }

    /// Human-readable text: one block per check, then a summary line. Deterministic.
    pub fn render_text(&self) -> String {
        let mut out = format!("tessera doctor on node {}\n", self.node);
        for f in &self.findings {
            let _ = writeln!(out, "[{}] {}", f.verdict.as_str(), f.check);
            for s in &f.saw {
                let _ = writeln!(out, "    {s}");
            }
            if let Some(fix) = &f.fix {
                let _ = writeln!(out, "    fix: {fix}");
            }
        }
        let count = |v| self.findings.iter().filter(|f| f.verdict == v).count();
        let _ = writeln!(
            out,
            "{} passed, {} warned, {} failed",
            count(Verdict::Pass),
            count(Verdict::Warn),
            count(Verdict::Fail)
        );
        out
    }

    /// The report as pretty JSON (`-o json`). Deterministic.
    pub fn render_json(&self) -> String {
        #[derive(Serialize)]
        struct Out<'a> {
            node: &'a str,
            result: Verdict,
            findings: &'a [Finding],
        }
        serde_json::to_string_pretty(&Out {
            node: &self.node,
            result: self.worst(),
            findings: &self.findings,
        })
        .map(|s| s + "\n")
        .unwrap_or_else(|e| format!("{{\"error\": \"cannot render: {e}\"}}\n"))
    }
}

/// What `doctor` works from: the plugin's options (same flags), how the layout was
/// decided, the node as loaded (or why it did not load), and the API client (or why
/// there is none).
pub struct DoctorInput {
    pub opts: PluginOptions,
    pub host_root: PathBuf,
    /// Where the container runtime's process is looked for (its config flag): the
    /// host's `/proc` (`--proc-root`) in the plugin's pod.
    pub runtime_proc: PathBuf,
    pub layout: Layout,
    pub node: Result<NodeModel, String>,
    pub client: Result<kube::Client, String>,
}

/// Runs every check in order. Side effects: reads the host, loads NVML (through the
/// node already loaded), calls the API server (read-only and dry-run requests, plus
/// SelfSubjectAccessReviews), runs a child process for the interception library, and
/// creates and removes one probe file in each directory the plugin writes.
pub async fn run(input: &DoctorInput) -> Report {
    let mut findings = vec![
        node::check_driver_root(&input.layout),
        node::check_driver(&input.node),
    ];
    let model = input.node.as_ref().ok();
    let paths = &input.opts.paths;
    findings.push(node::check_device_nodes(&node::gather_device_nodes(
        &paths.dev_root,
        model,
    )));
    findings.push(node::check_driver_files(&node::gather_driver_files(
        &paths.driver_root,
        &paths.host_driver_root,
        model,
    )));
    findings.push(node::check_directories(&node::gather_directories(paths)));
    let api_seen = api::gather(input).await;
    findings.extend(api::check(&api_seen));
    findings.push(runtime::check(&runtime::gather(
        &input.host_root,
        &input.runtime_proc,
        &paths.cdi_dir,
        api_seen.runtime_version.clone(),
    )));
    findings.push(interception::check(&interception::gather(
        &input.host_root,
        input.opts.interception_lib.as_deref(),
    )));
    findings.push(node::check_watchdog(&node::gather_watchdog(
        &paths.proc_root,
        input.opts.watchdog,
    )));
    Report {
        node: input.opts.node_name.clone(),
        findings,
    }
}
