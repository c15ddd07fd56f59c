//! The release build's libdl and libpthread functions, found when first called.
//!
//! The release artifact targets glibc 2.17 (cargo-zigbuild), where `dlopen`, `dlvsym`,
//! `pthread_create` and the rest live in `libdl.so.2` and `libpthread.so.0`. Linked
//! the ordinary way they become NEEDED, and ld.so then loads two more libraries into
//! every process of the container: about 95 µs of every process start on glibc 2.34
//! and later, where both are empty stubs (their functions moved into libc). This
//! module defines each of those functions inside the library instead, as a hidden
//! symbol (never exported: it interposes nothing) that jumps to the real function,
//! found at its first call by name *and* version in the objects the process has
//! loaded: libc on glibc 2.34 and later; on older glibc, libdl or libpthread, which a
//! CUDA process always has (the driver and NVML need both).
//!
//! The jump keeps the caller's return address, so `dlvsym(RTLD_NEXT, …)` still
//! searches after this library. A function not found (old glibc, in a process that
//! never loaded libpthread) returns NULL or `ENOSYS`, chosen so that its callers in the
//! library give up cleanly (no flusher thread: launches count directly), and is looked
//! up again at its next call. An object a function was found in other than libc is
//! pinned (`RTLD_NODELETE`): libdl is not, and the stored address must outlive
//! whichever library brought it in. `pthread_atfork` is not a shim: it is glibc's
//! `__register_atfork` (in libc.so.6 since 2.3.2, so never missing), given the
//! library's image base as its DSO handle. Only the zig build uses this (`build.rs` sets
//! `tessera_glibc_shims`); the ordinary build links glibc's own.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a shim returns when its function is nowhere to be found.
#[derive(Clone, Copy)]
enum Fail {
    /// A pointer (`dlopen`, `dlvsym`): NULL.
    Null,
    /// An error number (the `pthread_*` functions): `ENOSYS`.
    Errno,
    /// `dladdr`: 0, "not found"; `pthread_attr_setstacksize`: 0, "done" (std asserts
    /// that a failure is `EINVAL`; the `pthread_create` after it then fails cleanly).
    Zero,
}

macro_rules! shims {
    ($($i:literal $name:ident $ver:literal $fail:ident),* $(,)?) => {
        /// (name, version, failure) per shim, NUL-terminated, in slot order.
        const SHIMS: &[(&[u8], &[u8], Fail)] = &[
            $((concat!(stringify!($name), "\0").as_bytes(), concat!($ver, "\0").as_bytes(), Fail::$fail)),*
        ];
        const COUNT: usize = SHIMS.len();

        // Each shim jumps to its slot's function, or on its first call to the slow
        // path with its slot number in eax. The slow path keeps the six argument
        // registers across the lookup and jumps in turn: the function sees the
        // caller's arguments and return address.
        core::arch::global_asm!(
            $(
                concat!(".globl ", stringify!($name)),
                concat!(".hidden ", stringify!($name)),
                concat!(".type ", stringify!($name), ",@function"),
                ".p2align 4",
                concat!(stringify!($name), ":"),
                ".cfi_startproc",
                concat!("mov rax, qword ptr [rip + {slots} + 8 * ", $i, "]"),
                "test rax, rax",
                "jz 2f",
                "jmp rax",
                "2:",
                concat!("mov eax, ", $i),
                "jmp .Ltessera_shim_slow",
                ".cfi_endproc",
                concat!(".size ", stringify!($name), ", . - ", stringify!($name)),
            )*
            // Unwind information (the frame is the shim's caller's until the pushes)
            // so that debuggers and profilers can walk out of a lookup.
            ".p2align 4",
            ".Ltessera_shim_slow:",
            ".cfi_startproc",
            "push rdi",
            ".cfi_adjust_cfa_offset 8",
            "push rsi",
            ".cfi_adjust_cfa_offset 8",
            "push rdx",
            ".cfi_adjust_cfa_offset 8",
            "push rcx",
            ".cfi_adjust_cfa_offset 8",
            "push r8",
            ".cfi_adjust_cfa_offset 8",
            "push r9",
            ".cfi_adjust_cfa_offset 8",
            "sub rsp, 8",
            ".cfi_adjust_cfa_offset 8",
            "mov edi, eax",
            "call {resolve}",
            "add rsp, 8",
            ".cfi_adjust_cfa_offset -8",
            "pop r9",
            ".cfi_adjust_cfa_offset -8",
            "pop r8",
            ".cfi_adjust_cfa_offset -8",
            "pop rcx",
            ".cfi_adjust_cfa_offset -8",
            "pop rdx",
            ".cfi_adjust_cfa_offset -8",
            "pop rsi",
            ".cfi_adjust_cfa_offset -8",
            "pop rdi",
            ".cfi_adjust_cfa_offset -8",
            "jmp rax",
            ".cfi_endproc",
            // pthread_atfork(prepare, parent, child) is
            // __register_atfork(prepare, parent, child, &__dso_handle), the address
            // lld gives `__dso_handle` being the image base. (Nothing would drop the
            // handlers if the library were unloaded: it is preloaded, never unloaded.)
            ".globl pthread_atfork",
            ".hidden pthread_atfork",
            ".type pthread_atfork,@function",
            ".p2align 4",
            "pthread_atfork:",
            ".cfi_startproc",
            "lea rcx, [rip + __dso_handle]",
            "jmp qword ptr [rip + __register_atfork@GOTPCREL]",
            ".cfi_endproc",
            ".size pthread_atfork, . - pthread_atfork",
            slots = sym SLOTS,
            resolve = sym resolve,
        );
    };
}

