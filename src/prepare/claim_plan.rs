//! Deciding what a ResourceClaim needs from this node: a pure function from the claim,
//! the node's devices and the already prepared claims to a [`ClaimPlan`], or a
//! per-claim error for the kubelet. No I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::config::{GpuMode, ManagedGpu};
use crate::naming::{DeviceRef, parse_device_name};
use crate::prepare::gpu_config::{self, GpuConfig};

/// The MIG partition a planned device stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigTarget {
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    /// The GI ID NVML gives that placement (heap index), predicted before creation to
    /// check the claim's CDI spec; the record takes NVML's once it is made. 0 where the
    /// heap formula does not apply (a placement only a model read from NVML lists).
    pub gi_id: u32,
}

/// What a shared-GPU allocation (a consumed share or a fallback slot) gives the claim:
/// the memory budget the interception library enforces and the compute share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    pub memory_bytes: u64,
    /// Percent of the GPU's compute time (0-100).
    pub compute_percent: u32,
}

impl Budget {
    fn add(self, o: Budget) -> Budget {
        Budget {
            memory_bytes: self.memory_bytes.saturating_add(o.memory_bytes),
            compute_percent: self.compute_percent.saturating_add(o.compute_percent),
        }
    }
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
    /// `Some` for a share of a `shared` GPU or a fallback slot: what the claim may use.
    pub budget: Option<Budget>,
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
    /// `<claimUID>-<device>-<shareID>` for shared allocations. The whole shareID: two
    /// shares of one device in one claim may have shareIDs with a common prefix.
    pub fn cdi_name(&self, claim_uid: &str) -> String {
        match &self.share_id {
            Some(s) => format!("{claim_uid}-{}-{s}", self.device),
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
    #[error(
        "ResourceClaim {namespace}/{name} has UID {uid:?}: a UID is letters, digits and dashes, from and to a letter or digit (it names the claim's CDI devices and files)"
    )]
    BadUid {
        namespace: String,
        name: String,
        uid: String,
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
    #[error("device {device} of request {request}: {reason}")]
    BadShare {
        request: String,
        device: String,
        reason: String,
    },
    #[error(
        "GPU {minor} would be over-committed: {what} of prepared claims plus this one is {total}, more than its {capacity}"
    )]
    OverCommitted {
        minor: u32,
        what: &'static str,
        total: u64,
        capacity: u64,
    },
}

/// Bytes of a consumed-capacity quantity, rounded down to whole bytes; `None` if
/// negative or unparsable.
fn quantity_floor(q: &str) -> Option<u64> {
    let p = k8s_model::validation::quantity::ParsedQuantity::parse(q).ok()?;
    if p.sign() < 0 {
        return None;
    }
    let v = p.to_i64_value()?;
    // `to_i64_value` rounds away from zero: one less for a fractional positive value.
    let v = if p.is_integer() { v } else { v - 1 };
    u64::try_from(v).ok()
}

