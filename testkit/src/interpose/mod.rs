//! Test harness for the interception library: builds the fake driver and the C client
//! with the system compiler, lays out per-claim files in a temp dir, and runs each
//! case in its own mount namespace (`unshare -m`, plus `-p -f --mount-proc` when
//! asked) where the files are bind-mounted as the plugin mounts them in production:
//! `limits` and `control` read-only, `region` read-write under
//! `/run/tessera/claims/<uid>/`, the library directory read-only at
//! `/usr/local/tessera/lib` (from `<sandbox>/lib/v.<random>/`, beside `<sandbox>/claims/`,
//! as the plugin's run directory holds them), and `/etc/ld.so.preload` (in an overlay of `/etc`)
//! naming the front library there, which loads the interception library beside it
//! (as the plugin installs them). Nothing touches the host's paths, so cases run in parallel.
//!
//! Verdicts come from the fake driver's ledger (device memory it really handed
//! out), not from the library's own counters.
pub mod shares;
pub mod timeline;

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

use tessera_abi::control::{self, GpuControl};
use tessera_abi::limits::Limits;
use tessera_abi::region::{self, Snapshot};

pub const MIB: u64 = 1 << 20;
pub const GPU0: &str = "GPU-4f8d0c1e-6a2b-4c59-9e31-0a7b5d2c9f10";
pub const GPU1: &str = "GPU-9a1b2c3d-4e5f-4061-8273-94a5b6c7d8e9";
/// What `/etc/ld.so.preload` names: the front library (`cuda/preload`).
pub const PRELOAD_PATH: &str = "/usr/local/tessera/lib/libtessera_preload.so";
/// The interception library, which the front loads at the first CUDA call.
pub const CORE_PATH: &str = "/usr/local/tessera/lib/libtessera_cuda.so";
pub const CORE_FILE: &str = "libtessera_cuda.so";
pub const FRONT_FILE: &str = "libtessera_preload.so";
/// Tessera's `libcuda.so.1` and `libnvidia-ml.so.1` (the front built as soname shims),
/// as cargo names them (`tessera-shim-cuda`, `tessera-shim-nvml`) beside the library.
pub const SHIM_CUDA_FILE: &str = "libtessera_shim_cuda.so";
pub const SHIM_NVML_FILE: &str = "libtessera_shim_nvml.so";
/// Where the real driver files are mounted when the shims take their sonames.
pub const REAL_CUDA: &str = "/usr/local/tessera/driver/libcuda.real";
pub const REAL_NVML: &str = "/usr/local/tessera/driver/libnvidia-ml.real";

/// Copies a build of `libtessera_cuda.so` and the front library built beside it
/// (the same target directory: `cargo preload`) into `dir`, as the plugin installs them.
pub fn install_libs(core: &Path, dir: &Path) {
    let front = core.with_file_name(FRONT_FILE);
    assert!(
        front.is_file(),
        "{} missing beside {}",
        front.display(),
        core.display()
    );
    fs::create_dir_all(dir).expect("mkdir");
    fs::copy(core, dir.join(CORE_FILE)).expect("copy library");
    fs::copy(&front, dir.join(FRONT_FILE)).expect("copy front library");
    for shim in [SHIM_CUDA_FILE, SHIM_NVML_FILE] {
        let f = core.with_file_name(shim);
        assert!(
            f.is_file(),
            "{} missing beside {}",
            f.display(),
            core.display()
        );
        fs::copy(&f, dir.join(shim)).expect("copy shim");
    }
}

/// A C source of `cuda/tests/fakes/` (the fake driver, its clients).
fn fake_source(file: &str) -> String {
    let p = testkit_lite::repo_root()
        .join("cuda/tests/fakes")
        .join(file);
    p.to_str().expect("utf-8 checkout path").to_string()
}

/// Whether missing prerequisites fail (CI) or skip (a developer's machine): the test
/// kit's one rule.
pub use testkit_lite::prereq::in_ci;

/// Reports a skipped test on the terminal (written to fd 2 directly, so that the
/// test harness's output capture does not hide it): `tessera-cuda SKIP <test>: <why>`.
/// Grep for that prefix for the run's summary of skips.
pub fn skip(msg: String) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "tessera-cuda SKIP {msg}");
}

