//! Tessera's CDI specs applied by a runtime nobody here wrote: podman 4.3.1 (Debian
//! bookworm) with runc. The plugin runs on the mock node with real character devices
//! under its `--dev-root`, the fake API server and `tessera plan` allocate, the test
//! kubelet prepares, and containers run with the CDI IDs the plugin returned.
//!
//! Prerequisites (`.ci/run` installs them): root, podman, runc, unshare, busybox-static,
//! a C compiler. Without them the suite is skipped, unless `CI` is set.

use std::path::{Path, PathBuf};
use std::time::Instant;

use testkit::e2e::{self, Podman, Run, ids};
use testkit::harness::{self, NODE};
use testkit::kubelet_standin::KubeletClaim;
use testkit::runtime::PodmanRuntime;

use crate::scenarios::{self, Node};

/// A plugin on the mock node with real device nodes, a driver library and podman. With
/// `enforcing`, the driver library is the interception tests' fake libcuda and the
/// plugin installs the real interception library; otherwise a stand-in libcuda that
/// reports where it was loaded from.
async fn start(enforcing: bool) -> Node<PodmanRuntime> {
    let mut h = scenarios::harness_with_dev_root().await;
    let root = h.dir.path().to_path_buf();
    let programs = if enforcing {
        let fakes = e2e::cuda_fakes(&root.join("build"));
        scenarios::install_driver_libcuda(&h, &fakes.libcuda);
        h.opts.interception_lib = Some(e2e::interception_library(Path::new(env!(
            "CARGO_TARGET_TMPDIR"
        ))));
        let mut programs = vec![
            linked_client(&root.join("build"), &fakes.libcuda),
            fakes.client,
        ];
        programs.extend(tenant_programs(&root.join("build")));
        programs
    } else {
        let built = e2e::build(&root.join("build"));
        scenarios::install_driver_libcuda(&h, &built.libcuda);
        vec![built.cudaprobe]
    };
    let (plugin, k) = scenarios::start_plugin(&h).await;
    let programs: Vec<&Path> = programs.iter().map(|p| p.as_path()).collect();
    let rootfs = e2e::rootfs(&root.join("image"), &programs);
    let podman = e2e::Podman::new(&root.join("podman"), &h.opts.paths.cdi_dir);
    Node::new(h, plugin, k, PodmanRuntime::new(podman, &rootfs))
}

/// A tenant's program of `tests/tenants/` (the podman suite builds them with the
/// host's cc and runs them in its containers).
fn tenant_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tenants")
        .join(name)
}

