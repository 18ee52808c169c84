//! A read-only view of one Kubernetes object as the API server sent it, without parsing it into
//! a `serde_json::Value`: the top level is split into raw fields, `metadata` is parsed, and
//! nested fields are looked up on demand. `status` stays raw bytes from LIST to payload.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta<'a> {
    #[serde(borrow, default)]
    pub name: Cow<'a, str>,
    #[serde(borrow, default)]
    pub namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub uid: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub resource_version: Option<Cow<'a, str>>,
    #[serde(default)]
    pub generation: Option<i64>,
    #[serde(borrow, default)]
    pub creation_timestamp: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub deletion_timestamp: Option<Cow<'a, str>>,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
    /// `metadata.ownerReferences` as raw JSON (borrowed, parsed only by who needs it: the
    /// move graph).
    #[serde(borrow, default)]
    pub owner_references: Option<&'a RawValue>,
    #[serde(default)]
    pub managed_fields: Option<Vec<ManagedFields<'a>>>,
}

/// The part of a managedFields entry restatus reads: who wrote which subresource when.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedFields<'a> {
    #[serde(borrow, default)]
    pub manager: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub subresource: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub time: Option<Cow<'a, str>>,
}

impl ObjectMeta<'_> {
    /// When the status subresource was last written, as far as managedFields tell.
    pub fn status_written_at(&self) -> Option<jiff::Timestamp> {
        self.managed_fields
            .iter()
            .flatten()
            .filter(|m| m.subresource.as_deref() == Some("status"))
            .filter_map(|m| m.time.as_deref()?.parse().ok())
            .max()
    }
}

/// One object: its metadata, and its other top-level fields as raw JSON.
#[derive(Debug)]
pub struct RawObject<'a> {
    pub meta: ObjectMeta<'a>,
    fields: HashMap<Cow<'a, str>, &'a RawValue>,
}

impl<'a> RawObject<'a> {
    pub fn parse(json: &'a str) -> Result<Self, serde_json::Error> {
        let mut fields: HashMap<Cow<'a, str>, &'a RawValue> = serde_json::from_str(json)?;
        let meta = match fields.remove("metadata") {
            Some(raw) => ObjectMeta::deserialize(raw)?,
            None => ObjectMeta::default(),
        };
        Ok(RawObject { meta, fields })
    }

    /// `namespace/name`, or `name` for cluster-scoped objects.
    pub fn namespaced_name(&self) -> String {
        match &self.meta.namespace {
            Some(ns) if !ns.is_empty() => format!("{ns}/{}", self.meta.name),
            _ => self.meta.name.to_string(),
        }
    }

    pub fn field(&self, name: &str) -> Option<&'a RawValue> {
        self.fields.get(name).copied()
    }

    /// The status, unless absent, `null` or `{}`.
    pub fn status(&self) -> Option<&'a RawValue> {
        self.field("status").filter(|raw| !is_empty_json(raw.get()))
    }

    /// The value at a dotted path (`spec.access.macAddress`) if it is a non-empty string or a
    /// number. `metadata.*` paths read the parsed metadata.
    pub fn string_at(&self, path: &str) -> Option<String> {
        if let Some(field) = path.strip_prefix("metadata.") {
            let value = match field {
                "name" => Some(self.meta.name.to_string()),
                "namespace" => self.meta.namespace.as_ref().map(|n| n.to_string()),
                _ => None,
            };
            return value.filter(|v| !v.is_empty());
        }
        scalar_string(self.raw_at(path)?)
    }

    /// The boolean at a dotted path, if there is one.
    pub fn bool_at(&self, path: &str) -> Option<bool> {
        serde_json::from_str(self.raw_at(path)?.get()).ok()
    }

    /// The raw JSON at a dotted path outside `metadata`.
    fn raw_at(&self, path: &str) -> Option<&'a RawValue> {
        let mut parts = path.split('.');
        let mut raw = self.field(parts.next()?)?;
        for part in parts {
            raw = lookup(raw, part)?;
        }
        Some(raw)
    }
}

