//! Putting specs into a CDI spec directory: choosing the `cdiVersion`, refusing
//! invalid specs before any file is touched, and replacing files atomically.
//!
//! [`render_spec`] is pure (version, validation, bytes); [`SpecWriter`] owns the
//! side effects (temp file, fsync, rename, fsync of the directory, via
//! [`crate::atomic`]). Runtimes load every `*.json` and `*.yaml` in their spec
//! directories, so the temp file's name may end in neither.

use std::io;
use std::path::{Path, PathBuf};

use crate::atomic::{remove_durable, write_atomic};
use crate::spec::Spec;
use crate::validate::{ValidationError, validate_spec};
use crate::version::{SpecVersion, minimum_required_version, requirement};

/// How the written spec's `cdiVersion` is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionPolicy {
    /// Keep the spec's own `cdiVersion`; it must be known and high enough.
    Declared,
    /// "auto": replace `cdiVersion` by the minimum the spec's features need.
    Minimum,
    /// As [`VersionPolicy::Minimum`], but refuse a spec that needs more than the
    /// given version (e.g. 0.5.0, the newest podman 4.3.1 loads).
    MinimumAtMost(SpecVersion),
}

/// The file a spec goes to and the temp file it is staged in, both in the CDI dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecFileNames {
    file_name: String,
    temp_name: String,
}

impl SpecFileNames {
    /// Checks and pairs the names: both plain file names (no `/`); the target ends in
    /// `.json`; the temp name differs from it and does not end in `.json`, `.yaml` or
    /// `.yml`, so that runtimes never load a half-written file.
    ///
    /// # Errors
    /// [`WriteError::FileName`] naming the refused name and the reason.
    pub fn new(
        file_name: impl Into<String>,
        temp_name: impl Into<String>,
    ) -> Result<Self, WriteError> {
        let (file_name, temp_name) = (file_name.into(), temp_name.into());
        check_plain_name(&file_name)?;
        check_plain_name(&temp_name)?;
        if !file_name.ends_with(".json") || file_name == ".json" {
            return Err(WriteError::FileName {
                name: file_name,
                reason: "a spec file name must end in .json",
            });
        }
        if [".json", ".yaml", ".yml"]
            .iter()
            .any(|ext| temp_name.ends_with(ext))
        {
            return Err(WriteError::FileName {
                name: temp_name,
                reason: "a temp file name must not end in .json, .yaml or .yml",
            });
        }
        if temp_name == file_name {
            return Err(WriteError::FileName {
                name: temp_name,
                reason: "the temp file name must differ from the spec file name",
            });
        }
        Ok(Self {
            file_name,
            temp_name,
        })
    }

    /// The spec file's name, e.g. `tessera.dev-gpu-<uid>.json`.
    pub fn file_name(&self) -> &str {
        &self.file_name
    }

    /// The temp file's name, e.g. `.tessera-<uid>.tmp`.
    pub fn temp_name(&self) -> &str {
        &self.temp_name
    }
}

fn check_plain_name(name: &str) -> Result<(), WriteError> {
    let reason = if name.is_empty() {
        "the name is empty"
    } else if name == "." || name == ".." || name.contains(['/', '\0']) {
        "the name must be a plain file name"
    } else {
        return Ok(());
    };
    Err(WriteError::FileName {
        name: name.to_owned(),
        reason,
    })
}

/// Why a spec was not written or removed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A spec or temp file name was refused.
    #[error("file name {name:?} refused: {reason}")]
    FileName {
        /// The refused name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// The spec needs a newer `cdiVersion` than the policy allows.
    #[error(
        "the spec uses {feature}, which needs cdiVersion {required}, above the allowed {ceiling}"
    )]
    VersionAboveCeiling {
        /// The version the spec needs.
        required: SpecVersion,
        /// The highest version allowed.
        ceiling: SpecVersion,
        /// The feature that needs it.
        feature: &'static str,
    },
    /// Validation refused the spec; nothing was written.
    #[error("invalid spec for {file_name}")]
    Invalid {
        /// The spec file it was meant for.
        file_name: String,
        /// What is wrong with it.
        #[source]
        source: ValidationError,
    },
    /// The spec could not be serialized.
    #[error("serializing the spec for {file_name}")]
    Serialize {
        /// The spec file it was meant for.
        file_name: String,
        /// serde's description.
        #[source]
        source: serde_json::Error,
    },
    /// Writing, syncing or renaming failed; the previous file (if any) is intact.
    #[error("writing {path}")]
    Write {
        /// The target file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Removing a spec or temp file failed.
    #[error("removing {path}")]
    Remove {
        /// The file being removed.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// A validated spec and the exact bytes that represent it on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedSpec {
    /// The spec with its final `cdiVersion`.
    pub spec: Spec,
    /// That version.
    pub version: SpecVersion,
    /// Pretty-printed JSON with a trailing newline.
    pub bytes: Vec<u8>,
}

/// Chooses the version per `policy`, validates fully ([`validate_spec`]) and
/// serializes. Deterministic, no I/O; `file_name` only labels errors.
///
/// # Errors
/// [`WriteError::VersionAboveCeiling`], [`WriteError::Invalid`] or
/// [`WriteError::Serialize`].
pub fn render_spec(
    spec: &Spec,
    policy: VersionPolicy,
    file_name: &str,
) -> Result<RenderedSpec, WriteError> {
    let mut spec = spec.clone();
    match policy {
        VersionPolicy::Declared => {}
        VersionPolicy::Minimum => spec.cdi_version = minimum_required_version(&spec).to_string(),
        VersionPolicy::MinimumAtMost(ceiling) => {
            let required = requirement(&spec);
            if required.version > ceiling {
                return Err(WriteError::VersionAboveCeiling {
                    required: required.version,
                    ceiling,
                    feature: required.feature,
                });
            }
            spec.cdi_version = required.version.to_string();
        }
    }
    let version = validate_spec(&spec).map_err(|source| WriteError::Invalid {
        file_name: file_name.to_owned(),
        source,
    })?;
    let mut bytes = serde_json::to_vec_pretty(&spec).map_err(|source| WriteError::Serialize {
        file_name: file_name.to_owned(),
        source,
    })?;
    bytes.push(b'\n');
    Ok(RenderedSpec {
        spec,
        version,
        bytes,
    })
}

/// Writes and removes spec files in one CDI spec directory (e.g. `/var/run/cdi`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecWriter {
    dir: PathBuf,
}

