//! `cuGetProcAddress`/`_v2` (the driver answers, the library swaps in the hook of the
//! same variant) and `cuInit`, where a CUDA process loads its claims.
#![allow(non_snake_case)]

use super::*;

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
