//! The few CUDA driver and NVML types and constants the library touches (cuda.h,
//! nvml.h; facts B4 and B5). Only what the hooks read or write.
#![forbid(unsafe_code)]

use std::ffi::{c_int, c_uint, c_void};

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
/// Returned when the real driver entry point cannot be found at all.
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;

/// `CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

/// `CUmemAllocationProp` up to the location (the rest is not read).
#[repr(C)]
pub struct CUmemAllocationProp {
    pub alloc_type: c_int,
    pub requested_handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
}

/// `CUDA_ARRAY_DESCRIPTOR_v2`.
#[repr(C)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_int,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v2`.
#[repr(C)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_int,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
#[derive(Default)]
pub struct ArrayMemoryRequirements {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [c_uint; 4],
}

/// Bytes per channel element of a `CUarray_format`, or `None` for formats the
/// library does not size (it then assumes the widest, 16 bytes, for its estimate).
pub fn format_bytes(format: c_int) -> Option<u64> {
    match format {
        0x01 | 0x08 => Some(1),        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => Some(2), // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => Some(4), // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => None,
    }
}

/// `CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
/// `CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT`.
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;

/// `CUlimit` values that reserve device memory (facts B4.1, accounting table).
pub const CU_LIMIT_STACK_SIZE: c_int = 0;
pub const CU_LIMIT_PRINTF_FIFO_SIZE: c_int = 1;
pub const CU_LIMIT_MALLOC_HEAP_SIZE: c_int = 2;

pub type NvmlReturn = c_int;
pub type NvmlDevice = *mut c_void;
pub const NVML_SUCCESS: NvmlReturn = 0;
/// `NVML_ERROR_FUNCTION_NOT_FOUND`.
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;

/// `nvmlMemory_t` (v1).
#[repr(C)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}
