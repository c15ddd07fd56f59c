//! Field errors and field paths in the shape of `k8s.io/apimachinery/pkg/util/validation/field`:
//! the error kinds with their `reason` strings, the paths in Kubernetes notation
//! (`spec.devices[3].attributes[driverVersion].version`) and the one-line rendering the API
//! server puts into a 422 `Status`. Pure data and formatting.

use std::fmt;

/// What is wrong with a field; mirrors `field.ErrorType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FieldErrorKind {
    /// A referenced item does not exist (`field.NotFound`).
    NotFound,
    /// A required value is missing (`field.Required`).
    Required,
    /// A value that must be unique occurs twice (`field.Duplicate`).
    Duplicate,
    /// The value is malformed or out of range (`field.Invalid`).
    Invalid,
    /// The value is not one of an enumerated set (`field.NotSupported`).
    NotSupported,
    /// The field may not be set, or not in this combination (`field.Forbidden`).
    Forbidden,
    /// A string is longer than allowed (`field.TooLong`).
    TooLong,
    /// A list or map has more entries than allowed (`field.TooMany`).
    TooMany,
}

impl FieldErrorKind {
    /// The `reason` of a `StatusCause` (`field.ErrorType` as a string).
    pub fn reason(self) -> &'static str {
        match self {
            FieldErrorKind::NotFound => "FieldValueNotFound",
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::TooMany => "FieldValueTooMany",
        }
    }

    /// The human text Kubernetes prints for the kind (`ErrorType.String()`).
    pub fn description(self) -> &'static str {
        match self {
            FieldErrorKind::NotFound => "Not found",
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::Duplicate => "Duplicate value",
            FieldErrorKind::Invalid => "Invalid value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::Forbidden => "Forbidden",
            FieldErrorKind::TooLong => "Too long",
            FieldErrorKind::TooMany => "Too many",
        }
    }
}

/// A field path in Kubernetes notation, built like `field.NewPath("spec").Child("devices")`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldPath(String);

impl FieldPath {
    /// A root path such as `spec`, `metadata` or `status`.
    pub fn new(root: &str) -> Self {
        FieldPath(root.to_string())
    }

    /// `parent.name`.
    pub fn child(&self, name: &str) -> Self {
        if self.0.is_empty() {
            FieldPath(name.to_string())
        } else {
            FieldPath(format!("{}.{name}", self.0))
        }
    }

    /// `parent[i]`.
    pub fn index(&self, i: usize) -> Self {
        FieldPath(format!("{}[{i}]", self.0))
    }

    /// `parent[key]` (map entries; the key is not quoted, as in Go).
    pub fn key(&self, key: &str) -> Self {
        FieldPath(format!("{}[{key}]", self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A bad value as Go's `field.Error` would print it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadValue {
    /// A string: printed Go-quoted (`"Gpu"`).
    Str(String),
    /// A number: printed bare (`129`).
    Int(i64),
    /// A boolean: printed bare.
    Bool(bool),
    /// `nil`: printed as `null`.
    Null,
    /// Anything already rendered (a `fmt.Stringer`, a struct): printed as is.
    Raw(String),
}

impl BadValue {
    pub fn str(s: &str) -> Self {
        BadValue::Str(s.to_string())
    }

    fn render(&self) -> String {
        match self {
            BadValue::Str(s) => go_quote(s),
            BadValue::Int(i) => i.to_string(),
            BadValue::Bool(b) => b.to_string(),
            BadValue::Null => "null".to_string(),
            BadValue::Raw(s) => s.clone(),
        }
    }
}

impl From<usize> for BadValue {
    fn from(n: usize) -> Self {
        BadValue::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

/// One validation failure, as the API server reports it in a `StatusCause`.
/// Constructors take the path as a [`FieldPath`] or a string in the same notation.
///
/// `bad_value` is the value as Kubernetes renders it inside the message (Go-quoted for
/// strings, bare for numbers); `None` when the kind never shows a value (Required,
/// Forbidden, TooLong) or the value was omitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub kind: FieldErrorKind,
    pub field: String,
    pub detail: String,
    pub bad_value: Option<String>,
}

impl FieldError {
    fn new(
        kind: FieldErrorKind,
        path: impl fmt::Display,
        value: Option<BadValue>,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            kind,
            field: path.to_string(),
            detail: detail.into(),
            bad_value: value.map(|v| v.render()),
        }
    }

    /// `field.Invalid(path, value, detail)`.
    pub fn invalid(path: impl fmt::Display, value: BadValue, detail: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Invalid, path, Some(value), detail)
    }

    /// `field.Invalid(path, "<value omitted>", detail)`: Go prints no value then.
    pub fn invalid_omitted(path: impl fmt::Display, detail: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Invalid, path, None, detail)
    }

    /// `ValidateImmutableField`'s error (`field is immutable`); the new value is not shown.
    pub fn invalid_immutable(path: impl fmt::Display) -> Self {
        Self::new(FieldErrorKind::Invalid, path, None, "field is immutable")
    }

    /// `field.Required(path, detail)`.
    pub fn required(path: impl fmt::Display, detail: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Required, path, None, detail)
    }

