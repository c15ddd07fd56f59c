//! The live allocations the library charged, by handle, so that each free returns
//! what its allocation was charged (once, whatever the interleaving of frees): a
//! lock-free table for linear memory (`cuMemAlloc`/`cuMemFree`, the hottest pair), a
//! table under a [`ForkLock`] for every other kind, and the memory graphs materialize.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::accounting::{Charge, loaded_state};
use super::forklock::ForkLock;
use super::ptr_hasher::PtrHasher;
use crate::stderr::log;

/// What the library remembers about a live allocation.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub charge: Charge,
    /// Bytes to zero on free when the claim scrubs (0 = cannot scrub this kind).
    pub scrub_bytes: u64,
    /// The handle the allocation lives in: its memory pool for [`Kind::Async`]; 0
    /// otherwise.
    pub owner: u64,
}

/// The kind of handle an allocation is known by (pointers, VMM handles and arrays
/// live in different name spaces).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Linear,
    Array,
    /// A memory pool's retained size, keyed by the pool handle.
    Pool,
    /// A mipmapped array.
    Mipmap,
    /// A `cuCtxSetLimit` reservation, keyed by (device << 8 | limit).
    Limit,
    /// A device's graph memory pool, keyed by device ordinal.
    GraphPool,
    /// A context made by `cuCtxCreate*`, keyed by its handle.
    Context,
    /// A charged stream-ordered allocation, keyed by pointer (charge 0: its pool is
    /// charged): its pool (`owner`), so that a destroyed pool's charge is returned
    /// with its last pointer, and its size when the claim scrubs.
    Async,
}
type Table = HashMap<(Kind, u64), Entry, BuildHasherDefault<PtrHasher>>;
/// Every kind but [`Kind::Linear`], and linear allocations that found no room in
/// [`LINEAR`].
static ALLOCATIONS: ForkLock<Option<Table>> = ForkLock::new(None);
/// Linear allocations in the mutex table (those [`LINEAR`] had no room for): while 0,
/// a linear free that misses [`LINEAR`] takes no lock.
static LINEAR_SPILLED: AtomicUsize = AtomicUsize::new(0);

/// Remembers a charged allocation. An entry already recorded under the same id is
/// never overwritten silently: the driver handed the id out again, so the library
/// missed its free; that stale charge is returned (and logged).
pub fn record(kind: Kind, id: u64, e: Entry) {
    if kind == Kind::Pool {
        POOLS_SEEN.store(true, Ordering::Relaxed);
    }
    if kind == Kind::Linear && LINEAR.insert(id, e) {
        return;
    }
    let old = ALLOCATIONS.lock().ok().and_then(|mut t| {
        let old = t.get_or_insert_with(Table::default).insert((kind, id), e);
        if kind == Kind::Linear && old.is_none() {
            LINEAR_SPILLED.fetch_add(1, Ordering::Release);
        }
        old
    });
    if let Some(old) = old {
        log(format_args!(
            "{kind:?} {id:#x} was recorded twice; its earlier charge of {} bytes is returned",
            old.charge.bytes
        ));
        if let Some(st) = loaded_state() {
            st.release(old.charge);
        }
    }
}

/// Forgets an allocation and returns what it was charged; `None` for memory the
/// library never charged (unbudgeted, or allocated before it loaded). Each recorded
/// entry is returned at most once, whatever the interleaving of concurrent frees.
pub fn forget(kind: Kind, id: u64) -> Option<Entry> {
    if kind == Kind::Linear {
        if let Some(e) = LINEAR.remove(id) {
            return Some(e);
        }
        if LINEAR_SPILLED.load(Ordering::Acquire) == 0 {
            return None;
        }
    }
    let e = ALLOCATIONS
        .lock()
        .ok()
        .and_then(|mut t| t.as_mut().and_then(|t| t.remove(&(kind, id))));
    if kind == Kind::Linear && e.is_some() {
        LINEAR_SPILLED.fetch_sub(1, Ordering::Release);
    }
    e
}

/// Looks at an allocation's entry without forgetting it.
pub fn peek(kind: Kind, id: u64) -> Option<Entry> {
    if kind == Kind::Linear
        && let Some(e) = LINEAR.peek(id)
    {
        return Some(e);
    }
    ALLOCATIONS
        .lock()
        .ok()
        .and_then(|t| t.as_ref().and_then(|t| t.get(&(kind, id)).copied()))
}

/// How many remembered allocations of `kind` satisfy `f` (not [`Kind::Linear`]).
pub fn count(kind: Kind, f: impl Fn(&Entry) -> bool) -> usize {
    ALLOCATIONS
        .lock()
        .ok()
        .and_then(|t| {
            t.as_ref()
                .map(|t| t.iter().filter(|(k, e)| k.0 == kind && f(e)).count())
        })
        .unwrap_or(0)
}

/// The ids of every remembered allocation of `kind`.
pub fn keys(kind: Kind) -> Vec<u64> {
    let mut v: Vec<u64> = ALLOCATIONS
        .lock()
        .ok()
        .and_then(|t| {
            t.as_ref()
                .map(|t| t.keys().filter(|k| k.0 == kind).map(|k| k.1).collect())
        })
        .unwrap_or_default();
    if kind == Kind::Linear {
        LINEAR.for_each_key(|k| v.push(k));
    }
    v
}

