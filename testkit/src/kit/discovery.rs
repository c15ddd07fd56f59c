//! Discovery check: the GPUs the NVML backend finds (what `tessera inventory --backend
//! nvml` publishes) against a reference: `nvidia-smi -q -x` on a real host, the
//! simulated node's own inventory in CI. Compared per GPU (matched by UUID): name,
//! memory (within 1 %, as nvidia-smi prints MiB), PCI bus ID, MIG mode, and compute
//! capability where the reference has it. With MIG on, the MIG partitions Tessera
//! publishes against the GPU-instance profiles and placements NVML reports
//! ([`compare_partitions`]).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use tessera::inventory::NodeInventory;
use tessera::naming::{DeviceRef, parse_device_name};

use super::CheckReport;

/// One GPU as the reference describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefGpu {
    pub uuid: String,
    pub name: String,
    pub memory_bytes: u64,
    /// Domain:bus:device.function, lower case, 4-digit domain.
    pub pci_bus_id: String,
    pub mig_enabled: bool,
    /// `major.minor`, when the reference reports it.
    pub compute_capability: Option<String>,
}

/// The text of the first `<tag>...</tag>` in `xml`, trimmed. Deterministic.
fn tag<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&close)? + start;
    Some(xml[start..end].trim())
}

/// `00000000:19:00.0` (nvidia-smi) or `0000:19:00.0` (NVML) as `0000:19:00.0`.
/// Deterministic.
pub fn normalize_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) => {
            let domain = u32::from_str_radix(domain, 16).unwrap_or(0);
            format!("{domain:04x}:{rest}")
        }
        None => id,
    }
}

/// The GPUs of an `nvidia-smi -q -x` document. Deterministic.
///
/// # Errors
/// A `<gpu>` element without a UUID or memory total.
pub fn parse_nvidia_smi_xml(xml: &str) -> Result<Vec<RefGpu>, String> {
    let mut gpus = Vec::new();
    for chunk in xml.split("<gpu id=\"").skip(1) {
        let (bus, body) = chunk.split_once('"').ok_or("a <gpu> without its id")?;
        let body = body.split("</gpu>").next().unwrap_or(body);
        let uuid = tag(body, "uuid")
            .ok_or("a <gpu> without <uuid>")?
            .to_string();
        let fb = tag(body, "fb_memory_usage").ok_or("a <gpu> without <fb_memory_usage>")?;
        let total = tag(fb, "total").ok_or("no fb_memory_usage total")?;
        let mib: u64 = total
            .trim_end_matches("MiB")
            .trim()
            .parse()
            .map_err(|_| format!("memory total {total:?}"))?;
        let mig = tag(body, "mig_mode")
            .and_then(|m| tag(m, "current_mig"))
            .is_some_and(|m| m.eq_ignore_ascii_case("enabled"));
        let cc = tag(body, "cuda_compute_capability")
            .or_else(|| tag(body, "compute_cap"))
            .map(str::to_string);
        gpus.push(RefGpu {
            uuid,
            name: tag(body, "product_name").unwrap_or_default().to_string(),
            memory_bytes: mib << 20,
            pci_bus_id: normalize_bus_id(bus),
            mig_enabled: mig,
            compute_capability: cc,
        });
    }
    Ok(gpus)
}

/// The reference a simulated node gives: its own inventory. Deterministic.
pub fn reference_from_inventory(inv: &NodeInventory) -> Vec<RefGpu> {
    inv.gpus
        .iter()
        .map(|g| RefGpu {
            uuid: g.uuid.clone(),
            name: g.product_name.clone(),
            memory_bytes: g.memory_bytes,
            pci_bus_id: normalize_bus_id(&g.pci_bus_id),
            mig_enabled: g.mig_enabled,
            compute_capability: Some(g.cuda_compute_capability.clone()),
        })
        .collect()
}

