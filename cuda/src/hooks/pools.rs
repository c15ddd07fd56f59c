//! Stream-ordered memory: async allocations charged at what their pool retains.
#![allow(non_snake_case)]

use super::*;
use crate::enforce::forklock::{ForkGuard, ForkLock};

type AllocAsyncFn = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;
type AllocPoolFn =
    unsafe extern "C" fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;
type FreeAsyncFn = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;

/// The pool `cuMemAllocAsync` draws from on `dev`.
fn current_pool(dev: CUdevice) -> Option<CUmemoryPool> {
    let p = driver(DriverFn::DeviceGetMemPool);
    let p = if p == 0 {
        driver(DriverFn::DeviceGetDefaultMemPool)
    } else {
        p
    };
    if p == 0 {
        return None;
    }
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: cuDeviceGetMemPool(CUmemoryPool*, CUdevice).
    let f: unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult = unsafe { as_fn(p) };
    // SAFETY: valid out pointer.
    (unsafe { f(&mut pool, dev) } == CUDA_SUCCESS && !pool.is_null()).then_some(pool)
}

/// The memory a pool holds from the device (`RESERVED_MEM_CURRENT`).
fn pool_reserved(pool: CUmemoryPool) -> Option<u64> {
    pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
}

/// A u64 attribute of a pool.
fn pool_attribute(pool: CUmemoryPool, attr: c_int) -> Option<u64> {
    let p = driver(DriverFn::MemPoolGetAttribute);
    if p == 0 {
        return None;
    }
    let mut v: u64 = 0;
    // SAFETY: cuMemPoolGetAttribute(CUmemoryPool, attr, void*) with a u64 attribute.
    let f: unsafe extern "C" fn(CUmemoryPool, c_int, *mut c_void) -> CUresult = unsafe { as_fn(p) };
    // SAFETY: valid out pointer of the attribute's type.
    let rc = unsafe { f(pool, attr, (&mut v as *mut u64).cast()) };
    (rc == CUDA_SUCCESS).then_some(v)
}

/// What an allocation of `size` makes the pool grow by at least: its pages beyond
/// what the pool holds unused (`RESERVED_MEM_CURRENT` - `USED_MEM_CURRENT`); the whole
/// allocation when the pool cannot say.
fn least_growth(pool: CUmemoryPool, size: usize) -> u64 {
    let need = sizes::linear(size as u64);
    match (
        pool_reserved(pool),
        pool_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
    ) {
        (Some(r), Some(u)) => need.saturating_sub(r.saturating_sub(u)),
        _ => need,
    }
}

/// Gives back what a pool grew beyond its charge: waits for `stream` (where the
/// refused allocation was just freed) and trims the pool to the bytes it is charged,
/// then re-reads it.
fn trim_to_charge(st: &State, pool: CUmemoryPool, stream: CUstream) {
    let _ = sync_stream(stream);
    let keep = allocations::peek(Kind::Pool, pool as u64).map_or(0, |e| e.charge.bytes);
    let t = real(Hook::cuMemPoolTrimTo);
    if t != 0 {
        // SAFETY: cuMemPoolTrimTo(CUmemoryPool, size_t).
        let f: unsafe extern "C" fn(CUmemoryPool, usize) -> CUresult = unsafe { as_fn(t) };
        // SAFETY: the caller's pool.
        unsafe { f(pool, keep as usize) };
    }
    if !settle_pool(st, pool, None) {
        stderr::log(format_args!(
            "a memory pool grew past the budget and could not be trimmed back"
        ));
    }
}

/// Brings a pool's charge to what it retains now. The pool's charge lives on one
/// claim (the first that had room when the pool was first charged); `pending` is a
/// reservation made for the call that just ran and is folded in. Returns false when
/// the pool grew beyond what the budget allows.
fn settle_pool(st: &State, pool: CUmemoryPool, pending: Option<Charge>) -> bool {
    settle_retained(st, Kind::Pool, pool as u64, pending, || pool_reserved(pool))
}

