//! The CDI spec document as serde types, with the JSON field names of the CDI
//! specification (`specs-go/config.go` in tags.cncf.io/container-device-interface).
//!
//! Every optional field is left out of the JSON when unset or empty, so a spec
//! serializes to exactly the fields the caller set; which fields a given `cdiVersion`
//! may contain is checked by [`crate::validate`]. Unknown fields are ignored when
//! deserializing (the strict per-version check works on the raw JSON instead).
//! Maps are `BTreeMap`s so that output is deterministic.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A CDI spec file: one vendor/class, its devices and the edits they share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    /// `cdiVersion`: the spec version this document claims to follow.
    #[serde(rename = "cdiVersion")]
    pub cdi_version: String,
    /// `kind`: `vendor/class`, e.g. `tessera.dev/gpu`.
    pub kind: String,
    /// `annotations` (since 0.6.0): CDI-only metadata, not applied to containers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// `devices`: the devices this spec defines.
    pub devices: Vec<Device>,
    /// `containerEdits`: edits applied once when any device of this spec is injected.
    #[serde(
        rename = "containerEdits",
        default,
        skip_serializing_if = "edits_are_absent"
    )]
    pub container_edits: Option<ContainerEdits>,
}

fn edits_are_absent(edits: &Option<ContainerEdits>) -> bool {
    edits.as_ref().is_none_or(ContainerEdits::is_empty)
}

impl Spec {
    /// A spec of `kind` with the given version and devices and nothing else.
    pub fn new(
        cdi_version: impl Into<String>,
        kind: impl Into<String>,
        devices: Vec<Device>,
    ) -> Self {
        Self {
            cdi_version: cdi_version.into(),
            kind: kind.into(),
            annotations: BTreeMap::new(),
            devices,
            container_edits: None,
        }
    }

    /// Sets the spec-wide container edits.
    #[must_use]
    pub fn with_container_edits(mut self, edits: ContainerEdits) -> Self {
        self.container_edits = Some(edits);
        self
    }

    /// The device named `name`, if this spec defines it.
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name == name)
    }
}

/// One device a runtime can inject, addressed as `kind=name`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// `name`: unique within the spec.
    pub name: String,
    /// `annotations` (since 0.6.0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// `containerEdits`: required, and must not be empty.
    #[serde(rename = "containerEdits")]
    pub container_edits: ContainerEdits,
}

impl Device {
    /// A device with the given edits.
    pub fn new(name: impl Into<String>, container_edits: ContainerEdits) -> Self {
        Self {
            name: name.into(),
            annotations: BTreeMap::new(),
            container_edits,
        }
    }
}

/// Edits a runtime makes to the container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerEdits {
    /// `env`: `KEY=VALUE` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// `deviceNodes`.
    #[serde(rename = "deviceNodes", default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// `netDevices` (since 1.1.0).
    #[serde(rename = "netDevices", default, skip_serializing_if = "Vec::is_empty")]
    pub net_devices: Vec<NetDevice>,
    /// `hooks`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// `mounts`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// `intelRdt` (since 0.7.0).
    #[serde(rename = "intelRdt", default, skip_serializing_if = "Option::is_none")]
    pub intel_rdt: Option<IntelRdt>,
    /// `additionalGids` (since 0.7.0). The JSON name is `additionalGids`, as in the Go
    /// library's tag and the JSON schema.
    #[serde(
        rename = "additionalGids",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub additional_gids: Vec<u32>,
}

impl ContainerEdits {
    /// True when no edit is set. Empty edits are allowed spec-wide, not on a device.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.net_devices.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.intel_rdt.is_none()
            && self.additional_gids.is_empty()
    }

    /// Appends an environment entry `key=value`.
    #[must_use]
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.env.push(format!("{key}={value}"));
        self
    }

    /// Appends a device node.
    #[must_use]
    pub fn with_device_node(mut self, node: DeviceNode) -> Self {
        self.device_nodes.push(node);
        self
    }

    /// Appends a mount.
    #[must_use]
    pub fn with_mount(mut self, mount: Mount) -> Self {
        self.mounts.push(mount);
        self
    }

    /// Appends a hook.
    #[must_use]
    pub fn with_hook(mut self, hook: Hook) -> Self {
        self.hooks.push(hook);
        self
    }
}

