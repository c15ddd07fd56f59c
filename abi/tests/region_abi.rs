//! The region and control ABI as a specification: golden bytes written by hand from
//! the docs/design.md table (not by the crate) must parse, newer layouts must stay
//! readable, reservations never exceed a budget, and a dead process's slot is
//! reclaimed through its dropped OFD lock.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;

use tessera_abi::control::{self, Control, GpuControl};
use tessera_abi::map::{range_locked, try_lock_range};
use tessera_abi::region::{self, Layout, Refusal, Region, Snapshot};

fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

/// A v1 region with 2 GPUs and 3 slots, written from the documented table.
fn golden_v1() -> Vec<u8> {
    // header 64; GPU table at 64 (2 × 128) → 320; slot size = 64 + 2×8 → 128;
    // slot table at 320; 3 slots → 704; file rounded to 4096.
    let mut b = vec![0u8; 4096];
    b[..8].copy_from_slice(b"TSRAREG\0");
    put32(&mut b, 8, 1);
    put32(&mut b, 12, 64);
    put64(&mut b, 16, 4096);
    put32(&mut b, 24, 2);
    put32(&mut b, 28, 128);
    put32(&mut b, 32, 64);
    put32(&mut b, 36, 3);
    put32(&mut b, 40, 128);
    put32(&mut b, 44, 320);
    b[64..64 + 5].copy_from_slice(b"GPU-a");
    put64(&mut b, 64 + 64, 1000); // used
    put64(&mut b, 64 + 72, 1500); // peak
    put64(&mut b, 64 + 80, 2); // refused
    b[192..192 + 5].copy_from_slice(b"GPU-b");
    // slot 1: token, flags, started, charged (GPU-a 1000)
    let s1 = 320 + 128;
    put64(&mut b, s1, 0xdead);
    put64(&mut b, s1 + 8, 0xbeef);
    put32(&mut b, s1 + 16, 1);
    put64(&mut b, s1 + 24, 77);
    put64(&mut b, s1 + 64, 1000);
    b
}

/// The v2 file: the v1 bytes with version 2 and each slot's pool counters after its
/// charged ones (slot + 64 + 8·2 + 8·g); slot 1 holds 300 of its 1000 bytes in its
/// pool on GPU-a.
fn golden_v2() -> Vec<u8> {
    let mut b = golden_v1();
    put32(&mut b, 8, 2);
    put64(&mut b, 320 + 128 + 64 + 16, 300);
    b
}

/// The v3 file: the v2 bytes with version 3 and the slot map after the slot table
/// (320 + 3 × 128 = 704, a multiple of 64), slot 1's bit set.
fn golden_v3() -> Vec<u8> {
    let mut b = golden_v2();
    put32(&mut b, 8, 3);
    put32(&mut b, 48, 704);
    put64(&mut b, 704, 1 << 1);
    b
}

/// The crate writes exactly the documented bytes, and reads them back: used is the
/// usage counter less the pools.
#[test]
fn golden_v3_region_matches_the_documented_layout() {
    let g = golden_v3();
    let fresh = region::initial_bytes(&["GPU-a", "GPU-b"], 3).unwrap();
    // Same header and GPU UUIDs as the hand-written file (counters differ).
    assert_eq!(fresh[..64], g[..64]);
    assert_eq!(fresh[64..128], g[64..128]);
    assert_eq!(fresh[192..256], g[192..256]);
    let s = Snapshot::parse(&g).unwrap();
    assert_eq!(s.layout, Layout::current(2, 3).unwrap());
    assert!(s.layout.has_pools());
    assert_eq!(s.layout.slot_map, 704);
    assert_eq!(
        (
            s.gpus[0].uuid.as_str(),
            s.gpus[0].used,
            s.gpus[0].pooled,
            s.gpus[0].peak,
            s.gpus[0].refused
        ),
        ("GPU-a", 700, 300, 1500, 2)
    );
    assert_eq!(s.slots.len(), 1);
    let sl = &s.slots[0];
    assert_eq!(sl.index, 1);
    assert_eq!(sl.token, 0xdead | (0xbeef << 64));
    assert_eq!(
        (sl.flags, sl.started_ns, sl.charged.clone()),
        (1, 77, vec![1000, 0])
    );
}

/// A v2 file (pools, no slot map) is still read and used: its memory view reads every
/// slot's pool.
#[test]
fn a_v2_region_is_still_read_and_its_pools_all_counted() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("region");
    std::fs::write(&p, golden_v2()).unwrap();
    let f = File::options().read(true).write(true).open(&p).unwrap();
    let r = Region::map(&f, true).unwrap();
    assert_eq!(r.layout().slot_map, 0);
    assert_eq!(r.slot_marked(1), None);
    assert_eq!(
        r.allocated(0),
        Some(700),
        "slot 1's pool, found without a map"
    );
    // Taking and reclaiming slots works without a map.
    r.occupy_slot(2, 5, 0, 0);
    r.reserve_ahead(2, 0, 100, 50, 1 << 20).unwrap();
    assert_eq!(r.allocated(0), Some(800));
    r.reclaim_slot(2);
    assert_eq!(r.allocated(0), Some(700));
}

