//! The virtualized views: `cuMemGetInfo_v2`, `cuDeviceTotalMem_v2` and NVML's
//! `nvmlDeviceGetMemoryInfo(_v2)` report the budget.
#![allow(non_snake_case)]

use super::pools::resettle_pools;
use super::*;

/// (budget, used) for ordinal `dev`, if a claim budgets it.
fn budget_of_device(dev: CUdevice) -> Option<(u64, u64)> {
    let st = accounting::state();
    if !st.active() {
        return None;
    }
    if st.refuse_all {
        return Some((0, 0));
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
    if st.refuse_all {
        return Some((0, 0));
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
