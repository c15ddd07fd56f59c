//! The exported driver and NVML entry points. Each hook is thin: find the device,
//! reserve in the region (`accounting`), call the driver, roll back on failure, and
//! remember the charge for the matching free. With no claim mounted every hook only
//! forwards. No hook panics; a missing driver function gives `CUDA_ERROR_NOT_FOUND`.
#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use crate::accounting::{self, Charge, Entry, Kind, Refused, State};
use crate::ffi::*;
use crate::interpose::{DriverFn, Hook, as_fn, driver, hook_address, real, remember};
use crate::{gpa_table, sizes};

/// Calls the driver's function for `$hook` with type `$ty`, or returns NOT_FOUND.
macro_rules! call_real {
    ($hook:expr, $ty:ty, $($arg:expr),*) => {{
        let p = real($hook);
        if p == 0 {
            return CUDA_ERROR_NOT_FOUND;
        }
        // SAFETY: `p` is the driver's function of this variant, whose C signature is $ty.
        let f: $ty = unsafe { as_fn(p) };
        // SAFETY: forwarding the caller's arguments unchanged.
        unsafe { f($($arg),*) }
    }};
}

fn refused_code(st: &State, r: Refused, what: &str) -> CUresult {
    if r == Refused::NoSlot && !st.fail_closed {
        eprintln!("tessera-cuda: {what}: the device's UUID is unavailable; refusing");
    }
    CUDA_ERROR_OUT_OF_MEMORY
}

/// The current context's device ordinal.
fn current_device() -> Result<CUdevice, CUresult> {
    let p = driver(DriverFn::CtxGetDevice);
    if p == 0 {
        return Err(CUDA_ERROR_NOT_FOUND);
    }
    let mut dev: CUdevice = -1;
    // SAFETY: cuCtxGetDevice(CUdevice*).
    let f: unsafe extern "C" fn(*mut CUdevice) -> CUresult = unsafe { as_fn(p) };
    // SAFETY: valid out pointer.
    match unsafe { f(&mut dev) } {
        CUDA_SUCCESS => Ok(dev),
        e => Err(e),
    }
}

/// The `GPU-…` UUID of CUDA ordinal `dev`, as NVML and the plugin spell it.
fn cuda_uuid(dev: CUdevice) -> Option<String> {
    let mut raw = [0u8; 16];
    for f in [DriverFn::DeviceGetUuidV2, DriverFn::DeviceGetUuid] {
        let p = driver(f);
        if p == 0 {
            continue;
        }
        // SAFETY: cuDeviceGetUuid(_v2)(CUuuid*, CUdevice); CUuuid is 16 bytes.
        let g: unsafe extern "C" fn(*mut u8, CUdevice) -> CUresult = unsafe { as_fn(p) };
        // SAFETY: valid 16-byte buffer.
        if unsafe { g(raw.as_mut_ptr(), dev) } == CUDA_SUCCESS {
            return Some(sizes::format_uuid(&raw));
        }
    }
    None
}

