//! Rendering a claim's CDI spec (pure) and discovering the driver files it mounts
//! (the one I/O step, done once at start-up).
//!
//! One spec per claim, kind `tessera.dev/gpu`, file `tessera.dev-gpu-<claimUID>.json`.
//! Each device's own edits hold its device node (the CDI library rejects devices with
//! empty edits); edits every device of the claim needs (control and uvm nodes, driver
//! libraries and `nvidia-smi`) are spec-level. The version is the minimum the content
//! needs, at most 0.5.0 (podman 4.3.1 loads nothing newer; containerd 1.7 nothing
//! older when `hostPath` is used).

use std::path::{Path, PathBuf};

use tessera_cdi::{
    ContainerEdits, Device, DeviceNode, Hook, Mount, Spec, SpecFileNames, SpecVersion,
    VersionPolicy, WriteError,
};

use crate::inventory::CharMajors;
use crate::prepare::claim_plan::ClaimPlan;

/// CDI vendor/class of every Tessera spec.
pub const CDI_KIND: &str = "tessera.dev/gpu";
/// Prefix of Tessera's spec files (used by the start-up sweep).
pub const SPEC_FILE_PREFIX: &str = "tessera.dev-gpu-";
/// The version policy: minimum needed, never above what podman 4.3.1 accepts.
pub const VERSION_POLICY: VersionPolicy = VersionPolicy::MinimumAtMost(SpecVersion::V0_5_0);

/// `tessera.dev-gpu-<uid>.json` and its temp `.tessera-<uid>.tmp`.
pub fn spec_file_names(claim_uid: &str) -> Result<SpecFileNames, WriteError> {
    SpecFileNames::new(
        format!("{SPEC_FILE_PREFIX}{claim_uid}.json"),
        format!(".tessera-{claim_uid}.tmp"),
    )
}

/// The fully qualified CDI device ID `tessera.dev/gpu=<name>`.
pub fn cdi_device_id(name: &str) -> String {
    format!("{CDI_KIND}={name}")
}

/// A host file mounted read-only into containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFile {
    pub host_path: String,
    pub container_path: String,
}

/// What rendering needs besides the claim: where things are on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiContext {
    /// The host's device root, prefixed to `/dev/...` in `hostPath`.
    pub host_dev_root: PathBuf,
    pub majors: CharMajors,
    pub driver_files: Vec<DriverFile>,
    /// The run dir as the host sees it (claim files, library, `ld.so.preload`).
    pub host_run_dir: PathBuf,
    /// The installed interception library version; `None` if none is installed, in
    /// which case shared-GPU claims are refused rather than left unenforced.
    pub interception: Option<String>,
}

fn host_dev(ctx: &CdiContext, path: &str) -> String {
    join_host(&ctx.host_dev_root, path)
}

/// `root` + absolute `path`, without doubling slashes (`/` + `/dev/x` = `/dev/x`).
pub fn join_host(root: &Path, path: &str) -> String {
    root.join(path.trim_start_matches('/'))
        .display()
        .to_string()
}

/// A MIG device as its spec names it: (GI ID, CI ID) for its capability nodes, and
/// the UUID of the MIG device (`MIG-...`, once NVML made it).
pub type MigCaps = (u32, u32, Option<String>);

/// The environment variable naming a MIG device's UUID in its CDI device's edits:
/// `TESSERA_MIG_UUID_<gpu minor>_<GI ID>_<CI ID>`, unique on the node, so that a
/// container holding several MIG devices (of one claim or several) learns each one's
/// UUID (for `CUDA_VISIBLE_DEVICES`, `nvidia-smi -i`, logs) without one spec's value
/// replacing another's.
pub fn mig_uuid_env(gpu_minor: u32, gi: u32, ci: u32) -> String {
    format!("TESSERA_MIG_UUID_{gpu_minor}_{gi}_{ci}")
}

