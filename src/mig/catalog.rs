//! The MIG profile catalog: for each MIG-capable GPU model, the GPU-instance profiles
//! NVML reports (`nvmlDeviceGetGpuInstanceProfileInfo` + possible placements), as
//! static data. No I/O; every lookup is deterministic.
//!
//! Values come from `shared/reference/mig-and-cuda-facts.md` §A1.0–A1.3. Each profile
//! carries a [`Verification`] mark: the *weakest* provenance among its fields. Each
//! model's doc lists which fields are inferred or unverified.
//!
//! Only profiles whose compute instance spans the whole GPU instance (C == G) are
//! modelled, as in the NVIDIA DRA driver: [`MigProfile::ci_profile_index`] is that
//! full-GI compute-instance profile.

/// How much the facts back a profile's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verification {
    /// Every field seen in the MIG guide's tables or a real `nvidia-smi mig` transcript.
    Observed,
    /// At least one field inferred from a pattern across other GPUs (`[I]` in the facts).
    Inferred,
    /// Derived without any transcript (e.g. B200, from the guide's fractions only).
    Unverified,
    /// Read from the GPU's own NVML at run time (a product the catalog lacks).
    FromNvml,
}

/// One GPU-instance profile, as NVML describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigProfile {
    /// Profile name as `nvidia-smi mig -lgip` prints it: `1g.10gb`, `1g.10gb+me`.
    pub name: &'static str,
    /// `NVML_GPU_INSTANCE_PROFILE_*` value: what `nvmlDeviceGetGpuInstanceProfileInfo` takes.
    pub nvml_index: u32,
    /// The profile ID (`info.id`, shown by `nvidia-smi mig -lgip`): what every other GI
    /// call takes. Not the NVML index (H100 `1g.10gb`: index 0, ID 19).
    pub profile_id: u32,
    /// `instanceCount`: at most this many GIs of the profile at once.
    pub instance_count: u32,
    /// `memorySizeMB` as NVML reports it (MiB).
    pub memory_mib: u64,
    /// `multiprocessorCount`.
    pub multiprocessors: u32,
    /// `copyEngineCount`.
    pub copy_engines: u32,
    /// `decoderCount`.
    pub decoders: u32,
    /// `encoderCount`.
    pub encoders: u32,
    /// `jpegCount`.
    pub jpeg_engines: u32,
    /// `ofaCount`.
    pub ofa_engines: u32,
    /// Memory slices one instance occupies: the placement size.
    pub memory_slices: u32,
    /// Valid placement starts (in memory slices), ascending.
    pub placements: &'static [u32],
    /// `NVML_COMPUTE_INSTANCE_PROFILE_*` of the compute instance spanning the whole GI:
    /// the SM-slice count mapped 1g→0, 2g→1, 3g→2, 4g→3, 7g→4.
    pub ci_profile_index: u32,
    /// The weakest provenance among this profile's fields.
    pub verified: Verification,
}

impl MigProfile {
    /// Memory slices one instance occupies (the `size` of its placements).
    pub fn placement_size(&self) -> u32 {
        self.memory_slices
    }
}

/// A MIG-capable GPU model and its profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuModel {
    /// Catalog key, e.g. `H100-80GB`.
    pub key: &'static str,
    /// NVML product names (`nvmlDeviceGetName`) that map to this model.
    pub product_names: &'static [&'static str],
    /// Architecture as `GpuInfo::architecture` spells it: `Ampere`, `Hopper`, `Blackwell`.
    pub architecture: &'static str,
    /// Memory slices: 8, or 4 on A30.
    pub memory_slices: u32,
    /// SM (compute) slices: 7, or 4 on A30.
    pub compute_slices: u32,
    /// Total memory NVML reports for the full GPU in MIG mode, where a transcript shows it.
    pub total_memory_mib_mig: Option<u64>,
    /// Profiles in `nvidia-smi mig -lgip` order.
    pub profiles: &'static [MigProfile],
    /// MIG mode toggles without a GPU reset (Hopper and later); Ampere needs a reset.
    pub reset_free_mig_toggle: bool,
}