/// Stripes of locks serializing the settling of each retaining allocator: two
/// threads settling one pool would otherwise both take its charge out and put a
/// full one back (one charge leaked), and a settle racing `cuMemPoolDestroy` could
/// record the destroyed pool again.
const SETTLE_STRIPES: usize = 16;
static SETTLING: [ForkLock<()>; SETTLE_STRIPES] = [const { ForkLock::new(()) }; SETTLE_STRIPES];

/// The lock serializing the settling of (`kind`, `key`) (shared with other keys of
/// the same stripe); `None` in a forked child that inherited it held.
fn settling(kind: Kind, key: u64) -> Option<ForkGuard<'static, ()>> {
    let h = (key ^ ((kind as u64) << 56)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60;
    SETTLING[h as usize % SETTLE_STRIPES].lock().ok()
}

/// Brings the charge of a retaining allocator (`kind`, `key`) to what `reserved`
/// reports it holds now, folding in a `pending` reservation; false when it grew
/// beyond what the budget allows (the charge then stays at what could be reserved).
/// Serialized per allocator.
pub(super) fn settle_retained(
    st: &State,
    kind: Kind,
    key: u64,
    pending: Option<Charge>,
    reserved: impl FnOnce() -> Option<u64>,
) -> bool {
    let Some(_guard) = settling(kind, key) else {
        if let Some(p) = pending {
            st.release(p);
        }
        return true;
    };
    settle_locked(st, kind, key, pending, reserved)
}

/// [`settle_retained`] with the allocator's settling lock held.
fn settle_locked(
    st: &State,
    kind: Kind,
    key: u64,
    pending: Option<Charge>,
    reserved: impl FnOnce() -> Option<u64>,
) -> bool {
    let old = allocations::forget(kind, key).map(|e| e.charge);
    let mut held: Option<Charge> = match (old, pending) {
        (Some(o), Some(p)) if (o.claim, o.gpu) == (p.claim, p.gpu) => Some(Charge {
            bytes: o.bytes.saturating_add(p.bytes),
            ..o
        }),
        (Some(o), Some(p)) => {
            // Different claims: keep the pool's, fold the new one in by moving it.
            st.release(p);
            if st.reserve_on(o, p.bytes).is_ok() {
                Some(Charge {
                    bytes: o.bytes.saturating_add(p.bytes),
                    ..o
                })
            } else {
                Some(o)
            }
        }
        (o, p) => o.or(p),
    };
    let Some(c) = held.take() else {
        return true;
    };
    let target = reserved().unwrap_or(c.bytes);
    let (kept, ok) = match resize(st, c, target) {
        Ok(c) => (c, true),
        Err(c) => (c, false),
    };
    if kept.bytes > 0 {
        allocations::record(
            kind,
            key,
            Entry {
                charge: kept,
                scrub_bytes: 0,
                owner: 0,
            },
        );
    } else {
        st.release(kept);
    }
    ok
}

/// Common path of the four stream-ordered allocation hooks. The growth the pool
/// must make at least (the allocation's pages beyond the pool's unused memory) is
/// reserved first; the charge then follows what the pool retains. When the pool grew
/// by more than the budget holds, the allocation is freed, the pool trimmed back to
/// its charge, and the call refused.
fn alloc_from_pool(
    pool: Option<CUmemoryPool>,
    size: usize,
    stream: CUstream,
    call: impl FnOnce() -> CUresult,
    free: impl FnOnce(),
) -> CUresult {
    let st = accounting::state();
    if !st.active() {
        return call();
    }
    let dev = match current_device() {
        Ok(d) => d,
        Err(rc) => return rc,
    };
    let Some(pool) = pool.or_else(|| current_pool(dev)) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let g = match gpu_of(st, Some(dev), "cuMemAllocAsync") {
        Ok(Some(g)) => g,
        Ok(None) => return call(),
        Err(rc) => return rc,
    };
    let grow = least_growth(pool, size);
    let pending = if grow > 0 {
        match reserve_or_resettle(st, g, grow) {
            Ok(c) => Some(c),
            Err(r) => return refused_code(st, r, "cuMemAllocAsync"),
        }
    } else {
        None
    };
    let rc = call();
    if rc != CUDA_SUCCESS {
        if let Some(c) = pending {
            st.release(c);
        }
        let _ = settle_pool(st, pool, None);
        return rc;
    }
    if settle_pool(st, pool, pending) {
        remember_async(st, g, pool, size);
        rc
    } else {
        free();
        trim_to_charge(st, pool, stream);
        CUDA_ERROR_OUT_OF_MEMORY
    }
}

