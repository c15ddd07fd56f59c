//! Compute rates: every kernel launch is charged to its claim's token bucket on the
//! launch's GPU, and counted for the compute controller.
//!
//! * **Unit.** A launch costs its thread blocks (`gridDimX·gridDimY·gridDimZ`); a graph
//!   launch costs the blocks of its kernel nodes, summed once at instantiation
//!   ([`graph_work`]) and remembered per executable graph.
//! * **Bucket.** One per (claim, GPU), in the claim's region, shared by every process
//!   of the claim ([`tessera_abi::region::Bucket`]: a GCRA on one atomic word). The rate
//!   and tolerance come from the claim's read-only `control` file, read at every
//!   launch, so a new rate applies at the next launch; a launch that waits sleeps in
//!   slices of at most [`WAIT_SLICE_NS`] and re-reads the rate after each.
//! * **Fast paths.** With rate 0 (or no claim) a launch costs a few loads and two plain
//!   stores to this thread's counters. A throttled launch that finds tokens reads
//!   `CLOCK_MONOTONIC` (vDSO: no system call) and makes one compare-and-swap on the
//!   bucket. Neither makes a system call.
//! * **Counters.** Blocks and launches go to per-thread, single-writer counters (plain
//!   stores, no locked instruction); a flusher thread, started at the process's first
//!   counted launch, adds their growth to the region every [`FLUSH_EVERY`]. After a
//!   second without launches it polls every [`IDLE_POLL`] only, and launches meanwhile
//!   add to the region directly, so the region is never more than ~5 ms behind. Time
//!   spent waiting is added to the region after each slice of waiting.
//! * **Device.** A launch goes to the current context's device. When every CUDA
//!   ordinal the process sees maps to the same budgeted GPU (or to none), that is
//!   decided once; otherwise each launch asks the driver (`cuCtxGetDevice`).
//!   `cuLaunchCooperativeKernelMultiDevice` charges each entry to its stream's device.

use crate::forklock::ForkLock;
use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tessera_abi::control::RateCells;
use tessera_abi::region::{Admit, Bucket, cost_ns};

use crate::accounting::{self, Claim, PtrHasher, State};
use crate::budget::MergedGpu;
use crate::ffi::*;
use crate::interpose::{DriverFn, as_fn, driver};

/// Longest single sleep of a waiting launch: the rate is re-read and the time waited
/// published after each.
pub const WAIT_SLICE_NS: u64 = 4_000_000;
/// How often the flusher adds the threads' counters to the regions.
pub const FLUSH_EVERY: Duration = Duration::from_millis(4);
/// How long without launches before the flusher goes idle.
const IDLE_AFTER: u32 = 250;
/// How often an idle flusher looks for launches again.
pub const IDLE_POLL: Duration = Duration::from_millis(100);
/// Torn reads of a rate retried before taking it as it is (a writer killed mid-update).
const RATE_RETRIES: usize = 16;

/// One (claim, GPU) bucket a launch on a merged GPU can be charged to.
pub struct LaunchPart {
    pub bucket: Bucket<'static>,
    /// `None`: the claim's control file is unreadable; unthrottled.
    pub rate: Option<RateCells<'static>>,
    /// Index among all parts of the process (per-thread counters are indexed by it).
    pub index: usize,
}

