//! MIG models read from NVML for products the catalog lacks: a new product name, or a
//! known part under a name the catalog does not list. With MIG on, NVML answers every
//! GPU-instance profile (`nvmlDeviceGetGpuInstanceProfileInfo` over the profile
//! indices) and its placements; [`model_from_nvml`] turns those answers into a
//! [`GpuModel`] (pure), and [`register`] keeps it for the life of the process so that
//! publishing, planning and preparing find it through [`super::model_for_product`] as
//! they find the catalog's.
//!
//! Such a model never toggles MIG mode (`reset_free_mig_toggle` is false): its profiles
//! are only known while MIG is on, so Tessera leaves the mode as the administrator set
//! it. Profile names are derived as `nvidia-smi` forms them (`<g>g.<GiB>gb`, a suffix
//! per profile index), with the memory rounded up to whole GiB.

use std::sync::{Mutex, PoisonError};

use super::catalog::{GpuModel, MigProfile, Verification, full_gi_ci_profile};

/// One GPU-instance profile as NVML answered it: `nvmlGpuInstanceProfileInfo_t` at
/// profile index `nvml_index`, and its possible placements as `(start, size)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlProfile {
    pub nvml_index: u32,
    pub profile_id: u32,
    pub slice_count: u32,
    pub instance_count: u32,
    pub memory_mib: u64,
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
    pub placements: Vec<(u32, u32)>,
}

/// Why one of NVML's profiles was left out of a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnusableProfile {
    #[error("profile index {0}: no placements")]
    NoPlacements(u32),
    #[error("profile index {0}: placements of different sizes")]
    MixedSizes(u32),
    #[error("profile index {index}: no compute-instance profile spans {slices} slices")]
    NoFullComputeInstance { index: u32, slices: u32 },
    #[error("profile index {index}: ID {id} or name {name} already taken")]
    Duplicate { index: u32, id: u32, name: String },
}

/// The model an owned table describes, before it is made `'static`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedModel {
    pub product_name: String,
    pub architecture: String,
    pub memory_slices: u32,
    pub compute_slices: u32,
    /// `(name, profile, placement starts, placement size, CI profile index)`.
    pub profiles: Vec<(String, NvmlProfile, Vec<u32>, u32, u32)>,
}

/// The suffix `nvidia-smi` gives a profile index's name: `+me` (media extensions,
/// `*_REV1`), `+gfx`, `-me` (`*_NO_ME`), `+me.all` (`*_ALL_ME`); none otherwise.
/// Deterministic.
pub fn profile_suffix(nvml_index: u32) -> &'static str {
    match nvml_index {
        7 | 8 => "+me",
        10..=12 => "+gfx",
        13 | 14 => "-me",
        15 | 16 => "+me.all",
        _ => "",
    }
}

/// `<g>g.<GiB>gb<suffix>`, the memory rounded up to whole GiB: `1g.18gb+me`.
/// Deterministic.
pub fn profile_name(p: &NvmlProfile) -> String {
    format!(
        "{}g.{}gb{}",
        p.slice_count,
        p.memory_mib.div_ceil(1024),
        profile_suffix(p.nvml_index)
    )
}

