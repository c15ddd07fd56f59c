//! containerd 1.7 driven through CRI, for the container-runtime tests.
//!
//! Debian bookworm's containerd (1.6) has no CDI, so containerd 1.7 (Debian trixie) runs
//! in the real cluster's Debian trixie chroot (`tests/cluster/chroot.sh`: debootstrap
//! minbase with containerd and runc among its packages), built once and cached in
//! `/var/cache/tessera-e2e/trixie-cluster` (`TESSERA_E2E_CACHE` overrides the parent
//! dir; a fresh machine builds it in half a minute to a few minutes, the mirror's
//! speed). Runs never modify it: containerd starts in a private mount namespace (`unshare -m`)
//! where the chroot is a mount point, `/run` and `/tmp` are fresh tmpfs, and the test's
//! temp dir is bind-mounted at the same absolute path, so CDI `hostPath`s, the CDI spec
//! dir, the socket and all of containerd's state (root, state, logs) resolve alike on both
//! sides. The test image is a docker-archive built from a rootfs dir with `tar`, imported
//! with `ctr -n k8s.io images import`; no registry. Containers run in one host-network
//! pod sandbox whose cgroup parent is private to the run, so everything left over after a
//! failure is found and killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tessera::kubelet::proto::cri::{self, runtime_service_client::RuntimeServiceClient};
use testkit_lite::sys;
use tonic::transport::Channel;

use crate::e2e::{Run, run_ok};

/// The tag of the test image (also the pod sandbox image: nothing is pulled).
pub const IMAGE: &str = "localhost/tessera/e2e:1";