/// A missing prerequisite: skipped locally, a failure when `CI` is set.
pub fn require(test: &str) -> bool {
    let missing = prerequisites();
    match missing {
        None => true,
        Some(why) => {
            if in_ci() {
                panic!("{test}: prerequisite missing under CI: {why}");
            }
            skip(format!("{test}: {why}"));
            false
        }
    }
}

fn prerequisites() -> Option<String> {
    static P: OnceLock<Option<String>> = OnceLock::new();
    P.get_or_init(|| {
        if !testkit_lite::sys::is_root() {
            return Some("needs root for unshare -m and mounts".into());
        }
        for (prog, arg) in [("unshare", "--version"), ("cc", "--version")] {
            if Command::new(prog).arg(arg).output().is_err() {
                return Some(format!("`{prog}` not found"));
            }
        }
        None
    })
    .clone()
}

/// `readelf -W <flag> <lib>`'s output (binutils).
pub fn readelf(flag: &str, lib: &Path) -> String {
    let out = Command::new("readelf")
        .args(["-W", flag])
        .arg(lib)
        .output()
        .expect("readelf (binutils)");
    assert!(out.status.success(), "readelf {flag} {}", lib.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The built fixtures, shared by all tests of one binary.
pub struct Artifacts {
    /// Directory holding `libtessera_cuda.so` and the front library (mounted at
    /// /usr/local/tessera/lib).
    pub lib_dir: PathBuf,
    /// Directory holding the fake `libcuda.so.1`.
    pub fake_dir: PathBuf,
    /// A second copy of the fake, for the LD_LIBRARY_PATH trick.
    pub other_fake_dir: PathBuf,
    pub client: PathBuf,
    /// The simulated GPU's workload client (`tests/fakes/sim_client.c`).
    pub sim_client: PathBuf,
    _tmp: tempfile::TempDir,
}

fn cc(args: &[&str]) {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut words = cc.split_whitespace();
    let out = Command::new(words.next().unwrap_or("cc"))
        .args(words)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(
        out.status.success(),
        "cc {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds the fake driver (`-Bsymbolic-functions`, as facts B6 require) and the client,
/// and finds the library cargo built.
pub fn artifacts() -> &'static Artifacts {
    static A: OnceLock<Artifacts> = OnceLock::new();
    A.get_or_init(|| {
        // In the target directory, not /tmp: a static is never dropped, so this
        // directory outlives the test binary, and `cargo clean` is what removes it.
        let tmp = tempfile::Builder::new()
            .prefix("tessera-cuda-fixtures")
            .tempdir_in(testkit_lite::target_tmpdir())
            .expect("temp dir");
        let root = tmp.path();
        let (lib_dir, fake_dir, other) = (root.join("lib"), root.join("fake"), root.join("other"));
        for d in [&lib_dir, &fake_dir, &other] {
            fs::create_dir_all(d).expect("mkdir");
        }
        let fake = fake_dir.join("libcuda.so.1");
        cc(&[
            "-shared",
            "-fPIC",
            "-pthread",
            "-std=gnu11",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wl,-Bsymbolic-functions",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            fake.to_str().expect("utf-8 path"),
            &fake_source("fake_cuda.c"),
        ]);
        fs::copy(&fake, other.join("libcuda.so.1")).expect("copy fake");
        let client = root.join("cuda_client");
        cc(&[
            "-std=gnu11",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            client.to_str().expect("utf-8 path"),
            &fake_source("cuda_client.c"),
            "-ldl",
            "-pthread",
        ]);
        let sim_client = root.join("sim_client");
        cc(&[
            "-std=gnu11",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            sim_client.to_str().expect("utf-8 path"),
            &fake_source("sim_client.c"),
            "-ldl",
            "-lm",
        ]);
        let built = built_library();
        install_libs(&built, &lib_dir);
        Artifacts {
            lib_dir,
            fake_dir,
            other_fake_dir: other,
            client,
            sim_client,
            _tmp: tmp,
        }
    })
}

/// Builds `libtessera_cuda.so` (and the front, the shims and the CDI hook beside it) with the
/// cargo running the tests, into a target
/// directory of its own: integration tests do not link a cdylib, so cargo does not
/// rebuild it for them, and the outer build directory stays locked while tests run.
/// `TESSERA_CUDA_TEST_LIB=<file>` runs the tests against that build instead (CI
/// passes the release artifact), with the front library, shims and hook of the same directory.
pub fn built_library() -> PathBuf {
    match std::env::var_os("TESSERA_CUDA_TEST_LIB").filter(|v| !v.is_empty()) {
        Some(lib) => {
            let lib = PathBuf::from(lib);
            assert!(
                lib.is_file(),
                "TESSERA_CUDA_TEST_LIB={}: no such file",
                lib.display()
            );
            lib
        }
        None => built_library_with("debug", &[]),
    }
}

/// As [`built_library`], in `profile` ("debug" or "release" with `--release`).
pub fn built_library_with(profile: &str, extra: &[&str]) -> PathBuf {
    testkit_lite::cuda::interception_library(&testkit_lite::target_tmpdir(), profile, extra)
}

/// A program linked against `libcuda.so.1` (no `dlsym`, no `cuGetProcAddress`), built
/// into the sandbox's directory: `cuInit`, the primary context (one line), then
/// `cuMemAlloc_v2` of 6 MiB and of 2 MiB (a line each: `ok` or `err <code>`).
pub fn linked_program(sb: &Sandbox) -> PathBuf {
    let src = sb.dir.path().join("linked.c");
    fs::write(
        &src,
        r#"#include <stdio.h>
#include <stddef.h>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
static void say(CUresult rc) { if (rc) printf("err %d\n", rc); else printf("ok\n"); }
int main(void) {
    void *ctx = NULL;
    CUdeviceptr p;
    CUresult rc = cuInit(0);
    if (!rc) rc = cuDevicePrimaryCtxRetain(&ctx, 0);
    if (!rc) rc = cuCtxSetCurrent(ctx);
    say(rc);
    say(cuMemAlloc_v2(&p, 6291456));
    say(cuMemAlloc_v2(&p, 2097152));
    return 0;
}
"#,
    )
    .expect("write");
    let bin = sb.dir.path().join("linked");
    let fake = artifacts().fake_dir.join("libcuda.so.1");
    cc(&[
        "-o",
        bin.to_str().expect("utf-8 path"),
        src.to_str().expect("utf-8 path"),
        fake.to_str().expect("utf-8 path"),
    ]);
    bin
}

/// One claim's files as the plugin writes them.
#[derive(Clone)]
pub struct ClaimSpec {
    pub uid: String,
    pub scrub: bool,
    pub gpus: Vec<(String, u64)>,
    pub slots: u32,
    /// The region's per-context charge on every GPU (`gpu::CONTEXT_BYTES`). The
    /// plugin writes [`tessera_abi::region::DEFAULT_CONTEXT_BYTES`]; the harness writes 0
    /// (contexts not charged, and the fake's contexts hold nothing unless
    /// `FAKE_CUDA_CONTEXT_BYTES` says so) except in the tests that judge contexts.
    pub context_bytes: u64,
}

impl ClaimSpec {
    pub fn new(uid: &str, gpus: &[(&str, u64)]) -> Self {
        ClaimSpec {
            uid: uid.into(),
            scrub: false,
            gpus: gpus.iter().map(|(u, b)| (u.to_string(), *b)).collect(),
            slots: 32,
            context_bytes: 0,
        }
    }
}

/// How a case's process is started.
#[derive(Default, Clone)]
pub struct RunOpts {
    /// Own PID namespace with its own /proc.
    pub pidns: bool,
    /// Extra environment (the tenant's).
    pub env: Vec<(String, String)>,
    /// Shell run after the claim mounts, before the preload is in place.
    pub extra_script: String,
    /// The client's loading mode: gpa (default), gpa-ptds or dlsym.
    pub mode: Option<&'static str>,
    /// A directory holding another build of both libraries to mount instead
    /// ([`install_libs`]).
    pub lib_dir: Option<PathBuf>,
    /// The layout before the soname shims: the fake driver at its soname, nothing at
    /// the real files' paths. By default the shims are mounted over the fake driver
    /// (and fake NVML) and those at `/usr/local/tessera/driver/*.real`, as the plugin
    /// mounts them.
    pub no_shims: bool,
    /// Shell run after every mount, just before the program (the tenant's moves).
    pub tenant_script: String,
}

/// A simulated node: fake GPUs, a ledger, and claim files.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub claims: Vec<ClaimSpec>,
    pub devices: Vec<(String, u64)>,
}

pub const LEDGER_SIZE: usize = 65536;

impl Sandbox {
    pub fn new(devices: &[(&str, u64)], claims: Vec<ClaimSpec>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        for c in &claims {
            let d = dir.path().join("claims").join(&c.uid);
            fs::create_dir_all(&d).expect("mkdir");
            let limits = Limits::merged(&c.uid, c.scrub, c.gpus.clone()).expect("limits");
            fs::write(d.join("limits"), limits.render()).expect("limits");
            let uuids: Vec<&str> = limits.gpus.iter().map(|g| g.uuid.as_str()).collect();
            let ctl: Vec<GpuControl> = limits
                .gpus
                .iter()
                .map(|g| GpuControl {
                    uuid: g.uuid.clone(),
                    share: 0,
                    compute_limit: 100,
                    block_rate: 0,
                    burst_ns: 0,
                    updates: 0,
                })
                .collect();
            fs::write(
                d.join("control"),
                control::initial_bytes(&ctl).expect("control"),
            )
            .expect("control");
            let mut rb = region::initial_bytes(&uuids, c.slots).expect("region");
            let l = region::Layout::parse(&rb).expect("layout");
            for g in 0..uuids.len() {
                let o = l.gpu_offset(g) + region::gpu::CONTEXT_BYTES;
                rb[o..o + 8].copy_from_slice(&c.context_bytes.to_le_bytes());
            }
            fs::write(d.join("region"), rb).expect("region");
        }
        let mut ledger = vec![0u8; LEDGER_SIZE];
        ledger[..8].copy_from_slice(b"FAKECUDA");
        fs::write(dir.path().join("ledger"), ledger).expect("ledger");
        fs::write(
            dir.path().join("ld.so.preload"),
            format!("{PRELOAD_PATH}\n"),
        )
        .expect("preload");
        Sandbox {
            dir,
            claims,
            devices: devices.iter().map(|(u, b)| (u.to_string(), *b)).collect(),
        }
    }

    fn script(&self, opts: &RunOpts) -> String {
        let root = self.dir.path().display();
        let art = artifacts();
        let mut s = String::from("set -e\nmount -t tmpfs tmpfs /run\n");
        for c in &self.claims {
            let t = format!("/run/tessera/claims/{}", c.uid);
            s += &format!("mkdir -p {t}\n");
            for (f, ro) in [("limits", true), ("control", true), ("region", false)] {
                s += &format!(
                    "touch {t}/{f}\nmount --bind {root}/claims/{}/{f} {t}/{f}\n",
                    c.uid
                );
                if ro {
                    s += &format!("mount -o remount,bind,ro {t}/{f}\n");
                }
            }
        }
        s += &opts.extra_script;
        // The library directory is laid out as the plugin installs it, beside the
        // claims: `<run>/lib/<version>/` (hard links, else copies, of the build), since
        // the library trusts only claims mounted from its own run directory.
        s += &format!(
            "\nmkdir -p {root}/lib\nv=$(mktemp -d {root}/lib/v.XXXXXX)\n\
             ln {lib}/* $v/ 2>/dev/null || cp {lib}/* $v/\n\
             mount -t tmpfs tmpfs /usr/local\nmkdir -p /usr/local/tessera/lib\n\
             mount --bind $v /usr/local/tessera/lib\n\
             mount -o remount,bind,ro /usr/local/tessera/lib\n\
             mkdir -p {root}/etc-upper-$$ {root}/etc-work-$$\n\
             mount -t overlay overlay -o lowerdir=/etc,upperdir={root}/etc-upper-$$,workdir={root}/etc-work-$$ /etc\n\
             touch /etc/ld.so.preload\nmount --bind {root}/ld.so.preload /etc/ld.so.preload\n\
             mount -o remount,bind,ro /etc/ld.so.preload\n",
            lib = opts.lib_dir.as_ref().unwrap_or(&art.lib_dir).display()
        );
        if !opts.no_shims {
            // As the plugin mounts them: the real files at fixed paths (bound before
            // the shims cover them), the shims at the driver's paths.
            let fake = art.fake_dir.display();
            s += "mkdir -p /usr/local/tessera/driver\n";
            for (soname, shim, real) in [
                ("libcuda.so.1", SHIM_CUDA_FILE, REAL_CUDA),
                ("libnvidia-ml.so.1", SHIM_NVML_FILE, REAL_NVML),
            ] {
                s += &format!(
                    "if [ -f {fake}/{soname} ]; then touch {real}\n\
                     mount --bind {fake}/{soname} {real}\nmount -o remount,bind,ro {real}\n\
                     mount --bind $v/{shim} {fake}/{soname}\n\
                     mount -o remount,bind,ro {fake}/{soname}\nfi\n"
                );
            }
        }
        if !opts.tenant_script.is_empty() {
            // Without the tenant's variables, which are the program's.
            s += &format!(
                "(\nunset LD_PRELOAD LD_LIBRARY_PATH\n{}\n)\n",
                opts.tenant_script
            );
        }
        // The tenant's variables (`RunOpts::env`) reach the program only, never the
        // harness's own commands (a preload there would stop them).
        s += "exec env \"$@\"\n";
        s
    }

    /// The command for `program args` inside the sandbox. Each command gets its own
    /// overlay upper and work directories (`$$`): concurrent overlay mounts sharing a
    /// work directory race on its `work/` subdirectory and fail with ENOENT.
    pub fn command(&self, opts: &RunOpts, program: &Path, args: &[&str]) -> Command {
        let art = artifacts();
        let mut cmd = Command::new("unshare");
        cmd.arg("-m");
        if opts.pidns {
            // --kill-child: killing unshare kills the namespace's PID 1 (the client).
            cmd.args(["-p", "-f", "--mount-proc", "--kill-child"]);
        }
        cmd.arg("sh")
            .arg("-c")
            .arg(self.script(opts))
            .arg("sh")
            .args(opts.env.iter().map(|(k, v)| format!("{k}={v}")))
            .arg(program)
            .args(args);
        let devices: Vec<String> = self
            .devices
            .iter()
            .map(|(u, b)| format!("{u}:{b}"))
            .collect();
        cmd.env("FAKE_CUDA_DEVICES", devices.join(","))
            .env("FAKE_CUDA_LEDGER", self.dir.path().join("ledger"))
            .env("LD_LIBRARY_PATH", &art.fake_dir);
        cmd
    }

    /// Runs the client with `commands`; returns its stdout lines (and asserts it ran).
    pub fn client(&self, opts: &RunOpts, commands: &[&str]) -> Vec<String> {
        let out = self.client_output(opts, commands);
        assert!(
            out.status.success(),
            "client {commands:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        lines(&out.stdout)
    }

    pub fn client_output(&self, opts: &RunOpts, commands: &[&str]) -> Output {
        let mut args = vec![opts.mode.unwrap_or("gpa")];
        args.extend_from_slice(commands);
        self.command(opts, &artifacts().client, &args)
            .output()
            .expect("run client")
    }

    /// Starts the client in the background; returns once it printed `wait_for` lines.
    pub fn spawn_client(
        &self,
        opts: &RunOpts,
        commands: &[&str],
        wait_for: usize,
    ) -> (Running, Vec<String>) {
        let mut args = vec![opts.mode.unwrap_or("gpa")];
        args.extend_from_slice(commands);
        let child = self
            .command(opts, &artifacts().client, &args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn client");
        let mut running = Running::new(child);
        let got = running.read_lines(wait_for);
        (running, got)
    }

    /// Replaces what `/etc/ld.so.preload` will say in the next runs (empty: no preload).
    pub fn set_preload(&self, content: &str) {
        fs::write(self.dir.path().join("ld.so.preload"), content).expect("preload");
    }

    /// The ledger as the fake driver keeps it.
    pub fn ledger(&self) -> Ledger {
        let path = self.dir.path().join("ledger");
        let b = fs::read(&path).expect("ledger");
        let f = fs::File::open(&path).expect("ledger");
        let rd = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let mut l = Ledger::default();
        for d in 0..8 {
            let o = 64 + 64 * d;
            l.used[d] = rd(o);
            l.peak[d] = rd(o + 8);
            l.scrub_clean[d] = rd(o + 16);
            l.scrub_dirty[d] = rd(o + 24);
        }
        for r in 0..256 {
            let o = 4096 + 128 * r;
            if rd(o) == 0 {
                continue;
            }
            let locked = tessera_abi::map::range_locked(&f, o as u64, 128).unwrap_or(false);
            if locked {
                for d in 0..8 {
                    l.live[d] += rd(o + 8 + 8 * d);
                }
            }
        }
        l
    }

    /// The claim's region as the library left it.
    pub fn region(&self, uid: &str) -> Snapshot {
        let b = fs::read(self.dir.path().join("claims").join(uid).join("region")).expect("region");
        Snapshot::parse(&b).expect("region parses")
    }
}

/// A background client, SIGKILLed and reaped when dropped (also when a test fails).
pub struct Running(Child, BufReader<std::process::ChildStdout>);

impl Running {
    /// Takes over a client spawned with its stdout piped. The pipe stays open as long
    /// as the client (a closed pipe would kill a later print).
    pub fn new(mut child: Child) -> Self {
        let out = BufReader::new(child.stdout.take().expect("stdout piped"));
        Running(child, out)
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// The client's next `n` lines of output (fewer if it exits first).
    pub fn read_lines(&mut self, n: usize) -> Vec<String> {
        let mut got = Vec::new();
        while got.len() < n {
            let mut l = String::new();
            if self.1.read_line(&mut l).unwrap_or(0) == 0 {
                break;
            }
            got.push(l.trim_end().to_string());
        }
        got
    }

    /// SIGKILL now and wait for the process to be gone.
    pub fn kill_now(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// Device memory the fake driver handed out, per ledger device index.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    /// Held now (including by processes that died: a real driver frees those, the
    /// fake cannot, so see `live`).
    pub used: [u64; 8],
    /// The most ever held at once, across processes.
    pub peak: [u64; 8],
    /// Held by live processes.
    pub live: [u64; 8],
    pub scrub_clean: [u64; 8],
    pub scrub_dirty: [u64; 8],
}

pub fn lines(b: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(b)
        .lines()
        .map(str::to_string)
        .collect()
}

pub fn opts() -> RunOpts {
    RunOpts::default()
}

/// The directory `cuda/ci-setup.sh` filled with the pinned Python clients, if any.
pub fn python_clients() -> Option<PathBuf> {
    let dir = std::env::var_os("TESSERA_CUDA_TEST_PY").map(PathBuf::from)?;
    dir.join("venv/bin/python").exists().then_some(dir)
}

/// Builds the fake NVML (`tests/fakes/fake_nvml.c`, [`crate::fake_nvml`])
/// into the fake driver's directory, and writes a state file for `devices`.
pub fn fake_nvml(state_dir: &Path, devices: &[(String, u64)]) {
    static BUILT: OnceLock<()> = OnceLock::new();
    let art = artifacts();
    BUILT.get_or_init(|| {
        crate::fake_nvml::build_fake_nvml(&art.fake_dir);
    });
    let mut s = String::from(
        "tessera-node-state 1\nsource 0\ndriver-version 580.65.06\ncuda-driver-version 13000\n\
         major nvidia 195\nmajor nvidia-uvm 508\nmajor nvidia-caps 511\n",
    );
    for (i, (uuid, bytes)) in devices.iter().enumerate() {
        s += &format!(
            "gpu\nindex {i}\nminor {i}\nuuid {uuid}\nname NVIDIA H100 80GB HBM3\nbrand Nvidia\n\
             architecture Hopper\nmemory {bytes}\nmultiprocessors 132\ncompute-capability 9.0\n\
             pci-bus-id 0000:{:02x}:00.0\nmig-capable 0\nmig-enabled 0\nend\n",
            0x19 + i
        );
    }
    fs::create_dir_all(state_dir).expect("state dir");
    fs::write(state_dir.join("mock-node.state"), s).expect("state file");
}

/// The environment that puts a process on the simulated GPU (see
/// `tests/fakes/fakesim.h`): the shared state file (created by the first process),
/// the timeline log, and the process's tag in the timeline. Add
/// `FAKE_SIM_BLOCK_NS` (ns per block, default 1000) and `FAKE_SIM_SEED` (the fake
/// NVML's noise) as needed.
pub fn sim_env(state: &Path, log: &Path, tag: u32) -> Vec<(String, String)> {
    vec![
        ("FAKE_CUDA_SIM".into(), state.display().to_string()),
        ("FAKE_CUDA_SIM_LOG".into(), log.display().to_string()),
        ("FAKE_SIM_TAG".into(), tag.to_string()),
    ]
}
