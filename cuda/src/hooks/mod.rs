//! The exported driver and NVML entry points. Each hook is thin: find the device,
//! reserve in the region (`accounting`), call the driver, roll back on failure, and
//! remember the charge for the matching free. With no claim mounted every hook only
//! forwards. No hook panics; a missing driver function gives `CUDA_ERROR_NOT_FOUND`.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use crate::accounting::{self, Charge, Entry, Kind, Refused, State};
use crate::ffi::*;
use crate::interpose::{DriverFn, Hook, as_fn, driver, hook_address, real, remember};
pub(crate) use crate::interpose::{cuda_uuid, current_device};
use crate::{gpa_table, sizes};

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
        eprintln!("tessera-cuda: {what}: the device's UUID is unavailable; refusing");
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

/// Reserves `bytes` on ordinal `dev` (or the current device).
fn plan(dev: Option<CUdevice>, bytes: u64, what: &str) -> Result<Plan, CUresult> {
    let st = accounting::state();
    if !st.active() {
        return Ok(Plan::Forward);
    }
    let dev = match dev {
        Some(d) => d,
        None => current_device()?,
    };
    let g = match st.gpu_for(dev, cuda_uuid) {
        Ok(Some(g)) => g,
        Ok(None) => return Ok(Plan::Forward),
        Err(r) => return Err(refused_code(st, r, what)),
    };
    match st.reserve(g, bytes) {
        Ok(c) => Ok(Plan::Charged(st, c)),
        Err(r) => Err(refused_code(st, r, what)),
    }
}

/// After the driver call: keep the charge (and remember it) or roll it back.
fn settle(plan: Plan, rc: CUresult, kind: Kind, id: impl FnOnce() -> u64, scrub_bytes: u64) {
    if let Plan::Charged(st, c) = plan {
        if rc == CUDA_SUCCESS {
            accounting::record(
                kind,
                id(),
                Entry {
                    charge: c,
                    scrub_bytes,
                },
            );
        } else {
            st.release(c);
        }
    }
}

/// Zeroes `bytes` at `ptr` when the charge's claim scrubs on free.
fn scrub(st: &State, e: &Entry, ptr: CUdeviceptr) {
    if e.scrub_bytes == 0 || !st.scrubs(e.charge) {
        return;
    }
    let (m, s) = (
        driver(DriverFn::MemsetD8V2),
        driver(DriverFn::CtxSynchronize),
    );
    if m == 0 {
        return;
    }
    // SAFETY: cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t).
    let memset: unsafe extern "C" fn(CUdeviceptr, u8, usize) -> CUresult = unsafe { as_fn(m) };
    // SAFETY: the range is the allocation being freed.
    unsafe { memset(ptr, 0, e.scrub_bytes as usize) };
    if s != 0 {
        // SAFETY: cuCtxSynchronize(void).
        let sync: unsafe extern "C" fn() -> CUresult = unsafe { as_fn(s) };
        // SAFETY: no arguments.
        unsafe { sync() };
    }
}

/// Forgets and releases the charge of a freed allocation, after the driver freed it.
fn release_after(kind: Kind, id: u64, rc: CUresult, taken: Option<Entry>) {
    if let Some(e) = taken {
        if rc == CUDA_SUCCESS {
            accounting::state().release(e.charge);
        } else {
            accounting::record(kind, id, e);
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

mod arrays;
mod graphs;
mod launch;
mod limits;
mod linear;
mod lookup;
mod pools;
mod views;
mod vmm;

pub use arrays::*;
pub use graphs::*;
pub use launch::*;
pub use limits::*;
pub use linear::*;
pub use lookup::*;
pub use pools::*;
pub use views::*;
pub use vmm::*;
