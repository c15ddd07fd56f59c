//! Mapping a claim's accounting region to the host PIDs using it. Processes in a
//! container see only their own PID namespace, so the region holds no PIDs; the plugin
//! (host PID namespace) finds the processes that have the region file mapped by its
//! device and inode in `/proc/<pid>/maps`. The compute watchdog and the metrics use it.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// `(device, inode)` of a file, as `/proc/<pid>/maps` prints them.
fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// Parses one `maps` line's device (`major:minor`, hex) and inode columns.
fn parse_maps_line(line: &str) -> Option<(u64, u64, u64)> {
    let mut cols = line.split_whitespace();
    let _range = cols.next()?;
    let _perms = cols.next()?;
    let _offset = cols.next()?;
    let (major, minor) = cols.next()?.split_once(':')?;
    let inode = cols.next()?.parse().ok()?;
    Some((
        u64::from_str_radix(major, 16).ok()?,
        u64::from_str_radix(minor, 16).ok()?,
        inode,
    ))
}

/// Linux's `makedev` for the device numbers `stat` returns.
fn makedev(major: u64, minor: u64) -> u64 {
    ((major & 0xfffff000) << 32)
        | ((major & 0xfff) << 8)
        | ((minor & 0xffffff00) << 12)
        | (minor & 0xff)
}

/// The `(device, inode)` identity a `maps` line refers to, comparable with `stat`'s
/// `(st_dev, st_ino)`; `None` for unparsable lines.
pub fn parse_maps_identity(line: &str) -> Option<(u64, u64)> {
    let (ma, mi, ino) = parse_maps_line(line)?;
    (ino != 0).then(|| (makedev(ma, mi), ino))
}

/// Host PIDs (as seen under `proc_root`) that have `file` mapped, sorted. Processes
/// that exit or deny access while being scanned are skipped.
pub fn pids_mapping(proc_root: &Path, file: &Path) -> std::io::Result<Vec<u32>> {
    let (dev, ino) = identity(file)?;
    let mut pids = Vec::new();
    for e in std::fs::read_dir(proc_root)?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(maps) = std::fs::read_to_string(e.path().join("maps")) else {
            continue;
        };
        let hit = maps
            .lines()
            .filter_map(parse_maps_line)
            .any(|(ma, mi, i)| i == ino && makedev(ma, mi) == dev);
        if hit {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    Ok(pids)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process maps a region file: it is found, and after unmapping it is not.
    #[test]
    fn finds_the_processes_mapping_a_region() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("region");
        std::fs::write(
            &p,
            tessera_abi::region::initial_bytes(&["GPU-a"], 4).unwrap(),
        )
        .unwrap();
        let me = std::process::id();
        assert!(!pids_mapping(Path::new("/proc"), &p).unwrap().contains(&me));
        let f = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        let region = tessera_abi::region::Region::map(&f, true).unwrap();
        assert!(pids_mapping(Path::new("/proc"), &p).unwrap().contains(&me));
        drop(region);
        assert!(!pids_mapping(Path::new("/proc"), &p).unwrap().contains(&me));
    }

    #[test]
    fn parses_maps_lines() {
        let l = "7f12a000-7f12b000 rw-s 00000000 00:1a 123456    /run/tessera/claims/u/region";
        assert_eq!(parse_maps_line(l), Some((0, 0x1a, 123456)));
        assert_eq!(parse_maps_line("garbage"), None);
    }
}