/// What an allocation on the current device must do first.
enum Plan {
    /// Unbudgeted GPU or no claim: forward untouched.
    Forward,
    /// Charged; roll back with `release` if the driver fails.
    Charged(&'static State, Charge),
}

/// Reserves `bytes` on ordinal `dev` (or the current device).
fn plan(dev: Option<CUdevice>, bytes: u64, what: &str) -> Result<Plan, CUresult> {
    let st = accounting::state();
    if !st.active() {
        return Ok(Plan::Forward);
    }
    let dev = match dev {
        Some(d) => d,
        None => current_device()?,
    };
    let g = match st.gpu_for(dev, cuda_uuid) {
        Ok(Some(g)) => g,
        Ok(None) => return Ok(Plan::Forward),
        Err(r) => return Err(refused_code(st, r, what)),
    };
    match st.reserve(g, bytes) {
        Ok(c) => Ok(Plan::Charged(st, c)),
        Err(r) => Err(refused_code(st, r, what)),
    }
}

/// After the driver call: keep the charge (and remember it) or roll it back.
fn settle(plan: Plan, rc: CUresult, kind: Kind, id: impl FnOnce() -> u64, scrub_bytes: u64) {
    if let Plan::Charged(st, c) = plan {
        if rc == CUDA_SUCCESS {
            accounting::record(
                kind,
                id(),
                Entry {
                    charge: c,
                    scrub_bytes,
                },
            );
        } else {
            st.release(c);
        }
    }
}

/// Zeroes `bytes` at `ptr` when the charge's claim scrubs on free.
fn scrub(st: &State, e: &Entry, ptr: CUdeviceptr) {
    if e.scrub_bytes == 0 || !st.scrubs(e.charge) {
        return;
    }
    let (m, s) = (
        driver(DriverFn::MemsetD8V2),
        driver(DriverFn::CtxSynchronize),
    );
    if m == 0 {
        return;
    }
    // SAFETY: cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t).
    let memset: unsafe extern "C" fn(CUdeviceptr, u8, usize) -> CUresult = unsafe { as_fn(m) };
    // SAFETY: the range is the allocation being freed.
    unsafe { memset(ptr, 0, e.scrub_bytes as usize) };
    if s != 0 {
        // SAFETY: cuCtxSynchronize(void).
        let sync: unsafe extern "C" fn() -> CUresult = unsafe { as_fn(s) };
        // SAFETY: no arguments.
        unsafe { sync() };
    }
}

/// Forgets and releases the charge of a freed allocation, after the driver freed it.
fn release_after(kind: Kind, id: u64, rc: CUresult, taken: Option<Entry>) {
    if let Some(e) = taken {
        if rc == CUDA_SUCCESS {
            accounting::state().release(e.charge);
        } else {
            accounting::record(kind, id, e);
        }
    }
}

// ---- cuGetProcAddress ------------------------------------------------------------

/// Replaces the driver's answer by the hook of the same variant, keeping the
/// driver's pointer as the real one.
///
/// # Safety
/// `symbol` NUL-terminated or null; `pfn` valid or null.
unsafe fn patch_lookup(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: per the caller.
    let p = unsafe { *pfn };
    if p.is_null() {
        return;
    }
    // SAFETY: NUL-terminated per the caller.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let Some(sym) = gpa_table::resolve_symbol(name, version, flags) else {
        return;
    };
    if let Some(h) = crate::interpose::find_hook(sym.as_bytes()) {
        remember(h, p);
        // SAFETY: per the caller.
        unsafe { *pfn = hook_address(h) as *mut c_void };
    }
}

type GpaFn = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
type Gpa2Fn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    let rc = call_real!(Hook::cuGetProcAddress, GpaFn, symbol, pfn, version, flags);
    // SAFETY: the caller's pointers.
    unsafe { patch_lookup(symbol, pfn, version, flags) };
    rc
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    let rc = call_real!(
        Hook::cuGetProcAddress_v2,
        Gpa2Fn,
        symbol,
        pfn,
        version,
        flags,
        status
    );
    // SAFETY: the caller's pointers.
    unsafe { patch_lookup(symbol, pfn, version, flags) };
    rc
}

/// Loads the claims (and takes the slots) at the process's first CUDA call.
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    let _ = accounting::state();
    call_real!(
        Hook::cuInit,
        unsafe extern "C" fn(c_uint) -> CUresult,
        flags
    )
}

// ---- linear and managed memory ---------------------------------------------------

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    let plan = match plan(None, sizes::linear(size as u64), "cuMemAlloc") {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    let rc = call_real!(
        Hook::cuMemAlloc_v2,
        unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult,
        dptr,
        size
    );
    // SAFETY: on success the driver wrote *dptr.
    settle(plan, rc, Kind::Linear, || unsafe { *dptr }, size as u64);
    rc
}

/// Charged at the pitch the driver returns: reserved for the largest pitch it could
/// choose, then trimmed to the real one.
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    let bound = sizes::pitch_bound(width as u64, height as u64);
    let plan = match plan(None, bound, "cuMemAllocPitch") {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    let rc = call_real!(
        Hook::cuMemAllocPitch_v2,
        unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult,
        dptr,
        pitch,
        width,
        height,
        elem
    );
    let plan = match plan {
        Plan::Charged(st, c) if rc == CUDA_SUCCESS => {
            // SAFETY: on success the driver wrote *pitch.
            let real_pitch = unsafe { *pitch } as u64;
            let used = sizes::linear(real_pitch.saturating_mul(height as u64));
            match resize(st, c, used) {
                Ok(c) => Plan::Charged(st, c),
                Err(c) => {
                    // More than any pitch the library expected: free and refuse.
                    // SAFETY: freeing what the driver just allocated.
                    unsafe { free_linear_untracked(*dptr) };
                    st.release(c);
                    return CUDA_ERROR_OUT_OF_MEMORY;
                }
            }
        }
        p => p,
    };
    let scrub_bytes = if rc == CUDA_SUCCESS {
        // SAFETY: on success the driver wrote *pitch.
        (unsafe { *pitch } as u64).saturating_mul(height as u64)
    } else {
        0
    };
    // SAFETY: on success the driver wrote *dptr.
    settle(plan, rc, Kind::Linear, || unsafe { *dptr }, scrub_bytes);
    rc
}

