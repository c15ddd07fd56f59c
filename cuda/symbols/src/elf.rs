//! Finding a versioned function in the loaded objects without libdl: the objects'
//! dynamic symbol tables read as ld.so reads them (GNU or SysV hash table, version
//! definitions), and the loaded objects' address ranges. The release build's glibc
//! shims use it (`glibc_shims.rs`), the interception library to find the front library
//! (`front.rs`), and the front library itself (built without std): it allocates
//! nothing, uses only `core`, and calls nothing but `dl_iterate_phdr` (in libc,
//! declared here).

use core::ffi::{c_char, c_int, c_void};

/// `ElfW(Phdr)` on a 64-bit target.
#[repr(C)]
pub struct Phdr {
    pub p_type: u32,
    pub p_flags: u32,
    pub p_offset: u64,
    pub p_vaddr: u64,
    pub p_paddr: u64,
    pub p_filesz: u64,
    pub p_memsz: u64,
    pub p_align: u64,
}

/// The head of glibc's `struct dl_phdr_info` (the fields every version has).
#[repr(C)]
pub struct DlPhdrInfo {
    pub dlpi_addr: u64,
    pub dlpi_name: *const c_char,
    pub dlpi_phdr: *const Phdr,
    pub dlpi_phnum: u16,
}

pub type PhdrCallback = unsafe extern "C" fn(*mut DlPhdrInfo, usize, *mut c_void) -> c_int;

#[link(name = "c")]
unsafe extern "C" {
    /// In libc.so.6 since glibc 2.2.4 (`GLIBC_2.2.5` on x86-64).
    pub fn dl_iterate_phdr(callback: Option<PhdrCallback>, data: *mut c_void) -> c_int;
}

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;