/// The model NVML's answers describe, and the profiles left out with why. `None` when
/// no profile is usable. Memory slices are the end of the furthest placement, compute
/// slices the largest `sliceCount`. Deterministic.
pub fn model_from_nvml(
    product_name: &str,
    architecture: &str,
    nvml: &[NvmlProfile],
) -> (Option<OwnedModel>, Vec<UnusableProfile>) {
    let mut skipped = Vec::new();
    let mut profiles: Vec<(String, NvmlProfile, Vec<u32>, u32, u32)> = Vec::new();
    let mut sorted: Vec<&NvmlProfile> = nvml.iter().collect();
    sorted.sort_by_key(|p| p.nvml_index);
    for p in sorted {
        let index = p.nvml_index;
        let Some(&(_, size)) = p.placements.first() else {
            skipped.push(UnusableProfile::NoPlacements(index));
            continue;
        };
        if p.placements.iter().any(|&(_, s)| s != size) {
            skipped.push(UnusableProfile::MixedSizes(index));
            continue;
        }
        let Some(ci) = full_gi_ci_profile(p.slice_count) else {
            skipped.push(UnusableProfile::NoFullComputeInstance {
                index,
                slices: p.slice_count,
            });
            continue;
        };
        let name = profile_name(p);
        if profiles
            .iter()
            .any(|(n, q, ..)| *n == name || q.profile_id == p.profile_id)
        {
            skipped.push(UnusableProfile::Duplicate {
                index,
                id: p.profile_id,
                name,
            });
            continue;
        }
        let mut starts: Vec<u32> = p.placements.iter().map(|&(s, _)| s).collect();
        starts.sort_unstable();
        starts.dedup();
        profiles.push((name, p.clone(), starts, size, ci));
    }
    if profiles.is_empty() {
        return (None, skipped);
    }
    let memory_slices = profiles
        .iter()
        .flat_map(|(_, p, ..)| p.placements.iter().map(|&(s, n)| s + n))
        .max()
        .unwrap_or(0);
    let compute_slices = profiles
        .iter()
        .map(|(_, p, ..)| p.slice_count)
        .max()
        .unwrap_or(0);
    let model = OwnedModel {
        product_name: product_name.to_string(),
        architecture: architecture.to_string(),
        memory_slices,
        compute_slices,
        profiles,
    };
    (Some(model), skipped)
}

/// The models registered in this process, newest last.
static REGISTERED: Mutex<Vec<(OwnedModel, &'static GpuModel)>> = Mutex::new(Vec::new());

/// Keeps `model` for the life of the process and returns its `'static` form, which
/// [`super::model_for_product`] finds by its product name from now on. Registering an
/// equal model again returns the one already kept; a different model for the same name
/// replaces it (the old one stays allocated: one per distinct table, never per call).
pub fn register(model: OwnedModel) -> &'static GpuModel {
    let mut all = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, kept)) = all.iter().find(|(m, _)| *m == model) {
        return kept;
    }
    let leak = |s: &str| -> &'static str { Box::leak(s.to_string().into_boxed_str()) };
    let profiles: Vec<MigProfile> = model
        .profiles
        .iter()
        .map(|(name, p, starts, size, ci)| MigProfile {
            name: leak(name),
            nvml_index: p.nvml_index,
            profile_id: p.profile_id,
            instance_count: p.instance_count,
            memory_mib: p.memory_mib,
            multiprocessors: p.multiprocessors,
            copy_engines: p.copy_engines,
            decoders: p.decoders,
            encoders: p.encoders,
            jpeg_engines: p.jpeg_engines,
            ofa_engines: p.ofa_engines,
            memory_slices: *size,
            placements: Box::leak(starts.clone().into_boxed_slice()),
            ci_profile_index: *ci,
            verified: Verification::FromNvml,
        })
        .collect();
    let product: &'static str = leak(&model.product_name);
    let kept: &'static GpuModel = Box::leak(Box::new(GpuModel {
        key: product,
        product_names: Box::leak(vec![product].into_boxed_slice()),
        architecture: leak(&model.architecture),
        memory_slices: model.memory_slices,
        compute_slices: model.compute_slices,
        total_memory_mib_mig: None,
        profiles: Box::leak(profiles.into_boxed_slice()),
        reset_free_mig_toggle: false,
    }));
    all.retain(|(m, _)| m.product_name != model.product_name);
    all.push((model, kept));
    kept
}