/// Moves a charge to `bytes`: releases the excess, or reserves the difference on the
/// same claim. On failure returns the unchanged charge.
fn resize(st: &State, c: Charge, bytes: u64) -> Result<Charge, Charge> {
    if bytes <= c.bytes {
        st.release(Charge {
            bytes: c.bytes - bytes,
            ..c
        });
        Ok(Charge { bytes, ..c })
    } else {
        match st.reserve_on(c, bytes - c.bytes) {
            Ok(()) => Ok(Charge { bytes, ..c }),
            Err(_) => Err(c),
        }
    }
}

/// # Safety
/// `ptr` was just allocated by the driver.
unsafe fn free_linear_untracked(ptr: CUdeviceptr) {
    let p = real(Hook::cuMemFree_v2);
    if p != 0 {
        // SAFETY: cuMemFree_v2(CUdeviceptr).
        let f: unsafe extern "C" fn(CUdeviceptr) -> CUresult = unsafe { as_fn(p) };
        // SAFETY: as documented.
        unsafe { f(ptr) };
    }
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: c_uint,
) -> CUresult {
    let plan = match plan(None, sizes::linear(size as u64), "cuMemAllocManaged") {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    let rc = call_real!(
        Hook::cuMemAllocManaged,
        unsafe extern "C" fn(*mut CUdeviceptr, usize, c_uint) -> CUresult,
        dptr,
        size,
        flags
    );
    // SAFETY: on success the driver wrote *dptr.
    settle(plan, rc, Kind::Linear, || unsafe { *dptr }, size as u64);
    rc
}

/// Frees linear and managed memory; memory the library never charged (allocated
/// before it loaded, or unbudgeted) is simply forwarded.
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    let taken = accounting::forget(Kind::Linear, ptr);
    if let Some(e) = &taken {
        scrub(accounting::state(), e, ptr);
    }
    let rc = call_real!(
        Hook::cuMemFree_v2,
        unsafe extern "C" fn(CUdeviceptr) -> CUresult,
        ptr
    );
    release_after(Kind::Linear, ptr, rc, taken);
    rc
}

