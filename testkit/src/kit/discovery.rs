//! Discovery check: the GPUs the NVML backend finds (what `tessera inventory --backend
//! nvml` publishes) against a reference: `nvidia-smi -q -x` on a real host, the
//! simulated node's own inventory in CI. Compared per GPU (matched by UUID): name,
//! memory (within 1 %, as nvidia-smi prints MiB), PCI bus ID, MIG mode, and compute
//! capability where the reference has it.

use tessera::inventory::NodeInventory;

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

/// Compares what NVML found with the reference, GPU by GPU. Deterministic.
pub fn compare(found: &NodeInventory, reference: &[RefGpu]) -> CheckReport {
    let mut failures = Vec::new();
    let mut notes = Vec::new();
    let mut fields = 0;
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
        "{} GPU(s), {} field(s) compared, {} differ; driver {}",
        found.gpus.len(),
        fields,
        failures.len(),
        found.driver_version
    );
    CheckReport::from_findings("discovery", figure, failures, notes)
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
            compare(&inv, &reference).verdict,
            super::super::Verdict::Pass
        );
        reference[0].memory_bytes /= 2;
        reference[1].mig_enabled = !reference[1].mig_enabled;
        let r = compare(&inv, &reference);
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
}
