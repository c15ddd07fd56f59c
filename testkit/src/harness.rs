//! A test harness for the plugin: a fake API server, the plugin on the mock node in a
//! temp dir (in-process, or as a child process of the real binary), and helpers that
//! create and allocate claims the way the scheduler would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::fakeapi::{FakeApiConfig, FakeApiServer};
use crate::kubelet_standin::{self, DraClient, KubeletClaim};
use k8s_model::release::KubeVersion;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use kube::api::{Api, PostParams};
use tempfile::TempDir;
use tessera::inventory::mock::StateAccess;
use tessera::node::{BackendPaths, BackendSpec, NodeModel, load_node};
use tessera::plugin::{self, PluginOptions, PluginPaths};
use tessera::prepare::failpoints::FailPoints;

use crate::claims::ClaimBuilder;
pub use crate::claims::{DRIVER, NODE, NS, shared_result};

/// The plugin's directories under one temp dir.
pub fn paths(root: &Path) -> PluginPaths {
    PluginPaths {
        plugin_registry_dir: root.join("plugins_registry"),
        plugin_dir: root.join("plugins").join(DRIVER),
        cdi_dir: root.join("cdi"),
        state_dir: root.join("state"),
        run_dir: root.join("run"),
        host_run_dir: root.join("run"),
        dev_root: PathBuf::from("/"),
        host_dev_root: PathBuf::from("/"),
        driver_root: root.join("driver-root"),
        host_driver_root: root.join("driver-root"),
        proc_root: PathBuf::from("/proc"),
    }
}

pub fn options(root: &Path) -> PluginOptions {
    PluginOptions {
        driver_name: DRIVER.into(),
        node_name: NODE.into(),
        paths: paths(root),
        rolling_update_pod_uid: None,
        stale_check_interval: Duration::from_secs(3600),
        stale_min_age: Duration::from_secs(3600),
        publish_debounce: Duration::from_millis(50),
        fail_points: FailPoints::default(),
        adopt_unknown_mig: false,
        interception_lib: Some(interception_stand_in(root)),
        metrics_addr: None,
        watchdog: tessera::watchdog::Mode::Enforce,
        watchdog_tolerance: tessera::watchdog::DEFAULT_TOLERANCE,
    }
}

