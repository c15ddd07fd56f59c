//! Virtual memory management: `cuMemCreate` on device locations, `cuMemMap`,
//! `cuMemUnmap`, `cuMemRetainAllocationHandle` and `cuMemRelease`.
//!
//! The driver frees a handle's physical memory only once every reference to the
//! handle is released *and* every mapping of it is unmapped (facts B4.1), so the
//! charge follows the same rule: a handle is charged from `cuMemCreate` until the
//! later of its last release and its last unmap. `cuMemCreate` gives a handle one
//! reference and each `cuMemRetainAllocationHandle` one more, which the tenant must
//! release too: a library that freed the charge at the first release would let a
//! retained, unmapped handle hold memory uncharged. (A process that releases handles while keeping them mapped holds
//! their memory, and their charge.) A handle can be mapped several times; `cuMemUnmap`
//! takes a range, which ends every mapping that starts inside it.
#![allow(non_snake_case)]

use crate::enforce::forklock::ForkLock;
use std::collections::{BTreeMap, HashMap};

use super::*;

/// A charged handle.
struct Handle {
    entry: Entry,
    dev: CUdevice,
    size: u64,
    /// Live mappings of the handle.
    maps: u32,
    /// References not yet released (`cuMemCreate` and each
    /// `cuMemRetainAllocationHandle`); at 0 the memory goes when the last mapping does.
    refs: u64,
    /// `cuMemRelease` calls under way, their reference already taken off: until they
    /// return, the record stays (a refused release puts its reference back).
    releasing: u32,
    /// Which record this is: a handle value the driver freed can come back from a
    /// later `cuMemCreate`, and a driver call that counted on the old record must not
    /// change the new one when it returns.
    generation: u64,
}

impl Handle {
    /// Every reference is released: the memory lives only as long as its mappings.
    fn released(&self) -> bool {
        self.refs == 0
    }

    /// The driver has freed the handle: no reference, no mapping, and no release
    /// under way that could still be refused.
    fn gone(&self) -> bool {
        self.released() && self.maps == 0 && self.releasing == 0
    }
}

/// Applies `change` to the handle's counts (a reference or mapping counted ahead of a
/// driver call that refused, or a release that returned), if its record is still the
/// `generation` the call counted on: its charge, if the driver has now freed the handle.
fn recount(
    b: &mut Book,
    handle: u64,
    generation: u64,
    change: impl FnOnce(&mut Handle),
) -> Option<Charge> {
    let h = b
        .handles
        .get_mut(&handle)
        .filter(|h| h.generation == generation)?;
    change(h);
    if h.gone() {
        b.handles.remove(&handle).map(|h| h.entry.charge)
    } else {
        None
    }
}

#[derive(Default)]
struct Book {
    handles: HashMap<u64, Handle>,
    /// Mapping start address -> (handle, mapped bytes, the handle's generation);
    /// charged handles only.
    maps: BTreeMap<u64, (u64, u64, u64)>,
    /// The last generation given to a record.
    generations: u64,
}

static BOOK: ForkLock<Option<Book>> = ForkLock::new(None);

fn with_book<R>(f: impl FnOnce(&mut Book) -> R) -> Option<R> {
    BOOK.lock()
        .ok()
        .map(|mut b| f(b.get_or_insert_with(Book::default)))
}

/// Physical memory on a device location, charged at its size (the driver refuses
/// sizes that are not multiples of the granularity, so the size is what it uses).
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    // SAFETY: the caller passes a valid prop (or null, which the driver refuses).
    let dev = (!prop.is_null())
        .then(|| unsafe { &*prop })
        .filter(|p| p.location_type == CU_MEM_LOCATION_TYPE_DEVICE)
        .map(|p| p.location_id);
    let plan = match dev {
        Some(d) => match plan(Some(d), size as u64, "cuMemCreate") {
            Ok(p) => p,
            Err(rc) => return rc,
        },
        None => Plan::Forward,
    };
    let rc = call_real!(
        Hook::cuMemCreate,
        unsafe extern "C" fn(
            *mut CUmemGenericAllocationHandle,
            usize,
            *const CUmemAllocationProp,
            u64,
        ) -> CUresult,
        handle,
        size,
        prop,
        flags
    );
    if let Plan::Charged(st, c) = plan {
        if rc != CUDA_SUCCESS || handle.is_null() {
            st.release(c);
            return rc;
        }
        // SAFETY: on success the driver wrote *handle.
        let h = unsafe { *handle };
        let entry = Entry {
            charge: c,
            scrub_bytes: if st.scrubs(c) { size as u64 } else { 0 },
            owner: 0,
        };
        let kept = with_book(|b| {
            b.generations += 1;
            let generation = b.generations;
            // A record already there is a handle the driver has freed (it gave the
            // value out again) before the call that freed it returned: its charge goes.
            b.handles
                .insert(
                    h,
                    Handle {
                        entry,
                        dev: dev.unwrap_or(0),
                        size: size as u64,
                        maps: 0,
                        refs: 1,
                        releasing: 0,
                        generation,
                    },
                )
                .map(|old| old.entry.charge)
        });
        match kept {
            None => st.release(c),
            Some(Some(old)) => st.release(old),
            Some(None) => {}
        }
    }
    rc
}

