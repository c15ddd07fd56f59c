//! The strict per-version field check: which JSON fields each `cdiVersion` of the
//! spec has, and a walk over a spec's JSON that refuses any other field.
//!
//! Runtimes parse spec files strictly: podman 4.3.1's CDI library (0.5.2) uses
//! `yaml.UnmarshalStrict`, so a field its version does not have (e.g. `annotations`)
//! makes it drop the whole file. The field table follows the "Added in vX" notes of
//! `specs-go/config.go` in tags.cncf.io/container-device-interface. Versions 0.1.0
//! and 0.2.0 get the 0.3.0 field set, as the Go library parses them with the same
//! types. Pure and deterministic.

use serde_json::{Map, Value};

use crate::error::ValidationError;
use crate::version::SpecVersion;

/// The JSON objects of a spec, each with its own field list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Object {
    Spec,
    Device,
    Edits,
    DeviceNode,
    Mount,
    Hook,
    IntelRdt,
    NetDevice,
}

/// What a field holds, and so how the walk descends into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// A string, number or boolean: nothing to descend into.
    Scalar,
    /// A string-to-string map whose keys are data, not fields.
    Map,
    /// An array of scalars.
    ScalarArray,
    /// An object with its own fields.
    Object(Object),
    /// An array of such objects.
    ObjectArray(Object),
}

/// One field: in `parent`, named `name`, present from `since` until before `until`.
struct Field {
    parent: Object,
    name: &'static str,
    shape: Shape,
    since: SpecVersion,
    until: Option<SpecVersion>,
}

const fn field(parent: Object, name: &'static str, shape: Shape, since: SpecVersion) -> Field {
    Field {
        parent,
        name,
        shape,
        since,
        until: None,
    }
}

use Object as O;
use Shape as S;
use SpecVersion as V;

/// Every field of every CDI version. `V0_1_0` marks fields present from the start.
const FIELDS: &[Field] = &[
    field(O::Spec, "cdiVersion", S::Scalar, V::V0_1_0),
    field(O::Spec, "kind", S::Scalar, V::V0_1_0),
    field(O::Spec, "annotations", S::Map, V::V0_6_0),
    field(O::Spec, "devices", S::ObjectArray(O::Device), V::V0_1_0),
    field(O::Spec, "containerEdits", S::Object(O::Edits), V::V0_1_0),
    field(O::Device, "name", S::Scalar, V::V0_1_0),
    field(O::Device, "annotations", S::Map, V::V0_6_0),
    field(O::Device, "containerEdits", S::Object(O::Edits), V::V0_1_0),
    field(O::Edits, "env", S::ScalarArray, V::V0_1_0),
    field(
        O::Edits,
        "deviceNodes",
        S::ObjectArray(O::DeviceNode),
        V::V0_1_0,
    ),
    field(O::Edits, "hooks", S::ObjectArray(O::Hook), V::V0_1_0),
    field(O::Edits, "mounts", S::ObjectArray(O::Mount), V::V0_1_0),
    field(O::Edits, "intelRdt", S::Object(O::IntelRdt), V::V0_7_0),
    field(O::Edits, "additionalGids", S::ScalarArray, V::V0_7_0),
    field(
        O::Edits,
        "netDevices",
        S::ObjectArray(O::NetDevice),
        V::V1_1_0,
    ),
    field(O::DeviceNode, "path", S::Scalar, V::V0_1_0),
    field(O::DeviceNode, "hostPath", S::Scalar, V::V0_5_0),
    field(O::DeviceNode, "type", S::Scalar, V::V0_1_0),
    field(O::DeviceNode, "major", S::Scalar, V::V0_1_0),
    field(O::DeviceNode, "minor", S::Scalar, V::V0_1_0),
    field(O::DeviceNode, "fileMode", S::Scalar, V::V0_1_0),
    field(O::DeviceNode, "permissions", S::Scalar, V::V0_1_0),
    field(O::DeviceNode, "uid", S::Scalar, V::V0_1_0),
    field(O::DeviceNode, "gid", S::Scalar, V::V0_1_0),
    field(O::Mount, "hostPath", S::Scalar, V::V0_1_0),
    field(O::Mount, "containerPath", S::Scalar, V::V0_1_0),
    field(O::Mount, "options", S::ScalarArray, V::V0_1_0),
    field(O::Mount, "type", S::Scalar, V::V0_4_0),
    field(O::Hook, "hookName", S::Scalar, V::V0_1_0),
    field(O::Hook, "path", S::Scalar, V::V0_1_0),
    field(O::Hook, "args", S::ScalarArray, V::V0_1_0),
    field(O::Hook, "env", S::ScalarArray, V::V0_1_0),
    field(O::Hook, "timeout", S::Scalar, V::V0_1_0),
    field(O::IntelRdt, "closID", S::Scalar, V::V0_7_0),
    field(O::IntelRdt, "l3CacheSchema", S::Scalar, V::V0_7_0),
    field(O::IntelRdt, "memBwSchema", S::Scalar, V::V0_7_0),
    Field {
        until: Some(V::V1_1_0),
        ..field(O::IntelRdt, "enableCMT", S::Scalar, V::V0_7_0)
    },
    Field {
        until: Some(V::V1_1_0),
        ..field(O::IntelRdt, "enableMBM", S::Scalar, V::V0_7_0)
    },
    field(O::IntelRdt, "schemata", S::ScalarArray, V::V1_1_0),
    field(O::IntelRdt, "enableMonitoring", S::Scalar, V::V1_1_0),
    field(O::NetDevice, "hostInterfaceName", S::Scalar, V::V1_1_0),
    field(O::NetDevice, "name", S::Scalar, V::V1_1_0),
];

