//! The production NVML backend, exercised through the real nvml-wrapper path against
//! the fake `libnvidia-ml.so.1`: on the same simulated node it must discover exactly
//! what the mock backend discovers.
//!
//! Every test that loads the fake runs its checks in a child process of this binary
//! (`with_fake_host`), because the fake reads `TESSERA_FAKE_NVML_STATE_DIR` and
//! mutating the environment of the multi-threaded test process would be `unsafe` and
//! racy. The tests fail (never skip) when no C compiler is available.

use testkit::fake_nvml;

use std::path::Path;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use tessera::inventory::mock::DEFAULT_NODE_YAML;
use tessera::inventory::mock::state::STATE_FILE;
use tessera::inventory::nvml::NvmlBackend;
use tessera::inventory::{BackendError, GpuBackend, MigStatus};

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
        &testkit::test_name!("nvml_discovery_of_the_default_node_equals_mock_discovery"),
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
        &testkit::test_name!("nvml_discovery_of_a_custom_node_equals_mock_discovery"),
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
        &testkit::test_name!("an_unreadable_state_file_fails_nvml_init_cleanly"),
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
        &testkit::test_name!("fake_nvml_keeps_the_nvml_init_and_handle_contract"),
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

// ---- MIG ----
//
// MIG geometry is not the fake's: it forwards every MIG call to the NVML library
// `TESSERA_FAKE_NVML_MIG_LIB` names, and without one a MIG-capable GPU only reports
// its mode. The NVML backend's MIG paths (create, destroy, refusals, crash
// reconciliation) run on NVIDIA's models: `nvml_models` and `nvml_models_mig`.

const INVALID_ARGUMENT: u32 = 2;
const NOT_SUPPORTED: u32 = 3;
const NOT_FOUND: u32 = 6;
const IN_USE: u32 = 19;

/// gpu-2 of the default node: a Tesla T4, not MIG-capable.
const T4_MINOR: u32 = 2;

/// The NVML return code of a MIG refusal; panics on success or any other error.
fn mig_code<T: std::fmt::Debug>(result: Result<T, BackendError>) -> u32 {
    match result {
        Err(BackendError::Mig { source, .. }) => source.nvml_code(),
        other => panic!("expected a MIG refusal, got {other:?}"),
    }
}

/// A GPU without MIG (the T4) reports MIG off and refuses every MIG change with
/// NOT_SUPPORTED, through NVML as through the mock.
#[test]
fn a_gpu_without_mig_refuses_mig_as_not_supported() {
    with_fake_host(
        &testkit::test_name!("a_gpu_without_mig_refuses_mig_as_not_supported"),
        DEFAULT_NODE_YAML,
        |host| {
            let nvml = open_nvml(host).expect("the fake NVML initialises");
            let mock = host.writable_mock_backend();
            assert_eq!(
                nvml.mig_status(T4_MINOR).expect("status"),
                MigStatus::default()
            );
            assert_eq!(
                mock.mig_status(T4_MINOR).expect("status"),
                MigStatus::default()
            );
            let backends: [&dyn GpuBackend; 2] = [&nvml, &mock];
            for backend in backends {
                let kind = backend.kind();
                assert_eq!(
                    mig_code(backend.set_mig_mode(T4_MINOR, true)),
                    NOT_SUPPORTED,
                    "{kind}"
                );
                assert_eq!(
                    mig_code(backend.create_mig(T4_MINOR, 19, 0)),
                    NOT_SUPPORTED,
                    "{kind}"
                );
                assert_eq!(
                    mig_code(backend.destroy_mig(T4_MINOR, 7)),
                    NOT_SUPPORTED,
                    "{kind}"
                );
            }
            assert!(matches!(
                nvml.mig_status(9),
                Err(BackendError::NoSuchGpu(9))
            ));
        },
    );
}

