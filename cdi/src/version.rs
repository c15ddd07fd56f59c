//! CDI spec versions: the versions this crate knows, and the minimum `cdiVersion`
//! a spec needs for the features it uses.
//!
//! The rules mirror `MinimumRequiredVersion` in the upstream Go library,
//! tags.cncf.io/container-device-interface, file `specs-go/version.go` (the 1.1.0
//! release line; `pkg/cdi/version.go` only re-exports it), one [`VersionRule`] per
//! check in its `requiresV040` … `requiresV110` functions:
//!
//! | version | feature |
//! |---|---|
//! | 0.4.0 | a mount sets `type` |
//! | 0.5.0 | a device name starts with a digit; a device node sets `hostPath` |
//! | 0.6.0 | spec or device `annotations`; a `.` in the class part of `kind` |
//! | 0.7.0 | `intelRdt` present; `additionalGids` non-empty |
//! | 0.8.0, 1.0.0 | nothing (library-only bumps) |
//! | 1.1.0 | `intelRdt.schemata` or `intelRdt.enableMonitoring`; `netDevices` non-empty |
//!
//! A spec that uses none of them needs [`SpecVersion::EARLIEST`] (0.3.0), the Go
//! library's `vEarliest`; so, as in Go, a spec declaring the known but older 0.1.0 or
//! 0.2.0 never validates. Runtimes refuse versions they do not know: podman 4.3.1
//! (CDI library 0.5.2) knows 0.1.0–0.5.0, containerd 1.7.24 and podman 5.4 know up to
//! 0.8.0. Everything here is pure and deterministic.

use std::fmt;
use std::str::FromStr;

use crate::spec::{ContainerEdits, Spec};

/// A released CDI spec version. Ordered oldest to newest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SpecVersion {
    /// 0.1.0
    V0_1_0,
    /// 0.2.0
    V0_2_0,
    /// 0.3.0: the earliest version a spec is computed to need.
    V0_3_0,
    /// 0.4.0: mount `type`.
    V0_4_0,
    /// 0.5.0: device node `hostPath`, device names starting with a digit. The newest
    /// version podman 4.3.1 accepts.
    V0_5_0,
    /// 0.6.0: annotations, dots in the class.
    V0_6_0,
    /// 0.7.0: `intelRdt`, `additionalGids`.
    V0_7_0,
    /// 0.8.0: no spec change.
    V0_8_0,
    /// 1.0.0: no spec change.
    V1_0_0,
    /// 1.1.0: `netDevices`, `intelRdt.schemata`, `intelRdt.enableMonitoring`.
    V1_1_0,
}

impl SpecVersion {
    /// Every version this crate knows, oldest first. Any other `cdiVersion` is refused.
    pub const ALL: [SpecVersion; 10] = [
        SpecVersion::V0_1_0,
        SpecVersion::V0_2_0,
        SpecVersion::V0_3_0,
        SpecVersion::V0_4_0,
        SpecVersion::V0_5_0,
        SpecVersion::V0_6_0,
        SpecVersion::V0_7_0,
        SpecVersion::V0_8_0,
        SpecVersion::V1_0_0,
        SpecVersion::V1_1_0,
    ];

    /// The lowest version [`minimum_required_version`] returns (Go's `vEarliest`).
    pub const EARLIEST: SpecVersion = SpecVersion::V0_3_0;

    /// The newest version this crate knows.
    pub const LATEST: SpecVersion = SpecVersion::V1_1_0;

