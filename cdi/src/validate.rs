//! Validation of CDI specs: the crate's one error enum, [`ValidationError`], and the
//! checks that decide whether a runtime will load a spec.
//!
//! Three layers, all pure and deterministic:
//! 1. version: `cdiVersion` is known ([`SpecVersion`]) and at least the minimum the
//!    spec's features need ([`crate::version`]);
//! 2. strict fields: the JSON has only fields its `cdiVersion` has ([`check_fields`]);
//! 3. semantics, as the Go library's default validator
//!    (`pkg/cdi/producer/validator/validator-default.go`, `pkg/parser/parser.go`):
//!    kind and device names, unique non-empty devices, `KEY=VALUE` env, device nodes,
//!    mounts, hooks, Intel RDT, net devices, annotation keys. Stricter than Go in two
//!    places taken from the CDI spec text: device node and hook paths must be
//!    absolute, and a hook timeout must be positive.

use std::collections::{BTreeMap, HashSet};

use serde_json::Value;

pub use crate::fields::check_fields;
use crate::qualified::{parse_kind, validate_device_name};
use crate::spec::{ContainerEdits, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec};
use crate::version::{SpecVersion, requirement};

pub use crate::error::ValidationError;

/// Validates a spec fully: version, strict fields on its serialization, semantics.
/// Returns the declared version.
///
/// # Errors
/// The first [`ValidationError`] found, in that order.
pub fn validate_spec(spec: &Spec) -> Result<SpecVersion, ValidationError> {
    let declared = check_version(spec)?;
    let json =
        serde_json::to_value(spec).map_err(|source| ValidationError::Serialize { source })?;
    check_fields(&json, declared)?;
    validate_semantics(spec)?;
    Ok(declared)
}

/// Validates a spec document as a runtime reads it: strict fields against its own
/// `cdiVersion` first (as podman 4.3.1's strict unmarshal does), then the types,
/// version and semantics. Returns the parsed spec.
///
/// # Errors
/// The first [`ValidationError`] found.
pub fn validate_json(json: &Value) -> Result<Spec, ValidationError> {
    let version = json
        .get("cdiVersion")
        .and_then(Value::as_str)
        .ok_or(ValidationError::MissingVersion)?;
    let declared = SpecVersion::parse(version).ok_or_else(|| ValidationError::UnknownVersion {
        version: version.to_owned(),
    })?;
    check_fields(json, declared)?;
    let spec: Spec = serde_json::from_value(json.clone())
        .map_err(|source| ValidationError::Deserialize { source })?;
    check_version(&spec)?;
    validate_semantics(&spec)?;
    Ok(spec)
}

/// Checks that `cdiVersion` is known and not below the spec's [`requirement`].
/// As in the Go library, that minimum is never below [`SpecVersion::EARLIEST`], so
/// a spec declaring 0.1.0 or 0.2.0 is refused although both versions are known.
/// Returns the declared version.
///
/// # Errors
/// [`ValidationError::UnknownVersion`] or [`ValidationError::VersionTooLow`].
pub fn check_version(spec: &Spec) -> Result<SpecVersion, ValidationError> {
    let declared =
        SpecVersion::parse(&spec.cdi_version).ok_or_else(|| ValidationError::UnknownVersion {
            version: spec.cdi_version.clone(),
        })?;
    let required = requirement(spec);
    if required.version > declared {
        return Err(ValidationError::VersionTooLow {
            declared,
            required: required.version,
            feature: required.feature,
        });
    }
    Ok(declared)
}

