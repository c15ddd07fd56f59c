//! What a ClusterRole allows, read from the shipped manifests, so tests can check that
//! the plugin's requests stay within the RBAC it is installed with.

use std::path::Path;

use serde::Deserialize;

/// `(apiGroup, resource, verb)` triples the ClusterRoles in the YAML file `manifest`
/// allow, expanded rule by rule. Panics on an unreadable or malformed file (a test's
/// fixture).
pub fn allowed_by_cluster_role(manifest: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(manifest)
        .unwrap_or_else(|e| panic!("reading {}: {e}", manifest.display()));
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = serde_yaml_ng::Value::deserialize(doc).expect("a YAML document");
        if v["kind"] != "ClusterRole" {
            continue;
        }
        for rule in v["rules"].as_sequence().expect("rules") {
            let list = |k: &str| -> Vec<String> {
                rule[k]
                    .as_sequence()
                    .expect("a list")
                    .iter()
                    .map(|x| x.as_str().expect("a string").to_string())
                    .collect()
            };
            for g in list("apiGroups") {
                for r in list("resources") {
                    for verb in list("verbs") {
                        out.push((g.clone(), r.clone(), verb));
                    }
                }
            }
        }
    }
    out
}