/// The cached Debian trixie chroot with containerd 1.7 and runc: the real cluster's
/// (`tests/cluster/chroot.sh`, which also holds etcd, the CNI plugins and busybox, and
/// `/etc/hosts`, which a host-network pod sandbox copies from the runtime's root), one
/// debootstrap for both suites. Built on first use under the script's lock (CI builds it
/// in the background before the tests), its progress on stderr. Returns its path, or the
/// script's failure (e.g. no Debian mirror reachable).
pub fn chroot() -> Result<PathBuf, String> {
    let script = testkit_lite::repo_root().join("tests/cluster/chroot.sh");
    let out = Command::new(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}); its output is above",
            script.display(),
            out.status
        ));
    }
    let root = String::from_utf8_lossy(&out.stdout);
    let root = PathBuf::from(root.lines().last().unwrap_or_default());
    if !root.join("usr/bin/containerd").is_file() {
        return Err(format!(
            "{} printed {}, which has no usr/bin/containerd",
            script.display(),
            root.display()
        ));
    }
    Ok(root)
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Writes a docker-archive (`docker save` layout) of `rootfs` as `tag` into `out`: one
/// layer made with `tar`, its sha256 as the diff ID, a config whose default command
/// sleeps (the pod sandbox's "pause" process).
pub fn docker_archive(rootfs: &Path, tag: &str, out: &Path) {
    let dir = out.with_extension("d");
    std::fs::create_dir_all(&dir).unwrap();
    let layer = dir.join("layer.tar");
    let mut names: Vec<String> = std::fs::read_dir(rootfs)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    run_ok(
        Command::new("tar")
            .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
            .arg(rootfs)
            .arg("-cf")
            .arg(&layer)
            .args(&names),
        "tar (image layer)",
    );
    let diff_id = format!(
        "sha256:{:x}",
        Sha256::digest(std::fs::read(&layer).unwrap())
    );
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Cmd": ["/bin/sleep", "3600"],
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "tessera e2e (testkit/src/cri.rs)"}],
    })
    .to_string();
    let config_name = format!("{:x}.json", Sha256::digest(config.as_bytes()));
    std::fs::write(dir.join(&config_name), &config).unwrap();
    let manifest = serde_json::json!([{
        "Config": config_name,
        "RepoTags": [tag],
        "Layers": ["layer.tar"],
    }]);
    std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
    run_ok(
        Command::new("tar")
            .args(["--numeric-owner", "-C"])
            .arg(&dir)
            .arg("-cf")
            .arg(out)
            .args(["manifest.json", &config_name, "layer.tar"]),
        "tar (docker archive)",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A containerd 1.7 daemon in the chroot, in its own mount namespace.
pub struct Containerd {
    chroot: PathBuf,
    pub work: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
    /// The cgroup parent of every pod of this daemon (private to the run).
    pub cgroup_parent: String,
    child: Option<Child>,
}

impl Containerd {
    /// Starts containerd with CDI on and `cdi_dir` as its only spec dir; all state is
    /// under `work`. `shares` (which must hold `work` and every CDI `hostPath`) appear
    /// at the same paths inside the chroot.
    pub fn start(chroot: &Path, work: &Path, cdi_dir: &Path, shares: &[&Path]) -> Containerd {
        std::fs::create_dir_all(work.join("cni")).unwrap();
        let socket = work.join("containerd.sock");
        let config = work.join("config.toml");
        let w = work.display();
        std::fs::write(
            &config,
            format!(
                r#"version = 2
root = "{w}/root"
state = "{w}/state"
[grpc]
  address = "{sock}"
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  cdi_spec_dirs = ["{cdi}"]
  # No CAP_SYS_RESOURCE in the sandbox: the pause container's oom_score_adj=-998 fails.
  restrict_oom_score_adj = true
  sandbox_image = "{IMAGE}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{w}/cni"
"#,
                sock = socket.display(),
                cdi = cdi_dir.display(),
            ),
        )
        .unwrap();
        let log = work.join("containerd.log");
        let logf = std::fs::File::create(&log).unwrap();
        let script = r#"set -e
R="$1"; CONF="$2"; shift 2
mount --bind "$R" "$R"
mount -t proc proc "$R/proc"
mount --rbind /sys "$R/sys"
mount --rbind /dev "$R/dev"
mount -t tmpfs tmpfs "$R/run"
mount -t tmpfs tmpfs "$R/tmp"
for d in "$@"; do mkdir -p "$R$d"; mount --bind "$d" "$R$d"; done
exec chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root containerd --config "$CONF"
"#;
        let child = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
            ])
            .arg(chroot)
            .arg(&config)
            .args(shares)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .expect("unshare + containerd");
        let name = work
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut c = Containerd {
            chroot: chroot.to_path_buf(),
            work: work.to_path_buf(),
            socket,
            log,
            cgroup_parent: format!("/tessera-e2e-{}-{}", std::process::id(), name),
            child: Some(child),
        };
        // Until it listens (the socket file exists from `bind` on, a moment before).
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(&c.socket).is_err() {
            if let Some(st) = c.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("containerd exited ({st}):\n{}", c.log_tail(30));
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "containerd did not listen on {} in 60 s:\n{}",
                c.socket.display(),
                c.log_tail(30)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        c
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// `ctr` inside containerd's namespace and chroot, in the CRI namespace `k8s.io`.
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg("--mount")
            .arg(format!("--target={}", self.pid()))
            .arg("chroot")
            .arg(&self.chroot)
            .arg("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .output()
            .expect("nsenter + ctr")
    }

    /// Imports a docker-archive tar (which must be under a shared path).
    pub fn import(&self, tar: &Path) {
        let out = self.ctr(&["images", "import", &tar.display().to_string()]);
        assert!(
            out.status.success(),
            "ctr images import: {}\n{}\ncontainerd:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log_tail(20)
        );
    }

    pub fn log_tail(&self, n: usize) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), n)
    }

    /// containerd's own errors and CDI messages since the log had `from` bytes.
    pub fn errors_since(&self, from: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.get(from..)
            .unwrap_or("")
            .lines()
            .filter(|l| l.contains("level=error") || l.contains("CDI") || l.contains("cdi"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// What containerd's CDI registry said about the spec files (refresh errors, specs
    /// it could not load): empty when it accepted every spec it read.
    pub fn cdi_registry_complaints(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                let lower = l.to_lowercase();
                lower.contains("cdi")
                    && (lower.contains("level=error") || lower.contains("level=warn"))
                    && !lower.contains("unresolvable cdi devices")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn log_len(&self) -> usize {
        std::fs::metadata(&self.log).map_or(0, |m| m.len() as usize)
    }

    /// Stops containerd and kills what outlives it: the shims of this daemon (their
    /// command line names its socket) and every process in this run's pod cgroups, then
    /// removes those cgroups.
    fn shutdown(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id() as i32;
            // Our own child.
            sys::kill(pid, sys::SIGTERM);
            let t = Instant::now();
            while child.try_wait().ok().flatten().is_none() {
                if t.elapsed() > Duration::from_secs(5) {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let sock = self.socket.display().to_string();
        for _ in 0..50 {
            let mut left = 0;
            for pid in pids_with_arg(&sock) {
                left += 1;
                // A shim started by this run's containerd.
                sys::kill(pid, sys::SIGKILL);
            }
            left += kill_cgroup(&self.cgroup_parent);
            if left == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Processes whose command line has `arg` as one argument.
fn pids_with_arg(arg: &str) -> Vec<i32> {
    let mut v = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return v;
    };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline"))
            && cmd.split(|b| *b == 0).any(|a| a == arg.as_bytes())
        {
            v.push(pid);
        }
    }
    v
}

/// Kills every process in the cgroup `parent` (all hierarchies) and removes its dirs
/// bottom-up. Returns how many processes or dirs were still there.
fn kill_cgroup(parent: &str) -> usize {
    let mut left = 0;
    let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") else {
        return 0;
    };
    for h in rd.flatten() {
        let top = h.path().join(parent.trim_start_matches('/'));
        if top.is_dir() {
            left += kill_tree(&top);
        }
    }
    left
}

fn kill_tree(dir: &Path) -> usize {
    let mut left = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                left += kill_tree(&e.path());
            }
        }
    }
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            left += 1;
            // A process of this run's pod cgroup.
            sys::kill(pid, sys::SIGKILL);
        }
    }
    if std::fs::remove_dir(dir).is_err() {
        left += 1;
    }
    left
}

