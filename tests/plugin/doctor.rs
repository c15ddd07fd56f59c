//! `tessera doctor` as a specification: a clean mock node passes every check, and
//! breaking one thing at a time makes doctor name that thing with its fix. The node is
//! the mock backend in a temp dir: a fake host root (the runtime's config, the host's
//! loader and glibc, driver trees), a dev root, the plugin's directories, and the fake
//! API server enforcing the shipped ClusterRole.

use testkit::harness;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use tessera::doctor::{DoctorInput, Finding, Report, Verdict};
use tessera::driver_root::{self, LayoutFlags, Origin};
use tessera::node::BackendSpec;
use testkit::fakeapi::{FakeApiConfig, FakeApiServer};

const RBAC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/base/rbac.yaml");

/// The containerd 2.x config of the clean node: CDI on by default, the plugin's CDI dir
/// among the spec dirs.
fn containerd_config(cdi_dir: &Path) -> String {
    format!(
        "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\ncdi_spec_dirs = [\"/etc/cdi\", \"{}\"]\n",
        cdi_dir.display()
    )
}

/// The host's glibc files the interception library (or its stand-in) needs, linked
/// one by one into the fake host root (never whole directories, so that a driver
/// installed on the machine running the tests stays out of the fake host).
fn link_host_glibc(host: &Path) {
    let loader = host.join("lib64/ld-linux-x86-64.so.2");
    std::fs::create_dir_all(loader.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/lib64/ld-linux-x86-64.so.2", &loader).unwrap();
    let dir = host.join("lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&dir).unwrap();
    for name in [
        "libc.so.6",
        "libm.so.6",
        "libdl.so.2",
        "libpthread.so.0",
        "librt.so.1",
        "libgcc_s.so.1",
    ] {
        let real = [
            "/lib/x86_64-linux-gnu",
            "/usr/lib/x86_64-linux-gnu",
            "/lib64",
        ]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists());
        if let Some(real) = real {
            std::os::unix::fs::symlink(real, dir.join(name)).unwrap();
        }
    }
}

/// Driver files of the mock node's driver (580.65.06) in `lib_dir` and `bin_dir`
/// under `root`.
fn driver_tree(root: &Path, lib_dir: &str, bin_dir: &str) {
    let lib = root.join(lib_dir);
    std::fs::create_dir_all(&lib).unwrap();
    for base in ["libcuda.so", "libnvidia-ml.so"] {
        std::fs::write(lib.join(format!("{base}.580.65.06")), b"").unwrap();
        std::os::unix::fs::symlink(format!("{base}.580.65.06"), lib.join(format!("{base}.1")))
            .unwrap();
    }
    std::fs::create_dir_all(root.join(bin_dir)).unwrap();
    std::fs::write(root.join(bin_dir).join("nvidia-smi"), b"").unwrap();
}

/// Device nodes of the mock node (majors 195 and 508, GPUs 0–3, `nvidia-caps`) under
/// `dev_root/dev`: real character devices when `mknod` works (as root), else plain
/// files. Returns whether they are real.
fn device_nodes(dev_root: &Path) -> bool {
    let dev = dev_root.join("dev");
    std::fs::create_dir_all(dev.join("nvidia-caps")).unwrap();
    let nodes = [
        ("nvidiactl", 195, 255),
        ("nvidia-uvm", 508, 0),
        ("nvidia-uvm-tools", 508, 1),
        ("nvidia0", 195, 0),
        ("nvidia1", 195, 1),
        ("nvidia2", 195, 2),
        ("nvidia3", 195, 3),
    ];
    let mut real = true;
    for (name, major, minor) in nodes {
        let path = dev.join(name);
        let ok = Command::new("mknod")
            .arg(&path)
            .arg("c")
            .arg(major.to_string())
            .arg(minor.to_string())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            real = false;
            std::fs::write(&path, b"").unwrap();
        }
    }
    real
}

/// A mock node in a temp dir, healthy until a test breaks one thing.
struct FakeNode {
    h: harness::Harness,
    host: PathBuf,
    dev_root: PathBuf,
    /// Whether the device nodes are real character devices (`mknod` worked).
    real_nodes: bool,
}

