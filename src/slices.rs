//! Building the node's ResourceSlices from its inventory: a pure function, no I/O.
//!
//! One pool per node, named after the node. Devices are ordered by GPU minor; the
//! pool is split into as many slices as the per-slice limits of the server's version
//! require. Slices carry the indexed `generateName` (`<hex index>-<driver>-<node>-`) so
//! that their names sort in publish order, which is also the scheduler's first-fit order.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceCapacity, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::backend::{GpuInfo, NodeInventory};
use crate::config::ManagedGpu;
use crate::kubever::KubeVersion;
use crate::naming;
use crate::versions::normalize_semver;

/// Device `type` attribute values: the vocabulary DeviceClasses select on.
pub mod device_type {
    pub const GPU: &str = "gpu";
    pub const GPU_SHARED: &str = "gpu-shared";
    pub const GPU_SLOT: &str = "gpu-slot";
    pub const MIG: &str = "mig";
}

/// Standard attribute names from `resource.kubernetes.io`.
pub const ATTR_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
pub const ATTR_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
pub const ATTR_NUMA_NODE: &str = "resource.kubernetes.io/numaNode";

/// What the slices are built for.
#[derive(Debug, Clone)]
pub struct PoolParams<'a> {
    pub driver: &'a str,
    pub node_name: &'a str,
    pub version: KubeVersion,
}

/// Most devices one slice may hold on `version` (`kubernetes-dra-api.md` §2.2): 128,
/// or 64 on ≥1.35 when any device has taints or consumes counters.
pub fn max_devices_per_slice(version: KubeVersion, uses_counters_or_taints: bool) -> usize {
    if version.minor() >= 35 && uses_counters_or_taints {
        64
    } else {
        128
    }
}

/// `generateName` of the slice at `index` in a pool of `count` slices: the index in
/// lower-case hex, zero-padded to max(5, hex digits of count-1), then driver and node.
/// Deterministic; names therefore sort in publish order.
pub fn slice_generate_name(index: usize, count: usize, driver: &str, node: &str) -> String {
    let width = format!("{:x}", count.saturating_sub(1)).len().max(5);
    format!("{index:0width$x}-{driver}-{node}-")
}

/// Parses the index back out of a slice name made by [`slice_generate_name`] (plus the
/// server's 5-character suffix); `None` for names of another scheme.
pub fn parse_slice_index(name: &str, driver: &str, node: &str) -> Option<usize> {
    let (hex, rest) = name.split_once('-')?;
    if hex.len() < 5
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    let suffix = rest
        .strip_prefix(driver)?
        .strip_prefix('-')?
        .strip_prefix(node)?
        .strip_prefix('-')?;
    if suffix.len() != 5 {
        return None;
    }
    usize::from_str_radix(hex, 16).ok()
}

fn string_attr(s: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.into()),
        ..Default::default()
    }
}

fn int_attr(i: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i),
        ..Default::default()
    }
}

fn bool_attr(b: bool) -> DeviceAttribute {
    DeviceAttribute {
        bool: Some(b),
        ..Default::default()
    }
}

fn version_attr(v: String) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(v),
        ..Default::default()
    }
}

/// Inserts `name` as a version attribute (normalized to semver) plus `<name>String`
/// with the raw value, so that selectors can use either.
fn insert_version(attrs: &mut BTreeMap<String, DeviceAttribute>, name: &str, raw: &str) {
    if let Some(v) = normalize_semver(raw) {
        attrs.insert(name.to_string(), version_attr(v));
    }
    attrs.insert(format!("{name}String"), string_attr(raw));
}

