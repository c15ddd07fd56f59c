//! The process's claims and its charges: one slot per claim region, reservations
//! before every allocation, releases on every matching free, and each claim's launch
//! bucket per GPU ([`LaunchPart`], charged by the throttle).
//!
//! Loaded lazily on the first intercepted CUDA call, so a process that never touches
//! CUDA opens no region and takes no slot. Slot ownership is an OFD write lock on
//! the slot's byte range through a descriptor kept open for the process's life: the
//! kernel drops it at death (SIGKILL included) and the next process that finds the
//! slot unlocked returns its charges ([`Region::reclaim_dead`]). When a claim has no
//! free slot the process fails closed: every budgeted allocation is refused.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use tessera_abi::control::{Control, RateCells};
use tessera_abi::limits::Limits;
use tessera_abi::map::try_lock_range;
use tessera_abi::region::{Bucket, FLAG_NO_CUDA, Refusal, Region};

use super::budget::{self, MergedGpu};
use crate::stderr::log;

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
    /// The claims could not be established: every device counts as budgeted and
    /// every allocation is refused.
    pub refuse_all: bool,
    /// Per CUDA ordinal: 0 = not looked up, 1 = unbudgeted, 2 + i = `gpus[i]`,
    /// 0xffff_ffff = UUID unavailable.
    devices: [AtomicU32; MAX_DEVICES],
    no_cuda_cleared: std::sync::atomic::AtomicBool,
    /// When memory queries last reclaimed dead slots ([`coarse_now_ns`]).
    last_reclaim_ns: std::sync::atomic::AtomicU64,
    /// Per merged GPU (same index as `gpus`): the (claim, GPU) token buckets its
    /// launches are charged to, in claim-UID order.
    pub launch: Vec<Vec<LaunchPart>>,
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

/// Where the plugin's run directory is, as (filesystem `major:minor`, path within
/// it): from the file this library's code is mapped from, opened again and checked to
/// be that same file on the mount `mnt_id` names.
fn run_dir(entries: &[budget::MountEntry]) -> Result<(String, String), String> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| format!("cannot read /proc/self/maps: {e}"))?;
    let (dev, ino, path) = budget::mapping_at(&maps, run_dir as *const () as usize)
        .ok_or("this library's file is not in /proc/self/maps")?;
    let f = open_nonblocking(&path, false).map_err(|e| format!("cannot open {path}: {e}"))?;
    let md = f.metadata().map_err(|e| format!("{path}: {e}"))?;
    if budget::dev_string(md.dev()) != dev || md.ino() != ino {
        return Err(format!(
            "{path} is no longer the file this library was loaded from"
        ));
    }
    let id = mount_id(&f)?;
    let m = entries
        .iter()
        .find(|e| e.id == id)
        .ok_or_else(|| format!("{path}: mount {id} is not in mountinfo"))?;
    let rel = budget::path_in_filesystem(m, &path)
        .ok_or_else(|| format!("{path} is not under its mount point {}", m.point))?;
    let run = budget::run_dir_root(&rel).ok_or_else(|| {
        format!("this library ({path}, {rel} in its filesystem) was not installed by the plugin")
    })?;
    Ok((m.dev.clone(), run))
}

/// Opens without following the last component's FIFO semantics (a FIFO put in a
/// file's place would block the open) and never as the controlling terminal.
fn open_nonblocking(path: &str, write: bool) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