/// A shared object standing in for the interception library where a test checks how
/// the plugin installs and mounts it (enforcement is tested in the `cuda` crate):
/// an empty ELF `.so` built with the C compiler, under `<root>/stand-in/`, with a copy
/// beside it standing in for the front library, and forwarding stand-ins for the
/// soname shims: libraries with the driver's soname, nothing of their own and a
/// DT_NEEDED on the real file's container path, as the shims have, so that a
/// container of a whole GPU still reaches its driver through them; and a CDI hook
/// that pins nothing.
pub fn interception_stand_in(root: &Path) -> PathBuf {
    use tessera::prepare::library::{CONTAINER_DRIVER_DIR, SHIMMED};
    let dir = root.join("stand-in");
    let out = dir.join("libtessera_cuda.so");
    let front = dir.join(tessera::prepare::library::FRONT_FILE);
    let hook = dir.join(tessera::prepare::library::HOOK_FILE);
    if out.is_file()
        && front.is_file()
        && hook.is_file()
        && SHIMMED.iter().all(|(_, s, _)| dir.join(s).is_file())
    {
        return out;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("empty.c");
    std::fs::write(&src, "int tessera_stand_in;\n").unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let build = |out: &Path, link: &[String]| {
        let status = Command::new(&cc)
            .args(["-shared", "-fPIC", "-o"])
            .arg(out)
            .arg(&src)
            .args(link)
            .status()
            .expect("a C compiler (cc) builds the stand-in library");
        assert!(status.success(), "building {} failed", out.display());
    };
    build(&out, &[]);
    std::fs::copy(&out, &front).unwrap();
    // The CDI hook's stand-in: an executable that reads the OCI state and pins
    // nothing (the real hook is tested in `cuda/tests/cdi_hook.rs` and the podman
    // suite).
    let hook_src = dir.join("hook.c");
    std::fs::write(
        &hook_src,
        "#include <stdio.h>\nint main(void) { while (getchar() != EOF) {} return 0; }\n",
    )
    .unwrap();
    let status = Command::new(&cc)
        .arg("-o")
        .arg(&hook)
        .arg(&hook_src)
        .status()
        .expect("a C compiler (cc) builds the stand-in hook");
    assert!(status.success(), "building {} failed", hook.display());
    for (soname, shim, real) in SHIMMED {
        let needed = dir.join(format!("needed-{real}.so"));
        build(
            &needed,
            &[format!("-Wl,-soname,{CONTAINER_DRIVER_DIR}/{real}")],
        );
        build(
            &dir.join(shim),
            &[
                format!("-Wl,-soname,{soname}"),
                "-Wl,--no-as-needed".into(),
                needed.display().to_string(),
            ],
        );
    }
    out
}

pub fn model(root: &Path) -> NodeModel {
    load_node(
        &BackendSpec::Mock(None),
        None,
        &BackendPaths {
            state_dir: root.join("state"),
            ..Default::default()
        },
        StateAccess::ReadWrite,
    )
    .expect("mock node loads")
}

/// Creates fake driver files under `<root>/driver-root` so specs mount real paths.
pub fn make_driver_root(root: &Path) {
    let lib = root.join("driver-root/usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::create_dir_all(root.join("driver-root/usr/bin")).unwrap();
    for base in [
        "libcuda.so",
        "libnvidia-ml.so",
        "libnvidia-ptxjitcompiler.so",
        "libnvidia-nvvm.so",
    ] {
        std::fs::write(lib.join(format!("{base}.580.65.06")), b"").unwrap();
    }
    std::fs::write(root.join("driver-root/usr/bin/nvidia-smi"), b"").unwrap();
}

/// Whether a process listens on the Unix socket at `path`: a connection succeeds. (The
/// file alone is not enough: it exists from `bind` on, and a connection made before the
/// `listen` right after it is refused, which a loaded machine makes likely enough.)
pub fn listening(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

pub async fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A plugin running in this process.
pub struct InProcess {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), plugin::PluginError>>>,
}

impl InProcess {
    pub async fn start(api: &FakeApiServer, opts: PluginOptions, model: NodeModel) -> Self {
        let reg = plugin::registration_socket_path(
            &opts.paths.plugin_registry_dir,
            DRIVER,
            opts.rolling_update_pod_uid.as_deref(),
        );
        let _ = std::fs::remove_file(&reg);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(plugin::run(opts, model, api.client().unwrap(), async {
            let _ = rx.await;
        }));
        wait_until("registration socket", || listening(&reg)).await;
        InProcess {
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .expect("plugin stops")
                .expect("plugin task")
                .expect("plugin run");
        }
    }
}

/// Everything a test needs: API server, temp dir, the plugin's options and model.
pub struct Harness {
    pub api: FakeApiServer,
    pub dir: TempDir,
    pub opts: PluginOptions,
    pub model: NodeModel,
}

impl Harness {
    pub async fn new() -> Self {
        Self::with_config(FakeApiConfig::new(KubeVersion::NEWEST)).await
    }

    /// A harness whose fake API server runs with these gates (version included).
    pub async fn with_config(config: FakeApiConfig) -> Self {
        let api = FakeApiServer::start(config).await.unwrap();
        api.add_node(NODE);
        // The plugin's token is bound to its pod on NODE.
        api.set_caller_node(NODE);
        let dir = tempfile::tempdir().unwrap();
        make_driver_root(dir.path());
        let opts = options(dir.path());
        let model = model(dir.path());
        Harness {
            api,
            dir,
            opts,
            model,
        }
    }

    pub async fn start_plugin(&self) -> InProcess {
        InProcess::start(&self.api, self.opts.clone(), self.model.clone()).await
    }

    pub fn registration_socket(&self) -> PathBuf {
        plugin::registration_socket_path(&self.opts.paths.plugin_registry_dir, DRIVER, None)
    }

    /// Registers as the kubelet would and connects to the plugin's endpoint.
    pub async fn kubelet(&self) -> DraClient {
        let (info, _) = kubelet_standin::register(
            &self.registration_socket(),
            &["v1.DRAPlugin", "v1beta1.DRAPlugin"],
        )
        .await
        .unwrap();
        DraClient::connect(Path::new(&info.endpoint)).await.unwrap()
    }

    pub fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.api.client().unwrap(), NS)
    }

    /// Creates a claim with the given requests and sets its allocation to `results`
    /// (request, pool, device, shareID) and opaque `configs` (source, requests, params).
    pub async fn allocated_claim(
        &self,
        name: &str,
        results: &[(&str, &str, &str, Option<&str>)],
        configs: &[(&str, &[&str], serde_json::Value)],
    ) -> KubeletClaim {
        let results = results
            .iter()
            .map(
                |(request, pool, device, share)| DeviceRequestAllocationResult {
                    share_id: share.map(str::to_string),
                    ..crate::claims::result(request, pool, device)
                },
            )
            .collect();
        self.allocated_claim_with(name, results, configs).await
    }

    /// Like [`Harness::allocated_claim`], with full allocation results (for example
    /// [`shared_result`]s carrying `consumedCapacity`).
    pub async fn allocated_claim_with(
        &self,
        name: &str,
        results: Vec<DeviceRequestAllocationResult>,
        configs: &[(&str, &[&str], serde_json::Value)],
    ) -> KubeletClaim {
        let mut b = ClaimBuilder::new(name);
        for r in results {
            b = b.allocated(r);
        }
        for (source, reqs, params) in configs {
            b = b.opaque_config(source, reqs, params.clone());
        }
        // `req/sub` results need a firstAvailable request with that subrequest.
        self.store_allocated(name, b.requests_of_results().reserved_for_its_pod())
            .await
    }

    /// A claim of whole devices `results` (request, device on [`NODE`]) allocated and
    /// reserved for the PodGroup `group`, not for pods.
    pub async fn allocated_group_claim(
        &self,
        name: &str,
        results: &[(&str, &str)],
        group: &str,
    ) -> KubeletClaim {
        let mut b = ClaimBuilder::new(name);
        for (request, device) in results {
            b = b.allocated(crate::claims::result(request, NODE, device));
        }
        self.store_allocated(name, b.requests_of_results().reserved_for_pod_group(group))
            .await
    }

    /// Creates the claim `b` builds and stores its status, allocated on this node.
    async fn store_allocated(&self, name: &str, b: ClaimBuilder) -> KubeletClaim {
        let mut claim = b.clone().build();
        claim.status = None;
        let api = self.claims();
        let mut created = api.create(&PostParams::default(), &claim).await.unwrap();
        let mut status = b.status();
        // As the scheduler allocates node-local devices: to this node by name.
        if let Some(a) = status.allocation.as_mut() {
            a.node_selector.get_or_insert_with(|| node_selector(NODE));
        }
        created.status = Some(status);
        let stored = api
            .replace_status(name, &PostParams::default(), &created)
            .await
            .unwrap();
        KubeletClaim {
            namespace: NS.into(),
            uid: stored.metadata.uid.unwrap(),
            name: name.into(),
        }
    }

    /// Tessera's CDI spec files (and any temp file) in the CDI dir.
    pub fn cdi_files(&self) -> Vec<String> {
        list_files(&self.opts.paths.cdi_dir)
    }

    /// UIDs recorded in the checkpoint.
    pub fn checkpoint_claims(&self) -> Vec<String> {
        checkpoint_claims(&self.opts.paths.state_dir)
    }
}

