//! Contexts: `cuCtxCreate_v2/_v3/_v4` with `cuCtxDestroy_v2`, and each device's
//! primary context (`cuDevicePrimaryCtxRetain`, `cuDevicePrimaryCtxRelease_v2`,
//! `cuDevicePrimaryCtxReset_v2`). A context reserves device memory of its own (local
//! memory for the resident threads, printf FIFO, malloc heap, code, driver state).
//!
//! Each context is charged, before it is created, what the last measured context on
//! that GPU cost in this process, else the region's per-context figure
//! ([`tessera_abi::region::gpu::CONTEXT_BYTES`]), never less than that figure; when a
//! context of the same device is current the driver's free memory is read before and
//! after the creation. A measurement only ever raises the charge: the difference is
//! taken when it is above what was reserved, capped at twice the region's figure
//! (other processes allocate meanwhile), and ignored when it is below (memory freed
//! meanwhile, by this process or another, would otherwise make a context, and every
//! later one, look free: a tenant could cause that on purpose). A context cheaper than
//! the figure is therefore charged the figure; one dearer is charged what it costs. A
//! creation the budget cannot hold is refused with `CUDA_ERROR_OUT_OF_MEMORY`, or
//! undone when the measurement exceeds what fits. A created context is released at
//! `cuCtxDestroy_v2`; a primary context when the process's last retain is released,
//! or when it is reset.
#![allow(non_snake_case)]

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use crate::enforce::accounting::MAX_DEVICES;
use crate::enforce::forklock::ForkLock;

/// Makes an `int` argument usable as an index guard.
fn ordinal(dev: c_int) -> Option<usize> {
    usize::try_from(dev).ok()
}

/// Per merged GPU: the last context charge a measurement set in this process (0 =
/// none yet); never below the region's figure, never above twice it.
static LEARNED: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// Per CUDA ordinal: the process's retains of the primary context and its charge.
struct Primary {
    retains: u32,
    charge: Option<Charge>,
}

static PRIMARY: ForkLock<[Primary; MAX_DEVICES]> = ForkLock::new(
    [const {
        Primary {
            retains: 0,
            charge: None,
        }
    }; MAX_DEVICES],
);

/// The driver's free memory on the current context's device, if that is `dev`.
fn free_on(dev: CUdevice) -> Option<u64> {
    if current_device().ok()? != dev {
        return None;
    }
    let p = real(Hook::cuMemGetInfo_v2);
    if p == 0 {
        return None;
    }
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: the driver's cuMemGetInfo_v2(size_t*, size_t*).
    let f: unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult = unsafe { as_fn(p) };
    // SAFETY: valid out pointers.
    (unsafe { f(&mut free, &mut total) } == CUDA_SUCCESS).then_some(free as u64)
}

/// A context charge in the making: reserved before the driver creates the context.
struct Pending {
    st: &'static State,
    g: usize,
    charge: Charge,
    /// The figure measurements are bounded by.
    estimate: u64,
    free_before: Option<u64>,
}

/// Reserves a context's charge on ordinal `dev`: `Ok(None)` when the GPU is
/// unbudgeted, contexts are not charged there, or no claim is mounted.
fn reserve_context(dev: CUdevice, what: &str) -> Result<Option<Pending>, CUresult> {
    let st = accounting::state();
    if !st.active() {
        return Ok(None);
    }
    // Before cuInit, or for an ordinal the driver does not have, the driver's own
    // error is the answer (and the ordinal's UUID is not looked up, so no failure is
    // remembered for it).
    if !device_count().is_some_and(|n| (0..n).contains(&dev)) {
        return Ok(None);
    }
    let Some(g) = gpu_of(st, Some(dev), what)? else {
        return Ok(None);
    };
    let estimate = st.context_estimate(g);
    if estimate == 0 {
        return Ok(None);
    }
    let learned = LEARNED.get(g).map_or(0, |l| l.load(Ordering::Relaxed));
    let bytes = learned.max(estimate);
    let free_before = free_on(dev);
    let charge = reserve_or_resettle(st, g, bytes).map_err(|r| refused_code(st, r, what))?;
    Ok(Some(Pending {
        st,
        g,
        charge,
        estimate,
        free_before,
    }))
}

/// After the driver created the context on `dev` (now or already current for a
/// measurement): the charge, raised to the measurement when there is one above it;
/// `Err` (with everything released) when the measured cost does not fit.
fn settle_context(p: Pending, dev: CUdevice) -> Result<Charge, ()> {
    let Some((before, after)) = p.free_before.zip(free_on(dev)) else {
        return Ok(p.charge);
    };
    let m = sizes::context_charge(p.charge.bytes, p.estimate, before.saturating_sub(after));
    if let Some(l) = LEARNED.get(p.g) {
        l.store(m, Ordering::Relaxed);
    }
    resize(p.st, p.charge, m).map_err(|c| p.st.release(c))
}

type CreateV2 = unsafe extern "C" fn(*mut CUcontext, c_uint, CUdevice) -> CUresult;
type CreateV3 =
    unsafe extern "C" fn(*mut CUcontext, *mut c_void, c_int, c_uint, CUdevice) -> CUresult;