/// Set once a stream-ordered allocation was charged: until then a stream-ordered
/// free looks nothing up.
static ASYNC_TRACKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A pool destroyed while pointers from it were live: the driver keeps its memory
/// until the last of them is freed, so its charge stays until then.
struct DeadPool {
    pool: u64,
    charge: Charge,
    /// Its pointers not yet freed.
    live: usize,
}

/// Destroyed pools still holding memory (few: a pool destroyed with live pointers).
static DEAD_POOLS: ForkLock<Vec<DeadPool>> = ForkLock::new(Vec::new());
/// Whether [`DEAD_POOLS`] may be non-empty: until then a free looks nothing up.
static ANY_DEAD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

thread_local! {
    /// The pointer the stream-ordered allocation being settled returned (set by the
    /// hook after the driver call, read by [`remember_async`]).
    static LAST_ASYNC: std::cell::Cell<CUdeviceptr> = const { std::cell::Cell::new(0) };
}

/// Remembers a charged stream-ordered allocation: its pool, and its size for
/// scrubbing its free when the GPU's claim scrubs (the first claim of the merged GPU
/// decides).
fn remember_async(st: &State, g: usize, pool: CUmemoryPool, size: usize) {
    let Some(part) = st.gpus.get(g).and_then(|x| x.parts.first()) else {
        return;
    };
    let c = Charge {
        claim: part.claim as u16,
        gpu: part.gpu as u16,
        bytes: 0,
    };
    let ptr = LAST_ASYNC.with(|p| p.get());
    if ptr == 0 {
        return;
    }
    ASYNC_TRACKED.store(true, std::sync::atomic::Ordering::Relaxed);
    allocations::record(
        Kind::Async,
        ptr,
        Entry {
            charge: c,
            scrub_bytes: if st.scrubs(c) { size as u64 } else { 0 },
            owner: pool as u64,
        },
    );
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    alloc_async(
        Hook::cuMemAllocAsync,
        Hook::cuMemFreeAsync,
        dptr,
        size,
        stream,
    )
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    alloc_async(
        Hook::cuMemAllocAsync_ptsz,
        Hook::cuMemFreeAsync_ptsz,
        dptr,
        size,
        stream,
    )
}

fn alloc_async(
    h: Hook,
    free_h: Hook,
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    let (p, fp) = (real(h), real(free_h));
    if p == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    // SAFETY: the driver's function of this variant.
    let f: AllocAsyncFn = unsafe { as_fn(p) };
    let per_thread = h == Hook::cuMemAllocAsync_ptsz;
    alloc_from_pool(
        None,
        size,
        stream_of(stream, per_thread),
        || {
            // SAFETY: forwarding the caller's arguments.
            let rc = unsafe { f(dptr, size, stream) };
            note_async(rc, dptr);
            rc
        },
        || {
            if fp != 0 {
                // SAFETY: freeing what was just allocated, on the same stream.
                let free: FreeAsyncFn = unsafe { as_fn(fp) };
                // SAFETY: as above.
                unsafe { free(*dptr, stream) };
            }
        },
    )
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    alloc_pool(
        Hook::cuMemAllocFromPoolAsync,
        Hook::cuMemFreeAsync,
        dptr,
        size,
        pool,
        stream,
    )
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    alloc_pool(
        Hook::cuMemAllocFromPoolAsync_ptsz,
        Hook::cuMemFreeAsync_ptsz,
        dptr,
        size,
        pool,
        stream,
    )
}