fn lookup(parent: Object, name: &str, version: SpecVersion) -> Option<Shape> {
    FIELDS
        .iter()
        .find(|f| {
            f.parent == parent
                && f.name == name
                && f.since <= version
                && f.until.is_none_or(|u| version < u)
        })
        .map(|f| f.shape)
}

/// Checks that `spec_json` (a whole spec document) contains only fields that CDI
/// spec `version` has, at every depth. Does not look at `cdiVersion` itself, so it
/// can also answer "would this spec load as `version`?".
///
/// # Errors
/// [`ValidationError::UnknownField`] with the JSON path of the first field (in
/// document order) that `version` lacks, or [`ValidationError::FieldType`] when an
/// object or array is expected and something else is found.
pub fn check_fields(spec_json: &Value, version: SpecVersion) -> Result<(), ValidationError> {
    walk_object(spec_json, Object::Spec, "", version)
}

fn walk_object(
    v: &Value,
    object: Object,
    path: &str,
    version: SpecVersion,
) -> Result<(), ValidationError> {
    let map = as_object(v, path)?;
    for (name, value) in map {
        let child = join(path, name);
        let Some(shape) = lookup(object, name, version) else {
            return Err(ValidationError::UnknownField {
                path: child,
                version,
            });
        };
        walk_value(value, shape, &child, version)?;
    }
    Ok(())
}

fn walk_value(
    v: &Value,
    shape: Shape,
    path: &str,
    version: SpecVersion,
) -> Result<(), ValidationError> {
    match shape {
        Shape::Scalar => Ok(()),
        Shape::Map => as_object(v, path).map(|_| ()),
        Shape::ScalarArray => as_array(v, path).map(|_| ()),
        Shape::Object(o) => walk_object(v, o, path, version),
        Shape::ObjectArray(o) => as_array(v, path)?
            .iter()
            .enumerate()
            .try_for_each(|(i, item)| walk_object(item, o, &format!("{path}[{i}]"), version)),
    }
}

fn as_object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>, ValidationError> {
    v.as_object().ok_or_else(|| ValidationError::FieldType {
        path: display_path(path),
        expected: "an object",
    })
}

fn as_array<'a>(v: &'a Value, path: &str) -> Result<&'a Vec<Value>, ValidationError> {
    v.as_array().ok_or_else(|| ValidationError::FieldType {
        path: display_path(path),
        expected: "an array",
    })
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

