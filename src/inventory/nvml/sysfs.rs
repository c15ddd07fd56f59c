//! What NVML does not know, read from the host: character-device majors from
//! `/proc/devices`, and a GPU's PCIe root complex and NUMA node from `/sys`. The
//! parsing is pure; the readers take their root as a parameter so tests use a temp dir.

use super::*;

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
pub(super) fn read_char_majors(path: &Path) -> Result<CharMajors, BackendError> {
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
pub(super) fn sysfs_pcie_root(sys_root: &Path, bdf: &str) -> Option<String> {
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
pub(super) fn sysfs_numa_node(sys_root: &Path, bdf: &str) -> Option<i64> {
    let text = std::fs::read_to_string(pci_device_dir(sys_root, bdf).join("numa_node")).ok()?;
    text.trim().parse::<i64>().ok().filter(|n| *n >= 0)
}

pub(super) fn pci_device_dir(sys_root: &Path, bdf: &str) -> PathBuf {
    sys_root.join("bus/pci/devices").join(OsStr::new(bdf))
}
