//! Crash tests: the real `tessera plugin` binary aborts at each named fail point
//! (`TESSERA_FAILPOINTS`), a fresh process recovers on the same directories, and the
//! kubelet's retries then succeed with nothing orphaned on disk.

use testkit::harness;

use harness::{ChildPlugin, Harness, NODE};
use tessera::kubelet::proto::dra_v1::NodePrepareResourcesResponse;
use tessera::prepare::failpoints::FAIL_POINTS;
use testkit::kubelet_standin::{DraClient, KubeletClaim};

/// The kubelet call that reaches a fail point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Prepare,
    Unprepare,
}

/// One fail point and what the process leaves on disk when it dies there.
struct CrashCase {
    point: &'static str,
    call: Call,
    /// Whether the claim's CDI spec file exists at the moment of the crash.
    spec_at_crash: bool,
    /// The claim's checkpoint state at the moment of the crash.
    state_at_crash: &'static str,
    /// The device the crashing claim gets: a MIG partition for the MIG steps.
    device: &'static str,
}

/// The MIG partition the MIG crash cases prepare (placement 6 of gpu-0).
const MIG_DEVICE: &str = "gpu-0-mig-1g10gb-19-6";
/// The shared GPU the shared-claim cases take a share of (claim files, library).
const SHARED_DEVICE: &str = "gpu-1";
const SHARE_A: &str = "0b9c1f57-5f0e-4d0a-9d36-3c2b8f7e6a10";
const SHARE_B: &str = "7d4e2a91-3c6b-4f85-a0d2-91e7c5b3f486";

/// Every fail point of `tessera::prepare::failpoints::FAIL_POINTS`, with its crash scenario.
const CASES: &[CrashCase] = &[
    CrashCase {
        point: "prepare-after-started",
        call: Call::Prepare,
        spec_at_crash: false,
        state_at_crash: "PrepareStarted",
        device: SHARED_DEVICE,
    },
    CrashCase {
        point: "prepare-after-mig-create",
        call: Call::Prepare,
        spec_at_crash: false,
        state_at_crash: "PrepareStarted",
        device: MIG_DEVICE,
    },
    CrashCase {
        point: "prepare-after-claim-files",
        call: Call::Prepare,
        spec_at_crash: false,
        state_at_crash: "PrepareStarted",
        device: SHARED_DEVICE,
    },
    CrashCase {
        point: "prepare-after-metadata",
        call: Call::Prepare,
        spec_at_crash: false,
        state_at_crash: "PrepareStarted",
        device: MIG_DEVICE,
    },
    CrashCase {
        point: "prepare-after-cdi-write",
        call: Call::Prepare,
        spec_at_crash: true,
        state_at_crash: "PrepareStarted",
        device: MIG_DEVICE,
    },
    CrashCase {
        point: "prepare-before-completed",
        call: Call::Prepare,
        spec_at_crash: true,
        state_at_crash: "PrepareStarted",
        device: SHARED_DEVICE,
    },
    CrashCase {
        point: "unprepare-after-mig-destroy",
        call: Call::Unprepare,
        spec_at_crash: true,
        state_at_crash: "UnprepareStarted",
        device: MIG_DEVICE,
    },
    CrashCase {
        point: "unprepare-after-cdi-remove",
        call: Call::Unprepare,
        spec_at_crash: false,
        state_at_crash: "UnprepareStarted",
        device: MIG_DEVICE,
    },
    CrashCase {
        point: "unprepare-after-claim-files-remove",
        call: Call::Unprepare,
        spec_at_crash: false,
        state_at_crash: "UnprepareStarted",
        device: SHARED_DEVICE,
    },
    CrashCase {
        point: "unprepare-after-metadata-remove",
        call: Call::Unprepare,
        spec_at_crash: false,
        state_at_crash: "UnprepareStarted",
        device: SHARED_DEVICE,
    },
];

/// Allocates `device` to a new claim: a 10 GiB / 20 % share of the shared GPU, or the
/// device itself.
async fn allocate(h: &Harness, name: &str, device: &str, share: &str) -> KubeletClaim {
    if device == SHARED_DEVICE {
        let r = harness::shared_result("gpu", device, share, "10Gi", "20");
        h.allocated_claim_with(name, vec![r], &[]).await
    } else {
        h.allocated_claim(name, &[("gpu", NODE, device, None)], &[])
            .await
    }
}

