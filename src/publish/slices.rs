//! Building the node's ResourceSlices from its inventory: a pure function, no I/O.
//!
//! One pool per node, named after the node. Devices are ordered by GPU minor; the
//! pool is split into as many slices as the per-slice limits of the server's version
//! require. Slices carry the indexed `generateName` (`<hex index>-<driver>-<node>-`) so
//! that their names sort in publish order, which is also the scheduler's first-fit order.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::config::{GpuMode, ManagedGpu, SliceLayout};
use crate::device_health::policy::{NodeHealth, Span};
use crate::inventory::sizing::{MIB, shared_memory, slot_compute, slot_memory};
use crate::inventory::{GpuInfo, MigStatus, NodeInventory};
use crate::mig::{GpuModel, MigProfile};
use crate::naming;
use k8s_model::attribute_version::normalize_semver;
use k8s_model::release::{FeatureGates, KubeVersion};

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

/// What the API server keeps of the gated fields Tessera uses (learned with a
/// `dryRun=All` probe by the plugin, or from `--k8s-version`/`--gates` offline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerFeatures {
    /// Counter sets and `consumesCounters` (DRAPartitionableDevices).
    pub partitionable: bool,
    /// `allowMultipleAllocations` and request policies (DRAConsumableCapacity).
    pub consumable_capacity: bool,
    /// Device `taints` (DRADeviceTaints): unhealthy devices are tainted where the
    /// server keeps taints, and left out of the pool where it drops them.
    pub device_taints: bool,
}

impl ServerFeatures {
    /// What a server with these gates keeps.
    pub fn from_gates(gates: &FeatureGates) -> Self {
        ServerFeatures {
            partitionable: gates.partitionable_devices(),
            consumable_capacity: gates.consumable_capacity(),
            device_taints: gates.device_taints(),
        }
    }
}

/// What the slices are built for.
#[derive(Debug, Clone)]
pub struct PoolParams<'a> {
    pub driver: &'a str,
    pub node_name: &'a str,
    pub version: KubeVersion,
    pub features: ServerFeatures,
    /// The node config's layout choice; `Auto` follows the version.
    pub layout: SliceLayout,
    /// Fallback slots per `shared` GPU where consumable capacity is dropped.
    pub shared_slots: u32,
}

impl PoolParams<'_> {
    /// Whether counter sets go in slices of their own: `split` (≥1.35 shape) or
    /// `combined` (1.34 shape), `auto` choosing by version.
    pub fn split_counters(&self) -> bool {
        match self.layout {
            SliceLayout::Split => true,
            SliceLayout::Combined => false,
            SliceLayout::Auto => self.version.counters_in_own_slices(),
        }
    }

    /// Whether each device with consumable capacity gets a slice of its own, as its
    /// only (so first) device: the server's scheduler checks a pick's capacity on the
    /// device at the pick's index within its request in the chosen device's slice
    /// (1.34 with DRAConsumableCapacity, [`KubeVersion::checks_capacity_at_pick_index`]).
    /// Alone and first, a count-1 pick is checked on the device it takes, and no other
    /// device's pick is checked against the shared device's usage.
    pub fn isolate_consumable(&self) -> bool {
        self.features.consumable_capacity && self.version.checks_capacity_at_pick_index()
    }
}

/// Whether `d` is a device with consumable capacity (multi-allocatable, with a request
/// policy on some capacity): the devices the 1.34 scheduler's capacity check must find
/// at index 0 of their slice.
pub fn has_consumable_capacity(d: &Device) -> bool {
    d.allow_multiple_allocations == Some(true)
        && d.capacity
            .iter()
            .flatten()
            .any(|(_, c)| c.request_policy.is_some())
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
    if let Some(brand) = &gpu.brand {
        a.insert("brand".to_string(), string_attr(brand));
    }
    if let Some(arch) = &gpu.architecture {
        a.insert("architecture".to_string(), string_attr(arch));
    }
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
    if let Some(sms) = gpu.multiprocessors {
        cap.insert("multiprocessors".to_string(), capacity(sms));
    }
    Device {
        name: naming::gpu_device_name(gpu.minor),
        attributes: Some(gpu_attributes(gpu, inv, device_type::GPU)),
        capacity: Some(cap),
        ..Default::default()
    }
}

fn policy_capacity(
    value: u64,
    default: u64,
    min: u64,
    max: Option<u64>,
    step: u64,
) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(value.to_string()),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity(default.to_string())),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity(min.to_string()),
                max: max.map(|m| Quantity(m.to_string())),
                step: Some(Quantity(step.to_string())),
            }),
            valid_values: None,
        }),
    }
}

/// A `shared`-mode GPU (`gpu-<minor>`, type `gpu-shared`): many claims consume its
/// `memory` and `compute` capacities. Both carry request policies, because a
/// multi-allocatable device consumes every capacity it publishes: a claim that asks for
/// nothing gets the whole memory and no reserved compute. The SM count is an attribute
/// here, not a capacity, for the same reason.
pub fn shared_gpu_device(gpu: &GpuInfo, inv: &NodeInventory) -> Device {
    let mut attrs = gpu_attributes(gpu, inv, device_type::GPU_SHARED);
    if let Some(sms) = gpu.multiprocessors {
        attrs.insert("multiprocessors".to_string(), int_attr(i64::from(sms)));
    }
    let memory = shared_memory(gpu);
    let cap = BTreeMap::from([
        (
            "memory".to_string(),
            policy_capacity(memory, memory, MIB, None, MIB),
        ),
        (
            "compute".to_string(),
            policy_capacity(100, 0, 0, Some(100), 1),
        ),
    ]);
    Device {
        name: naming::gpu_device_name(gpu.minor),
        attributes: Some(attrs),
        capacity: Some(cap),
        allow_multiple_allocations: Some(true),
        ..Default::default()
    }
}