// ---- stream-ordered memory -------------------------------------------------------

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
fn settle_retained(
    st: &State,
    kind: Kind,
    key: u64,
    pending: Option<Charge>,
    reserved: impl FnOnce() -> Option<u64>,
) -> bool {
    let old = accounting::forget(kind, key).map(|e| e.charge);
    let mut held: Option<Charge> = match (old, pending) {
        (Some(o), Some(p)) if (o.claim, o.gpu) == (p.claim, p.gpu) => Some(Charge {
            bytes: o.bytes + p.bytes,
            ..o
        }),
        (Some(o), Some(p)) => {
            // Different claims: keep the pool's, fold the new one in by moving it.
            st.release(p);
            if st.reserve_on(o, p.bytes).is_ok() {
                Some(Charge {
                    bytes: o.bytes + p.bytes,
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

fn resettle_pools() {
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

// ---- virtual memory management ---------------------------------------------------

/// Physical memory on a device location, charged at its size (the driver refuses
/// sizes that are not multiples of the granularity, so the size is what it uses).
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    // SAFETY: the caller passes a valid prop (or null, which the driver refuses).
    let dev = (!prop.is_null())
        .then(|| unsafe { &*prop })
        .filter(|p| p.location_type == CU_MEM_LOCATION_TYPE_DEVICE)
        .map(|p| p.location_id);
    let plan = match dev {
        Some(d) => match plan(Some(d), size as u64, "cuMemCreate") {
            Ok(p) => p,
            Err(rc) => return rc,
        },
        None => Plan::Forward,
    };
    let rc = call_real!(
        Hook::cuMemCreate,
        unsafe extern "C" fn(
            *mut CUmemGenericAllocationHandle,
            usize,
            *const CUmemAllocationProp,
            u64,
        ) -> CUresult,
        handle,
        size,
        prop,
        flags
    );
    // SAFETY: on success the driver wrote *handle.
    settle(plan, rc, Kind::Vmm, || unsafe { *handle }, 0);
    rc
}

/// Released when the handle is released. (The driver frees the memory only once
/// it is also unmapped; the library returns the budget at release.)
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    let taken = accounting::forget(Kind::Vmm, handle);
    let rc = call_real!(
        Hook::cuMemRelease,
        unsafe extern "C" fn(CUmemGenericAllocationHandle) -> CUresult,
        handle
    );
    release_after(Kind::Vmm, handle, rc, taken);
    rc
}

// ---- arrays ----------------------------------------------------------------------

/// Charges an array: an upper bound before creation, then the size the driver
/// reports through `cuArrayGetMemoryRequirements`.
fn create_array(
    bound: u64,
    call: impl FnOnce() -> CUresult,
    created: impl Fn() -> CUarray,
) -> CUresult {
    create_sized(
        bound,
        call,
        created,
        Kind::Array,
        array_requirements,
        |arr| {
            let p = real(Hook::cuArrayDestroy);
            if p != 0 {
                // SAFETY: cuArrayDestroy(CUarray) on the array just created.
                let f: unsafe extern "C" fn(CUarray) -> CUresult = unsafe { as_fn(p) };
                // SAFETY: as above.
                unsafe { f(arr) };
            }
        },
    )
}

/// Charges an object whose size only the driver knows: `bound` before creation,
/// then what `requirements` reports; `destroy` undoes a creation the budget cannot
/// hold.
fn create_sized(
    bound: u64,
    call: impl FnOnce() -> CUresult,
    created: impl Fn() -> CUarray,
    kind: Kind,
    requirements: fn(CUarray, CUdevice) -> Option<u64>,
    destroy: impl FnOnce(CUarray),
) -> CUresult {
    let plan = match plan(None, bound, "cuArrayCreate") {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    let rc = call();
    let Plan::Charged(st, c) = plan else {
        return rc;
    };
    if rc != CUDA_SUCCESS {
        st.release(c);
        return rc;
    }
    let arr = created();
    let real_size = current_device()
        .ok()
        .and_then(|d| requirements(arr, d))
        .unwrap_or(c.bytes);
    match resize(st, c, real_size) {
        Ok(c) => {
            accounting::record(
                kind,
                arr as u64,
                Entry {
                    charge: c,
                    scrub_bytes: 0,
                },
            );
            rc
        }
        Err(c) => {
            destroy(arr);
            st.release(c);
            CUDA_ERROR_OUT_OF_MEMORY
        }
    }
}

fn array_requirements(arr: CUarray, dev: CUdevice) -> Option<u64> {
    requirements_of(DriverFn::ArrayGetMemoryRequirements, arr, dev)
}

fn mipmap_requirements(arr: CUarray, dev: CUdevice) -> Option<u64> {
    requirements_of(DriverFn::MipmappedArrayGetMemoryRequirements, arr, dev)
}

/// `cu(Mipmapped)ArrayGetMemoryRequirements`: the same signature for both.
fn requirements_of(f: DriverFn, arr: CUarray, dev: CUdevice) -> Option<u64> {
    let p = driver(f);
    if p == 0 {
        return None;
    }
    let mut req = ArrayMemoryRequirements::default();
    // SAFETY: cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS*, CUarray, CUdevice).
    let f: unsafe extern "C" fn(*mut ArrayMemoryRequirements, CUarray, CUdevice) -> CUresult =
        unsafe { as_fn(p) };
    // SAFETY: valid out pointer.
    (unsafe { f(&mut req, arr, dev) } == CUDA_SUCCESS).then_some(req.size as u64)
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    handle: *mut CUarray,
    desc: *const ArrayDescriptor,
) -> CUresult {
    // SAFETY: the caller's descriptor (null is forwarded for the driver to refuse).
    let bound = match unsafe { desc.as_ref() } {
        Some(d) => sizes::array_bound(d.width, d.height.max(1), 1, d.format, d.num_channels),
        None => 0,
    };
    let p = real(Hook::cuArrayCreate_v2);
    if p == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    // SAFETY: the driver's cuArrayCreate_v2.
    let f: unsafe extern "C" fn(*mut CUarray, *const ArrayDescriptor) -> CUresult =
        unsafe { as_fn(p) };
    create_array(
        bound,
        // SAFETY: forwarding the caller's arguments.
        || unsafe { f(handle, desc) },
        // SAFETY: read after success.
        || unsafe { *handle },
    )
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    handle: *mut CUarray,
    desc: *const Array3dDescriptor,
) -> CUresult {
    // SAFETY: the caller's descriptor (null is forwarded for the driver to refuse).
    let bound = match unsafe { desc.as_ref() } {
        Some(d) => sizes::array_bound(
            d.width,
            d.height.max(1),
            d.depth.max(1),
            d.format,
            d.num_channels,
        ),
        None => 0,
    };
    let p = real(Hook::cuArray3DCreate_v2);
    if p == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    // SAFETY: the driver's cuArray3DCreate_v2.
    let f: unsafe extern "C" fn(*mut CUarray, *const Array3dDescriptor) -> CUresult =
        unsafe { as_fn(p) };
    create_array(
        bound,
        // SAFETY: forwarding the caller's arguments.
        || unsafe { f(handle, desc) },
        // SAFETY: read after success.
        || unsafe { *handle },
    )
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(arr: CUarray) -> CUresult {
    let taken = accounting::forget(Kind::Array, arr as u64);
    let rc = call_real!(
        Hook::cuArrayDestroy,
        unsafe extern "C" fn(CUarray) -> CUresult,
        arr
    );
    release_after(Kind::Array, arr as u64, rc, taken);
    rc
}

/// Mipmapped arrays: bounded by a third more than level 0 (the level sum), then
/// charged at `cuMipmappedArrayGetMemoryRequirements`.
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    handle: *mut CUmipmappedArray,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> CUresult {
    // SAFETY: the caller's descriptor (null is forwarded for the driver to refuse).
    let bound = match unsafe { desc.as_ref() } {
        Some(d) => {
            let b = sizes::array_bound(
                d.width,
                d.height.max(1),
                d.depth.max(1),
                d.format,
                d.num_channels,
            );
            b.saturating_add(b / 3)
        }
        None => 0,
    };
    let p = real(Hook::cuMipmappedArrayCreate);
    if p == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    // SAFETY: the driver's cuMipmappedArrayCreate.
    let f: unsafe extern "C" fn(
        *mut CUmipmappedArray,
        *const Array3dDescriptor,
        c_uint,
    ) -> CUresult = unsafe { as_fn(p) };
    create_sized(
        bound,
        // SAFETY: forwarding the caller's arguments.
        || unsafe { f(handle, desc, levels) },
        // SAFETY: read after success.
        || unsafe { *handle },
        Kind::Mipmap,
        mipmap_requirements,
        |arr| {
            let p = real(Hook::cuMipmappedArrayDestroy);
            if p != 0 {
                // SAFETY: destroying what was just created.
                let d: unsafe extern "C" fn(CUmipmappedArray) -> CUresult = unsafe { as_fn(p) };
                // SAFETY: as above.
                unsafe { d(arr) };
            }
        },
    )
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(arr: CUmipmappedArray) -> CUresult {
    let taken = accounting::forget(Kind::Mipmap, arr as u64);
    let rc = call_real!(
        Hook::cuMipmappedArrayDestroy,
        unsafe extern "C" fn(CUmipmappedArray) -> CUresult,
        arr
    );
    release_after(Kind::Mipmap, arr as u64, rc, taken);
    rc
}

// ---- context limits --------------------------------------------------------------

/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT` × `..._MAX_THREADS_PER_MULTIPROCESSOR`:
/// how many threads can be resident, each with its own stack.
fn resident_threads(dev: CUdevice) -> Option<u64> {
    let p = driver(DriverFn::DeviceGetAttribute);
    if p == 0 {
        return None;
    }
    // SAFETY: cuDeviceGetAttribute(int*, CUdevice_attribute, CUdevice).
    let f: unsafe extern "C" fn(*mut c_int, c_int, CUdevice) -> CUresult = unsafe { as_fn(p) };
    let (mut sms, mut threads) = (0, 0);
    // SAFETY: valid out pointers.
    let ok =
        unsafe { f(&mut sms, 16, dev) == CUDA_SUCCESS && f(&mut threads, 39, dev) == CUDA_SUCCESS };
    ok.then(|| u64::try_from(sms).unwrap_or(0) * u64::try_from(threads).unwrap_or(0))
}

/// The device memory a limit reserves: the malloc heap and printf FIFO at their
/// size, the stack per resident thread; other limits reserve none.
fn limit_bytes(dev: CUdevice, limit: c_int, value: usize) -> Option<u64> {
    match limit {
        CU_LIMIT_MALLOC_HEAP_SIZE | CU_LIMIT_PRINTF_FIFO_SIZE => Some(value as u64),
        CU_LIMIT_STACK_SIZE => resident_threads(dev).map(|t| t.saturating_mul(value as u64)),
        _ => None,
    }
}

/// Charges the reservation a limit makes, replacing the limit's previous charge:
/// a raise reserves the difference before the driver call (on the claim already
/// charged), a cut is released after it.
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    type SetLimit = unsafe extern "C" fn(c_int, usize) -> CUresult;
    let st = accounting::state();
    let dev = if st.active() {
        current_device().ok()
    } else {
        None
    };
    let want = dev.and_then(|d| limit_bytes(d, limit, value).map(|b| (d, b)));
    let Some((dev, bytes)) = want else {
        return call_real!(Hook::cuCtxSetLimit, SetLimit, limit, value);
    };
    let key = (u64::from(dev as u32) << 8) | u64::from(limit as u8);
    let Some(old) = accounting::forget(Kind::Limit, key) else {
        let plan = match plan(Some(dev), bytes, "cuCtxSetLimit") {
            Ok(p) => p,
            Err(rc) => return rc,
        };
        let rc = call_real!(Hook::cuCtxSetLimit, SetLimit, limit, value);
        settle(plan, rc, Kind::Limit, || key, 0);
        return rc;
    };
    let keep = |c: Charge| {
        accounting::record(
            Kind::Limit,
            key,
            Entry {
                charge: c,
                scrub_bytes: 0,
            },
        )
    };
    let was = old.charge;
    if bytes > was.bytes && st.reserve_on(was, bytes - was.bytes).is_err() {
        keep(was);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = call_real!(Hook::cuCtxSetLimit, SetLimit, limit, value);
    let now = if rc == CUDA_SUCCESS { bytes } else { was.bytes };
    // Return whatever is held beyond what the limit now reserves.
    let held = was.bytes.max(bytes);
    if held > now {
        st.release(Charge {
            bytes: held - now,
            ..was
        });
    }
    keep(Charge { bytes: now, ..was });
    rc
}

// ---- graph memory ---------------------------------------------------------------

/// `CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`.
const GRAPH_MEM_RESERVED_CURRENT: c_int = 2;
/// Offsets in `CUDA_MEM_ALLOC_NODE_PARAMS` (x86-64): the pool props' location type
/// and id, and `bytesize`.
const ALLOC_NODE_LOCATION_TYPE: usize = 8;
const ALLOC_NODE_LOCATION_ID: usize = 12;
const ALLOC_NODE_BYTESIZE: usize = 104;

/// The memory a device's graph pool holds (`RESERVED_MEM_CURRENT`).
fn graph_reserved(dev: CUdevice) -> Option<u64> {
    let p = driver(DriverFn::DeviceGetGraphMemAttribute);
    if p == 0 {
        return None;
    }
    let mut v: u64 = 0;
    // SAFETY: cuDeviceGetGraphMemAttribute(CUdevice, attr, void*) with a u64 attribute.
    let f: unsafe extern "C" fn(CUdevice, c_int, *mut c_void) -> CUresult = unsafe { as_fn(p) };
    // SAFETY: valid out pointer of the attribute's type.
    let rc = unsafe { f(dev, GRAPH_MEM_RESERVED_CURRENT, (&mut v as *mut u64).cast()) };
    (rc == CUDA_SUCCESS).then_some(v)
}

fn settle_graph_pool(st: &State, dev: CUdevice, pending: Option<Charge>) -> bool {
    settle_retained(st, Kind::GraphPool, dev as u64, pending, || {
        graph_reserved(dev)
    })
}

/// Remembers what an allocation node adds to its graph (its size in 2 MiB pages,
/// on the node's device).
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut c_void,
    graph: *mut c_void,
    deps: *const c_void,
    ndeps: usize,
    params: *mut u8,
) -> CUresult {
    let rc = call_real!(
        Hook::cuGraphAddMemAllocNode,
        unsafe extern "C" fn(*mut c_void, *mut c_void, *const c_void, usize, *mut u8) -> CUresult,
        node,
        graph,
        deps,
        ndeps,
        params
    );
    if rc == CUDA_SUCCESS && !params.is_null() {
        // SAFETY: the driver accepted `params`, a CUDA_MEM_ALLOC_NODE_PARAMS.
        let (ty, id, bytes) = unsafe {
            (
                params
                    .add(ALLOC_NODE_LOCATION_TYPE)
                    .cast::<c_int>()
                    .read_unaligned(),
                params
                    .add(ALLOC_NODE_LOCATION_ID)
                    .cast::<c_int>()
                    .read_unaligned(),
                params
                    .add(ALLOC_NODE_BYTESIZE)
                    .cast::<usize>()
                    .read_unaligned(),
            )
        };
        if ty == CU_MEM_LOCATION_TYPE_DEVICE {
            accounting::add_graph_need(graph as u64, id, sizes::linear(bytes as u64));
        }
    }
    rc
}

/// An executable graph inherits its graph's needs.
fn instantiated(rc: CUresult, exec: *mut *mut c_void, graph: *mut c_void) {
    if rc == CUDA_SUCCESS
        && !exec.is_null()
        && let Some(n) = accounting::graph_need(graph as u64)
    {
        // SAFETY: on success the driver wrote *exec.
        accounting::add_graph_need(unsafe { *exec } as u64, n.dev, n.bytes);
    }
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    err_node: *mut c_void,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    let rc = call_real!(
        Hook::cuGraphInstantiate_v2,
        unsafe extern "C" fn(
            *mut *mut c_void,
            *mut c_void,
            *mut c_void,
            *mut c_char,
            usize,
        ) -> CUresult,
        exec,
        graph,
        err_node,
        log,
        log_size
    );
    instantiated(rc, exec, graph);
    rc
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    flags: u64,
) -> CUresult {
    let rc = call_real!(
        Hook::cuGraphInstantiateWithFlags,
        unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u64) -> CUresult,
        exec,
        graph,
        flags
    );
    instantiated(rc, exec, graph);
    rc
}

type InstantiateParamsFn =
    unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *mut c_void) -> CUresult;

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    params: *mut c_void,
) -> CUresult {
    let rc = call_real!(
        Hook::cuGraphInstantiateWithParams,
        InstantiateParamsFn,
        exec,
        graph,
        params
    );
    instantiated(rc, exec, graph);
    rc
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    params: *mut c_void,
) -> CUresult {
    let rc = call_real!(
        Hook::cuGraphInstantiateWithParams_ptsz,
        InstantiateParamsFn,
        exec,
        graph,
        params
    );
    instantiated(rc, exec, graph);
    rc
}

type ExecStreamFn = unsafe extern "C" fn(*mut c_void, CUstream) -> CUresult;

/// Upload and launch materialize graph memory: the growth the graph can cause (its
/// needs beyond what the device's graph pool is charged for) is reserved first,
/// then the charge follows the pool's reserved size.
fn materialize(h: Hook, exec: *mut c_void, stream: CUstream) -> CUresult {
    let p = real(h);
    if p == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    // SAFETY: the driver's function of this variant.
    let f: ExecStreamFn = unsafe { as_fn(p) };
    let st = accounting::state();
    let need = if st.active() {
        accounting::graph_need(exec as u64)
    } else {
        None
    };
    let Some(need) = need else {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { f(exec, stream) };
    };
    let held = accounting::peek(Kind::GraphPool, need.dev as u64).map_or(0, |e| e.charge.bytes);
    let growth = need.bytes.saturating_sub(held);
    let plan = if growth > 0 {
        match plan(Some(need.dev), growth, "cuGraphLaunch") {
            Ok(p) => p,
            Err(rc) => return rc,
        }
    } else {
        Plan::Forward
    };
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { f(exec, stream) };
    let pending = match plan {
        Plan::Charged(_, c) if rc == CUDA_SUCCESS => Some(c),
        Plan::Charged(st, c) => {
            st.release(c);
            None
        }
        Plan::Forward => None,
    };
    if !settle_graph_pool(st, need.dev, pending) {
        eprintln!("tessera-cuda: graph memory grew past the budget during a launch");
    }
    rc
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphUpload(exec: *mut c_void, stream: CUstream) -> CUresult {
    materialize(Hook::cuGraphUpload, exec, stream)
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphUpload_ptsz(exec: *mut c_void, stream: CUstream) -> CUresult {
    materialize(Hook::cuGraphUpload_ptsz, exec, stream)
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(exec: *mut c_void, stream: CUstream) -> CUresult {
    materialize(Hook::cuGraphLaunch, exec, stream)
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: *mut c_void, stream: CUstream) -> CUresult {
    materialize(Hook::cuGraphLaunch_ptsz, exec, stream)
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: *mut c_void) -> CUresult {
    let rc = call_real!(
        Hook::cuGraphExecDestroy,
        unsafe extern "C" fn(*mut c_void) -> CUresult,
        exec
    );
    if rc == CUDA_SUCCESS {
        accounting::drop_graph_need(exec as u64);
    }
    rc
}

/// Trimming returns the graph pool's unused memory; the charge follows.
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    let rc = call_real!(
        Hook::cuDeviceGraphMemTrim,
        unsafe extern "C" fn(CUdevice) -> CUresult,
        dev
    );
    let st = accounting::state();
    if st.active() {
        let _ = settle_graph_pool(st, dev, None);
    }
    rc
}

// ---- virtualized views -----------------------------------------------------------

/// (budget, used) for ordinal `dev`, if a claim budgets it.
fn budget_of_device(dev: CUdevice) -> Option<(u64, u64)> {
    let st = accounting::state();
    if !st.active() {
        return None;
    }
    match st.gpu_for(dev, cuda_uuid) {
        Ok(Some(g)) => st.usage(g),
        _ => None,
    }
}

/// Reports the budget as the total and what is left of it as free (never more
/// than the device really has free).
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let rc = call_real!(
        Hook::cuMemGetInfo_v2,
        unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult,
        free,
        total
    );
    if rc != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return rc;
    }
    resettle_pools();
    if let Some((budget, used)) = current_device().ok().and_then(budget_of_device) {
        let left = budget.saturating_sub(used);
        // SAFETY: valid out pointers (checked above).
        unsafe {
            *free = (*free).min(usize::try_from(left).unwrap_or(usize::MAX));
            *total = usize::try_from(budget).unwrap_or(usize::MAX);
        }
    }
    rc
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    let rc = call_real!(
        Hook::cuDeviceTotalMem_v2,
        unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult,
        bytes,
        dev
    );
    if rc == CUDA_SUCCESS
        && !bytes.is_null()
        && let Some((budget, _)) = budget_of_device(dev)
    {
        // SAFETY: valid out pointer.
        unsafe { *bytes = usize::try_from(budget).unwrap_or(usize::MAX) };
    }
    rc
}

/// (budget, used) of an NVML device, by its UUID.
fn budget_of_nvml(device: NvmlDevice) -> Option<(u64, u64)> {
    let st = accounting::state();
    if !st.active() {
        return None;
    }
    let p = driver(DriverFn::NvmlDeviceGetUuid);
    if p == 0 {
        return None;
    }
    let mut buf = [0u8; 96];
    // SAFETY: nvmlDeviceGetUUID(nvmlDevice_t, char*, unsigned int).
    let f: unsafe extern "C" fn(NvmlDevice, *mut c_char, c_uint) -> NvmlReturn =
        unsafe { as_fn(p) };
    // SAFETY: valid buffer of the stated length.
    if unsafe { f(device, buf.as_mut_ptr().cast(), buf.len() as c_uint) } != NVML_SUCCESS {
        return None;
    }
    let uuid = CStr::from_bytes_until_nul(&buf).ok()?.to_str().ok()?;
    let g = st.gpus.iter().position(|g| g.uuid == uuid)?;
    st.usage(g)
}

/// # Safety
/// NVML's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    mem: *mut NvmlMemory,
) -> NvmlReturn {
    let p = real(Hook::nvmlDeviceGetMemoryInfo);
    if p == 0 {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    // SAFETY: the real nvmlDeviceGetMemoryInfo.
    let f: unsafe extern "C" fn(NvmlDevice, *mut NvmlMemory) -> NvmlReturn = unsafe { as_fn(p) };
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { f(device, mem) };
    if rc == NVML_SUCCESS
        && let Some(m) = unsafe { mem.as_mut() }
        && let Some((budget, used)) = budget_of_nvml(device)
    {
        let v = sizes::virtual_memory(budget, used, m.free);
        m.total = v.total;
        m.used = v.used;
        m.free = v.free;
    }
    rc
}

/// # Safety
/// NVML's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    mem: *mut NvmlMemoryV2,
) -> NvmlReturn {
    let p = real(Hook::nvmlDeviceGetMemoryInfo_v2);
    if p == 0 {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    // SAFETY: the real nvmlDeviceGetMemoryInfo_v2.
    let f: unsafe extern "C" fn(NvmlDevice, *mut NvmlMemoryV2) -> NvmlReturn = unsafe { as_fn(p) };
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { f(device, mem) };
    if rc == NVML_SUCCESS
        && let Some(m) = unsafe { mem.as_mut() }
        && let Some((budget, used)) = budget_of_nvml(device)
    {
        let v = sizes::virtual_memory(budget, used, m.free);
        m.total = v.total;
        m.reserved = 0;
        m.used = v.used;
        m.free = v.free;
    }
    rc
}
