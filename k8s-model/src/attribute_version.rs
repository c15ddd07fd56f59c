//! Version strings for ResourceSlice `version` attributes, which must be strict
//! semver 2.0.0 (no leading zeros, three components).

/// Normalizes a driver-style version to semver: numeric components lose leading zeros
/// and missing components become 0 (`580.65.06` → `580.65.6`, `9.0` → `9.0.0`, `13` →
/// `13.0.0`). Extra numeric components beyond three are folded into build metadata
/// (`1.2.3.4` → `1.2.3+4`). Returns `None` when the input has no numeric core.
/// Deterministic; the result always parses with [`semver::Version::parse`].
pub fn normalize_semver(raw: &str) -> Option<String> {
    let raw = raw.trim().trim_start_matches('v');
    let parts: Vec<&str> = raw.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(4);
    for p in &parts {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        nums.push(p.parse::<u64>().ok()?);
    }
    while nums.len() < 3 {
        nums.push(0);
    }
    let mut out = format!("{}.{}.{}", nums[0], nums[1], nums[2]);
    if let Some(extra) = nums.get(3) {
        out.push_str(&format!("+{extra}"));
    }
    debug_assert!(semver::Version::parse(&out).is_ok());
    Some(out)
}

/// Whether `s` is a valid semver 2.0.0 string as the API server checks it.
pub fn is_semver(s: &str) -> bool {
    semver::Version::parse(s).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Driver, CUDA and compute-capability strings normalize to strict semver.
    #[test]
    fn normalization_table() {
        let cases = [
            ("580.65.06", Some("580.65.6")),
            ("9.0", Some("9.0.0")),
            ("13.0", Some("13.0.0")),
            ("7.5", Some("7.5.0")),
            ("535.104.05", Some("535.104.5")),
            ("550", Some("550.0.0")),
            ("1.2.3.4", Some("1.2.3+4")),
            ("v1.37.0", Some("1.37.0")),
            ("", None),
            ("abc", None),
            ("1..2", None),
            ("1.2.3.4.5", None),
        ];
        for (raw, want) in cases {
            let got = normalize_semver(raw);
            assert_eq!(got.as_deref(), want, "{raw}");
            if let Some(v) = got {
                assert!(is_semver(&v), "{v}");
            }
        }
    }

    /// The API server's semver check refuses leading zeros.
    #[test]
    fn leading_zero_is_not_semver() {
        assert!(!is_semver("580.65.06"));
        assert!(is_semver("580.65.6"));
    }
}
