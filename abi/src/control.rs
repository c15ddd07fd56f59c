//! `control`: per-GPU compute settings of a claim, written in place by the plugin and
//! mounted read-only in containers (a rate kept in a tenant-writable file would let the
//! tenant escape throttling). Layout v1, little-endian:
//!
//! * header (64 bytes): magic, version, header size, file size, GPU count, entry size,
//!   and at offset 32 the sequence counter;
//! * one 128-byte entry per GPU (the `limits` order): UUID, compute share `s` (percent),
//!   `computeLimit` (percent, 100 = none), block rate (thread blocks per second, 0 =
//!   unthrottled), the number of controller updates, and the token bucket's tolerance
//!   (`burst_ns`, 0 = the library's default [`DEFAULT_BURST_NS`]).
//!
//! The interception library enforces the block rate with one token bucket per (claim,
//! GPU) kept in the claim's `region` (its `Bucket`); a launch costs its
//! thread blocks (`gridDimX·gridDimY·gridDimZ`).
//!
//! Seqlock: the writer makes the sequence odd, stores the fields, makes it even again;
//! a reader retries until it reads the same even sequence before and after.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering, fence};

use crate::bytes::{get_uuid, put_uuid, rd_u32, rd_u64, wr_u32, wr_u64};
use crate::map::Mapping;
use crate::{AbiError, MAX_GPUS, UUID_FIELD};

pub const MAGIC: [u8; 8] = *b"TSRACTL\0";
pub const VERSION: u32 = 1;
pub const HEADER_SIZE: usize = 64;
pub const ENTRY_SIZE: usize = 128;
/// How many torn reads a reader retries before taking the value as it is.
pub const READ_RETRIES: usize = 10_000;
/// The bucket tolerance the library uses when an entry's `burst_ns` is 0.
pub use crate::DEFAULT_BURST_NS;

pub mod hdr {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const HEADER_SIZE: usize = 12;
    pub const FILE_SIZE: usize = 16;
    pub const GPU_COUNT: usize = 24;
    pub const ENTRY_SIZE: usize = 28;
    pub const SEQ: usize = 32;
}

pub mod entry {
    pub const UUID: usize = 0;
    pub const SHARE: usize = 64;
    pub const LIMIT: usize = 68;
    pub const BLOCK_RATE: usize = 72;
    pub const UPDATES: usize = 80;
    pub const BURST_NS: usize = 88;
}

/// One GPU's compute settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuControl {
    pub uuid: String,
    /// Reserved share in percent (0–100).
    pub share: u32,
    /// Hard cap in percent (100 = none).
    pub compute_limit: u32,
    /// Thread blocks per second the compute controller allows; 0 = unthrottled.
    pub block_rate: u64,
    pub updates: u64,
    /// Token-bucket tolerance in ns (how far a claim may run ahead of its rate after
    /// an idle period); 0 = the library's default, [`DEFAULT_BURST_NS`].
    pub burst_ns: u64,
}

/// File size for `gpus` entries, rounded up to a page.
pub fn file_size(gpus: usize) -> usize {
    (HEADER_SIZE + gpus * ENTRY_SIZE).div_ceil(4096) * 4096
}

/// The bytes of a fresh control file.
pub fn initial_bytes(gpus: &[GpuControl]) -> Result<Vec<u8>, AbiError> {
    if gpus.is_empty() || gpus.len() > MAX_GPUS {
        return Err(AbiError::Invalid("1 to 64 GPUs per control file".into()));
    }
    let size = file_size(gpus.len());
    let mut b = vec![0u8; size];
    b[..8].copy_from_slice(&MAGIC);
    wr_u32(&mut b, hdr::VERSION, VERSION);
    wr_u32(&mut b, hdr::HEADER_SIZE, HEADER_SIZE as u32);
    wr_u64(&mut b, hdr::FILE_SIZE, size as u64);
    wr_u32(&mut b, hdr::GPU_COUNT, gpus.len() as u32);
    wr_u32(&mut b, hdr::ENTRY_SIZE, ENTRY_SIZE as u32);
    for (i, g) in gpus.iter().enumerate() {
        if g.share > 100 || g.compute_limit == 0 || g.compute_limit > 100 {
            return Err(AbiError::Invalid(format!(
                "share {} / computeLimit {} out of range",
                g.share, g.compute_limit
            )));
        }
        let o = HEADER_SIZE + i * ENTRY_SIZE;
        put_uuid(&mut b[o..o + UUID_FIELD], &g.uuid)?;
        wr_u32(&mut b, o + entry::SHARE, g.share);
        wr_u32(&mut b, o + entry::LIMIT, g.compute_limit);
        wr_u64(&mut b, o + entry::BLOCK_RATE, g.block_rate);
        wr_u64(&mut b, o + entry::UPDATES, g.updates);
        wr_u64(&mut b, o + entry::BURST_NS, g.burst_ns);
    }
    Ok(b)
}

