//! The MIG catalog and geometry rules as a simulated GPU relies on them: every modelled
//! GPU refuses and accepts GPU instances the way NVML does (facts §A1–A2.1).

use std::collections::HashSet;

use tessera::mig::{
    GpuInstance, GpuModel, MigError, all_models, check_create, check_destroy, ci_cap_minor,
    default_placement, default_placement_order, gi_cap_minor, mig_uuid, model_for_product,
    profile_info, remaining_capacity,
};
use tessera::naming::{is_dns_label, mig_device_name, sanitize_mig_profile};

const INVALID_ARGUMENT: u32 = 2;
const NOT_SUPPORTED: u32 = 3;
const NOT_FOUND: u32 = 6;
const IN_USE: u32 = 19;
const INSUFFICIENT_RESOURCES: u32 = 23;

fn model(key: &str) -> &'static GpuModel {
    all_models()
        .iter()
        .find(|m| m.key == key)
        .unwrap_or_else(|| panic!("no model {key}"))
}

fn h100() -> &'static GpuModel {
    model_for_product("NVIDIA H100 80GB HBM3").unwrap()
}

/// Creates `profile_id` at `start` and appends it, panicking on refusal.
fn create(m: &GpuModel, gis: &mut Vec<GpuInstance>, profile_id: u32, start: u32) {
    let gi = check_create(m, gis, profile_id, start)
        .unwrap_or_else(|e| panic!("{} {profile_id}@{start}: {e}", m.key));
    gis.push(gi);
}

/// Creates `profile_id` where the driver would put it, returning the start.
fn create_default(
    m: &GpuModel,
    gis: &mut Vec<GpuInstance>,
    profile_id: u32,
) -> Result<u32, MigError> {
    let start = default_placement(m, gis, profile_id)?;
    create(m, gis, profile_id, start);
    Ok(start)
}

fn code(r: Result<impl std::fmt::Debug, MigError>) -> u32 {
    r.expect_err("expected a refusal").nvml_code()
}

/// Every placement of every profile of every modelled GPU creates on an empty GPU.
#[test]
fn every_placement_of_every_profile_creates_alone_on_an_empty_gpu() {
    for m in all_models() {
        for p in m.profiles {
            for &start in p.placements {
                let gi = check_create(m, &[], p.profile_id, start)
                    .unwrap_or_else(|e| panic!("{} {}@{start}: {e}", m.key, p.name));
                assert_eq!(
                    (gi.profile_id, gi.start, gi.size),
                    (p.profile_id, start, p.placement_size())
                );
            }
        }
    }
}

/// Seven 1g.10gb fit on an H100 and an eighth fails with INSUFFICIENT_RESOURCES.
#[test]
fn seven_1g10gb_fit_on_an_h100_and_an_eighth_fails() {
    let m = h100();
    let id = m.profile_by_name("1g.10gb").unwrap().profile_id;
    let mut gis = Vec::new();
    for _ in 0..7 {
        create_default(m, &mut gis, id).unwrap();
    }
    assert_eq!(remaining_capacity(m, &gis, id), 0);
    assert_eq!(code(default_placement(m, &gis, id)), INSUFFICIENT_RESOURCES);
    for start in 0..7 {
        assert_eq!(
            code(check_create(m, &gis, id, start)),
            INSUFFICIENT_RESOURCES
        );
    }
}