/// The attributes every device of a physical GPU carries (identity, product, driver
/// facts and PCI topology). Deterministic.
pub fn gpu_attributes(
    gpu: &GpuInfo,
    inv: &NodeInventory,
    device_type: &str,
) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    a.insert("type".to_string(), string_attr(device_type));
    a.insert("uuid".to_string(), string_attr(&gpu.uuid));
    a.insert("productName".to_string(), string_attr(&gpu.product_name));
    a.insert("brand".to_string(), string_attr(&gpu.brand));
    a.insert("architecture".to_string(), string_attr(&gpu.architecture));
    insert_version(
        &mut a,
        "cudaComputeCapability",
        &gpu.cuda_compute_capability,
    );
    insert_version(&mut a, "driverVersion", &inv.driver_version);
    insert_version(&mut a, "cudaDriverVersion", &inv.cuda_driver_version);
    a.insert("index".to_string(), int_attr(i64::from(gpu.index)));
    a.insert("minor".to_string(), int_attr(i64::from(gpu.minor)));
    a.insert("migCapable".to_string(), bool_attr(gpu.mig_capable));
    a.insert(ATTR_PCI_BUS_ID.to_string(), string_attr(&gpu.pci_bus_id));
    if let Some(root) = &gpu.pcie_root {
        a.insert(ATTR_PCIE_ROOT.to_string(), string_attr(root));
    }
    if let Some(numa) = gpu.numa_node {
        a.insert(ATTR_NUMA_NODE.to_string(), int_attr(numa));
    }
    a
}

fn capacity(value: impl ToString) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(value.to_string()),
        request_policy: None,
    }
}

/// The whole-GPU device (`gpu-<minor>`, type `gpu`).
pub fn whole_gpu_device(gpu: &GpuInfo, inv: &NodeInventory) -> Device {
    let mut cap = BTreeMap::new();
    cap.insert("memory".to_string(), capacity(gpu.memory_bytes));
    cap.insert("multiprocessors".to_string(), capacity(gpu.multiprocessors));
    Device {
        name: naming::gpu_device_name(gpu.minor),
        attributes: Some(gpu_attributes(gpu, inv, device_type::GPU)),
        capacity: Some(cap),
        ..Default::default()
    }
}

/// The devices one managed GPU contributes, in publish order.
///
/// `mig` and `shared` modes publish the plain whole GPU until partitions and shared
/// capacity are modelled (MIG and shared-GPU issues); the mode is still decided and
/// validated by the config.
pub fn devices_for(gpu: &ManagedGpu, inv: &NodeInventory) -> Vec<Device> {
    vec![whole_gpu_device(&gpu.gpu, inv)]
}

