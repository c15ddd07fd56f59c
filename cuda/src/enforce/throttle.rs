//! Compute rates: every kernel launch is charged to its claim's token bucket on the
//! launch's GPU, and counted for the compute controller (`launch_counters`).
//!
//! * **Unit.** A launch costs its thread blocks (`gridDimX·gridDimY·gridDimZ`); a graph
//!   launch costs the blocks of its kernel nodes, summed once at instantiation (by the
//!   graph hooks) and remembered per executable graph here ([`set_graph_work`]).
//! * **Bucket.** One per (claim, GPU), in the claim's region, shared by every process
//!   of the claim ([`tessera_abi::region::Bucket`]: a GCRA on one atomic word). The rate
//!   and tolerance come from the claim's read-only `control` file, read at every
//!   launch, so a new rate applies at the next launch; a launch that waits sleeps in
//!   slices of at most [`WAIT_SLICE_NS`] and re-reads the rate after each.
//! * **Fast paths.** With rate 0 (or no claim) a launch costs a few loads and two plain
//!   stores to this thread's counters. A throttled launch that finds tokens reads
//!   `CLOCK_MONOTONIC` (vDSO: no system call) and makes one compare-and-swap on the
//!   bucket. Neither makes a system call.
//! * **Device.** A launch goes to the current context's device. When every CUDA
//!   ordinal the process sees maps to the same budgeted GPU (or to none), that is
//!   decided once; otherwise each launch asks the driver (`cuCtxGetDevice`).
//!   `cuLaunchCooperativeKernelMultiDevice` charges each entry to its stream's device.
//!   The driver is asked through [`LaunchDevices`], which the hooks implement: this
//!   module calls no driver function itself.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use tessera_abi::region::Admit;

use super::accounting::{self, LaunchPart, State};
use super::forklock::ForkLock;
use super::launch_counters::count;
use super::ptr_hasher::PtrHasher;
use crate::ffi::CUdevice;

/// Longest single sleep of a waiting launch: the rate is re-read and the time waited
/// published after each.
pub const WAIT_SLICE_NS: u64 = 4_000_000;
/// Torn reads of a rate retried before taking it as it is (a writer killed mid-update).
const RATE_RETRIES: usize = 16;

/// What the launch path asks the driver: which devices there are, which one is
/// current, and a device's UUID. Implemented by the hooks, which call the driver.
pub trait LaunchDevices {
    /// How many devices the driver has (`cuDeviceGetCount`); `None` when it cannot
    /// say (before `cuInit`).
    fn count(&self) -> Option<i32>;
    /// The current context's device (`cuCtxGetDevice`).
    fn current(&self) -> Option<CUdevice>;
    /// The `GPU-…` UUID of CUDA ordinal `dev`.
    fn uuid(&self, dev: CUdevice) -> Option<String>;
}

/// `CLOCK_MONOTONIC` in ns (the vDSO: no system call).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Thread blocks of a grid, saturating.
#[inline]
pub fn grid_blocks(x: u32, y: u32, z: u32) -> u64 {
    u64::from(x)
        .saturating_mul(u64::from(y))
        .saturating_mul(u64::from(z))
}

// ---- which GPU a launch goes to -------------------------------------------------

const ROUTE_UNKNOWN: u32 = 0;
const ROUTE_NONE: u32 = 1;
const ROUTE_PER_CALL: u32 = u32::MAX;
/// 0: not decided; 1: no launch is charged; 2 + g: always merged GPU g; MAX: ask per
/// launch.
static ROUTE: AtomicU32 = AtomicU32::new(ROUTE_UNKNOWN);
/// The merged GPU ordinal `dev` is budgeted as, if any (unknown UUID: not charged).
fn gpu_of(st: &State, devices: &impl LaunchDevices, dev: CUdevice) -> Option<usize> {
    st.gpu_for(dev, |d| devices.uuid(d)).ok().flatten()
}

/// Decides the route once the driver can list its devices.
#[cold]
fn decide_route(st: &State, devices: &impl LaunchDevices) -> u32 {
    let Some(n) = devices.count().filter(|&n| n > 0) else {
        return ROUTE_PER_CALL; // not initialised yet: ask per launch, decide later
    };
    let mut seen: Option<Option<usize>> = None;
    for d in 0..n {
        let g = gpu_of(st, devices, d);
        match seen {
            None => seen = Some(g),
            Some(s) if s == g => {}
            Some(_) => {
                ROUTE.store(ROUTE_PER_CALL, Ordering::Relaxed);
                return ROUTE_PER_CALL;
            }
        }
    }
    let r = match seen.flatten() {
        Some(g) if st.launch.get(g).is_some_and(|p| !p.is_empty()) => 2 + g as u32,
        _ => ROUTE_NONE,
    };
    ROUTE.store(r, Ordering::Relaxed);
    r
}

/// The merged GPU of a launch on the current context (or on `dev`).
#[inline]
fn route(st: &State, devices: &impl LaunchDevices, dev: Option<CUdevice>) -> Option<usize> {
    if let Some(d) = dev {
        return gpu_of(st, devices, d);
    }
    let mut r = ROUTE.load(Ordering::Relaxed);
    if r == ROUTE_UNKNOWN {
        r = decide_route(st, devices);
    }
    match r {
        ROUTE_NONE => None,
        ROUTE_PER_CALL => devices.current().and_then(|d| gpu_of(st, devices, d)),
        g => Some((g - 2) as usize),
    }
}