/// A placement that shares a memory slice with an existing instance fails with
/// INSUFFICIENT_RESOURCES, while disjoint ones (post-R510 4g + 3g) succeed.
#[test]
fn overlapping_placements_fail_with_insufficient_resources() {
    let m = h100();
    // (existing name, start), (new name, start)
    let overlapping = [
        (("3g.40gb", 0), ("1g.10gb", 2)),
        (("2g.20gb", 4), ("1g.20gb", 4)),
        (("1g.20gb", 6), ("1g.10gb", 6)),
        (("4g.40gb", 0), ("3g.40gb", 0)),
        (("7g.80gb", 0), ("1g.10gb+me", 5)),
        (("1g.10gb", 3), ("7g.80gb", 0)),
        (("1g.10gb", 1), ("1g.10gb", 1)),
    ];
    for ((a, sa), (b, sb)) in overlapping {
        let mut gis = Vec::new();
        create(m, &mut gis, m.profile_by_name(a).unwrap().profile_id, sa);
        let r = check_create(m, &gis, m.profile_by_name(b).unwrap().profile_id, sb);
        assert_eq!(code(r), INSUFFICIENT_RESOURCES, "{a}@{sa} then {b}@{sb}");
    }
    let mut gis = Vec::new();
    create(m, &mut gis, 5, 0);
    create(m, &mut gis, 9, 4);
}

/// A start outside the profile's possible placements, or an unknown profile ID, fails
/// with INVALID_ARGUMENT even on an empty GPU.
#[test]
fn a_start_outside_the_possible_placements_fails_with_invalid_argument() {
    let cases = [
        ("H100-80GB", "2g.20gb", 6),
        ("H100-80GB", "1g.10gb", 7),
        ("H100-80GB", "1g.20gb", 1),
        ("H100-80GB", "3g.40gb", 2),
        ("H100-80GB", "4g.40gb", 4),
        ("H100-80GB", "7g.80gb", 1),
        ("A30-24GB", "2g.12gb", 1),
        ("A30-24GB", "1g.6gb", 4),
        ("B200-180GB", "3g.90gb", 99),
    ];
    for (key, name, start) in cases {
        let m = model(key);
        let id = m.profile_by_name(name).unwrap().profile_id;
        assert_eq!(
            code(check_create(m, &[], id, start)),
            INVALID_ARGUMENT,
            "{key} {name}@{start}"
        );
    }
    assert_eq!(code(check_create(h100(), &[], 99, 0)), INVALID_ARGUMENT);
    assert_eq!(code(default_placement(h100(), &[], 99)), INVALID_ARGUMENT);
}

/// `instanceCount` caps a profile even where free slices remain (`+me` only once).
#[test]
fn instance_count_limits_hold() {
    for (key, name, first, second) in [
        ("H100-80GB", "1g.10gb+me", 0, 3),
        ("A100-SXM4-40GB", "1g.5gb+me", 6, 0),
        ("A30-24GB", "1g.6gb+me", 0, 2),
        ("A30-24GB", "2g.12gb+me", 0, 2),
    ] {
        let m = model(key);
        let id = m.profile_by_name(name).unwrap().profile_id;
        let mut gis = Vec::new();
        assert_eq!(remaining_capacity(m, &gis, id), 1, "{key} {name}");
        create(m, &mut gis, id, first);
        assert_eq!(remaining_capacity(m, &gis, id), 0, "{key} {name}");
        assert_eq!(
            code(check_create(m, &gis, id, second)),
            INSUFFICIENT_RESOURCES,
            "{key} {name}"
        );
        assert_eq!(
            code(default_placement(m, &gis, id)),
            INSUFFICIENT_RESOURCES,
            "{key} {name}"
        );
    }
}

/// Creating at each placement yields the GI IDs of the facts' table (A1.2).
#[test]
fn created_instances_get_the_gi_ids_of_the_facts_table() {
    let h = h100();
    let eight = [
        ("7g.80gb", 0, 0),
        ("3g.40gb", 0, 1),
        ("3g.40gb", 4, 2),
        ("2g.20gb", 0, 3),
        ("2g.20gb", 2, 4),
        ("2g.20gb", 4, 5),
        ("1g.20gb", 6, 6),
        ("4g.40gb", 0, 1),
    ];
    for (name, start, want) in eight {
        let gi = check_create(h, &[], h.profile_by_name(name).unwrap().profile_id, start).unwrap();
        assert_eq!(gi.gi_id, want, "{name}@{start}");
    }
    for k in 0..7 {
        assert_eq!(check_create(h, &[], 19, k).unwrap().gi_id, 7 + k);
        assert_eq!(check_create(h, &[], 20, k).unwrap().gi_id, 7 + k);
    }
    let a30 = model("A30-24GB");
    for (name, start, want) in [("4g.24gb", 0, 0), ("2g.12gb", 0, 1), ("2g.12gb+me", 2, 2)] {
        let gi = check_create(
            a30,
            &[],
            a30.profile_by_name(name).unwrap().profile_id,
            start,
        )
        .unwrap();
        assert_eq!(gi.gi_id, want, "A30 {name}@{start}");
    }
    for k in 0..4 {
        assert_eq!(check_create(a30, &[], 14, k).unwrap().gi_id, 3 + k);
    }
}

