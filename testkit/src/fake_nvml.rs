//! Test support for the fake `libnvidia-ml.so.1` (`tests/fakes/fake_nvml.c`): builds
//! it with the system C compiler, lays out a simulated host for a mock node (state
//! file, `/proc/devices`, sysfs) and runs a test's checks in a child process whose
//! environment names the state dir.
//!
//! Why a child process: the fake finds its state dir through the environment
//! (`TESSERA_FAKE_NVML_STATE_DIR`), and setting the environment of a test process is
//! `unsafe` in edition 2024 and races with every other test thread; the library's
//! globals are per process as well. So [`with_fake_host`] re-runs the calling test in a
//! fresh process of the same test binary (`<test> --exact`), passing the environment
//! through `Command::env`, which is safe, and asserts that the child ran that one test
//! and passed.

use std::path::{Path, PathBuf};
use std::process::Command;

use tessera::inventory::GpuBackend;
use tessera::inventory::mock::state::STATE_FILE;
use tessera::inventory::mock::{MockBackend, MockNode, StateAccess};
use tessera::inventory::{GpuInfo, NodeInventory};

/// Read by the fake library at `nvmlInit`: the directory holding `mock-node.state`.
pub const STATE_DIR_ENV: &str = "TESSERA_FAKE_NVML_STATE_DIR";
/// The NVML library the fake forwards every MIG call to (the bridge over NVIDIA's
/// models, `tests/nvml-models`); without it the fake does no MIG.
pub const MIG_LIB_ENV: &str = "TESSERA_FAKE_NVML_MIG_LIB";
/// Set in a child process only: the fixture root the parent prepared.
const FIXTURE_ENV: &str = "TESSERA_FAKE_NVML_FIXTURE";
/// Set in a child process only: the test the child was started for.
const CHILD_TEST_ENV: &str = "TESSERA_FAKE_NVML_CHILD_TEST";

const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fakes/fake_nvml.c");
const SONAME: &str = "libnvidia-ml.so.1";

