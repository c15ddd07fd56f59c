//! The simulated driver's memory: the ledger that the project's fake `libcuda`
//! (`cuda/tests/fakes/fake_cuda.c`, the driver library of a simulated node's containers)
//! keeps of the device memory each process really holds. With `driverLedger` in the
//! node description, the mock node lists a GPU's processes from it, as NVML lists them
//! from the kernel driver, so that the memory watchdog has something true to judge on a
//! simulated node (the real-cluster suite's backstop test). Without it the mock node has
//! no processes.
//!
//! Layout (the fake driver's, little-endian `u64`s): the device table at 64 + 64·d
//! (bytes used, …, the raw 16-byte UUID at +32, a 1 at +48 once the UUID is there);
//! 256 records of 128 bytes from 4096: owner flag, bytes held per device (8), the PID
//! (`getpid()`, so in the process's own PID namespace) at +72 and the inode of that
//! namespace at +80. A process owns its record through an OFD lock on its range, which
//! the kernel drops when the process dies: a record without a lock is a dead process,
//! whose memory the real driver would have freed.
//!
//! The processes of every pod that mounts the ledger (only the real-cluster suite's
//! test pods do; on a real node the ledger is the kernel driver's) write it, so it is
//! read as untrusted input: opened as `abi::untrusted` opens a region (no link
//! followed, no blocking, a regular file only), its first 64 KiB read with `pread(2)`,
//! never mapped. A record whose namespace
//! is not known, or whose process `--proc-root` does not show, is left out, never
//! guessed. A pod that mounts the ledger could still forge a record naming another
//! process; that is the simulation's limit (NVML has no such path), not a tenant's way
//! in on a real node.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::BackendError;
use crate::inventory::GpuProcess;

/// The ledger's size (the fake driver maps exactly this much).
pub const LEDGER_SIZE: u64 = 65536;
const DEV0: usize = 64;
const DEV_SIZE: usize = 64;
const MAX_DEVICES: usize = 8;
const REC0: usize = 4096;
const REC_SIZE: usize = 128;
const RECORDS: usize = 256;

/// One record holding memory on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// Record index (its OFD lock range tells whether the process lives).
    pub record: usize,
    /// PID in the process's own namespace.
    pub pid: u32,
    /// Inode of that PID namespace; `None` from a fake driver that does not record it.
    pub pid_ns: Option<u64>,
    pub bytes: u64,
}

fn word(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8)
        .map_or(0, |w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
}