/// GI IDs stay unique among instances packed onto one GPU in any valid layout.
#[test]
fn gi_ids_are_unique_on_a_full_gpu() {
    let m = h100();
    let mut gis = Vec::new();
    create(m, &mut gis, 9, 4);
    create(m, &mut gis, 14, 0);
    create(m, &mut gis, 19, 2);
    create(m, &mut gis, 20, 3);
    let ids: HashSet<u32> = gis.iter().map(|g| g.gi_id).collect();
    assert_eq!(ids.len(), gis.len());
    assert_eq!(ids, HashSet::from([2, 3, 9, 10]));
}

/// Capability minors match every `mig-minors` sample in the facts (A2.1).
#[test]
fn cap_minors_match_the_mig_minors_samples() {
    assert_eq!(gi_cap_minor(0, 0), 3);
    for (ci, want) in [(0, 4), (1, 5), (2, 6)] {
        assert_eq!(ci_cap_minor(0, 0, ci), want);
    }
    assert_eq!(gi_cap_minor(0, 1), 12);
    for (ci, want) in [(0, 13), (1, 14), (2, 15)] {
        assert_eq!(ci_cap_minor(0, 1, ci), want);
    }
    assert_eq!(ci_cap_minor(3, 3, 3), 439);
    assert_eq!(ci_cap_minor(6, 11, 5), 918);
    assert_eq!(ci_cap_minor(31, 14, 6), 4321);
    assert_eq!(ci_cap_minor(31, 14, 7), 4322);
}

/// Profile IDs are not NVML indices: lookups by one never answer for the other.
#[test]
fn profile_ids_are_not_nvml_indices() {
    let h = h100();
    let one_g = h.profile_by_name("1g.10gb").unwrap();
    assert_eq!((one_g.nvml_index, one_g.profile_id), (0, 19));
    assert_eq!(h.profile_by_index(0).unwrap().name, "1g.10gb");
    assert_eq!(h.profile_by_id(0).unwrap().name, "7g.80gb");
    assert_eq!(profile_info(h, 0).unwrap().profile_id, 19);
    // Passing the index where the ID is expected asks for 7g, which cannot start at 6.
    assert_eq!(
        code(check_create(h, &[], one_g.nvml_index, 6)),
        INVALID_ARGUMENT
    );
    let a30 = model("A30-24GB");
    let a30_1g = a30.profile_by_name("1g.6gb").unwrap();
    assert_eq!((a30_1g.nvml_index, a30_1g.profile_id), (0, 14));
    assert_eq!(a30.profile_by_id(0).unwrap().name, "4g.24gb");
    assert_eq!(a30.profile_by_index(3).unwrap().profile_id, 0);
    for (m, p) in all_models()
        .iter()
        .flat_map(|m| m.profiles.iter().map(move |p| (m, p)))
    {
        assert_eq!(profile_info(m, p.nvml_index), Ok(p));
    }
}

/// `nvmlDeviceGetGpuInstanceProfileInfo` semantics: a missing valid index is
/// NOT_SUPPORTED, an index past the enum is INVALID_ARGUMENT.
#[test]
fn profile_info_distinguishes_unsupported_from_invalid_indices() {
    assert_eq!(code(profile_info(h100(), 8)), NOT_SUPPORTED);
    assert_eq!(code(profile_info(model("A30-24GB"), 2)), NOT_SUPPORTED);
    assert_eq!(code(profile_info(h100(), 0x12)), INVALID_ARGUMENT);
}

