//! Budgets across processes, claims and tenants: shared budgets across PID
//! namespaces, dead processes, forged files, merged claims and environment tricks.
//! Each case runs in its own mount namespace; verdicts come from the fake driver's
//! ledger.

use testkit::interpose as support;

use std::time::{Duration, Instant};

use support::*;

const OOM: &str = "err 2";

fn one_gpu(budget: u64) -> Sandbox {
    Sandbox::new(
        &[(GPU0, 80 << 30)],
        vec![ClaimSpec::new("claim-a", &[(GPU0, budget)])],
    )
}

/// Every lookup of tests/data/gpa-lookups.tsv, made through the preloaded library
/// against the fake driver: a variant the library intercepts comes back as the
/// library's hook of exactly that variant; every other answer is the driver's own
/// pointer (or NULL), unchanged. The fake's own table must agree with the expected
/// variant wherever it implements the name, which checks the data from both sides.
#[test]
#[ignore = "needs root (unshare -m)"]
fn recorded_lookups_get_the_right_variant_through_the_library() {
    if !require("lookups") {
        return;
    }
    let sb = one_gpu(10 * MIB);
    let tsv = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/gpa-lookups.tsv");
    let out = sb.client(&opts(), &["lookup", tsv]);
    assert!(out.len() > 1900, "only {} rows", out.len());
    let hooks = [
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
        "cuInit",
        "cuMemAlloc_v2",
        "cuMemAllocPitch_v2",
        "cuMemAllocManaged",
        "cuMemFree_v2",
        "cuMemAllocAsync",
        "cuMemAllocAsync_ptsz",
        "cuMemAllocFromPoolAsync",
        "cuMemAllocFromPoolAsync_ptsz",
        "cuMemFreeAsync",
        "cuMemFreeAsync_ptsz",
        "cuMemPoolTrimTo",
        "cuMemPoolDestroy",
        "cuMemCreate",
        "cuMemRelease",
        "cuMemMap",
        "cuMemUnmap",
        "cuCtxCreate_v2",
        "cuCtxCreate_v3",
        "cuCtxCreate_v4",
        "cuCtxDestroy_v2",
        "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease_v2",
        "cuDevicePrimaryCtxReset_v2",
        "cuArrayCreate_v2",
        "cuArray3DCreate_v2",
        "cuArrayDestroy",
        "cuMipmappedArrayCreate",
        "cuMipmappedArrayDestroy",
        "cuCtxSetLimit",
        "cuGraphAddMemAllocNode",
        "cuGraphInstantiate",
        "cuGraphInstantiate_v2",
        "cuGraphInstantiateWithFlags",
        "cuGraphInstantiateWithParams",
        "cuGraphInstantiateWithParams_ptsz",
        "cuGraphUpload",
        "cuGraphUpload_ptsz",
        "cuGraphLaunch",
        "cuGraphLaunch_ptsz",
        "cuGraphExecDestroy",
        "cuDeviceGraphMemTrim",
        "cuLaunchKernel",
        "cuLaunchKernel_ptsz",
        "cuLaunchKernelEx",
        "cuLaunchKernelEx_ptsz",
        "cuLaunchCooperativeKernel",
        "cuLaunchCooperativeKernel_ptsz",
        "cuLaunchCooperativeKernelMultiDevice",
        "cuMemGetInfo_v2",
        "cuDeviceTotalMem_v2",
    ];
    let beyond_table = ["cuMemRetainAllocationHandle"];
    let (mut hooked, mut passed) = (0, 0);
    for row in &out {
        let f: Vec<&str> = row.split('\t').collect();
        assert_eq!(f.len(), 7, "{row}");
        let (ver, expected, got, own) = (f[2].parse::<i32>().unwrap(), f[4], f[5], f[6]);
        if ver > 13050 {
            assert_eq!(
                (got, own),
                ("null", "null"),
                "above the driver's version: {row}"
            );
            continue;
        }
        if own != "null" && expected != "driver" {
            assert_eq!(own, expected, "the fake disagrees with the table: {row}");
        }
        // A hooked entry point outside the B4.1 table ("driver" there) has one
        // variant, handed out under the name looked up.
        let hooked_as = if hooks.contains(&expected) {
            Some(expected)
        } else if expected == "driver" && beyond_table.contains(&f[1]) {
            Some(f[1])
        } else {
            None
        };
        if let (Some(h), false) = (hooked_as, own == "null") {
            assert_eq!(got, format!("hook:{h}"), "{row}");
            hooked += 1;
        } else {
            let want = if own == "null" {
                "null".to_string()
            } else {
                format!("driver:{own}")
            };
            assert_eq!(got, want, "passed through unchanged: {row}");
            passed += 1;
        }
    }
    assert!(
        hooked > 50 && passed > 1000,
        "{hooked} hooked, {passed} passed"
    );
}

/// Two processes in separate PID namespaces (each with its own /proc, so both may be
/// PID 1) charge one region and share one budget.
#[test]
#[ignore = "needs root (unshare -m)"]
fn processes_in_separate_pid_namespaces_share_one_budget() {
    if !require("pidns") {
        return;
    }
    let sb = one_gpu(10 * MIB);
    let o = RunOpts {
        pidns: true,
        ..opts()
    };
    let (a, got) = sb.spawn_client(&o, &["ctx", "0", "alloc", "6291456", "hold"], 3);
    assert_eq!(got, ["ok", "ok 0", "holding"]);
    let out = sb.client(&o, &["ctx", "0", "alloc", "6291456", "alloc", "4194304"]);
    drop(a);
    assert_eq!(out, ["ok", OOM, "ok 0"]);
    assert!(sb.ledger().peak[0] <= 10 * MIB);
}

