//! The test kit's dependency-light half, for the tests of crates that must not wait
//! for the plugin's build: `tessera-cdi`, `tessera-interpose` and the real-cluster crate
//! (`tests/cluster`). `testkit` re-exports it; nothing here is written twice.
//!
//! * [`prereq`]: whether a run is CI's ([`prereq::in_ci`]), the skip-or-fail rule for
//!   a missing prerequisite, and the suites' progress lines (std and libc only);
//! * [`cuda`]: the real interception library, built for the tests that load it;
//! * [`sys`]: the few libc calls the test kit makes, behind safe functions;
//! * `cdi` (feature `cdi`): the CDI JSON schema validator and a realistic GPU spec.

pub mod cuda;
pub mod prereq;
pub mod sys;

#[cfg(feature = "cdi")]
pub mod cdi;

/// The repository's root (this crate lives in `testkit/lite`).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A stand-in for cargo's `CARGO_TARGET_TMPDIR` for the running test or bench binary,
/// for a helper compiled outside it (cargo sets the variable only when it compiles a
/// test or bench): `tmp/` beside the binary's profile directory, the binary being
/// `<target dir>/[<triple>/]<profile>/deps/<name>`. Inside the target directory, so
/// that `cargo clean` removes what tests leave there.
///
/// # Panics
/// When the binary's path is unknown or too short, or the directory cannot be made.
pub fn target_tmpdir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the running binary's path");
    let base = exe
        .ancestors()
        .nth(3)
        .unwrap_or_else(|| panic!("{}: not in a cargo target directory", exe.display()));
    let tmp = base.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    tmp
}
