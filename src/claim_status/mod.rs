//! A prepared claim's `status.devices` (KEP-4817, DRAResourceClaimDeviceStatus): what
//! Tessera reports per allocated device, and the service that keeps it true.
//!
//! * This file is the pure core: [`desired_statuses`] turns a checkpoint record, the
//!   node's GPUs and the devices' health into the entries Tessera owns, and
//!   [`merge_statuses`] puts them into a claim's current list (other drivers' entries
//!   kept, unchanged conditions keeping their `lastTransitionTime`). No I/O.
//! * [`writer`]: the kube edge, one GET and one `PUT .../status` per change (the
//!   [`ClaimStatusWriter`](writer::ClaimStatusWriter) seam).
//! * [`reporter`]: the service that writes after each prepare, removes after each
//!   unprepare, follows device health and retries failures with a backoff.
//!
//! The entry's `data` ([`DeviceData`]) is a contract for readers such as dcgm-exporter's
//! pod mapper: `docs/design.md`, section 16.

pub mod reporter;
pub mod writer;

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::{Deserialize, Serialize};

use crate::config::ManagedGpu;
use crate::prepare::checkpoint::{ClaimRecord, ClaimState, PreparedDevice};

/// The condition type Tessera sets on each of its entries.
pub const READY: &str = "Ready";
/// `Ready=True`: the device is prepared and healthy.
pub const REASON_PREPARED: &str = "Prepared";
/// `Ready=False`: the device is prepared but the health watcher found it unhealthy.
pub const REASON_UNHEALTHY: &str = "DeviceUnhealthy";

/// The free-form `data` of one entry, as JSON (camelCase keys). Deterministic encoding:
/// fields in declaration order, absent ones left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceData {
    /// The physical GPU: `GPU-…`, what NVML and DCGM key GPUs by.
    #[serde(rename = "gpuUUID")]
    pub gpu_uuid: String,
    /// NVML's product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub product_name: String,
    /// For a MIG device: the instance and where it sits on its GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigData>,
    /// For a share of a shared GPU (or a fallback slot): the claim's budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetData>,
    /// The CDI device IDs the kubelet was given for this device.
    #[serde(rename = "cdiDeviceIDs")]
    pub cdi_device_ids: Vec<String>,
}

/// A MIG device of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigData {
    /// `MIG-…`, absent only when NVML gave none.
    #[serde(rename = "uuid", default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The profile's name, e.g. `1g.10gb`, when the GPU's model is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The profile ID `nvidia-smi mig -lgip` shows.
    #[serde(rename = "profileID")]
    pub profile_id: u32,
    /// First memory slice and number of slices.
    pub placement: Placement,
    #[serde(rename = "gpuInstanceID")]
    pub gpu_instance_id: u32,
    #[serde(
        rename = "computeInstanceID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub compute_instance_id: Option<u32>,
    /// Whether Tessera created the instance for this claim (and destroys it at
    /// unprepare); false for one it found (`--adopt-unknown-mig`, static MIG).
    pub created_on_demand: bool,
}

/// A MIG placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub start: u32,
    pub size: u32,
}

/// The budget of a shared claim on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetData {
    pub memory_bytes: u64,
    /// Percent of the GPU's compute time.
    pub compute_percent: u32,
}

/// One device's health as the health watcher last reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Healthy,
    /// Unhealthy, with the watcher's message.
    Unhealthy(String),
}

/// The entry `data` of one prepared device. Deterministic.
pub fn device_data(d: &PreparedDevice, gpus: &[ManagedGpu]) -> DeviceData {
    let gpu = gpus.iter().find(|g| g.gpu.uuid == d.gpu_uuid);
    let mig = d.mig.as_ref().map(|m| MigData {
        uuid: m.uuid.clone(),
        profile: gpu
            .and_then(ManagedGpu::mig_model)
            .and_then(|model| model.profile_by_id(m.profile_id))
            .map(|p| p.name.to_string()),
        profile_id: m.profile_id,
        placement: Placement {
            start: m.start,
            size: m.size,
        },
        gpu_instance_id: m.gi_id,
        compute_instance_id: m.ci_id,
        created_on_demand: m.created,
    });
    DeviceData {
        gpu_uuid: d.gpu_uuid.clone(),
        product_name: gpu.map(|g| g.gpu.product_name.clone()).unwrap_or_default(),
        mig,
        budget: d.budget.map(|b| BudgetData {
            memory_bytes: b.memory_bytes,
            compute_percent: b.compute_percent,
        }),
        cdi_device_ids: d.cdi_device_ids.clone(),
    }
}