/// Claim files a tenant creates in a writable place (here: plain files in the
/// container's /run) count for nothing, even with a larger budget for the same GPU.
#[test]
#[ignore = "needs root (unshare -m)"]
fn forged_limits_in_a_writable_location_change_nothing() {
    if !require("forged") {
        return;
    }
    let forged = Sandbox::new(
        &[(GPU0, 80 << 30)],
        vec![ClaimSpec::new("forged", &[(GPU0, 1 << 30)])],
    );
    let sb = one_gpu(4 * MIB);
    let src = forged.dir.path().join("claims/forged");
    let o = RunOpts {
        extra_script: format!(
            "mkdir -p /run/tessera/claims/forged\ncp {0}/limits {0}/control {0}/region /run/tessera/claims/forged/\n\
             cp {0}/limits /run/tessera/claims/zz-limits\n",
            src.display()
        ),
        ..opts()
    };
    let out = sb.client(&o, &["ctx", "0", "alloc", "6291456", "meminfo"]);
    assert_eq!(
        out,
        [
            "ok".to_string(),
            OOM.to_string(),
            format!("ok {} {}", 4 * MIB, 4 * MIB)
        ]
    );
    // Writing the real, read-only limits fails.
    let o = RunOpts {
        extra_script: "echo 'gpu x 1' >> /run/tessera/claims/claim-a/limits && exit 9 || true\n"
            .into(),
        ..opts()
    };
    assert_eq!(
        sb.client(&o, &["ctx", "0", "alloc", "6291456"]),
        ["ok", OOM]
    );
}

/// A forged claim (1 GiB of GPU0) in a sandbox of its own: its files lie outside the
/// run directory of the sandbox that runs the client.
fn forged_claim() -> Sandbox {
    Sandbox::new(
        &[(GPU0, 80 << 30)],
        vec![ClaimSpec::new("forged", &[(GPU0, 1 << 30)])],
    )
}

/// Renaming any directory above the claim mounts (which needs no privilege: the
/// mounts move along) leaves the budget as it was: claims are found by what is
/// mounted, not where it now appears.
#[test]
#[ignore = "needs root (unshare -m)"]
fn renaming_directories_above_the_claim_mounts_changes_nothing() {
    if !require("rename") {
        return;
    }
    for script in [
        "mv /run/tessera/claims /run/tessera/moved\n",
        "mv /run/tessera/claims/claim-a /run/tessera/claims/zz\n",
        "mkdir -p /run/elsewhere && mv /run/tessera /run/elsewhere/t\n",
    ] {
        let sb = one_gpu(4 * MIB);
        let o = RunOpts {
            extra_script: script.into(),
            ..opts()
        };
        let out = sb.client(
            &o,
            &[
                "ctx", "0", "alloc", "6291456", "alloc", "4194304", "meminfo",
            ],
        );
        assert_eq!(
            out,
            [
                "ok".to_string(),
                OOM.to_string(),
                "ok 0".to_string(),
                format!("ok 0 {}", 4 * MIB)
            ],
            "{script}"
        );
        assert!(sb.ledger().peak[0] <= 4 * MIB, "{script}");
    }
}

/// A claim's files mounted from outside the plugin's run directory (what a tenant's
/// volume `subPath` mount produces) count for nothing: no budget is added.
#[test]
#[ignore = "needs root (unshare -m)"]
fn claim_files_mounted_from_elsewhere_add_no_budget() {
    if !require("subpath") {
        return;
    }
    let forged = forged_claim();
    let src = forged.dir.path().join("claims/forged");
    let mut script = String::from("mkdir -p /run/tessera/claims/forged\n");
    for f in ["limits", "control", "region"] {
        script += &format!(
            "touch /run/tessera/claims/forged/{f}\nmount --bind {}/{f} /run/tessera/claims/forged/{f}\n",
            src.display()
        );
        if f != "region" {
            script += &format!("mount -o remount,bind,ro /run/tessera/claims/forged/{f}\n");
        }
    }
    let sb = one_gpu(4 * MIB);
    let o = RunOpts {
        extra_script: script,
        ..opts()
    };
    let out = sb.client(&o, &["ctx", "0", "alloc", "6291456", "meminfo"]);
    assert_eq!(
        out,
        [
            "ok".to_string(),
            OOM.to_string(),
            format!("ok {} {}", 4 * MIB, 4 * MIB)
        ]
    );
    let r = forged.region("forged");
    assert_eq!(
        (r.gpus[0].used, r.gpus[0].peak, r.slots.len()),
        (0, 0, 0),
        "the forged region was never touched"
    );
}

/// A volume mounted over the claims' directory hides the real files behind files of
/// the tenant's choosing; the library opens each claim file through its own mount,
/// finds something else there, and refuses every allocation (201:
/// `CUDA_ERROR_INVALID_CONTEXT`, once the context itself was refused).
#[test]
#[ignore = "needs root (unshare -m)"]
fn a_volume_over_the_claims_fails_closed() {
    if !require("overmount") {
        return;
    }
    let forged = forged_claim();
    let src = forged.dir.path().join("claims/forged");
    let sb = one_gpu(4 * MIB);
    let o = RunOpts {
        extra_script: format!(
            "mount -t tmpfs tmpfs /run/tessera\nmkdir -p /run/tessera/claims/claim-a\n\
             cp {0}/control {0}/region /run/tessera/claims/claim-a/\n\
             sed s/forged/claim-a/ {0}/limits > /run/tessera/claims/claim-a/limits\n",
            src.display()
        ),
        ..opts()
    };
    let out = sb.client_output(&o, &["ctx", "0", "alloc", "1", "meminfo"]);
    // Even the context's charge is refused (so nothing after it has a context).
    assert_eq!(lines(&out.stdout), [OOM, "err 201", "err 201"], "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not the mounted claim file"), "{err}");
    assert_eq!(sb.ledger().peak[0], 0);
}

