//! Tessera's CDI specs applied by containerd 1.7 (Debian trixie) through CRI, the API
//! the kubelet uses: the plugin runs on the mock node with real character devices under
//! its `--dev-root`, the fake API server and `tessera plan` allocate, the test kubelet
//! prepares, and containers are created with `ContainerConfig.CDI_devices` set to the
//! CDI IDs the plugin returned (only the named request's IDs when a container names one).
//!
//! containerd runs in the real cluster's cached trixie chroot (`tests/cluster/chroot.sh`)
//! in a private mount namespace (see `testkit/src/cri.rs`). Prerequisites (`.ci/run`
//! installs them): root, debootstrap, flock, unshare, nsenter, chroot, tar,
//! busybox-static, a C compiler and the Debian mirror.
//! Without them the suite is skipped, unless `CI` is set.

use std::path::Path;
use std::time::Instant;

use testkit::cri::{self, Containerd};
use testkit::e2e;
use testkit::runtime::ContainerdRuntime;

use crate::scenarios::{self, Node};

/// A plugin on the mock node with real device nodes and a stand-in libcuda, and
/// containerd (from `chroot`) with one pod sandbox.
async fn start(chroot: &Path) -> Node<ContainerdRuntime> {
    let h = scenarios::harness_with_dev_root().await;
    let root = h.dir.path().to_path_buf();
    // Built into the temp dir, so nothing outlives the test.
    let built = e2e::build(&root.join("fakes"));
    scenarios::install_driver_libcuda(&h, &built.libcuda);
    let (plugin, k) = scenarios::start_plugin(&h).await;
    let rootfs = e2e::rootfs(&root.join("image"), &[&built.cudaprobe]);
    let work = root.join("containerd");
    std::fs::create_dir_all(&work).unwrap();
    let tar = work.join("image.tar");
    cri::docker_archive(&rootfs, cri::IMAGE, &tar);
    // The temp dir holds the CDI dir, every hostPath and containerd's state.
    let containerd = Containerd::start(chroot, &work, &h.opts.paths.cdi_dir, &[&root]);
    containerd.import(&tar);
    let runtime = ContainerdRuntime::connect(containerd).await;
    Node::new(h, plugin, k, runtime)
}

/// Every scenario on one node, one containerd and one pod sandbox; prints each
/// scenario's time and the suite's, set-up (chroot, daemon, image) included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and containerd (in a debootstrap chroot)"]
async fn containerd_cri_applies_tessera_cdi_specs() {
    if e2e::prerequisites(
        "containerd suite",
        &[
            "debootstrap",
            "flock",
            "unshare",
            "nsenter",
            "chroot",
            "tar",
            "cc",
        ],
    )
    .is_err()
    {
        return;
    }
    let t0 = Instant::now();
    let chroot = match cri::chroot() {
        Ok(c) => c,
        Err(e) => {
            e2e::skip_or_fail(
                &format!("containerd suite: {e}"),
                "the Debian mirror is a prerequisite too",
            );
            return;
        }
    };
    e2e::report(format_args!(
        "containerd suite: chroot {} (cached, or built by chroot.sh) in {:?}",
        chroot.display(),
        t0.elapsed()
    ));
    let mut n = start(&chroot).await;
    let v = &n.runtime.cri.as_ref().unwrap().version;
    e2e::report(format_args!(
        "runtime: {} {} (CRI {}); set-up {:?}",
        v.runtime_name,
        v.runtime_version,
        v.runtime_api_version,
        t0.elapsed()
    ));
    scenarios::run_all(&mut n).await;
    let complaints = n.runtime.containerd.cdi_registry_complaints();
    assert!(
        complaints.is_empty(),
        "containerd's CDI registry complained about Tessera's specs:\n{complaints}"
    );
    e2e::report(format_args!(
        "passed: containerd's CDI registry loaded every spec without a complaint"
    ));
    n.runtime.stop().await;
    n.stop_plugin().await;
    e2e::report(format_args!("containerd suite: total {:?}", t0.elapsed()));
}
