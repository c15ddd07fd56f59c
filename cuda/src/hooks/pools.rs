//! Stream-ordered memory: async allocations charged at what their pool retains.
#![allow(non_snake_case)]

use super::*;

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
    let p = driver(DriverFn::MemPoolGetAttribute);
    if p == 0 {
        return None;
    }
    let mut v: u64 = 0;
    // SAFETY: cuMemPoolGetAttribute(CUmemoryPool, attr, void*) with a u64 attribute.
    let f: unsafe extern "C" fn(CUmemoryPool, c_int, *mut c_void) -> CUresult = unsafe { as_fn(p) };
    // SAFETY: valid out pointer of the attribute's type.
    let rc = unsafe {
        f(
            pool,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            (&mut v as *mut u64).cast(),
        )
    };
    (rc == CUDA_SUCCESS).then_some(v)
}

/// Brings a pool's charge to what it retains now. The pool's charge lives on one
/// claim (the first that had room when the pool was first charged); `pending` is a
/// reservation made for the call that just ran and is folded in. Returns false when
/// the pool grew beyond what the budget allows.
fn settle_pool(st: &State, pool: CUmemoryPool, pending: Option<Charge>) -> bool {
    settle_retained(st, Kind::Pool, pool as u64, pending, || pool_reserved(pool))
}

/// Brings the charge of a retaining allocator (`kind`, `key`) to what `reserved`
/// reports it holds now, folding in a `pending` reservation; false when it grew
/// beyond what the budget allows (the charge then stays at what could be reserved).
pub(super) fn settle_retained(
    st: &State,
    kind: Kind,
    key: u64,
    pending: Option<Charge>,
    reserved: impl FnOnce() -> Option<u64>,
) -> bool {
    let old = accounting::forget(kind, key).map(|e| e.charge);
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
        accounting::record(
            kind,
            key,
            Entry {
                charge: kept,
                scrub_bytes: 0,
            },
        );
    } else {
        st.release(kept);
    }
    ok
}

/// Common path of the four stream-ordered allocation hooks.
fn alloc_from_pool(
    pool: Option<CUmemoryPool>,
    size: usize,
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
    // The pool grows by at least the allocation; reserve that much first.
    let plan = match plan(Some(dev), sizes::linear(size as u64), "cuMemAllocAsync") {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    let rc = call();
    match plan {
        Plan::Forward => rc,
        Plan::Charged(st, c) => {
            if rc != CUDA_SUCCESS {
                st.release(c);
                let _ = settle_pool(st, pool, None);
                return rc;
            }
            if settle_pool(st, pool, Some(c)) {
                rc
            } else {
                free();
                CUDA_ERROR_OUT_OF_MEMORY
            }
        }
    }
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
    alloc_from_pool(
        None,
        size,
        // SAFETY: forwarding the caller's arguments.
        || unsafe { f(dptr, size, stream) },
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
    alloc_from_pool(
        Some(pool),
        size,
        // SAFETY: forwarding the caller's arguments.
        || unsafe { f(dptr, size, pool, stream) },
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

/// Returns memory to its pool, then recharges every charged pool at what it
/// retains (a free can let the pool release memory past its threshold).
fn free_async(h: Hook, ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    let rc = call_real!(h, FreeAsyncFn, ptr, stream);
    resettle_pools();
    rc
}

pub(super) fn resettle_pools() {
    let st = accounting::state();
    if !st.active() || !accounting::any_pool() {
        return;
    }
    for pool in accounting::keys(Kind::Pool) {
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
