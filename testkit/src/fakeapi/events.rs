//! Events: the API server's validation of Events (`ValidateEventCreate` and
//! `ValidateEventUpdate` in `k8s.io/kubernetes/pkg/apis/core/validation/events.go`)
//! and the conversion between the two groups that serve the one stored Event.
//!
//! The real server keeps one Event and shows it as a core/v1 `Event` or an
//! events.k8s.io/v1 `Event` (`involvedObject` is `regarding`, `message` is `note`,
//! `reportingComponent` is `reportingController`, `source`, `firstTimestamp`,
//! `lastTimestamp` and `count` are `deprecated*`). The fake stores the core/v1 shape
//! ([`events_v1_to_core`]) and converts on reads through events.k8s.io
//! ([`core_to_events_v1`]). Error field paths are those of the internal type, as the
//! real server reports them for both groups (`involvedObject.namespace`, `message`).
//!
//! Rules modelled, for both groups (the "legacy" rules):
//! * without `eventTime` (old-style Events): `involvedObject.namespace` equals the
//!   Event's namespace (or both empty, or the Event in `default`);
//! * with `eventTime`: the regarded object's namespace may be empty only for an Event
//!   in `default` or `kube-system` (so an Event without `regarding` elsewhere is
//!   refused; the real server, and this fake, accept one in those two namespaces);
//!   `reportingController` (core/v1: `reportingComponent`) set and a qualified name;
//!   `reportingInstance` set and at most 128 characters; `action` and `reason` set and
//!   at most 128 characters each; the note (`message`) at most 1024 bytes;
//! * the namespace a DNS subdomain.
//!
//! Only for events.k8s.io/v1 (core/v1 keeps the legacy rules for compatibility):
//! * create: the name a DNS subdomain (`metadata.name`), `eventTime` set, `type`
//!   `Normal` or `Warning`, the deprecated fields unset (`firstTimestamp`,
//!   `lastTimestamp`, `count`, `source`), a series with `count` at least 2;
//! * update (PUT or PATCH): `regarding`, `reason`, `note`, `type`, `action`, `related`,
//!   `reportingController`, `reportingInstance`, the deprecated fields and `eventTime`
//!   (to the microsecond) immutable; a changed series as on create.
//!
//! Not modelled: `ValidateObjectMetaUpdate` beyond what the fake's update keeps (uid,
//! creation time, name from the URL), labels and annotations, and a series without its
//! `count` or `lastObservedTime` (a 400 decode error here, a 422 there).

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::events::v1::Event as EventV1;
use serde_json::{Value, json};

use k8s_model::validation::format::{
    validate_dns_subdomain, validate_label_name, validate_object_name,
};
use k8s_model::validation::{BadValue, FieldError, FieldPath};

/// `k8s.io/kubernetes/pkg/apis/core/validation.ReasonLengthLimit` and friends.
const REASON_LENGTH_LIMIT: usize = 128;
const ACTION_LENGTH_LIMIT: usize = 128;
const NOTE_LENGTH_LIMIT: usize = 1024;
const REPORTING_INSTANCE_LENGTH_LIMIT: usize = 128;

/// Field names that differ between the groups: (core/v1, events.k8s.io/v1).
const RENAMES: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

/// What the legacy rules look at, from either group's Event.
struct Legacy<'a> {
    namespace: &'a str,
    regarding_namespace: &'a str,
    has_event_time: bool,
    reporting_controller: &'a str,
    reporting_instance: &'a str,
    action: &'a str,
    reason: &'a str,
    note: &'a str,
}

/// `legacyValidateEvent`: the rules both groups apply. `reporting_path` is the name
/// of the reporting controller field in the request's group. Pure.
fn legacy_errors(ev: &Legacy, reporting_path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let (ns, involved_ns) = (ev.namespace, ev.regarding_namespace);
    let mismatch = || {
        FieldError::invalid(
            "involvedObject.namespace",
            BadValue::str(involved_ns),
            "does not match event.namespace",
        )
    };
    if !ev.has_event_time {
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
        if ev.reporting_controller.is_empty() {
            errs.push(FieldError::required(reporting_path, ""));
        }
        // `ValidateQualifiedName`, as for label keys (the empty name fails it too).
        errs.extend(validate_label_name(
            ev.reporting_controller,
            &FieldPath::new(reporting_path),
        ));
        let at_most = |path: &str, limit: usize| {
            FieldError::invalid(
                path,
                BadValue::str(""),
                format!("can have at most {limit} characters"),
            )
        };
        if ev.reporting_instance.is_empty() {
            errs.push(FieldError::required("reportingInstance", ""));
        }
        if ev.reporting_instance.len() > REPORTING_INSTANCE_LENGTH_LIMIT {
            errs.push(at_most(
                "reportingInstance",
                REPORTING_INSTANCE_LENGTH_LIMIT,
            ));
        }
        if ev.action.is_empty() {
            errs.push(FieldError::required("action", ""));
        }
        if ev.action.len() > ACTION_LENGTH_LIMIT {
            errs.push(at_most("action", ACTION_LENGTH_LIMIT));
        }
        if ev.reason.is_empty() {
            errs.push(FieldError::required("reason", ""));
        }
        if ev.reason.len() > REASON_LENGTH_LIMIT {
            errs.push(at_most("reason", REASON_LENGTH_LIMIT));
        }
        if ev.note.len() > NOTE_LENGTH_LIMIT {
            errs.push(at_most("message", NOTE_LENGTH_LIMIT));
        }
    }
    errs.extend(validate_dns_subdomain(ns, &FieldPath::new("namespace")));
    errs
}