/// A v1 file (no pools) is still read, its usage counter as it stands.
#[test]
fn a_v1_region_is_still_read() {
    let s = Snapshot::parse(&golden_v1()).unwrap();
    assert_eq!(s.layout, Layout::v1(2, 3).unwrap());
    assert!(!s.layout.has_pools());
    assert_eq!((s.gpus[0].used, s.gpus[0].pooled), (1000, 0));
    assert_eq!(s.slots[0].charged, vec![1000, 0]);
}

/// A region written by a later version that grew the header, the GPU entries and the
/// slots (appending fields) is still readable by this version: the N → N+1 rule seen
/// from the reader's side, and a v1 file stays readable by any later reader because the
/// crate never reads past the sizes in the header.
#[test]
fn a_grown_layout_stays_readable() {
    let (hs, es, ss, gpus, slots) = (128usize, 192usize, 192usize, 1usize, 2usize);
    let slot_table = hs + gpus * es;
    let size = 4096;
    let mut b = vec![0u8; size];
    b[..8].copy_from_slice(b"TSRAREG\0");
    put32(&mut b, 8, 4);
    put32(&mut b, 12, hs as u32);
    put64(&mut b, 16, size as u64);
    put32(&mut b, 24, gpus as u32);
    put32(&mut b, 28, es as u32);
    put32(&mut b, 32, hs as u32);
    put32(&mut b, 36, slots as u32);
    put32(&mut b, 40, ss as u32);
    put32(&mut b, 44, slot_table as u32);
    let slot_map = slot_table + slots * ss;
    put32(&mut b, 48, slot_map as u32);
    put64(&mut b, slot_map, 1 << 1);
    b[64..72].copy_from_slice(&[0xff; 8]); // a v4 header field
    b[hs..hs + 5].copy_from_slice(b"GPU-z");
    put64(&mut b, hs + 64, 42);
    put64(&mut b, hs + 152, u64::MAX); // a v4 GPU field, after the v3 ones
    let s1 = slot_table + ss;
    put64(&mut b, s1, 9);
    put64(&mut b, s1 + 64, 42);
    let s = Snapshot::parse(&b).unwrap();
    assert_eq!((s.layout.version, s.layout.slot_map), (4, slot_map));
    assert_eq!((s.gpus[0].uuid.as_str(), s.gpus[0].used), ("GPU-z", 42));
    assert_eq!(
        (s.slots[0].index, s.slots[0].charged.clone()),
        (1, vec![42])
    );
}

#[test]
fn malformed_regions_are_refused() {
    let g = golden_v1();
    assert!(Snapshot::parse(&g[..100]).is_err());
    let mut bad = g.clone();
    bad[0] = b'X';
    assert!(Snapshot::parse(&bad).is_err());
    let mut bad = g.clone();
    put32(&mut bad, 36, 1000); // slots beyond the file
    assert!(Snapshot::parse(&bad).is_err());
    let mut bad = g;
    put32(&mut bad, 40, 64); // slot too small for 2 GPUs
    assert!(Snapshot::parse(&bad).is_err());
    // A slot map that is misaligned, overlaps a table or leaves the file.
    for at in [708, 4, 64, 320 + 128, 4092] {
        let mut bad = golden_v3();
        put32(&mut bad, 48, at);
        assert!(Snapshot::parse(&bad).is_err(), "slot map at {at}");
    }
    assert!(Layout::v1(0, 1).is_err());
}

fn region_file(dir: &tempfile::TempDir, uuids: &[&str], slots: u32) -> std::path::PathBuf {
    let p = dir.path().join("region");
    File::create(&p)
        .unwrap()
        .write_all(&region::initial_bytes(uuids, slots).unwrap())
        .unwrap();
    p
}