/// A copy of the library loaded from anywhere but the plugin's run directory (a
/// tenant's `LD_PRELOAD` of one, ahead of the front) anchors no claim and refuses
/// every allocation rather than run unbudgeted.
#[test]
#[ignore = "needs root (unshare -m)"]
fn a_copy_of_the_library_from_elsewhere_fails_closed() {
    if !require("copy") {
        return;
    }
    let art = artifacts();
    let copy = art.lib_dir.join("libtessera_cuda.so");
    for mode in ["gpa", "dlsym"] {
        let sb = one_gpu(4 * MIB);
        let o = RunOpts {
            env: vec![("LD_PRELOAD".into(), copy.display().to_string())],
            mode: Some(mode),
            ..opts()
        };
        let out = sb.client_output(&o, &["ctx", "0", "alloc", "1", "alloc", "1"]);
        assert_eq!(
            lines(&out.stdout),
            [OOM, "err 201", "err 201"],
            "{mode}: {out:?}"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("was not installed by the plugin"),
            "{mode}: {err}"
        );
        assert_eq!(sb.ledger().peak[0], 0, "{mode}");
    }
}

/// A library preloaded ahead of Tessera's front that defines `dlsym` (glibc's own
/// libc, since 2.34) or the driver's entry points (the driver itself) would answer
/// the program's lookups first and hand it the bare driver: the front stops such a
/// process before `main`, with exit status 126 and one line saying which library and
/// why. Through both lookup paths of the client.
#[test]
#[ignore = "needs root (unshare -m)"]
fn an_interposer_preloaded_ahead_of_tessera_stops_the_process() {
    if !require("interposer") {
        return;
    }
    for (preload, defines, no_shims) in [
        ("libc.so.6", "defines dlsym", false),
        // The driver by its real file (its soname is Tessera's shim's now), and the
        // driver at its soname in the layout before the shims.
        (REAL_CUDA, "defines cu", false),
        ("libcuda.so.1", "defines cu", true),
        ("libm.so.6:libc.so.6", "defines dlsym", false),
    ] {
        for mode in ["gpa", "dlsym"] {
            let sb = one_gpu(4 * MIB);
            let o = RunOpts {
                env: vec![("LD_PRELOAD".into(), preload.into())],
                mode: Some(mode),
                no_shims,
                ..opts()
            };
            let out = sb.client_output(&o, &["ctx", "0", "alloc", "6291456"]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(126), "{preload} {mode}: {out:?}");
            assert!(lines(&out.stdout).is_empty(), "{preload} {mode}: {out:?}");
            assert!(
                err.contains(defines) && err.contains("remove it from LD_PRELOAD"),
                "{preload} {mode}: {err}"
            );
            assert_eq!(sb.ledger().peak[0], 0, "{preload} {mode}");
        }
    }
    // So does a process that never touches CUDA: the front cannot know it will not.
    let sb = one_gpu(4 * MIB);
    let o = RunOpts {
        env: vec![("LD_PRELOAD".into(), "libc.so.6".into())],
        ..opts()
    };
    let out = sb
        .command(&o, std::path::Path::new("/bin/true"), &[])
        .output()
        .expect("true");
    assert_eq!(out.status.code(), Some(126), "{out:?}");
}

/// `libcuda.so.1` preloaded is Tessera's soname shim, the front's twin: allowed ahead
/// of the front, and the process is enforced.
#[test]
#[ignore = "needs root (unshare -m)"]
fn the_soname_shim_preloaded_ahead_of_the_front_is_enforced() {
    if !require("shim-preloaded") {
        return;
    }
    for mode in ["gpa", "dlsym"] {
        let sb = one_gpu(4 * MIB);
        let o = RunOpts {
            env: vec![("LD_PRELOAD".into(), "libcuda.so.1".into())],
            mode: Some(mode),
            ..opts()
        };
        let r = sb.client(&o, &["ctx", "0", "alloc", "6291456", "alloc", "2097152"]);
        assert_eq!(r[1..], [OOM.to_string(), r[2].clone()], "{mode}: {r:?}");
        assert!(r[0] == "ok" && r[2].starts_with("ok "), "{mode}: {r:?}");
        assert_eq!(sb.ledger().peak[0], 2 * MIB, "{mode}");
    }
}

/// What a tenant gets when ld.so skips `/etc/ld.so.preload` (renaming `/etc` does
/// that: the file is gone, so ld.so loads no front): the process finds the driver by
/// its soname, which is Tessera's shim, the real driver behind it.
fn without_the_preload() -> RunOpts {
    RunOpts {
        tenant_script: "umount /etc/ld.so.preload\nrm /etc/ld.so.preload".into(),
        ..opts()
    }
}