/// Slots in the lock-free table of linear allocations (a power of two): 64 KiB,
/// small enough to stay in cache (with 64 K slots and a scattering hash, the miss on
/// a cold slot cost more than the whole mutex; 256 KiB still cost ~10 ns per pair, and
/// more with 8 processes sharing two cores' caches). 2,048 live allocations is more
/// than a caching allocator keeps; what finds no room goes to the mutex table.
const LINEAR_SLOTS: usize = 1 << 11;
/// How far an insertion probes before spilling to the mutex table.
const LINEAR_PROBE: usize = 64;
/// Key values with a meaning of their own (device pointers are never this small;
/// such an id goes to the mutex table).
const K_EMPTY: u64 = 0;
const K_GONE: u64 = 1;
const K_BUSY: u64 = 2;

/// One slot: the pointer and what it was charged. The payload is written and read
/// only by the thread that moved the key to `K_BUSY`.
#[repr(C, align(32))]
struct LinearSlot {
    key: AtomicU64,
    /// claim << 16 | gpu.
    at: AtomicU64,
    bytes: AtomicU64,
    scrub: AtomicU64,
}

/// The allocation table for `cuMemAlloc`/`cuMemFree`, the hottest pair: open
/// addressing keyed by pointer, one compare-and-swap per insert and per remove, no
/// lock. A slot's key goes `EMPTY|GONE -> BUSY -> id` when an allocation is recorded
/// and `id -> BUSY -> GONE` when it is freed; the thread whose compare-and-swap moved
/// it to `BUSY` owns the payload until it publishes the next key, so two racing frees
/// of one pointer cannot both take its charge. A key never returns to `EMPTY`, so a
/// lookup stops at the first `EMPTY` slot. Lives in `.bss`: untouched pages cost
/// nothing.
struct LinearTable {
    slots: [LinearSlot; LINEAR_SLOTS],
}

static LINEAR: LinearTable = LinearTable {
    slots: [const {
        LinearSlot {
            key: AtomicU64::new(K_EMPTY),
            at: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            scrub: AtomicU64::new(0),
        }
    }; LINEAR_SLOTS],
};

impl LinearTable {
    fn home(id: u64) -> usize {
        // Locality-preserving: the 2 MiB page number mixed with the 512-byte offset in
        // it, so that consecutive allocations (a bump of whole pages, or small ones
        // carved from one page) land in neighbouring, already-cached slots.
        ((id >> 21) ^ (id >> 9)) as usize & (LINEAR_SLOTS - 1)
    }

    fn probe(id: u64) -> impl Iterator<Item = &'static LinearSlot> {
        let h = Self::home(id);
        (0..LINEAR_PROBE).map(move |i| &LINEAR.slots[(h + i) & (LINEAR_SLOTS - 1)])
    }

    /// Records `e` under `id`; false when there is no room within the probe window.
    fn insert(&self, id: u64, e: Entry) -> bool {
        if id <= K_BUSY {
            return false;
        }
        for s in Self::probe(id) {
            let mut k = s.key.load(Ordering::Relaxed);
            while k == K_EMPTY || k == K_GONE {
                match s
                    .key
                    .compare_exchange(k, K_BUSY, Ordering::Acquire, Ordering::Relaxed)
                {
                    Ok(_) => {
                        let c = e.charge;
                        s.at.store(
                            (u64::from(c.claim) << 16) | u64::from(c.gpu),
                            Ordering::Relaxed,
                        );
                        s.bytes.store(c.bytes, Ordering::Relaxed);
                        s.scrub.store(e.scrub_bytes, Ordering::Relaxed);
                        s.key.store(id, Ordering::Release);
                        return true;
                    }
                    Err(now) => k = now,
                }
            }
        }
        false
    }

    fn read(s: &LinearSlot) -> Entry {
        let at = s.at.load(Ordering::Relaxed);
        Entry {
            charge: Charge {
                claim: (at >> 16) as u16,
                gpu: at as u16,
                bytes: s.bytes.load(Ordering::Relaxed),
            },
            scrub_bytes: s.scrub.load(Ordering::Relaxed),
            owner: 0,
        }
    }

    /// Takes the entry of `id` out of the table; `None` if it holds none (or a racing
    /// free of the same pointer took it first).
    fn remove(&self, id: u64) -> Option<Entry> {
        if id <= K_BUSY {
            return None;
        }
        for s in Self::probe(id) {
            match s.key.load(Ordering::Acquire) {
                K_EMPTY => return None,
                k if k == id
                    && s.key
                        .compare_exchange(id, K_BUSY, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok() =>
                {
                    let e = Self::read(s);
                    s.key.store(K_GONE, Ordering::Release);
                    return Some(e);
                }
                _ => {}
            }
        }
        None
    }

    /// The entry of `id`, left in place (read twice around the key to skip a slot
    /// being rewritten).
    fn peek(&self, id: u64) -> Option<Entry> {
        if id <= K_BUSY {
            return None;
        }
        for s in Self::probe(id) {
            match s.key.load(Ordering::Acquire) {
                K_EMPTY => return None,
                k if k == id => {
                    let e = Self::read(s);
                    std::sync::atomic::fence(Ordering::Acquire);
                    if s.key.load(Ordering::Relaxed) == id {
                        return Some(e);
                    }
                }
                _ => {}
            }
        }
        None
    }

    fn for_each_key(&self, mut f: impl FnMut(u64)) {
        for s in &self.slots {
            let k = s.key.load(Ordering::Acquire);
            if k > K_BUSY {
                f(k);
            }
        }
    }
}

