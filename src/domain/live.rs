//! What restatus knows of a live object: its identity keys, its status, its annotations and
//! when its status was last written. Pure: built from a listed or watched object, read by
//! planning, applying, the controller's index and preflight.
//!
//! A status is kept as two digests (of the JSON as sent, and of its canonical form) and
//! whether it is initial: that is all a restore decision needs. The JSON itself is kept until
//! [`LiveObject::compact`] drops it, which the controller's index and large restores do, so
//! that memory does not grow with the size of the fleet's statuses.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::domain::annotations;
use crate::domain::identity::KindProfile;
use crate::domain::object::RawObject;
use crate::format::{IdentityKey, ObjectRef, is_carried};

/// What restatus knows of a live object on the target.
#[derive(Debug, Clone)]
pub struct LiveObject {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub keys: Vec<IdentityKey>,
    /// The status, unless absent or null.
    pub status: Option<LiveStatus>,
    /// restatus's own annotations and metal-operator's operation: the others are not
    /// restatus's business (and would cost memory for every object the controller watches).
    pub annotations: BTreeMap<String, String>,
    /// When the status subresource was last written (managedFields), if known.
    pub status_written_at: Option<Timestamp>,
}

impl LiveObject {
    pub fn from_raw(kind: &KindProfile, object: &RawObject<'_>) -> Self {
        let meta = &object.meta;
        LiveObject {
            kind: kind.kind.clone(),
            namespace: meta.namespace.as_ref().map(|n| n.to_string()).filter(|n| !n.is_empty()),
            name: meta.name.to_string(),
            uid: meta.uid.as_deref().unwrap_or_default().to_string(),
            resource_version: meta.resource_version.as_deref().unwrap_or_default().to_string(),
            keys: kind.keys_of(object),
            status: object.status().map(|s| LiveStatus::new(kind, s)),
            annotations: meta
                .annotations
                .iter()
                .flatten()
                .filter(|(k, _)| is_carried(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            status_written_at: meta.status_written_at(),
        }
    }

    /// The status, parsed, if its JSON is kept.
    pub fn status_value(&self) -> Option<Value> {
        self.status.as_ref().and_then(LiveStatus::value)
    }

    /// The same object without its status JSON (digests kept).
    pub fn compact(mut self) -> Self {
        self.status = self.status.map(LiveStatus::compact);
        self
    }

    pub fn object_ref(&self) -> ObjectRef {
        ObjectRef { kind: self.kind.clone(), namespace: self.namespace.clone(), name: self.name.clone() }
    }

    /// `ignore` set by restatus (by any snapshot or run), which restatus may remove.
    pub fn quiesced_by_restatus(&self) -> bool {
        annotations::quiesced_by_restatus(&self.annotations)
    }

    /// The target refused this snapshot's status for the object before (see
    /// [`annotations::NOT_RESTORED_ANNOTATION`]).
    pub fn refused(&self, snapshot: &str) -> bool {
        self.annotations.get(annotations::NOT_RESTORED_ANNOTATION).is_some_and(|s| s == snapshot)
    }

    /// restatus restored the object and holds it for a person (see
    /// [`annotations::held_by_restatus`]).
    pub fn held_by_restatus(&self) -> bool {
        annotations::held_by_restatus(&self.annotations)
    }

    /// metal-operator leaves this object alone, whoever asked for it.
    pub fn ignored(&self) -> bool {
        annotations::is_quiesced(&self.annotations)
    }
}

/// A live status as restore decisions need it.
#[derive(Debug, Clone)]
pub struct LiveStatus {
    /// sha256 of the JSON as the API server sent it.
    sent: [u8; 32],
    /// sha256 of its canonical form (parsed and written again: keys sorted, numbers and
    /// strings in one spelling), so that equal statuses from two API servers compare equal.
    canonical: [u8; 32],
    /// Empty, or in one of the kind's initial states.
    initial: bool,
    json: Option<Box<RawValue>>,
}

impl LiveStatus {
    pub fn new(kind: &KindProfile, raw: &RawValue) -> Self {
        let value: Value = serde_json::from_str(raw.get()).unwrap_or(Value::Null);
        LiveStatus {
            sent: Sha256::digest(raw.get()).into(),
            canonical: canonical_digest(&value),
            initial: kind.is_initial_status(Some(&value)),
            json: Some(raw.to_owned()),
        }
    }

    /// The same status without its JSON (digests kept).
    pub fn compact(mut self) -> Self {
        self.json = None;
        self
    }

    /// The JSON as the API server sent it, unless dropped.
    pub fn json(&self) -> Option<&RawValue> {
        self.json.as_deref()
    }

    pub fn value(&self) -> Option<Value> {
        self.json().and_then(|s| serde_json::from_str(s.get()).ok())
    }

    pub fn is_initial(&self) -> bool {
        self.initial
    }

    /// The same bytes as `raw`: equal without parsing anything.
    pub fn same_bytes(&self, raw: &RawValue) -> bool {
        self.sent == <[u8; 32]>::from(Sha256::digest(raw.get()))
    }

    /// Equal to `value` as JSON.
    pub fn same_value(&self, value: &Value) -> bool {
        self.canonical == canonical_digest(value)
    }

    /// Equal to `other` as JSON (compacted or not).
    pub fn same_as(&self, other: &LiveStatus) -> bool {
        self.canonical == other.canonical
    }

    /// Equal to `raw` as JSON.
    pub fn equals(&self, raw: &RawValue) -> bool {
        self.same_bytes(raw) || serde_json::from_str::<Value>(raw.get()).is_ok_and(|v| self.same_value(&v))
    }
}

fn canonical_digest(value: &Value) -> [u8; 32] {
    Sha256::digest(serde_json::to_vec(value).unwrap_or_default()).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::identity::Profile;
    use crate::fixtures::{key, ts};
    use serde_json::json;

    #[test]
    fn live_objects_read_keys_status_and_status_write_time() {
        let profile = Profile::metal_operator();
        let json = r#"{"metadata":{"name":"s","uid":"u","resourceVersion":"5",
            "annotations":{"metal.ironcore.dev/operation":"ignore","restatus.ironcore.dev/quiesced-by":"restatus"},
            "managedFields":[{"manager":"a","operation":"Update","time":"2026-11-30T08:00:00Z"},
                             {"manager":"m","operation":"Update","subresource":"status","time":"2026-11-30T08:30:00Z"},
                             {"manager":"n","operation":"Update","subresource":"status","time":"2026-11-30T08:10:00Z"}]},
            "spec":{"systemUUID":"ABC"},"status":{"state":"Available"}}"#;
        let object = LiveObject::from_raw(profile.kind("Server").unwrap(), &RawObject::parse(json).unwrap());
        assert_eq!(object.keys, [key("spec.systemUUID", "abc")]);
        assert_eq!(object.status_value(), Some(json!({"state": "Available"})));
        let status = object.clone().compact().status.unwrap();
        assert!(status.json().is_none() && !status.is_initial());
        assert!(status.equals(&RawValue::from_string(r#"{ "state" : "Available" }"#.into()).unwrap()));
        assert!(!status.equals(&RawValue::from_string(r#"{"state":"Reserved"}"#.into()).unwrap()));
        assert_eq!(object.status_written_at, Some(ts("2026-11-30T08:30:00Z")));
        assert!(object.quiesced_by_restatus());
    }
}
