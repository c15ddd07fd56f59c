//! Tessera's CDI specs applied by containerd 1.7 (Debian trixie) through CRI, the API
//! the kubelet uses: the plugin runs on the mock node with real character devices under
//! its `--dev-root`, the fake API server and `tessera plan` allocate, the test kubelet
//! prepares, and containers are created with `ContainerConfig.CDI_devices` set to the
//! CDI IDs the plugin returned (only the named request's IDs when a container names one).
//!
//! containerd runs in the real cluster's cached trixie chroot (`tests/cluster/chroot.sh`)
//! in a private mount namespace (see `tests/support/cri.rs`). Prerequisites (`.ci/run`
//! installs them): root, debootstrap, flock, unshare, nsenter, chroot, tar,
//! busybox-static, a C compiler and the Debian mirror.
//! Without them the suite is skipped, unless `CI` is set.

#[path = "support/cri.rs"]
mod cri;
#[path = "support/e2e.rs"]
mod e2e;
#[path = "support/harness.rs"]
mod harness;

use std::time::Instant;

use cri::{Containerd, Cri};
use e2e::{Run, assert_nodes, assert_open_allowed, ids, node_script, open_script};
use harness::{Harness, InProcess, NODE};
use tessera::kubelet::proto::dra_v1::NodePrepareResourcesResponse;
use testkit::kubelet_standin::{DraClient, KubeletClaim};

/// A plugin on the mock node with real device nodes, a stand-in libcuda, and containerd
/// with one pod sandbox. Fields drop in order: containerd goes before the temp dir.
struct Node {
    cri: Option<Cri>,
    containerd: Containerd,
    plugin: Option<InProcess>,
    k: DraClient,
    h: Harness,
}

impl Node {
    async fn start(chroot: &std::path::Path) -> Node {
        let mut h = Harness::new().await;
        let root = h.dir.path().to_path_buf();
        // Built into the temp dir, so nothing outlives the test.
        let built = e2e::build(&root.join("fakes"));
        let dev_root = root.join("dev-root");
        e2e::make_dev_root(&dev_root, &h.model.inventory);
        h.opts.paths.dev_root = dev_root.clone();
        h.opts.paths.host_dev_root = dev_root;
        let lib = root.join("driver-root/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06");
        std::fs::copy(&built.libcuda, lib).unwrap();
        let plugin = h.start_plugin().await;
        let k = h.kubelet().await;
        let rootfs = e2e::rootfs(&root.join("image"), &[&built.cudaprobe]);
        let work = root.join("containerd");
        std::fs::create_dir_all(&work).unwrap();
        let tar = work.join("image.tar");
        cri::docker_archive(&rootfs, cri::IMAGE, &tar);
        // The temp dir holds the CDI dir, every hostPath and containerd's state.
        let containerd = Containerd::start(chroot, &work, &h.opts.paths.cdi_dir, &[&root]);
        containerd.import(&tar);
        let cri = Cri::connect(&containerd).await;
        Node {
            cri: Some(cri),
            containerd,
            plugin: Some(plugin),
            k,
            h,
        }
    }

    async fn prepare(&self, c: &KubeletClaim) -> NodePrepareResourcesResponse {
        let r = self.k.prepare_v1(std::slice::from_ref(c)).await.unwrap();
        assert_eq!(r.claims[&c.uid].error, "", "prepare {}", c.name);
        r
    }

    /// Runs `script` in a container created with `ids` as its CDI devices.
    async fn run(&mut self, ids: &[String], script: &str) -> Result<Run, String> {
        let from = self.containerd.log_len();
        let cri = self.cri.as_mut().unwrap();
        cri.run(ids, script).await.map_err(|e| {
            format!(
                "{:?}: {}\ncontainerd's log:\n{}",
                e.code(),
                e.message(),
                self.containerd.errors_since(from)
            )
        })
    }

    /// Like `run`, but the container must start and exit 0; failures print
    /// containerd's own error.
    async fn run_ok(&mut self, ids: &[String], script: &str) -> Run {
        match self.run(ids, script).await {
            Ok(r) => {
                assert!(
                    r.ok,
                    "container with {ids:?} failed\nstdout:\n{}\nstderr:\n{}",
                    r.stdout, r.stderr
                );
                r
            }
            Err(e) => panic!("containerd refused a container with {ids:?}: {e}"),
        }
    }

    async fn stop(mut self) {
        if let Some(c) = self.cri.take() {
            c.stop().await;
        }
        if let Some(p) = self.plugin.take() {
            p.stop().await;
        }
    }
}

