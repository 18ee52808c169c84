//! The journal's bookkeeping, pure: what the chain so far yields per object (a digest of its
//! status, never the JSON), what the watches saw since the last segment, and the next
//! segment's records — only objects whose status differs from what base and chain yield.
//!
//! Memory: one digest per object of the chain, one pending record per object changed since
//! the last segment, the pairing views; bounded by the number of objects, not of changes.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::domain::capture::{self, judge};
use crate::domain::identity::KindProfile;
use crate::domain::object::RawObject;
use crate::domain::pairing::{View, Views};
use crate::format::{Consistency, Inconsistency, ObjectRef, Record, is_tombstone, object_key, tombstone};

/// A status's digest: sha256 over its JSON with object keys sorted (the order the API server
/// or a serialiser writes fields in does not count), and the identity keys.
pub fn status_digest(record: &Record) -> [u8; 16] {
    let mut hasher = Sha256::new();
    match serde_json::from_str::<Value>(record.status.get()) {
        Ok(value) => canonical(&value, &mut hasher),
        Err(_) => hasher.update(record.status.get().as_bytes()),
    }
    for key in &record.keys {
        hasher.update(key.field.as_bytes());
        hasher.update([0]);
        hasher.update(key.value.as_bytes());
        hasher.update([0]);
    }
    let mut out = [0u8; 16];
    out.copy_from_slice(&hasher.finalize()[..16]);
    out
}

fn canonical(value: &Value, hasher: &mut Sha256) {
    match value {
        Value::Object(map) => {
            hasher.update(b"{");
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            for key in keys {
                hasher.update(Value::String(key.clone()).to_string().as_bytes());
                hasher.update(b":");
                canonical(&map[key], hasher);
                hasher.update(b",");
            }
            hasher.update(b"}");
        }
        Value::Array(items) => {
            hasher.update(b"[");
            for item in items {
                canonical(item, hasher);
                hasher.update(b",");
            }
            hasher.update(b"]");
        }
        other => hasher.update(other.to_string().as_bytes()),
    }
}

/// What the chain yields, per object, and what changed since.
#[derive(Debug, Default)]
pub struct JournalState {
    /// Per object ([`object_key`]): the digest of its status at the chain's point.
    chain: HashMap<String, [u8; 16]>,
    /// Per object: its newest record (or tombstone) since the last segment.
    pending: HashMap<String, Record>,
    /// Per group-qualified kind: the objects of the (re-)list in progress.
    listing: HashMap<String, HashSet<String>>,
    /// Kinds listed at least once since the watches (re)started (or that cannot be watched).
    listed: HashSet<String>,
    /// Pairing views and transitional objects of the live fleet, for the verdict.
    views: Views,
    transitional: BTreeMap<String, Inconsistency>,
}

/// The next segment's content.
#[derive(Debug)]
pub struct Cut {
    /// Changed objects and tombstones, by object.
    pub records: Vec<Record>,
    pub changed: u64,
    pub deleted: u64,
    /// Per group-qualified kind, the newest resourceVersion among the records.
    pub resource_versions: BTreeMap<String, String>,
    /// The verdict of the live fleet now.
    pub consistency: Consistency,
}

