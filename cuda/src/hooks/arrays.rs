//! Arrays and mipmapped arrays, charged at the size the driver reports.
#![allow(non_snake_case)]

use super::*;

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
            allocations::record(
                kind,
                arr as u64,
                Entry {
                    charge: c,
                    scrub_bytes: 0,
                    owner: 0,
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
    let taken = allocations::forget(Kind::Array, arr as u64);
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
    let taken = allocations::forget(Kind::Mipmap, arr as u64);
    let rc = call_real!(
        Hook::cuMipmappedArrayDestroy,
        unsafe extern "C" fn(CUmipmappedArray) -> CUresult,
        arr
    );
    release_after(Kind::Mipmap, arr as u64, rc, taken);
    rc
}