/// A device node to create in the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNode {
    /// `path`: absolute path inside the container.
    pub path: String,
    /// `hostPath` (since 0.5.0): the node on the host, when it differs from `path`.
    #[serde(rename = "hostPath", default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `type`: `c`, `b`, `u` or `p`; runtimes stat the host node when unset.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
    /// `major` device number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// `minor` device number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// `fileMode`: Go `os.FileMode` bits.
    #[serde(rename = "fileMode", default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// `permissions`: device cgroup access, a combination of `r`, `w`, `m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// `uid` of the node in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// `gid` of the node in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

impl DeviceNode {
    /// A node known only by its container path (runtimes stat the same host path).
    pub fn at(path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            ..Self::default()
        }
    }

    /// A character device `major:minor` at `path`, taken from `host_path` on the host,
    /// with `rw` cgroup access. Sets `hostPath`, so the spec needs cdiVersion 0.5.0.
    pub fn char(
        path: impl Into<String>,
        host_path: impl Into<String>,
        major: i64,
        minor: i64,
    ) -> Self {
        Self {
            path: path.into(),
            host_path: Some(host_path.into()),
            node_type: Some("c".to_owned()),
            major: Some(major),
            minor: Some(minor),
            permissions: Some("rw".to_owned()),
            ..Self::default()
        }
    }

    /// Replaces the cgroup permissions (`r`, `w`, `m` combined).
    #[must_use]
    pub fn with_permissions(mut self, permissions: impl Into<String>) -> Self {
        self.permissions = Some(permissions.into());
        self
    }
}

/// A mount to add to the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// `hostPath`: the mount source.
    #[serde(rename = "hostPath")]
    pub host_path: String,
    /// `containerPath`: the mount destination.
    #[serde(rename = "containerPath")]
    pub container_path: String,
    /// `type` (since 0.4.0): file system type, e.g. `tmpfs`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
    /// `options`: OCI mount options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Mount {
    /// A bind mount with the given options.
    pub fn bind(host: impl Into<String>, container: impl Into<String>, options: &[&str]) -> Self {
        Self {
            host_path: host.into(),
            container_path: container.into(),
            mount_type: None,
            options: options.iter().map(|o| (*o).to_owned()).collect(),
        }
    }

    /// A read-only bind mount (`ro, nosuid, nodev, bind`), as used for driver libraries.
    pub fn bind_ro(host: impl Into<String>, container: impl Into<String>) -> Self {
        Self::bind(host, container, &["ro", "nosuid", "nodev", "bind"])
    }

    /// A read-write bind mount (`rw, nosuid, nodev, bind`).
    pub fn bind_rw(host: impl Into<String>, container: impl Into<String>) -> Self {
        Self::bind(host, container, &["rw", "nosuid", "nodev", "bind"])
    }
}

/// An OCI hook to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hook {
    /// `hookName`: `prestart`, `createRuntime`, `createContainer`, `startContainer`,
    /// `poststart` or `poststop`.
    #[serde(rename = "hookName")]
    pub hook_name: String,
    /// `path`: absolute path of the executable.
    pub path: String,
    /// `args`: argv, including argv\[0\].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// `env`: `KEY=VALUE` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// `timeout` in seconds; must be positive when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
}

impl Hook {
    /// A hook without args, env or timeout.
    pub fn new(hook_name: impl Into<String>, path: impl Into<String>) -> Self {
        Self {
            hook_name: hook_name.into(),
            path: path.into(),
            args: Vec::new(),
            env: Vec::new(),
            timeout: None,
        }
    }
}

