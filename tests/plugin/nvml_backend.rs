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
use tessera::inventory::mock::state::{self, NodeState, STATE_FILE};
use tessera::inventory::mock::{DEFAULT_NODE_YAML, MockBackend};
use tessera::inventory::nvml::NvmlBackend;
use tessera::inventory::{BackendError, ComputeInstance, GpuBackend, MigInstance, MigStatus};
use tessera::mig::mig_uuid;

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

// ---- MIG through NVML over the fake, against the mock backend on the same node ----

const INVALID_ARGUMENT: u32 = 2;
const NOT_SUPPORTED: u32 = 3;
const NOT_FOUND: u32 = 6;
const IN_USE: u32 = 19;
const INSUFFICIENT_RESOURCES: u32 = 23;

/// gpu-0 of the default node: an H100 80GB HBM3, MIG-capable, MIG off.
const H100_UUID: &str = "GPU-4f8d0c1e-6a2b-4c59-9e31-0a7b5d2c9f10";
/// gpu-2 of the default node: a Tesla T4, not MIG-capable.
const T4_MINOR: u32 = 2;

/// The NVML return code of a MIG refusal; panics on success or any other error.
fn mig_code<T: std::fmt::Debug>(result: Result<T, BackendError>) -> u32 {
    match result {
        Err(BackendError::Mig { source, .. }) => source.nvml_code(),
        other => panic!("expected a MIG refusal, got {other:?}"),
    }
}

/// The MIG device a `create_mig` of profile 19 (1g.10gb) at `start` on gpu-0 makes.
fn h100_1g(start: u32) -> MigInstance {
    let gi_id = 7 + start;
    MigInstance {
        gi_id,
        profile_id: 19,
        start,
        size: 1,
        ci: Some(ComputeInstance {
            ci_id: 0,
            uuid: mig_uuid(H100_UUID, gi_id, 0),
        }),
    }
}

/// The state file parses and renders back to the very same text: whoever wrote it
/// last (the fake NVML or the mock backend) wrote exactly what `inventory/mock/state.rs` writes.
fn assert_state_file_is_canonical(host: &FakeHost) {
    let text = host.state_text();
    let parsed = NodeState::parse(&text, Path::new(STATE_FILE)).expect("state file parses");
    assert_eq!(
        parsed.render(),
        text,
        "state file is not in state.rs's rendering"
    );
}

/// Both backends report the same MIG status for `minor`, and return it.
fn same_status(nvml: &NvmlBackend, mock: &MockBackend, minor: u32) -> MigStatus {
    let via_mock = mock.mig_status(minor).expect("mock MIG status");
    assert_eq!(
        nvml.mig_status(minor).expect("NVML MIG status"),
        via_mock,
        "gpu-{minor}"
    );
    via_mock
}

/// A 1g.10gb made through NVML at placement 6 is GI 13 with CI 0 and the MIG UUID
/// geometry::mig_uuid derives, and the mock backend reads exactly that device back.
#[test]
fn a_mig_device_created_through_nvml_is_seen_by_the_mock_backend() {
    with_fake_host(
        &testkit::test_name!("a_mig_device_created_through_nvml_is_seen_by_the_mock_backend"),
        DEFAULT_NODE_YAML,
        |host| {
            let nvml = open_nvml(host).expect("the fake NVML initialises");
            let mock = host.mock_backend();
            assert_eq!(nvml.mig_status(0).expect("status"), MigStatus::default());
            nvml.set_mig_mode(0, true).expect("MIG mode on");
            assert!(mock.mig_status(0).expect("mock status").enabled);

            let made = nvml.create_mig(0, 19, 6).expect("create 1g.10gb at 6");
            assert_eq!(made, h100_1g(6));
            let uuid = &made.ci.as_ref().expect("a compute instance").uuid;
            assert!(uuid.starts_with("MIG-"), "{uuid}");
            let seen = same_status(&nvml, &mock, 0);
            assert_eq!(
                seen,
                MigStatus {
                    enabled: true,
                    instances: vec![made]
                }
            );
            // The other H100 is untouched, and discovery still agrees.
            assert_eq!(same_status(&nvml, &mock, 1), MigStatus::default());
            assert_eq!(
                nvml.discover().expect("NVML discovers"),
                mock.discover().expect("mock discovers")
            );
            assert_state_file_is_canonical(host);
        },
    );
}