    /// The version as written in `cdiVersion`, e.g. `"0.5.0"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            SpecVersion::V0_1_0 => "0.1.0",
            SpecVersion::V0_2_0 => "0.2.0",
            SpecVersion::V0_3_0 => "0.3.0",
            SpecVersion::V0_4_0 => "0.4.0",
            SpecVersion::V0_5_0 => "0.5.0",
            SpecVersion::V0_6_0 => "0.6.0",
            SpecVersion::V0_7_0 => "0.7.0",
            SpecVersion::V0_8_0 => "0.8.0",
            SpecVersion::V1_0_0 => "1.0.0",
            SpecVersion::V1_1_0 => "1.1.0",
        }
    }

    /// Parses a known version. One leading `v` is accepted, as the Go library does.
    /// Returns `None` for anything else (including `0.5`, `0.9.0`, `auto`).
    pub fn parse(s: &str) -> Option<SpecVersion> {
        let s = s.strip_prefix('v').unwrap_or(s);
        SpecVersion::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

impl fmt::Display for SpecVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `cdiVersion` string is not a version this crate knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown CDI spec version {0:?}")]
pub struct UnknownVersion(pub String);

impl FromStr for SpecVersion {
    type Err = UnknownVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SpecVersion::parse(s).ok_or_else(|| UnknownVersion(s.to_owned()))
    }
}

/// One row of the version table: specs for which `applies` holds need `version`.
#[derive(Debug, Clone, Copy)]
pub struct VersionRule {
    /// The version the feature needs.
    pub version: SpecVersion,
    /// The feature, in words, for error messages.
    pub feature: &'static str,
    /// Whether `spec` uses the feature.
    pub applies: fn(&Spec) -> bool,
}

/// The version table, newest first, mirroring `specs-go/version.go`.
pub const RULES: &[VersionRule] = &[
    VersionRule {
        version: SpecVersion::V1_1_0,
        feature: "intelRdt.schemata or intelRdt.enableMonitoring",
        applies: |s| {
            any_edits(s, |e| {
                e.intel_rdt
                    .as_ref()
                    .is_some_and(|r| r.schemata.is_some() || r.enable_monitoring)
            })
        },
    },
    VersionRule {
        version: SpecVersion::V1_1_0,
        feature: "netDevices",
        applies: |s| any_edits(s, |e| !e.net_devices.is_empty()),
    },
    VersionRule {
        version: SpecVersion::V0_7_0,
        feature: "intelRdt",
        applies: |s| any_edits(s, |e| e.intel_rdt.is_some()),
    },
    VersionRule {
        version: SpecVersion::V0_7_0,
        feature: "additionalGids",
        applies: |s| any_edits(s, |e| !e.additional_gids.is_empty()),
    },
    VersionRule {
        version: SpecVersion::V0_6_0,
        feature: "spec annotations",
        applies: |s| !s.annotations.is_empty(),
    },
    VersionRule {
        version: SpecVersion::V0_6_0,
        feature: "device annotations",
        applies: |s| s.devices.iter().any(|d| !d.annotations.is_empty()),
    },
    VersionRule {
        version: SpecVersion::V0_6_0,
        feature: "a dot in the class part of kind",
        // Go: `_, class, ok := strings.Cut(spec.Kind, "/"); ok && strings.Contains(class, ".")`
        applies: |s| {
            s.kind
                .split_once('/')
                .is_some_and(|(_, class)| class.contains('.'))
        },
    },
    VersionRule {
        version: SpecVersion::V0_5_0,
        feature: "a device name starting with a digit",
        applies: |s| {
            s.devices
                .iter()
                .any(|d| d.name.starts_with(|c: char| c.is_ascii_digit()))
        },
    },
    VersionRule {
        version: SpecVersion::V0_5_0,
        feature: "deviceNodes[].hostPath",
        applies: |s| {
            any_edits(s, |e| {
                e.device_nodes
                    .iter()
                    .any(|n| n.host_path.as_deref().is_some_and(|p| !p.is_empty()))
            })
        },
    },
    VersionRule {
        version: SpecVersion::V0_4_0,
        feature: "mounts[].type",
        applies: |s| {
            any_edits(s, |e| {
                e.mounts
                    .iter()
                    .any(|m| m.mount_type.as_deref().is_some_and(|t| !t.is_empty()))
            })
        },
    },
];

/// Whether `pred` holds for the spec-wide edits or any device's edits.
fn any_edits(spec: &Spec, pred: impl Fn(&ContainerEdits) -> bool) -> bool {
    spec.container_edits.as_ref().is_some_and(&pred)
        || spec.devices.iter().any(|d| pred(&d.container_edits))
}

