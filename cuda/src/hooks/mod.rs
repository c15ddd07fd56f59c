//! The exported driver and NVML entry points, and the exported `dlsym`. Each hook is
//! thin: find the device, reserve in the region (`enforce::accounting`), call the
//! driver, roll back on failure, and remember the charge for the matching free
//! (`enforce::allocations`). With no claim mounted every hook only forwards. No hook
//! panics; a missing driver function gives `CUDA_ERROR_NOT_FOUND`.
//!
//! The loader's hook table knows the hooks by name only: this module gives it their
//! addresses ([`hook_address`]) where a lookup needs them.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use crate::enforce::accounting::{self, Charge, Refused, State};
use crate::enforce::allocations::{self, Entry, Kind};
use crate::enforce::sizes;
use crate::ffi::*;
use crate::loader::driver_fns::{DriverFn, as_fn, driver};
use crate::loader::gpa_table;
use crate::loader::hook_table::{self, Hook};
use crate::stderr;
use devices::{DriverDevices, cuda_uuid, current_device, device_count, stream_device};

macro_rules! hook_names {
    ($($sym:ident),* $(,)?) => {
        /// The address of the library's own function for `h`: what a lookup of a
        /// hooked name hands out.
        pub fn hook_address(h: Hook) -> usize {
            match h { $(Hook::$sym => $sym as *const () as usize),* }
        }
    };
}

tessera_symbols::for_each_hook!(hook_names);

/// The driver's function for `h` ([`hook_table::real`]).
#[inline]
fn real(h: Hook) -> usize {
    hook_table::real(h, hook_address)
}

/// Keeps `p` as the driver's function for `h` ([`hook_table::remember`]).
fn remember(h: Hook, p: *mut c_void) {
    hook_table::remember(h, p, hook_address);
}

/// Calls the driver's function for `$hook` with type `$ty`, or returns NOT_FOUND.
macro_rules! call_real {
    ($hook:expr, $ty:ty, $($arg:expr),*) => {{
        let p = real($hook);
        if p == 0 {
            return CUDA_ERROR_NOT_FOUND;
        }
        // SAFETY: `p` is the driver's function of this variant, whose C signature is $ty.
        let f: $ty = unsafe { as_fn(p) };
        // SAFETY: forwarding the caller's arguments unchanged.
        unsafe { f($($arg),*) }
    }};
}

fn refused_code(st: &State, r: Refused, what: &str) -> CUresult {
    if r == Refused::NoSlot && !st.fail_closed {
        stderr::log(format_args!(
            "{what}: the device's UUID is unavailable; refusing"
        ));
    }
    CUDA_ERROR_OUT_OF_MEMORY
}

