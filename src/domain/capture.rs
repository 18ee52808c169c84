//! Capture, the pure part: which listed objects become records, which are skipped and why,
//! which keys collide, and whether the whole capture is consistent. The backup pipeline feeds
//! it page by page; restore and preflight feed it the live objects for the same verdict.
//! `status` is copied as raw JSON, never parsed.

use std::collections::{BTreeMap, HashMap};

use serde_json::value::RawValue;

use crate::domain::identity::KindProfile;
use crate::domain::object::RawObject;
use crate::domain::pairing::{View, Views};
use crate::format::{
    CaptureSummary, Consistency, IdentityKey, Inconsistency, KeyConflict, KeyDigest, KindCount, ObjectRef, Record,
    Skipped, is_carried,
};

/// Why a kind or an object is not in the payload. Stable strings: they end up in manifests.
pub mod reasons {
    pub const SECRET_KIND: &str = "never captured: holds credentials";
    pub const NOT_SERVED: &str = "kind not served by the API server";
    pub const NO_STATUS: &str = "no status";
    pub const NO_KEY: &str = "no identity key: every key field is empty";
}

/// Accumulates what a capture saw, kind by kind.
#[derive(Debug, Default)]
pub struct Collector {
    kinds: Vec<KindCount>,
    skipped: Vec<Skipped>,
    /// The first owner of each primary key, by its digest, to report collisions: some 40
    /// bytes an object.
    owners: Owners,
    conflicts: BTreeMap<(String, IdentityKey), Vec<ObjectRef>>,
    /// What the consistency verdict looks at.
    views: Views,
    transitional: Vec<Inconsistency>,
}

impl Collector {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn begin_kind(&mut self, kind: &KindProfile) {
        self.kinds.push(KindCount { api_version: kind.api_version(), kind: kind.kind.clone(), records: 0, skipped: 0 });
    }

    /// A whole kind left out (denied, or not served).
    pub fn skip_kind(&mut self, kind: &KindProfile, reason: &str) {
        self.skipped.push(Skipped { kind: kind.kind.clone(), namespace: None, name: None, reason: reason.into() });
    }

    /// Turns one listed object into a record, or notes why it is skipped.
    pub fn add(&mut self, kind: &KindProfile, object: &RawObject<'_>) -> Option<Record> {
        let reference = ObjectRef {
            kind: kind.kind.clone(),
            namespace: object.meta.namespace.as_ref().map(|n| n.to_string()),
            name: object.meta.name.to_string(),
        };
        self.observe(kind, object, &reference);
        let keys = kind.keys_of(object);
        let skip = match (object.status(), keys.first()) {
            (None, _) => Some(reasons::NO_STATUS),
            (_, None) => Some(reasons::NO_KEY),
            _ => None,
        };
        let count = self.current(kind);
        if let Some(reason) = skip {
            count.skipped += 1;
            self.skipped.push(Skipped {
                kind: reference.kind,
                namespace: reference.namespace,
                name: Some(reference.name),
                reason: reason.into(),
            });
            return None;
        }
        count.records += 1;
        let (status, primary) = (object.status()?, keys.first()?.clone());
        self.note_key(&kind.kind, primary, reference);
        Some(record_of(kind, object, keys, status))
    }

    /// Claim/server pairing violations among the objects added so far.
    pub fn pairing(&self) -> Vec<crate::domain::pairing::Violation> {
        self.views.check()
    }

    /// The pairing views of the objects added so far.
    pub fn views(&self) -> &Views {
        &self.views
    }

    /// Ends the capture with its consistency verdict (see [`judge`]).
    pub fn finish(self, attempts: u32) -> CaptureSummary {
        let conflicts: Vec<KeyConflict> = self
            .conflicts
            .into_iter()
            .map(|((kind, key), objects)| KeyConflict { kind, key: key.to_string(), objects })
            .collect();
        // Pairing can only be judged when both sides were listed.
        let listed = |kind: &str| {
            self.kinds.iter().any(|k| k.kind == kind)
                && !self.skipped.iter().any(|s| s.kind == kind && s.name.is_none())
        };
        let views = if listed("Server") && listed("ServerClaim") { self.views } else { Views::default() };
        let consistency = judge(&views, self.transitional, &conflicts, attempts);
        CaptureSummary { kinds: self.kinds, skipped: self.skipped, conflicts, consistency }
    }

