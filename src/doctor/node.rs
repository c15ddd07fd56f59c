//! The node's own checks: the driver root and driver, device nodes, the driver files
//! the CDI specs mount, the plugin's directories, the watchdog's prerequisites. Each
//! `check_*` is pure (deterministic over what `gather_*` saw).

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use super::Finding;
use crate::config::GpuMode;
use crate::driver_root::{Layout, Origin};
use crate::inventory::CharMajors;
use crate::node::NodeModel;
use crate::plugin::PluginPaths;
use crate::prepare::cdi_spec::{self, DriverFile};

/// The driver root: given by `--driver-root`, or every candidate tried and the one in
/// use. Fails when discovery found none.
pub fn check_driver_root(layout: &Layout) -> Finding {
    const CHECK: &str = "driver-root";
    let mut saw = Vec::new();
    match &layout.origin {
        Origin::Flag => {
            saw.push(format!(
                "--driver-root {} (the host's {})",
                layout.driver_root.display(),
                layout.host_driver_root.display()
            ));
        }
        Origin::Discovered(tried) => {
            for t in tried {
                let outcome = match &t.outcome {
                    Ok(f) => format!("used: {}", f.note),
                    Err(e) => format!("no: {e}"),
                };
                saw.push(format!(
                    "{} [{}] at {}: {outcome}",
                    t.candidate.host_path,
                    t.candidate.source,
                    t.path.display()
                ));
            }
        }
    }
    saw.push(format!(
        "device nodes from {} (the host's {})",
        layout.dev_root.display(),
        layout.host_dev_root.display()
    ));
    match &layout.origin {
        Origin::Discovered(_) if layout.origin.chosen().is_none() => Finding::fail(
            CHECK,
            saw,
            "no known driver layout works on this node: install the NVIDIA driver, or set --driver-root (Helm: hostPaths.driverRoot) to the directory whose usr/lib*/ or lib64/ holds libnvidia-ml.so.1, as the host sees it under --host-root",
        ),
        _ => Finding::pass(CHECK, saw),
    }
}

/// The driver through the backend: versions, each GPU with its configured mode and MIG
/// state. Fails when the node did not load.
pub fn check_driver(node: &Result<NodeModel, String>) -> Finding {
    const CHECK: &str = "driver";
    let model = match node {
        Ok(m) => m,
        Err(e) => {
            return Finding::fail(
                CHECK,
                vec![e.clone()],
                "check that the NVIDIA kernel driver is loaded (`nvidia-smi` on the host) and that the driver root holds its libnvidia-ml.so.1; a node config error names its field",
            );
        }
    };
    let inv = &model.inventory;
    let mut saw = vec![format!(
        "{} backend: driver {}, CUDA {}, {} GPU(s)",
        model.backend.kind(),
        inv.driver_version,
        inv.cuda_driver_version,
        model.gpus.len()
    )];
    let mut mig_off_elsewhere = Vec::new();
    for g in &model.gpus {
        let mig = if !g.gpu.mig_capable {
            "no MIG".to_string()
        } else if g.gpu.mig_enabled {
            "MIG on".to_string()
        } else {
            "MIG off".to_string()
        };
        saw.push(format!(
            "gpu-{} {} {} mode {} ({mig})",
            g.gpu.minor,
            g.gpu.product_name,
            g.gpu.uuid,
            g.mode.as_str()
        ));
        if g.mode != GpuMode::Mig && g.gpu.mig_enabled {
            mig_off_elsewhere.push(format!("gpu-{}", g.gpu.minor));
        }
    }
    if model.gpus.is_empty() {
        return Finding::warn(
            CHECK,
            saw,
            "no GPU is managed: check the node config's gpus selection, or that the driver sees the GPUs (`nvidia-smi -L`)",
        );
    }
    if !mig_off_elsewhere.is_empty() {
        return Finding::warn(
            CHECK,
            saw,
            format!(
                "{} has MIG on but is not in mig mode: whole-GPU claims on it need MIG off (`nvidia-smi -i <index> -mig 0`, a GPU reset on GPUs that need one), or give it mode mig in the node config",
                mig_off_elsewhere.join(", ")
            ),
        );
    }
    Finding::pass(CHECK, saw)
}