/// Starts the real plugin binary on the harness's node with `fail_points` armed, with
/// the simulated node's own config plus device metadata files on, so that every crash
/// case also covers the metadata directory.
async fn start_child(h: &Harness, fail_points: &str) -> ChildPlugin {
    let config = h.dir.path().join("node-config.yaml");
    std::fs::write(
        &config,
        "apiVersion: config.tessera.dev/v1alpha1\nkind: NodeConfig\ngpus:\n\
         - {match: {minor: 0}, mode: mig}\n- {match: {minor: 1}, mode: shared}\n\
         - {match: {minor: 2}, mode: exclusive}\n- {match: {minor: 3}, mode: exclusive}\n\
         deviceMetadata: true\n",
    )
    .unwrap();
    ChildPlugin::start_with(
        std::path::Path::new(env!("CARGO_BIN_EXE_tessera")),
        &h.api,
        h.dir.path(),
        fail_points,
        &["--backend".into(), "mock".into()],
        &[("TESSERA_CONFIG", config.into_os_string())],
    )
    .await
}

/// Entries of `<run-dir>/metadata` (device metadata directories and any leftovers).
fn metadata_dirs(h: &Harness) -> Vec<String> {
    harness::list_files(&h.opts.paths.run_dir.join("metadata"))
}

/// Entries of `<run-dir>/claims` (claim directories and any leftovers).
fn claim_dirs(h: &Harness) -> Vec<String> {
    harness::list_files(&h.opts.paths.run_dir.join("claims"))
}

/// Installed interception library versions (and any leftovers) in `<run-dir>/lib`.
fn lib_versions(h: &Harness) -> Vec<String> {
    harness::list_files(&h.opts.paths.run_dir.join("lib"))
}

/// MIG devices alive on gpu-0 of the simulated node (read from its state file).
fn live_mig(h: &Harness) -> Vec<(u32, u32)> {
    use tessera::inventory::GpuBackend;
    use tessera::inventory::mock::{MockBackend, MockNode, StateAccess};
    let b = MockBackend::new(
        MockNode::embedded_default().unwrap(),
        h.opts.paths.state_dir.clone(),
        StateAccess::ReadOnly,
    );
    b.mig_status(0)
        .unwrap()
        .instances
        .iter()
        .map(|i| (i.start, i.profile_id))
        .collect()
}

fn case(point: &str) -> &'static CrashCase {
    CASES.iter().find(|c| c.point == point).unwrap_or_else(|| {
        panic!("fail point {point:?} has no crash case in tests/plugin/crash.rs")
    })
}

/// Tessera's spec files and temp files in the CDI dir (anything a crash could orphan).
fn tessera_cdi_files(h: &Harness) -> Vec<String> {
    h.cdi_files()
        .into_iter()
        .filter(|n| {
            (n.starts_with("tessera.dev-gpu-") && n.ends_with(".json"))
                || (n.starts_with(".tessera-") && n.ends_with(".tmp"))
        })
        .collect()
}

fn assert_no_checkpoint_temp(h: &Harness, when: &str) {
    let state_files = harness::list_files(&h.opts.paths.state_dir);
    assert!(
        !state_files.iter().any(|f| f == ".checkpoint.json.tmp"),
        "{when}: stray checkpoint temp file in {state_files:?}"
    );
}

async fn prepare_ok(k: &DraClient, c: &KubeletClaim, when: &str) -> NodePrepareResourcesResponse {
    let resp = k
        .prepare_v1(std::slice::from_ref(c))
        .await
        .unwrap_or_else(|e| panic!("{when}: prepare call failed: {e}"));
    assert_eq!(resp.claims[&c.uid].error, "", "{when}: prepare error");
    assert!(
        !resp.claims[&c.uid].devices.is_empty(),
        "{when}: no devices"
    );
    resp
}

async fn unprepare_ok(k: &DraClient, c: &KubeletClaim, when: &str) {
    let resp = k
        .unprepare_v1(std::slice::from_ref(c))
        .await
        .unwrap_or_else(|e| panic!("{when}: unprepare call failed: {e}"));
    assert_eq!(resp.claims[&c.uid].error, "", "{when}: unprepare error");
}

/// Makes the child reach `cc.point` on claim `c` and checks that it aborted there,
/// leaving the state the case describes.
async fn crash_at(h: &Harness, child: &mut ChildPlugin, cc: &CrashCase, c: &KubeletClaim) {
    let p = cc.point;
    let k = h.kubelet().await;
    let call = match cc.call {
        Call::Prepare => k.prepare_v1(std::slice::from_ref(c)).await.map(drop),
        Call::Unprepare => {
            prepare_ok(&k, c, p).await;
            assert!(h.spec_path(&c.uid).exists(), "{p}: spec written by prepare");
            k.unprepare_v1(std::slice::from_ref(c)).await.map(drop)
        }
    };
    assert!(
        call.is_err(),
        "{p}: the call must fail when the plugin dies"
    );
    assert!(child.wait_aborted().await, "{p}: the plugin aborted");
    assert_eq!(
        h.spec_path(&c.uid).exists(),
        cc.spec_at_crash,
        "{p}: spec file at the crash"
    );
    assert_eq!(
        h.checkpoint_state(&c.uid).as_deref(),
        Some(cc.state_at_crash),
        "{p}: checkpoint state at the crash"
    );
}

