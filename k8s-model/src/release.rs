//! Kubernetes server versions (1.34–1.38) and DRA feature gates: which fields each
//! version's `resource.k8s.io/v1` API has, and which ones a disabled gate drops.
//! Pure data, shared by the slice builder, the publisher, `tessera plan` and the fake
//! API server (`kubernetes-dra-api.md` §4, §7).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// A supported Kubernetes minor release (1.34 to 1.38; 1.38 as of v1.38.0-beta.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeVersion {
    minor: u32,
}

impl KubeVersion {
    pub const OLDEST: KubeVersion = KubeVersion { minor: 34 };
    pub const NEWEST: KubeVersion = KubeVersion { minor: 38 };
    pub const ALL: [KubeVersion; 5] = [
        KubeVersion { minor: 34 },
        KubeVersion { minor: 35 },
        KubeVersion { minor: 36 },
        KubeVersion { minor: 37 },
        KubeVersion { minor: 38 },
    ];

    /// `Some` for 1.34..=1.38.
    pub fn new(minor: u32) -> Option<Self> {
        (34..=38).contains(&minor).then_some(KubeVersion { minor })
    }

    pub fn minor(self) -> u32 {
        self.minor
    }

    /// From `/version`'s `major`/`minor` fields (`"1"`, `"37+"`). Newer servers are
    /// treated as the newest known version, older ones are refused.
    pub fn from_server(major: &str, minor: &str) -> Result<Self, VersionError> {
        let digits: String = minor.chars().take_while(|c| c.is_ascii_digit()).collect();
        let m: u32 = digits
            .parse()
            .map_err(|_| VersionError::Unparsable(format!("{major}.{minor}")))?;
        if major != "1" {
            return Err(VersionError::Unparsable(format!("{major}.{minor}")));
        }
        if m > Self::NEWEST.minor {
            return Ok(Self::NEWEST);
        }
        Self::new(m).ok_or(VersionError::Unsupported(format!("1.{m}")))
    }

    /// The `gitVersion` a server of this release reports.
    pub fn git_version(self) -> String {
        format!("v1.{}.0", self.minor)
    }

    /// Whether counter sets must live in slices of their own (KEP-4815 shape change).
    pub fn counters_in_own_slices(self) -> bool {
        self.minor >= 35
    }

    /// Whether the scheduler (with DRAConsumableCapacity on) also checks a pick's
    /// capacity on `slice.Spec.Devices[i]`, `i` the pick's index within its request,
    /// in the chosen device's slice: 1.34's `allocateDevice` passes `r.deviceIndex` to
    /// `CmpRequestOverCapacity` (every 1.34.x, k8s.io/dynamic-resource-allocation up to
    /// v0.34.13); 1.35 passes the device. An index past the slice's end panics.
    pub fn checks_capacity_at_pick_index(self) -> bool {
        self.minor == 34
    }

    /// Whether each pick of a request scans every device again (1.34, 1.35), so a
    /// multi-allocatable device may be taken twice by one request; from 1.36 the next
    /// pick starts after the previous one (`allocateOne`'s `startLocation`).
    pub fn rescans_each_pick(self) -> bool {
        self.minor <= 35
    }

    /// Whether the scheduler's DynamicResources plugin scores nodes by the
    /// `firstAvailable` subrequests their allocation uses, preferring earlier ones
    /// (kubernetes#134711, from 1.35: `Score`/`computeScore`, weight 2 in the default
    /// profile). 1.34 has no such score: any node where the claim fits may win.
    pub fn scores_prioritized_list(self) -> bool {
        self.minor >= 35
    }
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}", self.minor)
    }
}