/// `raw[key]` for a JSON object; `None` for anything else.
fn lookup<'a>(raw: &'a RawValue, key: &str) -> Option<&'a RawValue> {
    let map: HashMap<Cow<'a, str>, &'a RawValue> = serde_json::from_str(raw.get()).ok()?;
    map.get(key).copied()
}

fn scalar_string(raw: &RawValue) -> Option<String> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar<'a> {
        Text(#[serde(borrow)] Cow<'a, str>),
        Number(serde_json::Number),
    }
    match serde_json::from_str::<Scalar>(raw.get()).ok()? {
        Scalar::Text(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
        Scalar::Text(_) => None,
        Scalar::Number(n) => Some(n.to_string()),
    }
}

/// The object `json` (a whole object, as the API server answered a write) as the body of a
/// replace (PUT) of the object itself that changes nothing but its annotations, merge-patch
/// style: `changes` sets keys, `null` removes them. Every other field is carried byte for
/// byte, except `status` (the object's own endpoint ignores it where the kind has a status
/// subresource) and `managedFields` (the API server keeps its own). `resourceVersion` stays:
/// the replace fails with a conflict when the object changed since `json` was read.
pub fn annotations_replaced(json: &str, changes: &Map<String, Value>) -> Result<String, serde_json::Error> {
    let fields: HashMap<Cow<'_, str>, &RawValue> = serde_json::from_str(json)?;
    let mut metadata: Map<String, Value> = match fields.get("metadata") {
        Some(raw) => serde_json::from_str(raw.get())?,
        None => Map::new(),
    };
    metadata.remove("managedFields");
    let mut annotations = match metadata.remove("annotations") {
        Some(Value::Object(annotations)) => annotations,
        _ => Map::new(),
    };
    for (key, value) in changes {
        match value {
            Value::Null => annotations.remove(key),
            value => annotations.insert(key.clone(), value.clone()),
        };
    }
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }

    let mut body = String::with_capacity(json.len());
    body.push('{');
    for (key, raw) in fields.iter().filter(|(key, _)| !matches!(key.as_ref(), "metadata" | "status")) {
        body.push_str(&serde_json::to_string(key)?);
        body.push(':');
        body.push_str(raw.get());
        body.push(',');
    }
    body.push_str("\"metadata\":");
    body.push_str(&serde_json::to_string(&metadata)?);
    body.push('}');
    Ok(body)
}

