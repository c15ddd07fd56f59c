//! Where the NVIDIA driver's user-space files live on this node, when `--driver-root`
//! does not say: the common layouts are tried in a fixed order ([`CANDIDATES`]) and the
//! first that works wins. "Works" means NVML loads from it (`--backend nvml`), or, for
//! the mock backend and `nvml:LIBPATH`, that the driver libraries are there.
//!
//! The plugin sees the host's `/` at `--host-root` (a read-only mount in the pod), so a
//! candidate `/run/nvidia/driver` is read at `<host-root>/run/nvidia/driver` and written
//! into CDI specs as `/run/nvidia/driver/...`. Device nodes follow the layout: when the
//! chosen root has `dev/nvidiactl` (a driver container's root), that is the dev root,
//! else the host's `/dev`.
//!
//! [`resolve`] is deterministic given its probe; [`probe_nvml`] and [`probe_files`] do
//! the I/O (loading NVML, listing library directories).

use std::path::{Path, PathBuf};

use tracing::{info, warn};

use crate::node::BackendSpec;
use crate::prepare::cdi_spec::find_driver_lib;

/// A layout to try: its root as the host sees it, and who puts the driver there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub host_path: &'static str,
    pub source: &'static str,
}

/// The layouts tried, in order.
pub const CANDIDATES: &[Candidate] = &[
    Candidate {
        host_path: "/",
        source: "driver installed on the host (distribution packages, .run installer)",
    },
    Candidate {
        host_path: "/run/nvidia/driver",
        source: "NVIDIA GPU Operator driver container",
    },
    Candidate {
        host_path: "/home/kubernetes/bin/nvidia",
        source: "GKE driver installer (Container-Optimized OS)",
    },
    Candidate {
        host_path: "/usr/local/glibc",
        source: "Talos NVIDIA system extensions (glibc tree)",
    },
];

/// One candidate tried and what came of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tried {
    pub candidate: Candidate,
    /// The same directory as the plugin sees it (`<host-root><host_path>`).
    pub path: PathBuf,
    /// What was found (`Ok`: e.g. the NVML library loaded) or why it was refused.
    pub outcome: Result<Found, String>,
}

/// What made a candidate acceptable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The NVML library that loaded, when NVML was the test.
    pub nvml_lib: Option<PathBuf>,
    pub note: String,
}

/// The flags that decide the layout (`--host-root`, `--driver-root`, ...).
#[derive(Debug, Clone)]
pub struct LayoutFlags {
    pub host_root: PathBuf,
    pub driver_root: Option<PathBuf>,
    pub host_driver_root: Option<PathBuf>,
    pub dev_root: Option<PathBuf>,
    pub host_dev_root: Option<PathBuf>,
    pub backend: BackendSpec,
}

/// The layout in use: the plugin's and the host's view of the driver and dev roots,
/// the backend to open (NVML from the found root), and the candidates tried.
#[derive(Debug, Clone)]
pub struct Layout {
    pub driver_root: PathBuf,
    pub host_driver_root: PathBuf,
    pub dev_root: PathBuf,
    pub host_dev_root: PathBuf,
    pub backend: BackendSpec,
    /// How the driver root was decided.
    pub origin: Origin,
}

/// How the driver root was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `--driver-root` named it.
    Flag,
    /// Discovery tried these, in order; the last `Ok` one (if any) is in use.
    Discovered(Vec<Tried>),
}

impl Origin {
    /// The candidate in use, if discovery found one.
    pub fn chosen(&self) -> Option<&Tried> {
        match self {
            Origin::Flag => None,
            Origin::Discovered(tried) => tried.iter().find(|t| t.outcome.is_ok()),
        }
    }
}

