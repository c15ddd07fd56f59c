//! The production NVML backend, exercised through the real nvml-wrapper path against
//! the fake `libnvidia-ml.so.1`: on the same simulated node it must discover exactly
//! what the mock backend discovers.
//!
//! Every test that loads the fake runs its checks in a child process of this binary
//! (`with_fake_host`), because the fake reads `TESSERA_FAKE_NVML_STATE_DIR` and
//! mutating the environment of the multi-threaded test process would be `unsafe` and
//! racy. The tests fail (never skip) when no C compiler is available.

#[path = "support/fake_nvml.rs"]
mod fake_nvml;

use std::path::Path;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use tessera::backend::mock::DEFAULT_NODE_YAML;
use tessera::backend::nvml::NvmlBackend;
use tessera::backend::state::STATE_FILE;
use tessera::backend::{BackendError, GpuBackend};

use fake_nvml::{FakeHost, with_fake_host};

/// A node unlike the default: explicit NVML indices that differ from minor order, an
/// A100 with MIG enabled in a non-zero PCI domain, and an L4 with no PCIe root whose
/// NUMA node only sysfs knows (so NVML says "not supported" and sysfs says -1).
const CUSTOM_NODE_YAML: &str = r#"
apiVersion: mock.tessera.dev/v1alpha1
kind: MockNode
driverVersion: "570.133.20"
cudaDriverVersion: "12.8"
charDevices:
  nvidia: 195
  nvidia-uvm: 237
gpus:
- index: 1
  minor: 0
  uuid: GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d
  productName: NVIDIA A100 80GB PCIe
  brand: Tesla
  architecture: Ampere
  memoryBytes: 85899345920
  multiprocessors: 108
  cudaComputeCapability: "8.0"
  pciBusID: "0001:C1:00.0"
  pcieRoot: pci0001:c0
  numaNode: 3
  migCapable: true
  migEnabled: true
- index: 0
  minor: 5
  uuid: GPU-5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9
  productName: NVIDIA L4
  brand: Nvidia
  architecture: Ada
  memoryBytes: 24152899584
  multiprocessors: 58
  cudaComputeCapability: "8.9"
  pciBusID: "0000:82:00.0"
"#;

fn open_nvml(host: &FakeHost) -> Result<NvmlBackend, BackendError> {
    NvmlBackend::new(Some(host.lib_path()), host.proc_root(), host.sys_root())
}

/// NVML discovery of the embedded default node equals the mock backend's discovery.
#[test]
fn nvml_discovery_of_the_default_node_equals_mock_discovery() {
    with_fake_host(
        "nvml_discovery_of_the_default_node_equals_mock_discovery",
        DEFAULT_NODE_YAML,
        |host| {
            let expected = host.mock_backend().discover().expect("mock discovers");
            assert_eq!(expected.gpus.len(), 4);
            let nvml = open_nvml(host).expect("the fake NVML initialises");
            assert_eq!(nvml.kind(), "nvml");
            assert_eq!(nvml.discover().expect("NVML discovers"), expected);
        },
    );
}

/// A custom node (MIG enabled, sparse minors, odd PCI domain, unknown NUMA) also
/// round-trips through NVML discovery unchanged.
#[test]
fn nvml_discovery_of_a_custom_node_equals_mock_discovery() {
    with_fake_host(
        "nvml_discovery_of_a_custom_node_equals_mock_discovery",
        CUSTOM_NODE_YAML,
        |host| {
            let expected = host.mock_backend().discover().expect("mock discovers");
            let got = open_nvml(host)
                .expect("the fake NVML initialises")
                .discover()
                .expect("NVML discovers");
            assert_eq!(got, expected);
            // The properties this node exists to cover, stated outright.
            let a100 = &got.gpus[0];
            assert_eq!((a100.index, a100.minor), (1, 0));
            assert!(a100.mig_capable && a100.mig_enabled);
            assert_eq!(a100.pci_bus_id, "0001:c1:00.0");
            assert_eq!(a100.pcie_root.as_deref(), Some("pci0001:c0"));
            let l4 = &got.gpus[1];
            assert_eq!((l4.index, l4.minor), (0, 5));
            assert_eq!((l4.pcie_root.as_deref(), l4.numa_node), (None, None));
            assert_eq!(got.char_majors.nvidia_caps, None);
        },
    );
}

