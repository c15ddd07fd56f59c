//! JSON merge patch (RFC 7386), the one PATCH format the fake API server applies
//! (`application/merge-patch+json`, kube's `Patch::Merge`).

use serde_json::{Map, Value};

/// The content type of a JSON merge patch.
pub const MERGE_PATCH: &str = "application/merge-patch+json";

/// `target` with `patch` merged in: objects merge key by key, `null` removes a key,
/// anything else replaces. Pure.
pub fn merge_patch(target: Value, patch: &Value) -> Value {
    let Value::Object(patch) = patch else {
        return patch.clone();
    };
    let mut merged = match target {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    for (k, v) in patch {
        if v.is_null() {
            merged.remove(k);
        } else {
            let current = merged.remove(k).unwrap_or(Value::Null);
            merged.insert(k.clone(), merge_patch(current, v));
        }
    }
    Value::Object(merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The examples of RFC 7386, appendix A.
    #[test]
    fn merge_patch_follows_rfc_7386() {
        for (target, patch, want) in [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": "b", "b": "c"}),
                json!({"a": null}),
                json!({"b": "c"}),
            ),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "b"}), json!(["c"]), json!(["c"])),
            (json!({"a": "foo"}), json!(null), json!(null)),
            (json!({"a": "foo"}), json!("bar"), json!("bar")),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!([1, 2]),
                json!({"a": "b", "c": null}),
                json!({"a": "b"}),
            ),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ] {
            assert_eq!(
                merge_patch(target.clone(), &patch),
                want,
                "{target} + {patch}"
            );
        }
    }
}
