//! The journal's bookkeeping, pure: what the chain so far yields per object (a digest of its
//! status, never the JSON), what the watches saw since the last segment, and the next
//! segment's records — only objects whose status differs from what base and chain yield.
//!
//! Memory: one digest per object of the chain, one pending record per object changed since
//! the last segment, the pairing views; bounded by the number of objects, not of changes.
//!
//! Lag: per object with a pending change, when the watches delivered its first change that is
//! not in the bucket yet (the time is the caller's: the watch event's arrival). A cut carries
//! those times with its records, so that the lag of each change written is known; the oldest
//! of them is the journal's current lag ([`JournalState::oldest_unwritten`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

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
    /// Per object in `pending`: when its first change not yet in the bucket was observed.
    since: HashMap<String, Instant>,
    /// The oldest of `since`, kept as changes come (`None`: none, or not known since the
    /// oldest one was removed: looked up again when asked).
    oldest: Option<Instant>,
    /// Per group-qualified kind: how far its watch has seen (absent: not since the watches
    /// (re)started). A segment's `to` is never later than the earliest of them.
    watched: HashMap<String, Watched>,
}

/// How far a kind's watch has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// Listed, and watching since: every change up to now is delivered.
    Current,
    /// Up to this time only: its watch broke then (an error, forbidden), or, for a kind the API
    /// server does not serve, the last time it said so.
    Until(jiff::Timestamp),
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
    /// Per record (same order): when its change was first observed.
    pub observed: Vec<Instant>,
}

