//! `libtessera_preload.so`, the front library: what `/etc/ld.so.preload` names in a
//! shared-GPU container, so what every process of the container loads.
//!
//! Most of those processes never touch CUDA (shells, `cat`, the entrypoint's
//! children), and a preloaded library costs each of them its load: the interception
//! library itself (`libtessera_cuda.so`, built with std) costs about +90 µs per
//! process start, mostly ld.so relocating and faulting in its pages. This library is
//! the part every process pays for: no std, no relocation per hook, a few pages. It
//! exports the interception library's hooks (the list in `tessera_symbols::for_each_hook!`) as jumps
//! through a table, and `dlsym`. At the first call of a hook, or the first `dlsym` of a
//! hooked name, it `dlopen`s `libtessera_cuda.so` from its own directory
//! (`RTLD_LOCAL`: the hooks stay reachable only through here), fills the table, and
//! from then on each hook is one indirect jump into the interception library.
//!
//! * `dlsym` of a hooked name goes to the interception library's `dlsym`, which swaps
//!   the driver's function for the hook; every other name jumps straight to glibc's
//!   `dlsym` with the caller's return address (so `RTLD_NEXT` still searches after the
//!   caller). A process that only looks up other names never loads it.
//! * It tells the interception library where its own stubs are
//!   (`tessera_front_attach`), so a lookup that finds them is never taken for the
//!   driver.
//! * At load it runs one check ([`refuse_interposers_ahead`]): a library that
//!   `LD_PRELOAD` put ahead of this one and that defines `dlsym` or a hooked name stops
//!   the process, which it would otherwise take around the budget.
//! * **Fails closed.** If the interception library cannot be loaded (missing, not the
//!   build beside this one), every hook returns 999 (`CUDA_ERROR_UNKNOWN`, and
//!   `NVML_ERROR_UNKNOWN`), a hooked name looked up by `dlsym` is that failure too, and
//!   one line says why on stderr: a claim is never run unenforced.
//!
//! `dlopen`, `dlsym` and `dlerror` are found by name and version in the loaded objects
//! (`tessera_symbols::elf`): libc on glibc 2.34 and later, libdl before (which every
//! process that can reach CUDA has). The only NEEDED object is libc; the functions
//! linked by name are `dl_iterate_phdr`, `write`, `abort`, `_exit` and what `core` calls
//! (`memcpy`, `memset`, `strlen`, `bcmp`), none newer than `GLIBC_2.14`.
//!
//! This crate is an rlib; three cdylib crates make libraries of it, each naming its
//! kind with [`library!`]: `tessera-preload` (`libtessera_preload.so`, the front) and
//! `tessera-shim-cuda`/`tessera-shim-nvml` (the soname shims). Without std they build
//! only with `panic=abort` (`cargo preload`); see `cuda/README.md` for the figures.
//!
//! **The soname shims** are Tessera's `libcuda.so.1` and `libnvidia-ml.so.1`, which the
//! plugin mounts at the driver's own paths in a shared-claim container, each NEEDing
//! the real library at a fixed path whose name is no soname
//! (`/usr/local/tessera/driver/libcuda.real`, `…/libnvidia-ml.real`). A program that
//! links or `dlopen`s the driver by soname then gets the shim first and the real
//! driver behind it: `dlsym` on the handle and direct binding find a hooked name in the
//! shim (its stub) and every other name in the real driver, even when `ld.so.preload`
//! was skipped. A shim loads the interception library from the fixed
//! [`CORE_PATH`] (it is not mounted beside it), runs no check at load (libc, ahead of
//! it in every process, defines `dlsym`), and exports `tessera_shim`, which the
//! front's check and the interception library recognise.

// The stubs are x86-64 assembly; on other targets this crate and the libraries made
// of it are empty (the plugin then refuses shared claims: it installs the interception
// library only with its front).
#![cfg(target_arch = "x86_64")]
#![no_std]
#![allow(non_snake_case, non_camel_case_types)]

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use tessera_symbols::elf as elf_symbols;

