//! Which claims bind this process, and the merged budget per GPU UUID.
//!
//! A claim counts only when its `limits` is a read-only mount point with `control`
//! and `region` mounted beside it (`/proc/self/mountinfo`): the plugin mounts each as
//! a single file, while a file a tenant writes into the container's writable layer is
//! no mount point at all, so it counts for nothing. Pure functions; the caller reads
//! the files.
#![forbid(unsafe_code)]

use tessera_abi::limits::Limits;

/// Where claim files appear in containers.
pub const CLAIMS_DIR: &str = tessera_abi::CONTAINER_CLAIMS_DIR;

/// A claim directory whose three files are mounted as the plugin mounts them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedClaim {
    pub uid: String,
    pub dir: String,
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

/// The claims whose `limits` (read-only), `control` (read-only) and `region` are
/// mount points, sorted by UID. For a path mounted several times the last (topmost)
/// entry decides. Deterministic.
pub fn mounted_claims(mountinfo: &str) -> Vec<MountedClaim> {
    // (mount point, read-only) in mount order.
    let mut mounts: Vec<(String, bool)> = Vec::new();
    for line in mountinfo.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 6 {
            continue;
        }
        let point = unescape(f[4]);
        if !point.starts_with(CLAIMS_DIR) {
            continue;
        }
        let ro = f[5].split(',').any(|o| o == "ro");
        mounts.retain(|(p, _)| *p != point);
        mounts.push((point, ro));
    }
    let find = |p: &str| mounts.iter().find(|(m, _)| m == p).map(|(_, ro)| *ro);
    let mut out = Vec::new();
    for (point, ro) in &mounts {
        let Some(rest) = point.strip_prefix(CLAIMS_DIR) else {
            continue;
        };
        let Some(uid) = rest
            .strip_prefix('/')
            .and_then(|r| r.strip_suffix("/limits"))
        else {
            continue;
        };
        if !*ro || uid.is_empty() || uid.contains('/') {
            continue;
        }
        let dir = format!("{CLAIMS_DIR}/{uid}");
        if find(&format!("{dir}/control")) == Some(true) && find(&format!("{dir}/region")).is_some()
        {
            out.push(MountedClaim {
                uid: uid.to_string(),
                dir,
            });
        }
    }
    out.sort_by(|a, b| a.uid.cmp(&b.uid));
    out
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

    fn line(point: &str, opts: &str) -> String {
        format!("36 35 0:5 /x {point} {opts} shared:1 - tmpfs tmpfs rw\n")
    }

    /// Only a read-only limits mount with control and region mounted beside it counts.
    #[test]
    fn only_plugin_mounted_claims_count() {
        let mut mi = String::new();
        for (uid, lim, ctl, reg) in [
            ("b", "ro,nosuid", "ro", "rw"),
            ("a", "ro", "ro", "rw"),
            ("writable", "rw", "ro", "rw"),
            ("noregion", "ro", "ro", ""),
            ("ctlrw", "ro", "rw", "rw"),
        ] {
            mi += &line(&format!("/run/tessera/claims/{uid}/limits"), lim);
            mi += &line(&format!("/run/tessera/claims/{uid}/control"), ctl);
            if !reg.is_empty() {
                mi += &line(&format!("/run/tessera/claims/{uid}/region"), reg);
            }
        }
        mi += &line("/run/tessera/claims", "rw");
        let got: Vec<String> = mounted_claims(&mi).into_iter().map(|c| c.uid).collect();
        assert_eq!(got, ["a", "b"]);
        // A later writable mount over the same limits path hides the read-only one.
        mi += &line("/run/tessera/claims/a/limits", "rw");
        let got: Vec<String> = mounted_claims(&mi).into_iter().map(|c| c.uid).collect();
        assert_eq!(got, ["b"]);
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
