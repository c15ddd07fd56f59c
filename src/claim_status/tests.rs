use super::*;
use crate::config::{GpuMode, ManagedGpu};
use crate::inventory::mock::MockNode;
use crate::prepare::checkpoint::MigRecord;
use crate::prepare::claim_plan::Budget;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaimStatus,
};
use serde_json::json;

const DRIVER: &str = "gpu.tessera.dev";
const POOL: &str = "node-a";

fn gpus() -> Vec<ManagedGpu> {
    let inv = MockNode::embedded_default().unwrap().inventory();
    vec![
        ManagedGpu {
            gpu: inv.gpus[0].clone(),
            mode: GpuMode::Mig,
        },
        ManagedGpu {
            gpu: inv.gpus[2].clone(),
            mode: GpuMode::Shared,
        },
    ]
}

fn t(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
}

fn whole(gpus: &[ManagedGpu]) -> PreparedDevice {
    PreparedDevice {
        request_names: vec!["gpu".into()],
        pool_name: POOL.into(),
        device_name: "gpu-0".into(),
        cdi_device_ids: vec!["tessera.dev/gpu=claim-gpu-0".into()],
        share_id: None,
        gpu_uuid: gpus[0].gpu.uuid.clone(),
        config: Default::default(),
        mig: None,
        budget: None,
    }
}

fn mig(gpus: &[ManagedGpu]) -> PreparedDevice {
    PreparedDevice {
        device_name: "gpu-0-mig-1g10gb-3".into(),
        cdi_device_ids: vec!["tessera.dev/gpu=claim-mig".into()],
        mig: Some(MigRecord {
            gpu_minor: gpus[0].gpu.minor,
            profile_id: 19,
            start: 3,
            size: 1,
            gi_id: 9,
            ci_id: Some(0),
            uuid: Some("MIG-11111111-2222-3333-4444-555555555555".into()),
            created: true,
        }),
        ..whole(gpus)
    }
}

fn share(gpus: &[ManagedGpu]) -> PreparedDevice {
    PreparedDevice {
        device_name: "gpu-2-shared".into(),
        cdi_device_ids: vec!["tessera.dev/gpu=claim-share".into()],
        share_id: Some("0b0d1c2e-3f40-4152-8637-48596a7b8c9d".into()),
        gpu_uuid: gpus[1].gpu.uuid.clone(),
        budget: Some(Budget {
            memory_bytes: 4 << 30,
            compute_percent: 25,
        }),
        ..whole(gpus)
    }
}

fn record(state: ClaimState, devices: Vec<PreparedDevice>) -> ClaimRecord {
    ClaimRecord {
        state,
        namespace: "ns".into(),
        name: "c".into(),
        devices,
        cdi_spec: None,
        claim_files: false,
        metadata: false,
        lib_version: None,
        pods: vec![],
        started_at: 0,
        completed_at: None,
    }
}

fn data(s: &AllocatedDeviceStatus) -> serde_json::Value {
    s.data.as_ref().unwrap().0.clone()
}

fn ready(s: &AllocatedDeviceStatus) -> (&str, &str, &str) {
    let c = &s.conditions.as_ref().unwrap()[0];
    (c.type_.as_str(), c.status.as_str(), c.reason.as_str())
}

/// Each kind of device reports what a reader needs: the GPU UUID and product name
/// always; a MIG device its instance UUID, profile and placement; a share its budget
/// and share ID; every device its CDI device IDs.
#[test]
fn each_device_kind_reports_its_data() {
    let g = gpus();
    let product = |i: usize| g[i].gpu.product_name.clone();
    let cases = [
        (
            whole(&g),
            json!({"gpuUUID": g[0].gpu.uuid, "productName": product(0),
                   "cdiDeviceIDs": ["tessera.dev/gpu=claim-gpu-0"]}),
        ),
        (
            mig(&g),
            json!({"gpuUUID": g[0].gpu.uuid, "productName": product(0),
                   "mig": {"uuid": "MIG-11111111-2222-3333-4444-555555555555",
                           "profile": "1g.10gb", "profileID": 19,
                           "placement": {"start": 3, "size": 1},
                           "gpuInstanceID": 9, "computeInstanceID": 0,
                           "createdOnDemand": true},
                   "cdiDeviceIDs": ["tessera.dev/gpu=claim-mig"]}),
        ),
        (
            share(&g),
            json!({"gpuUUID": g[1].gpu.uuid, "productName": product(1),
                   "budget": {"memoryBytes": 4u64 << 30, "computePercent": 25},
                   "cdiDeviceIDs": ["tessera.dev/gpu=claim-share"]}),
        ),
    ];
    for (dev, want) in cases {
        let out = desired_statuses(
            DRIVER,
            &record(ClaimState::PrepareCompleted, vec![dev.clone()]),
            &g,
            &BTreeMap::new(),
            t(100),
        );
        assert_eq!(out.len(), 1, "{}", dev.device_name);
        let s = &out[0];
        assert_eq!(
            (s.driver.as_str(), s.pool.as_str(), s.device.as_str()),
            (DRIVER, POOL, dev.device_name.as_str())
        );
        assert_eq!(s.share_id, dev.share_id);
        assert_eq!(ready(s), (READY, "True", REASON_PREPARED));
        assert_eq!(data(s), want, "{}", dev.device_name);
    }
}