/// The fallback for servers that drop consumable capacity: `slots` devices
/// `gpu-<minor>-slot-<k>` (type `gpu-slot`), each with the GPU's attributes (uuid
/// included, so `matchAttribute: uuid` gathers one GPU's slots), a `memory` capacity of
/// total/N and a `compute` capacity of 100/N, without request policies.
pub fn slot_devices(gpu: &GpuInfo, inv: &NodeInventory, slots: u32) -> Vec<Device> {
    let mut attrs = gpu_attributes(gpu, inv, device_type::GPU_SLOT);
    if let Some(sms) = gpu.multiprocessors {
        attrs.insert("multiprocessors".to_string(), int_attr(i64::from(sms)));
    }
    attrs.insert("slots".to_string(), int_attr(i64::from(slots)));
    let cap = BTreeMap::from([
        ("memory".to_string(), capacity(slot_memory(gpu, slots))),
        ("compute".to_string(), capacity(slot_compute(slots))),
    ]);
    (0..slots)
        .map(|k| {
            let mut a = attrs.clone();
            a.insert("slot".to_string(), int_attr(i64::from(k)));
            Device {
                name: naming::slot_device_name(gpu.minor, k),
                attributes: Some(a),
                capacity: Some(cap.clone()),
                ..Default::default()
            }
        })
        .collect()
}

/// Counter names of a MIG-mode GPU's counter set, in the DNS-label form the API
/// requires, besides `memory-slice-<k>`.
const MIG_COUNTERS: [&str; 7] = [
    "memory",
    "multiprocessors",
    "copy-engines",
    "decoders",
    "encoders",
    "jpeg-engines",
    "ofa-engines",
];

/// `gpu-<minor>-counters`.
pub fn counter_set_name(minor: u32) -> String {
    format!("gpu-{minor}-counters")
}

fn profile_values(p: &MigProfile) -> [u64; 7] {
    [
        p.memory_mib << 20,
        u64::from(p.multiprocessors),
        u64::from(p.copy_engines),
        u64::from(p.decoders),
        u64::from(p.encoders),
        u64::from(p.jpeg_engines),
        u64::from(p.ofa_engines),
    ]
}

/// The per-dimension maxima across a model's profiles: the counter set's capacity.
fn model_maxima(model: &GpuModel) -> [u64; 7] {
    let mut m = [0u64; 7];
    for p in model.profiles {
        for (i, v) in profile_values(p).into_iter().enumerate() {
            m[i] = m[i].max(v);
        }
    }
    m
}

fn counters(values: [u64; 7], slices: impl Iterator<Item = u32>) -> BTreeMap<String, Counter> {
    let mut c: BTreeMap<String, Counter> = MIG_COUNTERS
        .iter()
        .zip(values)
        .map(|(n, v)| {
            (
                n.to_string(),
                Counter {
                    value: Quantity(v.to_string()),
                },
            )
        })
        .collect();
    for k in slices {
        c.insert(
            format!("memory-slice-{k}"),
            Counter {
                value: Quantity("1".into()),
            },
        );
    }
    c
}

/// The counter set of a MIG-mode GPU: the profile maxima plus one counter per memory
/// slice. Deterministic.
pub fn mig_counter_set(minor: u32, model: &GpuModel) -> CounterSet {
    CounterSet {
        name: counter_set_name(minor),
        counters: counters(model_maxima(model), 0..model.memory_slices),
    }
}

/// Placement order within a profile, for packing under the scheduler's first fit:
/// small profiles fill the GPU from its end, large ones from its start, so that the
/// big placements stay free as long as possible. Deterministic.
pub fn packing_order(model: &GpuModel, p: &MigProfile) -> Vec<u32> {
    let mut starts = p.placements.to_vec();
    if p.placement_size() * 2 < model.memory_slices {
        starts.sort_by(|a, b| b.cmp(a));
    } else {
        starts.sort();
    }
    starts
}

/// The attributes every partition of `gpu` shares (computed once per GPU: building
/// them normalizes three version strings).
fn mig_parent_attributes(gpu: &GpuInfo, inv: &NodeInventory) -> BTreeMap<String, DeviceAttribute> {
    let mut attrs = gpu_attributes(gpu, inv, device_type::MIG);
    attrs.remove("uuid");
    attrs.remove("index");
    attrs.remove("minor");
    attrs.remove("migCapable");
    attrs.insert("parentUUID".into(), string_attr(&gpu.uuid));
    attrs.insert("parentMinor".into(), int_attr(i64::from(gpu.minor)));
    attrs
}