/// Eight threads on eight separate mappings race to reserve 1 MiB pieces of a 100 MiB
/// budget: exactly 100 succeed, usage never exceeds the budget, refusals are counted.
#[test]
fn concurrent_reservations_never_exceed_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let p = region_file(&dir, &["GPU-a"], 8);
    let budget = 100 << 20;
    let ok = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let p = p.clone();
            let ok = ok.clone();
            std::thread::spawn(move || {
                let f = File::options().read(true).write(true).open(&p).unwrap();
                let r = Region::map(&f, true).unwrap();
                for _ in 0..50 {
                    if r.reserve(t, 0, 1 << 20, budget).is_ok() {
                        ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let f = File::open(&p).unwrap();
    let s = Region::map(&f, false).unwrap().snapshot().unwrap();
    assert_eq!(ok.load(std::sync::atomic::Ordering::Relaxed), 100);
    assert_eq!(s.gpus[0].used, budget);
    assert_eq!(s.gpus[0].peak, budget);
    assert_eq!(s.gpus[0].refused, 300);
}

/// A slot's pool: reserved ahead (in the usage counter and the slot's charge, not in
/// `used` as read), taken by small allocations without touching the usage counter,
/// refilled by frees and given back beyond its size; near the budget a reservation is
/// exact; a reclaim returns the pool with the charge.
#[test]
fn pools_reserve_ahead_and_give_back_beyond_their_size() {
    let dir = tempfile::tempdir().unwrap();
    let p = region_file(&dir, &["GPU-a"], 4);
    let f = File::options().read(true).write(true).open(&p).unwrap();
    let r = Region::map(&f, true).unwrap();
    let (k, budget) = (1u64 << 20, 8u64 << 20);
    let raw = |r: &Region| r.gpu_used(0).unwrap();
    r.reserve_ahead(0, 0, 4096, k, budget).unwrap();
    let s = r.snapshot().unwrap();
    assert_eq!((s.gpus[0].used, s.gpus[0].pooled), (4096, k));
    assert_eq!(s.slots.len(), 0, "no token: charged only");
    assert_eq!(raw(&r), k + 4096);
    // A small allocation from the pool leaves the usage counter alone.
    assert!(r.pool_take(0, 0, 4096));
    assert_eq!(raw(&r), k + 4096);
    assert_eq!(r.gpu_stats(0).unwrap().used, 8192);
    assert!(!r.pool_take(0, 0, k), "the pool holds less than that");
    // Frees refill the pool up to its size; the rest goes back to the claim.
    r.pool_put(0, 0, 8192, k);
    assert_eq!((r.pool(0, 0), raw(&r)), (k, k));
    // Slot 1 fills the budget: the refill no longer fits, the allocation alone does.
    r.reserve_ahead(1, 0, budget - k - 4096, k, budget).unwrap();
    assert_eq!(r.pool(1, 0), 0, "exact near the budget");
    assert_eq!(
        r.reserve_ahead(1, 0, 8192, 0, budget),
        Err(Refusal::OverBudget)
    );
    assert_eq!(r.snapshot().unwrap().gpus[0].refused, 0, "not counted");
    r.count_refusal(0);
    assert_eq!(r.snapshot().unwrap().gpus[0].refused, 1);
    // Draining the pool makes it allocated; a reclaim returns charge and pool.
    assert_eq!(r.pool_drain(0, 0), k);
    assert_eq!(r.reclaim_slot(0), vec![k]);
    assert_eq!((r.pool(0, 0), raw(&r)), (0, budget - k - 4096));
    // Keep 0 (no pool for this budget) returns everything.
    r.pool_put(1, 0, 4096, 0);
    assert_eq!(raw(&r), budget - k - 8192);
    // A read-only mapping changes nothing.
    let ro = Region::map(&File::open(&p).unwrap(), false).unwrap();
    assert!(!ro.pool_take(1, 0, 1));
    assert_eq!(ro.reserve_ahead(1, 0, 1, 0, budget), Err(Refusal::ReadOnly));
}

/// Eight threads, each with its own slot and mapping, allocate and free small pieces
/// through their pools against a budget the pieces overfill: the usage counter never
/// exceeds the budget, and once all is freed every charge equals its pool.
#[test]
fn concurrent_pools_never_exceed_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let p = region_file(&dir, &["GPU-a"], 8);
    let budget: u64 = 4 << 20;
    let keep = 256 << 10;
    let over = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let p = p.clone();
            let over = over.clone();
            std::thread::spawn(move || {
                let f = File::options().read(true).write(true).open(&p).unwrap();
                let r = Region::map(&f, true).unwrap();
                r.occupy_slot(t, t as u128 + 1, 0, 0);
                let mut live = Vec::new();
                for i in 0..20_000u64 {
                    let bytes = 4096 * (1 + (i * 7 + t as u64) % 31);
                    if i % 3 != 2 {
                        let ok = r.pool_take(t, 0, bytes)
                            || r.reserve_ahead(t, 0, bytes, keep, budget).is_ok();
                        if ok {
                            live.push(bytes);
                        }
                    } else if let Some(b) = live.pop() {
                        r.pool_put(t, 0, b, keep);
                    }
                    if r.gpu_used(0).unwrap() > budget {
                        over.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                for b in live {
                    r.pool_put(t, 0, b, keep);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(!over.load(std::sync::atomic::Ordering::Relaxed));
    let f = File::open(&p).unwrap();
    let r = Region::map(&f, false).unwrap();
    let s = r.snapshot().unwrap();
    assert_eq!(s.gpus[0].used, 0, "everything freed");
    assert!(s.gpus[0].pooled <= 8 * keep);
    let charged: u64 = (0..8)
        .map(|t| {
            let c = s
                .slots
                .iter()
                .find(|x| x.index == t)
                .map_or(0, |x| x.charged[0]);
            assert_eq!(c, r.pool(t, 0), "slot {t}: its charge is its pool");
            c
        })
        .sum();
    assert_eq!(charged, r.gpu_used(0).unwrap());
}

/// The memory view (`Region::allocated`) reads the pools of the slots the slot map
/// marks: slots are marked when taken and unmarked when reclaimed (a dead process's
/// slot too), so the view equals the usage counter less every pool. A map a tenant
/// cleared leaves pools counted as allocated (less free, never more), and nothing
/// that reserves reads it: the budget holds.
#[test]
fn the_slot_map_follows_owners_and_bounds_the_memory_view() {
    let dir = tempfile::tempdir().unwrap();
    let p = region_file(&dir, &["GPU-a", "GPU-b"], 130);
    let f = File::options().read(true).write(true).open(&p).unwrap();
    let r = Region::map(&f, true).unwrap();
    assert_eq!(r.layout().slot_map_words(), 3);
    let (keep, budget) = (1u64 << 20, 64u64 << 20);
    let all_pools = |r: &Region, g| (0..130).map(|s| r.pool(s, g)).sum::<u64>();
    // Slots in three map words, one taken twice (reclaimed in between).
    for s in [0usize, 1, 64, 129, 1] {
        if r.slot_marked(s) == Some(true) {
            r.reclaim_slot(s);
            assert_eq!(r.slot_marked(s), Some(false));
        }
        r.occupy_slot(s, s as u128 + 1, 0, 0);
        assert_eq!(r.slot_marked(s), Some(true));
        r.reserve_ahead(s, 0, 4096, keep, budget).unwrap();
        r.reserve_ahead(s, 1, 2 << 20, 0, budget).unwrap();
        assert!(r.pool_take(s, 0, 8192) || r.reserve(s, 0, 8192, budget).is_ok());
    }
    assert_eq!(r.slot_marked(2), Some(false));
    for g in 0..2 {
        let want = r.gpu_used(g).unwrap() - all_pools(&r, g);
        assert_eq!(r.allocated(g), Some(want), "GPU {g}");
    }
    assert_eq!(r.allocated(0), Some(4 * (4096 + 8192)));
    // A dead process's slot (its lock is free: this test holds none) is reclaimed
    // with its pool, and leaves the map.
    assert_eq!(r.reclaim_dead(&f).unwrap(), vec![0, 1, 64, 129]);
    assert!((0..130).all(|s| r.slot_marked(s) == Some(false)));
    assert_eq!((r.allocated(0), r.gpu_used(0)), (Some(0), Some(0)));
    // A tenant clearing the map: its pool then counts as allocated, and the budget
    // is enforced as before (the map is not read by reservations).
    r.occupy_slot(3, 9, 0, 0);
    r.reserve_ahead(3, 0, 4096, keep, budget).unwrap();
    assert_eq!(r.allocated(0), Some(4096));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .and_then(|mut w| {
            use std::io::{Seek, SeekFrom};
            w.seek(SeekFrom::Start(r.layout().slot_map as u64))?;
            w.write_all(&[0u8; 24])
        })
        .unwrap();
    assert_eq!(r.slot_marked(3), Some(false));
    assert_eq!(
        r.allocated(0),
        Some(4096 + keep),
        "the pool counted, not hidden"
    );
    assert_eq!(
        r.reserve(3, 0, budget - 4096 - keep + 1, budget),
        Err(Refusal::OverBudget)
    );
}

#[test]
fn release_returns_and_saturates() {
    let dir = tempfile::tempdir().unwrap();
    let p = region_file(&dir, &["GPU-a", "GPU-b"], 2);
    let f = File::options().read(true).write(true).open(&p).unwrap();
    let r = Region::map(&f, true).unwrap();
    assert_eq!(r.gpu_index("GPU-b"), Some(1));
    r.reserve(0, 1, 10, 10).unwrap();
    assert_eq!(r.reserve(1, 1, 1, 10), Err(Refusal::OverBudget));
    assert_eq!(r.reserve(5, 1, 1, 10), Err(Refusal::OutOfRange));
    r.release(0, 1, 4);
    r.release(0, 1, 100);
    let s = r.snapshot().unwrap();
    assert_eq!(s.gpus[1].used, 0);
    // A read-only mapping refuses every change instead of faulting.
    let ro = Region::map(&File::open(&p).unwrap(), false).unwrap();
    assert_eq!(ro.reserve(0, 0, 1, 10), Err(Refusal::ReadOnly));
    ro.release(0, 0, 1);
    ro.occupy_slot(0, 1, 0, 0);
    assert!(ro.reclaim_slot(0).is_empty());
}

/// A child process takes slot 0's OFD lock, charges 3 MiB and is SIGKILLed: the lock is
/// gone the moment it dies, and `reclaim_dead` returns its charge.
#[test]
fn a_killed_process_slot_is_reclaimed() {
    if let Ok(p) = std::env::var("TESSERA_ABI_CHILD_REGION") {
        let f = File::options().read(true).write(true).open(&p).unwrap();
        let r = Region::map(&f, true).unwrap();
        let (start, len) = r.layout().slot_lock_range(0);
        assert!(try_lock_range(&f, start, len).unwrap());
        r.occupy_slot(0, 0x1234, 0, 1);
        r.reserve(0, 0, 3 << 20, 10 << 20).unwrap();
        println!("READY");
        std::thread::sleep(std::time::Duration::from_secs(60));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = region_file(&dir, &["GPU-a"], 4);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_killed_process_slot_is_reclaimed",
            "--nocapture",
        ])
        .env("TESSERA_ABI_CHILD_REGION", &p)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("READY") {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0);
    }
    let f = File::options().read(true).write(true).open(&p).unwrap();
    let r = Region::map(&f, true).unwrap();
    let (start, len) = r.layout().slot_lock_range(0);
    assert!(range_locked(&f, start, len).unwrap());
    assert_eq!(r.reclaim_dead(&f).unwrap(), Vec::<usize>::new());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!range_locked(&f, start, len).unwrap());
    assert_eq!(r.reclaim_dead(&f).unwrap(), vec![0]);
    let s = r.snapshot().unwrap();
    assert_eq!(s.gpus[0].used, 0);
    assert!(s.slots.is_empty());
}

/// The control file: documented header, seqlocked updates visible to a read-only
/// mapping, and refusal of out-of-range values.
#[test]
fn control_file_updates_are_seen_by_readers() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("control");
    let gpus = vec![GpuControl {
        uuid: "GPU-a".into(),
        share: 25,
        compute_limit: 100,
        block_rate: 0,
        updates: 0,
        burst_ns: 0,
    }];
    let bytes = control::initial_bytes(&gpus).unwrap();
    assert_eq!(&bytes[..8], b"TSRACTL\0");
    assert_eq!(bytes.len(), 4096);
    assert_eq!(
        u32::from_le_bytes(bytes[64 + 64..64 + 68].try_into().unwrap()),
        25
    );
    File::create(&p).unwrap().write_all(&bytes).unwrap();
    let w = Control::map(
        &File::options().read(true).write(true).open(&p).unwrap(),
        true,
    )
    .unwrap();
    let r = Control::map(&File::open(&p).unwrap(), false).unwrap();
    assert!(r.set_rate(0, 5, 0).is_err());
    assert!(r.repair_sequence().is_err());
    assert!(w.set_rate(1, 5, 0).is_err());
    w.set_rate(0, 1200, 30_000_000).unwrap();
    assert_eq!(r.rate(0), Some((1200, 30_000_000)));
    assert_eq!(r.block_rate(0), Some(1200));
    assert_eq!(r.burst_ns(0), Some(30_000_000));
    assert_eq!(r.cells(0).map(|c| c.block_rate()), Some(1200));
    assert_eq!(r.gpu_index("GPU-a"), Some(0));
    assert_eq!(r.gpu_index("GPU-b"), None);
    let all = r.read().unwrap();
    assert_eq!(
        (
            all[0].block_rate,
            all[0].burst_ns,
            all[0].updates,
            all[0].share
        ),
        (1200, 30_000_000, 1, 25)
    );
    // The documented offsets: block rate at entry + 72, burst at entry + 88.
    let raw = std::fs::read(&p).unwrap();
    let at = |o: usize| u64::from_le_bytes(raw[o..o + 8].try_into().unwrap());
    assert_eq!(
        (at(64 + 72), at(64 + 80), at(64 + 88)),
        (1200, 1, 30_000_000)
    );
    // A writer killed mid-update leaves the sequence odd: readers still answer
    // (bounded retries), and the plugin's repair makes it even again.
    let seq = |f: &std::path::Path| {
        u64::from_le_bytes(std::fs::read(f).unwrap()[32..40].try_into().unwrap())
    };
    let mut raw = std::fs::read(&p).unwrap();
    raw[32..40].copy_from_slice(&(seq(&p) + 1).to_le_bytes());
    std::fs::write(&p, &raw).unwrap();
    assert_eq!(seq(&p) % 2, 1);
    assert_eq!(r.rate(0), Some((1200, 30_000_000)));
    assert_eq!(r.read().unwrap()[0].block_rate, 1200);
    assert!(w.repair_sequence().unwrap());
    assert_eq!(seq(&p) % 2, 0);
    assert!(!w.repair_sequence().unwrap());
    let mut bad = gpus.clone();
    bad[0].share = 101;
    assert!(control::initial_bytes(&bad).is_err());
    bad[0].share = 0;
    bad[0].compute_limit = 0;
    assert!(control::initial_bytes(&bad).is_err());
}

/// The GCRA: after idleness a claim may run `burst` ahead; then each launch waits for
/// the previous one's cost; a launch bigger than the burst is admitted when the bucket
/// is not in debt and the next one waits out the debt. Costs round up; the TAT is kept
/// to a quantum of 256 ns (its low bits carry the rate code).
#[test]
fn the_bucket_admits_a_burst_then_the_rate() {
    use region::{Admit, cost_ns};
    assert_eq!(cost_ns(1000, 1000), 1_000_000_000);
    assert_eq!(cost_ns(1, 3), 333_333_334);
    assert_eq!(cost_ns(u64::MAX, 1), region::MAX_DEBT_NS);
    assert_eq!(cost_ns(1 << 40, 1 << 40), 1_000_000_000);
    let dir = tempfile::tempdir().unwrap();
    let p = region_file(&dir, &["GPU-a", "GPU-b"], 4);
    let r = Region::map(
        &File::options().read(true).write(true).open(&p).unwrap(),
        true,
    )
    .unwrap();
    let b = r.bucket(1).unwrap();
    let q = 1u64 << region::RATE_CODE_BITS;
    let until_near = |a: Admit, t: u64, slack: u64| match a {
        Admit::Until(x) => assert!(x.abs_diff(t) <= slack, "until {x}, expected {t} ± {slack}"),
        Admit::Now => panic!("admitted; expected to wait until {t}"),
    };
    let ms = 1_000_000u64;
    let now = 1_000_000 * ms;
    // Rate 1000 blocks/s: 1 ms per block; burst 10 ms.
    let mut admitted = 0;
    while b.try_admit(now, 1, 1000, 10 * ms) == Admit::Now {
        admitted += 1;
    }
    assert!(
        (10..=11).contains(&admitted),
        "a burst of 10 ms at 1 ms a launch, plus the one at now (to the quantum): {admitted}"
    );
    // Owed: the burst's last launch (11 fit exactly; the quantum may leave room for 10).
    until_near(
        b.try_admit(now, 1, 1000, 10 * ms),
        now + (admitted - 10) * ms,
        12 * q,
    );
    assert_eq!(b.try_admit(now + 2 * ms, 1, 1000, 10 * ms), Admit::Now);
    // A 500-block kernel (500 ms > burst) runs when not in debt (here after an idle
    // 100 ms, from a base of now − burst), then the bucket owes.
    assert_eq!(b.try_admit(now + 100 * ms, 500, 1000, 10 * ms), Admit::Now);
    until_near(
        b.try_admit(now + 101 * ms, 1, 1000, 10 * ms),
        now + 590 * ms,
        2 * q,
    );
    // Burst 0 means the default (50 ms).
    let b0 = r.bucket(0).unwrap();
    let mut n = 0;
    while b0.try_admit(now, 1, 1000, 0) == Admit::Now {
        n += 1;
    }
    assert!((50..=51).contains(&n), "{n}");
    // A corrupted TAT (far beyond any launch's debt) counts as now.
    let raw_tat = r.layout().gpu_offset(0) + region::gpu::TAT;
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[raw_tat..raw_tat + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    assert_eq!(r.bucket(0).unwrap().try_admit(now, 1, 1000, 0), Admit::Now);
    // Read-only mappings have no bucket, but do have the counters.
    let ro = Region::map(&File::open(&p).unwrap(), false).unwrap();
    assert!(ro.bucket(0).is_none());
    b.count(700, 3);
    b.add_waited(12_345);
    let st = ro.gpu_stats(1).unwrap();
    assert_eq!((st.blocks, st.launches, st.waited_ns), (700, 3, 12_345));
    assert!(ro.gpu_stats(2).is_none());
    let read = region::read_gpu_stats(&p).unwrap();
    assert_eq!(read.len(), 2);
    assert_eq!(read[1], st);
    assert!(region::read_gpu_stats(&dir.path().join("missing")).is_err());
    let snap = ro.snapshot().unwrap();
    assert_eq!(
        (
            snap.gpus[1].blocks,
            snap.gpus[1].launches,
            snap.gpus[1].waited_ns
        ),
        (700, 3, 12_345)
    );
    // At the documented offsets: entry + 96, 104, 112.
    let raw = std::fs::read(&p).unwrap();
    let o = r.layout().gpu_offset(1);
    let at = |x: usize| u64::from_le_bytes(raw[o + x..o + x + 8].try_into().unwrap());
    assert_eq!((at(96), at(104), at(112)), (700, 3, 12_345));
}

/// Eight threads on separate mappings (as separate processes) share one bucket: over
/// a simulated second, what they are admitted never exceeds rate × (1 s + burst).
#[test]
fn processes_sharing_a_bucket_obey_its_rate_together() {
    use region::Admit;
    let dir = tempfile::tempdir().unwrap();
    let p = region_file(&dir, &["GPU-a", "GPU-b"], 4);
    let clock = Arc::new(std::sync::atomic::AtomicU64::new(5_000_000_000));
    let admitted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (rate, burst) = (100_000u64, 20_000_000u64);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (clock, admitted, p) = (clock.clone(), admitted.clone(), p.clone());
            s.spawn(move || {
                let f = File::options().read(true).write(true).open(&p).unwrap();
                let r = Region::map(&f, true).unwrap();
                let b = r.bucket(0).unwrap();
                let blocks = 1 + t * 7;
                loop {
                    let now = clock.load(std::sync::atomic::Ordering::Relaxed);
                    if now >= 6_000_000_000 {
                        break;
                    }
                    if b.try_admit(now, blocks, rate, burst) == Admit::Now {
                        admitted.fetch_add(blocks, std::sync::atomic::Ordering::Relaxed);
                    }
                    if t == 0 {
                        clock.fetch_add(1_000, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let got = admitted.load(std::sync::atomic::Ordering::Relaxed);
    let max = rate + rate * burst / 1_000_000_000 + 50;
    assert!(
        got <= max,
        "{got} blocks admitted in 1 s at {rate}/s (max {max})"
    );
    assert!(
        got >= rate * 9 / 10,
        "{got} blocks: the bucket starved its users"
    );
}

/// The controller may set a claim's rate very low for a tick (its first seconds, a
/// bad window on a loaded node). A launch booked then owes up to a minute; when the
/// rate rises again, the debt is rescaled to the new rate instead of stalling the
/// claim for that minute.
#[test]
fn a_debt_booked_at_a_low_rate_is_repaid_at_the_new_rate() {
    use region::Admit;
    let dir = tempfile::tempdir().unwrap();
    let p = region_file(&dir, &["GPU-a"], 4);
    let r = Region::map(
        &File::options().read(true).write(true).open(&p).unwrap(),
        true,
    )
    .unwrap();
    let b = r.bucket(0).unwrap();
    let now = 7_000_000_000_000u64;
    let burst = 1_000_000;
    // 1000 blocks at 1 block/s: admitted, and the bucket owes the 60 s cap.
    assert_eq!(b.try_admit(now, 1000, 1, burst), Admit::Now);
    let owed = |a: Admit, at: u64| match a {
        Admit::Until(t) => t - at,
        Admit::Now => 0,
    };
    let d = owed(b.try_admit(now + 1, 10, 1, burst), now + 1);
    assert!(d > 59_000_000_000, "owes {d} ns at the low rate");
    // The rate falls further: the debt is not scaled up.
    assert_eq!(owed(b.try_admit(now + 2, 10, 1, burst), now + 2), d - 1);
    // The controller raises the rate to a million blocks/s: what is left is owed at
    // that rate (≤ 60 µs), and the next launch runs once it is paid.
    let d2 = owed(b.try_admit(now + 3, 10, 1_000_000, burst), now + 3);
    assert!(d2 > 0 && d2 <= 61_000, "owes {d2} ns after the rise");
    assert_eq!(
        b.try_admit(now + 3 + d2 + 256, 10, 1_000_000, burst),
        Admit::Now
    );
    // Every waiter sees the rescaled debt, whatever rate it read.
    let d3 = owed(b.try_admit(now + 4, 10, 1, burst), now + 4);
    assert!(d3 <= 200_000, "a waiter at the old rate still owes {d3} ns");
}

/// A rescale never undercharges: a debt booked at rate r and repaid at r' > r owes at
/// least (r / r') of it, and at most (the ceiling of r's code / r') of it.
#[test]
fn a_rescaled_debt_is_never_less_than_the_exact_one() {
    use region::{Admit, rate_code, rate_code_ceiling};
    let dir = tempfile::tempdir().unwrap();
    let p = region_file(&dir, &["GPU-a"], 4);
    let r = Region::map(
        &File::options().read(true).write(true).open(&p).unwrap(),
        true,
    )
    .unwrap();
    let mut now = 9_000_000_000_000u64;
    for (r0, r1) in [
        (1000u64, 2000u64),
        (1000, 1001),
        (3, 5),
        (12_345, 1_000_000),
        (77, 78),
    ] {
        let b = r.bucket(0).unwrap();
        now += 100_000_000_000;
        // About 200 ms owed at r0.
        let blocks = r0.div_ceil(5);
        assert_eq!(b.try_admit(now, blocks, r0, 1), Admit::Now);
        let exact = region::cost_ns(blocks, r0) as f64 * r0 as f64 / r1 as f64;
        let hi = region::cost_ns(blocks, r0) as f64
            * rate_code_ceiling(rate_code(r0)).min(r1) as f64
            / r1 as f64;
        let Admit::Until(t) = b.try_admit(now, 1, r1, 1) else {
            panic!("admitted in debt")
        };
        let owed = (t - now) as f64;
        assert!(
            owed >= exact - 512.0 && owed <= hi + 512.0,
            "{r0} -> {r1}: owes {owed}, exact {exact}, at most {hi}"
        );
        now += 1_000_000_000;
    }
}

/// Rate codes: monotonic in the rate, eight steps an octave, and a code's ceiling is
/// at least every rate with that code and below every rate with a higher one.
#[test]
fn rate_codes_are_monotonic_and_their_ceilings_bound_them() {
    use region::{rate_code, rate_code_ceiling};
    let mut prev = 0u8;
    let rates = (1..200_000u64).chain((0..40).map(|e| (1u64 << 24) * 3 / 2 + (e << 20)));
    for rt in rates.chain([u32::MAX as u64, 1 << 40, u64::MAX]) {
        let c = rate_code(rt);
        assert!(rt < 1 << 24 || c >= prev, "code of {rt}");
        assert!(rate_code_ceiling(c) >= rt, "ceiling of {rt}'s code {c}");
        if c < 255 {
            assert!(
                rate_code(rate_code_ceiling(c) + 1) > c,
                "rate past code {c}'s ceiling"
            );
        }
        prev = c;
    }
    assert_eq!(
        (rate_code(1), rate_code(2), rate_code(1 << 20)),
        (0, 8, 160)
    );
}

/// A tenant rewriting its bucket's TAT word would refill the bucket: zeroed, set
/// beyond any debt (read as corrupt, so as now), or set a little later at rate code 0
/// (a debt rescaled to nothing). A process that remembers the word it last left
/// (`try_admit_after`) is paced as before in all three cases, and the word is repaired;
/// a later word (other processes' launches) and a word of another rate code are not
/// overridden.
#[test]
fn a_remembered_word_undoes_a_rewritten_bucket_and_nothing_else() {
    use region::Admit;
    let dir = tempfile::tempdir().unwrap();
    let p = region_file(&dir, &["GPU-a"], 4);
    let f = File::options().read(true).write(true).open(&p).unwrap();
    let r = Region::map(&f, true).unwrap();
    let b = r.bucket(0).unwrap();
    let ms = 1_000_000u64;
    let now = 1_000_000 * ms;
    let raw_tat = (r.layout().gpu_offset(0) + region::gpu::TAT) as u64;
    let write =
        |w: u64| std::os::unix::fs::FileExt::write_all_at(&f, &w.to_le_bytes(), raw_tat).unwrap();
    // A 500-block kernel at 1000 blocks/s: the bucket owes 490 ms (500 less the burst).
    assert_eq!(b.try_admit(now, 500, 1000, 10 * ms), Admit::Now);
    let seen = b.word();
    let wait = |a: Admit| match a {
        Admit::Now => 0,
        Admit::Until(t) => t.saturating_sub(now),
    };
    assert!(wait(b.try_admit(now, 1, 1000, 10 * ms)) >= 480 * ms);
    for forged in [
        0,
        now + region::MAX_DEBT_NS + 10 * ms,
        (b.tat() + 256) & !0xff,
    ] {
        write(forged);
        // Believed, the forged word admits a launch at once (or within nanoseconds)...
        let believed = wait(b.try_admit(now, 1, 1000, 10 * ms));
        assert!(believed < ms, "{forged}: {believed} ns");
        write(forged);
        // ...remembered, it owes what it did, and the word is put back.
        let remembered = wait(b.try_admit_after(now, 1, 1000, 10 * ms, seen).0);
        assert!(remembered >= 480 * ms, "{forged}: {remembered} ns");
        assert!(
            b.tat() >= seen & !0xff,
            "{forged}: {} < {}",
            b.tat(),
            seen & !0xff
        );
        write(seen);
    }
    // A later word stays: the remembered one is only a floor. The word returned is the
    // one this admission stored.
    let (verdict, stored) = b.try_admit_after(now + 495 * ms, 1, 1000, 10 * ms, seen);
    assert_eq!(verdict, Admit::Now);
    assert_eq!(stored, b.word());
    assert!(b.tat() > seen & !0xff);
    // At another rate the remembered word says nothing, nor does one beyond any debt.
    write(0);
    assert_eq!(b.try_admit_after(now, 1, 2000, 10 * ms, seen).0, Admit::Now);
    write(0);
    let beyond = ((now + region::MAX_DEBT_NS + 10 * ms) & !0xff) | (seen & 0xff);
    assert_eq!(
        b.try_admit_after(now, 1, 1000, 10 * ms, beyond).0,
        Admit::Now
    );
}