/// The mount an open file is on (`mnt_id` of `/proc/self/fdinfo`).
fn mount_id(f: &File) -> Result<u64, String> {
    use std::os::fd::AsRawFd;
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", f.as_raw_fd()))
        .map_err(|e| format!("cannot read fdinfo: {e}"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "fdinfo has no mnt_id".to_string())
}

/// Opens a claim file through its mount: whatever its path now names, the file must
/// be a regular file on that very mount (a path a tenant re-pointed, by renaming
/// directories or by mounting a volume over them, is refused).
fn open_mounted(file: &budget::ClaimFile, write: bool) -> Result<File, String> {
    let f = open_nonblocking(&file.path, write)
        .map_err(|e| format!("cannot open {}: {e}", file.path))?;
    let id = mount_id(&f)?;
    if id != file.mount_id {
        return Err(format!(
            "{} is not the mounted claim file (mount {id}, not {})",
            file.path, file.mount_id
        ));
    }
    let md = f.metadata().map_err(|e| format!("{}: {e}", file.path))?;
    if !md.is_file() {
        return Err(format!("{} is not a regular file", file.path));
    }
    Ok(f)
}

/// `CLOCK_MONOTONIC_COARSE` in ns: read from the vDSO's data page without a TSC read
/// (a few ns, where a precise clock costs about 30 ns on a VM), at the kernel tick's
/// resolution (≤ 4 ms), plenty to pace [`RECLAIM_EVERY_NS`].
fn coarse_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into a local timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        return u64::MAX;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
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
            refuse_all: false,
            devices: [const { AtomicU32::new(DEV_UNKNOWN) }; MAX_DEVICES],
            no_cuda_cleared: std::sync::atomic::AtomicBool::new(false),
            last_reclaim_ns: std::sync::atomic::AtomicU64::new(0),
            launch: Vec::new(),
        }
    }

    /// Reads the mounted claims, maps their regions and takes a slot in each. Fails
    /// closed (every allocation refused, [`State::refuse_all`]) when the claims cannot
    /// be established: mountinfo unreadable, this library not loaded from the plugin's
    /// run directory, or a claim of that directory whose files cannot be opened
    /// through their mounts or read. A claim whose region has no free slot fails
    /// closed on its GPUs.
    fn load() -> Self {
        match Self::try_load() {
            Ok(st) => st,
            Err(e) => {
                log(format_args!("{e}; refusing every allocation"));
                let mut st = State::empty();
                st.fail_closed = true;
                st.refuse_all = true;
                st
            }
        }
    }

    fn try_load() -> Result<Self, String> {
        let mut st = State::empty();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        let entries = budget::parse_mountinfo(&mountinfo);
        let (dev, run) = run_dir(&entries)?;
        let mounted = budget::mounted_claims(&entries, &dev, &run)?;
        let mut limits = Vec::new();
        for mc in mounted {
            let (claim, l) = Self::open_claim(&mc).map_err(|e| format!("claim {}: {e}", mc.uid))?;
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
        let claims = &st.claims;
        st.gpus = budget::merge(&limits, |c, uuid| claims[c].region.gpu_index(uuid));
        for p in st.gpus.iter().flat_map(|g| g.parts.iter()) {
            if let Some(k) = st.claims[p.claim].pool_keep.get_mut(p.gpu) {
                *k = tessera_abi::region::pool_size(p.budget);
            }
        }
        st.launch = launch_parts(&st.claims, &st.gpus);
        Ok(st)
    }

    fn open_claim(mc: &budget::MountedClaim) -> Result<(Claim, Limits), String> {
        let mut text = String::new();
        open_mounted(&mc.limits, false)?
            .read_to_string(&mut text)
            .map_err(|e| format!("cannot read limits: {e}"))?;
        let limits = Limits::parse(&text).map_err(|e| format!("limits: {e}"))?;
        if limits.claim_uid != mc.uid {
            return Err(format!("limits name claim {}", limits.claim_uid));
        }
        let lock_file = open_mounted(&mc.region, true)?;
        let reclaim_file = open_mounted(&mc.region, true)?;
        let region = Region::map(&lock_file, true).map_err(|e| format!("region: {e}"))?;
        // Never unmapped: the state lives as long as the process.
        let region: &'static Region = Box::leak(Box::new(region));
        let control = match open_mounted(&mc.control, false)
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

    /// Whether any claim binds this process (otherwise every hook passes through),
    /// or the library failed closed.
    pub fn active(&self) -> bool {
        !self.claims.is_empty() || self.refuse_all
    }

    /// The merged GPU for CUDA ordinal `dev`: `Ok(None)` when unbudgeted. `uuid_of`
    /// asks the driver (called once per ordinal).
    pub fn gpu_for(
        &self,
        dev: i32,
        uuid_of: impl FnOnce(i32) -> Option<String>,
    ) -> Result<Option<usize>, Refused> {
        if self.refuse_all {
            return Err(Refused::NoSlot);
        }
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
    /// every call. Used is each claim's usage less the pools of its slots in use
    /// ([`Region::allocated`]: the slot map, then one load per process).
    pub fn usage(&self, g: usize) -> Option<(u64, u64)> {
        let gpu = self.gpus.get(g)?;
        let now = coarse_now_ns();
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

/// One (claim, GPU) bucket a launch on a merged GPU can be charged to (the throttle
/// charges it; built here, with the claims, when the state loads).
pub struct LaunchPart {
    pub bucket: Bucket<'static>,
    /// `None`: the claim's control file is unreadable; unthrottled.
    pub rate: Option<RateCells<'static>>,
    /// Index among all parts of the process (per-thread counters are indexed by it).
    pub index: usize,
    /// The bucket's TAT word as this process last left it, a floor under the shared
    /// word (`Bucket::try_admit_after`): a tenant who rewrites the shared word (the
    /// region is writable) does not rewrite this process's memory of it, so every
    /// process stays paced at the claim's rate at least, and the controller (NVML's
    /// view) holds the claim to its share.
    pub seen: std::sync::atomic::AtomicU64,
}

/// The launch buckets of each merged GPU (same order as `gpus`): the claims' regions
/// and control files, in claim-UID order.
fn launch_parts(claims: &[Claim], gpus: &[MergedGpu]) -> Vec<Vec<LaunchPart>> {
    let mut index = 0;
    gpus.iter()
        .map(|g| {
            g.parts
                .iter()
                .filter_map(|p| {
                    let c = claims.get(p.claim)?;
                    let bucket = c.region.bucket(p.gpu)?;
                    let rate = c
                        .control
                        .and_then(|ctl| ctl.gpu_index(&g.uuid).and_then(|i| ctl.cells(i)));
                    let part = LaunchPart {
                        bucket,
                        rate,
                        seen: std::sync::atomic::AtomicU64::new(0),
                        index,
                    };
                    index += 1;
                    Some(part)
                })
                .collect()
        })
        .collect()
}
