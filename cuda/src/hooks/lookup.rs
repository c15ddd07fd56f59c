//! The lookups that hand out hooks, and `cuInit`, where a CUDA process loads its
//! claims.
//!
//! * `dlsym` is exported as a naked trampoline: `RTLD_NEXT` lookups jump straight to
//!   glibc's `dlsym` with the caller's own return address, so other libraries'
//!   `RTLD_NEXT` still resolves relative to *them*; every other lookup goes through
//!   [`dlsym_hook`], which swaps a hooked name for the hook. This catches
//!   `dlopen(libcuda) + dlsym(handle, …)`, which never searches preloaded objects.
//! * `cuGetProcAddress`/`_v2` are hooks too: the driver's answer is kept as the real
//!   pointer of the variant [`gpa_table`] says it is, and replaced by the hook of that
//!   same variant (same ABI).
#![allow(non_snake_case)]

use super::*;
use crate::loader::resolve::{REAL_DLSYM, real_dlsym, resolve_real_dlsym_c};

/// Every lookup except `RTLD_NEXT`: the driver's answer, with a hooked name swapped
/// for the hook (the driver's pointer is kept as the real one).
///
/// # Safety
/// Called by the trampoline with `dlsym`'s arguments.
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn dlsym_hook(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let Some(dlsym) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: forwarding the caller's arguments.
    let p = unsafe { dlsym(handle, name) };
    if p.is_null() || name.is_null() {
        return p;
    }
    // SAFETY: dlsym found `name`, so it is a valid C string.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    match hook_table::find_hook(bytes) {
        Some(h) => {
            remember(h, p);
            hook_address(h) as *mut c_void
        }
        None => p,
    }
}

/// The exported `dlsym`: `RTLD_NEXT` (-1) jumps to glibc with the caller's return
/// address intact; everything else goes to [`dlsym_hook`]. The first `RTLD_NEXT`
/// lookup resolves glibc's `dlsym` (keeping the caller's arguments) and jumps to it
/// the same way; resolving it lazily spares every process that never calls `dlsym` a
/// lookup at load.
///
/// # Safety
/// Has `dlsym`'s contract.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    // Unwind information, so that debuggers and profilers can walk out of a lookup.
    core::arch::naked_asm!(
        ".cfi_startproc",
        "cmp rdi, -1",
        "jne {hook}",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "push rdi",
        ".cfi_adjust_cfa_offset 8",
        "push rsi",
        ".cfi_adjust_cfa_offset 8",
        "sub rsp, 8",
        ".cfi_adjust_cfa_offset 8",
        "call {resolve}",
        "add rsp, 8",
        ".cfi_adjust_cfa_offset -8",
        "pop rsi",
        ".cfi_adjust_cfa_offset -8",
        "pop rdi",
        ".cfi_adjust_cfa_offset -8",
        "test rax, rax",
        "jz {hook}",
        "jmp rax",
        ".cfi_endproc",
        hook = sym dlsym_hook,
        real = sym REAL_DLSYM,
        resolve = sym resolve_real_dlsym_c,
    )
}

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
    if let Some(h) = hook_table::find_hook(sym.as_bytes()) {
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
