//! `limits`: a claim's memory budgets, written once by the plugin (mode 0444, mounted
//! read-only). Versioned text, one record per line, so that a human can `cat` it:
//!
//! ```text
//! tessera-limits 1
//! claim 0b5c6e2a-1f3d-4c8e-9a7b-2d4f6e8a0c1e
//! scrub-on-free false
//! gpu GPU-4f8d0c1e-6a2b-4c59-9e31-0a7b5d2c9f10 21474836480
//! ```
//!
//! The first line names the format and its version. `gpu` lines give one GPU's budget
//! in bytes, sorted by UUID, each UUID once (the plugin sums a claim's shares of one
//! GPU). A reader of version N accepts any version ≥ 1 and skips keys it does not know,
//! so that N+1 may add lines.
#![forbid(unsafe_code)]

use crate::AbiError;

/// The first word of a limits file.
pub const MAGIC: &str = "tessera-limits";
/// The version this crate writes.
pub const VERSION: u32 = 1;

/// One GPU's budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuBudget {
    pub uuid: String,
    pub memory_bytes: u64,
}

/// The contents of a `limits` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub version: u32,
    pub claim_uid: String,
    pub scrub_on_free: bool,
    /// Sorted by UUID, no duplicates.
    pub gpus: Vec<GpuBudget>,
}

impl Limits {
    /// Builds limits from per-device budgets, merging devices of the same GPU (a claim
    /// given one shared GPU twice gets the sum) and sorting by UUID.
    pub fn merged(
        claim_uid: &str,
        scrub_on_free: bool,
        budgets: impl IntoIterator<Item = (String, u64)>,
    ) -> Result<Self, AbiError> {
        let mut map = std::collections::BTreeMap::<String, u64>::new();
        for (uuid, bytes) in budgets {
            let e = map.entry(uuid).or_default();
            *e = e
                .checked_add(bytes)
                .ok_or_else(|| AbiError::Invalid("memory budget overflows 64 bits".to_string()))?;
        }
        let l = Limits {
            version: VERSION,
            claim_uid: claim_uid.to_string(),
            scrub_on_free,
            gpus: map
                .into_iter()
                .map(|(uuid, memory_bytes)| GpuBudget { uuid, memory_bytes })
                .collect(),
        };
        l.check()?;
        Ok(l)
    }

    fn check(&self) -> Result<(), AbiError> {
        let token_ok = |s: &str| !s.is_empty() && !s.chars().any(|c| c.is_whitespace());
        if !token_ok(&self.claim_uid) {
            return Err(AbiError::Invalid(format!(
                "claim UID {:?} is empty or has whitespace",
                self.claim_uid
            )));
        }
        for g in &self.gpus {
            if !token_ok(&g.uuid) || g.uuid.len() >= crate::UUID_FIELD {
                return Err(AbiError::Invalid(format!("GPU UUID {:?}", g.uuid)));
            }
        }
        Ok(())
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut s = format!(
            "{MAGIC} {}\nclaim {}\nscrub-on-free {}\n",
            self.version, self.claim_uid, self.scrub_on_free
        );
        for g in &self.gpus {
            s.push_str(&format!("gpu {} {}\n", g.uuid, g.memory_bytes));
        }
        s
    }

    /// Parses a limits file of any version ≥ 1.
    pub fn parse(text: &str) -> Result<Self, AbiError> {
        let bad = |line: usize, reason: &str| AbiError::BadLine {
            line,
            reason: reason.to_string(),
        };
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
        let version = match lines
            .next()
            .map(|(_, l)| l.split_whitespace().collect::<Vec<_>>())
        {
            Some(w) if w.len() == 2 && w[0] == MAGIC => w[1]
                .parse::<u32>()
                .ok()
                .filter(|v| *v >= 1)
                .ok_or_else(|| bad(1, "version must be an integer ≥ 1"))?,
            _ => return Err(AbiError::BadMagic),
        };
        let mut claim_uid = None;
        let mut scrub_on_free = false;
        let mut gpus: Vec<GpuBudget> = Vec::new();
        for (n, line) in lines {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                [] => {}
                ["claim", uid] => claim_uid = Some(uid.to_string()),
                ["scrub-on-free", v] => {
                    scrub_on_free = match *v {
                        "true" => true,
                        "false" => false,
                        _ => return Err(bad(n, "scrub-on-free must be true or false")),
                    }
                }
                ["gpu", uuid, bytes] => {
                    let memory_bytes = bytes
                        .parse::<u64>()
                        .map_err(|_| bad(n, "budget must be a byte count"))?;
                    if gpus.iter().any(|g| g.uuid == *uuid) {
                        return Err(bad(n, "GPU listed twice"));
                    }
                    gpus.push(GpuBudget {
                        uuid: uuid.to_string(),
                        memory_bytes,
                    });
                }
                // Keys of a newer version.
                _ if version > VERSION => {}
                _ => return Err(bad(n, "unknown line")),
            }
        }
        let claim_uid = claim_uid.ok_or_else(|| bad(0, "no claim line"))?;
        gpus.sort_by(|a, b| a.uuid.cmp(&b.uuid));
        Ok(Limits {
            version,
            claim_uid,
            scrub_on_free,
            gpus,
        })
    }

    /// The budget for `uuid`, if this claim restricts that GPU.
    pub fn budget(&self, uuid: &str) -> Option<u64> {
        self.gpus
            .iter()
            .find(|g| g.uuid == uuid)
            .map(|g| g.memory_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same GPU twice sums; output sorted by UUID; the text round-trips.
    #[test]
    fn merges_by_uuid_and_round_trips() {
        let l = Limits::merged(
            "uid-1",
            true,
            [
                ("GPU-b".to_string(), 10),
                ("GPU-a".to_string(), 5),
                ("GPU-b".to_string(), 7),
            ],
        )
        .unwrap();
        assert_eq!(
            l.render(),
            "tessera-limits 1\nclaim uid-1\nscrub-on-free true\ngpu GPU-a 5\ngpu GPU-b 17\n"
        );
        assert_eq!(Limits::parse(&l.render()).unwrap(), l);
        assert_eq!(l.budget("GPU-b"), Some(17));
        assert_eq!(l.budget("GPU-c"), None);
    }

    /// Version 2 may add keys; version 1 may not contain unknown ones.
    #[test]
    fn newer_versions_may_add_keys() {
        let v2 = "tessera-limits 2\nclaim u\nnew-key 1 2 3\ngpu G 9\n";
        let l = Limits::parse(v2).unwrap();
        assert_eq!((l.version, l.budget("G")), (2, Some(9)));
        let v1 = "tessera-limits 1\nclaim u\nnew-key 1\n";
        assert!(matches!(
            Limits::parse(v1),
            Err(AbiError::BadLine { line: 3, .. })
        ));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(Limits::parse("hello"), Err(AbiError::BadMagic));
        assert!(Limits::parse("tessera-limits 0\nclaim u\n").is_err());
        assert!(Limits::parse("tessera-limits 1\n").is_err());
        assert!(Limits::parse("tessera-limits 1\nclaim u\ngpu G x\n").is_err());
        assert!(Limits::parse("tessera-limits 1\nclaim u\ngpu G 1\ngpu G 2\n").is_err());
        assert!(Limits::merged("has space", false, []).is_err());
    }
}