/// Defines what a library made of this crate decides by its kind: `library!(preload)`
/// for the front (its check at load, [`refuse_interposers_ahead`]; the interception
/// library beside it), `library!(shim)` for a soname shim (exports `tessera_shim`; the
/// interception library at [`CORE_PATH`]). Also the panic handler and the stand-in
/// `rust_eh_personality` that a library without std needs. Invoked once, at the root of
/// the cdylib crate.
#[macro_export]
macro_rules! library {
    (preload) => {
        $crate::__library_common!(0);
        /// Run by ld.so before `main`, the one thing the front does at load (a shim
        /// comes after libc, which defines `dlsym`).
        #[used]
        #[unsafe(link_section = ".init_array")]
        static CHECK_AT_LOAD: unsafe extern "C" fn() = $crate::refuse_interposers_ahead;
    };
    (shim) => {
        $crate::__library_common!(1);
        /// Marks a soname shim: the front's check lets it come first, and the
        /// interception library never takes an address inside it for the driver's.
        #[unsafe(no_mangle)]
        pub extern "C" fn tessera_shim() {}
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __library_common {
    ($kind:literal) => {
        #[panic_handler]
        fn panic(_: &core::panic::PanicInfo) -> ! {
            $crate::abort_process()
        }

        // core's precompiled code carries unwind tables naming `rust_eh_personality`,
        // which a library without std does not have; nothing here unwinds
        // (panic=abort), so a hidden definition that traps keeps ld.so from having to
        // resolve the name. `tessera_front_kind` is the byte [`library!`] sets: hidden,
        // so reading it costs no relocation.
        core::arch::global_asm!(
            ".globl rust_eh_personality",
            ".hidden rust_eh_personality",
            ".type rust_eh_personality,@function",
            "rust_eh_personality:",
            "ud2",
            ".size rust_eh_personality, . - rust_eh_personality",
            ".pushsection .rodata.tessera_front_kind,\"a\",@progbits",
            ".globl tessera_front_kind",
            ".hidden tessera_front_kind",
            ".type tessera_front_kind,@object",
            "tessera_front_kind:",
            concat!(".byte ", $kind),
            ".size tessera_front_kind, 1",
            ".popsection",
        );
    };
}

/// Whether this library is a soname shim (`library!(shim)`), not the front.
fn is_shim() -> bool {
    let kind: u32;
    // SAFETY: reads the byte `library!` defines in every library made of this crate,
    // PC-relative (it is hidden: no relocation, no GOT).
    unsafe {
        core::arch::asm!(
            "movzx {k:e}, byte ptr [rip + tessera_front_kind]",
            k = out(reg) kind,
            options(nostack, readonly, pure, preserves_flags),
        );
    }
    kind == 1
}

/// The panic handler's end (`library!`): nothing here unwinds.
#[doc(hidden)]
pub fn abort_process() -> ! {
    // SAFETY: abort has no preconditions.
    unsafe { abort() }
}

#[link(name = "c")]
unsafe extern "C" {
    fn abort() -> !;
    fn write(fd: c_int, buf: *const c_void, n: usize) -> isize;
    fn _exit(status: c_int) -> !;
}

/// How a process stopped by [`refuse_interposers_ahead`] exits (126: "cannot
/// execute", as a shell says for a command it could not run).
const STOPPED: c_int = 126;

/// Stops the process if an object loaded ahead of this one (which only `LD_PRELOAD`
/// can place there) defines `dlsym`, `dlvsym` or a hooked CUDA or NVML name: ld.so
/// would bind the program's lookups to it before this library's, so a program that
/// `dlopen`s the driver and looks its functions up (as cudart, PyTorch and
/// cuda-bindings do) would get the bare driver. `LD_PRELOAD=libc.so.6` (glibc 2.34+
/// defines `dlsym`) and a preloaded driver are the configurations this stops; the
/// interception library itself (it defines `tessera_front_attach`) may come first.
/// Tessera's soname shim (it defines `tessera_shim`) may come first too: it is this
/// library's twin. It cannot wait for the first CUDA call: the program never calls
/// through here. Costs one walk of the objects ahead (normally the program alone).
///
/// # Safety
/// Run by ld.so from the front's `.init_array` (`library!(preload)`), before `main`.
#[doc(hidden)]
pub unsafe extern "C" fn refuse_interposers_ahead() {
    let me = refuse_interposers_ahead as *const () as usize;
    let Some((object, name)) = elf_symbols::defined_ahead(
        me,
        &[b"dlsym\0dlvsym\0", NAMES],
        b"tessera_front_attach\0tessera_shim\0",
    ) else {
        return;
    };
    put(b"tessera: ");
    if !object.is_null() {
        // SAFETY: ld.so's name for a loaded object.
        put(unsafe { cstr(object) });
    }
    put(b" is loaded ahead of Tessera's interposer (LD_PRELOAD) and defines ");
    put(name.strip_suffix(b"\0").unwrap_or(name));
    put(b": CUDA could reach the GPU around this container's budget, so the process stops; remove it from LD_PRELOAD\n");
    // SAFETY: ends the process; nothing of it has run yet.
    unsafe { _exit(STOPPED) }
}

/// The interception library's file name, looked for beside the front.
const CORE_FILE: &[u8] = b"libtessera_cuda.so";
/// Where a shim loads the interception library from: the plugin's library directory
/// in the container (`CONTAINER_LIB_DIR`), NUL-terminated. A shim is mounted at the
/// driver's path, so its own directory is the driver's.
const CORE_PATH: &[u8] = b"/usr/local/tessera/lib/libtessera_cuda.so\0";

/// What a hook returns when the interception library could not be loaded:
/// `CUDA_ERROR_UNKNOWN`, which is also `NVML_ERROR_UNKNOWN`.
const UNKNOWN: c_int = 999;
const RTLD_NOW: c_int = 2;

macro_rules! hook_names {
    ($($sym:ident),* $(,)?) => {
        /// The hooks, in `tessera_symbols::for_each_hook!` order (the table's).
        #[repr(usize)]
        #[derive(Clone, Copy)]
        enum Hook { $($sym),* }
        const COUNT: usize = [$(Hook::$sym),*].len();
        /// Exported names, each ended by a NUL, in table order: one string (an
        /// array of slices would be a relocation per name at load).
        const NAMES: &[u8] = concat!($(stringify!($sym), "\0"),*).as_bytes();

        $(
            /// Jumps to the interception library's hook; on the first call, through
            /// [`slow_path`] with the hook's index in eax.
            ///
            /// # Safety
            /// The driver's contract for this entry point: the arguments reach the
            /// hook untouched.
            #[unsafe(naked)]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $sym() {
                core::arch::naked_asm!(
                    ".cfi_startproc",
                    "mov rax, qword ptr [rip + {table} + {offset}]",
                    "test rax, rax",
                    "jz 2f",
                    "jmp rax",
                    "2:",
                    "mov eax, {index}",
                    "jmp {slow}",
                    ".cfi_endproc",
                    table = sym TABLE,
                    offset = const Hook::$sym as usize * 8,
                    index = const Hook::$sym as usize,
                    slow = sym slow_path,
                )
            }
        )*
    };
}

tessera_symbols::for_each_hook!(hook_names);

/// The interception library's hooks, filled when it is loaded (zero before: `.bss`,
/// nothing for ld.so to relocate).
static TABLE: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];
/// The interception library's `dlsym`, and glibc's.
static CORE_DLSYM: AtomicUsize = AtomicUsize::new(0);
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