impl FromStr for KubeVersion {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().trim_start_matches('v');
        let mut parts = s.split('.');
        let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
            return Err(VersionError::Unparsable(s.into()));
        };
        if major != "1" {
            return Err(VersionError::Unparsable(s.into()));
        }
        let m: u32 = minor
            .parse()
            .map_err(|_| VersionError::Unparsable(s.into()))?;
        Self::new(m).ok_or(VersionError::Unsupported(s.into()))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error("cannot parse Kubernetes version {0:?}")]
    Unparsable(String),
    #[error("Kubernetes {0} is not supported (1.34 to 1.38 are)")]
    Unsupported(String),
    #[error("unknown feature gate {0:?}")]
    UnknownGate(String),
    #[error("feature gate {gate}: {reason}")]
    BadGate { gate: String, reason: String },
}

/// DRA-related feature gates Tessera knows, with their default per release (index 0 =
/// 1.34 … 4 = 1.38; `None` = the gate does not exist in that release). 1.38 is
/// v1.38.0-beta.0's `kube_features.go`: DynamicResourceAllocation is gone (GA since
/// 1.35), and DRAConsumableCapacity, DRADeviceBindingConditions, DRADeviceTaints,
/// DRADeviceTaintRules, DRAPartitionableDevices and DRAFractionalCapacityRange are GA.
const GATES: &[(&str, [Option<bool>; 5])] = &[
    (
        "DynamicResourceAllocation",
        [Some(true), Some(true), Some(true), Some(true), None],
    ),
    (
        "DRAPrioritizedList",
        [Some(true), Some(true), Some(true), Some(true), Some(true)],
    ),
    (
        "DRAAdminAccess",
        [Some(true), Some(true), Some(true), Some(true), Some(true)],
    ),
    (
        "DRAResourceClaimDeviceStatus",
        [Some(true), Some(true), Some(true), Some(true), Some(true)],
    ),
    (
        "DRADeviceTaints",
        [Some(false), Some(false), Some(true), Some(true), Some(true)],
    ),
    (
        "DRADeviceTaintRules",
        [None, Some(false), Some(false), Some(true), Some(true)],
    ),
    (
        "DRAPartitionableDevices",
        [Some(false), Some(false), Some(true), Some(true), Some(true)],
    ),
    (
        "DRAConsumableCapacity",
        [Some(false), Some(false), Some(true), Some(true), Some(true)],
    ),
    (
        "DRADeviceBindingConditions",
        [Some(false), Some(false), Some(true), Some(true), Some(true)],
    ),
    (
        "DRAExtendedResource",
        [Some(false), Some(false), Some(true), Some(true), Some(true)],
    ),
    (
        "DRASchedulerFilterTimeout",
        [Some(true), Some(true), Some(true), Some(true), Some(true)],
    ),
    (
        "ResourceHealthStatus",
        [Some(false), Some(false), Some(true), Some(true), Some(true)],
    ),
    (
        "DRAResourceClaimGranularStatusAuthorization",
        [None, None, Some(true), Some(true), Some(true)],
    ),
    (
        "DRAListTypeAttributes",
        [None, None, Some(false), Some(false), Some(false)],
    ),
    (
        "DRANodeAllocatableResources",
        [None, None, Some(false), Some(false), Some(false)],
    ),
    (
        "DRAWorkloadResourceClaims",
        [None, None, Some(false), Some(false), Some(false)],
    ),
    // Not a DRA gate, but DRAWorkloadResourceClaims needs it (Workload, PodGroup,
    // pod.spec.schedulingGroup, the scheduler's gang scheduling): alpha in 1.35, beta
    // and still off by default from 1.37.
    (
        "GenericWorkload",
        [None, Some(false), Some(false), Some(false), Some(false)],
    ),
    (
        "DRAResourcePoolStatus",
        [None, None, Some(false), Some(false), Some(false)],
    ),
    (
        "DRAFractionalCapacityRange",
        [None, None, None, Some(true), Some(true)],
    ),
    (
        "DRAOptionalNodeOperations",
        [None, None, None, Some(false), Some(false)],
    ),
    (
        "DRADerivedAttributes",
        [None, None, None, Some(false), Some(false)],
    ),
    (
        "DRADeviceCompatibilityGroups",
        [None, None, None, Some(false), Some(false)],
    ),
    (
        "DRAPartitionableDevicesType",
        [None, None, None, Some(false), Some(false)],
    ),
];