impl GpuModel {
    /// The profile with this profile ID (19, 20, 15…), if the model has it.
    pub fn profile_by_id(&self, id: u32) -> Option<&'static MigProfile> {
        self.profiles.iter().find(|p| p.profile_id == id)
    }

    /// The profile with this `NVML_GPU_INSTANCE_PROFILE_*` index, if the model has it.
    pub fn profile_by_index(&self, index: u32) -> Option<&'static MigProfile> {
        self.profiles.iter().find(|p| p.nvml_index == index)
    }

    /// The profile with exactly this name (`1g.10gb+me`), if the model has it.
    pub fn profile_by_name(&self, name: &str) -> Option<&'static MigProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

/// The model whose NVML product names include `product_name` (exact match): the
/// catalog's, else one this process read from NVML for a product the catalog lacks
/// ([`super::discovered`]).
pub fn model_for_product(product_name: &str) -> Option<&'static GpuModel> {
    catalogued(product_name).or_else(|| super::discovered::model_for_product(product_name))
}

/// The catalog's own model for `product_name` (exact match), if any.
pub fn catalogued(product_name: &str) -> Option<&'static GpuModel> {
    MODELS
        .iter()
        .find(|m| m.product_names.contains(&product_name))
}

/// Every modelled GPU.
pub fn all_models() -> &'static [GpuModel] {
    &MODELS
}

/// Full-GI compute-instance profile index for a GI of `sm_slices` SM slices
/// (`NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7,8,6}_SLICE`), `None` for other counts.
/// Deterministic.
pub const fn full_gi_ci_profile(sm_slices: u32) -> Option<u32> {
    match sm_slices {
        1 => Some(0),
        2 => Some(1),
        3 => Some(2),
        4 => Some(3),
        7 => Some(4),
        8 => Some(5),
        6 => Some(6),
        _ => None,
    }
}

/// [`full_gi_ci_profile`] for the static tables: an unknown count fails the build.
const fn full_gi_ci_profile_index(sm_slices: u32) -> u32 {
    match full_gi_ci_profile(sm_slices) {
        Some(i) => i,
        None => panic!("no compute-instance profile for this slice count"),
    }
}

/// One table row per profile. Columns: name, NVML index, profile ID, instanceCount,
/// memorySizeMB, SM, CE, DEC, ENC, JPEG, OFA, SM slices (g), memory slices, placements,
/// verification.
macro_rules! profiles {
    ($($name:literal: $idx:literal $id:literal $inst:literal $mem:literal
        $sm:literal $ce:literal $dec:literal $enc:literal $jpeg:literal $ofa:literal
        $g:literal $slices:literal [$($start:literal),*] $v:ident;)*) => {
        &[$(MigProfile {
            name: $name,
            nvml_index: $idx,
            profile_id: $id,
            instance_count: $inst,
            memory_mib: $mem,
            multiprocessors: $sm,
            copy_engines: $ce,
            decoders: $dec,
            encoders: $enc,
            jpeg_engines: $jpeg,
            ofa_engines: $ofa,
            memory_slices: $slices,
            placements: &[$($start),*],
            ci_profile_index: full_gi_ci_profile_index($g),
            verified: Verification::$v,
        }),*]
    };
}

/// A100 40GB. All fields observed [G table + S]. Also matches the go-nvml mock.
const A100_40GB: GpuModel = GpuModel {
    key: "A100-SXM4-40GB",
    product_names: &["NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"],
    architecture: "Ampere",
    memory_slices: 8,
    compute_slices: 7,
    total_memory_mib_mig: None,
    reset_free_mig_toggle: false,
    profiles: profiles! {
    //  name          idx id inst MiB    SM  CE DEC ENC JPG OFA g mem placements
        "1g.5gb":     0   19 7    4864   14  1  0   0   0   0   1 1   [0, 1, 2, 3, 4, 5, 6] Observed;
        "1g.5gb+me":  7   20 1    4864   14  1  1   0   1   1   1 1   [0, 1, 2, 3, 4, 5, 6] Observed;
        "1g.10gb":    9   15 4    9856   14  1  1   0   0   0   1 2   [0, 2, 4, 6]          Observed;
        "2g.10gb":    1   14 3    9856   28  2  1   0   0   0   2 2   [0, 2, 4]             Observed;
        "3g.20gb":    2   9  2    19968  42  3  2   0   0   0   3 4   [0, 4]                Observed;
        "4g.20gb":    3   5  1    19968  56  4  2   0   0   0   4 4   [0]                   Observed;
        "7g.40gb":    4   0  1    40192  98  7  5   0   1   1   7 8   [0]                   Observed;
    },
};

