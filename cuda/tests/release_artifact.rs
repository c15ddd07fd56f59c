//! The release artifacts (the interception library, and the front library, the soname
//! shims and the CDI hook built beside it) loads everywhere: built with cargo-zigbuild for glibc 2.17,
//! each needs no symbol version above GLIBC_2.17, lists only libc and the loader as
//! NEEDED (its libdl and libpthread functions are found at first use), still enforces
//! in a root filesystem without libgcc_s (where ld.so would silently skip a preload
//! that needs it), and works on a glibc older than 2.34, where libdl and libpthread
//! are libraries of their own (a Debian bullseye root filesystem, glibc 2.31). Needs
//! `cargo-zigbuild` on PATH, zig (a `zig` binary or PyPI `ziglang` in the `python3` on
//! PATH), `readelf` and, for bullseye, `debootstrap` and a Debian mirror.

use testkit::interpose as support;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use support::*;

const TARGET: &str = "x86_64-unknown-linux-gnu.2.17";

fn have(prog: &str, arg: &str) -> bool {
    Command::new(prog)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Builds the release library with cargo-zigbuild; `None` (skip) when the tools are
/// missing and CI is unset.
fn zig_library(test: &str) -> Option<PathBuf> {
    if !require(test) {
        return None;
    }
    // cargo-zigbuild finds zig itself (a `zig` binary, or `python3 -m ziglang`).
    let missing: Vec<&str> = [("cargo-zigbuild", "--version"), ("readelf", "--version")]
        .into_iter()
        .filter(|(p, a)| !have(p, a))
        .map(|(p, _)| p)
        .collect();
    if !missing.is_empty() {
        let why =
            format!("{missing:?} not on PATH (pip install ziglang; cargo install cargo-zigbuild)");
        if in_ci() {
            panic!("{test}: {why}");
        }
        skip(format!("{test}: {why}"));
        return None;
    }
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tessera-interpose-zig");
    testkit_lite::cuda::build_shipped(
        "cargo-zigbuild",
        &["zigbuild"],
        &target_dir,
        &["--release", "--target", TARGET],
    );
    Some(target_dir.join("x86_64-unknown-linux-gnu/release/libtessera_cuda.so"))
}

/// No symbol version above GLIBC_2.17, and only libc and the loader as NEEDED. The
/// issue allows libdl and libpthread too, but on glibc 2.34 and later they are empty
/// stubs that ld.so would still open and map in every process of the container (about
/// 95 µs of each start), so the library finds their functions itself.
#[test]
#[ignore = "needs root and cargo-zigbuild"]
fn the_release_library_needs_glibc_2_17_and_only_libc() {
    let Some(lib) = zig_library("glibc-2.17") else {
        return;
    };
    // Every object: the front library (what ld.so.preload names), the soname shims
    // (which also NEED their real driver file by absolute path, and carry the
    // driver's soname) and the interception library they load.
    for (shim, soname, real) in [
        (SHIM_CUDA_FILE, "libcuda.so.1", REAL_CUDA),
        (SHIM_NVML_FILE, "libnvidia-ml.so.1", REAL_NVML),
    ] {
        let d = readelf("-d", &lib.with_file_name(shim));
        assert!(
            d.contains(&format!("(NEEDED)             Shared library: [{real}]"))
                && d.contains(&format!("(SONAME)             Library soname: [{soname}]")),
            "{shim}: {d}"
        );
    }
    // The CDI hook runs on the host, which any glibc from 2.17 on has: it may also
    // need the libraries Rust's std links (glibc's own, and libgcc_s).
    let hook = lib.with_file_name("tessera-cdi-hook");
    assert!(
        glibc_floor(&hook) <= (2, 17),
        "{}: needs GLIBC_{:?}",
        hook.display(),
        glibc_floor(&hook)
    );
    for n in needed(&hook) {
        assert!(
            [
                "libc.so.6",
                "ld-linux-x86-64.so.2",
                "libgcc_s.so.1",
                "libpthread.so.0",
                "libdl.so.2",
                "libm.so.6",
                "librt.so.1"
            ]
            .contains(&n.as_str()),
            "{}: NEEDED {n}",
            hook.display()
        );
    }
    for lib in [
        lib.with_file_name(FRONT_FILE),
        lib.with_file_name(SHIM_CUDA_FILE),
        lib.with_file_name(SHIM_NVML_FILE),
        lib,
    ] {
        let newest = glibc_floor(&lib);
        assert!(
            newest <= (2, 17),
            "{}: needs GLIBC_{}.{}",
            lib.display(),
            newest.0,
            newest.1
        );
        let needed = needed(&lib);
        let allowed = ["libc.so.6", "ld-linux-x86-64.so.2", REAL_CUDA, REAL_NVML];
        for n in &needed {
            assert!(
                allowed.contains(&n.as_str()),
                "{}: NEEDED {n}: {needed:?}",
                lib.display()
            );
        }
    }
}

/// The newest GLIBC_x.y symbol version an ELF file needs.
fn glibc_floor(file: &Path) -> (u32, u32) {
    let versions = readelf("-V", file);
    let mut newest = (2, 0);
    for v in versions.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.')) {
        if let Some(n) = v.strip_prefix("GLIBC_") {
            let mut it = n.split('.').map(|x| x.parse::<u32>().unwrap_or(0));
            let ver = (it.next().unwrap_or(0), it.next().unwrap_or(0));
            newest = newest.max(ver);
        }
    }
    newest
}

