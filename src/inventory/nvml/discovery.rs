//! Whole-GPU discovery: one GPU's identity, memory, compute and topology from NVML,
//! completed from sysfs where NVML has no answer, and the pure conversions of NVML's
//! strings and numbers.

use super::*;

/// The optional queries one GPU's discovery could not answer: each NVML call's name
/// (or what was missing), for the one warning per node [`NvmlBackend::discover`] logs.
pub(super) type Unanswered = Vec<String>;

impl NvmlBackend {
    /// One GPU by NVML index, and the optional queries it could not answer. Side
    /// effects: NVML calls and sysfs reads only.
    ///
    /// Discovery degrades, never dies, on what a slice can do without: brand,
    /// architecture, the core count (so the SM count), NUMA node and MIG mode are
    /// optional; when NVML does not answer them the attribute is left out (MIG:
    /// published as not MIG-capable). The GPU's identity is required: its handle,
    /// UUID, name, minor number, memory, PCI bus ID and compute capability.
    pub(super) fn gpu_info(&self, index: u32) -> Result<(GpuInfo, Unanswered), BackendError> {
        let call = |call: &'static str| nvml_call(call, index);
        let mut unanswered = Unanswered::new();
        let mut optional = |call: &'static str, e: NvmlError| {
            unanswered.push(format!("{call} ({e})"));
        };
        let dev = self
            .nvml
            .device_by_index(index)
            .map_err(call("nvmlDeviceGetHandleByIndex_v2"))?;
        let uuid = dev.uuid().map_err(call("nvmlDeviceGetUUID"))?;
        let product_name = attribute_string(
            "productName",
            dev.name().map_err(call("nvmlDeviceGetName"))?,
        );
        let brand = dev
            .brand()
            .map(|b| format!("{b:?}"))
            .map_err(|e| optional("nvmlDeviceGetBrand", e))
            .ok();
        let architecture = dev
            .architecture()
            .map(|a| format!("{a:?}"))
            .map_err(|e| optional("nvmlDeviceGetArchitecture", e))
            .ok();
        let memory = dev
            .memory_info()
            .map_err(call("nvmlDeviceGetMemoryInfo_v2"))?;
        let minor = dev
            .minor_number()
            .map_err(call("nvmlDeviceGetMinorNumber"))?;
        let pci = dev.pci_info().map_err(call("nvmlDeviceGetPciInfo_v3"))?;
        let pci_bus_id = normalize_bus_id(&pci.bus_id)
            .ok_or_else(|| call("nvmlDeviceGetPciInfo_v3")(NvmlError::GetPciInfoFailed))?;
        let cc = dev
            .cuda_compute_capability()
            .map_err(call("nvmlDeviceGetCudaComputeCapability"))?;
        let cores = dev
            .num_cores()
            .map_err(|e| optional("nvmlDeviceGetNumGpuCores", e))
            .ok();
        let per_sm = cuda_cores_per_sm(cc.major, cc.minor);
        if per_sm.is_none() {
            unanswered.push(format!(
                "cores per SM of compute capability {}.{} (not in the table)",
                cc.major, cc.minor
            ));
        }
        let multiprocessors = cores.zip(per_sm).map(|(c, p)| c / p);
        let (mig_capable, mig_enabled) = match dev.mig_mode() {
            Ok(mode) => (true, mode.current == NVML_DEVICE_MIG_ENABLE),
            Err(e) if is_unsupported(&e) => (false, false),
            Err(e) => {
                unanswered.push(format!("nvmlDeviceGetMigMode ({e})"));
                (false, false)
            }
        };
        if mig_capable && crate::mig::catalog::catalogued(&product_name).is_none() {
            self.learn_mig_model(&dev, &product_name, architecture.as_deref(), mig_enabled)
                .unwrap_or_else(|why| unanswered.push(why));
        }
        // sysfs first: `resource.kubernetes.io/numaNode` means the CPU-side node of the
        // PCI device, which is what sysfs reports. NVML's answer is a fallback: it is
        // documented for GPUs that are NUMA nodes themselves (Grace Hopper/Blackwell),
        // where it names the GPU memory's node. "Not supported" is the usual answer of
        // a GPU that is not one; other failures are reported.
        let numa_node = match sysfs_numa_node(&self.sys_root, &pci_bus_id) {
            Some(node) => Some(node),
            None => match dev.numa_node_id() {
                Ok(node) => Some(i64::from(node)),
                Err(e) if is_unsupported(&e) => None,
                Err(e) => {
                    unanswered.push(format!("nvmlDeviceGetNumaNodeId ({e})"));
                    None
                }
            },
        };
        let info = GpuInfo {
            index,
            minor,
            pcie_root: sysfs_pcie_root(&self.sys_root, &pci_bus_id),
            uuid,
            product_name,
            brand,
            architecture,
            memory_bytes: memory.total,
            multiprocessors,
            cuda_compute_capability: format!("{}.{}", cc.major, cc.minor),
            pci_bus_id,
            numa_node,
            mig_capable,
            mig_enabled,
        };
        Ok((info, unanswered))
    }
}