/// One device node the specs name: its path under the dev root, whether it is there
/// as a character device, and its major if so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenNode {
    pub path: String,
    pub state: NodeState,
    /// The major the specs will carry for it.
    pub want_major: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    Missing,
    NotCharDevice,
    CharDevice { major: u32 },
}

/// What the device-node check saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenDeviceNodes {
    pub dev_root: PathBuf,
    /// `None` when the node did not load (no driver majors known).
    pub majors: Option<CharMajors>,
    pub nodes: Vec<SeenNode>,
}

/// Looks at `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`, each GPU's
/// `/dev/nvidia<minor>` and, with a mig-mode GPU, `/dev/nvidia-caps`, under `dev_root`.
pub fn gather_device_nodes(dev_root: &Path, model: Option<&NodeModel>) -> SeenDeviceNodes {
    let majors = model.map(|m| m.inventory.char_majors);
    let mut want: Vec<(String, Option<u32>)> = vec![
        ("/dev/nvidiactl".into(), majors.map(|m| m.nvidia)),
        ("/dev/nvidia-uvm".into(), majors.map(|m| m.nvidia_uvm)),
        ("/dev/nvidia-uvm-tools".into(), majors.map(|m| m.nvidia_uvm)),
    ];
    for g in model.map(|m| m.gpus.as_slice()).unwrap_or_default() {
        want.push((
            format!("/dev/nvidia{}", g.gpu.minor),
            majors.map(|m| m.nvidia),
        ));
    }
    let nodes = want
        .into_iter()
        .map(|(path, want_major)| {
            let full = dev_root.join(path.trim_start_matches('/'));
            let state = match std::fs::metadata(&full) {
                Err(_) => NodeState::Missing,
                Ok(m) if m.file_type().is_char_device() => NodeState::CharDevice {
                    major: major_of(std::os::unix::fs::MetadataExt::rdev(&m)),
                },
                Ok(_) => NodeState::NotCharDevice,
            };
            SeenNode {
                path,
                state,
                want_major,
            }
        })
        .collect();
    let mut seen = SeenDeviceNodes {
        dev_root: dev_root.to_path_buf(),
        majors,
        nodes,
    };
    let any_mig = model.is_some_and(|m| m.gpus.iter().any(|g| g.mode == GpuMode::Mig));
    if any_mig {
        let caps = dev_root.join("dev/nvidia-caps");
        seen.nodes.push(SeenNode {
            path: "/dev/nvidia-caps".into(),
            state: if caps.is_dir() {
                NodeState::CharDevice { major: 0 }
            } else {
                NodeState::Missing
            },
            want_major: majors.and_then(|m| m.nvidia_caps),
        });
    }
    seen
}