// ---- charging -----------------------------------------------------------------

/// Charges a launch of `blocks` thread blocks (`kernels` kernels) on the current
/// context's device, or on `dev`: returns once the claim's bucket admits it. The
/// driver is asked about devices through `devices`.
#[inline]
pub fn launch(devices: &impl LaunchDevices, blocks: u64, kernels: u64, dev: Option<CUdevice>) {
    let st = accounting::state();
    if st.launch.is_empty() {
        return;
    }
    let Some(parts) = route(st, devices, dev).and_then(|g| st.launch.get(g)) else {
        return;
    };
    if let [p] = parts.as_slice() {
        let rate = p.rate.map_or(0, |r| r.block_rate());
        if rate == 0 {
            count(p, blocks, kernels);
            return;
        }
    }
    charge(parts, blocks, kernels);
}

/// The throttled path: the first part (claim) that is unthrottled or whose bucket
/// admits the launch takes it; otherwise sleep until the earliest bucket frees up (in
/// slices of [`WAIT_SLICE_NS`]), re-read the rates, try again.
fn charge(parts: &[LaunchPart], blocks: u64, kernels: u64) {
    if parts.is_empty() {
        return;
    }
    loop {
        let now = now_ns();
        let mut until = u64::MAX;
        for p in parts {
            let (rate, burst) = p.rate.and_then(|r| r.read(RATE_RETRIES)).unwrap_or((0, 0));
            if rate == 0 {
                count(p, blocks, kernels);
                return;
            }
            // The bucket as this process last left it bounds what a rewritten word
            // can grant (the region is the tenant's to write); remember the word this
            // admission stored, never one read back (it may be the tenant's by then).
            let seen = p.seen.load(Ordering::Relaxed);
            match p.bucket.try_admit_after(now, blocks, rate, burst, seen) {
                (Admit::Now, word) => {
                    p.seen.store(word, Ordering::Relaxed);
                    count(p, blocks, kernels);
                    return;
                }
                (Admit::Until(t), _) => until = until.min(t),
            }
        }
        let nap = until.saturating_sub(now).clamp(1, WAIT_SLICE_NS);
        sleep_ns(nap);
        let waited = now_ns().saturating_sub(now);
        for p in parts {
            p.bucket.add_waited(waited);
        }
    }
}

fn sleep_ns(ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: a valid timespec; an interrupted sleep is simply retried by the caller.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}
// ---- graphs -------------------------------------------------------------------

/// What one launch of a graph runs: the blocks of its kernel nodes, and how many.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Work {
    pub blocks: u64,
    pub kernels: u64,
}

type WorkMap = HashMap<u64, Work, BuildHasherDefault<PtrHasher>>;
/// Per executable graph (`CUgraphExec`): its work, from instantiation to destruction.
static GRAPH_WORK: ForkLock<Option<WorkMap>> = ForkLock::new(None);
/// Set once a graph with kernels is remembered: until then launches take no lock.
static ANY_GRAPH_WORK: AtomicBool = AtomicBool::new(false);
/// Remembers what executable graph `exec` runs per launch.
pub fn set_graph_work(exec: u64, w: Work) {
    if let Ok(mut t) = GRAPH_WORK.lock() {
        let t = t.get_or_insert_with(WorkMap::default);
        if w.kernels == 0 {
            t.remove(&exec);
        } else {
            t.insert(exec, w);
            ANY_GRAPH_WORK.store(true, Ordering::Release);
        }
    }
}

/// What one launch of `exec` runs (nothing if it has no kernel nodes).
pub fn graph_work_of(exec: u64) -> Option<Work> {
    if !ANY_GRAPH_WORK.load(Ordering::Acquire) {
        return None;
    }
    GRAPH_WORK
        .lock()
        .ok()
        .and_then(|t| t.as_ref().and_then(|t| t.get(&exec).copied()))
}

/// Forgets `exec` (destroyed).
pub fn drop_graph_work(exec: u64) {
    if let Ok(mut t) = GRAPH_WORK.lock()
        && let Some(t) = t.as_mut()
    {
        t.remove(&exec);
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn grids_multiply_and_saturate() {
        assert_eq!(grid_blocks(2, 3, 4), 24);
        assert_eq!(grid_blocks(0, 3, 4), 0);
        assert_eq!(
            grid_blocks(u32::MAX, u32::MAX, u32::MAX),
            u64::MAX,
            "saturates"
        );
    }

    #[test]
    fn graph_work_is_remembered_per_exec_until_destroyed() {
        set_graph_work(
            0x1000,
            Work {
                blocks: 500,
                kernels: 50,
            },
        );
        set_graph_work(0x2000, Work::default());
        assert_eq!(
            graph_work_of(0x1000),
            Some(Work {
                blocks: 500,
                kernels: 50
            })
        );
        assert_eq!(graph_work_of(0x2000), None);
        drop_graph_work(0x1000);
        assert_eq!(graph_work_of(0x1000), None);
    }

    #[test]
    fn the_clock_is_monotonic_ns() {
        let a = now_ns();
        std::thread::sleep(Duration::from_millis(2));
        let b = now_ns();
        assert!(b - a >= 2_000_000 && b - a < 2_000_000_000, "{a} {b}");
    }
}