/// Compares what NVML found with the reference, GPU by GPU, and, when given, the MIG
/// partitions Tessera publishes with the profiles NVML reports ([`compare_partitions`]).
/// Deterministic.
pub fn compare(
    found: &NodeInventory,
    reference: &[RefGpu],
    partitions: Option<(&[OfferedPartition], &NvmlProfiles)>,
) -> CheckReport {
    let mut failures = Vec::new();
    let mut notes = Vec::new();
    let mut fields = 0;
    let mut mig_figure = String::new();
    if let Some((offered, nvml)) = partitions {
        let c = compare_partitions(offered, nvml);
        mig_figure = format!("; {}", c.figure);
        failures.extend(c.failures);
        notes.extend(c.notes);
    } else if found.gpus.iter().any(|g| g.mig_enabled) {
        notes.push("MIG partitions not compared (no NVML profile listing given)".into());
    }
    if found.gpus.len() != reference.len() {
        failures.push(format!(
            "NVML found {} GPU(s), the reference lists {}",
            found.gpus.len(),
            reference.len()
        ));
    }
    for r in reference {
        let Some(g) = found.gpus.iter().find(|g| g.uuid == r.uuid) else {
            failures.push(format!("{}: not found through NVML", r.uuid));
            continue;
        };
        let mut eq = |what: &str, ok: bool, a: String, b: String| {
            fields += 1;
            if !ok {
                failures.push(format!("{}: {what}: NVML {a}, reference {b}", r.uuid));
            }
        };
        eq("uuid", true, g.uuid.clone(), r.uuid.clone());
        eq(
            "name",
            g.product_name == r.name,
            g.product_name.clone(),
            r.name.clone(),
        );
        let diff = g.memory_bytes.abs_diff(r.memory_bytes) as f64;
        eq(
            "memory",
            diff <= r.memory_bytes as f64 * 0.01,
            g.memory_bytes.to_string(),
            r.memory_bytes.to_string(),
        );
        let bus = normalize_bus_id(&g.pci_bus_id);
        eq(
            "PCI bus ID",
            bus == r.pci_bus_id,
            bus.clone(),
            r.pci_bus_id.clone(),
        );
        eq(
            "MIG mode",
            g.mig_enabled == r.mig_enabled,
            g.mig_enabled.to_string(),
            r.mig_enabled.to_string(),
        );
        match &r.compute_capability {
            Some(cc) => eq(
                "compute capability",
                &g.cuda_compute_capability == cc,
                g.cuda_compute_capability.clone(),
                cc.clone(),
            ),
            None => notes.push(format!(
                "{}: compute capability {} (the reference does not report it)",
                r.uuid, g.cuda_compute_capability
            )),
        }
        notes.push(format!(
            "{} {} {} {:.1} GiB cc {} MIG {}",
            g.uuid,
            g.product_name,
            bus,
            g.memory_bytes as f64 / (1u64 << 30) as f64,
            g.cuda_compute_capability,
            if g.mig_enabled { "on" } else { "off" }
        ));
    }
    let figure = format!(
        "{} GPU(s), {} field(s) compared, {} differ; driver {}{mig_figure}",
        found.gpus.len(),
        fields,
        failures.len(),
        found.driver_version
    );
    CheckReport::from_findings("discovery", figure, failures, notes)
}

/// One GPU-instance profile as NVML reports it (`kit_nvml mig-profiles`, from
/// `nvmlDeviceGetGpuInstanceProfileInfoV` and `..PossiblePlacements_v2`: what `nvidia-smi
/// mig -lgip` and `-lgipp` print).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlProfile {
    pub gpu_uuid: String,
    pub id: u32,
    /// Without NVML's `MIG ` prefix, e.g. `1g.10gb`.
    pub name: String,
    pub memory_mib: u64,
    pub multiprocessors: u32,
    /// The possible placements' first memory slices.
    pub placements: BTreeSet<u32>,
}

/// NVML's MIG profiles of every GPU, and the GPUs it gave none for (MIG off, or none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvmlProfiles {
    pub profiles: Vec<NvmlProfile>,
    /// UUIDs of the GPUs without profiles.
    pub without: Vec<String>,
}

/// Parses `kit_nvml mig-profiles`'s lines (`tests/gpu/progs/kit_nvml.c`). Deterministic.
///
/// # Errors
/// An `error=` line (NVML failed), or a line without its fields.
pub fn parse_kit_nvml_profiles(text: &str) -> Result<NvmlProfiles, String> {
    let mut out = NvmlProfiles::default();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let f: BTreeMap<&str, &str> = line
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .collect();
        if f.contains_key("error") {
            return Err(format!("NVML failed: {line}"));
        }
        let field = |k: &str| {
            f.get(k)
                .copied()
                .ok_or_else(|| format!("no {k}= in {line:?}"))
        };
        let gpu = field("gpu")?.to_string();
        if f.get("profiles") == Some(&"none") {
            out.without.push(gpu);
            continue;
        }
        let num = |k: &str| -> Result<u64, String> {
            field(k)?
                .parse()
                .map_err(|_| format!("{k}= is not a number in {line:?}"))
        };
        let placements = field("placements")?
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|p| {
                p.split_once(':')
                    .and_then(|(start, _)| start.parse::<u32>().ok())
                    .ok_or_else(|| format!("placement {p:?} in {line:?}"))
            })
            .collect::<Result<BTreeSet<u32>, String>>()?;
        out.profiles.push(NvmlProfile {
            gpu_uuid: gpu,
            id: u32::try_from(num("id")?).map_err(|e| e.to_string())?,
            name: field("name")?.to_string(),
            memory_mib: num("mem_mib")?,
            multiprocessors: u32::try_from(num("sms")?).map_err(|e| e.to_string())?,
            placements,
        });
    }
    Ok(out)
}

