//! Which claims bind this process, and the merged budget per GPU UUID.
//!
//! A claim is found by *what* is mounted, never by where it now appears: the
//! `root` field of `/proc/self/mountinfo` (the mounted file's path within its
//! filesystem) cannot be changed from inside a container, while the mount point can
//! (renaming any directory above it moves it). The plugin keeps every claim's files
//! beside the library, under one run directory: `<run>/lib/<version>/` holds this
//! library and `<run>/claims/<uid>/{limits,control,region}` the claims. So `<run>` is
//! learned from the mount this library was loaded from ([`run_dir_root`]), and a
//! claim counts when its three files are mounts of that filesystem under
//! `<run>/claims/` ([`mounted_claims`]), `limits` and `control` read-only. A file a
//! tenant writes, or a volume it mounts (an `emptyDir` with a `subPath`, say), lies
//! elsewhere, so it counts for nothing. Pure functions; the caller reads the files
//! and checks that each path it opens is really on that mount (`mnt_id`).
#![forbid(unsafe_code)]

use tessera_abi::limits::Limits;

/// Where claim files appear in containers (where the plugin mounts them; not
/// relied on).
pub const CLAIMS_DIR: &str = tessera_abi::CONTAINER_CLAIMS_DIR;

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The mount ID (the kernel's `mnt_id`, as `/proc/<pid>/fdinfo/<fd>` shows it).
    pub id: u64,
    /// `major:minor` of the filesystem, decimal.
    pub dev: String,
    /// The mounted path within its filesystem (`//deleted` suffix removed).
    pub root: String,
    /// Where it is mounted now, relative to the process's root.
    pub point: String,
    pub read_only: bool,
}

/// Decodes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo; malformed lines are skipped.
pub fn parse_mountinfo(mountinfo: &str) -> Vec<MountEntry> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 6 {
            continue;
        }
        let Ok(id) = f[0].parse() else { continue };
        let root = unescape(f[3]);
        let root = root.strip_suffix("//deleted").unwrap_or(&root).to_string();
        out.push(MountEntry {
            id,
            dev: f[2].to_string(),
            root,
            point: unescape(f[4]),
            read_only: f[5].split(',').any(|o| o == "ro"),
        });
    }
    out
}

/// The path of `path` within its filesystem, given the mount it is on: the mount's
/// root joined with what follows the mount point. `None` if `path` is not under it.
pub fn path_in_filesystem(mount: &MountEntry, path: &str) -> Option<String> {
    let rest = if mount.point == "/" {
        path.strip_prefix('/')?
    } else {
        let r = path.strip_prefix(mount.point.as_str())?;
        if r.is_empty() {
            return Some(mount.root.clone());
        }
        r.strip_prefix('/')?
    };
    Some(join(&mount.root, rest))
}

fn join(dir: &str, rest: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{rest}")
    } else {
        format!("{dir}/{rest}")
    }
}

/// The plugin's run directory within its filesystem, from this library's own path
/// there (`<run>/lib/<version>/<file>` gives `<run>`). `None` for any other layout:
/// a library that was not installed by the plugin anchors no claim.
pub fn run_dir_root(library_in_filesystem: &str) -> Option<String> {
    let mut parts = library_in_filesystem.rsplitn(4, '/');
    let (file, version, lib, run) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if file.is_empty()
        || version.is_empty()
        || lib != "lib"
        || !library_in_filesystem.starts_with('/')
    {
        return None;
    }
    Some(if run.is_empty() {
        "/".to_string()
    } else {
        run.to_string()
    })
}

/// `major:minor` (decimal, as mountinfo writes it) of a `st_dev` (glibc's encoding).
pub fn dev_string(dev: u64) -> String {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    format!("{major}:{minor}")
}

