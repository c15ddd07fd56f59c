//! Replays every committed seed and every regression input (`fuzz/corpus/<target>/`,
//! `fuzz/regressions/<target>/`) through its target, so `cargo test --workspace` runs
//! them without the fuzzer. `cargo run -p tessera-fuzz --example write_seeds`
//! regenerates the seed corpora from the examples.

use std::path::{Path, PathBuf};

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 7] = [
    ("claim_plan", tessera_fuzz::claim_plan),
    ("node_prepare", tessera_fuzz::node_prepare),
    ("node_config", tessera_fuzz::node_config),
    ("plan", tessera_fuzz::plan),
    ("abi_files", tessera_fuzz::abi_files),
    ("cdi_spec", tessera_fuzz::cdi_spec),
    ("quantity_semver", tessera_fuzz::quantity_semver),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// Every seed and regression input passes its target's checks.
#[test]
fn corpora_and_regressions_pass() {
    let mut n = 0;
    for (name, target) in TARGETS {
        for dir in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root().join(dir).join(name)) else {
                continue;
            };
            for e in entries.flatten() {
                let data = std::fs::read(e.path()).unwrap();
                target(&data);
                n += 1;
            }
        }
        assert!(
            root().join("corpus").join(name).is_dir(),
            "{name} has no seed corpus"
        );
    }
    assert!(n >= TARGETS.len());
}
