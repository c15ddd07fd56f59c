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
use tessera::kubelet::proto::dra_v1::NodePrepareResourcesResponse;
use testkit::kubelet_standin::{DraClient, KubeletClaim};

/// A plugin on the mock node with real device nodes, a driver library and podman.
struct Node {
    h: Harness,
    plugin: Option<InProcess>,
    k: DraClient,
    rootfs: PathBuf,
    podman: Podman,
}

impl Node {
    /// With `enforcing`, the driver library is the interception tests' fake libcuda and
    /// the plugin installs the real interception library; otherwise a stand-in libcuda
    /// that reports where it was loaded from.
    async fn start(enforcing: bool) -> Node {
        let mut h = Harness::new().await;
        let root = h.dir.path().to_path_buf();
        let dev_root = root.join("dev-root");
        e2e::make_dev_root(&dev_root, &h.model.inventory);
        h.opts.paths.dev_root = dev_root.clone();
        h.opts.paths.host_dev_root = dev_root;
        // The driver's libcuda, mounted at its soname by the spec.
        let lib = root.join("driver-root/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06");
        let programs = if enforcing {
            let fakes = e2e::cuda_fakes(&root.join("build"));
            std::fs::copy(&fakes.libcuda, lib).unwrap();
            h.opts.interception_lib = Some(e2e::interception_library());
            vec![
                linked_client(&root.join("build"), &fakes.libcuda),
                fakes.client,
            ]
        } else {
            let built = e2e::build(&root.join("build"));
            std::fs::copy(&built.libcuda, lib).unwrap();
            vec![built.cudaprobe]
        };
        let plugin = h.start_plugin().await;
        let k = h.kubelet().await;
        let programs: Vec<&std::path::Path> = programs.iter().map(|p| p.as_path()).collect();
        let rootfs = e2e::rootfs(&root.join("image"), &programs);
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

/// `linked <bytes>`, linked against `libcuda.so.1` (no `dlsym`, no
/// `cuGetProcAddress`): `cuInit` and the primary context of device 0 (a line), then a
/// `cuMemAlloc_v2` of `<bytes>` (a line: `ok` or `err <code>`).
fn linked_client(dir: &std::path::Path, libcuda: &std::path::Path) -> PathBuf {
    let src = dir.join("linked.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
static void say(CUresult rc) { if (rc) printf("err %d\n", rc); else printf("ok\n"); }
int main(int argc, char **argv) {
    void *ctx = NULL;
    CUdeviceptr p;
    CUresult rc = cuInit(0);
    if (!rc) rc = cuDevicePrimaryCtxRetain(&ctx, 0);
    if (!rc) rc = cuCtxSetCurrent(ctx);
    say(rc);
    if (argc > 1) say(cuMemAlloc_v2(&p, strtoull(argv[1], NULL, 10)));
    return 0;
}
"#,
    )
    .unwrap();
    let bin = dir.join("linked");
    let out = std::process::Command::new("cc")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .arg(libcuda)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
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
    // The plugin has a library installed (the harness's stand-in), so libcuda.so.1 is
    // its soname shim, which forwards to the driver mounted at its fixed path.
    assert!(
        out.has_line("LIBCUDA=/usr/local/tessera/driver/libcuda.real"),
        "the program linked with -lcuda reaches the mounted driver through the shim:\n{}",
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
    let out = n.run_ok(&ids(&r, &c.uid), &script);
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
#[ignore = "needs root and podman"]
async fn podman_applies_tessera_cdi_specs() {
    if e2e::prerequisites("podman suite", &["podman", "runc", "unshare", "cc"]).is_err() {
        return;
    }
    let t0 = Instant::now();
    let n = Node::start(false).await;
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

const GPU1: &str = "GPU-9a7e3b21-0c4d-4f8e-b6a5-2d1c0e9f8a73";
const GPU2: &str = "GPU-1c5b8e4a-7d3f-4a2b-9c61-8e0f4d7a2b95";
const GIB: u64 = 1 << 30;

/// `--device` arguments plus the fake driver's view of the node's GPUs (its own
/// wiring, not a tenant knob): gpu-1 then gpu-2, as ordinals 0 and 1.
fn fake_args(ids: &[String]) -> Vec<String> {
    let mut a: Vec<String> = ids
        .iter()
        .flat_map(|i| ["--device".into(), i.clone()])
        .collect();
    a.push("-e".into());
    a.push(format!(
        "FAKE_CUDA_DEVICES={GPU1}:85520809984,{GPU2}:16106127360"
    ));
    a
}

/// The result lines of `cuda_client` (`ok ...` / `err N` / `holding`).
fn results(r: &Run) -> Vec<String> {
    r.stdout
        .lines()
        .filter(|l| l.starts_with("ok") || l.starts_with("err") || *l == "holding")
        .map(str::to_string)
        .collect()
}

async fn share(
    n: &Node,
    name: &str,
    id: &str,
    memory: &str,
    compute: &str,
) -> (KubeletClaim, Vec<String>) {
    let c =
        n.h.allocated_claim_with(
            name,
            vec![harness::shared_result("gpu", "gpu-1", id, memory, compute)],
            &[],
        )
        .await;
    let r = n.prepare(&c).await;
    let i = ids(&r, &c.uid);
    (c, i)
}

/// Shared claims through podman with the real interception library preloaded by the
/// spec: budgets enforced over the fake driver, shared by two containers of one claim,
/// separate per claim, merged with a whole GPU in one container, and not disabled by
/// the tenant's environment, a forged limits file or renamed claim directories; a
/// process with a `dlsym`-defining library preloaded ahead of Tessera's is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and podman"]
async fn podman_enforces_shared_budgets() {
    if e2e::prerequisites("podman suite", &["podman", "runc", "unshare", "cc"]).is_err() {
        return;
    }
    let t0 = std::time::Instant::now();
    let n = Node::start(true).await;
    eprintln!("podman enforcement suite: set-up {:?}", t0.elapsed());
    let (a, a_ids) = share(
        &n,
        "light",
        "1a2b3c4d-0000-4000-8000-00000000000a",
        "20Gi",
        "25",
    )
    .await;
    let (_b, b_ids) = share(
        &n,
        "heavy",
        "1a2b3c4d-0000-4000-8000-00000000000b",
        "30Gi",
        "40",
    )
    .await;
    let client = "/usr/local/bin/cuda_client gpa ctx 0";

    // Over and under the budget; the virtual total; the tenant's tricks change nothing.
    let t = std::time::Instant::now();
    let forged = format!(
        "mkdir -p /run/tessera/claims/forged && printf 'tessera-limits 1\\nclaim forged\\nscrub-on-free false\\ngpu {GPU1} 85899345920\\n' > /run/tessera/claims/forged/limits && cp /run/tessera/claims/{}/region /run/tessera/claims/forged/region",
        a.uid
    );
    let script = format!(
        "cat /etc/ld.so.preload; {client} alloc {} alloc {} meminfo; \
         unset LD_PRELOAD; LD_PRELOAD= CUDA_DISABLE_CONTROL=true TESSERA_DISABLE=1 {client} alloc {}; \
         {forged}; {client} alloc {}; \
         mv /run/tessera/claims /run/tessera/moved; {client} alloc {}; \
         mv /run/tessera /run/elsewhere; {client} alloc {}; \
         LD_PRELOAD=libc.so.6 /usr/local/bin/cuda_client dlsym ctx 0 alloc {}; echo status $?",
        21 * GIB,
        10 * GIB,
        21 * GIB,
        21 * GIB,
        21 * GIB,
        21 * GIB,
        21 * GIB
    );
    let out = n.podman.run(&n.rootfs, &fake_args(&a_ids), &script);
    assert!(out.ok, "{}\n{}", out.stdout, Podman::cdi_errors(&out));
    let r = results(&out);
    assert_eq!(r[0], "ok", "ctx: {r:?}");
    assert_eq!(r[1], "err 2", "21 GiB over a 20 GiB budget: {r:?}");
    assert!(r[2].starts_with("ok "), "10 GiB under it: {r:?}");
    let total: u64 = r[3].split(' ').nth(2).unwrap().parse().unwrap();
    assert_eq!(
        total,
        20 * GIB,
        "the container sees its budget as the total: {r:?}"
    );
    assert_eq!(
        r[5], "err 2",
        "LD_PRELOAD= and CUDA_DISABLE_CONTROL change nothing: {r:?}"
    );
    assert_eq!(r[7], "err 2", "a forged limits file changes nothing: {r:?}");
    assert_eq!(
        (r[9].as_str(), r[11].as_str()),
        ("err 2", "err 2"),
        "renaming the directories above the claim mounts changes nothing: {r:?}"
    );
    assert_eq!(
        r.len(),
        12,
        "LD_PRELOAD=libc.so.6 (it defines dlsym, ahead of Tessera's): stopped before main: {r:?}"
    );
    assert!(out.stdout.contains("status 126"), "{}", out.stdout);
    eprintln!(
        "passed: budget, virtual total, tenant tricks, forged limits, renamed claim directories, LD_PRELOAD=libc.so.6 in {:?}",
        t.elapsed()
    );

    // Renaming /etc makes ld.so skip /etc/ld.so.preload (no front): the driver's
    // soname is Tessera's shim, the real driver behind it. A dlsym client, a
    // cuGetProcAddress client, a program linked with -lcuda, LD_LIBRARY_PATH at the
    // real files' directory and LD_PRELOAD=libc.so.6 each keep the limit; a
    // non-hooked function forwarded through the handle (cuCtxSetCurrent) works.
    // Renaming /usr/local/tessera takes the real driver away: CUDA fails.
    let t = std::time::Instant::now();
    let c = "/usr/local/bin/cuda_client";
    let over = 21 * GIB;
    let script = format!(
        "mv /etc /etc.x && test ! -e /etc/ld.so.preload && echo etc-moved; \
         {c} dlsym ctx 0 alloc {over}; {c} gpa ctx 0 alloc {over}; /usr/local/bin/linked {over}; \
         LD_LIBRARY_PATH=/usr/local/tessera/driver {c} dlsym ctx 0 alloc {over}; \
         LD_PRELOAD=libc.so.6 {c} dlsym ctx 0 alloc {over}; \
         LD_PRELOAD=libc.so.6 /usr/local/bin/linked {over}; \
         mv /usr/local/tessera /usr/local/x && echo tessera-moved; \
         {c} dlsym ctx 0 alloc {GIB}; echo status $?; /usr/local/bin/linked {GIB}; echo status $?"
    );
    let out = n
        .podman
        .run_writable(&n.rootfs, &fake_args(&a_ids), &script);
    assert!(out.ok, "{}\n{}", out.stdout, Podman::cdi_errors(&out));
    assert!(out.has_line("etc-moved"), "{}\n{}", out.stdout, out.stderr);
    let r = results(&out);
    let held: Vec<String> = ["ok", "err 2"]
        .repeat(6)
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        r[..12],
        held[..],
        "with /etc renamed, each path keeps the 20 GiB budget:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(out.has_line("tessera-moved"), "{}", out.stdout);
    assert!(
        r[12..].iter().all(|l| !l.starts_with("ok")),
        "with /usr/local/tessera renamed, CUDA fails: {r:?}\n{}",
        out.stderr
    );
    eprintln!(
        "passed: /etc renamed (dlsym, cuGetProcAddress, -lcuda, LD_LIBRARY_PATH, LD_PRELOAD=libc.so.6), /usr/local/tessera renamed in {:?}",
        t.elapsed()
    );

    // Two containers of one claim share its budget; another claim has its own.
    let t = std::time::Instant::now();
    let holder = "tessera-e2e-holder";
    let started = n.podman.start(
        &n.rootfs,
        holder,
        &fake_args(&a_ids),
        &format!("{client} alloc {} hold", 12 * GIB),
    );
    assert!(started.ok, "{}", Podman::cdi_errors(&started));
    // A container start takes a second or so; a loaded machine gets a minute.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let logs = n.podman.logs(holder);
        if logs.stdout.contains("holding") {
            assert!(logs.stdout.contains("ok "), "{}", logs.stdout);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "holder: {}",
            logs.stdout
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let second = n.podman.run(
        &n.rootfs,
        &fake_args(&a_ids),
        &format!("{client} alloc {}", 12 * GIB),
    );
    assert_eq!(
        results(&second),
        ["ok", "err 2"],
        "60 % + 60 % of one claim"
    );
    let other = n.podman.run(
        &n.rootfs,
        &fake_args(&b_ids),
        &format!("{client} alloc {}", 25 * GIB),
    );
    assert!(
        results(&other)[1].starts_with("ok "),
        "another claim has its own budget: {:?}",
        results(&other)
    );
    assert!(n.podman.kill(holder).ok);
    let after = n.podman.run(
        &n.rootfs,
        &fake_args(&a_ids),
        &format!("{client} alloc {}", 12 * GIB),
    );
    assert!(
        results(&after)[1].starts_with("ok "),
        "the killed holder's memory came back: {:?}",
        results(&after)
    );
    eprintln!(
        "passed: two containers share a claim's budget, another claim its own, in {:?}",
        t.elapsed()
    );

    // One container with the share and a whole GPU: budgeted and unrestricted.
    let t = std::time::Instant::now();
    let w =
        n.h.allocated_claim("whole", &[("gpu", NODE, "gpu-2", None)], &[])
            .await;
    let w_ids = ids(&n.prepare(&w).await, &w.uid);
    // Both orders of the two specs (CDI: the last one mounting a path wins): the same
    // shim at libcuda.so.1's path, so the share stays budgeted with /etc renamed.
    for both in [
        a_ids.iter().chain(&w_ids).cloned().collect::<Vec<String>>(),
        w_ids.iter().chain(&a_ids).cloned().collect(),
    ] {
        let out = n.podman.run_writable(
            &n.rootfs,
            &fake_args(&both),
            &format!(
                "{client} meminfo ctx 1 meminfo alloc {}; mv /etc /etc.x && test ! -e /etc/ld.so.preload && /usr/local/bin/cuda_client dlsym ctx 0 alloc {}",
                14 * GIB,
                21 * GIB
            ),
        );
        let r = results(&out);
        let total = |line: &str| -> u64 { line.split(' ').nth(2).unwrap().parse().unwrap() };
        assert_eq!(total(&r[1]), 20 * GIB, "the share's budget: {r:?}");
        assert_eq!(
            total(&r[3]),
            16106127360,
            "the whole GPU is unrestricted: {r:?}"
        );
        assert!(r[4].starts_with("ok "), "{r:?}");
        assert_eq!(
            r[5..],
            ["ok", "err 2"],
            "{both:?}: with /etc renamed, the share keeps its budget: {r:?}"
        );
    }
    eprintln!(
        "passed: a share and a whole GPU in one container in {:?}",
        t.elapsed()
    );
    n.stop().await;
    eprintln!("podman enforcement suite: total {:?}", t0.elapsed());
}
