//! Installing the interception library into the run dir, which containers of shared
//! claims mount: `<run-dir>/lib/<version>/` holding `libtessera_cuda.so`, the front
//! library `libtessera_preload.so` (built beside it) and the one-line `ld.so.preload`
//! naming the front's container path, which a claim's spec mounts at
//! `/etc/ld.so.preload`. The front is what every process of the container loads; it
//! loads the interception library at the first CUDA call (`cuda/front`).
//!
//! Beside them, the soname shims `libtessera_shim_cuda.so` and
//! `libtessera_shim_nvml.so` (the front built as Tessera's `libcuda.so.1` and
//! `libnvidia-ml.so.1`: `cuda/shim-cuda`, `cuda/shim-nvml`): a spec mounts them at the
//! driver's own paths and the real driver files at [`CONTAINER_DRIVER_DIR`], so that a
//! program that loads the driver by soname gets Tessera's library first even when
//! `ld.so.preload` is skipped (`cdi_spec.rs`). `cargo preload` builds the front and the
//! shims beside the library (.cargo/config.toml says why they build apart).
//!
//! And `tessera-cdi-hook`, the `createContainer` hook every shared claim's spec runs
//! (`cuda/cdi-hook`): it makes [`PINNED_DIRS`] mount points, which a tenant without
//! `CAP_SYS_ADMIN` cannot rename, so `/etc/ld.so.preload` and the front are always
//! where ld.so looks.
//!
//! The preload file lives in the version directory so that a spec always mounts a pair
//! that agrees. Specs written before the front existed mount `<run-dir>/ld.so.preload`
//! beside an older library directory (no front): that file keeps naming
//! `libtessera_cuda.so`, which every version has and which also works preloaded
//! directly, so their new containers stay enforced after an upgrade.
//!
//! The version is the crate version plus a content hash, so an upgraded plugin installs
//! beside the old library instead of replacing a file that running containers have
//! mapped. Installation is atomic (a `.tmp` directory renamed into place); versions no
//! prepared claim references are removed at start-up and after each unprepare.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The library's file name, in the run dir and in containers.
pub const LIB_FILE: &str = "libtessera_cuda.so";
/// The front library's file name: beside `--interception-lib`, in the run dir and in
/// containers; what `ld.so.preload` names.
pub const FRONT_FILE: &str = "libtessera_preload.so";
/// Where the library directory is mounted in containers (read-only). The shims load
/// the interception library from here (a path built into them).
pub const CONTAINER_LIB_DIR: &str = "/usr/local/tessera/lib";
/// The soname shims' file names: beside `--interception-lib`, in the run dir.
pub const SHIM_CUDA_FILE: &str = "libtessera_shim_cuda.so";
pub const SHIM_NVML_FILE: &str = "libtessera_shim_nvml.so";
/// Where the real driver libraries are mounted (read-only) in a container whose
/// sonames are the shims'. Each shim NEEDs its file here by absolute path (built into
/// it); the names are no sonames, so no search by soname finds the real files.
pub const CONTAINER_DRIVER_DIR: &str = "/usr/local/tessera/driver";
/// The driver's sonames the shims take, each with its shim and its real file's name
/// in [`CONTAINER_DRIVER_DIR`].
pub const SHIMMED: [(&str, &str, &str); 2] = [
    ("libcuda.so.1", SHIM_CUDA_FILE, "libcuda.real"),
    ("libnvidia-ml.so.1", SHIM_NVML_FILE, "libnvidia-ml.real"),
];
/// The hook executable's file name: beside `--interception-lib`, in the run dir. The
/// runtime runs it on the host, from there.
pub const HOOK_FILE: &str = "tessera-cdi-hook";
/// The container directories the hook pins (makes mount points, outer first): `/etc`,
/// which holds `ld.so.preload`, and every directory above [`CONTAINER_LIB_DIR`] and
/// [`CONTAINER_DRIVER_DIR`]. Renaming any of them would make ld.so skip the front, or
/// let the tenant put its own file where the front or a shim's real driver is named.
pub const PINNED_DIRS: [&str; 4] = ["/etc", "/usr", "/usr/local", "/usr/local/tessera"];
/// `lib/` under the run dir.
pub const LIB_DIR: &str = "lib";
/// `<run-dir>/lib/<version>/ld.so.preload`, mounted at `/etc/ld.so.preload`; and the
/// older plugins' `<run-dir>/ld.so.preload` ([`legacy_preload_contents`]).
pub const PRELOAD_FILE: &str = "ld.so.preload";

