//! The few system calls the test kit makes through libc, each behind a safe function,
//! so that `testkit` itself denies `unsafe` code.

use std::io;
use std::path::Path;

/// Whether this process runs as root (effective UID 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock the fake driver's simulator
/// stamps its timeline with (`std::time::Instant` reads it too, but hides the value).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Creates the character device `path` (`major:minor`, mode 0666). An existing file
/// is no error.
///
/// # Errors
/// What `mknod(2)` returns otherwise (no root, no such directory).
pub fn mknod_char(path: &Path, major: u32, minor: u32) -> io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: a valid NUL-terminated path; makedev and mknod have no other preconditions.
    let r = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    let err = io::Error::last_os_error();
    if r == 0 || err.kind() == io::ErrorKind::AlreadyExists {
        Ok(())
    } else {
        Err(err)
    }
}

/// This process's hard limit on open files (`RLIMIT_NOFILE`).
pub fn nofile_hard_limit() -> u64 {
    // SAFETY: getrlimit writes into a valid, zeroed struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_max
    }
}

/// Sends `signal` (e.g. `libc::SIGKILL`) to process `pid`; a process gone already is
/// no error worth reporting, so nothing is returned.
pub fn kill(pid: i32, signal: i32) {
    // SAFETY: kill has no memory preconditions; callers name processes they started.
    unsafe { libc::kill(pid, signal) };
}

pub use libc::{SIGKILL, SIGTERM};
