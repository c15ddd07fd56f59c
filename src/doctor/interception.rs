//! Whether the interception library (and its front, which `ld.so.preload` names, and
//! the CDI hook, which the runtime runs on the host) loads on this host's glibc: a child process runs the host's own dynamic loader (found
//! under the host root) in trace mode with immediate binding, against the host's
//! library directories only (`--inhibit-cache --library-path`), as `ldd -r` does. A
//! missing glibc symbol version or library fails it; nothing of the library runs.
//!
//! Not checked here: a CUDA context coming up through the library and
//! `cuMemGetInfo` reporting a budget (that needs a GPU and a claim's files mounted);
//! the finding says so.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::Finding;
use crate::prepare::library::{FRONT_FILE, HOOK_FILE};

const CHECK: &str = "interception-library";

/// The dynamic loaders looked for under the host root, in order.
const LOADERS: &[&str] = &[
    "lib64/ld-linux-x86-64.so.2",
    "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
    "usr/lib64/ld-linux-x86-64.so.2",
    "lib/ld-linux-aarch64.so.1",
    "lib/aarch64-linux-gnu/ld-linux-aarch64.so.1",
];
/// The host's library directories searched (those that exist), in order.
const HOST_LIB_DIRS: &[&str] = &[
    "lib/x86_64-linux-gnu",
    "usr/lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "usr/lib64",
    "lib",
    "usr/lib",
];

/// One library traced by the host's loader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Traced {
    pub lib: PathBuf,
    /// Exit success, and the loader's stderr lines.
    pub ok: bool,
    pub errors: Vec<String>,
    /// The glibc the trace resolved `libc.so.6` to.
    pub libc: Option<String>,
}

/// What the interception check saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeenInterception {
    /// No `--interception-lib` and none beside the binary.
    NotConfigured,
    Missing(PathBuf),
    /// No dynamic loader found under the host root.
    NoLoader(PathBuf),
    Traced {
        loader: PathBuf,
        libs: Vec<Traced>,
    },
}

/// Runs the host's loader on the library and its front.
pub fn gather(host_root: &Path, lib: Option<&Path>) -> SeenInterception {
    let Some(lib) = lib else {
        return SeenInterception::NotConfigured;
    };
    if !lib.is_file() {
        return SeenInterception::Missing(lib.to_path_buf());
    }
    let Some(loader) = LOADERS
        .iter()
        .map(|l| host_root.join(l))
        .find(|p| p.exists())
    else {
        return SeenInterception::NoLoader(host_root.to_path_buf());
    };
    let search: Vec<String> = HOST_LIB_DIRS
        .iter()
        .map(|d| host_root.join(d))
        .filter(|p| p.is_dir())
        .map(|p| p.display().to_string())
        .collect();
    let mut libs = vec![lib.to_path_buf()];
    // The front, and the CDI hook, which the runtime runs on the host: its libraries
    // must resolve there.
    for beside in [FRONT_FILE, HOOK_FILE] {
        if let Some(f) = lib.parent().map(|d| d.join(beside))
            && f.is_file()
        {
            libs.push(f);
        }
    }
    let libs = libs
        .into_iter()
        .map(|l| trace(&loader, &search.join(":"), &l))
        .collect();
    SeenInterception::Traced { loader, libs }
}

fn trace(loader: &Path, search: &str, lib: &Path) -> Traced {
    let out = Command::new(loader)
        .env_clear()
        .env("LD_BIND_NOW", "1")
        .env("LD_WARN", "yes")
        .arg("--inhibit-cache")
        .arg("--library-path")
        .arg(search)
        .arg("--list")
        .arg(lib)
        .output();
    match out {
        Err(e) => Traced {
            lib: lib.to_path_buf(),
            ok: false,
            errors: vec![format!("cannot run {}: {e}", loader.display())],
            libc: None,
        },
        Ok(o) => {
            let stdout = String::from_utf8_lossy(&o.stdout);
            let libc = stdout
                .lines()
                .find(|l| l.trim_start().starts_with("libc.so.6"))
                .and_then(|l| l.split("=>").nth(1))
                .and_then(|r| r.split_whitespace().next())
                .map(str::to_string);
            let errors: Vec<String> = String::from_utf8_lossy(&o.stderr)
                .lines()
                .chain(stdout.lines().filter(|l| l.contains("not found")))
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty())
                .collect();
            Traced {
                lib: lib.to_path_buf(),
                ok: o.status.success() && errors.is_empty(),
                errors,
                libc,
            }
        }
    }
}

/// Loads on the host → pass (with what was not exercised); no library configured →
/// warn (shared GPUs are refused); a library that does not load → fail.
pub fn check(seen: &SeenInterception) -> Finding {
    let not_exercised =
        "not checked: a CUDA context through the library and cuMemGetInfo showing a budget (needs a GPU and a claim)".to_string();
    match seen {
        SeenInterception::NotConfigured => Finding::warn(
            CHECK,
            vec!["no --interception-lib and no libtessera_cuda.so beside the binary".into()],
            "shared-GPU claims are refused without it: pass --interception-lib (the image has /usr/local/lib/tessera/libtessera_cuda.so)",
        ),
        SeenInterception::Missing(p) => Finding::fail(
            CHECK,
            vec![format!("{} does not exist", p.display())],
            "point --interception-lib at libtessera_cuda.so (with libtessera_preload.so beside it), as the image ships them",
        ),
        SeenInterception::NoLoader(root) => Finding::warn(
            CHECK,
            vec![
                format!("no dynamic loader (ld-linux) under {}", root.display()),
                not_exercised,
            ],
            "mount the host's / read-only at --host-root so doctor can load the library on the host's glibc",
        ),
        SeenInterception::Traced { loader, libs } => {
            let mut saw = vec![format!("host loader {}", loader.display())];
            let mut bad = false;
            for t in libs {
                if t.ok {
                    saw.push(format!(
                        "{} loads{}",
                        t.lib.display(),
                        t.libc
                            .as_ref()
                            .map_or(String::new(), |c| format!(" against {c}"))
                    ));
                } else {
                    bad = true;
                    saw.push(format!(
                        "{} does not load: {}",
                        t.lib.display(),
                        t.errors.join("; ")
                    ));
                }
            }
            saw.push(not_exercised);
            if bad {
                Finding::fail(
                    CHECK,
                    saw,
                    "this host's glibc cannot load the interception library (built for glibc 2.17 and newer): use the release image's library, not one built on a newer system",
                )
            } else {
                Finding::pass(CHECK, saw)
            }
        }
    }
}
