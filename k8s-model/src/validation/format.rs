//! Value formats shared by slice and claim validation, with apimachinery's exact messages:
//! DNS labels and subdomains, C identifiers, label names and values, driver and pool
//! names, attribute keys (QualifiedName), UIDs, object names, node selectors and opaque
//! JSON parameters. Pure functions.
//!
//! The regex checks are written out by hand; the plugin's `naming` checks its own names
//! with these functions, so there is one copy of each rule.

use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

use super::field::{BadValue, FieldError, FieldPath};
use crate::release::KubeVersion;

pub const DNS1123_LABEL_MAX_LENGTH: usize = 63;
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
/// `resource.DeviceMaxIDLength`.
pub const DEVICE_MAX_ID_LENGTH: usize = 32;
/// `resource.DeviceMaxDomainLength`.
pub const DEVICE_MAX_DOMAIN_LENGTH: usize = 63;
/// `resource.PoolNameMaxLength`.
pub const POOL_NAME_MAX_LENGTH: usize = 253;
/// Driver names: `ValidateCSIDriverName`'s limit.
pub const DRIVER_NAME_MAX_LENGTH: usize = 63;
const QUALIFIED_NAME_MAX_LENGTH: usize = 63;
const LABEL_VALUE_MAX_LENGTH: usize = 63;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const C_IDENTIFIER_FMT: &str = "[A-Za-z_][A-Za-z0-9_]*";
const C_IDENTIFIER_MSG: &str = "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_'";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// apimachinery's `RegexError`.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut out = msg.to_string();
    if examples.is_empty() {
        out.push_str(&format!(" (regex used for validation is '{fmt}')"));
        return out;
    }
    out.push_str(" (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn matches_label_regex(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|c| is_lower_alnum(*c) || *c == b'-')
}

fn matches_subdomain_regex(s: &str) -> bool {
    s.split('.').all(matches_label_regex)
}

