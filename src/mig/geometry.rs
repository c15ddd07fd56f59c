//! MIG geometry: the rules NVML enforces when GPU instances are created and destroyed,
//! as pure functions over a GPU's current instances, plus the identifiers NVML and the
//! kernel derive from them (GI IDs, capability minors, MIG UUIDs).
//!
//! A simulated GPU calls these so that it refuses exactly what real hardware refuses,
//! with the same NVML return code. Every function here is deterministic and does no I/O.
//! Sources: `mig-and-cuda-facts.md` §A1.1, A1.2, A2, A2.1.

use sha2::{Digest, Sha256};

use super::catalog::{GpuModel, MigProfile};

/// One existing GPU instance: `nvmlGpuInstanceInfo_t` without the device handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuInstance {
    /// GI ID: the heap index of its memory-slice range (see [`gi_id_for_placement`]).
    pub gi_id: u32,
    /// Profile ID (19, 20, 15…), not the NVML profile index.
    pub profile_id: u32,
    /// First memory slice.
    pub start: u32,
    /// Memory slices occupied.
    pub size: u32,
}

impl GpuInstance {
    /// Whether this instance shares a memory slice with `[start, start + size)`.
    fn overlaps(&self, start: u32, size: u32) -> bool {
        self.start < start + size && start < self.start + self.size
    }
}

/// A refused MIG operation, one variant per NVML return code it mirrors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    /// `NVML_ERROR_INVALID_ARGUMENT` (2): unknown profile, or a placement the profile
    /// can never take.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// `NVML_ERROR_NOT_SUPPORTED` (3): a valid NVML profile index this GPU lacks.
    #[error("not supported: {0}")]
    NotSupported(String),
    /// `NVML_ERROR_INSUFFICIENT_RESOURCES` (23): the placement is occupied or overlaps,
    /// or the profile's instance count is reached.
    #[error("insufficient resources: {0}")]
    InsufficientResources(String),
    /// `NVML_ERROR_IN_USE` (19): the GI still has compute instances.
    #[error("in use: {0}")]
    InUse(String),
    /// `NVML_ERROR_NOT_FOUND` (6): no GI with that ID.
    #[error("not found: {0}")]
    NotFound(String),
}

impl MigError {
    /// The `nvmlReturn_t` value this error stands for.
    pub fn nvml_code(&self) -> u32 {
        match self {
            Self::InvalidArgument(_) => 2,
            Self::NotSupported(_) => 3,
            Self::NotFound(_) => 6,
            Self::InUse(_) => 19,
            Self::InsufficientResources(_) => 23,
        }
    }
}

/// `NVML_GPU_INSTANCE_PROFILE_COUNT`: profile indices at or above it are invalid.
pub const NVML_GPU_INSTANCE_PROFILE_COUNT: u32 = 0x12;

/// `nvmlDeviceGetGpuInstanceProfileInfo` semantics: the profile at NVML index `index`.
///
/// Errors: `InvalidArgument` for an index ≥ [`NVML_GPU_INSTANCE_PROFILE_COUNT`] (how
/// callers detect the end of enumeration), `NotSupported` for a valid index this GPU
/// lacks.
pub fn profile_info(model: &GpuModel, index: u32) -> Result<&'static MigProfile, MigError> {
    if index >= NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(MigError::InvalidArgument(format!(
            "GPU instance profile index {index} is out of range"
        )));
    }
    model.profile_by_index(index).ok_or_else(|| {
        MigError::NotSupported(format!(
            "{} has no GPU instance profile with index {index}",
            model.key
        ))
    })
}