/// The address range an object's `PT_LOAD` segments span, `None` for an object ld.so
/// gave no program headers or no loaded segment.
///
/// # Safety
/// `info` must be what `dl_iterate_phdr` passed to its callback.
unsafe fn load_span(info: &DlPhdrInfo) -> Option<(usize, usize)> {
    if info.dlpi_phdr.is_null() {
        return None;
    }
    // SAFETY: ld.so's program headers for this object (the caller's contract).
    let phdrs =
        unsafe { core::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let base = info.dlpi_addr as usize;
    let (mut lo, mut hi) = (usize::MAX, 0usize);
    for p in phdrs.iter().filter(|p| p.p_type == PT_LOAD) {
        let start = base.wrapping_add(p.p_vaddr as usize);
        lo = lo.min(start);
        hi = hi.max(start.wrapping_add(p.p_memsz as usize));
    }
    (lo < hi).then_some((lo, hi))
}

/// A lookup in progress: the NUL-terminated name and version, the name's GNU and
/// SysV hashes, and what it found (address, the object's name).
struct Query {
    name: &'static [u8],
    ver: &'static [u8],
    gnu_hash: u32,
    sysv_hash: u32,
    found: usize,
    object: *const c_char,
}

impl Query {
    /// A lookup of `name` (NUL-terminated) at version `ver` (empty: any version).
    fn new(name: &'static [u8], ver: &'static [u8]) -> Self {
        let bare = name.strip_suffix(b"\0").unwrap_or(name);
        Query {
            name,
            ver,
            gnu_hash: gnu_hash(bare),
            sysv_hash: sysv_hash(bare),
            found: 0,
            object: core::ptr::null(),
        }
    }
}

/// The address of the function `name` defined at version `ver` by a loaded object
/// (0 if none) and that object's name. Reads the objects' dynamic symbol tables (GNU
/// or SysV hash, version definitions) as ld.so does; allocates nothing and calls
/// nothing that could be a shim.
pub fn find(name: &'static [u8], ver: &'static [u8]) -> (usize, *const c_char) {
    let mut q = Query::new(name, ver);
    // SAFETY: the callback reads only what ld.so mapped, and stops at the first match.
    unsafe { dl_iterate_phdr(Some(visit), (&raw mut q).cast()) };
    (q.found, q.object)
}

/// The GNU hash of a symbol name (DT_GNU_HASH).
fn gnu_hash(name: &[u8]) -> u32 {
    name.iter().fold(5381u32, |h, &c| {
        h.wrapping_mul(33).wrapping_add(u32::from(c))
    })
}

/// The System V ELF hash of a symbol name (DT_HASH).
fn sysv_hash(name: &[u8]) -> u32 {
    name.iter().fold(0u32, |h, &c| {
        let h = (h << 4).wrapping_add(u32::from(c));
        let g = h & 0xf000_0000;
        (h ^ (g >> 24)) & !g
    })
}

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const DT_VERDEF: i64 = 0x6fff_fffc;
const DT_VERDEFNUM: i64 = 0x6fff_fffd;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;

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

/// One object's tables, as addresses in the process.
struct Tables {
    strtab: usize,
    symtab: usize,
    versym: usize,
    verdef: usize,
    verdefnum: u64,
}

impl Tables {
    /// Whether symbol `idx` is the defined function `q.name` at version `q.ver` (an
    /// empty `q.ver`: at any version or none, an indirect function too).
    ///
    /// # Safety
    /// `idx` must be a symbol index of the object.
    unsafe fn matches(&self, idx: usize, q: &Query) -> Option<u64> {
        // SAFETY: per the caller, and the object's own tables.
        unsafe {
            let sym = &*(self.symtab as *const Sym).add(idx);
            let kind = sym.info & 0xf;
            if q.ver.is_empty() {
                return (sym.shndx != 0
                    && (kind == STT_FUNC || kind == STT_GNU_IFUNC)
                    && cstr_is(self.strtab + sym.name as usize, q.name))
                .then_some(sym.value);
            }
            (sym.shndx != 0
                && kind == STT_FUNC
                && cstr_is(self.strtab + sym.name as usize, q.name)
                && version_is(
                    *(self.versym as *const u16).add(idx) & 0x7fff,
                    self.verdef,
                    self.verdefnum,
                    self.strtab,
                    q.ver,
                ))
            .then_some(sym.value)
        }
    }
}

/// One object's symbol tables and its GNU and SysV hash tables (0 where absent).
/// `None` for an object without a dynamic section, string or symbol table.
///
/// # Safety
/// `info` must be what `dl_iterate_phdr` passed.
unsafe fn object_tables(info: &DlPhdrInfo) -> Option<(Tables, usize, usize)> {
    let base = info.dlpi_addr as usize;
    if info.dlpi_phdr.is_null() {
        return None;
    }
    // SAFETY: ld.so's program headers for this object.
    let phdrs =
        unsafe { core::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let dynamic = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC)?;
    // glibc relocates the dynamic section's addresses in place where it is writable;
    // the vDSO's (and a read-only one) stay relative to the base.
    let addr = |v: u64| -> usize {
        let v = v as usize;
        if v < base { v + base } else { v }
    };
    let mut t = Tables {
        strtab: 0,
        symtab: 0,
        versym: 0,
        verdef: 0,
        verdefnum: 0,
    };
    let (mut gnu, mut sysv) = (0usize, 0usize);
    let mut d = (base + dynamic.p_vaddr as usize) as *const Dyn;
    // SAFETY: the dynamic section, ended by DT_NULL.
    unsafe {
        while (*d).tag != DT_NULL {
            let v = (*d).val;
            match (*d).tag {
                DT_STRTAB => t.strtab = addr(v),
                DT_SYMTAB => t.symtab = addr(v),
                DT_GNU_HASH => gnu = addr(v),
                DT_HASH => sysv = addr(v),
                DT_VERSYM => t.versym = addr(v),
                DT_VERDEF => t.verdef = addr(v),
                DT_VERDEFNUM => t.verdefnum = v,
                _ => {}
            }
            d = d.add(1);
        }
    }
    (t.strtab != 0 && t.symtab != 0).then_some((t, gnu, sysv))
}

/// `q` in one object's tables: the symbol's value (relative to the object's base).
///
/// # Safety
/// The tables of one loaded object, as [`object_tables`] found them.
unsafe fn lookup(t: &Tables, gnu: usize, sysv: usize, q: &Query) -> Option<u64> {
    if !q.ver.is_empty() && (t.versym == 0 || t.verdef == 0) {
        return None;
    }
    // SAFETY: the hash tables ld.so itself reads for this object.
    unsafe {
        if gnu != 0 {
            gnu_lookup(gnu, t, q)
        } else if sysv != 0 {
            sysv_lookup(sysv, t, q)
        } else {
            None
        }
    }
}

/// One object: its symbol `q.name` with version `q.ver`, through its GNU hash table,
/// or its SysV one if it has no GNU table.
///
/// # Safety
/// Called by `dl_iterate_phdr` with a valid `info` and `data` = a `Query`.
unsafe extern "C" fn visit(info: *mut DlPhdrInfo, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: per the caller.
    let (info, q) = unsafe { (&*info, &mut *data.cast::<Query>()) };
    // SAFETY: as above.
    let Some((t, gnu, sysv)) = (unsafe { object_tables(info) }) else {
        return 0;
    };
    // SAFETY: this object's tables.
    match unsafe { lookup(&t, gnu, sysv, q) } {
        Some(v) => {
            q.found = info.dlpi_addr as usize + v as usize;
            q.object = info.dlpi_name;
            1
        }
        None => 0,
    }
}

/// The first object loaded ahead of the one spanning `stop`, the main program
/// excepted, that defines a function named in `lists` (each a run of NUL-terminated
/// names; at any version) and defines none of `unless` (a run of NUL-terminated names):
/// (its name as ld.so has it,
/// the name it defines, NUL included). Objects load in the order ld.so searches them
/// for a program's symbols, so such an object answers before the one at `stop`.
pub fn defined_ahead(
    stop: usize,
    lists: &[&'static [u8]],
    unless: &'static [u8],
) -> Option<(*const c_char, &'static [u8])> {
    struct Ahead<'a> {
        stop: usize,
        lists: &'a [&'static [u8]],
        unless: &'static [u8],
        seen: usize,
        found: Option<(*const c_char, &'static [u8])>,
    }
    fn query(name: &'static [u8]) -> Query {
        Query::new(name, b"")
    }
    unsafe extern "C" fn visit(info: *mut DlPhdrInfo, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: per dl_iterate_phdr, with `data` = an `Ahead`.
        let (info, a) = unsafe { (&*info, &mut *data.cast::<Ahead>()) };
        a.seen += 1;
        // SAFETY: `info` is dl_iterate_phdr's.
        let Some((lo, hi)) = (unsafe { load_span(info) }) else {
            return 0;
        };
        if (lo..hi).contains(&a.stop) {
            return 1;
        }
        if a.seen == 1 {
            return 0; // the main program
        }
        // SAFETY: as above.
        let Some((t, gnu, sysv)) = (unsafe { object_tables(info) }) else {
            return 0;
        };
        for name in a.unless.split_inclusive(|&c| c == 0) {
            // SAFETY: this object's tables.
            if unsafe { lookup(&t, gnu, sysv, &query(name)) }.is_some() {
                return 0;
            }
        }
        for list in a.lists {
            for name in list.split_inclusive(|&c| c == 0) {
                // SAFETY: as above.
                if unsafe { lookup(&t, gnu, sysv, &query(name)) }.is_some() {
                    a.found = Some((info.dlpi_name, name));
                    return 1;
                }
            }
        }
        0
    }
    let mut a = Ahead {
        stop,
        lists,
        unless,
        seen: 0,
        found: None,
    };
    // SAFETY: the callback reads only what ld.so mapped.
    unsafe { dl_iterate_phdr(Some(visit), (&raw mut a).cast()) };
    a.found
}

/// # Safety
/// `table` must be the object's DT_GNU_HASH table.
unsafe fn gnu_lookup(table: usize, t: &Tables, q: &Query) -> Option<u64> {
    // SAFETY: per the caller.
    unsafe {
        let ht = table as *const u32;
        let (nbuckets, symoffset, bloom_words) = (*ht, *ht.add(1), *ht.add(2));
        if nbuckets == 0 {
            return None;
        }
        let buckets = ht
            .add(4)
            .cast::<u64>()
            .add(bloom_words as usize)
            .cast::<u32>();
        let chain = buckets.add(nbuckets as usize);
        let mut idx = *buckets.add((q.gnu_hash % nbuckets) as usize);
        if idx < symoffset {
            return None;
        }
        loop {
            let h = *chain.add((idx - symoffset) as usize);
            if h | 1 == q.gnu_hash | 1
                && let Some(v) = t.matches(idx as usize, q)
            {
                return Some(v);
            }
            if h & 1 != 0 {
                return None;
            }
            idx += 1;
        }
    }
}

/// # Safety
/// `table` must be the object's DT_HASH table.
unsafe fn sysv_lookup(table: usize, t: &Tables, q: &Query) -> Option<u64> {
    // SAFETY: per the caller.
    unsafe {
        let ht = table as *const u32;
        let (nbucket, nchain) = (*ht, *ht.add(1));
        if nbucket == 0 {
            return None;
        }
        let chain = ht.add(2 + nbucket as usize);
        let mut idx = *ht.add(2 + (q.sysv_hash % nbucket) as usize);
        // Bounded by the chain's length: a corrupt table cannot loop.
        for _ in 0..nchain {
            if idx == 0 || idx >= nchain {
                return None;
            }
            if let Some(v) = t.matches(idx as usize, q) {
                return Some(v);
            }
            idx = *chain.add(idx as usize);
        }
        None
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

/// The loaded object whose segments span `addr`, as the range they span, and whether
/// it defines every name of `all` and none of `none` (runs of NUL-terminated names, at
/// any version). The interception library tells the front's and the sonames' stubs
/// from the driver's functions with it.
pub fn classify_object(
    addr: usize,
    all: &'static [u8],
    none: &'static [u8],
) -> Option<(usize, usize, bool)> {
    struct Classify {
        addr: usize,
        all: &'static [u8],
        none: &'static [u8],
        found: Option<(usize, usize, bool)>,
    }
    fn defines(t: &Tables, gnu: usize, sysv: usize, name: &'static [u8]) -> bool {
        let q = Query::new(name, b"");
        // SAFETY: one loaded object's tables.
        unsafe { lookup(t, gnu, sysv, &q) }.is_some()
    }
    unsafe extern "C" fn visit(info: *mut DlPhdrInfo, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: per dl_iterate_phdr, with `data` = a `Classify`.
        let (info, c) = unsafe { (&*info, &mut *data.cast::<Classify>()) };
        // SAFETY: `info` is dl_iterate_phdr's.
        let Some((lo, hi)) = (unsafe { load_span(info) }) else {
            return 0;
        };
        if !(lo..hi).contains(&c.addr) {
            return 0;
        }
        // SAFETY: as above.
        let is = match unsafe { object_tables(info) } {
            Some((t, gnu, sysv)) => {
                c.all
                    .split_inclusive(|&b| b == 0)
                    .all(|n| defines(&t, gnu, sysv, n))
                    && !c
                        .none
                        .split_inclusive(|&b| b == 0)
                        .any(|n| defines(&t, gnu, sysv, n))
            }
            None => false,
        };
        c.found = Some((lo, hi, is));
        1
    }
    let mut c = Classify {
        addr,
        all,
        none,
        found: None,
    };
    // SAFETY: the callback reads only what ld.so mapped.
    unsafe { dl_iterate_phdr(Some(visit), (&raw mut c).cast()) };
    c.found
}

/// The loaded object whose segments span `addr`: its name as ld.so has it (the path
/// it was loaded by; empty for the main program) and that span. The front library
/// uses it to find itself.
pub fn object_containing(addr: usize) -> Option<(*const c_char, usize, usize)> {
    find_object(&mut |_, lo, hi| (lo..hi).contains(&addr))
}

/// The first loaded object `pick(name, lo, hi)` accepts, given ld.so's name for it
/// and the range its `PT_LOAD` segments span: (name, lo, hi). The interception library
/// finds the front library with it when nothing told it where the front is.
pub fn find_object(
    pick: &mut dyn FnMut(&core::ffi::CStr, usize, usize) -> bool,
) -> Option<(*const c_char, usize, usize)> {
    struct Find<'a> {
        pick: &'a mut dyn FnMut(&core::ffi::CStr, usize, usize) -> bool,
        found: Option<(*const c_char, usize, usize)>,
    }
    unsafe extern "C" fn visit(info: *mut DlPhdrInfo, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: per dl_iterate_phdr, with `data` = a `Find`.
        let (info, f) = unsafe { (&*info, &mut *data.cast::<Find>()) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: `info` is dl_iterate_phdr's.
        let Some((lo, hi)) = (unsafe { load_span(info) }) else {
            return 0;
        };
        // SAFETY: ld.so's name for this object.
        let name = unsafe { core::ffi::CStr::from_ptr(info.dlpi_name) };
        if (f.pick)(name, lo, hi) {
            f.found = Some((info.dlpi_name, lo, hi));
            return 1;
        }
        0
    }
    let mut f = Find { pick, found: None };
    // SAFETY: the callback reads only what ld.so mapped.
    unsafe { dl_iterate_phdr(Some(visit), (&raw mut f).cast()) };
    f.found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::process::Command;

    #[test]
    fn hashes_match_the_elf_definitions() {
        // Reference values from the GNU hash and System V ABI definitions.
        assert_eq!(gnu_hash(b""), 5381);
        assert_eq!(gnu_hash(b"printf"), 0x156b_2bb8);
        assert_eq!(sysv_hash(b""), 0);
        assert_eq!(sysv_hash(b"printf"), 0x0779_05a6);
    }

    /// The object holding an address: libc for one of its functions, the test program
    /// (named "") for one of ours, none for an address nothing maps.
    #[test]
    fn object_containing_names_the_object_and_its_range() {
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        let getpid = libc::getpid as *const () as usize;
        // SAFETY: valid out pointer.
        assert_ne!(
            unsafe { libc::dladdr(getpid as *const c_void, &mut info) },
            0
        );
        let (name, lo, hi) = object_containing(getpid).expect("libc");
        // SAFETY: ld.so's names are NUL-terminated.
        let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
        assert!(name.contains("libc.so.6"), "{name}");
        assert_eq!(lo, info.dli_fbase as usize);
        assert!(lo < getpid && getpid < hi);
        let here = object_containing_names_the_object_and_its_range as *const () as usize;
        let (name, _, _) = object_containing(here).expect("the test program");
        // SAFETY: as above.
        assert_eq!(unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes(), b"");
        assert!(object_containing(8).is_none());
    }

    fn dlvsym(handle: *mut c_void, name: &[u8], ver: &[u8]) -> usize {
        // SAFETY: NUL-terminated names.
        unsafe { libc::dlvsym(handle, name.as_ptr().cast(), ver.as_ptr().cast()) as usize }
    }

    /// Every function the release build's shims look up, found where glibc's own
    /// `dlvsym` finds it (on this host's glibc).
    #[test]
    fn finds_what_dlvsym_finds_for_the_shimmed_functions() {
        let wanted: &[(&'static [u8], &'static [u8])] = &[
            (b"dlopen\0", b"GLIBC_2.2.5\0"),
            (b"dlvsym\0", b"GLIBC_2.2.5\0"),
            (b"dladdr\0", b"GLIBC_2.2.5\0"),
            (b"pthread_attr_getguardsize\0", b"GLIBC_2.2.5\0"),
            (b"pthread_attr_getstack\0", b"GLIBC_2.2.5\0"),
            (b"pthread_attr_setstacksize\0", b"GLIBC_2.2.5\0"),
            (b"pthread_create\0", b"GLIBC_2.2.5\0"),
            (b"pthread_detach\0", b"GLIBC_2.2.5\0"),
            (b"pthread_getattr_np\0", b"GLIBC_2.2.5\0"),
            (b"pthread_key_create\0", b"GLIBC_2.2.5\0"),
            (b"pthread_key_delete\0", b"GLIBC_2.2.5\0"),
            (b"pthread_rwlock_rdlock\0", b"GLIBC_2.2.5\0"),
            (b"pthread_rwlock_unlock\0", b"GLIBC_2.2.5\0"),
            (b"pthread_rwlock_wrlock\0", b"GLIBC_2.2.5\0"),
            (b"pthread_setname_np\0", b"GLIBC_2.12\0"),
            (b"pthread_setspecific\0", b"GLIBC_2.2.5\0"),
            // The front library's, on glibc 2.34 and later.
            (b"dlopen\0", b"GLIBC_2.34\0"),
            (b"dlsym\0", b"GLIBC_2.34\0"),
            (b"dlerror\0", b"GLIBC_2.34\0"),
        ];
        for &(name, ver) in wanted {
            let (got, object) = find(name, ver);
            let want = dlvsym(libc::RTLD_DEFAULT, name, ver);
            assert_ne!(want, 0, "{}", String::from_utf8_lossy(name));
            assert_eq!(got, want, "{}", String::from_utf8_lossy(name));
            assert!(!object.is_null());
        }
        assert_eq!(
            find(b"pthread_create\0", b"GLIBC_9.99\0").0,
            0,
            "no such version"
        );
        assert_eq!(find(b"tessera_no_such_function\0", b"GLIBC_2.2.5\0").0, 0);
    }

    /// An object with only a SysV hash table (`--hash-style=sysv`), and one with only
    /// a GNU one: the versioned function is found in each, a wrong version in neither.
    #[test]
    fn reads_sysv_and_gnu_hash_tables() {
        let dir = std::env::temp_dir().join(format!("tessera-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("probe.c"), "int PROBE(void) { return 1; }\n").expect("write");
        std::fs::write(
            dir.join("probe.map"),
            "TESSERA_PROBE_1 { global: tessera_probe_*; local: *; };\n",
        )
        .expect("write");
        for style in ["sysv", "gnu"] {
            let lib = dir.join(format!("libprobe-{style}.so"));
            let ok = Command::new("cc")
                .args(["-shared", "-fPIC", "-o"])
                .arg(&lib)
                .arg(dir.join("probe.c"))
                .arg(format!("-DPROBE=tessera_probe_{style}"))
                .arg(format!(
                    "-Wl,--hash-style={style},--version-script={}",
                    dir.join("probe.map").display()
                ))
                .status()
                .expect("cc");
            assert!(ok.success());
            let path = CString::new(lib.as_os_str().as_encoded_bytes()).expect("path");
            // SAFETY: a library with no constructors.
            let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            assert!(!h.is_null(), "{style}: dlopen");
            let name: &'static [u8] = if style == "sysv" {
                b"tessera_probe_sysv\0"
            } else {
                b"tessera_probe_gnu\0"
            };
            let want = dlvsym(h, name, b"TESSERA_PROBE_1\0");
            assert_ne!(want, 0);
            assert_eq!(find(name, b"TESSERA_PROBE_1\0").0, want, "{style}");
            assert_eq!(
                find(name, b"TESSERA_PROBE_2\0").0,
                0,
                "{style}: wrong version"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
