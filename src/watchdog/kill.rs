//! Killing an over-budget process safely: only the PID still in the pod it was judged
//! in (a reused PID is left alone), never the plugin itself, and only through a procfs
//! of the plugin's own PID namespace.

use std::path::Path;

use crate::watchdog::judge::pod_uid_from_cgroup;

/// Why a kill was not made.
#[derive(Debug, thiserror::Error)]
pub enum KillError {
    #[error("PID {pid} now belongs to pod {now:?}, not {expected} (PID reused)")]
    Reused {
        pid: u32,
        expected: String,
        now: Option<String>,
    },
    #[error("PID {pid} is the plugin itself")]
    Own { pid: u32 },
    #[error("signalling PID {pid} failed")]
    Signal {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
}

/// SIGKILLs `pid` only if it is still in pod `expected` (by `<proc_root>/<pid>/cgroup`)
/// and is not the plugin itself. Through a pidfd where the kernel has them (5.3+): the
/// pidfd pins the process whose cgroup was checked, so the signal cannot reach a
/// process that took the PID after the check. What is caught is reuse by a process
/// outside that pod; without pidfds a small window remains between the check and
/// kill(2). `proc_root` must show the plugin's own PID namespace
/// ([`proc_root_matches_pid_namespace`]): the pidfd and kill(2) use the plugin's PIDs.
pub fn kill_checked(proc_root: &Path, pid: u32, expected: &str) -> Result<(), KillError> {
    let signal_err = |source| KillError::Signal { pid, source };
    if pid == std::process::id() {
        return Err(KillError::Own { pid });
    }
    let check = || {
        let now = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup"))
            .ok()
            .as_deref()
            .and_then(pod_uid_from_cgroup);
        if now.as_deref() == Some(expected) {
            Ok(())
        } else {
            Err(KillError::Reused {
                pid,
                expected: expected.to_string(),
                now,
            })
        }
    };
    // SAFETY: pidfd_open(2) takes a PID and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOSYS) {
            return Err(signal_err(e));
        }
        // No pidfds: a check and kill(2), with the (tiny) window between them.
        check()?;
        // SAFETY: kill(2) on a PID just checked to be in the expected pod.
        if unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) } != 0 {
            return Err(signal_err(std::io::Error::last_os_error()));
        }
        return Ok(());
    }
    let fd = fd as libc::c_int;
    let r = check().and_then(|()| {
        // SAFETY: pidfd_send_signal(2) on the pidfd opened above, no siginfo.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd,
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc != 0 {
            Err(signal_err(std::io::Error::last_os_error()))
        } else {
            Ok(())
        }
    });
    // SAFETY: closing the pidfd this function opened.
    unsafe { libc::close(fd) };
    r
}

/// Whether `proc_root` is a procfs of the plugin's own PID namespace: its `self` link
/// names the plugin's PID. (Comparing `self/ns/pid` links is not enough: the host's
/// procfs resolves `self` to the caller too, whose namespace link is the caller's
/// own.) Errors when the link cannot be read.
pub fn proc_root_matches_pid_namespace(proc_root: &Path) -> std::io::Result<bool> {
    let link = std::fs::read_link(proc_root.join("self"))?;
    Ok(link.to_str().and_then(|s| s.parse::<u32>().ok()) == Some(std::process::id()))
}
