//! The process's claims and its charges: one slot per claim region, reservations
//! before every allocation, releases on every matching free.
//!
//! Loaded lazily on the first intercepted CUDA call, so a process that never touches
//! CUDA opens no region and takes no slot. Slot ownership is an OFD write lock on
//! the slot's byte range through a descriptor kept open for the process's life: the
//! kernel drops it at death (SIGKILL included) and the next process that finds the
//! slot unlocked returns its charges ([`Region::reclaim_dead`]). When a claim has no
//! free slot the process fails closed: every budgeted allocation is refused.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Read;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::forklock::ForkLock;

use tessera_abi::control::Control;
use tessera_abi::limits::Limits;
use tessera_abi::map::try_lock_range;
use tessera_abi::region::{FLAG_NO_CUDA, Refusal, Region};

use crate::budget::{self, MergedGpu};

/// One claim bound to this process.
pub struct Claim {
    pub uid: String,
    pub scrub_on_free: bool,
    /// Mapped for the process's life (never unmapped), so the launch path can keep
    /// `'static` references to its bucket.
    pub region: &'static Region,
    /// The claim's rates (read-only mapping); `None` when it cannot be mapped, which
    /// leaves the claim's launches unthrottled (logged).
    pub control: Option<&'static Control>,
    /// Holds the slot's OFD lock for the process's life; never closed.
    _lock_file: File,
    /// A second open description, for probing other slots' locks.
    reclaim_file: File,
    pub slot: Option<usize>,
    /// Per GPU of the region: what the process may keep reserved in its pool
    /// ([`tessera_abi::region::pool_size`] of the budget; 0 = no pool).
    pub pool_keep: Vec<u64>,
}

/// Everything the library knows about its claims.
pub struct State {
    pub claims: Vec<Claim>,
    pub gpus: Vec<MergedGpu>,
    /// Some claim had no free slot: refuse every budgeted allocation.
    pub fail_closed: bool,
    /// Per CUDA ordinal: 0 = not looked up, 1 = unbudgeted, 2 + i = `gpus[i]`,
    /// 0xffff_ffff = UUID unavailable.
    devices: [AtomicU32; MAX_DEVICES],
    no_cuda_cleared: std::sync::atomic::AtomicBool,
    /// When memory queries last reclaimed dead slots (wall clock, ns).
    last_reclaim_ns: std::sync::atomic::AtomicU64,
    /// Per merged GPU (same index as `gpus`): the (claim, GPU) token buckets its
    /// launches are charged to, in claim-UID order.
    pub launch: Vec<Vec<crate::throttle::LaunchPart>>,
}

/// How often memory queries reclaim dead processes' slots. (Reservations that would
/// be refused reclaim at once, whatever the time.)
pub const RECLAIM_EVERY_NS: u64 = 250_000_000;

pub const MAX_DEVICES: usize = 64;
const DEV_UNKNOWN: u32 = 0;
const DEV_FREE: u32 = 1;
const DEV_NO_UUID: u32 = u32::MAX;

static STATE: OnceLock<State> = OnceLock::new();

/// What an allocation was charged to: claim, GPU index in its region, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub claim: u16,
    pub gpu: u16,
    pub bytes: u64,
}

/// Why an allocation is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    OverBudget,
    /// Fail closed: no slot, or the device's UUID could not be read.
    NoSlot,
}

/// The process's state, loaded on first use.
#[inline]
pub fn state() -> &'static State {
    STATE.get_or_init(State::load)
}

/// The process's state if it was loaded (never loads it).
pub fn loaded_state() -> Option<&'static State> {
    STATE.get()
}

/// Writes `tessera-cuda: <msg>` to stderr with one write(2), ignoring every error:
/// `eprintln!` panics when stderr is closed or a broken pipe, and a panic must never
/// unwind out of a hook.
pub fn log(msg: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut buf = [0u8; 512];
    let mut cur = std::io::Cursor::new(&mut buf[..]);
    let _ = write!(cur, "tessera-cuda: {msg}");
    let mut n = (cur.position() as usize).min(buf.len() - 1);
    buf[n] = b'\n';
    n += 1;
    // SAFETY: write(2) from a local buffer to fd 2; the result is ignored on purpose.
    let _ = unsafe { libc::write(2, buf.as_ptr().cast(), n) };
}