const NOT_TRIED: u8 = 0;
const LOADED: u8 = 1;
const FAILED: u8 = 2;
/// Whether the interception library is loaded. Two threads may both load it (the
/// second `dlopen` returns the same handle and both fill the table alike); a success
/// sets the state, a failure only if nothing did before (and says why, once).
static STATE: AtomicU8 = AtomicU8::new(NOT_TRIED);

/// A hook's first call: keeps the six argument registers and xmm0–7 across the load
/// and jumps to the hook (or to [`fail_unknown`]) with the caller's arguments and
/// return address.
#[unsafe(naked)]
unsafe extern "C" fn slow_path() {
    // At entry rsp is 8 mod 16 (the caller's call); six pushes keep it so, and 136
    // bytes more align it for movaps and the call.
    core::arch::naked_asm!(
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
        "sub rsp, 136",
        ".cfi_adjust_cfa_offset 136",
        "movaps xmmword ptr [rsp], xmm0",
        "movaps xmmword ptr [rsp + 16], xmm1",
        "movaps xmmword ptr [rsp + 32], xmm2",
        "movaps xmmword ptr [rsp + 48], xmm3",
        "movaps xmmword ptr [rsp + 64], xmm4",
        "movaps xmmword ptr [rsp + 80], xmm5",
        "movaps xmmword ptr [rsp + 96], xmm6",
        "movaps xmmword ptr [rsp + 112], xmm7",
        "mov edi, eax",
        "call {target}",
        "movaps xmm0, xmmword ptr [rsp]",
        "movaps xmm1, xmmword ptr [rsp + 16]",
        "movaps xmm2, xmmword ptr [rsp + 32]",
        "movaps xmm3, xmmword ptr [rsp + 48]",
        "movaps xmm4, xmmword ptr [rsp + 64]",
        "movaps xmm5, xmmword ptr [rsp + 80]",
        "movaps xmm6, xmmword ptr [rsp + 96]",
        "movaps xmm7, xmmword ptr [rsp + 112]",
        "add rsp, 136",
        ".cfi_adjust_cfa_offset -136",
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
        target = sym hook_target,
    )
}

