//! `cuCtxSetLimit` reservations (malloc heap, printf FIFO, stack).
#![allow(non_snake_case)]

use super::*;

/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT` × `..._MAX_THREADS_PER_MULTIPROCESSOR`:
/// how many threads can be resident, each with its own stack.
fn resident_threads(dev: CUdevice) -> Option<u64> {
    let p = driver(DriverFn::DeviceGetAttribute);
    if p == 0 {
        return None;
    }
    // SAFETY: cuDeviceGetAttribute(int*, CUdevice_attribute, CUdevice).
    let f: unsafe extern "C" fn(*mut c_int, c_int, CUdevice) -> CUresult = unsafe { as_fn(p) };
    let (mut sms, mut threads) = (0, 0);
    // SAFETY: valid out pointers.
    let ok =
        unsafe { f(&mut sms, 16, dev) == CUDA_SUCCESS && f(&mut threads, 39, dev) == CUDA_SUCCESS };
    ok.then(|| u64::try_from(sms).unwrap_or(0) * u64::try_from(threads).unwrap_or(0))
}

/// The device memory a limit reserves: the malloc heap and printf FIFO at their
/// size, the stack per resident thread; other limits reserve none.
fn limit_bytes(dev: CUdevice, limit: c_int, value: usize) -> Option<u64> {
    match limit {
        CU_LIMIT_MALLOC_HEAP_SIZE | CU_LIMIT_PRINTF_FIFO_SIZE => Some(value as u64),
        CU_LIMIT_STACK_SIZE => resident_threads(dev).map(|t| t.saturating_mul(value as u64)),
        _ => None,
    }
}

/// Charges the reservation a limit makes, replacing the limit's previous charge:
/// a raise reserves the difference before the driver call (on the claim already
/// charged), a cut is released after it.
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    type SetLimit = unsafe extern "C" fn(c_int, usize) -> CUresult;
    let st = accounting::state();
    let dev = if st.active() {
        current_device().ok()
    } else {
        None
    };
    let want = dev.and_then(|d| limit_bytes(d, limit, value).map(|b| (d, b)));
    let Some((dev, bytes)) = want else {
        return call_real!(Hook::cuCtxSetLimit, SetLimit, limit, value);
    };
    let key = (u64::from(dev as u32) << 8) | u64::from(limit as u8);
    let Some(old) = allocations::forget(Kind::Limit, key) else {
        let plan = match plan(Some(dev), bytes, "cuCtxSetLimit") {
            Ok(p) => p,
            Err(rc) => return rc,
        };
        let rc = call_real!(Hook::cuCtxSetLimit, SetLimit, limit, value);
        settle(plan, rc, Kind::Limit, || key, 0);
        return rc;
    };
    let keep = |c: Charge| {
        allocations::record(
            Kind::Limit,
            key,
            Entry {
                charge: c,
                scrub_bytes: 0,
                owner: 0,
            },
        )
    };
    let was = old.charge;
    if bytes > was.bytes && st.reserve_on(was, bytes - was.bytes).is_err() {
        keep(was);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = call_real!(Hook::cuCtxSetLimit, SetLimit, limit, value);
    let now = if rc == CUDA_SUCCESS { bytes } else { was.bytes };
    // Return whatever is held beyond what the limit now reserves.
    let held = was.bytes.max(bytes);
    if held > now {
        st.release(Charge {
            bytes: held - now,
            ..was
        });
    }
    keep(Charge { bytes: now, ..was });
    rc
}
