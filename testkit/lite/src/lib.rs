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

/// Cargo's `CARGO_TARGET_TMPDIR` (`<target dir>/tmp`) for the running test or bench
/// binary, for a helper compiled outside it (cargo sets the variable only when it
/// compiles a test or bench): the binary lives in `<target dir>/[<triple>/]<profile>/
/// deps/`, and the target directory is the nearest one holding cargo's `CACHEDIR.TAG`.
///
/// # Panics
/// When the binary's path is unknown or not inside a cargo target directory.
pub fn target_tmpdir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the running binary's path");
    let target = exe
        .ancestors()
        .skip(1)
        .find(|d| d.join("CACHEDIR.TAG").is_file())
        .unwrap_or_else(|| panic!("{}: not in a cargo target directory", exe.display()));
    let tmp = target.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    tmp
}