impl FakeNode {
    async fn healthy() -> Self {
        let h = harness::Harness::with_config(FakeApiConfig::new(
            k8s_model::release::KubeVersion::NEWEST,
        ))
        .await;
        let root = h.dir.path().to_path_buf();
        let host = root.join("host");
        link_host_glibc(&host);
        std::fs::create_dir_all(host.join("etc/containerd")).unwrap();
        std::fs::write(
            host.join("etc/containerd/config.toml"),
            containerd_config(&h.opts.paths.cdi_dir),
        )
        .unwrap();
        let dev_root = root.join("dev-root");
        let real_nodes = device_nodes(&dev_root);
        let p = &h.opts.paths;
        for d in [
            &p.plugin_registry_dir,
            &p.plugin_dir,
            &p.cdi_dir,
            &p.run_dir,
            &p.state_dir,
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        h.api.set_node_status(
            harness::NODE,
            json!({"nodeInfo": {
                "containerRuntimeVersion": "containerd://2.1.4",
                "kubeletVersion": "v1.37.0", "architecture": "amd64", "bootID": "b",
                "kernelVersion": "6.1", "kubeProxyVersion": "", "machineID": "m",
                "operatingSystem": "linux", "osImage": "Debian", "systemUUID": "s"
            }}),
        );
        h.api
            .enforce_rbac(testkit::rbac::allowed_by_cluster_role(Path::new(RBAC)));
        FakeNode {
            h,
            host,
            dev_root,
            real_nodes,
        }
    }

    fn api(&self) -> &FakeApiServer {
        &self.h.api
    }

    /// What `tessera doctor` would be given: the harness's `--driver-root` (its fake
    /// driver files), this node's dev root and host root.
    fn input(&self) -> DoctorInput {
        let mut opts = self.h.opts.clone();
        opts.paths.dev_root = self.dev_root.clone();
        let layout = driver_root::resolve(
            &LayoutFlags {
                host_root: self.host.clone(),
                driver_root: Some(opts.paths.driver_root.clone()),
                host_driver_root: Some(opts.paths.host_driver_root.clone()),
                dev_root: Some(self.dev_root.clone()),
                host_dev_root: Some("/".into()),
                backend: BackendSpec::Mock(None),
            },
            |_| unreachable!("a given driver root is not probed"),
        );
        DoctorInput {
            opts,
            host_root: self.host.clone(),
            // No runtime process: the config under the fake host root is the one read.
            runtime_proc: self.host.join("proc"),
            layout,
            node: Ok(self.h.model.clone()),
            client: Ok(self.h.api.client().unwrap()),
        }
    }

    async fn doctor(&self) -> Report {
        tessera::doctor::run(&self.input()).await
    }
}

fn finding<'a>(r: &'a Report, check: &str) -> &'a Finding {
    r.get(check)
        .unwrap_or_else(|| panic!("no {check} finding in\n{}", r.render_text()))
}

/// Asserts `check` has `verdict`, its findings mention `saw` and its fix `fix`.
fn assert_names(r: &Report, check: &str, verdict: Verdict, saw: &str, fix: &str) {
    let f = finding(r, check);
    let text = r.render_text();
    assert_eq!(f.verdict, verdict, "{check}:\n{text}");
    assert!(
        f.saw.iter().any(|s| s.contains(saw)),
        "{check} should mention {saw:?}:\n{text}"
    );
    assert!(
        f.fix.as_deref().is_some_and(|x| x.contains(fix)),
        "{check}'s fix should mention {fix:?}:\n{text}"
    );
}

/// Every other check passes (the one broken thing is the only non-pass).
fn assert_only(r: &Report, broken: &str, real_nodes: bool) {
    for f in &r.findings {
        if f.check == broken || (!real_nodes && f.check == "device-nodes") {
            continue;
        }
        assert_eq!(
            f.verdict,
            Verdict::Pass,
            "{}:\n{}",
            f.check,
            r.render_text()
        );
    }
}

/// A clean mock node passes every check; the only honest exception is device nodes
/// made as plain files when the tests cannot `mknod` (not root), which warn.
#[tokio::test]
async fn a_clean_mock_node_passes_every_check() {
    let n = FakeNode::healthy().await;
    let r = n.doctor().await;
    println!("{}", r.render_text());
    let checks: Vec<&str> = r.findings.iter().map(|f| f.check).collect();
    assert_eq!(
        checks,
        [
            "driver-root",
            "driver",
            "device-nodes",
            "driver-files",
            "directories",
            "api-server",
            "rbac",
            "dra-features",
            "gpu-owners",
            "container-runtime",
            "interception-library",
            "watchdog",
        ]
    );
    assert_only(&r, "", n.real_nodes);
    if !n.real_nodes {
        assert_names(
            &r,
            "device-nodes",
            Verdict::Warn,
            "not character devices",
            "nvidia-modprobe",
        );
    }
    assert!(
        finding(&r, "interception-library")
            .saw
            .iter()
            .any(|s| s.starts_with("not checked: a CUDA context")),
        "the finding says what it did not exercise"
    );
    assert!(
        finding(&r, "interception-library")
            .saw
            .iter()
            .any(|s| s.contains("/tessera-cdi-hook loads")),
        "the CDI hook, which the runtime runs on the host, is traced by the host's loader"
    );
    assert_ne!(r.worst(), Verdict::Fail);
}