impl JournalState {
    /// The state of a chain whose point holds `records` (a base's, with its segments applied).
    pub fn at_point<'a>(records: impl IntoIterator<Item = &'a Record>) -> JournalState {
        let mut state = JournalState::default();
        for record in records {
            state.chain.insert(object_key(record), status_digest(record));
        }
        state
    }

    /// Applies a segment's records to the chain's digests (a segment read back, or written).
    pub fn apply(&mut self, records: &[Record]) {
        for record in records {
            let key = object_key(record);
            if is_tombstone(record) {
                self.chain.remove(&key);
            } else {
                self.chain.insert(key, status_digest(record));
            }
        }
    }

    /// Objects the chain yields.
    pub fn objects(&self) -> usize {
        self.chain.len()
    }

    /// Objects changed since the last segment (some may be back to the chain's status).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Forgets the live side (pending changes, listings, views): the watches start again and
    /// list every object, which is diffed against the chain.
    pub fn restart_watches(&mut self) {
        self.pending.clear();
        self.listing.clear();
        self.listed.clear();
        self.views = Views::default();
        self.transitional.clear();
    }

    /// Whether every one of `kinds` has been listed since the watches started: before that a
    /// segment could miss objects gone while the journal was away.
    pub fn all_listed<'a>(&self, kinds: impl IntoIterator<Item = &'a KindProfile>) -> bool {
        kinds.into_iter().all(|k| self.listed.contains(&k.qualified_kind()))
    }

    /// A kind that cannot be watched (not served, forbidden) counts as listed, empty.
    pub fn unavailable(&mut self, kind: &KindProfile) {
        self.listed.insert(kind.qualified_kind());
    }

    /// A (re-)list of `kind` begins.
    pub fn list_started(&mut self, kind: &KindProfile) {
        self.listing.insert(kind.qualified_kind(), HashSet::new());
    }

    /// An object as a watch or a listing delivers it.
    pub fn seen(&mut self, kind: &KindProfile, object: &RawObject<'_>) {
        let reference = ObjectRef {
            kind: kind.kind.clone(),
            namespace: object.meta.namespace.as_ref().map(|n| n.to_string()).filter(|n| !n.is_empty()),
            name: object.meta.name.to_string(),
        };
        let key = key_of(kind, reference.namespace.as_deref(), &reference.name);
        if let Some(listing) = self.listing.get_mut(&kind.qualified_kind()) {
            listing.insert(key.clone());
        }
        if let Some(view) = View::of(kind, object) {
            self.views.add(view);
        }
        match capture::transitional(kind, object) {
            Some(reason) => self.transitional.insert(key.clone(), Inconsistency { object: reference.clone(), reason }),
            None => self.transitional.remove(&key),
        };
        match capture::record(kind, object) {
            Some(record) => self.changed(key, record),
            // No status (or no key): a capture would skip it; gone from the chain's point of view.
            None => self.gone(kind, key, reference.namespace.as_deref(), &reference.name, object_rv(object)),
        }
    }

    /// An object deleted (`resource_version`: the deletion's).
    pub fn deleted(
        &mut self,
        kind: &KindProfile,
        namespace: Option<&str>,
        name: &str,
        resource_version: Option<String>,
    ) {
        let key = key_of(kind, namespace, name);
        self.views.remove(&kind.kind, namespace, name);
        self.transitional.remove(&key);
        self.gone(kind, key, namespace, name, resource_version);
    }

    /// A (re-)list of `kind` is complete: every object of the kind the chain (or a pending
    /// change) holds that the listing did not is gone.
    pub fn list_done(&mut self, kind: &KindProfile) {
        let qualified = kind.qualified_kind();
        let Some(listing) = self.listing.remove(&qualified) else { return };
        let prefix = format!("{qualified}/");
        let missing: Vec<String> = self
            .chain
            .keys()
            .chain(self.pending.keys())
            .filter(|k| k.starts_with(&prefix) && !listing.contains(*k))
            .cloned()
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        for key in missing {
            let (namespace, name) = split_key(&key, &prefix);
            self.deleted(kind, namespace.as_deref(), &name, None);
        }
        self.listed.insert(qualified);
    }

    /// Keeps the record only when it differs from what the chain yields: a listing of an
    /// unchanged fleet holds nothing.
    fn changed(&mut self, key: String, record: Record) {
        if self.chain.get(&key) == Some(&status_digest(&record)) {
            self.pending.remove(&key);
        } else {
            self.pending.insert(key, record);
        }
    }

    fn gone(&mut self, kind: &KindProfile, key: String, namespace: Option<&str>, name: &str, rv: Option<String>) {
        let mut stone = tombstone(&Record {
            api_version: kind.api_version(),
            kind: kind.kind.clone(),
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
            keys: vec![],
            uid: None,
            resource_version: None,
            generation: None,
            creation_timestamp: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            status: (),
        });
        stone.resource_version = rv;
        self.pending.insert(key, stone);
    }

    /// What differs from the chain now: `None` when nothing does (no segment is written). The
    /// pending changes are taken; [`JournalState::written`] applies them to the chain once
    /// the segment is stored, [`JournalState::put_back`] keeps them when it is not.
    pub fn cut(&mut self) -> Option<Cut> {
        let chain = &self.chain;
        self.pending.retain(|key, record| match (is_tombstone(record), chain.get(key)) {
            (true, None) => false,
            (true, Some(_)) => true,
            (false, Some(digest)) => *digest != status_digest(record),
            (false, None) => true,
        });
        if self.pending.is_empty() {
            return None;
        }
        let mut records: Vec<(String, Record)> = self.pending.drain().collect();
        records.sort_by(|a, b| a.0.cmp(&b.0));
        let records: Vec<Record> = records.into_iter().map(|(_, r)| r).collect();
        let deleted = records.iter().filter(|r| is_tombstone(r)).count() as u64;
        let mut resource_versions: BTreeMap<String, String> = BTreeMap::new();
        for record in &records {
            if let Some(rv) = &record.resource_version {
                let newest = resource_versions.entry(record.qualified_kind()).or_insert_with(|| rv.clone());
                if newer(rv, newest) {
                    *newest = rv.clone();
                }
            }
        }
        let transitional = self.transitional.values().cloned().collect();
        let consistency = judge(&self.views, transitional, &[], 1);
        Some(Cut { changed: records.len() as u64 - deleted, deleted, records, resource_versions, consistency })
    }

    /// The cut's segment is stored: the chain now yields its records.
    pub fn written(&mut self, cut: &Cut) {
        self.apply(&cut.records);
    }

    /// The cut's segment was not stored: its records wait for the next one (unless the
    /// watches saw newer changes of the same objects since).
    pub fn put_back(&mut self, cut: Cut) {
        for record in cut.records {
            self.pending.entry(object_key(&record)).or_insert(record);
        }
    }
}