/// A100 80GB. Observed [S, two transcripts] except `1g.20gb` DEC, inferred by analogy
/// with the 40GB part.
const A100_80GB: GpuModel = GpuModel {
    key: "A100-80GB",
    product_names: &["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"],
    architecture: "Ampere",
    memory_slices: 8,
    compute_slices: 7,
    total_memory_mib_mig: None,
    reset_free_mig_toggle: false,
    profiles: profiles! {
    //  name          idx id inst MiB    SM  CE DEC ENC JPG OFA g mem placements
        "1g.10gb":    0   19 7    9728   14  1  0   0   0   0   1 1   [0, 1, 2, 3, 4, 5, 6] Observed;
        "1g.10gb+me": 7   20 1    9728   14  1  1   0   1   1   1 1   [0, 1, 2, 3, 4, 5, 6] Observed;
        "1g.20gb":    9   15 4    19968  14  1  1   0   0   0   1 2   [0, 2, 4, 6]          Inferred;
        "2g.20gb":    1   14 3    19968  28  2  1   0   0   0   2 2   [0, 2, 4]             Observed;
        "3g.40gb":    2   9  2    40192  42  3  2   0   0   0   3 4   [0, 4]                Observed;
        "4g.40gb":    3   5  1    40192  56  4  2   0   0   0   4 4   [0]                   Observed;
        "7g.80gb":    4   0  1    80896  98  7  5   0   1   1   7 8   [0]                   Observed;
    },
};

/// A30 24GB: 4 memory and 4 SM slices, its own profile IDs. All fields observed [G + S,
/// driver 535.183.01]; `4g.24gb` is 24064 MiB on another driver. DEC of `1g.6gb` is
/// NVML's 1, not the guide's 0.
const A30_24GB: GpuModel = GpuModel {
    key: "A30-24GB",
    product_names: &["NVIDIA A30"],
    architecture: "Ampere",
    memory_slices: 4,
    compute_slices: 4,
    total_memory_mib_mig: None,
    reset_free_mig_toggle: false,
    profiles: profiles! {
    //  name          idx id inst MiB    SM  CE DEC ENC JPG OFA g mem placements
        "1g.6gb":     0   14 4    5952   14  1  1   0   0   0   1 1   [0, 1, 2, 3]          Observed;
        "1g.6gb+me":  7   21 1    5952   14  1  1   0   1   1   1 1   [0, 1, 2, 3]          Observed;
        "2g.12gb":    1   5  2    11968  28  2  2   0   0   0   2 2   [0, 2]                Observed;
        "2g.12gb+me": 8   6  1    11968  28  2  2   0   1   1   2 2   [0, 2]                Observed;
        "4g.24gb":    3   0  1    24000  56  4  4   0   1   1   4 4   [0]                   Observed;
    },
};