/// Linux's `major()` of a `dev_t`.
fn major_of(rdev: u64) -> u32 {
    (((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0x0000_0fff)) as u32
}

/// Device nodes: all present → pass; some missing but every missing one's major known
/// (the specs carry major and minor, the runtime creates the node) → warn; a missing
/// node whose major is unknown → fail; a present node with another major → fail.
pub fn check_device_nodes(seen: &SeenDeviceNodes) -> Finding {
    const CHECK: &str = "device-nodes";
    let mut saw = vec![format!("under {}", seen.dev_root.display())];
    match seen.majors {
        Some(m) => saw.push(format!(
            "majors: nvidia {}, nvidia-uvm {}, nvidia-caps {}",
            m.nvidia,
            m.nvidia_uvm,
            m.nvidia_caps.map_or("unknown".into(), |c| c.to_string())
        )),
        None => saw.push("majors unknown (the node did not load)".into()),
    }
    let (mut missing, mut unknown, mut wrong, mut not_char) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for n in &seen.nodes {
        match n.state {
            NodeState::Missing if n.want_major.is_some() => missing.push(n.path.as_str()),
            NodeState::Missing => unknown.push(n.path.as_str()),
            NodeState::NotCharDevice => not_char.push(n.path.as_str()),
            NodeState::CharDevice { major } => {
                if n.path != "/dev/nvidia-caps" && n.want_major.is_some_and(|w| w != major) {
                    wrong.push(format!("{} (major {major})", n.path));
                }
            }
        }
    }
    let present = seen.nodes.len() - missing.len() - unknown.len() - not_char.len();
    saw.push(format!("{present} of {} present", seen.nodes.len()));
    if !unknown.is_empty() {
        saw.push(format!("missing, major unknown: {}", unknown.join(", ")));
        return Finding::fail(
            CHECK,
            saw,
            "load the NVIDIA kernel modules (`modprobe nvidia nvidia-uvm`, or `nvidia-modprobe -u -c=0`) so that /proc/devices lists their majors",
        );
    }
    if !wrong.is_empty() {
        saw.push(format!(
            "major differs from /proc/devices: {}",
            wrong.join(", ")
        ));
        return Finding::fail(
            CHECK,
            saw,
            "stale device nodes from another driver version: remove them and recreate with `nvidia-modprobe -u -c=0` (or reboot)",
        );
    }
    if !missing.is_empty() || !not_char.is_empty() {
        if !missing.is_empty() {
            saw.push(format!("missing (major known): {}", missing.join(", ")));
        }
        if !not_char.is_empty() {
            saw.push(format!("not character devices: {}", not_char.join(", ")));
        }
        return Finding::warn(
            CHECK,
            saw,
            "the CDI specs still carry these by major and minor, so containers get them; to create them on the host run `nvidia-smi` once or `nvidia-modprobe -u -c=0` (and `nvidia-modprobe -f /proc/driver/nvidia/capabilities/mig/config` for MIG), e.g. from a systemd unit at boot",
        );
    }
    Finding::pass(CHECK, saw)
}

/// What the driver-files check saw: the files the specs mount, as discovered, with
/// the version each file name carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenDriverFiles {
    pub driver_root: PathBuf,
    pub driver_version: Option<String>,
    pub files: Vec<(DriverFile, Option<String>)>,
}

