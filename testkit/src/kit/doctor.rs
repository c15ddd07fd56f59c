//! Doctor check: `tessera doctor -o json` on the bare host, judged on what the node
//! itself must have: the driver root found, the driver, its device nodes and files.
//! The checks about a cluster (API server, RBAC, container runtime, directories) cannot
//! pass on a bare host; they are listed, not judged.

use serde_json::Value;

use super::CheckReport;

/// The doctor checks a bare GPU host must pass (or only warn on).
pub const JUDGED: [&str; 4] = ["driver-root", "driver", "device-nodes", "driver-files"];

/// Judges a doctor report (its JSON). Deterministic.
pub fn judge(doc: &Value) -> CheckReport {
    let mut failures = Vec::new();
    let mut notes = Vec::new();
    let findings = doc["findings"].as_array().cloned().unwrap_or_default();
    let mut passed = 0;
    for check in JUDGED {
        match findings.iter().find(|f| f["check"] == check) {
            None => failures.push(format!("{check}: not in the doctor's report")),
            Some(f) if f["verdict"] == "fail" => {
                failures.push(format!("{check}: fail: {}", saw(f)))
            }
            Some(_) => passed += 1,
        }
    }
    for f in &findings {
        notes.push(format!(
            "{} {}: {}",
            f["check"].as_str().unwrap_or("?"),
            f["verdict"].as_str().unwrap_or("?"),
            saw(f)
        ));
    }
    let figure = format!(
        "{passed}/{} node checks pass (driver root, driver, device nodes, driver files); {} finding(s) in all",
        JUDGED.len(),
        findings.len()
    );
    CheckReport::from_findings("doctor", figure, failures, notes)
}

fn saw(f: &Value) -> String {
    f["saw"]
        .as_array()
        .map(|s| {
            s.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bare host fails the cluster checks; only the node's own four are judged.
    #[test]
    fn doctor_is_judged_on_the_node_checks_only() {
        let mut findings: Vec<Value> = JUDGED
            .iter()
            .map(|c| serde_json::json!({"check": c, "verdict": "pass", "saw": ["ok"]}))
            .collect();
        findings.push(serde_json::json!({"check": "rbac", "verdict": "fail", "saw": ["no API"]}));
        let doc = serde_json::json!({ "node": "n", "findings": findings });
        assert_eq!(judge(&doc).verdict, super::super::Verdict::Pass);
        let mut bad = doc.clone();
        bad["findings"][2]["verdict"] = "fail".into();
        assert_eq!(judge(&bad).verdict, super::super::Verdict::Fail);
    }
}