/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    // Counted before the driver maps it: a release and unmap racing in another thread
    // must not see the handle's last mapping gone and return its charge while this
    // mapping keeps the memory alive. (Such a race can skip a scrub: the memory then
    // goes back to the device unzeroed.)
    let counted = with_book(|b| {
        let h = b.handles.get_mut(&handle)?;
        h.maps = h.maps.saturating_add(1);
        Some(h.generation)
    })
    .flatten();
    let rc = call_real!(
        Hook::cuMemMap,
        unsafe extern "C" fn(
            CUdeviceptr,
            usize,
            usize,
            CUmemGenericAllocationHandle,
            u64,
        ) -> CUresult,
        ptr,
        size,
        offset,
        handle,
        flags
    );
    if let Some(generation) = counted {
        let freed = with_book(|b| {
            if rc == CUDA_SUCCESS {
                b.maps.insert(ptr, (handle, size as u64, generation));
                None
            } else {
                recount(b, handle, generation, |h| h.maps = h.maps.saturating_sub(1))
            }
        })
        .flatten();
        if let Some(c) = freed {
            accounting::state().release(c);
        }
    }
    rc
}

/// Ends every mapping that starts in `[ptr, ptr + size)`; a released handle whose
/// last mapping this was is freed by the driver now, and its charge returned (zeroed
/// first through the mapping when its claim scrubs).
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    let end = ptr.saturating_add(size as u64);
    // (address, handle, bytes, generation, zero it first)
    let ending: Vec<(u64, u64, u64, u64, bool)> = with_book(|b| {
        let mut per_handle: HashMap<u64, u32> = HashMap::new();
        let hits: Vec<(u64, (u64, u64, u64))> =
            b.maps.range(ptr..end).map(|(&va, &m)| (va, m)).collect();
        for &(_, (h, _, _)) in &hits {
            *per_handle.entry(h).or_default() += 1;
        }
        hits.into_iter()
            .map(|(va, (h, n, g))| {
                let here = per_handle.get(&h).copied().unwrap_or(0);
                // The handle's last mappings end here, after its release: zero them.
                let scrub_it = b.handles.get(&h).is_some_and(|x| {
                    x.generation == g && x.released() && x.maps <= here && x.entry.scrub_bytes > 0
                });
                (va, h, n, g, scrub_it)
            })
            .collect()
    })
    .unwrap_or_default();
    for &(va, _, n, _, scrub_it) in &ending {
        if scrub_it {
            scrub_range(va, n, "cuMemUnmap");
        }
    }
    let rc = call_real!(
        Hook::cuMemUnmap,
        unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult,
        ptr,
        size
    );
    if rc == CUDA_SUCCESS && !ending.is_empty() {
        let freed: Vec<Charge> = with_book(|b| {
            let mut freed = Vec::new();
            for (va, h, n, g, _) in ending {
                // Only the mapping this call ended: a cuMemMap racing in another
                // thread may already have mapped something else at `va`.
                if b.maps.get(&va) == Some(&(h, n, g)) {
                    b.maps.remove(&va);
                }
                freed.extend(recount(b, h, g, |x| x.maps = x.maps.saturating_sub(1)));
            }
            freed
        })
        .unwrap_or_default();
        let st = accounting::state();
        for c in freed {
            st.release(c);
        }
    }
    rc
}

/// The handle behind a mapped address, with one more reference to it: the handle
/// stays charged until that reference is released as well.
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    // The reference is counted before the driver gives it, on the charged handle
    // mapped at `addr`: a release and unmap racing in another thread then cannot
    // return the charge of memory this reference keeps.
    let a = addr as u64;
    let ahead = with_book(|b| {
        let (&va, &(h, n, g)) = b.maps.range(..=a).next_back()?;
        let x = b
            .handles
            .get_mut(&h)
            .filter(|x| x.generation == g && a < va.saturating_add(n))?;
        x.refs = x.refs.saturating_add(1);
        Some((h, g))
    })
    .flatten();
    let rc = call_real!(
        Hook::cuMemRetainAllocationHandle,
        unsafe extern "C" fn(*mut CUmemGenericAllocationHandle, *mut c_void) -> CUresult,
        handle,
        addr
    );
    // SAFETY: on success the driver wrote *handle.
    let got = (rc == CUDA_SUCCESS && !handle.is_null()).then(|| unsafe { *handle });
    if ahead.map(|(h, _)| h) == got {
        return rc;
    }
    // Counted on another handle than the driver's (the mapping changed meanwhile), or
    // refused: the reference moves to the handle the driver gave, if it is charged.
    let freed = with_book(|b| {
        if let Some(g) = got
            && let Some(x) = b.handles.get_mut(&g)
        {
            x.refs = x.refs.saturating_add(1);
        }
        ahead.and_then(|(h, g)| recount(b, h, g, |x| x.refs = x.refs.saturating_sub(1)))
    })
    .flatten();
    if let Some(c) = freed {
        accounting::state().release(c);
    }
    rc
}

