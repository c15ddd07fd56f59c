//! The hooked names and the driver's function behind each: the [`Hook`] table, built
//! from the one list in `tessera_symbols::for_each_hook!`, and the real-function slots.
//!
//! A hook's real pointer is the one the driver last handed out for its name (through
//! `dlsym` or `cuGetProcAddress`, kept by [`remember`]), else the name resolved behind
//! the library at the hook's first call ([`real`]). The hooks' own addresses are not
//! the loader's to know: the hooks pass them in (an [`OwnAddress`]), so that a lookup
//! answered with the hook itself is never taken for the driver's function.
//!
//! Real pointers live in plain atomics: no allocation or lock on these paths.

use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::front::in_front;
use super::resolve::resolve_behind;

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
    };
}

tessera_symbols::for_each_hook!(hook_names);

/// The address of the library's own function for a hook (the hooks module's): what a
/// lookup of a hooked name hands out, and never a real pointer.
pub type OwnAddress = fn(Hook) -> usize;

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

/// Records `p` as the driver's pointer for `h`, unless it is the hook itself (`own`)
/// or the front's stub for it (a lookup in the global scope finds those first).
pub fn remember(h: Hook, p: *mut c_void, own: OwnAddress) {
    let p = p as usize;
    if p != 0 && p != own(h) && !in_front(p) {
        REAL[h as usize].store(p, Ordering::Release);
    }
}

/// The driver's function for `h`: the pointer last handed out by the driver's own
/// `dlsym`/`cuGetProcAddress`, else resolved behind the library. 0 when there is none.
/// `own` is only called when the name must be resolved.
#[inline]
pub fn real(h: Hook, own: OwnAddress) -> usize {
    let v = REAL[h as usize].load(Ordering::Acquire);
    if v != 0 {
        return v;
    }
    resolve_real(h, own)
}

#[cold]
#[inline(never)]
fn resolve_real(h: Hook, own: OwnAddress) -> usize {
    let lib: &CStr = if h.name().starts_with("nvml") {
        c"libnvidia-ml.so.1"
    } else {
        c"libcuda.so.1"
    };
    // SAFETY: NUL-terminated name from the table.
    let p = unsafe { resolve_behind(HOOK_NAMES[h as usize].as_ptr().cast(), lib) };
    remember(h, p, own);
    REAL[h as usize].load(Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::gpa_table::{BEYOND_TABLE, VARIANTS};

    /// Every CUDA hook is a variant the lookup table knows, so cuGetProcAddress
    /// can hand it out.
    #[test]
    fn every_cuda_hook_is_a_known_variant() {
        for h in ALL_HOOKS {
            if h.name().starts_with("cu") {
                assert!(
                    VARIANTS.iter().any(|v| v.symbol() == h.name())
                        || BEYOND_TABLE.contains(&h.name()),
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
