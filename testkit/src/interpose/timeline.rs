//! The simulated GPU's timeline: the ground truth of who used the GPU when.
//!
//! The fake driver (cuda/tests/fakes/fakesim.h) appends one 32-byte record per
//! completed kernel to the log named by `FAKE_CUDA_SIM_LOG`, under the simulator's
//! lock, in completion order; all little-endian:
//!
//! | offset | field      |                                             |
//! |--------|------------|---------------------------------------------|
//! | 0      | u32 gpu    | the device's position in `FAKE_CUDA_DEVICES` |
//! | 4      | u32 pid    | `getpid()` of the launching process          |
//! | 8      | u32 tag    | its `FAKE_SIM_TAG` (0 by default)            |
//! | 12     | u32 pad    | 0                                           |
//! | 16     | u64 start  | CLOCK_MONOTONIC ns                          |
//! | 24     | u64 end    | CLOCK_MONOTONIC ns, exclusive               |
//!
//! On one GPU the intervals never overlap (one kernel at a time). Busy time in a
//! window `[t0, t1)` counts each interval's part inside it, so intervals crossing a
//! window's edges are split. A benchmark's achieved share of claim `c` in a window is
//! `by_tag[c] / gpu_ns` ([`WindowBusy::share`]), never anything NVML reported.
use std::collections::BTreeMap;
use std::path::Path;

/// Bytes per log record.
pub const RECORD: usize = 32;
/// One second in ns.
pub const SECOND: u64 = 1_000_000_000;

/// One kernel's stay on a GPU: `[start, end)` in CLOCK_MONOTONIC ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    pub gpu: u32,
    pub pid: u32,
    pub tag: u32,
    pub start: u64,
    pub end: u64,
}

impl Interval {
    /// The part of the interval inside `[t0, t1)`, in ns.
    pub fn overlap(&self, t0: u64, t1: u64) -> u64 {
        let (a, b) = (self.start.max(t0), self.end.min(t1));
        b.saturating_sub(a)
    }
}

/// Busy time in one window `[t0, t1)` of one GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WindowBusy {
    pub t0: u64,
    pub t1: u64,
    /// The GPU's busy ns (all processes).
    pub gpu_ns: u64,
    /// Busy ns per `FAKE_SIM_TAG`.
    pub by_tag: BTreeMap<u32, u64>,
    /// Busy ns per pid.
    pub by_pid: BTreeMap<u32, u64>,
}

impl WindowBusy {
    /// Tag `tag`'s busy time over the GPU's busy time (0 when the GPU was idle).
    pub fn share(&self, tag: u32) -> f64 {
        if self.gpu_ns == 0 {
            return 0.0;
        }
        self.by_tag.get(&tag).copied().unwrap_or(0) as f64 / self.gpu_ns as f64
    }

    /// The GPU's busy fraction of the window.
    pub fn utilization(&self) -> f64 {
        self.gpu_ns as f64 / (self.t1 - self.t0).max(1) as f64
    }

    /// Busy ns of `tag`.
    pub fn tag_ns(&self, tag: u32) -> u64 {
        self.by_tag.get(&tag).copied().unwrap_or(0)
    }

    /// Busy ns of `pid`.
    pub fn pid_ns(&self, pid: u32) -> u64 {
        self.by_pid.get(&pid).copied().unwrap_or(0)
    }
}

/// A parsed timeline log.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// In log order (completion order).
    pub intervals: Vec<Interval>,
}

impl Timeline {
    /// Parses a log; a trailing partial record (a write in progress) is ignored.
    pub fn parse(bytes: &[u8]) -> Self {
        let u32_at = |r: &[u8], o: usize| u32::from_le_bytes(r[o..o + 4].try_into().expect("4"));
        let u64_at = |r: &[u8], o: usize| u64::from_le_bytes(r[o..o + 8].try_into().expect("8"));
        let intervals = bytes
            .chunks_exact(RECORD)
            .map(|r| Interval {
                gpu: u32_at(r, 0),
                pid: u32_at(r, 4),
                tag: u32_at(r, 8),
                start: u64_at(r, 16),
                end: u64_at(r, 24),
            })
            .collect();
        Timeline { intervals }
    }

    /// Reads and parses the log at `path` (empty if it does not exist yet).
    pub fn read(path: &Path) -> std::io::Result<Self> {
        match std::fs::read(path) {
            Ok(b) => Ok(Self::parse(&b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e),
        }
    }

    /// The intervals of one GPU.
    pub fn on_gpu(&self, gpu: u32) -> impl Iterator<Item = &Interval> + '_ {
        self.intervals.iter().filter(move |i| i.gpu == gpu)
    }

    /// Busy time of GPU `gpu` in each window.
    pub fn windows(&self, gpu: u32, windows: &[(u64, u64)]) -> Vec<WindowBusy> {
        windows
            .iter()
            .map(|&(t0, t1)| {
                let mut w = WindowBusy {
                    t0,
                    t1,
                    ..WindowBusy::default()
                };
                for i in self.on_gpu(gpu) {
                    let d = i.overlap(t0, t1);
                    if d == 0 {
                        continue;
                    }
                    w.gpu_ns += d;
                    *w.by_tag.entry(i.tag).or_default() += d;
                    *w.by_pid.entry(i.pid).or_default() += d;
                }
                w
            })
            .collect()
    }

    /// Busy time of GPU `gpu` in the single window `[t0, t1)`.
    pub fn window(&self, gpu: u32, t0: u64, t1: u64) -> WindowBusy {
        self.windows(gpu, &[(t0, t1)]).remove(0)
    }

    /// Pairs of intervals of one GPU that overlap (there must be none).
    pub fn overlaps(&self, gpu: u32) -> usize {
        let mut v: Vec<&Interval> = self.on_gpu(gpu).collect();
        v.sort_by_key(|i| i.start);
        v.windows(2).filter(|p| p[1].start < p[0].end).count()
    }
}

/// `n` consecutive windows of `len` ns from `start`.
pub fn consecutive(start: u64, len: u64, n: usize) -> Vec<(u64, u64)> {
    (0..n as u64)
        .map(|k| (start + k * len, start + (k + 1) * len))
        .collect()
}

/// CLOCK_MONOTONIC now, in ns: the timeline's clock.
pub fn now_ns() -> u64 {
    testkit_lite::sys::monotonic_ns()
}
