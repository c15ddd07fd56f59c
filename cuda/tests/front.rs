//! The front library (`cuda/front`, built as `cuda/preload`): what `/etc/ld.so.preload` names. It exports the
//! interception library's hooks and `dlsym`, loads `libtessera_cuda.so` from its own
//! directory at the first CUDA call and never before, and fails closed when it cannot.
//! Every other suite runs through it too (the harness installs both, as the plugin
//! does); these cases pin what is particular to it.

use testkit::interpose as support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use support::*;

fn opts() -> RunOpts {
    RunOpts::default()
}

fn one_gpu(budget: u64) -> Sandbox {
    Sandbox::new(
        &[(GPU0, 80 << 30)],
        vec![ClaimSpec::new("claim-a", &[(GPU0, budget)])],
    )
}

/// The functions an object defines in its dynamic symbol table (`nm -D`).
fn exports(lib: &Path) -> BTreeSet<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only", "--format=posix"])
        .arg(lib)
        .output()
        .expect("nm (binutils)");
    assert!(out.status.success(), "nm {}", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (name, kind) = (f.next()?, f.next()?);
            (kind == "T").then(|| name.to_string())
        })
        .collect()
}

/// Runs the client through an allocation over the 4 MiB budget and holds it: its
/// result lines and its `/proc/<pid>/maps` while it holds.
fn over_budget_and_held(sb: &Sandbox, o: &RunOpts) -> (Vec<String>, String) {
    let (client, got) = sb.spawn_client(o, &["ctx", "0", "alloc", "6291456", "hold"], 3);
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", client.id())).expect("maps");
    drop(client);
    (got, maps)
}

/// The front exports exactly the interception library's hooks and `dlsym` (the list
/// both build from, `tessera_symbols::for_each_hook!`), and nothing ld.so must work for at
/// load: no library but libc, no relocation per hook, one check at load, nothing at
/// exit.
#[test]
#[ignore = "needs root (unshare -m)"]
fn the_front_exports_the_hooks_and_dlsym_and_needs_nothing_at_load() {
    if !require("front-exports") {
        return;
    }
    let core = built_library();
    let front = core.with_file_name(FRONT_FILE);
    let mut want = exports(&core);
    assert!(
        want.remove("tessera_front_attach"),
        "the interception library does not export tessera_front_attach"
    );
    assert!(
        want.contains("dlsym") && want.contains("cuMemAlloc_v2"),
        "{want:?}"
    );
    assert_eq!(
        exports(&front),
        want,
        "the front's exports differ from the hooks"
    );
    let dynamic = readelf("-d", &front);
    let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert_eq!(needed.len(), 1, "{needed:?}");
    assert!(needed[0].contains("[libc.so.6]"), "{needed:?}");
    // One function of its own runs at load (the check that nothing defining `dlsym`
    // or a hook was preloaded ahead of it), nothing at exit.
    for tag in ["(INIT)", "(FINI)", "(FINI_ARRAY)", "(PREINIT_ARRAY)"] {
        assert!(!dynamic.contains(tag), "the front has {tag}:\n{dynamic}");
    }
    let init_array: Vec<&str> = dynamic
        .lines()
        .filter(|l| l.contains("(INIT_ARRAYSZ)"))
        .collect();
    assert!(
        init_array.len() == 1 && init_array[0].trim_end().ends_with(" 8 (bytes)"),
        "one function at load:\n{dynamic}"
    );
    // The jump table is zero until the interception library is loaded; what ld.so
    // relocates is libc's functions and a few pointers in core's code, not the hooks.
    let relocs = readelf("-r", &front);
    let count = relocs.lines().filter(|l| l.contains("R_X86_64_")).count();
    assert!(
        count < want.len() / 2,
        "{count} relocations for {} exports:\n{relocs}",
        want.len()
    );
}

/// A process that never calls CUDA maps the front library only: the interception
/// library stays out, even in a process that looks up other names with `dlsym`.
#[test]
#[ignore = "needs root (unshare -m)"]
fn a_process_that_never_calls_cuda_does_not_load_the_interception_library() {
    if !require("front-lazy") {
        return;
    }
    let sb = one_gpu(4 * MIB);
    let out = sb
        .command(
            &opts(),
            Path::new("/bin/sh"),
            &[
                "-c",
                "grep -o 'libtessera_[a-z]*\\.so' /proc/self/maps | sort -u",
            ],
        )
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lines(&out.stdout), [FRONT_FILE]);
    // python3 looks up many names with dlsym as it starts (none of them hooked).
    let py = "import re; print(' '.join(sorted(set(re.findall(r'libtessera_[a-z]+\\.so', open('/proc/self/maps').read())))))";
    let out = sb
        .command(&opts(), Path::new("/usr/bin/python3"), &["-c", py])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lines(&out.stdout), [FRONT_FILE]);
}