fn display_path(path: &str) -> String {
    if path.is_empty() {
        "(document)".to_owned()
    } else {
        path.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec_with_edits(edits: Value) -> Value {
        json!({"cdiVersion": "x", "kind": "v.com/c",
               "devices": [{"name": "d", "containerEdits": {"env": ["A=1"]}}],
               "containerEdits": edits})
    }

    fn unknown_at(v: &Value, version: SpecVersion) -> Option<String> {
        match check_fields(v, version) {
            Ok(()) => None,
            Err(ValidationError::UnknownField { path, .. }) => Some(path),
            Err(other) => panic!("unexpected error {other}"),
        }
    }

    /// Each versioned field is refused before its version (reported at its own JSON
    /// path, or its parent's if that is newer still) and accepted from it on.
    #[test]
    fn versioned_fields_appear_at_their_version() {
        let cases: &[(Value, &str, SpecVersion)] = &[
            (
                json!({"mounts": [{"hostPath": "t", "containerPath": "/t", "type": "tmpfs"}]}),
                "containerEdits.mounts[0].type",
                V::V0_4_0,
            ),
            (
                json!({"deviceNodes": [{"path": "/dev/a", "hostPath": "/dev/b"}]}),
                "containerEdits.deviceNodes[0].hostPath",
                V::V0_5_0,
            ),
            (
                json!({"intelRdt": {}}),
                "containerEdits.intelRdt",
                V::V0_7_0,
            ),
            (
                json!({"additionalGids": [1]}),
                "containerEdits.additionalGids",
                V::V0_7_0,
            ),
            (
                json!({"netDevices": []}),
                "containerEdits.netDevices",
                V::V1_1_0,
            ),
            (
                json!({"intelRdt": {"schemata": []}}),
                "containerEdits.intelRdt.schemata",
                V::V1_1_0,
            ),
            (
                json!({"intelRdt": {"enableMonitoring": true}}),
                "containerEdits.intelRdt.enableMonitoring",
                V::V1_1_0,
            ),
        ];
        for (edits, path, since) in cases {
            let spec = spec_with_edits(edits.clone());
            for v in SpecVersion::ALL {
                let got = unknown_at(&spec, v);
                if v < *since {
                    // Before its parent exists, the parent is what gets reported.
                    let got = got.unwrap_or_else(|| panic!("{path} accepted at {v}"));
                    assert!(path.starts_with(&got), "{path} at {v}: reported {got}");
                    if v >= V::V0_7_0 {
                        assert_eq!(got, *path);
                    }
                } else {
                    assert_eq!(got, None, "{path} at {v}");
                }
            }
        }
    }

    /// Annotations exist from 0.6.0, on the spec and on devices.
    #[test]
    fn annotations_need_0_6_0() {
        let spec = json!({"cdiVersion": "x", "kind": "v.com/c", "annotations": {"a": "b"},
                          "devices": []});
        assert_eq!(unknown_at(&spec, V::V0_5_0).as_deref(), Some("annotations"));
        assert_eq!(unknown_at(&spec, V::V0_6_0), None);
        let spec = json!({"cdiVersion": "x", "kind": "v.com/c",
                          "devices": [{"name": "d", "annotations": {"a.b/c": "d"}, "containerEdits": {}}]});
        assert_eq!(
            unknown_at(&spec, V::V0_5_0).as_deref(),
            Some("devices[0].annotations")
        );
        assert_eq!(unknown_at(&spec, V::V1_1_0), None);
    }

    /// enableCMT and enableMBM exist from 0.7.0 and are gone in 1.1.0.
    #[test]
    fn removed_intel_rdt_flags_are_refused_from_1_1_0() {
        for flag in ["enableCMT", "enableMBM"] {
            let spec = spec_with_edits(json!({"intelRdt": {flag: true}}));
            assert_eq!(unknown_at(&spec, V::V1_0_0), None);
            assert_eq!(unknown_at(&spec, V::V0_7_0), None);
            let want = format!("containerEdits.intelRdt.{flag}");
            assert_eq!(unknown_at(&spec, V::V1_1_0), Some(want));
        }
    }

    /// Fields no version has are refused everywhere, including typos of real ones.
    #[test]
    fn fields_of_no_version_are_refused() {
        let spec = json!({"cdiVersion": "x", "kind": "v.com/c", "devices": [],
                          "containerEdits": {"deviceNodes": [{"path": "/dev/a", "hostpath": "/b"}]}});
        assert_eq!(
            unknown_at(&spec, V::LATEST).as_deref(),
            Some("containerEdits.deviceNodes[0].hostpath")
        );
        let spec =
            json!({"cdiVersion": "x", "kind": "v.com/c", "devices": [], "containerRuntime": []});
        assert_eq!(
            unknown_at(&spec, V::LATEST).as_deref(),
            Some("containerRuntime")
        );
    }

    /// A container where an object or array belongs is reported with its path.
    #[test]
    fn wrong_container_types_are_reported() {
        let spec = json!({"cdiVersion": "x", "kind": "v.com/c", "devices": {}});
        assert!(matches!(
            check_fields(&spec, V::V0_5_0),
            Err(ValidationError::FieldType { path, expected: "an array" }) if path == "devices"
        ));
        assert!(matches!(
            check_fields(&json!([]), V::V0_5_0),
            Err(ValidationError::FieldType { .. })
        ));
    }
}
