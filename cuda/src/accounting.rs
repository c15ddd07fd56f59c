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
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use tessera_abi::limits::Limits;
use tessera_abi::map::try_lock_range;
use tessera_abi::region::{FLAG_NO_CUDA, Refusal, Region};

use crate::budget::{self, MergedGpu};

/// One claim bound to this process.
pub struct Claim {
    pub uid: String,
    pub scrub_on_free: bool,
    pub region: Region,
    /// Holds the slot's OFD lock for the process's life; never closed.
    _lock_file: File,
    /// A second open description, for probing other slots' locks.
    reclaim_file: File,
    pub slot: Option<usize>,
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
pub fn state() -> &'static State {
    STATE.get_or_init(State::load)
}

fn log(msg: std::fmt::Arguments<'_>) {
    eprintln!("tessera-cuda: {msg}");
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
                _lock_file: lock_file,
                reclaim_file,
                slot,
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
    /// for all of it. On refusal, dead processes' slots are reclaimed and the claims
    /// tried once more. Atomic per claim (compare-and-swap in the region).
    pub fn reserve(&self, g: usize, bytes: u64) -> Result<Charge, Refused> {
        if self.fail_closed {
            return Err(Refused::NoSlot);
        }
        let Some(gpu) = self.gpus.get(g) else {
            return Err(Refused::NoSlot);
        };
        self.clear_no_cuda();
        for attempt in 0..2 {
            for p in &gpu.parts {
                let Some(c) = self.claims.get(p.claim) else {
                    continue;
                };
                let Some(s) = c.slot else {
                    return Err(Refused::NoSlot);
                };
                match c.region.reserve(s, p.gpu, bytes, p.budget) {
                    Ok(()) => {
                        return Ok(Charge {
                            claim: p.claim as u16,
                            gpu: p.gpu as u16,
                            bytes,
                        });
                    }
                    // Not this claim: over its budget, or its region is unusable.
                    Err(Refusal::OverBudget | Refusal::OutOfRange | Refusal::ReadOnly) => {}
                }
            }
            if attempt == 0 {
                let mut reclaimed = false;
                for p in &gpu.parts {
                    if let Some(c) = self.claims.get(p.claim) {
                        reclaimed |= c
                            .region
                            .reclaim_dead(&c.reclaim_file)
                            .is_ok_and(|v| !v.is_empty());
                    }
                }
                if !reclaimed {
                    break;
                }
            }
        }
        Err(Refused::OverBudget)
    }

    /// Reserves `bytes` more on the claim and GPU that `c` is charged to.
    pub fn reserve_on(&self, c: Charge, bytes: u64) -> Result<(), Refused> {
        let cl = self
            .claims
            .get(usize::from(c.claim))
            .ok_or(Refused::NoSlot)?;
        let s = cl.slot.ok_or(Refused::NoSlot)?;
        let budget = self
            .gpus
            .iter()
            .flat_map(|g| g.parts.iter())
            .find(|p| p.claim == usize::from(c.claim) && p.gpu == usize::from(c.gpu))
            .map(|p| p.budget)
            .ok_or(Refused::NoSlot)?;
        cl.region
            .reserve(s, usize::from(c.gpu), bytes, budget)
            .map_err(|_| Refused::OverBudget)
    }

    /// Returns a charge (a free, or a rollback after the driver failed).
    pub fn release(&self, c: Charge) {
        if let Some(cl) = self.claims.get(usize::from(c.claim))
            && let Some(s) = cl.slot
        {
            cl.region.release(s, usize::from(c.gpu), c.bytes);
        }
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
            used = used.saturating_add(c.region.gpu_used(p.gpu).unwrap_or(0));
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

/// What the library remembers about a live allocation.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub charge: Charge,
    /// Bytes to zero on free when the claim scrubs (0 = cannot scrub this kind).
    pub scrub_bytes: u64,
}

/// The kind of handle an allocation is known by (pointers, VMM handles and arrays
/// live in different name spaces).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Linear,
    Vmm,
    Array,
    /// A memory pool's retained size, keyed by the pool handle.
    Pool,
    /// A mipmapped array.
    Mipmap,
    /// A `cuCtxSetLimit` reservation, keyed by (device << 8 | limit).
    Limit,
    /// A device's graph memory pool, keyed by device ordinal.
    GraphPool,
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
static ALLOCATIONS: Mutex<Option<Table>> = Mutex::new(None);

/// Remembers a charged allocation.
pub fn record(kind: Kind, id: u64, e: Entry) {
    if kind == Kind::Pool {
        POOLS_SEEN.store(true, Ordering::Relaxed);
    }
    if let Ok(mut t) = ALLOCATIONS.lock() {
        t.get_or_insert_with(Table::default).insert((kind, id), e);
    }
}

/// Forgets an allocation and returns what it was charged; `None` for memory the
/// library never charged (unbudgeted, or allocated before it loaded).
pub fn forget(kind: Kind, id: u64) -> Option<Entry> {
    ALLOCATIONS
        .lock()
        .ok()
        .and_then(|mut t| t.as_mut().and_then(|t| t.remove(&(kind, id))))
}

/// Looks at an allocation's entry without forgetting it.
pub fn peek(kind: Kind, id: u64) -> Option<Entry> {
    ALLOCATIONS
        .lock()
        .ok()
        .and_then(|t| t.as_ref().and_then(|t| t.get(&(kind, id)).copied()))
}

/// The ids of every remembered allocation of `kind`.
pub fn keys(kind: Kind) -> Vec<u64> {
    ALLOCATIONS
        .lock()
        .ok()
        .and_then(|t| {
            t.as_ref()
                .map(|t| t.keys().filter(|k| k.0 == kind).map(|k| k.1).collect())
        })
        .unwrap_or_default()
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
static GRAPH_NEEDS: Mutex<Option<Needs>> = Mutex::new(None);

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
