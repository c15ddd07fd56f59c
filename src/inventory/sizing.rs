//! How a GPU's memory and compute divide into what Tessera publishes and budgets: the
//! same arithmetic for the slices (what the scheduler counts) and the claim plans (what
//! a claim is held to), so the two can never disagree.

use crate::inventory::GpuInfo;

/// Memory is published and budgeted in whole MiB.
pub const MIB: u64 = 1 << 20;

/// A shared GPU's memory as published: the total rounded down to 1 MiB.
pub fn shared_memory(gpu: &GpuInfo) -> u64 {
    gpu.memory_bytes / MIB * MIB
}

/// One fallback slot's memory: total/N rounded down to 1 MiB.
pub fn slot_memory(gpu: &GpuInfo, slots: u32) -> u64 {
    gpu.memory_bytes / u64::from(slots.max(1)) / MIB * MIB
}

/// One fallback slot's compute share in percent (N divides 100: the config checks).
pub fn slot_compute(slots: u32) -> u32 {
    100 / slots.max(1)
}