/// No libcuda under the driver root fails `driver-files` with the driver-root fix.
#[tokio::test]
async fn no_libcuda_under_the_driver_root_fails_with_the_driver_root_fix() {
    let n = FakeNode::healthy().await;
    let lib = n.h.opts.paths.driver_root.join("usr/lib/x86_64-linux-gnu");
    std::fs::remove_file(lib.join("libcuda.so.580.65.06")).unwrap();
    let r = n.doctor().await;
    println!("{}", r.render_text());
    assert_names(
        &r,
        "driver-files",
        Verdict::Fail,
        "libcuda.so not found",
        "--driver-root",
    );
    assert_only(&r, "driver-files", n.real_nodes);
    assert_eq!(r.worst(), Verdict::Fail);
}

/// Each known driver layout, built as a fake host tree, is found by discovery; the
/// host paths the CDI specs mount follow it, and doctor lists the candidates tried.
#[tokio::test]
async fn each_driver_root_layout_is_discovered_and_its_paths_go_into_the_specs() {
    let cases = [
        ("/", "usr/lib/x86_64-linux-gnu", "usr/bin", 1),
        (
            "/run/nvidia/driver",
            "usr/lib/x86_64-linux-gnu",
            "usr/bin",
            2,
        ),
        ("/home/kubernetes/bin/nvidia", "lib64", "bin", 3),
        ("/usr/local/glibc", "usr/lib", "bin", 4),
    ];
    for (candidate, lib_dir, bin_dir, tried) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let host = tmp.path();
        let root = driver_root::under(host, candidate);
        driver_tree(&root, lib_dir, bin_dir);
        let layout = driver_root::discover(
            &LayoutFlags {
                host_root: host.to_path_buf(),
                driver_root: None,
                host_driver_root: None,
                dev_root: None,
                host_dev_root: None,
                backend: BackendSpec::Mock(None),
            },
            Path::new("/proc"),
            Path::new("/sys"),
        );
        assert_eq!(layout.driver_root, root, "{candidate}");
        assert_eq!(layout.host_driver_root, Path::new(candidate));
        let Origin::Discovered(t) = &layout.origin else {
            panic!("discovered")
        };
        assert_eq!(t.len(), tried, "{candidate}: {t:?}");
        // What the plugin mounts into containers: host paths in this layout.
        let files = tessera::prepare::cdi_spec::discover_driver_files(
            &layout.driver_root,
            &layout.host_driver_root,
            "580.65.06",
        );
        let cuda = driver_root::under(
            Path::new(candidate),
            &format!("{lib_dir}/libcuda.so.580.65.06"),
        );
        assert!(
            files.iter().any(|f| Path::new(&f.host_path) == cuda),
            "{candidate}: {files:?}"
        );
        // Doctor shows every candidate tried and the file versions.
        let mut n = FakeNode::healthy().await;
        n.h.opts.paths.driver_root = layout.driver_root.clone();
        n.h.opts.paths.host_driver_root = layout.host_driver_root.clone();
        let mut input = n.input();
        input.layout = layout;
        let r = tessera::doctor::run(&input).await;
        let f = finding(&r, "driver-root");
        assert_eq!(f.verdict, Verdict::Pass, "{}", r.render_text());
        assert!(
            f.saw[tried - 1].contains("used: driver files found"),
            "{f:?}"
        );
        assert!(
            finding(&r, "driver-files")
                .saw
                .iter()
                .any(|s| s.contains(&format!(
                    "{} → /usr/lib/x86_64-linux-gnu/libcuda.so.1 (version 580.65.06)",
                    cuda.display()
                ))),
            "{}",
            r.render_text()
        );
        assert_eq!(
            finding(&r, "driver-files").verdict,
            Verdict::Pass,
            "{}",
            r.render_text()
        );
    }
}

