//! `region`: a claim's accounting region, one fixed-size file per claim, created at
//! full size by the plugin and mapped read-write by every process of the claim's
//! containers. Layout v2 (all integers little-endian; offsets in bytes):
//!
//! * header (64 bytes) at 0: magic, version, header size, file size, GPU count, GPU
//!   entry size, GPU table offset, slot count, slot size, slot table offset;
//! * GPU table: one 128-byte entry per GPU of the claim's `limits`, in the same order
//!   (sorted by UUID): UUID, bytes used, peak, refused allocations, then the claim's
//!   token bucket on that GPU ([`Bucket`]: its theoretical arrival time) and the launch
//!   counters the compute controller reads (thread blocks, launches, ns waited);
//! * slot table: one slot per process: a random 128-bit token (0 = free), flags, start
//!   time, then one u64 of bytes charged per GPU and (v2) one u64 per GPU of bytes the
//!   process reserved ahead of its allocations (its pool, part of its charge);
//! * (v3) the slot map, after the slot table: one bit per slot, set while the slot has
//!   an owner, so that memory queries read the pools of the slots in use only
//!   ([`Region::allocated`]).
//!
//! A process owns slot *i* while it holds an OFD write lock on the slot's byte range
//! (`slot_offset(i) .. + slot_size`). The kernel drops that lock at process death,
//! SIGKILL included, so a slot with a non-zero token whose range is unlocked belongs to
//! a dead process: whoever locks it next returns its charges to the GPU totals
//! ([`Region::reclaim_slot`]).
//!
//! Mutating methods do nothing (or refuse) on a read-only mapping: a store through a
//! `PROT_READ` mapping would kill the process.
//!
//! Sizes in the header let version N+1 append fields to the header, GPU entries and
//! slots: a version-N reader uses the sizes it finds, so it still reads N's fields.
//! See docs/design.md, section 15, for the table.
#![forbid(unsafe_code)]

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::bytes::{get_uuid, put_uuid, rd_u32, rd_u64, wr_u32, wr_u64};
use crate::map::{self, Mapping};
use crate::{AbiError, DEFAULT_BURST_NS, UUID_FIELD};

pub const MAGIC: [u8; 8] = *b"TSRAREG\0";
/// v2 appended the per-GPU pool counters to the slots; v3 the slot map (a header
/// field and a bitmap after the slot table).
pub const VERSION: u32 = 3;
pub const HEADER_SIZE: usize = 64;
pub const GPU_ENTRY_SIZE: usize = 128;
/// Slots per region: concurrent processes per claim. When all are taken, new processes
/// fail closed (every allocation refused).
pub const DEFAULT_SLOTS: u32 = 128;
/// Most GPUs one claim may budget (bounded so the region stays small).
pub use crate::MAX_GPUS;

/// Header field offsets.
pub mod hdr {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const HEADER_SIZE: usize = 12;
    pub const FILE_SIZE: usize = 16;
    pub const GPU_COUNT: usize = 24;
    pub const GPU_ENTRY_SIZE: usize = 28;
    pub const GPU_TABLE: usize = 32;
    pub const SLOT_COUNT: usize = 36;
    pub const SLOT_SIZE: usize = 40;
    pub const SLOT_TABLE: usize = 44;
    /// (v3) Offset of the slot map: one bit per slot (bit `s % 64` of little-endian
    /// u64 word `s / 64`), set while slot `s` has an owner; 0 = none.
    pub const SLOT_MAP: usize = 48;
}

/// GPU entry field offsets.
pub mod gpu {
    pub const UUID: usize = 0;
    pub const USED: usize = 64;
    pub const PEAK: usize = 72;
    pub const REFUSED: usize = 80;
    /// The token bucket's theoretical arrival time (`CLOCK_MONOTONIC` ns to 256 ns; 0 =
    /// never charged), its low 8 bits the code of the rate it was booked at
    /// ([`super::rate_code`]).
    pub const TAT: usize = 88;
    /// Thread blocks launched by all processes of the claim (cumulative).
    pub const BLOCKS: usize = 96;
    /// Kernels launched (a graph launch counts its kernel nodes; cumulative).
    pub const LAUNCHES: usize = 104;
    /// Nanoseconds launches spent waiting in the bucket, summed over threads
    /// (cumulative).
    pub const WAITED_NS: usize = 112;
    /// (v2) The least the library charges per CUDA context on this GPU, reserved
    /// before the driver creates it; a measurement may raise a context's charge to at
    /// most twice this, never lower it (bytes; written at creation,
    /// [`super::DEFAULT_CONTEXT_BYTES`]; 0 = contexts are not charged, as in regions
    /// written before the field).
    pub const CONTEXT_BYTES: usize = 120;
}

/// The per-context charge a fresh region carries: a CUDA context reserves device
/// memory of its own (local memory for every resident thread, the printf FIFO, the
/// malloc heap, code and driver state), measured at about 300–500 MiB on A100/H100-class
/// GPUs (`../shared/reference/anchor-hami.md`). The low end: a measurement, when the
/// driver can answer one, raises a context's charge (to at most twice this) but never
/// lowers it, and the node-side watchdog's tolerance covers the rest.
pub const DEFAULT_CONTEXT_BYTES: u64 = 300 << 20;

/// Most a single launch may put a bucket in debt (its cost at the current rate is
/// capped there), and so how far ahead of now a sane theoretical arrival time can be:
/// one further ahead (a corrupted region) is treated as now.
pub const MAX_DEBT_NS: u64 = 60_000_000_000;

/// Slot field offsets.
pub mod slot {
    pub const TOKEN: usize = 0;
    pub const FLAGS: usize = 16;
    pub const STARTED_NS: usize = 24;
    /// First of the per-GPU charged counters (u64 each, in GPU-table order).
    pub const CHARGED: usize = 64;
    /// (v2) Offset of GPU `g`'s pool counter in a slot of a region with `gpus` GPUs:
    /// after the charged counters.
    pub const fn pooled(gpus: usize, g: usize) -> usize {
        CHARGED + 8 * gpus + 8 * g
    }
}

/// Most a process keeps reserved ahead of its allocations on one GPU (its pool): small
/// allocations are then charged and returned in the process's own slot, without a
/// compare-and-swap on the claim's shared usage. What a process holds in its pool is
/// unavailable to the claim's other processes, so it is bounded by this and by
/// [`POOL_DIVISOR`] of the budget (allocations larger than the pool are charged
/// exactly).
/// Sixteen of the driver's 2 MiB allocation pages.
pub const POOL_MAX: u64 = 32 << 20;
/// A pool is at most this fraction (1/n) of the GPU's budget: below a 512 MiB budget
/// a pool is smaller than one 2 MiB page, so page-rounded allocations never fit it.
pub const POOL_DIVISOR: u64 = 256;