/// MIG devices the mock backend makes (a 4g, a 2g and a 1g+me) read back through NVML
/// with the same IDs, placements and UUIDs.
#[test]
fn mig_devices_created_through_the_mock_are_seen_through_nvml() {
    with_fake_host(
        &testkit::test_name!("mig_devices_created_through_the_mock_are_seen_through_nvml"),
        DEFAULT_NODE_YAML,
        |host| {
            let nvml = open_nvml(host).expect("the fake NVML initialises");
            let mock = host.writable_mock_backend();
            // NVML reads first, so it must notice the mock's later writes.
            assert_eq!(nvml.mig_status(1).expect("status"), MigStatus::default());
            mock.set_mig_mode(1, true).expect("MIG mode on");
            let four = mock.create_mig(1, 5, 0).expect("4g.40gb at 0");
            let two = mock.create_mig(1, 14, 4).expect("2g.20gb at 4");
            let me = mock.create_mig(1, 20, 6).expect("1g.10gb+me at 6");
            assert_eq!(
                [four.gi_id, two.gi_id, me.gi_id],
                [1, 5, 13],
                "heap-index GI IDs"
            );
            let status = same_status(&nvml, &mock, 1);
            assert_eq!(status.instances, vec![four, two, me]);
            assert!(status.enabled);
            assert_eq!(
                nvml.discover().expect("NVML discovers"),
                mock.discover().expect("mock discovers")
            );
        },
    );
}

/// A placement that overlaps a live GPU instance, including the very same placement,
/// is INSUFFICIENT_RESOURCES and makes nothing.
#[test]
fn an_overlapping_placement_is_insufficient_resources() {
    with_fake_host(
        &testkit::test_name!("an_overlapping_placement_is_insufficient_resources"),
        DEFAULT_NODE_YAML,
        |host| {
            let nvml = open_nvml(host).expect("the fake NVML initialises");
            let mock = host.mock_backend();
            nvml.set_mig_mode(0, true).expect("MIG mode on");
            nvml.create_mig(0, 19, 6).expect("1g.10gb at 6");
            for (profile, start) in [(19, 6), (15, 6), (9, 4), (0, 0)] {
                assert_eq!(
                    mig_code(nvml.create_mig(0, profile, start)),
                    INSUFFICIENT_RESOURCES,
                    "profile {profile} at {start}"
                );
            }
            assert_eq!(same_status(&nvml, &mock, 0).instances, vec![h100_1g(6)]);
        },
    );
}

/// A start the profile cannot take, or an unknown profile ID, is INVALID_ARGUMENT.
#[test]
fn a_placement_outside_the_profile_is_invalid_argument() {
    with_fake_host(
        &testkit::test_name!("a_placement_outside_the_profile_is_invalid_argument"),
        DEFAULT_NODE_YAML,
        |host| {
            let nvml = open_nvml(host).expect("the fake NVML initialises");
            nvml.set_mig_mode(0, true).expect("MIG mode on");
            for (profile, start) in [(19, 7), (14, 1), (15, 3), (5, 4), (99, 0)] {
                assert_eq!(
                    mig_code(nvml.create_mig(0, profile, start)),
                    INVALID_ARGUMENT,
                    "profile {profile} at {start}"
                );
            }
            assert_eq!(same_status(&nvml, &host.mock_backend(), 0).instances, []);
        },
    );
}

/// Destroying a MIG device with processes on it (`mig-busy`) is IN_USE and leaves the
/// GPU instance and its compute instance in place; once idle it is destroyed.
#[test]
fn destroying_a_busy_mig_device_is_in_use_and_changes_nothing() {
    with_fake_host(
        &testkit::test_name!("destroying_a_busy_mig_device_is_in_use_and_changes_nothing"),
        DEFAULT_NODE_YAML,
        |host| {
            let nvml = open_nvml(host).expect("the fake NVML initialises");
            let mock = host.mock_backend();
            nvml.set_mig_mode(0, true).expect("MIG mode on");
            nvml.create_mig(0, 19, 6).expect("1g.10gb at 6");
            let set_busy = |busy: bool| {
                state::update(&host.state_dir(), |st| {
                    let mig = st.mig.entry(0).or_default();
                    if busy {
                        mig.busy.insert(13);
                    } else {
                        mig.busy.remove(&13);
                    }
                    Ok::<_, ()>(())
                })
                .expect("state update")
                .expect("change applies");
            };
            set_busy(true);
            assert_eq!(mig_code(nvml.destroy_mig(0, 13)), IN_USE);
            assert_eq!(same_status(&nvml, &mock, 0).instances, vec![h100_1g(6)]);
            assert!(host.state_text().contains("mig-busy 13\n"));
            set_busy(false);
            nvml.destroy_mig(0, 13)
                .expect("an idle device is destroyed");
            assert_eq!(same_status(&nvml, &mock, 0).instances, []);
        },
    );
}

