//! Virtual memory management: `cuMemCreate` on device locations and `cuMemRelease`.
#![allow(non_snake_case)]

use super::*;

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