/// An installed library version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledLib {
    /// `<crate version>-<first 12 hex digits of sha256>`.
    pub version: String,
    /// `<run-dir>/lib/<version>`.
    pub dir: PathBuf,
}

/// Why installing failed.
#[derive(Debug, thiserror::Error)]
#[error("installing the interception library from {source_path}: {what}")]
pub struct InstallError {
    pub source_path: PathBuf,
    pub what: String,
}

/// The contents of a version's `ld.so.preload`: the front library.
pub fn preload_contents() -> String {
    format!("{CONTAINER_LIB_DIR}/{FRONT_FILE}\n")
}

/// The contents of `<run-dir>/ld.so.preload`, which specs of plugins before the front
/// library mount: the interception library itself, present in every version.
pub fn legacy_preload_contents() -> String {
    format!("{CONTAINER_LIB_DIR}/{LIB_FILE}\n")
}

/// The version name of the pair of libraries with these bytes.
pub fn version_of(lib: &[u8], front: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update((lib.len() as u64).to_le_bytes());
    h.update(lib);
    h.update(front);
    let digest = h.finalize();
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{hex}", env!("CARGO_PKG_VERSION"))
}

/// Installs `source` (an ELF shared object), the front library, the two soname
/// shims and the CDI hook beside it and their `ld.so.preload` into `<run_dir>/lib/<version>/` unless
/// that version is already there, and (re)writes the legacy `<run_dir>/ld.so.preload`.
/// Both atomic. A build without its front, shims or hook is refused.
pub fn install(run_dir: &Path, source: &Path) -> Result<InstalledLib, InstallError> {
    let fail = |what: String| InstallError {
        source_path: source.to_path_buf(),
        what,
    };
    let bytes = fs::read(source).map_err(|e| fail(e.to_string()))?;
    if !bytes.starts_with(b"\x7fELF") {
        return Err(fail("not an ELF file".into()));
    }
    let beside = |file: &str, what: &str| -> Result<Vec<u8>, InstallError> {
        let path = source.with_file_name(file);
        let b = fs::read(&path).map_err(|e| {
            fail(format!(
                "{what} {} (built beside it by `cargo preload`, or `cargo build` for \
                     the CDI hook): {e}",
                path.display()
            ))
        })?;
        if !b.starts_with(b"\x7fELF") {
            return Err(fail(format!("{}: not an ELF file", path.display())));
        }
        Ok(b)
    };
    let front = beside(FRONT_FILE, "the front library")?;
    let shims = [
        beside(SHIM_CUDA_FILE, "the soname shim")?,
        beside(SHIM_NVML_FILE, "the soname shim")?,
    ];
    let hook = beside(HOOK_FILE, "the CDI hook")?;
    let mut together = front.clone();
    for s in shims.iter().chain([&hook]) {
        together.extend_from_slice(&(s.len() as u64).to_le_bytes());
        together.extend_from_slice(s);
    }
    let version = version_of(&bytes, &together);
    let libs = run_dir.join(LIB_DIR);
    fs::create_dir_all(&libs).map_err(|e| fail(format!("{}: {e}", libs.display())))?;
    let dir = libs.join(&version);
    let preload = preload_contents();
    let installed = fs::read(dir.join(LIB_FILE)).is_ok_and(|b| b == bytes)
        && fs::read(dir.join(FRONT_FILE)).is_ok_and(|b| b == front)
        && fs::read(dir.join(SHIM_CUDA_FILE)).is_ok_and(|b| b == shims[0])
        && fs::read(dir.join(SHIM_NVML_FILE)).is_ok_and(|b| b == shims[1])
        && fs::read(dir.join(HOOK_FILE)).is_ok_and(|b| b == hook)
        && fs::read(dir.join(PRELOAD_FILE)).is_ok_and(|b| b == preload.as_bytes());
    if !installed {
        // Per process: two installers never share a temp dir (callers also hold the
        // node lock); `gc` removes leftovers of dead ones.
        let tmp = libs.join(format!(".{version}.tmp-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        let _ = fs::remove_dir_all(&dir);
        let r = (|| -> std::io::Result<()> {
            fs::create_dir(&tmp)?;
            fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
            for (file, content, mode) in [
                (LIB_FILE, bytes.as_slice(), 0o755),
                (FRONT_FILE, front.as_slice(), 0o755),
                (SHIM_CUDA_FILE, shims[0].as_slice(), 0o755),
                (SHIM_NVML_FILE, shims[1].as_slice(), 0o755),
                (HOOK_FILE, hook.as_slice(), 0o755),
                (PRELOAD_FILE, preload.as_bytes(), 0o644),
            ] {
                let mut f = fs::File::create_new(tmp.join(file))?;
                f.write_all(content)?;
                f.sync_all()?;
                fs::set_permissions(tmp.join(file), fs::Permissions::from_mode(mode))?;
            }
            tessera_cdi::atomic::sync_dir(&tmp)?;
            fs::rename(&tmp, &dir)?;
            tessera_cdi::atomic::sync_dir(&libs)
        })();
        if let Err(e) = r {
            let _ = fs::remove_dir_all(&tmp);
            return Err(fail(format!("{}: {e}", dir.display())));
        }
    }
    let preload = legacy_preload_contents();
    if fs::read_to_string(run_dir.join(PRELOAD_FILE))
        .ok()
        .as_deref()
        != Some(preload.as_str())
    {
        tessera_cdi::atomic::write_atomic(
            run_dir,
            PRELOAD_FILE,
            ".ld.so.preload.tmp",
            preload.as_bytes(),
        )
        .map_err(|e| fail(format!("{PRELOAD_FILE}: {e}")))?;
        fs::set_permissions(
            run_dir.join(PRELOAD_FILE),
            fs::Permissions::from_mode(0o644),
        )
        .map_err(|e| fail(format!("{PRELOAD_FILE}: {e}")))?;
    }
    Ok(InstalledLib { version, dir })
}

/// Removes library versions outside `keep` and leftover `.tmp` directories. Returns
/// what it removed.
pub fn gc(run_dir: &Path, keep: &BTreeSet<String>) -> std::io::Result<Vec<String>> {
    let libs = run_dir.join(LIB_DIR);
    let mut removed = Vec::new();
    let entries = match fs::read_dir(&libs) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(e),
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if keep.contains(&name) {
            continue;
        }
        fs::remove_dir_all(e.path())?;
        removed.push(name);
    }
    if !removed.is_empty() {
        tessera_cdi::atomic::sync_dir(&libs)?;
    }
    removed.sort();
    Ok(removed)
}

/// The library next to the running binary (`--interception-lib` default).
pub fn default_source() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()?
        .parent()
        .map(|d| d.join(LIB_FILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A library build in a directory of its own, with its front beside it.
    fn fake_lib(dir: &Path, tag: &[u8]) -> PathBuf {
        let d = dir.join(format!("build-{}", tag[0]));
        fs::create_dir_all(&d).unwrap();
        let p = d.join(LIB_FILE);
        let mut b = b"\x7fELF".to_vec();
        b.extend_from_slice(tag);
        fs::write(&p, &b).unwrap();
        b.extend_from_slice(b"front");
        fs::write(d.join(FRONT_FILE), &b).unwrap();
        for shim in [SHIM_CUDA_FILE, SHIM_NVML_FILE, HOOK_FILE] {
            fs::write(d.join(shim), [b.as_slice(), shim.as_bytes()].concat()).unwrap();
        }
        p
    }

    /// Installing twice is a no-op; a new build installs beside the old; gc keeps what
    /// it is told to and removes temp leftovers.
    #[test]
    fn install_is_idempotent_and_versions_coexist() {
        let src = tempfile::tempdir().unwrap();
        let run = tempfile::tempdir().unwrap();
        let a = install(run.path(), &fake_lib(src.path(), b"a")).unwrap();
        assert_eq!(install(run.path(), &fake_lib(src.path(), b"a")).unwrap(), a);
        let b = install(run.path(), &fake_lib(src.path(), b"b")).unwrap();
        assert_ne!(a.version, b.version);
        for f in [
            LIB_FILE,
            FRONT_FILE,
            SHIM_CUDA_FILE,
            SHIM_NVML_FILE,
            HOOK_FILE,
        ] {
            assert!(a.dir.join(f).is_file() && b.dir.join(f).is_file(), "{f}");
        }
        assert_eq!(
            fs::metadata(a.dir.join(HOOK_FILE))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o755,
            "the runtime executes the hook"
        );
        assert_eq!(
            fs::read(a.dir.join(FRONT_FILE)).unwrap(),
            b"\x7fELFafront",
            "the front beside the library is installed with it"
        );
        assert_eq!(
            fs::read_to_string(a.dir.join(PRELOAD_FILE)).unwrap(),
            "/usr/local/tessera/lib/libtessera_preload.so\n"
        );
        // What specs of plugins before the front mount, beside library directories
        // without it: the library itself, which every version has.
        assert_eq!(
            fs::read_to_string(run.path().join(PRELOAD_FILE)).unwrap(),
            "/usr/local/tessera/lib/libtessera_cuda.so\n"
        );
        fs::create_dir(run.path().join("lib/.x.tmp-1")).unwrap();
        let removed = gc(run.path(), &BTreeSet::from([b.version.clone()])).unwrap();
        assert_eq!(removed, [".x.tmp-1".to_string(), a.version.clone()]);
        assert!(!a.dir.exists() && b.dir.exists());
    }

    #[test]
    fn refuses_a_non_elf_file() {
        let src = tempfile::tempdir().unwrap();
        let p = src.path().join("x.so");
        fs::write(&p, b"#!/bin/sh").unwrap();
        let e = install(tempfile::tempdir().unwrap().path(), &p).unwrap_err();
        assert!(e.to_string().contains("not an ELF"), "{e}");
        assert!(install(src.path(), &src.path().join("missing.so")).is_err());
    }

    /// A library without its front is refused, and nothing is installed.
    #[test]
    fn refuses_a_library_without_its_front() {
        let src = tempfile::tempdir().unwrap();
        let run = tempfile::tempdir().unwrap();
        let lib = fake_lib(src.path(), b"a");
        fs::remove_file(lib.with_file_name(FRONT_FILE)).unwrap();
        let e = install(run.path(), &lib).unwrap_err();
        assert!(e.to_string().contains("libtessera_preload.so"), "{e}");
        assert!(!run.path().join(LIB_DIR).exists() && !run.path().join(PRELOAD_FILE).exists());
    }

    /// So is a library without either soname shim or its CDI hook (a shared claim's
    /// spec cannot pin the container's directories without it), and nothing is
    /// installed.
    #[test]
    fn refuses_a_library_without_its_shims_or_cdi_hook() {
        for missing in [SHIM_CUDA_FILE, SHIM_NVML_FILE, HOOK_FILE] {
            let src = tempfile::tempdir().unwrap();
            let run = tempfile::tempdir().unwrap();
            let lib = fake_lib(src.path(), b"a");
            fs::remove_file(lib.with_file_name(missing)).unwrap();
            let e = install(run.path(), &lib).unwrap_err();
            assert!(e.to_string().contains(missing), "{e}");
            assert!(!run.path().join(LIB_DIR).exists(), "{missing}");
        }
    }

    /// The hook pins `/etc` and every directory above the library and driver
    /// mounts, outer first.
    #[test]
    fn the_pinned_dirs_cover_every_directory_above_tesseras_mounts() {
        let mut want = vec!["/etc".to_string()];
        for mount in [CONTAINER_LIB_DIR, CONTAINER_DRIVER_DIR] {
            let mut p = Path::new(mount).parent();
            let mut chain = Vec::new();
            while let Some(d) = p.filter(|d| *d != Path::new("/")) {
                chain.push(d.display().to_string());
                p = d.parent();
            }
            for d in chain.into_iter().rev() {
                if !want.contains(&d) {
                    want.push(d);
                }
            }
        }
        assert_eq!(PINNED_DIRS.to_vec(), want);
    }
}