/// The errors the API server returns for creating `ev` through core/v1: the legacy
/// rules only. The name is not checked as a DNS subdomain there: only the registry's
/// path-segment rule applies ([`path_segment_name_errors`], a 400 before validation).
/// Pure.
pub fn validate_event(ev: &Event) -> Vec<FieldError> {
    legacy_errors(
        &Legacy {
            namespace: ev.metadata.namespace.as_deref().unwrap_or(""),
            regarding_namespace: ev.involved_object.namespace.as_deref().unwrap_or(""),
            has_event_time: ev.event_time.is_some(),
            reporting_controller: ev.reporting_component.as_deref().unwrap_or(""),
            reporting_instance: ev.reporting_instance.as_deref().unwrap_or(""),
            action: ev.action.as_deref().unwrap_or(""),
            reason: ev.reason.as_deref().unwrap_or(""),
            note: ev.message.as_deref().unwrap_or(""),
        },
        "reportingComponent",
    )
}

/// The legacy rules for an events.k8s.io/v1 Event. Pure.
fn legacy_v1_errors(ev: &EventV1) -> Vec<FieldError> {
    let regarding_namespace = ev
        .regarding
        .as_ref()
        .and_then(|r| r.namespace.as_deref())
        .unwrap_or("");
    legacy_errors(
        &Legacy {
            namespace: ev.metadata.namespace.as_deref().unwrap_or(""),
            regarding_namespace,
            has_event_time: ev.event_time.is_some(),
            reporting_controller: ev.reporting_controller.as_deref().unwrap_or(""),
            reporting_instance: ev.reporting_instance.as_deref().unwrap_or(""),
            action: ev.action.as_deref().unwrap_or(""),
            reason: ev.reason.as_deref().unwrap_or(""),
            note: ev.note.as_deref().unwrap_or(""),
        },
        "reportingController",
    )
}

/// `validateV1EventSeries`. Pure.
fn series_errors(ev: &EventV1) -> Vec<FieldError> {
    match &ev.series {
        Some(s) if s.count < 2 => vec![FieldError::invalid(
            "series.count",
            BadValue::str(""),
            "should be at least 2",
        )],
        _ => Vec::new(),
    }
}

/// The errors the API server returns for creating `ev` through events.k8s.io/v1:
/// the legacy rules and the strict ones (see the module doc). Pure.
pub fn validate_events_v1_create(ev: &EventV1) -> Vec<FieldError> {
    let mut errs = legacy_v1_errors(ev);
    errs.extend(validate_object_name(
        &ev.metadata,
        &FieldPath::new("metadata"),
    ));
    errs.extend(series_errors(ev));
    if ev.event_time.is_none() {
        errs.push(FieldError::required("eventTime", ""));
    }
    let type_ = ev.type_.as_deref().unwrap_or("");
    if type_ != "Normal" && type_ != "Warning" {
        errs.push(FieldError::invalid(
            "type",
            BadValue::str(""),
            format!("has invalid value: {type_}"),
        ));
    }
    let unset = |path: &str| FieldError::invalid(path, BadValue::str(""), "needs to be unset");
    if ev.deprecated_first_timestamp.is_some() {
        errs.push(unset("firstTimestamp"));
    }
    if ev.deprecated_last_timestamp.is_some() {
        errs.push(unset("lastTimestamp"));
    }
    if ev.deprecated_count.unwrap_or(0) != 0 {
        errs.push(unset("count"));
    }
    let source = ev.deprecated_source.clone().unwrap_or_default();
    if source.component.is_some_and(|c| !c.is_empty()) || source.host.is_some_and(|h| !h.is_empty())
    {
        errs.push(unset("source"));
    }
    errs
}