/// One MIG partition Tessera publishes: a `type: mig` device of its ResourceSlices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferedPartition {
    pub parent_uuid: String,
    pub profile: String,
    /// NVML's GPU-instance profile ID, from the device's name.
    pub profile_id: u32,
    /// The placement's first memory slice, from the device's name.
    pub start: u32,
    pub memory_bytes: Option<u64>,
    pub multiprocessors: Option<u32>,
}

/// The MIG partitions among ResourceSlices as JSON: a `List` (as `tessera inventory -o
/// json` prints it), an array, or one slice. Deterministic.
pub fn offered_partitions(slices: &Value) -> Vec<OfferedPartition> {
    let all: Vec<&Value> = match (slices["items"].as_array(), slices.as_array()) {
        (Some(items), _) | (None, Some(items)) => items.iter().collect(),
        (None, None) => vec![slices],
    };
    let s = |d: &Value, k: &str| d["attributes"][k]["string"].as_str().map(str::to_string);
    let cap = |d: &Value, k: &str| {
        d["capacity"][k]["value"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
    };
    let mut out = Vec::new();
    for d in all
        .iter()
        .flat_map(|slice| slice["spec"]["devices"].as_array().into_iter().flatten())
    {
        if s(d, "type").as_deref() != Some("mig") {
            continue;
        }
        let Some(DeviceRef::Mig {
            gi_profile_id,
            placement_start,
            ..
        }) = d["name"].as_str().and_then(parse_device_name)
        else {
            continue;
        };
        out.push(OfferedPartition {
            parent_uuid: s(d, "parentUUID").unwrap_or_default(),
            profile: s(d, "profile").unwrap_or_default(),
            profile_id: gi_profile_id,
            start: placement_start,
            memory_bytes: cap(d, "memory"),
            multiprocessors: cap(d, "multiprocessors").and_then(|v| u32::try_from(v).ok()),
        });
    }
    out
}

/// What [`compare_partitions`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionComparison {
    pub figure: String,
    pub failures: Vec<String>,
    pub notes: Vec<String>,
}

fn set_text(s: &BTreeSet<u32>) -> String {
    let v: Vec<String> = s.iter().map(u32::to_string).collect();
    format!("{{{}}}", v.join(","))
}