fn alloc_pool(
    h: Hook,
    free_h: Hook,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let (p, fp) = (real(h), real(free_h));
    if p == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    // SAFETY: the driver's function of this variant.
    let f: AllocPoolFn = unsafe { as_fn(p) };
    let per_thread = h == Hook::cuMemAllocFromPoolAsync_ptsz;
    alloc_from_pool(
        Some(pool),
        size,
        stream_of(stream, per_thread),
        || {
            // SAFETY: forwarding the caller's arguments.
            let rc = unsafe { f(dptr, size, pool, stream) };
            note_async(rc, dptr);
            rc
        },
        || {
            if fp != 0 {
                // SAFETY: freeing what was just allocated, on the same stream.
                let free: FreeAsyncFn = unsafe { as_fn(fp) };
                // SAFETY: as above.
                unsafe { free(*dptr, stream) };
            }
        },
    )
}

/// Records the pointer a stream-ordered allocation returned, for [`remember_async`].
fn note_async(rc: CUresult, dptr: *mut CUdeviceptr) {
    let p = if rc == CUDA_SUCCESS && !dptr.is_null() {
        // SAFETY: on success the driver wrote *dptr.
        unsafe { *dptr }
    } else {
        0
    };
    LAST_ASYNC.with(|c| c.set(p));
}

/// Returns memory to its pool, then recharges every charged pool at what it
/// retains (a free can let the pool release memory past its threshold). Memory of a
/// scrubbing claim is first zeroed on the same stream (`cuMemsetD8Async`, ordered
/// before the free).
///
/// The last pointer of a destroyed pool returns the pool's charge, once the free has
/// run (the stream is synchronised first: the driver frees the memory only then).
fn free_async(h: Hook, ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    let per_thread = h == Hook::cuMemFreeAsync_ptsz;
    let taken = if ASYNC_TRACKED.load(std::sync::atomic::Ordering::Relaxed) {
        allocations::forget(Kind::Async, ptr)
    } else {
        None
    };
    if let Some(e) = taken
        && e.scrub_bytes > 0
    {
        scrub_async(per_thread, ptr, e.scrub_bytes, stream);
    }
    let rc = call_real!(h, FreeAsyncFn, ptr, stream);
    if let Some(e) = taken {
        if rc != CUDA_SUCCESS {
            allocations::record(Kind::Async, ptr, e);
        } else if ANY_DEAD.load(std::sync::atomic::Ordering::Acquire) {
            dead_pool_pointer_freed(e.owner, stream_of(stream, per_thread));
        }
    }
    resettle_pools();
    rc
}

/// One pointer of pool `pool` was freed: when it was a destroyed pool's last, waits
/// for `stream` (where the free runs) and returns the pool's charge.
fn dead_pool_pointer_freed(pool: u64, stream: CUstream) {
    let done = DEAD_POOLS.lock().ok().and_then(|mut v| {
        let i = v.iter().position(|d| d.pool == pool)?;
        v[i].live = v[i].live.saturating_sub(1);
        if v[i].live > 0 {
            return None;
        }
        let d = v.swap_remove(i);
        if v.is_empty() {
            ANY_DEAD.store(false, std::sync::atomic::Ordering::Release);
        }
        Some(d.charge)
    });
    if let Some(c) = done {
        let _ = sync_stream(stream);
        accounting::state().release(c);
    }
}

/// Queues the zeroing of `bytes` at `ptr` on `stream`, before its free; a failure is
/// logged.
fn scrub_async(per_thread: bool, ptr: CUdeviceptr, bytes: u64, stream: CUstream) {
    let m = driver(if per_thread {
        DriverFn::MemsetD8AsyncPtsz
    } else {
        DriverFn::MemsetD8Async
    });
    let rc = if m == 0 {
        CUDA_ERROR_NOT_FOUND
    } else {
        // SAFETY: cuMemsetD8Async(CUdeviceptr, unsigned char, size_t, CUstream).
        let f: unsafe extern "C" fn(CUdeviceptr, u8, usize, CUstream) -> CUresult =
            unsafe { as_fn(m) };
        // SAFETY: the allocation being freed, on the caller's stream.
        unsafe { f(ptr, 0, bytes as usize, stream) }
    };
    if rc != CUDA_SUCCESS {
        stderr::log(format_args!(
            "cuMemFreeAsync: scrubbing {bytes} bytes failed with CUDA error {rc}; freed unscrubbed"
        ));
    }
}

