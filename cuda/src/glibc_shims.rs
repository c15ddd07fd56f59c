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
//! never loaded libpthread) fails the way its caller handles: NULL, or `ENOSYS`, and
//! is looked up again at its next call. Only the zig build uses this (`build.rs` sets
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
    /// `dladdr`: 0, "not found".
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
                concat!("mov rax, qword ptr [rip + {slots} + 8 * ", $i, "]"),
                "test rax, rax",
                "jz 2f",
                "jmp rax",
                "2:",
                concat!("mov eax, ", $i),
                "jmp .Ltessera_shim_slow",
                concat!(".size ", stringify!($name), ", . - ", stringify!($name)),
            )*
            ".p2align 4",
            ".Ltessera_shim_slow:",
            "push rdi",
            "push rsi",
            "push rdx",
            "push rcx",
            "push r8",
            "push r9",
            "sub rsp, 8",
            "mov edi, eax",
            "call {resolve}",
            "add rsp, 8",
            "pop r9",
            "pop r8",
            "pop rcx",
            "pop rdx",
            "pop rsi",
            "pop rdi",
            "jmp rax",
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
    3 pthread_atfork "GLIBC_2.2.5" Errno,
    4 pthread_attr_getguardsize "GLIBC_2.2.5" Errno,
    5 pthread_attr_getstack "GLIBC_2.2.5" Errno,
    6 pthread_attr_setstacksize "GLIBC_2.2.5" Errno,
    7 pthread_create "GLIBC_2.2.5" Errno,
    8 pthread_detach "GLIBC_2.2.5" Errno,
    9 pthread_getattr_np "GLIBC_2.2.5" Errno,
    10 pthread_key_create "GLIBC_2.2.5" Errno,
    11 pthread_key_delete "GLIBC_2.2.5" Errno,
    12 pthread_rwlock_rdlock "GLIBC_2.2.5" Errno,
    13 pthread_rwlock_unlock "GLIBC_2.2.5" Errno,
    14 pthread_rwlock_wrlock "GLIBC_2.2.5" Errno,
    15 pthread_setname_np "GLIBC_2.12" Errno,
    16 pthread_setspecific "GLIBC_2.2.5" Errno,
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
    let found = find(name, ver);
    if found != 0 {
        SLOTS[i as usize].store(found, Ordering::Release);
        return found;
    }
    match fail {
        Fail::Null => fail_null as *const () as usize,
        Fail::Errno => fail_errno as *const () as usize,
        Fail::Zero => fail_zero as *const () as usize,
    }
}

/// A lookup in progress: the NUL-terminated name and version, the name's GNU hash.
struct Query {
    name: &'static [u8],
    ver: &'static [u8],
    hash: u32,
    found: usize,
}

/// The address of the function `name` defined at version `ver` by a loaded object,
/// or 0. Reads the objects' dynamic symbol tables (GNU hash, version definitions) as
/// ld.so does; allocates nothing and calls nothing that could be a shim.
fn find(name: &'static [u8], ver: &'static [u8]) -> usize {
    let bare = name.strip_suffix(b"\0").unwrap_or(name);
    let hash = bare.iter().fold(5381u32, |h, &c| {
        h.wrapping_mul(33).wrapping_add(u32::from(c))
    });
    let mut q = Query {
        name,
        ver,
        hash,
        found: 0,
    };
    // SAFETY: the callback reads only what ld.so mapped, and stops at the first match.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut q).cast()) };
    q.found
}

const DT_NULL: i64 = 0;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const DT_VERDEF: i64 = 0x6fff_fffc;
const DT_VERDEFNUM: i64 = 0x6fff_fffd;
const STT_FUNC: u8 = 2;

#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

#[repr(C)]
struct Verdef {
    version: u16,
    flags: u16,
    ndx: u16,
    cnt: u16,
    hash: u32,
    aux: u32,
    next: u32,
}