/// The claim's spec. Deterministic: devices in plan order, spec-level edits fixed. A
/// MIG device gets its parent's `/dev/nvidia<minor>` plus its GI and CI capability
/// nodes (`mig-and-cuda-facts.md` A2.1), and its UUID in [`mig_uuid_env`] when known;
/// `mig_caps` gives each MIG device's (GI ID, CI ID, UUID) in plan order. Fails when a MIG device is present but the `nvidia-caps` major
/// is unknown.
pub fn render_claim_spec(
    plan: &ClaimPlan,
    ctx: &CdiContext,
    mig_caps: &[Option<MigCaps>],
) -> Result<Spec, String> {
    let mut devices = Vec::with_capacity(plan.devices.len());
    for (i, d) in plan.devices.iter().enumerate() {
        let path = format!("/dev/nvidia{}", d.gpu_minor);
        let mut edits = ContainerEdits::default().with_device_node(DeviceNode::char(
            path.clone(),
            host_dev(ctx, &path),
            i64::from(ctx.majors.nvidia),
            i64::from(d.gpu_minor),
        ));
        if let Some((gi, ci, uuid)) = mig_caps.get(i).cloned().flatten() {
            if let Some(uuid) = uuid {
                edits = edits.with_env(&mig_uuid_env(d.gpu_minor, gi, ci), &uuid);
            }
            let major = ctx.majors.nvidia_caps.ok_or(
                "the nvidia-caps character-device major is unknown (not in /proc/devices)",
            )?;
            for minor in [
                crate::mig::geometry::gi_cap_minor(d.gpu_minor, gi),
                crate::mig::geometry::ci_cap_minor(d.gpu_minor, gi, ci),
            ] {
                let cap = format!("/dev/nvidia-caps/nvidia-cap{minor}");
                edits = edits.with_device_node(
                    DeviceNode::char(
                        cap.clone(),
                        host_dev(ctx, &cap),
                        i64::from(major),
                        i64::from(minor),
                    )
                    .with_permissions("r"),
                );
            }
        }
        devices.push(Device::new(d.cdi_name(&plan.uid), edits));
    }
    let mut common = ContainerEdits::default();
    for (path, major, minor) in [
        ("/dev/nvidiactl", ctx.majors.nvidia, 255),
        ("/dev/nvidia-uvm", ctx.majors.nvidia_uvm, 0),
        ("/dev/nvidia-uvm-tools", ctx.majors.nvidia_uvm, 1),
    ] {
        common = common.with_device_node(DeviceNode::char(
            path,
            host_dev(ctx, path),
            i64::from(major),
            i64::from(minor),
        ));
    }
    common = driver_mounts(ctx, common);
    if plan.is_shared() {
        common = shared_claim_mounts(plan, ctx, common)?;
    }
    Ok(Spec::new("auto", CDI_KIND, devices).with_container_edits(common))
}

/// The driver files. With an interception library installed, in every spec (whole
/// GPUs too: CDI runtimes replace a mount at one container path by the last spec's,
/// so a container holding a whole-GPU claim and a shared one must get the same file
/// from both), `libcuda.so.1` and `libnvidia-ml.so.1` are Tessera's soname shims,
/// the real files are mounted at `/usr/local/tessera/driver/*.real` (where each shim
/// NEEDs its own), and the library directory at `/usr/local/tessera/lib` (where the
/// shims load the interception library from). A process then reaches the driver
/// through Tessera's library even when `ld.so.preload` was skipped (renamed `/etc`);
/// in a container without a shared claim the library finds no budget and forwards.
fn driver_mounts(ctx: &CdiContext, mut edits: ContainerEdits) -> ContainerEdits {
    use crate::prepare::library as lib;
    let version = ctx.interception.as_deref();
    for f in &ctx.driver_files {
        let shim = lib::SHIMMED
            .iter()
            .find(|(soname, _, _)| f.container_path.rsplit('/').next() == Some(*soname));
        edits = match (version, shim) {
            (Some(version), Some((_, shim, real))) => edits
                .with_mount(Mount::bind_ro(
                    join_host(
                        &ctx.host_run_dir,
                        &format!("{}/{version}/{shim}", lib::LIB_DIR),
                    ),
                    f.container_path.clone(),
                ))
                .with_mount(Mount::bind_ro(
                    f.host_path.clone(),
                    format!("{}/{real}", lib::CONTAINER_DRIVER_DIR),
                )),
            _ => edits.with_mount(Mount::bind_ro(
                f.host_path.clone(),
                f.container_path.clone(),
            )),
        };
    }
    if let Some(version) = version {
        edits = edits.with_mount(Mount::bind_ro(
            join_host(&ctx.host_run_dir, &format!("{}/{version}", lib::LIB_DIR)),
            lib::CONTAINER_LIB_DIR,
        ));
    }
    edits
}