/// The 16 bytes of a `GPU-xxxxxxxx-xxxx-...` UUID; `None` if it is not one.
fn raw_uuid(uuid: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = uuid
        .strip_prefix("GPU-")?
        .bytes()
        .filter(|c| *c != b'-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// The ledger's device index of GPU `uuid`, if a process of the fake driver recorded it.
pub fn device_of(ledger: &[u8], uuid: &str) -> Option<usize> {
    let want = raw_uuid(uuid)?;
    (0..MAX_DEVICES).find(|d| {
        let base = DEV0 + DEV_SIZE * d;
        word(ledger, base + 48) == 1 && ledger.get(base + 32..base + 48) == Some(&want[..])
    })
}

/// The records holding memory on ledger device `d` (live or not).
pub fn holders(ledger: &[u8], d: usize) -> Vec<Holder> {
    if d >= MAX_DEVICES {
        return Vec::new();
    }
    (0..RECORDS)
        .filter_map(|r| {
            let base = REC0 + REC_SIZE * r;
            let bytes = word(ledger, base + 8 + 8 * d);
            let pid = u32::try_from(word(ledger, base + 72)).ok()?;
            let ns = word(ledger, base + 80);
            (word(ledger, base) != 0 && bytes != 0 && pid != 0).then_some(Holder {
                record: r,
                pid,
                pid_ns: (ns != 0).then_some(ns),
                bytes,
            })
        })
        .collect()
}

/// Creates an empty ledger at `path` unless one is there, atomically (written aside,
/// then linked into place: a fake driver never maps a short file, and an existing
/// ledger, with the records of running processes, is never replaced).
pub fn create_if_missing(path: &Path) -> Result<(), BackendError> {
    let bad = |reason: String| BackendError::MockLedger {
        path: path.display().to_string(),
        reason,
    };
    if std::fs::symlink_metadata(path).is_ok() {
        return Ok(());
    }
    let name = path
        .file_name()
        .ok_or_else(|| bad("not a file path".into()))?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let mut bytes = vec![0u8; LEDGER_SIZE as usize];
    bytes[..8].copy_from_slice(b"FAKECUDA");
    let made = std::fs::write(&tmp, &bytes)
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        // A link, unlike a rename, never replaces a ledger created meanwhile.
        .and_then(|()| match std::fs::hard_link(&tmp, path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        });
    let _ = std::fs::remove_file(&tmp);
    made.map_err(|e| bad(format!("cannot create: {e}")))
}

/// The processes holding memory on GPU `uuid`, as NVML would list them: live records
/// only, PIDs as `proc_root` (the host's `/proc` for a plugin with hostPID) shows them,
/// one entry per process (a process may own several records: a driver loaded twice).
pub fn processes(
    ledger_path: &Path,
    uuid: &str,
    proc_root: &Path,
) -> Result<Vec<GpuProcess>, BackendError> {
    let bad = |reason: String| BackendError::MockLedger {
        path: ledger_path.display().to_string(),
        reason,
    };
    let file = tessera_abi::untrusted::open_regular(ledger_path)
        .map_err(BackendError::MockLedgerUnopenable)?;
    // The locks first, then the bytes: a dead process's record taken over in between
    // is read with its new, live owner's figures, never the other way round.
    let mut locked = [false; RECORDS];
    for (r, l) in locked.iter_mut().enumerate() {
        *l = tessera_abi::map::range_locked(&file, (REC0 + REC_SIZE * r) as u64, REC_SIZE as u64)
            .map_err(|e| bad(format!("cannot test record {r}'s lock: {e}")))?;
    }
    let ledger = read_prefix(&file, LEDGER_SIZE as usize).map_err(&bad)?;
    let Some(d) = device_of(&ledger, uuid) else {
        return Ok(Vec::new());
    };
    let live: Vec<Holder> = holders(&ledger, d)
        .into_iter()
        .filter(|h| locked[h.record])
        .collect();
    let spaces: BTreeSet<u64> = live.iter().filter_map(|h| h.pid_ns).collect();
    let host = host_pids(proc_root, &spaces);
    let mut by_pid: BTreeMap<u32, u64> = BTreeMap::new();
    for h in live {
        // A record without its namespace, or whose process proc_root's view does not
        // have (it died after the lock test), is left out, never guessed.
        if let Some(pid) = h.pid_ns.and_then(|ns| host.get(&(ns, h.pid)).copied()) {
            *by_pid.entry(pid).or_default() += h.bytes;
        }
    }
    Ok(by_pid
        .into_iter()
        .map(|(pid, bytes)| GpuProcess {
            pid,
            used_bytes: Some(bytes),
            gi_id: None,
        })
        .collect())
}

/// The first `max` bytes of `f` (fewer if it is shorter): a ledger grown past its size
/// (anyone who maps it can `ftruncate` it) costs nothing and blinds no one.
fn read_prefix(f: &std::fs::File, max: usize) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; max];
    let mut n = 0;
    while n < max {
        match f.read_at(&mut b[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("cannot read: {e}")),
        }
    }
    b.truncate(n);
    Ok(b)
}

/// (PID namespace inode, PID in it) → PID in `proc_root`'s view, for the processes of
/// `spaces`: from each `<proc_root>/<pid>/ns/pid` and the innermost `NSpid` of its
/// `status` (what the kernel driver knows of a process without asking).
fn host_pids(proc_root: &Path, spaces: &BTreeSet<u64>) -> BTreeMap<(u64, u32), u32> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    if spaces.is_empty() {
        return out;
    }
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(ns) = std::fs::metadata(e.path().join("ns/pid")).map(|m| m.ino()) else {
            continue;
        };
        if !spaces.contains(&ns) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        if let Some(inner) = innermost_nspid(&status) {
            out.insert((ns, inner), pid);
        }
    }
    out
}

