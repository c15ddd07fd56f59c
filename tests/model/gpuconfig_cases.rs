//! The GpuConfig decoder against the shared case table `tests/data/gpuconfig-cases.yaml`.

use serde::Deserialize;
use tessera::prepare::gpu_config::{GpuConfig, decode};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    parameters: serde_json::Value,
    #[serde(default)]
    want: Option<GpuConfig>,
    #[serde(default)]
    error: Option<String>,
}

/// Every case decodes to its expected config, or fails naming its expected field.
#[test]
fn gpuconfig_cases_decode_as_tabled() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/gpuconfig-cases.yaml"
    ))
    .unwrap();
    let cases: Vec<Case> = serde_yaml_ng::from_str(&text).unwrap();
    assert!(cases.len() >= 10);
    for c in cases {
        let got = decode(&c.parameters);
        match (&c.want, &c.error) {
            (Some(want), None) => {
                let doc = got.unwrap_or_else(|e| panic!("{}: {e}", c.name));
                let eff = GpuConfig {
                    scrub_on_free: doc.scrub_on_free.unwrap_or(false),
                    compute_limit: doc.compute_limit.map(|l| l as u8),
                };
                assert_eq!(&eff, want, "{}", c.name);
            }
            (None, Some(field)) => {
                let e = got.expect_err(&c.name);
                assert_eq!(&e.field, field, "{}: {e}", c.name);
            }
            _ => panic!("{}: exactly one of want/error", c.name),
        }
    }
}