/// Every (profile, placement) of a GPU gets a distinct DNS-label device name.
#[test]
fn every_mig_device_name_is_a_unique_dns_label() {
    for m in all_models() {
        let mut names = HashSet::new();
        for p in m.profiles {
            let sanitized = sanitize_mig_profile(p.name);
            assert!(is_dns_label(&sanitized), "{sanitized}");
            for &start in p.placements {
                let name = mig_device_name(31, p.name, p.profile_id, start);
                assert!(is_dns_label(&name), "{name}");
                assert!(names.insert(name.clone()), "{} duplicate {name}", m.key);
            }
        }
    }
}

/// No profile reports more memory than its GPU, and any full packing of instances fits
/// in the GPU's memory.
#[test]
fn no_profile_uses_more_memory_than_its_gpu() {
    // Upper bounds outside MIG mode: NVML totals where public nvidia-smi output shows
    // them (H100, H100 NVL, H200 NVL, B200), else the nominal size.
    let totals = [
        ("A100-SXM4-40GB", 40960),
        ("A100-80GB", 81920),
        ("A30-24GB", 24576),
        ("H100-80GB", 81559),
        ("H100-94GB", 95830),
        ("GH200-96GB", 98304),
        ("H200-141GB", 143771),
        ("B200-180GB", 183359),
    ];
    assert_eq!(totals.len(), all_models().len());
    for (key, total) in totals {
        let m = model(key);
        let total = m.total_memory_mib_mig.unwrap_or(total);
        for p in m.profiles {
            assert!(p.memory_mib <= total, "{key} {}", p.name);
            let per_slice = p.memory_mib.div_ceil(u64::from(p.placement_size()));
            assert!(
                per_slice * u64::from(m.memory_slices) <= total + 1024,
                "{key} {}",
                p.name
            );
        }
        let whole = m.profiles.iter().map(|p| p.memory_mib).max().unwrap();
        assert!(m.profiles.iter().all(|p| p.memory_mib <= whole));
    }
}

/// Default placements follow the observed sequences (A1.2), including the guide's
/// `-cgi 19,19,14,9` failure and `-cgi 9,19,14,19` success.
#[test]
fn default_placements_follow_the_observed_sequences() {
    let h = h100();
    let mut gis = Vec::new();
    let starts: Vec<u32> = (0..7)
        .map(|_| create_default(h, &mut gis, 19).unwrap())
        .collect();
    assert_eq!(starts, [6, 4, 5, 0, 1, 2, 3]);
    assert_eq!(
        gis.iter().map(|g| g.gi_id).collect::<Vec<_>>(),
        [13, 11, 12, 7, 8, 9, 10]
    );

    assert_eq!(default_placement(h, &[], 14), Ok(4));
    let blocked = [check_create(h, &[], 19, 4).unwrap()];
    assert_eq!(default_placement(h, &blocked, 14), Ok(0));
    assert_eq!(default_placement(h, &[], 9), Ok(4));
    let upper = [check_create(h, &[], 9, 4).unwrap()];
    assert_eq!(default_placement(h, &upper, 9), Ok(0));
    assert_eq!(default_placement(h, &[], 5), Ok(0));
    assert_eq!(default_placement(h, &[], 0), Ok(0));

    let mut gis = Vec::new();
    for id in [19, 19, 14] {
        create_default(h, &mut gis, id).unwrap();
    }
    assert_eq!(code(default_placement(h, &gis, 9)), INSUFFICIENT_RESOURCES);
    let mut gis = Vec::new();
    for id in [9, 19, 14, 19] {
        create_default(h, &mut gis, id).unwrap();
    }

    let gh = model_for_product("NVIDIA GH200 480GB").unwrap();
    let mut gis = Vec::new();
    let starts: Vec<u32> = (0..3)
        .map(|_| create_default(gh, &mut gis, 15).unwrap())
        .collect();
    assert_eq!(starts, [4, 0, 2]);
    assert_eq!(gis.iter().map(|g| g.gi_id).collect::<Vec<_>>(), [5, 3, 4]);

    let a30 = model_for_product("NVIDIA A30").unwrap();
    let mut gis = Vec::new();
    assert_eq!(create_default(a30, &mut gis, 14), Ok(0));
    assert_eq!(create_default(a30, &mut gis, 14), Ok(1));
    assert_eq!(create_default(a30, &mut gis, 5), Ok(2));
}