/// The mounts of a claim with shared-GPU devices (besides [`driver_mounts`]' library
/// directory) and its hook (which pins the directories above them,
/// [`lib::PINNED_DIRS`]): its version's `ld.so.preload` at `/etc/ld.so.preload` (identical in every
/// shared claim's spec of one version, so two claims in one container agree; across
/// versions, the last spec's pair wins whole), and the claim's own three files, each mounted as a single
/// file under `/run/tessera/claims/<uid>/` (never a writable directory): `limits` and
/// `control` read-only, `region` read-write.
fn shared_claim_mounts(
    plan: &ClaimPlan,
    ctx: &CdiContext,
    mut edits: ContainerEdits,
) -> Result<ContainerEdits, String> {
    use crate::prepare::library as lib;
    let version = ctx.interception.as_deref().ok_or(
        "no interception library is installed (see --interception-lib): a shared-GPU claim would not be enforced",
    )?;
    let run = &ctx.host_run_dir;
    edits = edits.with_mount(Mount::bind_ro(
        join_host(
            run,
            &format!("{}/{version}/{}", lib::LIB_DIR, lib::PRELOAD_FILE),
        ),
        "/etc/ld.so.preload",
    ));
    // The hook runs on the host, from the version directory, before the container's
    // `pivot_root`: it makes `/etc` and the directories above the library and the
    // driver's real files mount points, which the tenant cannot rename.
    let mut hook = Hook::new(
        "createContainer",
        join_host(
            run,
            &format!("{}/{version}/{}", lib::LIB_DIR, lib::HOOK_FILE),
        ),
    );
    hook.args = std::iter::once(lib::HOOK_FILE)
        .chain(["pin"])
        .chain(lib::PINNED_DIRS)
        .map(String::from)
        .collect();
    edits = edits.with_hook(hook);
    for (name, rw) in [
        (tessera_abi::LIMITS_FILE, false),
        (tessera_abi::CONTROL_FILE, false),
        (tessera_abi::REGION_FILE, true),
    ] {
        let host = join_host(
            run,
            &format!(
                "{}/{}/{name}",
                crate::prepare::claim_files::CLAIMS_DIR,
                plan.uid
            ),
        );
        let container = format!("{}/{}/{name}", tessera_abi::CONTAINER_CLAIMS_DIR, plan.uid);
        edits = edits.with_mount(if rw {
            Mount::bind_rw(host, container)
        } else {
            Mount::bind_ro(host, container)
        });
    }
    Ok(edits)
}

/// Driver libraries a CUDA container needs, with their sonames. `libcuda` is
/// essential; the others are mounted when present.
const DRIVER_LIBS: &[(&str, &str)] = &[
    ("libcuda.so", "libcuda.so.1"),
    ("libnvidia-ml.so", "libnvidia-ml.so.1"),
    (
        "libnvidia-ptxjitcompiler.so",
        "libnvidia-ptxjitcompiler.so.1",
    ),
    ("libnvidia-nvvm.so", "libnvidia-nvvm.so.4"),
];
/// Library directories searched under the driver root, in order.
const LIB_DIRS: &[&str] = &[
    "usr/lib/x86_64-linux-gnu",
    "usr/lib64",
    "lib/x86_64-linux-gnu",
    "lib64",
    "usr/lib",
    "lib",
];
/// Where libraries go in the container: the default lib dir of Debian/Ubuntu images,
/// so an unmodified image finds `libcuda.so.1` without `LD_LIBRARY_PATH`.
pub const CONTAINER_LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";
const BIN_DIRS: &[&str] = &["usr/bin", "bin", "usr/local/bin"];

