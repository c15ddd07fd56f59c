//! Names in CDI: the `vendor/class` kind of a spec, device names, and fully
//! qualified device IDs `vendor/class=name` as runtimes receive them (`--device`,
//! CRI `CDIDevice.name`, the DRA `CDIDeviceIDs` field).
//!
//! The character rules mirror the upstream Go library
//! (tags.cncf.io/container-device-interface, `pkg/parser/parser.go`):
//! - vendor and class: ASCII letters, digits, `_`, `-`, `.`; must start with a letter
//!   and end with a letter or digit;
//! - device name: ASCII letters, digits, `_`, `-`, `.`, `:`; must start and end with a
//!   letter or digit.
//!
//! Everything here is pure and deterministic.

use std::fmt;
use std::str::FromStr;

/// Which part of a CDI name a [`NameError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamePart {
    /// The vendor, before the `/` of a kind (`tessera.dev`).
    Vendor,
    /// The class, after the `/` of a kind (`gpu`).
    Class,
    /// The device name, after the `=` of a qualified ID (`gpu-0`).
    Device,
}

impl fmt::Display for NamePart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NamePart::Vendor => "vendor",
            NamePart::Class => "class",
            NamePart::Device => "device name",
        })
    }
}

/// Why a CDI name, kind or qualified device ID was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The kind has no `/` separating vendor and class.
    #[error("kind {kind:?} is not of the form vendor/class")]
    KindWithoutSlash {
        /// The refused kind.
        kind: String,
    },
    /// The qualified ID has no `=` separating kind and device name.
    #[error("device ID {id:?} is not of the form vendor/class=name")]
    IdWithoutEquals {
        /// The refused ID.
        id: String,
    },
    /// A part is empty.
    #[error("{part} is empty")]
    Empty {
        /// The empty part.
        part: NamePart,
    },
    /// A part starts with a character it may not start with.
    #[error("{part} {name:?} must start with {expected}")]
    BadStart {
        /// The offending part.
        part: NamePart,
        /// Its text.
        name: String,
        /// What it must start with.
        expected: &'static str,
    },
    /// A part contains a character outside its alphabet.
    #[error("{part} {name:?} contains the invalid character {ch:?}")]
    BadChar {
        /// The offending part.
        part: NamePart,
        /// Its text.
        name: String,
        /// The first invalid character.
        ch: char,
    },
    /// A part ends with something other than a letter or digit.
    #[error("{part} {name:?} must end with a letter or digit")]
    BadEnd {
        /// The offending part.
        part: NamePart,
        /// Its text.
        name: String,
    },
}

/// A fully qualified CDI device ID, `vendor/class=name`, whose three parts are valid.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QualifiedName {
    vendor: String,
    class: String,
    name: String,
}

impl QualifiedName {
    /// Builds an ID from its parts.
    ///
    /// # Errors
    /// [`NameError`] for the first part that breaks the CDI character rules.
    pub fn new(
        vendor: impl Into<String>,
        class: impl Into<String>,
        name: impl Into<String>,
    ) -> Result<Self, NameError> {
        let (vendor, class, name) = (vendor.into(), class.into(), name.into());
        validate_vendor(&vendor)?;
        validate_class(&class)?;
        validate_device_name(&name)?;
        Ok(Self {
            vendor,
            class,
            name,
        })
    }

    /// Builds the ID of device `name` in a spec of kind `kind` (`vendor/class`).
    ///
    /// # Errors
    /// [`NameError`] if the kind or the name is invalid.
    pub fn from_kind(kind: &str, name: impl Into<String>) -> Result<Self, NameError> {
        let (vendor, class) = parse_kind(kind)?;
        Self::new(vendor, class, name)
    }

    /// Parses `vendor/class=name`. The kind ends at the first `=` and the vendor at
    /// the first `/`, as in the Go library, so a name may itself contain neither.
    ///
    /// # Errors
    /// [`NameError`] if a separator is missing or a part is invalid.
    pub fn parse(id: &str) -> Result<Self, NameError> {
        let Some((kind, name)) = id.split_once('=') else {
            return Err(NameError::IdWithoutEquals { id: id.to_owned() });
        };
        Self::from_kind(kind, name)
    }

    /// The vendor part (`tessera.dev`).
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// The class part (`gpu`).
    pub fn class(&self) -> &str {
        &self.class
    }

    /// The device name (`gpu-0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The kind of the spec that defines this device: `vendor/class`.
    pub fn kind(&self) -> String {
        format!("{}/{}", self.vendor, self.class)
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}={}", self.vendor, self.class, self.name)
    }
}