/// An ELF file's DT_NEEDED entries.
fn needed(file: &Path) -> Vec<String> {
    readelf("-d", file)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| {
            l.split('[')
                .nth(1)
                .map(|s| s.trim_end_matches(']').to_string())
        })
        .collect()
}

/// With libgcc_s masked out of the root filesystem, the release library still loads
/// and refuses over budget. So does the plain cargo build since `cuda/build.rs` links the
/// unwinder statically (ld.so would silently skip a preload that needs libgcc_s, and
/// loading it cost every process of the container a second library).
#[test]
#[ignore = "needs root and cargo-zigbuild"]
fn the_release_library_enforces_without_libgcc_s() {
    let Some(lib) = zig_library("no-libgcc_s") else {
        return;
    };
    let sb = Sandbox::new(
        &[(GPU0, 80 << 30)],
        vec![ClaimSpec::new("claim-a", &[(GPU0, 4 * MIB)])],
    );
    let dir = sb.dir.path().join("zig-lib");
    install_libs(&lib, &dir);
    // An overlay of the library directory with libgcc_s deleted (a whiteout); the
    // script (set -e) stops if it is still there.
    let d = sb.dir.path().display();
    let mask = format!(
        "mkdir -p {d}/lib-upper {d}/lib-work\n\
         mount -t overlay overlay -o lowerdir=/lib/x86_64-linux-gnu,upperdir={d}/lib-upper,workdir={d}/lib-work /lib/x86_64-linux-gnu\n\
         rm -f /lib/x86_64-linux-gnu/libgcc_s.so.1\n\
         test ! -e /lib/x86_64-linux-gnu/libgcc_s.so.1\n"
    );
    let mut o = RunOpts {
        extra_script: mask.clone(),
        lib_dir: Some(dir),
        ..opts()
    };
    let out = sb.client(&o, &["ctx", "0", "alloc", "6291456"]);
    assert_eq!(out, ["ok", "err 2"], "the zig build did not enforce");
    // The plain build needs no libgcc_s either, and enforces there too.
    let plain = built_library();
    let needed = readelf("-d", &plain);
    assert!(!needed.contains("libgcc_s"), "plain build: {needed}");
    o.lib_dir = None;
    let out = sb.client(&o, &["ctx", "0", "alloc", "6291456"]);
    assert_eq!(out, ["ok", "err 2"], "the plain build did not enforce");
}

