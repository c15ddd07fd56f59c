//! How the library gets between a CUDA client and the driver, and how it finds the
//! driver behind itself.
//!
//! * The hooks are exported under the driver's names, so a client linked against
//!   `libcuda.so.1` binds to them (the library is first in the global scope).
//! * `dlsym` is exported as a naked trampoline: `RTLD_NEXT` lookups jump straight to
//!   glibc's `dlsym` with the caller's own return address, so other libraries'
//!   `RTLD_NEXT` still resolves relative to *them*; every other lookup goes through
//!   [`dlsym_hook`], which swaps a hooked name for the hook. This catches
//!   `dlopen(libcuda) + dlsym(handle, …)`, which never searches preloaded objects.
//! * `cuGetProcAddress`/`_v2` are hooks too: the driver's answer is kept as the real
//!   pointer of the variant [`gpa_table`](crate::gpa_table) says it is, and replaced by
//!   the hook of that same variant (same ABI).
//!
//! Real pointers live in plain atomics: no allocation or lock on these paths.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::ffi::{CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS, CUdevice, CUresult};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`, resolved with `dlvsym` (never with `dlsym`, which is ours).
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

macro_rules! hook_names {
    ($($sym:ident),* $(,)?) => {
        /// The driver and NVML entry points the library intercepts, by exported name.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Hook { $($sym),* }
        pub const HOOK_COUNT: usize = [$(Hook::$sym),*].len();
        /// Exported names, NUL-terminated, in `Hook` order.
        pub const HOOK_NAMES: [&str; HOOK_COUNT] = [$(concat!(stringify!($sym), "\0")),*];
        pub const ALL_HOOKS: [Hook; HOOK_COUNT] = [$(Hook::$sym),*];

        /// The address of the library's own function for `h`.
        #[cfg(not(test))]
        pub fn hook_address(h: Hook) -> usize {
            match h { $(Hook::$sym => crate::hooks::$sym as *const () as usize),* }
        }
    };
}

include!("hook_names.rs");

#[cfg(test)]
pub fn hook_address(_h: Hook) -> usize {
    0
}

static REAL: [AtomicUsize; HOOK_COUNT] = [const { AtomicUsize::new(0) }; HOOK_COUNT];

impl Hook {
    /// The exported name without its NUL.
    pub fn name(self) -> &'static str {
        let n = HOOK_NAMES[self as usize];
        &n[..n.len() - 1]
    }
}

/// The hook exported as `name`, if any. A linear scan of ~25 names, after a
/// two-byte prefix check that rejects almost every other `dlsym` at once.
pub fn find_hook(name: &[u8]) -> Option<Hook> {
    if !(name.starts_with(b"cu") || name.starts_with(b"nvml")) {
        return None;
    }
    ALL_HOOKS
        .iter()
        .copied()
        .find(|h| h.name().as_bytes() == name)
}

/// The address range of the front library (`libtessera_preload.so`) when it loaded
/// this one: its exports have the hooks' names and come first in the global scope,
/// so a lookup there finds them before the driver's. Empty when preloaded directly.
static FRONT: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];

/// Called once by the front library after it `dlopen`s this one, with the range its
/// segments span.
#[cfg(not(test))]
#[unsafe(no_mangle)]
pub extern "C" fn tessera_front_attach(lo: usize, hi: usize) {
    FRONT[0].store(lo, Ordering::Release);
    FRONT[1].store(hi, Ordering::Release);
}

/// Whether `p` is one of the front library's stubs (which jump back here). Without an
/// attach (this library preloaded directly, say by a tenant's `LD_PRELOAD`, ahead of
/// the front), the front is looked for among the loaded objects, once, by file name.
pub fn in_front(p: usize) -> bool {
    if FRONT[1].load(Ordering::Acquire) == 0 {
        find_front();
    }
    (FRONT[0].load(Ordering::Acquire)..FRONT[1].load(Ordering::Acquire)).contains(&p)
}

/// Records the range of a loaded `libtessera_preload.so`, or an empty non-zero range
/// if there is none (so that the search runs once). Cold: lookups only.
fn find_front() {
    let front = crate::elf_symbols::find_object(&mut |name, _, _| {
        name.to_bytes().ends_with(b"/libtessera_preload.so")
    });
    match front {
        Some((_, lo, hi)) => {
            FRONT[0].store(lo, Ordering::Release);
            FRONT[1].store(hi, Ordering::Release);
        }
        None => {
            let _ = FRONT[1].compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}

/// Records `p` as the driver's pointer for `h`, unless it is the hook itself or the
/// front's stub for it (a lookup in the global scope finds those first).
pub fn remember(h: Hook, p: *mut c_void) {
    let p = p as usize;
    if p != 0 && p != hook_address(h) && !in_front(p) {
        REAL[h as usize].store(p, Ordering::Release);
    }
}

/// The driver's function for `h`: the pointer last handed out by the driver's own
/// `dlsym`/`cuGetProcAddress`, else resolved behind the library. 0 when there is none.
#[inline]
pub fn real(h: Hook) -> usize {
    let v = REAL[h as usize].load(Ordering::Acquire);
    if v != 0 {
        return v;
    }
    resolve_real(h)
}

#[cold]
#[inline(never)]
fn resolve_real(h: Hook) -> usize {
    let lib: &CStr = if h.name().starts_with("nvml") {
        c"libnvidia-ml.so.1"
    } else {
        c"libcuda.so.1"
    };
    // SAFETY: NUL-terminated name from the table.
    let p = unsafe { resolve_behind(HOOK_NAMES[h as usize].as_ptr().cast(), lib) };
    remember(h, p);
    REAL[h as usize].load(Ordering::Acquire)
}

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
            return Some(crate::sizes::format_uuid(&raw));
        }
    }
    None
}

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

/// Finds `name` in the objects after this library, then in `lib` if it is loaded
/// (a client may have opened it `RTLD_LOCAL`), loading `lib` as a last resort.
///
/// # Safety
/// `name` must be a NUL-terminated string.
unsafe fn resolve_behind(name: *const c_char, lib: &CStr) -> *mut c_void {
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

/// Every lookup except `RTLD_NEXT`: the driver's answer, with a hooked name swapped
/// for the hook (the driver's pointer is kept as the real one).
///
/// # Safety
/// Called by the trampoline with `dlsym`'s arguments.
#[cfg(not(test))]
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
    match find_hook(bytes) {
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
#[cfg(all(not(test), target_arch = "x86_64"))]
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

/// [`resolve_real_dlsym`] for the trampoline.
#[cfg(not(test))]
extern "C" fn resolve_real_dlsym_c() -> usize {
    resolve_real_dlsym()
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

/// Makes an `int` argument usable as an index guard.
pub fn ordinal(dev: c_int) -> Option<usize> {
    usize::try_from(dev).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpa_table::VARIANTS;

    /// Every CUDA hook is a variant the lookup table knows, so cuGetProcAddress
    /// can hand it out.
    #[test]
    fn every_cuda_hook_is_a_known_variant() {
        for h in ALL_HOOKS {
            if h.name().starts_with("cu") {
                assert!(
                    VARIANTS.iter().any(|v| v.symbol() == h.name())
                        || crate::gpa_table::BEYOND_TABLE.contains(&h.name()),
                    "{} not in gpa-variants.tsv",
                    h.name()
                );
            }
        }
        assert_eq!(find_hook(b"cuMemAlloc_v2"), Some(Hook::cuMemAlloc_v2));
        assert_eq!(find_hook(b"cuMemAlloc"), None);
        assert_eq!(find_hook(b"puts"), None);
    }
}