/// Compares the MIG partitions Tessera publishes with the profiles NVML reports, on
/// every GPU NVML lists profiles for (MIG on), profile by profile (matched by name):
/// NVML's profile ID, memory (MiB), multiprocessors and possible placements (first
/// memory slices) must be Tessera's. A profile Tessera publishes that NVML does not
/// offer, and a GPU with profiles but no partition published, are failures; a profile
/// NVML offers that Tessera does not publish is a note (Tessera's catalog may omit
/// profiles on purpose). Deterministic.
pub fn compare_partitions(
    offered: &[OfferedPartition],
    nvml: &NvmlProfiles,
) -> PartitionComparison {
    let mut c = PartitionComparison::default();
    let gpus: BTreeSet<&str> = nvml.profiles.iter().map(|p| p.gpu_uuid.as_str()).collect();
    let (mut profiles, mut placements) = (0, 0);
    for gpu in &gpus {
        let theirs: Vec<&NvmlProfile> = nvml
            .profiles
            .iter()
            .filter(|p| p.gpu_uuid == *gpu)
            .collect();
        let mut ours: BTreeMap<String, Vec<&OfferedPartition>> = BTreeMap::new();
        for o in offered
            .iter()
            .filter(|o| o.parent_uuid.eq_ignore_ascii_case(gpu))
        {
            ours.entry(o.profile.to_ascii_lowercase())
                .or_default()
                .push(o);
        }
        if ours.is_empty() {
            c.failures.push(format!(
                "{gpu}: NVML reports {} MIG profile(s), Tessera publishes no MIG partition",
                theirs.len()
            ));
            continue;
        }
        for p in &theirs {
            let Some(o) = ours.get(&p.name.to_ascii_lowercase()) else {
                c.notes.push(format!(
                    "{gpu}: NVML offers {} (profile {}), Tessera does not publish it",
                    p.name, p.id
                ));
                continue;
            };
            profiles += 1;
            let starts: BTreeSet<u32> = o.iter().map(|x| x.start).collect();
            placements += starts.len();
            let mut differ = |what: &str, ours: String, nvml: String| {
                if ours != nvml {
                    c.failures.push(format!(
                        "{gpu} {}: {what}: Tessera {ours}, NVML {nvml}",
                        p.name
                    ));
                }
            };
            let first = o[0];
            differ("profile ID", first.profile_id.to_string(), p.id.to_string());
            differ(
                "memory (MiB)",
                first
                    .memory_bytes
                    .map_or("none".into(), |b| (b >> 20).to_string()),
                p.memory_mib.to_string(),
            );
            differ(
                "multiprocessors",
                first
                    .multiprocessors
                    .map_or("none".into(), |m| m.to_string()),
                p.multiprocessors.to_string(),
            );
            differ(
                "placements (first memory slices)",
                set_text(&starts),
                set_text(&p.placements),
            );
        }
        for (name, o) in &ours {
            if !theirs.iter().any(|p| p.name.eq_ignore_ascii_case(name)) {
                c.failures.push(format!(
                    "{gpu}: Tessera publishes {} ({} placement(s)), which NVML does not offer",
                    o[0].profile,
                    o.len()
                ));
            }
        }
    }
    c.figure = format!(
        "MIG partitions: {profiles} profile(s), {placements} placement(s) compared with NVML on {} GPU(s), {} differ",
        gpus.len(),
        c.failures.len()
    );
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str = r#"<?xml version="1.0" ?>
<nvidia_smi_log>
  <driver_version>580.65.06</driver_version>
  <gpu id="00000000:19:00.0">
    <product_name>NVIDIA H100 80GB HBM3</product_name>
    <mig_mode>
      <current_mig>Disabled</current_mig>
      <pending_mig>Disabled</pending_mig>
    </mig_mode>
    <uuid>GPU-4f8d0c1e-6a2b-4c59-9e31-0a7b5d2c9f10</uuid>
    <fb_memory_usage>
      <total>81559 MiB</total>
      <used>0 MiB</used>
    </fb_memory_usage>
  </gpu>
</nvidia_smi_log>
"#;

    /// nvidia-smi's XML gives each GPU's UUID, name, MiB total, bus ID and MIG mode.
    #[test]
    fn nvidia_smi_xml_parses_into_reference_gpus() {
        let gpus = parse_nvidia_smi_xml(XML).unwrap();
        assert_eq!(
            gpus,
            vec![RefGpu {
                uuid: "GPU-4f8d0c1e-6a2b-4c59-9e31-0a7b5d2c9f10".into(),
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_bytes: 81559 << 20,
                pci_bus_id: "0000:19:00.0".into(),
                mig_enabled: false,
                compute_capability: None,
            }]
        );
    }

    /// A GPU whose memory differs by more than 1 % or whose MIG mode differs fails the
    /// comparison, naming the field.
    #[test]
    fn differing_fields_fail_discovery_by_name() {
        let node = tessera::inventory::mock::MockNode::embedded_default().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let inv = tessera::inventory::mock::MockBackend::new(
            node,
            dir.path().to_path_buf(),
            tessera::inventory::mock::StateAccess::ReadWrite,
        );
        let inv = tessera::inventory::GpuBackend::discover(&inv).unwrap();
        let mut reference = reference_from_inventory(&inv);
        assert_eq!(
            compare(&inv, &reference, None).verdict,
            super::super::Verdict::Pass
        );
        reference[0].memory_bytes /= 2;
        reference[1].mig_enabled = !reference[1].mig_enabled;
        let r = compare(&inv, &reference, None);
        assert_eq!(r.verdict, super::super::Verdict::Fail);
        assert!(r.details[0].contains("memory"), "{:?}", r.details);
        assert!(r.details[1].contains("MIG mode"), "{:?}", r.details);
    }

    /// Bus IDs compare equal whatever the domain's width or the case.
    #[test]
    fn bus_ids_normalize_to_a_four_digit_domain() {
        for (id, want) in [
            ("00000000:19:00.0", "0000:19:00.0"),
            ("0000:3B:00.0", "0000:3b:00.0"),
        ] {
            assert_eq!(normalize_bus_id(id), want);
        }
    }
    const GPU: &str = "GPU-4f8d0c1e-6a2b-4c59-9e31-0a7b5d2c9f10";

    fn partition(profile: &str, id: u32, start: u32, mib: u64) -> OfferedPartition {
        OfferedPartition {
            parent_uuid: GPU.into(),
            profile: profile.into(),
            profile_id: id,
            start,
            memory_bytes: Some(mib << 20),
            multiprocessors: Some(16),
        }
    }

    /// kit_nvml's lines parse into profiles (names without `MIG `, placements by first
    /// slice) and GPUs without profiles; an `error=` line is an error.
    #[test]
    fn kit_nvml_profile_lines_parse() {
        let text = format!(
            "gpu={GPU} index=0 profile_index=0 id=19 name=1g.10gb slices=1 mem_mib=9984 sms=16 instances=7 placements=0:1,1:1,6:1\n\
             gpu=GPU-other index=1 profiles=none code=3\n"
        );
        let p = parse_kit_nvml_profiles(&text).unwrap();
        assert_eq!(p.without, ["GPU-other"]);
        assert_eq!(
            p.profiles,
            [NvmlProfile {
                gpu_uuid: GPU.into(),
                id: 19,
                name: "1g.10gb".into(),
                memory_mib: 9984,
                multiprocessors: 16,
                placements: [0, 1, 6].into(),
            }]
        );
        assert!(parse_kit_nvml_profiles("error=nvmlInit_v2:9\n").is_err());
        assert!(parse_kit_nvml_profiles(&format!("gpu={GPU} id=x\n")).is_err());
    }

    /// The MIG devices of a slice list are found by type, their profile ID and
    /// placement read from their names; other devices are not partitions.
    #[test]
    fn offered_partitions_are_the_mig_devices_of_the_slices() {
        let list = serde_json::json!({"kind": "List", "items": [{"spec": {"devices": [
            {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}},
            {"name": "gpu-0-mig-1g10gb-19-6", "attributes": {
                "type": {"string": "mig"}, "profile": {"string": "1g.10gb"},
                "parentUUID": {"string": GPU}},
             "capacity": {"memory": {"value": "10468982784"}, "multiprocessors": {"value": "16"}}}
        ]}}]});
        assert_eq!(
            offered_partitions(&list),
            [partition("1g.10gb", 19, 6, 9984)]
        );
    }

    /// Partitions compare profile by profile: equal tables pass; a different
    /// placement, memory or ID, a profile NVML lacks, and a GPU with none published
    /// fail, naming it; a profile only NVML has is a note.
    #[test]
    fn partitions_differing_from_nvml_fail_by_name() {
        let nvml = |placements: &[u32], mib: u64, id: u32| NvmlProfiles {
            profiles: vec![
                NvmlProfile {
                    gpu_uuid: GPU.into(),
                    id,
                    name: "1g.10gb".into(),
                    memory_mib: mib,
                    multiprocessors: 16,
                    placements: placements.iter().copied().collect(),
                },
                NvmlProfile {
                    gpu_uuid: GPU.into(),
                    id: 15,
                    name: "1g.10gb+me".into(),
                    memory_mib: 9984,
                    multiprocessors: 16,
                    placements: [0].into(),
                },
            ],
            without: vec![],
        };
        let ours = [
            partition("1g.10gb", 19, 0, 9984),
            partition("1g.10gb", 19, 1, 9984),
        ];
        let ok = compare_partitions(&ours, &nvml(&[0, 1], 9984, 19));
        assert!(ok.failures.is_empty(), "{:?}", ok.failures);
        assert_eq!(ok.notes.len(), 1, "{:?}", ok.notes);
        assert!(
            ok.figure
                .starts_with("MIG partitions: 1 profile(s), 2 placement(s)")
        );
        for (table, what) in [
            (nvml(&[0, 2], 9984, 19), "placements"),
            (nvml(&[0, 1], 9728, 19), "memory"),
            (nvml(&[0, 1], 9984, 0), "profile ID"),
        ] {
            let c = compare_partitions(&ours, &table);
            assert_eq!(c.failures.len(), 1, "{what}: {:?}", c.failures);
            assert!(c.failures[0].contains(what), "{:?}", c.failures);
        }
        let extra = [ours[0].clone(), partition("7g.80gb", 0, 0, 81152)];
        let c = compare_partitions(&extra, &nvml(&[0], 9984, 19));
        assert!(c.failures[0].contains("7g.80gb") && c.failures[0].contains("does not offer"));
        let c = compare_partitions(&[], &nvml(&[0], 9984, 19));
        assert!(
            c.failures[0].contains("publishes no MIG partition"),
            "{:?}",
            c.failures
        );
    }
}