/// The function hook `i` jumps to: the interception library's, loaded if need be, or
/// the failure.
extern "C" fn hook_target(i: u32) -> usize {
    if loaded()
        && let Some(p) = TABLE.get(i as usize).map(|t| t.load(Ordering::Acquire))
        && p != 0
    {
        return p;
    }
    fail_unknown as *const () as usize
}

/// Every hook, when the interception library could not be loaded.
extern "C" fn fail_unknown() -> c_int {
    UNKNOWN
}

/// The exported `dlsym`. A name that cannot be a hook (not `cu…`/`nvml…`) jumps to
/// glibc's `dlsym` at once; the rest go through [`dlsym_target`]. Either way the
/// function jumped to sees the caller's arguments and return address.
///
/// # Safety
/// Has `dlsym`'s contract.
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    // Byte by byte, so a short name is never read past its NUL.
    core::arch::naked_asm!(
        ".cfi_startproc",
        "test rsi, rsi",
        "jz 3f",
        "movzx eax, byte ptr [rsi]",
        "cmp eax, 0x63", // 'c'
        "jne 2f",
        "cmp byte ptr [rsi + 1], 0x75", // 'u'
        "je 4f",
        "jmp 3f",
        "2:",
        "cmp eax, 0x6e", // 'n'
        "jne 3f",
        "cmp byte ptr [rsi + 1], 0x76", // 'v'
        "jne 3f",
        "cmp byte ptr [rsi + 2], 0x6d", // 'm'
        "jne 3f",
        "cmp byte ptr [rsi + 3], 0x6c", // 'l'
        "je 4f",
        "3:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 4f",
        "jmp rax",
        "4:",
        "push rdi",
        ".cfi_adjust_cfa_offset 8",
        "push rsi",
        ".cfi_adjust_cfa_offset 8",
        "sub rsp, 8",
        ".cfi_adjust_cfa_offset 8",
        "call {target}",
        "add rsp, 8",
        ".cfi_adjust_cfa_offset -8",
        "pop rsi",
        ".cfi_adjust_cfa_offset -8",
        "pop rdi",
        ".cfi_adjust_cfa_offset -8",
        "test rax, rax",
        "jz 5f",
        "jmp rax",
        "5:",
        "ret",
        ".cfi_endproc",
        real = sym REAL_DLSYM,
        target = sym dlsym_target,
    )
}