    /// Notes what consistency needs: pairing views, transitional states, deletions.
    fn observe(&mut self, kind: &KindProfile, object: &RawObject<'_>, reference: &ObjectRef) {
        if let Some(view) = View::of(kind, object) {
            self.views.add(view);
        }
        if let Some(reason) = transitional(kind, object) {
            self.transitional.push(Inconsistency { object: reference.clone(), reason });
        }
    }

    fn current(&mut self, kind: &KindProfile) -> &mut KindCount {
        if self.kinds.last().is_none_or(|k| k.kind != kind.kind) {
            self.begin_kind(kind);
        }
        self.kinds.last_mut().expect("begin_kind pushed one")
    }

    fn note_key(&mut self, kind: &str, key: IdentityKey, object: ObjectRef) {
        let digest = key.digest(kind);
        match self.owners.first(digest) {
            None => self.owners.insert(digest, object.namespace.as_deref(), &object.name),
            Some((namespace, name)) => {
                let first = ObjectRef { kind: kind.to_string(), namespace, name };
                let objects = self.conflicts.entry((kind.to_string(), key)).or_insert_with(|| vec![first]);
                objects.push(object);
            }
        }
    }
}

/// Who first carried each primary key: the digest's owner as `namespace/name` (or `name`) in
/// one string, not a string an object.
#[derive(Debug, Default)]
struct Owners {
    by_digest: HashMap<KeyDigest, u32>,
    names: String,
    /// Where each owner's text ends in `names`.
    ends: Vec<u32>,
}

impl Owners {
    fn insert(&mut self, digest: KeyDigest, namespace: Option<&str>, name: &str) {
        if let Some(namespace) = namespace {
            self.names.push_str(namespace);
            self.names.push('/');
        }
        self.names.push_str(name);
        self.by_digest.insert(digest, self.ends.len() as u32);
        self.ends.push(self.names.len() as u32);
    }

    /// The first owner of a digest: (namespace, name).
    fn first(&self, digest: KeyDigest) -> Option<(Option<String>, String)> {
        let i = *self.by_digest.get(&digest)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        let text = &self.names[start..self.ends[i] as usize];
        Some(match text.split_once('/') {
            Some((namespace, name)) => (Some(namespace.to_string()), name.to_string()),
            None => (None, text.to_string()),
        })
    }
}

/// A capture is consistent when claims and servers pair up (every Bound ServerClaim's Server
/// is Reserved and points back, no Reserved Server points to a missing or unbound claim), no
/// claim is binding (not Bound, yet with a serverRef), no object is transitional or being
/// deleted, and identity keys are unique.
pub fn judge(views: &Views, transitional: Vec<Inconsistency>, conflicts: &[KeyConflict], attempts: u32) -> Consistency {
    let mut reasons: Vec<Inconsistency> =
        views.check().into_iter().map(|v| Inconsistency { object: v.object, reason: v.reason }).collect();
    reasons.extend(transitional);
    for claim in views.claims().filter(|c| c.phase != "Bound" && c.server.is_some()) {
        let object = ObjectRef {
            kind: "ServerClaim".into(),
            namespace: Some(claim.namespace.clone()),
            name: claim.name.clone(),
        };
        let server = claim.server.as_deref().unwrap_or_default();
        reasons
            .push(Inconsistency { object, reason: format!("binding: {:?} with spec.serverRef {server}", claim.phase) });
    }
    for conflict in conflicts {
        for object in &conflict.objects {
            reasons.push(Inconsistency {
                object: object.clone(),
                reason: format!("shares identity key {}", conflict.key),
            });
        }
    }
    let reason_count = reasons.len();
    reasons.truncate(Consistency::MAX_REASONS);
    Consistency { consistent: reason_count == 0, attempts, reasons, reason_count }
}

/// The record of one object as a capture would make it, or `None` where a capture skips it (no
/// status, or no identity key). The journal's records are a backup's.
pub fn record(kind: &KindProfile, object: &RawObject<'_>) -> Option<Record> {
    let keys = kind.keys_of(object);
    let status = object.status()?;
    keys.first()?;
    Some(record_of(kind, object, keys, status))
}

/// Why an object makes a capture inconsistent on its own (being deleted, or in a transitional
/// state), if it does.
pub fn transitional(kind: &KindProfile, object: &RawObject<'_>) -> Option<String> {
    if object.meta.deletion_timestamp.is_some() {
        return Some("being deleted".to_string());
    }
    kind.transitional_state(object).map(|state| format!("in transitional state {state:?}"))
}

