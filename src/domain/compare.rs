//! Compares two snapshots: the objects whose status differs, per top-level status field (as
//! the restore plan shows a restore's changes), and the objects in only one of them. Objects
//! are matched by kind and primary identity key, as a restore matches them, so an object
//! recreated under another name or uid is still the same object.
//!
//! Pure: feed the records of A, then those of B (e.g. from [`crate::store::SnapshotStore::load`]);
//! only A's statuses are held, never a payload.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::domain::status::{FieldChange, diff};
use crate::format::Record;
use crate::{Error, Result};

/// One object that differs between A and B.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectDiff {
    pub kind: String,
    /// The primary identity key (`field=value`), or `name=namespace/name` for a record without keys.
    pub key: String,
    /// `namespace/name` in A, when the object is in A.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name_in_a: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name_in_b: Option<String>,
    /// From A's status to B's, per top-level field (empty for an object in only one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<FieldChange>,
}

impl ObjectDiff {
    /// `changed`, `only-in-a` or `only-in-b`.
    pub fn presence(&self) -> &'static str {
        match (&self.name_in_a, &self.name_in_b) {
            (Some(_), Some(_)) => "changed",
            (Some(_), None) => "only-in-a",
            _ => "only-in-b",
        }
    }
}

/// What differs between snapshots A and B.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotDiff {
    pub a: String,
    pub b: String,
    /// In both, with a different status; by kind, then key.
    pub changed: Vec<ObjectDiff>,
    pub only_in_a: Vec<ObjectDiff>,
    pub only_in_b: Vec<ObjectDiff>,
    /// In both with the same status.
    pub unchanged: usize,
}

/// Builds a [`SnapshotDiff`]: every record of A with [`Comparer::add_a`], then every record
/// of B with [`Comparer::add_b`], then [`Comparer::finish`].
pub struct Comparer {
    a_id: String,
    b_id: String,
    /// A's objects not yet met in B: (group-qualified kind, key) → (kind, name, status).
    pending: BTreeMap<(String, String), (String, String, Value)>,
    out: SnapshotDiff,
}

/// What matches a record of A with one of B: its group-qualified kind (a kind of the same name
/// in another group is another kind) and its primary key.
fn key_of(record: &Record) -> (String, String) {
    let key = record.primary_key().map_or_else(|| format!("name={}", record.object_name()), ToString::to_string);
    (record.qualified_kind(), key)
}

fn status_of(snapshot: &str, record: &Record) -> Result<Value> {
    serde_json::from_str(record.status.get())
        .map_err(|e| Error::corrupt(snapshot, format!("status of {} is not JSON: {e}", record.object_name())))
}

impl Comparer {
    pub fn new(a: impl Into<String>, b: impl Into<String>) -> Self {
        let (a_id, b_id) = (a.into(), b.into());
        let out = SnapshotDiff { a: a_id.clone(), b: b_id.clone(), ..Default::default() };
        Comparer { a_id, b_id, pending: BTreeMap::new(), out }
    }

    pub fn add_a(&mut self, record: &Record) -> Result<()> {
        let status = status_of(&self.a_id, record)?;
        self.pending.insert(key_of(record), (record.kind.clone(), record.object_name(), status));
        Ok(())
    }

    pub fn add_b(&mut self, record: &Record) -> Result<()> {
        let status = status_of(&self.b_id, record)?;
        let (qualified, key) = key_of(record);
        let kind = record.kind.clone();
        let name_in_b = Some(record.object_name());
        match self.pending.remove(&(qualified, key.clone())) {
            Some((_, name_in_a, before)) => {
                let changes = diff(Some(&before), &status);
                if changes.is_empty() {
                    self.out.unchanged += 1;
                } else {
                    self.out.changed.push(ObjectDiff { kind, key, name_in_a: Some(name_in_a), name_in_b, changes });
                }
            }
            None => self.out.only_in_b.push(ObjectDiff { kind, key, name_in_a: None, name_in_b, changes: vec![] }),
        }
        Ok(())
    }

    pub fn finish(mut self) -> SnapshotDiff {
        self.out.only_in_a = (self.pending.into_iter())
            .map(|((_, key), (kind, name, _))| ObjectDiff {
                kind,
                key,
                name_in_a: Some(name),
                name_in_b: None,
                changes: vec![],
            })
            .collect();
        let order = |x: &ObjectDiff, y: &ObjectDiff| (&x.kind, &x.key).cmp(&(&y.kind, &y.key));
        self.out.changed.sort_by(order);
        self.out.only_in_b.sort_by(order);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, uuid};
    use serde_json::json;

    fn compare(a: &[Record], b: &[Record]) -> SnapshotDiff {
        let mut c = Comparer::new("A", "B");
        a.iter().for_each(|r| c.add_a(r).unwrap());
        b.iter().for_each(|r| c.add_b(r).unwrap());
        c.finish()
    }

    #[test]
    fn objects_match_by_kind_and_primary_key_and_differ_per_top_level_field() {
        let a = [
            fixtures::record("Server", "s1", &[uuid("1")], json!({"state": "Available", "powerState": "Off"})),
            fixtures::record("Server", "s2", &[uuid("2")], json!({"state": "Reserved"})),
            fixtures::record("Server", "gone", &[uuid("3")], json!({"state": "Available"})),
        ];
        let b = [
            // Same object, recreated under another name: matched by its key; two fields differ.
            fixtures::record("Server", "s1-new", &[uuid("1")], json!({"state": "Reserved", "powerState": "On"})),
            fixtures::record("Server", "s2", &[uuid("2")], json!({"state": "Reserved"})),
            fixtures::record("Server", "new", &[uuid("4")], json!({"state": "Initial"})),
            // Another kind with the same key is another object, and so is a kind of the same
            // name in another group.
            fixtures::record("BMC", "b1", &[uuid("1")], json!({"state": "Enabled"})),
            Record {
                api_version: "inventory.example.com/v1".into(),
                ..fixtures::record("Server", "other", &[uuid("2")], json!({"state": "Reserved"}))
            },
        ];
        let d = compare(&a, &b);
        assert_eq!(d.unchanged, 1);
        assert_eq!(d.changed.len(), 1);
        let changed = &d.changed[0];
        assert_eq!((changed.name_in_a.as_deref(), changed.name_in_b.as_deref()), (Some("s1"), Some("s1-new")));
        assert_eq!(changed.presence(), "changed");
        let fields: Vec<String> = changed.changes.iter().map(ToString::to_string).collect();
        assert_eq!(fields, [r#"status.powerState: "Off" -> "On""#, r#"status.state: "Available" -> "Reserved""#]);
        let only_a: Vec<_> = d.only_in_a.iter().map(|o| (o.kind.as_str(), o.name_in_a.as_deref())).collect();
        assert_eq!(only_a, [("Server", Some("gone"))]);
        let only_b: Vec<_> = d.only_in_b.iter().map(|o| (o.kind.as_str(), o.name_in_b.as_deref())).collect();
        assert_eq!(only_b, [("BMC", Some("b1")), ("Server", Some("other")), ("Server", Some("new"))]);
        assert_eq!(d.only_in_b[0].presence(), "only-in-b");
    }

    #[test]
    fn identical_snapshots_differ_in_nothing() {
        let a = [fixtures::record("Server", "s1", &[uuid("1")], json!({"state": "Available", "conditions": []}))];
        let d = compare(&a, &a);
        assert_eq!((d.changed.len(), d.only_in_a.len(), d.only_in_b.len(), d.unchanged), (0, 0, 0, 1));
    }
}
