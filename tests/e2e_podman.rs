//! Tessera's CDI specs applied by a runtime nobody here wrote: podman 4.3.1 (Debian
//! bookworm) with runc. The plugin runs on the mock node with real character devices
//! under its `--dev-root`, the fake API server and `tessera plan` allocate, the test
//! kubelet prepares, and containers run with the CDI IDs the plugin returned.
//!
//! Prerequisites (`.ci/run` installs them): root, podman, runc, unshare, busybox-static,
//! a C compiler. Without them the suite is skipped, unless `CI` is set.

#[path = "support/e2e.rs"]
mod e2e;
#[path = "support/harness.rs"]
mod harness;

use std::path::PathBuf;
use std::time::Instant;

use e2e::{Podman, Run, assert_nodes, assert_open_allowed, ids, node_script, open_script};
use harness::{Harness, InProcess, NODE};
use tessera::kubelet::{DraClient, KubeletClaim};
use tessera::proto::dra_v1::NodePrepareResourcesResponse;

/// A plugin on the mock node with real device nodes, a stand-in libcuda and podman.
struct Node {
    h: Harness,
    plugin: Option<InProcess>,
    k: DraClient,
    rootfs: PathBuf,
    podman: Podman,
}

impl Node {
    async fn start() -> Node {
        let mut h = Harness::new().await;
        let root = h.dir.path().to_path_buf();
        let built = e2e::build(&root.join("build"));
        let dev_root = root.join("dev-root");
        e2e::make_dev_root(&dev_root, &h.model.inventory);
        h.opts.paths.dev_root = dev_root.clone();
        h.opts.paths.host_dev_root = dev_root;
        // The driver's libcuda is the stand-in (mounted at its soname by the spec).
        let lib = root.join("driver-root/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06");
        std::fs::copy(&built.libcuda, lib).unwrap();
        let plugin = h.start_plugin().await;
        let k = h.kubelet().await;
        let rootfs = e2e::rootfs(&root.join("image"), &[&built.cudaprobe]);
        let podman = Podman::new(&root.join("podman"), &h.opts.paths.cdi_dir);
        Node {
            h,
            plugin: Some(plugin),
            k,
            rootfs,
            podman,
        }
    }

    async fn prepare(&self, c: &KubeletClaim) -> NodePrepareResourcesResponse {
        let r = self.k.prepare_v1(std::slice::from_ref(c)).await.unwrap();
        assert_eq!(r.claims[&c.uid].error, "", "prepare {}", c.name);
        r
    }

    /// Runs `script` in a container given `ids` as `--device` arguments.
    fn run(&self, ids: &[String], script: &str) -> Run {
        let args: Vec<String> = ids
            .iter()
            .flat_map(|i| ["--device".into(), i.clone()])
            .collect();
        self.podman.run(&self.rootfs, &args, script)
    }

    /// Like `run`, but the container must start; failures print podman's CDI errors.
    fn run_ok(&self, ids: &[String], script: &str) -> Run {
        let r = self.run(ids, script);
        assert!(
            r.ok,
            "podman run {ids:?} failed\nstdout:\n{}\nCDI/errors:\n{}\nstderr (end):\n{}",
            r.stdout,
            Podman::cdi_errors(&r),
            r.stderr
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        );
        r
    }

    async fn stop(mut self) {
        if let Some(p) = self.plugin.take() {
            p.stop().await;
        }
    }
}

