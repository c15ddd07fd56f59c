//! The shared CDI schema's example files, as a specification of what counts as a
//! valid spec: good files pass both the JSON schema and our validation, bad files
//! fail at least one of them.

use serde_json::Value;
use testkit_lite::cdi::{schema_errors, schema_validator, testdata};

/// Every file in testdata/good is valid under the JSON schema and under our
/// strict, version and semantic validation.
#[test]
fn every_good_example_passes_the_schema_and_our_validation() {
    let validator = schema_validator();
    for path in testdata("good") {
        let text = std::fs::read_to_string(&path).unwrap();
        let json: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let errors = schema_errors(&validator, &json);
        assert!(
            errors.is_empty(),
            "{}: schema errors {errors:?}",
            path.display()
        );
        if let Err(e) = tessera_cdi::validate_json(&json) {
            panic!("{}: refused by our validation: {e} ({e:?})", path.display());
        }
    }
}

/// Every file in testdata/bad fails to parse, fails the JSON schema, or fails our
/// validation.
#[test]
fn every_bad_example_fails_the_schema_or_our_validation() {
    let validator = schema_validator();
    for path in testdata("bad") {
        let text = std::fs::read_to_string(&path).unwrap();
        let Ok(json) = serde_json::from_str::<Value>(&text) else {
            continue; // not even JSON: no runtime loads it
        };
        let schema_ok = schema_errors(&validator, &json).is_empty();
        let ours_ok = tessera_cdi::validate_json(&json).is_ok();
        assert!(
            !(schema_ok && ours_ok),
            "{} was accepted by both",
            path.display()
        );
    }
}

/// The schema validator really resolves `defs.json`: a device node without `path`
/// (a rule that lives only in defs.json) is refused.
#[test]
fn schema_references_into_defs_are_enforced() {
    let validator = schema_validator();
    let spec = serde_json::json!({
        "cdiVersion": "0.5.0", "kind": "vendor.com/gpu",
        "devices": [{"name": "gpu0", "containerEdits": {"deviceNodes": [{"hostPath": "/dev/x"}]}}]
    });
    let errors = schema_errors(&validator, &spec);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("deviceNodes/0") && e.contains("path")),
        "{errors:?}"
    );
}