/// Geometry read from a control file's header: (GPU count, header size, entry size).
fn geometry(b: &[u8]) -> Result<(usize, usize, usize), AbiError> {
    if b.len() < HEADER_SIZE || b[..8] != MAGIC {
        return Err(AbiError::BadMagic);
    }
    let (v, hs, n, es) = (
        rd_u32(b, hdr::VERSION),
        rd_u32(b, hdr::HEADER_SIZE) as usize,
        rd_u32(b, hdr::GPU_COUNT) as usize,
        rd_u32(b, hdr::ENTRY_SIZE) as usize,
    );
    if v < 1 || hs < HEADER_SIZE || es < ENTRY_SIZE || es % 8 != 0 || hs % 8 != 0 {
        return Err(AbiError::BadLayout("control header".into()));
    }
    if n == 0 || n > MAX_GPUS || hs + n * es > b.len() {
        return Err(AbiError::BadLayout("control GPU table".into()));
    }
    Ok((n, hs, es))
}

/// Parses a control file's bytes (no seqlock: for files nobody is writing).
pub fn parse(b: &[u8]) -> Result<Vec<GpuControl>, AbiError> {
    let (n, hs, es) = geometry(b)?;
    Ok((0..n)
        .map(|i| {
            let o = hs + i * es;
            GpuControl {
                uuid: get_uuid(&b[o..o + UUID_FIELD]),
                share: rd_u32(b, o + entry::SHARE),
                compute_limit: rd_u32(b, o + entry::LIMIT),
                block_rate: rd_u64(b, o + entry::BLOCK_RATE),
                updates: rd_u64(b, o + entry::UPDATES),
                burst_ns: rd_u64(b, o + entry::BURST_NS),
            }
        })
        .collect())
}

/// A mapped control file.
pub struct Control {
    map: Mapping,
    gpus: usize,
    header_size: usize,
    entry_size: usize,
}

impl Control {
    pub fn map(file: &std::fs::File, writable: bool) -> Result<Self, AbiError> {
        let map = Mapping::new(file, writable)
            .map_err(|e| AbiError::BadLayout(format!("cannot map: {e}")))?;
        let (gpus, header_size, entry_size) = geometry(&map.snapshot())?;
        Ok(Control {
            map,
            gpus,
            header_size,
            entry_size,
        })
    }

    fn at64(&self, g: usize, f: usize) -> Option<&AtomicU64> {
        (g < self.gpus)
            .then(|| self.map.u64_at(self.header_size + g * self.entry_size + f))
            .flatten()
    }

    /// GPU `g`'s block rate and bucket tolerance, `(block_rate, burst_ns)` as stored
    /// (`burst_ns` 0 = [`DEFAULT_BURST_NS`]), read consistently under the sequence
    /// counter. A writer that died mid-update leaves the sequence odd; readers then
    /// stop retrying after [`READ_RETRIES`] and take the values as they are (the plugin
    /// repairs the sequence under its node lock at start-up: [`Control::repair_sequence`]).
    pub fn rate(&self, g: usize) -> Option<(u64, u64)> {
        self.cells(g)?.read(READ_RETRIES)
    }

    /// GPU `g`'s block rate (thread blocks per second, 0 = unthrottled); see
    /// [`Control::rate`].
    pub fn block_rate(&self, g: usize) -> Option<u64> {
        self.rate(g).map(|r| r.0)
    }

    /// GPU `g`'s bucket tolerance in ns as stored (0 = [`DEFAULT_BURST_NS`]); see
    /// [`Control::rate`].
    pub fn burst_ns(&self, g: usize) -> Option<u64> {
        self.rate(g).map(|r| r.1)
    }