/// A destroyed MIG device is gone for both backends, whichever made or destroyed it,
/// and destroying it again is NOT_FOUND.
#[test]
fn a_destroyed_mig_device_is_gone_on_both_sides() {
    with_fake_host(
        &testkit::test_name!("a_destroyed_mig_device_is_gone_on_both_sides"),
        DEFAULT_NODE_YAML,
        |host| {
            let nvml = open_nvml(host).expect("the fake NVML initialises");
            let mock = host.writable_mock_backend();
            nvml.set_mig_mode(0, true).expect("MIG mode on");

            nvml.create_mig(0, 19, 6).expect("create through NVML");
            nvml.destroy_mig(0, 13).expect("destroy through NVML");
            assert_eq!(same_status(&nvml, &mock, 0).instances, []);
            assert_eq!(mig_code(nvml.destroy_mig(0, 13)), NOT_FOUND);
            assert_eq!(mig_code(mock.destroy_mig(0, 13)), NOT_FOUND);

            mock.create_mig(0, 14, 2).expect("create through the mock");
            nvml.destroy_mig(0, 4).expect("destroy through NVML");
            assert_eq!(same_status(&nvml, &mock, 0).instances, []);

            nvml.create_mig(0, 19, 0).expect("create through NVML");
            mock.destroy_mig(0, 7).expect("destroy through the mock");
            assert_eq!(same_status(&nvml, &mock, 0).instances, []);
            assert_state_file_is_canonical(host);
        },
    );
}

/// Seven 1g.10gb fill placements 0–6 as GIs 7–13; an eighth finds no room.
#[test]
fn an_eighth_1g_device_does_not_fit_after_seven() {
    with_fake_host(
        &testkit::test_name!("an_eighth_1g_device_does_not_fit_after_seven"),
        DEFAULT_NODE_YAML,
        |host| {
            let nvml = open_nvml(host).expect("the fake NVML initialises");
            let mock = host.mock_backend();
            nvml.set_mig_mode(0, true).expect("MIG mode on");
            for start in 0..7 {
                assert_eq!(
                    nvml.create_mig(0, 19, start).expect("1g.10gb"),
                    h100_1g(start)
                );
            }
            for start in 0..7 {
                assert_eq!(
                    mig_code(nvml.create_mig(0, 19, start)),
                    INSUFFICIENT_RESOURCES
                );
            }
            assert_eq!(
                same_status(&nvml, &mock, 0).instances,
                (0..7).map(h100_1g).collect::<Vec<_>>()
            );
        },
    );
}