/// With `/etc/ld.so.preload` skipped, a client that `dlopen`s `libcuda.so.1` and
/// looks its functions up (`dlsym` by exact name, as cudart and PyTorch do, or
/// `cuGetProcAddress` as cuda-bindings does, per-thread variants too) is enforced: the
/// handle's lookups find the hooked names in the shim and every other name
/// (`cuCtxSetCurrent`, `cuDeviceGet`) in the real driver behind it. Before the shims
/// this reached the bare driver.
#[test]
#[ignore = "needs root (unshare -m)"]
fn with_the_preload_skipped_the_soname_shim_enforces_dlopen_clients() {
    if !require("no-preload-dlopen") {
        return;
    }
    for mode in ["dlsym", "gpa", "gpa-ptds"] {
        let sb = one_gpu(4 * MIB);
        let o = RunOpts {
            mode: Some(mode),
            ..without_the_preload()
        };
        let out = sb.client_output(&o, &["ctx", "0", "alloc", "6291456", "alloc", "2097152"]);
        let r = lines(&out.stdout);
        assert_eq!(r.len(), 3, "{mode}: {out:?}");
        assert_eq!(r[0], "ok", "{mode}: forwarded functions work: {out:?}");
        assert_eq!(r[1], OOM, "{mode}: {r:?}");
        assert!(r[2].starts_with("ok "), "{mode}: {r:?}");
        assert_eq!(sb.ledger().peak[0], 2 * MIB, "{mode}");
    }
    // Control: the layout before the shims reaches the bare driver this way.
    let sb = one_gpu(4 * MIB);
    let o = RunOpts {
        mode: Some("dlsym"),
        no_shims: true,
        ..without_the_preload()
    };
    let r = sb.client(&o, &["ctx", "0", "alloc", "6291456"]);
    assert!(
        r[1].starts_with("ok "),
        "the preload was not skipped: {r:?}"
    );
}

/// With `/etc/ld.so.preload` skipped, a program linked against `libcuda.so.1` binds
/// to the shim's stubs (first in the global scope), the rest to the real driver.
#[test]
#[ignore = "needs root (unshare -m)"]
fn with_the_preload_skipped_a_program_linked_against_libcuda_is_enforced() {
    if !require("no-preload-linked") {
        return;
    }
    let sb = one_gpu(4 * MIB);
    let bin = linked_program(&sb);
    let out = sb
        .command(&without_the_preload(), &bin, &[])
        .output()
        .expect("linked");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(lines(&out.stdout), ["ok", OOM, "ok"], "{out:?}");
    assert_eq!(sb.ledger().peak[0], 2 * MIB);
}

/// The tenant's environment on top of a skipped preload: `LD_LIBRARY_PATH` naming the
/// real files' directory finds no soname there; `LD_PRELOAD=libc.so.6` (no front to
/// stop it) puts glibc's `dlsym` first, which still finds the shim first on the
/// handle. Each keeps the limit, by both lookup paths.
#[test]
#[ignore = "needs root (unshare -m)"]
fn with_the_preload_skipped_environment_tricks_keep_the_limit() {
    if !require("no-preload-env") {
        return;
    }
    let ld_path = format!(
        "/usr/local/tessera/driver:{}",
        artifacts().fake_dir.display()
    );
    for env in [
        vec![("LD_LIBRARY_PATH".to_string(), ld_path)],
        vec![("LD_PRELOAD".to_string(), "libc.so.6".to_string())],
    ] {
        for mode in ["dlsym", "gpa"] {
            let sb = one_gpu(4 * MIB);
            let o = RunOpts {
                env: env.clone(),
                mode: Some(mode),
                ..without_the_preload()
            };
            let r = sb.client(&o, &["ctx", "0", "alloc", "6291456", "alloc", "2097152"]);
            assert_eq!(
                r[..2],
                ["ok".to_string(), OOM.to_string()],
                "{env:?} {mode}: {r:?}"
            );
            assert_eq!(sb.ledger().peak[0], 2 * MIB, "{env:?} {mode}");
        }
        let sb = one_gpu(4 * MIB);
        let bin = linked_program(&sb);
        let o = RunOpts {
            env: env.clone(),
            ..without_the_preload()
        };
        let out = sb.command(&o, &bin, &[]).output().expect("linked");
        assert_eq!(lines(&out.stdout), ["ok", OOM, "ok"], "{env:?}: {out:?}");
    }
}

/// A container holding only whole-GPU claims gets the same shims at the driver's
/// sonames (section 9 of docs/design.md: every spec mounts them) and no
/// `ld.so.preload`: the shim loads the interception library, which finds no claim and
/// forwards, by every lookup path and when linked.
#[test]
#[ignore = "needs root (unshare -m)"]
fn without_a_claim_the_soname_shim_forwards_unrestricted() {
    if !require("shim-no-claim") {
        return;
    }
    for mode in ["dlsym", "gpa"] {
        let sb = Sandbox::new(&[(GPU0, 80 << 30)], vec![]);
        let o = RunOpts {
            mode: Some(mode),
            ..without_the_preload()
        };
        let r = sb.client(&o, &["ctx", "0", "alloc", "6291456", "meminfo"]);
        assert!(r[1].starts_with("ok "), "{mode}: {r:?}");
        assert_eq!(r[2].split(' ').nth(2), Some("85899345920"), "{mode}: {r:?}");
    }
    let sb = Sandbox::new(&[(GPU0, 80 << 30)], vec![]);
    let bin = linked_program(&sb);
    let out = sb
        .command(&without_the_preload(), &bin, &[])
        .output()
        .expect("linked");
    assert_eq!(lines(&out.stdout), ["ok", "ok", "ok"], "{out:?}");
}

/// Renaming `/usr/local/tessera` takes the front, the interception library and the
/// real driver files away from their paths: ld.so skips the preload (a warning), and
/// the shim cannot load (its real file is missing: a linked program cannot start,
/// `dlopen` fails). Never the bare driver.
#[test]
#[ignore = "needs root (unshare -m)"]
fn renaming_the_tessera_directories_fails_closed() {
    if !require("rename-tessera") {
        return;
    }
    // The mounts themselves cannot be renamed (EBUSY); the directories above them can.
    for moved in ["mv /usr/local/tessera /usr/local/elsewhere"] {
        for mode in ["dlsym", "gpa"] {
            let sb = one_gpu(4 * MIB);
            let o = RunOpts {
                tenant_script: moved.into(),
                mode: Some(mode),
                ..opts()
            };
            let out = sb.client_output(&o, &["ctx", "0", "alloc", "2097152"]);
            let r = lines(&out.stdout);
            assert!(
                r.is_empty() || !r[0].starts_with("ok"),
                "{moved} {mode}: CUDA must fail: {out:?}"
            );
            assert_eq!(sb.ledger().peak[0], 0, "{moved} {mode}: {out:?}");
        }
        let sb = one_gpu(4 * MIB);
        let bin = linked_program(&sb);
        let o = RunOpts {
            tenant_script: moved.into(),
            ..opts()
        };
        let out = sb.command(&o, &bin, &[]).output().expect("linked");
        let r = lines(&out.stdout);
        assert!(
            r.is_empty() || !r[0].starts_with("ok"),
            "{moved} linked: CUDA must fail: {out:?}"
        );
        assert_eq!(sb.ledger().peak[0], 0, "{moved} linked: {out:?}");
    }
}