/// The effective feature gates of one server: the release's defaults plus overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureGates {
    version: KubeVersion,
    enabled: BTreeMap<&'static str, bool>,
}

impl FeatureGates {
    /// The release's default gates.
    pub fn defaults(version: KubeVersion) -> Self {
        let idx = (version.minor - 34) as usize;
        let enabled = GATES
            .iter()
            .filter_map(|(name, d)| d[idx].map(|on| (*name, on)))
            .collect();
        FeatureGates { version, enabled }
    }

    /// Defaults plus overrides in Kubernetes syntax: `A=true,B=false`. A gate the
    /// release does not have is an error, like the real `--feature-gates` flag.
    pub fn parse(version: KubeVersion, spec: &str) -> Result<Self, VersionError> {
        let mut gates = Self::defaults(version);
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, value) = item.split_once('=').ok_or_else(|| VersionError::BadGate {
                gate: item.into(),
                reason: "expected NAME=true|false".into(),
            })?;
            let on = match value.trim().to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => {
                    return Err(VersionError::BadGate {
                        gate: name.into(),
                        reason: format!("value {value:?} is not true or false"),
                    });
                }
            };
            let key = gates
                .enabled
                .keys()
                .copied()
                .find(|k| *k == name.trim())
                .ok_or_else(|| VersionError::UnknownGate(name.trim().into()))?;
            gates.enabled.insert(key, on);
        }
        Ok(gates)
    }

    pub fn version(&self) -> KubeVersion {
        self.version
    }

    /// Whether a gate is on. Unknown gates are off.
    pub fn enabled(&self, gate: &str) -> bool {
        self.enabled.get(gate).copied().unwrap_or(false)
    }

    /// `A=true,B=false` of every gate that differs from the release default.
    pub fn overrides(&self) -> String {
        let defaults = Self::defaults(self.version);
        self.enabled
            .iter()
            .filter(|(k, v)| defaults.enabled.get(*k) != Some(v))
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn partitionable_devices(&self) -> bool {
        self.enabled("DRAPartitionableDevices")
    }
    pub fn prioritized_list(&self) -> bool {
        self.enabled("DRAPrioritizedList")
    }
    pub fn consumable_capacity(&self) -> bool {
        self.enabled("DRAConsumableCapacity")
    }
    pub fn device_taints(&self) -> bool {
        self.enabled("DRADeviceTaints")
    }
    pub fn binding_conditions(&self) -> bool {
        self.enabled("DRADeviceBindingConditions")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gate defaults follow the release table; overrides apply; unknown gates fail.
    #[test]
    fn gates_follow_the_release_table() {
        let v134 = KubeVersion::new(34).unwrap();
        let v137 = KubeVersion::new(37).unwrap();
        assert!(!FeatureGates::defaults(v134).consumable_capacity());
        assert!(FeatureGates::defaults(v137).consumable_capacity());
        let g = FeatureGates::parse(
            v137,
            "DRAConsumableCapacity=false,DRAPartitionableDevices=true",
        )
        .unwrap();
        assert!(!g.consumable_capacity() && g.partitionable_devices());
        assert_eq!(g.overrides(), "DRAConsumableCapacity=false");
        assert!(matches!(
            FeatureGates::parse(v134, "DRAListTypeAttributes=true"),
            Err(VersionError::UnknownGate(_))
        ));
        assert!(FeatureGates::parse(v137, "DRAConsumableCapacity=maybe").is_err());
    }

    /// Versions parse from flags and from `/version`.
    #[test]
    fn versions_parse() {
        assert_eq!("1.35".parse::<KubeVersion>().unwrap().minor(), 35);
        assert!("1.33".parse::<KubeVersion>().is_err());
        assert_eq!(KubeVersion::from_server("1", "36+").unwrap().minor(), 36);
        assert_eq!(
            KubeVersion::from_server("1", "40").unwrap(),
            KubeVersion::NEWEST
        );
        assert!(KubeVersion::from_server("1", "30").is_err());
    }
}