/// The pool size for a GPU with `budget` bytes.
pub const fn pool_size(budget: u64) -> u64 {
    let p = budget / POOL_DIVISOR;
    if p < POOL_MAX { p } else { POOL_MAX }
}

/// Slot flag: the process took its slot but has made no CUDA call yet.
pub const FLAG_NO_CUDA: u32 = 1;

/// The geometry of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub version: u32,
    pub header_size: usize,
    pub file_size: usize,
    pub gpu_count: usize,
    pub gpu_entry_size: usize,
    pub gpu_table: usize,
    pub slot_count: usize,
    pub slot_size: usize,
    pub slot_table: usize,
    /// (v3) Offset of the slot map ([`hdr::SLOT_MAP`]); 0 = none (older regions).
    pub slot_map: usize,
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

impl Layout {
    /// The geometry this version writes (v3) for `gpus` GPUs and `slots` slots: the
    /// slot map follows the slot table, on a cache line of its own.
    pub fn current(gpus: usize, slots: u32) -> Result<Self, AbiError> {
        let mut l = Self::v1(gpus, slots)?;
        l.version = VERSION;
        l.slot_size = round_up(slot::pooled(gpus, gpus), 64);
        l.slot_map = round_up(l.slot_table + l.slot_count * l.slot_size, 64);
        l.file_size = round_up(l.slot_map + l.slot_map_words() * 8, 4096);
        Ok(l)
    }

    /// Words (u64) of the slot map: one bit per slot.
    pub fn slot_map_words(&self) -> usize {
        self.slot_count.div_ceil(64)
    }

    /// Whether slots carry pool counters (v2 and later).
    pub fn has_pools(&self) -> bool {
        self.version >= 2 && self.slot_size >= slot::pooled(self.gpu_count, self.gpu_count)
    }

    /// The v1 geometry for `gpus` GPUs and `slots` slots; the file size is rounded up
    /// to whole pages.
    pub fn v1(gpus: usize, slots: u32) -> Result<Self, AbiError> {
        if gpus == 0 || gpus > MAX_GPUS || slots == 0 {
            return Err(AbiError::Invalid(format!(
                "a region needs 1 to {MAX_GPUS} GPUs and at least one slot (got {gpus}, {slots})"
            )));
        }
        let gpu_table = HEADER_SIZE;
        let slot_size = round_up(slot::CHARGED + 8 * gpus, 64);
        let slot_table = round_up(gpu_table + gpus * GPU_ENTRY_SIZE, 64);
        let slot_count = slots as usize;
        let file_size = round_up(slot_table + slot_count * slot_size, 4096);
        Ok(Layout {
            version: 1,
            header_size: HEADER_SIZE,
            file_size,
            gpu_count: gpus,
            gpu_entry_size: GPU_ENTRY_SIZE,
            gpu_table,
            slot_count,
            slot_size,
            slot_table,
            slot_map: 0,
        })
    }

    /// Reads and checks the geometry from a region's first bytes (any version ≥ 1).
    pub fn parse(b: &[u8]) -> Result<Self, AbiError> {
        if b.len() < HEADER_SIZE || b[..8] != MAGIC {
            return Err(AbiError::BadMagic);
        }
        let mut l = Layout {
            version: rd_u32(b, hdr::VERSION),
            header_size: rd_u32(b, hdr::HEADER_SIZE) as usize,
            file_size: rd_u64(b, hdr::FILE_SIZE) as usize,
            gpu_count: rd_u32(b, hdr::GPU_COUNT) as usize,
            gpu_entry_size: rd_u32(b, hdr::GPU_ENTRY_SIZE) as usize,
            gpu_table: rd_u32(b, hdr::GPU_TABLE) as usize,
            slot_count: rd_u32(b, hdr::SLOT_COUNT) as usize,
            slot_size: rd_u32(b, hdr::SLOT_SIZE) as usize,
            slot_table: rd_u32(b, hdr::SLOT_TABLE) as usize,
            slot_map: 0,
        };
        if l.version >= 3 && l.header_size >= hdr::SLOT_MAP + 4 {
            l.slot_map = rd_u32(b, hdr::SLOT_MAP) as usize;
        }
        let bad = |s: &str| Err(AbiError::BadLayout(s.to_string()));
        if l.version < 1 {
            return bad("version 0");
        }
        if l.header_size < HEADER_SIZE || l.gpu_entry_size < GPU_ENTRY_SIZE {
            return bad("header or GPU entry smaller than v1");
        }
        if l.gpu_count == 0 || l.gpu_count > MAX_GPUS {
            return bad("GPU count out of range");
        }
        if l.slot_size < slot::CHARGED + 8 * l.gpu_count || l.slot_count == 0 {
            return bad("slot too small for its GPUs");
        }
        if [l.gpu_table, l.slot_table, l.gpu_entry_size, l.slot_size]
            .iter()
            .any(|v| v % 8 != 0)
        {
            return bad("misaligned table");
        }
        let gpu_end = l.gpu_table + l.gpu_count * l.gpu_entry_size;
        let slot_end = l.slot_table + l.slot_count * l.slot_size;
        if l.gpu_table < l.header_size || l.slot_table < gpu_end || slot_end > l.file_size {
            return bad("tables overlap or exceed the file");
        }
        if l.slot_map != 0 {
            let map_end = l.slot_map + 8 * l.slot_map_words();
            let overlaps = |start: usize, end: usize| l.slot_map < end && start < map_end;
            if !l.slot_map.is_multiple_of(8)
                || map_end > l.file_size
                || overlaps(0, l.header_size)
                || overlaps(l.gpu_table, gpu_end)
                || overlaps(l.slot_table, slot_end)
            {
                return bad("slot map misaligned, overlapping a table or beyond the file");
            }
        }
        if b.len() < l.file_size {
            return bad("file shorter than its header says");
        }
        Ok(l)
    }

    pub fn gpu_offset(&self, g: usize) -> usize {
        self.gpu_table + g * self.gpu_entry_size
    }

    pub fn slot_offset(&self, s: usize) -> usize {
        self.slot_table + s * self.slot_size
    }

    /// The byte range a process locks to own slot `s`.
    pub fn slot_lock_range(&self, s: usize) -> (u64, u64) {
        (self.slot_offset(s) as u64, self.slot_size as u64)
    }
}