/// The GI ID NVML assigns to the memory-slice range `start:size` on a GPU with
/// `memory_slices` slices: its heap index `(S/size − 1) + start/size` [A1.2, I verified
/// against 7 transcripts]. On 8-slice parts 0:8→0; 0:4→1, 4:4→2; 0:2→3 … 6:2→6;
/// k:1→7+k. On A30 0:4→0; 0:2→1, 2:2→2; k:1→3+k.
///
/// `None` when `size` is zero or does not divide `memory_slices`, or `start` is not a
/// multiple of `size` (no catalog placement is like that).
pub fn gi_id_for_placement(memory_slices: u32, start: u32, size: u32) -> Option<u32> {
    if size == 0
        || !memory_slices.is_multiple_of(size)
        || !start.is_multiple_of(size)
        || start >= memory_slices
    {
        return None;
    }
    Some(memory_slices / size - 1 + start / size)
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement` rules: whether a GI of `profile_id` may
/// start at memory slice `start` next to `existing`. Returns the instance NVML would
/// create, with its GI ID.
///
/// Errors, checked in this order: unknown profile ID → `InvalidArgument`; `start` not
/// among the profile's possible placements → `InvalidArgument`; overlap with any
/// existing instance's memory slices (including an identical placement) →
/// `InsufficientResources`; the profile's `instanceCount` already reached →
/// `InsufficientResources`.
pub fn check_create(
    model: &GpuModel,
    existing: &[GpuInstance],
    profile_id: u32,
    start: u32,
) -> Result<GpuInstance, MigError> {
    let profile = known_profile(model, profile_id)?;
    let size = profile.placement_size();
    if !profile.placements.contains(&start) {
        return Err(MigError::InvalidArgument(format!(
            "{} {} cannot start at memory slice {start} (possible: {:?})",
            model.key, profile.name, profile.placements
        )));
    }
    if let Some(gi) = existing.iter().find(|gi| gi.overlaps(start, size)) {
        return Err(MigError::InsufficientResources(format!(
            "memory slices {start}..{} overlap GPU instance {} at {}..{}",
            start + size,
            gi.gi_id,
            gi.start,
            gi.start + gi.size
        )));
    }
    check_instance_count(profile, existing)?;
    let gi_id = gi_id_for_placement(model.memory_slices, start, size).ok_or_else(|| {
        MigError::InvalidArgument(format!(
            "{} {} placement {start}:{size} does not fit the GPU's memory slices",
            model.key, profile.name
        ))
    })?;
    Ok(GpuInstance {
        gi_id,
        profile_id,
        start,
        size,
    })
}

/// The placement `nvmlDeviceCreateGpuInstance` (no placement given) picks for
/// `profile_id`: the first free start in [`default_placement_order`].
///
/// Errors: unknown profile ID → `InvalidArgument`; instance count reached or no free
/// placement → `InsufficientResources`.
pub fn default_placement(
    model: &GpuModel,
    existing: &[GpuInstance],
    profile_id: u32,
) -> Result<u32, MigError> {
    let profile = known_profile(model, profile_id)?;
    check_instance_count(profile, existing)?;
    default_placement_order(model, profile)
        .into_iter()
        .find(|&start| check_create(model, existing, profile_id, start).is_ok())
        .ok_or_else(|| {
            MigError::InsufficientResources(format!(
                "no free placement for {} {}",
                model.key, profile.name
            ))
        })
}

/// The order in which the driver tries a profile's placements when none is given,
/// whatever is occupied. Every possible placement appears exactly once.
///
/// 8-slice parts, observed [S, G]: 1-slice profiles 6, 4, 5, 0, 1, 2, 3; 2-slice
/// profiles 4, 0, 2 (2g, and GH200 `1g.24gb` ×3), then 6 for `1g.Ngb` [I]; 4-slice
/// profiles 4, then 0. A30 [S]: 1-slice profiles 0, 1 observed, then 2, 3 [I]; 2-slice
/// profiles take 2 when 0 is taken, 0 first is [I]. Whole-GPU and single-placement
/// profiles have one choice. `+me` profiles are assumed to follow their base profile [I].
pub fn default_placement_order(model: &GpuModel, profile: &MigProfile) -> Vec<u32> {
    let preferred: &[u32] = match (model.memory_slices, profile.placement_size()) {
        (8, 1) => &[6, 4, 5, 0, 1, 2, 3],
        (8, 2) => &[4, 0, 2, 6],
        (8, 4) => &[4, 0],
        (4, 1) => &[0, 1, 2, 3],
        (4, 2) => &[0, 2],
        _ => &[],
    };
    let mut order: Vec<u32> = preferred
        .iter()
        .copied()
        .filter(|s| profile.placements.contains(s))
        .collect();
    order.extend(
        profile
            .placements
            .iter()
            .copied()
            .filter(|s| !preferred.contains(s)),
    );
    order
}

/// `nvmlDeviceGetGpuInstanceRemainingCapacity`: how many more GIs of `profile_id` fit
/// next to `existing`, bounded by free non-overlapping placements and by the remaining
/// instance count. 0 for a profile the model lacks (NVML would refuse the call).
pub fn remaining_capacity(model: &GpuModel, existing: &[GpuInstance], profile_id: u32) -> u32 {
    let Some(profile) = model.profile_by_id(profile_id) else {
        return 0;
    };
    let used = existing
        .iter()
        .filter(|gi| gi.profile_id == profile_id)
        .count() as u32;
    let left = profile.instance_count.saturating_sub(used);
    let size = profile.placement_size();
    let mut taken: Vec<GpuInstance> = existing.to_vec();
    let mut free = 0;
    for &start in profile.placements {
        if !taken.iter().any(|gi| gi.overlaps(start, size)) {
            taken.push(GpuInstance {
                gi_id: u32::MAX,
                profile_id,
                start,
                size,
            });
            free += 1;
        }
    }
    free.min(left)
}

/// `nvmlGpuInstanceDestroy` rules: the instance with `gi_id` may be destroyed when it
/// exists and has no compute instances left. Returns that instance.
///
/// Errors: no such GI → `NotFound`; `live_compute_instances > 0` → `InUse` (the DRA
/// driver destroys the CI first).
pub fn check_destroy(
    existing: &[GpuInstance],
    gi_id: u32,
    live_compute_instances: u32,
) -> Result<GpuInstance, MigError> {
    let gi = existing
        .iter()
        .find(|gi| gi.gi_id == gi_id)
        .ok_or_else(|| MigError::NotFound(format!("no GPU instance with ID {gi_id}")))?;
    if live_compute_instances > 0 {
        return Err(MigError::InUse(format!(
            "GPU instance {gi_id} still has {live_compute_instances} compute instance(s)"
        )));
    }
    Ok(*gi)
}

/// Minor of `/dev/nvidia-caps/nvidia-cap<m>` for `gpu<gpu_minor>/gi<gi_id>/access`:
/// `3 + 135·gpu_minor + 9·gi_id` [A2.1] (GI IDs 0..=14; GPU = device minor).
pub fn gi_cap_minor(gpu_minor: u32, gi_id: u32) -> u32 {
    3 + 135 * gpu_minor + 9 * gi_id
}

/// Minor of the capability node for `gpu<gpu_minor>/gi<gi_id>/ci<ci_id>/access`:
/// `gi_cap_minor + 1 + ci_id` [A2.1] (CI IDs 0..=7).
pub fn ci_cap_minor(gpu_minor: u32, gi_id: u32, ci_id: u32) -> u32 {
    gi_cap_minor(gpu_minor, gi_id) + 1 + ci_id
}

/// A MIG device UUID in the R470+ shape `MIG-xxxxxxxx-xxxx-5xxx-yxxx-xxxxxxxxxxxx`
/// (version nibble 5, RFC 4122 variant `10xx`), derived from SHA-256 of the parent
/// UUID and the GI and CI IDs.
///
/// Deterministic: the same (parent, GI, CI) always yields the same UUID, and distinct
/// triples differ (up to hash collisions). Real drivers only promise stability for the
/// device's lifetime; a simulation reproducing it across re-creation is stricter.
pub fn mig_uuid(parent_uuid: &str, gi_id: u32, ci_id: u32) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"tessera-mig-uuid\0");
    hasher.update(parent_uuid.as_bytes());
    hasher.update(b"\0");
    hasher.update(gi_id.to_be_bytes());
    hasher.update(ci_id.to_be_bytes());
    let digest = hasher.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex = |bytes: &[u8]| bytes.iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "MIG-{}-{}-{}-{}-{}",
        hex(&b[0..4]),
        hex(&b[4..6]),
        hex(&b[6..8]),
        hex(&b[8..10]),
        hex(&b[10..16])
    )
}

/// The model's profile with this ID, or `InvalidArgument`.
fn known_profile(model: &GpuModel, profile_id: u32) -> Result<&'static MigProfile, MigError> {
    model.profile_by_id(profile_id).ok_or_else(|| {
        MigError::InvalidArgument(format!(
            "{} has no GPU instance profile with ID {profile_id}",
            model.key
        ))
    })
}

/// `InsufficientResources` when `existing` already holds `instanceCount` GIs of `profile`.
fn check_instance_count(profile: &MigProfile, existing: &[GpuInstance]) -> Result<(), MigError> {
    let used = existing
        .iter()
        .filter(|gi| gi.profile_id == profile.profile_id)
        .count();
    if used >= profile.instance_count as usize {
        return Err(MigError::InsufficientResources(format!(
            "{} already has {used} of {} instance(s)",
            profile.name, profile.instance_count
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The heap-index formula reproduces the GI-ID table of the facts (A1.2).
    #[test]
    fn gi_ids_follow_the_heap_index_table() {
        let eight = [
            ((0, 8), 0),
            ((0, 4), 1),
            ((4, 4), 2),
            ((0, 2), 3),
            ((2, 2), 4),
            ((4, 2), 5),
            ((6, 2), 6),
        ];
        for ((start, size), want) in eight {
            assert_eq!(
                gi_id_for_placement(8, start, size),
                Some(want),
                "{start}:{size}"
            );
        }
        for k in 0..7 {
            assert_eq!(gi_id_for_placement(8, k, 1), Some(7 + k));
        }
        let a30 = [((0, 4), 0), ((0, 2), 1), ((2, 2), 2)];
        for ((start, size), want) in a30 {
            assert_eq!(
                gi_id_for_placement(4, start, size),
                Some(want),
                "{start}:{size}"
            );
        }
        for k in 0..4 {
            assert_eq!(gi_id_for_placement(4, k, 1), Some(3 + k));
        }
        for (start, size) in [(0, 0), (1, 2), (0, 3), (8, 1)] {
            assert_eq!(gi_id_for_placement(8, start, size), None, "{start}:{size}");
        }
    }

    /// Error variants carry the NVML return codes they mirror.
    #[test]
    fn errors_map_to_nvml_codes() {
        let cases = [
            (MigError::InvalidArgument(String::new()), 2),
            (MigError::NotSupported(String::new()), 3),
            (MigError::NotFound(String::new()), 6),
            (MigError::InUse(String::new()), 19),
            (MigError::InsufficientResources(String::new()), 23),
        ];
        for (err, code) in cases {
            assert_eq!(err.nvml_code(), code, "{err}");
        }
    }

    /// MIG UUIDs have the v5 shape: 8-4-4-4-12 lower-case hex, version 5, variant 10xx.
    #[test]
    fn mig_uuids_have_the_v5_shape() {
        let uuid = mig_uuid("GPU-4f8d0c1e-6a2b-4c59-9e31-0a7b5d2c9f10", 7, 0);
        let body = uuid.strip_prefix("MIG-").unwrap();
        let groups: Vec<&str> = body.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(
            body.chars()
                .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c))
        );
        assert!(groups[2].starts_with('5'), "{uuid}");
        assert!(
            matches!(groups[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'),
            "{uuid}"
        );
    }
}
