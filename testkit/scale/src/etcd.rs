//! What the cluster stores, read from etcd itself (its JSON gateway on loopback, through
//! `curl`): each resource's object count and stored bytes (keys and values as the API
//! server wrote them, protobuf), the slices one by one, and the database's size.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{Context, Result};

/// One stored key.
#[derive(Debug, Clone)]
pub struct Entry {
    pub key: String,
    pub bytes: usize,
}

/// Everything under `/registry/`.
#[derive(Debug, Clone, Default)]
pub struct Contents {
    pub entries: Vec<Entry>,
    /// The database file's size (`dbSize`), and what of it is in use (`dbSizeInUse`).
    pub db_size: u64,
    pub db_in_use: u64,
}

fn post(endpoint: &str, path: &str, body: &str) -> Result<serde_json::Value> {
    let out = Command::new("curl")
        .args(["-fsS", "--max-time", "300", "-X", "POST", "-d", body])
        .arg(format!("{endpoint}{path}"))
        .output()
        .context("running curl")?;
    anyhow::ensure!(
        out.status.success(),
        "curl {endpoint}{path}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    serde_json::from_slice(&out.stdout).with_context(|| format!("{endpoint}{path}: not JSON"))
}

/// Reads every key under `/registry/` and the database's status.
pub fn read(endpoint: &str) -> Result<Contents> {
    // "/registry/" up to (not including) "/registry0", base64.
    let range = post(
        endpoint,
        "/v3/kv/range",
        r#"{"key":"L3JlZ2lzdHJ5Lw==","range_end":"L3JlZ2lzdHJ5MA=="}"#,
    )?;
    let mut entries = Vec::new();
    for kv in range["kvs"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let key = kv["key"].as_str().map(b64_decode).unwrap_or_default();
        let value_len = kv["value"].as_str().map(b64_len).unwrap_or(0);
        entries.push(Entry {
            bytes: key.len() + value_len,
            key: String::from_utf8_lossy(&key).into_owned(),
        });
    }
    let status = post(endpoint, "/v3/maintenance/status", "{}")?;
    let num = |v: &serde_json::Value| {
        v.as_str()
            .and_then(|s| s.parse().ok())
            .or_else(|| v.as_u64())
            .unwrap_or(0)
    };
    Ok(Contents {
        entries,
        db_size: num(&status["dbSize"]),
        db_in_use: num(&status["dbSizeInUse"]),
    })
}

impl Contents {
    /// (objects, bytes) per resource: `/registry/<group>/<resource>/...` for groups
    /// with a dot, `/registry/<resource>/...` for the core ones.
    pub fn by_resource(&self) -> BTreeMap<String, (usize, usize)> {
        let mut out: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for e in &self.entries {
            let parts: Vec<&str> = e.key.split('/').collect();
            let resource = match parts.get(2) {
                Some(g) if g.contains('.') => format!("{g}/{}", parts.get(3).unwrap_or(&"")),
                Some(r) => r.to_string(),
                None => continue,
            };
            let c = out.entry(resource).or_default();
            c.0 += 1;
            c.1 += e.bytes;
        }
        out
    }

    /// The stored slices: (name, bytes).
    pub fn slices(&self) -> impl Iterator<Item = (&str, usize)> {
        // The API server keys them `/registry/resourceslices/<name>` (no group).
        self.entries.iter().filter_map(|e| {
            e.key
                .strip_prefix("/registry/resourceslices/")
                .or_else(|| {
                    e.key
                        .strip_prefix("/registry/resource.k8s.io/resourceslices/")
                })
                .map(|n| (n, e.bytes))
        })
    }
}

/// The decoded length of standard base64 text.
fn b64_len(s: &str) -> usize {
    let pad = s.bytes().rev().take_while(|b| *b == b'=').count();
    s.len() / 4 * 3 - pad
}

/// Decodes standard base64 (etcd's JSON gateway's bytes); invalid characters are
/// skipped.
fn b64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for v in s.bytes().filter_map(val) {
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gateway's base64 keys decode, and value lengths count padding.
    #[test]
    fn base64_keys_and_lengths() {
        assert_eq!(b64_decode("L3JlZ2lzdHJ5Lw=="), b"/registry/");
        assert_eq!(b64_len("L3JlZ2lzdHJ5Lw=="), 10);
        assert_eq!(b64_len("YWJj"), 3);
        assert_eq!(b64_len(""), 0);
    }
}