/// Finds the driver files under `driver_root` (the plugin's view) and maps them to
/// `host_driver_root` (the host's view) for the spec. A library is taken as
/// `<lib>.<driver_version>` (what the driver installs), else its soname file. Missing
/// files are skipped; the caller warns when `libcuda` is missing.
pub fn discover_driver_files(
    driver_root: &Path,
    host_driver_root: &Path,
    driver_version: &str,
) -> Vec<DriverFile> {
    let mut out = Vec::new();
    for (base, soname) in DRIVER_LIBS {
        let candidates = [format!("{base}.{driver_version}"), soname.to_string()];
        let found = LIB_DIRS.iter().find_map(|dir| {
            candidates
                .iter()
                .map(|c| format!("{dir}/{c}"))
                .find(|rel| driver_root.join(rel).is_file())
        });
        if let Some(rel) = found {
            out.push(DriverFile {
                host_path: join_host(host_driver_root, &rel),
                container_path: format!("{CONTAINER_LIB_DIR}/{soname}"),
            });
        }
    }
    if let Some(rel) = BIN_DIRS
        .iter()
        .map(|d| format!("{d}/nvidia-smi"))
        .find(|rel| driver_root.join(rel).is_file())
    {
        out.push(DriverFile {
            host_path: join_host(host_driver_root, &rel),
            container_path: "/usr/bin/nvidia-smi".into(),
        });
    }
    out
}

/// The first file under `driver_root`'s library directories (in [`LIB_DIRS`] order)
/// that is the library `base` (e.g. `libcuda.so`): its soname, else any `<base>.<ver>`.
/// Reads directories only.
pub fn find_driver_lib(driver_root: &Path, base: &str) -> Option<PathBuf> {
    let soname = DRIVER_LIBS
        .iter()
        .find(|(b, _)| *b == base)
        .map_or_else(|| format!("{base}.1"), |(_, s)| s.to_string());
    LIB_DIRS.iter().find_map(|dir| {
        let d = driver_root.join(dir);
        let exact = d.join(&soname);
        if exact.is_file() {
            return Some(exact);
        }
        let prefix = format!("{base}.");
        let mut names: Vec<PathBuf> = std::fs::read_dir(&d)
            .ok()?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        names.sort();
        names.pop()
    })
}