/// The launch buckets of each merged GPU (same order as `gpus`): the claims' regions
/// and control files, in claim-UID order.
pub fn parts(claims: &[Claim], gpus: &[MergedGpu]) -> Vec<Vec<LaunchPart>> {
    let mut index = 0;
    gpus.iter()
        .map(|g| {
            g.parts
                .iter()
                .filter_map(|p| {
                    let c = claims.get(p.claim)?;
                    let bucket = c.region.bucket(p.gpu)?;
                    let rate = c
                        .control
                        .and_then(|ctl| ctl.gpu_index(&g.uuid).and_then(|i| ctl.cells(i)));
                    let part = LaunchPart {
                        bucket,
                        rate,
                        index,
                    };
                    index += 1;
                    Some(part)
                })
                .collect()
        })
        .collect()
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

pub(crate) fn device_count() -> Option<i32> {
    let p = driver(DriverFn::DeviceGetCount);
    if p == 0 {
        return None;
    }
    let mut n: i32 = 0;
    // SAFETY: cuDeviceGetCount(int*).
    let f: unsafe extern "C" fn(*mut i32) -> CUresult = unsafe { as_fn(p) };
    // SAFETY: valid out pointer.
    (unsafe { f(&mut n) } == CUDA_SUCCESS).then_some(n)
}

/// The merged GPU ordinal `dev` is budgeted as, if any (unknown UUID: not charged).
fn gpu_of(st: &State, dev: CUdevice) -> Option<usize> {
    st.gpu_for(dev, crate::interpose::cuda_uuid).ok().flatten()
}

/// Decides the route once the driver can list its devices.
#[cold]
fn decide_route(st: &State) -> u32 {
    let Some(n) = device_count().filter(|&n| n > 0) else {
        return ROUTE_PER_CALL; // not initialised yet: ask per launch, decide later
    };
    let mut seen: Option<Option<usize>> = None;
    for d in 0..n {
        let g = gpu_of(st, d);
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
fn route(st: &State, dev: Option<CUdevice>) -> Option<usize> {
    if let Some(d) = dev {
        return gpu_of(st, d);
    }
    let mut r = ROUTE.load(Ordering::Relaxed);
    if r == ROUTE_UNKNOWN {
        r = decide_route(st);
    }
    match r {
        ROUTE_NONE => None,
        ROUTE_PER_CALL => crate::interpose::current_device()
            .ok()
            .and_then(|d| gpu_of(st, d)),
        g => Some((g - 2) as usize),
    }
}

/// The device a stream belongs to: `cuStreamGetDevice` (12.8), else the stream's
/// context's device; else the current device.
pub fn stream_device(stream: u64) -> Option<CUdevice> {
    let stream = stream as usize as CUstream;
    let mut dev: CUdevice = -1;
    let p = driver(DriverFn::StreamGetDevice);
    if p != 0 {
        // SAFETY: cuStreamGetDevice(CUstream, CUdevice*).
        let f: unsafe extern "C" fn(CUstream, *mut CUdevice) -> CUresult = unsafe { as_fn(p) };
        // SAFETY: valid out pointer; the caller's stream.
        if unsafe { f(stream, &mut dev) } == CUDA_SUCCESS {
            return Some(dev);
        }
    }
    let g = driver(DriverFn::StreamGetCtx);
    if g != 0 {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: cuStreamGetCtx(CUstream, CUcontext*).
        let f: unsafe extern "C" fn(CUstream, *mut CUcontext) -> CUresult = unsafe { as_fn(g) };
        // SAFETY: valid out pointer.
        if unsafe { f(stream, &mut ctx) } == CUDA_SUCCESS && !ctx.is_null() {
            let v2 = driver(DriverFn::CtxGetDeviceV2);
            if v2 != 0 {
                // SAFETY: cuCtxGetDevice_v2(CUdevice*, CUcontext).
                let f: unsafe extern "C" fn(*mut CUdevice, CUcontext) -> CUresult =
                    unsafe { as_fn(v2) };
                // SAFETY: valid out pointer and context.
                if unsafe { f(&mut dev, ctx) } == CUDA_SUCCESS {
                    return Some(dev);
                }
            }
            let (push, pop) = (
                driver(DriverFn::CtxPushCurrentV2),
                driver(DriverFn::CtxPopCurrentV2),
            );
            if push != 0 && pop != 0 {
                // SAFETY: cuCtxPushCurrent_v2(CUcontext), cuCtxPopCurrent_v2(CUcontext*).
                let (push, pop): (
                    unsafe extern "C" fn(CUcontext) -> CUresult,
                    unsafe extern "C" fn(*mut CUcontext) -> CUresult,
                ) = unsafe { (as_fn(push), as_fn(pop)) };
                // SAFETY: the stream's own context, popped right after.
                if unsafe { push(ctx) } == CUDA_SUCCESS {
                    let d = crate::interpose::current_device().ok();
                    let mut out: CUcontext = std::ptr::null_mut();
                    // SAFETY: valid out pointer.
                    unsafe { pop(&mut out) };
                    if d.is_some() {
                        return d;
                    }
                }
            }
        }
    }
    crate::interpose::current_device().ok()
}

// ---- charging -----------------------------------------------------------------

/// Charges a launch of `blocks` thread blocks (`kernels` kernels) on the current
/// context's device, or on `dev`: returns once the claim's bucket admits it.
#[inline]
pub fn launch(blocks: u64, kernels: u64, dev: Option<CUdevice>) {
    let st = accounting::state();
    if st.launch.is_empty() {
        return;
    }
    let Some(parts) = route(st, dev).and_then(|g| st.launch.get(g)) else {
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
            match p.bucket.try_admit(now, cost_ns(blocks, rate), burst) {
                Admit::Now => {
                    count(p, blocks, kernels);
                    return;
                }
                Admit::Until(t) => until = until.min(t),
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

// ---- counters -----------------------------------------------------------------

/// Threads with counters of their own; later threads add to the region directly.
const THREAD_SLOTS: usize = 256;
/// Parts (claim × GPU) with per-thread counters; further parts count directly.
const PARTS_PER_THREAD: usize = 8;
/// How far a thread looks for a free slot from its hash.
const SLOT_PROBE: usize = 16;

/// One thread's launch counters: written only by the thread whose key tags the slot
/// (plain load and store, no locked instruction), read by the flusher. Counters are
/// cumulative per slot whoever owns it, so a slot passes from a dead thread to a new
/// one without any bookkeeping.
#[repr(C, align(64))]
struct ThreadCounters {
    /// Per part: [blocks, launches], side by side (one cache line per launch).
    parts: [[AtomicU64; 2]; PARTS_PER_THREAD],
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO_COUNTERS: ThreadCounters = ThreadCounters {
    parts: [const { [const { AtomicU64::new(0) }; 2] }; PARTS_PER_THREAD],
};

static COUNTERS: [ThreadCounters; THREAD_SLOTS] = [ZERO_COUNTERS; THREAD_SLOTS];
/// The key of the thread that writes each slot (0 = free).
static TAGS: [AtomicUsize; THREAD_SLOTS] = [const { AtomicUsize::new(0) }; THREAD_SLOTS];
/// What the flusher has already added to the regions, per slot and part (global so
/// that a forked child's flusher continues from its parent's books).
static FLUSHED: [[[AtomicU64; 2]; PARTS_PER_THREAD]; THREAD_SLOTS] =
    [const { [const { [const { AtomicU64::new(0) }; 2] }; PARTS_PER_THREAD] }; THREAD_SLOTS];

/// Launches add to the region directly (no flusher, or an idle one).
static DIRECT: AtomicBool = AtomicBool::new(false);
/// A launch counted directly since the flusher last looked.
static DIRECT_USED: AtomicBool = AtomicBool::new(false);
static FLUSHER_STARTED: AtomicBool = AtomicBool::new(false);

/// This thread's key: its thread pointer (`%fs:0`, the TCB's address, unique among
/// live threads; a dead thread's TCB may be reused by a new thread, which then simply
/// continues its slot). One load: no `__tls_get_addr` call, no destructor to register.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn thread_key() -> usize {
    let tp: usize;
    // SAFETY: on x86-64 Linux %fs:0 holds the thread control block's own address
    // (glibc and musl); reading it has no side effect.
    unsafe {
        core::arch::asm!(
            "mov {}, qword ptr fs:[0]",
            out(reg) tp,
            options(nostack, readonly, preserves_flags, pure)
        );
    }
    tp
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn thread_key() -> usize {
    // SAFETY: no preconditions.
    unsafe { libc::pthread_self() as usize }
}

#[inline(always)]
fn slot_hash(key: usize) -> usize {
    ((key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % THREAD_SLOTS
}

/// Adds a launch to this thread's counters (or to the region directly).
#[inline]
fn count(p: &LaunchPart, blocks: u64, kernels: u64) {
    if p.index < PARTS_PER_THREAD && !DIRECT.load(Ordering::Relaxed) {
        let key = thread_key();
        let mut s = slot_hash(key);
        if TAGS[s].load(Ordering::Relaxed) != key {
            s = register(key);
        }
        if let Some(c) = COUNTERS.get(s) {
            let [b, l] = &c.parts[p.index];
            b.store(
                b.load(Ordering::Relaxed).wrapping_add(blocks),
                Ordering::Relaxed,
            );
            l.store(
                l.load(Ordering::Relaxed).wrapping_add(kernels),
                Ordering::Relaxed,
            );
            return;
        }
    }
    p.bucket.count(blocks, kernels);
    if !DIRECT_USED.load(Ordering::Relaxed) {
        DIRECT_USED.store(true, Ordering::Relaxed);
    }
}

/// A thread's launch finds no slot tagged with its key at its hash: the slot it took
/// further along (a few loads), or a free one (and the process's flusher if it has
/// none yet). `THREAD_SLOTS` (none) when every slot of its probe window is taken.
#[cold]
#[inline(never)]
fn register(key: usize) -> usize {
    let h = slot_hash(key);
    let window = || (0..SLOT_PROBE).map(move |i| (h + i) % THREAD_SLOTS);
    if let Some(s) = window().find(|&s| TAGS[s].load(Ordering::Relaxed) == key) {
        return s;
    }
    start_flusher();
    for s in window() {
        match TAGS[s].load(Ordering::Acquire) {
            k if k == key => return s,
            0 if TAGS[s]
                .compare_exchange(0, key, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok() =>
            {
                return s;
            }
            _ => {}
        }
    }
    THREAD_SLOTS
}

/// A forked child has no flusher and only the forking thread: every slot is untagged,
/// so that thread registers again (starting the child's flusher) at its next launch;
/// and what the slots hold counts as flushed (the parent flushes its own launches).
extern "C" fn after_fork_in_child() {
    FLUSHER_STARTED.store(false, Ordering::Relaxed);
    DIRECT.store(false, Ordering::Relaxed);
    FLUSHING.store(false, Ordering::Relaxed);
    for ((t, c), f) in TAGS.iter().zip(COUNTERS.iter()).zip(FLUSHED.iter()) {
        t.store(0, Ordering::Relaxed);
        for (cp, fp) in c.parts.iter().zip(f.iter()) {
            for (cv, fv) in cp.iter().zip(fp.iter()) {
                fv.store(cv.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
    }
}

fn start_flusher() {
    static ATFORK: std::sync::Once = std::sync::Once::new();
    ATFORK.call_once(|| {
        // SAFETY: registering a handler that only stores to atomics.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
    if FLUSHER_STARTED.load(Ordering::Relaxed) || FLUSHER_STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    // Once per process: a forked child inherits the registration.
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: registers a function of the library; glibc runs it at exit (the
        // library is preloaded and never unloaded).
        unsafe { libc::atexit(flush_at_exit) };
    });
    let spawned = std::thread::Builder::new()
        .name("tessera-flush".into())
        .stack_size(64 << 10)
        .spawn(flusher);
    if spawned.is_err() {
        // No flusher: every launch adds to the region itself.
        DIRECT.store(true, Ordering::Relaxed);
    }
}

fn flusher() {
    let mut quiet = 0u32;
    loop {
        let idle = DIRECT.load(Ordering::Relaxed);
        std::thread::sleep(if idle { IDLE_POLL } else { FLUSH_EVERY });
        let moved = flush();
        if idle {
            if DIRECT_USED.swap(false, Ordering::Relaxed) || moved {
                quiet = 0;
                DIRECT.store(false, Ordering::Relaxed);
            }
        } else if moved {
            quiet = 0;
        } else {
            quiet += 1;
            if quiet >= IDLE_AFTER {
                DIRECT_USED.store(false, Ordering::Relaxed);
                DIRECT.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// At exit (`exit`): the last counts reach the region. A
/// process killed outright loses at most [`FLUSH_EVERY`] of them. Registered when the
/// flusher first starts (not in `.fini_array`), so that a process that never launches
/// has nothing of the library's to run, or page in, at exit. It therefore runs before
/// the exit handlers registered earlier (C++ destructors of statics made before the
/// first launch among them): launches made by those handlers are not flushed, as for a
/// process killed outright.
extern "C" fn flush_at_exit() {
    if FLUSHER_STARTED.load(Ordering::Relaxed) {
        flush();
    }
}

/// One flush at a time (the flusher, and exit): a flag rather than a mutex, so that a
/// forked child can reset it.
static FLUSHING: AtomicBool = AtomicBool::new(false);

/// Adds what every thread counted since the last flush to the regions; whether
/// anything moved.
pub fn flush() -> bool {
    let Some(st) = accounting::loaded_state() else {
        return false;
    };
    while FLUSHING.swap(true, Ordering::Acquire) {
        std::thread::yield_now();
    }
    let moved = flush_locked(st);
    FLUSHING.store(false, Ordering::Release);
    moved
}

fn flush_locked(st: &State) -> bool {
    let mut moved = false;
    for gpu in &st.launch {
        for p in gpu {
            let Some(i) = (p.index < PARTS_PER_THREAD).then_some(p.index) else {
                continue;
            };
            let (mut blocks, mut launches) = (0u64, 0u64);
            // Only slots a thread took (a slot keeps its tag after its thread exits).
            for ((c, f), _) in COUNTERS
                .iter()
                .zip(FLUSHED.iter())
                .zip(TAGS.iter())
                .filter(|(_, t)| t.load(Ordering::Relaxed) != 0)
            {
                let (b, l) = (
                    c.parts[i][0].load(Ordering::Relaxed),
                    c.parts[i][1].load(Ordering::Relaxed),
                );
                // Only the flusher writes FLUSHED: plain loads and stores.
                let (fb, fl) = (&f[i][0], &f[i][1]);
                let (ob, ol) = (fb.load(Ordering::Relaxed), fl.load(Ordering::Relaxed));
                if b != ob {
                    blocks = blocks.wrapping_add(b.wrapping_sub(ob));
                    fb.store(b, Ordering::Relaxed);
                }
                if l != ol {
                    launches = launches.wrapping_add(l.wrapping_sub(ol));
                    fl.store(l, Ordering::Relaxed);
                }
            }
            if blocks != 0 || launches != 0 {
                p.bucket.count(blocks, launches);
                moved = true;
            }
        }
    }
    moved
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

/// `CU_GRAPH_NODE_TYPE_KERNEL` and `_GRAPH` (a child graph).
const NODE_KERNEL: i32 = 0;
const NODE_CHILD_GRAPH: i32 = 4;
/// Child graphs nest at most this deep before the walk stops.
const MAX_GRAPH_DEPTH: u32 = 8;
/// `CUDA_KERNEL_NODE_PARAMS(_v2)`: gridDimX, Y, Z after the function handle.
const KERNEL_NODE_GRID: usize = 8;

/// Sums the kernel nodes of `graph` (child graphs included) with
/// `cuGraphGetNodes`/`cuGraphNodeGetType`/`cuGraphKernelNodeGetParams(_v2)`. Works for
/// stream-captured graphs too. Without those driver functions the graph costs nothing.
pub fn graph_work(graph: *mut c_void) -> Work {
    let mut w = Work::default();
    walk(graph, 0, &mut w);
    w
}

fn walk(graph: *mut c_void, depth: u32, w: &mut Work) {
    let (gn, gt) = (
        driver(DriverFn::GraphGetNodes),
        driver(DriverFn::GraphNodeGetType),
    );
    if gn == 0 || gt == 0 || graph.is_null() {
        return;
    }
    type GetNodes = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut usize) -> CUresult;
    type GetType = unsafe extern "C" fn(*mut c_void, *mut i32) -> CUresult;
    // SAFETY: cuGraphGetNodes(CUgraph, CUgraphNode*, size_t*), cuGraphNodeGetType(CUgraphNode, CUgraphNodeType*).
    let (get_nodes, get_type): (GetNodes, GetType) = unsafe { (as_fn(gn), as_fn(gt)) };
    let mut n: usize = 0;
    // SAFETY: a NULL node array asks for the count.
    if unsafe { get_nodes(graph, std::ptr::null_mut(), &mut n) } != CUDA_SUCCESS || n == 0 {
        return;
    }
    let mut nodes: Vec<*mut c_void> = vec![std::ptr::null_mut(); n];
    // SAFETY: room for n nodes; the driver writes back how many it wrote.
    if unsafe { get_nodes(graph, nodes.as_mut_ptr(), &mut n) } != CUDA_SUCCESS {
        return;
    }
    nodes.truncate(n);
    for node in nodes {
        let mut ty: i32 = -1;
        // SAFETY: a node of this graph; valid out pointer.
        if unsafe { get_type(node, &mut ty) } != CUDA_SUCCESS {
            continue;
        }
        match ty {
            NODE_KERNEL => {
                if let Some(b) = kernel_node_blocks(node) {
                    w.blocks = w.blocks.saturating_add(b);
                    w.kernels += 1;
                }
            }
            NODE_CHILD_GRAPH if depth < MAX_GRAPH_DEPTH => {
                let p = driver(DriverFn::GraphChildGraphNodeGetGraph);
                if p == 0 {
                    continue;
                }
                let mut child: *mut c_void = std::ptr::null_mut();
                // SAFETY: cuGraphChildGraphNodeGetGraph(CUgraphNode, CUgraph*).
                let f: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> CUresult =
                    unsafe { as_fn(p) };
                // SAFETY: valid out pointer.
                if unsafe { f(node, &mut child) } == CUDA_SUCCESS {
                    walk(child, depth + 1, w);
                }
            }
            _ => {}
        }
    }
}

/// A kernel node's thread blocks, from `cuGraphKernelNodeGetParams_v2` (72-byte
/// params) or the v1 call (56 bytes): both put the grid at the same offsets.
fn kernel_node_blocks(node: *mut c_void) -> Option<u64> {
    for f in [
        DriverFn::GraphKernelNodeGetParamsV2,
        DriverFn::GraphKernelNodeGetParams,
    ] {
        let p = driver(f);
        if p == 0 {
            continue;
        }
        // Larger than either params struct, zeroed.
        let mut buf = [0u64; 32];
        // SAFETY: cuGraphKernelNodeGetParams(_v2)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS(_v2)*).
        let g: unsafe extern "C" fn(*mut c_void, *mut u8) -> CUresult = unsafe { as_fn(p) };
        // SAFETY: the buffer is larger than the params the driver writes.
        if unsafe { g(node, buf.as_mut_ptr().cast()) } == CUDA_SUCCESS {
            // Little-endian u32s at bytes 8, 12, 16: words 1 (low, high) and 2 (low).
            let w = |o: usize| buf[o / 8] >> (8 * (o % 8)) & 0xffff_ffff;
            return Some(grid_blocks(
                w(KERNEL_NODE_GRID) as u32,
                w(KERNEL_NODE_GRID + 4) as u32,
                w(KERNEL_NODE_GRID + 8) as u32,
            ));
        }
    }
    None
}

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