/// MIG mode cannot be switched off while MIG devices exist (IN_USE, mode stays on);
/// with none left it switches off for both backends.
#[test]
fn mig_mode_cannot_be_switched_off_while_mig_devices_exist() {
    with_fake_host(
        &testkit::test_name!("mig_mode_cannot_be_switched_off_while_mig_devices_exist"),
        DEFAULT_NODE_YAML,
        |host| {
            let nvml = open_nvml(host).expect("the fake NVML initialises");
            let mock = host.mock_backend();
            nvml.set_mig_mode(0, true).expect("MIG mode on");
            nvml.set_mig_mode(0, true)
                .expect("switching on again is a no-op");
            nvml.create_mig(0, 9, 4).expect("3g.40gb at 4");
            assert_eq!(mig_code(nvml.set_mig_mode(0, false)), IN_USE);
            assert!(same_status(&nvml, &mock, 0).enabled);
            nvml.destroy_mig(0, 2).expect("destroy the 3g");
            nvml.set_mig_mode(0, false).expect("MIG mode off");
            assert_eq!(same_status(&nvml, &mock, 0), MigStatus::default());
            assert_eq!(mig_code(nvml.create_mig(0, 19, 6)), NOT_SUPPORTED);
        },
    );
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
            assert_eq!(same_status(&nvml, &mock, T4_MINOR), MigStatus::default());
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

/// One MIG request of the scenario below.
#[derive(Debug, Clone, Copy)]
enum MigRequest {
    Status(u32),
    SetMode(u32, bool),
    Create(u32, u32, u32),
    Destroy(u32, u32),
}

/// What a backend answered, comparable across backends.
#[derive(Debug, PartialEq, Eq)]
enum MigAnswer {
    Status(MigStatus),
    Made(MigInstance),
    Done,
    Refused(u32),
    NoSuchGpu(u32),
}

fn ask(backend: &dyn GpuBackend, request: MigRequest) -> MigAnswer {
    let answer = |result: Result<MigAnswer, BackendError>| match result {
        Ok(answer) => answer,
        Err(BackendError::Mig { source, .. }) => MigAnswer::Refused(source.nvml_code()),
        Err(BackendError::NoSuchGpu(minor)) => MigAnswer::NoSuchGpu(minor),
        Err(other) => panic!("{}: {request:?} failed: {other:?}", backend.kind()),
    };
    answer(match request {
        MigRequest::Status(minor) => backend.mig_status(minor).map(MigAnswer::Status),
        MigRequest::SetMode(minor, on) => backend.set_mig_mode(minor, on).map(|()| MigAnswer::Done),
        MigRequest::Create(minor, profile, start) => backend
            .create_mig(minor, profile, start)
            .map(MigAnswer::Made),
        MigRequest::Destroy(minor, gi) => backend.destroy_mig(minor, gi).map(|()| MigAnswer::Done),
    })
}

/// The same sequence of MIG requests, from the same node state, gets the same answers
/// (instances, UUIDs and NVML codes) from the NVML backend over the fake as from the
/// mock backend, and leaves the same state file.
#[test]
fn nvml_and_mock_answer_the_same_mig_requests_identically() {
    use MigRequest::*;
    let scenario = [
        Create(0, 19, 6),
        Destroy(0, 13),
        SetMode(0, true),
        SetMode(0, true),
        Create(0, 19, 6),
        Create(0, 19, 6),
        Create(0, 19, 7),
        Create(0, 5, 0),
        Create(0, 9, 0),
        Create(0, 9, 4),
        Create(0, 20, 5),
        Create(0, 20, 4),
        Create(0, 15, 4),
        Create(0, 99, 0),
        SetMode(0, false),
        Destroy(0, 2),
        Destroy(0, 12),
        Status(0),
        Create(1, 0, 0),
        SetMode(1, true),
        Create(1, 0, 0),
        Create(1, 19, 0),
        Status(1),
        Destroy(1, 0),
        SetMode(1, false),
        SetMode(T4_MINOR, true),
        Status(T4_MINOR),
        Status(9),
        Create(9, 19, 0),
    ];
    with_fake_host(
        &testkit::test_name!("nvml_and_mock_answer_the_same_mig_requests_identically"),
        DEFAULT_NODE_YAML,
        |host| {
            let initial = host.state_text();
            let nvml = open_nvml(host).expect("the fake NVML initialises");
            let via_nvml: Vec<_> = scenario.iter().map(|r| ask(&nvml, *r)).collect();
            let nvml_state = host.state_text();

            host.set_state_text(&initial);
            let mock = host.writable_mock_backend();
            let via_mock: Vec<_> = scenario.iter().map(|r| ask(&mock, *r)).collect();
            for ((request, n), m) in scenario.iter().zip(&via_nvml).zip(&via_mock) {
                assert_eq!(n, m, "{request:?}: NVML (left) and mock (right) differ");
            }
            assert_eq!(nvml_state, host.state_text(), "final state files differ");
            // The scenario exercises every refusal code, not just successes.
            for code in [
                INVALID_ARGUMENT,
                NOT_SUPPORTED,
                NOT_FOUND,
                IN_USE,
                INSUFFICIENT_RESOURCES,
            ] {
                assert!(
                    via_nvml.contains(&MigAnswer::Refused(code)),
                    "code {code} unexercised"
                );
            }
        },
    );
}

/// `nvmlGpuInstanceProfileInfo_v2_t` (152 bytes).
#[repr(C)]
struct GiProfileInfoV2 {
    version: u32,
    id: u32,
    is_p2p_supported: u32,
    slice_count: u32,
    instance_count: u32,
    counts: [u32; 6],
    memory_size_mb: u64,
    name: [u8; 96],
}

/// `nvmlGpuInstanceProfileInfo_v3_t` (152 bytes): no isP2pSupported, capabilities last.
#[repr(C)]
struct GiProfileInfoV3 {
    version: u32,
    id: u32,
    slice_count: u32,
    instance_count: u32,
    counts: [u32; 6],
    memory_size_mb: u64,
    name: [u8; 96],
    capabilities: u32,
}

/// `NVML_STRUCT_VERSION(T, v)`.
fn struct_version<T>(v: u32) -> u32 {
    size_of::<T>() as u32 | (v << 24)
}

fn c_name(name: &[u8]) -> &str {
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    std::str::from_utf8(&name[..end]).expect("UTF-8 name")
}

/// The fake's MIG entry points keep NVML's contract where the backend does not look:
/// profile info by index (v1, V with v2/v3, bad versions and indices), possible
/// placements with the count protocol, remaining capacity, and GI destroy refused
/// while its CI lives, NOT_FOUND once gone.
#[test]
fn fake_nvml_mig_calls_keep_the_nvml_contract() {
    with_fake_host(
        &testkit::test_name!("fake_nvml_mig_calls_keep_the_nvml_contract"),
        DEFAULT_NODE_YAML,
        |host| {
            let lib_path = host.lib_path();
            let nvml = Nvml::builder()
                .lib_path(lib_path.as_os_str())
                .init()
                .expect("init");
            let lib = nvml.lib();
            let h100 = nvml.device_by_index(0).expect("gpu-0");
            let t4 = nvml.device_by_index(T4_MINOR).expect("gpu-2");
            // SAFETY: `handle` only copies the handle out of the wrapper.
            let dev = unsafe { h100.handle() };

            let one_g = h100.profile_info(0).expect("1g.10gb by index 0");
            assert_eq!(
                (
                    one_g.id,
                    one_g.slice_count,
                    one_g.instance_count,
                    one_g.memory_size_mb
                ),
                (19, 1, 7, 9984)
            );
            let seven_g = h100.profile_info(4).expect("7g.80gb by index 4");
            assert_eq!(
                (seven_g.id, seven_g.slice_count, seven_g.instance_count),
                (0, 7, 1)
            );
            assert!(matches!(h100.profile_info(5), Err(NvmlError::NotSupported)));
            assert!(matches!(
                h100.profile_info(0x12),
                Err(NvmlError::InvalidArg)
            ));
            assert!(matches!(t4.profile_info(0), Err(NvmlError::NotSupported)));

            let info_v = lib
                .nvmlDeviceGetGpuInstanceProfileInfoV
                .as_ref()
                .expect("symbol");
            // SAFETY (all calls below): `dev` is a live handle of this NVML, and every
            // buffer is a `#[repr(C)]` mirror of the nvml.h struct the symbol takes,
            // passed with its version or element count.
            let mut v2: GiProfileInfoV2 = unsafe { std::mem::zeroed() };
            v2.version = struct_version::<GiProfileInfoV2>(2);
            assert_eq!(v2.version, 0x0200_0098);
            assert_eq!(unsafe { info_v(dev, 9, (&raw mut v2).cast()) }, 0);
            assert_eq!((v2.id, v2.slice_count, v2.instance_count), (15, 1, 4));
            assert_eq!((v2.is_p2p_supported, v2.memory_size_mb), (0, 20096));
            assert_eq!(c_name(&v2.name), "MIG 1g.20gb");
            let mut v3: GiProfileInfoV3 = unsafe { std::mem::zeroed() };
            v3.version = struct_version::<GiProfileInfoV3>(3);
            assert_eq!(unsafe { info_v(dev, 2, (&raw mut v3).cast()) }, 0);
            assert_eq!((v3.id, v3.slice_count, v3.instance_count), (9, 3, 2));
            assert_eq!(
                (v3.counts[0], v3.memory_size_mb, v3.capabilities),
                (60, 40448, 0)
            );
            assert_eq!(c_name(&v3.name), "MIG 3g.40gb");
            v3.version = struct_version::<GiProfileInfoV3>(1);
            assert_eq!(
                unsafe { info_v(dev, 2, (&raw mut v3).cast()) },
                INVALID_ARGUMENT
            );

            let placements = lib
                .nvmlDeviceGetGpuInstancePossiblePlacements_v2
                .as_ref()
                .expect("symbol");
            let mut count = 0u32;
            let no_buffer = std::ptr::null_mut();
            assert_eq!(unsafe { placements(dev, 15, no_buffer, &mut count) }, 0);
            assert_eq!(count, 4);
            let mut buf = [[0u32; 2]; 4];
            count = 2;
            let insufficient = unsafe { placements(dev, 15, buf.as_mut_ptr().cast(), &mut count) };
            assert_eq!((insufficient, count), (7, 4));
            assert_eq!(
                unsafe { placements(dev, 15, buf.as_mut_ptr().cast(), &mut count) },
                0
            );
            assert_eq!(buf, [[0, 2], [2, 2], [4, 2], [6, 2]]);
            assert_eq!(
                unsafe { placements(dev, 99, buf.as_mut_ptr().cast(), &mut count) },
                INVALID_ARGUMENT
            );

            let remaining = lib
                .nvmlDeviceGetGpuInstanceRemainingCapacity
                .as_ref()
                .expect("symbol");
            assert_eq!(unsafe { remaining(dev, 19, &mut count) }, NOT_SUPPORTED);
            let backend = open_nvml(host).expect("the fake NVML initialises");
            backend.set_mig_mode(0, true).expect("MIG mode on");
            assert_eq!(unsafe { remaining(dev, 19, &mut count) }, 0);
            assert_eq!(count, 7);
            backend.create_mig(0, 9, 0).expect("3g.40gb at 0 (GI 1)");
            assert_eq!(unsafe { remaining(dev, 19, &mut count) }, 0);
            assert_eq!(count, 3, "only placements 4, 5, 6 remain for 1g");

            let by_id = lib.nvmlDeviceGetGpuInstanceById.as_ref().expect("symbol");
            let destroy_gi = lib.nvmlGpuInstanceDestroy.as_ref().expect("symbol");
            let get_cis = lib
                .nvmlGpuInstanceGetComputeInstances
                .as_ref()
                .expect("symbol");
            let destroy_ci = lib.nvmlComputeInstanceDestroy.as_ref().expect("symbol");
            let mut gi = std::ptr::null_mut();
            assert_eq!(unsafe { by_id(dev, 2, &mut gi) }, NOT_FOUND);
            assert_eq!(unsafe { by_id(dev, 1, &mut gi) }, 0);
            assert_eq!(unsafe { destroy_gi(gi) }, IN_USE, "its CI still lives");
            let mut cis = [std::ptr::null_mut(); 1];
            // 3g's full-GI compute instance is CI profile 2; profile 0 does not fit it.
            assert_eq!(
                unsafe { get_cis(gi, 0, cis.as_mut_ptr(), &mut count) },
                NOT_SUPPORTED
            );
            assert_eq!(unsafe { get_cis(gi, 2, cis.as_mut_ptr(), &mut count) }, 0);
            assert_eq!(count, 1);
            assert_eq!(unsafe { destroy_ci(cis[0]) }, 0);
            assert_eq!(unsafe { destroy_gi(gi) }, 0);
            assert_eq!(unsafe { destroy_gi(gi) }, NOT_FOUND, "already destroyed");
            assert_eq!(backend.mig_status(0).expect("status").instances, []);
            assert_state_file_is_canonical(host);
        },
    );
}

/// Health over NVML: XIDs injected into the simulated node after the first poll arrive
/// through the fake's event set (an application XID too: the policy, not the backend,
/// ignores it), with the GPU instance ID when the XID names one; a lost GPU answers
/// `GPU_IS_LOST` and is reported lost, then recovered once it answers again (a reset);
/// a `clear` of a GPU that was never lost reports nothing, on NVML as on the mock, so
/// a fatal XID's taint stays until such a reset. The mock reports the same events. The
/// fake's MIG writes keep the `health-event` lines.
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

            // A MIG change written by the fake keeps the health lines.
            nvml.set_mig_mode(0, true).expect("MIG mode on");
            assert_eq!(
                kinds(&mock.health_events(0).expect("mock events")),
                nvml_all
            );
            assert_state_file_is_canonical(host);
        },
    );
}
