//! What the build scripts of the front library (`tessera-preload`) and the soname
//! shims (`tessera-shim-cuda`, `tessera-shim-nvml`) tell cargo about linking them.
//! Only link arguments: cargo and rustc build the libraries themselves.

use std::path::{Path, PathBuf};
use std::process::Command;

/// No C start files (crti/crtn, crtbeginS/crtendS): their `_init`, `_fini`,
/// `frame_dummy` and `__do_global_dtors_aux` would run at load and at exit in every
/// process the library is preloaded into. The library has no C++ constructors, and the
/// linker defines `__dso_handle` itself.
pub fn no_start_files() {
    println!("cargo::rustc-cdylib-link-arg=-nostartfiles");
}

/// Gives the library `soname` as its DT_SONAME.
pub fn soname(soname: &str) {
    println!("cargo::rustc-cdylib-link-arg=-Wl,-soname,{soname}");
}

/// Makes the library NEED the file at `path` (an absolute path, which ld.so then
/// opens as it is): links a stand-in library whose DT_SONAME is `path`, built with the
/// linker cargo uses for the target (`RUSTC_LINKER`, else `CC`, else `cc`) from no
/// source at all.
///
/// # Panics
/// When the linker cannot be run or fails: a build script's way to fail the build.
pub fn needed(path: &str) {
    assert!(path.starts_with('/'), "{path}: not an absolute path");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let stub = out.join("libneeded-stub.so");
    let linker = std::env::var("RUSTC_LINKER")
        .or_else(|_| std::env::var("CC"))
        .unwrap_or_else(|_| "cc".into());
    println!("cargo::rerun-if-env-changed=RUSTC_LINKER");
    println!("cargo::rerun-if-env-changed=CC");
    let empty = out.join("empty.c");
    write(&empty, "");
    let res = Command::new(&linker)
        .args(["-shared", "-nostdlib", "-o"])
        .arg(&stub)
        .arg(format!("-Wl,-soname,{path}"))
        .arg(&empty)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the linker {linker}: {e}"));
    assert!(
        res.status.success(),
        "{linker} could not link the stand-in for {path}:\n{}",
        String::from_utf8_lossy(&res.stderr)
    );
    // rustc links with --as-needed: the stand-in defines nothing the library uses.
    println!("cargo::rustc-cdylib-link-arg=-Wl,--no-as-needed");
    println!("cargo::rustc-cdylib-link-arg={}", stub.display());
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}
