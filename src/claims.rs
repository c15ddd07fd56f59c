//! Deciding what a ResourceClaim needs from this node: a pure function from the claim,
//! the node's devices and the already prepared claims to a [`ClaimPlan`], or a
//! per-claim error for the kubelet. No I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::config::ManagedGpu;
use crate::gpuconfig::{self, GpuConfig};
use crate::naming::{DeviceRef, parse_device_name};

/// The MIG partition a planned device stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigTarget {
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    /// The GI ID NVML gives that placement (heap index), known before creation.
    pub gi_id: u32,
}

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
    /// `Some` for a MIG partition (created at prepare), `None` for a whole GPU.
    pub mig: Option<MigTarget>,
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
    #[error(
        "device {device} is a whole GPU with MIG in use ({count} MIG device(s)); MIG mode must be off to use it whole"
    )]
    MigInUse { device: String, count: usize },
    #[error("cannot build the CDI spec: {0}")]
    Cdi(String),
}

/// Whether the held device `other` shares hardware with `planned`: the same whole GPU
/// as a partition of it, or overlapping memory slices of one GPU.
fn overlaps(gpus: &[ManagedGpu], other: &str, planned: &PlannedDevice) -> bool {
    let (minor, placement) = match parse_device_name(other) {
        Some(DeviceRef::Gpu { minor }) => (minor, None),
        Some(DeviceRef::Mig {
            minor,
            gi_profile_id,
            placement_start,
            ..
        }) => {
            let size = gpus
                .iter()
                .find(|g| g.gpu.minor == minor)
                .and_then(|g| crate::mig::model_for_product(&g.gpu.product_name))
                .and_then(|m| m.profile_by_id(gi_profile_id))
                .map_or(1, |p| p.placement_size());
            (minor, Some((placement_start, size)))
        }
        _ => return false,
    };
    if minor != planned.gpu_minor || other == planned.device {
        return false;
    }
    match (placement, planned.mig) {
        (Some((s, n)), Some(t)) => s < t.start + t.size && t.start < s + n,
        // A whole GPU and any partition of it.
        _ => true,
    }
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
        let (gpu, mig) = match parse_device_name(&r.device) {
            Some(DeviceRef::Gpu { minor }) => (
                gpus.iter()
                    .find(|g| g.gpu.minor == minor)
                    .ok_or_else(unknown)?,
                None,
            ),
            Some(DeviceRef::Mig {
                minor,
                profile,
                gi_profile_id,
                placement_start,
            }) => {
                let gpu = gpus
                    .iter()
                    .find(|g| g.gpu.minor == minor)
                    .ok_or_else(unknown)?;
                let model = crate::slices::mig_model(gpu).ok_or_else(unknown)?;
                let p = model
                    .profile_by_id(gi_profile_id)
                    .filter(|p| crate::naming::sanitize_mig_profile(p.name) == profile)
                    .filter(|p| p.placements.contains(&placement_start))
                    .ok_or_else(unknown)?;
                let size = p.placement_size();
                let gi_id = crate::mig::geometry::gi_id_for_placement(
                    model.memory_slices,
                    placement_start,
                    size,
                )
                .ok_or_else(unknown)?;
                (
                    gpu,
                    Some(MigTarget {
                        profile_id: gi_profile_id,
                        start: placement_start,
                        size,
                        gi_id,
                    }),
                )
            }
            // Slots are not published yet (shared-GPU issue).
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
            mig,
        };
        if let Some(holder) = held.get(&planned.hold_key())
            && holder != expected_uid
        {
            return Err(ClaimError::DeviceInUse {
                device: planned.device,
                holder: holder.clone(),
            });
        }
        // Last line of defence behind the scheduler's counters: a whole GPU and its
        // partitions, or two overlapping partitions, are never held at once.
        for (key, holder) in held {
            let other = key.split('#').next().unwrap_or(key);
            if holder != expected_uid && overlaps(gpus, other, &planned) {
                return Err(ClaimError::DeviceInUse {
                    device: planned.device,
                    holder: format!("{holder} (through {other})"),
                });
            }
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