/// A driver container's root with its own `dev/` (the GPU Operator) is also the dev
/// root, as the host sees it.
#[test]
fn a_driver_container_root_with_device_nodes_is_the_dev_root() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("run/nvidia/driver");
    driver_tree(&root, "usr/lib/x86_64-linux-gnu", "usr/bin");
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::write(root.join("dev/nvidiactl"), b"").unwrap();
    let layout = driver_root::resolve(
        &LayoutFlags {
            host_root: tmp.path().to_path_buf(),
            driver_root: None,
            host_driver_root: None,
            dev_root: None,
            host_dev_root: None,
            backend: BackendSpec::Mock(None),
        },
        driver_root::probe_files,
    );
    assert_eq!(layout.dev_root, root);
    assert_eq!(layout.host_dev_root, Path::new("/run/nvidia/driver"));
}

/// With no driver in any known layout, `driver-root` fails, listing every candidate.
#[tokio::test]
async fn no_known_layout_fails_driver_root_listing_every_candidate() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = driver_root::resolve(
        &LayoutFlags {
            host_root: tmp.path().to_path_buf(),
            driver_root: None,
            host_driver_root: None,
            dev_root: None,
            host_dev_root: None,
            backend: BackendSpec::Mock(None),
        },
        driver_root::probe_files,
    );
    let f = tessera::doctor::node::check_driver_root(&layout);
    assert_eq!(f.verdict, Verdict::Fail);
    for c in driver_root::CANDIDATES {
        assert!(
            f.saw
                .iter()
                .any(|s| s.starts_with(c.host_path) && s.contains("no: ")),
            "{f:?}"
        );
    }
    assert!(f.fix.unwrap().contains("hostPaths.driverRoot"));
}

/// Device nodes missing while the driver's majors are known warn (the specs carry
/// them by number) with the `nvidia-modprobe` fix.
#[tokio::test]
async fn missing_device_nodes_with_known_majors_warn_with_the_modprobe_fix() {
    let n = FakeNode::healthy().await;
    std::fs::remove_dir_all(n.dev_root.join("dev")).unwrap();
    let r = n.doctor().await;
    assert_names(
        &r,
        "device-nodes",
        Verdict::Warn,
        "missing (major known): /dev/nvidiactl",
        "nvidia-modprobe -u -c=0",
    );
    assert!(
        finding(&r, "device-nodes")
            .saw
            .iter()
            .any(|s| s.contains("nvidia 195, nvidia-uvm 508"))
    );
    assert_only(&r, "device-nodes", true);
}

/// A containerd 1.7 config with CDI switched off fails the runtime check, naming the
/// setting to turn on.
#[tokio::test]
async fn a_containerd_config_with_cdi_off_fails_naming_enable_cdi() {
    let n = FakeNode::healthy().await;
    std::fs::write(
        n.host.join("etc/containerd/config.toml"),
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = false\n",
    )
    .unwrap();
    n.api().set_node_status(
        harness::NODE,
        json!({"nodeInfo": {"containerRuntimeVersion": "containerd://1.7.24",
            "kubeletVersion": "v1.37.0", "architecture": "amd64", "bootID": "b",
            "kernelVersion": "6.1", "kubeProxyVersion": "", "machineID": "m",
            "operatingSystem": "linux", "osImage": "Debian", "systemUUID": "s"}}),
    );
    let r = n.doctor().await;
    println!("{}", r.render_text());
    assert_names(
        &r,
        "container-runtime",
        Verdict::Fail,
        "enable_cdi = false",
        "[plugins.\"io.containerd.grpc.v1.cri\"] enable_cdi = true",
    );
    assert_only(&r, "container-runtime", n.real_nodes);
}

/// A CDI dir the plugin cannot write (here: a file where the directory should be)
/// fails `directories`, naming it.
#[tokio::test]
async fn an_unwritable_cdi_dir_fails_directories() {
    let n = FakeNode::healthy().await;
    let cdi = &n.h.opts.paths.cdi_dir;
    std::fs::remove_dir_all(cdi).unwrap();
    std::fs::write(cdi, b"").unwrap();
    let r = n.doctor().await;
    assert_names(&r, "directories", Verdict::Fail, "CDI dir", "CDI dir");
    assert!(
        finding(&r, "directories")
            .saw
            .iter()
            .any(|s| s.contains("not a directory"))
    );
    // The runtime check still passes: containerd reads that path, whatever is there.
    assert_only(&r, "directories", n.real_nodes);
}