async fn whole_gpu_claim(n: &mut Node) {
    let c =
        n.h.allocated_claim("whole", &[("gpu", NODE, "gpu-2", None)], &[])
            .await;
    let r = n.prepare(&c).await;
    let ids = ids(&r, &c.uid);
    let present = [
        "/dev/nvidia2",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ];
    let absent = [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidia3",
        "/etc/ld.so.preload",
    ];
    let script = format!(
        "{}{}{}for f in /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 /usr/bin/nvidia-smi; do test -f $f && echo FILE=$f; done; unset LD_LIBRARY_PATH; /usr/local/bin/cudaprobe",
        node_script(&present, &absent),
        open_script("/dev/nvidia2"),
        open_script("/dev/nvidia-uvm"),
    );
    let out = n.run_ok(&ids, &script).await;
    // containerd took the devices from the typed CRI field (17), not from annotations.
    let field = format!(
        "CDI devices from CRI Config.CDIDevices: [{}]",
        ids.join(" ")
    );
    assert!(
        std::fs::read_to_string(&n.containerd.log)
            .unwrap()
            .contains(&field),
        "containerd's log lacks {field:?}"
    );
    assert_nodes(&out, &present, &absent);
    assert_open_allowed(&out, "/dev/nvidia2");
    assert_open_allowed(&out, "/dev/nvidia-uvm");
    for f in [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/bin/nvidia-smi",
    ] {
        assert!(out.has_line(&format!("FILE={f}")), "{f}:\n{}", out.stdout);
    }
    assert!(out.has_line("cuInit=0"), "{}", out.stdout);
    // The plugin has a library installed (the harness's stand-in), so libcuda.so.1 is
    // its soname shim, which forwards to the driver mounted at its fixed path.
    assert!(
        out.has_line("LIBCUDA=/usr/local/tessera/driver/libcuda.real"),
        "the program linked with -lcuda reaches the mounted driver through the shim:\n{}",
        out.stdout
    );

    // Control: without the CDI device the same container has no GPU and no library,
    // and a node is not openable just because it exists (containerd's default devices).
    let bare = n
        .run_ok(&[], &node_script(&[], &["/dev/nvidia2", "/dev/nvidiactl"]))
        .await;
    assert_nodes(&bare, &[], &["/dev/nvidia2", "/dev/nvidiactl"]);

    // Unprepare: the spec is gone and containerd refuses the ID at CreateContainer.
    n.k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
    assert!(!n.h.spec_path(&c.uid).exists(), "spec removed");
    match n.run(&ids, "echo started").await {
        Ok(r) => panic!("a container with an unprepared device must not be created: {r:?}"),
        Err(e) => assert!(e.contains("unresolvable CDI devices"), "{e}"),
    }
}

async fn two_requests(n: &mut Node) {
    let c =
        n.h.allocated_claim(
            "two",
            &[("a", NODE, "gpu-2", None), ("b", NODE, "gpu-3", None)],
            &[],
        )
        .await;
    let r = n.prepare(&c).await;
    let of = |req: &str| -> Vec<String> {
        r.claims[&c.uid]
            .devices
            .iter()
            .filter(|d| d.request_names.iter().any(|n| n == req))
            .flat_map(|d| d.cdi_device_ids.clone())
            .collect()
    };
    let (a, b) = (of("a"), of("b"));
    assert_eq!((a.len(), b.len()), (1, 1));
    let only_a = n
        .run_ok(&a, &node_script(&["/dev/nvidia2"], &["/dev/nvidia3"]))
        .await;
    assert_nodes(&only_a, &["/dev/nvidia2"], &["/dev/nvidia3"]);
    let only_b = n
        .run_ok(&b, &node_script(&["/dev/nvidia3"], &["/dev/nvidia2"]))
        .await;
    assert_nodes(&only_b, &["/dev/nvidia3"], &["/dev/nvidia2"]);
    n.k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
}

async fn mig_claim(n: &mut Node) {
    let c =
        n.h.allocated_claim("mig", &[("mig", NODE, "gpu-0-mig-1g10gb-19-6", None)], &[])
            .await;
    let r = n.prepare(&c).await;
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(n.h.spec_path(&c.uid)).unwrap()).unwrap();
    let caps: Vec<String> = spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap().to_string())
        .filter(|p| p.starts_with("/dev/nvidia-caps/"))
        .collect();
    assert_eq!(caps.len(), 2, "GI and CI capability nodes");
    let mut present: Vec<&str> = vec!["/dev/nvidia0", "/dev/nvidiactl"];
    present.extend(caps.iter().map(String::as_str));
    let script = format!(
        "{}{}",
        node_script(&present, &["/dev/nvidia1"]),
        open_script(&caps[0])
    );
    let out = n.run_ok(&ids(&r, &c.uid), &script).await;
    assert_nodes(&out, &present, &["/dev/nvidia1"]);
    assert_open_allowed(&out, &caps[0]);
    n.k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
}