/// The semantic checks alone (no version, no strict fields).
///
/// # Errors
/// The first [`ValidationError`] found: kind, spec annotations, spec-wide edits,
/// then each device in order.
pub fn validate_semantics(spec: &Spec) -> Result<(), ValidationError> {
    parse_kind(&spec.kind).map_err(|source| ValidationError::Kind {
        kind: spec.kind.clone(),
        source,
    })?;
    check_annotations("annotations", &spec.annotations)?;
    if let Some(edits) = &spec.container_edits {
        check_edits("containerEdits", edits)?;
    }
    if spec.devices.is_empty() {
        return Err(ValidationError::NoDevices);
    }
    let mut seen = HashSet::new();
    for (i, device) in spec.devices.iter().enumerate() {
        validate_device_name(&device.name).map_err(|source| ValidationError::DeviceName {
            device: device.name.clone(),
            source,
        })?;
        if !seen.insert(device.name.as_str()) {
            return Err(ValidationError::DuplicateDevice {
                device: device.name.clone(),
            });
        }
        check_annotations(&format!("devices[{i}].annotations"), &device.annotations)?;
        if device.container_edits.is_empty() {
            return Err(ValidationError::EmptyDeviceEdits {
                device: device.name.clone(),
            });
        }
        check_edits(
            &format!("devices[{i}].containerEdits"),
            &device.container_edits,
        )?;
    }
    Ok(())
}

fn check_edits(path: &str, edits: &ContainerEdits) -> Result<(), ValidationError> {
    check_env(&format!("{path}.env"), &edits.env)?;
    for (i, node) in edits.device_nodes.iter().enumerate() {
        check_device_node(&format!("{path}.deviceNodes[{i}]"), node)?;
    }
    for (i, hook) in edits.hooks.iter().enumerate() {
        check_hook(&format!("{path}.hooks[{i}]"), hook)?;
    }
    for (i, mount) in edits.mounts.iter().enumerate() {
        check_mount(&format!("{path}.mounts[{i}]"), mount)?;
    }
    if let Some(rdt) = &edits.intel_rdt {
        check_intel_rdt(&format!("{path}.intelRdt"), rdt)?;
    }
    check_net_devices(&format!("{path}.netDevices"), &edits.net_devices)
}

fn check_env(path: &str, env: &[String]) -> Result<(), ValidationError> {
    match env
        .iter()
        .enumerate()
        .find(|(_, e)| !matches!(e.find('='), Some(p) if p > 0))
    {
        Some((i, entry)) => Err(ValidationError::Env {
            path: format!("{path}[{i}]"),
            entry: entry.clone(),
        }),
        None => Ok(()),
    }
}

fn check_device_node(path: &str, node: &DeviceNode) -> Result<(), ValidationError> {
    let absolute = |field: &str, value: &str| {
        if value.starts_with('/') {
            Ok(())
        } else {
            Err(ValidationError::DeviceNodePath {
                path: format!("{path}.{field}"),
                value: value.to_owned(),
            })
        }
    };
    absolute("path", &node.path)?;
    if let Some(host) = &node.host_path {
        absolute("hostPath", host)?;
    }
    if let Some(t) = &node.node_type
        && !matches!(t.as_str(), "" | "b" | "c" | "u" | "p")
    {
        return Err(ValidationError::DeviceNodeType {
            path: format!("{path}.type"),
            value: t.clone(),
        });
    }
    for (field, number) in [("major", node.major), ("minor", node.minor)] {
        if number.is_some_and(|n| n < 0) {
            return Err(ValidationError::DeviceNumber {
                path: format!("{path}.{field}"),
            });
        }
    }
    if let Some(p) = &node.permissions
        && !p.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))
    {
        return Err(ValidationError::DevicePermissions {
            path: format!("{path}.permissions"),
            value: p.clone(),
        });
    }
    Ok(())
}

/// The OCI hook points a CDI hook may name.
pub const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

fn check_hook(path: &str, hook: &Hook) -> Result<(), ValidationError> {
    if !HOOK_NAMES.contains(&hook.hook_name.as_str()) {
        return Err(ValidationError::HookName {
            path: format!("{path}.hookName"),
            value: hook.hook_name.clone(),
        });
    }
    if !hook.path.starts_with('/') {
        return Err(ValidationError::HookPath {
            path: format!("{path}.path"),
            value: hook.path.clone(),
        });
    }
    check_env(&format!("{path}.env"), &hook.env)?;
    if hook.timeout == Some(0) {
        return Err(ValidationError::HookTimeout {
            path: format!("{path}.timeout"),
        });
    }
    Ok(())
}