/// Without a loadable NVML the backend refuses to start and points at `--backend mock`.
#[test]
fn a_missing_nvml_library_is_unavailable_with_a_hint_at_the_mock_backend() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let lib = tmp.path().join("libnvidia-ml.so.1");
    let result = NvmlBackend::new(Some(lib.clone()), tmp.path().into(), tmp.path().into());
    match result {
        Err(err @ BackendError::NvmlUnavailable { .. }) => {
            let msg = err.to_string();
            assert!(msg.contains("--backend mock"), "{msg}");
            assert!(msg.contains(&lib.display().to_string()), "{msg}");
        }
        other => panic!("expected NvmlUnavailable, got {other:?}"),
    }
}

/// A missing, corrupt, truncated, foreign-version or unreadable state file makes
/// NVML init fail with an error, never a panic or a half-read node.
#[test]
fn an_unreadable_state_file_fails_nvml_init_cleanly() {
    with_fake_host(
        "an_unreadable_state_file_fails_nvml_init_cleanly",
        DEFAULT_NODE_YAML,
        |host| {
            let state = host.state_dir().join(STATE_FILE);
            let good = std::fs::read_to_string(&state).expect("state file");
            let truncated: String = good.lines().take(12).map(|l| format!("{l}\n")).collect();
            let write = |text: &str| std::fs::write(&state, text).expect("write state");
            let not_loaded = NvmlError::DriverNotLoaded.to_string();
            let mismatch = NvmlError::LibRmVersionMismatch.to_string();
            let cases: [(&str, &dyn Fn(), &str); 6] = [
                ("garbage", &|| write("not a state file\n"), &mismatch),
                (
                    "another version",
                    &|| write("tessera-node-state 2\n"),
                    &mismatch,
                ),
                ("truncated gpu block", &|| write(&truncated), &not_loaded),
                (
                    "bad value",
                    &|| write(&good.replace("memory 8", "memory x")),
                    &not_loaded,
                ),
                (
                    "missing",
                    &|| std::fs::remove_file(&state).expect("rm"),
                    &not_loaded,
                ),
                (
                    "a directory",
                    &|| std::fs::create_dir(&state).expect("mkdir"),
                    &not_loaded,
                ),
            ];
            for (case, corrupt, reason) in cases {
                corrupt();
                match open_nvml(host) {
                    Err(BackendError::NvmlUnavailable { reason: got, .. }) => {
                        assert_eq!(got, reason, "{case}");
                    }
                    Err(other) => panic!("{case}: expected NvmlUnavailable, got {other:?}"),
                    Ok(_) => panic!("{case}: NVML initialised over a bad state file"),
                }
            }
        },
    );
}

/// The fake counts nested inits like NVML, rejects out-of-range indices with
/// InvalidArg, and serves the v2 memory struct; later MIG work builds on this.
#[test]
fn fake_nvml_keeps_the_nvml_init_and_handle_contract() {
    with_fake_host(
        "fake_nvml_keeps_the_nvml_init_and_handle_contract",
        DEFAULT_NODE_YAML,
        |host| {
            let lib = host.lib_path();
            let init = |lib: &Path| Nvml::builder().lib_path(lib.as_os_str()).init();
            let outer = init(&lib).expect("first init");
            let inner = init(&lib).expect("nested init");
            drop(inner);
            // One shutdown left NVML initialised for the outer user.
            assert_eq!(outer.device_count().expect("count"), 4);
            assert!(matches!(
                outer.device_by_index(4),
                Err(NvmlError::InvalidArg)
            ));
            let dev = outer.device_by_index(2).expect("handle");
            assert_eq!(dev.index().expect("index"), 2);
            let mem = dev.memory_info().expect("memory");
            assert_eq!(
                (mem.total, mem.free, mem.used),
                (16106127360, 16106127360, 0)
            );
            assert!(matches!(dev.mig_mode(), Err(NvmlError::NotSupported)));
            assert_eq!(dev.pci_info().expect("pci").bus_id, "00000000:86:00.0");
        },
    );
}
