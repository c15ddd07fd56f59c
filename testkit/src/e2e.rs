//! End-to-end support for the container-runtime tests: prerequisites (skipped only
//! when `CI` is unset), a registry-free rootfs (static busybox plus the host's glibc
//! and the test programs), a node's device nodes made with mknod under a private
//! `--dev-root`, fake driver files, and podman driven inside a private mount
//! namespace whose `/etc/cdi` and `/var/run/cdi` are the plugin's CDI dir.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

// The prerequisite checks and progress lines live in the light half of the kit (the
// real-cluster crate uses them without linking the plugin).
pub use testkit_lite::prereq::{in_ci, prerequisites, report, skip_or_fail};
use testkit_lite::sys;

/// Runs `cmd` (`what` names it in failure messages) and returns its output.
///
/// # Panics
/// When it cannot be started or fails; the message carries its stdout and stderr.
pub fn run_ok(cmd: &mut Command, what: &str) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// Test programs and fake libraries, built once per test binary.
pub struct Built {
    pub dir: PathBuf,
    /// The stand-in `libcuda.so.1` (soname libcuda.so.1).
    pub libcuda: PathBuf,
    /// A program linked with `-lcuda`.
    pub cudaprobe: PathBuf,
}

fn fakes() -> PathBuf {
    testkit_lite::repo_root().join("tests/fakes/e2e")
}