/// The file mapped at `addr` in `/proc/self/maps`: (`major:minor` decimal, inode,
/// path). `None` for an anonymous mapping or an unreadable line.
pub fn mapping_at(maps: &str, addr: usize) -> Option<(String, u64, String)> {
    for line in maps.lines() {
        let mut f = line.splitn(6, ' ');
        let range = f.next()?;
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).ok()?,
            usize::from_str_radix(hi, 16).ok()?,
        );
        if !(lo..hi).contains(&addr) {
            continue;
        }
        let (_perms, _offset, dev, inode) = (f.next()?, f.next()?, f.next()?, f.next()?);
        let (major, minor) = dev.split_once(':')?;
        let dev = format!(
            "{}:{}",
            u64::from_str_radix(major, 16).ok()?,
            u64::from_str_radix(minor, 16).ok()?
        );
        let path = f.next()?.trim_start();
        if !path.starts_with('/') || path.ends_with(" (deleted)") {
            return None;
        }
        return Some((dev, inode.parse().ok()?, unescape(path)));
    }
    None
}

/// A mounted claim file: the mount it must be opened through, and where it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimFile {
    pub mount_id: u64,
    pub path: String,
}

/// A claim whose three files are mounted from the plugin's run directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedClaim {
    pub uid: String,
    pub limits: ClaimFile,
    pub control: ClaimFile,
    pub region: ClaimFile,
}

/// The claims mounted from `<run>/claims/` on filesystem `dev`, sorted by UID. Every
/// such mount belongs to a claim that binds this process, so one that is not as the
/// plugin mounts it (a file missing beside it, `limits` or `control` writable) is an
/// error: the caller fails closed. For a file mounted at several points, the last
/// (topmost) entry is taken. Deterministic.
pub fn mounted_claims(
    entries: &[MountEntry],
    dev: &str,
    run: &str,
) -> Result<Vec<MountedClaim>, String> {
    let prefix = join(run, "claims/");
    // (uid, [limits, control, region]) in first-seen order.
    let mut found: Vec<(String, [Option<&MountEntry>; 3])> = Vec::new();
    for e in entries.iter().filter(|e| e.dev == dev) {
        let Some(rest) = e.root.strip_prefix(prefix.as_str()) else {
            continue;
        };
        let Some((uid, file)) = rest.split_once('/') else {
            return Err(format!(
                "{} is mounted at {}: a claim directory, not its files",
                e.root, e.point
            ));
        };
        let i = match file {
            tessera_abi::LIMITS_FILE => 0,
            tessera_abi::CONTROL_FILE => 1,
            tessera_abi::REGION_FILE => 2,
            _ => {
                return Err(format!(
                    "{} is mounted at {}: not a claim file",
                    e.root, e.point
                ));
            }
        };
        if uid.is_empty() || uid.starts_with('.') {
            return Err(format!(
                "{} is mounted at {}: not a prepared claim",
                e.root, e.point
            ));
        }
        match found.iter_mut().find(|(u, _)| u == uid) {
            Some((_, files)) => files[i] = Some(e),
            None => {
                let mut files = [None; 3];
                files[i] = Some(e);
                found.push((uid.to_string(), files));
            }
        }
    }
    let mut out = Vec::new();
    for (uid, files) in found {
        let [Some(l), Some(c), Some(r)] = files else {
            return Err(format!(
                "claim {uid}: limits, control and region are not all mounted"
            ));
        };
        if !l.read_only || !c.read_only {
            return Err(format!(
                "claim {uid}: limits or control is mounted writable"
            ));
        }
        let file = |e: &MountEntry| ClaimFile {
            mount_id: e.id,
            path: e.point.clone(),
        };
        out.push(MountedClaim {
            limits: file(l),
            control: file(c),
            region: file(r),
            uid,
        });
    }
    out.sort_by(|a, b| a.uid.cmp(&b.uid));
    Ok(out)
}

/// One claim's share of a GPU's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// Index of the claim (claims sorted by UID).
    pub claim: usize,
    /// Index of the GPU in that claim's region.
    pub gpu: usize,
    pub budget: u64,
}

/// A GPU that at least one claim budgets; its parts in claim-UID order, which is the
/// order the library charges them in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedGpu {
    pub uuid: String,
    pub parts: Vec<Part>,
}

impl MergedGpu {
    /// The GPU's whole budget for this process: the sum of its claims' budgets.
    pub fn total(&self) -> u64 {
        self.parts
            .iter()
            .fold(0u64, |a, p| a.saturating_add(p.budget))
    }
}

