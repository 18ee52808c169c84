//! The controller's two indexes, pure: the snapshot in use with its records by key digest,
//! and the live objects by uid with who carries which key. An object's neighbourhood is the
//! small planning input that judges it exactly as the one-shot plan would. Both indexes hold
//! digests of keys (see [`KeyDigest`]), not the keys: planning compares the keys themselves.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use jiff::Timestamp;

use crate::Result;
use crate::domain::annotations;
use crate::domain::live::{LiveObject, LiveStatus};
use crate::domain::pairing::SystemServers;
use crate::format::{IdentityKey, KeyDigest, Manifest, Names, Records};

/// A loaded snapshot with its records indexed by key digest. The records stay compressed in
/// the payload until an object is planned.
pub struct SnapshotIndex {
    pub manifest: Manifest,
    pub records: Records,
    /// (digest of a record's key, record), sorted.
    by_key: Vec<(KeyDigest, u32)>,
    /// Read when a BMC first needs them.
    pub system_servers: SystemServers,
}

impl SnapshotIndex {
    pub fn new(manifest: Manifest, records: Records) -> Self {
        let mut by_key: Vec<(KeyDigest, u32)> = Vec::with_capacity(records.len());
        for r in 0..records.len() {
            by_key.extend(records.key_digests(r).iter().map(|&d| (d, r as u32)));
        }
        by_key.sort_unstable();
        SnapshotIndex { manifest, records, by_key, system_servers: SystemServers::default() }
    }

    /// The records carrying a key of this digest, in payload order.
    fn with_key(&self, digest: KeyDigest) -> impl Iterator<Item = usize> + '_ {
        let start = self.by_key.partition_point(|(d, _)| *d < digest);
        self.by_key[start..].iter().take_while(move |(d, _)| *d == digest).map(|(_, r)| *r as usize)
    }

    /// Where the first record carrying one of these key digests is in the payload: objects
    /// handled in this order read the payload's frames one after the other.
    pub fn position(&self, digests: impl Iterator<Item = KeyDigest>) -> usize {
        digests.filter_map(|d| self.with_key(d).next()).min().unwrap_or(usize::MAX)
    }
}

/// A live object's uid, shared by the index, its key lists and the main loop's queues.
pub type Uid = Arc<str>;

/// Live objects by uid, and who carries which key. An object is kept compact (see
/// [`Entry`]) and made a [`LiveObject`] again only to be planned: a few hundred bytes an
/// object, for the tens of thousands a management cluster holds.
#[derive(Default)]
pub struct LiveIndex {
    objects: HashMap<Uid, Box<Entry>>,
    by_key: HashMap<KeyDigest, Vec<Uid>>,
    /// Kinds and key fields, interned: entries hold their index.
    kinds: Names,
    fields: Names,
}

/// A [`LiveObject`] as the index keeps it: kind and key fields interned, strings boxed, the
/// status as digests (it is compacted).
struct Entry {
    kind: u32,
    namespace: Option<Box<str>>,
    name: Box<str>,
    resource_version: Box<str>,
    /// (key field, value).
    keys: Box<[(u32, Box<str>)]>,
    status: Option<LiveStatus>,
    annotations: BTreeMap<String, String>,
    status_written_at: Option<Timestamp>,
}

impl LiveIndex {
    /// Adds or replaces an object; returns its uid as the index shares it.
    pub fn upsert(&mut self, object: LiveObject) -> Uid {
        self.remove(&object.uid);
        let uid: Uid = object.uid.into();
        let kind = self.kinds.intern(&object.kind);
        let keys: Box<[(u32, Box<str>)]> =
            object.keys.into_iter().map(|k| (self.fields.intern(&k.field), k.value.into_boxed_str())).collect();
        let entry = Entry {
            kind,
            namespace: object.namespace.map(String::into_boxed_str),
            name: object.name.into_boxed_str(),
            resource_version: object.resource_version.into_boxed_str(),
            keys,
            status: object.status.map(LiveStatus::compact),
            annotations: object.annotations,
            status_written_at: object.status_written_at,
        };
        let digests: Vec<KeyDigest> = self.digests(&entry).collect();
        for digest in digests {
            self.by_key.entry(digest).or_default().push(uid.clone());
        }
        self.objects.insert(uid.clone(), Box::new(entry));
        uid
    }

    pub fn remove(&mut self, uid: &str) {
        let Some(old) = self.objects.remove(uid) else { return };
        let digests: Vec<KeyDigest> = self.digests(&old).collect();
        for digest in digests {
            if let Some(uids) = self.by_key.get_mut(&digest) {
                uids.retain(|u| &**u != uid);
                if uids.is_empty() {
                    self.by_key.remove(&digest);
                }
            }
        }
    }