/// One MIG partition device (`type: mig`), optionally consuming the GPU's counters.
fn mig_device_with(
    parent: &BTreeMap<String, DeviceAttribute>,
    gpu: &GpuInfo,
    p: &MigProfile,
    start: u32,
    with_counters: bool,
) -> Device {
    let mut attrs = parent.clone();
    attrs.insert("profile".into(), string_attr(p.name));
    let values = profile_values(p);
    let cap: BTreeMap<String, DeviceCapacity> = [
        "memory",
        "multiprocessors",
        "copyEngines",
        "decoders",
        "encoders",
        "jpegEngines",
        "ofaEngines",
    ]
    .iter()
    .zip(values)
    .map(|(n, v)| (n.to_string(), capacity(v)))
    .collect();
    let size = p.placement_size();
    Device {
        name: naming::mig_device_name(gpu.minor, p.name, p.profile_id, start),
        attributes: Some(attrs),
        capacity: Some(cap),
        consumes_counters: with_counters.then(|| {
            vec![DeviceCounterConsumption {
                counter_set: counter_set_name(gpu.minor),
                counters: counters(values, start..start + size),
                compatibility_groups: None,
            }]
        }),
        ..Default::default()
    }
}

/// The devices one managed GPU contributes, in publish order, and its counter set.
/// [`placed_devices`] without the placements.
pub fn devices_for(
    gpu: &ManagedGpu,
    inv: &NodeInventory,
    mig: Option<&MigStatus>,
    features: ServerFeatures,
    shared_slots: u32,
) -> (Vec<Device>, Option<CounterSet>) {
    let (placed, set) = placed_devices(gpu, inv, mig, features, shared_slots);
    (placed.into_iter().map(|(d, _)| d).collect(), set)
}

/// The devices one managed GPU contributes, in publish order, each with the memory
/// slices it occupies (its MIG placement; `None` for a device using the whole GPU),
/// and its counter set.
///
/// * `exclusive`: the whole GPU.
/// * `shared`: one multi-allocatable device with consumable `memory` and `compute`, or
///   `shared_slots` fallback slots where the server drops consumable capacity. No
///   counters, no partitions.
/// * `mig` with partitionable devices: the whole GPU consuming every counter (unless
///   Ampere with MIG on, which offers partitions only), then one device per (profile,
///   placement) in [`packing_order`], and the GPU's counter set.
/// * `mig` on a server that drops counters: live MIG instances as static devices, or
///   the whole GPU when there are none.
pub fn placed_devices(
    gpu: &ManagedGpu,
    inv: &NodeInventory,
    mig: Option<&MigStatus>,
    features: ServerFeatures,
    shared_slots: u32,
) -> (Vec<(Device, Option<Span>)>, Option<CounterSet>) {
    let whole = |d: Device| (d, None);
    if gpu.mode == GpuMode::Shared {
        return if features.consumable_capacity {
            (vec![whole(shared_gpu_device(&gpu.gpu, inv))], None)
        } else {
            (
                slot_devices(&gpu.gpu, inv, shared_slots)
                    .into_iter()
                    .map(whole)
                    .collect(),
                None,
            )
        };
    }
    let Some(model) = gpu.mig_model() else {
        return (vec![whole(whole_gpu_device(&gpu.gpu, inv))], None);
    };
    let g = &gpu.gpu;
    let parent = mig_parent_attributes(g, inv);
    if !features.partitionable {
        let live: Vec<(Device, Option<Span>)> = mig
            .map(|m| m.instances.as_slice())
            .unwrap_or_default()
            .iter()
            .filter_map(|i| {
                model.profile_by_id(i.profile_id).map(|p| {
                    (
                        mig_device_with(&parent, g, p, i.start, false),
                        Some(Span {
                            start: i.start,
                            size: i.size,
                        }),
                    )
                })
            })
            .collect();
        if live.is_empty() {
            return (vec![whole(whole_gpu_device(g, inv))], None);
        }
        return (live, None);
    }
    let mut devices = Vec::new();
    if !g.mig_enabled || model.reset_free_mig_toggle {
        let mut dev = whole_gpu_device(g, inv);
        dev.consumes_counters = Some(vec![DeviceCounterConsumption {
            counter_set: counter_set_name(g.minor),
            counters: counters(model_maxima(model), 0..model.memory_slices),
            compatibility_groups: None,
        }]);
        devices.push(whole(dev));
    }
    for p in model.profiles {
        for start in packing_order(model, p) {
            devices.push((
                mig_device_with(&parent, g, p, start, true),
                Some(Span {
                    start,
                    size: p.placement_size(),
                }),
            ));
        }
    }
    (devices, Some(mig_counter_set(g.minor, model)))
}

/// Most counter sets in one slice (≥1.35) and most counters in all sets of one slice
/// (the 1.34 combined layout).
const MAX_COUNTER_SETS_PER_SLICE: usize = 8;
const MAX_COUNTERS_PER_COMBINED_SLICE: usize = 32;

fn new_slice(
    params: &PoolParams<'_>,
    devices: Option<Vec<Device>>,
    counter_sets: Option<Vec<CounterSet>>,
) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta::default(),
        spec: ResourceSliceSpec {
            driver: params.driver.to_string(),
            node_name: Some(params.node_name.to_string()),
            pool: ResourcePool {
                name: params.node_name.to_string(),
                generation: 1,
                resource_slice_count: 0,
            },
            devices,
            shared_counters: counter_sets,
            ..Default::default()
        },
    }
}