async fn whole_gpu_claim(n: &Node) {
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
    let out = n.run_ok(&ids, &script);
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
    assert!(
        out.has_line("LIBCUDA=/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        "the program linked with -lcuda loads the mounted library:\n{}",
        out.stdout
    );

    // Control: without the CDI device the same container has no GPU and no library.
    let bare = n.run_ok(&[], &node_script(&[], &["/dev/nvidia2", "/dev/nvidiactl"]));
    assert_nodes(&bare, &[], &["/dev/nvidia2", "/dev/nvidiactl"]);

    // Unprepare: the spec is gone and the runtime refuses the ID.
    n.k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
    let gone = n.run(&ids, "echo started");
    assert!(
        !gone.ok,
        "a container with an unprepared device must not start"
    );
    assert!(
        gone.stderr.contains("unresolvable CDI devices"),
        "{}",
        gone.stderr
    );
}

async fn two_requests(n: &Node) {
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
    let only_a = n.run_ok(&a, &node_script(&["/dev/nvidia2"], &["/dev/nvidia3"]));
    assert_nodes(&only_a, &["/dev/nvidia2"], &["/dev/nvidia3"]);
    let only_b = n.run_ok(&b, &node_script(&["/dev/nvidia3"], &["/dev/nvidia2"]));
    assert_nodes(&only_b, &["/dev/nvidia3"], &["/dev/nvidia2"]);
    n.k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
}

async fn mig_claim(n: &Node) {
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
    let out = n.run_ok(&ids(&r, &c.uid), &script);
    assert_nodes(&out, &present, &["/dev/nvidia1"]);
    assert_open_allowed(&out, &caps[0]);
    n.k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
}

async fn shared_claim_files(n: &Node) {
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
         test -f /usr/local/tessera/lib/libtessera_cuda.so && echo LIB=present; \
         head -1 {base}/limits | sed 's/^/LIMITS=/'; \
         echo forged > {base}/limits 2>/dev/null || echo LIMITS_WRITE=refused; \
         echo forged > {base}/control 2>/dev/null || echo CONTROL_WRITE=refused; \
         echo x > /etc/ld.so.preload 2>/dev/null || echo PRELOAD_WRITE=refused; \
         grep ' {base}/' /proc/self/mountinfo | awk '{{print \"MOUNT=\" $5 \" \" $6}}' | sed 's/,.*//'; \
         ls /run/tessera/claims | sed 's/^/CLAIMDIR=/'; \
         {}",
        node_script(&["/dev/nvidia1"], &["/dev/nvidia0"])
    );
    let out = n.run_ok(&ids(&r, &c.uid), &script);
    assert!(
        out.has_line("PRELOAD=/usr/local/tessera/lib/libtessera_cuda.so"),
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
    assert!(
        out.has_line(&format!("MOUNT={base}/limits ro")),
        "{}",
        out.stdout
    );
    assert!(
        out.has_line(&format!("MOUNT={base}/control ro")),
        "{}",
        out.stdout
    );
    assert!(
        out.has_line(&format!("MOUNT={base}/region rw")),
        "{}",
        out.stdout
    );
    assert!(
        out.has_line(&format!("CLAIMDIR={}", c.uid)),
        "only this claim's directory:\n{}",
        out.stdout
    );
    assert_nodes(&out, &["/dev/nvidia1"], &["/dev/nvidia0"]);
    n.k.unprepare_v1(std::slice::from_ref(&c)).await.unwrap();
}

/// Every scenario on one node and one podman set-up; prints each scenario's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podman_applies_tessera_cdi_specs() {
    if e2e::prerequisites("podman suite", &["podman", "runc", "unshare", "cc"]).is_err() {
        return;
    }
    let t0 = Instant::now();
    let n = Node::start().await;
    eprintln!("podman suite: set-up {:?}", t0.elapsed());
    let version = std::process::Command::new("podman")
        .arg("--version")
        .output()
        .unwrap();
    eprintln!(
        "runtime: {}",
        String::from_utf8_lossy(&version.stdout).trim()
    );
    let t = Instant::now();
    whole_gpu_claim(&n).await;
    eprintln!(
        "passed: whole GPU (nodes, cgroup rule, driver files, -lcuda, unprepare) in {:?}",
        t.elapsed()
    );
    let t = Instant::now();
    two_requests(&n).await;
    eprintln!(
        "passed: two requests, one per container, in {:?}",
        t.elapsed()
    );
    let t = Instant::now();
    mig_claim(&n).await;
    eprintln!(
        "passed: MIG partition (parent and capability nodes) in {:?}",
        t.elapsed()
    );
    let t = Instant::now();
    shared_claim_files(&n).await;
    eprintln!("passed: shared claim files and mounts in {:?}", t.elapsed());
    n.stop().await;
    eprintln!("podman suite: total {:?}", t0.elapsed());
}