    /// The other live objects that carry one of the object's keys.
    pub fn sharing_keys(&self, uid: &str) -> Vec<Uid> {
        let Some(entry) = self.objects.get(uid) else { return vec![] };
        let mut uids: Vec<Uid> =
            self.digests(entry).flat_map(|d| self.by_key.get(&d).into_iter().flatten()).cloned().collect();
        uids.retain(|u| &**u != uid);
        uids.sort();
        uids.dedup();
        uids
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.objects.contains_key(uid)
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Every object's uid.
    pub fn uids(&self) -> impl Iterator<Item = &Uid> {
        self.objects.keys()
    }

    /// The index's own handle of a uid.
    pub fn uid(&self, uid: &str) -> Option<Uid> {
        self.objects.get_key_value(uid).map(|(uid, _)| uid.clone())
    }

    /// The object's kind.
    pub fn kind_of(&self, uid: &str) -> Option<&str> {
        self.objects.get(uid).map(|e| self.kinds.get(e.kind))
    }

    /// Objects of the kinds `waits` names that still carry restatus's `ignore`: restored,
    /// maybe waiting for a partner (see `restore::hold::Wake`).
    pub fn held(&self, waits: impl Fn(&str) -> bool) -> impl Iterator<Item = &Uid> {
        let held = move |e: &Entry| waits(self.kinds.get(e.kind)) && quiesced(e);
        self.objects.iter().filter(move |(_, e)| held(e)).map(|(uid, _)| uid)
    }

    /// The index holds `object` (by uid) with another status, or none.
    pub fn status_changed(&self, object: &LiveObject) -> bool {
        let Some(entry) = self.objects.get(object.uid.as_str()) else { return false };
        match (&entry.status, &object.status) {
            (None, None) => false,
            (Some(old), Some(new)) => !old.same_as(new),
            _ => true,
        }
    }

    /// Objects that carry restatus's `ignore`.
    pub fn quiesced(&self) -> usize {
        self.objects.values().filter(|e| quiesced(e)).count()
    }

    /// The uids of the live objects of `kind`.
    pub fn uids_of(&self, kind: &str) -> Vec<String> {
        let Some(kind) = self.kinds.find(kind) else { return vec![] };
        self.objects.iter().filter(|(_, e)| e.kind == kind).map(|(uid, _)| uid.to_string()).collect()
    }

    /// The object as planning reads it.
    pub fn get(&self, uid: &str) -> Option<LiveObject> {
        let (uid, e) = self.objects.get_key_value(uid)?;
        let kind = self.kinds.get(e.kind).to_string();
        let keys =
            e.keys.iter().map(|(f, v)| IdentityKey { field: self.fields.get(*f).to_string(), value: v.to_string() });
        Some(LiveObject {
            kind,
            namespace: e.namespace.as_deref().map(str::to_string),
            name: e.name.to_string(),
            uid: uid.to_string(),
            resource_version: e.resource_version.to_string(),
            keys: keys.collect(),
            status: e.status.clone(),
            annotations: e.annotations.clone(),
            status_written_at: e.status_written_at,
        })
    }

    /// The live objects of `kind` carrying one of `keys`, each once.
    pub fn carrying<'k>(&self, kind: &str, keys: impl IntoIterator<Item = &'k IdentityKey>) -> Vec<LiveObject> {
        let mut uids: BTreeSet<&Uid> = BTreeSet::new();
        for key in keys {
            uids.extend(self.by_key.get(&key.digest(kind)).into_iter().flatten());
        }
        let objects = uids.into_iter().filter_map(|u| self.get(u));
        // A digest is a candidate; the key itself confirms it.
        objects.filter(|o| o.kind == kind).collect()
    }

    /// Where the first record carrying one of the object's keys is in the payload (see
    /// [`SnapshotIndex::position`]).
    pub fn position(&self, uid: &str, snapshot: &SnapshotIndex) -> usize {
        self.objects.get(uid).map_or(usize::MAX, |e| snapshot.position(self.digests(e)))
    }

    /// The digests of an entry's keys.
    fn digests<'a>(&'a self, e: &'a Entry) -> impl Iterator<Item = KeyDigest> + 'a {
        let kind = self.kinds.get(e.kind);
        e.keys.iter().map(move |(f, v)| IdentityKey::digest_of(kind, self.fields.get(*f), v))
    }

    /// The planning input for one object: its candidate records, every record sharing their
    /// primary keys, and every live object sharing any of those records' keys. `None` for an
    /// object the index does not hold.
    pub fn neighbourhood(&self, uid: &str, snapshot: &SnapshotIndex) -> Option<Result<(Records, Vec<LiveObject>)>> {
        let (uid, entry) = self.objects.get_key_value(uid)?;
        let mut records: BTreeSet<usize> = self.digests(entry).flat_map(|d| snapshot.with_key(d)).collect();
        let primaries: Vec<KeyDigest> =
            records.iter().filter_map(|&r| snapshot.records.key_digests(r).first().copied()).collect();
        records.extend(primaries.into_iter().flat_map(|d| snapshot.with_key(d)));
        let mut uids: BTreeSet<&Uid> = BTreeSet::from([uid]);
        for &r in &records {
            for digest in snapshot.records.key_digests(r) {
                uids.extend(self.by_key.get(digest).into_iter().flatten());
            }
        }
        let live = uids.into_iter().filter_map(|u| self.get(u)).collect();
        let records = records.into_iter().map(|r| snapshot.records.record(r)).collect::<Result<Vec<_>>>();
        Some(records.map(|records| (Records::from_records(records), live)))
    }
}