/// Builds the node's pool: every managed GPU's devices in minor order, split into
/// slices at the version's limits. With counters, the `split` layout puts counter sets
/// in slices of their own (at most 8 per slice) followed by device slices (at most 64
/// devices); the `combined` layout keeps each GPU's counter set with its devices (at
/// most 32 counters per slice). Always at least one slice (an empty one signals "driver
/// up, no devices"). `pool.generation` is 1 here; the publisher assigns the real one.
/// Deterministic.
pub fn build_pool(
    params: &PoolParams<'_>,
    inv: &NodeInventory,
    gpus: &[ManagedGpu],
    mig: &BTreeMap<u32, MigStatus>,
) -> Vec<ResourceSlice> {
    build_pool_with_health(params, inv, gpus, mig, &NodeHealth::default())
}

/// [`build_pool`] with the devices' health ([`NodeHealth::device`]): an unhealthy
/// device carries its taint ([`crate::device_health::policy::Unhealthy::taint`]) when the server
/// keeps taints; otherwise it is left out of the pool, and a GPU unhealthy as a whole
/// is left out with its counter set. A taint lowers the per-slice device limit to 64
/// on ≥1.35, so the pool may split differently.
pub fn build_pool_with_health(
    params: &PoolParams<'_>,
    inv: &NodeInventory,
    gpus: &[ManagedGpu],
    mig: &BTreeMap<u32, MigStatus>,
    health: &NodeHealth,
) -> Vec<ResourceSlice> {
    let mut ordered: Vec<&ManagedGpu> = gpus.iter().collect();
    ordered.sort_by_key(|g| g.gpu.minor);
    if !params.features.device_taints {
        ordered.retain(|g| health.unhealthy(g.gpu.minor).is_none());
    }
    let mut per_gpu: Vec<(Vec<Device>, Option<CounterSet>)> = ordered
        .iter()
        .map(|g| {
            let minor = g.gpu.minor;
            let (placed, set) = placed_devices(
                g,
                inv,
                mig.get(&minor),
                params.features,
                params.shared_slots,
            );
            let devices = placed
                .into_iter()
                .filter_map(|(mut d, span)| match health.device(minor, span) {
                    None => Some(d),
                    Some(u) if params.features.device_taints => {
                        d.taints.get_or_insert_with(Vec::new).push(u.taint());
                        Some(d)
                    }
                    Some(_) => None,
                })
                .collect();
            (devices, set)
        })
        .collect();
    // Devices with consumable capacity leave the GPU's run for slices of their own at
    // the end (where the bug needs it), so the other devices keep their order and their
    // slices. Tessera's shared GPUs consume no counters: a moved device never leaves a
    // counter set behind (1.34 wants both in one slice).
    let mut isolated: Vec<Device> = Vec::new();
    if params.isolate_consumable() {
        for (devices, _) in &mut per_gpu {
            let (alone, rest): (Vec<Device>, Vec<Device>) = std::mem::take(devices)
                .into_iter()
                .partition(|d| has_consumable_capacity(d) && d.consumes_counters.is_none());
            *devices = rest;
            isolated.extend(alone);
        }
    }
    let any_counters = per_gpu.iter().any(|(_, c)| c.is_some());
    let mut slices = Vec::new();
    if any_counters && !params.split_counters() {
        // 1.34: a slice holds counter sets with the devices consuming them.
        let mut cur_devices: Vec<Device> = Vec::new();
        let mut cur_sets: Vec<CounterSet> = Vec::new();
        let mut cur_counters = 0;
        let per_slice = max_devices_per_slice(params.version, false);
        for (devices, set) in per_gpu {
            let n = set.as_ref().map_or(0, |s| s.counters.len());
            if (!cur_sets.is_empty() && cur_counters + n > MAX_COUNTERS_PER_COMBINED_SLICE)
                || cur_devices.len() + devices.len() > per_slice
            {
                slices.push(new_slice(
                    params,
                    Some(std::mem::take(&mut cur_devices)),
                    (!cur_sets.is_empty()).then(|| std::mem::take(&mut cur_sets)),
                ));
                cur_counters = 0;
            }
            cur_counters += n;
            cur_sets.extend(set);
            cur_devices.extend(devices);
        }
        if !cur_devices.is_empty() || !cur_sets.is_empty() {
            slices.push(new_slice(
                params,
                Some(cur_devices),
                (!cur_sets.is_empty()).then_some(cur_sets),
            ));
        }
    } else {
        let sets: Vec<CounterSet> = per_gpu.iter().filter_map(|(_, c)| c.clone()).collect();
        for chunk in sets.chunks(MAX_COUNTER_SETS_PER_SLICE) {
            slices.push(new_slice(params, None, Some(chunk.to_vec())));
        }
        let devices: Vec<Device> = per_gpu.into_iter().flat_map(|(d, _)| d).collect();
        let uses_counters = devices
            .iter()
            .any(|d| d.consumes_counters.is_some() || d.taints.is_some());
        let per_slice = max_devices_per_slice(params.version, uses_counters);
        for chunk in devices.chunks(per_slice) {
            slices.push(new_slice(params, Some(chunk.to_vec()), None));
        }
    }
    for d in isolated {
        slices.push(new_slice(params, Some(vec![d]), None));
    }
    if slices.is_empty() {
        slices.push(new_slice(params, Some(Vec::new()), None));
    }
    let count = slices.len();
    for (i, s) in slices.iter_mut().enumerate() {
        s.metadata.generate_name = Some(slice_generate_name(
            i,
            count,
            params.driver,
            params.node_name,
        ));
        s.spec.pool.resource_slice_count = count as i64;
    }
    slices
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::mock::MockNode;

    fn default_pool(version: u32) -> Vec<ResourceSlice> {
        let v = KubeVersion::new(version).unwrap();
        pool_with_features(
            version,
            ServerFeatures::from_gates(&FeatureGates::defaults(v)),
            SliceLayout::Auto,
        )
    }

    /// The default mock node's pool on `version` with `gates` and `layout`.
    fn default_pool_with(version: u32, gates: &str, layout: SliceLayout) -> Vec<ResourceSlice> {
        let v = KubeVersion::new(version).unwrap();
        pool_with_features(
            version,
            ServerFeatures::from_gates(&FeatureGates::parse(v, gates).unwrap()),
            layout,
        )
    }

    fn pool_with_features(
        version: u32,
        features: ServerFeatures,
        layout: SliceLayout,
    ) -> Vec<ResourceSlice> {
        let node = MockNode::embedded_default().unwrap();
        let inv = node.inventory();
        let cfg = crate::config::NodeConfig::embedded_in(&node)
            .unwrap()
            .unwrap();
        let gpus = cfg.resolve(&inv, "t").unwrap();
        build_pool(
            &PoolParams {
                driver: "gpu.tessera.dev",
                node_name: "node-a",
                version: KubeVersion::new(version).unwrap(),
                features,
                layout,
                shared_slots: 4,
            },
            &inv,
            &gpus,
            &BTreeMap::new(),
        )
    }

    const ALL_GATES: &str = "DRAPartitionableDevices=true,DRAConsumableCapacity=true";

    fn device_names(s: &ResourceSlice) -> Vec<&str> {
        s.spec
            .devices
            .iter()
            .flatten()
            .map(|d| d.name.as_str())
            .collect()
    }

    /// On 1.37 the default node publishes gpu-0's counter set in a slice of its own,
    /// then one device slice: gpu-0 whole, its 25 partitions, gpu-1..gpu-3.
    #[test]
    fn default_node_on_1_37_splits_counters_from_devices() {
        let slices = default_pool(37);
        assert_eq!(slices.len(), 2);
        assert!(slices[0].spec.devices.is_none());
        let sets = slices[0].spec.shared_counters.as_ref().unwrap();
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0].name, "gpu-0-counters");
        assert_eq!(sets[0].counters.len(), 15);
        assert_eq!(sets[0].counters["memory-slice-7"].value.0, "1");
        let names = device_names(&slices[1]);
        assert_eq!(names.len(), 29);
        assert_eq!(names[0], "gpu-0");
        assert_eq!(&names[26..], ["gpu-1", "gpu-2", "gpu-3"]);
        assert_eq!(
            slices[0].metadata.generate_name.as_deref(),
            Some("00000-gpu.tessera.dev-node-a-")
        );
        // 1g partitions fill from the end, 3g from the start.
        let one_g: Vec<_> = names
            .iter()
            .filter(|n| n.contains("-mig-1g10gb-19-"))
            .collect();
        assert_eq!(one_g.first().copied(), Some(&"gpu-0-mig-1g10gb-19-6"));
        let three_g: Vec<_> = names
            .iter()
            .filter(|n| n.contains("-mig-3g40gb-9-"))
            .collect();
        assert_eq!(three_g, [&"gpu-0-mig-3g40gb-9-0", &"gpu-0-mig-3g40gb-9-4"]);
        // The whole GPU consumes every counter; a partition its slices.
        let devs = slices[1].spec.devices.as_ref().unwrap();
        assert_eq!(
            devs[0].consumes_counters.as_ref().unwrap()[0]
                .counters
                .len(),
            15
        );
        let p = devs
            .iter()
            .find(|d| d.name == "gpu-0-mig-3g40gb-9-4")
            .unwrap();
        let c = &p.consumes_counters.as_ref().unwrap()[0].counters;
        assert_eq!(c["memory"].value.0, (40448u64 << 20).to_string());
        let slices_used: Vec<_> = c
            .keys()
            .filter(|k| k.starts_with("memory-slice-"))
            .collect();
        assert_eq!(
            slices_used,
            [
                "memory-slice-4",
                "memory-slice-5",
                "memory-slice-6",
                "memory-slice-7"
            ]
        );
        let a = p.attributes.as_ref().unwrap();
        assert_eq!(a["type"].string.as_deref(), Some("mig"));
        assert_eq!(a["profile"].string.as_deref(), Some("3g.40gb"));
        assert_eq!(
            a["parentUUID"].string.as_deref(),
            Some("GPU-4f8d0c1e-6a2b-4c59-9e31-0a7b5d2c9f10")
        );
    }

    /// 1.34 with consumable capacity (its scheduler checks a pick's capacity on the
    /// device at the pick's index in the slice): the shared gpu-1 is the only device of
    /// the last slice, so index 0 is gpu-1 itself; the other devices and gpu-0's counter
    /// set keep the combined slice, in their order; every slice counts the pool.
    #[test]
    fn on_1_34_with_consumable_capacity_a_shared_gpu_is_alone_in_its_slice() {
        for layout in [SliceLayout::Auto, SliceLayout::Combined, SliceLayout::Split] {
            let slices = default_pool_with(34, ALL_GATES, layout);
            let last = slices.last().unwrap();
            assert_eq!(device_names(last), ["gpu-1"], "{layout:?}");
            assert!(last.spec.shared_counters.is_none());
            for s in &slices {
                assert_eq!(s.spec.pool.resource_slice_count, slices.len() as i64);
                let devices = s.spec.devices.as_deref().unwrap_or_default();
                // Every device with capacity policies is first, and alone.
                for (i, d) in devices.iter().enumerate() {
                    if has_consumable_capacity(d) {
                        assert_eq!((i, devices.len()), (0, 1), "{layout:?}: {}", d.name);
                    }
                }
            }
            let names: Vec<&str> = slices.iter().flat_map(device_names).collect();
            assert_eq!(names.len(), 29);
            assert_eq!(&names[26..], ["gpu-2", "gpu-3", "gpu-1"], "{layout:?}");
        }
        let auto = default_pool_with(34, ALL_GATES, SliceLayout::Auto);
        assert_eq!(auto.len(), 2);
        assert_eq!(device_names(&auto[0])[0], "gpu-0");
        assert_eq!(
            auto[0].spec.shared_counters.as_ref().unwrap()[0].name,
            "gpu-0-counters"
        );
        assert_eq!(
            auto[1].metadata.generate_name.as_deref(),
            Some("00001-gpu.tessera.dev-node-a-")
        );
        let pool = validate_on(34, &auto);
        assert!(pool.is_empty(), "{pool:?}");
    }

    /// Consumable capacity alone (no counters) on 1.34: the whole GPUs share a slice,
    /// gpu-1 has its own.
    #[test]
    fn on_1_34_without_counters_the_shared_gpu_still_gets_its_own_slice() {
        let slices = default_pool_with(34, "DRAConsumableCapacity=true", SliceLayout::Auto);
        let names: Vec<Vec<&str>> = slices.iter().map(device_names).collect();
        assert_eq!(names, [vec!["gpu-0", "gpu-2", "gpu-3"], vec!["gpu-1"]]);
    }

    /// 1.35+ checks the chosen device: the layout is unchanged (gpu-1 stays between
    /// gpu-0's partitions and gpu-2), and so is 1.34 without consumable capacity.
    #[test]
    fn the_layout_moves_nothing_where_the_scheduler_checks_the_right_device() {
        for v in [35, 36, 37] {
            let slices = default_pool_with(v, ALL_GATES, SliceLayout::Auto);
            assert_eq!(slices.len(), 2, "1.{v}");
            let names = device_names(&slices[1]);
            assert_eq!(&names[26..], ["gpu-1", "gpu-2", "gpu-3"], "1.{v}");
        }
        let slices = default_pool_with(34, "DRAPartitionableDevices=true", SliceLayout::Auto);
        assert_eq!(slices.len(), 1);
        let names = device_names(&slices[0]);
        assert_eq!(names.len(), 32);
        assert!(names.contains(&"gpu-1-slot-0"));
    }

    /// What the API server (per slice) and the pool rules of `minor` refuse.
    fn validate_on(minor: u32, slices: &[ResourceSlice]) -> Vec<String> {
        let gates = FeatureGates::parse(KubeVersion::new(minor).unwrap(), ALL_GATES).unwrap();
        let mut errs: Vec<String> = slices
            .iter()
            .flat_map(|s| k8s_model::validation::validate_resource_slice(s, &gates))
            .map(|e| e.to_string())
            .collect();
        let refs: Vec<&ResourceSlice> = slices.iter().collect();
        errs.extend(
            k8s_model::validation::validate_pool_for(&refs, gates.version())
                .into_iter()
                .map(|e| e.to_string()),
        );
        errs
    }

    /// Where the server drops counters and consumable capacity (1.34/1.35 defaults), a
    /// MIG-mode GPU without live MIG devices is published whole, with no counters, and
    /// the shared gpu-1 as its four fallback slots: one slice.
    #[test]
    fn without_partitionable_devices_mig_gpus_are_whole() {
        for v in [34, 35] {
            let slices = default_pool(v);
            assert_eq!(slices.len(), 1, "1.{v}");
            assert_eq!(
                device_names(&slices[0]),
                [
                    "gpu-0",
                    "gpu-1-slot-0",
                    "gpu-1-slot-1",
                    "gpu-1-slot-2",
                    "gpu-1-slot-3",
                    "gpu-2",
                    "gpu-3"
                ]
            );
            assert!(slices[0].spec.shared_counters.is_none());
        }
    }

    /// Whole-GPU attributes: versions normalized to semver, raw strings kept, PCI topology standard.
    #[test]
    fn whole_gpu_attributes_follow_the_contract() {
        let slices = default_pool(37);
        let d = slices[1]
            .spec
            .devices
            .as_ref()
            .unwrap()
            .iter()
            .find(|d| d.name == "gpu-2")
            .unwrap();
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

    /// What NVML did not answer (brand, architecture, SM count) is left out of every
    /// kind of device, and the rest is published as usual.
    #[test]
    fn unanswered_optional_facts_are_left_out() {
        let mut inv = MockNode::embedded_default().unwrap().inventory();
        let gpu = &mut inv.gpus[2];
        gpu.brand = None;
        gpu.architecture = None;
        gpu.multiprocessors = None;
        let gpu = inv.gpus[2].clone();
        let whole = whole_gpu_device(&gpu, &inv);
        let shared = shared_gpu_device(&gpu, &inv);
        let slots = slot_devices(&gpu, &inv, 2);
        for d in [&whole, &shared, &slots[0]] {
            let a = d.attributes.as_ref().unwrap();
            for left_out in ["brand", "architecture", "multiprocessors"] {
                assert!(!a.contains_key(left_out), "{}: {left_out}", d.name);
            }
            assert_eq!(a["uuid"].string.as_deref(), Some(gpu.uuid.as_str()));
            assert!(a.contains_key("cudaComputeCapability"), "{}", d.name);
        }
        let c = whole.capacity.as_ref().unwrap();
        assert!(!c.contains_key("multiprocessors"));
        assert_eq!(c["memory"].value.0, gpu.memory_bytes.to_string());
    }

    /// A shared GPU on 1.37: one multi-allocatable device whose only capacities are
    /// `memory` (whole by default, 1 MiB steps) and `compute` (0 by default, 0-100), with
    /// the SM count as an attribute and no counters.
    #[test]
    fn shared_gpu_publishes_consumable_memory_and_compute() {
        let slices = default_pool(37);
        let d = slices[1]
            .spec
            .devices
            .as_ref()
            .unwrap()
            .iter()
            .find(|d| d.name == "gpu-1")
            .unwrap();
        assert_eq!(d.allow_multiple_allocations, Some(true));
        assert!(d.consumes_counters.is_none());
        let a = d.attributes.as_ref().unwrap();
        assert_eq!(a["type"].string.as_deref(), Some("gpu-shared"));
        assert_eq!(a["multiprocessors"].int, Some(132));
        let c = d.capacity.as_ref().unwrap();
        assert_eq!(c.keys().collect::<Vec<_>>(), ["compute", "memory"]);
        let mem = &c["memory"];
        let total: u64 = mem.value.0.parse().unwrap();
        assert_eq!(total % (1 << 20), 0);
        let p = mem.request_policy.as_ref().unwrap();
        assert_eq!(p.default.as_ref().unwrap().0, mem.value.0);
        let r = p.valid_range.as_ref().unwrap();
        assert_eq!(
            (r.min.0.as_str(), r.step.as_ref().unwrap().0.as_str()),
            ("1048576", "1048576")
        );
        let p = c["compute"].request_policy.as_ref().unwrap();
        assert_eq!(c["compute"].value.0, "100");
        assert_eq!(p.default.as_ref().unwrap().0, "0");
        let r = p.valid_range.as_ref().unwrap();
        assert_eq!(
            (r.min.0.as_str(), r.max.as_ref().unwrap().0.as_str()),
            ("0", "100")
        );
    }

    /// Fallback slots carry the GPU's uuid and 1/N of its memory (rounded down to 1 MiB)
    /// and compute, with no request policy.
    #[test]
    fn fallback_slots_split_memory_and_compute() {
        let node = MockNode::embedded_default().unwrap();
        let inv = node.inventory();
        let gpu = ManagedGpu {
            gpu: GpuInfo {
                memory_bytes: 10 * (1 << 30) + 12345,
                ..inv.gpus[1].clone()
            },
            mode: GpuMode::Shared,
        };
        let features = ServerFeatures {
            partitionable: false,
            consumable_capacity: false,
            device_taints: false,
        };
        let (devs, set) = devices_for(&gpu, &inv, None, features, 5);
        assert!(set.is_none());
        assert_eq!(devs.len(), 5);
        assert_eq!(devs[4].name, "gpu-1-slot-4");
        let a = devs[4].attributes.as_ref().unwrap();
        assert_eq!(a["type"].string.as_deref(), Some("gpu-slot"));
        assert_eq!(a["uuid"].string.as_deref(), Some(gpu.gpu.uuid.as_str()));
        assert_eq!(a["slot"].int, Some(4));
        let c = devs[4].capacity.as_ref().unwrap();
        assert_eq!(c["memory"].value.0, (2048u64 << 20).to_string());
        assert_eq!(c["compute"].value.0, "20");
        assert!(c.values().all(|c| c.request_policy.is_none()));
        assert!(devs.iter().all(|d| d.allow_multiple_allocations.is_none()));
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

    fn exclusive_node(n: u32) -> (NodeInventory, Vec<ManagedGpu>) {
        let node = MockNode::embedded_default().unwrap();
        let mut inv = node.inventory();
        let template = inv.gpus[2].clone();
        inv.gpus = (0..n)
            .map(|i| GpuInfo {
                minor: i,
                index: i,
                uuid: format!("GPU-{i:08x}-0000-4000-8000-000000000000"),
                ..template.clone()
            })
            .collect();
        let gpus = inv
            .gpus
            .iter()
            .map(|g| ManagedGpu {
                gpu: g.clone(),
                mode: GpuMode::Exclusive,
            })
            .collect();
        (inv, gpus)
    }

    fn health_with(events: &[(u32, crate::inventory::HealthEventKind)]) -> NodeHealth {
        let mut h = NodeHealth::default();
        for (i, (minor, kind)) in events.iter().enumerate() {
            h.apply(
                &crate::inventory::HealthEvent {
                    seq: i as u64 + 1,
                    minor: *minor,
                    gi_id: None,
                    kind: *kind,
                },
                crate::device_health::policy::At::now(),
            );
        }
        h
    }

    /// One tainted GPU among 130 on 1.37: every slice drops to 64 devices, and only the
    /// unhealthy GPU's device carries the taint.
    #[test]
    fn a_taint_resplits_a_large_pool_at_64() {
        let (inv, gpus) = exclusive_node(130);
        let version = KubeVersion::NEWEST;
        let params = PoolParams {
            driver: "gpu.tessera.dev",
            node_name: "n",
            version,
            features: ServerFeatures::from_gates(&FeatureGates::defaults(version)),
            layout: SliceLayout::Auto,
            shared_slots: 4,
        };
        let health = health_with(&[(77, crate::inventory::HealthEventKind::Xid(79))]);
        let slices = build_pool_with_health(&params, &inv, &gpus, &BTreeMap::new(), &health);
        let sizes: Vec<_> = slices
            .iter()
            .map(|s| s.spec.devices.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes, [64, 64, 2]);
        let tainted: Vec<_> = slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .filter(|d| d.taints.is_some())
            .collect();
        assert_eq!(tainted.len(), 1);
        assert_eq!(tainted[0].name, "gpu-77");
        let t = &tainted[0].taints.as_ref().unwrap()[0];
        assert_eq!(
            (t.key.as_str(), t.value.as_deref(), t.effect.as_str()),
            ("gpu.tessera.dev/unhealthy", Some("xid-79"), "NoExecute")
        );
    }

    /// An XID on MIG GPU instance 9 of gpu-0 (memory slice 6) taints exactly the
    /// devices that consume memory slice 6 (the whole GPU, the partitions overlapping
    /// the instance), not the partitions beside it nor another GPU's devices; on a
    /// server that drops taints those devices are left out and the counter set stays.
    #[test]
    fn an_instance_xid_taints_the_devices_overlapping_it() {
        let node = MockNode::embedded_default().unwrap();
        let inv = node.inventory();
        let gpus = crate::config::NodeConfig::embedded_in(&node)
            .unwrap()
            .unwrap()
            .resolve(&inv, "t")
            .unwrap();
        let mut health = NodeHealth::default();
        health.apply_in(
            &crate::inventory::HealthEvent {
                seq: 1,
                minor: 0,
                gi_id: Some(9),
                kind: crate::inventory::HealthEventKind::Xid(48),
            },
            crate::device_health::policy::Scope::Instance {
                gi_id: 9,
                span: Span { start: 6, size: 1 },
            },
            crate::device_health::policy::At::now(),
        );
        let version = KubeVersion::NEWEST;
        let mut params = PoolParams {
            driver: "gpu.tessera.dev",
            node_name: "n",
            version,
            features: ServerFeatures::from_gates(&FeatureGates::defaults(version)),
            layout: SliceLayout::Auto,
            shared_slots: 4,
        };
        assert!(params.features.device_taints && params.features.partitionable);
        let slices = build_pool_with_health(&params, &inv, &gpus, &BTreeMap::new(), &health);
        let devices: Vec<&Device> = slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .collect();
        let uses_slice_6 = |d: &Device| {
            d.consumes_counters.iter().flatten().any(|c| {
                c.counter_set == "gpu-0-counters" && c.counters.contains_key("memory-slice-6")
            })
        };
        let mut tainted = 0;
        for d in &devices {
            let t = d
                .taints
                .as_ref()
                .map(|t| (t[0].value.clone().unwrap_or_default(), t[0].effect.clone()));
            if uses_slice_6(d) {
                assert_eq!(t, Some(("xid-48".into(), "NoExecute".into())), "{}", d.name);
                tainted += 1;
            } else {
                assert_eq!(t, None, "{}", d.name);
            }
        }
        assert!(tainted >= 3 && tainted < devices.len() - 10, "{tainted}");
        // Without taints: those devices are left out, gpu-0's counter set stays.
        params.features.device_taints = false;
        let slices = build_pool_with_health(&params, &inv, &gpus, &BTreeMap::new(), &health);
        let left: Vec<&Device> = slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .collect();
        assert_eq!(left.len(), devices.len() - tainted);
        assert!(left.iter().all(|d| !uses_slice_6(d)));
        assert!(slices.iter().any(|s| s.spec.shared_counters.is_some()));
    }

    /// On 1.35 defaults (taints dropped) an unhealthy GPU's devices are left out: here
    /// the shared gpu-1's four slots.
    #[test]
    fn without_taints_unhealthy_gpus_are_left_out() {
        let node = MockNode::embedded_default().unwrap();
        let inv = node.inventory();
        let gpus = crate::config::NodeConfig::embedded_in(&node)
            .unwrap()
            .unwrap()
            .resolve(&inv, "t")
            .unwrap();
        let version = KubeVersion::new(35).unwrap();
        let params = PoolParams {
            driver: "gpu.tessera.dev",
            node_name: "n",
            version,
            features: ServerFeatures::from_gates(&FeatureGates::defaults(version)),
            layout: SliceLayout::Auto,
            shared_slots: 4,
        };
        assert!(!params.features.device_taints);
        let health = health_with(&[(1, crate::inventory::HealthEventKind::Lost)]);
        let slices = build_pool_with_health(&params, &inv, &gpus, &BTreeMap::new(), &health);
        assert_eq!(device_names(&slices[0]), ["gpu-0", "gpu-2", "gpu-3"]);
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
                features: ServerFeatures::from_gates(&FeatureGates::defaults(KubeVersion::NEWEST)),
                layout: SliceLayout::Auto,
                shared_slots: 4,
            },
            &inv,
            &gpus,
            &BTreeMap::new(),
        );
        let sizes: Vec<_> = slices
            .iter()
            .map(|s| s.spec.devices.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes, [128, 2]);
        assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 2));
    }
}