/// Where `dlsym(handle, name)` goes: the interception library's `dlsym` for a hooked
/// name (loading it), else glibc's. 0 (the lookup returns NULL) if glibc's cannot be
/// found, which only a process without `dlsym` anywhere could see.
unsafe extern "C" fn dlsym_target(_handle: *mut c_void, name: *const c_char) -> usize {
    // SAFETY: dlsym's name argument is a C string (or NULL).
    if !name.is_null() && hook_index(unsafe { cstr(name) }).is_some() {
        return if loaded() {
            CORE_DLSYM.load(Ordering::Acquire)
        } else {
            dlsym_unenforced as *const () as usize
        };
    }
    real_dlsym()
}

/// `dlsym` of a hooked name when the interception library could not be loaded: the
/// failure instead of the driver's function.
unsafe extern "C" fn dlsym_unenforced(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let real = real_dlsym();
    if real == 0 {
        return core::ptr::null_mut();
    }
    // SAFETY: glibc's dlsym.
    let real: DlsymFn = unsafe { core::mem::transmute::<usize, DlsymFn>(real) };
    // SAFETY: the caller's arguments.
    let p = unsafe { real(handle, name) };
    if p.is_null() {
        p
    } else {
        fail_unknown as *const () as *mut c_void
    }
}

type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type DlerrorFn = unsafe extern "C" fn() -> *const c_char;
type AttachFn = unsafe extern "C" fn(usize, usize);

/// A libc or libdl function by name, at glibc 2.34's version or the x86-64 base one.
fn glibc_function(name: &'static [u8]) -> usize {
    for ver in [b"GLIBC_2.34\0".as_slice(), b"GLIBC_2.2.5\0"] {
        let (p, _) = elf_symbols::find(name, ver);
        if p != 0 {
            return p;
        }
    }
    0
}

/// glibc's `dlsym`, found once.
fn real_dlsym() -> usize {
    let p = REAL_DLSYM.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    let p = glibc_function(b"dlsym\0");
    REAL_DLSYM.store(p, Ordering::Release);
    p
}

/// The NUL-terminated string at `p`, without its NUL.
///
/// # Safety
/// `p` must be a valid C string.
unsafe fn cstr<'a>(p: *const c_char) -> &'a [u8] {
    let mut n = 0;
    // SAFETY: per the caller, up to and excluding the NUL.
    unsafe {
        while *p.add(n) != 0 {
            n += 1;
        }
        core::slice::from_raw_parts(p.cast::<u8>(), n)
    }
}

/// The hooked names, NUL-terminated, in table order.
fn names() -> impl Iterator<Item = &'static [u8]> {
    NAMES.split_inclusive(|&c| c == 0)
}

/// The table index of a hooked name.
fn hook_index(name: &[u8]) -> Option<usize> {
    names().position(|n| &n[..n.len() - 1] == name)
}

/// Whether the interception library is loaded, loading it on the first call.
fn loaded() -> bool {
    match STATE.load(Ordering::Acquire) {
        LOADED => true,
        FAILED => false,
        _ => {
            match load_core() {
                // A full table is authoritative, even over another thread's failure
                // (say a transient EMFILE).
                Ok(()) => STATE.store(LOADED, Ordering::Release),
                Err(why) => {
                    if STATE
                        .compare_exchange(NOT_TRIED, FAILED, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        say(why);
                    }
                }
            }
            STATE.load(Ordering::Acquire) == LOADED
        }
    }
}