/// A CRI client holding one host-network pod sandbox.
pub struct Cri {
    pub rt: RuntimeServiceClient<Channel>,
    pub version: cri::VersionResponse,
    sandbox_id: String,
    sandbox_config: cri::PodSandboxConfig,
    log_dir: PathBuf,
    n: u32,
}

fn host_network() -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: cri::NamespaceMode::Node as i32,
        pid: cri::NamespaceMode::Container as i32,
        ..Default::default()
    }
}

impl Cri {
    /// Connects over containerd's socket and runs the pod sandbox.
    pub async fn connect(c: &Containerd) -> Cri {
        let ch = crate::kubelet_standin::connect_unix(&c.socket)
            .await
            .expect("connect to containerd's socket");
        let mut rt = RuntimeServiceClient::new(ch);
        let version = rt
            .version(cri::VersionRequest::default())
            .await
            .expect("CRI Version")
            .into_inner();
        let log_dir = c.work.join("pod-logs");
        std::fs::create_dir_all(&log_dir).unwrap();
        let sandbox_config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "tessera-e2e".into(),
                uid: format!("e2e-{}", std::process::id()),
                namespace: "default".into(),
                attempt: 0,
            }),
            log_directory: log_dir.display().to_string(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: c.cgroup_parent.clone(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(host_network()),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let from = c.log_len();
        let sandbox_id = match rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(sandbox_config.clone()),
                runtime_handler: String::new(),
            })
            .await
        {
            Ok(r) => r.into_inner().pod_sandbox_id,
            Err(e) => panic!(
                "RunPodSandbox: {}\ncontainerd:\n{}",
                e.message(),
                c.errors_since(from)
            ),
        };
        Cri {
            rt,
            version,
            sandbox_id,
            sandbox_config,
            log_dir,
            n: 0,
        }
    }

    /// Creates, starts and waits for a container running `/bin/sh -c script` with
    /// `cdi` in `ContainerConfig.CDI_devices`; returns its log (stdout and stderr
    /// lines), or the error of the first CRI call that failed.
    pub async fn run(&mut self, cdi: &[String], script: &str) -> Result<Run, tonic::Status> {
        self.n += 1;
        let name = format!("c{}", self.n);
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.clone(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: IMAGE.into(),
                ..Default::default()
            }),
            command: vec!["/bin/sh".into(), "-c".into(), script.into()],
            log_path: format!("{name}.log"),
            linux: Some(cri::LinuxContainerConfig {
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(host_network()),
                    ..Default::default()
                }),
            }),
            cdi_devices: cdi
                .iter()
                .map(|n| cri::CdiDevice { name: n.clone() })
                .collect(),
            ..Default::default()
        };
        let id = self
            .rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: self.sandbox_id.clone(),
                config: Some(config),
                sandbox_config: Some(self.sandbox_config.clone()),
            })
            .await?
            .into_inner()
            .container_id;
        let result = self.start_and_wait(&id).await;
        let _ = self
            .rt
            .remove_container(cri::RemoveContainerRequest {
                container_id: id.clone(),
            })
            .await;
        let status = result?;
        let log =
            std::fs::read_to_string(self.log_dir.join(format!("{name}.log"))).unwrap_or_default();
        let (mut stdout, mut stderr) = (String::new(), String::new());
        // CRI log lines: `<time> <stream> <P|F> <text>`.
        for line in log.lines() {
            let mut f = line.splitn(4, ' ');
            let (_, stream, _, text) = (f.next(), f.next(), f.next(), f.next().unwrap_or(""));
            let out = if stream == Some("stderr") {
                &mut stderr
            } else {
                &mut stdout
            };
            out.push_str(text);
            out.push('\n');
        }
        if status.exit_code != 0 {
            stderr.push_str(&format!(
                "exit code {} ({}: {})\n",
                status.exit_code, status.reason, status.message
            ));
        }
        Ok(Run {
            ok: status.exit_code == 0,
            stdout,
            stderr,
        })
    }

    async fn start_and_wait(&mut self, id: &str) -> Result<cri::ContainerStatus, tonic::Status> {
        self.rt
            .start_container(cri::StartContainerRequest {
                container_id: id.into(),
            })
            .await?;
        let t = Instant::now();
        loop {
            let st = self
                .rt
                .container_status(cri::ContainerStatusRequest {
                    container_id: id.into(),
                    verbose: false,
                })
                .await?
                .into_inner()
                .status
                .unwrap_or_default();
            if st.state == cri::ContainerState::ContainerExited as i32 {
                return Ok(st);
            }
            if t.elapsed() > Duration::from_secs(60) {
                let _ = self
                    .rt
                    .stop_container(cri::StopContainerRequest {
                        container_id: id.into(),
                        timeout: 0,
                    })
                    .await;
                return Err(tonic::Status::deadline_exceeded(format!(
                    "container {id} still running after 60 s"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops and removes the pod sandbox.
    pub async fn stop(mut self) {
        let id = std::mem::take(&mut self.sandbox_id);
        self.rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .expect("StopPodSandbox");
        self.rt
            .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
            .await
            .expect("RemovePodSandbox");
    }
}
