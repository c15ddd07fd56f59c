//! `kubectl exec <plugin pod> -- tessera doctor` without flags: doctor takes the flags
//! of the `tessera plugin` process running in the same container (the same mount
//! namespace), so that it checks exactly what the plugin uses. The environment is the
//! container's already. Given any flag besides `-o`/`--output`, doctor uses only its
//! own flags.
//!
//! [`adopt`] is pure; [`find_plugin`] reads `/proc`.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Doctor's argv with the plugin's flags, when doctor was given none of its own
/// (only `-o`/`--output`) and `plugin` is a `tessera plugin` command line; `None`
/// otherwise. Deterministic.
pub fn adopt(doctor: &[OsString], plugin: &[OsString]) -> Option<Vec<OsString>> {
    if doctor.get(1).map(OsString::as_os_str) != Some(OsStr::new("doctor")) {
        return None;
    }
    let own = &doctor[2..];
    let mut i = 0;
    while i < own.len() {
        let a = own[i].as_bytes();
        if a == b"-o" || a == b"--output" {
            i += 2;
        } else if a.starts_with(b"--output=") || (a.starts_with(b"-o") && a.len() > 2) {
            i += 1;
        } else {
            return None;
        }
    }
    if plugin.get(1).map(OsString::as_os_str) != Some(OsStr::new("plugin")) {
        return None;
    }
    let mut out = vec![doctor[0].clone(), OsString::from("doctor")];
    out.extend(plugin[2..].iter().cloned());
    out.extend(own.iter().cloned());
    Some(out)
}

/// The PID and command line of a `tessera plugin` process in this process's mount
/// namespace (this container), read from `proc`. The lowest PID wins.
pub fn find_plugin(proc: &Path) -> Option<(u32, Vec<OsString>)> {
    let me = std::process::id();
    let ours = std::fs::read_link(proc.join("self/ns/mnt")).ok()?;
    let mut pids: Vec<u32> = std::fs::read_dir(proc)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|p| *p != me)
        .collect();
    pids.sort_unstable();
    pids.into_iter().find_map(|pid| {
        let dir = proc.join(pid.to_string());
        if std::fs::read_link(dir.join("ns/mnt")).ok()? != ours {
            return None;
        }
        let raw = std::fs::read(dir.join("cmdline")).ok()?;
        let argv: Vec<OsString> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| OsStr::from_bytes(a).to_os_string())
            .collect();
        let exe = Path::new(argv.first()?).file_name()?;
        (exe == "tessera" && argv.get(1)? == "plugin").then_some((pid, argv))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<OsString> {
        s.iter().map(OsString::from).collect()
    }

    /// Only a bare `tessera doctor` (with an output format) takes the plugin's flags.
    #[test]
    fn a_bare_doctor_takes_the_plugins_flags() {
        let plugin = v(&["tessera", "plugin", "--backend=mock", "--cdi-dir=/x"]);
        assert_eq!(
            adopt(&v(&["tessera", "doctor"]), &plugin),
            Some(v(&["tessera", "doctor", "--backend=mock", "--cdi-dir=/x"]))
        );
        assert_eq!(
            adopt(&v(&["tessera", "doctor", "-o", "json"]), &plugin),
            Some(v(&[
                "tessera",
                "doctor",
                "--backend=mock",
                "--cdi-dir=/x",
                "-o",
                "json"
            ]))
        );
        assert_eq!(
            adopt(&v(&["tessera", "doctor", "--backend=nvml"]), &plugin),
            None
        );
        assert_eq!(
            adopt(&v(&["tessera", "doctor"]), &v(&["tessera", "inventory"])),
            None
        );
        assert_eq!(adopt(&v(&["tessera", "plan"]), &plugin), None);
    }
}