async fn shared_claim_files(n: &mut Node) {
    let c =
        n.h.allocated_claim_with(
            "shared",
            vec![harness::shared_result(
                "gpu",
                "gpu-1",
                "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0",
                "20Gi",
                "25",
            )],
            &[],
        )
        .await;
    let r = n.prepare(&c).await;
    let base = format!("/run/tessera/claims/{}", c.uid);
    let script = format!(
        "cat /etc/ld.so.preload | sed 's/^/PRELOAD=/'; \
         test -f /usr/local/tessera/lib/libtessera_cuda.so && test -f /usr/local/tessera/lib/libtessera_preload.so && echo LIB=present; \
         head -1 {base}/limits | sed 's/^/LIMITS=/'; \
         echo forged > {base}/limits 2>/dev/null || echo LIMITS_WRITE=refused; \
         echo forged > {base}/control 2>/dev/null || echo CONTROL_WRITE=refused; \
         echo x > /etc/ld.so.preload 2>/dev/null || echo PRELOAD_WRITE=refused; \
         grep ' {base}/' /proc/self/mountinfo | awk '{{print \"MOUNT=\" $5 \" \" $6}}' | sed 's/,.*//'; \
         ls /run/tessera/claims | sed 's/^/CLAIMDIR=/'; \
         {}",
        node_script(&["/dev/nvidia1"], &["/dev/nvidia0"])
    );
    let out = n.run_ok(&ids(&r, &c.uid), &script).await;
    assert!(
        out.has_line("PRELOAD=/usr/local/tessera/lib/libtessera_preload.so"),
        "{}",
        out.stdout
    );
    assert!(out.has_line("LIB=present"), "{}", out.stdout);
    assert!(out.has_line("LIMITS=tessera-limits 1"), "{}", out.stdout);
    for f in ["LIMITS_WRITE", "CONTROL_WRITE", "PRELOAD_WRITE"] {
        assert!(
            out.has_line(&format!("{f}=refused")),
            "{f}:\n{}",
            out.stdout
        );
    }
    for (file, mode) in [("limits", "ro"), ("control", "ro"), ("region", "rw")] {
        assert!(
            out.has_line(&format!("MOUNT={base}/{file} {mode}")),
            "{file} mounted {mode}:\n{}",
            out.stdout
        );
    }
    assert!(
        out.has_line(&format!("CLAIMDIR={}", c.uid)),
        "only this claim's directory:\n{}",
        out.stdout
    );
    assert_nodes(&out, &["/dev/nvidia1"], &["/dev/nvidia0"]);
    n.k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
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
            // The Debian mirror is a prerequisite too.
            assert!(!e2e::in_ci(), "containerd suite: {e}");
            e2e::report(format_args!("SKIPPED containerd suite: {e}"));
            return;
        }
    };
    e2e::report(format_args!(
        "containerd suite: chroot {} (cached, or built by chroot.sh) in {:?}",
        chroot.display(),
        t0.elapsed()
    ));
    let mut n = Node::start(&chroot).await;
    let v = &n.cri.as_ref().unwrap().version;
    e2e::report(format_args!(
        "runtime: {} {} (CRI {}); set-up {:?}",
        v.runtime_name,
        v.runtime_version,
        v.runtime_api_version,
        t0.elapsed()
    ));
    let t = Instant::now();
    whole_gpu_claim(&mut n).await;
    e2e::report(format_args!(
        "passed: whole GPU (nodes, cgroup rule, driver files, -lcuda, unprepare) in {:?}",
        t.elapsed()
    ));
    let t = Instant::now();
    two_requests(&mut n).await;
    e2e::report(format_args!(
        "passed: two requests, one per container, in {:?}",
        t.elapsed()
    ));
    let t = Instant::now();
    mig_claim(&mut n).await;
    e2e::report(format_args!(
        "passed: MIG partition (parent and capability nodes) in {:?}",
        t.elapsed()
    ));
    let t = Instant::now();
    shared_claim_files(&mut n).await;
    e2e::report(format_args!(
        "passed: shared claim files and mounts in {:?}",
        t.elapsed()
    ));
    let complaints = n.containerd.cdi_registry_complaints();
    assert!(
        complaints.is_empty(),
        "containerd's CDI registry complained about Tessera's specs:\n{complaints}"
    );
    e2e::report(format_args!(
        "passed: containerd's CDI registry loaded every spec without a complaint"
    ));
    n.stop().await;
    e2e::report(format_args!("containerd suite: total {:?}", t0.elapsed()));
}