    /// `field.Forbidden(path, detail)`.
    pub fn forbidden(path: impl fmt::Display, detail: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Forbidden, path, None, detail)
    }

    /// `field.Duplicate(path, value)`.
    pub fn duplicate(path: impl fmt::Display, value: BadValue) -> Self {
        Self::new(FieldErrorKind::Duplicate, path, Some(value), "")
    }

    /// `field.NotFound(path, value)`.
    pub fn not_found(path: impl fmt::Display, value: BadValue) -> Self {
        Self::new(FieldErrorKind::NotFound, path, Some(value), "")
    }

    /// `field.NotSupported(path, value, valid)`: lists the valid values Go-quoted.
    pub fn not_supported(path: impl fmt::Display, value: BadValue, valid: &[&str]) -> Self {
        let detail = if valid.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = valid.iter().map(|v| go_quote(v)).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Self::new(FieldErrorKind::NotSupported, path, Some(value), detail)
    }

    /// `field.TooLong(path, _, max)`: `may not be more than <max> bytes`.
    pub fn too_long(path: impl fmt::Display, max: usize) -> Self {
        let unit = if max == 1 { "byte" } else { "bytes" };
        Self::new(
            FieldErrorKind::TooLong,
            path,
            None,
            format!("may not be more than {max} {unit}"),
        )
    }

    /// `field.TooMany(path, actual, max)`: `<actual>: must have at most <max> items`.
    pub fn too_many(path: impl fmt::Display, actual: usize, max: usize) -> Self {
        let unit = if max == 1 { "item" } else { "items" };
        Self::new(
            FieldErrorKind::TooMany,
            path,
            Some(BadValue::from(actual)),
            format!("must have at most {max} {unit}"),
        )
    }

    /// The `reason` of this error's `StatusCause`.
    pub fn reason(&self) -> &'static str {
        self.kind.reason()
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.kind.description())?;
        if let Some(v) = &self.bad_value {
            write!(f, ": {v}")?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

impl std::error::Error for FieldError {}

/// Go's `validateSlice`: a list over `max` yields only `TooMany` (no per-item checks);
/// otherwise every item is checked at `path[i]`. `None` means unlimited.
pub(crate) fn validate_list<T>(
    items: &[T],
    max: Option<usize>,
    path: &FieldPath,
    mut item: impl FnMut(&T, &FieldPath) -> Vec<FieldError>,
) -> Vec<FieldError> {
    if let Some(max) = max
        && items.len() > max
    {
        return vec![FieldError::too_many(path, items.len(), max)];
    }
    items
        .iter()
        .enumerate()
        .flat_map(|(i, t)| item(t, &path.index(i)))
        .collect()
}

/// Go's `validateSet`: [`validate_list`] plus `Duplicate` at `path[i]` for every item
/// whose key was seen before.
pub(crate) fn validate_unique_list<T, K: Ord>(
    items: &[T],
    max: Option<usize>,
    path: &FieldPath,
    item: impl FnMut(&T, &FieldPath) -> Vec<FieldError>,
    key: impl Fn(&T) -> K,
    render: impl Fn(&K) -> BadValue,
) -> Vec<FieldError> {
    if let Some(max) = max
        && items.len() > max
    {
        return vec![FieldError::too_many(path, items.len(), max)];
    }
    let mut errs = validate_list(items, None, path, item);
    let mut seen = std::collections::BTreeSet::new();
    for (i, t) in items.iter().enumerate() {
        let k = key(t);
        if seen.contains(&k) {
            errs.push(FieldError::duplicate(path.index(i), render(&k)));
        } else {
            seen.insert(k);
        }
    }
    errs
}

/// The `message` of the 422 `Status` the API server returns (`errors.NewInvalid`):
/// `ResourceSlice.resource.k8s.io "x" is invalid: <err>` or `... is invalid: [<e1>, <e2>]`.
/// Deterministic.
pub fn invalid_status_message(qualified_kind: &str, name: &str, errors: &[FieldError]) -> String {
    let base = format!("{qualified_kind} {} is invalid", go_quote(name));
    match errors {
        [] => base,
        [one] => format!("{base}: {one}"),
        many => {
            let parts: Vec<String> = many.iter().map(ToString::to_string).collect();
            format!("{base}: [{}]", parts.join(", "))
        }
    }
}

/// Quotes like Go's `%q` / `strconv.Quote`: printable Unicode kept, `"` and `\` escaped,
/// control characters as `\n`, `\t`, `\xNN` or `\uNNNN`.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => {
                if (c as u32) <= 0xffff {
                    out.push_str(&format!("\\u{:04x}", c as u32));
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Errors render exactly like `field.Error.Error()` in Go.
    #[test]
    fn errors_render_like_kubernetes() {
        let devices = FieldPath::new("spec").child("devices");
        let cases = [
            (
                FieldError::invalid(
                    devices.index(0).child("name"),
                    BadValue::str("Gpu"),
                    "bad label",
                ),
                "spec.devices[0].name: Invalid value: \"Gpu\": bad label",
            ),
            (
                FieldError::too_many(&devices, 129, 128),
                "spec.devices: Too many: 129: must have at most 128 items",
            ),
            (
                FieldError::too_long(
                    devices
                        .index(0)
                        .child("attributes")
                        .key("x")
                        .child("string"),
                    64,
                ),
                "spec.devices[0].attributes[x].string: Too long: may not be more than 64 bytes",
            ),
            (
                FieldError::required(FieldPath::new("spec").child("driver"), ""),
                "spec.driver: Required value",
            ),
            (
                FieldError::forbidden(
                    devices
                        .index(0)
                        .child("capacity")
                        .key("memory")
                        .child("requestPolicy"),
                    "no",
                ),
                "spec.devices[0].capacity[memory].requestPolicy: Forbidden: no",
            ),
            (
                FieldError::duplicate(devices.index(1), BadValue::str("gpu-0")),
                "spec.devices[1]: Duplicate value: \"gpu-0\"",
            ),
            (
                FieldError::not_supported(
                    FieldPath::new("effect"),
                    BadValue::str("X"),
                    &["NoExecute", "NoSchedule"],
                ),
                "effect: Unsupported value: \"X\": supported values: \"NoExecute\", \"NoSchedule\"",
            ),
            (
                FieldError::invalid(devices.index(2), BadValue::Null, "d"),
                "spec.devices[2]: Invalid value: null: d",
            ),
        ];
        for (err, want) in cases {
            assert_eq!(err.to_string(), want);
        }
    }

    /// Every kind maps to the `reason` string of `field.ErrorType`.
    #[test]
    fn reasons_match_apimachinery() {
        assert_eq!(FieldErrorKind::Invalid.reason(), "FieldValueInvalid");
        assert_eq!(FieldErrorKind::Required.reason(), "FieldValueRequired");
        assert_eq!(FieldErrorKind::Forbidden.reason(), "FieldValueForbidden");
        assert_eq!(FieldErrorKind::TooMany.reason(), "FieldValueTooMany");
        assert_eq!(FieldErrorKind::TooLong.reason(), "FieldValueTooLong");
        assert_eq!(FieldErrorKind::Duplicate.reason(), "FieldValueDuplicate");
        assert_eq!(
            FieldErrorKind::NotSupported.reason(),
            "FieldValueNotSupported"
        );
        assert_eq!(FieldErrorKind::NotFound.reason(), "FieldValueNotFound");
    }

    /// The 422 message lists one error bare and several in brackets.
    #[test]
    fn status_message_aggregates() {
        let p = FieldPath::new("spec");
        let e1 = FieldError::required(p.child("driver"), "");
        let e2 = FieldError::required(p.child("pool"), "");
        assert_eq!(
            invalid_status_message(
                "ResourceSlice.resource.k8s.io",
                "s",
                std::slice::from_ref(&e1)
            ),
            "ResourceSlice.resource.k8s.io \"s\" is invalid: spec.driver: Required value"
        );
        assert_eq!(
            invalid_status_message("ResourceSlice.resource.k8s.io", "s", &[e1, e2]),
            "ResourceSlice.resource.k8s.io \"s\" is invalid: [spec.driver: Required value, spec.pool: Required value]"
        );
        assert_eq!(go_quote("a\"b\\\n\u{1}é"), "\"a\\\"b\\\\\\n\\x01é\"");
    }
}