/// Intel RDT settings (`intelRdt`, since 0.7.0).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntelRdt {
    /// `closID`: a file name, or `/` for the root class of service.
    #[serde(rename = "closID", default, skip_serializing_if = "Option::is_none")]
    pub clos_id: Option<String>,
    /// `l3CacheSchema`.
    #[serde(
        rename = "l3CacheSchema",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub l3_cache_schema: Option<String>,
    /// `memBwSchema`.
    #[serde(
        rename = "memBwSchema",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub mem_bw_schema: Option<String>,
    /// `schemata` (since 1.1.0). `Some(vec![])` still counts as set, as a non-nil
    /// slice does in the Go library's version rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schemata: Option<Vec<String>>,
    /// `enableMonitoring` (since 1.1.0).
    #[serde(rename = "enableMonitoring", default, skip_serializing_if = "is_false")]
    pub enable_monitoring: bool,
    /// `enableCMT` (0.7.0 to 1.0.0; removed in 1.1.0).
    #[serde(rename = "enableCMT", default, skip_serializing_if = "is_false")]
    pub enable_cmt: bool,
    /// `enableMBM` (0.7.0 to 1.0.0; removed in 1.1.0).
    #[serde(rename = "enableMBM", default, skip_serializing_if = "is_false")]
    pub enable_mbm: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A host network interface moved into the container (`netDevices`, since 1.1.0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetDevice {
    /// `hostInterfaceName`.
    #[serde(rename = "hostInterfaceName")]
    pub host_interface_name: String,
    /// `name` inside the container.
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Unset optional fields are left out: a spec serializes to what the caller set.
    #[test]
    fn unset_fields_are_omitted_from_json() {
        let spec = Spec::new(
            "0.5.0",
            "tessera.dev/gpu",
            vec![Device::new(
                "gpu0",
                ContainerEdits::default().with_device_node(DeviceNode::at("/dev/nvidia0")),
            )],
        )
        .with_container_edits(ContainerEdits::default());
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            json!({
                "cdiVersion": "0.5.0",
                "kind": "tessera.dev/gpu",
                "devices": [{"name": "gpu0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}]
            })
        );
    }

    /// Every field uses the CDI spec's camelCase JSON name.
    #[test]
    fn fields_use_cdi_json_names() {
        let edits = ContainerEdits {
            env: vec!["A=1".into()],
            device_nodes: vec![DeviceNode {
                file_mode: Some(0o666),
                uid: Some(1),
                gid: Some(2),
                ..DeviceNode::char("/dev/x", "/host/dev/x", 1, 0)
            }],
            net_devices: vec![NetDevice {
                host_interface_name: "eth1".into(),
                name: "net0".into(),
            }],
            hooks: vec![Hook {
                timeout: Some(5),
                args: vec!["hook".into()],
                env: vec!["B=2".into()],
                ..Hook::new("createContainer", "/bin/hook")
            }],
            mounts: vec![Mount {
                mount_type: Some("tmpfs".into()),
                ..Mount::bind_ro("/h", "/c")
            }],
            intel_rdt: Some(IntelRdt {
                clos_id: Some("c".into()),
                l3_cache_schema: Some("L3:0=f".into()),
                mem_bw_schema: Some("MB:0=50".into()),
                schemata: Some(vec!["L2:0=f".into()]),
                enable_monitoring: true,
                enable_cmt: true,
                enable_mbm: true,
            }),
            additional_gids: vec![44],
        };
        let v = serde_json::to_value(&edits).unwrap();
        let keys = |v: &serde_json::Value| {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(
            keys(&v),
            [
                "additionalGids",
                "deviceNodes",
                "env",
                "hooks",
                "intelRdt",
                "mounts",
                "netDevices"
            ]
        );
        assert_eq!(
            keys(&v["deviceNodes"][0]),
            [
                "fileMode",
                "gid",
                "hostPath",
                "major",
                "minor",
                "path",
                "permissions",
                "type",
                "uid"
            ]
        );
        assert_eq!(
            keys(&v["mounts"][0]),
            ["containerPath", "hostPath", "options", "type"]
        );
        assert_eq!(
            keys(&v["hooks"][0]),
            ["args", "env", "hookName", "path", "timeout"]
        );
        assert_eq!(keys(&v["netDevices"][0]), ["hostInterfaceName", "name"]);
        assert_eq!(
            keys(&v["intelRdt"]),
            [
                "closID",
                "enableCMT",
                "enableMBM",
                "enableMonitoring",
                "l3CacheSchema",
                "memBwSchema",
                "schemata"
            ]
        );
        let back: ContainerEdits = serde_json::from_value(v).unwrap();
        assert_eq!(back, edits);
    }

    /// A character node keeps minor 0 (the first GPU) instead of dropping it.
    #[test]
    fn char_node_keeps_minor_zero() {
        let v =
            serde_json::to_value(DeviceNode::char("/dev/nvidia0", "/dev/nvidia0", 195, 0)).unwrap();
        assert_eq!(
            v,
            json!({"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0", "type": "c",
                   "major": 195, "minor": 0, "permissions": "rw"})
        );
    }
}