impl FromStr for QualifiedName {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Splits a kind into `(vendor, class)` at its first `/` and validates both parts.
///
/// # Errors
/// [`NameError::KindWithoutSlash`] without a `/`; otherwise the error of the first
/// invalid part (so `vendor.com/foo/bar` fails on the `/` inside the class).
pub fn parse_kind(kind: &str) -> Result<(&str, &str), NameError> {
    let Some((vendor, class)) = kind.split_once('/') else {
        return Err(NameError::KindWithoutSlash {
            kind: kind.to_owned(),
        });
    };
    validate_vendor(vendor)?;
    validate_class(class)?;
    Ok((vendor, class))
}

/// Checks a vendor name (letters, digits, `_-.`; starts with a letter, ends alphanumeric).
///
/// # Errors
/// [`NameError`] naming the first rule broken.
pub fn validate_vendor(vendor: &str) -> Result<(), NameError> {
    validate_part(NamePart::Vendor, vendor)
}

/// Checks a class name (same alphabet and rules as a vendor).
///
/// # Errors
/// [`NameError`] naming the first rule broken.
pub fn validate_class(class: &str) -> Result<(), NameError> {
    validate_part(NamePart::Class, class)
}

/// Checks a device name (letters, digits, `_-.:`; starts and ends alphanumeric).
///
/// # Errors
/// [`NameError`] naming the first rule broken.
pub fn validate_device_name(name: &str) -> Result<(), NameError> {
    validate_part(NamePart::Device, name)
}

fn validate_part(part: NamePart, name: &str) -> Result<(), NameError> {
    let (start_ok, expected): (fn(char) -> bool, _) = match part {
        NamePart::Vendor | NamePart::Class => (|c: char| c.is_ascii_alphabetic(), "a letter"),
        NamePart::Device => (|c: char| c.is_ascii_alphanumeric(), "a letter or digit"),
    };
    let inner_ok = |c: char| {
        c.is_ascii_alphanumeric()
            || matches!(c, '_' | '-' | '.')
            || (part == NamePart::Device && c == ':')
    };
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return Err(NameError::Empty { part });
    };
    if !start_ok(first) {
        return Err(NameError::BadStart {
            part,
            name: name.to_owned(),
            expected,
        });
    }
    if let Some(ch) = name.chars().find(|&c| !inner_ok(c)) {
        return Err(NameError::BadChar {
            part,
            name: name.to_owned(),
            ch,
        });
    }
    if !name.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(NameError::BadEnd {
            part,
            name: name.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Device names accept exactly the CDI alphabet and start/end rules.
    #[test]
    fn device_names_follow_the_cdi_alphabet() {
        let cases: &[(&str, bool)] = &[
            ("gpu0", true),
            ("0", true),
            ("gpu-0", true),
            ("GPU_0", true),
            ("gpu.0", true),
            ("mig:1g.10gb:0", true),
            ("abc-123e4567-e89b-12d3-a456-426614174000-gpu-0", true),
            ("", false),
            ("-gpu", false),
            ("gpu-", false),
            ("gpu/0", false),
            ("gpu 0", false),
            ("gpu=0", false),
            ("gpü", false),
        ];
        for (name, ok) in cases {
            assert_eq!(validate_device_name(name).is_ok(), *ok, "{name:?}");
        }
    }

    /// Vendor and class must start with a letter and may not contain `:`.
    #[test]
    fn vendor_and_class_start_with_a_letter() {
        let cases: &[(&str, bool)] = &[
            ("tessera.dev/gpu", true),
            ("foo.bar.baz/foo-bar123.B_az", true),
            ("a/b", true),
            ("vendor.com/foo/bar", false),
            ("vendor.com/", false),
            ("/gpu", false),
            ("gpu", false),
            ("1vendor.com/gpu", false),
            ("vendor.com/1gpu", false),
            ("vendor.com/gpu:x", false),
            ("vendor.com./gpu", false),
        ];
        for (kind, ok) in cases {
            assert_eq!(parse_kind(kind).is_ok(), *ok, "{kind:?}");
        }
    }

    /// Building then parsing a qualified ID returns the same parts.
    #[test]
    fn qualified_name_round_trips_through_its_string_form() {
        let q = QualifiedName::new("tessera.dev", "gpu", "claim-1234-gpu-0").unwrap();
        assert_eq!(q.to_string(), "tessera.dev/gpu=claim-1234-gpu-0");
        assert_eq!(QualifiedName::parse(&q.to_string()).unwrap(), q);
        assert_eq!(q.kind(), "tessera.dev/gpu");
        assert_eq!(
            QualifiedName::from_kind("tessera.dev/gpu", "claim-1234-gpu-0").unwrap(),
            q
        );
    }

    /// Malformed IDs are refused with the part that is wrong.
    #[test]
    fn malformed_qualified_names_name_the_broken_part() {
        assert!(matches!(
            QualifiedName::parse("tessera.dev/gpu"),
            Err(NameError::IdWithoutEquals { .. })
        ));
        assert!(matches!(
            QualifiedName::parse("gpu=0"),
            Err(NameError::KindWithoutSlash { .. })
        ));
        assert!(matches!(
            QualifiedName::parse("tessera.dev/gpu="),
            Err(NameError::Empty {
                part: NamePart::Device
            })
        ));
        assert!(matches!(
            QualifiedName::parse("tessera.dev/gpu=a=b"),
            Err(NameError::BadChar {
                part: NamePart::Device,
                ch: '=',
                ..
            })
        ));
        assert!(matches!(
            "x/=0".parse::<QualifiedName>(),
            Err(NameError::Empty {
                part: NamePart::Class
            })
        ));
    }
}