/// Without a MIG library the fake reports a MIG-capable GPU's mode, as the state file
/// has it (switched by the mock backend), and refuses every MIG change with
/// NOT_SUPPORTED: no MIG geometry is written here twice.
#[test]
fn without_a_mig_library_the_fake_reports_mig_mode_only() {
    with_fake_host(
        &testkit::test_name!("without_a_mig_library_the_fake_reports_mig_mode_only"),
        DEFAULT_NODE_YAML,
        |host| {
            let nvml = open_nvml(host).expect("the fake NVML initialises");
            let mock = host.writable_mock_backend();
            assert_eq!(nvml.mig_status(0).expect("status"), MigStatus::default());
            mock.set_mig_mode(0, true)
                .expect("MIG mode on through the mock");
            assert_eq!(
                nvml.mig_status(0).expect("status"),
                MigStatus {
                    enabled: true,
                    instances: vec![]
                }
            );
            assert_eq!(mig_code(nvml.set_mig_mode(0, false)), NOT_SUPPORTED);
            assert_eq!(mig_code(nvml.create_mig(0, 19, 0)), NOT_SUPPORTED);
        },
    );
}

/// With a MIG library (the bridge over go-nvml's DGX H100 model) the fake forwards
/// MIG: the node's H100 (NVML index 0) is the model's GPU 0 for MIG, so the NVML
/// backend's MIG device there is the model's (its MIG UUID the model's), the model's
/// refusals are the backend's, and the mock backend's state file holds no MIG line;
/// the T4 (index 2) stays NOT_SUPPORTED, though the model's GPU 2 can do MIG.
#[test]
fn with_a_mig_library_the_fake_forwards_mig_to_it() {
    fake_nvml::with_fake_host_and_mig(
        &testkit::test_name!("with_a_mig_library_the_fake_forwards_mig_to_it"),
        DEFAULT_NODE_YAML,
        || crate::nvml_models::built().map(|dir| dir.join("libnvidia-ml.so.1")),
        |host| {
            let nvml = open_nvml(host).expect("the fake NVML and its MIG library initialise");
            assert_eq!(nvml.mig_status(0).expect("status"), MigStatus::default());
            nvml.set_mig_mode(0, true)
                .expect("MIG mode on, in the model");
            let made = nvml
                .create_mig(0, 19, 3)
                .expect("1g.10gb at 3, in the model");
            assert_eq!((made.profile_id, made.start, made.size), (19, 3, 1));
            let uuid = made.ci.as_ref().expect("a compute instance").uuid.clone();
            assert!(uuid.starts_with("MIG-"), "{uuid}");
            assert_eq!(
                nvml.mig_status(0).expect("status"),
                MigStatus {
                    enabled: true,
                    instances: vec![made.clone()]
                }
            );
            let text = host.state_text();
            assert!(
                !text.contains("mig-gi") && !text.contains("mig-ci"),
                "{text}"
            );
            assert_eq!(mig_code(nvml.create_mig(T4_MINOR, 19, 0)), NOT_SUPPORTED);
            // The model's refusals, as NVML's: a placement the profile cannot take, a
            // GPU instance that is not there, MIG off while one exists.
            assert_eq!(mig_code(nvml.create_mig(0, 19, 7)), INVALID_ARGUMENT);
            assert_eq!(mig_code(nvml.destroy_mig(0, made.gi_id + 1)), NOT_FOUND);
            assert_eq!(mig_code(nvml.set_mig_mode(0, false)), IN_USE);
            nvml.destroy_mig(0, made.gi_id).expect("destroy");
            nvml.set_mig_mode(0, false).expect("MIG mode off");
            assert_eq!(nvml.mig_status(0).expect("status"), MigStatus::default());
        },
    );
}

