//! A realistic per-claim GPU spec, as Tessera writes it: it conforms to the CDI
//! schema, comes out at the version podman 4.3.1 and containerd 1.7 both load, and
//! is written atomically, or not at all when invalid.

use std::collections::BTreeMap;

use tessera_cdi::{
    QualifiedName, SpecFileNames, SpecVersion, SpecWriter, ValidationError, VersionPolicy,
    WriteError, check_fields, minimum_required_version, render_spec, validate_json,
};
use testkit_lite::cdi::{gpu_spec, schema_errors, schema_validator};

const UID: &str = "4f6c2a8e-1b3d-4e5f-8a9b-0c1d2e3f4a5b";

fn names() -> SpecFileNames {
    SpecFileNames::new(
        format!("tessera.dev-gpu-{UID}.json"),
        format!(".tessera-{UID}.tmp"),
    )
    .unwrap()
}

/// A spec using only device nodes (with hostPath), mounts and env needs exactly
/// cdiVersion 0.5.0: the only version both podman 4.3.1 and containerd 1.7 accept.
#[test]
fn gpu_spec_with_nodes_mounts_and_env_comes_out_at_0_5_0() {
    let spec = gpu_spec(UID);
    assert_eq!(minimum_required_version(&spec), SpecVersion::V0_5_0);
    let rendered = render_spec(&spec, VersionPolicy::Minimum, "gpu.json").unwrap();
    assert_eq!(rendered.version, SpecVersion::V0_5_0);
    assert_eq!(rendered.spec.cdi_version, "0.5.0");
    let ceiling = render_spec(
        &spec,
        VersionPolicy::MinimumAtMost(SpecVersion::V0_5_0),
        "gpu.json",
    )
    .unwrap();
    assert_eq!(ceiling, rendered);
}

/// The rendered GPU spec validates against shared/schemas/cdi/schema.json (with
/// defs.json) and against our own validation of the bytes as a runtime reads them.
#[test]
fn rendered_gpu_spec_conforms_to_the_cdi_schema() {
    let rendered = render_spec(&gpu_spec(UID), VersionPolicy::Minimum, "gpu.json").unwrap();
    let json: serde_json::Value = serde_json::from_slice(&rendered.bytes).unwrap();
    let errors = schema_errors(&schema_validator(), &json);
    assert!(errors.is_empty(), "schema errors: {errors:?}");
    assert_eq!(validate_json(&json).unwrap(), rendered.spec);
    assert_eq!(
        json["devices"][0]["containerEdits"]["deviceNodes"][0]["minor"],
        0
    );
}

/// Adding a field that 0.5.0 does not have (annotations) is refused by the strict
/// check with the field's JSON path, and the writer refuses to pin such a spec to 0.5.0.
#[test]
fn a_field_unknown_to_0_5_0_is_refused_by_the_strict_check() {
    let mut spec = render_spec(&gpu_spec(UID), VersionPolicy::Minimum, "gpu.json")
        .unwrap()
        .spec;
    spec.devices[0].annotations =
        BTreeMap::from([("tessera.dev/claim".to_owned(), UID.to_owned())]);
    let json = serde_json::to_value(&spec).unwrap();
    match check_fields(&json, SpecVersion::V0_5_0) {
        Err(ValidationError::UnknownField { path, version }) => {
            assert_eq!(path, "devices[0].annotations");
            assert_eq!(version, SpecVersion::V0_5_0);
        }
        other => panic!("expected UnknownField, got {other:?}"),
    }
    assert!(matches!(
        validate_json(&json),
        Err(ValidationError::UnknownField { .. })
    ));
    assert!(matches!(
        render_spec(
            &spec,
            VersionPolicy::MinimumAtMost(SpecVersion::V0_5_0),
            "gpu.json"
        ),
        Err(WriteError::VersionAboveCeiling {
            required: SpecVersion::V0_6_0,
            ..
        })
    ));
    // Left to "auto", the same spec is raised to 0.6.0, where the field exists.
    let auto = render_spec(&spec, VersionPolicy::Minimum, "gpu.json").unwrap();
    assert_eq!(auto.version, SpecVersion::V0_6_0);
}

