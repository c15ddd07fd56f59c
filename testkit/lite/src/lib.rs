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