/// Discovers the driver files as the plugin does (at the driver's version when the
/// node loaded) and reads the version from each library's name.
pub fn gather_driver_files(
    driver_root: &Path,
    host_driver_root: &Path,
    model: Option<&NodeModel>,
) -> SeenDriverFiles {
    let driver_version = model.map(|m| m.inventory.driver_version.clone());
    let files = cdi_spec::discover_driver_files(
        driver_root,
        host_driver_root,
        driver_version.as_deref().unwrap_or(""),
    );
    let files = files
        .into_iter()
        .map(|f| {
            let local = driver_root.join(
                Path::new(&f.host_path)
                    .strip_prefix(host_driver_root)
                    .unwrap_or(Path::new(&f.host_path)),
            );
            let base = Path::new(&f.container_path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let base = base
                .find(".so")
                .map_or(base.clone(), |i| base[..i + 3].to_string());
            let version = cdi_spec::driver_lib_version(&local, &base);
            (f, version)
        })
        .collect();
    SeenDriverFiles {
        driver_root: driver_root.to_path_buf(),
        driver_version,
        files,
    }
}

/// Driver files: `libcuda` missing → fail; `libnvidia-ml` or `nvidia-smi` missing, or
/// a library at another version than the driver's → warn.
pub fn check_driver_files(seen: &SeenDriverFiles) -> Finding {
    const CHECK: &str = "driver-files";
    let mut saw = vec![format!("under {}", seen.driver_root.display())];
    for (f, v) in &seen.files {
        saw.push(format!(
            "{} → {}{}",
            f.host_path,
            f.container_path,
            v.as_ref()
                .map_or(String::new(), |v| format!(" (version {v})"))
        ));
    }
    let has = |suffix: &str| {
        seen.files
            .iter()
            .any(|(f, _)| f.container_path.ends_with(suffix))
    };
    if !has("/libcuda.so.1") {
        saw.push("libcuda.so not found".into());
        return Finding::fail(
            CHECK,
            saw,
            format!(
                "no libcuda.so under the driver root {}: containers would start without the CUDA driver. Install the driver's user-space libraries there, or point --driver-root (Helm: hostPaths.driverRoot) at the root that has usr/lib*/libcuda.so.<version>",
                seen.driver_root.display()
            ),
        );
    }
    let mut missing = Vec::new();
    if !has("/libnvidia-ml.so.1") {
        missing.push("libnvidia-ml.so");
    }
    if !has("/nvidia-smi") {
        missing.push("nvidia-smi");
    }
    let stale: Vec<String> = match &seen.driver_version {
        Some(want) => seen
            .files
            .iter()
            .filter_map(|(f, v)| {
                v.as_ref()
                    .filter(|v| *v != want)
                    .map(|v| format!("{} at {v}", f.host_path))
            })
            .collect(),
        None => Vec::new(),
    };
    if !missing.is_empty() || !stale.is_empty() {
        if !missing.is_empty() {
            saw.push(format!("not found: {}", missing.join(", ")));
        }
        if !stale.is_empty() {
            saw.push(format!(
                "not the driver's version {}: {}",
                seen.driver_version.as_deref().unwrap_or("?"),
                stale.join(", ")
            ));
        }
        return Finding::warn(
            CHECK,
            saw,
            "install the driver's user-space utilities and libraries of the same version as the kernel module (containers then get nvidia-smi and NVML)",
        );
    }
    Finding::pass(CHECK, saw)
}

/// One directory the plugin writes and what a write there did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenDir {
    pub role: &'static str,
    pub path: PathBuf,
    pub state: DirState,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirState {
    Writable,
    Missing,
    NotADirectory,
    /// Creating a file failed; the error text.
    NotWritable(String),
}

/// Checks each directory by creating and removing `.tessera-doctor-<pid>` in it.
pub fn gather_directories(paths: &PluginPaths) -> Vec<SeenDir> {
    [
        ("kubelet plugin registry", &paths.plugin_registry_dir),
        ("plugin dir", &paths.plugin_dir),
        ("CDI dir", &paths.cdi_dir),
        ("run dir", &paths.run_dir),
        ("state dir", &paths.state_dir),
    ]
    .into_iter()
    .map(|(role, path)| SeenDir {
        role,
        path: path.clone(),
        state: probe_dir(path),
    })
    .collect()
}

fn probe_dir(path: &Path) -> DirState {
    match std::fs::metadata(path) {
        Err(_) => return DirState::Missing,
        Ok(m) if !m.is_dir() => return DirState::NotADirectory,
        Ok(_) => {}
    }
    let probe = path.join(format!(".tessera-doctor-{}", std::process::id()));
    match std::fs::write(&probe, b"") {
        Ok(()) => {
            let _ = std::fs::remove_file(&probe);
            DirState::Writable
        }
        Err(e) => DirState::NotWritable(e.to_string()),
    }
}

/// Directories: every one writable → pass; any missing, not a directory or not
/// writable → fail, naming the hostPath volume to fix.
pub fn check_directories(seen: &[SeenDir]) -> Finding {
    const CHECK: &str = "directories";
    let mut saw = Vec::new();
    let mut bad = Vec::new();
    for d in seen {
        let state = match &d.state {
            DirState::Writable => "writable".to_string(),
            DirState::Missing => "missing".to_string(),
            DirState::NotADirectory => "not a directory".to_string(),
            DirState::NotWritable(e) => format!("not writable ({e})"),
        };
        if d.state != DirState::Writable {
            bad.push(d.role);
        }
        saw.push(format!("{} {}: {state}", d.role, d.path.display()));
    }
    if bad.is_empty() {
        Finding::pass(CHECK, saw)
    } else {
        Finding::fail(
            CHECK,
            saw,
            format!(
                "the plugin must write its {}: mount the host directory read-write at that path (the DaemonSet's hostPath volumes; Helm: hostPaths.*), make it a directory, and check it is not on a read-only filesystem",
                bad.join(", ")
            ),
        )
    }
}

/// What the watchdog check saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenWatchdog {
    pub mode: crate::watchdog::Mode,
    pub proc_root: PathBuf,
    /// Our PID as the `--proc-root` procfs names us (`<proc-root>/self`), and as we see
    /// it; equal when we share the host's PID namespace.
    pub pid_there: Result<u32, String>,
    pub pid_here: u32,
    /// Reading `<proc-root>/1/cgroup` (the watchdog maps processes to pods by cgroup).
    pub proc_readable: Result<(), String>,
}