/// A field unknown to 0.5.0 but added to the raw JSON (not via our types) is
/// refused too, wherever it is nested.
#[test]
fn a_nested_raw_field_unknown_to_0_5_0_is_refused() {
    let rendered = render_spec(&gpu_spec(UID), VersionPolicy::Minimum, "gpu.json").unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&rendered.bytes).unwrap();
    json["containerEdits"]["additionalGids"] = serde_json::json!([44]);
    assert!(matches!(
        check_fields(&json, SpecVersion::V0_5_0),
        Err(ValidationError::UnknownField { path, .. }) if path == "containerEdits.additionalGids"
    ));
}

/// The writer puts exactly the rendered bytes at the target name, leaves no temp
/// file, and the device is addressable by its qualified ID.
#[test]
fn writer_writes_the_rendered_spec_and_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let writer = SpecWriter::new(dir.path());
    let written = writer
        .write(&names(), &gpu_spec(UID), VersionPolicy::Minimum)
        .unwrap();
    let on_disk = std::fs::read(writer.path_of(&names())).unwrap();
    assert_eq!(on_disk, written.bytes);
    let entries: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, [names().file_name()]);
    let id = QualifiedName::from_kind(&written.spec.kind, &written.spec.devices[0].name).unwrap();
    assert_eq!(id.to_string(), format!("tessera.dev/gpu={UID}-gpu-0"));
    // Writing again is idempotent.
    let again = writer
        .write(&names(), &gpu_spec(UID), VersionPolicy::Minimum)
        .unwrap();
    assert_eq!(again, written);
    assert_eq!(std::fs::read(writer.path_of(&names())).unwrap(), on_disk);
}

/// An invalid spec is refused before the disk is touched: the previous file stays
/// byte for byte, and no temp file appears.
#[test]
fn writer_refuses_an_invalid_spec_without_touching_disk() {
    let dir = tempfile::tempdir().unwrap();
    let writer = SpecWriter::new(dir.path());
    let before = writer
        .write(&names(), &gpu_spec(UID), VersionPolicy::Minimum)
        .unwrap();
    let mut bad = gpu_spec(UID);
    bad.devices[0]
        .container_edits
        .env
        .push("NOT_KEY_VALUE".to_owned());
    let err = writer
        .write(&names(), &bad, VersionPolicy::Minimum)
        .unwrap_err();
    assert!(
        matches!(
            err,
            WriteError::Invalid {
                source: ValidationError::Env { .. },
                ..
            }
        ),
        "{err:?}"
    );
    // "auto" is not a version: keeping the declared one refuses it.
    let err = writer
        .write(&names(), &gpu_spec(UID), VersionPolicy::Declared)
        .unwrap_err();
    assert!(matches!(
        err,
        WriteError::Invalid {
            source: ValidationError::UnknownVersion { .. },
            ..
        }
    ));
    assert_eq!(
        std::fs::read(writer.path_of(&names())).unwrap(),
        before.bytes
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    // Nothing is created in an empty directory either.
    let empty = tempfile::tempdir().unwrap();
    assert!(
        SpecWriter::new(empty.path())
            .write(&names(), &bad, VersionPolicy::Minimum)
            .is_err()
    );
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);
}

/// Removal deletes the spec and any leftover temp file, and is idempotent.
#[test]
fn remove_deletes_spec_and_leftover_temp_idempotently() {
    let dir = tempfile::tempdir().unwrap();
    let writer = SpecWriter::new(dir.path());
    writer
        .write(&names(), &gpu_spec(UID), VersionPolicy::Minimum)
        .unwrap();
    std::fs::write(dir.path().join(names().temp_name()), b"half").unwrap();
    writer.remove(&names()).unwrap();
    writer.remove(&names()).unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// A write into a missing directory fails with the target path and leaves nothing.
#[test]
fn write_into_a_missing_directory_reports_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("cdi");
    let err = SpecWriter::new(&missing)
        .write(&names(), &gpu_spec(UID), VersionPolicy::Minimum)
        .unwrap_err();
    assert!(
        matches!(&err, WriteError::Write { path, .. } if path.starts_with(&missing)),
        "{err:?}"
    );
}