/// The model registered for `product_name`, if any.
pub fn model_for_product(product_name: &str) -> Option<&'static GpuModel> {
    REGISTERED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .find(|(m, _)| m.product_name == product_name)
        .map(|(_, kept)| *kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(index: u32, id: u32, g: u32, mib: u64, placements: &[(u32, u32)]) -> NvmlProfile {
        NvmlProfile {
            nvml_index: index,
            profile_id: id,
            slice_count: g,
            instance_count: placements.len() as u32,
            memory_mib: mib,
            multiprocessors: 16 * g,
            copy_engines: g,
            decoders: g,
            encoders: 0,
            jpeg_engines: 0,
            ofa_engines: 0,
            placements: placements.to_vec(),
        }
    }

    /// Names as nvidia-smi prints them, from the slice count, memory and index.
    #[test]
    fn profile_names_follow_nvidia_smi() {
        let cases = [
            (0, 1, 18432, "1g.18gb"),
            (7, 1, 18432, "1g.18gb+me"),
            (9, 1, 35840, "1g.35gb"),
            (4, 7, 144384, "7g.141gb"),
            (0, 1, 9984, "1g.10gb"),
            (13, 1, 9984, "1g.10gb-me"),
            (15, 1, 9984, "1g.10gb+me.all"),
            (10, 1, 9984, "1g.10gb+gfx"),
        ];
        for (index, g, mib, want) in cases {
            let p = profile(index, index, g, mib, &[(0, 1)]);
            assert_eq!(profile_name(&p), want, "index {index}");
        }
    }

    /// What NVML answers becomes a model: usable profiles in index order, slices from
    /// the placements; each unusable profile is left out with why.
    #[test]
    fn a_model_from_nvml_keeps_usable_profiles_and_says_why_others_are_left_out() {
        let nvml = [
            profile(4, 0, 7, 81920, &[(0, 8)]),
            profile(0, 19, 1, 10240, &[(0, 1), (1, 1), (6, 1)]),
            profile(1, 14, 2, 20480, &[]),
            profile(2, 9, 3, 40960, &[(0, 4), (4, 3)]),
            profile(6, 30, 5, 50000, &[(0, 5)]),
            profile(9, 19, 1, 20480, &[(0, 2)]),
        ];
        let (model, skipped) = model_from_nvml("New GPU", "Hopper", &nvml);
        let model = model.expect("usable profiles");
        let names: Vec<&str> = model.profiles.iter().map(|(n, ..)| n.as_str()).collect();
        assert_eq!(names, ["1g.10gb", "7g.80gb"]);
        assert_eq!((model.memory_slices, model.compute_slices), (8, 7));
        assert_eq!(model.profiles[0].2, [0, 1, 6]);
        assert_eq!(
            skipped,
            [
                UnusableProfile::NoPlacements(1),
                UnusableProfile::MixedSizes(2),
                UnusableProfile::NoFullComputeInstance {
                    index: 6,
                    slices: 5
                },
                UnusableProfile::Duplicate {
                    index: 9,
                    id: 19,
                    name: "1g.20gb".into()
                },
            ]
        );
        let (none, why) = model_from_nvml("New GPU", "Hopper", &nvml[2..3]);
        assert_eq!((none, why), (None, vec![UnusableProfile::NoPlacements(1)]));
    }

    /// A registered model is found by its product name, keeps NVML's IDs and never
    /// toggles MIG; registering it again returns the same one, a new table replaces it.
    #[test]
    fn a_registered_model_is_found_by_its_product_name() {
        let name = "Test GPU registered by discovered::tests";
        assert!(super::super::model_for_product(name).is_none());
        let nvml = [profile(0, 0, 1, 10240, &[(0, 1), (1, 1)])];
        let (model, _) = model_from_nvml(name, "Blackwell", &nvml);
        let kept = register(model.clone().unwrap());
        assert!(std::ptr::eq(kept, register(model.unwrap())));
        let found = super::super::model_for_product(name).expect("registered");
        assert!(std::ptr::eq(found, kept));
        assert!(!found.reset_free_mig_toggle);
        let p = found.profile_by_id(0).unwrap();
        assert_eq!(
            (p.name, p.placements, p.memory_slices),
            ("1g.10gb", &[0, 1][..], 1)
        );
        assert_eq!(p.verified, Verification::FromNvml);
        let (other, _) = model_from_nvml(name, "Blackwell", &[profile(0, 0, 1, 10240, &[(0, 1)])]);
        let replaced = register(other.unwrap());
        assert!(!std::ptr::eq(replaced, kept));
        assert!(std::ptr::eq(
            super::super::model_for_product(name).unwrap(),
            replaced
        ));
    }
}