/// What a graph (or an executable graph) materializes when launched: the device
/// and the sum of its memory-allocation nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphNeed {
    pub dev: i32,
    pub bytes: u64,
}

type Needs = HashMap<u64, GraphNeed, BuildHasherDefault<PtrHasher>>;
/// Graph memory needs, keyed by `CUgraph` and by `CUgraphExec` handle.
static GRAPH_NEEDS: ForkLock<Option<Needs>> = ForkLock::new(None);

/// Adds `bytes` on `dev` to what handle `h` materializes.
pub fn add_graph_need(h: u64, dev: i32, bytes: u64) {
    if let Ok(mut t) = GRAPH_NEEDS.lock() {
        let e = t.get_or_insert_with(Needs::default).entry(h).or_default();
        e.dev = dev;
        e.bytes = e.bytes.saturating_add(bytes);
    }
}

/// What handle `h` materializes (none if it has no allocation nodes).
pub fn graph_need(h: u64) -> Option<GraphNeed> {
    GRAPH_NEEDS
        .lock()
        .ok()
        .and_then(|t| t.as_ref().and_then(|t| t.get(&h).copied()))
}

/// Forgets handle `h`.
pub fn drop_graph_need(h: u64) {
    if let Ok(mut t) = GRAPH_NEEDS.lock()
        && let Some(t) = t.as_mut()
    {
        t.remove(&h);
    }
}

/// Set once a pool charge is recorded: until then memory queries skip re-reading pools.
static POOLS_SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process ever charged a memory pool.
pub fn any_pool() -> bool {
    POOLS_SEEN.load(Ordering::Relaxed)
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn entry(id: u64) -> Entry {
        Entry {
            charge: Charge {
                claim: (id % 3) as u16,
                gpu: (id % 5) as u16,
                bytes: id.wrapping_mul(31),
            },
            scrub_bytes: id ^ 0xff,
            owner: 0,
        }
    }

    fn same(a: Entry, b: Entry) -> bool {
        a.charge == b.charge && a.scrub_bytes == b.scrub_bytes
    }

    /// Eight threads record pointers, then all eight race to free every one of them:
    /// each entry comes back exactly once, with what it was charged.
    #[test]
    fn racing_frees_take_each_linear_entry_once() {
        const PER: u64 = 2000;
        let base = 0x7f00_0000_0000u64;
        let ids: Vec<u64> = (0..8 * PER).map(|i| base + (i << 21)).collect();
        std::thread::scope(|s| {
            for t in 0..8 {
                let ids = &ids;
                s.spawn(move || {
                    for &id in &ids[(t * PER) as usize..((t + 1) * PER) as usize] {
                        record(Kind::Linear, id, entry(id));
                    }
                });
            }
        });
        for &id in &ids {
            assert!(peek(Kind::Linear, id).is_some_and(|e| same(e, entry(id))));
        }
        let taken: Vec<AtomicU32> = ids.iter().map(|_| AtomicU32::new(0)).collect();
        std::thread::scope(|s| {
            for _ in 0..8 {
                let (ids, taken) = (&ids, &taken);
                s.spawn(move || {
                    for (i, &id) in ids.iter().enumerate() {
                        if let Some(e) = forget(Kind::Linear, id) {
                            assert!(same(e, entry(id)), "{id:#x}: {e:?}");
                            taken[i].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert!(taken.iter().all(|t| t.load(Ordering::Relaxed) == 1));
        assert!(ids.iter().all(|&id| forget(Kind::Linear, id).is_none()));
    }

    /// Pointers that all hash to one slot fill its probe window; the rest spill to
    /// the mutex table and are still found, and forgetting them empties the spill.
    #[test]
    fn a_full_probe_window_spills_to_the_mutex_table() {
        let home = LinearTable::home(0x5a5a_0000_0000);
        let ids: Vec<u64> = (1u64..)
            .map(|k| 0x5a5a_0000_0000 + (k << 12))
            .filter(|&id| LinearTable::home(id) == home)
            .take(LINEAR_PROBE + 6)
            .collect();
        for &id in &ids {
            record(Kind::Linear, id, entry(id));
        }
        assert!(LINEAR_SPILLED.load(Ordering::Relaxed) >= 6);
        assert!(keys(Kind::Linear).len() >= ids.len());
        for &id in ids.iter().rev() {
            let e = forget(Kind::Linear, id).expect("recorded");
            assert!(same(e, entry(id)));
            assert!(forget(Kind::Linear, id).is_none());
        }
    }
}