/// The errors the API server returns for replacing `old` with `new` through
/// events.k8s.io/v1 (a PUT, or the result of a PATCH): the legacy rules on `new`, a
/// changed series validated, and every field but the series immutable. Absent and
/// empty compare equal, as Go's zero values do. Pure.
pub fn validate_events_v1_update(new: &EventV1, old: &EventV1) -> Vec<FieldError> {
    fn same<T: Clone + Default + PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
        a.clone().unwrap_or_default() == b.clone().unwrap_or_default()
    }
    let mut errs = legacy_v1_errors(new);
    if new.series != old.series {
        errs.extend(series_errors(new));
    }
    // Sub-microsecond changes are tolerated (kubernetes#111928).
    let micros = |e: &EventV1| e.event_time.as_ref().map(|t| t.0.as_microsecond());
    let unchanged = [
        ("involvedObject", same(&new.regarding, &old.regarding)),
        ("reason", same(&new.reason, &old.reason)),
        ("message", same(&new.note, &old.note)),
        (
            "source",
            same(&new.deprecated_source, &old.deprecated_source),
        ),
        (
            "firstTimestamp",
            new.deprecated_first_timestamp == old.deprecated_first_timestamp,
        ),
        (
            "lastTimestamp",
            new.deprecated_last_timestamp == old.deprecated_last_timestamp,
        ),
        ("count", same(&new.deprecated_count, &old.deprecated_count)),
        ("type", same(&new.type_, &old.type_)),
        ("eventTime", micros(new) == micros(old)),
        ("action", same(&new.action, &old.action)),
        ("related", new.related == old.related),
        (
            "reportingController",
            same(&new.reporting_controller, &old.reporting_controller),
        ),
        (
            "reportingInstance",
            same(&new.reporting_instance, &old.reporting_instance),
        ),
    ];
    errs.extend(
        unchanged
            .iter()
            .filter(|(_, same)| !same)
            .map(|(path, _)| FieldError::invalid_immutable(path)),
    );
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

/// Renames `obj`'s top-level fields from one group's names to the other's.
fn rename(mut obj: Value, to_v1: bool) -> Value {
    if let Some(map) = obj.as_object_mut() {
        for &(core, v1) in RENAMES {
            let (from, to) = if to_v1 { (core, v1) } else { (v1, core) };
            if let Some(v) = map.remove(from) {
                map.insert(to.into(), v);
            }
        }
    }
    obj
}

/// A stored (core/v1-shaped) Event as events.k8s.io/v1 shows it. Pure.
pub fn core_to_events_v1(obj: Value) -> Value {
    let mut obj = rename(obj, true);
    obj["apiVersion"] = json!("events.k8s.io/v1");
    obj["kind"] = json!("Event");
    obj
}