pub(super) fn resettle_pools() {
    let st = accounting::state();
    if !st.active() || !allocations::any_pool() {
        return;
    }
    for pool in allocations::keys(Kind::Pool) {
        let _ = settle_pool(st, pool as CUmemoryPool, None);
    }
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    free_async(Hook::cuMemFreeAsync, ptr, stream)
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    free_async(Hook::cuMemFreeAsync_ptsz, ptr, stream)
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult {
    let rc = call_real!(
        Hook::cuMemPoolTrimTo,
        unsafe extern "C" fn(CUmemoryPool, usize) -> CUresult,
        pool,
        keep
    );
    let st = accounting::state();
    if st.active() {
        let _ = settle_pool(st, pool, None);
    }
    rc
}

/// A destroyed pool gives back what it holds unused at once, and the rest only when
/// its last pointer is freed (the driver returns at once and keeps that memory until
/// then). So before destroying a charged pool the library waits for the context's
/// work (frees queued on streams complete), trims the pool to nothing and reads what
/// it still reserves: that much stays charged until the last pointer the library
/// knows from it is freed, or, when it knows none (pointers freed past the library),
/// for the process's life.
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    type DestroyFn = unsafe extern "C" fn(CUmemoryPool) -> CUresult;
    let st = accounting::state();
    let charged = st.active() && allocations::peek(Kind::Pool, pool as u64).is_some();
    if !charged {
        return call_real!(Hook::cuMemPoolDestroy, DestroyFn, pool);
    }
    // Held to the end: no settle of this pool runs meanwhile, so none can record it
    // again after its charge is taken out.
    let Some(_guard) = settling(Kind::Pool, pool as u64) else {
        return call_real!(Hook::cuMemPoolDestroy, DestroyFn, pool);
    };
    let s = driver(DriverFn::CtxSynchronize);
    if s != 0 {
        // SAFETY: cuCtxSynchronize(void).
        let sync: unsafe extern "C" fn() -> CUresult = unsafe { as_fn(s) };
        // SAFETY: no arguments.
        unsafe { sync() };
    }
    let t = real(Hook::cuMemPoolTrimTo);
    if t != 0 {
        // SAFETY: cuMemPoolTrimTo(CUmemoryPool, size_t) on the caller's pool.
        let f: unsafe extern "C" fn(CUmemoryPool, usize) -> CUresult = unsafe { as_fn(t) };
        // SAFETY: as above.
        unsafe { f(pool, 0) };
    }
    let still = pool_reserved(pool);
    let rc = call_real!(Hook::cuMemPoolDestroy, DestroyFn, pool);
    if rc != CUDA_SUCCESS {
        let _ = settle_locked(st, Kind::Pool, pool as u64, None, || pool_reserved(pool));
        return rc;
    }
    let Some(e) = allocations::forget(Kind::Pool, pool as u64) else {
        return rc;
    };
    let held = still.unwrap_or(e.charge.bytes);
    let charge = match resize(st, e.charge, held) {
        Ok(c) | Err(c) => c,
    };
    if charge.bytes == 0 {
        st.release(charge);
        return rc;
    }
    let live = allocations::count(Kind::Async, |a| a.owner == pool as u64);
    if live == 0 {
        stderr::log(format_args!(
            "cuMemPoolDestroy: a destroyed pool still holds {} bytes for pointers the library does not know; they stay charged",
            charge.bytes
        ));
        return rc;
    }
    if let Ok(mut v) = DEAD_POOLS.lock() {
        v.push(DeadPool {
            pool: pool as u64,
            charge,
            live,
        });
        ANY_DEAD.store(true, std::sync::atomic::Ordering::Release);
    }
    rc
}
