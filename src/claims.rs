//! Deciding what a ResourceClaim needs from this node: a pure function from the claim,
//! the node's devices and the already prepared claims to a [`ClaimPlan`], or a
//! per-claim error for the kubelet. No I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::config::ManagedGpu;
use crate::gpuconfig::{self, GpuConfig};
use crate::naming::{DeviceRef, parse_device_name};

/// One device the claim gets here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedDevice {
    /// The request, with any `/subrequest` suffix stripped (what the kubelet matches
    /// against container `resources.claims[].request`).
    pub request: String,
    pub pool: String,
    pub device: String,
    pub share_id: Option<String>,
    pub gpu_minor: u32,
    pub gpu_uuid: String,
    pub config: GpuConfig,
}

impl PlannedDevice {
    /// The key under which the device is held: (device, shareID) for multi-allocatable
    /// devices, the device alone otherwise.
    pub fn hold_key(&self) -> String {
        match &self.share_id {
            Some(s) => format!("{}#{s}", self.device),
            None => self.device.clone(),
        }
    }

    /// The CDI device name inside the claim's spec: `<claimUID>-<device>`, or
    /// `<claimUID>-<device>-<first 8 of shareID>` for shared allocations.
    pub fn cdi_name(&self, claim_uid: &str) -> String {
        match &self.share_id {
            Some(s) => format!("{claim_uid}-{}-{}", self.device, &s[..s.len().min(8)]),
            None => format!("{claim_uid}-{}", self.device),
        }
    }
}

/// Everything needed to prepare one claim on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPlan {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub devices: Vec<PlannedDevice>,
}

/// Why a claim cannot be prepared. The `Display` text is what the kubelet reports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error(
        "ResourceClaim {namespace}/{name} has UID {found}, expected {expected}: it was replaced"
    )]
    UidMismatch {
        namespace: String,
        name: String,
        expected: String,
        found: String,
    },
    #[error("ResourceClaim {namespace}/{name} is not allocated")]
    NotAllocated { namespace: String, name: String },
    #[error("ResourceClaim {namespace}/{name} has no devices of driver {driver} in pool {pool}")]
    NoDevicesHere {
        namespace: String,
        name: String,
        driver: String,
        pool: String,
    },
    #[error(
        "device {device} of request {request} is in pool {pool}, which is not this node's pool {ours}"
    )]
    DeviceNotOurs {
        request: String,
        device: String,
        pool: String,
        ours: String,
    },
    #[error("device {device} of request {request} does not exist on this node")]
    UnknownDevice { request: String, device: String },
    #[error("device {device} is already prepared for claim {holder}")]
    DeviceInUse { device: String, holder: String },
    #[error("device {device} is allocated twice in this claim")]
    DuplicateDevice { device: String },
    #[error("invalid opaque config: {0}")]
    Config(String),
}

/// Decides the claim's devices on this node. `held` maps a hold key (see
/// [`PlannedDevice::hold_key`]) to the UID of the claim holding it. Checks, in order:
/// UID, allocation, that our results are in our pool, that each device exists, that it
/// is not held by another claim, and the opaque configs. Deterministic.
pub fn plan_claim(
    claim: &ResourceClaim,
    expected_uid: &str,
    driver: &str,
    pool: &str,
    gpus: &[ManagedGpu],
    held: &BTreeMap<String, String>,
) -> Result<ClaimPlan, ClaimError> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    if uid != expected_uid {
        return Err(ClaimError::UidMismatch {
            namespace,
            name,
            expected: expected_uid.into(),
            found: uid,
        });
    }
    let Some(alloc) = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
    else {
        return Err(ClaimError::NotAllocated { namespace, name });
    };
    let results = alloc.results.as_deref().unwrap_or_default();
    let configs = alloc.config.as_deref().unwrap_or_default();
    gpuconfig::validate_all(configs, driver).map_err(ClaimError::Config)?;
    let mut devices = Vec::new();
    for r in results.iter().filter(|r| r.driver == driver) {
        if r.pool != pool {
            return Err(ClaimError::DeviceNotOurs {
                request: r.request.clone(),
                device: r.device.clone(),
                pool: r.pool.clone(),
                ours: pool.into(),
            });
        }
        let unknown = || ClaimError::UnknownDevice {
            request: r.request.clone(),
            device: r.device.clone(),
        };
        let gpu = match parse_device_name(&r.device) {
            Some(DeviceRef::Gpu { minor }) => gpus
                .iter()
                .find(|g| g.gpu.minor == minor)
                .ok_or_else(unknown)?,
            // Slots and MIG partitions are not published yet (shared-GPU and MIG issues).
            _ => return Err(unknown()),
        };
        let config =
            gpuconfig::effective_config(configs, driver, &r.request).map_err(ClaimError::Config)?;
        let planned = PlannedDevice {
            request: r
                .request
                .split('/')
                .next()
                .unwrap_or(&r.request)
                .to_string(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            share_id: r.share_id.clone(),
            gpu_minor: gpu.gpu.minor,
            gpu_uuid: gpu.gpu.uuid.clone(),
            config,
        };
        if let Some(holder) = held.get(&planned.hold_key())
            && holder != expected_uid
        {
            return Err(ClaimError::DeviceInUse {
                device: planned.device,
                holder: holder.clone(),
            });
        }
        if devices
            .iter()
            .any(|d: &PlannedDevice| d.hold_key() == planned.hold_key())
        {
            return Err(ClaimError::DuplicateDevice {
                device: planned.device,
            });
        }
        devices.push(planned);
    }
    if devices.is_empty() {
        return Err(ClaimError::NoDevicesHere {
            namespace,
            name,
            driver: driver.into(),
            pool: pool.into(),
        });
    }
    Ok(ClaimPlan {
        uid,
        namespace,
        name,
        devices,
    })
}
