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

/// A plan input's first line names the server it is planned for, as `tessera plan
/// --k8s-version --gates` does; an input without one is planned for the newest release.
#[test]
fn a_gates_line_picks_the_server_a_plan_input_is_planned_for() {
    use k8s_model::release::KubeVersion;
    use tessera_fuzz::plan_gates;
    let newest = plan_gates("apiVersion: resource.k8s.io/v1\n").unwrap();
    assert_eq!(newest.version(), KubeVersion::NEWEST);
    let old = plan_gates("# gates: 1.34\n---\n").unwrap();
    assert_eq!(old.version(), KubeVersion::OLDEST);
    assert!(!old.consumable_capacity() && !old.partitionable_devices());
    let alpha =
        plan_gates("# gates: 1.34 DRAPartitionableDevices=true,DRAConsumableCapacity=true\n")
            .unwrap();
    assert!(alpha.consumable_capacity() && alpha.partitionable_devices());
    assert_eq!(
        plan_gates("# gates: v1.35.2\n").unwrap().version(),
        KubeVersion::new(35).unwrap()
    );
    for unknown in [
        "# Gates: 1.34\n",
        "#gates 1.34\n",
        "# gates: 1.33\n",
        "# gates: 2.36\n",
        "# gates: 1.36 NoSuchGate=true\n",
        "# gates: 1.36 DRAConsumableCapacity=maybe\n",
    ] {
        assert!(plan_gates(unknown).is_none(), "{unknown:?} accepted");
    }
}

/// The plan seeds cover every release the model knows, so the fuzzer starts from each
/// server's slices: fallback slots where partitionable devices and consumable capacity
/// are off (the defaults of 1.34 and 1.35), counters in the devices' slices on 1.34
/// with those gates on, counter sets in slices of their own from 1.35 with them on.
#[test]
fn the_plan_seeds_cover_every_release() {
    use k8s_model::release::KubeVersion;
    let seeds: Vec<String> = std::fs::read_dir(root().join("corpus/plan"))
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    for v in KubeVersion::ALL {
        let header = format!("# gates: {v}\n");
        assert!(
            seeds.iter().any(|s| s.starts_with(&header)),
            "no plan seed for {v}"
        );
    }
}
