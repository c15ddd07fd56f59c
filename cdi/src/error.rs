//! Why a spec was refused: one error type for the schema, field and name checks.

use crate::qualified::NameError;
use crate::version::SpecVersion;

/// Why a spec was refused. Paths are JSON paths such as
/// `devices[0].containerEdits.deviceNodes[1].path`.
#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    /// The JSON has no string `cdiVersion`.
    #[error("cdiVersion is missing or not a string")]
    MissingVersion,
    /// `cdiVersion` is not a version this crate knows.
    #[error("unknown cdiVersion {version:?}")]
    UnknownVersion {
        /// The declared version.
        version: String,
    },
    /// The spec uses a feature newer than its declared `cdiVersion`.
    #[error("the spec uses {feature}, which needs cdiVersion {required}, but declares {declared}")]
    VersionTooLow {
        /// The declared version.
        declared: SpecVersion,
        /// The version the feature needs.
        required: SpecVersion,
        /// The feature that needs it.
        feature: &'static str,
    },
    /// Strict check: the JSON has a field that its `cdiVersion` does not have.
    #[error("{path}: field does not exist in CDI spec {version}")]
    UnknownField {
        /// JSON path of the field.
        path: String,
        /// The version checked against.
        version: SpecVersion,
    },
    /// Strict check: an object or array was expected.
    #[error("{path}: expected {expected}")]
    FieldType {
        /// JSON path of the value.
        path: String,
        /// What was expected.
        expected: &'static str,
    },
    /// The JSON does not map onto the spec types (missing required field, wrong type).
    #[error("the JSON does not match the CDI spec types")]
    Deserialize {
        /// serde's description, with its line and column.
        #[source]
        source: serde_json::Error,
    },
    /// The spec could not be turned into JSON for the strict check.
    #[error("the spec could not be serialized to JSON")]
    Serialize {
        /// serde's description.
        #[source]
        source: serde_json::Error,
    },
    /// `kind` is not a valid `vendor/class`.
    #[error("invalid kind {kind:?}")]
    Kind {
        /// The kind.
        kind: String,
        /// Which rule it breaks.
        #[source]
        source: NameError,
    },
    /// A device name breaks the CDI name rules.
    #[error("invalid device name {device:?}")]
    DeviceName {
        /// The device name.
        device: String,
        /// Which rule it breaks.
        #[source]
        source: NameError,
    },
    /// Two devices share a name.
    #[error("device {device:?} is defined more than once")]
    DuplicateDevice {
        /// The repeated name.
        device: String,
    },
    /// The spec defines no device (runtimes refuse such a spec).
    #[error("the spec defines no devices")]
    NoDevices,
    /// A device has no container edits at all.
    #[error("device {device:?} has empty containerEdits")]
    EmptyDeviceEdits {
        /// The device name.
        device: String,
    },
    /// An environment entry is not `KEY=VALUE` with a non-empty key.
    #[error("{path}: environment entry {entry:?} is not KEY=VALUE")]
    Env {
        /// JSON path of the entry.
        path: String,
        /// The entry.
        entry: String,
    },
    /// A device node `path` or `hostPath` is not absolute.
    #[error("{path}: device node path {value:?} is not absolute")]
    DeviceNodePath {
        /// JSON path of the field.
        path: String,
        /// Its value.
        value: String,
    },
    /// A device node `type` is not one of `b`, `c`, `u`, `p`.
    #[error("{path}: device node type {value:?} is not b, c, u or p")]
    DeviceNodeType {
        /// JSON path of the field.
        path: String,
        /// Its value.
        value: String,
    },
    /// A device number is negative (-1 would mean a wildcard).
    #[error("{path}: negative device number")]
    DeviceNumber {
        /// JSON path of the field.
        path: String,
    },
    /// Device node `permissions` has characters other than `r`, `w`, `m`.
    #[error("{path}: permissions {value:?} may only combine r, w and m")]
    DevicePermissions {
        /// JSON path of the field.
        path: String,
        /// Its value.
        value: String,
    },
    /// A mount lacks its host or container path.
    #[error("{path}: mount has an empty {missing}")]
    Mount {
        /// JSON path of the mount.
        path: String,
        /// `hostPath` or `containerPath`.
        missing: &'static str,
    },
    /// A hook name is not one of the OCI hook points.
    #[error("{path}: {value:?} is not an OCI hook name")]
    HookName {
        /// JSON path of the field.
        path: String,
        /// Its value.
        value: String,
    },
    /// A hook path is not absolute.
    #[error("{path}: hook path {value:?} is not absolute")]
    HookPath {
        /// JSON path of the field.
        path: String,
        /// Its value.
        value: String,
    },
    /// A hook timeout is zero.
    #[error("{path}: hook timeout must be positive")]
    HookTimeout {
        /// JSON path of the field.
        path: String,
    },
    /// `intelRdt.closID` is not a valid file name (nor `/`).
    #[error("{path}: closID {value:?} is not a valid file name")]
    ClosId {
        /// JSON path of the field.
        path: String,
        /// Its value.
        value: String,
    },
    /// A net device lacks its host or container interface name.
    #[error("{path}: net device has an empty {missing}")]
    NetDevice {
        /// JSON path of the net device.
        path: String,
        /// `hostInterfaceName` or `name`.
        missing: &'static str,
    },
    /// Two net devices of one edit share a host or container interface name.
    #[error("{path}: interface {name:?} is used twice")]
    DuplicateNetDevice {
        /// JSON path of the second net device.
        path: String,
        /// The repeated interface name.
        name: String,
    },
    /// An annotation key is not a Kubernetes qualified name.
    #[error("{path}: annotation key {key:?} is not a qualified name")]
    AnnotationKey {
        /// JSON path of the annotations map.
        path: String,
        /// The key.
        key: String,
    },
    /// Annotations exceed Kubernetes' 256 KiB total size.
    #[error("{path}: annotations total {size} bytes, more than 262144")]
    AnnotationsTooLarge {
        /// JSON path of the annotations map.
        path: String,
        /// Their total size (keys plus values).
        size: usize,
    },
}