impl SpecWriter {
    /// A writer for `dir`, which must exist when writing.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The spec directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The full path of a spec file.
    pub fn path_of(&self, names: &SpecFileNames) -> PathBuf {
        self.dir.join(&names.file_name)
    }

    /// Renders `spec` ([`render_spec`]) and atomically replaces the spec file with it.
    /// An invalid spec leaves the directory untouched; a failed write leaves the
    /// previous file intact and no temp file. Idempotent for equal input.
    ///
    /// # Errors
    /// The errors of [`render_spec`], or [`WriteError::Write`].
    pub fn write(
        &self,
        names: &SpecFileNames,
        spec: &Spec,
        policy: VersionPolicy,
    ) -> Result<RenderedSpec, WriteError> {
        let rendered = render_spec(spec, policy, &names.file_name)?;
        write_atomic(
            &self.dir,
            &names.file_name,
            &names.temp_name,
            &rendered.bytes,
        )
        .map_err(|source| WriteError::Write {
            path: self.path_of(names),
            source,
        })?;
        Ok(rendered)
    }

    /// Durably removes the spec file and any temp file left by a crash. Missing
    /// files are not an error, so removal is idempotent.
    ///
    /// # Errors
    /// [`WriteError::Remove`] for the first file that could not be removed.
    pub fn remove(&self, names: &SpecFileNames) -> Result<(), WriteError> {
        for name in [&names.file_name, &names.temp_name] {
            remove_durable(&self.dir, name).map_err(|source| WriteError::Remove {
                path: self.dir.join(name),
                source,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ContainerEdits, Device, DeviceNode};
    use crate::version::Requirement;

    fn plain_spec() -> Spec {
        Spec::new(
            "auto",
            "vendor.com/gpu",
            vec![Device::new(
                "gpu0",
                ContainerEdits::default().with_device_node(DeviceNode::at("/dev/card0")),
            )],
        )
    }

    /// Each policy sets the version it promises, and a ceiling below the spec's
    /// minimum (even the 0.3.0 baseline) is refused.
    #[test]
    fn version_policies_choose_or_refuse_the_version() {
        let auto = render_spec(&plain_spec(), VersionPolicy::Minimum, "f.json").unwrap();
        assert_eq!(auto.version, SpecVersion::V0_3_0);
        assert!(auto.bytes.starts_with(b"{\n  \"cdiVersion\": \"0.3.0\""));
        assert!(auto.bytes.ends_with(b"}\n"));
        let declared = Spec {
            cdi_version: "0.8.0".into(),
            ..plain_spec()
        };
        let kept = render_spec(&declared, VersionPolicy::Declared, "f.json").unwrap();
        assert_eq!(kept.version, SpecVersion::V0_8_0);
        for ceiling in [SpecVersion::V0_1_0, SpecVersion::V0_2_0] {
            assert!(matches!(
                render_spec(
                    &plain_spec(),
                    VersionPolicy::MinimumAtMost(ceiling),
                    "f.json"
                ),
                Err(WriteError::VersionAboveCeiling {
                    required: SpecVersion::V0_3_0,
                    feature: Requirement::BASELINE,
                    ..
                })
            ));
        }
    }

    /// Names that a runtime would load, or that escape the directory, are refused.
    #[test]
    fn unsafe_file_names_are_refused() {
        let cases: &[(&str, &str, bool)] = &[
            ("tessera.dev-gpu-1.json", ".tessera-1.tmp", true),
            ("tessera.dev-gpu-1.yaml", ".tessera-1.tmp", false),
            ("tessera.dev-gpu-1.json", ".tessera-1.json", false),
            ("tessera.dev-gpu-1.json", ".tessera-1.yaml", false),
            ("tessera.dev-gpu-1.json", "tessera.dev-gpu-1.json", false),
            ("../x.json", ".t.tmp", false),
            ("a/x.json", ".t.tmp", false),
            ("x.json", "", false),
            ("x.json", "..", false),
            (".json", ".t.tmp", false),
        ];
        for (file, temp, ok) in cases {
            assert_eq!(
                SpecFileNames::new(*file, *temp).is_ok(),
                *ok,
                "{file} {temp}"
            );
        }
    }
}
