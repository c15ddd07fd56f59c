//! The real interception library (`tessera-cuda`), built for the tests that load it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `libtessera_cuda.so` with the cargo running the tests, into a target
/// directory of its own under `target_tmpdir` (the caller's `CARGO_TARGET_TMPDIR`):
/// integration tests do not link a cdylib, and the outer target directory is locked
/// while tests run. `profile` is the output directory (`"debug"`, or `"release"` with
/// `--release` among `extra`, the further arguments of `cargo build`).
///
/// # Panics
/// When cargo cannot be run, the build fails (its stderr in the message) or the library
/// is missing after it.
pub fn interception_library(target_tmpdir: &Path, profile: &str, extra: &[&str]) -> PathBuf {
    let target = target_tmpdir.join("tessera-cuda-lib");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args([
            "build",
            "--offline",
            "--lib",
            "-p",
            "tessera-cuda",
            "--manifest-path",
        ])
        .arg(crate::repo_root().join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cargo}: {e}"));
    assert!(
        out.status.success(),
        "building the library failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lib = target.join(profile).join("libtessera_cuda.so");
    assert!(lib.exists(), "{} missing after the build", lib.display());
    lib
}
