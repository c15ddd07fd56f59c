//! Finding what is behind the library: glibc's own `dlsym` (the library exports one of
//! its own), and a driver or NVML function: in the real driver file where Tessera's
//! soname shims put it (`/usr/local/tessera/driver/libcuda.real`, loaded as the shim's
//! dependency), else in the objects after this library or in its library
//! (`libcuda.so.1`, `libnvidia-ml.so.1`), which a client may have opened `RTLD_LOCAL`.
//! An answer inside Tessera's own stubs (the front or a shim) is never taken.
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

/// Where the plugin mounts the real driver libraries in a container whose
/// `libcuda.so.1` and `libnvidia-ml.so.1` are Tessera's shims (each NEEDs its real
/// file by this absolute path; `tessera_abi::CONTAINER_DRIVER_DIR`). The names are not
/// sonames, so no library search by soname finds them.
pub fn real_file_of(lib: &CStr) -> &'static CStr {
    if lib.to_bytes().starts_with(b"libnvidia-ml") {
        c"/usr/local/tessera/driver/libnvidia-ml.real"
    } else {
        c"/usr/local/tessera/driver/libcuda.real"
    }
}

/// `name` in the real file behind `lib`'s shim, if that file is loaded: `Some` with
/// its function (or null when it has none), `None` when it is not loaded.
///
/// # Safety
/// `name` must be a NUL-terminated string.
unsafe fn from_real_file(dlsym: DlsymFn, name: *const c_char, lib: &CStr) -> Option<*mut c_void> {
    // SAFETY: RTLD_NOLOAD only finds an object already loaded (the shim's dependency).
    let real = unsafe {
        libc::dlopen(
            real_file_of(lib).as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if real.is_null() {
        return None;
    }
    // SAFETY: glibc dlsym with a handle and a valid name. The real file's search list
    // starts with itself: its own function, or nothing.
    let p = unsafe { dlsym(real, name) };
    Some(not_a_stub(p))
}

/// `p`, or null when it lies in Tessera's stubs (they would jump back here).
fn not_a_stub(p: *mut c_void) -> *mut c_void {
    if !p.is_null() && in_front(p as usize) {
        std::ptr::null_mut()
    } else {
        p
    }
}

/// Finds `name` in the real driver file behind the shim of `lib` if it is loaded,
/// else in the objects after this library, then in `lib` if it is loaded (a client
/// may have opened it `RTLD_LOCAL`), loading `lib` as a last resort. Never an address
/// inside Tessera's stubs (null instead).
///
/// # Safety
/// `name` must be a NUL-terminated string.
pub unsafe fn resolve_behind(name: *const c_char, lib: &CStr) -> *mut c_void {
    let Some(dlsym) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: per the caller.
    if let Some(p) = unsafe { from_real_file(dlsym, name, lib) } {
        return p;
    }
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
            // Tessera's shim at the soname: its real file is loaded now.
            // SAFETY: per the caller.
            if let Some(p) = unsafe { from_real_file(dlsym, name, lib) } {
                return p;
            }
            // SAFETY: as above.
            return not_a_stub(unsafe { dlsym(h, name) });
        }
    }
    std::ptr::null_mut()
}
