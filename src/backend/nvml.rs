//! The production GPU backend: whole-GPU discovery through NVML (nvml-wrapper's safe
//! API), plus what NVML does not know, read from the host's `/proc` and `/sys`:
//! character-device majors, the PCIe root complex, and the NUMA node when NVML has none.
//!
//! This module is a thin edge: [`NvmlBackend`] makes the calls and maps their errors,
//! and the decisions (bus-ID normalisation, CUDA cores per SM, `/proc/devices` parsing,
//! PCIe-root extraction) are pure functions with table tests below. `/proc` and `/sys`
//! are constructor parameters so that tests point them at a temp dir; the library path
//! is one too, so that tests load the fake `libnvidia-ml.so.1` from
//! `tests/fakes/fake_nvml.c`.

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

use super::{MigInstance, MigStatus, BackendError, CharMajors, GpuBackend, GpuInfo, NodeInventory};

/// What `Nvml::init()` dlopens when no library path is given.
const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// `NVML_DEVICE_MIG_ENABLE` (nvml.h): the value of `MigMode::current` when MIG is on.
const NVML_DEVICE_MIG_ENABLE: u32 = 1;

/// The NVIDIA driver seen through NVML. Holds one initialised NVML for its whole life
/// (NVML is reference counted; `Drop` shuts it down).
pub struct NvmlBackend {
    nvml: Nvml,
    proc_root: PathBuf,
    sys_root: PathBuf,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend")
            .field("proc_root", &self.proc_root)
            .field("sys_root", &self.sys_root)
            .finish_non_exhaustive()
    }
}

impl NvmlBackend {
    /// Loads and initialises NVML from `lib_path` (or the loader's default search for
    /// `libnvidia-ml.so.1`). `proc_root` and `sys_root` stand for `/proc` and `/sys`.
    ///
    /// # Errors
    /// [`BackendError::NvmlUnavailable`] when the library cannot be loaded or
    /// `nvmlInit_v2` fails (no driver, driver not loaded, no permission); its message
    /// points at `--backend mock`.
    pub fn new(
        lib_path: Option<PathBuf>,
        proc_root: PathBuf,
        sys_root: PathBuf,
    ) -> Result<Self, BackendError> {
        let init = match &lib_path {
            Some(path) => Nvml::builder().lib_path(path.as_os_str()).init(),
            None => Nvml::init(),
        };
        let nvml = init.map_err(|e| BackendError::NvmlUnavailable {
            lib: lib_path
                .as_deref()
                .map_or_else(|| DEFAULT_LIB.to_string(), |p| p.display().to_string()),
            // NvmlError's Display already includes its libloading cause.
            reason: e.to_string(),
        })?;
        Ok(NvmlBackend {
            nvml,
            proc_root,
            sys_root,
        })
    }