/// The bytes of a fresh region for these GPU UUIDs (in `limits` order).
pub fn initial_bytes(uuids: &[&str], slots: u32) -> Result<Vec<u8>, AbiError> {
    let l = Layout::current(uuids.len(), slots)?;
    let mut b = vec![0u8; l.file_size];
    b[..8].copy_from_slice(&MAGIC);
    wr_u32(&mut b, hdr::VERSION, l.version);
    wr_u32(&mut b, hdr::HEADER_SIZE, l.header_size as u32);
    wr_u64(&mut b, hdr::FILE_SIZE, l.file_size as u64);
    wr_u32(&mut b, hdr::GPU_COUNT, l.gpu_count as u32);
    wr_u32(&mut b, hdr::GPU_ENTRY_SIZE, l.gpu_entry_size as u32);
    wr_u32(&mut b, hdr::GPU_TABLE, l.gpu_table as u32);
    wr_u32(&mut b, hdr::SLOT_COUNT, l.slot_count as u32);
    wr_u32(&mut b, hdr::SLOT_SIZE, l.slot_size as u32);
    wr_u32(&mut b, hdr::SLOT_TABLE, l.slot_table as u32);
    wr_u32(&mut b, hdr::SLOT_MAP, l.slot_map as u32);
    for (i, u) in uuids.iter().enumerate() {
        let off = l.gpu_offset(i) + gpu::UUID;
        put_uuid(&mut b[off..off + UUID_FIELD], u)?;
        wr_u64(
            &mut b,
            l.gpu_offset(i) + gpu::CONTEXT_BYTES,
            DEFAULT_CONTEXT_BYTES,
        );
    }
    Ok(b)
}

/// One GPU's counters, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuUsage {
    pub uuid: String,
    /// Bytes the claim's processes have allocated: the usage counter less what their
    /// pools hold.
    pub used: u64,
    /// Bytes reserved in pools, ahead of allocations (v2).
    pub pooled: u64,
    pub peak: u64,
    pub refused: u64,
    /// Thread blocks launched (cumulative).
    pub blocks: u64,
    /// Kernels launched (cumulative).
    pub launches: u64,
    /// Nanoseconds spent waiting in the token bucket (cumulative).
    pub waited_ns: u64,
}

/// One GPU's counters, read in place ([`Region::gpu_stats`]): memory, and the launch
/// counters the compute controller turns into rates. Every field is cumulative except
/// `used`; the launch counters are at most a few milliseconds behind the launches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuStats {
    /// Bytes used now.
    pub used: u64,
    /// Peak bytes used.
    pub peak: u64,
    /// Refused allocations.
    pub refused: u64,
    /// Thread blocks launched.
    pub blocks: u64,
    /// Kernels launched (a graph launch counts its kernel nodes).
    pub launches: u64,
    /// Nanoseconds launches spent waiting in the bucket, summed over threads: the
    /// controller's sign that the claim wants more than its rate.
    pub waited_ns: u64,
}

impl GpuUsage {
    /// The counters, as [`Region::gpu_stats`] returns them.
    pub fn stats(&self) -> GpuStats {
        GpuStats {
            used: self.used,
            peak: self.peak,
            refused: self.refused,
            blocks: self.blocks,
            launches: self.launches,
            waited_ns: self.waited_ns,
        }
    }
}

/// Largest region file the plugin reads (a tenant can grow its region, sparse, to
/// any size): 1 MiB, six times the largest region it creates ([`MAX_GPUS`] GPUs,
/// [`DEFAULT_SLOTS`] slots), so that later versions may append fields.
pub const MAX_READ: u64 = 1 << 20;

/// Every GPU's counters from a region file, read as hostile input
/// ([`crate::untrusted::read_bounded`]: no FIFO, no symlink, at most [`MAX_READ`]
/// bytes, with `read(2)` and never through a mapping a tenant could shrink under the
/// reader). The plugin's safe way to read a region it does not trust (see
/// docs/security.md, threat model); [`Region::gpu_stats`] is the in-place reader for
/// mappings.
pub fn read_gpu_stats(path: &std::path::Path) -> Result<Vec<GpuStats>, AbiError> {
    let (_, b) = crate::untrusted::read_bounded(path, MAX_READ)?;
    Ok(Snapshot::parse(&b)?
        .gpus
        .iter()
        .map(GpuUsage::stats)
        .collect())
}

/// One slot, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotInfo {
    pub index: usize,
    pub token: u128,
    pub flags: u32,
    pub started_ns: u64,
    pub charged: Vec<u64>,
}

/// A parsed copy of a region (for the plugin's metrics and for tests). `used` excludes
/// what the processes' pools hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub layout: Layout,
    pub gpus: Vec<GpuUsage>,
    /// Slots with a non-zero token.
    pub slots: Vec<SlotInfo>,
}

impl Snapshot {
    pub fn parse(b: &[u8]) -> Result<Self, AbiError> {
        let l = Layout::parse(b)?;
        let gpus = (0..l.gpu_count)
            .map(|g| {
                let o = l.gpu_offset(g);
                let pooled = if l.has_pools() {
                    (0..l.slot_count)
                        .map(|s| rd_u64(b, l.slot_offset(s) + slot::pooled(l.gpu_count, g)))
                        .fold(0u64, u64::saturating_add)
                } else {
                    0
                };
                GpuUsage {
                    uuid: get_uuid(&b[o + gpu::UUID..o + gpu::UUID + UUID_FIELD]),
                    used: rd_u64(b, o + gpu::USED).saturating_sub(pooled),
                    pooled,
                    peak: rd_u64(b, o + gpu::PEAK),
                    refused: rd_u64(b, o + gpu::REFUSED),
                    blocks: rd_u64(b, o + gpu::BLOCKS),
                    launches: rd_u64(b, o + gpu::LAUNCHES),
                    waited_ns: rd_u64(b, o + gpu::WAITED_NS),
                }
            })
            .collect();
        let slots = (0..l.slot_count)
            .filter_map(|s| {
                let o = l.slot_offset(s);
                let token = u128::from(rd_u64(b, o + slot::TOKEN))
                    | (u128::from(rd_u64(b, o + slot::TOKEN + 8)) << 64);
                (token != 0).then(|| SlotInfo {
                    index: s,
                    token,
                    flags: rd_u32(b, o + slot::FLAGS),
                    started_ns: rd_u64(b, o + slot::STARTED_NS),
                    charged: (0..l.gpu_count)
                        .map(|g| rd_u64(b, o + slot::CHARGED + 8 * g))
                        .collect(),
                })
            })
            .collect();
        Ok(Snapshot {
            layout: l,
            gpus,
            slots,
        })
    }
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The GPU's usage plus the request exceeds the budget.
    OverBudget,
    /// No such GPU or slot index in this region.
    OutOfRange,
    /// The region is mapped read-only.
    ReadOnly,
}

/// A mapped region with the atomic operations the library and the plugin perform.
pub struct Region {
    map: Mapping,
    layout: Layout,
}