/// Why loading failed: a message and, if any, `dlerror()`'s.
struct Why(&'static [u8], *const c_char);

/// Opens `libtessera_cuda.so` (beside the front; at [`CORE_PATH`] for a shim) and
/// fills the table.
fn load_core() -> Result<(), Why> {
    let Some((me, lo, hi)) = elf_symbols::object_containing(load_core as *const () as usize) else {
        return Err(Why(
            b"cannot find Tessera's front library among the loaded objects",
            core::ptr::null(),
        ));
    };
    let mut path = [0u8; 4096];
    core_path(me, &mut path)?;
    let (dlopen, dlsym) = (glibc_function(b"dlopen\0"), real_dlsym());
    if dlopen == 0 || dlsym == 0 {
        return Err(Why(
            b"dlopen and dlsym are not loaded (neither in libc nor libdl)",
            core::ptr::null(),
        ));
    }
    // SAFETY: glibc's functions, found by name and version.
    let (dlopen, dlsym) = unsafe {
        (
            core::mem::transmute::<usize, DlopenFn>(dlopen),
            core::mem::transmute::<usize, DlsymFn>(dlsym),
        )
    };
    let dlerror = || {
        let p = glibc_function(b"dlerror\0");
        if p == 0 {
            return core::ptr::null();
        }
        // SAFETY: glibc's dlerror.
        unsafe { core::mem::transmute::<usize, DlerrorFn>(p)() }
    };
    // SAFETY: a NUL-terminated path. RTLD_LOCAL (0): its exports stay out of the
    // global scope, where this library's come first anyway.
    let handle = unsafe { dlopen(path.as_ptr().cast(), RTLD_NOW) };
    if handle.is_null() {
        return Err(Why(b"cannot load libtessera_cuda.so", dlerror()));
    }
    let lookup = |name: &[u8]| -> usize {
        // SAFETY: the handle just opened and a NUL-terminated name.
        unsafe { dlsym(handle, name.as_ptr().cast()) as usize }
    };
    let (core_dlsym, attach) = (lookup(b"dlsym\0"), lookup(b"tessera_front_attach\0"));
    if core_dlsym == 0 || attach == 0 || names().any(|n| lookup(n) == 0) {
        return Err(Why(
            b"libtessera_cuda.so does not export every hook: it is not the build beside this one",
            core::ptr::null(),
        ));
    }
    // SAFETY: the interception library's tessera_front_attach(lo, hi).
    unsafe { core::mem::transmute::<usize, AttachFn>(attach)(lo, hi) };
    for (slot, name) in TABLE.iter().zip(names()) {
        slot.store(lookup(name), Ordering::Release);
    }
    CORE_DLSYM.store(core_dlsym, Ordering::Release);
    Ok(())
}

/// The interception library's path, NUL-terminated, into `path`: [`CORE_PATH`] for a
/// shim, `<directory of this library>/libtessera_cuda.so` for the front.
fn core_path(me: *const c_char, path: &mut [u8; 4096]) -> Result<(), Why> {
    if is_shim() {
        path[..CORE_PATH.len()].copy_from_slice(CORE_PATH);
        return Ok(());
    }
    // SAFETY: ld.so's name for a loaded object.
    let me = unsafe { cstr(me) };
    let Some(slash) = me.iter().rposition(|&c| c == b'/') else {
        return Err(Why(
            b"libtessera_preload.so was not loaded by a path",
            core::ptr::null(),
        ));
    };
    let len = slash + 1 + CORE_FILE.len();
    if len >= path.len() {
        return Err(Why(
            b"the library directory's path is too long",
            core::ptr::null(),
        ));
    }
    path[..=slash].copy_from_slice(&me[..=slash]);
    path[slash + 1..len].copy_from_slice(CORE_FILE);
    Ok(())
}

/// One line on stderr: the interception library is not loaded, so CUDA fails.
fn say(why: Why) {
    put(b"tessera: ");
    put(why.0);
    if !why.1.is_null() {
        put(b": ");
        // SAFETY: dlerror's message.
        put(unsafe { cstr(why.1) });
    }
    put(b"; CUDA calls fail (CUDA_ERROR_UNKNOWN) rather than run without the claim's limits\n");
}

fn put(b: &[u8]) {
    // SAFETY: a valid buffer. A failed write to stderr has nowhere else to go.
    let _ = unsafe { write(2, b.as_ptr().cast(), b.len()) };
}