/// The entries Tessera owns for a claim: one per prepared device of `driver`, with
/// condition `Ready` (True when healthy, False with [`REASON_UNHEALTHY`] and the
/// watcher's message otherwise; a device the watcher does not list counts as healthy)
/// stamped `now`, and [`DeviceData`]. None for a claim whose prepare has not completed
/// (or that is being unprepared). Deterministic.
pub fn desired_statuses(
    driver: &str,
    record: &ClaimRecord,
    gpus: &[ManagedGpu],
    health: &BTreeMap<String, Health>,
    now: Time,
) -> Vec<AllocatedDeviceStatus> {
    if record.state != ClaimState::PrepareCompleted {
        return Vec::new();
    }
    record
        .devices
        .iter()
        .map(|d| {
            let (status, reason, message) = match health.get(&d.device_name) {
                Some(Health::Unhealthy(m)) => ("False", REASON_UNHEALTHY, m.clone()),
                _ => (
                    "True",
                    REASON_PREPARED,
                    "prepared on this node by Tessera".to_string(),
                ),
            };
            let data = serde_json::to_value(device_data(d, gpus)).unwrap_or_default();
            AllocatedDeviceStatus {
                driver: driver.to_string(),
                pool: d.pool_name.clone(),
                device: d.device_name.clone(),
                share_id: d.share_id.clone(),
                conditions: Some(vec![Condition {
                    type_: READY.into(),
                    status: status.into(),
                    reason: reason.into(),
                    message,
                    last_transition_time: now.clone(),
                    observed_generation: None,
                }]),
                data: Some(k8s_openapi::apimachinery::pkg::runtime::RawExtension(data)),
                network_data: None,
            }
        })
        .collect()
}

/// The key of an entry: driver, pool, device and share ID (the list's map keys).
fn key(s: &AllocatedDeviceStatus) -> (&str, &str, &str, Option<&str>) {
    (&s.driver, &s.pool, &s.device, s.share_id.as_deref())
}

/// `current` (a claim's `status.devices`) with `driver`'s entries replaced by `ours`:
/// other drivers' entries stay, in place; ours follow them, in `ours`' order. A
/// condition whose status did not change keeps its `lastTransitionTime`, so writing
/// the same state again yields the same list. Deterministic.
pub fn merge_statuses(
    current: &[AllocatedDeviceStatus],
    driver: &str,
    ours: Vec<AllocatedDeviceStatus>,
) -> Vec<AllocatedDeviceStatus> {
    let mut out: Vec<AllocatedDeviceStatus> = current
        .iter()
        .filter(|s| s.driver != driver)
        .cloned()
        .collect();
    for mut s in ours {
        let old = current.iter().find(|c| key(c) == key(&s));
        if let (Some(old), Some(conds)) = (old, s.conditions.as_mut()) {
            for c in conds {
                let same = old
                    .conditions
                    .iter()
                    .flatten()
                    .find(|o| o.type_ == c.type_ && o.status == c.status);
                if let Some(o) = same {
                    c.last_transition_time = o.last_transition_time.clone();
                }
            }
        }
        out.push(s);
    }
    out
}

/// What a claim's `status.devices` must become for `driver`'s entries to be `ours`:
/// [`merge_statuses`] of its current list, keeping only entries for devices in its
/// allocation (the API server refuses any other). `None` when nothing changes, which
/// includes a claim that is not allocated (the API server drops `status.devices` when a
/// claim is deallocated). Deterministic.
pub fn next_devices(
    claim: &ResourceClaim,
    driver: &str,
    ours: Vec<AllocatedDeviceStatus>,
) -> Option<Vec<AllocatedDeviceStatus>> {
    let status = claim.status.as_ref()?;
    let results = status
        .allocation
        .as_ref()?
        .devices
        .as_ref()?
        .results
        .as_ref()?;
    let allocated = |s: &AllocatedDeviceStatus| {
        results.iter().any(|r| {
            r.driver == s.driver
                && r.pool == s.pool
                && r.device == s.device
                && r.share_id == s.share_id
        })
    };
    let ours: Vec<AllocatedDeviceStatus> = ours.into_iter().filter(allocated).collect();
    let current = status.devices.as_deref().unwrap_or(&[]);
    let next = merge_statuses(current, driver, ours);
    (next != current).then_some(next)
}

#[cfg(test)]
mod tests;