/// Stops the child with SIGTERM and checks that it removed both of its sockets.
async fn terminate(h: &Harness, child: ChildPlugin, when: &str) {
    child.terminate().await;
    assert!(
        !h.registration_socket().exists(),
        "{when}: registration socket removed"
    );
    assert!(!h.dra_socket().exists(), "{when}: DRA socket removed");
}

/// Crashes the plugin at `point`, restarts it, and checks recovery and the retries.
async fn crash_and_recover(point: &str) {
    let cc = case(point);
    let h = Harness::new().await;
    let mut child = start_child(&h, point).await;
    let c = allocate(&h, "crashing", cc.device, SHARE_A).await;
    crash_at(&h, &mut child, cc, &c).await;
    drop(child);
    if point == "prepare-after-mig-create" {
        assert_eq!(
            live_mig(&h),
            [(6, 19)],
            "{point}: the instance exists at the crash"
        );
    }

    // Start-up recovery runs in the fresh process.
    let child = start_child(&h, "").await;
    let k = h.kubelet().await;
    assert_no_checkpoint_temp(&h, point);
    match cc.call {
        Call::Prepare => {
            assert!(!h.spec_path(&c.uid).exists(), "{point}: no orphan spec");
            assert_eq!(
                live_mig(&h),
                [],
                "{point}: recovery destroyed the half-prepared MIG device"
            );
            assert_eq!(tessera_cdi_files(&h), Vec::<String>::new(), "{point}");
            assert_eq!(claim_dirs(&h), Vec::<String>::new(), "{point}: claim dirs");
            assert_eq!(
                metadata_dirs(&h),
                Vec::<String>::new(),
                "{point}: metadata dirs"
            );
            assert!(
                !h.checkpoint_claims().contains(&c.uid),
                "{point}: recovery rolled the claim back"
            );
        }
        Call::Unprepare => {
            // Recovery finished the undo; the kubelet's retried unprepare is a no-op.
            assert!(
                !h.checkpoint_claims().contains(&c.uid),
                "{point}: recovery finished the unprepare"
            );
            unprepare_ok(&k, &c, point).await;
            assert!(
                !h.spec_path(&c.uid).exists(),
                "{point}: spec removed by the retry"
            );
            assert_eq!(live_mig(&h), [], "{point}: no MIG device left");
            assert_eq!(claim_dirs(&h), Vec::<String>::new(), "{point}: claim dirs");
            assert_eq!(
                metadata_dirs(&h),
                Vec::<String>::new(),
                "{point}: metadata dirs"
            );
            assert!(
                !h.checkpoint_claims().contains(&c.uid),
                "{point}: the retried unprepare forgot the claim"
            );
            assert_eq!(tessera_cdi_files(&h), Vec::<String>::new(), "{point}");
        }
    }

    let first = prepare_ok(&k, &c, point).await;
    let spec = std::fs::read(h.spec_path(&c.uid)).expect("spec written by the retry");
    assert_eq!(
        h.checkpoint_state(&c.uid).as_deref(),
        Some("PrepareCompleted")
    );
    let again = prepare_ok(&k, &c, point).await;
    assert_eq!(again, first, "{point}: prepare is idempotent");
    assert_eq!(std::fs::read(h.spec_path(&c.uid)).unwrap(), spec, "{point}");

    if cc.device == MIG_DEVICE {
        assert_eq!(
            live_mig(&h),
            [(6, 19)],
            "{point}: the retry created the MIG device"
        );
    }
    if cc.device == SHARED_DEVICE {
        assert_eq!(
            claim_dirs(&h),
            std::slice::from_ref(&c.uid),
            "{point}: the retry's claim dir"
        );
    }
    unprepare_ok(&k, &c, point).await;
    assert_eq!(live_mig(&h), [], "{point}: no MIG device leaked");
    assert_eq!(
        h.cdi_files(),
        Vec::<String>::new(),
        "{point}: CDI dir empty"
    );
    assert_eq!(claim_dirs(&h), Vec::<String>::new(), "{point}: claim dirs");
    assert_eq!(
        metadata_dirs(&h),
        Vec::<String>::new(),
        "{point}: metadata dirs"
    );
    assert_eq!(lib_versions(&h).len(), 1, "{point}: one library version");
    assert_eq!(h.checkpoint_claims(), Vec::<String>::new(), "{point}");
    assert_no_checkpoint_temp(&h, point);
    terminate(&h, child, point).await;
}