/// Merges the claims' limits (in claim-UID order) by GPU UUID. `region_index`
/// gives a GPU's index in a claim's region; a GPU a region lacks is skipped for that
/// claim. Deterministic.
pub fn merge(
    limits: &[Limits],
    region_index: impl Fn(usize, &str) -> Option<usize>,
) -> Vec<MergedGpu> {
    let mut out: Vec<MergedGpu> = Vec::new();
    for (c, l) in limits.iter().enumerate() {
        for g in &l.gpus {
            let Some(gpu) = region_index(c, &g.uuid) else {
                continue;
            };
            let part = Part {
                claim: c,
                gpu,
                budget: g.memory_bytes,
            };
            match out.iter_mut().find(|m| m.uuid == g.uuid) {
                Some(m) => m.parts.push(part),
                None => out.push(MergedGpu {
                    uuid: g.uuid.clone(),
                    parts: vec![part],
                }),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEV: &str = "0:41";
    const RUN: &str = "/tessera";

    fn line(id: u64, dev: &str, root: &str, point: &str, opts: &str) -> String {
        format!("{id} 35 {dev} {root} {point} {opts} shared:1 - tmpfs tmpfs rw\n")
    }

    /// The three files of claim `uid` as the plugin mounts them, at `dir`.
    fn claim(id: u64, uid: &str, dir: &str) -> String {
        let mut s = String::new();
        for (k, (f, o)) in [("limits", "ro,nosuid"), ("control", "ro"), ("region", "rw")]
            .into_iter()
            .enumerate()
        {
            s += &line(
                id + k as u64,
                DEV,
                &format!("{RUN}/claims/{uid}/{f}"),
                &format!("{dir}/{f}"),
                o,
            );
        }
        s
    }

    fn uids(mi: &str) -> Result<Vec<String>, String> {
        mounted_claims(&parse_mountinfo(mi), DEV, RUN)
            .map(|v| v.into_iter().map(|c| c.uid).collect())
    }

    /// Claims are found by what is mounted: a renamed directory above the mounts
    /// changes nothing, and the files are read where they are now.
    #[test]
    fn claims_are_found_by_their_source_wherever_they_appear() {
        let mi = claim(40, "b", "/run/tessera/claims/b") + &claim(50, "a", "/run/moved/a");
        assert_eq!(uids(&mi).unwrap(), ["a", "b"]);
        let c = &mounted_claims(&parse_mountinfo(&mi), DEV, RUN).unwrap()[0];
        assert_eq!(
            c.region,
            ClaimFile {
                mount_id: 52,
                path: "/run/moved/a/region".into()
            }
        );
    }

    /// What a tenant can mount (a volume, a `subPath` of it) lies outside the run
    /// directory, or on another filesystem, and counts for nothing.
    #[test]
    fn files_from_elsewhere_count_for_nothing() {
        let mut mi = claim(40, "a", "/run/tessera/claims/a");
        for (dev, root) in [
            (
                DEV,
                "/kubelet/pods/p/volumes/empty-dir/x/claims/fake/limits",
            ),
            ("0:99", "/tessera/claims/fake/limits"),
            (DEV, "/tessera/lib/v1/libtessera_cuda.so"),
            (DEV, "/"),
        ] {
            mi += &line(90, dev, root, "/run/tessera/claims/fake/limits", "ro");
        }
        assert_eq!(uids(&mi).unwrap(), ["a"]);
    }

    /// A claim of the run directory that is not mounted as the plugin mounts it makes
    /// the caller fail closed rather than leave it out.
    #[test]
    fn a_claim_mounted_otherwise_is_an_error() {
        let writable = line(1, DEV, "/tessera/claims/w/limits", "/x/limits", "rw")
            + &line(2, DEV, "/tessera/claims/w/control", "/x/control", "ro")
            + &line(3, DEV, "/tessera/claims/w/region", "/x/region", "rw");
        assert!(uids(&writable).unwrap_err().contains("writable"));
        let partial = line(1, DEV, "/tessera/claims/p/limits", "/x/limits", "ro");
        assert!(uids(&partial).unwrap_err().contains("not all mounted"));
        let dir = line(1, DEV, "/tessera/claims/d", "/x", "ro");
        assert!(uids(&dir).is_err());
        let tmp = claim(1, ".d.tmp", "/x");
        assert!(uids(&tmp).is_err());
        assert_eq!(uids("").unwrap(), Vec::<String>::new());
    }

    /// A file mounted twice: the topmost entry is the one opened.
    #[test]
    fn the_topmost_mount_of_a_file_is_taken() {
        let mi = claim(40, "a", "/run/tessera/claims/a") + &claim(60, "a", "/elsewhere/a");
        let c = &mounted_claims(&parse_mountinfo(&mi), DEV, RUN).unwrap()[0];
        assert_eq!(c.limits.mount_id, 60);
    }

    #[test]
    fn the_run_directory_comes_from_the_library_path() {
        assert_eq!(
            run_dir_root("/tessera/lib/0.1.0-ab12/libtessera_cuda.so").as_deref(),
            Some("/tessera")
        );
        assert_eq!(
            run_dir_root("/lib/v/libtessera_cuda.so").as_deref(),
            Some("/")
        );
        assert_eq!(run_dir_root("/target/debug/libtessera_cuda.so"), None);
        assert_eq!(run_dir_root("libtessera_cuda.so"), None);
        let m = MountEntry {
            id: 1,
            dev: DEV.into(),
            root: "/tessera/lib/v".into(),
            point: "/usr/local/tessera/lib".into(),
            read_only: true,
        };
        assert_eq!(
            path_in_filesystem(&m, "/usr/local/tessera/lib/libtessera_cuda.so").as_deref(),
            Some("/tessera/lib/v/libtessera_cuda.so")
        );
        assert_eq!(path_in_filesystem(&m, "/usr/local/tessera/library"), None);
        let root = MountEntry {
            point: "/".into(),
            root: "/".into(),
            ..m
        };
        assert_eq!(path_in_filesystem(&root, "/a/b").as_deref(), Some("/a/b"));
    }

    #[test]
    fn the_mapping_of_an_address_gives_its_file() {
        let maps = "7f0000000000-7f0000001000 r--p 00000000 fd:01 77 /usr/lib/x.so\n\
                    7f0000001000-7f0000003000 r-xp 00001000 00:29 1234 /usr/local/tessera/lib/libtessera_cuda.so\n\
                    7f0000004000-7f0000005000 rw-p 00000000 00:00 0 \n";
        assert_eq!(
            mapping_at(maps, 0x7f0000001800),
            Some((
                "0:41".into(),
                1234,
                "/usr/local/tessera/lib/libtessera_cuda.so".into()
            ))
        );
        assert_eq!(mapping_at(maps, 0x7f0000004800), None);
        assert_eq!(mapping_at(maps, 0x10), None);
        assert_eq!(dev_string((253 << 8) | 1), "253:1");
    }

    #[test]
    fn mountinfo_lines_are_parsed_with_escapes_and_deleted_files() {
        let e =
            parse_mountinfo("36 35 0:5 /a\\040b//deleted /p\\040q ro,relatime - tmpfs t rw\nbad\n");
        assert_eq!(
            e,
            [MountEntry {
                id: 36,
                dev: "0:5".into(),
                root: "/a b".into(),
                point: "/p q".into(),
                read_only: true
            }]
        );
    }

    #[test]
    fn octal_escapes_are_decoded() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/a\04"), r"/a\04");
    }

    /// Budgets merge by UUID in claim order; each part keeps its region index.
    #[test]
    fn budgets_merge_by_uuid_in_claim_order() {
        let a = Limits::parse("tessera-limits 1\nclaim a\ngpu GPU-1 10\ngpu GPU-2 5\n").unwrap();
        let b = Limits::parse("tessera-limits 1\nclaim b\ngpu GPU-2 7\n").unwrap();
        let m = merge(&[a, b], |c, u| match (c, u) {
            (0, "GPU-1") => Some(0),
            (0, "GPU-2") => Some(1),
            (1, "GPU-2") => Some(0),
            _ => None,
        });
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].uuid, "GPU-2");
        assert_eq!(
            m[1].parts,
            [
                Part {
                    claim: 0,
                    gpu: 1,
                    budget: 5
                },
                Part {
                    claim: 1,
                    gpu: 0,
                    budget: 7
                }
            ]
        );
        assert_eq!(m[1].total(), 12);
    }
}