/// The budget of a `shared` GPU's allocation: its `consumedCapacity`, which the
/// scheduler filled after applying the request policies (defaults and rounding to the
/// step). Memory must be 1 byte to the published total; compute 0 to 100 percent.
fn consumed_budget(
    r: &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult,
    gpu: &ManagedGpu,
) -> Result<Budget, ClaimError> {
    let bad = |reason: String| ClaimError::BadShare {
        request: r.request.clone(),
        device: r.device.clone(),
        reason,
    };
    if r.share_id.is_none() {
        return Err(bad(
            "a shared GPU allocated without a shareID (the server dropped consumable capacity?)"
                .into(),
        ));
    }
    let cc = r
        .consumed_capacity
        .as_ref()
        .ok_or_else(|| bad("no consumedCapacity in the allocation result".into()))?;
    let get = |name: &str| -> Result<u64, ClaimError> {
        let q = cc
            .get(name)
            .ok_or_else(|| bad(format!("consumedCapacity has no {name}")))?;
        quantity_floor(&q.0)
            .ok_or_else(|| bad(format!("consumedCapacity {name} {:?} is not a size", q.0)))
    };
    let memory_bytes = get("memory")?;
    let compute = get("compute")?;
    let total = crate::inventory::sizing::shared_memory(&gpu.gpu);
    if memory_bytes == 0 || memory_bytes > total {
        return Err(bad(format!(
            "consumed memory {memory_bytes} is outside 1..={total} bytes"
        )));
    }
    if compute > 100 {
        return Err(bad(format!(
            "consumed compute {compute} is above 100 percent"
        )));
    }
    Ok(Budget {
        memory_bytes,
        compute_percent: compute as u32,
    })
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

/// Whether a claim UID or shareID can be part of CDI device names and file names:
/// 1 to 64 letters, digits and dashes, beginning and ending with a letter or digit
/// (the API server's are UUIDs; a CDI device name ends with a letter or digit).
fn fit_for_cdi_names(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// This node as claim planning sees it.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    pub driver: &'a str,
    pub pool: &'a str,
    pub gpus: &'a [ManagedGpu],
    /// Fallback slots per `shared` GPU (the node config's `sharedSlots`).
    pub shared_slots: u32,
}

/// What other prepared claims hold: hold key (see [`PlannedDevice::hold_key`]) to the
/// holder's UID, and per GPU minor the sum of their shared-GPU budgets.
#[derive(Debug, Clone, Default)]
pub struct Held {
    pub devices: BTreeMap<String, String>,
    pub budgets: BTreeMap<u32, Budget>,
}

/// Decides the claim's devices on this node. Checks, in order: UID, allocation, the
/// opaque configs (all of them, used or not), that our results are in our pool, that
/// each device exists, the shares of shared GPUs, that no device is held by another
/// claim, and that no shared GPU ends up over-committed. Deterministic.
pub fn plan_claim(
    claim: &ResourceClaim,
    expected_uid: &str,
    node: NodeView<'_>,
    held: &Held,
) -> Result<ClaimPlan, ClaimError> {
    let NodeView {
        driver,
        pool,
        gpus,
        shared_slots,
    } = node;
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
    // The API server's UIDs are UUIDs; the UID names the claim's CDI devices
    // (`<uid>-<device>`), spec file and claim directory, so anything else is refused
    // here rather than as an invalid spec.
    if !fit_for_cdi_names(&uid) {
        return Err(ClaimError::BadUid {
            namespace,
            name,
            uid,
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
    gpu_config::validate_all(configs, driver).map_err(ClaimError::Config)?;
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
        // The shareID names the CDI device too (`<uid>-<device>-<shareID>`).
        if let Some(share) = r.share_id.as_deref().filter(|s| !fit_for_cdi_names(s)) {
            return Err(ClaimError::BadShare {
                request: r.request.clone(),
                device: r.device.clone(),
                reason: format!(
                    "shareID {share:?} is not letters, digits and dashes from and to a letter or digit (it names the CDI device)"
                ),
            });
        }
        let unknown = || ClaimError::UnknownDevice {
            request: r.request.clone(),
            device: r.device.clone(),
        };
        let find = |minor: u32| gpus.iter().find(|g| g.gpu.minor == minor);
        let (gpu, mig, budget) = match parse_device_name(&r.device) {
            Some(DeviceRef::Gpu { minor }) => {
                let gpu = find(minor).ok_or_else(unknown)?;
                let budget = match gpu.mode {
                    GpuMode::Shared => Some(consumed_budget(r, gpu)?),
                    _ => None,
                };
                (gpu, None, budget)
            }
            Some(DeviceRef::Slot { minor, slot }) => {
                let gpu = find(minor)
                    .filter(|g| g.mode == GpuMode::Shared && slot < shared_slots)
                    .ok_or_else(unknown)?;
                let budget = Budget {
                    memory_bytes: crate::inventory::sizing::slot_memory(&gpu.gpu, shared_slots),
                    compute_percent: crate::inventory::sizing::slot_compute(shared_slots),
                };
                (gpu, None, Some(budget))
            }
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
                let model = gpu.mig_model().ok_or_else(unknown)?;
                let p = model
                    .profile_by_id(gi_profile_id)
                    .filter(|p| crate::naming::sanitize_mig_profile(p.name) == profile)
                    .filter(|p| p.placements.contains(&placement_start))
                    .ok_or_else(unknown)?;
                let size = p.placement_size();
                // A placement NVML lists that the heap formula does not cover (a model
                // read from NVML) is still valid: its GI ID is NVML's to name.
                let gi_id = crate::mig::geometry::gi_id_for_placement(
                    model.memory_slices,
                    placement_start,
                    size,
                )
                .unwrap_or(0);
                (
                    gpu,
                    Some(MigTarget {
                        profile_id: gi_profile_id,
                        start: placement_start,
                        size,
                        gi_id,
                    }),
                    None,
                )
            }
            None => return Err(unknown()),
        };
        let config = gpu_config::effective_config(configs, driver, &r.request)
            .map_err(ClaimError::Config)?;
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
            budget,
        };
        if let Some(holder) = held.devices.get(&planned.hold_key())
            && holder != expected_uid
        {
            return Err(ClaimError::DeviceInUse {
                device: planned.device,
                holder: holder.clone(),
            });
        }
        // Last line of defence behind the scheduler's counters: a whole GPU and its
        // partitions, or two overlapping partitions, are never held at once.
        for (key, holder) in &held.devices {
            // Shares of a shared GPU never exclude anything: their sum is checked by
            // `check_commitment`, together with fallback slots.
            if key.contains('#') {
                continue;
            }
            let other = key.as_str();
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
    check_commitment(gpus, &devices, held)?;
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

/// Last line of defence behind the scheduler's capacity accounting: the budgets of all
/// prepared claims on one shared GPU stay within its memory and 100 % compute.
fn check_commitment(
    gpus: &[ManagedGpu],
    devices: &[PlannedDevice],
    held: &Held,
) -> Result<(), ClaimError> {
    let mut mine: BTreeMap<u32, Budget> = BTreeMap::new();
    for d in devices {
        if let Some(b) = d.budget {
            let e = mine.entry(d.gpu_minor).or_default();
            *e = e.add(b);
        }
    }
    for (minor, b) in mine {
        let Some(gpu) = gpus.iter().find(|g| g.gpu.minor == minor) else {
            continue;
        };
        let total = b.add(held.budgets.get(&minor).copied().unwrap_or_default());
        let capacity = crate::inventory::sizing::shared_memory(&gpu.gpu);
        if total.memory_bytes > capacity {
            return Err(ClaimError::OverCommitted {
                minor,
                what: "memory (bytes)",
                total: total.memory_bytes,
                capacity,
            });
        }
        if total.compute_percent > 100 {
            return Err(ClaimError::OverCommitted {
                minor,
                what: "compute (percent)",
                total: u64::from(total.compute_percent),
                capacity: 100,
            });
        }
    }
    Ok(())
}

impl ClaimPlan {
    /// Whether any device is a shared-GPU share or slot (the claim then gets its
    /// per-claim files and the interception library).
    pub fn is_shared(&self) -> bool {
        self.devices.iter().any(|d| d.budget.is_some())
    }

    /// The claim's budgets per GPU UUID: the sum over its shares of that GPU, sorted by
    /// UUID (the order of the `limits`, `control` and `region` tables).
    pub fn budgets_by_uuid(&self) -> Vec<(String, Budget)> {
        let mut m: BTreeMap<String, Budget> = BTreeMap::new();
        for d in &self.devices {
            if let Some(b) = d.budget {
                let e = m.entry(d.gpu_uuid.clone()).or_default();
                *e = e.add(b);
            }
        }
        m.into_iter().collect()
    }
}
/// The kind of a claim from its allocation, for a prepare that failed before devices
/// were recorded: the first of `driver`'s results, by its device name (`…-mig-…`,
/// `…-slot-…`) and share ID (a share of a shared GPU); `unknown` when the claim has no
/// result of ours or the name is not one Tessera publishes. Pure.
pub fn allocation_kind(
    claim: &k8s_openapi::api::resource::v1::ResourceClaim,
    driver: &str,
) -> &'static str {
    use crate::naming::{DeviceRef, parse_device_name};
    let Some(r) = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .and_then(|rs| rs.iter().find(|r| r.driver == driver))
    else {
        return "unknown";
    };
    match (parse_device_name(&r.device), &r.share_id) {
        (Some(DeviceRef::Mig { .. }), _) => "mig",
        (Some(DeviceRef::Slot { .. }), _) => "slot",
        (Some(DeviceRef::Gpu { .. }), Some(_)) => "shared",
        (Some(DeviceRef::Gpu { .. }), None) => "whole",
        (None, _) => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed prepare is labelled by the kind its allocation names.
    #[test]
    fn allocation_names_the_kind_of_a_claim() {
        use k8s_openapi::api::resource::v1::{
            AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
            ResourceClaimStatus,
        };
        let claim = |driver: &str, device: &str, share: Option<&str>| ResourceClaim {
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(vec![DeviceRequestAllocationResult {
                            driver: driver.into(),
                            device: device.into(),
                            share_id: share.map(Into::into),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let d = "gpu.tessera.dev";
        for (c, want) in [
            (claim(d, "gpu-2", None), "whole"),
            (claim(d, "gpu-1", Some("0a1b")), "shared"),
            (claim(d, "gpu-1-slot-3", None), "slot"),
            (claim(d, "gpu-0-mig-1g10gb-19-5", None), "mig"),
            (claim(d, "gpu-9", None), "whole"),
            (claim(d, "nvidia0", None), "unknown"),
            (claim("other.dev", "gpu-2", None), "unknown"),
            (ResourceClaim::default(), "unknown"),
        ] {
            assert_eq!(allocation_kind(&c, d), want);
        }
    }

    /// Regression (fuzz target claim_plan): a claim whose UID matched the expected one
    /// but was empty or held characters a CDI device name refuses (`@`, `,`, `:`, `!`)
    /// was accepted, and its spec failed validation. Such a UID is refused by name.
    #[test]
    fn a_uid_unfit_for_cdi_names_is_refused() {
        let claim = |uid: &str| -> ResourceClaim {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "c", "namespace": "ns", "uid": uid},
                "status": {"allocation": {"devices": {"results": []}}}}))
            .unwrap()
        };
        let node = NodeView {
            driver: "gpu.tessera.dev",
            pool: "n",
            gpus: &[],
            shared_slots: 0,
        };
        let long = "a".repeat(65);
        for uid in [
            "",
            "0b8d8d8c.0c2a,5e4b",
            "0b5c6e2a-1f3d:[-4c8e",
            "a@b",
            "a/b",
            &long,
        ] {
            let err = plan_claim(&claim(uid), uid, node, &Held::default()).unwrap_err();
            assert!(matches!(err, ClaimError::BadUid { .. }), "{uid:?}: {err}");
        }
        // A UUID passes the check (and meets the next one).
        let uid = "0b5c6e2a-1f3d-4c8e-9a7b-2d4f6e8a0c1e";
        let err = plan_claim(&claim(uid), uid, node, &Held::default()).unwrap_err();
        assert!(matches!(err, ClaimError::NoDevicesHere { .. }), "{err}");
    }

    /// Regression (fuzz target claim_plan): a share of the shared GPU with a shareID
    /// holding a comma was accepted, and the CDI device it names failed validation.
    #[test]
    fn a_share_id_unfit_for_cdi_names_is_refused() {
        let uid = "0b5c6e2a-1f3d-4c8e-9a7b-2d4f6e8a0c1e";
        let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": uid},
            "status": {"allocation": {"devices": {"results": [{
                "request": "gpu", "driver": "gpu.tessera.dev", "pool": "n", "device": "gpu-1",
                "shareID": "2a7ed99d-db05,5111,5110.d038ab07aa75",
                "consumedCapacity": {"memory": "20Gi", "compute": "25"}}]}}}}))
        .unwrap();
        let node = NodeView {
            driver: "gpu.tessera.dev",
            pool: "n",
            gpus: &[],
            shared_slots: 0,
        };
        let err = plan_claim(&claim, uid, node, &Held::default()).unwrap_err();
        assert!(
            matches!(&err, ClaimError::BadShare { reason, .. } if reason.contains("shareID")),
            "{err}"
        );
        // Nor may it end with a dash (found next: "35ef9e2a-5d98-4000-").
        let mut claim = claim;
        let results = claim.status.as_mut().unwrap().allocation.as_mut().unwrap();
        results.devices.as_mut().unwrap().results.as_mut().unwrap()[0].share_id =
            Some("35ef9e2a-5d98-4000-".into());
        let err = plan_claim(&claim, uid, node, &Held::default()).unwrap_err();
        assert!(matches!(err, ClaimError::BadShare { .. }), "{err}");
    }
}