impl Cut {
    /// The lag of each change of the cut whose segment is in the bucket at `stored`: from its
    /// observation to then.
    pub fn lags(&self, stored: Instant) -> impl Iterator<Item = Duration> + '_ {
        self.observed.iter().map(move |at| stored.saturating_duration_since(*at))
    }
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
        self.watched.clear();
        self.pending.clear();
        self.since.clear();
        self.oldest = None;
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

    /// `kind`'s watch broke `at` (an error, forbidden): it has seen nothing after `at` until it
    /// lists again. A kind not seen since the watches started stays unseen.
    pub fn watch_broken(&mut self, kind: &KindProfile, at: jiff::Timestamp) {
        if let Some(watched) = self.watched.get_mut(&kind.qualified_kind())
            && *watched == Watched::Current
        {
            *watched = Watched::Until(at);
        }
    }

    /// The API server said `at` that it does not serve `kind`: none of its objects exists then.
    pub fn not_served(&mut self, kind: &KindProfile, at: jiff::Timestamp) {
        let watched = self.watched.entry(kind.qualified_kind()).or_insert(Watched::Until(at));
        if let Watched::Until(seen) = watched {
            *seen = (*seen).max(at);
        } else {
            *watched = Watched::Until(at);
        }
    }

    /// How far `kind`'s watch has seen; `None`: nothing since the watches (re)started.
    pub fn watched(&self, kind: &KindProfile) -> Option<Watched> {
        self.watched.get(&kind.qualified_kind()).copied()
    }

    /// The latest time a segment cut `now` may claim to bring a restore to: the earliest time
    /// up to which every one of `kinds` was watched (`now` for those watching now), and the kind
    /// that holds it there. `None` when a kind was not seen at all since the watches started:
    /// then nothing later than the chain's point is known of it.
    pub fn seen_until<'a>(
        &self,
        kinds: impl IntoIterator<Item = &'a KindProfile>,
        now: jiff::Timestamp,
    ) -> (Option<jiff::Timestamp>, Option<String>) {
        let mut until = now;
        let mut held = None;
        for kind in kinds {
            match self.watched(kind) {
                None => return (None, Some(kind.qualified_kind())),
                Some(Watched::Current) => {}
                Some(Watched::Until(at)) if at < until => {
                    until = at;
                    held = Some(kind.qualified_kind());
                }
                Some(Watched::Until(_)) => {}
            }
        }
        (Some(until), held)
    }

    /// A (re-)list of `kind` begins.
    pub fn list_started(&mut self, kind: &KindProfile) {
        self.listing.insert(kind.qualified_kind(), HashSet::new());
    }

    /// An object as a watch or a listing delivers it, now.
    pub fn seen(&mut self, kind: &KindProfile, object: &RawObject<'_>) {
        self.seen_at(kind, object, Instant::now());
    }

    /// An object as a watch or a listing delivers it, the event having arrived `at`.
    pub fn seen_at(&mut self, kind: &KindProfile, object: &RawObject<'_>, at: Instant) {
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
            Some(record) => self.changed(key, record, at),
            // No status (or no key): a capture would skip it; gone from the chain's point of view.
            None => self.gone(kind, key, reference.namespace.as_deref(), &reference.name, object_rv(object), at),
        }
    }

    /// An object deleted (`resource_version`: the deletion's), now.
    pub fn deleted(
        &mut self,
        kind: &KindProfile,
        namespace: Option<&str>,
        name: &str,
        resource_version: Option<String>,
    ) {
        self.deleted_at(kind, namespace, name, resource_version, Instant::now());
    }

    /// An object deleted, the event having arrived `at`.
    pub fn deleted_at(
        &mut self,
        kind: &KindProfile,
        namespace: Option<&str>,
        name: &str,
        resource_version: Option<String>,
        at: Instant,
    ) {
        let key = key_of(kind, namespace, name);
        self.views.remove(&kind.kind, namespace, name);
        self.transitional.remove(&key);
        self.gone(kind, key, namespace, name, resource_version, at);
    }

    /// A (re-)list of `kind` is complete, now.
    pub fn list_done(&mut self, kind: &KindProfile) {
        self.list_done_at(kind, Instant::now());
    }

    /// A (re-)list of `kind` is complete (its end arrived `at`): every object of the kind the
    /// chain (or a pending change) holds that the listing did not is gone.
    pub fn list_done_at(&mut self, kind: &KindProfile, at: Instant) {
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
            self.deleted_at(kind, namespace.as_deref(), &name, None, at);
        }
        self.watched.insert(qualified.clone(), Watched::Current);
        self.listed.insert(qualified);
    }

    /// Keeps the record only when it differs from what the chain yields: a listing of an
    /// unchanged fleet holds nothing.
    fn changed(&mut self, key: String, record: Record, at: Instant) {
        if self.chain.get(&key) == Some(&status_digest(&record)) {
            self.pending.remove(&key);
            self.settled(&key);
        } else {
            self.observed(&key, at);
            self.pending.insert(key, record);
        }
    }

    /// `key` has a change not in the bucket, observed `at` (unless an older one is pending).
    fn observed(&mut self, key: &str, at: Instant) {
        if !self.since.contains_key(key) {
            self.since.insert(key.to_string(), at);
            if self.oldest.is_some_and(|oldest| at < oldest) || self.since.len() == 1 {
                self.oldest = Some(at);
            }
        }
    }

    /// `key` has no change pending any more (written, or back to the chain's status).
    fn settled(&mut self, key: &str) -> Option<Instant> {
        let at = self.since.remove(key)?;
        if self.oldest == Some(at) {
            self.oldest = None;
        }
        Some(at)
    }

    /// When the oldest change not yet in the bucket was observed: `None` when every change
    /// observed is in the bucket (or undone). A cut taken and not yet [`JournalState::written`]
    /// or [`JournalState::put_back`] does not count: the caller holds it.
    pub fn oldest_unwritten(&mut self) -> Option<Instant> {
        if self.oldest.is_none() {
            self.oldest = self.since.values().min().copied();
        }
        self.oldest
    }

    /// The current lag at `now`: the age of the oldest change not yet in the bucket, zero when
    /// there is none.
    pub fn lag(&mut self, now: Instant) -> Duration {
        self.oldest_unwritten().map_or(Duration::ZERO, |at| now.saturating_duration_since(at))
    }

    fn gone(
        &mut self,
        kind: &KindProfile,
        key: String,
        namespace: Option<&str>,
        name: &str,
        rv: Option<String>,
        at: Instant,
    ) {
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
        self.observed(&key, at);
        self.pending.insert(key, stone);
    }

    /// What differs from the chain now: `None` when nothing does (no segment is written). The
    /// pending changes are taken; [`JournalState::written`] applies them to the chain once
    /// the segment is stored, [`JournalState::put_back`] keeps them when it is not.
    pub fn cut(&mut self) -> Option<Cut> {
        let chain = &self.chain;
        let mut undone = Vec::new();
        self.pending.retain(|key, record| {
            let differs = match (is_tombstone(record), chain.get(key)) {
                (true, None) => false,
                (true, Some(_)) => true,
                (false, Some(digest)) => *digest != status_digest(record),
                (false, None) => true,
            };
            if !differs {
                undone.push(key.clone());
            }
            differs
        });
        for key in undone {
            self.settled(&key);
        }
        if self.pending.is_empty() {
            return None;
        }
        let mut records: Vec<(String, Record)> = self.pending.drain().collect();
        records.sort_by(|a, b| a.0.cmp(&b.0));
        let now = Instant::now();
        let observed = records.iter().map(|(key, _)| self.settled(key).unwrap_or(now)).collect();
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
        Some(Cut {
            changed: records.len() as u64 - deleted,
            deleted,
            records,
            resource_versions,
            consistency,
            observed,
        })
    }

    /// The cut's segment is stored: the chain now yields its records.
    pub fn written(&mut self, cut: &Cut) {
        self.apply(&cut.records);
    }

    /// The cut's segment was not stored: its records wait for the next one (unless the
    /// watches saw newer changes of the same objects since).
    pub fn put_back(&mut self, cut: Cut) {
        for (record, at) in cut.records.into_iter().zip(cut.observed) {
            let key = object_key(&record);
            // The change put back is older than any seen since: its time counts.
            self.settled(&key);
            self.observed(&key, at);
            self.pending.entry(key).or_insert(record);
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

    /// The lag bookkeeping, with the times given: the current lag is the age of the oldest change
    /// not in the bucket (0 with none: an idle fleet, a change undone, a listing equal to the
    /// chain); a cut carries each change's first observation, so that its lag is measured when
    /// its segment is stored; a later change of an object already pending keeps the older time;
    /// a segment not stored puts its times back, older than any change seen since.
    #[test]
    fn the_lag_is_the_age_of_the_oldest_change_not_in_the_bucket() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut state = listed_state();
        let profile = profile();
        let servers = profile.kind("Server").unwrap();
        let seen = |state: &mut JournalState, name: &str, status: &str, when: Instant| {
            state.seen_at(servers, &RawObject::parse(&server_json(name, status, None)).unwrap(), when);
        };
        assert_eq!(state.oldest_unwritten(), None, "listed as the chain holds them");
        assert_eq!(state.lag(at(100)), Duration::ZERO);
        // An unchanged object delivered again, and a change undone, leave no lag.
        seen(&mut state, "a", r#"{"state":"Available","powerState":"Off"}"#, at(1));
        seen(&mut state, "b", r#"{"state":"Tainted"}"#, at(2));
        seen(&mut state, "b", r#"{"state":"Available"}"#, at(3));
        assert_eq!(state.lag(at(10)), Duration::ZERO);
        assert!(state.cut().is_none());

        seen(&mut state, "a", r#"{"state":"Reserved"}"#, at(10));
        seen(&mut state, "a", r#"{"state":"Reserved","powerState":"On"}"#, at(12));
        seen(&mut state, "b", r#"{"state":"Tainted"}"#, at(13));
        assert_eq!(state.oldest_unwritten(), Some(at(10)), "a's first change counts, not its second");
        assert_eq!(state.lag(at(15)), Duration::from_secs(5));
        // Cut: the times go with the records.
        let cut = state.cut().unwrap();
        assert_eq!(cut.records.len(), 2);
        assert_eq!(cut.observed, [at(10), at(13)], "per record, in the cut's order");
        assert_eq!(state.oldest_unwritten(), None, "the cut holds them now");
        // Not stored: put back with their times, older than a change of a seen meanwhile.
        seen(&mut state, "a", r#"{"state":"Tainted"}"#, at(20));
        state.put_back(cut);
        assert_eq!(state.oldest_unwritten(), Some(at(10)));
        let cut = state.cut().unwrap();
        assert_eq!(cut.observed, [at(10), at(13)]);
        let lags: Vec<Duration> = cut.lags(at(21)).collect();
        assert_eq!(lags, [Duration::from_secs(11), Duration::from_secs(8)]);
        state.written(&cut);
        assert_eq!(state.lag(at(30)), Duration::ZERO, "everything in the bucket");

        // A deletion and an object missing from a re-list count from their events too; a
        // deletion of an object the chain never had counts until the cut drops it.
        state.deleted_at(servers, None, "a", Some("20".into()), at(40));
        state.deleted_at(servers, None, "zz", None, at(35));
        assert_eq!(state.oldest_unwritten(), Some(at(35)));
        state.list_started(servers);
        state.list_done_at(servers, at(45));
        let cut = state.cut().unwrap();
        assert_eq!(cut.records.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(cut.observed, [at(40), at(45)]);
        state.written(&cut);
        assert_eq!(state.oldest_unwritten(), None, "zz dropped by the cut");
        // Watches restarted: nothing pending, no lag.
        seen(&mut state, "c", r#"{"state":"Available"}"#, at(50));
        assert_eq!(state.oldest_unwritten(), Some(at(50)));
        state.restart_watches();
        assert_eq!(state.lag(at(60)), Duration::ZERO);
    }

    /// F134: how far a segment may claim to bring a restore: the earliest time every kind's
    /// watch has seen. Not seen since the watches started: nothing (the chain's point); listed
    /// and watching: now; broken (an error, forbidden): the moment it broke, whatever comes
    /// after, until it lists again; not served: the last time the API server said so.
    #[test]
    fn a_segment_claims_no_time_after_what_every_kind_has_seen() {
        let profile = profile();
        let (servers, claims) = (profile.kind("Server").unwrap(), profile.kind("ServerClaim").unwrap());
        let kinds = [servers, claims];
        let t = |s: &str| crate::fixtures::ts(s);
        let now = t("2026-11-30T10:00:00Z");
        let mut state = JournalState::default();
        state.list_started(servers);
        state.list_done(servers);
        assert_eq!(state.seen_until(kinds, now), (None, Some(claims.qualified_kind())), "claims never seen");
        state.list_started(claims);
        state.list_done(claims);
        assert_eq!(state.seen_until(kinds, now), (Some(now), None));
        // The claims' watch breaks (forbidden at a restart of its watch): held at that time,
        // later errors do not move it.
        state.watch_broken(claims, t("2026-11-30T09:58:00Z"));
        state.watch_broken(claims, t("2026-11-30T09:59:00Z"));
        let held = (Some(t("2026-11-30T09:58:00Z")), Some(claims.qualified_kind()));
        assert_eq!(state.seen_until(kinds, now), held);
        assert_eq!(state.seen_until(kinds, t("2026-11-30T11:00:00Z")), held, "an hour later, still");
        // Listed again: watching, now.
        state.list_started(claims);
        state.list_done(claims);
        assert_eq!(state.seen_until(kinds, now), (Some(now), None));
        // Not served: seen empty each time the API server says so.
        state.not_served(claims, t("2026-11-30T09:59:30Z"));
        state.not_served(claims, t("2026-11-30T09:59:50Z"));
        assert_eq!(state.seen_until(kinds, now), (Some(t("2026-11-30T09:59:50Z")), Some(claims.qualified_kind())));
        // A kind that broke before it was ever seen stays unseen.
        let mut fresh = JournalState::default();
        fresh.watch_broken(servers, now);
        assert_eq!(fresh.watched(servers), None);
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