fn check_mount(path: &str, mount: &Mount) -> Result<(), ValidationError> {
    let missing = if mount.host_path.is_empty() {
        "hostPath"
    } else if mount.container_path.is_empty() {
        "containerPath"
    } else {
        return Ok(());
    };
    Err(ValidationError::Mount {
        path: path.to_owned(),
        missing,
    })
}

fn check_intel_rdt(path: &str, rdt: &IntelRdt) -> Result<(), ValidationError> {
    match rdt.clos_id.as_deref() {
        None | Some("/") => Ok(()),
        Some(c) if c.len() >= 4096 || c == "." || c == ".." || c.contains(['/', '\n']) => {
            Err(ValidationError::ClosId {
                path: format!("{path}.closID"),
                value: c.to_owned(),
            })
        }
        Some(_) => Ok(()),
    }
}

fn check_net_devices(path: &str, devices: &[NetDevice]) -> Result<(), ValidationError> {
    let (mut hosts, mut names) = (HashSet::new(), HashSet::new());
    for (i, dev) in devices.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let missing = if dev.host_interface_name.is_empty() {
            Some("hostInterfaceName")
        } else if dev.name.is_empty() {
            Some("name")
        } else {
            None
        };
        if let Some(missing) = missing {
            return Err(ValidationError::NetDevice { path: at, missing });
        }
        for (set, name) in [
            (&mut hosts, &dev.host_interface_name),
            (&mut names, &dev.name),
        ] {
            if !set.insert(name.as_str()) {
                return Err(ValidationError::DuplicateNetDevice {
                    path: at,
                    name: name.clone(),
                });
            }
        }
    }
    Ok(())
}

/// Kubernetes' limit on the total size of an object's annotations.
const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