/// The rule that sets the spec's minimum version: the first matching row of
/// [`RULES`] (newest first), or `None` when the spec needs only
/// [`SpecVersion::EARLIEST`].
pub fn deciding_rule(spec: &Spec) -> Option<&'static VersionRule> {
    RULES.iter().find(|r| (r.applies)(spec))
}

/// The `cdiVersion` a spec needs, and the feature that makes it need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirement {
    /// The minimum version.
    pub version: SpecVersion,
    /// The deciding feature, or [`Requirement::BASELINE`].
    pub feature: &'static str,
}

impl Requirement {
    /// The feature named when no rule applies and the minimum is [`SpecVersion::EARLIEST`].
    pub const BASELINE: &'static str = "only baseline fields";
}

/// The minimum version of `spec` with its reason: the deciding rule's, else
/// [`SpecVersion::EARLIEST`] with [`Requirement::BASELINE`].
pub fn requirement(spec: &Spec) -> Requirement {
    deciding_rule(spec).map_or(
        Requirement {
            version: SpecVersion::EARLIEST,
            feature: Requirement::BASELINE,
        },
        |r| Requirement {
            version: r.version,
            feature: r.feature,
        },
    )
}

/// The lowest `cdiVersion` that can describe `spec`: the newest version among the
/// rules it triggers, else [`SpecVersion::EARLIEST`]. Ignores `spec.cdi_version`.
/// Same result as the Go library's `MinimumRequiredVersion`.
pub fn minimum_required_version(spec: &Spec) -> SpecVersion {
    requirement(spec).version
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Device, DeviceNode, IntelRdt, Mount, NetDevice};
    use std::collections::BTreeMap;

    fn node_only() -> ContainerEdits {
        ContainerEdits::default().with_device_node(DeviceNode::at("/dev/card0"))
    }

    fn spec_with(kind: &str, name: &str, edits: ContainerEdits) -> Spec {
        Spec::new("0.3.0", kind, vec![Device::new(name, edits)])
    }

    fn annotated() -> BTreeMap<String, String> {
        BTreeMap::from([("a".to_owned(), "b".to_owned())])
    }

    /// Each rule of the Go library's table yields its version, alone and in spec-wide edits.
    #[test]
    fn each_feature_requires_the_go_library_minimum() {
        let k = "vendor.com/gpu";
        let rdt = |r: IntelRdt| ContainerEdits {
            intel_rdt: Some(r),
            ..node_only()
        };
        let cases: Vec<(&str, Spec, SpecVersion)> = vec![
            (
                "plain device node",
                spec_with(k, "gpu0", node_only()),
                SpecVersion::V0_3_0,
            ),
            (
                "mount without type",
                spec_with(
                    k,
                    "gpu0",
                    ContainerEdits::default().with_mount(Mount::bind_ro("/a", "/b")),
                ),
                SpecVersion::V0_3_0,
            ),
            (
                "mount with type",
                spec_with(
                    k,
                    "gpu0",
                    ContainerEdits::default().with_mount(Mount {
                        mount_type: Some("tmpfs".into()),
                        ..Mount::bind_ro("tmpfs", "/b")
                    }),
                ),
                SpecVersion::V0_4_0,
            ),
            (
                "mount with empty type",
                spec_with(
                    k,
                    "gpu0",
                    ContainerEdits::default().with_mount(Mount {
                        mount_type: Some(String::new()),
                        ..Mount::bind_ro("/a", "/b")
                    }),
                ),
                SpecVersion::V0_3_0,
            ),
            (
                "name starting with a digit",
                spec_with(k, "0", node_only()),
                SpecVersion::V0_5_0,
            ),
            (
                "device node hostPath",
                spec_with(
                    k,
                    "gpu0",
                    ContainerEdits::default()
                        .with_device_node(DeviceNode::char("/dev/a", "/dev/b", 1, 3)),
                ),
                SpecVersion::V0_5_0,
            ),
            (
                "dot in class",
                spec_with("vendor.com/gpu.x", "gpu0", node_only()),
                SpecVersion::V0_6_0,
            ),
            (
                "dot only in vendor",
                spec_with("vendor.com/gpu", "gpu0", node_only()),
                SpecVersion::V0_3_0,
            ),
            (
                "spec annotations",
                Spec {
                    annotations: annotated(),
                    ..spec_with(k, "gpu0", node_only())
                },
                SpecVersion::V0_6_0,
            ),
            (
                "device annotations",
                Spec::new(
                    "0.3.0",
                    k,
                    vec![Device {
                        annotations: annotated(),
                        ..Device::new("gpu0", node_only())
                    }],
                ),
                SpecVersion::V0_6_0,
            ),
            (
                "empty intelRdt",
                spec_with(k, "gpu0", rdt(IntelRdt::default())),
                SpecVersion::V0_7_0,
            ),
            (
                "additionalGids",
                spec_with(
                    k,
                    "gpu0",
                    ContainerEdits {
                        additional_gids: vec![44],
                        ..node_only()
                    },
                ),
                SpecVersion::V0_7_0,
            ),
            (
                "intelRdt.schemata",
                spec_with(
                    k,
                    "gpu0",
                    rdt(IntelRdt {
                        schemata: Some(vec![]),
                        ..IntelRdt::default()
                    }),
                ),
                SpecVersion::V1_1_0,
            ),
            (
                "intelRdt.enableMonitoring",
                spec_with(
                    k,
                    "gpu0",
                    rdt(IntelRdt {
                        enable_monitoring: true,
                        ..IntelRdt::default()
                    }),
                ),
                SpecVersion::V1_1_0,
            ),
            (
                "netDevices",
                spec_with(
                    k,
                    "gpu0",
                    ContainerEdits {
                        net_devices: vec![NetDevice {
                            host_interface_name: "eth1".into(),
                            name: "net0".into(),
                        }],
                        ..node_only()
                    },
                ),
                SpecVersion::V1_1_0,
            ),
        ];
        for (what, spec, want) in cases {
            assert_eq!(
                minimum_required_version(&spec),
                want,
                "{what} (device edits)"
            );
            // The same edits spec-wide must give the same answer.
            let mut global = spec.clone();
            global.container_edits = Some(global.devices[0].container_edits.clone());
            global.devices[0].container_edits = node_only();
            assert_eq!(
                minimum_required_version(&global),
                want,
                "{what} (spec-wide edits)"
            );
        }
    }

    /// With several features the newest requirement wins.
    #[test]
    fn newest_requirement_wins() {
        let mut spec = spec_with(
            "vendor.com/gpu",
            "0",
            ContainerEdits {
                additional_gids: vec![1],
                ..node_only()
            },
        );
        assert_eq!(minimum_required_version(&spec), SpecVersion::V0_7_0);
        assert_eq!(
            deciding_rule(&spec).map(|r| r.feature),
            Some("additionalGids")
        );
        spec.devices[0].container_edits.additional_gids.clear();
        assert_eq!(minimum_required_version(&spec), SpecVersion::V0_5_0);
    }

    /// Known versions parse (with an optional `v`); anything else is refused.
    #[test]
    fn only_known_versions_parse() {
        for v in SpecVersion::ALL {
            assert_eq!(SpecVersion::parse(v.as_str()), Some(v));
            assert_eq!(SpecVersion::parse(&format!("v{v}")), Some(v));
        }
        for bad in [
            "", "0.5", "0.9.0", "1.2.0", "2.0.0", "auto", "vv0.5.0", " 0.5.0",
        ] {
            assert_eq!(SpecVersion::parse(bad), None, "{bad:?}");
            assert!(bad.parse::<SpecVersion>().is_err());
        }
        assert!(SpecVersion::ALL.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(SpecVersion::ALL[0], SpecVersion::V0_1_0);
        assert_eq!(SpecVersion::ALL[9], SpecVersion::LATEST);
    }

    /// The rule table is ordered newest first, so the first match is the maximum.
    #[test]
    fn rule_table_is_ordered_newest_first() {
        assert!(RULES.windows(2).all(|w| w[0].version >= w[1].version));
    }
}
