//! The Kubernetes semver library of CEL (`k8s.io/apiserver/pkg/cel/library/semverlib.go`,
//! library version 1): `semver(s[, normalize])`, `isSemver(s[, normalize])` and the
//! functions on `kubernetes.Semver` values, also the type of `version` attributes.
//! Pure.
//!
//! Parsing uses the `semver` crate where Kubernetes uses `blang/semver`: both follow
//! semver.org 2.0.0 strictly (no `v`, three components, no leading zeros); error texts
//! differ. Equality and ordering ignore build metadata, like blang's `EQ` and `Compare`.

use std::any::Any;
use std::cmp::Ordering;

use ::semver::Version;
use cel::common::types::{CelBool, CelInt, CelString, Kind, Type};
use cel::common::value::{StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use super::quantity::ordering_to_int;

/// The CEL type of semantic versions, named as in Kubernetes.
pub(crate) static SEMVER_TYPE: Type = Type::simple_type(Kind::Opaque, "kubernetes.Semver");

/// A `kubernetes.Semver` CEL value.
#[derive(Debug, Clone)]
pub(crate) struct SemverVal(pub(crate) Version);

impl SemverVal {
    fn cmp(&self, other: &SemverVal) -> Ordering {
        self.0.cmp_precedence(&other.0)
    }
}

impl Val for SemverVal {
    fn get_type(&self) -> &Type {
        &SEMVER_TYPE
    }

    fn cel_type() -> &'static Type {
        &SEMVER_TYPE
    }

    /// Equal by precedence, so build metadata is ignored (`1.0.0+a == 1.0.0+b`).
    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<SemverVal>()
            .is_some_and(|other| self.cmp(other) == Ordering::Equal)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for SemverVal {}

/// Registers the library on `env`. Errors: a name or id already declared (a bug).
pub(crate) fn library(env: &mut Env) -> Result<(), DeclarationError> {
    cel::add_overload!(env, fn semver: (CelString) -> Result<SemverVal>, id = "string_to_semver")?;
    cel::add_overload!(env, fn semver_normalize: (CelString, CelBool) -> Result<SemverVal>,
        name = "semver", id = "string_bool_to_semver")?;
    cel::add_overload!(env, fn is_semver: (CelString) -> CelBool, id = "is_semver_string")?;
    cel::add_overload!(env, fn is_semver_normalize: (CelString, CelBool) -> CelBool,
        name = "isSemver", id = "is_semver_string_bool")?;
    cel::add_member_overload!(env, fn major: (SemverVal) -> Result<CelInt>, id = "semver_major")?;
    cel::add_member_overload!(env, fn minor: (SemverVal) -> Result<CelInt>, id = "semver_minor")?;
    cel::add_member_overload!(env, fn patch: (SemverVal) -> Result<CelInt>, id = "semver_patch")?;
    cel::add_member_overload!(env, fn semver_is_greater_than: (SemverVal, SemverVal) -> CelBool,
        name = "isGreaterThan", id = "semver_is_greater_than")?;
    cel::add_member_overload!(env, fn semver_is_less_than: (SemverVal, SemverVal) -> CelBool,
        name = "isLessThan", id = "semver_is_less_than")?;
    cel::add_member_overload!(env, fn semver_compare_to: (SemverVal, SemverVal) -> CelInt,
        name = "compareTo", id = "semver_compare_to")?;
    Ok(())
}

/// Parses a strict semantic version, as a `version` attribute is parsed.
pub(crate) fn parse_strict(s: &str) -> Result<SemverVal, semver::Error> {
    Version::parse(s).map(SemverVal)
}

/// Why a version string is refused by [`parse`].
#[derive(Debug, thiserror::Error)]
enum SemverError {
    #[error("short version cannot contain PreRelease/Build meta data")]
    ShortWithMetadata,
    #[error(transparent)]
    Syntax(#[from] semver::Error),
}

/// Go's `normalizeAndParse` when `normalize`: drops one leading `v`, strips leading zeros
/// of the dot-separated parts and fills a missing minor or patch with `0`; then parses
/// strictly. Deterministic.
fn parse(s: &str, normalize: bool) -> Result<SemverVal, SemverError> {
    if !normalize {
        return Ok(parse_strict(s)?);
    }
    let s = s.strip_prefix('v').unwrap_or(s);
    let mut parts: Vec<String> = s
        .splitn(3, '.')
        .map(|part| {
            if part.len() <= 1 {
                return part.to_owned();
            }
            let trimmed = part.trim_start_matches('0');
            if trimmed.as_bytes().first().is_some_and(u8::is_ascii_digit) {
                trimmed.to_owned()
            } else {
                format!("0{trimmed}")
            }
        })
        .collect();
    if parts.len() < 3 {
        if parts.last().is_some_and(|last| last.contains(['+', '-'])) {
            return Err(SemverError::ShortWithMetadata);
        }
        parts.resize(3, "0".to_owned());
    }
    Ok(parse_strict(&parts.join("."))?)
}

fn semver(s: &CelString<'_>) -> Result<SemverVal, ExecutionError> {
    parse(s.inner(), false).map_err(|e| ExecutionError::function_error("semver", e))
}

fn semver_normalize(s: &CelString<'_>, normalize: &CelBool) -> Result<SemverVal, ExecutionError> {
    parse(s.inner(), *normalize.inner()).map_err(|e| ExecutionError::function_error("semver", e))
}

fn is_semver(s: &CelString<'_>) -> CelBool {
    CelBool::from(parse(s.inner(), false).is_ok())
}

fn is_semver_normalize(s: &CelString<'_>, normalize: &CelBool) -> CelBool {
    CelBool::from(parse(s.inner(), *normalize.inner()).is_ok())
}

fn component(function: &str, value: u64) -> Result<CelInt, ExecutionError> {
    i64::try_from(value)
        .map(CelInt::from)
        .map_err(|_| ExecutionError::function_error(function, "version component out of range"))
}

fn major(this: &SemverVal) -> Result<CelInt, ExecutionError> {
    component("major", this.0.major)
}

fn minor(this: &SemverVal) -> Result<CelInt, ExecutionError> {
    component("minor", this.0.minor)
}

fn patch(this: &SemverVal) -> Result<CelInt, ExecutionError> {
    component("patch", this.0.patch)
}

fn semver_is_greater_than(this: &SemverVal, other: &SemverVal) -> CelBool {
    CelBool::from(this.cmp(other) == Ordering::Greater)
}

fn semver_is_less_than(this: &SemverVal, other: &SemverVal) -> CelBool {
    CelBool::from(this.cmp(other) == Ordering::Less)
}

fn semver_compare_to(this: &SemverVal, other: &SemverVal) -> CelInt {
    ordering_to_int(this.cmp(other))
}

#[cfg(test)]
mod tests {
    use super::super::env::eval_standalone;
    use super::parse;
    use cel::Value;

    /// Normalization follows Go's `normalizeAndParse` case by case.
    #[test]
    fn normalization_matches_go() {
        let cases = [
            ("v1.0.0", Some("1.0.0")),
            ("1.0", Some("1.0.0")),
            ("1", Some("1.0.0")),
            ("01.01.01", Some("1.1.1")),
            ("1.2.03-rc.1", Some("1.2.3-rc.1")),
            ("1.2.00-rc", Some("1.2.0-rc")),
            ("v2.000", Some("2.0.0")),
            ("1.0-rc", None),
            ("1+build", None),
            ("vv1.0.0", None),
            ("hello", None),
            ("", None),
        ];
        for (input, want) in cases {
            let got = parse(input, true).ok().map(|v| v.0.to_string());
            assert_eq!(got.as_deref(), want, "{input}");
        }
        assert!(parse("v1.0.0", false).is_err());
        assert!(parse("01.1.1", false).is_err());
    }

    /// The examples of `semverlib.go`'s documentation evaluate as in Kubernetes.
    #[test]
    fn kubernetes_library_examples_hold() {
        let cases: &[(&str, Value)] = &[
            (
                r#"semver("1.2.3").compareTo(semver("1.2.3"))"#,
                Value::Int(0),
            ),
            (
                r#"semver("1.2.3").compareTo(semver("2.0.0"))"#,
                Value::Int(-1),
            ),
            (
                r#"semver("1.2.3").compareTo(semver("0.1.2"))"#,
                Value::Int(1),
            ),
            (r#"semver("1.2.3").major()"#, Value::Int(1)),
            (r#"semver("1.2.3").minor()"#, Value::Int(2)),
            (r#"semver("1.2.3").patch()"#, Value::Int(3)),
            (
                r#"semver("1.2.3").isLessThan(semver("1.10.0"))"#,
                Value::Bool(true),
            ),
            (
                r#"semver("1.10.0").isGreaterThan(semver("1.2.3"))"#,
                Value::Bool(true),
            ),
            (
                r#"semver("1.0.0-alpha").isLessThan(semver("1.0.0"))"#,
                Value::Bool(true),
            ),
            (
                r#"semver("1.0.0+a") == semver("1.0.0+b")"#,
                Value::Bool(true),
            ),
            (
                r#"semver("v1.0.0", true) == semver("1.0.0")"#,
                Value::Bool(true),
            ),
            (
                r#"semver("1.0", true) == semver("1.0.0")"#,
                Value::Bool(true),
            ),
            (
                r#"semver("01.01.01", true) == semver("1.1.1")"#,
                Value::Bool(true),
            ),
            (r#"isSemver("1.0.0")"#, Value::Bool(true)),
            (r#"isSemver("hello")"#, Value::Bool(false)),
            (r#"isSemver("v1.0")"#, Value::Bool(false)),
            (r#"isSemver("v1.0", true)"#, Value::Bool(true)),
            (r#"isSemver("01.01.01", false)"#, Value::Bool(false)),
        ];
        for (expression, want) in cases {
            assert_eq!(
                eval_standalone(expression).as_ref(),
                Ok(want),
                "{expression}"
            );
        }
    }

    /// Invalid versions are errors, and semvers have no `<`.
    #[test]
    fn invalid_versions_and_operators_are_errors() {
        for expression in [
            r#"semver("200K")"#,
            r#"semver("v1.0.0")"#,
            r#"semver("1.0-rc", true)"#,
            r#"semver("1.0.0") < semver("2.0.0")"#,
            r#"semver("1.0.0").compareTo(quantity("1"))"#,
        ] {
            assert!(eval_standalone(expression).is_err(), "{expression}");
        }
    }
}