fn random_token() -> u128 {
    let mut b = [0u8; 16];
    // SAFETY: getrandom(2) into a local buffer, via syscall (older glibc lacks the wrapper).
    let n = unsafe { libc::syscall(libc::SYS_getrandom, b.as_mut_ptr(), b.len(), 0) };
    if n != 16
        && let Ok(mut f) = File::open("/dev/urandom")
    {
        let _ = f.read_exact(&mut b);
    }
    let t = u128::from_le_bytes(b);
    if t == 0 { 1 } else { t }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl State {
    fn empty() -> Self {
        State {
            claims: Vec::new(),
            gpus: Vec::new(),
            fail_closed: false,
            devices: [const { AtomicU32::new(DEV_UNKNOWN) }; MAX_DEVICES],
            no_cuda_cleared: std::sync::atomic::AtomicBool::new(false),
            last_reclaim_ns: std::sync::atomic::AtomicU64::new(0),
            launch: Vec::new(),
        }
    }

    /// Reads the mounted claims, maps their regions and takes a slot in each. A claim
    /// whose files cannot be read is logged and left out; one whose region has no
    /// free slot makes the process fail closed.
    fn load() -> Self {
        let mut st = State::empty();
        let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return st;
        };
        let mounted = budget::mounted_claims(&mountinfo);
        let mut limits = Vec::new();
        for mc in mounted {
            match Self::open_claim(&mc) {
                Ok((claim, l)) => {
                    if claim.slot.is_none() {
                        log(format_args!(
                            "claim {}: every process slot is in use; refusing all allocations on its GPUs",
                            mc.uid
                        ));
                        st.fail_closed = true;
                    }
                    st.claims.push(claim);
                    limits.push(l);
                }
                Err(e) => log(format_args!("claim {}: {e}; ignored", mc.uid)),
            }
        }
        let claims = &st.claims;
        st.gpus = budget::merge(&limits, |c, uuid| claims[c].region.gpu_index(uuid));
        for p in st.gpus.iter().flat_map(|g| g.parts.iter()) {
            if let Some(k) = st.claims[p.claim].pool_keep.get_mut(p.gpu) {
                *k = tessera_abi::region::pool_size(p.budget);
            }
        }
        st.launch = crate::throttle::parts(&st.claims, &st.gpus);
        st
    }

    fn open_claim(mc: &budget::MountedClaim) -> Result<(Claim, Limits), String> {
        let text = std::fs::read_to_string(format!("{}/limits", mc.dir))
            .map_err(|e| format!("cannot read limits: {e}"))?;
        let limits = Limits::parse(&text).map_err(|e| format!("limits: {e}"))?;
        if limits.claim_uid != mc.uid {
            return Err(format!("limits name claim {}", limits.claim_uid));
        }
        let path = format!("{}/region", mc.dir);
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| format!("cannot open region: {e}"))
        };
        let lock_file = open()?;
        let reclaim_file = open()?;
        let region = Region::map(&lock_file, true).map_err(|e| format!("region: {e}"))?;
        // Never unmapped: the state lives as long as the process.
        let region: &'static Region = Box::leak(Box::new(region));
        let control = match File::open(format!("{}/control", mc.dir))
            .map_err(|e| e.to_string())
            .and_then(|f| Control::map(&f, false).map_err(|e| e.to_string()))
        {
            Ok(c) => Some(&*Box::leak(Box::new(c))),
            Err(e) => {
                log(format_args!(
                    "claim {}: control: {e}; its launches are not throttled",
                    mc.uid
                ));
                None
            }
        };
        let _ = region.reclaim_dead(&reclaim_file);
        let mut slot = None;
        for s in 0..region.layout().slot_count {
            let (start, len) = region.layout().slot_lock_range(s);
            if let Ok(true) = try_lock_range(&lock_file, start, len) {
                // Locked by us: free, or left by a process that died since.
                region.reclaim_slot(s);
                region.occupy_slot(s, random_token(), FLAG_NO_CUDA, now_ns());
                slot = Some(s);
                break;
            }
        }
        Ok((
            Claim {
                uid: mc.uid.clone(),
                scrub_on_free: limits.scrub_on_free,
                region,
                control,
                _lock_file: lock_file,
                reclaim_file,
                slot,
                pool_keep: if region.layout().has_pools() {
                    vec![0; region.layout().gpu_count]
                } else {
                    Vec::new()
                },
            },
            limits,
        ))
    }

    /// Whether any claim binds this process (otherwise every hook passes through).
    pub fn active(&self) -> bool {
        !self.claims.is_empty()
    }

    /// The merged GPU for CUDA ordinal `dev`: `Ok(None)` when unbudgeted. `uuid_of`
    /// asks the driver (called once per ordinal).
    pub fn gpu_for(
        &self,
        dev: i32,
        uuid_of: impl FnOnce(i32) -> Option<String>,
    ) -> Result<Option<usize>, Refused> {
        let Some(slot) = usize::try_from(dev).ok().and_then(|d| self.devices.get(d)) else {
            return Err(Refused::NoSlot);
        };
        let mut v = slot.load(Ordering::Acquire);
        if v == DEV_UNKNOWN {
            v = match uuid_of(dev) {
                Some(u) => match self.gpus.iter().position(|g| g.uuid == u) {
                    Some(i) => 2 + i as u32,
                    None => DEV_FREE,
                },
                None => DEV_NO_UUID,
            };
            slot.store(v, Ordering::Release);
        }
        match v {
            DEV_FREE => Ok(None),
            DEV_NO_UUID => Err(Refused::NoSlot),
            i => Ok(Some(i.saturating_sub(2) as usize)),
        }
    }

    /// Reserves `bytes` on merged GPU `g`: the first claim (in UID order) with room
    /// for all of it. Before refusing, dead processes' slots are reclaimed (in every
    /// claim of the GPU) and the claims tried once more, then what other live
    /// processes keep in their pools is taken back ([`Region::steal_pools`]) and the
    /// claims tried again. Atomic per claim (compare-and-swap in the region).
    ///
    /// A small allocation is first taken from the process's pool in its own slot (one
    /// compare-and-swap that no other process touches); when the pool is short, the
    /// claim's usage is raised by the allocation plus a refill of the pool, or, when
    /// that no longer fits, by the allocation alone (with what the pool still holds).
    /// Near the budget every process therefore charges exactly, and a refusal leaves
    /// no budget unused but what other processes put back into their pools after
    /// they were taken back (a race, at most [`tessera_abi::region::pool_size`]
    /// each).
    #[inline]
    pub fn reserve(&self, g: usize, bytes: u64) -> Result<Charge, Refused> {
        if self.fail_closed {
            return Err(Refused::NoSlot);
        }
        let Some(gpu) = self.gpus.get(g) else {
            return Err(Refused::NoSlot);
        };
        self.clear_no_cuda();
        // Before refusing: dead processes' slots are reclaimed, then what other live
        // processes keep in their pools is returned to the claim, each followed by one
        // more try; a refusal then means allocations really fill the budget.
        let mut step = 0;
        loop {
            for p in &gpu.parts {
                let Some(c) = self.claims.get(p.claim) else {
                    continue;
                };
                let Some(s) = c.slot else {
                    return Err(Refused::NoSlot);
                };
                let charge = Charge {
                    claim: p.claim as u16,
                    gpu: p.gpu as u16,
                    bytes,
                };
                // Not this claim: over its budget, or its region is unusable.
                if reserve_in(c, s, p.gpu, bytes, p.budget) {
                    return Ok(charge);
                }
            }
            step += 1;
            let freed = match step {
                // Every claim of the GPU is reclaimed (not only up to the first that
                // had a dead slot): the retry tries them all.
                1 => gpu.parts.iter().fold(false, |any, p| {
                    any | self.claims.get(p.claim).is_some_and(reclaim_dead_in)
                }),
                2 => {
                    let mut any = false;
                    for p in &gpu.parts {
                        if let Some(c) = self.claims.get(p.claim)
                            && let Some(s) = c.slot
                        {
                            any |= c.region.steal_pools(p.gpu, s) > 0;
                        }
                    }
                    any
                }
                _ => break,
            };
            if !freed && step == 2 {
                break;
            }
        }
        for p in &gpu.parts {
            if let Some(c) = self.claims.get(p.claim) {
                c.region.count_refusal(p.gpu);
            }
        }
        Err(Refused::OverBudget)
    }

    /// Reserves `bytes` more on the claim and GPU that `c` is charged to. Before
    /// refusing, as [`State::reserve`] does: dead processes' slots of the claim are
    /// reclaimed, then what other live processes keep in their pools is taken back,
    /// each followed by one more try.
    pub fn reserve_on(&self, c: Charge, bytes: u64) -> Result<(), Refused> {
        let cl = self
            .claims
            .get(usize::from(c.claim))
            .ok_or(Refused::NoSlot)?;
        let s = cl.slot.ok_or(Refused::NoSlot)?;
        let g = usize::from(c.gpu);
        let budget = self
            .gpus
            .iter()
            .flat_map(|gpu| gpu.parts.iter())
            .find(|p| p.claim == usize::from(c.claim) && p.gpu == g)
            .map(|p| p.budget)
            .ok_or(Refused::NoSlot)?;
        for step in 0..3 {
            let retry = match step {
                0 => true,
                1 => reclaim_dead_in(cl),
                _ => cl.region.steal_pools(g, s) > 0,
            };
            if retry && reserve_in(cl, s, g, bytes, budget) {
                return Ok(());
            }
        }
        cl.region.count_refusal(g);
        Err(Refused::OverBudget)
    }

    /// Returns a charge (a free, or a rollback after the driver failed): into the
    /// process's pool, which gives back to the claim what exceeds its size.
    #[inline]
    pub fn release(&self, c: Charge) {
        if let Some(cl) = self.claims.get(usize::from(c.claim))
            && let Some(s) = cl.slot
        {
            let g = usize::from(c.gpu);
            let keep = cl.pool_keep.get(g).copied().unwrap_or(0);
            cl.region.pool_put(s, g, c.bytes, keep);
        }
    }

    /// What a CUDA context on merged GPU `g` is charged when the driver cannot measure
    /// it: the largest figure its claims' regions carry ([`Region::context_bytes`];
    /// 0 = contexts are not charged).
    pub fn context_estimate(&self, g: usize) -> u64 {
        self.gpus.get(g).map_or(0, |gpu| {
            gpu.parts
                .iter()
                .filter_map(|p| {
                    self.claims
                        .get(p.claim)
                        .map(|c| c.region.context_bytes(p.gpu))
                })
                .max()
                .unwrap_or(0)
        })
    }

    /// Whether the claim behind `c` asks for memory to be zeroed on free.
    pub fn scrubs(&self, c: Charge) -> bool {
        self.claims
            .get(usize::from(c.claim))
            .is_some_and(|cl| cl.scrub_on_free)
    }

    /// (budget, used) of merged GPU `g`, summed over its claims. Dead slots are
    /// reclaimed first, at most once per [`RECLAIM_EVERY_NS`], so that a query soon
    /// stops reporting a dead process's memory without probing every slot's lock on
    /// every call.
    pub fn usage(&self, g: usize) -> Option<(u64, u64)> {
        let gpu = self.gpus.get(g)?;
        let now = now_ns();
        let last = self.last_reclaim_ns.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= RECLAIM_EVERY_NS
            && self
                .last_reclaim_ns
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            for c in &self.claims {
                let _ = c.region.reclaim_dead(&c.reclaim_file);
            }
        }
        let mut used = 0u64;
        for p in &gpu.parts {
            let c = self.claims.get(p.claim)?;
            // Every process's pool is free to this one: a reservation that needs it
            // takes it back ([`Region::steal_pools`]).
            used = used.saturating_add(c.region.allocated(p.gpu).unwrap_or(0));
        }
        Some((gpu.total(), used))
    }

    fn clear_no_cuda(&self) {
        if !self.no_cuda_cleared.load(Ordering::Relaxed)
            && !self.no_cuda_cleared.swap(true, Ordering::Relaxed)
        {
            for c in &self.claims {
                if let Some(s) = c.slot {
                    c.region.clear_slot_flags(s, FLAG_NO_CUDA);
                }
            }
        }
    }
}