    /// One GPU by NVML index. Side effects: NVML calls and sysfs reads only.
    fn gpu_info(&self, index: u32) -> Result<GpuInfo, BackendError> {
        let call = |call: &'static str| {
            move |source| BackendError::NvmlCall {
                call,
                index,
                source,
            }
        };
        let dev = self
            .nvml
            .device_by_index(index)
            .map_err(call("nvmlDeviceGetHandleByIndex_v2"))?;
        let uuid = dev.uuid().map_err(call("nvmlDeviceGetUUID"))?;
        let product_name = dev.name().map_err(call("nvmlDeviceGetName"))?;
        let brand = dev.brand().map_err(call("nvmlDeviceGetBrand"))?;
        let architecture = dev
            .architecture()
            .map_err(call("nvmlDeviceGetArchitecture"))?;
        let memory = dev
            .memory_info()
            .map_err(call("nvmlDeviceGetMemoryInfo_v2"))?;
        let minor = dev
            .minor_number()
            .map_err(call("nvmlDeviceGetMinorNumber"))?;
        let pci = dev.pci_info().map_err(call("nvmlDeviceGetPciInfo_v3"))?;
        let pci_bus_id = normalize_bus_id(&pci.bus_id)
            .ok_or_else(|| call("nvmlDeviceGetPciInfo_v3")(NvmlError::GetPciInfoFailed))?;
        let cc = dev
            .cuda_compute_capability()
            .map_err(call("nvmlDeviceGetCudaComputeCapability"))?;
        let per_sm = cuda_cores_per_sm(cc.major, cc.minor).ok_or_else(|| {
            // BackendError has no variant for "capability missing from the table";
            // report it as an unexpected NVML value, packed as major*10+minor (e.g.
            // 130 for 13.0).
            let packed = cc.major.saturating_mul(10).saturating_add(cc.minor);
            call("nvmlDeviceGetCudaComputeCapability")(NvmlError::UnexpectedVariant(
                u32::try_from(packed).unwrap_or(u32::MAX),
            ))
        })?;
        let cores = dev.num_cores().map_err(call("nvmlDeviceGetNumGpuCores"))?;
        let (mig_capable, mig_enabled) = match dev.mig_mode() {
            Ok(mode) => (true, mode.current == NVML_DEVICE_MIG_ENABLE),
            Err(e) if is_unsupported(&e) => (false, false),
            Err(e) => return Err(call("nvmlDeviceGetMigMode")(e)),
        };
        // sysfs first: `resource.kubernetes.io/numaNode` means the CPU-side node of the
        // PCI device, which is what sysfs reports. NVML's answer is a fallback: it is
        // documented for GPUs that are NUMA nodes themselves (Grace Hopper/Blackwell),
        // where it names the GPU memory's node.
        let numa_node = match sysfs_numa_node(&self.sys_root, &pci_bus_id) {
            Some(node) => Some(node),
            None => match dev.numa_node_id() {
                Ok(node) => Some(i64::from(node)),
                Err(e) if is_unsupported(&e) => None,
                Err(e) => return Err(call("nvmlDeviceGetNumaNodeId")(e)),
            },
        };
        Ok(GpuInfo {
            index,
            minor,
            pcie_root: sysfs_pcie_root(&self.sys_root, &pci_bus_id),
            uuid,
            product_name,
            brand: format!("{brand:?}"),
            architecture: format!("{architecture:?}"),
            memory_bytes: memory.total,
            multiprocessors: cores / per_sm,
            cuda_compute_capability: format!("{}.{}", cc.major, cc.minor),
            pci_bus_id,
            numa_node,
            mig_capable,
            mig_enabled,
        })
    }
}

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    // TEMPORARY (being replaced by the NVML MIG implementation in this change): the
    // MIG operations refuse with NOT_SUPPORTED instead of touching the driver.
    fn mig_status(&self, minor: u32) -> Result<MigStatus, BackendError> {
        Err(BackendError::Mig { op: "status", minor, source: crate::mig::MigError::NotSupported("NVML MIG operations are not wired yet".into()) })
    }
    fn set_mig_mode(&self, minor: u32, _enabled: bool) -> Result<(), BackendError> {
        Err(BackendError::Mig { op: "set-mode", minor, source: crate::mig::MigError::NotSupported("NVML MIG operations are not wired yet".into()) })
    }
    fn create_mig(&self, minor: u32, _profile_id: u32, _start: u32) -> Result<MigInstance, BackendError> {
        Err(BackendError::Mig { op: "create", minor, source: crate::mig::MigError::NotSupported("NVML MIG operations are not wired yet".into()) })
    }
    fn destroy_mig(&self, minor: u32, _gi_id: u32) -> Result<(), BackendError> {
        Err(BackendError::Mig { op: "destroy", minor, source: crate::mig::MigError::NotSupported("NVML MIG operations are not wired yet".into()) })
    }

    /// Enumerates every GPU NVML reports, ordered by minor. Reads NVML,
    /// `<proc_root>/devices` and `<sys_root>/bus/pci/devices/<bdf>`; writes nothing.
    ///
    /// # Errors
    /// [`BackendError::NvmlSystem`] / [`BackendError::NvmlCall`] when an NVML call fails
    /// (other than "not supported" for MIG mode and NUMA node), and
    /// [`BackendError::CharMajor`] when `/proc/devices` lacks `nvidia` or `nvidia-uvm`.
    fn discover(&self) -> Result<NodeInventory, BackendError> {
        let sys = |call: &'static str| move |source| BackendError::NvmlSystem { call, source };
        let driver_version = self
            .nvml
            .sys_driver_version()
            .map_err(sys("nvmlSystemGetDriverVersion"))?;
        let cuda = self
            .nvml
            .sys_cuda_driver_version()
            .map_err(sys("nvmlSystemGetCudaDriverVersion_v2"))?;
        let char_majors = read_char_majors(&self.proc_root.join("devices"))?;
        let count = self
            .nvml
            .device_count()
            .map_err(sys("nvmlDeviceGetCount_v2"))?;
        let mut gpus = (0..count)
            .map(|i| self.gpu_info(i))
            .collect::<Result<Vec<_>, _>>()?;
        gpus.sort_by_key(|g| g.minor);
        Ok(NodeInventory {
            driver_version,
            cuda_driver_version: cuda_version_string(cuda),
            char_majors,
            gpus,
        })
    }
}