/// The Debian bullseye (glibc 2.31) root filesystem, built once with debootstrap and
/// cached (under a lock, renamed into place when complete) beside the containerd
/// suite's chroot: `$TESSERA_E2E_CACHE` or `/var/cache/tessera-e2e`. Runs never modify
/// it (they mount an overlay over it).
fn bullseye() -> Result<PathBuf, String> {
    const STAMP: &str = ".tessera-complete";
    let parent = std::env::var_os("TESSERA_E2E_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| "/var/cache/tessera-e2e".into());
    let root = parent.join("bullseye-minbase");
    if root.join(STAMP).is_file() {
        return Ok(root);
    }
    std::fs::create_dir_all(&parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let lock = std::fs::File::create(parent.join("bullseye-minbase.lock"))
        .map_err(|e| format!("lock: {e}"))?;
    // SAFETY: flock on a valid descriptor; released when `lock` is dropped.
    unsafe {
        use std::os::fd::AsRawFd;
        libc::flock(lock.as_raw_fd(), libc::LOCK_EX);
    }
    if root.join(STAMP).is_file() {
        return Ok(root);
    }
    let tmp = parent.join(format!("bullseye-minbase.tmp{}", std::process::id()));
    // Bullseye's LTS ended in August 2026: once deb.debian.org drops it, it is on
    // archive.debian.org (TESSERA_DEBIAN_MIRROR names another mirror).
    let mirrors: Vec<String> = match std::env::var("TESSERA_DEBIAN_MIRROR") {
        Ok(m) if !m.is_empty() => vec![m],
        _ => vec![
            "http://deb.debian.org/debian".into(),
            "http://archive.debian.org/debian".into(),
        ],
    };
    let t = std::time::Instant::now();
    let mut failures = Vec::new();
    for mirror in &mirrors {
        let out = Command::new("debootstrap")
            .args(["--variant=minbase", "bullseye"])
            .arg(&tmp)
            .arg(mirror)
            .output()
            .map_err(|e| format!("debootstrap: {e}"))?;
        if out.status.success() {
            break;
        }
        let _ = std::fs::remove_dir_all(&tmp);
        let err = String::from_utf8_lossy(&out.stderr);
        let log = String::from_utf8_lossy(&out.stdout);
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        failures.push(format!(
            "debootstrap --variant=minbase bullseye {mirror} failed:\n{err}\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    if failures.len() == mirrors.len() {
        return Err(failures.join("\n"));
    }
    if let Ok(rd) = std::fs::read_dir(tmp.join("var/cache/apt/archives")) {
        for e in rd.flatten() {
            if e.path().extension().is_some_and(|x| x == "deb") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    std::fs::write(tmp.join(STAMP), b"").map_err(|e| format!("stamp: {e}"))?;
    std::fs::rename(&tmp, &root).map_err(|e| format!("rename: {e}"))?;
    eprintln!(
        "old-glibc: built the bullseye root filesystem in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    Ok(root)
}

/// Kills a process that is still running `secs` after it started, unless dropped
/// first: a process in the chroot that hangs fails its test instead of holding CI.
struct Deadline(Arc<AtomicBool>);

impl Deadline {
    fn new(pid: u32, secs: u64) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(secs);
            while Instant::now() < end {
                if d.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if !d.load(Ordering::Relaxed) {
                // SAFETY: signalling the test's own child's process group (the child
                // leads it: `run` starts it with `process_group(0)`), so that a hung
                // grandchild holding its pipes goes too.
                unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
            }
        });
        Deadline(done)
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// `c`'s output, the process killed (and the output cut short) after 2 minutes.
fn output_within(mut c: Command) -> Output {
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let _deadline = Deadline::new(child.id(), 120);
    child.wait_with_output().expect("wait")
}

/// `zig cc` for glibc 2.28, so that the fake driver and the client run on bullseye:
/// a `zig` binary, else PyPI's `python3 -m ziglang` (the two cargo-zigbuild takes).
fn zig_cc(args: &[&str]) {
    let mut cmd = if have("zig", "version") {
        Command::new("zig")
    } else {
        let mut c = Command::new("python3");
        c.args(["-m", "ziglang"]);
        c
    };
    let out = cmd
        .args(["cc", "-target", "x86_64-linux-gnu.2.28"])
        .args(args)
        .output()
        .expect("zig cc");
    assert!(
        out.status.success(),
        "zig cc {args:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// On glibc 2.31, where `dlopen`/`dlvsym` live in libdl and `pthread_create` in
/// libpthread, the release library (which lists neither as NEEDED):
/// * loads into a process that has neither (`/bin/true`, `cat`): ld.so prints
///   nothing and the library is mapped;
/// * in a CUDA client (which has both, as every process using the real driver does)
///   finds them at first use: `dlvsym` for its `dlsym` trampoline (the client's
///   lookups work), the budget refuses an allocation over it, and the flusher thread
///   starts and is named (`pthread_create`, `pthread_attr_*`, `pthread_setname_np`).
#[test]
#[ignore = "needs root, cargo-zigbuild and debootstrap"]
fn the_release_library_works_on_glibc_2_31() {
    let Some(lib) = zig_library("old-glibc") else {
        return;
    };
    if !have("debootstrap", "--version") {
        let why = "old-glibc: debootstrap not on PATH (apt-get install debootstrap)";
        if in_ci() {
            panic!("{why}");
        }
        skip(why.into());
        return;
    }
    let rootfs = match bullseye() {
        Ok(r) => r,
        Err(e) if in_ci() => panic!("old-glibc: {e}"),
        Err(e) => {
            skip(format!("old-glibc: {e}"));
            return;
        }
    };
    let sb = Sandbox::new(
        &[(GPU0, 80 << 30)],
        vec![ClaimSpec::new("claim-a", &[(GPU0, 4 * MIB)])],
    );
    let d = sb.dir.path();
    let bins = d.join("old-bins");
    std::fs::create_dir_all(&bins).expect("mkdir");
    let (fake, client) = (bins.join("libcuda.so.1"), bins.join("cuda_client"));
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fakes");
    zig_cc(&[
        "-shared",
        "-fPIC",
        "-pthread",
        "-std=gnu11",
        "-O1",
        "-Wl,-Bsymbolic",
        "-Wl,-soname,libcuda.so.1",
        "-o",
        fake.to_str().expect("utf-8"),
        &format!("{src}/fake_cuda.c"),
    ]);
    zig_cc(&[
        "-std=gnu11",
        "-O1",
        "-o",
        client.to_str().expect("utf-8"),
        &format!("{src}/cuda_client.c"),
        "-ldl",
        "-pthread",
    ]);
    let needed = readelf("-d", &client);
    assert!(
        needed.contains("libpthread.so.0") && needed.contains("libdl.so.2"),
        "the client must load libdl and libpthread as on old glibc: {needed}"
    );
    // An overlay of the cached root filesystem, with the claim mounted as the plugin
    // mounts it (limits and control read-only), the libraries from a version directory
    // beside the claims (the library trusts only claims of its own run directory), the
    // fake and the client.
    let (dd, r) = (d.display(), d.join("root"));
    let rr = r.display();
    let mut script = format!(
        "set -e\nmkdir -p {dd}/up {dd}/work {rr}\n\
         mount -t overlay overlay -o lowerdir={rootfs},upperdir={dd}/up,workdir={dd}/work {rr}\n\
         mount -t proc proc {rr}/proc\n\
         mkdir -p {rr}/run/tessera/claims/claim-a {rr}/usr/local/tessera/lib {rr}/fake\n\
         mkdir -p {dd}/lib/v.old\ncp {lib} {front} {dd}/lib/v.old/\n\
         mount --bind {dd}/lib/v.old {rr}/usr/local/tessera/lib\n\
         cp {fake} {rr}/fake/\ncp {client} {rr}/cuda_client\n\
         touch {rr}/ledger\nmount --bind {dd}/ledger {rr}/ledger\n",
        rootfs = rootfs.display(),
        lib = lib.display(),
        front = lib.with_file_name(FRONT_FILE).display(),
        fake = fake.display(),
        client = client.display(),
    );
    for (f, ro) in [("limits", true), ("control", true), ("region", false)] {
        let t = format!("{rr}/run/tessera/claims/claim-a/{f}");
        script += &format!("touch {t}\nmount --bind {dd}/claims/claim-a/{f} {t}\n");
        if ro {
            script += &format!("mount -o remount,bind,ro {t}\n");
        }
    }
    script += &format!("echo {PRELOAD_PATH} > {rr}/etc/ld.so.preload\nexec chroot {rr} \"$@\"\n");
    let run = |args: &[&str]| {
        let mut c = Command::new("unshare");
        c.process_group(0)
            .args(["-m", "sh", "-c", &script, "sh"])
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("FAKE_CUDA_DEVICES", format!("{GPU0}:{}", 80u64 << 30))
            .env("FAKE_CUDA_LEDGER", "/ledger")
            .env("LD_LIBRARY_PATH", "/fake");
        c
    };
    let text = |o: &std::process::Output| {
        (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };

    // glibc 2.31 in there, and no libpthread in a plain process.
    let o = output_within(run(&["/usr/bin/ldd", "--version"]));
    let (out, err) = text(&o);
    assert!(out.contains("2.31"), "not glibc 2.31: {out}{err}");
    let o = output_within(run(&["/bin/cat", "/proc/self/maps"]));
    let (out, err) = text(&o);
    assert!(
        o.status.success() && err.is_empty(),
        "cat under the preload: {err}"
    );
    // The front is mapped; the interception library waits for a CUDA call.
    assert!(
        out.contains(FRONT_FILE) && !out.contains(CORE_FILE),
        "the front library alone should be mapped:\n{out}"
    );
    assert!(!out.contains("libpthread"), "cat has libpthread:\n{out}");
    let o = output_within(run(&["/bin/true"]));
    assert!(o.status.success() && o.stderr.is_empty(), "{:?}", text(&o));

    // A CUDA client: lookups through the trampoline, and the budget.
    for mode in ["gpa", "dlsym"] {
        let o = output_within(run(&[
            "/cuda_client",
            mode,
            "ctx",
            "0",
            "alloc",
            "6291456",
            "alloc",
            "2097152",
        ]));
        let (out, err) = text(&o);
        assert_eq!(
            lines(&o.stdout),
            ["ok", "err 2", "ok 0"],
            "{mode} on glibc 2.31:\n{out}{err}"
        );
    }
    // Launches start the flusher thread, named by the library.
    let mut child = Running::new(
        run(&[
            "/cuda_client",
            "gpa",
            "ctx",
            "0",
            "bench-launch",
            "1000",
            "hold",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("client"),
    );
    let watchdog = Deadline::new(child.id(), 120);
    // "ok" (ctx), "ok <wall> <cpu>" (the launches), "holding".
    let got = child.read_lines(3);
    // The new thread names itself: wait for the name (at once on an idle machine; given
    // up after 30 s).
    let pid = child.id();
    let threads = || -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
            .map(|c| c.trim().to_string())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut names = threads();
    while !names.iter().any(|n| n == "tessera-flush") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        names = threads();
    }
    child.kill_now();
    drop(watchdog);
    assert_eq!(got.last().map(String::as_str), Some("holding"), "{got:?}");
    assert!(
        names.iter().any(|n| n == "tessera-flush"),
        "no flusher thread on glibc 2.31: {names:?}"
    );
}