/// An events.k8s.io/v1 Event in the stored (core/v1) shape. `involvedObject` is
/// always present there, as core/v1 requires. Pure.
pub fn events_v1_to_core(obj: Value) -> Value {
    let mut obj = rename(obj, false);
    obj["apiVersion"] = json!("v1");
    obj["kind"] = json!("Event");
    if obj.get("involvedObject").is_none_or(Value::is_null) {
        obj["involvedObject"] = json!({});
    }
    obj
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(v: Value) -> Event {
        serde_json::from_value(v).unwrap()
    }

    fn event_v1(v: Value) -> EventV1 {
        serde_json::from_value(v).unwrap()
    }

    /// An events.k8s.io/v1 Warning as kube-runtime's Recorder posts it for a pod.
    fn recorded() -> Value {
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "pod-a.18a2b3c4d5e6f708", "namespace": "ns"},
            "eventTime": "2026-01-01T00:00:00.123456Z",
            "regarding": {"apiVersion": "v1", "kind": "Pod", "name": "pod-a",
                          "namespace": "ns", "uid": "4b2f6c1e-8d3a-4f5b-9c7e-1a2b3c4d5e6f"},
            "reportingController": "tessera.dev/watchdog", "reportingInstance": "node-a",
            "type": "Warning", "reason": "GpuMemoryOverBudget", "action": "CheckGpuMemory",
            "note": "claim ns/c holds 2 GiB, over its budget of 1 GiB"
        })
    }

    /// The field paths of `errs`, in order.
    fn fields(errs: &[FieldError]) -> Vec<&str> {
        errs.iter().map(|e| e.field.as_str()).collect()
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

    /// What the Recorder posts passes events.k8s.io/v1 creation; each strict rule
    /// refuses one broken field, with the real server's field path.
    #[test]
    fn events_v1_creation_is_validated_strictly() {
        assert_eq!(validate_events_v1_create(&event_v1(recorded())), Vec::new());
        let long = "x".repeat(129);
        let cases: Vec<(&str, Value, Vec<&str>)> = vec![
            // Then an old-style Event to the legacy rules, which this one passes (its
            // pod's namespace is its own): only the strict rule refuses it.
            ("eventTime", json!(null), vec!["eventTime"]),
            ("type", json!("Error"), vec!["type"]),
            ("reason", json!(""), vec!["reason"]),
            ("reason", json!(long), vec!["reason"]),
            ("action", json!(null), vec!["action"]),
            ("action", json!(long), vec!["action"]),
            ("note", json!("n".repeat(1025)), vec!["message"]),
            ("reportingInstance", json!(""), vec!["reportingInstance"]),
            ("reportingInstance", json!(long), vec!["reportingInstance"]),
            // Required, then not a qualified name (empty name part, regex).
            (
                "reportingController",
                json!(null),
                vec!["reportingController"; 3],
            ),
            ("regarding", json!(null), vec!["involvedObject.namespace"]),
            ("deprecatedCount", json!(1), vec!["count"]),
            (
                "deprecatedSource",
                json!({"component": "kubelet"}),
                vec!["source"],
            ),
            (
                "series",
                json!({"count": 1, "lastObservedTime": "2026-01-01T00:00:01.000000Z"}),
                vec!["series.count"],
            ),
        ];
        for (field, value, want) in cases {
            let mut v = recorded();
            v[field] = value;
            let errs = validate_events_v1_create(&event_v1(v));
            assert_eq!(fields(&errs), want, "{field}: {errs:?}");
        }
        // The note limit is in bytes: 1024 bytes pass.
        let mut v = recorded();
        v["note"] = json!("n".repeat(1024));
        assert!(validate_events_v1_create(&event_v1(v)).is_empty());
        // Without `regarding`, an Event in `default` passes, as on the real server.
        let mut v = recorded();
        v["regarding"] = json!(null);
        v["metadata"]["namespace"] = json!("default");
        assert!(validate_events_v1_create(&event_v1(v)).is_empty());
        // The name must be a DNS subdomain (core/v1 only checks path segments).
        let mut v = recorded();
        v["metadata"]["name"] = json!("Pod_A.18a2b3c4d5e6f708");
        assert_eq!(
            fields(&validate_events_v1_create(&event_v1(v))),
            ["metadata.name"]
        );
    }

    /// A series update (what the Recorder patches in) passes; changing what the
    /// Event says does not; sub-microsecond eventTime changes are tolerated.
    #[test]
    fn events_v1_updates_change_only_the_series() {
        let old = event_v1(recorded());
        let mut v = recorded();
        v["series"] = json!({"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"});
        assert!(validate_events_v1_update(&event_v1(v.clone()), &old).is_empty());
        v["series"]["count"] = json!(1);
        assert_eq!(
            fields(&validate_events_v1_update(&event_v1(v), &old)),
            ["series.count"]
        );
        for (field, value, path) in [
            ("note", json!("another note"), "message"),
            ("reason", json!("Other"), "reason"),
            ("type", json!("Normal"), "type"),
            ("action", json!("Kill"), "action"),
            ("reportingInstance", json!("node-b"), "reportingInstance"),
            (
                "regarding",
                json!({"kind": "Pod", "name": "pod-b", "namespace": "ns"}),
                "involvedObject",
            ),
            (
                "eventTime",
                json!("2026-01-01T00:00:00.123457Z"),
                "eventTime",
            ),
        ] {
            let mut v = recorded();
            v[field] = value;
            assert_eq!(
                fields(&validate_events_v1_update(&event_v1(v), &old)),
                [path],
                "{field}"
            );
        }
        let mut v = recorded();
        v["eventTime"] = json!("2026-01-01T00:00:00.123456789Z");
        assert!(validate_events_v1_update(&event_v1(v), &old).is_empty());
    }

    /// The two groups' shapes convert into each other, field for field.
    #[test]
    fn events_convert_between_the_groups() {
        let core = events_v1_to_core(recorded());
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "pod-a");
        assert_eq!(core["message"], recorded()["note"]);
        assert_eq!(core["reportingComponent"], "tessera.dev/watchdog");
        assert!(core.get("regarding").is_none() && core.get("note").is_none());
        let typed: Event = serde_json::from_value(core.clone()).unwrap();
        assert_eq!(typed.reason.as_deref(), Some("GpuMemoryOverBudget"));
        assert_eq!(core_to_events_v1(core), recorded());
        // core/v1 requires involvedObject; an Event without `regarding` gets an empty one.
        let mut v = recorded();
        v.as_object_mut().unwrap().remove("regarding");
        assert_eq!(events_v1_to_core(v)["involvedObject"], json!({}));
    }
}
