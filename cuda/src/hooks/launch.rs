//! Kernel launches: each is charged its thread blocks to the claim's token bucket on
//! the launch's GPU (`enforce::throttle`), then forwarded. Graph launches are in
//! `graphs.rs`.
#![allow(non_snake_case)]

use super::*;
use crate::enforce::throttle::{self, grid_blocks};

type LaunchFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;

type CooperativeFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    *mut *mut c_void,
) -> CUresult;

type LaunchExFn = unsafe extern "C" fn(
    *const CUlaunchConfig,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;

/// `CUlaunchConfig` up to the stream (attributes do not change the block count:
/// clusters group blocks, they do not add any).
#[repr(C)]
pub struct CUlaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub stream: CUstream,
}

/// `CUDA_LAUNCH_PARAMS_v1`.
#[repr(C)]
pub struct CudaLaunchParams {
    pub function: *mut c_void,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub stream: CUstream,
    pub kernel_params: *mut *mut c_void,
}

#[inline]
#[allow(clippy::too_many_arguments)]
fn kernel(
    h: Hook,
    f: *mut c_void,
    g: [c_uint; 3],
    b: [c_uint; 3],
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let p = real(h);
    if p == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    throttle::launch(&DriverDevices, grid_blocks(g[0], g[1], g[2]), 1, None);
    // SAFETY: the driver's function of this variant.
    let real: LaunchFn = unsafe { as_fn(p) };
    // SAFETY: forwarding the caller's arguments.
    unsafe {
        real(
            f, g[0], g[1], g[2], b[0], b[1], b[2], shmem, stream, params, extra,
        )
    }
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    kernel(
        Hook::cuLaunchKernel,
        f,
        [gx, gy, gz],
        [bx, by, bz],
        shmem,
        stream,
        params,
        extra,
    )
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    kernel(
        Hook::cuLaunchKernel_ptsz,
        f,
        [gx, gy, gz],
        [bx, by, bz],
        shmem,
        stream,
        params,
        extra,
    )
}

#[inline]
fn cooperative(
    h: Hook,
    f: *mut c_void,
    g: [c_uint; 3],
    b: [c_uint; 3],
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    let p = real(h);
    if p == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    throttle::launch(&DriverDevices, grid_blocks(g[0], g[1], g[2]), 1, None);
    // SAFETY: the driver's function of this variant.
    let real: CooperativeFn = unsafe { as_fn(p) };
    // SAFETY: forwarding the caller's arguments.
    unsafe { real(f, g[0], g[1], g[2], b[0], b[1], b[2], shmem, stream, params) }
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    cooperative(
        Hook::cuLaunchCooperativeKernel,
        f,
        [gx, gy, gz],
        [bx, by, bz],
        shmem,
        stream,
        params,
    )
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    cooperative(
        Hook::cuLaunchCooperativeKernel_ptsz,
        f,
        [gx, gy, gz],
        [bx, by, bz],
        shmem,
        stream,
        params,
    )
}

fn launch_ex(
    h: Hook,
    config: *const CUlaunchConfig,
    f: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let p = real(h);
    if p == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    if !config.is_null() {
        // SAFETY: the caller's launch configuration (the driver rejects a NULL one).
        let g = unsafe { std::ptr::addr_of!((*config).grid).read_unaligned() };
        throttle::launch(&DriverDevices, grid_blocks(g[0], g[1], g[2]), 1, None);
    }
    // SAFETY: the driver's function of this variant.
    let real: LaunchExFn = unsafe { as_fn(p) };
    // SAFETY: forwarding the caller's arguments.
    unsafe { real(config, f, params, extra) }
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    launch_ex(Hook::cuLaunchKernelEx, config, f, params, extra)
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfig,
    f: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    launch_ex(Hook::cuLaunchKernelEx_ptsz, config, f, params, extra)
}

/// Each device's kernel is charged to that device's bucket (its stream's device).
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernelMultiDevice(
    list: *mut CudaLaunchParams,
    n: c_uint,
    flags: c_uint,
) -> CUresult {
    let p = real(Hook::cuLaunchCooperativeKernelMultiDevice);
    if p == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    if !list.is_null() && accounting::state().active() {
        for i in 0..n as usize {
            // SAFETY: the caller's array of `n` launch parameters.
            let e = unsafe { list.add(i).read_unaligned() };
            let dev = stream_device(e.stream as u64);
            throttle::launch(
                &DriverDevices,
                grid_blocks(e.grid[0], e.grid[1], e.grid[2]),
                1,
                dev,
            );
        }
    }
    // SAFETY: cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS*, unsigned, unsigned).
    let real: unsafe extern "C" fn(*mut CudaLaunchParams, c_uint, c_uint) -> CUresult =
        unsafe { as_fn(p) };
    // SAFETY: forwarding the caller's arguments.
    unsafe { real(list, n, flags) }
}
