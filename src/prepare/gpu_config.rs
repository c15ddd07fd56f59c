//! The opaque per-claim device configuration Tessera accepts in ResourceClaims and
//! DeviceClasses (`resource.tessera.dev/v1alpha1`, kind `GpuConfig`): strict,
//! versioned decoding, and merging in allocation order (class configs, then claim
//! configs; the later one wins field by field).
//!
//! | field | type | meaning |
//! |---|---|---|
//! | `scrubOnFree` | bool, default false | zero device memory as it is freed and at claim end |
//! | `computeLimit` | int 1–100, optional | hard cap on the claim's compute share |
//!
//! The decoder's cases live in `tests/data/gpuconfig-cases.yaml` so that the admission
//! policy (deploy issue) can be tested against the same table.

use k8s_openapi::api::resource::v1::DeviceAllocationConfiguration;
use serde::{Deserialize, Serialize};

pub const API_VERSION: &str = "resource.tessera.dev/v1alpha1";
pub const KIND: &str = "GpuConfig";

/// One decoded `GpuConfig`. `None` fields were not set by that config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuConfigDoc {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub_on_free: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_limit: Option<i64>,
}

/// The effective configuration of one allocated device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuConfig {
    pub scrub_on_free: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_limit: Option<u8>,
}

/// A config decoding error naming the field (`computeLimit`, `apiVersion`, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct GpuConfigError {
    pub field: String,
    pub message: String,
}

fn err(field: &str, message: impl Into<String>) -> GpuConfigError {
    GpuConfigError {
        field: field.into(),
        message: message.into(),
    }
}

/// Decodes one opaque parameters object strictly: version first, then unknown fields,
/// then value ranges. Pure.
pub fn decode(parameters: &serde_json::Value) -> Result<GpuConfigDoc, GpuConfigError> {
    let obj = parameters
        .as_object()
        .ok_or_else(|| err("parameters", "must be a JSON object"))?;
    crate::config::typemeta::check(
        obj.get("apiVersion").and_then(|v| v.as_str()),
        obj.get("kind").and_then(|v| v.as_str()),
        API_VERSION,
        KIND,
    )
    .map_err(|(field, message)| err(field, message))?;
    let doc: GpuConfigDoc = serde_path_to_error::deserialize(parameters).map_err(|e| {
        let inner = e.inner().to_string();
        // For an unknown field the path is the parent; name the field itself.
        let field = match inner.strip_prefix("unknown field `") {
            Some(rest) => rest.split('`').next().unwrap_or("").to_string(),
            None => e.path().to_string(),
        };
        err(&field, inner)
    })?;
    if let Some(l) = doc.compute_limit
        && !(1..=100).contains(&l)
    {
        return Err(err(
            "computeLimit",
            format!("must be between 1 and 100, got {l}"),
        ));
    }
    Ok(doc)
}

/// Folds a config into the effective one: fields the config sets override.
fn apply(base: GpuConfig, doc: &GpuConfigDoc) -> GpuConfig {
    GpuConfig {
        scrub_on_free: doc.scrub_on_free.unwrap_or(base.scrub_on_free),
        // Range-checked by `decode`.
        compute_limit: doc.compute_limit.map(|l| l as u8).or(base.compute_limit),
    }
}

/// Whether a configuration entry applies to `request` (`req` or `req/sub`); an empty
/// `requests` list applies to every request.
fn applies_to(cfg: &DeviceAllocationConfiguration, request: &str) -> bool {
    let parent = request.split('/').next().unwrap_or(request);
    match &cfg.requests {
        None => true,
        Some(r) if r.is_empty() => true,
        Some(r) => r.iter().any(|x| x == request || x == parent),
    }
}

/// The effective config for one allocation result's request: our driver's opaque
/// configs that apply to it, class configs first, then claim configs, each group in
/// list order (the allocator already lists them that way). Configs of other drivers
/// are ignored. Errors name the config entry and field, e.g.
/// `config[1] (FromClaim): computeLimit: must be between 1 and 100, got 0`. Pure.
pub fn effective_config(
    configs: &[DeviceAllocationConfiguration],
    driver: &str,
    request: &str,
) -> Result<GpuConfig, String> {
    let mut ordered: Vec<(usize, &DeviceAllocationConfiguration)> =
        configs.iter().enumerate().collect();
    // Stable: class configs before claim configs, list order within each.
    ordered.sort_by_key(|(_, c)| u8::from(c.source != "FromClass"));
    let mut out = GpuConfig::default();
    for (i, c) in ordered {
        let Some(opaque) = &c.opaque else { continue };
        if opaque.driver != driver || !applies_to(c, request) {
            continue;
        }
        let doc =
            decode(&opaque.parameters.0).map_err(|e| format!("config[{i}] ({}): {e}", c.source))?;
        out = apply(out, &doc);
    }
    Ok(out)
}

/// Decodes every opaque config of our driver in the list, whatever request it names,
/// so that a malformed config fails the claim even if no device uses it. Pure.
pub fn validate_all(configs: &[DeviceAllocationConfiguration], driver: &str) -> Result<(), String> {
    for (i, c) in configs.iter().enumerate() {
        if let Some(opaque) = &c.opaque
            && opaque.driver == driver
        {
            decode(&opaque.parameters.0).map_err(|e| format!("config[{i}] ({}): {e}", c.source))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::OpaqueDeviceConfiguration;
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    use serde_json::json;

    fn cfg(
        source: &str,
        requests: &[&str],
        params: serde_json::Value,
    ) -> DeviceAllocationConfiguration {
        DeviceAllocationConfiguration {
            source: source.into(),
            requests: Some(requests.iter().map(|s| s.to_string()).collect()),
            opaque: Some(OpaqueDeviceConfiguration {
                driver: "gpu.tessera.dev".into(),
                parameters: RawExtension(params),
            }),
        }
    }

    /// Class configs apply first, claim configs override them, field by field.
    #[test]
    fn later_configs_win_field_by_field() {
        let configs = vec![
            cfg(
                "FromClaim",
                &[],
                json!({"apiVersion": API_VERSION, "kind": KIND, "computeLimit": 30}),
            ),
            cfg(
                "FromClass",
                &["gpu"],
                json!({"apiVersion": API_VERSION, "kind": KIND, "scrubOnFree": true, "computeLimit": 80}),
            ),
        ];
        let got = effective_config(&configs, "gpu.tessera.dev", "gpu").unwrap();
        assert_eq!(
            got,
            GpuConfig {
                scrub_on_free: true,
                compute_limit: Some(30)
            }
        );
    }

    /// A config for another request or another driver does not apply.
    #[test]
    fn configs_apply_only_to_their_requests_and_driver() {
        let mut other = cfg("FromClaim", &[], json!({"anything": 1}));
        other.opaque.as_mut().unwrap().driver = "other.example.com".into();
        let configs = vec![
            cfg(
                "FromClaim",
                &["b"],
                json!({"apiVersion": API_VERSION, "kind": KIND, "scrubOnFree": true}),
            ),
            other,
        ];
        assert_eq!(
            effective_config(&configs, "gpu.tessera.dev", "a/sub").unwrap(),
            GpuConfig::default()
        );
        assert!(
            effective_config(&configs, "gpu.tessera.dev", "b/sub")
                .unwrap()
                .scrub_on_free
        );
        assert!(validate_all(&configs, "gpu.tessera.dev").is_ok());
    }
}
