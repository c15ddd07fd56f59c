//! The driver's answers about devices that the hooks need: which device a call is
//! about (the current context's, a stream's), how many there are, and a device's
//! UUID, as NVML and the plugin spell it. [`DriverDevices`] hands them to the
//! throttle, which calls no driver function itself.

use crate::enforce::sizes;
use crate::enforce::throttle::LaunchDevices;
use crate::ffi::*;
use crate::loader::driver_fns::{DriverFn, as_fn, driver};

/// The driver, as the throttle's launch path asks it about devices.
pub struct DriverDevices;

impl LaunchDevices for DriverDevices {
    #[inline]
    fn count(&self) -> Option<i32> {
        device_count()
    }

    #[inline]
    fn current(&self) -> Option<CUdevice> {
        current_device().ok()
    }

    #[inline]
    fn uuid(&self, dev: CUdevice) -> Option<String> {
        cuda_uuid(dev)
    }
}

/// The current context's device ordinal.
pub fn current_device() -> Result<CUdevice, CUresult> {
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
pub fn cuda_uuid(dev: CUdevice) -> Option<String> {
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

/// How many devices the driver has (`cuDeviceGetCount`); `None` before `cuInit` or
/// without the driver.
pub fn device_count() -> Option<i32> {
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
                    let d = current_device().ok();
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
    current_device().ok()
}
