//! The release artifact loads everywhere: built with cargo-zigbuild for glibc 2.17,
//! it needs no symbol version above GLIBC_2.17, lists only libc, libdl, libpthread and
//! the loader as NEEDED, and still enforces in a root filesystem without libgcc_s
//! (where ld.so would silently skip a preload that needs it). Needs `cargo-zigbuild`
//! on PATH, zig (a `zig` binary or PyPI `ziglang` in the `python3` on PATH) and `readelf`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;

const TARGET: &str = "x86_64-unknown-linux-gnu.2.17";

fn have(prog: &str, arg: &str) -> bool {
    Command::new(prog)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Builds the release library with cargo-zigbuild; `None` (skip) when the tools are
/// missing and CI is unset.
fn zig_library(test: &str) -> Option<PathBuf> {
    if !require(test) {
        return None;
    }
    // cargo-zigbuild finds zig itself (a `zig` binary, or `python3 -m ziglang`).
    let missing: Vec<&str> = [("cargo-zigbuild", "--version"), ("readelf", "--version")]
        .into_iter()
        .filter(|(p, a)| !have(p, a))
        .map(|(p, _)| p)
        .collect();
    if !missing.is_empty() {
        let why =
            format!("{missing:?} not on PATH (pip install ziglang; cargo install cargo-zigbuild)");
        if std::env::var_os("CI").is_some() {
            panic!("{test}: {why}");
        }
        skip(format!("{test}: {why}"));
        return None;
    }
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tessera-cuda-zig");
    let out = Command::new("cargo-zigbuild")
        .args([
            "zigbuild",
            "--offline",
            "--release",
            "--lib",
            "-p",
            "tessera-cuda",
            "--target",
            TARGET,
        ])
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .output()
        .expect("cargo-zigbuild");
    assert!(
        out.status.success(),
        "zigbuild failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(target_dir.join("x86_64-unknown-linux-gnu/release/libtessera_cuda.so"))
}

fn readelf(flag: &str, lib: &Path) -> String {
    let out = Command::new("readelf")
        .arg(flag)
        .arg(lib)
        .output()
        .expect("readelf");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// No symbol version above GLIBC_2.17, and only libc, libdl, libpthread and the loader
/// as NEEDED.
#[test]
fn the_release_library_needs_glibc_2_17_and_only_libc() {
    let Some(lib) = zig_library("glibc-2.17") else {
        return;
    };
    let versions = readelf("-V", &lib);
    let mut newest = (2, 0);
    for v in versions.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.')) {
        if let Some(n) = v.strip_prefix("GLIBC_") {
            let mut it = n.split('.').map(|x| x.parse::<u32>().unwrap_or(0));
            let ver = (it.next().unwrap_or(0), it.next().unwrap_or(0));
            newest = newest.max(ver);
        }
    }
    assert!(newest <= (2, 17), "needs GLIBC_{}.{}", newest.0, newest.1);
    let needed: Vec<String> = readelf("-d", &lib)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| {
            l.split('[')
                .nth(1)
                .map(|s| s.trim_end_matches(']').to_string())
        })
        .collect();
    let allowed = [
        "libc.so.6",
        "libdl.so.2",
        "libpthread.so.0",
        "ld-linux-x86-64.so.2",
    ];
    for n in &needed {
        assert!(allowed.contains(&n.as_str()), "NEEDED {n}: {needed:?}");
    }
}

/// With libgcc_s masked out of the root filesystem, the release library still loads
/// and refuses over budget. So does the plain cargo build since `build.rs` links the
/// unwinder statically (ld.so would silently skip a preload that needs libgcc_s, and
/// loading it cost every process of the container a second library).
#[test]
fn the_release_library_enforces_without_libgcc_s() {
    let Some(lib) = zig_library("no-libgcc_s") else {
        return;
    };
    let sb = Sandbox::new(
        &[(GPU0, 80 << 30)],
        vec![ClaimSpec::new("claim-a", &[(GPU0, 4 * MIB)])],
    );
    let dir = sb.dir.path().join("zig-lib");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::copy(&lib, dir.join("libtessera_cuda.so")).expect("copy");
    // An overlay of the library directory with libgcc_s deleted (a whiteout); the
    // script (set -e) stops if it is still there.
    let d = sb.dir.path().display();
    let mask = format!(
        "mkdir -p {d}/lib-upper {d}/lib-work\n\
         mount -t overlay overlay -o lowerdir=/lib/x86_64-linux-gnu,upperdir={d}/lib-upper,workdir={d}/lib-work /lib/x86_64-linux-gnu\n\
         rm -f /lib/x86_64-linux-gnu/libgcc_s.so.1\n\
         test ! -e /lib/x86_64-linux-gnu/libgcc_s.so.1\n"
    );
    let mut o = RunOpts {
        extra_script: mask.clone(),
        lib_dir: Some(dir),
        ..opts()
    };
    let out = sb.client(&o, &["ctx", "0", "alloc", "6291456"]);
    assert_eq!(out, ["ok", "err 2"], "the zig build did not enforce");
    // The plain build needs no libgcc_s either, and enforces there too.
    let plain = built_library();
    let needed = readelf("-d", &plain);
    assert!(!needed.contains("libgcc_s"), "plain build: {needed}");
    o.lib_dir = None;
    let out = sb.client(&o, &["ctx", "0", "alloc", "6291456"]);
    assert_eq!(out, ["ok", "err 2"], "the plain build did not enforce");
}
