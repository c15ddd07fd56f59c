//! Where Tessera's stubs lie in memory: the front library (`libtessera_preload.so`,
//! named by `ld.so.preload`) and the soname shims (Tessera's `libcuda.so.1` and
//! `libnvidia-ml.so.1`, mounted at the driver's paths). Their exports carry the hooks'
//! names, so a lookup in the global scope or on a handle of `libcuda.so.1` finds their
//! stubs before the driver's functions: the loader must never take one for the
//! driver's (the stubs jump back into this library: endless recursion).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Ranges of stub objects: each attached one (the front and each shim that loaded this
/// library tell it theirs) or found. `[lo, hi)` pairs, 0 = free.
const SLOTS: usize = 8;
static STUBS: [[AtomicUsize; 2]; SLOTS] =
    [const { [AtomicUsize::new(0), AtomicUsize::new(0)] }; SLOTS];
/// The first object found not to be a stub (the driver, usually), so that checking the
/// driver's pointers walks the loaded objects once. Set once, never changed.
static NOT_STUB: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// What a stub object defines: the hooks (`cuGetProcAddress` stands for them) and
/// `dlsym`, and not `tessera_front_attach` (this library). A tenant's interposer that
/// looks like one is refused as the driver too, which only fails closer.
const STUB_DEFINES: &[u8] = b"cuGetProcAddress\0dlsym\0";
const NOT_STUB_DEFINES: &[u8] = b"tessera_front_attach\0";

/// Called by the front library and by each soname shim after it `dlopen`s this one,
/// with the range its segments span.
#[cfg(not(test))]
#[unsafe(no_mangle)]
pub extern "C" fn tessera_front_attach(lo: usize, hi: usize) {
    record(lo, hi);
}

/// Adds `[lo, hi)` to the stub ranges (once; silently dropped when every slot is
/// taken, since [`in_front`] then finds it again by its symbols).
fn record(lo: usize, hi: usize) {
    if lo >= hi {
        return;
    }
    for s in &STUBS {
        match s[0].compare_exchange(0, lo, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                s[1].store(hi, Ordering::Release);
                return;
            }
            Err(v) if v == lo => return,
            Err(_) => {}
        }
    }
}

/// Whether `p` lies in one of Tessera's stub objects (the front or a soname shim),
/// attached or found among the loaded objects by what they define.
pub fn in_front(p: usize) -> bool {
    for s in &STUBS {
        let lo = s[0].load(Ordering::Acquire);
        if lo == 0 {
            break;
        }
        let hi = s[1].load(Ordering::Acquire);
        // A slot being filled has hi 0: found again below.
        if (lo..hi).contains(&p) {
            return true;
        }
    }
    if (NOT_STUB[0].load(Ordering::Acquire)..NOT_STUB[1].load(Ordering::Acquire)).contains(&p) {
        return false;
    }
    match super::elf_symbols::classify_object(p, STUB_DEFINES, NOT_STUB_DEFINES) {
        Some((lo, hi, true)) => {
            record(lo, hi);
            true
        }
        Some((lo, hi, false)) => {
            if NOT_STUB[0]
                .compare_exchange(0, lo, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                NOT_STUB[1].store(hi, Ordering::Release);
            }
            false
        }
        None => false,
    }
}