/// A CUDA process has both once it made its first call, and is enforced.
#[test]
#[ignore = "needs root (unshare -m)"]
fn the_first_cuda_call_loads_the_interception_library() {
    if !require("front-load") {
        return;
    }
    let sb = one_gpu(4 * MIB);
    for mode in ["gpa", "dlsym"] {
        let o = RunOpts {
            mode: Some(mode),
            ..opts()
        };
        let (got, maps) = over_budget_and_held(&sb, &o);
        assert_eq!(got, ["ok", "err 2", "holding"], "{mode}");
        for (file, path) in [(FRONT_FILE, PRELOAD_PATH), (CORE_FILE, CORE_PATH)] {
            assert!(maps.contains(path), "{mode}: {file} not mapped:\n{maps}");
        }
    }
}

/// Without the interception library beside it, the front fails closed: every hook
/// returns CUDA_ERROR_UNKNOWN (999), a hooked name looked up by `dlsym` is that
/// failure too, nothing reaches the driver, and stderr says why.
#[test]
#[ignore = "needs root (unshare -m)"]
fn without_the_interception_library_cuda_fails_and_says_why() {
    if !require("front-fail-closed") {
        return;
    }
    let sb = one_gpu(4 * MIB);
    let dir = sb.dir.path().join("front-only");
    install_libs(&built_library(), &dir);
    std::fs::remove_file(dir.join(CORE_FILE)).expect("rm");
    let o = RunOpts {
        lib_dir: Some(dir),
        mode: Some("dlsym"),
        ..opts()
    };
    let out = sb.client_output(&o, &["ctx", "0", "alloc", "4096"]);
    assert_eq!(lines(&out.stdout), ["err 999", "err 999"]);
    let err = String::from_utf8_lossy(&out.stderr);
    let said: Vec<&str> = err.lines().filter(|l| l.starts_with("tessera: ")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains("cannot load libtessera_cuda.so")
            && said[0].contains("libtessera_cuda.so: cannot open shared object file"),
        "{err}"
    );
    assert_eq!(sb.ledger().peak[0], 0, "the driver was reached");
    // Through cuGetProcAddress the client cannot even start: the lookup fails.
    let out = sb.client_output(&RunOpts { mode: None, ..o }, &["ctx", "0"]);
    assert!(!out.status.success());
    assert!(lines(&out.stdout).is_empty());
}

/// Specs written before the front library existed mount the run dir's old
/// `ld.so.preload`, which names `libtessera_cuda.so` itself (beside a library directory
/// without a front): preloaded directly, it still enforces and still answers `dlsym`.
#[test]
#[ignore = "needs root (unshare -m)"]
fn the_interception_library_preloaded_directly_still_enforces() {
    if !require("front-legacy") {
        return;
    }
    let sb = one_gpu(4 * MIB);
    sb.set_preload(&format!("{CORE_PATH}\n"));
    for mode in ["gpa", "dlsym"] {
        let o = RunOpts {
            mode: Some(mode),
            ..opts()
        };
        let (got, maps) = over_budget_and_held(&sb, &o);
        assert_eq!(got, ["ok", "err 2", "holding"], "{mode}");
        assert!(maps.contains(CORE_PATH), "{mode}:\n{maps}");
        assert!(
            !maps.contains(PRELOAD_PATH),
            "{mode}: the front was loaded:\n{maps}"
        );
    }
    // A tenant's LD_PRELOAD of the library, ahead of the front that ld.so.preload
    // names: the library finds the front's stubs by itself and never takes them for
    // the driver (they would jump back into it).
    sb.set_preload(&format!("{PRELOAD_PATH}\n"));
    for mode in ["gpa", "dlsym"] {
        let o = RunOpts {
            mode: Some(mode),
            env: vec![("LD_PRELOAD".into(), CORE_PATH.into())],
            ..opts()
        };
        let out = sb.client(&o, &["ctx", "0", "alloc", "6291456", "alloc", "2097152"]);
        assert_eq!(out, ["ok", "err 2", "ok 0"], "{mode} with LD_PRELOAD");
    }
}

/// A program linked against `libcuda.so.1` (no `dlsym`, no `cuGetProcAddress`): its
/// calls bind to the front's stubs, and the interception library finds the driver's
/// functions behind it, never the stubs (which would jump back: endless recursion).
/// Through the front alone, and with a tenant's `LD_PRELOAD` of the library ahead of
/// the front (where the library finds the front by itself: no attach).
#[test]
#[ignore = "needs root (unshare -m)"]
fn a_program_linked_against_libcuda_is_enforced_through_the_front() {
    if !require("front-linked") {
        return;
    }
    let sb = one_gpu(4 * MIB);
    let bin = linked_program(&sb);
    for env in [
        vec![],
        vec![("LD_PRELOAD".to_string(), CORE_PATH.to_string())],
    ] {
        let o = RunOpts {
            env: env.clone(),
            ..opts()
        };
        let out = sb.command(&o, &bin, &[]).output().expect("linked");
        assert!(
            out.status.success(),
            "{env:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(lines(&out.stdout), ["ok", "err 2", "ok"], "{env:?}");
    }
}
