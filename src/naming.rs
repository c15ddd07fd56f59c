//! Device names: the contract that ties slices, claims, the checkpoint and crash
//! clean-up together. Every name is a DNS label.
//!
//! * whole GPU: `gpu-<minor>`
//! * fallback slot of a shared GPU: `gpu-<minor>-slot-<k>`
//! * MIG partition: `gpu-<minor>-mig-<profile>-<giProfileId>-<placementStart>`, where the
//!   profile is lower-cased, dots dropped, `+` turned into `-` (`1g.10gb+me` →
//!   `1g10gb-me`) and `giProfileId` is the ID `nvidia-smi mig -lgip` shows (19, 20, 15…),
//!   not the NVML profile index.

/// `gpu-<minor>`.
pub fn gpu_device_name(minor: u32) -> String {
    format!("gpu-{minor}")
}

/// `gpu-<minor>-slot-<k>`.
pub fn slot_device_name(minor: u32, slot: u32) -> String {
    format!("gpu-{minor}-slot-{slot}")
}

/// Sanitizes a MIG profile name for use in a device name: lower-case, dots dropped,
/// `+` → `-`. Deterministic.
pub fn sanitize_mig_profile(profile: &str) -> String {
    profile
        .chars()
        .filter(|c| *c != '.')
        .map(|c| {
            if c == '+' {
                '-'
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
}

/// `gpu-<minor>-mig-<profile>-<giProfileId>-<placementStart>`.
pub fn mig_device_name(
    minor: u32,
    profile: &str,
    gi_profile_id: u32,
    placement_start: u32,
) -> String {
    format!(
        "gpu-{minor}-mig-{}-{gi_profile_id}-{placement_start}",
        sanitize_mig_profile(profile)
    )
}

/// A device name parsed back into what it refers to (used for crash clean-up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceRef {
    Gpu {
        minor: u32,
    },
    Slot {
        minor: u32,
        slot: u32,
    },
    Mig {
        minor: u32,
        profile: String,
        gi_profile_id: u32,
        placement_start: u32,
    },
}

/// Parses a Tessera device name; `None` for names Tessera does not produce.
pub fn parse_device_name(name: &str) -> Option<DeviceRef> {
    let rest = name.strip_prefix("gpu-")?;
    let (minor, tail) = match rest.split_once('-') {
        Some((m, t)) => (m, Some(t)),
        None => (rest, None),
    };
    let minor = parse_num(minor)?;
    let Some(tail) = tail else {
        return Some(DeviceRef::Gpu { minor });
    };
    if let Some(k) = tail.strip_prefix("slot-") {
        return Some(DeviceRef::Slot {
            minor,
            slot: parse_num(k)?,
        });
    }
    let mig = tail.strip_prefix("mig-")?;
    let (front, start) = mig.rsplit_once('-')?;
    let (profile, id) = front.rsplit_once('-')?;
    if profile.is_empty() {
        return None;
    }
    Some(DeviceRef::Mig {
        minor,
        profile: profile.to_string(),
        gi_profile_id: parse_num(id)?,
        placement_start: parse_num(start)?,
    })
}

/// Decimal without sign or leading zeros (so that names round-trip exactly).
fn parse_num(s: &str) -> Option<u32> {
    if s.is_empty() || (s.len() > 1 && s.starts_with('0')) || !s.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    s.parse().ok()
}

/// RFC 1123 DNS label, by the API server's own rule (one copy, in the model crate).
pub fn is_dns_label(s: &str) -> bool {
    k8s_model::validation::format::dns1123_label_errors(s).is_empty()
}

/// RFC 1123 DNS subdomain, by the API server's own rule.
pub fn is_dns_subdomain(s: &str) -> bool {
    k8s_model::validation::format::dns1123_subdomain_errors(s).is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Profile names sanitize per the contract, and the result is a DNS label.
    #[test]
    fn mig_names_follow_the_contract() {
        let cases = [
            ("1g.10gb", 19, 6, "gpu-0-mig-1g10gb-19-6"),
            ("1g.10gb+me", 20, 0, "gpu-0-mig-1g10gb-me-20-0"),
            ("7g.80gb", 0, 0, "gpu-0-mig-7g80gb-0-0"),
            ("3g.40gb", 9, 4, "gpu-0-mig-3g40gb-9-4"),
        ];
        for (profile, id, start, want) in cases {
            let name = mig_device_name(0, profile, id, start);
            assert_eq!(name, want);
            assert!(is_dns_label(&name), "{name}");
            assert_eq!(
                parse_device_name(&name),
                Some(DeviceRef::Mig {
                    minor: 0,
                    profile: sanitize_mig_profile(profile),
                    gi_profile_id: id,
                    placement_start: start
                })
            );
        }
    }

    /// Whole-GPU and slot names parse back; foreign names do not.
    #[test]
    fn names_parse_back() {
        assert_eq!(
            parse_device_name("gpu-3"),
            Some(DeviceRef::Gpu { minor: 3 })
        );
        assert_eq!(
            parse_device_name(&slot_device_name(1, 2)),
            Some(DeviceRef::Slot { minor: 1, slot: 2 })
        );
        for bad in [
            "gpu-",
            "gpu-01",
            "gpu-x",
            "cpu-0",
            "gpu-0-foo-1",
            "gpu-0-mig-19-0",
        ] {
            assert_eq!(parse_device_name(bad), None, "{bad}");
        }
    }

    /// DNS label rules as Kubernetes applies them.
    #[test]
    fn dns_labels() {
        assert!(is_dns_label("gpu-0"));
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        assert!(is_dns_subdomain("gpu.tessera.dev"));
        assert!(!is_dns_subdomain("gpu..dev"));
    }
}