/// Builds the node's pool: every managed GPU's devices, in minor order, split into
/// slices at the version's per-slice device limit. Always at least one slice (an empty
/// one signals "driver up, no devices"). `pool.generation` is 1 here; the publisher
/// assigns the real generation. Deterministic.
pub fn build_pool(
    params: &PoolParams<'_>,
    inv: &NodeInventory,
    gpus: &[ManagedGpu],
) -> Vec<ResourceSlice> {
    let mut ordered: Vec<&ManagedGpu> = gpus.iter().collect();
    ordered.sort_by_key(|g| g.gpu.minor);
    let devices: Vec<Device> = ordered.iter().flat_map(|g| devices_for(g, inv)).collect();
    let uses_counters = devices
        .iter()
        .any(|d| d.consumes_counters.is_some() || d.taints.is_some());
    let per_slice = max_devices_per_slice(params.version, uses_counters);
    let chunks: Vec<Vec<Device>> = if devices.is_empty() {
        vec![Vec::new()]
    } else {
        devices.chunks(per_slice).map(<[Device]>::to_vec).collect()
    };
    let count = chunks.len();
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, devs)| ResourceSlice {
            metadata: ObjectMeta {
                generate_name: Some(slice_generate_name(
                    i,
                    count,
                    params.driver,
                    params.node_name,
                )),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: params.driver.to_string(),
                node_name: Some(params.node_name.to_string()),
                pool: ResourcePool {
                    name: params.node_name.to_string(),
                    generation: 1,
                    resource_slice_count: count as i64,
                },
                devices: Some(devs),
                ..Default::default()
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::mock::MockNode;

    fn default_pool(version: u32) -> Vec<ResourceSlice> {
        let node = MockNode::embedded_default().unwrap();
        let inv = node.inventory();
        let cfg = node.embedded_config().unwrap().unwrap();
        let gpus = cfg.resolve(&inv, "t").unwrap();
        build_pool(
            &PoolParams {
                driver: "gpu.tessera.dev",
                node_name: "node-a",
                version: KubeVersion::new(version).unwrap(),
            },
            &inv,
            &gpus,
        )
    }

    /// The default node publishes one slice with gpu-0..gpu-3 in minor order.
    #[test]
    fn default_node_is_one_slice_of_four_gpus() {
        let slices = default_pool(37);
        assert_eq!(slices.len(), 1);
        let names: Vec<_> = slices[0]
            .spec
            .devices
            .as_ref()
            .unwrap()
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(names, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
        assert_eq!(
            slices[0].metadata.generate_name.as_deref(),
            Some("00000-gpu.tessera.dev-node-a-")
        );
    }

    /// Whole-GPU attributes: versions normalized to semver, raw strings kept, PCI topology standard.
    #[test]
    fn whole_gpu_attributes_follow_the_contract() {
        let slices = default_pool(37);
        let d = &slices[0].spec.devices.as_ref().unwrap()[2];
        let a = d.attributes.as_ref().unwrap();
        assert_eq!(a["type"].string.as_deref(), Some("gpu"));
        assert_eq!(a["productName"].string.as_deref(), Some("Tesla T4"));
        assert_eq!(a["driverVersion"].version.as_deref(), Some("580.65.6"));
        assert_eq!(
            a["driverVersionString"].string.as_deref(),
            Some("580.65.06")
        );
        assert_eq!(a["cudaDriverVersion"].version.as_deref(), Some("13.0.0"));
        assert_eq!(a["cudaComputeCapability"].version.as_deref(), Some("7.5.0"));
        assert_eq!(a[ATTR_PCIE_ROOT].string.as_deref(), Some("pci0000:80"));
        assert_eq!(a[ATTR_NUMA_NODE].int, Some(1));
        assert_eq!(a["minor"].int, Some(2));
        assert_eq!(a["migCapable"].bool, Some(false));
        let c = d.capacity.as_ref().unwrap();
        assert_eq!(c["memory"].value.0, "16106127360");
        assert_eq!(c["multiprocessors"].value.0, "40");
    }

    /// Slice names carry a zero-padded hex index that parses back.
    #[test]
    fn slice_names_round_trip() {
        assert_eq!(slice_generate_name(0, 1, "d.x", "n"), "00000-d.x-n-");
        assert_eq!(slice_generate_name(10, 11, "d.x", "n"), "0000a-d.x-n-");
        assert_eq!(
            slice_generate_name(3, 0x100001, "d.x", "n"),
            "000003-d.x-n-"
        );
        assert_eq!(parse_slice_index("0000a-d.x-n-abcde", "d.x", "n"), Some(10));
        assert_eq!(parse_slice_index("n-d.x-abcde", "d.x", "n"), None);
        assert_eq!(parse_slice_index("0000a-d.x-other-abcde", "d.x", "n"), None);
    }

    /// A pool larger than the per-slice limit splits across slices.
    #[test]
    fn large_pools_split_at_the_device_limit() {
        let node = MockNode::embedded_default().unwrap();
        let mut inv = node.inventory();
        let template = inv.gpus[2].clone();
        inv.gpus = (0..130)
            .map(|i| GpuInfo {
                minor: i,
                index: i,
                uuid: format!("GPU-{i:08x}-0000-4000-8000-000000000000"),
                ..template.clone()
            })
            .collect();
        let gpus: Vec<ManagedGpu> = inv
            .gpus
            .iter()
            .map(|g| ManagedGpu {
                gpu: g.clone(),
                mode: crate::config::GpuMode::Exclusive,
            })
            .collect();
        let slices = build_pool(
            &PoolParams {
                driver: "gpu.tessera.dev",
                node_name: "n",
                version: KubeVersion::NEWEST,
            },
            &inv,
            &gpus,
        );
        let sizes: Vec<_> = slices
            .iter()
            .map(|s| s.spec.devices.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes, [128, 2]);
        assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 2));
    }
}
