//! Finding what is behind the library: glibc's own `dlsym` (the library exports one of
//! its own), and a driver or NVML function in the objects after this library or in its
//! library (`libcuda.so.1`, `libnvidia-ml.so.1`), which a client may have opened
//! `RTLD_LOCAL`.
//!
//! Nothing here runs at load: glibc's `dlsym` is looked up at the first `dlsym(RTLD_NEXT,
//! …)` or the first function resolved.

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::front::in_front;

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`, resolved with `dlvsym` (never with `dlsym`, which is ours). The
/// exported `dlsym` trampoline jumps through it.
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// glibc's `dlsym`, resolved on first use.
pub fn real_dlsym() -> Option<DlsymFn> {
    let mut v = REAL_DLSYM.load(Ordering::Acquire);
    if v == 0 {
        v = resolve_real_dlsym();
    }
    // SAFETY: a non-zero value is glibc's dlsym.
    (v != 0).then(|| unsafe { std::mem::transmute::<usize, DlsymFn>(v) })
}

/// Looks up glibc's `dlsym` by version (2.34 moved it into libc; 2.2.5 is the x86-64
/// base version) and stores it. Behind this library first (`RTLD_NEXT`: preloaded
/// directly, another interposer's `dlsym` after it stays in the chain); if that finds the front library's
/// `dlsym` (unversioned, so any version matches it, and glibc before 2.34 searches
/// the global scope, where the front comes first), in libc or libdl by handle.
pub fn resolve_real_dlsym() -> usize {
    for ver in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: dlvsym with valid C strings.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), ver.as_ptr()) };
        if !p.is_null() && !in_front(p as usize) {
            REAL_DLSYM.store(p as usize, Ordering::Release);
            return p as usize;
        }
    }
    for (lib, ver) in [
        (c"libc.so.6", c"GLIBC_2.34"),
        (c"libdl.so.2", c"GLIBC_2.2.5"),
    ] {
        // SAFETY: RTLD_NOLOAD only finds an object already loaded.
        let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if h.is_null() {
            continue;
        }
        // SAFETY: a handle and valid C strings.
        let p = unsafe { libc::dlvsym(h, c"dlsym".as_ptr(), ver.as_ptr()) };
        if !p.is_null() {
            REAL_DLSYM.store(p as usize, Ordering::Release);
            return p as usize;
        }
    }
    0
}

/// [`resolve_real_dlsym`] for the exported `dlsym` trampoline (called from assembly).
#[cfg(not(test))]
pub extern "C" fn resolve_real_dlsym_c() -> usize {
    resolve_real_dlsym()
}

/// Finds `name` in the objects after this library, then in `lib` if it is loaded
/// (a client may have opened it `RTLD_LOCAL`), loading `lib` as a last resort.
///
/// # Safety
/// `name` must be a NUL-terminated string.
pub unsafe fn resolve_behind(name: *const c_char, lib: &CStr) -> *mut c_void {
    let Some(dlsym) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: glibc dlsym with a valid name.
    let p = unsafe { dlsym(libc::RTLD_NEXT, name) };
    if !p.is_null() && !in_front(p as usize) {
        return p;
    }
    for mode in [
        libc::RTLD_NOW | libc::RTLD_NOLOAD,
        libc::RTLD_NOW | libc::RTLD_LOCAL,
    ] {
        // SAFETY: dlopen with a valid name; the handle stays open (as the client's does).
        let h = unsafe { libc::dlopen(lib.as_ptr(), mode) };
        if !h.is_null() {
            // SAFETY: as above.
            return unsafe { dlsym(h, name) };
        }
    }
    std::ptr::null_mut()
}
