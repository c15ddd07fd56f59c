//! The `apiVersion`/`kind` check every versioned Tessera document starts with, so that a
//! document of a future version gets "unsupported version" rather than a confusing
//! unknown-field error. Pure.

/// Checks a document's type meta. `Err((field, message))` names `apiVersion` or `kind`.
pub fn check(
    api_version: Option<&str>,
    kind: Option<&str>,
    want_api_version: &str,
    want_kind: &str,
) -> Result<(), (&'static str, String)> {
    match api_version {
        Some(v) if v == want_api_version => {}
        Some(other) => {
            return Err((
                "apiVersion",
                format!("unsupported version {other:?}, expected {want_api_version:?}"),
            ));
        }
        None => {
            return Err((
                "apiVersion",
                format!("required, must be {want_api_version:?}"),
            ));
        }
    }
    match kind {
        Some(k) if k == want_kind => Ok(()),
        other => Err(("kind", format!("must be {want_kind:?}, found {other:?}"))),
    }
}