/// The last PID of the `NSpid:` line of a `/proc/<pid>/status`.
fn innermost_nspid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "GPU-4f8d0c1e-6a2b-4c59-9e31-0a7b5d2c9f10";

    fn put(b: &mut [u8], off: usize, v: u64) {
        b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// A ledger with `uuid` as device 1 and the given (record, pid, ns, bytes on device 1).
    fn ledger(uuid: &str, recs: &[(usize, u64, u64, u64)]) -> Vec<u8> {
        let mut b = vec![0u8; LEDGER_SIZE as usize];
        let base = DEV0 + DEV_SIZE;
        b[base + 32..base + 48].copy_from_slice(&raw_uuid(uuid).unwrap());
        put(&mut b, base + 48, 1);
        for &(r, pid, ns, bytes) in recs {
            let rb = REC0 + REC_SIZE * r;
            put(&mut b, rb, 1);
            put(&mut b, rb + 16, bytes);
            put(&mut b, rb + 72, pid);
            put(&mut b, rb + 80, ns);
        }
        b
    }

    #[test]
    fn a_gpu_is_found_by_its_raw_uuid_once_recorded() {
        let b = ledger(UUID, &[]);
        assert_eq!(device_of(&b, UUID), Some(1));
        assert_eq!(
            device_of(&b, "GPU-9a7e3b21-0c4d-4f8e-b6a5-2d1c0e9f8a73"),
            None
        );
        assert_eq!(device_of(&b, "not-a-uuid"), None);
        assert_eq!(
            device_of(&[0u8; 100], UUID),
            None,
            "a short ledger has no devices"
        );
    }

    #[test]
    fn holders_are_the_records_with_memory_on_the_device() {
        let b = ledger(UUID, &[(0, 41, 7, 1 << 30), (3, 42, 0, 0), (9, 43, 0, 5)]);
        let h = holders(&b, 1);
        assert_eq!(
            h,
            vec![
                Holder {
                    record: 0,
                    pid: 41,
                    pid_ns: Some(7),
                    bytes: 1 << 30
                },
                Holder {
                    record: 9,
                    pid: 43,
                    pid_ns: None,
                    bytes: 5
                },
            ]
        );
        assert!(holders(&b, 0).is_empty(), "nothing held on device 0");
        assert!(holders(&b, 99).is_empty(), "no device 99");
        assert!(
            holders(&b[..4096 + 64], 1).is_empty(),
            "a record cut short holds nothing"
        );
    }

    #[test]
    fn the_innermost_nspid_is_the_pid_a_container_sees() {
        assert_eq!(innermost_nspid("Name:\tx\nNSpid:\t4242\t17\t1\n"), Some(1));
        assert_eq!(innermost_nspid("NSpid:\t99\n"), Some(99));
        assert_eq!(innermost_nspid("Name:\tx\n"), None);
    }

    #[test]
    fn only_live_records_are_processes_and_pids_are_translated_to_proc_roots_view() {
        use std::os::unix::fs::MetadataExt;
        // This process, recorded as a container would record it: its PID namespace's
        // inode and its PID there (the host's /proc is this test's /proc).
        let me = std::process::id();
        let ns = std::fs::metadata("/proc/self/ns/pid").unwrap().ino();
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let inner = innermost_nspid(&status).unwrap();
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("ledger");
        // Records 0 and 1: this process twice (a driver loaded twice); 2: a dead one.
        let b = ledger(
            UUID,
            &[
                (0, inner as u64, ns, 3 << 30),
                (1, inner as u64, ns, 1 << 30),
                (2, 77, ns, 9 << 30),
                (3, inner as u64, 0, 2 << 30),
            ],
        );
        std::fs::write(&path, &b).unwrap();
        let f = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        // Record 3 is live but without its namespace: it cannot be placed, so it is
        // left out. Record 2 is not locked: a dead process.
        for r in [0u64, 1, 3] {
            assert!(tessera_abi::map::try_lock_range(&f, 4096 + 128 * r, 128).unwrap());
        }
        let got = processes(&path, UUID, Path::new("/proc")).unwrap();
        assert_eq!(
            got,
            vec![GpuProcess {
                pid: me,
                used_bytes: Some(4 << 30),
                gi_id: None
            }],
            "the live records, summed per process, with the PID /proc shows"
        );
        drop(f);
        assert!(
            processes(&path, UUID, Path::new("/proc"))
                .unwrap()
                .is_empty(),
            "locks gone: no process"
        );
        assert!(
            processes(
                &path,
                "GPU-9a7e3b21-0c4d-4f8e-b6a5-2d1c0e9f8a73",
                Path::new("/proc")
            )
            .unwrap()
            .is_empty()
        );
    }

    #[test]
    fn a_missing_ledger_is_created_empty_and_an_existing_one_is_kept() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("ledger");
        create_if_missing(&path).unwrap();
        let b = std::fs::read(&path).unwrap();
        assert_eq!(b.len() as u64, LEDGER_SIZE);
        assert_eq!(&b[..8], b"FAKECUDA");
        assert!(
            processes(&path, UUID, Path::new("/proc"))
                .unwrap()
                .is_empty()
        );
        std::fs::write(&path, ledger(UUID, &[(0, 1, 0, 5)])).unwrap();
        create_if_missing(&path).unwrap();
        assert_eq!(holders(&std::fs::read(&path).unwrap(), 1).len(), 1, "kept");
        assert_eq!(
            std::fs::read_dir(d.path()).unwrap().count(),
            1,
            "no temp file left"
        );
    }

    #[test]
    fn an_unreadable_ledger_is_an_error_naming_it_once() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("missing");
        let e = processes(&path, UUID, Path::new("/proc"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("simulated driver ledger {}: ", path.display())),
            "{e}"
        );
        assert_eq!(e.matches(&path.display().to_string()).count(), 1, "{e}");
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = processes(&fifo, UUID, Path::new("/proc"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn a_ledger_grown_past_its_size_is_read_as_its_first_64_kib() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("ledger");
        std::fs::write(&path, ledger(UUID, &[])).unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_len(1 << 40).unwrap();
        assert!(
            processes(&path, UUID, Path::new("/proc"))
                .unwrap()
                .is_empty()
        );
    }
}