/// An unhealthy device's `Ready` is False with the watcher's message; devices the
/// watcher does not list count as healthy.
#[test]
fn an_unhealthy_device_is_not_ready() {
    let g = gpus();
    let health = BTreeMap::from([
        ("gpu-0".to_string(), Health::Unhealthy("XID 79".into())),
        ("gpu-2-shared".to_string(), Health::Healthy),
    ]);
    let out = desired_statuses(
        DRIVER,
        &record(ClaimState::PrepareCompleted, vec![whole(&g), share(&g)]),
        &g,
        &health,
        t(5),
    );
    assert_eq!(ready(&out[0]), (READY, "False", REASON_UNHEALTHY));
    assert_eq!(out[0].conditions.as_ref().unwrap()[0].message, "XID 79");
    assert_eq!(ready(&out[1]), (READY, "True", REASON_PREPARED));
}

/// Only a completed prepare has entries: a claim being prepared or unprepared has none.
#[test]
fn only_completed_claims_have_entries() {
    let g = gpus();
    for (state, n) in [
        (ClaimState::PrepareStarted, 0),
        (ClaimState::UnprepareStarted, 0),
        (ClaimState::Unknown, 0),
        (ClaimState::PrepareCompleted, 1),
    ] {
        let out = desired_statuses(
            DRIVER,
            &record(state, vec![whole(&g)]),
            &g,
            &BTreeMap::new(),
            t(0),
        );
        assert_eq!(out.len(), n, "{state:?}");
    }
}

fn entry(driver: &str, device: &str, status: &str, at: i64) -> AllocatedDeviceStatus {
    AllocatedDeviceStatus {
        driver: driver.into(),
        pool: POOL.into(),
        device: device.into(),
        conditions: Some(vec![Condition {
            type_: READY.into(),
            status: status.into(),
            reason: "R".into(),
            message: String::new(),
            last_transition_time: t(at),
            observed_generation: None,
        }]),
        ..Default::default()
    }
}

fn times(v: &[AllocatedDeviceStatus]) -> Vec<(String, String, i64)> {
    v.iter()
        .map(|s| {
            let c = &s.conditions.as_ref().unwrap()[0];
            (
                format!("{}/{}", s.driver, s.device),
                c.status.clone(),
                c.last_transition_time.0.as_second(),
            )
        })
        .collect()
}

/// Merging keeps other drivers' entries, replaces ours, and keeps a condition's
/// transition time while its status is unchanged (so rewriting is a no-op).
#[test]
fn merge_keeps_others_and_unchanged_transition_times() {
    let other = entry("net.example.com", "nic-0", "True", 1);
    let current = vec![
        entry(DRIVER, "gpu-0", "True", 10),
        other.clone(),
        entry(DRIVER, "gpu-1", "True", 10),
    ];
    let ours = vec![
        entry(DRIVER, "gpu-0", "True", 50),
        entry(DRIVER, "gpu-1", "False", 50),
    ];
    let merged = merge_statuses(&current, DRIVER, ours);
    assert_eq!(
        times(&merged),
        vec![
            ("net.example.com/nic-0".into(), "True".into(), 1),
            (format!("{DRIVER}/gpu-0"), "True".into(), 10),
            (format!("{DRIVER}/gpu-1"), "False".into(), 50),
        ]
    );
    // Removing ours leaves only the other driver's.
    assert_eq!(merge_statuses(&merged, DRIVER, vec![]), vec![other]);
}

fn allocated_claim(devices: &[&str], current: Option<Vec<AllocatedDeviceStatus>>) -> ResourceClaim {
    ResourceClaim {
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(
                        devices
                            .iter()
                            .map(|d| DeviceRequestAllocationResult {
                                request: "gpu".into(),
                                driver: DRIVER.into(),
                                pool: POOL.into(),
                                device: d.to_string(),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                    config: None,
                }),
                ..Default::default()
            }),
            devices: current,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The next status holds only allocated devices, and is `None` when nothing changes
/// or the claim is not allocated.
#[test]
fn next_devices_writes_only_allocated_devices_and_only_changes() {
    let ours = || {
        vec![
            entry(DRIVER, "gpu-0", "True", 7),
            entry(DRIVER, "gpu-9", "True", 7),
        ]
    };
    let claim = allocated_claim(&["gpu-0"], None);
    let next = next_devices(&claim, DRIVER, ours()).unwrap();
    assert_eq!(
        times(&next),
        vec![(format!("{DRIVER}/gpu-0"), "True".into(), 7)]
    );
    // Written already: nothing to do, even at a later time.
    let written = allocated_claim(&["gpu-0"], Some(next));
    let later = vec![entry(DRIVER, "gpu-0", "True", 99)];
    assert_eq!(next_devices(&written, DRIVER, later), None);
    // Removal of ours.
    assert_eq!(next_devices(&written, DRIVER, vec![]), Some(vec![]));
    // Not allocated: nothing (the API server drops status.devices on deallocation).
    assert_eq!(
        next_devices(&ResourceClaim::default(), DRIVER, ours()),
        None
    );
}

/// Retries back off from one second, doubling, to at most a minute.
#[test]
fn retries_back_off_to_a_minute() {
    use reporter::backoff;
    let secs: Vec<u64> = [0, 1, 2, 5, 6, 7, 40]
        .iter()
        .map(|a| backoff(*a).as_secs())
        .collect();
    assert_eq!(secs, vec![1, 2, 4, 32, 60, 60, 60]);
}