/// The default order lists each possible placement exactly once, for every profile.
#[test]
fn default_order_is_a_permutation_of_the_placements() {
    for m in all_models() {
        for p in m.profiles {
            let mut order = default_placement_order(m, p);
            order.sort_unstable();
            assert_eq!(order, p.placements, "{} {}", m.key, p.name);
        }
    }
}

/// Remaining capacity counts free placements, capped by the instance count.
#[test]
fn remaining_capacity_counts_free_placements() {
    let h = h100();
    let empty: Vec<(u32, u32)> = h
        .profiles
        .iter()
        .map(|p| (p.profile_id, remaining_capacity(h, &[], p.profile_id)))
        .collect();
    assert_eq!(
        empty,
        [(19, 7), (20, 1), (15, 4), (14, 3), (9, 2), (5, 1), (0, 1)]
    );
    let lower = [check_create(h, &[], 9, 0).unwrap()];
    assert_eq!(remaining_capacity(h, &lower, 19), 3);
    assert_eq!(remaining_capacity(h, &lower, 15), 2);
    assert_eq!(remaining_capacity(h, &lower, 14), 1);
    assert_eq!(remaining_capacity(h, &lower, 5), 0);
    assert_eq!(remaining_capacity(h, &[], 99), 0);
}

/// Destroy refuses an unknown GI with NOT_FOUND and a GI with live compute instances
/// with IN_USE.
#[test]
fn destroy_requires_an_existing_gi_without_compute_instances() {
    let gis = [check_create(h100(), &[], 9, 4).unwrap()];
    assert_eq!(check_destroy(&gis, 2, 0), Ok(gis[0]));
    assert_eq!(code(check_destroy(&gis, 1, 0)), NOT_FOUND);
    assert_eq!(code(check_destroy(&gis, 2, 1)), IN_USE);
}

/// MIG UUIDs are deterministic and differ per parent, GI and CI.
#[test]
fn mig_uuids_are_stable_and_distinct() {
    let parent = "GPU-4f8d0c1e-6a2b-4c59-9e31-0a7b5d2c9f10";
    assert_eq!(mig_uuid(parent, 2, 0), mig_uuid(parent, 2, 0));
    let all: HashSet<String> = [
        mig_uuid(parent, 2, 0),
        mig_uuid(parent, 2, 1),
        mig_uuid(parent, 3, 0),
        mig_uuid("GPU-00000000-0000-0000-0000-000000000000", 2, 0),
    ]
    .into();
    assert_eq!(all.len(), 4);
    assert_eq!(mig_uuid(parent, 2, 0).len(), "MIG-".len() + 36);
}

/// NVML product names resolve to their model; Hopper and later toggle MIG without reset.
#[test]
fn product_names_resolve_to_models() {
    let cases = [
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB", false),
        ("NVIDIA A100 80GB PCIe", "A100-80GB", false),
        ("NVIDIA A30", "A30-24GB", false),
        ("NVIDIA H100 PCIe", "H100-80GB", true),
        ("NVIDIA H100 NVL", "H100-94GB", true),
        ("NVIDIA H200", "H200-141GB", true),
        ("NVIDIA B200", "B200-180GB", true),
    ];
    for (product, key, reset_free) in cases {
        let m = model_for_product(product).unwrap();
        assert_eq!(
            (m.key, m.reset_free_mig_toggle),
            (key, reset_free),
            "{product}"
        );
    }
    assert!(model_for_product("NVIDIA L4").is_none());
}