fn check_annotations(
    path: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<(), ValidationError> {
    if let Some(key) = annotations
        .keys()
        .find(|k| !is_qualified_name(&k.to_ascii_lowercase()))
    {
        return Err(ValidationError::AnnotationKey {
            path: path.to_owned(),
            key: key.clone(),
        });
    }
    let size = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > ANNOTATIONS_MAX_BYTES {
        return Err(ValidationError::AnnotationsTooLarge {
            path: path.to_owned(),
            size,
        });
    }
    Ok(())
}

/// Kubernetes `IsQualifiedName`: `[prefix/]name`, prefix a DNS-1123 subdomain,
/// name at most 63 alphanumerics plus inner `-_.`.
fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    name_ok && prefix.is_none_or(is_dns_subdomain)
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && label.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Device;
    use serde_json::json;

    fn base() -> Spec {
        Spec::new(
            "0.5.0",
            "tessera.dev/gpu",
            vec![Device::new(
                "gpu0",
                ContainerEdits::default().with_device_node(DeviceNode::char(
                    "/dev/nvidia0",
                    "/dev/nvidia0",
                    195,
                    0,
                )),
            )],
        )
    }

    fn edit(f: impl FnOnce(&mut ContainerEdits)) -> Spec {
        let mut s = base();
        f(&mut s.devices[0].container_edits);
        s
    }

    /// A minimal valid spec passes every layer.
    #[test]
    fn a_minimal_gpu_spec_is_valid() {
        assert_eq!(validate_spec(&base()).unwrap(), SpecVersion::V0_5_0);
    }

    /// Each semantic rule refuses its broken case with the variant named for it.
    #[test]
    fn each_semantic_rule_refuses_its_case() {
        type Check = fn(&ValidationError) -> bool;
        let cases: Vec<(&str, Spec, Check)> = vec![
            (
                "kind without class",
                Spec {
                    kind: "tessera.dev".into(),
                    ..base()
                },
                |e| matches!(e, ValidationError::Kind { .. }),
            ),
            (
                "no devices",
                Spec {
                    devices: vec![],
                    ..base()
                },
                |e| matches!(e, ValidationError::NoDevices),
            ),
            (
                "bad device name",
                {
                    let mut s = base();
                    s.devices[0].name = "-gpu".into();
                    s
                },
                |e| matches!(e, ValidationError::DeviceName { device, .. } if device == "-gpu"),
            ),
            (
                "duplicate device",
                {
                    let mut s = base();
                    s.devices.push(s.devices[0].clone());
                    s
                },
                |e| matches!(e, ValidationError::DuplicateDevice { device } if device == "gpu0"),
            ),
            (
                "empty device edits",
                edit(|e| *e = ContainerEdits::default()),
                |e| matches!(e, ValidationError::EmptyDeviceEdits { device } if device == "gpu0"),
            ),
            (
                "env without =",
                edit(|e| e.env = vec!["A=1".into(), "B".into()]),
                |e| matches!(e, ValidationError::Env { path, .. } if path == "devices[0].containerEdits.env[1]"),
            ),
            (
                "env with empty key",
                edit(|e| e.env = vec!["=1".into()]),
                |e| matches!(e, ValidationError::Env { .. }),
            ),
            (
                "relative node path",
                edit(|e| e.device_nodes[0].path = "dev/nvidia0".into()),
                |e| {
                    matches!(e, ValidationError::DeviceNodePath { path, .. }
                    if path == "devices[0].containerEdits.deviceNodes[0].path")
                },
            ),
            (
                "relative host path",
                edit(|e| e.device_nodes[0].host_path = Some("nvidia0".into())),
                |e| matches!(e, ValidationError::DeviceNodePath { path, .. } if path.ends_with("hostPath")),
            ),
            (
                "bad node type",
                edit(|e| e.device_nodes[0].node_type = Some("x".into())),
                |e| matches!(e, ValidationError::DeviceNodeType { .. }),
            ),
            (
                "negative minor",
                edit(|e| e.device_nodes[0].minor = Some(-1)),
                |e| matches!(e, ValidationError::DeviceNumber { path } if path.ends_with("minor")),
            ),
            (
                "bad permissions",
                edit(|e| e.device_nodes[0].permissions = Some("rwx".into())),
                |e| matches!(e, ValidationError::DevicePermissions { .. }),
            ),
            (
                "mount without host path",
                edit(|e| e.mounts.push(Mount::bind_ro("", "/c"))),
                |e| {
                    matches!(
                        e,
                        ValidationError::Mount {
                            missing: "hostPath",
                            ..
                        }
                    )
                },
            ),
            (
                "mount without container path",
                edit(|e| e.mounts.push(Mount::bind_ro("/h", ""))),
                |e| {
                    matches!(e, ValidationError::Mount { path, missing: "containerPath" }
                    if path == "devices[0].containerEdits.mounts[0]")
                },
            ),
            (
                "unknown hook",
                edit(|e| e.hooks.push(Hook::new("preStart", "/bin/h"))),
                |e| matches!(e, ValidationError::HookName { .. }),
            ),
            (
                "relative hook path",
                edit(|e| e.hooks.push(Hook::new("poststop", "h"))),
                |e| matches!(e, ValidationError::HookPath { .. }),
            ),
            (
                "hook env",
                edit(|e| {
                    e.hooks.push(Hook {
                        env: vec!["X".into()],
                        ..Hook::new("poststop", "/h")
                    })
                }),
                |e| matches!(e, ValidationError::Env { path, .. } if path.ends_with("hooks[0].env[0]")),
            ),
            (
                "zero hook timeout",
                edit(|e| {
                    e.hooks.push(Hook {
                        timeout: Some(0),
                        ..Hook::new("poststop", "/h")
                    })
                }),
                |e| matches!(e, ValidationError::HookTimeout { .. }),
            ),
            (
                "closID with slash",
                Spec {
                    cdi_version: "0.7.0".into(),
                    ..edit(|e| {
                        e.intel_rdt = Some(IntelRdt {
                            clos_id: Some("a/b".into()),
                            ..IntelRdt::default()
                        })
                    })
                },
                |e| matches!(e, ValidationError::ClosId { .. }),
            ),
            (
                "duplicate net device",
                Spec {
                    cdi_version: "1.1.0".into(),
                    ..edit(|e| {
                        let n = |h: &str, c: &str| NetDevice {
                            host_interface_name: h.into(),
                            name: c.into(),
                        };
                        e.net_devices = vec![n("eth1", "net0"), n("eth2", "net0")];
                    })
                },
                |e| matches!(e, ValidationError::DuplicateNetDevice { name, .. } if name == "net0"),
            ),
            (
                "bad annotation key",
                Spec {
                    cdi_version: "0.6.0".into(),
                    annotations: BTreeMap::from([("bad key".into(), "v".into())]),
                    ..base()
                },
                |e| matches!(e, ValidationError::AnnotationKey { .. }),
            ),
        ];
        for (what, spec, check) in cases {
            let err = validate_spec(&spec).expect_err(what);
            assert!(check(&err), "{what}: got {err:?}");
        }
    }

    /// A declared version below what the features need (and below 0.3.0 in any case)
    /// is refused, naming the feature; an unknown version is refused.
    #[test]
    fn a_version_below_the_features_is_refused() {
        let spec = Spec {
            cdi_version: "0.3.0".into(),
            ..base()
        };
        assert!(matches!(
            validate_spec(&spec),
            Err(ValidationError::VersionTooLow {
                declared: SpecVersion::V0_3_0,
                required: SpecVersion::V0_5_0,
                feature: "deviceNodes[].hostPath"
            })
        ));
        let spec = Spec {
            cdi_version: "0.1.0".into(),
            ..edit(|e| e.device_nodes[0].host_path = None)
        };
        assert!(matches!(
            validate_spec(&spec),
            Err(ValidationError::VersionTooLow {
                required: SpecVersion::V0_3_0,
                ..
            })
        ));
        let spec = Spec {
            cdi_version: "0.9.0".into(),
            ..base()
        };
        assert!(matches!(
            validate_spec(&spec),
            Err(ValidationError::UnknownVersion { .. })
        ));
    }

    /// Raw JSON is checked strictly against its own version before anything else.
    #[test]
    fn json_is_checked_strictly_against_its_own_version() {
        let mut json = serde_json::to_value(base()).unwrap();
        assert!(validate_json(&json).is_ok());
        json["devices"][0]["annotations"] = json!({"a": "b"});
        assert!(matches!(
            validate_json(&json),
            Err(ValidationError::UnknownField { path, version: SpecVersion::V0_5_0 })
                if path == "devices[0].annotations"
        ));
        json["cdiVersion"] = json!("0.6.0");
        assert_eq!(
            validate_json(&json).unwrap().devices[0].annotations.len(),
            1
        );
        assert!(matches!(
            validate_json(&json!({"kind": "a/b"})),
            Err(ValidationError::MissingVersion)
        ));
        assert!(matches!(
            validate_json(&json!({"cdiVersion": "0.5.0", "kind": "a/b"})),
            Err(ValidationError::Deserialize { .. })
        ));
    }

    /// Annotation keys follow Kubernetes' qualified-name rule.
    #[test]
    fn annotation_keys_are_kubernetes_qualified_names() {
        let cases: &[(&str, bool)] = &[
            ("a", true),
            ("tessera.dev/claim-uid", true),
            ("Tessera.Dev/Claim_UID", true),
            ("a.b", true),
            ("", false),
            ("/a", false),
            ("a/", false),
            ("a/b/c", false),
            ("-a", false),
            ("a b", false),
            ("x_y.com/a", false),
        ];
        for (key, ok) in cases {
            assert_eq!(is_qualified_name(&key.to_ascii_lowercase()), *ok, "{key:?}");
        }
        assert!(!is_qualified_name(&"a".repeat(64)));
    }
}