/// The real functions, filled at first use.
static SLOTS: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];

shims!(
    0 dlopen "GLIBC_2.2.5" Null,
    1 dlvsym "GLIBC_2.2.5" Null,
    2 dladdr "GLIBC_2.2.5" Zero,
    3 pthread_attr_getguardsize "GLIBC_2.2.5" Errno,
    4 pthread_attr_getstack "GLIBC_2.2.5" Errno,
    5 pthread_attr_setstacksize "GLIBC_2.2.5" Zero,
    6 pthread_create "GLIBC_2.2.5" Errno,
    7 pthread_detach "GLIBC_2.2.5" Errno,
    8 pthread_getattr_np "GLIBC_2.2.5" Errno,
    9 pthread_key_create "GLIBC_2.2.5" Errno,
    10 pthread_key_delete "GLIBC_2.2.5" Errno,
    11 pthread_rwlock_rdlock "GLIBC_2.2.5" Errno,
    12 pthread_rwlock_unlock "GLIBC_2.2.5" Errno,
    13 pthread_rwlock_wrlock "GLIBC_2.2.5" Errno,
    14 pthread_setname_np "GLIBC_2.12" Errno,
    15 pthread_setspecific "GLIBC_2.2.5" Errno,
);

extern "C" fn fail_null() -> *mut c_void {
    std::ptr::null_mut()
}

extern "C" fn fail_errno() -> c_int {
    libc::ENOSYS
}

extern "C" fn fail_zero() -> c_int {
    0
}

/// The function for slot `i`, stored for the next call; if it is not loaded, the
/// slot's failure (not stored: a later call looks again).
extern "C" fn resolve(i: u32) -> usize {
    let Some(&(name, ver, fail)) = SHIMS.get(i as usize) else {
        return fail_null as *const () as usize;
    };
    let (found, object) = super::elf_symbols::find(name, ver);
    if found != 0 {
        pin(object);
        SLOTS[i as usize].store(found, Ordering::Release);
        return found;
    }
    match fail {
        Fail::Null => fail_null as *const () as usize,
        Fail::Errno => fail_errno as *const () as usize,
        Fail::Zero => fail_zero as *const () as usize,
    }
}

/// Objects already pinned, by name pointer (libdl and libpthread at most).
static PINNED: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

/// Keeps the object a function was found in loaded for good (`RTLD_NODELETE`), unless
/// it is libc (never unloaded): libdl is not marked so, and if the library that brought
/// it in were closed, the stored address would dangle. Marked before the `dlopen`, so
/// that the lookup of `dlopen` itself (a shim) does not come back here.
fn pin(object: *const c_char) {
    if object.is_null() {
        return;
    }
    // SAFETY: ld.so's name for a loaded object: a NUL-terminated string.
    let name = unsafe { std::ffi::CStr::from_ptr(object) }.to_bytes();
    if name.is_empty() || name.windows(7).any(|w| w == b"libc.so") {
        return;
    }
    for slot in &PINNED {
        match slot.compare_exchange(0, object as usize, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                // SAFETY: the object is loaded (RTLD_NOLOAD only adds the flag).
                unsafe {
                    libc::dlopen(
                        object,
                        libc::RTLD_LAZY | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
                    )
                };
                return;
            }
            Err(v) if v == object as usize => return,
            Err(_) => {}
        }
    }
}