/// H100 80GB (SXM5 and PCIe). All fields observed [G + S, several identical transcripts];
/// the full GPU showed 81559 MiB in MIG mode (driver 580.65.06).
const H100_80GB: GpuModel = GpuModel {
    key: "H100-80GB",
    product_names: &["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"],
    architecture: "Hopper",
    memory_slices: 8,
    compute_slices: 7,
    total_memory_mib_mig: Some(81559),
    reset_free_mig_toggle: true,
    profiles: profiles! {
    //  name          idx id inst MiB    SM  CE DEC ENC JPG OFA g mem placements
        "1g.10gb":    0   19 7    9984   16  1  1   0   1   0   1 1   [0, 1, 2, 3, 4, 5, 6] Observed;
        "1g.10gb+me": 7   20 1    9984   16  1  1   0   1   1   1 1   [0, 1, 2, 3, 4, 5, 6] Observed;
        "1g.20gb":    9   15 4    20096  26  1  1   0   1   0   1 2   [0, 2, 4, 6]          Observed;
        "2g.20gb":    1   14 3    20096  32  2  2   0   2   0   2 2   [0, 2, 4]             Observed;
        "3g.40gb":    2   9  2    40448  60  3  3   0   3   0   3 4   [0, 4]                Observed;
        "4g.40gb":    3   5  1    40448  64  4  4   0   4   0   4 4   [0]                   Observed;
        "7g.80gb":    4   0  1    81152  132 8  7   0   7   1   7 8   [0]                   Observed;
    },
};

/// H100 NVL 94GB. All fields observed [G names/engines, S placements]; memory is the
/// driver 560.35.03 transcript (another driver reports 128 MiB less per slice, 94848
/// for 7g). Full GPU in MIG mode: 95830 MiB [S]. The SXM5/PCIe 94GB parts share these
/// numbers per the facts, but their NVML names are not recorded, so only the NVL maps.
const H100_94GB: GpuModel = GpuModel {
    key: "H100-94GB",
    product_names: &["NVIDIA H100 NVL"],
    architecture: "Hopper",
    memory_slices: 8,
    compute_slices: 7,
    total_memory_mib_mig: Some(95830),
    reset_free_mig_toggle: true,
    profiles: profiles! {
    //  name          idx id inst MiB    SM  CE DEC ENC JPG OFA g mem placements
        "1g.12gb":    0   19 7    11008  16  1  1   0   1   0   1 1   [0, 1, 2, 3, 4, 5, 6] Observed;
        "1g.12gb+me": 7   20 1    11008  16  1  1   0   1   1   1 1   [0, 1, 2, 3, 4, 5, 6] Observed;
        "1g.24gb":    9   15 4    22144  26  1  1   0   1   0   1 2   [0, 2, 4, 6]          Observed;
        "2g.24gb":    1   14 3    22144  32  2  2   0   2   0   2 2   [0, 2, 4]             Observed;
        "3g.47gb":    2   9  2    47488  60  3  3   0   3   0   3 4   [0, 4]                Observed;
        "4g.47gb":    3   5  1    47488  64  4  4   0   4   0   4 4   [0]                   Observed;
        "7g.94gb":    4   0  1    95360  132 8  7   0   7   1   7 8   [0]                   Observed;
    },
};

/// GH200 (H100 96GB on Grace Hopper). Memory, SM and engine counts observed [G + S];
/// placements inferred from the 8-slice table (only `1g.24gb` at 0, 2, 4 was seen), so
/// every profile is [`Verification::Inferred`]. On GH200 `-cgi 15 -C` picks CI profile
/// `1_SLICE_REV1`; Tessera, like the DRA driver, uses the C == G profile (index 0).
const GH200_96GB: GpuModel = GpuModel {
    key: "GH200-96GB",
    product_names: &["NVIDIA GH200 480GB"],
    architecture: "Hopper",
    memory_slices: 8,
    compute_slices: 7,
    total_memory_mib_mig: None,
    reset_free_mig_toggle: true,
    profiles: profiles! {
    //  name          idx id inst MiB    SM  CE DEC ENC JPG OFA g mem placements
        "1g.12gb":    0   19 7    11264  16  1  1   0   1   0   1 1   [0, 1, 2, 3, 4, 5, 6] Inferred;
        "1g.12gb+me": 7   20 1    11264  16  1  1   0   1   1   1 1   [0, 1, 2, 3, 4, 5, 6] Inferred;
        "1g.24gb":    9   15 4    23552  26  1  1   0   1   0   1 2   [0, 2, 4, 6]          Inferred;
        "2g.24gb":    1   14 3    23552  32  2  2   0   2   0   2 2   [0, 2, 4]             Inferred;
        "3g.48gb":    2   9  2    47616  60  3  3   0   3   0   3 4   [0, 4]                Inferred;
        "4g.48gb":    3   5  1    47616  64  4  4   0   4   0   4 4   [0]                   Inferred;
        "7g.96gb":    4   0  1    95232  132 8  7   0   7   1   7 8   [0]                   Inferred;
    },
};