pub fn list_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

pub fn checkpoint_claims(state_dir: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(state_dir.join("checkpoint.json")) else {
        return vec![];
    };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["claims"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// A plugin running as a child process of the real `tessera` binary.
pub struct ChildPlugin {
    pub child: Child,
}

impl ChildPlugin {
    /// Starts `tessera plugin` (the binary `exe`: the test's `CARGO_BIN_EXE_tessera`) on
    /// the mock node with `fail_points` armed, talking to `api` through a kubeconfig
    /// file; waits until its registration socket listens.
    pub async fn start(exe: &Path, api: &FakeApiServer, root: &Path, fail_points: &str) -> Self {
        Self::start_with(
            exe,
            api,
            root,
            fail_points,
            &["--backend".into(), "mock".into()],
            &[],
        )
        .await
    }

    /// Like [`ChildPlugin::start`], with the backend's flags (`--backend ...` and any
    /// it needs, such as `--proc-root`) and extra environment variables given.
    pub async fn start_with(
        exe: &Path,
        api: &FakeApiServer,
        root: &Path,
        fail_points: &str,
        backend_args: &[std::ffi::OsString],
        env: &[(&str, std::ffi::OsString)],
    ) -> Self {
        let p = paths(root);
        let kubeconfig = root.join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
        let reg = plugin::registration_socket_path(&p.plugin_registry_dir, DRIVER, None);
        let _ = std::fs::remove_file(&reg);
        let child = Command::new(exe)
            // An abort may dump core where core dumps are on: keep it in the temp dir.
            .current_dir(root)
            .arg("plugin")
            .args(["--node-name", NODE])
            .args(backend_args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--plugin-registry-dir")
            .arg(&p.plugin_registry_dir)
            .arg("--plugin-dir")
            .arg(&p.plugin_dir)
            .arg("--cdi-dir")
            .arg(&p.cdi_dir)
            .arg("--state-dir")
            .arg(&p.state_dir)
            .arg("--run-dir")
            .arg(&p.run_dir)
            .arg("--interception-lib")
            .arg(interception_stand_in(root))
            .args(["--metrics-addr", "off"])
            .arg("--driver-root")
            .arg(&p.driver_root)
            .env("TESSERA_FAILPOINTS", fail_points)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn tessera plugin");
        let mut me = ChildPlugin { child };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !listening(&reg) {
            if let Ok(Some(status)) = me.child.try_wait() {
                panic!("plugin exited early: {status}");
            }
            assert!(Instant::now() < deadline, "plugin did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        me
    }

    /// Waits for the process to end (after a fail point) and returns whether it was
    /// killed by a signal (abort).
    pub async fn wait_aborted(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                use std::os::unix::process::ExitStatusExt;
                return status.signal().is_some();
            }
            assert!(Instant::now() < deadline, "plugin did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the process with SIGTERM and waits.
    pub async fn terminate(mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().ok().flatten().is_none() {
            assert!(Instant::now() < deadline, "plugin did not stop on SIGTERM");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ChildPlugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Harness {
    /// Like [`Harness::new`], with the temp dir created under `parent` (benchmarks put
    /// it on disk rather than on a tmpfs `/tmp`).
    pub async fn new_in(parent: &Path) -> Self {
        let api = FakeApiServer::start(FakeApiConfig::new(KubeVersion::NEWEST))
            .await
            .unwrap();
        api.add_node(NODE);
        std::fs::create_dir_all(parent).unwrap();
        let dir = tempfile::tempdir_in(parent).unwrap();
        make_driver_root(dir.path());
        let opts = options(dir.path());
        let model = model(dir.path());
        Harness {
            api,
            dir,
            opts,
            model,
        }
    }

    /// The DRA socket of a plugin started without a rolling-update pod UID.
    pub fn dra_socket(&self) -> PathBuf {
        self.opts.paths.plugin_dir.join("dra.sock")
    }

    /// The path of a claim's CDI spec file.
    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.opts
            .paths
            .cdi_dir
            .join(format!("tessera.dev-gpu-{uid}.json"))
    }

    /// The lifecycle state the checkpoint records for a claim (`PrepareStarted`, ...).
    pub fn checkpoint_state(&self, uid: &str) -> Option<String> {
        checkpoint_state(&self.opts.paths.state_dir, uid)
    }
}

/// The lifecycle state recorded for claim `uid` in `<state_dir>/checkpoint.json`.
pub fn checkpoint_state(state_dir: &Path, uid: &str) -> Option<String> {
    let text = std::fs::read_to_string(state_dir.join("checkpoint.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["claims"][uid]["state"].as_str().map(str::to_string)
}

/// A ResourceClaim as the scheduler leaves it: UID set and one allocated `device` of
/// our driver and pool for `request`. For tests that call `DeviceState` directly.
pub fn allocated_claim_object(uid: &str, request: &str, device: &str) -> ResourceClaim {
    ClaimBuilder::new(&format!("c-{uid}"))
        .uid(uid)
        .device(request, NODE, device)
        .build()
}

/// The node selector the scheduler sets on an allocation of node-local devices:
/// `metadata.name In [node]`.
pub fn node_selector(node: &str) -> k8s_openapi::api::core::v1::NodeSelector {
    use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.into()]),
            }]),
            match_expressions: None,
        }],
    }
}