/// The version a driver library's file name carries (`libcuda.so.580.65.06` →
/// `580.65.06`), following a soname symlink to its target. `None` for a bare soname
/// that is not a link to a versioned file. Reads the link only.
pub fn driver_lib_version(path: &Path, base: &str) -> Option<String> {
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let version_of = |n: String| {
        n.strip_prefix(&format!("{base}."))
            .filter(|v| v.contains('.'))
            .map(str::to_string)
    };
    name(path).and_then(version_of).or_else(|| {
        let target = std::fs::read_link(path).ok()?;
        name(&target).and_then(version_of)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::claim_plan::{Budget, PlannedDevice};
    use crate::prepare::gpu_config::GpuConfig;

    fn ctx() -> CdiContext {
        CdiContext {
            host_dev_root: PathBuf::from("/"),
            majors: CharMajors {
                nvidia: 195,
                nvidia_uvm: 508,
                nvidia_caps: Some(511),
            },
            driver_files: vec![DriverFile {
                host_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06".into(),
                container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
            }],
            host_run_dir: PathBuf::from("/run/tessera"),
            interception: Some("0.1.0-abc".into()),
        }
    }

    fn plan(devices: &[(u32, Option<&str>)]) -> ClaimPlan {
        ClaimPlan {
            uid: "0b5c6e2a-1f3d-4c8e-9a7b-2d4f6e8a0c1e".into(),
            namespace: "ns".into(),
            name: "c".into(),
            devices: devices
                .iter()
                .map(|(minor, share)| PlannedDevice {
                    request: "gpu".into(),
                    pool: "node".into(),
                    device: format!("gpu-{minor}"),
                    share_id: share.map(str::to_string),
                    gpu_minor: *minor,
                    gpu_uuid: format!("GPU-{minor}"),
                    config: GpuConfig::default(),
                    mig: None,
                    budget: None,
                })
                .collect(),
        }
    }

    /// A whole-GPU claim: its device node per device, control/uvm nodes and driver
    /// files once, at cdiVersion 0.5.0, valid for the CDI library.
    #[test]
    fn whole_gpu_claim_renders_device_nodes_and_driver_mounts() {
        let spec = render_claim_spec(&plan(&[(2, None), (3, None)]), &ctx(), &[]).unwrap();
        let rendered = tessera_cdi::render_spec(&spec, VERSION_POLICY, "f.json").unwrap();
        assert_eq!(rendered.spec.cdi_version, "0.5.0");
        let names: Vec<_> = spec.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "0b5c6e2a-1f3d-4c8e-9a7b-2d4f6e8a0c1e-gpu-2",
                "0b5c6e2a-1f3d-4c8e-9a7b-2d4f6e8a0c1e-gpu-3"
            ]
        );
        let node = &spec.devices[1].container_edits.device_nodes[0];
        assert_eq!(
            (node.path.as_str(), node.major, node.minor),
            ("/dev/nvidia3", Some(195), Some(3))
        );
        let common = spec.container_edits.as_ref().unwrap();
        let paths: Vec<_> = common
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(
            paths,
            ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        );
        assert_eq!(
            common.mounts[0].container_path,
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
        );
        assert!(common.mounts[0].options.contains(&"ro".to_string()));
    }

    /// With a library installed, every spec, whole-GPU or shared, mounts the same
    /// files at the driver's sonames (Tessera's shims, from the version directory),
    /// the real file at `/usr/local/tessera/driver/libcuda.real` and the library
    /// directory: a container holding both kinds of claim gets one layout whichever
    /// spec the runtime applies last. Without a library, the driver itself.
    #[test]
    fn every_spec_mounts_the_shim_at_the_driver_soname() {
        let mounts = |plan: &ClaimPlan, c: &CdiContext| -> Vec<(String, String)> {
            let spec = render_claim_spec(plan, c, &[]).unwrap();
            let mut m: Vec<_> = spec
                .container_edits
                .unwrap()
                .mounts
                .iter()
                .filter(|m| !m.container_path.starts_with("/run/tessera/claims"))
                .filter(|m| m.container_path != "/etc/ld.so.preload")
                .map(|m| (m.host_path.clone(), m.container_path.clone()))
                .collect();
            m.sort();
            m
        };
        let whole = mounts(&plan(&[(2, None)]), &ctx());
        let shared = mounts(
            &plan(&[(1, Some("9f1c2d3e-aaaa-4bbb-8ccc-dddddddddddd"))]),
            &ctx(),
        );
        assert_eq!(whole, shared);
        let pair = |h: &str, c: &str| (h.to_string(), c.to_string());
        assert_eq!(
            whole,
            [
                pair("/run/tessera/lib/0.1.0-abc", "/usr/local/tessera/lib"),
                pair(
                    "/run/tessera/lib/0.1.0-abc/libtessera_shim_cuda.so",
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
                ),
                pair(
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06",
                    "/usr/local/tessera/driver/libcuda.real"
                ),
            ]
        );
        let mut none = ctx();
        none.interception = None;
        assert_eq!(
            mounts(&plan(&[(2, None)]), &none),
            [pair(
                "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
            )]
        );
    }

    /// Shared allocations carry their shareID in the CDI name.
    #[test]
    fn shared_allocations_carry_the_share_id() {
        let spec = render_claim_spec(
            &plan(&[(1, Some("9f1c2d3e-aaaa-4bbb-8ccc-dddddddddddd"))]),
            &ctx(),
            &[],
        )
        .unwrap();
        assert_eq!(
            spec.devices[0].name,
            "0b5c6e2a-1f3d-4c8e-9a7b-2d4f6e8a0c1e-gpu-1-9f1c2d3e-aaaa-4bbb-8ccc-dddddddddddd"
        );
    }

    /// A shared claim's spec runs the CDI hook from the host's copy of its library
    /// version, pinning `/etc` and the directories above the library and driver
    /// mounts; a whole-GPU spec has no budget to protect and runs nothing.
    #[test]
    fn a_shared_claim_spec_pins_the_directories_above_its_mounts() {
        let mut shared = plan(&[(1, Some("9f1c2d3e-aaaa-4bbb-8ccc-dddddddddddd"))]);
        shared.devices[0].budget = Some(Budget {
            memory_bytes: 1 << 30,
            compute_percent: 25,
        });
        let spec = render_claim_spec(&shared, &ctx(), &[]).unwrap();
        let hooks = &spec.container_edits.as_ref().unwrap().hooks;
        assert_eq!(hooks.len(), 1, "{hooks:?}");
        assert_eq!(hooks[0].hook_name, "createContainer");
        assert_eq!(hooks[0].path, "/run/tessera/lib/0.1.0-abc/tessera-cdi-hook");
        assert_eq!(
            hooks[0].args,
            [
                "tessera-cdi-hook",
                "pin",
                "/etc",
                "/usr",
                "/usr/local",
                "/usr/local/tessera"
            ]
        );
        let whole = render_claim_spec(&plan(&[(0, None)]), &ctx(), &[]).unwrap();
        assert!(whole.container_edits.unwrap().hooks.is_empty());
    }

    /// Host paths honour the host dev root.
    #[test]
    fn host_dev_root_prefixes_host_paths() {
        let mut c = ctx();
        c.host_dev_root = PathBuf::from("/run/fake-dev-root");
        let spec = render_claim_spec(&plan(&[(0, None)]), &c, &[]).unwrap();
        let node = &spec.devices[0].container_edits.device_nodes[0];
        assert_eq!(
            node.host_path.as_deref(),
            Some("/run/fake-dev-root/dev/nvidia0")
        );
        assert_eq!(node.path, "/dev/nvidia0");
    }

    /// A MIG device's UUID, once known, is in its device's environment, named by its
    /// GPU, GI and CI; the spec's own environment does not change.
    #[test]
    fn a_mig_devices_uuid_is_in_its_environment() {
        let uuid = "MIG-5f1e9d2c-7a3b-5c4d-8e6f-0123456789ab";
        let with = render_claim_spec(
            &plan(&[(0, None)]),
            &ctx(),
            &[Some((13, 2, Some(uuid.to_string())))],
        )
        .unwrap();
        assert_eq!(
            with.devices[0].container_edits.env,
            [format!("TESSERA_MIG_UUID_0_13_2={uuid}")]
        );
        let without =
            render_claim_spec(&plan(&[(0, None)]), &ctx(), &[Some((13, 2, None))]).unwrap();
        assert!(without.devices[0].container_edits.env.is_empty());
        assert_eq!(with.container_edits, without.container_edits);
    }

    /// A MIG device gets its parent's node and the GI and CI capability nodes, read-only.
    #[test]
    fn mig_devices_get_capability_nodes() {
        let spec = render_claim_spec(&plan(&[(0, None)]), &ctx(), &[Some((13, 0, None))]).unwrap();
        let nodes: Vec<_> = spec.devices[0]
            .container_edits
            .device_nodes
            .iter()
            .map(|n| (n.path.as_str(), n.major, n.minor, n.permissions.as_deref()))
            .collect();
        assert_eq!(
            nodes,
            [
                ("/dev/nvidia0", Some(195), Some(0), Some("rw")),
                (
                    "/dev/nvidia-caps/nvidia-cap120",
                    Some(511),
                    Some(120),
                    Some("r")
                ),
                (
                    "/dev/nvidia-caps/nvidia-cap121",
                    Some(511),
                    Some(121),
                    Some("r")
                ),
            ]
        );
        let mut no_caps = ctx();
        no_caps.majors.nvidia_caps = None;
        assert!(render_claim_spec(&plan(&[(0, None)]), &no_caps, &[Some((13, 0, None))]).is_err());
    }

    /// Driver files are found by driver version or soname, missing ones skipped.
    #[test]
    fn driver_files_are_discovered_under_the_driver_root() {
        let root = tempfile::tempdir().unwrap();
        let lib = root.path().join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(root.path().join("usr/bin")).unwrap();
        std::fs::write(lib.join("libcuda.so.580.65.06"), b"").unwrap();
        std::fs::write(lib.join("libnvidia-ml.so.1"), b"").unwrap();
        std::fs::write(root.path().join("usr/bin/nvidia-smi"), b"").unwrap();
        let files = discover_driver_files(root.path(), Path::new("/host"), "580.65.06");
        let pairs: Vec<_> = files
            .iter()
            .map(|f| (f.host_path.as_str(), f.container_path.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                (
                    "/host/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06",
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
                ),
                (
                    "/host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
                ),
                ("/host/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"),
            ]
        );
    }
}