/// A CDI dir on a read-only mount fails `directories` with the error the write got
/// (root only: a private mount namespace with a read-only bind mount, then the real
/// binary in it).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "root: a read-only bind mount in a private mount namespace (unshare -m)"]
async fn a_read_only_cdi_dir_fails_directories() {
    let n = FakeNode::healthy().await;
    let kubeconfig = n.h.dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, n.api().kubeconfig()).unwrap();
    let cdi = n.h.opts.paths.cdi_dir.display().to_string();
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount --bind -o ro {cdi} {cdi} && exec \"$0\" \"$@\""
        ))
        .arg(env!("CARGO_BIN_EXE_tessera"));
    cli_args(&mut cmd, &n, &kubeconfig);
    let out = tokio::task::block_in_place(|| cmd.args(["-o", "json"]).output().unwrap());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let dirs = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "directories")
        .unwrap();
    assert_eq!(dirs["verdict"], "fail", "{dirs}");
    assert!(
        dirs["saw"].to_string().contains("Read-only file system"),
        "{dirs}"
    );
    assert_eq!(out.status.code(), Some(1));
}

/// A ServiceAccount missing one verb of the ClusterRole fails `rbac`, naming the verb
/// (the fake API server answers the SelfSubjectAccessReviews from the rules it
/// enforces).
#[tokio::test]
async fn rbac_missing_a_verb_fails_naming_it() {
    let n = FakeNode::healthy().await;
    let rules: Vec<_> = testkit::rbac::allowed_by_cluster_role(Path::new(RBAC))
        .into_iter()
        .filter(|(g, r, v)| !(g == "resource.k8s.io" && r == "resourceslices" && v == "watch"))
        .collect();
    n.api().enforce_rbac(rules);
    let r = n.doctor().await;
    println!("{}", r.render_text());
    assert_names(
        &r,
        "rbac",
        Verdict::Fail,
        "denied: watch resourceslices.resource.k8s.io",
        "ClusterRole tessera-plugin",
    );
    assert_only(&r, "rbac", n.real_nodes);
}

/// A device plugin advertising `nvidia.com/gpu` on this Node fails `gpu-owners`.
#[tokio::test]
async fn a_device_plugins_nvidia_gpu_on_the_node_fails_gpu_owners() {
    let n = FakeNode::healthy().await;
    n.api().set_node_status(
        harness::NODE,
        json!({"allocatable": {"nvidia.com/gpu": "4", "cpu": "8"}}),
    );
    let r = n.doctor().await;
    assert_names(
        &r,
        "gpu-owners",
        Verdict::Fail,
        "nvidia.com/gpu=4",
        "uninstall the NVIDIA device plugin",
    );
}

fn cli_args(cmd: &mut Command, n: &FakeNode, kubeconfig: &Path) {
    let p = &n.h.opts.paths;
    cmd.arg("doctor")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("NODE_NAME", harness::NODE)
        .arg("--backend=mock")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--host-root={}", n.host.display()))
        // No runtime process (a cluster on the test machine would be found otherwise).
        .arg(format!("--runtime-proc={}", n.host.join("proc").display()))
        .arg(format!("--dev-root={}", n.dev_root.display()))
        .arg("--host-dev-root=/")
        .arg(format!("--driver-root={}", p.driver_root.display()))
        .arg(format!(
            "--plugin-registry-dir={}",
            p.plugin_registry_dir.display()
        ))
        .arg(format!("--plugin-dir={}", p.plugin_dir.display()))
        .arg(format!("--cdi-dir={}", p.cdi_dir.display()))
        .arg(format!("--state-dir={}", p.state_dir.display()))
        .arg(format!("--run-dir={}", p.run_dir.display()))
        .arg(format!(
            "--interception-lib={}",
            n.h.opts.interception_lib.as_ref().unwrap().display()
        ));
}

