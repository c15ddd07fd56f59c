//! Prerequisites (skipped only when `CI` is unset, a failure when it is set) and the
//! suites' progress lines. Std and libc only: the real-cluster crate (`tests/cluster`,
//! which links nothing of Tessera's), `tessera-interpose`'s tests and `testkit` use it.

use std::path::Path;
use std::process::{Command, Stdio};

/// Whether missing prerequisites fail (CI) or skip (a developer's machine): `CI` set
/// and not empty, `false` or `0`. The one definition every suite uses.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// `cmd` on PATH; `python3:MODULE` for a module the `python3` on PATH can import.
fn have(cmd: &str) -> bool {
    if let Some(module) = cmd.strip_prefix("python3:") {
        return Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    }
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Prints a line of a suite's progress (a scenario's time, the runtime's version, a
/// skip) and appends it to the file `TESSERA_TEST_TIMINGS` names, when set: `cargo test`
/// keeps a passing test's output to itself, and `.ci/run` prints that file after the
/// tests rather than running the suites a second time to show their times.
pub fn report(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let line = format!("{line}\n");
    eprint!("{line}");
    if let Some(path) = std::env::var_os("TESSERA_TEST_TIMINGS") {
        // One append per line: the suites run in parallel, and O_APPEND keeps lines whole.
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = appended {
            eprintln!("cannot append to {}: {e}", Path::new(&path).display());
        }
    }
}

/// Checks the prerequisites of a runtime suite: commands, and `python3:MODULE` entries.
/// `Ok(())` to run; `Err(reason)` to skip (printed by the caller). With `CI` set, a
/// missing prerequisite panics.
pub fn prerequisites(suite: &str, commands: &[&str]) -> Result<(), String> {
    let mut missing: Vec<String> = commands
        .iter()
        .filter(|c| !have(c))
        .map(|c| c.to_string())
        .collect();
    if !crate::sys::is_root() {
        missing.push("root".into());
    }
    if !Path::new("/bin/busybox").is_file() {
        missing.push("/bin/busybox (busybox-static)".into());
    }
    if missing.is_empty() {
        return Ok(());
    }
    let reason = format!("{suite}: missing {}", missing.join(", "));
    skip_or_fail(&reason, ".ci/run installs them");
    Err(reason)
}

/// The rule for a missing prerequisite, `reason` saying what is missing: with `CI` set
/// it panics (`remedy` says how to provide it); otherwise it reports
/// `SKIPPED <reason>` (see [`report`]) and returns, and the caller returns early.
pub fn skip_or_fail(reason: &str, remedy: &str) {
    assert!(
        !in_ci(),
        "{reason} (CI=true: a missing prerequisite is a failure; {remedy})"
    );
    report(format_args!("SKIPPED {reason}"));
}
