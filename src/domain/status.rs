//! A status as JSON, compared and patched: what differs per top-level field (for people: the
//! restore plan, `snapshots diff`), and the merge patch that leaves exactly a recorded status.

use std::fmt;

use serde::Serialize;
use serde_json::Value;

/// One top-level status field a restore changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldChange {
    pub field: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

impl fmt::Display for FieldChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".into());
        write!(f, "status.{}: {} -> {}", self.field, show(&self.from), show(&self.to))
    }
}

/// Top-level fields of `to` that differ from `from`, summarised for people.
pub fn diff(from: Option<&Value>, to: &Value) -> Vec<FieldChange> {
    let empty = serde_json::Map::new();
    let from = from.and_then(Value::as_object).unwrap_or(&empty);
    let to = to.as_object().unwrap_or(&empty);
    let mut fields: Vec<&String> = from.keys().chain(to.keys()).collect();
    fields.sort();
    fields.dedup();
    fields
        .into_iter()
        .filter(|f| from.get(*f) != to.get(*f))
        .map(|f| FieldChange { field: f.clone(), from: from.get(f).map(summary), to: to.get(f).map(summary) })
        .collect()
}

fn summary(v: &Value) -> String {
    match v {
        Value::Array(items) => format!("[{} items]", items.len()),
        Value::Object(map) => format!("{{{} fields}}", map.len()),
        other => other.to_string(),
    }
}

/// The status to write: the record's, with `null` for live top-level fields the record lacks,
/// so a JSON merge patch leaves exactly the record's status.
pub fn status_patch(live: Option<&Value>, record: &Value) -> Value {
    let mut patch = record.clone();
    if let (Some(Value::Object(live)), Value::Object(out)) = (live, &mut patch) {
        for key in live.keys() {
            out.entry(key.clone()).or_insert(Value::Null);
        }
    }
    patch
}

/// The fields of a written status that the stored one lacks (`status.a.b`, `status.list[2]`):
/// what the served schema pruned. Nulls count as absent; values that differ (a default, a
/// conversion) are not dropped fields. At most `limit` paths, in the written order.
pub fn dropped_fields(written: &Value, stored: Option<&Value>, limit: usize) -> Vec<String> {
    fn walk(path: &mut String, written: &Value, stored: Option<&Value>, out: &mut Vec<String>, limit: usize) {
        if out.len() >= limit || written.is_null() {
            return;
        }
        let Some(stored) = stored.filter(|s| !s.is_null()) else {
            out.push(path.clone());
            return;
        };
        let len = path.len();
        match (written, stored) {
            (Value::Object(w), Value::Object(s)) => {
                for (key, value) in w {
                    path.push('.');
                    path.push_str(key);
                    walk(path, value, s.get(key), out, limit);
                    path.truncate(len);
                }
            }
            (Value::Array(w), Value::Array(s)) => {
                for (i, value) in w.iter().enumerate() {
                    path.push_str(&format!("[{i}]"));
                    walk(path, value, s.get(i), out, limit);
                    path.truncate(len);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&mut "status".to_string(), written, stored, &mut out, limit);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dropped_fields_are_what_the_stored_status_lacks_of_the_written_one() {
        let written = json!({"state": "Available", "powerState": "On", "nics": [{"mac": "aa", "lldp": {"port": 1}},
                             {"mac": "bb"}], "gone": {"deep": true}, "nothing": null});
        let stored = json!({"state": "Available", "powerState": "Off", "nics": [{"mac": "aa"}], "extra": 1});
        assert_eq!(
            dropped_fields(&written, Some(&stored), 10),
            ["status.gone", "status.nics[0].lldp", "status.nics[1]"],
            "keys in serde_json's order (sorted); a value that differs is not dropped; nulls are not fields"
        );
        assert_eq!(dropped_fields(&written, Some(&written), 10), Vec::<String>::new());
        assert_eq!(dropped_fields(&written, None, 10), ["status"]);
        assert_eq!(dropped_fields(&written, Some(&json!({})), 2).len(), 2, "at most the limit");
    }

    #[test]
    fn status_patch_removes_fields_the_record_lacks() {
        let live = json!({"state": "Initial", "powerState": "Off"});
        let patch = status_patch(Some(&live), &json!({"state": "Reserved"}));
        assert_eq!(patch, json!({"state": "Reserved", "powerState": null}));
    }

    #[test]
    fn a_diff_names_each_changed_top_level_field_summarised() {
        let from = json!({"state": "Initial", "powerState": "Off", "nics": [1]});
        let to = json!({"state": "Reserved", "nics": [1, 2], "bios": {"version": "1"}});
        let shown: Vec<String> = diff(Some(&from), &to).iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "status.bios: (absent) -> {1 fields}",
                "status.nics: [1 items] -> [2 items]",
                "status.powerState: \"Off\" -> (absent)",
                "status.state: \"Initial\" -> \"Reserved\"",
            ]
        );
    }
}
