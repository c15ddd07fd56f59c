//! A shared memory mapping of a per-claim file and the OFD locks on its byte ranges.
//!
//! Values inside the mapping are accessed only through atomics at 8-byte-aligned
//! offsets (the mapping is page-aligned and every layout offset is a multiple of 8), so
//! that processes in different containers, and the plugin on the host, see consistent
//! values without any other synchronisation.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// A `MAP_SHARED` mapping of a whole file, unmapped on drop.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    writable: bool,
}

// The mapping is only accessed through atomics.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `file` (its current length, which must be non-zero), read-write or read-only.
    pub fn new(file: &File, writable: bool) -> io::Result<Self> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "file too large"))?;
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "empty file"));
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping of a valid fd; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
            writable,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// A copy of the mapped bytes (a snapshot for parsing; values may be mid-update).
    pub fn snapshot(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        for (i, chunk) in v.chunks_mut(8).enumerate() {
            let x = self
                .u64_at(i * 8)
                .map_or(0, |a| a.load(std::sync::atomic::Ordering::Relaxed));
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        v
    }

    /// The atomic u64 at `off`, if aligned and inside the mapping.
    #[inline]
    pub fn u64_at(&self, off: usize) -> Option<&AtomicU64> {
        if !off.is_multiple_of(8) || off.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: in bounds and aligned (page-aligned base); shared memory is only
        // accessed atomically.
        Some(unsafe { &*(self.ptr.add(off) as *const AtomicU64) })
    }

    /// The atomic u32 at `off`, if aligned and inside the mapping.
    pub fn u32_at(&self, off: usize) -> Option<&AtomicU32> {
        if !off.is_multiple_of(4) || off.checked_add(4)? > self.len {
            return None;
        }
        // SAFETY: as for `u64_at`.
        Some(unsafe { &*(self.ptr.add(off) as *const AtomicU32) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

fn flock_for(kind: libc::c_short, start: u64, len: u64) -> libc::flock {
    // SAFETY: flock is plain data; zero is a valid starting value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    fl.l_pid = 0;
    fl
}

/// Tries to take an exclusive OFD lock on `[start, start+len)` without waiting. The
/// lock belongs to the open file description: it lives until `file` (and every dup of
/// it) is closed, which the kernel does at process death, SIGKILL included.
pub fn try_lock_range(file: &File, start: u64, len: u64) -> io::Result<bool> {
    let mut fl = flock_for(libc::F_WRLCK as libc::c_short, start, len);
    // SAFETY: valid fd and flock.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Releases an OFD lock taken by [`try_lock_range`].
pub fn unlock_range(file: &File, start: u64, len: u64) -> io::Result<()> {
    let mut fl = flock_for(libc::F_UNLCK as libc::c_short, start, len);
    // SAFETY: valid fd and flock.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether some open file description (of any process) holds a lock overlapping
/// `[start, start+len)`, without taking it.
pub fn range_locked(file: &File, start: u64, len: u64) -> io::Result<bool> {
    let mut fl = flock_for(libc::F_WRLCK as libc::c_short, start, len);
    // SAFETY: valid fd and flock.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}