/// Errors that mean "this driver or GPU cannot answer", not "the call broke": the
/// feature is unsupported, or the symbol is missing from an older library.
fn is_unsupported(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_)
    )
}

/// NVML's bus ID (`00000000:19:00.0`, upper-case hex, 8-digit domain) in the sysfs form
/// `0000:19:00.0`: lower case, domain as at least 4 hex digits (as the kernel prints it,
/// so a domain above `ffff` keeps all its digits). `None` if it is not `d:b:d.f` hex.
/// Deterministic.
pub fn normalize_bus_id(nvml_bus_id: &str) -> Option<String> {
    let hex = |s: &str, max: u32| {
        if s.is_empty() || s.len() > 8 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(s, 16).ok().filter(|v| *v <= max)
    };
    let mut parts = nvml_bus_id.trim().splitn(3, ':');
    let domain = hex(parts.next()?, u32::MAX)?;
    let bus = hex(parts.next()?, 0xff)?;
    let (device, function) = parts.next()?.split_once('.')?;
    let device = hex(device, 0x1f)?;
    let function = hex(function, 7)?;
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

/// CUDA cores per streaming multiprocessor for a compute capability; `None` when the
/// capability is not in the table. Deterministic.
///
/// Source: `_ConvertSMVer2Cores` in NVIDIA's cuda-samples `Common/helper_cuda.h`
/// (FP32 lanes per SM, the count NVML's "GPU cores" reports), which matches the
/// "Arithmetic Instructions" throughput table of the CUDA C++ Programming Guide:
///
/// | capability | cores/SM | parts |
/// |---|---|---|
/// | 5.0, 5.2, 5.3 | 128 | Maxwell |
/// | 6.0 | 64 | P100 |
/// | 6.1, 6.2 | 128 | other Pascal |
/// | 7.0, 7.2, 7.5 | 64 | Volta, Xavier, Turing |
/// | 8.0 | 64 | A100, A30 |
/// | 8.6, 8.7, 8.9 | 128 | GA10x, Orin, Ada |
/// | 9.0 | 128 | Hopper |
/// | 10.x, 11.0, 12.x | 128 | Blackwell (11.0 is Thor, renamed from 10.1 in CUDA 13) |
///
/// `tests/fakes/fake_nvml.c` carries the same table to turn SMs into cores.
pub fn cuda_cores_per_sm(major: i32, minor: i32) -> Option<u32> {
    match (major, minor) {
        (5, 0 | 2 | 3) => Some(128),
        (6, 0) => Some(64),
        (6, 1 | 2) => Some(128),
        (7, 0 | 2 | 5) => Some(64),
        (8, 0) => Some(64),
        (8, 6 | 7 | 9) => Some(128),
        (9, 0) => Some(128),
        (10, m) | (12, m) if m >= 0 => Some(128),
        (11, 0) => Some(128),
        _ => None,
    }
}

/// NVML's CUDA driver version integer (`major*1000 + minor*10`) as `major.minor`:
/// 13000 → `13.0`, 12090 → `12.9`. Deterministic.
pub fn cuda_version_string(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// The driver majors from the text of `/proc/devices`: only the "Character devices:"
/// section counts. `nvidia` wins over the pre-550.40 name `nvidia-frontend`.
/// `Err(name)` names the first required entry that is missing. Deterministic.
pub fn parse_char_majors(proc_devices: &str) -> Result<CharMajors, &'static str> {
    let (mut nvidia, mut frontend, mut uvm, mut caps) = (None, None, None, None);
    let mut in_char = false;
    for line in proc_devices.lines() {
        let line = line.trim();
        if line.ends_with(':') {
            in_char = line == "Character devices:";
            continue;
        }
        if !in_char {
            continue;
        }
        let Some((num, name)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        let Ok(num) = num.parse::<u32>() else {
            continue;
        };
        match name.trim() {
            "nvidia" => nvidia = Some(num),
            "nvidia-frontend" => frontend = Some(num),
            "nvidia-uvm" => uvm = Some(num),
            "nvidia-caps" => caps = Some(num),
            _ => {}
        }
    }
    Ok(CharMajors {
        nvidia: nvidia.or(frontend).ok_or("nvidia")?,
        nvidia_uvm: uvm.ok_or("nvidia-uvm")?,
        nvidia_caps: caps,
    })
}

/// Reads and parses `path` (the host's `/proc/devices`).
fn read_char_majors(path: &Path) -> Result<CharMajors, BackendError> {
    let missing = |name| BackendError::CharMajor {
        name,
        path: path.to_path_buf(),
    };
    // An unreadable file reports the first major it would have given.
    let text = std::fs::read_to_string(path).map_err(|_| missing("nvidia"))?;
    parse_char_majors(&text).map_err(missing)
}

/// The PCIe root complex (`pci0000:00`) in a canonical sysfs device path such as
/// `devices/pci0000:00/0000:00:01.0/0000:19:00.0`: the component right after
/// `devices`, if it looks like `pci<domain>:<bus>`. Deterministic.
pub fn pcie_root_in_path(device_path: &Path) -> Option<String> {
    let mut parts = device_path.components().filter_map(|c| match c {
        Component::Normal(s) => s.to_str(),
        _ => None,
    });
    while let Some(part) = parts.next() {
        if part != "devices" {
            continue;
        }
        let root = parts.next()?;
        let (domain, bus) = root.strip_prefix("pci")?.split_once(':')?;
        let is_hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
        return (is_hex(domain) && is_hex(bus)).then(|| root.to_string());
    }
    None
}

/// Resolves `<sys_root>/bus/pci/devices/<bdf>` and returns its PCIe root; `None` when
/// the link is missing or leads elsewhere. Reads the filesystem only.
fn sysfs_pcie_root(sys_root: &Path, bdf: &str) -> Option<String> {
    let target = pci_device_dir(sys_root, bdf).canonicalize().ok()?;
    // Only the part below sys_root counts, so that a sys_root under some
    // `.../devices/pci...` directory cannot be mistaken for the root complex.
    let within = sys_root
        .canonicalize()
        .ok()
        .and_then(|root| target.strip_prefix(root).ok().map(Path::to_path_buf))
        .unwrap_or(target);
    pcie_root_in_path(&within)
}

/// `<sys_root>/bus/pci/devices/<bdf>/numa_node`; `None` when missing, unparsable or
/// negative (the kernel writes -1 when it does not know). Reads the filesystem only.
fn sysfs_numa_node(sys_root: &Path, bdf: &str) -> Option<i64> {
    let text = std::fs::read_to_string(pci_device_dir(sys_root, bdf).join("numa_node")).ok()?;
    text.trim().parse::<i64>().ok().filter(|n| *n >= 0)
}

fn pci_device_dir(sys_root: &Path, bdf: &str) -> PathBuf {
    sys_root.join("bus/pci/devices").join(OsStr::new(bdf))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVML's 8-digit upper-case bus IDs become sysfs names; garbage is refused.
    #[test]
    fn bus_ids_are_normalised_to_the_sysfs_form() {
        let cases = [
            ("00000000:19:00.0", Some("0000:19:00.0")),
            ("00000000:AF:00.0", Some("0000:af:00.0")),
            ("0000:3B:00.0", Some("0000:3b:00.0")),
            ("00000001:0A:1F.7", Some("0001:0a:1f.7")),
            ("00010000:00:00.0", Some("10000:00:00.0")),
            (" 00000000:19:00.0 ", Some("0000:19:00.0")),
            ("00000000:19:00", None),
            ("00000000:19.00.0", None),
            ("0000:100:00.0", None),
            ("0000:19:20.0", None),
            ("0000:19:00.8", None),
            ("0000:g9:00.0", None),
            ("", None),
        ];
        for (input, want) in cases {
            assert_eq!(normalize_bus_id(input).as_deref(), want, "{input:?}");
        }
    }

    /// The cores-per-SM table matches helper_cuda.h and refuses unknown capabilities.
    #[test]
    fn cuda_cores_per_sm_follows_the_table() {
        let cases = [
            ((5, 2), Some(128)),
            ((6, 0), Some(64)),
            ((6, 1), Some(128)),
            ((7, 0), Some(64)),
            ((7, 5), Some(64)),
            ((8, 0), Some(64)),
            ((8, 6), Some(128)),
            ((8, 7), Some(128)),
            ((8, 9), Some(128)),
            ((9, 0), Some(128)),
            ((10, 0), Some(128)),
            ((10, 3), Some(128)),
            ((11, 0), Some(128)),
            ((12, 0), Some(128)),
            ((12, 1), Some(128)),
            ((3, 5), None),
            ((7, 1), None),
            ((8, 8), None),
            ((9, 1), None),
            ((13, 0), None),
            ((10, -1), None),
        ];
        for ((major, minor), want) in cases {
            assert_eq!(cuda_cores_per_sm(major, minor), want, "{major}.{minor}");
        }
        // H100 SXM5: 16896 cores / 132 SMs; T4: 2560 / 40; A100: 6912 / 108.
        assert_eq!(16896 / cuda_cores_per_sm(9, 0).unwrap(), 132);
        assert_eq!(2560 / cuda_cores_per_sm(7, 5).unwrap(), 40);
        assert_eq!(6912 / cuda_cores_per_sm(8, 0).unwrap(), 108);
    }

    /// NVML's integer CUDA version prints as `major.minor`, the form state.rs parses.
    #[test]
    fn cuda_driver_versions_print_as_major_dot_minor() {
        for (v, want) in [
            (13000, "13.0"),
            (12090, "12.9"),
            (12020, "12.2"),
            (11080, "11.8"),
        ] {
            assert_eq!(cuda_version_string(v), want);
            assert_eq!(super::super::state::cuda_version_to_int(want), v as u32);
        }
    }

    const PROC_DEVICES: &str = "Character devices:\n  1 mem\n  4 /dev/vc/0\n195 nvidia\n\
                                 235 nvidia-caps-imex-channels\n508 nvidia-uvm\n511 nvidia-caps\n\n\
                                 Block devices:\n  7 loop\n  8 sd\n";

    /// Majors come from the character section only; legacy and optional names work.
    #[test]
    fn char_majors_are_parsed_from_proc_devices() {
        let want = CharMajors {
            nvidia: 195,
            nvidia_uvm: 508,
            nvidia_caps: Some(511),
        };
        assert_eq!(parse_char_majors(PROC_DEVICES), Ok(want));

        let legacy = "Character devices:\n195 nvidia-frontend\n250 nvidia-uvm\n";
        let want_legacy = CharMajors {
            nvidia: 195,
            nvidia_uvm: 250,
            nvidia_caps: None,
        };
        assert_eq!(parse_char_majors(legacy), Ok(want_legacy));

        let both = "Character devices:\n196 nvidia-frontend\n195 nvidia\n250 nvidia-uvm\n";
        assert_eq!(parse_char_majors(both).map(|m| m.nvidia), Ok(195));

        let block_only =
            "Character devices:\n  1 mem\n508 nvidia-uvm\nBlock devices:\n195 nvidia\n";
        assert_eq!(parse_char_majors(block_only), Err("nvidia"));
        assert_eq!(
            parse_char_majors("Character devices:\n195 nvidia\n"),
            Err("nvidia-uvm")
        );
        assert_eq!(parse_char_majors(""), Err("nvidia"));
    }

    /// The root complex is the component after `devices`, and only a `pciDDDD:BB` one.
    #[test]
    fn pcie_root_is_read_from_the_canonical_device_path() {
        let cases = [
            (
                "/sys/devices/pci0000:00/0000:00:01.0/0000:19:00.0",
                Some("pci0000:00"),
            ),
            (
                "devices/pci0000:80/0000:80:01.0/0000:86:00.0",
                Some("pci0000:80"),
            ),
            (
                "/sys/devices/pci10000:00/10000:00:02.0/10000:01:00.0",
                Some("pci10000:00"),
            ),
            ("/sys/devices/platform/0000:19:00.0", None),
            ("/sys/bus/pci/devices/0000:19:00.0", None),
            ("/sys/devices", None),
        ];
        for (path, want) in cases {
            assert_eq!(
                pcie_root_in_path(Path::new(path)).as_deref(),
                want,
                "{path}"
            );
        }
    }

    /// sysfs lookups follow the symlink, ignore a sys root's own ancestors, and read
    /// `numa_node` with -1 meaning unknown.
    #[test]
    fn sysfs_lookups_follow_the_device_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        // A sys root that itself lives below `devices/pci...` must not confuse it.
        let sys = tmp.path().join("devices/pci0000:ff/sys");
        let dev = sys.join("devices/pci0000:80/0000:80:01.0/0000:86:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("numa_node"), "1\n").unwrap();
        let odd = sys.join("devices/platform/0000:af:00.0");
        std::fs::create_dir_all(&odd).unwrap();
        std::fs::write(odd.join("numa_node"), "-1\n").unwrap();
        let links = sys.join("bus/pci/devices");
        std::fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:80/0000:80:01.0/0000:86:00.0",
            links.join("0000:86:00.0"),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/platform/0000:af:00.0",
            links.join("0000:af:00.0"),
        )
        .unwrap();

        assert_eq!(
            sysfs_pcie_root(&sys, "0000:86:00.0").as_deref(),
            Some("pci0000:80")
        );
        assert_eq!(sysfs_numa_node(&sys, "0000:86:00.0"), Some(1));
        assert_eq!(sysfs_pcie_root(&sys, "0000:af:00.0"), None);
        assert_eq!(sysfs_numa_node(&sys, "0000:af:00.0"), None);
        assert_eq!(sysfs_pcie_root(&sys, "0000:01:00.0"), None);
        assert_eq!(sysfs_numa_node(&sys, "0000:01:00.0"), None);
    }

    /// A missing or incomplete `/proc/devices` is a CharMajor error naming the file.
    #[test]
    fn missing_proc_devices_is_a_char_major_error() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("devices");
        let err = read_char_majors(&path).unwrap_err();
        assert!(
            matches!(&err, BackendError::CharMajor { name: "nvidia", path: p } if *p == path),
            "{err:?}"
        );
        std::fs::write(&path, "Character devices:\n195 nvidia\n").unwrap();
        let err = read_char_majors(&path).unwrap_err();
        assert!(
            matches!(
                err,
                BackendError::CharMajor {
                    name: "nvidia-uvm",
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