/// Compiles the fake NVML into `out_dir` with `$CC` (default `cc`; it may carry
/// arguments, e.g. `ccache gcc`) and returns the path of `libnvidia-ml.so.1`. Warnings
/// are errors, so the fake stays warning-free.
///
/// # Panics
/// When the compiler cannot be run or fails; the message carries its stderr. A missing
/// compiler fails the test, it never skips it.
pub fn build_fake_nvml(out_dir: &Path) -> PathBuf {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let mut words = cc.split_whitespace();
    let program = words.next().unwrap_or("cc");
    let out = out_dir.join(SONAME);
    let output = Command::new(program)
        .args(words)
        .args(["-shared", "-fPIC", "-pthread", "-std=c11", "-O1"])
        .args(["-Wall", "-Wextra", "-Werror"])
        .arg(format!("-Wl,-soname,{SONAME}"))
        .arg("-o")
        .arg(&out)
        .arg(SOURCE)
        // dlopen of the MIG library (glibc before 2.34 keeps it in libdl).
        .arg("-ldl")
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}` (set CC): {e}"));
    assert!(
        output.status.success(),
        "`{cc}` failed to build {SOURCE} ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// A simulated host in a directory: `node.yaml`, `state/mock-node.state`,
/// `proc/devices`, `sys/...` and `lib/libnvidia-ml.so.1`.
pub struct FakeHost {
    root: PathBuf,
    /// Held by the parent so the directory outlives the child; `None` in the child.
    _tmp: Option<tempfile::TempDir>,
}

impl FakeHost {
    /// Lays out the host for the node described by `node_yaml` and builds the fake
    /// library. The state file is written by the mock backend itself.
    pub fn create(node_yaml: &str) -> Self {
        let tmp = tempfile::tempdir().expect("temp dir");
        let host = FakeHost {
            root: tmp.path().to_path_buf(),
            _tmp: None,
        };
        std::fs::write(host.node_yaml(), node_yaml).expect("write node.yaml");
        let inventory = MockBackend::new(host.node(), host.state_dir(), StateAccess::ReadWrite)
            .discover()
            .expect("mock backend writes the state file");
        write_proc_devices(&host.proc_root(), &inventory);
        for gpu in &inventory.gpus {
            write_sysfs_device(&host.sys_root(), gpu);
        }
        let lib_dir = host.root.join("lib");
        std::fs::create_dir_all(&lib_dir).expect("lib dir");
        build_fake_nvml(&lib_dir);
        FakeHost {
            _tmp: Some(tmp),
            ..host
        }
    }

    /// In a child started by [`FakeHost::run_in_child`] for `test_name`: the parent's
    /// host. `None` in any other process.
    ///
    /// # Panics
    /// When this is a child started for a different test (a wrong name was passed).
    pub fn from_env(test_name: &str) -> Option<Self> {
        let root = std::env::var_os(FIXTURE_ENV)?;
        let child_test = std::env::var(CHILD_TEST_ENV).unwrap_or_default();
        assert_eq!(
            child_test, test_name,
            "child process started for another test"
        );
        Some(FakeHost {
            root: root.into(),
            _tmp: None,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn lib_path(&self) -> PathBuf {
        self.root.join("lib").join(SONAME)
    }
    pub fn proc_root(&self) -> PathBuf {
        self.root.join("proc")
    }
    pub fn sys_root(&self) -> PathBuf {
        self.root.join("sys")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.root.join("state")
    }
    pub fn node_yaml(&self) -> PathBuf {
        self.root.join("node.yaml")
    }

    /// The node description the host was made from.
    pub fn node(&self) -> MockNode {
        MockNode::from_file(&self.node_yaml()).expect("node.yaml parses")
    }

    /// A read-only mock backend over the host's state file.
    pub fn mock_backend(&self) -> MockBackend {
        MockBackend::new(self.node(), self.state_dir(), StateAccess::ReadOnly)
    }

    /// A mock backend that may write the host's state file (MIG changes).
    pub fn writable_mock_backend(&self) -> MockBackend {
        MockBackend::new(self.node(), self.state_dir(), StateAccess::ReadWrite)
    }

    /// The state file's current text.
    pub fn state_text(&self) -> String {
        std::fs::read_to_string(self.state_dir().join(STATE_FILE)).expect("read the state file")
    }

    /// Replaces the state file's text (between scenarios; nothing else writes then).
    pub fn set_state_text(&self, text: &str) {
        std::fs::write(self.state_dir().join(STATE_FILE), text).expect("write the state file");
    }

    /// Re-runs `test_name` of this test binary in a child process with the host's
    /// environment (ignored or not: the parent runs, so the test was asked for).
    /// Panics with the child's output unless exactly that test ran and passed; else
    /// prints what the test printed.
    pub fn run_in_child(&self, test_name: &str) {
        self.run_in_child_with(test_name, &[]);
    }

    /// As [`FakeHost::run_in_child`], with more environment for the child (e.g.
    /// [`MIG_LIB_ENV`]).
    pub fn run_in_child_with(&self, test_name: &str, env: &[(&str, &std::ffi::OsStr)]) {
        let exe = std::env::current_exe().expect("current test binary");
        let output = Command::new(exe)
            .envs(env.iter().copied())
            .args([
                test_name,
                "--exact",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(STATE_DIR_ENV, self.state_dir())
            .env(FIXTURE_ENV, &self.root)
            .env(CHILD_TEST_ENV, test_name)
            .output()
            .expect("spawn child test process");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && stdout.contains("test result: ok. 1 passed"),
            "child process for `{test_name}` did not run and pass ({})\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            output.status
        );
        // The child's own lines (figures a test prints), for `--nocapture`: without
        // the harness's (its first print follows `test <name> ... ` on that line).
        for l in stdout.lines() {
            let l = l.split_once(" ... ").map_or(l, |(_, rest)| rest);
            let harness = l.is_empty()
                || l == "ok"
                || l.starts_with("running ")
                || l.starts_with("test result:");
            if !harness {
                println!("{l}");
            }
        }
    }
}

/// The libtest name of the calling module's test `f`: `module::f` in a test binary made
/// of modules (`tests/<binary>/main.rs`), `f` at a binary's root. For [`with_fake_host`],
/// whose child process runs exactly that test.
#[macro_export]
macro_rules! test_name {
    ($f:literal) => {
        $crate::fake_nvml::test_path(module_path!(), $f)
    };
}

/// `module_path` (`crate::a::b`) without its crate, joined with `f`: `a::b::f`.
pub fn test_path(module_path: &str, f: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{f}"),
        None => f.to_string(),
    }
}

/// Runs `check` on a fake host for `node_yaml` in a child process (see the module
/// docs). `test_name` must be the calling test's own libtest name: see [`test_name!`].
pub fn with_fake_host(test_name: &str, node_yaml: &str, check: impl FnOnce(&FakeHost)) {
    match FakeHost::from_env(test_name) {
        Some(host) => check(&host),
        None => FakeHost::create(node_yaml).run_in_child(test_name),
    }
}

/// The go-nvml model behind the fake's MIG in [`with_fake_host_and_mig`]: the DGX
/// H100, whose GPU 0 is an H100 80GB HBM3 like the default node's gpu-0.
pub const MIG_MODEL: &str = "dgxh100";

/// As [`with_fake_host`], with the fake forwarding MIG to the bridge over NVIDIA's
/// [`MIG_MODEL`] (`tests/nvml-models`), its instances kept in the host's `model/`.
/// `mig_lib` (run in the parent only) gives the bridge's `libnvidia-ml.so.1`; `None`
/// skips the test (its builder decides when that is allowed).
pub fn with_fake_host_and_mig(
    test_name: &str,
    node_yaml: &str,
    mig_lib: impl FnOnce() -> Option<PathBuf>,
    check: impl FnOnce(&FakeHost),
) {
    if let Some(host) = FakeHost::from_env(test_name) {
        return check(&host);
    }
    let Some(lib) = mig_lib() else { return };
    let host = FakeHost::create(node_yaml);
    let state = host.root().join("model");
    host.run_in_child_with(
        test_name,
        &[
            (MIG_LIB_ENV, lib.as_os_str()),
            ("TESSERA_NVML_MODEL", MIG_MODEL.as_ref()),
            ("TESSERA_NVML_MODEL_STATE", state.as_os_str()),
        ],
    );
}

/// `proc/devices` as the kernel prints it, with the node's driver majors.
pub fn write_proc_devices(proc_root: &Path, inventory: &NodeInventory) {
    let majors = &inventory.char_majors;
    let mut text = String::from("Character devices:\n  1 mem\n  4 /dev/vc/0\n  5 /dev/tty\n");
    text += &format!(
        "{:3} nvidia\n{:3} nvidia-uvm\n",
        majors.nvidia, majors.nvidia_uvm
    );
    if let Some(caps) = majors.nvidia_caps {
        text += &format!("{caps:3} nvidia-caps\n");
    }
    text += "\nBlock devices:\n  7 loop\n  8 sd\n259 blkext\n";
    std::fs::create_dir_all(proc_root).expect("proc dir");
    std::fs::write(proc_root.join("devices"), text).expect("write proc/devices");
}

/// The GPU's sysfs device directory, with `numa_node` (-1 when unknown), and the
/// `bus/pci/devices/<bdf>` symlink to it. A GPU with a PCIe root sits below a bridge
/// of that root (`devices/pci0000:80/0000:80:01.0/<bdf>`); one without sits outside
/// any root (`devices/platform/<bdf>`), so that resolving its root finds none.
pub fn write_sysfs_device(sys_root: &Path, gpu: &GpuInfo) {
    let bdf = &gpu.pci_bus_id;
    let rel = match gpu.pcie_root.as_deref() {
        Some(root) => match root.strip_prefix("pci") {
            Some(domain_bus) => format!("devices/{root}/{domain_bus}:01.0/{bdf}"),
            None => format!("devices/{root}/{bdf}"),
        },
        None => format!("devices/platform/{bdf}"),
    };
    let dir = sys_root.join(&rel);
    std::fs::create_dir_all(&dir).expect("sysfs device dir");
    let numa = gpu.numa_node.unwrap_or(-1);
    std::fs::write(dir.join("numa_node"), format!("{numa}\n")).expect("write numa_node");
    let links = sys_root.join("bus/pci/devices");
    std::fs::create_dir_all(&links).expect("sysfs bus dir");
    std::os::unix::fs::symlink(format!("../../../{rel}"), links.join(bdf)).expect("sysfs symlink");
}
