use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{IdentityKey, ObjectRef};

/// Annotation and label prefixes a record carries over from the live object: restatus's own
/// bookkeeping and metal-operator's operation annotation (`ignore` must survive a restore).
/// Everything else belongs to the object's spec side and is not restatus's business.
pub const CARRIED_ANNOTATION_PREFIXES: &[&str] = &["restatus.ironcore.dev/", "metal.ironcore.dev/operation"];

/// One captured object: where it lives, how to find it again without its uid, and its status.
///
/// `status` is kept as raw JSON: restatus carries it, it does not need to understand it. A
/// [`RecordHead`] is a record without its status: what planning keeps in memory for every
/// record, while statuses stay compressed in the payload until one is written
/// (see [`Records`](super::Records)).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record<S = Box<RawValue>> {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// Identity keys in profile order; the first is the primary key.
    pub keys: Vec<IdentityKey>,
    /// For information and safety checks only: never used to match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub status: S,
}

/// A record without its status.
pub type RecordHead = Record<()>;

impl<S> Record<S> {
    /// The record's head, and its status.
    pub fn split(self) -> (RecordHead, S) {
        self.replace_status(())
    }

    /// The same record with `status` instead, and the status it had.
    fn replace_status<T>(self, status: T) -> (Record<T>, S) {
        let Record {
            api_version,
            kind,
            namespace,
            name,
            keys,
            uid,
            resource_version,
            generation,
            creation_timestamp,
            labels,
            annotations,
            status: old,
        } = self;
        let record = Record {
            api_version,
            kind,
            namespace,
            name,
            keys,
            uid,
            resource_version,
            generation,
            creation_timestamp,
            labels,
            annotations,
            status,
        };
        (record, old)
    }
}

impl RecordHead {
    /// The whole record again, with its status.
    pub fn with_status<S>(&self, status: S) -> Record<S> {
        self.clone().replace_status(status).0
    }
}

impl<S> Record<S> {
    /// `namespace/name`, or `name` for cluster-scoped objects.
    pub fn object_name(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }

    /// The object the record was captured from.
    pub fn object_ref(&self) -> ObjectRef {
        ObjectRef { kind: self.kind.clone(), namespace: self.namespace.clone(), name: self.name.clone() }
    }

    pub fn primary_key(&self) -> Option<&IdentityKey> {
        self.keys.first()
    }

    /// The API group the record was captured in (empty for the core group).
    pub fn group(&self) -> &str {
        split_api_version(&self.api_version).0
    }

    /// The API version the record was captured in (its status is of that version's schema).
    pub fn version(&self) -> &str {
        split_api_version(&self.api_version).1
    }

    /// `Kind.group` (`Server.metal.ironcore.dev`), or `Kind` for the core group: what a
    /// record is matched to a kind of the profile by, never the kind's name alone.
    pub fn qualified_kind(&self) -> String {
        qualified_kind(&self.kind, &self.api_version)
    }
}

/// `group/version` (or `version` for the core group) as (group, version).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

/// `Kind.group`, or `Kind` for the core group.
pub fn qualified_kind(kind: &str, api_version: &str) -> String {
    match split_api_version(api_version).0 {
        "" => kind.to_string(),
        group => format!("{kind}.{group}"),
    }
}

/// Whether restatus carries a label or annotation of this key into a record.
pub fn is_carried(key: &str) -> bool {
    CARRIED_ANNOTATION_PREFIXES.iter().any(|prefix| key.starts_with(prefix))
}