/// H200 141GB (SXM5 and NVL). Placements are inferred for every profile (no `-lgipp`
/// transcript), so all are [`Verification::Inferred`]. Observed [S]: memory of
/// `1g.18gb`, `1g.18gb+me`, `2g.35gb`, `7g.141gb`; IDs 19/20/14/0. Inferred beyond
/// placements: `1g.35gb` ID, memory (= 2g) and SM; `3g.71gb`/`4g.71gb` IDs, SM and
/// memory (71680 MiB = half of 7g; never seen).
const H200_141GB: GpuModel = GpuModel {
    key: "H200-141GB",
    product_names: &["NVIDIA H200", "NVIDIA H200 NVL"],
    architecture: "Hopper",
    memory_slices: 8,
    compute_slices: 7,
    total_memory_mib_mig: None,
    reset_free_mig_toggle: true,
    profiles: profiles! {
    //  name          idx id inst MiB    SM  CE DEC ENC JPG OFA g mem placements
        "1g.18gb":    0   19 7    16384  16  1  1   0   1   0   1 1   [0, 1, 2, 3, 4, 5, 6] Inferred;
        "1g.18gb+me": 7   20 1    16384  16  1  1   0   1   1   1 1   [0, 1, 2, 3, 4, 5, 6] Inferred;
        "1g.35gb":    9   15 4    33280  26  1  1   0   1   0   1 2   [0, 2, 4, 6]          Inferred;
        "2g.35gb":    1   14 3    33280  32  2  2   0   2   0   2 2   [0, 2, 4]             Inferred;
        "3g.71gb":    2   9  2    71680  60  3  3   0   3   0   3 4   [0, 4]                Inferred;
        "4g.71gb":    3   5  1    71680  64  4  4   0   4   0   4 4   [0]                   Inferred;
        "7g.141gb":   4   0  1    143360 132 8  7   0   7   1   7 8   [0]                   Inferred;
    },
};

/// B200 180GB. No transcript exists; everything is [`Verification::Unverified`]. From
/// the guide [G]: names, instance counts, CE/DEC/JPEG/OFA, memory and SM fractions.
/// Derived: memory = ⌊183359 MiB × memory fraction⌋ and SM = ⌊148 × SM fraction⌋,
/// where 183359 MiB and 148 SMs are what public `nvidia-smi`/CUDA output shows for a
/// B200 outside MIG mode (not in the facts). Assumed: profile IDs as on H100, ENC 0,
/// the 8-slice placement table.
const B200_180GB: GpuModel = GpuModel {
    key: "B200-180GB",
    product_names: &["NVIDIA B200"],
    architecture: "Blackwell",
    memory_slices: 8,
    compute_slices: 7,
    total_memory_mib_mig: None,
    reset_free_mig_toggle: true,
    profiles: profiles! {
    //  name          idx id inst MiB    SM  CE DEC ENC JPG OFA g mem placements
        "1g.23gb":    0   19 7    22919  21  2  1   0   1   0   1 1   [0, 1, 2, 3, 4, 5, 6] Unverified;
        "1g.23gb+me": 7   20 1    22919  21  2  1   0   1   1   1 1   [0, 1, 2, 3, 4, 5, 6] Unverified;
        "1g.45gb":    9   15 4    45839  21  2  1   0   1   0   1 2   [0, 2, 4, 6]          Unverified;
        "2g.45gb":    1   14 3    45839  42  3  1   0   1   0   2 2   [0, 2, 4]             Unverified;
        "3g.90gb":    2   9  2    91679  63  6  1   0   1   0   3 4   [0, 4]                Unverified;
        "4g.90gb":    3   5  1    91679  84  8  1   0   1   0   4 4   [0]                   Unverified;
        "7g.180gb":   4   0  1    183359 148 16 1   0   1   1   7 8   [0]                   Unverified;
    },
};