type CreateV4 = unsafe extern "C" fn(*mut CUcontext, *mut c_void, c_uint, CUdevice) -> CUresult;
type CtxFn = unsafe extern "C" fn(CUcontext) -> CUresult;
type DevFn = unsafe extern "C" fn(CUdevice) -> CUresult;

/// The common path of the `cuCtxCreate` variants: reserve, create, measure, record.
fn create(pctx: *mut CUcontext, dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let pending = match reserve_context(dev, "cuCtxCreate") {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    let rc = call();
    let Some(p) = pending else {
        return rc;
    };
    if rc != CUDA_SUCCESS || pctx.is_null() {
        p.st.release(p.charge);
        return rc;
    }
    // SAFETY: on success the driver wrote *pctx.
    let ctx = unsafe { *pctx };
    match settle_context(p, dev) {
        Ok(c) => {
            allocations::record(
                Kind::Context,
                ctx as u64,
                Entry {
                    charge: c,
                    scrub_bytes: 0,
                    owner: 0,
                },
            );
            rc
        }
        Err(()) => {
            let d = real(Hook::cuCtxDestroy_v2);
            if d != 0 {
                // SAFETY: destroying the context just created.
                let f: CtxFn = unsafe { as_fn(d) };
                // SAFETY: as above.
                unsafe { f(ctx) };
            }
            CUDA_ERROR_OUT_OF_MEMORY
        }
    }
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    create(pctx, dev, || {
        call_real!(Hook::cuCtxCreate_v2, CreateV2, pctx, flags, dev)
    })
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    nparams: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    create(pctx, dev, || {
        call_real!(
            Hook::cuCtxCreate_v3,
            CreateV3,
            pctx,
            params,
            nparams,
            flags,
            dev
        )
    })
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    create(pctx, dev, || {
        call_real!(Hook::cuCtxCreate_v4, CreateV4, pctx, params, flags, dev)
    })
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    let taken = allocations::forget(Kind::Context, ctx as u64);
    let rc = call_real!(Hook::cuCtxDestroy_v2, CtxFn, ctx);
    release_after(Kind::Context, ctx as u64, rc, taken);
    rc
}

/// The first retain of a device's primary context creates it: charged as a created
/// context. Later retains only count.
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    type Retain = unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult;
    let Some(d) = ordinal(dev).filter(|&d| d < MAX_DEVICES) else {
        return call_real!(Hook::cuDevicePrimaryCtxRetain, Retain, pctx, dev);
    };
    // Held across the driver call: retains and releases of primary contexts are
    // serialized in this process (the driver serializes them too). A child forked
    // meanwhile finds the lock abandoned and forwards ([`ForkLock`]).
    let Ok(mut prim) = PRIMARY.lock() else {
        return call_real!(Hook::cuDevicePrimaryCtxRetain, Retain, pctx, dev);
    };
    let slot = &mut prim[d];
    let pending = if slot.charge.is_none() {
        match reserve_context(dev, "cuDevicePrimaryCtxRetain") {
            Ok(p) => p,
            Err(rc) => return rc,
        }
    } else {
        None
    };
    let rc = call_real!(Hook::cuDevicePrimaryCtxRetain, Retain, pctx, dev);
    if rc != CUDA_SUCCESS {
        if let Some(p) = pending {
            p.st.release(p.charge);
        }
        return rc;
    }
    if let Some(p) = pending {
        match settle_context(p, dev) {
            Ok(c) => slot.charge = Some(c),
            Err(()) => {
                let r = real(Hook::cuDevicePrimaryCtxRelease_v2);
                if r != 0 {
                    // SAFETY: undoing the retain just made.
                    let f: DevFn = unsafe { as_fn(r) };
                    // SAFETY: as above.
                    unsafe { f(dev) };
                }
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
    }
    slot.retains = slot.retains.saturating_add(1);
    rc
}

/// The process's last release of a primary context destroys it: its charge is
/// returned.
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    let rc = call_real!(Hook::cuDevicePrimaryCtxRelease_v2, DevFn, dev);
    if rc == CUDA_SUCCESS
        && let Some(d) = ordinal(dev).filter(|&d| d < MAX_DEVICES)
        && let Ok(mut prim) = PRIMARY.lock()
    {
        let slot = &mut prim[d];
        slot.retains = slot.retains.saturating_sub(1);
        if slot.retains == 0
            && let Some(c) = slot.charge.take()
        {
            accounting::state().release(c);
        }
    }
    rc
}

/// A reset destroys the primary context's resources (a later retain or use creates
/// them again): its charge is returned, the retain count kept.
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    let rc = call_real!(Hook::cuDevicePrimaryCtxReset_v2, DevFn, dev);
    if rc == CUDA_SUCCESS
        && let Some(d) = ordinal(dev).filter(|&d| d < MAX_DEVICES)
        && let Ok(mut prim) = PRIMARY.lock()
        && let Some(c) = prim[d].charge.take()
    {
        accounting::state().release(c);
    }
    rc
}