pub fn gather_watchdog(proc_root: &Path, mode: crate::watchdog::Mode) -> SeenWatchdog {
    let pid_there = std::fs::read_link(proc_root.join("self"))
        .map_err(|e| format!("cannot read {}/self: {e}", proc_root.display()))
        .and_then(|p| {
            p.to_string_lossy()
                .parse::<u32>()
                .map_err(|e| format!("{}/self → {}: {e}", proc_root.display(), p.display()))
        });
    let proc_readable = std::fs::read_to_string(proc_root.join("1/cgroup"))
        .map(|_| ())
        .map_err(|e| format!("cannot read {}/1/cgroup: {e}", proc_root.display()));
    SeenWatchdog {
        mode,
        proc_root: proc_root.to_path_buf(),
        pid_there,
        pid_here: std::process::id(),
        proc_readable,
    }
}

/// Watchdog prerequisites: off → pass; else the host's PID namespace (hostPID) and a
/// readable `--proc-root` are needed (fail without).
pub fn check_watchdog(seen: &SeenWatchdog) -> Finding {
    const CHECK: &str = "watchdog";
    let mode = format!("{:?}", seen.mode).to_lowercase();
    if seen.mode == crate::watchdog::Mode::Off {
        return Finding::pass(CHECK, vec!["--watchdog off: nothing needed".into()]);
    }
    let mut saw = vec![format!(
        "--watchdog {mode}, --proc-root {}",
        seen.proc_root.display()
    )];
    let mut problems = Vec::new();
    match &seen.pid_there {
        Ok(p) if *p == seen.pid_here => saw.push(format!(
            "PID {p} here and in {}: the host's PID namespace",
            seen.proc_root.display()
        )),
        Ok(p) => {
            saw.push(format!(
                "PID {} here but {p} in {}: a PID namespace of its own",
                seen.pid_here,
                seen.proc_root.display()
            ));
            problems.push("set hostPID: true on the DaemonSet's pod (NVML reports host PIDs; the watchdog kills only in its own namespace)");
        }
        Err(e) => {
            saw.push(e.clone());
            problems.push("mount the host's /proc at --proc-root (hostPath /proc)");
        }
    }
    match &seen.proc_readable {
        Ok(()) => saw.push(format!("{} readable", seen.proc_root.display())),
        Err(e) => {
            saw.push(e.clone());
            problems.push("the plugin must read the host's /proc: run it privileged with hostPID");
        }
    }
    if problems.is_empty() {
        Finding::pass(CHECK, saw)
    } else {
        Finding::fail(CHECK, saw, problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(path: &str, state: NodeState, want: Option<u32>) -> SeenNode {
        SeenNode {
            path: path.into(),
            state,
            want_major: want,
        }
    }

    fn seen(nodes: Vec<SeenNode>) -> SeenDeviceNodes {
        SeenDeviceNodes {
            dev_root: "/".into(),
            majors: Some(CharMajors {
                nvidia: 195,
                nvidia_uvm: 508,
                nvidia_caps: None,
            }),
            nodes,
        }
    }

    /// Present → pass; missing with a known major → warn; missing and unknown → fail;
    /// a node with another major → fail.
    #[test]
    fn device_node_verdicts() {
        use super::super::Verdict::*;
        let ok = NodeState::CharDevice { major: 195 };
        let cases = [
            (vec![node("/dev/nvidiactl", ok, Some(195))], Pass),
            (
                vec![node("/dev/nvidiactl", NodeState::Missing, Some(195))],
                Warn,
            ),
            (
                vec![node("/dev/nvidiactl", NodeState::NotCharDevice, Some(195))],
                Warn,
            ),
            (vec![node("/dev/nvidiactl", NodeState::Missing, None)], Fail),
            (
                vec![node(
                    "/dev/nvidiactl",
                    NodeState::CharDevice { major: 1 },
                    Some(195),
                )],
                Fail,
            ),
        ];
        for (nodes, want) in cases {
            assert_eq!(
                check_device_nodes(&seen(nodes.clone())).verdict,
                want,
                "{nodes:?}"
            );
        }
    }

    /// The major of a `dev_t` as glibc's `gnu_dev_major` computes it.
    #[test]
    fn major_of_decodes_dev_t() {
        assert_eq!(major_of((195 << 8) | 3), 195);
        assert_eq!(major_of((508u64 << 8) | 1), 508);
    }
}