fn quiesced(e: &Entry) -> bool {
    annotations::quiesced_by_restatus(&e.annotations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::identity::Profile;
    use crate::fixtures::{self, SNAPSHOT_TIME, record, ts, uuid as key};
    use crate::restore::plan::{self, PlanInput, Verdict};
    use serde_json::json;

    fn live(uid: &str, keys: &[&str]) -> LiveObject {
        let keys: Vec<IdentityKey> = keys.iter().map(|k| key(k)).collect();
        LiveObject { name: format!("n-{uid}"), ..fixtures::live("Server", uid, &keys, None) }
    }

    fn snapshot(keys: &[&str]) -> SnapshotIndex {
        let records: Vec<_> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| record("Server", &format!("r{i}"), &[key(k)], json!({"state": "Reserved"})))
            .collect();
        let at = ts(SNAPSHOT_TIME);
        SnapshotIndex::new(fixtures::manifest(crate::format::SnapshotId::new(at), at), Records::from_records(records))
    }

    #[test]
    fn the_neighbourhood_holds_the_object_its_records_and_key_rivals() {
        let mut index = LiveIndex::default();
        index.upsert(live("a", &["k1"]));
        index.upsert(live("b", &["k1"]));
        index.upsert(live("c", &["k2"]));
        let snap = snapshot(&["k1", "k2", "k3"]);
        let (records, objects) = index.neighbourhood("a", &snap).unwrap().unwrap();
        let names: Vec<String> = records.heads().map(|h| h.unwrap().1.name).collect();
        assert_eq!(names, ["r0"]);
        let mut uids: Vec<_> = objects.iter().map(|o| o.uid.as_str()).collect();
        uids.sort();
        assert_eq!(uids, ["a", "b"], "b shares the key and makes the match ambiguous");
    }

    #[test]
    fn an_indexed_object_comes_back_as_it_went_in_without_its_status_json() {
        let mut object = fixtures::live("ServerClaim", "c", &[key("k1"), key("k2")], Some(json!({"phase": "Bound"})));
        object.namespace = Some("ns".into());
        object.annotations.insert("metal.ironcore.dev/operation".into(), "ignore".into());
        object.status_written_at = Some(ts(SNAPSHOT_TIME));
        let mut index = LiveIndex::default();
        index.upsert(fixtures::live("Server", "s", &[key("k3")], None));
        let uid = index.upsert(object.clone());
        assert_eq!(&*uid, "c");
        assert_eq!(index.kind_of("c"), Some("ServerClaim"));
        assert_eq!(format!("{:?}", index.get("c").unwrap()), format!("{:?}", object.compact()));
        assert_eq!(index.uids_of("ServerClaim"), ["c"]);
        assert_eq!(index.len(), 2);
    }

    #[test]
    fn upsert_replaces_old_keys_and_remove_forgets_them() {
        let mut index = LiveIndex::default();
        index.upsert(live("a", &["k1"]));
        index.upsert(live("a", &["k2"]));
        assert!(!index.by_key.contains_key(&key("k1").digest("Server")));
        assert!(index.by_key.contains_key(&key("k2").digest("Server")));
        index.remove("a");
        assert!(index.by_key.is_empty() && index.objects.is_empty());
    }

    #[test]
    fn one_object_plans_like_the_whole_fleet() {
        let mut index = LiveIndex::default();
        for (uid, k) in [("a", "k1"), ("b", "k1"), ("c", "k2")] {
            index.upsert(live(uid, &[k]));
        }
        let snap = snapshot(&["k1", "k2"]);
        let profile = Profile::metal_operator();
        let verdict_of = |uid: &str| {
            let (records, objects) = index.neighbourhood(uid, &snap).unwrap().unwrap();
            let input = PlanInput {
                profile: &profile,
                snapshot: &snap.manifest.snapshot_id,
                snapshot_time: Some(snap.manifest.created_at),
                records: &records,
                live: &objects,
                force: false,
                explain: false,
            };
            plan::plan(&input)
                .unwrap()
                .items
                .into_iter()
                .find(|i| {
                    i.target.as_ref().is_some_and(|t| t.name == format!("n-{uid}")) || i.verdict == Verdict::Ambiguous
                })
                .map(|i| i.verdict)
        };
        assert_eq!(verdict_of("a"), Some(Verdict::Ambiguous));
        assert_eq!(verdict_of("c"), Some(Verdict::Restore));
    }
}