/// `null`, `{}` (with any white space) count as no status.
pub fn is_empty_json(json: &str) -> bool {
    let compact: String = json.chars().filter(|c| !c.is_whitespace()).collect();
    compact == "null" || compact == "{}"
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVER: &str = r#"{"apiVersion":"metal.ironcore.dev/v1alpha1","kind":"Server",
        "metadata":{"name":"server-1","uid":"u-1","resourceVersion":"42","generation":3,
                    "labels":{"a":"b"},"annotations":{"metal.ironcore.dev/operation":"ignore"}},
        "spec":{"systemUUID":"ABC-def","bmc":{"address":"10.0.0.1","protocol":{"port":623}}},
        "status":{"state":"Available","networkInterfaces":[{"name":"eth0"}]}}"#;

    #[test]
    fn reads_metadata_and_nested_fields() {
        let obj = RawObject::parse(SERVER).unwrap();
        assert_eq!(obj.meta.name, "server-1");
        assert_eq!(obj.meta.generation, Some(3));
        assert_eq!(obj.namespaced_name(), "server-1");
        assert_eq!(obj.string_at("spec.systemUUID").as_deref(), Some("ABC-def"));
        assert_eq!(obj.string_at("spec.bmc.address").as_deref(), Some("10.0.0.1"));
        assert_eq!(obj.string_at("spec.bmc.protocol.port").as_deref(), Some("623"));
        assert_eq!(obj.string_at("spec.bmc.protocol"), None, "objects are not keys");
        assert_eq!(obj.string_at("spec.missing"), None);
        assert_eq!(obj.string_at("metadata.name").as_deref(), Some("server-1"));
        assert_eq!(obj.bool_at("spec.bmc.protocol.port"), None);
        let flags = RawObject::parse(r#"{"spec":{"paused":true,"x":{"on":false}}}"#).unwrap();
        assert_eq!((flags.bool_at("spec.paused"), flags.bool_at("spec.x.on")), (Some(true), Some(false)));
        assert!(obj.status().unwrap().get().contains("Available"));
    }

    #[test]
    fn empty_status_counts_as_none() {
        for status in ["null", "{}", "{ }", "{\n}"] {
            let json = format!(r#"{{"metadata":{{"name":"x"}},"status":{status}}}"#);
            assert!(RawObject::parse(&json).unwrap().status().is_none(), "{status}");
        }
        assert!(RawObject::parse(r#"{"metadata":{"name":"x"}}"#).unwrap().status().is_none());
    }

    #[test]
    fn a_replacement_changes_only_annotations() {
        let answer = r#"{"apiVersion":"metal.ironcore.dev/v1alpha1","kind":"Server",
            "metadata":{"name":"server-1","uid":"u-1","resourceVersion":"43","finalizers":["f"],
                        "ownerReferences":[{"kind":"BMC","name":"b","uid":"u-b"}],"labels":{"a":"b"},
                        "annotations":{"keep":"me","metal.ironcore.dev/operation":"ignore","q":"r"},
                        "managedFields":[{"manager":"restatus","fieldsV1":{"f:status":{}}}]},
            "spec":{"systemUUID":"ABC","n":1.50},"status":{"state":"Reserved"},"extra":[1,2]}"#;
        let mut changes = Map::new();
        changes.insert("metal.ironcore.dev/operation".into(), Value::Null);
        changes.insert("q".into(), Value::Null);
        changes.insert("restored-from".into(), "snap-1".into());
        let body = annotations_replaced(answer, &changes).unwrap();
        let body: Value = serde_json::from_str(&body).unwrap();
        let original: Value = serde_json::from_str(answer).unwrap();
        assert_eq!(body["metadata"]["annotations"], serde_json::json!({"keep": "me", "restored-from": "snap-1"}));
        assert_eq!(body["metadata"]["resourceVersion"], "43", "the replace is conditional");
        assert!(body["metadata"].get("managedFields").is_none());
        assert!(body.get("status").is_none());
        for same in ["apiVersion", "kind", "spec", "extra"] {
            assert_eq!(body[same], original[same], "{same}");
        }
        for same in ["name", "uid", "finalizers", "ownerReferences", "labels"] {
            assert_eq!(body["metadata"][same], original["metadata"][same], "{same}");
        }

        // Removing the only annotations leaves none; an object without any gets them.
        let bare = r#"{"metadata":{"name":"x","annotations":{"q":"r"}}}"#;
        let body: Value = serde_json::from_str(&annotations_replaced(bare, &changes).unwrap()).unwrap();
        assert_eq!(body["metadata"]["annotations"], serde_json::json!({"restored-from": "snap-1"}));
        let mut remove = Map::new();
        remove.insert("q".into(), Value::Null);
        let body: Value = serde_json::from_str(&annotations_replaced(bare, &remove).unwrap()).unwrap();
        assert!(body["metadata"].get("annotations").is_none());
        assert!(annotations_replaced("[1]", &remove).is_err(), "not an object");
    }

    #[test]
    fn blank_strings_are_not_keys() {
        let obj = RawObject::parse(r#"{"metadata":{"name":"x"},"spec":{"systemUUID":"  "}}"#).unwrap();
        assert_eq!(obj.string_at("spec.systemUUID"), None);
    }
}