/// A process that never calls CUDA opens no region and takes no slot; a CUDA
/// process does take one (flagged "no CUDA call yet" until it allocates).
#[test]
#[ignore = "needs root (unshare -m)"]
fn a_non_cuda_process_takes_no_slot() {
    if !require("non-cuda") {
        return;
    }
    let sb = one_gpu(4 * MIB);
    let out = sb
        .command(
            &opts(),
            std::path::Path::new("/bin/sh"),
            &["-c", "cat /etc/ld.so.preload; ls / >/dev/null"],
        )
        .output()
        .expect("sh");
    assert!(out.status.success());
    assert_eq!(lines(&out.stdout), [PRELOAD_PATH]);
    assert!(sb.region("claim-a").slots.is_empty(), "a slot was taken");
    let (a, got) = sb.spawn_client(&opts(), &["ctx", "0", "hold"], 2);
    assert_eq!(got, ["ok", "holding"]);
    let slots = sb.region("claim-a").slots;
    drop(a);
    assert_eq!(slots.len(), 1);
    assert_eq!(slots[0].flags, tessera_abi::region::FLAG_NO_CUDA);
}

/// 16 processes allocating and freeing at random for 10 s never hold more than the
/// budget at once, by the driver's ledger.
#[test]
#[ignore = "needs root (unshare -m)"]
fn sixteen_processes_at_random_never_exceed_the_budget() {
    if !require("stress") {
        return;
    }
    stress(64 * MIB, 10, "8388608");
}

/// The same with a budget large enough for per-process pools (1 GiB: 4 MiB ahead
/// each), with allocations of up to 64 MiB, half of them small enough for the pools:
/// pools taken back from live processes and refilled never let the processes exceed
/// the budget.
#[test]
#[ignore = "needs root (unshare -m)"]
fn sixteen_processes_with_pools_never_exceed_the_budget() {
    if !require("stress-pools") {
        return;
    }
    assert!(tessera_abi::region::pool_size(1 << 30) > 0);
    stress(1 << 30, 6, "67108864");
}