fn record_of(kind: &KindProfile, object: &RawObject<'_>, keys: Vec<IdentityKey>, status: &RawValue) -> Record {
    let carried = |map: &Option<BTreeMap<String, String>>| -> BTreeMap<String, String> {
        map.iter().flatten().filter(|(k, _)| is_carried(k)).map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    let meta = &object.meta;
    Record {
        api_version: kind.api_version(),
        kind: kind.kind.clone(),
        namespace: meta.namespace.as_ref().map(|n| n.to_string()).filter(|n| !n.is_empty()),
        name: meta.name.to_string(),
        keys,
        uid: meta.uid.as_ref().map(|s| s.to_string()),
        resource_version: meta.resource_version.as_ref().map(|s| s.to_string()),
        generation: meta.generation,
        creation_timestamp: meta.creation_timestamp.as_ref().map(|s| s.to_string()),
        labels: carried(&meta.labels),
        annotations: carried(&meta.annotations),
        status: status.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::identity::Profile;

    fn server(name: &str, uuid: &str, status: &str) -> String {
        format!(
            r#"{{"metadata":{{"name":"{name}","uid":"uid-{name}","resourceVersion":"7","generation":2,
            "annotations":{{"kubectl.kubernetes.io/last-applied-configuration":"{{}}","metal.ironcore.dev/operation":"ignore"}}}},
            "spec":{{"systemUUID":"{uuid}"}},"status":{status}}}"#
        )
    }

    #[test]
    fn objects_become_records_with_keys_and_carried_annotations_only() {
        let profile = Profile::metal_operator();
        let kind = profile.kind("Server").unwrap();
        let mut collector = Collector::new();
        collector.begin_kind(kind);
        let json = server("s1", "UUID-1", r#"{"state":"Reserved","powerState":"On"}"#);
        let record = collector.add(kind, &RawObject::parse(&json).unwrap()).unwrap();
        assert_eq!(record.kind, "Server");
        assert_eq!(record.api_version, "metal.ironcore.dev/v1alpha1");
        assert_eq!(record.keys[0].to_string(), "spec.systemUUID=uuid-1");
        assert_eq!(record.uid.as_deref(), Some("uid-s1"));
        assert_eq!(record.generation, Some(2));
        assert_eq!(record.status.get(), r#"{"state":"Reserved","powerState":"On"}"#);
        assert_eq!(record.annotations.keys().collect::<Vec<_>>(), ["metal.ironcore.dev/operation"]);
        let summary = collector.finish(1);
        assert_eq!(summary.kinds[0].records, 1);
        assert!(summary.skipped.is_empty() && summary.conflicts.is_empty());
    }

    #[test]
    fn objects_without_status_or_key_are_skipped_with_a_reason() {
        let profile = Profile::metal_operator();
        let kind = profile.kind("Server").unwrap();
        let mut collector = Collector::new();
        collector.begin_kind(kind);
        assert!(collector.add(kind, &RawObject::parse(&server("s1", "U1", "{}")).unwrap()).is_none());
        assert!(
            collector.add(kind, &RawObject::parse(&server("s2", "", r#"{"state":"Available"}"#)).unwrap()).is_none()
        );
        let summary = collector.finish(1);
        assert_eq!((summary.kinds[0].records, summary.kinds[0].skipped), (0, 2));
        let reasons: Vec<_> = summary.skipped.iter().map(|s| (s.name.clone().unwrap(), s.reason.as_str())).collect();
        assert_eq!(reasons, [("s1".to_string(), reasons::NO_STATUS), ("s2".to_string(), reasons::NO_KEY)]);
    }

    #[test]
    fn duplicate_keys_are_conflicts_and_both_records_are_kept() {
        let profile = Profile::metal_operator();
        let kind = profile.kind("Server").unwrap();
        let mut collector = Collector::new();
        let status = r#"{"state":"Available"}"#;
        for name in ["a", "b", "c"] {
            let uuid = if name == "c" { "other" } else { "SAME" };
            assert!(collector.add(kind, &RawObject::parse(&server(name, uuid, status)).unwrap()).is_some());
        }
        let summary = collector.finish(1);
        assert_eq!(summary.kinds[0].records, 3);
        assert_eq!(summary.conflicts.len(), 1);
        let conflict = &summary.conflicts[0];
        assert_eq!(conflict.key, "spec.systemUUID=same");
        let names: Vec<_> = conflict.objects.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn key_owners_keep_namespace_and_name_apart() {
        let mut owners = Owners::default();
        owners.insert(1, Some("ns-a"), "claim-1");
        owners.insert(2, None, "server-1");
        owners.insert(3, Some("ns-b"), "claim-2");
        assert_eq!(owners.first(1), Some((Some("ns-a".into()), "claim-1".into())));
        assert_eq!(owners.first(2), Some((None, "server-1".into())));
        assert_eq!(owners.first(3), Some((Some("ns-b".into()), "claim-2".into())));
        assert_eq!(owners.first(4), None);
    }

    fn consistency_of(objects: &[(&str, &str)]) -> Consistency {
        let profile = Profile::metal_operator();
        let mut collector = Collector::new();
        for (kind, json) in objects {
            collector.add(profile.kind(kind).unwrap(), &RawObject::parse(json).unwrap());
        }
        collector.finish(2).consistency
    }

    fn reasons(c: &Consistency) -> Vec<String> {
        c.reasons.iter().map(|r| format!("{}: {}", r.object, r.reason)).collect()
    }

    const RESERVED: &str = r#"{"metadata":{"name":"s1"},"spec":{"systemUUID":"u1","serverClaimRef":{"namespace":"a","name":"c1"}},"status":{"state":"Reserved"}}"#;
    const BOUND: &str =
        r#"{"metadata":{"name":"c1","namespace":"a"},"spec":{"serverRef":{"name":"s1"}},"status":{"phase":"Bound"}}"#;

    #[test]
    fn a_paired_fleet_is_consistent() {
        let c = consistency_of(&[("Server", RESERVED), ("ServerClaim", BOUND)]);
        assert!(c.consistent, "{:?}", reasons(&c));
        assert_eq!(c.attempts, 2);
    }

    #[test]
    fn a_capture_that_straddles_a_binding_is_inconsistent() {
        // The claim was listed Bound, the server before it became Reserved.
        let available = r#"{"metadata":{"name":"s1"},"spec":{"systemUUID":"u1"},"status":{"state":"Available"}}"#;
        let c = consistency_of(&[("Server", available), ("ServerClaim", BOUND)]);
        assert!(!c.consistent);
        assert_eq!(reasons(&c), ["ServerClaim a/c1: Bound to Server s1, which is \"Available\", not Reserved"]);
        let binding = r#"{"metadata":{"name":"c1","namespace":"a"},"spec":{"serverRef":{"name":"s1"}},"status":{"phase":"Unbound"}}"#;
        let c = consistency_of(&[("Server", available), ("ServerClaim", binding)]);
        assert_eq!(reasons(&c), ["ServerClaim a/c1: binding: \"Unbound\" with spec.serverRef s1"]);
    }

    #[test]
    fn transitional_and_deleted_objects_and_key_conflicts_are_inconsistent() {
        let discovery = r#"{"metadata":{"name":"s2"},"spec":{"systemUUID":"u2"},"status":{"state":"Discovery"}}"#;
        let deleting = r#"{"metadata":{"name":"b1","deletionTimestamp":"2026-11-30T09:00:00Z"},"spec":{"bmcUUID":"x"},"status":{"state":"Enabled"}}"#;
        let twin = r#"{"metadata":{"name":"s3"},"spec":{"systemUUID":"U2"},"status":{"state":"Available"}}"#;
        let c = consistency_of(&[("BMC", deleting), ("Server", discovery), ("Server", twin)]);
        assert_eq!(
            reasons(&c),
            [
                "BMC b1: being deleted",
                "Server s2: in transitional state \"Discovery\"",
                "Server s2: shares identity key spec.systemUUID=u2",
                "Server s3: shares identity key spec.systemUUID=u2",
            ]
        );
    }

    #[test]
    fn pairing_is_judged_only_when_both_kinds_are_listed() {
        let profile = Profile::metal_operator();
        let mut collector = Collector::new();
        let servers = profile.kind("Server").unwrap();
        collector.begin_kind(servers);
        collector.add(servers, &RawObject::parse(RESERVED).unwrap());
        assert!(collector.finish(1).consistency.consistent, "a Servers-only capture cannot see claims");
        let mut collector = Collector::new();
        collector.add(servers, &RawObject::parse(RESERVED).unwrap());
        collector.begin_kind(profile.kind("ServerClaim").unwrap());
        assert!(!collector.finish(1).consistency.consistent, "both listed: the missing claim counts");
    }

    #[test]
    fn an_unbound_claim_without_server_is_at_rest() {
        let waiting = r#"{"metadata":{"name":"c9","namespace":"a"},"spec":{},"status":{"phase":"Unbound"}}"#;
        assert!(consistency_of(&[("ServerClaim", waiting)]).consistent);
    }
}