/// `linked <bytes>`, linked against `libcuda.so.1` (no `dlsym`, no
/// `cuGetProcAddress`): `cuInit` and the primary context of device 0 (a line), then a
/// `cuMemAlloc_v2` of `<bytes>` (a line: `ok` or `err <code>`).
fn linked_client(dir: &Path, libcuda: &Path) -> PathBuf {
    let src = tenant_source("linked.c");
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

/// Every scenario on one node and one podman set-up; prints each scenario's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and podman"]
async fn podman_applies_tessera_cdi_specs() {
    if e2e::prerequisites("podman suite", &["podman", "runc", "unshare", "cc"]).is_err() {
        return;
    }
    let t0 = Instant::now();
    let mut n = start(false).await;
    e2e::report(format_args!("podman suite: set-up {:?}", t0.elapsed()));
    let version = std::process::Command::new("podman")
        .arg("--version")
        .output()
        .unwrap();
    e2e::report(format_args!(
        "runtime: {}",
        String::from_utf8_lossy(&version.stdout).trim()
    ));
    scenarios::run_all(&mut n).await;
    n.stop_plugin().await;
    e2e::report(format_args!("podman suite: total {:?}", t0.elapsed()));
}

const GPU1: &str = "GPU-9a7e3b21-0c4d-4f8e-b6a5-2d1c0e9f8a73";
const GPU2: &str = "GPU-1c5b8e4a-7d3f-4a2b-9c61-8e0f4d7a2b95";
const GIB: u64 = 1 << 30;

/// `--device` arguments plus the fake driver's view of the node's GPUs (its own
/// wiring, not a tenant knob): gpu-1 then gpu-2, as ordinals 0 and 1.
fn fake_args(ids: &[String]) -> Vec<String> {
    let mut a = PodmanRuntime::device_args(ids);
    a.push("-e".into());
    a.push(format!(
        "FAKE_CUDA_DEVICES={GPU1}:85520809984,{GPU2}:16106127360"
    ));
    a
}

/// What a tenant's own code would use to reach the driver (installed in
/// `/usr/local/bin`): `tenant path|dlmopen FILE BYTES` opens FILE with `dlopen` or in
/// a new link-map namespace with `dlmopen` and allocates through `dlsym` (one result
/// line for the context, one for the allocation); `audit.so`, an `LD_AUDIT` module
/// that answers ld.so's search for `libcuda.so.1` with the real driver file;
/// `own_dlsym.so`, the tenant's own library defining `dlsym` (to preload); and
/// `static_client`, `cuda_client` linked statically (no ld.so, so no
/// `/etc/ld.so.preload`: what a program linked statically against cudart is).
fn tenant_programs(dir: &Path) -> Vec<PathBuf> {
    let tenant = tenant_source("tenant.c");
    let audit = tenant_source("audit.c");
    let own_dlsym = tenant_source("own_dlsym.c");
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda/tests/fakes/cuda_client.c");
    let builds: [(&str, Vec<String>); 4] = [
        ("tenant", vec![tenant.display().to_string(), "-ldl".into()]),
        (
            "audit.so",
            vec![
                "-shared".into(),
                "-fPIC".into(),
                audit.display().to_string(),
            ],
        ),
        (
            "own_dlsym.so",
            vec![
                "-shared".into(),
                "-fPIC".into(),
                own_dlsym.display().to_string(),
                "-ldl".into(),
            ],
        ),
        (
            "static_client",
            vec![
                "-static".into(),
                "-std=gnu11".into(),
                "-O1".into(),
                client.display().to_string(),
                "-ldl".into(),
                "-lpthread".into(),
            ],
        ),
    ];
    builds
        .into_iter()
        .map(|(name, args)| {
            let out = dir.join(name);
            let r = std::process::Command::new("cc")
                .arg("-o")
                .arg(&out)
                .args(&args)
                .output()
                .unwrap();
            assert!(
                r.status.success(),
                "building {name}: {}",
                String::from_utf8_lossy(&r.stderr)
            );
            out
        })
        .collect()
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
    n: &Node<PodmanRuntime>,
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
/// process with a `dlsym`-defining library preloaded ahead of Tessera's is stopped;
/// the directories above Tessera's mounts cannot be renamed (the spec's hook), and
/// the real driver file named by path keeps the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and podman"]
async fn podman_enforces_shared_budgets() {
    if e2e::prerequisites("podman suite", &["podman", "runc", "unshare", "cc"]).is_err() {
        return;
    }
    let t0 = std::time::Instant::now();
    let mut n = start(true).await;
    e2e::report(format_args!(
        "podman enforcement suite: set-up {:?}",
        t0.elapsed()
    ));
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
    let out = n
        .runtime
        .podman
        .run(&n.runtime.rootfs, &fake_args(&a_ids), &script);
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
    e2e::report(format_args!(
        "passed: budget, virtual total, tenant tricks, forged limits, renamed claim directories, LD_PRELOAD=libc.so.6 in {:?}",
        t.elapsed()
    ));

    // The spec's hook pinned /etc and the directories above Tessera's mounts: the
    // tenant (root in the container, on a writable root where a rename otherwise
    // works) cannot rename them, so ld.so always reads /etc/ld.so.preload and loads
    // the front. Then naming the real driver file: preloading it stops the process
    // before main; a link to it called libcuda.so.1 on LD_LIBRARY_PATH, or its
    // directory on LD_LIBRARY_PATH, keeps the limit for a dlsym client, a
    // cuGetProcAddress client and a program linked with -lcuda.
    let t = std::time::Instant::now();
    let c = "/usr/local/bin/cuda_client";
    let over = 21 * GIB;
    let script = format!(
        "for d in /etc /usr /usr/local /usr/local/tessera; do \
           if mv $d $d.x; then echo renamed $d; else echo refused $d; fi; done; \
         mkdir /scratch && mv /scratch /scratch.x && echo control-renamed; \
         LD_PRELOAD=/usr/local/tessera/driver/libcuda.real {c} dlsym ctx 0 alloc {over}; echo status $?; \
         mkdir /tmp/l && ln -s /usr/local/tessera/driver/libcuda.real /tmp/l/libcuda.so.1; \
         LD_LIBRARY_PATH=/tmp/l {c} dlsym ctx 0 alloc {over}; \
         LD_LIBRARY_PATH=/tmp/l {c} gpa ctx 0 alloc {over}; \
         LD_LIBRARY_PATH=/tmp/l /usr/local/bin/linked {over}; \
         LD_LIBRARY_PATH=/usr/local/tessera/driver {c} dlsym ctx 0 alloc {over}; \
         LD_LIBRARY_PATH=/usr/local/tessera/driver /usr/local/bin/linked {over}; \
         LD_PRELOAD=libc.so.6 /usr/local/bin/linked {over}; echo status $?"
    );
    let out = n
        .runtime
        .podman
        .run_writable(&n.runtime.rootfs, &fake_args(&a_ids), &script);
    assert!(out.ok, "{}\n{}", out.stdout, Podman::cdi_errors(&out));
    for d in ["/etc", "/usr", "/usr/local", "/usr/local/tessera"] {
        assert!(
            out.has_line(&format!("refused {d}")),
            "{d} was renamed:\n{}\n{}",
            out.stdout,
            out.stderr
        );
    }
    assert!(
        out.has_line("control-renamed"),
        "a directory of the image's own is renamed as usual: {}",
        out.stdout
    );
    let statuses: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("status "))
        .collect();
    assert_eq!(
        statuses,
        ["status 126", "status 126"],
        "LD_PRELOAD of the real driver file, and of libc.so.6, stop the process before main:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    let r = results(&out);
    let held: Vec<String> = ["ok", "err 2"]
        .repeat(5)
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        r, held,
        "the real driver reached through LD_LIBRARY_PATH keeps the 20 GiB budget:\n{}\n{}",
        out.stdout, out.stderr
    );
    e2e::report(format_args!(
        "passed: /etc, /usr, /usr/local, /usr/local/tessera pinned; the real driver file preloaded or on LD_LIBRARY_PATH (dlsym, cuGetProcAddress, -lcuda) in {:?}",
        t.elapsed()
    ));

    // Two containers of one claim share its budget; another claim has its own.
    let t = std::time::Instant::now();
    let holder = "tessera-e2e-holder";
    let started = n.runtime.podman.start(
        &n.runtime.rootfs,
        holder,
        &fake_args(&a_ids),
        &format!("{client} alloc {} hold", 12 * GIB),
    );
    assert!(started.ok, "{}", Podman::cdi_errors(&started));
    // A container start takes a second or so; a loaded machine gets a minute.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let logs = n.runtime.podman.logs(holder);
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
    let second = n.runtime.podman.run(
        &n.runtime.rootfs,
        &fake_args(&a_ids),
        &format!("{client} alloc {}", 12 * GIB),
    );
    assert_eq!(
        results(&second),
        ["ok", "err 2"],
        "60 % + 60 % of one claim"
    );
    let other = n.runtime.podman.run(
        &n.runtime.rootfs,
        &fake_args(&b_ids),
        &format!("{client} alloc {}", 25 * GIB),
    );
    assert!(
        results(&other)[1].starts_with("ok "),
        "another claim has its own budget: {:?}",
        results(&other)
    );
    assert!(n.runtime.podman.kill(holder).ok);
    let after = n.runtime.podman.run(
        &n.runtime.rootfs,
        &fake_args(&a_ids),
        &format!("{client} alloc {}", 12 * GIB),
    );
    assert!(
        results(&after)[1].starts_with("ok "),
        "the killed holder's memory came back: {:?}",
        results(&after)
    );
    e2e::report(format_args!(
        "passed: two containers share a claim's budget, another claim its own, in {:?}",
        t.elapsed()
    ));

    // One container with the share and a whole GPU: budgeted and unrestricted.
    let t = std::time::Instant::now();
    let w =
        n.h.allocated_claim("whole", &[("gpu", NODE, "gpu-2", None)], &[])
            .await;
    let w_ids = ids(&n.prepare(&w).await, &w.uid);
    // Both orders of the two specs (CDI: the last one mounting a path wins): the same
    // shim at libcuda.so.1's path, and the shared spec's hook pins /etc.
    for both in [
        a_ids.iter().chain(&w_ids).cloned().collect::<Vec<String>>(),
        w_ids.iter().chain(&a_ids).cloned().collect(),
    ] {
        let out = n.runtime.podman.run_writable(
            &n.runtime.rootfs,
            &fake_args(&both),
            &format!(
                "{client} meminfo ctx 1 meminfo alloc {}; mv /etc /etc.x || echo etc-pinned; \
                 cmp /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/local/tessera/lib/libtessera_shim_cuda.so && echo shim-at-soname; \
                 /usr/local/bin/cuda_client dlsym ctx 0 alloc {}",
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
        assert!(
            out.has_line("etc-pinned") && out.has_line("shim-at-soname"),
            "{both:?}: the shared spec's hook ran and Tessera's shim is at the soname whichever spec came last:\n{}\n{}",
            out.stdout,
            out.stderr
        );
        assert_eq!(r[5..], ["ok", "err 2"], "{both:?}: {r:?}");
    }
    e2e::report(format_args!(
        "passed: a share and a whole GPU in one container in {:?}",
        t.elapsed()
    ));
    n.stop_plugin().await;
    e2e::report(format_args!(
        "podman enforcement suite: total {:?}",
        t0.elapsed()
    ));
}

/// Tenant code and private roots, in a real container of a 20 GiB share: what holds,
/// and what is the watchdog's (docs/security.md, threat model). Held: the real driver
/// file opened by path, an `LD_AUDIT` module that points ld.so's search for
/// `libcuda.so.1` at the real file (the front is loaded and hooks both), and the real
/// file in a new link-map namespace with `dlmopen` (the program's `dlsym` is the
/// front's); the tenant's own library defining `dlsym`, preloaded, stops the process
/// before `main`. A program linked statically (no ld.so, so no front) fails closed. Not
/// held, as the threat model says: a private root, with `chroot` into a tree holding
/// a copy of the driver, or with `unshare -Urm`, a tmpfs over `/etc` and the real file
/// preloaded; dropping `SYS_CHROOT` and refusing `unshare` in the seccomp profile
/// stop both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and podman"]
async fn a_private_root_escapes_the_library_and_dropping_its_privileges_stops_it() {
    if e2e::prerequisites("podman suite", &["podman", "runc", "unshare", "cc"]).is_err() {
        return;
    }
    let mut n = start(true).await;
    let (_a, a_ids) = share(
        &n,
        "light",
        "1a2b3c4d-0000-4000-8000-00000000000c",
        "20Gi",
        "25",
    )
    .await;
    let over = 21 * GIB;
    let real = "/usr/local/tessera/driver/libcuda.real";
    let held = format!(
        "echo case static; /usr/local/bin/static_client dlsym ctx 0 alloc {over}; \
         echo case path; /usr/local/bin/tenant path {real} {over}; \
         echo case audit-dlsym; LD_AUDIT=/usr/local/bin/audit.so /usr/local/bin/cuda_client dlsym ctx 0 alloc {over}; \
         echo case audit-linked; LD_AUDIT=/usr/local/bin/audit.so /usr/local/bin/linked {over}; \
         echo case dlmopen; /usr/local/bin/tenant dlmopen {real} {over}; \
         echo case own-dlsym; LD_PRELOAD=/usr/local/bin/own_dlsym.so /usr/local/bin/cuda_client dlsym ctx 0 alloc {over}; echo err status $?"
    );
    let out = n
        .runtime
        .podman
        .run(&n.runtime.rootfs, &fake_args(&a_ids), &held);
    assert!(out.ok, "{}\n{}", out.stdout, Podman::cdi_errors(&out));
    let by_case = cases(&out.stdout);
    println!("{by_case:?}\n{}", out.stderr);
    // Linked statically, the program has no ld.so and so no front: the shim it
    // dlopens finds none and fails every call (fail closed, not unbudgeted).
    assert_eq!(
        by_case.get("static").map(Vec::as_slice),
        Some(&["err 999".to_string(), "err 999".to_string()][..]),
        "static: CUDA fails closed: {by_case:?}\n{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("cannot find Tessera's front library"),
        "{}",
        out.stderr
    );
    for case in ["path", "audit-dlsym", "audit-linked"] {
        assert_eq!(
            by_case.get(case).map(Vec::as_slice),
            Some(&["ok".to_string(), "err 2".to_string()][..]),
            "{case}: the 20 GiB budget holds: {by_case:?}\n{}",
            out.stderr
        );
    }
    // In a new namespace the real file has no front, but the program's own `dlsym`
    // is still the front's, which answers hooked names with Tessera's hooks: the
    // allocation does not get through. (Code that looks the copy's functions up
    // without the base namespace's `dlsym` is the watchdog's.)
    let dlmopen = by_case.get("dlmopen").cloned().unwrap_or_default();
    assert!(
        dlmopen.len() == 2 && !dlmopen[1].starts_with("ok"),
        "dlmopen: no allocation over the budget: {by_case:?}"
    );
    // The tenant's own library defining dlsym, preloaded ahead of the front: the front's
    // check at load stops the process before main (exit 126), nothing allocated.
    assert_eq!(
        by_case.get("own-dlsym").map(Vec::as_slice),
        Some(&["err status 126".to_string()][..]),
        "own-dlsym: stopped before main: {by_case:?}\n{}",
        out.stderr
    );

    // A private root: a tree with the program, libc, the loader and a copy of the
    // real driver at the soname, and no ld.so.preload; or a user and mount namespace
    // with a tmpfs over /etc and the real file preloaded.
    let private = format!(
        "mkdir -p /nr/usr/local/bin /nr/lib/x86_64-linux-gnu /nr/lib64 /nr/usr/lib/x86_64-linux-gnu /nr/etc /nr/tmp; \
         cp /usr/local/bin/cuda_client /nr/usr/local/bin/; \
         cp /lib/x86_64-linux-gnu/libc.so.6 /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 /nr/lib/x86_64-linux-gnu/; \
         ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 /nr/lib64/ld-linux-x86-64.so.2; \
         cp {real} /nr/usr/lib/x86_64-linux-gnu/libcuda.so.1; \
         echo case chroot; chroot /nr /usr/local/bin/cuda_client dlsym ctx 0 alloc {over} || echo refused chroot; \
         echo case userns; unshare -Urm sh -c 'mount -t tmpfs t /etc && LD_PRELOAD={real} /usr/local/bin/cuda_client dlsym ctx 0 alloc {over}' || echo refused userns"
    );
    let out = n
        .runtime
        .podman
        .run(&n.runtime.rootfs, &fake_args(&a_ids), &private);
    assert!(out.ok, "{}\n{}", out.stdout, Podman::cdi_errors(&out));
    let by_case = cases(&out.stdout);
    println!("defaults: {by_case:?}\n{}", out.stderr);
    for case in ["chroot", "userns"] {
        let r = by_case.get(case).cloned().unwrap_or_default();
        assert!(
            r.len() == 2 && r.iter().all(|l| l.starts_with("ok")),
            "{case}: with podman's default capabilities and seccomp profile a private root escapes the library: {by_case:?}"
        );
    }
    // The same with SYS_CHROOT dropped and a seccomp profile that refuses unshare.
    let profile = n.h.dir.path().join("no-unshare.json");
    std::fs::write(
        &profile,
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["unshare"],"action":"SCMP_ACT_ERRNO","errnoRet":1}]}"#,
    )
    .unwrap();
    let mut args = fake_args(&a_ids);
    args.extend([
        "--cap-drop".to_string(),
        "SYS_CHROOT".to_string(),
        "--security-opt".to_string(),
        format!("seccomp={}", profile.display()),
    ]);
    let out = n.runtime.podman.run(&n.runtime.rootfs, &args, &private);
    assert!(out.ok, "{}\n{}", out.stdout, Podman::cdi_errors(&out));
    let by_case = cases(&out.stdout);
    println!("hardened: {by_case:?}\n{}", out.stderr);
    for case in ["chroot", "userns"] {
        assert_eq!(
            by_case.get(case).map(Vec::as_slice),
            Some(&[format!("refused {case}")][..]),
            "{case}: stopped by the pod's privileges: {by_case:?}\n{}",
            out.stderr
        );
    }
    n.stop_plugin().await;
}

/// The result lines after each `case NAME` line.
fn cases(stdout: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut m = std::collections::BTreeMap::new();
    let mut cur: Option<String> = None;
    for l in stdout.lines() {
        if let Some(c) = l.strip_prefix("case ") {
            cur = Some(c.to_string());
            m.insert(c.to_string(), Vec::new());
        } else if let Some(v) = cur.as_ref().and_then(|c| m.get_mut(c))
            && (l.starts_with("ok") || l.starts_with("err") || l.starts_with("refused"))
        {
            v.push(l.to_string());
        }
    }
    m
}