/// Releases one reference to the handle. At its last reference the charge goes now if
/// the handle is not mapped, else at its last unmap. When the claim scrubs and the
/// last reference goes from an unmapped handle, the whole handle is zeroed first
/// (mapped at a temporary address), while it is still valid. A handle released while
/// mapped stays valid memory for the tenant until its last unmap, so it is left alone
/// here and zeroed by that [`cuMemUnmap`].
///
/// # Safety
/// The driver's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    // The reference is taken off before the driver call, so that of two releases
    // racing, exactly one sees the last reference go and zeroes the handle (while it
    // is still valid); a refusal puts it back.
    let known = with_book(|b| {
        let h = b.handles.get_mut(&handle).filter(|h| !h.released())?;
        h.refs -= 1;
        h.releasing += 1;
        Some((
            h.entry.scrub_bytes > 0 && h.refs == 0 && h.maps == 0,
            h.dev,
            h.size,
            h.generation,
        ))
    })
    .flatten();
    if let Some((true, dev, size, _)) = known {
        scrub_handle(handle, dev, size);
    }
    let rc = call_real!(
        Hook::cuMemRelease,
        unsafe extern "C" fn(CUmemGenericAllocationHandle) -> CUresult,
        handle
    );
    if let Some((_, _, _, generation)) = known {
        // The record is still there: `releasing` kept a racing unmap from removing it.
        let freed = with_book(|b| {
            recount(b, handle, generation, |h| {
                h.releasing = h.releasing.saturating_sub(1);
                if rc != CUDA_SUCCESS {
                    h.refs = h.refs.saturating_add(1);
                }
            })
        })
        .flatten();
        if let Some(c) = freed {
            accounting::state().release(c);
        }
    }
    rc
}

/// Zeroes `bytes` at `va` (`cuMemsetD8_v2`, then a context synchronise), logging a
/// failure: the free goes ahead either way.
fn scrub_range(va: CUdeviceptr, bytes: u64, what: &str) {
    let rc = memset_sync(va, bytes);
    if rc != CUDA_SUCCESS {
        stderr::log(format_args!(
            "{what}: scrubbing {bytes} bytes failed with CUDA error {rc}; the memory is freed unscrubbed"
        ));
    }
}

/// Zeroes a whole handle before its release: reserves a temporary address range,
/// maps the handle there with read-write access for its device, zeroes it, and takes
/// the mapping and the range down again.
fn scrub_handle(handle: u64, dev: CUdevice, size: u64) {
    let (reserve, free, access) = (
        driver(DriverFn::MemAddressReserve),
        driver(DriverFn::MemAddressFree),
        driver(DriverFn::MemSetAccess),
    );
    let (map, unmap) = (real(Hook::cuMemMap), real(Hook::cuMemUnmap));
    if [reserve, free, access, map, unmap].contains(&0) {
        stderr::log(format_args!(
            "cuMemRelease: the driver lacks the VMM calls to scrub a handle; freed unscrubbed"
        ));
        return;
    }
    let n = size as usize;
    let mut va: CUdeviceptr = 0;
    // SAFETY: the driver's VMM entry points with their cuda.h signatures.
    let rc = unsafe {
        let reserve: unsafe extern "C" fn(
            *mut CUdeviceptr,
            usize,
            usize,
            CUdeviceptr,
            u64,
        ) -> CUresult = as_fn(reserve);
        reserve(&mut va, n, 0, 0, 0)
    };
    if rc != CUDA_SUCCESS {
        scrub_failed(rc);
        return;
    }
    // SAFETY: as above; `va` is the range just reserved, `handle` is live.
    let mut rc = unsafe {
        let map: unsafe extern "C" fn(CUdeviceptr, usize, usize, u64, u64) -> CUresult = as_fn(map);
        map(va, n, 0, handle, 0)
    };
    if rc == CUDA_SUCCESS {
        // CUmemAccessDesc: location {type DEVICE, id}, flags PROT_READWRITE (3).
        let desc: [c_int; 3] = [CU_MEM_LOCATION_TYPE_DEVICE, dev, 3];
        // SAFETY: cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t).
        rc = unsafe {
            let access: unsafe extern "C" fn(CUdeviceptr, usize, *const c_int, usize) -> CUresult =
                as_fn(access);
            access(va, n, desc.as_ptr(), 1)
        };
        if rc == CUDA_SUCCESS {
            rc = memset_sync(va, size);
        }
        // SAFETY: unmapping what was mapped above.
        unsafe {
            let unmap: unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult = as_fn(unmap);
            unmap(va, n);
        }
    }
    // SAFETY: freeing the range reserved above.
    unsafe {
        let free: unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult = as_fn(free);
        free(va, n);
    }
    if rc != CUDA_SUCCESS {
        scrub_failed(rc);
    }
}

fn scrub_failed(rc: CUresult) {
    stderr::log(format_args!(
        "cuMemRelease: scrubbing a handle failed with CUDA error {rc}; it is freed unscrubbed"
    ));
}