/// Every fail point has a crash case, and no case names an unknown fail point.
#[test]
fn every_fail_point_has_a_crash_case() {
    let cases: Vec<&str> = CASES.iter().map(|c| c.point).collect();
    assert_eq!(cases, FAIL_POINTS);
}

/// A crash at any fail point is recovered at restart: nothing orphaned, the kubelet's
/// retries succeed, prepare stays idempotent, and unprepare leaves nothing behind.
#[tokio::test]
async fn a_crash_at_every_fail_point_is_recovered_at_restart() {
    let mut exercised = 0;
    for point in FAIL_POINTS {
        crash_and_recover(point).await;
        exercised += 1;
    }
    eprintln!("crash points exercised: {exercised}");
    assert_eq!(exercised, FAIL_POINTS.len());
}

/// A claim completed before the crash survives the crash and the restart untouched:
/// same spec bytes, still completed in the checkpoint, same prepare answer.
#[tokio::test]
async fn a_completed_claim_survives_a_crash_of_another_claim() {
    let mut exercised = 0;
    for point in FAIL_POINTS {
        let cc = case(point);
        let h = Harness::new().await;
        // A completed whole GPU, MIG device and share beside the crashing claim.
        let whole = |request: &str, device: &str| {
            k8s_openapi::api::resource::v1::DeviceRequestAllocationResult {
                request: request.into(),
                driver: harness::DRIVER.into(),
                pool: NODE.into(),
                device: device.into(),
                ..Default::default()
            }
        };
        let done = h
            .allocated_claim_with(
                "done",
                vec![
                    whole("gpu", "gpu-2"),
                    whole("mig", "gpu-0-mig-1g10gb-19-0"),
                    harness::shared_result("share", SHARED_DEVICE, SHARE_B, "5Gi", "10"),
                ],
                &[],
            )
            .await;
        let crashing = allocate(&h, "crashing", cc.device, SHARE_A).await;

        // Prepared by an earlier, cleanly stopped plugin.
        let child = start_child(&h, "").await;
        let before = prepare_ok(&h.kubelet().await, &done, point).await;
        terminate(&h, child, point).await;
        let spec = std::fs::read(h.spec_path(&done.uid)).unwrap();

        let mut child = start_child(&h, point).await;
        crash_at(&h, &mut child, cc, &crashing).await;
        drop(child);

        let child = start_child(&h, "").await;
        let k = h.kubelet().await;
        assert_eq!(
            std::fs::read(h.spec_path(&done.uid)).ok().as_ref(),
            Some(&spec),
            "{point}: the completed claim's spec is untouched"
        );
        assert_eq!(
            h.checkpoint_state(&done.uid).as_deref(),
            Some("PrepareCompleted"),
            "{point}"
        );
        assert_eq!(prepare_ok(&k, &done, point).await, before, "{point}");
        assert!(
            live_mig(&h).contains(&(0, 19)),
            "{point}: the completed claim's MIG device survives the restart"
        );
        assert_eq!(std::fs::read(h.spec_path(&done.uid)).unwrap(), spec);
        if cc.call == Call::Unprepare {
            unprepare_ok(&k, &crashing, point).await;
        }
        assert_eq!(
            tessera_cdi_files(&h),
            [format!("tessera.dev-gpu-{}.json", done.uid)],
            "{point}: only the completed claim's spec is left"
        );
        assert_eq!(
            h.checkpoint_claims(),
            std::slice::from_ref(&done.uid),
            "{point}"
        );
        assert_eq!(
            claim_dirs(&h),
            std::slice::from_ref(&done.uid),
            "{point}: only the completed claim's directory is left"
        );
        assert_eq!(
            metadata_dirs(&h),
            std::slice::from_ref(&done.uid),
            "{point}: only the completed claim's metadata is left"
        );

        prepare_ok(&k, &crashing, point).await;
        unprepare_ok(&k, &crashing, point).await;
        unprepare_ok(&k, &done, point).await;
        assert_eq!(live_mig(&h), [], "{point}: no MIG device leaked");
        assert_eq!(h.cdi_files(), Vec::<String>::new(), "{point}");
        assert_eq!(h.checkpoint_claims(), Vec::<String>::new(), "{point}");
        assert_eq!(claim_dirs(&h), Vec::<String>::new(), "{point}");
        assert_eq!(
            metadata_dirs(&h),
            Vec::<String>::new(),
            "{point}: metadata dirs"
        );
        assert_no_checkpoint_temp(&h, point);
        terminate(&h, child, point).await;
        exercised += 1;
    }
    eprintln!("crash points exercised with a surviving claim: {exercised}");
    assert_eq!(exercised, FAIL_POINTS.len());
}
