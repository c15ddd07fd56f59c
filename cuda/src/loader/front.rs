//! Where the front library (`libtessera_preload.so`) lies in memory. Its exports carry
//! the hooks' names and come first in the global scope, so a lookup there finds its
//! stubs before the driver's functions: the loader must never take one for the
//! driver's (the stubs jump back into this library).

use std::sync::atomic::{AtomicUsize, Ordering};

/// The address range of the front library when it loaded this one. Empty when
/// preloaded directly.
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
    let front = super::elf_symbols::find_object(&mut |name, _, _| {
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