/// One object: its symbol `q.name` with version `q.ver`, through the GNU hash table.
///
/// # Safety
/// Called by `dl_iterate_phdr` with a valid `info` and `data` = a `Query`.
unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: per the caller.
    let (info, q) = unsafe { (&*info, &mut *data.cast::<Query>()) };
    let base = info.dlpi_addr as usize;
    if info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: ld.so's program headers for this object.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC) else {
        return 0;
    };
    // glibc relocates the dynamic section's addresses in place where it is writable;
    // the vDSO's (and a read-only one) stay relative to the base.
    let addr = |v: u64| -> usize {
        let v = v as usize;
        if v < base { v + base } else { v }
    };
    let (mut strtab, mut symtab, mut gnu_hash, mut versym, mut verdef, mut verdefnum) =
        (0usize, 0usize, 0usize, 0usize, 0usize, 0u64);
    let mut d = (base + dynamic.p_vaddr as usize) as *const Dyn;
    // SAFETY: the dynamic section, ended by DT_NULL.
    unsafe {
        while (*d).tag != DT_NULL {
            let v = (*d).val;
            match (*d).tag {
                DT_STRTAB => strtab = addr(v),
                DT_SYMTAB => symtab = addr(v),
                DT_GNU_HASH => gnu_hash = addr(v),
                DT_VERSYM => versym = addr(v),
                DT_VERDEF => verdef = addr(v),
                DT_VERDEFNUM => verdefnum = v,
                _ => {}
            }
            d = d.add(1);
        }
    }
    if strtab == 0 || symtab == 0 || gnu_hash == 0 || versym == 0 || verdef == 0 {
        return 0;
    }
    // SAFETY: the tables ld.so itself reads for this object.
    unsafe {
        let ht = gnu_hash as *const u32;
        let (nbuckets, symoffset, bloom_words) = (*ht, *ht.add(1), *ht.add(2));
        if nbuckets == 0 {
            return 0;
        }
        let buckets = ht
            .add(4)
            .cast::<u64>()
            .add(bloom_words as usize)
            .cast::<u32>();
        let chain = buckets.add(nbuckets as usize);
        let mut idx = *buckets.add((q.hash % nbuckets) as usize);
        if idx < symoffset {
            return 0;
        }
        loop {
            let h = *chain.add((idx - symoffset) as usize);
            if h | 1 == q.hash | 1 {
                let sym = &*(symtab as *const Sym).add(idx as usize);
                if sym.shndx != 0
                    && sym.info & 0xf == STT_FUNC
                    && cstr_is(strtab + sym.name as usize, q.name)
                    && version_is(
                        *(versym as *const u16).add(idx as usize) & 0x7fff,
                        verdef,
                        verdefnum,
                        strtab,
                        q.ver,
                    )
                {
                    q.found = base + sym.value as usize;
                    return 1;
                }
            }
            if h & 1 != 0 {
                return 0;
            }
            idx += 1;
        }
    }
}

/// Whether the NUL-terminated string at `p` is `want` (NUL included).
///
/// # Safety
/// `p` must point to a NUL-terminated string.
unsafe fn cstr_is(p: usize, want: &[u8]) -> bool {
    let p = p as *const c_char;
    for (k, &w) in want.iter().enumerate() {
        // SAFETY: stops at the string's NUL at the latest (`want` ends with one).
        if unsafe { *p.add(k) } as u8 != w {
            return false;
        }
    }
    true
}

/// Whether version index `ndx` of the object is named `want`.
///
/// # Safety
/// `verdef`/`strtab` must be the object's tables.
unsafe fn version_is(ndx: u16, verdef: usize, count: u64, strtab: usize, want: &[u8]) -> bool {
    let mut v = verdef;
    for _ in 0..count {
        // SAFETY: the version definitions chain, `count` long.
        let d = unsafe { &*(v as *const Verdef) };
        if d.ndx == ndx {
            // SAFETY: the first auxiliary entry names the version.
            let name = unsafe { *((v + d.aux as usize) as *const u32) };
            // SAFETY: a string of the object's table.
            return unsafe { cstr_is(strtab + name as usize, want) };
        }
        if d.next == 0 {
            break;
        }
        v += d.next as usize;
    }
    false
}