    /// The atomics of GPU `g`'s rate, for a reader on a hot path (the interception
    /// library): borrowed from the mapping, no copy.
    pub fn cells(&self, g: usize) -> Option<RateCells<'_>> {
        Some(RateCells {
            seq: self.map.u64_at(hdr::SEQ)?,
            rate: self.at64(g, entry::BLOCK_RATE)?,
            burst: self.at64(g, entry::BURST_NS)?,
        })
    }

    /// Index of `uuid` in the GPU table.
    pub fn gpu_index(&self, uuid: &str) -> Option<usize> {
        let snap = self.map.snapshot();
        (0..self.gpus).find(|&g| {
            let o = self.header_size + g * self.entry_size + entry::UUID;
            get_uuid(&snap[o..o + UUID_FIELD]) == uuid
        })
    }

    /// Number of GPU entries.
    pub fn gpu_count(&self) -> usize {
        self.gpus
    }

    /// Makes an odd sequence (a writer killed mid-update) even again. Call only while
    /// no writer can run: the plugin does it at start-up under its node lock.
    pub fn repair_sequence(&self) -> Result<bool, AbiError> {
        if !self.map.writable() {
            return Err(AbiError::Invalid("control mapped read-only".into()));
        }
        let seq = self
            .map
            .u64_at(hdr::SEQ)
            .ok_or_else(|| AbiError::BadLayout("no sequence".into()))?;
        let odd = seq.load(Ordering::Acquire) % 2 == 1;
        if odd {
            seq.fetch_add(1, Ordering::AcqRel);
        }
        Ok(odd)
    }

    /// Sets GPU `g`'s block rate (thread blocks per second, 0 = unthrottled) and bucket
    /// tolerance (`burst_ns`, 0 = the library's default) and counts an update: the
    /// plugin's compute controller, on a writable mapping. The sequence counter
    /// brackets the stores, so a reader never sees the rate of one update with the
    /// tolerance of another. The library applies a new rate at the next launch (and a
    /// launch waiting in the bucket re-reads it).
    pub fn set_rate(&self, g: usize, block_rate: u64, burst_ns: u64) -> Result<(), AbiError> {
        if !self.map.writable() {
            return Err(AbiError::Invalid("control mapped read-only".into()));
        }
        let (Some(seq), Some(r), Some(b), Some(u)) = (
            self.map.u64_at(hdr::SEQ),
            self.at64(g, entry::BLOCK_RATE),
            self.at64(g, entry::BURST_NS),
            self.at64(g, entry::UPDATES),
        ) else {
            return Err(AbiError::Invalid(format!("no GPU {g}")));
        };
        seq.fetch_add(1, Ordering::AcqRel);
        fence(Ordering::Release);
        r.store(block_rate, Ordering::Relaxed);
        b.store(burst_ns, Ordering::Relaxed);
        u.fetch_add(1, Ordering::Relaxed);
        seq.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// A consistent copy of all entries.
    /// Bounded like [`Control::rate`]: after [`READ_RETRIES`] torn reads the
    /// last copy is parsed as it is.
    pub fn read(&self) -> Result<Vec<GpuControl>, AbiError> {
        let seq = self
            .map
            .u64_at(hdr::SEQ)
            .ok_or_else(|| AbiError::BadLayout("no sequence".into()))?;
        for _ in 0..READ_RETRIES {
            let s1 = seq.load(Ordering::Acquire);
            if s1 % 2 == 0 {
                let snap = self.map.snapshot();
                fence(Ordering::Acquire);
                if seq.load(Ordering::Relaxed) == s1 {
                    return parse(&snap);
                }
            }
            std::hint::spin_loop();
        }
        parse(&self.map.snapshot())
    }
}

/// The atomics behind one GPU's rate in a mapped control file (see [`Control::cells`]).
#[derive(Clone, Copy)]
pub struct RateCells<'a> {
    seq: &'a AtomicU64,
    rate: &'a AtomicU64,
    burst: &'a AtomicU64,
}

impl RateCells<'_> {
    /// The block rate alone: one load (a single aligned word is never torn, so no
    /// sequence check is needed). 0 = unthrottled.
    #[inline]
    pub fn block_rate(&self) -> u64 {
        self.rate.load(Ordering::Acquire)
    }

    /// `(block_rate, burst_ns)` from one update, retrying up to `retries` torn reads;
    /// after that (a writer killed mid-update) the values as they are. `None` never
    /// happens today; it keeps the signature of [`Control::rate`].
    #[inline]
    pub fn read(&self, retries: usize) -> Option<(u64, u64)> {
        let mut v = (
            self.rate.load(Ordering::Relaxed),
            self.burst.load(Ordering::Relaxed),
        );
        for _ in 0..retries.max(1) {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            v = (
                self.rate.load(Ordering::Relaxed),
                self.burst.load(Ordering::Relaxed),
            );
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return Some(v);
            }
        }
        Some(v)
    }
}
