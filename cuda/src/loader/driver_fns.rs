//! The driver and NVML functions the library calls but does not intercept (the
//! [`DriverFn`] table), each found behind the library once, and [`as_fn`], which
//! casts a found pointer to the function type the caller knows it has.

use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::resolve::resolve_behind;

macro_rules! driver_table {
    ($($fn:ident = $name:literal),* $(,)?) => {
        /// Driver functions the library calls but does not intercept.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum DriverFn { $($fn),* }
        const DRIVER_COUNT: usize = [$(DriverFn::$fn),*].len();
        const DRIVER_NAMES: [&str; DRIVER_COUNT] = [$(concat!($name, "\0")),*];
    };
}

driver_table!(
    CtxGetDevice = "cuCtxGetDevice",
    DeviceGetUuidV2 = "cuDeviceGetUuid_v2",
    DeviceGetUuid = "cuDeviceGetUuid",
    MemsetD8V2 = "cuMemsetD8_v2",
    CtxSynchronize = "cuCtxSynchronize",
    ArrayGetMemoryRequirements = "cuArrayGetMemoryRequirements",
    MemPoolGetAttribute = "cuMemPoolGetAttribute",
    DeviceGetDefaultMemPool = "cuDeviceGetDefaultMemPool",
    DeviceGetMemPool = "cuDeviceGetMemPool",
    NvmlDeviceGetUuid = "nvmlDeviceGetUUID",
    MipmappedArrayGetMemoryRequirements = "cuMipmappedArrayGetMemoryRequirements",
    DeviceGetAttribute = "cuDeviceGetAttribute",
    DeviceGetGraphMemAttribute = "cuDeviceGetGraphMemAttribute",
    DeviceGetCount = "cuDeviceGetCount",
    StreamGetDevice = "cuStreamGetDevice",
    StreamGetCtx = "cuStreamGetCtx",
    CtxGetDeviceV2 = "cuCtxGetDevice_v2",
    CtxPushCurrentV2 = "cuCtxPushCurrent_v2",
    CtxPopCurrentV2 = "cuCtxPopCurrent_v2",
    GraphGetNodes = "cuGraphGetNodes",
    GraphNodeGetType = "cuGraphNodeGetType",
    GraphKernelNodeGetParamsV2 = "cuGraphKernelNodeGetParams_v2",
    GraphKernelNodeGetParams = "cuGraphKernelNodeGetParams",
    GraphChildGraphNodeGetGraph = "cuGraphChildGraphNodeGetGraph",
    MemsetD8Async = "cuMemsetD8Async",
    MemsetD8AsyncPtsz = "cuMemsetD8Async_ptsz",
    StreamSynchronize = "cuStreamSynchronize",
    MemAddressReserve = "cuMemAddressReserve",
    MemAddressFree = "cuMemAddressFree",
    MemSetAccess = "cuMemSetAccess",
    MemGetAllocationPropertiesFromHandle = "cuMemGetAllocationPropertiesFromHandle",
);

static DRIVER: [AtomicUsize; DRIVER_COUNT] = [const { AtomicUsize::new(0) }; DRIVER_COUNT];

/// The driver's exported function `f`, resolved once; 0 if it has none.
pub fn driver(f: DriverFn) -> usize {
    let i = f as usize;
    let v = DRIVER[i].load(Ordering::Acquire);
    if v != 0 {
        return v;
    }
    let lib: &CStr = if f == DriverFn::NvmlDeviceGetUuid {
        c"libnvidia-ml.so.1"
    } else {
        c"libcuda.so.1"
    };
    // SAFETY: NUL-terminated name.
    let p = unsafe { resolve_behind(DRIVER_NAMES[i].as_ptr().cast(), lib) } as usize;
    DRIVER[i].store(p, Ordering::Release);
    p
}

/// Casts a real pointer to a function type.
///
/// # Safety
/// `p` must be non-zero and point to a function of type `F`.
pub unsafe fn as_fn<F: Copy>(p: usize) -> F {
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
    // SAFETY: per the caller.
    unsafe { std::mem::transmute_copy::<usize, F>(&p) }
}
