//! Launch counters for the compute controller: blocks and launches go to per-thread,
//! single-writer counters (plain stores, no locked instruction); a flusher thread,
//! started at the process's first counted launch, adds their growth to the region
//! every [`FLUSH_EVERY`]. After a second without launches it polls every
//! [`IDLE_POLL`] only, and launches meanwhile add to the region directly, so the
//! region is never more than ~5 ms behind. (Time spent waiting is added to the region
//! by the throttle, after each slice of waiting.)

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use super::accounting::{self, LaunchPart, State};

/// How often the flusher adds the threads' counters to the regions.
pub const FLUSH_EVERY: Duration = Duration::from_millis(4);
/// How long without launches before the flusher goes idle.
const IDLE_AFTER: u32 = 250;
/// How often an idle flusher looks for launches again.
pub const IDLE_POLL: Duration = Duration::from_millis(100);

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
pub fn count(p: &LaunchPart, blocks: u64, kernels: u64) {
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