/// Alphanumeric at both ends, `[-A-Za-z0-9_.]` inside.
fn matches_qualified_name_regex(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// `validation.IsDNS1123Label`.
pub fn dns1123_label_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !matches_label_regex(value) {
        if matches_subdomain_regex(value) {
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_MSG,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// `validation.IsDNS1123Subdomain`.
pub fn dns1123_subdomain_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !matches_subdomain_regex(value) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// `content.IsCIdentifier`.
fn c_identifier_errors(value: &str) -> Vec<String> {
    let b = value.as_bytes();
    let ok = !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
    if ok {
        Vec::new()
    } else {
        vec![regex_error(
            C_IDENTIFIER_MSG,
            C_IDENTIFIER_FMT,
            &["my_name", "MY_NAME", "MyName"],
        )]
    }
}

/// `validation.IsQualifiedName` (label keys, taint keys, condition types).
fn qualified_name_errors(value: &str) -> Vec<String> {
    let name_regex = || {
        regex_error(
            QUALIFIED_NAME_MSG,
            QUALIFIED_NAME_FMT,
            &["MyName", "my.name", "123-abc"],
        )
    };
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    dns1123_subdomain_errors(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                name_regex()
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errs.push(format!(
            "name part {}",
            max_len_error(QUALIFIED_NAME_MAX_LENGTH)
        ));
    }
    if !matches_qualified_name_regex(name) {
        errs.push(format!("name part {}", name_regex()));
    }
    errs
}

fn each_invalid(path: &FieldPath, value: &str, msgs: Vec<String>) -> Vec<FieldError> {
    msgs.into_iter()
        .map(|m| FieldError::invalid(path, BadValue::str(value), m))
        .collect()
}

/// `ValidateDNS1123Label`: device, request, counter and counter-set names.
pub fn validate_dns_label(value: &str, path: &FieldPath) -> Vec<FieldError> {
    each_invalid(path, value, dns1123_label_errors(value))
}

/// `ValidateDNS1123Subdomain`: device class names, node names, object names.
pub fn validate_dns_subdomain(value: &str, path: &FieldPath) -> Vec<FieldError> {
    each_invalid(path, value, dns1123_subdomain_errors(value))
}

/// `metav1validation.ValidateLabelName`.
pub fn validate_label_name(value: &str, path: &FieldPath) -> Vec<FieldError> {
    each_invalid(path, value, qualified_name_errors(value))
}

/// `validation.IsValidLabelValue` as field errors.
pub fn validate_label_value(value: &str, path: &FieldPath) -> Vec<FieldError> {
    let mut msgs = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        msgs.push(max_len_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !value.is_empty() && !matches_qualified_name_regex(value) {
        msgs.push(regex_error(
            LABEL_VALUE_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    each_invalid(path, value, msgs)
}

/// `ValidateCSIDriverName`: required, at most 63 bytes, a DNS subdomain when lower-cased.
pub fn validate_driver_name(value: &str, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if value.is_empty() {
        errs.push(FieldError::required(path, ""));
    }
    if value.len() > DRIVER_NAME_MAX_LENGTH {
        errs.push(FieldError::too_long(path, DRIVER_NAME_MAX_LENGTH));
    }
    errs.extend(each_invalid(
        path,
        value,
        dns1123_subdomain_errors(&value.to_lowercase()),
    ));
    errs
}

/// `validatePoolName`: required, at most 253 bytes, DNS subdomains separated by `/`.
pub fn validate_pool_name(value: &str, path: &FieldPath) -> Vec<FieldError> {
    if value.is_empty() {
        return vec![FieldError::required(path, "")];
    }
    let mut errs = Vec::new();
    if value.len() > POOL_NAME_MAX_LENGTH {
        errs.push(FieldError::too_long(path, POOL_NAME_MAX_LENGTH));
    }
    for part in value.split('/') {
        errs.extend(validate_dns_subdomain(part, path));
    }
    errs
}

fn validate_c_identifier(id: &str, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if id.len() > DEVICE_MAX_ID_LENGTH {
        errs.push(FieldError::too_long(path, DEVICE_MAX_ID_LENGTH));
    }
    errs.extend(each_invalid(path, id, c_identifier_errors(id)));
    errs
}

/// `validateQualifiedName`: attribute and capacity keys, `<C identifier>` or
/// `<domain>/<C identifier>`. From 1.37 a second `/` is rejected; 1.35 (and, inferred,
/// 1.34 and 1.36) accepted such names unchecked.
pub fn validate_qualified_name(
    name: &str,
    path: &FieldPath,
    version: KubeVersion,
) -> Vec<FieldError> {
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        [id] => validate_c_identifier(id, path),
        [domain, id] => {
            let mut errs = Vec::new();
            if domain.is_empty() {
                errs.push(FieldError::invalid(
                    path,
                    BadValue::str(""),
                    "the domain must not be empty",
                ));
            } else {
                errs.extend(validate_driver_name(domain, path));
            }
            if id.is_empty() {
                errs.push(FieldError::invalid(
                    path,
                    BadValue::str(""),
                    "the name must not be empty",
                ));
            } else {
                errs.extend(validate_c_identifier(id, path));
            }
            errs
        }
        _ if version.minor() >= 37 => {
            vec![FieldError::invalid(
                path,
                BadValue::str(name),
                "must not contain more than one slash",
            )]
        }
        _ => Vec::new(),
    }
}

/// `validateFullyQualifiedName`: a qualified name that must carry a domain.
pub fn validate_fully_qualified_name(
    name: &str,
    path: &FieldPath,
    version: KubeVersion,
) -> Vec<FieldError> {
    let mut errs = validate_qualified_name(name, path, version);
    if !name.contains('/') {
        errs.push(FieldError::invalid(
            path,
            BadValue::str(name),
            "a fully qualified name must be a domain and a name separated by a slash",
        ));
    }
    errs
}

/// `validateUID` (share IDs): a UUID in lowercase 36-character RFC 4122 form.
pub fn validate_uid(uid: &str, path: &FieldPath) -> Vec<FieldError> {
    if let Err(e) = uuid_validate(uid) {
        return vec![FieldError::invalid(
            path,
            BadValue::str(uid),
            format!("error validating uid: {e}"),
        )];
    }
    if uid.len() != 36 || uid != uid.to_lowercase() {
        return vec![FieldError::invalid(
            path,
            BadValue::str(uid),
            "uid must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase hexadecimal characters",
        )];
    }
    Vec::new()
}

/// `github.com/google/uuid.Validate`, with its error texts.
fn uuid_validate(s: &str) -> Result<(), String> {
    let hex_pair = |b: &[u8], i: usize| b[i].is_ascii_hexdigit() && b[i + 1].is_ascii_hexdigit();
    let body: &str = match s.len() {
        36 => s,
        45 => {
            let (prefix, rest) = s.split_at_checked(9).ok_or("invalid UUID format")?;
            if !prefix.eq_ignore_ascii_case("urn:uuid:") {
                return Err(format!(
                    "invalid urn prefix: {}",
                    super::field::go_quote(prefix)
                ));
            }
            rest
        }
        38 => {
            if !(s.starts_with('{') && s.ends_with('}')) {
                return Err("invalid bracketed UUID format".into());
            }
            s.get(1..37).ok_or("invalid bracketed UUID format")?
        }
        32 => {
            let b = s.as_bytes();
            if (0..32).step_by(2).all(|i| hex_pair(b, i)) {
                return Ok(());
            }
            return Err("invalid UUID format".into());
        }
        n => return Err(format!("invalid UUID length: {n}")),
    };
    let b = body.as_bytes();
    if b.len() != 36 || b[8] != b'-' || b[13] != b'-' || b[18] != b'-' || b[23] != b'-' {
        return Err("invalid UUID format".into());
    }
    let pairs = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
    if pairs.iter().all(|&i| hex_pair(b, i)) {
        Ok(())
    } else {
        Err("invalid UUID format".into())
    }
}

/// The name part of `ValidateObjectMeta` for cluster- or namespace-scoped objects named
/// as DNS subdomains: `name` or `generateName` required, each a DNS subdomain
/// (`generateName` as a prefix). Labels, annotations and owner references are not
/// checked here.
pub fn validate_object_name(meta: &ObjectMeta, path: &FieldPath) -> Vec<FieldError> {
    let name = meta.name.as_deref().unwrap_or("");
    let generate = meta.generate_name.as_deref().unwrap_or("");
    let mut errs = Vec::new();
    if !generate.is_empty() {
        let prefix = generate.trim_end_matches('-');
        let prefix = if prefix.is_empty() { generate } else { prefix };
        errs.extend(each_invalid(
            &path.child("generateName"),
            generate,
            dns1123_subdomain_errors(prefix),
        ));
    }
    if name.is_empty() {
        if generate.is_empty() {
            errs.push(FieldError::required(
                path.child("name"),
                "name or generateName is required",
            ));
        }
    } else {
        errs.extend(validate_dns_subdomain(name, &path.child("name")));
    }
    errs
}

/// The part of `ValidateNodeSelector` Tessera relies on: at least one term. The terms'
/// requirements are not validated here.
pub fn validate_node_selector(selector: &NodeSelector, path: &FieldPath) -> Vec<FieldError> {
    if selector.node_selector_terms.is_empty() {
        vec![FieldError::required(
            path.child("nodeSelectorTerms"),
            "must have at least one node selector term",
        )]
    } else {
        Vec::new()
    }
}

/// `validateRawExtension` for opaque parameters and device status data: required,
/// at most `max` bytes (compact JSON stands in for the client's raw bytes) unless
/// `stored`, and a JSON object.
pub fn validate_raw_extension(
    raw: &RawExtension,
    path: &FieldPath,
    stored: bool,
    max: usize,
) -> Vec<FieldError> {
    let value = &raw.0;
    if value.is_null() {
        return vec![FieldError::required(path, "")];
    }
    let len = serde_json::to_string(value).map(|s| s.len()).unwrap_or(0);
    if !stored && len > max {
        return vec![FieldError::too_long(path, max)];
    }
    if !value.is_object() {
        return vec![FieldError::invalid_omitted(
            path,
            "must be a valid JSON object",
        )];
    }
    Vec::new()
}

/// Keys longer than `max_len` shortened in the middle for field paths (`truncateIfTooLong`).
pub fn truncate_key(key: &str, max_len: usize) -> String {
    let max_len = max_len.max(16);
    if key.len() <= max_len || !key.is_ascii() {
        return key.to_string();
    }
    let remaining = max_len - 3;
    let head = remaining.div_ceil(2);
    let tail = remaining / 2;
    format!("{}...{}", &key[..head], &key[key.len() - tail..])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Label checks accept RFC 1123 labels only and carry apimachinery's texts.
    #[test]
    fn dns_label_messages_match_apimachinery() {
        for s in ["gpu-0", "a", "0", &"a".repeat(63)] {
            assert!(dns1123_label_errors(s).is_empty(), "{s}");
        }
        for s in ["-a", "a-", "Gpu", "a.b", "", &"a".repeat(64)] {
            assert!(!dns1123_label_errors(s).is_empty(), "{s}");
        }
        assert_eq!(
            dns1123_label_errors("a.b"),
            vec!["must not contain dots".to_string()]
        );
        assert_eq!(
            dns1123_label_errors("Gpu")[0],
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        );
        assert_eq!(
            dns1123_subdomain_errors("!")[0],
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        );
        assert!(dns1123_subdomain_errors(&format!("{}.com", "a".repeat(64))).is_empty());
    }

    /// Attribute keys follow QualifiedName rules; the multi-slash rule starts in 1.37.
    #[test]
    fn qualified_names() {
        let p = FieldPath::new("k");
        let v36 = KubeVersion::new(36).unwrap();
        let v37 = KubeVersion::new(37).unwrap();
        for ok in [
            "productName",
            "_x",
            "resource.kubernetes.io/pciBusID",
            "gpu.tessera.dev/uuid",
        ] {
            assert!(validate_qualified_name(ok, &p, v37).is_empty(), "{ok}");
        }
        for bad in ["9x", "a-b", "/x", "d/", "Bad_Domain/x", &"x".repeat(33)] {
            assert!(!validate_qualified_name(bad, &p, v37).is_empty(), "{bad}");
        }
        assert!(validate_qualified_name("a/b/c", &p, v36).is_empty());
        assert_eq!(validate_qualified_name("a/b/c", &p, v37).len(), 1);
        assert_eq!(validate_fully_qualified_name("x", &p, v37).len(), 1);
    }

    /// Share IDs must be lowercase 36-character UUIDs.
    #[test]
    fn uids() {
        let p = FieldPath::new("shareID");
        assert!(validate_uid("ac051fac-2ead-46d9-b8b4-4e0fbeb7455d", &p).is_empty());
        let upper = validate_uid("AC051FAC-2EAD-46D9-B8B4-4E0FBEB7455D", &p);
        assert!(
            upper[0]
                .detail
                .starts_with("uid must be in RFC 4122 normalized form")
        );
        let compact = validate_uid("ac051fac2ead46d9b8b44e0fbeb7455d", &p);
        assert!(compact[0].detail.starts_with("uid must be in RFC 4122"));
        assert_eq!(
            validate_uid("xyz", &p)[0].detail,
            "error validating uid: invalid UUID length: 3"
        );
        assert_eq!(
            validate_uid("zc051fac-2ead-46d9-b8b4-4e0fbeb7455d", &p)[0].detail,
            "error validating uid: invalid UUID format"
        );
    }

    /// Label names and values carry apimachinery's prefixes.
    #[test]
    fn label_names_and_values() {
        let p = FieldPath::new("key");
        assert!(validate_label_name("example.com/taint", &p).is_empty());
        let empty = validate_label_name("", &p);
        assert_eq!(empty[0].detail, "name part must be non-empty");
        assert_eq!(empty.len(), 2);
        assert!(validate_label_value("", &p).is_empty());
        assert_eq!(validate_label_value("spaces not allowed", &p).len(), 1);
        assert_eq!(
            truncate_key(&"x".repeat(100), 20),
            format!("{}...{}", "x".repeat(9), "x".repeat(8))
        );
    }
}