/// What an allocation on the current device must do first.
enum Plan {
    /// Unbudgeted GPU or no claim: forward untouched.
    Forward,
    /// Charged; roll back with `release` if the driver fails.
    Charged(&'static State, Charge),
}

const ROUTE_UNKNOWN: u32 = 0;
const ROUTE_PER_CALL: u32 = 1;
const ROUTE_FREE: u32 = 2;
/// Where an allocation on the current context is charged, when that cannot depend on
/// the context: every device the process sees is the same merged GPU, or none is
/// budgeted (one GPU in the container, typically). 0: not decided; 1: ask the driver
/// per call; 2: unbudgeted; 3 + g: merged GPU g. Saves a `cuCtxGetDevice` per call.
static ALLOC_ROUTE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(ROUTE_UNKNOWN);

/// Decides [`ALLOC_ROUTE`] once the driver can list its devices (else per call, for
/// now: a process that allocates before `cuInit` gets an error from the driver).
#[cold]
fn decide_alloc_route(st: &State) -> u32 {
    let Some(n) = device_count().filter(|&n| n > 0) else {
        return ROUTE_PER_CALL;
    };
    let mut seen = None;
    for d in 0..n {
        let g = match st.gpu_for(d, cuda_uuid) {
            Ok(g) => g,
            Err(_) => return ROUTE_PER_CALL,
        };
        match seen {
            None => seen = Some(g),
            Some(s) if s == g => {}
            Some(_) => {
                seen = None;
                break;
            }
        }
    }
    let r = match seen {
        Some(Some(g)) => 3 + g as u32,
        Some(None) => ROUTE_FREE,
        None => ROUTE_PER_CALL,
    };
    ALLOC_ROUTE.store(r, std::sync::atomic::Ordering::Relaxed);
    r
}

/// The merged GPU an allocation on ordinal `dev` (or the current context) is charged
/// to; `Ok(None)` when unbudgeted; the error to return when the device is unknown.
#[inline]
fn gpu_of(st: &State, dev: Option<CUdevice>, what: &str) -> Result<Option<usize>, CUresult> {
    let dev = match dev {
        Some(d) => d,
        None => {
            let mut r = ALLOC_ROUTE.load(std::sync::atomic::Ordering::Relaxed);
            if r == ROUTE_UNKNOWN {
                r = decide_alloc_route(st);
            }
            match r {
                ROUTE_FREE => return Ok(None),
                ROUTE_PER_CALL => current_device()?,
                g => return Ok(Some((g - 3) as usize)),
            }
        }
    };
    st.gpu_for(dev, cuda_uuid)
        .map_err(|r| refused_code(st, r, what))
}

/// Reserves `bytes` on ordinal `dev` (or the current device).
#[inline]
fn plan(dev: Option<CUdevice>, bytes: u64, what: &str) -> Result<Plan, CUresult> {
    let st = accounting::state();
    if !st.active() {
        return Ok(Plan::Forward);
    }
    let g = match gpu_of(st, dev, what)? {
        Some(g) => g,
        None => return Ok(Plan::Forward),
    };
    match reserve_or_resettle(st, g, bytes) {
        Ok(c) => Ok(Plan::Charged(st, c)),
        Err(r) => Err(refused_code(st, r, what)),
    }
}

/// Reserves `bytes` on merged GPU `g`; before refusing, re-reads what the process's
/// memory pools retain (a pool may have released memory at a synchronisation the
/// library does not see) and tries once more.
#[inline]
fn reserve_or_resettle(st: &'static State, g: usize, bytes: u64) -> Result<Charge, Refused> {
    match st.reserve(g, bytes) {
        Err(Refused::OverBudget) if allocations::any_pool() => {
            pools::resettle_pools();
            st.reserve(g, bytes)
        }
        r => r,
    }
}

/// After the driver call: keep the charge (and remember it) or roll it back.
fn settle(plan: Plan, rc: CUresult, kind: Kind, id: impl FnOnce() -> u64, scrub_bytes: u64) {
    if let Plan::Charged(st, c) = plan {
        if rc == CUDA_SUCCESS {
            // Decided now, so that the free of a claim that does not scrub looks no
            // further.
            let scrub_bytes = if st.scrubs(c) { scrub_bytes } else { 0 };
            allocations::record(
                kind,
                id(),
                Entry {
                    charge: c,
                    scrub_bytes,
                    owner: 0,
                },
            );
        } else {
            st.release(c);
        }
    }
}

/// Zeroes `bytes` at `ptr` when the charge's claim scrubs on free; a failure is
/// logged (the free goes ahead).
fn scrub(st: &State, e: &Entry, ptr: CUdeviceptr) {
    if e.scrub_bytes == 0 || !st.scrubs(e.charge) {
        return;
    }
    let rc = memset_sync(ptr, e.scrub_bytes);
    if rc != CUDA_SUCCESS {
        stderr::log(format_args!(
            "scrubbing {} bytes failed with CUDA error {rc}; the memory is freed unscrubbed",
            e.scrub_bytes
        ));
    }
}

/// Zeroes `bytes` at `ptr` (`cuMemsetD8_v2`) and waits for it (`cuCtxSynchronize`):
/// the first error, or success.
fn memset_sync(ptr: CUdeviceptr, bytes: u64) -> CUresult {
    let (m, s) = (
        driver(DriverFn::MemsetD8V2),
        driver(DriverFn::CtxSynchronize),
    );
    if m == 0 || s == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    // SAFETY: cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t).
    let memset: unsafe extern "C" fn(CUdeviceptr, u8, usize) -> CUresult = unsafe { as_fn(m) };
    // SAFETY: the range is memory being freed, still valid.
    let rc = unsafe { memset(ptr, 0, bytes as usize) };
    if rc != CUDA_SUCCESS {
        return rc;
    }
    // SAFETY: cuCtxSynchronize(void).
    let sync: unsafe extern "C" fn() -> CUresult = unsafe { as_fn(s) };
    // SAFETY: no arguments.
    unsafe { sync() }
}

/// Forgets and releases the charge of a freed allocation, after the driver freed it.
fn release_after(kind: Kind, id: u64, rc: CUresult, taken: Option<Entry>) {
    if let Some(e) = taken {
        if rc == CUDA_SUCCESS {
            accounting::state().release(e.charge);
        } else {
            allocations::record(kind, id, e);
        }
    }
}

/// Moves a charge to `bytes`: releases the excess, or reserves the difference on the
/// same claim. On failure returns the unchanged charge.
fn resize(st: &State, c: Charge, bytes: u64) -> Result<Charge, Charge> {
    if bytes <= c.bytes {
        st.release(Charge {
            bytes: c.bytes - bytes,
            ..c
        });
        Ok(Charge { bytes, ..c })
    } else {
        match st.reserve_on(c, bytes - c.bytes) {
            Ok(()) => Ok(Charge { bytes, ..c }),
            Err(_) => Err(c),
        }
    }
}

/// `CU_STREAM_PER_THREAD`: the per-thread default stream as an explicit handle.
const STREAM_PER_THREAD: usize = 2;

/// The stream a `_ptsz` entry point means by `stream` (NULL is the per-thread
/// default stream there), as a handle any entry point understands.
fn stream_of(stream: CUstream, per_thread: bool) -> CUstream {
    if per_thread && stream.is_null() {
        STREAM_PER_THREAD as CUstream
    } else {
        stream
    }
}

/// Waits for the work queued on `stream` (`cuStreamSynchronize`).
fn sync_stream(stream: CUstream) -> CUresult {
    let p = driver(DriverFn::StreamSynchronize);
    if p == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    // SAFETY: cuStreamSynchronize(CUstream).
    let f: unsafe extern "C" fn(CUstream) -> CUresult = unsafe { as_fn(p) };
    // SAFETY: a stream handle the caller passed to the driver.
    unsafe { f(stream) }
}

mod arrays;
mod contexts;
mod devices;
mod graphs;
mod launch;
mod limits;
mod linear;
mod lookup;
mod pools;
mod views;
mod vmm;

pub use arrays::*;
pub use contexts::*;
pub use graphs::*;
pub use launch::*;
pub use limits::*;
pub use linear::*;
pub use lookup::*;
pub use pools::*;
pub use views::*;
pub use vmm::*;