/// Health over NVML: XIDs injected into the simulated node after the first poll arrive
/// through the fake's event set (an application XID too: the policy, not the backend,
/// ignores it), with the GPU instance ID when the XID names one; a lost GPU answers
/// `GPU_IS_LOST` and is reported lost, then recovered once it answers again (a reset);
/// a `clear` of a GPU that was never lost reports nothing, on NVML as on the mock, so
/// a fatal XID's taint stays until such a reset. The mock reports the same events.
#[test]
fn nvml_reports_injected_xids_loss_and_recovery() {
    use tessera::device_health::policy::{HealthConfig, NodeHealth};
    use tessera::inventory::HealthEventKind;
    use tessera::inventory::mock::{inject_clear, inject_lost, inject_mig_xid, inject_xid};
    with_fake_host(
        &testkit::test_name!("nvml_reports_injected_xids_loss_and_recovery"),
        DEFAULT_NODE_YAML,
        |host| {
            let nvml = open_nvml(host).expect("the fake NVML initialises");
            let mock = host.mock_backend();
            let kinds = |events: &[tessera::inventory::HealthEvent]| {
                events
                    .iter()
                    .map(|e| (e.minor, e.gi_id, e.kind))
                    .collect::<Vec<_>>()
            };
            let mut health = NodeHealth::new(HealthConfig::default());
            let mut since = 0;
            let mut poll = |health: &mut NodeHealth| {
                let events = nvml.health_events(since).expect("poll");
                for e in &events {
                    since = since.max(e.seq);
                    health.apply(e, tessera::device_health::policy::At::now());
                }
                kinds(&events)
            };
            assert!(poll(&mut health).is_empty(), "first poll");
            // The mock backend registers for events at its first poll too (as an NVML
            // event set does): both see what happens from here on.
            assert!(mock.health_events(0).expect("mock").is_empty());
            let state_dir = host.state_dir();
            inject_xid(&state_dir, 2, 79).unwrap();
            inject_xid(&state_dir, 3, 13).unwrap();
            inject_mig_xid(&state_dir, 0, 7, 48).unwrap();
            assert_eq!(
                poll(&mut health),
                [
                    (2, None, HealthEventKind::Xid(79)),
                    (3, None, HealthEventKind::Xid(13)),
                    (0, Some(7), HealthEventKind::Xid(48)),
                ]
            );
            assert!(poll(&mut health).is_empty());
            assert!(health.unhealthy(2).is_some());

            // No sign of health returning on NVML: the fatal taint stays.
            inject_clear(&state_dir, 2).unwrap();
            assert!(poll(&mut health).is_empty());
            assert!(
                health
                    .expire(std::time::Instant::now() + std::time::Duration::from_secs(315_360_000))
                    .is_empty()
            );
            assert!(health.unhealthy(2).is_some());

            inject_lost(&state_dir, 1).unwrap();
            assert_eq!(poll(&mut health), [(1, None, HealthEventKind::Lost)]);
            match nvml.discover() {
                Err(BackendError::NvmlCall {
                    source: NvmlError::GpuLost,
                    ..
                }) => {}
                other => panic!("discovery of a node with a lost GPU: {other:?}"),
            }
            assert!(poll(&mut health).is_empty());
            inject_clear(&state_dir, 1).unwrap();
            assert_eq!(poll(&mut health), [(1, None, HealthEventKind::Recovered)]);
            assert!(health.unhealthy(1).is_none(), "recovery clears the loss");
            assert_eq!(
                nvml.discover().expect("NVML discovers"),
                mock.discover().expect("mock discovers")
            );

            // A reset of gpu-2 (it drops off the bus, seen by a poll, and answers again)
            // clears its XID.
            inject_lost(&state_dir, 2).unwrap();
            assert_eq!(poll(&mut health), [(2, None, HealthEventKind::Lost)]);
            inject_clear(&state_dir, 2).unwrap();
            assert_eq!(poll(&mut health), [(2, None, HealthEventKind::Recovered)]);
            assert!(
                health.unhealthy(2).is_none(),
                "a reset clears the fatal XID"
            );
            let nvml_all = kinds(&nvml.health_events(0).expect("poll"));
            assert_eq!(kinds(&mock.health_events(0).expect("mock")), nvml_all);
        },
    );
}