impl Region {
    /// Maps an open region file (read-write for the library, read-only for metrics).
    pub fn map(file: &File, writable: bool) -> Result<Self, AbiError> {
        let map = Mapping::new(file, writable)
            .map_err(|e| AbiError::BadLayout(format!("cannot map: {e}")))?;
        let layout = Layout::parse(&map.snapshot()[..])?;
        if layout.file_size > map.len() {
            return Err(AbiError::BadLayout(
                "mapping shorter than the region".into(),
            ));
        }
        Ok(Region { map, layout })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn snapshot(&self) -> Result<Snapshot, AbiError> {
        Snapshot::parse(&self.map.snapshot())
    }

    #[inline]
    fn gpu_field(&self, g: usize, field: usize) -> Option<&std::sync::atomic::AtomicU64> {
        (g < self.layout.gpu_count)
            .then(|| self.map.u64_at(self.layout.gpu_offset(g) + field))
            .flatten()
    }

    #[inline]
    fn pooled(&self, s: usize, g: usize) -> Option<&std::sync::atomic::AtomicU64> {
        (s < self.layout.slot_count && g < self.layout.gpu_count && self.layout.has_pools())
            .then(|| {
                self.map
                    .u64_at(self.layout.slot_offset(s) + slot::pooled(self.layout.gpu_count, g))
            })
            .flatten()
    }

    /// Bytes slot `s` holds in its pool on GPU `g` (0 without pools).
    #[inline]
    pub fn pool(&self, s: usize, g: usize) -> u64 {
        self.pooled(s, g).map_or(0, |p| p.load(Ordering::Relaxed))
    }

    /// The least a CUDA context on GPU `g` is charged ([`gpu::CONTEXT_BYTES`]; 0 for a
    /// region without the field).
    pub fn context_bytes(&self, g: usize) -> u64 {
        if self.layout.version < 2 {
            return 0;
        }
        self.gpu_field(g, gpu::CONTEXT_BYTES)
            .map_or(0, |a| a.load(Ordering::Relaxed))
    }

    /// Bytes reserved on GPU `g` less what the slots' pools hold: what the claim's
    /// processes have really allocated. With a slot map (v3) only the pools of the
    /// slots it marks in use are read (one word per 64 slots, then one load per slot
    /// in use); without one, every slot's (one cache line each, 128 in a region the
    /// plugin makes). The map is tenant-writable like the rest of the region: a bit
    /// cleared by mistake or malice leaves that slot's pool counted as allocated
    /// (less reported free, never more), and nothing that reserves or refuses reads
    /// it.
    pub fn allocated(&self, g: usize) -> Option<u64> {
        let used = self.gpu_used(g)?;
        if !self.layout.has_pools() {
            return Some(used);
        }
        let pooled = match self.slot_map_word(0) {
            Some(_) => {
                let mut sum = 0u64;
                for w in 0..self.layout.slot_map_words() {
                    let mut bits = self
                        .slot_map_word(w)
                        .map_or(0, |a| a.load(Ordering::Acquire));
                    while bits != 0 {
                        let s = w * 64 + bits.trailing_zeros() as usize;
                        bits &= bits - 1;
                        sum = sum.saturating_add(self.pool(s, g));
                    }
                }
                sum
            }
            None => (0..self.layout.slot_count)
                .map(|s| self.pool(s, g))
                .fold(0u64, u64::saturating_add),
        };
        Some(used.saturating_sub(pooled))
    }

    /// Word `w` of the slot map (v3; `None` without one).
    #[inline]
    fn slot_map_word(&self, w: usize) -> Option<&AtomicU64> {
        (self.layout.slot_map != 0 && w < self.layout.slot_map_words())
            .then(|| self.map.u64_at(self.layout.slot_map + 8 * w))
            .flatten()
    }

    /// Marks slot `s` in use (`true`) or free in the slot map (no-op without one).
    fn mark_slot(&self, s: usize, in_use: bool) {
        if s >= self.layout.slot_count {
            return;
        }
        if let Some(w) = self.slot_map_word(s / 64) {
            let bit = 1u64 << (s % 64);
            if in_use {
                w.fetch_or(bit, Ordering::AcqRel);
            } else {
                w.fetch_and(!bit, Ordering::AcqRel);
            }
        }
    }

    /// Whether the slot map marks slot `s` in use (`None` without a slot map).
    pub fn slot_marked(&self, s: usize) -> Option<bool> {
        self.slot_map_word(s / 64)
            .filter(|_| s < self.layout.slot_count)
            .map(|w| w.load(Ordering::Acquire) & (1u64 << (s % 64)) != 0)
    }

    /// Returns to GPU `g`'s total what other slots (every slot but `own`) hold in
    /// their pools, so that a reservation that would otherwise be refused can use
    /// budget no allocation holds. Returns the bytes freed. Safe against the owners:
    /// each pool is emptied with one swap (an owner's `pool_take` then finds it empty
    /// and reserves from the total instead; its `pool_put` refills it), and only what
    /// the slot's charge really held is subtracted from the total (a reclaim of a
    /// dead slot racing with this cannot return the same bytes twice). The slot's
    /// token is read before the swap and again before the subtraction: when it
    /// changed, the slot was reclaimed (and perhaps taken by another process)
    /// meanwhile, the reclaim returned the pool with the rest of the charge, and
    /// nothing is subtracted (a new owner's pool swapped this way stays in its charge
    /// until it exits: over-charged, never under).
    pub fn steal_pools(&self, g: usize, own: usize) -> u64 {
        if !self.map.writable() || !self.layout.has_pools() {
            return 0;
        }
        let Some(used) = self.gpu_field(g, gpu::USED) else {
            return 0;
        };
        let mut freed = 0u64;
        for s in (0..self.layout.slot_count).filter(|&s| s != own) {
            let (Some(p), Some(c)) = (self.pooled(s, g), self.charged(s, g)) else {
                continue;
            };
            if p.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let owner = self.slot_token(s);
            let take = p.swap(0, Ordering::AcqRel);
            if take == 0 || owner == 0 || self.slot_token(s) != owner {
                continue;
            }
            let before = c
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(take))
                })
                .unwrap_or(0);
            let n = before.min(take);
            if n > 0 {
                sat_sub(used, n);
                freed = freed.saturating_add(n);
            }
        }
        freed
    }

    /// Takes `bytes` from slot `s`'s pool on GPU `g` for an allocation: one
    /// compare-and-swap on the process's own slot, nothing shared with the claim's
    /// other processes. The bytes stay in the slot's charge (now as allocated).
    #[inline]
    pub fn pool_take(&self, s: usize, g: usize, bytes: u64) -> bool {
        if !self.map.writable() {
            return false;
        }
        self.pooled(s, g).is_some_and(|p| {
            p.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                v.checked_sub(bytes)
            })
            .is_ok()
        })
    }

    /// Empties slot `s`'s pool on GPU `g` into allocated bytes; returns how many.
    pub fn pool_drain(&self, s: usize, g: usize) -> u64 {
        if !self.map.writable() {
            return 0;
        }
        self.pooled(s, g)
            .map_or(0, |p| p.swap(0, Ordering::Relaxed))
    }

    /// Returns freed `bytes` of slot `s` to its pool on GPU `g`, and what the pool holds
    /// beyond `keep` to the GPU (as [`Region::release`]). Without pools (a v1 region,
    /// `keep` 0) everything goes back to the GPU.
    #[inline]
    pub fn pool_put(&self, s: usize, g: usize, bytes: u64, keep: u64) {
        if !self.map.writable() {
            return;
        }
        let Some(p) = self.pooled(s, g).filter(|_| keep > 0) else {
            self.release(s, g, bytes);
            return;
        };
        if p.fetch_add(bytes, Ordering::Relaxed).saturating_add(bytes) > keep
            && let Ok(old) = p.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                (v > keep).then_some(keep)
            })
        {
            self.release(s, g, old - keep);
        }
    }

    /// Reserves `need` bytes on GPU `g` for slot `s` under `budget`, and `ahead` more
    /// into the slot's pool when they fit too (and the region has pools); refuses only
    /// when `need` alone does not fit. Unlike [`Region::reserve`] a refusal is not
    /// counted ([`Region::count_refusal`]): the caller may still find room elsewhere.
    pub fn reserve_ahead(
        &self,
        s: usize,
        g: usize,
        need: u64,
        ahead: u64,
        budget: u64,
    ) -> Result<(), Refusal> {
        if !self.map.writable() {
            return Err(Refusal::ReadOnly);
        }
        let (Some(used), Some(charged)) = (self.gpu_field(g, gpu::USED), self.charged(s, g)) else {
            return Err(Refusal::OutOfRange);
        };
        let pool = self.pooled(s, g).filter(|_| ahead > 0);
        let mut cur = used.load(Ordering::Relaxed);
        loop {
            let fits = |n: u64| cur.checked_add(n).filter(|&t| t <= budget);
            let (next, extra) = match (
                pool.and_then(|_| fits(need.saturating_add(ahead))),
                fits(need),
            ) {
                (Some(t), _) => (t, ahead),
                (None, Some(t)) => (t, 0),
                (None, None) => return Err(Refusal::OverBudget),
            };
            match used.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    // Charge first, then pool: a process killed between the two has the
                    // bytes in its charge, which its reclaim returns.
                    charged.fetch_add(need + extra, Ordering::Release);
                    if let (Some(p), true) = (pool, extra > 0) {
                        p.fetch_add(extra, Ordering::Relaxed);
                    }
                    if let Some(pk) = self.gpu_field(g, gpu::PEAK)
                        && pk.load(Ordering::Relaxed) < next
                    {
                        pk.fetch_max(next, Ordering::Relaxed);
                    }
                    return Ok(());
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Counts one refused allocation on GPU `g`.
    pub fn count_refusal(&self, g: usize) {
        if self.map.writable()
            && let Some(r) = self.gpu_field(g, gpu::REFUSED)
        {
            r.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[inline]
    fn charged(&self, s: usize, g: usize) -> Option<&std::sync::atomic::AtomicU64> {
        (s < self.layout.slot_count && g < self.layout.gpu_count)
            .then(|| {
                self.map
                    .u64_at(self.layout.slot_offset(s) + slot::CHARGED + 8 * g)
            })
            .flatten()
    }

    /// Bytes reserved on GPU `g`: allocations plus every process's pool (one atomic
    /// load, no copy). The interception library answers memory queries with
    /// [`Region::allocated`] instead, which subtracts every slot's pool (a refusal
    /// would take them back).
    pub fn gpu_used(&self, g: usize) -> Option<u64> {
        self.gpu_field(g, gpu::USED)
            .map(|a| a.load(Ordering::Acquire))
    }

    /// GPU `g`'s counters, read in place with one atomic load each (no copy of the
    /// region; `used` less every slot's pool): works on a read-only mapping (the plugin)
    /// as on a writable one.
    pub fn gpu_stats(&self, g: usize) -> Option<GpuStats> {
        let rd = |f| self.gpu_field(g, f).map(|a| a.load(Ordering::Relaxed));
        let pooled = (0..self.layout.slot_count)
            .map(|s| self.pool(s, g))
            .fold(0u64, u64::saturating_add);
        Some(GpuStats {
            used: rd(gpu::USED)?.saturating_sub(pooled),
            peak: rd(gpu::PEAK)?,
            refused: rd(gpu::REFUSED)?,
            blocks: rd(gpu::BLOCKS)?,
            launches: rd(gpu::LAUNCHES)?,
            waited_ns: rd(gpu::WAITED_NS)?,
        })
    }

    /// GPU `g`'s token bucket and launch counters, for the interception library (a
    /// writable mapping; `None` on a read-only one, whose stores would fault).
    pub fn bucket(&self, g: usize) -> Option<Bucket<'_>> {
        if !self.map.writable() {
            return None;
        }
        Some(Bucket {
            tat: self.gpu_field(g, gpu::TAT)?,
            blocks: self.gpu_field(g, gpu::BLOCKS)?,
            launches: self.gpu_field(g, gpu::LAUNCHES)?,
            waited: self.gpu_field(g, gpu::WAITED_NS)?,
        })
    }

    /// Index of `uuid` in the GPU table.
    pub fn gpu_index(&self, uuid: &str) -> Option<usize> {
        let snap = self.map.snapshot();
        (0..self.layout.gpu_count).find(|&g| {
            let o = self.layout.gpu_offset(g) + gpu::UUID;
            get_uuid(&snap[o..o + UUID_FIELD]) == uuid
        })
    }

    /// Reserves `bytes` on GPU `g` for slot `s` (whose lock the caller holds) under
    /// `budget`: an atomic compare-and-swap on the GPU's usage, so that no interleaving
    /// of processes can exceed the budget; then the slot's charge. Usage is raised
    /// before the slot is charged: a process killed between the two leaks its
    /// reservation (the budget shrinks until the claim ends) rather than letting usage
    /// fall below reality. The peak is read first and only raised on a new maximum
    /// (one shared write instead of two). The slot's charge stays an atomic add: the
    /// owner's threads write it concurrently, and a lost update would let a reclaim
    /// return more than the process held.
    pub fn reserve(&self, s: usize, g: usize, bytes: u64, budget: u64) -> Result<(), Refusal> {
        if !self.map.writable() {
            return Err(Refusal::ReadOnly);
        }
        let (Some(used), Some(charged)) = (self.gpu_field(g, gpu::USED), self.charged(s, g)) else {
            return Err(Refusal::OutOfRange);
        };
        let mut cur = used.load(Ordering::Relaxed);
        loop {
            let next = match cur.checked_add(bytes) {
                Some(n) if n <= budget => n,
                _ => {
                    if let Some(r) = self.gpu_field(g, gpu::REFUSED) {
                        r.fetch_add(1, Ordering::Relaxed);
                    }
                    return Err(Refusal::OverBudget);
                }
            };
            match used.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    charged.fetch_add(bytes, Ordering::Release);
                    if let Some(p) = self.gpu_field(g, gpu::PEAK)
                        && p.load(Ordering::Relaxed) < next
                    {
                        p.fetch_max(next, Ordering::Relaxed);
                    }
                    return Ok(());
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Returns `bytes` charged to slot `s` on GPU `g` (a free, or a rollback after a
    /// failed allocation), by the process that owns the slot. The slot's charge
    /// saturates at zero; the GPU's usage takes one atomic subtract (no retry loop when
    /// processes contend). Usage includes this slot's charge, so the subtract cannot
    /// pass zero unless the region was corrupted; if it does, the value is put back to
    /// what a saturating subtract gives, and meanwhile it reads as huge, which refuses
    /// reservations rather than admitting them.
    #[inline]
    pub fn release(&self, s: usize, g: usize, bytes: u64) {
        if !self.map.writable() {
            return;
        }
        if let Some(c) = self.charged(s, g) {
            sat_sub(c, bytes);
        }
        if let Some(u) = self.gpu_field(g, gpu::USED) {
            let before = u.fetch_sub(bytes, Ordering::AcqRel);
            if before < bytes {
                u.fetch_add(bytes - before, Ordering::AcqRel);
            }
        }
    }

    /// Returns every charge of slot `s` to the GPU totals and frees the slot. Call only
    /// while holding the slot's OFD lock (after finding it unlocked with a token).
    pub fn reclaim_slot(&self, s: usize) -> Vec<u64> {
        if !self.map.writable() {
            return Vec::new();
        }
        let mut returned = Vec::with_capacity(self.layout.gpu_count);
        for g in 0..self.layout.gpu_count {
            let n = self
                .charged(s, g)
                .map_or(0, |c| c.swap(0, Ordering::AcqRel));
            if n > 0
                && let Some(u) = self.gpu_field(g, gpu::USED)
            {
                sat_sub(u, n);
            }
            returned.push(n);
            // The pool is part of the charge just returned.
            if let Some(p) = self.pooled(s, g) {
                p.store(0, Ordering::Relaxed);
            }
        }
        // Only once its pools are empty: a slot the map leaves out must hold none.
        self.mark_slot(s, false);
        let o = self.layout.slot_offset(s);
        for off in [slot::TOKEN, slot::TOKEN + 8, slot::STARTED_NS] {
            if let Some(a) = self.map.u64_at(o + off) {
                a.store(0, Ordering::Release);
            }
        }
        if let Some(f) = self.map.u32_at(o + slot::FLAGS) {
            f.store(0, Ordering::Release);
        }
        returned
    }

    /// Slot `s`'s token (0: free), read with two atomic loads.
    fn slot_token(&self, s: usize) -> u128 {
        let o = self.layout.slot_offset(s);
        let rd = |off| {
            self.map
                .u64_at(o + off)
                .map_or(0, |a| a.load(Ordering::Acquire))
        };
        u128::from(rd(slot::TOKEN)) | (u128::from(rd(slot::TOKEN + 8)) << 64)
    }

    /// Marks slot `s` as owned by `token` (call while holding its lock).
    pub fn occupy_slot(&self, s: usize, token: u128, flags: u32, started_ns: u64) {
        if !self.map.writable() {
            return;
        }
        // Before the slot can hold a pool (its owner fills it after this).
        self.mark_slot(s, true);
        let o = self.layout.slot_offset(s);
        if let (Some(lo), Some(hi), Some(t), Some(f)) = (
            self.map.u64_at(o + slot::TOKEN),
            self.map.u64_at(o + slot::TOKEN + 8),
            self.map.u64_at(o + slot::STARTED_NS),
            self.map.u32_at(o + slot::FLAGS),
        ) {
            t.store(started_ns, Ordering::Relaxed);
            f.store(flags, Ordering::Relaxed);
            hi.store((token >> 64) as u64, Ordering::Relaxed);
            lo.store(token as u64, Ordering::Release);
        }
    }

    /// Clears flag bits of slot `s`.
    pub fn clear_slot_flags(&self, s: usize, bits: u32) {
        if !self.map.writable() {
            return;
        }
        if let Some(f) = self.map.u32_at(self.layout.slot_offset(s) + slot::FLAGS) {
            f.fetch_and(!bits, Ordering::AcqRel);
        }
    }

    /// Finds slots whose token is set but whose lock nobody holds (dead processes),
    /// takes each lock, returns the charges and frees the slot. Returns the indices
    /// reclaimed. `file` must be an open description of the region file other than the
    /// one any live slot lock of this process is held on.
    pub fn reclaim_dead(&self, file: &File) -> std::io::Result<Vec<usize>> {
        let mut out = Vec::new();
        if !self.map.writable() {
            return Ok(out);
        }
        let snap = self.map.snapshot();
        for s in 0..self.layout.slot_count {
            let o = self.layout.slot_offset(s);
            if rd_u64(&snap, o + slot::TOKEN) == 0 && rd_u64(&snap, o + slot::TOKEN + 8) == 0 {
                continue;
            }
            let (start, len) = self.layout.slot_lock_range(s);
            if map::try_lock_range(file, start, len)? {
                self.reclaim_slot(s);
                map::unlock_range(file, start, len)?;
                out.push(s);
            }
        }
        Ok(out)
    }
}

/// What [`Bucket::try_admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Charged: launch now.
    Now,
    /// The bucket is in debt until this time (`CLOCK_MONOTONIC` ns): wait, re-read the
    /// rate, try again.
    Until(u64),
}

/// The time a launch of `blocks` thread blocks costs at `rate` blocks per second, in
/// ns (rounded up; capped at [`MAX_DEBT_NS`]). `rate` must be non-zero.
#[inline]
pub fn cost_ns(blocks: u64, rate: u64) -> u64 {
    let rate = rate.max(1);
    let ns = match blocks.checked_mul(1_000_000_000) {
        Some(n) => n.div_ceil(rate),
        None => (u128::from(blocks) * 1_000_000_000)
            .div_ceil(u128::from(rate))
            .try_into()
            .unwrap_or(u64::MAX),
    };
    ns.min(MAX_DEBT_NS)
}

/// Low bits of the TAT word that carry the rate code (see [`Bucket`]); the time is kept
/// to this many bits' quantum (256 ns).
pub const RATE_CODE_BITS: u32 = 8;
/// The bits of a TAT word that carry its rate code.
pub const CODE_MASK: u64 = (1 << RATE_CODE_BITS) - 1;

/// The rate code stored beside a TAT: eight steps per octave, `8·⌊log₂ r⌋ + the next
/// three bits of r`, so codes are monotonic in the rate (0 for rate 1, 255 from about
/// 4.2·10⁹ blocks/s up).
#[inline]
pub fn rate_code(rate: u64) -> u8 {
    let rate = rate.max(1);
    let e = rate.ilog2();
    let frac = if e >= 3 {
        (rate >> (e - 3)) & 7
    } else {
        (rate << (3 - e)) & 7
    };
    (u64::from(e) * 8 + frac).min(255) as u8
}

/// The largest rate with `code` (rates with a higher code are above it): the bound a
/// debt booked under `code` is rescaled from, so that a rescale never undercharges.
#[inline]
pub fn rate_code_ceiling(code: u8) -> u64 {
    if code == 255 {
        return u64::MAX;
    }
    // The least rate with the next code, minus one: 2^e·(8 + f)/8, rounded up.
    let next = u32::from(code) + 1;
    let (e, m) = (next / 8, 8 + u64::from(next % 8));
    let least = if e >= 3 {
        m << (e - 3)
    } else {
        ((m << e) + 7) >> 3
    };
    least.saturating_sub(1).max(1)
}

/// One (claim, GPU) token bucket in the region, shared by every process of the claim,
/// with the launch counters beside it. A GCRA on one atomic word: the theoretical
/// arrival time (TAT). A launch is admitted when the bucket is not in debt (TAT ≤ now),
/// and moves the TAT to `max(TAT, now − burst) + cost`: after an idle period a claim
/// may run `burst` ahead of its rate, and a kernel bigger than the burst still runs
/// (it puts the bucket in debt, which the next launches wait out). No lock: a process
/// killed at any point leaves the bucket usable.
///
/// The word's low [`RATE_CODE_BITS`] carry the code of the rate the debt was booked at
/// ([`rate_code`]). When the controller raises the rate, a waiting launch rescales the
/// debt to the new rate: without it, launches booked while the rate was briefly low
/// (a claim's first seconds, a bad window on a loaded node) would keep the claim
/// stalled for up to [`MAX_DEBT_NS`] whatever rate the controller set afterwards.
#[derive(Clone, Copy)]
pub struct Bucket<'a> {
    tat: &'a AtomicU64,
    blocks: &'a AtomicU64,
    launches: &'a AtomicU64,
    waited: &'a AtomicU64,
}

/// A TAT word: time `t` rounded to the quantum, with the rate code in the low bits.
/// The rounding is dithered by the low bits of `now` (up with probability
/// remainder/quantum), so that on average a launch is charged its exact cost however
/// small; a clock too coarse to have such bits rounds up, never down.
#[inline]
fn pack(t: u64, now: u64, code: u8) -> u64 {
    let (q, rem) = (t & !CODE_MASK, t & CODE_MASK);
    let q = if rem > (now & CODE_MASK) {
        q.saturating_add(CODE_MASK + 1)
    } else {
        q
    };
    (q & !CODE_MASK) | u64::from(code)
}

impl Bucket<'_> {
    /// Tries to charge a launch of `blocks` thread blocks at `rate` blocks/s (non-zero;
    /// its cost is [`cost_ns`]) at `now` (`CLOCK_MONOTONIC` ns) with tolerance
    /// `burst_ns` (0 = [`DEFAULT_BURST_NS`]). A debt booked at a lower rate is first
    /// rescaled to `rate`. One compare-and-swap when admitted; no system call.
    #[inline]
    pub fn try_admit(&self, now: u64, blocks: u64, rate: u64, burst_ns: u64) -> Admit {
        self.try_admit_after(now, blocks, rate, burst_ns, 0).0
    }

    /// [`Bucket::try_admit`] for a process that remembers `seen`, the TAT word it last
    /// left in this bucket (0 = none): at the same rate code, the stored time counts as
    /// at least `seen`'s, whatever the word now holds. For honest writers the time only
    /// grows at one rate code, so this changes nothing; a tenant who rewrites the word
    /// (zero, a time beyond [`MAX_DEBT_NS`] that reads as corrupt, a low rate code
    /// whose debt rescales to nothing) then buys each process no more than the claim's
    /// rate, and a word that owes less than `seen` is repaired unless it was booked at a
    /// higher rate code. A `seen` beyond any debt ([`MAX_DEBT_NS`]) is ignored. Returns
    /// the verdict and, when admitted, the word this call stored (the one to remember:
    /// a word read back later may already be the tenant's).
    #[inline]
    pub fn try_admit_after(
        &self,
        now: u64,
        blocks: u64,
        rate: u64,
        burst_ns: u64,
        seen: u64,
    ) -> (Admit, u64) {
        let burst = if burst_ns == 0 {
            DEFAULT_BURST_NS
        } else {
            burst_ns
        };
        let rate = rate.max(1);
        let code = rate_code(rate);
        let cost = cost_ns(blocks, rate);
        let floor = now.saturating_sub(burst);
        let mut old = self.tat.load(Ordering::Relaxed);
        loop {
            let (t, booked) = (old & !CODE_MASK, (old & CODE_MASK) as u8);
            // A time further ahead than any launch can put it is a corrupted region.
            let mut t = if t > now.saturating_add(MAX_DEBT_NS) {
                0
            } else {
                t
            };
            if t > now && booked < code {
                // Owed at the old rate's ceiling, paid at the new one (never more).
                let scaled = u128::from(t - now) * u128::from(rate_code_ceiling(booked).min(rate))
                    / u128::from(rate);
                t = now + scaled as u64;
            }
            let seen_t = seen & !CODE_MASK;
            if seen & CODE_MASK == u64::from(code) && seen_t <= now.saturating_add(MAX_DEBT_NS) {
                t = t.max(seen_t);
            }
            let base = t.max(floor);
            let (new, verdict) = if base > now {
                if t == old & !CODE_MASK || booked >= code {
                    return (Admit::Until(base), 0);
                }
                // Store the rescaled debt, so that every waiter sees it.
                (pack(t, now, code), Admit::Until(base))
            } else {
                (pack(base.saturating_add(cost), now, code), Admit::Now)
            };
            match self
                .tat
                .compare_exchange_weak(old, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return (verdict, if verdict == Admit::Now { new } else { 0 }),
                Err(actual) => old = actual,
            }
        }
    }

    /// The theoretical arrival time now stored (ns, to the quantum; without the code).
    pub fn tat(&self) -> u64 {
        self.tat.load(Ordering::Relaxed) & !CODE_MASK
    }

    /// The whole TAT word: time and rate code.
    pub fn word(&self) -> u64 {
        self.tat.load(Ordering::Relaxed)
    }

    /// Adds to the launch counters.
    #[inline]
    pub fn count(&self, blocks: u64, launches: u64) {
        if blocks != 0 {
            self.blocks.fetch_add(blocks, Ordering::Relaxed);
        }
        if launches != 0 {
            self.launches.fetch_add(launches, Ordering::Relaxed);
        }
    }

    /// Adds time spent waiting in the bucket.
    pub fn add_waited(&self, ns: u64) {
        if ns != 0 {
            self.waited.fetch_add(ns, Ordering::Relaxed);
        }
    }
}

fn sat_sub(a: &std::sync::atomic::AtomicU64, n: u64) {
    let _ = a.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::atomic::AtomicU64;

    fn region(dir: &tempfile::TempDir, slots: u32) -> std::path::PathBuf {
        let p = dir.path().join("region");
        File::create(&p)
            .unwrap()
            .write_all(&initial_bytes(&["GPU-a"], slots).unwrap())
            .unwrap();
        p
    }

    /// The owner's fast paths keep the same books as `reserve`/`release`: eight
    /// threads of one process (one slot) and eight of others race reservations and
    /// releases; usage never passes the budget, the peak is the true maximum, and every
    /// release returns exactly what was reserved.
    #[test]
    fn owned_reserve_and_release_never_exceed_and_balance() {
        let dir = tempfile::tempdir().unwrap();
        let p = region(&dir, 4);
        let budget = 16 << 20;
        let max_seen = AtomicU64::new(0);
        let open = || {
            let f = File::options().read(true).write(true).open(&p).unwrap();
            Region::map(&f, true).unwrap()
        };
        let shared = open();
        for s in 0..4 {
            shared.occupy_slot(s, 1 + s as u128, 0, 0);
        }
        std::thread::scope(|sc| {
            for t in 0..16usize {
                let (shared, max_seen) = (&shared, &max_seen);
                let own = open();
                sc.spawn(move || {
                    // Threads 0..8 share slot 0 (one process), the rest use slots 1..4.
                    let (r, s) = if t < 8 {
                        (shared, 0)
                    } else {
                        (&own, 1 + t % 3)
                    };
                    let mut held = Vec::new();
                    for i in 0..4000u64 {
                        let bytes = (1 + (i * 7 + t as u64) % 5) << 20;
                        if r.reserve(s, 0, bytes, budget).is_ok() {
                            held.push(bytes);
                        }
                        let used = r.gpu_used(0).unwrap();
                        assert!(used <= budget, "used {used} > budget {budget}");
                        max_seen.fetch_max(used, Ordering::Relaxed);
                        if held.len() > 3 || (i % 3 == 0 && !held.is_empty()) {
                            r.release(s, 0, held.swap_remove(0));
                        }
                    }
                    for b in held {
                        r.release(s, 0, b);
                    }
                });
            }
        });
        let s = shared.snapshot().unwrap();
        assert_eq!(s.gpus[0].used, 0);
        assert!(s.gpus[0].peak <= budget);
        assert!(s.gpus[0].peak >= max_seen.load(Ordering::Relaxed));
        assert_eq!(s.slots.len(), 4);
        assert!(s.slots.iter().all(|x| x.charged == [0]), "{:?}", s.slots);
        assert!(s.gpus[0].refused > 0, "the budget was never reached");
    }

    /// A release larger than the charge (a corrupted region) saturates at zero.
    #[test]
    fn owned_release_saturates() {
        let dir = tempfile::tempdir().unwrap();
        let p = region(&dir, 2);
        let f = File::options().read(true).write(true).open(&p).unwrap();
        let r = Region::map(&f, true).unwrap();
        r.occupy_slot(0, 7, 0, 0);
        r.reserve(0, 0, 10, 100).unwrap();
        r.release(0, 0, 25);
        let s = r.snapshot().unwrap();
        assert_eq!((s.gpus[0].used, s.gpus[0].peak), (0, 10));
        assert_eq!(s.slots[0].charged, [0]);
        assert_eq!(r.reserve(0, 0, 101, 100), Err(Refusal::OverBudget));
    }

    /// Another process taking back pools while their owners allocate and free from
    /// them keeps the books: the GPU's usage is always the sum of the slots' charges,
    /// never above the budget, and everything is back to zero once the owners free.
    #[test]
    fn stealing_pools_races_owners_without_losing_a_byte() {
        let dir = tempfile::tempdir().unwrap();
        let p = region(&dir, 4);
        let f = File::options().read(true).write(true).open(&p).unwrap();
        let r = Region::map(&f, true).unwrap();
        let budget = 64 << 20;
        let keep = 4 << 20;
        for s in 0..3 {
            r.occupy_slot(s, 1 + s as u128, 0, 0);
        }
        let owners = std::sync::atomic::AtomicU32::new(2);
        std::thread::scope(|sc| {
            for s in 0..2usize {
                let (r, owners) = (&r, &owners);
                sc.spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..20_000u64 {
                        let bytes = (1 + (i + s as u64) % 2) << 20;
                        let ok = r.pool_take(s, 0, bytes)
                            || r.reserve_ahead(s, 0, bytes, keep, budget).is_ok();
                        if ok {
                            held.push(bytes);
                        }
                        if (held.len() > 4 || i % 3 == 0)
                            && let Some(b) = held.pop()
                        {
                            r.pool_put(s, 0, b, keep);
                        }
                    }
                    for b in held {
                        r.pool_put(s, 0, b, keep);
                    }
                    owners.fetch_sub(1, Ordering::Relaxed);
                });
            }
            let (r, owners) = (&r, &owners);
            sc.spawn(move || {
                while owners.load(Ordering::Relaxed) > 0 {
                    r.steal_pools(0, 2);
                    let used = r.gpu_used(0).unwrap();
                    assert!(used <= budget, "used {used} > budget");
                }
            });
        });
        // Whether the loop above raced an owner depends on timing; a pool refilled
        // now is always taken back.
        r.reserve_ahead(0, 0, 1 << 20, keep, budget).unwrap();
        r.pool_put(0, 0, 1 << 20, keep);
        assert!(r.steal_pools(0, 2) >= keep, "a refilled pool is taken back");
        let s = r.snapshot().unwrap();
        let charged: u64 = s.slots.iter().map(|x| x.charged[0]).sum();
        assert_eq!(
            r.gpu_used(0).unwrap(),
            charged,
            "usage is the slots' charges"
        );
        assert_eq!((s.gpus[0].used, s.gpus[0].pooled, charged), (0, 0, 0));
    }
}