/// Returns the charges of claim `c`'s dead processes; whether there were any.
fn reclaim_dead_in(c: &Claim) -> bool {
    c.region
        .reclaim_dead(&c.reclaim_file)
        .is_ok_and(|v| !v.is_empty())
}

/// Reserves `bytes` in claim `c`'s region, slot `s`, GPU `g`: from the process's pool
/// when the allocation is small, else raising the claim's usage (with a refill of the
/// pool for a small one, while it fits), else with what the pool holds plus the rest
/// exactly. False when it does not fit or the region is unusable (not counted).
#[inline]
fn reserve_in(c: &Claim, s: usize, g: usize, bytes: u64, budget: u64) -> bool {
    let keep = c.pool_keep.get(g).copied().unwrap_or(0);
    let small = bytes <= keep;
    if small && c.region.pool_take(s, g, bytes) {
        return true;
    }
    let ahead = if small { keep } else { 0 };
    match c.region.reserve_ahead(s, g, bytes, ahead, budget) {
        Ok(()) => return true,
        Err(Refusal::OutOfRange | Refusal::ReadOnly) => return false,
        Err(Refusal::OverBudget) => {}
    }
    // The pool may hold part of it: the rest must fit exactly.
    let held = c.region.pool_drain(s, g);
    if held >= bytes {
        c.region.pool_put(s, g, held - bytes, keep);
        return true;
    }
    if held > 0 {
        if c.region
            .reserve_ahead(s, g, bytes - held, 0, budget)
            .is_ok()
        {
            return true;
        }
        c.region.pool_put(s, g, held, keep);
    }
    false
}

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

/// A multiplicative hasher: keys are pointers and handles, no DoS concern, and
/// hashing must be cheap on the allocation path.
#[derive(Default)]
pub struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }
    fn write_isize(&mut self, n: isize) {
        self.write_u64(n as u64);
    }
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