/// 16 clients running `random <secs> <max>` on one claim's GPU: judged by the ledger.
fn stress(budget: u64, secs: u32, max: &str) {
    let sb = one_gpu(budget);
    let secs = secs.to_string();
    let kids: Vec<_> = (0..16)
        .map(|_| {
            sb.command(
                &opts(),
                &artifacts().client,
                &["gpa", "ctx", "0", "random", &secs, max],
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn")
        })
        .collect();
    let (mut allocs, mut refused) = (0u64, 0u64);
    for k in kids {
        let out = k.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "a client failed: {}; stdout: {:?}; stderr: {:?}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let l = lines(&out.stdout);
        let f: Vec<u64> = l[1]
            .split(' ')
            .skip(1)
            .map(|x| x.parse().unwrap())
            .collect();
        allocs += f[0];
        refused += f[1];
    }
    let l = sb.ledger();
    eprintln!(
        "16 processes: {allocs} allocations, {refused} refusals, ledger peak {} of {budget}",
        l.peak[0]
    );
    assert!(
        l.peak[0] <= budget,
        "ledger peak {} > budget {budget}",
        l.peak[0]
    );
    assert!(
        allocs > 1000 && refused > 0,
        "the budget was never contended"
    );
    assert_eq!(l.used[0], 0);
    assert_eq!(sb.region("claim-a").gpus[0].used, 0);
}

/// A process SIGKILLed while it holds an allocation and a pool (a 1 GiB budget: 4 MiB
/// ahead) gives all of it back to the next process, which can allocate the whole
/// budget at once (its first allocation reclaims the dead slot: no timer is involved).
/// The time from the kill to that allocation, a sandboxed process's start included, is
/// printed (well under a second on an idle machine); the test bounds it at 10 s.
#[test]
#[ignore = "needs root (unshare -m)"]
fn sigkill_with_a_pool_held_gives_the_budget_to_the_next_process() {
    if !require("sigkill-pool") {
        return;
    }
    let budget: u64 = 1 << 30;
    let sb = one_gpu(budget);
    let (mut a, got) = sb.spawn_client(&opts(), &["ctx", "0", "alloc", "1048576", "hold"], 3);
    assert_eq!(got, ["ok", "ok 0", "holding"]);
    let r = sb.region("claim-a");
    assert_eq!(
        (r.gpus[0].used, r.gpus[0].pooled),
        (2 * MIB, tessera_abi::region::pool_size(budget))
    );
    a.kill_now();
    let killed = Instant::now();
    let out = sb.client(&opts(), &["ctx", "0", "alloc", &budget.to_string()]);
    let took = killed.elapsed();
    println!("the next process allocated the whole budget {took:?} after the kill");
    assert_eq!(
        out,
        ["ok", "ok 0"],
        "the dead process's charges were not returned"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

/// A process SIGKILLed in the middle of an allocation (the driver holds the memory,
/// the region holds the reservation) gives the budget back to the next process's
/// allocation (timed and bounded as above).
#[test]
#[ignore = "needs root (unshare -m)"]
fn sigkill_mid_allocation_gives_the_budget_to_the_next_process() {
    if !require("sigkill") {
        return;
    }
    let sb = one_gpu(10 * MIB);
    let slow = RunOpts {
        env: vec![("FAKE_CUDA_ALLOC_DELAY_MS".into(), "60000".into())],
        ..opts()
    };
    let (mut a, got) = sb.spawn_client(&slow, &["ctx", "0", "alloc", "10485760"], 1);
    assert_eq!(got, ["ok"]);
    let t = Instant::now();
    while sb.ledger().live[0] < 10 * MIB {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the allocation never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(sb.region("claim-a").gpus[0].used, 10 * MIB);
    a.kill_now();
    let killed = Instant::now();
    let out = sb.client(&opts(), &["ctx", "0", "alloc", "10485760"]);
    let took = killed.elapsed();
    println!("the next process allocated the budget {took:?} after the kill");
    assert_eq!(
        out,
        ["ok", "ok 0"],
        "the dead process's reservation was not returned"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

/// Two claims budgeting the same GPU merge by UUID (charged in claim-UID order, the
/// first with room for the whole allocation); a GPU no claim budgets stays free, and
/// the budget follows the UUID when CUDA_VISIBLE_DEVICES reorders ordinals.
#[test]
#[ignore = "needs root (unshare -m)"]
fn two_claims_merge_by_uuid_and_an_unbudgeted_gpu_stays_free() {
    if !require("merge") {
        return;
    }
    let sb = Sandbox::new(
        &[(GPU0, 80 << 30), (GPU1, 80 << 30)],
        vec![
            ClaimSpec::new("claim-b", &[(GPU0, 6 * MIB)]),
            ClaimSpec::new("claim-a", &[(GPU0, 4 * MIB)]),
        ],
    );
    let out = sb.client(
        &opts(),
        &[
            "ctx",
            "0",
            "meminfo",
            "alloc",
            "6291456",
            "alloc",
            "4194304",
            "alloc",
            "1",
            "ctx",
            "1",
            "alloc",
            "1073741824",
        ],
    );
    assert_eq!(
        out,
        [
            "ok".to_string(),
            format!("ok {} {}", 10 * MIB, 10 * MIB),
            "ok 0".to_string(),
            "ok 1".to_string(),
            OOM.to_string(),
            "ok".to_string(),
            "ok 2".to_string(),
        ]
    );
    // 6 MiB did not fit claim-a (first by UID), so it went to claim-b; 4 MiB to claim-a.
    assert_eq!(sb.region("claim-a").gpus[0].used, 4 * MIB);
    assert_eq!(sb.region("claim-b").gpus[0].used, 6 * MIB);
    assert_eq!(sb.ledger().peak[1], 1 << 30);

    let sb = Sandbox::new(
        &[(GPU0, 80 << 30), (GPU1, 80 << 30)],
        vec![ClaimSpec::new("claim-a", &[(GPU0, 4 * MIB)])],
    );
    let o = RunOpts {
        env: vec![("CUDA_VISIBLE_DEVICES".into(), "1,0".into())],
        ..opts()
    };
    let out = sb.client(
        &o,
        &[
            "ctx", "0", "alloc", "8388608", "ctx", "1", "alloc", "8388608",
        ],
    );
    assert_eq!(out, ["ok", "ok 0", "ok", OOM]);
}

/// A 64 MiB claim with scrubOnFree on or off, and a fake driver that checks whether
/// each free finds the memory zeroed.
fn scrub_checked(scrub: bool) -> (Sandbox, RunOpts) {
    let mut c = ClaimSpec::new("claim-a", &[(GPU0, 64 * MIB)]);
    c.scrub = scrub;
    let sb = Sandbox::new(&[(GPU0, 80 << 30)], vec![c]);
    let o = RunOpts {
        env: vec![("FAKE_CUDA_CHECK_SCRUB".into(), "1".into())],
        ..opts()
    };
    (sb, o)
}

/// With scrubOnFree the freed memory is zero when the driver gets it back, on every
/// path the library scrubs: linear memory; a VMM handle unmapped then released (zeroed
/// through a temporary mapping), and one released while mapped and written again
/// before its last unmap (zeroed through that mapping); a stream-ordered free (zeroed
/// on its stream first). Without it the tenant's bytes are still there (which shows
/// the fake's check works).
#[test]
#[ignore = "needs root (unshare -m)"]
fn scrub_on_free_zeroes_freed_memory() {
    if !require("scrub") {
        return;
    }
    for scrub in [true, false] {
        let (sb, o) = scrub_checked(scrub);
        let out = sb.client(
            &o,
            &[
                "ctx",
                "0", // linear
                "alloc",
                "1048576",
                "fill",
                "0",
                "1048576",
                "free",
                "0", // VMM: unmap, release
                "vmm",
                "2097152",
                "vreserve",
                "2097152",
                "vmap",
                "2",
                "1",
                "2097152",
                "fill",
                "2",
                "2097152",
                "vunmap",
                "2",
                "2097152",
                "release",
                "1",
                // VMM: release while mapped, write, unmap
                "vmm",
                "2097152",
                "vmap",
                "2",
                "3",
                "2097152",
                "fill",
                "2",
                "2097152",
                "release",
                "3",
                "fill",
                "2",
                "2097152",
                "vunmap",
                "2",
                "2097152", // stream-ordered
                "async",
                "1048576",
                "fill",
                "4",
                "1048576",
                "freeasync",
                "4",
            ],
        );
        assert_eq!(
            out,
            [
                "ok", "ok 0", "ok", "ok", "ok 1", "ok 2", "ok", "ok", "ok", "ok", "ok 3", "ok",
                "ok", "ok", "ok", "ok", "ok 4", "ok", "ok"
            ],
            "scrub {scrub}"
        );
        let l = sb.ledger();
        assert_eq!(
            (l.scrub_clean[0], l.scrub_dirty[0]),
            if scrub { (4, 0) } else { (0, 4) },
            "scrub {scrub}"
        );
    }
}

/// A VMM handle released while mapped is still the tenant's memory until its last
/// unmap (the driver frees it only then): scrubbing must not zero it at the release.
/// Regression: the release zeroed the whole handle through a temporary mapping while
/// the tenant's mapping still showed it. Mapped twice, released, the data reads back
/// intact, still after the first unmap; the last unmap zeroes it before the driver
/// takes it back (by the fake's check).
#[test]
#[ignore = "needs root (unshare -m)"]
fn scrubbing_leaves_a_released_but_mapped_handle_intact_until_its_last_unmap() {
    if !require("scrub-mapped") {
        return;
    }
    let (sb, o) = scrub_checked(true);
    let out = sb.client(
        &o,
        &[
            "ctx", "0", "vmm", "2097152", "vreserve", "2097152", "vreserve", "2097152", "vmap",
            "1", "0", "2097152", "vmap", "2", "0", "2097152", "fill", "1", "2097152", "release",
            "0", "peek", "1", "2097152", "vunmap", "1", "2097152", "peek", "2", "2097152",
            "vunmap", "2", "2097152",
        ],
    );
    assert_eq!(
        out,
        [
            "ok",
            "ok 0",
            "ok 1",
            "ok 2",
            "ok",
            "ok",
            "ok",
            "ok",
            "ok filled",
            "ok",
            "ok filled",
            "ok"
        ]
    );
    let l = sb.ledger();
    assert_eq!(
        (l.scrub_clean[0], l.scrub_dirty[0]),
        (1, 0),
        "zeroed once, at the last unmap"
    );
    assert_eq!(l.live[0], 0);
}

/// A reference retained from a mapping keeps the handle the tenant's memory after
/// its first release and last unmap (it can be mapped again): scrubbing waits for the
/// retained reference's release, then zeroes the whole handle before the driver frees
/// it (by the fake's check).
#[test]
#[ignore = "needs root (unshare -m)"]
fn scrubbing_waits_for_a_retained_reference() {
    if !require("scrub-retained") {
        return;
    }
    let (sb, o) = scrub_checked(true);
    let out = sb.client(
        &o,
        &[
            "ctx", "0", "vmm", "2097152", "vreserve", "2097152", "vmap", "1", "0", "2097152",
            "fill", "1", "2097152", "vretain", "1", "release", "0", "vunmap", "1", "2097152",
            "vreserve", "2097152", "vmap", "3", "2", "2097152", "peek", "3", "2097152", "vunmap",
            "3", "2097152", "release", "2",
        ],
    );
    assert_eq!(
        out,
        [
            "ok",
            "ok 0",
            "ok 1",
            "ok",
            "ok",
            "ok 2",
            "ok",
            "ok",
            "ok 3",
            "ok",
            "ok filled",
            "ok",
            "ok"
        ]
    );
    let l = sb.ledger();
    assert_eq!(
        (l.scrub_clean[0], l.scrub_dirty[0]),
        (1, 0),
        "zeroed once, at the retained reference's release"
    );
    assert_eq!(l.live[0], 0);
}

/// A release the driver refuses keeps the handle's charge, even when the handle's
/// last mapping is unmapped in another thread while the release is under way (the
/// library takes the reference off before the driver call); the next release, which
/// the driver accepts, returns it. The unmap lands inside the refused release by the
/// fake driver's ordering hooks (`bgunmap ... during`), not by timing.
#[test]
#[ignore = "needs root (unshare -m)"]
fn a_refused_release_racing_an_unmap_keeps_the_charge() {
    if !require("release-race") {
        return;
    }
    let sb = one_gpu(64 * MIB);
    let o = RunOpts {
        env: vec![("FAKE_CUDA_RELEASE_FAIL_MS".into(), "100".into())],
        ..opts()
    };
    let out = sb.client(
        &o,
        &[
            "ctx", "0", "meminfo", "vmm", "2097152", "vreserve", "2097152", "vmap", "1", "0",
            "2097152", "meminfo", "bgunmap", "1", "2097152", "during", "release", "0", "meminfo",
            "vunmap", "1", "2097152", "release", "0", "meminfo",
        ],
    );
    let (empty, charged) = (out[1].clone(), out[5].clone());
    assert!(
        empty.starts_with("ok ") && charged.starts_with("ok "),
        "{out:?}"
    );
    assert_ne!(empty, charged, "the mapped handle is charged");
    assert_eq!(
        out,
        [
            "ok",
            empty.as_str(),
            "ok 0",
            "ok 1",
            "ok",
            charged.as_str(),
            "ok",
            "err 999",
            charged.as_str(),
            "err 1",
            "ok",
            empty.as_str(),
        ],
        "refused while the other thread unmapped (a second unmap finds nothing): still \
         charged; released: the charge is back"
    );
    assert_eq!(sb.ledger().live[0], 0);
}

/// A handle value the driver frees and gives out again while the call that freed it
/// has not returned yet: the new handle gets a record of its own, the old charge goes,
/// and the returning call does not touch the new record. (The client creates the new
/// handle once the unmap is in the fake driver's delay, its memory freed: `waitslow`;
/// and reads the charge once the unmap returned: `bgwait`.)
#[test]
#[ignore = "needs root (unshare -m)"]
fn a_reused_handle_value_is_a_new_record() {
    if !require("handle-reuse") {
        return;
    }
    let sb = one_gpu(64 * MIB);
    let o = RunOpts {
        env: vec![
            ("FAKE_CUDA_REUSE_HANDLES".into(), "1".into()),
            ("FAKE_CUDA_UNMAP_DELAY_MS".into(), "400".into()),
        ],
        ..opts()
    };
    let out = sb.client(
        &o,
        &[
            "ctx", "0", "meminfo", "vmm", "2097152", "vreserve", "2097152", "vmap", "1", "0",
            "2097152", "release", "0", "meminfo", "bgunmap", "1", "2097152", "0", "waitslow",
            "vmm", "2097152", "bgwait", "meminfo", "release", "2", "meminfo",
        ],
    );
    let (empty, one) = (out[1].clone(), out[6].clone());
    assert!(
        empty.starts_with("ok ") && one.starts_with("ok "),
        "{out:?}"
    );
    assert_ne!(empty, one);
    assert_eq!(
        out,
        [
            "ok",
            empty.as_str(),
            "ok 0",
            "ok 1",
            "ok",
            "ok",
            one.as_str(),
            "ok",
            "ok",
            "ok 2",
            "ok",
            one.as_str(),
            "ok",
            empty.as_str(),
        ],
        "the old handle freed and its value reused: one handle's charge, then none"
    );
}

/// None of these tenant changes turns enforcement off: an empty or different
/// LD_PRELOAD, LD_LIBRARY_PATH naming another copy of libcuda, CUDA_* and TESSERA_*
/// variables, CUDA_DISABLE_CONTROL=true; through either loading path.
#[test]
#[ignore = "needs root (unshare -m)"]
fn tenant_environment_tricks_do_not_disable_enforcement() {
    if !require("env") {
        return;
    }
    let art = artifacts();
    let other = art.other_fake_dir.display().to_string();
    let tricks: Vec<Vec<(&str, String)>> = vec![
        vec![("LD_PRELOAD", String::new())],
        vec![("LD_PRELOAD", "libm.so.6".into())],
        vec![("LD_LIBRARY_PATH", other)],
        vec![("CUDA_DISABLE_CONTROL", "true".into())],
        vec![
            ("TESSERA_DISABLE", "1".into()),
            ("TESSERA_LIMITS", "/dev/null".into()),
        ],
        vec![
            ("CUDA_DEVICE_MEMORY_LIMIT", "80g".into()),
            ("CUDA_MODULE_LOADING", "LAZY".into()),
        ],
    ];
    for mode in ["gpa", "dlsym"] {
        for t in &tricks {
            let sb = one_gpu(4 * MIB);
            let o = RunOpts {
                env: t.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
                mode: Some(mode),
                ..opts()
            };
            let out = sb.client(&o, &["ctx", "0", "alloc", "6291456", "alloc", "4194304"]);
            assert_eq!(out, ["ok", OOM, "ok 0"], "{mode} {t:?}");
            assert!(sb.ledger().peak[0] <= 4 * MIB, "{mode} {t:?}");
        }
    }
}

/// When every slot of a claim is taken, a new process fails closed: allocations on
/// the claim's GPUs are refused, and it says why once.
#[test]
#[ignore = "needs root (unshare -m)"]
fn a_process_without_a_slot_fails_closed() {
    if !require("fail-closed") {
        return;
    }
    let mut c = ClaimSpec::new("claim-a", &[(GPU0, 64 * MIB)]);
    c.slots = 1;
    let sb = Sandbox::new(&[(GPU0, 80 << 30)], vec![c]);
    let (a, got) = sb.spawn_client(&opts(), &["ctx", "0", "hold"], 2);
    assert_eq!(got, ["ok", "holding"]);
    let out = sb.client_output(&opts(), &["ctx", "0", "alloc", "1", "alloc", "1"]);
    drop(a);
    assert_eq!(lines(&out.stdout), ["ok", OOM, OOM]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("every process slot is in use").count(),
        1,
        "{err}"
    );
    // Once the holder is gone its slot is reclaimed for the next process.
    assert_eq!(
        sb.client(&opts(), &["ctx", "0", "alloc", "1"]),
        ["ok", "ok 0"]
    );
}

/// Other libraries' `dlsym(RTLD_NEXT, …)` still resolves relative to *them* under
/// the preloaded library (its `dlsym` is a trampoline that keeps the caller's return
/// address): a getenv shim loaded after the library finds libc's getenv, not itself.
#[test]
#[ignore = "needs root (unshare -m)"]
fn other_libraries_rtld_next_still_finds_the_next_object() {
    if !require("rtld-next") {
        return;
    }
    let sb = one_gpu(4 * MIB);
    let dir = sb.dir.path().join("shim");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let fakes = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fakes");
    let shim = dir.join("librtldshim.so");
    let main = dir.join("rtld_next_main");
    let cc = |args: &[&str]| {
        let out = std::process::Command::new("cc")
            .args(args)
            .output()
            .expect("cc");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        shim.to_str().expect("utf-8"),
        &format!("{fakes}/rtld_next_shim.c"),
        "-ldl",
    ]);
    cc(&[
        "-o",
        main.to_str().expect("utf-8"),
        &format!("{fakes}/rtld_next_main.c"),
        &format!("-L{}", dir.display()),
        "-lrtldshim",
        &format!("-Wl,-rpath,{}", dir.display()),
    ]);
    let o = RunOpts {
        env: vec![("RTLD_NEXT_TEST".into(), "libc".into())],
        ..opts()
    };
    let out = sb.command(&o, &main, &[]).output().expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lines(&out.stdout), ["via-shim libc"]);
}