/// What decides whether a candidate works: NVML loads (`--backend nvml`), or the driver
/// files are present (mock, `nvml:LIBPATH`).
pub fn probe_kind(backend: &BackendSpec) -> ProbeKind {
    match backend {
        BackendSpec::Nvml(None) => ProbeKind::Nvml,
        BackendSpec::Nvml(Some(_)) | BackendSpec::Mock(_) => ProbeKind::DriverFiles,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    Nvml,
    DriverFiles,
}

/// Decides the layout. Deterministic given `probe` (called with each candidate's path
/// as the plugin sees it, until one is accepted). With `--driver-root` nothing is
/// probed. When no candidate works the host's `/` is used, as before discovery
/// existed (NVML then comes from the loader's search path).
pub fn resolve(
    flags: &LayoutFlags,
    mut probe: impl FnMut(&Path) -> Result<Found, String>,
) -> Layout {
    let (driver_root, host_driver_root, origin) = match &flags.driver_root {
        Some(d) => (
            d.clone(),
            flags.host_driver_root.clone().unwrap_or_else(|| d.clone()),
            Origin::Flag,
        ),
        None => {
            let mut tried = Vec::new();
            for c in CANDIDATES {
                let path = under(&flags.host_root, c.host_path);
                let outcome = probe(&path);
                let ok = outcome.is_ok();
                tried.push(Tried {
                    candidate: *c,
                    path,
                    outcome,
                });
                if ok {
                    break;
                }
            }
            let origin = Origin::Discovered(tried);
            let (root, host) = match origin.chosen() {
                Some(t) => (t.path.clone(), PathBuf::from(t.candidate.host_path)),
                None => (flags.host_root.clone(), PathBuf::from("/")),
            };
            let host = flags.host_driver_root.clone().unwrap_or(host);
            (root, host, origin)
        }
    };
    let backend = match (&flags.backend, origin.chosen()) {
        (
            BackendSpec::Nvml(None),
            Some(Tried {
                outcome:
                    Ok(Found {
                        nvml_lib: Some(lib),
                        ..
                    }),
                ..
            }),
        ) => BackendSpec::Nvml(Some(lib.clone())),
        (b, _) => b.clone(),
    };
    let (dev_root, default_host_dev) = match &flags.dev_root {
        Some(d) => (d.clone(), d.clone()),
        None if driver_root.join("dev/nvidiactl").exists() && driver_root != flags.host_root => {
            (driver_root.clone(), host_driver_root.clone())
        }
        None => (flags.host_root.clone(), PathBuf::from("/")),
    };
    Layout {
        driver_root,
        host_driver_root,
        dev_root,
        host_dev_root: flags.host_dev_root.clone().unwrap_or(default_host_dev),
        backend,
        origin,
    }
}

/// `root` + absolute `path` (`/host` + `/run/x` = `/host/run/x`; `/host` + `/` = `/host`).
pub fn under(root: &Path, path: &str) -> PathBuf {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

/// The probe of `--backend nvml`: `libnvidia-ml.so.1` under `root` loads and NVML
/// initialises (it is shut down again). Side effects: loads the library.
pub fn probe_nvml(root: &Path, proc_root: &Path, sys_root: &Path) -> Result<Found, String> {
    let lib = find_driver_lib(root, "libnvidia-ml.so")
        .ok_or_else(|| "no libnvidia-ml.so.1 in its library directories".to_string())?;
    crate::inventory::nvml::NvmlBackend::new(
        Some(lib.clone()),
        proc_root.to_path_buf(),
        sys_root.to_path_buf(),
    )
    .map_err(|e| crate::error_chain::cause_chain(&e))?;
    Ok(Found {
        note: format!("NVML loads from {}", lib.display()),
        nvml_lib: Some(lib),
    })
}

/// The probe of the mock backend and `nvml:LIBPATH`: `libcuda.so` or `libnvidia-ml.so`
/// is in one of `root`'s library directories. Reads directories only.
pub fn probe_files(root: &Path) -> Result<Found, String> {
    let found: Vec<PathBuf> = ["libcuda.so", "libnvidia-ml.so"]
        .iter()
        .filter_map(|b| find_driver_lib(root, b))
        .collect();
    if found.is_empty() {
        return Err("no libcuda.so or libnvidia-ml.so in its library directories".into());
    }
    let names: Vec<String> = found.iter().map(|p| p.display().to_string()).collect();
    Ok(Found {
        nvml_lib: None,
        note: format!("driver files found: {}", names.join(", ")),
    })
}

/// `--backend nvml` with `--driver-root`: NVML is the driver root's
/// `libnvidia-ml.so.1` (as a discovered root's is), else the loader's when the root has
/// none. Without it the plugin's image, which has no NVML of its own, could not load
/// NVML from a driver root given by flag (Helm's `hostPaths.driverRoot`). Reads
/// directories only.
pub fn nvml_in_given_root(layout: Layout) -> Layout {
    match (&layout.origin, &layout.backend) {
        (Origin::Flag, BackendSpec::Nvml(None)) => {
            match find_driver_lib(&layout.driver_root, "libnvidia-ml.so") {
                Some(lib) => Layout {
                    backend: BackendSpec::Nvml(Some(lib)),
                    ..layout
                },
                None => layout,
            }
        }
        _ => layout,
    }
}

/// [`resolve`] with the probe `flags.backend` calls for, logging the outcome; with
/// `--driver-root`, NVML from that root ([`nvml_in_given_root`]).
pub fn discover(flags: &LayoutFlags, proc_root: &Path, sys_root: &Path) -> Layout {
    let kind = probe_kind(&flags.backend);
    let layout = nvml_in_given_root(resolve(flags, |root| match kind {
        ProbeKind::Nvml => probe_nvml(root, proc_root, sys_root),
        ProbeKind::DriverFiles => probe_files(root),
    }));
    match &layout.origin {
        Origin::Flag => {
            if let BackendSpec::Nvml(Some(lib)) = &layout.backend {
                info!(driver_root = %layout.driver_root.display(), nvml = %lib.display(), "driver root given; NVML loads from it");
            }
        }
        Origin::Discovered(tried) => match layout.origin.chosen() {
            Some(t) => info!(
                driver_root = %t.path.display(),
                host_driver_root = %layout.host_driver_root.display(),
                layout = t.candidate.source,
                tried = tried.len(),
                "driver root discovered"
            ),
            None => warn!(
                host_root = %flags.host_root.display(),
                tried = tried.len(),
                "no driver root found among the known layouts (see `tessera doctor`); using the host's /"
            ),
        },
    }
    layout
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(driver_root: Option<&str>) -> LayoutFlags {
        LayoutFlags {
            host_root: PathBuf::from("/host"),
            driver_root: driver_root.map(PathBuf::from),
            host_driver_root: None,
            dev_root: None,
            host_dev_root: None,
            backend: BackendSpec::Nvml(None),
        }
    }

    fn found_at(ok: &'static str) -> impl FnMut(&Path) -> Result<Found, String> {
        move |p| {
            if p == Path::new(ok) {
                Ok(Found {
                    nvml_lib: Some(p.join("lib64/libnvidia-ml.so.1")),
                    note: "ok".into(),
                })
            } else {
                Err("no".into())
            }
        }
    }

    /// Candidates are tried in order until one works; host paths drop the host root,
    /// and NVML is opened from the library found.
    #[test]
    fn the_first_working_candidate_wins_and_maps_to_the_host_view() {
        let l = resolve(&flags(None), found_at("/host/home/kubernetes/bin/nvidia"));
        assert_eq!(l.driver_root, Path::new("/host/home/kubernetes/bin/nvidia"));
        assert_eq!(l.host_driver_root, Path::new("/home/kubernetes/bin/nvidia"));
        assert_eq!(
            l.backend,
            BackendSpec::Nvml(Some(
                "/host/home/kubernetes/bin/nvidia/lib64/libnvidia-ml.so.1".into()
            ))
        );
        let Origin::Discovered(tried) = &l.origin else {
            panic!("discovered")
        };
        let paths: Vec<_> = tried.iter().map(|t| t.path.display().to_string()).collect();
        assert_eq!(
            paths,
            [
                "/host",
                "/host/run/nvidia/driver",
                "/host/home/kubernetes/bin/nvidia"
            ]
        );
        assert_eq!(
            (l.dev_root.as_path(), l.host_dev_root.as_path()),
            (Path::new("/host"), Path::new("/"))
        );
    }

    /// `--driver-root` is taken as given; nothing is probed.
    #[test]
    fn a_given_driver_root_is_not_probed() {
        let l = resolve(&flags(Some("/driver-root")), |_| panic!("probed"));
        assert_eq!(l.driver_root, Path::new("/driver-root"));
        assert_eq!(l.host_driver_root, Path::new("/driver-root"));
        assert_eq!(l.origin, Origin::Flag);
    }

    /// Regression (the real cluster on `--backend nvml`, issue #41): with `--driver-root`
    /// NVML was opened from the loader's path, which the plugin's image lacks; it is the
    /// given root's `libnvidia-ml.so.1`, and the loader's only when the root has none.
    #[test]
    fn a_given_driver_root_provides_nvml() {
        let dir = tempfile::tempdir().unwrap();
        let lib_dir = dir.path().join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib_dir).unwrap();
        let root = dir.path().to_str().unwrap();
        let without = nvml_in_given_root(resolve(&flags(Some(root)), |_| panic!("probed")));
        assert_eq!(without.backend, BackendSpec::Nvml(None));
        std::fs::write(lib_dir.join("libnvidia-ml.so.1"), b"").unwrap();
        let with = nvml_in_given_root(resolve(&flags(Some(root)), |_| panic!("probed")));
        assert_eq!(
            with.backend,
            BackendSpec::Nvml(Some(lib_dir.join("libnvidia-ml.so.1")))
        );
        let mut mock = flags(Some(root));
        mock.backend = BackendSpec::Mock(None);
        let mock = nvml_in_given_root(resolve(&mock, |_| panic!("probed")));
        assert_eq!(mock.backend, BackendSpec::Mock(None));
    }

    /// When nothing works, the host's / is used with the loader's NVML, as before.
    #[test]
    fn nothing_found_falls_back_to_the_host_root() {
        let l = resolve(&flags(None), |_| Err("no".into()));
        assert_eq!(l.driver_root, Path::new("/host"));
        assert_eq!(l.host_driver_root, Path::new("/"));
        assert_eq!(l.backend, BackendSpec::Nvml(None));
        assert!(l.origin.chosen().is_none());
    }
}
