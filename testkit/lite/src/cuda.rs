//! The real interception library (`tessera-interpose`), with its front, soname shims
//! and CDI hook beside it, built for the tests that load them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `libtessera_cuda.so` and what the plugin installs beside it (the front
/// library, the soname shims, `tessera-cdi-hook`) with the cargo running the tests,
/// into a target directory of its own under `target_tmpdir` (the caller's
/// `CARGO_TARGET_TMPDIR`): integration tests do not link a cdylib, and the outer target
/// directory is locked while tests run. Two builds, as `cargo build` then `cargo
/// preload` (.cargo/config.toml): the front and the shims have no std, and cargo builds
/// them only with panic=abort. `profile` is the output directory (`"debug"`, or
/// `"release"` with `--release` among `extra`, the further arguments of `cargo build`).
///
/// # Panics
/// When cargo cannot be run, a build fails (its stderr in the message) or the library
/// is missing after it.
pub fn interception_library(target_tmpdir: &Path, profile: &str, extra: &[&str]) -> PathBuf {
    let target = target_tmpdir.join("tessera-interpose-lib");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    build_shipped(&cargo, &["build"], &target, extra);
    let lib = target.join(profile).join("libtessera_cuda.so");
    assert!(lib.exists(), "{} missing after the build", lib.display());
    lib
}

/// The shipped files' two builds, as `cargo build` and `cargo preload`
/// (.cargo/config.toml) make them: the interception library and the CDI hook, then the
/// front and the soname shims, which have no std and build with panic=abort only.
const SHIPPED: [&[&str]; 2] = [
    &["-p", "tessera-interpose", "-p", "tessera-cdi-hook"],
    &[
        "--config",
        "profile.dev.panic='abort'",
        "--config",
        "profile.release.panic='abort'",
        "-p",
        "tessera-preload",
        "-p",
        "tessera-shim-cuda",
        "-p",
        "tessera-shim-nvml",
    ],
];

/// Runs both of the shipped files' builds (`program` `command`, e.g. `cargo build` or
/// `cargo-zigbuild zigbuild`, then `extra`) into `target_dir`, offline.
///
/// # Panics
/// When `program` cannot be run or a build fails (its stderr in the message).
pub fn build_shipped(program: &str, command: &[&str], target_dir: &Path, extra: &[&str]) {
    for packages in SHIPPED {
        let out = Command::new(program)
            .args(command)
            .arg("--offline")
            .args(packages)
            .arg("--manifest-path")
            .arg(crate::repo_root().join("Cargo.toml"))
            .arg("--target-dir")
            .arg(target_dir)
            .args(extra)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {command:?} {packages:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
