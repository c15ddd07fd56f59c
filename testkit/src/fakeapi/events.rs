//! Validation of core/v1 Events on create, as the API server's
//! `ValidateEventCreate` does for a `v1` request: the legacy rules only (stricter
//! rules apply to events.k8s.io/v1 and are not modelled). The name is not checked as
//! a DNS subdomain there: only the registry's path-segment rule applies
//! ([`path_segment_name_errors`], a 400 before validation).

use k8s_openapi::api::core::v1::Event;

use k8s_model::validation::format::{validate_dns_subdomain, validate_label_name};
use k8s_model::validation::{BadValue, FieldError, FieldPath};

/// `k8s.io/kubernetes/pkg/apis/core/validation.ReasonLengthLimit` and friends.
const REASON_LENGTH_LIMIT: usize = 128;
const ACTION_LENGTH_LIMIT: usize = 128;
const NOTE_LENGTH_LIMIT: usize = 1024;
const REPORTING_INSTANCE_LENGTH_LIMIT: usize = 128;

/// The errors the API server returns for creating `ev` through core/v1. Pure.
pub fn validate_event(ev: &Event) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let ns = ev.metadata.namespace.as_deref().unwrap_or("");
    let involved_ns = ev.involved_object.namespace.as_deref().unwrap_or("");
    let involved_path = "involvedObject.namespace";
    let mismatch = || {
        FieldError::invalid(
            involved_path,
            BadValue::str(involved_ns),
            "does not match event.namespace",
        )
    };
    if ev.event_time.is_none() {
        if involved_ns.is_empty() {
            if !ns.is_empty() && ns != "default" {
                errs.push(mismatch());
            }
        } else if ns != involved_ns {
            errs.push(mismatch());
        }
    } else {
        if involved_ns.is_empty() && ns != "default" && ns != "kube-system" {
            errs.push(mismatch());
        }
        let reporting = ev.reporting_component.as_deref().unwrap_or("");
        if reporting.is_empty() {
            errs.push(FieldError::required("reportingComponent", ""));
        }
        // `ValidateQualifiedName`, as for label keys (the empty name fails it too).
        errs.extend(validate_label_name(
            reporting,
            &FieldPath::new("reportingComponent"),
        ));
        let instance = ev.reporting_instance.as_deref().unwrap_or("");
        if instance.is_empty() {
            errs.push(FieldError::required("reportingInstance", ""));
        }
        if instance.len() > REPORTING_INSTANCE_LENGTH_LIMIT {
            errs.push(FieldError::too_long(
                "reportingInstance",
                REPORTING_INSTANCE_LENGTH_LIMIT,
            ));
        }
        let action = ev.action.as_deref().unwrap_or("");
        if action.is_empty() {
            errs.push(FieldError::required("action", ""));
        }
        if action.len() > ACTION_LENGTH_LIMIT {
            errs.push(FieldError::too_long("action", ACTION_LENGTH_LIMIT));
        }
        let reason = ev.reason.as_deref().unwrap_or("");
        if reason.is_empty() {
            errs.push(FieldError::required("reason", ""));
        }
        if reason.len() > REASON_LENGTH_LIMIT {
            errs.push(FieldError::too_long("reason", REASON_LENGTH_LIMIT));
        }
        if ev.message.as_deref().unwrap_or("").len() > NOTE_LENGTH_LIMIT {
            errs.push(FieldError::too_long("message", NOTE_LENGTH_LIMIT));
        }
    }
    errs.extend(validate_dns_subdomain(
        ns,
        &FieldPath::new("metadata.namespace"),
    ));
    errs
}

/// `path.IsValidPathSegmentName`: what the registry requires of an Event's name (its
/// key), answered as a 400 `Name parameter invalid` before validation. Pure.
pub fn path_segment_name_errors(name: &str) -> Vec<String> {
    for bad in [".", ".."] {
        if name == bad {
            return vec![format!("may not be '{bad}'")];
        }
    }
    ["/", "%"]
        .iter()
        .filter(|c| name.contains(**c))
        .map(|c| format!("may not contain '{c}'"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(v: serde_json::Value) -> Event {
        serde_json::from_value(v).unwrap()
    }

    /// A Warning on a pod in its own namespace passes; a mismatched namespace, a bad
    /// name, and a new-style event without its reporting fields do not.
    #[test]
    fn events_are_validated_as_the_api_server_does_for_v1() {
        let ok = event(json!({
            "metadata": {"name": "pod-a.x7k2q", "namespace": "ns"},
            "involvedObject": {"kind": "Pod", "name": "pod-a", "namespace": "ns"},
            "reason": "GpuMemoryOverBudget", "type": "Warning"
        }));
        assert!(validate_event(&ok).is_empty());
        let other_ns = event(json!({
            "metadata": {"name": "e", "namespace": "ns"},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "other"}
        }));
        assert_eq!(validate_event(&other_ns).len(), 1);
        // Not a DNS subdomain, yet a valid Event name: only the path-segment rule
        // applies to Events.
        let underscore = event(json!({
            "metadata": {"name": "Pod_A.x7k2q", "namespace": "ns"},
            "involvedObject": {"kind": "Pod", "name": "Pod_A", "namespace": "ns"}
        }));
        assert!(validate_event(&underscore).is_empty());
        for (name, want) in [
            ("Pod_A.x7k2q", 0),
            (".", 1),
            ("..", 1),
            ("a/b", 1),
            ("a%2Fb/c", 2),
        ] {
            assert_eq!(path_segment_name_errors(name).len(), want, "{name}");
        }
        let new_style = event(json!({
            "metadata": {"name": "e", "namespace": "ns"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "ns"}
        }));
        // reportingComponent required and not a qualified name (empty name part,
        // regex), reportingInstance, action and reason required.
        assert_eq!(
            validate_event(&new_style).len(),
            6,
            "{:?}",
            validate_event(&new_style)
        );
        let mut reported = new_style.clone();
        reported.reporting_component = Some("tessera.dev/watchdog".into());
        reported.reporting_instance = Some("node-a".into());
        reported.action = Some("Kill".into());
        reported.reason = Some("GpuMemoryOverBudget".into());
        assert!(
            validate_event(&reported).is_empty(),
            "{:?}",
            validate_event(&reported)
        );
        reported.reporting_component = Some("tessera watchdog!".into());
        let errs = validate_event(&reported);
        assert!(
            errs.len() == 1 && errs[0].to_string().contains("reportingComponent"),
            "{errs:?}"
        );
    }
}
