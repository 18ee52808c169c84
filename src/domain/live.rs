//! What restatus knows of a live object: its identity keys, its status as raw JSON, its
//! annotations and when its status was last written. Pure: built from a listed or watched
//! object, read by planning, applying, the controller's index and preflight.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::domain::annotations;
use crate::domain::identity::{IdentityKey, KindProfile};
use crate::domain::object::RawObject;
use crate::format::ObjectRef;

/// What restatus knows of a live object on the target.
#[derive(Debug, Clone)]
pub struct LiveObject {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub keys: Vec<IdentityKey>,
    /// The status as the API server sent it (parsed only when a decision needs it).
    pub status: Option<Box<RawValue>>,
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
            status: object.status().map(RawValue::to_owned),
            annotations: meta.annotations.clone().unwrap_or_default(),
            status_written_at: meta.status_written_at(),
        }
    }

    /// The same view of an object that came through a typed API call or a watch.
    pub fn from_dynamic(kind: &KindProfile, object: &kube::api::DynamicObject) -> Result<Self, serde_json::Error> {
        let json = serde_json::to_string(object)?;
        Ok(Self::from_raw(kind, &RawObject::parse(&json)?))
    }

    /// The status, parsed.
    pub fn status_value(&self) -> Option<Value> {
        self.status.as_deref().and_then(|s| serde_json::from_str(s.get()).ok())
    }

    pub fn object_ref(&self) -> ObjectRef {
        ObjectRef { kind: self.kind.clone(), namespace: self.namespace.clone(), name: self.name.clone() }
    }

    /// `ignore` set by restatus (by any snapshot or run), which restatus may remove.
    pub fn quiesced_by_restatus(&self) -> bool {
        annotations::quiesced_by_restatus(&self.annotations)
    }

    /// metal-operator leaves this object alone, whoever asked for it.
    pub fn ignored(&self) -> bool {
        annotations::is_quiesced(&self.annotations)
    }
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
        assert_eq!(object.status_written_at, Some(ts("2026-11-30T08:30:00Z")));
        assert!(object.quiesced_by_restatus());
    }
}