/// The CLI: same flags as `plugin`; text by default, JSON with `-o json`; exit code 0
/// without a fail and 1 with one.
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_prints_its_findings_and_exits_non_zero_on_a_fail() {
    let n = FakeNode::healthy().await;
    let kubeconfig = n.h.dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, n.api().kubeconfig()).unwrap();
    let run = |extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
        cli_args(&mut cmd, &n, &kubeconfig);
        tokio::task::block_in_place(|| cmd.args(extra).output().unwrap())
    };
    let out = run(&[]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{text}");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("[pass] rbac"), "{text}");
    assert!(text.contains("0 failed"), "{text}");

    std::fs::remove_file(
        n.h.opts
            .paths
            .driver_root
            .join("usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06"),
    )
    .unwrap();
    let out = run(&["-o", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["result"], "fail");
    assert_eq!(v["node"], harness::NODE);
    let f = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "driver-files")
        .unwrap();
    assert_eq!(f["verdict"], "fail");
    assert!(f["fix"].as_str().unwrap().contains("--driver-root"));
}

/// The runtime's spec dirs are host paths, the plugin's `--cdi-dir` a path in its pod:
/// they are matched by identity (device and inode) as the runtime resolves them, so the
/// default `/var/run/cdi` on the host passes when it is the plugin's CDI dir, and a
/// spec dir that is another directory fails.
#[tokio::test]
async fn the_runtime_spec_dirs_are_matched_by_identity_not_by_path() {
    let n = FakeNode::healthy().await;
    let run = n.host.join("var/run");
    std::fs::create_dir_all(&run).unwrap();
    std::os::unix::fs::symlink(&n.h.opts.paths.cdi_dir, run.join("cdi")).unwrap();
    std::fs::create_dir_all(n.host.join("etc/cdi")).unwrap();
    let config = n.host.join("etc/containerd/config.toml");
    std::fs::write(&config, "version = 3\n").unwrap();
    let r = n.doctor().await;
    let f = finding(&r, "container-runtime");
    assert_eq!(f.verdict, Verdict::Pass, "{}", r.render_text());
    assert!(
        f.saw
            .iter()
            .any(|s| s.starts_with("/var/run/cdi is the plugin's --cdi-dir")),
        "{f:?}"
    );

    std::fs::write(
        &config,
        "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\ncdi_spec_dirs = [\"/etc/cdi\"]\n",
    )
    .unwrap();
    let r = n.doctor().await;
    assert_names(
        &r,
        "container-runtime",
        Verdict::Fail,
        "CDI spec dirs: /etc/cdi",
        "cdi_spec_dirs",
    );
}

/// With several containerd daemons on the host, the config read is the one of the
/// containerd whose socket this pod's shim names (found up the parent PIDs), read
/// through `/proc/<pid>/root` at its `--config` path.
#[tokio::test]
async fn the_containerd_running_this_pod_is_the_one_whose_config_is_read() {
    let n = FakeNode::healthy().await;
    let proc = n.host.join("proc");
    let me = std::process::id();
    let shim = 4_000_000u32;
    let write = |pid: u32, comm: &str, argv: &[&str], ppid: u32| {
        let d = proc.join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("comm"), format!("{comm}\n")).unwrap();
        std::fs::write(d.join("cmdline"), argv.join("\0") + "\0").unwrap();
        std::fs::write(d.join("stat"), format!("{pid} ({comm}) S {ppid} 0 0")).unwrap();
    };
    write(me, "doctor", &["tessera", "doctor"], shim);
    write(
        shim,
        "containerd-shim",
        &[
            "containerd-shim-runc-v2",
            "-namespace",
            "k8s.io",
            "-address",
            "/b/containerd.sock",
        ],
        1,
    );
    // Another cluster's containerd (lower PID, CDI off) and this pod's.
    let cdi = n.h.opts.paths.cdi_dir.display().to_string();
    for (pid, config, text) in [
        (10u32, "/a/config.toml", "version = 2\n[grpc]\naddress = \"/a/containerd.sock\"\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = false\n".to_string()),
        (20, "/b/config.toml", format!("version = 2\n[grpc]\naddress = \"/b/containerd.sock\"\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = true\ncdi_spec_dirs = [\"{cdi}\"]\n")),
    ] {
        write(pid, "containerd", &["containerd", "--config", config], 1);
        let f = proc.join(pid.to_string()).join("root").join(config.trim_start_matches('/'));
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, text).unwrap();
    }
    std::fs::remove_file(n.host.join("etc/containerd/config.toml")).unwrap();
    let r = n.doctor().await;
    let f = finding(&r, "container-runtime");
    assert_eq!(f.verdict, Verdict::Pass, "{}", r.render_text());
    assert!(
        f.saw
            .iter()
            .any(|s| s.contains("/proc/20/root/b/config.toml")),
        "{f:?}"
    );
}