static MODELS: [GpuModel; 8] = [
    A100_40GB, A100_80GB, A30_24GB, H100_80GB, H100_94GB, GH200_96GB, H200_141GB, B200_180GB,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// SM-slice count of a profile, read from its name (`3g.40gb` → 3).
    fn sm_slices(p: &MigProfile) -> u32 {
        p.name.split_once('g').unwrap().0.parse().unwrap()
    }

    /// Placements are aligned to their size, inside the GPU, ascending, and enough
    /// for the instance count.
    #[test]
    fn placements_are_aligned_and_inside_the_gpu() {
        for m in all_models() {
            for p in m.profiles {
                let size = p.placement_size();
                assert!(
                    size > 0 && m.memory_slices.is_multiple_of(size),
                    "{} {}",
                    m.key,
                    p.name
                );
                assert!(p.placements.windows(2).all(|w| w[0] < w[1]), "{}", p.name);
                for &start in p.placements {
                    assert!(start.is_multiple_of(size), "{} {} @{start}", m.key, p.name);
                    assert!(start + size <= m.memory_slices, "{} {}", m.key, p.name);
                }
                assert!(
                    p.instance_count as usize <= p.placements.len(),
                    "{}",
                    p.name
                );
            }
        }
    }

    /// Names, profile IDs and NVML indices are each unique within a model.
    #[test]
    fn profile_keys_are_unique_per_model() {
        for m in all_models() {
            for (i, a) in m.profiles.iter().enumerate() {
                for b in &m.profiles[i + 1..] {
                    assert_ne!(a.name, b.name, "{}", m.key);
                    assert_ne!(a.profile_id, b.profile_id, "{}", m.key);
                    assert_ne!(a.nvml_index, b.nvml_index, "{}", m.key);
                }
            }
        }
    }

    /// The full-GI CI profile follows the SM-slice count in the name, which never
    /// exceeds the model's compute slices; `+me` profiles are the REV1 indices with an OFA.
    #[test]
    fn compute_side_matches_the_profile_name() {
        for m in all_models() {
            for p in m.profiles {
                let g = sm_slices(p);
                assert!(g <= m.compute_slices, "{} {}", m.key, p.name);
                assert_eq!(
                    p.ci_profile_index,
                    full_gi_ci_profile_index(g),
                    "{}",
                    p.name
                );
                if p.name.ends_with("+me") {
                    assert!(matches!(p.nvml_index, 7 | 8), "{} {}", m.key, p.name);
                    assert!(p.ofa_engines >= 1, "{} {}", m.key, p.name);
                }
            }
        }
    }

    /// Lookups by ID, index and name find the same profile; unknown keys find none.
    #[test]
    fn lookups_agree() {
        for m in all_models() {
            for p in m.profiles {
                assert_eq!(m.profile_by_id(p.profile_id), Some(p));
                assert_eq!(m.profile_by_index(p.nvml_index), Some(p));
                assert_eq!(m.profile_by_name(p.name), Some(p));
            }
            assert_eq!(m.profile_by_id(99), None);
            assert_eq!(m.profile_by_index(0x12), None);
            assert_eq!(m.profile_by_name("1g.1gb"), None);
        }
    }

    /// Model keys and product names are unique across the catalog, so a product maps
    /// to at most one model.
    #[test]
    fn product_names_map_to_one_model() {
        let models = all_models();
        for (i, a) in models.iter().enumerate() {
            for b in &models[i + 1..] {
                assert_ne!(a.key, b.key);
                for name in a.product_names {
                    assert!(!b.product_names.contains(name), "{name}");
                }
            }
            for name in a.product_names {
                assert_eq!(model_for_product(name).map(|m| m.key), Some(a.key));
            }
        }
        assert!(model_for_product("Tesla T4").is_none());
        assert!(model_for_product("nvidia h100 80gb hbm3").is_none());
    }
}
