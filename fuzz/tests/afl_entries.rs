//! The AFL++ entries (`src/bin/*.rs`) compile against the library.
//!
//! `cargo afl build --features afl` (fuzz/run.sh) is the only build that links them:
//! it needs the AFL++ runtime, which CI does not build. So each entry's own file is
//! compiled here, as a module, with a stand-in for `afl::fuzz!` that demands what the
//! real macro does of its argument (an `FnMut(&[u8])`). A renamed or retyped target
//! fails this build, and CI's lints see the entries' code.

// `afl::fuzz!` in the entries resolves to this crate's `fuzz!`.
extern crate self as afl;

/// The stand-in: type-checks the entry's closure as afl 0.18's `fuzz!` takes it, and
/// runs nothing.
#[macro_export]
macro_rules! fuzz {
    ($closure:expr) => {{
        fn afl_entry<F: FnMut(&[u8])>(_: F) {}
        afl_entry($closure)
    }};
}

// Each entry's `main` is private to its file: compiled and checked here, never called.
#[allow(dead_code)]
#[path = "../src/bin/abi_files.rs"]
mod abi_files;
#[allow(dead_code)]
#[path = "../src/bin/cdi_spec.rs"]
mod cdi_spec;
#[allow(dead_code)]
#[path = "../src/bin/claim_plan.rs"]
mod claim_plan;
#[allow(dead_code)]
#[path = "../src/bin/node_config.rs"]
mod node_config;
#[allow(dead_code)]
#[path = "../src/bin/node_prepare.rs"]
mod node_prepare;
#[allow(dead_code)]
#[path = "../src/bin/plan.rs"]
mod plan;
#[allow(dead_code)]
#[path = "../src/bin/quantity_semver.rs"]
mod quantity_semver;

const ENTRIES: &[&str] = &[
    "abi_files",
    "cdi_spec",
    "claim_plan",
    "node_config",
    "node_prepare",
    "plan",
    "quantity_semver",
];

#[test]
fn every_afl_entry_is_compiled_here() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/bin");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .expect("src/bin is readable")
        .map(|e| {
            let name = e.expect("a directory entry").file_name();
            let name = name.to_str().expect("a UTF-8 file name");
            name.strip_suffix(".rs")
                .expect("only .rs files in src/bin")
                .to_owned()
        })
        .collect();
    on_disk.sort();
    let listed: Vec<&str> = ENTRIES.to_vec();
    assert_eq!(
        on_disk, listed,
        "every file of src/bin is an AFL++ entry compiled here (a `mod` and ENTRIES)"
    );
}