impl NvmlBackend {
    /// For a MIG-capable GPU whose product the catalog lacks: with MIG on, reads its
    /// profiles and placements from NVML and registers them as its model
    /// ([`crate::mig::discovered`]), so that it is partitioned as NVML says. With MIG
    /// off NVML's tables are not to be relied on, and the GPU is published whole. `Err`
    /// is what to warn about (no model, or profiles left out).
    fn learn_mig_model(
        &self,
        dev: &Device<'_>,
        product: &str,
        architecture: Option<&str>,
        mig_enabled: bool,
    ) -> Result<(), String> {
        if !mig_enabled {
            return Err(format!(
                "MIG profiles of {product:?} (not in Tessera's catalog; read from NVML only with MIG on): published whole"
            ));
        }
        let profiles = self
            .nvml_profiles(dev)
            .map_err(|CallFailed { call, source }| {
                format!("MIG profiles of {product:?}: {call} ({source}): published whole")
            })?;
        let (model, skipped) = crate::mig::discovered::model_from_nvml(
            product,
            architecture.unwrap_or_default(),
            &profiles,
        );
        let Some(model) = model else {
            return Err(format!(
                "MIG profiles of {product:?}: NVML lists none usable: published whole"
            ));
        };
        crate::mig::discovered::register(model);
        if skipped.is_empty() {
            return Ok(());
        }
        let why: Vec<String> = skipped.iter().map(ToString::to_string).collect();
        Err(format!(
            "MIG profiles of {product:?} left out: {}",
            why.join(", ")
        ))
    }
}

/// NVML's string `what` as a device attribute: at most the 64 bytes the API server
/// allows a string attribute (cut at a character boundary, with a warning). NVML's
/// buffers are larger (80 bytes for the driver version, 96 for a name); an attribute
/// one byte too long would get the node's whole pool refused.
pub fn attribute_string(what: &str, mut value: String) -> String {
    let max = k8s_model::validation::DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH;
    if value.len() > max {
        let cut = (0..=max)
            .rev()
            .find(|&i| value.is_char_boundary(i))
            .unwrap_or(0);
        tracing::warn!(
            what,
            value = %value,
            "longer than a device attribute may be; published cut to {cut} bytes"
        );
        value.truncate(cut);
    }
    value
}

/// NVML's bus ID (`00000000:19:00.0`, upper-case hex, 8-digit domain) in the sysfs form
/// `0000:19:00.0`: lower case, domain as at least 4 hex digits (as the kernel prints it,
/// so a domain above `ffff` keeps all its digits). `None` if it is not `d:b:d.f` hex.
/// Deterministic.
pub fn normalize_bus_id(nvml_bus_id: &str) -> Option<String> {
    let hex = |s: &str, max: u32| {
        if s.is_empty() || s.len() > 8 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(s, 16).ok().filter(|v| *v <= max)
    };
    let mut parts = nvml_bus_id.trim().splitn(3, ':');
    let domain = hex(parts.next()?, u32::MAX)?;
    let bus = hex(parts.next()?, 0xff)?;
    let (device, function) = parts.next()?.split_once('.')?;
    let device = hex(device, 0x1f)?;
    let function = hex(function, 7)?;
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

/// CUDA cores per streaming multiprocessor for a compute capability; `None` when the
/// capability is not in the table. Deterministic.
///
/// Source: `_ConvertSMVer2Cores` in NVIDIA's cuda-samples `Common/helper_cuda.h`
/// (FP32 lanes per SM, the count NVML's "GPU cores" reports), which matches the
/// "Arithmetic Instructions" throughput table of the CUDA C++ Programming Guide:
///
/// | capability | cores/SM | parts |
/// |---|---|---|
/// | 5.0, 5.2, 5.3 | 128 | Maxwell |
/// | 6.0 | 64 | P100 |
/// | 6.1, 6.2 | 128 | other Pascal |
/// | 7.0, 7.2, 7.5 | 64 | Volta, Xavier, Turing |
/// | 8.0 | 64 | A100, A30 |
/// | 8.6, 8.7, 8.9 | 128 | GA10x, Orin, Ada |
/// | 9.0 | 128 | Hopper |
/// | 10.x, 11.0, 12.x | 128 | Blackwell (11.0 is Thor, renamed from 10.1 in CUDA 13) |
///
/// `tests/fakes/fake_nvml.c` carries the same table to turn SMs into cores.
pub fn cuda_cores_per_sm(major: i32, minor: i32) -> Option<u32> {
    match (major, minor) {
        (5, 0 | 2 | 3) => Some(128),
        (6, 0) => Some(64),
        (6, 1 | 2) => Some(128),
        (7, 0 | 2 | 5) => Some(64),
        (8, 0) => Some(64),
        (8, 6 | 7 | 9) => Some(128),
        (9, 0) => Some(128),
        (10, m) | (12, m) if m >= 0 => Some(128),
        (11, 0) => Some(128),
        _ => None,
    }
}

/// NVML's CUDA driver version integer (`major*1000 + minor*10`) as `major.minor`:
/// 13000 → `13.0`, 12090 → `12.9`. Deterministic.
pub fn cuda_version_string(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}
