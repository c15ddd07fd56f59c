//! The container runtimes the runtime suites apply Tessera's CDI specs with, behind one
//! trait: the scenarios are written once over [`Runtime`], and each runtime is a thin
//! implementation: [`PodmanRuntime`] (podman's CLI, `--device <CDI ID>`) and
//! [`ContainerdRuntime`] (containerd through CRI, `ContainerConfig.CDI_devices`).

use std::future::Future;
use std::path::{Path, PathBuf};

use crate::cri::{Containerd, Cri};
use crate::e2e::{Podman, Run};

/// A container runtime that runs a script in a fresh container of the test image with
/// CDI devices, as a pod's container would get them.
pub trait Runtime {
    /// The runtime's name in progress lines and failure messages (`podman`,
    /// `containerd`).
    fn name(&self) -> &'static str;

    /// Runs `script` (`/bin/sh -c`) in a new container given `ids` as its CDI devices,
    /// and waits for it to exit.
    ///
    /// # Errors
    /// The runtime refused to create or start the container (an unknown CDI ID, say),
    /// or the container failed: the message carries what the runtime said, its CDI
    /// registry's complaints included.
    fn run(&mut self, ids: &[String], script: &str) -> impl Future<Output = Result<Run, String>>;

    /// Checks that the container just run with `ids` received them through the
    /// runtime's own API for CDI devices (containerd: the typed CRI field, not
    /// annotations). Podman has nothing more to show than its `--device` arguments.
    fn assert_devices_received(&self, ids: &[String]) {
        let _ = ids;
    }
}

/// Podman, running containers on an overlay of one registry-free root filesystem.
pub struct PodmanRuntime {
    pub podman: Podman,
    /// The image's root filesystem (see [`crate::e2e::rootfs`]).
    pub rootfs: PathBuf,
}

impl PodmanRuntime {
    pub fn new(podman: Podman, rootfs: &Path) -> Self {
        PodmanRuntime {
            podman,
            rootfs: rootfs.to_path_buf(),
        }
    }

    /// `--device <id>` for each CDI ID.
    pub fn device_args(ids: &[String]) -> Vec<String> {
        ids.iter()
            .flat_map(|i| ["--device".into(), i.clone()])
            .collect()
    }
}

impl Runtime for PodmanRuntime {
    fn name(&self) -> &'static str {
        "podman"
    }

    async fn run(&mut self, ids: &[String], script: &str) -> Result<Run, String> {
        let r = self
            .podman
            .run(&self.rootfs, &Self::device_args(ids), script);
        if r.ok {
            return Ok(r);
        }
        Err(format!(
            "podman run failed\nstdout:\n{}\nCDI/errors:\n{}\nstderr:\n{}",
            r.stdout,
            Podman::cdi_errors(&r),
            r.stderr
        ))
    }
}

/// containerd through CRI, with one pod sandbox. Fields drop in order: the CRI client
/// before the daemon.
pub struct ContainerdRuntime {
    pub cri: Option<Cri>,
    pub containerd: Containerd,
}

impl ContainerdRuntime {
    /// Connects to `containerd` and starts the pod sandbox.
    pub async fn connect(containerd: Containerd) -> Self {
        let cri = Cri::connect(&containerd).await;
        ContainerdRuntime {
            cri: Some(cri),
            containerd,
        }
    }

    /// Stops the pod sandbox and closes the connection (the daemon stops on drop).
    pub async fn stop(&mut self) {
        if let Some(c) = self.cri.take() {
            c.stop().await;
        }
    }
}

impl Runtime for ContainerdRuntime {
    fn name(&self) -> &'static str {
        "containerd"
    }

    async fn run(&mut self, ids: &[String], script: &str) -> Result<Run, String> {
        let from = self.containerd.log_len();
        let cri = self.cri.as_mut().expect("the CRI connection is open");
        let r = cri.run(ids, script).await.map_err(|e| {
            format!(
                "containerd refused the container: {:?}: {}\ncontainerd's log:\n{}",
                e.code(),
                e.message(),
                self.containerd.errors_since(from)
            )
        })?;
        if r.ok {
            Ok(r)
        } else {
            Err(format!(
                "the container failed\nstdout:\n{}\nstderr:\n{}",
                r.stdout, r.stderr
            ))
        }
    }

    fn assert_devices_received(&self, ids: &[String]) {
        let field = format!(
            "CDI devices from CRI Config.CDIDevices: [{}]",
            ids.join(" ")
        );
        assert!(
            std::fs::read_to_string(&self.containerd.log)
                .unwrap()
                .contains(&field),
            "containerd's log lacks {field:?}"
        );
    }
}
