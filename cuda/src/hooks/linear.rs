//! Linear and managed memory: `cuMemAlloc_v2`, `cuMemAllocPitch_v2`,
//! `cuMemAllocManaged` and `cuMemFree_v2`.
#![allow(non_snake_case)]

use super::*;

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
    let taken = allocations::forget(Kind::Linear, ptr);
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
