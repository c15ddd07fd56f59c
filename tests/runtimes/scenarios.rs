//! The scenarios every runtime runs, written once over [`Runtime`]: a node (the plugin
//! on the mock node with real character devices under its `--dev-root`, the fake API
//! server, the test kubelet) and the runtime under test, which starts containers with
//! the CDI IDs the plugin returned.

use std::path::Path;
use std::time::Instant;

use tessera::kubelet::proto::dra_v1::NodePrepareResourcesResponse;
use testkit::e2e::{self, Run, assert_nodes, assert_open_allowed, ids, node_script, open_script};
use testkit::harness::{self, Harness, InProcess, NODE};
use testkit::kubelet_standin::{DraClient, KubeletClaim};
use testkit::runtime::Runtime;

/// A plugin on the mock node and a runtime. Fields drop in order: the runtime (a
/// containerd daemon) goes before the temp dir.
pub struct Node<R> {
    pub runtime: R,
    plugin: Option<InProcess>,
    pub k: DraClient,
    pub h: Harness,
}

/// The harness of a node whose device nodes are real character devices under its own
/// dev root (the plugin's `--dev-root`).
pub async fn harness_with_dev_root() -> Harness {
    let mut h = Harness::new().await;
    let dev_root = h.dir.path().join("dev-root");
    e2e::make_dev_root(&dev_root, &h.model.inventory);
    h.opts.paths.dev_root = dev_root.clone();
    h.opts.paths.host_dev_root = dev_root;
    h
}

/// Installs `libcuda` as the driver's libcuda in the harness's driver root (mounted at
/// its soname by the specs).
pub fn install_driver_libcuda(h: &Harness, libcuda: &Path) {
    let lib = h
        .dir
        .path()
        .join("driver-root/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06");
    std::fs::copy(libcuda, lib).unwrap();
}

/// Starts the harness's plugin and registers the test kubelet with it.
pub async fn start_plugin(h: &Harness) -> (InProcess, DraClient) {
    let plugin = h.start_plugin().await;
    let k = h.kubelet().await;
    (plugin, k)
}

impl<R: Runtime> Node<R> {
    pub fn new(h: Harness, plugin: InProcess, k: DraClient, runtime: R) -> Self {
        Node {
            runtime,
            plugin: Some(plugin),
            k,
            h,
        }
    }

    pub async fn prepare(&self, c: &KubeletClaim) -> NodePrepareResourcesResponse {
        let r = self.k.prepare_v1(std::slice::from_ref(c)).await.unwrap();
        assert_eq!(r.claims[&c.uid].error, "", "prepare {}", c.name);
        r
    }

    /// Runs `script` in a container given `ids`; it must start and exit 0 (failures
    /// print the runtime's own errors).
    pub async fn run_ok(&mut self, ids: &[String], script: &str) -> Run {
        match self.runtime.run(ids, script).await {
            Ok(r) => r,
            Err(e) => panic!("{}: a container with {ids:?}: {e}", self.runtime.name()),
        }
    }

    /// Stops the plugin.
    pub async fn stop_plugin(&mut self) {
        if let Some(p) = self.plugin.take() {
            p.stop().await;
        }
    }
}

/// Every scenario on one node, in order; reports each one's time.
pub async fn run_all<R: Runtime>(n: &mut Node<R>) {
    let t = Instant::now();
    whole_gpu_claim(n).await;
    e2e::report(format_args!(
        "passed: whole GPU (nodes, cgroup rule, driver files, -lcuda, unprepare) in {:?}",
        t.elapsed()
    ));
    let t = Instant::now();
    two_requests(n).await;
    e2e::report(format_args!(
        "passed: two requests, one per container, in {:?}",
        t.elapsed()
    ));
    let t = Instant::now();
    mig_claim(n).await;
    e2e::report(format_args!(
        "passed: MIG partition (parent and capability nodes) in {:?}",
        t.elapsed()
    ));
    let t = Instant::now();
    shared_claim_files(n).await;
    e2e::report(format_args!(
        "passed: shared claim files and mounts in {:?}",
        t.elapsed()
    ));
}

/// A whole GPU: its node, the control nodes and the driver files, openable through the
/// device cgroup rule, reached by a program linked with `-lcuda` through the soname
/// shim; a container without the device has none of it, and once unprepared the
/// runtime refuses the ID.
pub async fn whole_gpu_claim<R: Runtime>(n: &mut Node<R>) {
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
    // containerd: the devices came from the typed CRI field (17), not from annotations.
    n.runtime.assert_devices_received(&ids);
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

    // Unprepare: the spec is gone and the runtime refuses the ID (containerd at
    // CreateContainer).
    n.k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
    assert!(!n.h.spec_path(&c.uid).exists(), "spec removed");
    match n.runtime.run(&ids, "echo started").await {
        Ok(r) => panic!("a container with an unprepared device must not start: {r:?}"),
        Err(e) => assert!(e.contains("unresolvable CDI devices"), "{e}"),
    }
}

/// Two requests of one claim, one per container: each container gets only its
/// request's GPU.
pub async fn two_requests<R: Runtime>(n: &mut Node<R>) {
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

/// A MIG partition: its parent's node and its two capability nodes (GI and CI), the
/// capability openable; no other GPU.
pub async fn mig_claim<R: Runtime>(n: &mut Node<R>) {
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

/// A share of a shared GPU: the preload file and the interception library, the
/// claim's limits and control files read-only and its region writable, only this
/// claim's directory, and none of it writable where it must not be.
pub async fn shared_claim_files<R: Runtime>(n: &mut Node<R>) {
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