/// Builds the fakes into `dir`.
pub fn build(dir: &Path) -> Built {
    std::fs::create_dir_all(dir).unwrap();
    let libcuda = dir.join("libcuda.so.1");
    run_ok(
        Command::new(cc())
            .args(["-O2", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
            .arg(&libcuda)
            .arg(fakes().join("libcuda_probe.c"))
            .arg("-ldl"),
        "building the stand-in libcuda",
    );
    std::os::unix::fs::symlink("libcuda.so.1", dir.join("libcuda.so")).ok();
    let cudaprobe = dir.join("cudaprobe");
    run_ok(
        Command::new(cc())
            .args(["-O2", "-o"])
            .arg(&cudaprobe)
            .arg(fakes().join("cudaprobe.c"))
            .arg("-L")
            .arg(dir)
            .arg("-lcuda"),
        "building cudaprobe",
    );
    Built {
        dir: dir.to_path_buf(),
        libcuda,
        cudaprobe,
    }
}

/// A minimal root filesystem: static busybox (every applet), the host's glibc and
/// loader, and `programs` in `/usr/local/bin`. Containers use it as `--rootfs DIR:O`
/// (an overlay), so runs never modify it.
pub fn rootfs(dir: &Path, programs: &[&Path]) -> PathBuf {
    let r = dir.join("rootfs");
    for d in [
        "bin",
        "etc",
        "dev",
        "proc",
        "sys",
        "tmp",
        "root",
        "run",
        "lib64",
        "lib/x86_64-linux-gnu",
        "usr/lib/x86_64-linux-gnu",
        "usr/local/bin",
        "usr/bin",
    ] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", r.join("bin/busybox")).unwrap();
    // The applets of the original, not of the copy just written: another test thread
    // forking meanwhile holds the copy's write descriptor until its exec, and executing
    // the copy then fails with ETXTBSY (seen in CI).
    let list = Command::new("/bin/busybox").arg("--list").output().unwrap();
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" {
            std::os::unix::fs::symlink("busybox", r.join("bin").join(applet)).ok();
        }
    }
    // Only libc and the loader: no libgcc_s, as in minimal images. The interception
    // library links its unwinder statically, so it loads here too.
    for lib in ["libc.so.6", "ld-linux-x86-64.so.2"] {
        let src = Path::new("/lib/x86_64-linux-gnu").join(lib);
        // `copy` keeps the mode: the loader must stay executable.
        std::fs::copy(&src, r.join("lib/x86_64-linux-gnu").join(lib))
            .unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    }
    std::os::unix::fs::symlink(
        "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        r.join("lib64/ld-linux-x86-64.so.2"),
    )
    .ok();
    for p in programs {
        let dst = r.join("usr/local/bin").join(p.file_name().unwrap());
        std::fs::copy(p, &dst).unwrap();
    }
    std::fs::write(r.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(r.join("etc/group"), "root:x:0:\n").unwrap();
    r
}

/// One character device to create under the dev root.
pub fn mknod(dev_root: &Path, path: &str, major: u32, minor: u32) {
    let p = dev_root.join(path.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    sys::mknod_char(&p, major, minor).unwrap_or_else(|e| panic!("mknod {}: {e}", p.display()));
}

/// The mock node's device nodes, as a real node has them (majors from its
/// description): `nvidia<minor>` per GPU, `nvidiactl`, the two uvm nodes, and every
/// MIG capability node of the MIG-capable GPUs (what nvidia-modprobe creates).
pub fn make_dev_root(dev_root: &Path, inv: &tessera::inventory::NodeInventory) {
    let m = inv.char_majors;
    for g in &inv.gpus {
        mknod(
            dev_root,
            &format!("/dev/nvidia{}", g.minor),
            m.nvidia,
            g.minor,
        );
        if g.mig_capable
            && let Some(caps) = m.nvidia_caps
        {
            for gi in 0..15 {
                let gm = tessera::mig::geometry::gi_cap_minor(g.minor, gi);
                mknod(
                    dev_root,
                    &format!("/dev/nvidia-caps/nvidia-cap{gm}"),
                    caps,
                    gm,
                );
                for ci in 0..8 {
                    let cm = tessera::mig::geometry::ci_cap_minor(g.minor, gi, ci);
                    mknod(
                        dev_root,
                        &format!("/dev/nvidia-caps/nvidia-cap{cm}"),
                        caps,
                        cm,
                    );
                }
            }
        }
    }
    mknod(dev_root, "/dev/nvidiactl", m.nvidia, 255);
    mknod(dev_root, "/dev/nvidia-uvm", m.nvidia_uvm, 0);
    mknod(dev_root, "/dev/nvidia-uvm-tools", m.nvidia_uvm, 1);
}

/// podman 4.3.1 (Debian bookworm) configured for this sandbox: runc (crun refuses the
/// hybrid cgroup layout), ulimits within the sandbox's hard limits, no network, vfs
/// storage and all state under `dir`.
pub struct Podman {
    dir: PathBuf,
    cdi_dir: PathBuf,
    empty_dir: PathBuf,
}

/// The result of one container run.
#[derive(Debug)]
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(o: Output) -> Self {
        Run {
            ok: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    /// Whether a stdout line equals `line`.
    pub fn has_line(&self, line: &str) -> bool {
        self.stdout.lines().any(|l| l.trim_end() == line)
    }
}

impl Podman {
    pub fn new(dir: &Path, cdi_dir: &Path) -> Self {
        let conf = dir.join("conf");
        std::fs::create_dir_all(&conf).unwrap();
        let nofile = sys::nofile_hard_limit();
        std::fs::write(
            conf.join("containers.conf"),
            format!(
                "[containers]\ndefault_ulimits = [\"nofile={nofile}:{nofile}\", \"nproc=32768:32768\"]\nnetns = \"none\"\n[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n"
            ),
        )
        .unwrap();
        std::fs::write(
            conf.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                dir.join("storage").display(),
                dir.join("runroot").display()
            ),
        )
        .unwrap();
        let empty_dir = dir.join("empty-cdi");
        std::fs::create_dir_all(&empty_dir).unwrap();
        // Mount points only: their contents are never touched, the private namespace
        // shadows them.
        for d in ["/etc/cdi", "/var/run/cdi"] {
            std::fs::create_dir_all(d).unwrap();
        }
        Podman {
            dir: dir.to_path_buf(),
            cdi_dir: cdi_dir.to_path_buf(),
            empty_dir,
        }
    }

    /// `podman --log-level=debug run --rm --rootfs ROOTFS:O [args] -- /bin/sh -c SCRIPT`
    /// in a private mount namespace where `/var/run/cdi` is the plugin's CDI dir and
    /// `/etc/cdi` is empty.
    pub fn run(&self, rootfs: &Path, args: &[String], script: &str) -> Run {
        self.run_rootfs(&format!("{}:O", rootfs.display()), args, script)
    }

    /// As [`Podman::run`], on a writable copy of `rootfs` taken for this run alone
    /// (`--rootfs COPY`, no overlay): every directory of the image can be renamed there,
    /// as on storage without overlayfs (an overlay without `redirect_dir` refuses to
    /// rename a directory of a lower layer, `EXDEV`), which the tenant's renames need.
    pub fn run_writable(&self, rootfs: &Path, args: &[String], script: &str) -> Run {
        let copy = tempfile::Builder::new()
            .prefix("rootfs-rw")
            .tempdir_in(&self.dir)
            .unwrap();
        let st = Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", rootfs.display()))
            .arg(copy.path())
            .status()
            .unwrap();
        assert!(st.success(), "copying the rootfs");
        self.run_rootfs(&copy.path().display().to_string(), args, script)
    }

    fn run_rootfs(&self, rootfs: &str, args: &[String], script: &str) -> Run {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(
                "mount --bind \"$0\" /var/run/cdi && mount --bind \"$1\" /etc/cdi && shift 2 && exec podman \"$@\"",
            )
            .arg(&self.cdi_dir)
            .arg(&self.empty_dir)
            .args(["--log-level=debug", "run", "--rm"])
            .args(args)
            .arg("--rootfs")
            .arg(rootfs)
            .args(["/bin/sh", "-c", script])
            .env("CONTAINERS_CONF", self.dir.join("conf/containers.conf"))
            .env(
                "CONTAINERS_STORAGE_CONF",
                self.dir.join("conf/storage.conf"),
            );
        Run::from(cmd.output().expect("unshare + podman"))
    }

    /// Starts a detached container `name` (same namespaces and settings as `run`).
    pub fn start(&self, rootfs: &Path, name: &str, args: &[String], script: &str) -> Run {
        let mut all = vec!["-d".to_string(), "--name".to_string(), name.to_string()];
        all.extend(args.iter().cloned());
        self.podman_cmd(
            &[
                &["run", "--rm"][..],
                &all.iter().map(String::as_str).collect::<Vec<_>>(),
            ]
            .concat(),
            Some((rootfs, script)),
        )
    }

    /// `podman logs NAME`.
    pub fn logs(&self, name: &str) -> Run {
        self.podman_cmd(&["logs", name], None)
    }

    /// `podman rm -f -t 0 NAME` (kills the container).
    pub fn kill(&self, name: &str) -> Run {
        self.podman_cmd(&["rm", "-f", "-t", "0", name], None)
    }

    fn podman_cmd(&self, args: &[&str], rootfs_script: Option<(&Path, &str)>) -> Run {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(
                "mount --bind \"$0\" /var/run/cdi && mount --bind \"$1\" /etc/cdi && shift 2 && exec podman \"$@\"",
            )
            .arg(&self.cdi_dir)
            .arg(&self.empty_dir)
            .arg("--log-level=debug")
            .args(args);
        if let Some((rootfs, script)) = rootfs_script {
            cmd.arg("--rootfs")
                .arg(format!("{}:O", rootfs.display()))
                .args(["/bin/sh", "-c", script]);
        }
        cmd.env("CONTAINERS_CONF", self.dir.join("conf/containers.conf"))
            .env(
                "CONTAINERS_STORAGE_CONF",
                self.dir.join("conf/storage.conf"),
            );
        Run::from(cmd.output().expect("unshare + podman"))
    }

    /// The CDI registry's own complaints in podman's debug log (why a spec was not
    /// loaded), for failure messages.
    pub fn cdi_errors(run: &Run) -> String {
        run.stderr
            .lines()
            .filter(|l| {
                l.contains("CDI") || l.contains("cdi") || l.contains("Error") || l.contains("error")
            })
            .filter(|l| !l.contains("level=debug msg=\"Using"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The CDI IDs the plugin returned for a claim.
pub fn ids(
    r: &tessera::kubelet::proto::dra_v1::NodePrepareResourcesResponse,
    uid: &str,
) -> Vec<String> {
    r.claims[uid]
        .devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.clone())
        .collect()
}

/// Checks of the device nodes: present (and a character device), or absent.
pub fn node_script(present: &[&str], absent: &[&str]) -> String {
    let mut s = String::new();
    for p in present {
        s.push_str(&format!("test -c {p} && echo PRESENT={p}; "));
    }
    for a in absent {
        s.push_str(&format!("test -e {a} || echo ABSENT={a}; "));
    }
    s
}

pub fn assert_nodes(r: &Run, present: &[&str], absent: &[&str]) {
    for p in present {
        assert!(
            r.has_line(&format!("PRESENT={p}")),
            "{p} missing:\n{}",
            r.stdout
        );
    }
    for a in absent {
        assert!(
            r.has_line(&format!("ABSENT={a}")),
            "{a} present:\n{}",
            r.stdout
        );
    }
}

/// Opening a node: the device cgroup rule must let it through. The fake majors have no
/// driver, so a permitted open fails with ENXIO ("No such device or address"), never
/// EPERM.
pub fn open_script(path: &str) -> String {
    let tag = path.replace('/', "_");
    format!(
        "(exec 3<{path}) 2>&1 | sed 's/^/OPEN {tag}: /'; (exec 3<{path}) 2>/dev/null && echo 'OPEN {tag}: ok' || true; "
    )
}

pub fn assert_open_allowed(r: &Run, path: &str) {
    let tag = format!("OPEN {}: ", path.replace('/', "_"));
    let lines: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with(&tag)).collect();
    assert!(
        !lines.is_empty(),
        "no open result for {path}:\n{}",
        r.stdout
    );
    assert!(
        lines.iter().all(|l| !l.contains("Operation not permitted")),
        "{path}: the device cgroup denies it: {lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("No such device") || l.ends_with(": ok")),
        "{path}: {lines:?}"
    );
}

/// The interception library's fake driver and client (from `cuda/tests/fakes`).
pub struct CudaFakes {
    /// A fake `libcuda.so.1` backed by host memory (see `fake_cuda.c`).
    pub libcuda: PathBuf,
    /// `cuda_client <mode> <command>...`: one result line per command.
    pub client: PathBuf,
}

/// Builds the fake driver (internal calls bound locally, as the real driver) and the
/// client into `dir`.
pub fn cuda_fakes(dir: &Path) -> CudaFakes {
    let src = testkit_lite::repo_root().join("cuda/tests/fakes");
    std::fs::create_dir_all(dir).unwrap();
    let libcuda = dir.join("libcuda-fake.so.1");
    run_ok(
        Command::new(cc())
            .args([
                "-shared",
                "-fPIC",
                "-pthread",
                "-std=gnu11",
                "-O1",
                "-Wl,-Bsymbolic-functions",
                "-Wl,-soname,libcuda.so.1",
                "-o",
            ])
            .arg(&libcuda)
            .arg(src.join("fake_cuda.c")),
        "building the fake libcuda",
    );
    let client = dir.join("cuda_client");
    run_ok(
        Command::new(cc())
            .args(["-std=gnu11", "-O1", "-o"])
            .arg(&client)
            .arg(src.join("cuda_client.c"))
            .arg("-ldl"),
        "building cuda_client",
    );
    CudaFakes { libcuda, client }
}

/// The real interception library (debug), built into `target_tmpdir` (the test's
/// `CARGO_TARGET_TMPDIR`); see [`testkit_lite::cuda::interception_library`].
pub fn interception_library(target_tmpdir: &Path) -> PathBuf {
    testkit_lite::cuda::interception_library(target_tmpdir, "debug", &[])
}