/// Whether resourceVersion `a` is newer than `b`: numerically where both are numbers (etcd's
/// are), else as strings.
fn newer(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a > b,
        _ => a > b,
    }
}

fn object_rv(object: &RawObject<'_>) -> Option<String> {
    object.meta.resource_version.as_ref().map(|rv| rv.to_string())
}

fn key_of(kind: &KindProfile, namespace: Option<&str>, name: &str) -> String {
    format!("{}/{}/{name}", kind.qualified_kind(), namespace.unwrap_or(""))
}

/// The namespace and name of an object key of the kind `prefix` names.
fn split_key(key: &str, prefix: &str) -> (Option<String>, String) {
    let rest = key.strip_prefix(prefix).unwrap_or(key);
    match rest.split_once('/') {
        Some(("", name)) => (None, name.to_string()),
        Some((namespace, name)) => (Some(namespace.to_string()), name.to_string()),
        None => (None, rest.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::identity::Profile;

    fn profile() -> Profile {
        Profile::metal_operator()
    }

    fn server_json(name: &str, status: &str, claim: Option<(&str, &str)>) -> String {
        let claim =
            claim.map_or(String::new(), |(ns, n)| format!(r#","serverClaimRef":{{"namespace":"{ns}","name":"{n}"}}"#));
        format!(
            r#"{{"metadata":{{"name":"{name}","uid":"u-{name}","resourceVersion":"7"}},"spec":{{"systemUUID":"uuid-{name}"{claim}}},"status":{status}}}"#
        )
    }

    fn claim_json(name: &str, phase: &str, server: Option<&str>) -> String {
        let server = server.map_or(String::new(), |s| format!(r#""serverRef":{{"name":"{s}"}}"#));
        format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"9"}},"spec":{{{server}}},"status":{{"phase":"{phase}"}}}}"#
        )
    }

    fn record_of(json: &str, kind: &str) -> Record {
        let profile = profile();
        capture::record(profile.kind(kind).unwrap(), &RawObject::parse(json).unwrap()).unwrap()
    }

    /// A state whose chain holds servers a and b, Available, both listed.
    fn listed_state() -> JournalState {
        let a = record_of(&server_json("a", r#"{"state":"Available","powerState":"Off"}"#, None), "Server");
        let b = record_of(&server_json("b", r#"{"state":"Available"}"#, None), "Server");
        let mut state = JournalState::at_point([&a, &b]);
        let profile = profile();
        let servers = profile.kind("Server").unwrap();
        state.list_started(servers);
        for json in [
            server_json("a", r#"{"powerState":"Off","state":"Available"}"#, None),
            server_json("b", r#"{"state":"Available"}"#, None),
        ] {
            state.seen(servers, &RawObject::parse(&json).unwrap());
        }
        state.list_done(servers);
        state
    }

    #[test]
    fn the_same_status_in_another_field_order_is_no_change() {
        let mut state = listed_state();
        assert!(state.cut().is_none(), "listed as the chain holds them: nothing to write");
        assert_eq!(state.pending(), 0);
    }

    #[test]
    fn a_changed_status_is_cut_once_and_then_is_the_chains() {
        let mut state = listed_state();
        let profile = profile();
        let servers = profile.kind("Server").unwrap();
        let changed = server_json("a", r#"{"state":"Reserved"}"#, None);
        state.seen(servers, &RawObject::parse(&changed).unwrap());
        let cut = state.cut().unwrap();
        assert_eq!((cut.changed, cut.deleted), (1, 0));
        assert_eq!(cut.records[0].status.get(), r#"{"state":"Reserved"}"#);
        assert_eq!(cut.resource_versions.get("Server.metal.ironcore.dev").map(String::as_str), Some("7"));
        state.written(&cut);
        state.seen(servers, &RawObject::parse(&changed).unwrap());
        assert!(state.cut().is_none(), "the same status again: the chain has it");
    }

    #[test]
    fn a_change_undone_before_the_cut_writes_nothing() {
        let mut state = listed_state();
        let profile = profile();
        let servers = profile.kind("Server").unwrap();
        state.seen(servers, &RawObject::parse(&server_json("b", r#"{"state":"Tainted"}"#, None)).unwrap());
        state.seen(servers, &RawObject::parse(&server_json("b", r#"{"state":"Available"}"#, None)).unwrap());
        assert!(state.cut().is_none());
    }

    #[test]
    fn many_changes_of_one_object_keep_one_pending_record() {
        let mut state = listed_state();
        let profile = profile();
        let servers = profile.kind("Server").unwrap();
        for i in 0..1000 {
            state.seen(servers, &RawObject::parse(&server_json("a", &format!(r#"{{"state":"S{i}"}}"#), None)).unwrap());
        }
        assert_eq!(state.pending(), 1, "memory bounded by objects, not changes");
        let cut = state.cut().unwrap();
        assert_eq!(cut.records.len(), 1);
        assert_eq!(cut.records[0].status.get(), r#"{"state":"S999"}"#);
    }

    #[test]
    fn deletions_and_objects_missing_from_a_relist_become_tombstones() {
        let mut state = listed_state();
        let profile = profile();
        let servers = profile.kind("Server").unwrap();
        state.deleted(servers, None, "a", Some("12".into()));
        let cut = state.cut().unwrap();
        assert_eq!((cut.changed, cut.deleted), (0, 1));
        assert!(is_tombstone(&cut.records[0]) && cut.records[0].name == "a");
        assert_eq!(cut.resource_versions["Server.metal.ironcore.dev"], "12");
        state.written(&cut);
        assert_eq!(state.objects(), 1);
        // A re-list (a 410, or a restart) that no longer holds b: b is gone too; a new c appears.
        state.list_started(servers);
        state.seen(servers, &RawObject::parse(&server_json("c", r#"{"state":"Initial"}"#, None)).unwrap());
        state.list_done(servers);
        let cut = state.cut().unwrap();
        let names: Vec<(String, bool)> = cut.records.iter().map(|r| (r.name.clone(), is_tombstone(r))).collect();
        assert_eq!(names, [("b".to_string(), true), ("c".to_string(), false)]);
        assert!(!cut.consistency.consistent, "c is Initial: transitional");
        // A deletion of an object the chain never had writes nothing.
        state.written(&cut);
        state.deleted(servers, None, "zz", None);
        assert!(state.cut().is_none());
    }

    #[test]
    fn a_segment_not_stored_keeps_its_changes_for_the_next() {
        let mut state = listed_state();
        let profile = profile();
        let servers = profile.kind("Server").unwrap();
        state.seen(servers, &RawObject::parse(&server_json("a", r#"{"state":"Reserved"}"#, None)).unwrap());
        let cut = state.cut().unwrap();
        state.put_back(cut);
        let again = state.cut().unwrap();
        assert_eq!(again.records[0].status.get(), r#"{"state":"Reserved"}"#);
        // A newer change seen meanwhile wins over the put-back one.
        state.seen(servers, &RawObject::parse(&server_json("a", r#"{"state":"Tainted"}"#, None)).unwrap());
        state.put_back(again);
        assert_eq!(state.cut().unwrap().records[0].status.get(), r#"{"state":"Tainted"}"#);
    }

    #[test]
    fn the_verdict_is_the_live_fleets_pairing_now() {
        let mut state = listed_state();
        let profile = profile();
        let (servers, claims) = (profile.kind("Server").unwrap(), profile.kind("ServerClaim").unwrap());
        // The claim is Bound before its Server is Reserved: inconsistent at this cut.
        state.seen(claims, &RawObject::parse(&claim_json("c1", "Bound", Some("a"))).unwrap());
        let cut = state.cut().unwrap();
        assert!(!cut.consistency.consistent);
        assert!(cut.consistency.reasons[0].reason.contains("not Reserved"), "{:?}", cut.consistency.reasons);
        state.written(&cut);
        state.seen(
            servers,
            &RawObject::parse(&server_json("a", r#"{"state":"Reserved"}"#, Some(("ns", "c1")))).unwrap(),
        );
        let cut = state.cut().unwrap();
        assert!(cut.consistency.consistent, "{:?}", cut.consistency.reasons);
    }

    #[test]
    fn only_listed_kinds_let_a_segment_be_written() {
        let profile = profile();
        let kinds: Vec<&KindProfile> = profile.kinds.iter().filter(|k| !k.is_denied()).collect();
        let mut state = JournalState::default();
        assert!(!state.all_listed(kinds.iter().copied()));
        for kind in &kinds[..kinds.len() - 1] {
            state.list_started(kind);
            state.list_done(kind);
        }
        assert!(!state.all_listed(kinds.iter().copied()));
        state.unavailable(kinds[kinds.len() - 1]);
        assert!(state.all_listed(kinds.iter().copied()));
        state.restart_watches();
        assert!(!state.all_listed(kinds.iter().copied()));
    }

    #[test]
    fn digests_ignore_field_order_but_not_values_or_keys() {
        let a = record_of(&server_json("a", r#"{"x":{"b":1,"a":[1,2]},"s":"v"}"#, None), "Server");
        let b = record_of(&server_json("a", r#"{"s":"v","x":{"a":[1,2],"b":1}}"#, None), "Server");
        let c = record_of(&server_json("a", r#"{"s":"v","x":{"a":[2,1],"b":1}}"#, None), "Server");
        let d = record_of(&server_json("other", r#"{"x":{"b":1,"a":[1,2]},"s":"v"}"#, None), "Server");
        assert_eq!(status_digest(&a), status_digest(&b));
        assert_ne!(status_digest(&a), status_digest(&c));
        assert_ne!(status_digest(&a), status_digest(&d), "another identity key");
        assert!(newer("10", "9") && !newer("9", "10") && newer("b", "a"));
    }
}
