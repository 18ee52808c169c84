//! The controller's two indexes, pure: the snapshot in use with its records by key digest,
//! and the live objects by uid with who carries which key. An object's neighbourhood is the
//! small planning input that judges it exactly as the one-shot plan would. Both indexes hold
//! digests of keys (see [`KeyDigest`]), not the keys: planning compares the keys themselves.

use std::collections::{BTreeSet, HashMap};

use crate::Result;
use crate::domain::identity::KeyDigest;
use crate::domain::live::LiveObject;
use crate::format::{Manifest, Records};
use crate::restore::apply::SystemServers;

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

    /// Where the first record carrying one of the object's keys is in the payload: objects
    /// handled in this order read the payload's frames one after the other.
    pub fn position(&self, object: &LiveObject) -> usize {
        let first = |d: KeyDigest| self.with_key(d).next();
        object.keys.iter().filter_map(|k| first(k.digest(&object.kind))).min().unwrap_or(usize::MAX)
    }
}

/// Live objects by uid, and who carries which key.
#[derive(Default)]
pub struct LiveIndex {
    pub objects: HashMap<String, LiveObject>,
    by_key: HashMap<KeyDigest, Vec<String>>,
}

impl LiveIndex {
    pub fn upsert(&mut self, object: LiveObject) {
        self.remove(&object.uid);
        for key in &object.keys {
            self.by_key.entry(key.digest(&object.kind)).or_default().push(object.uid.clone());
        }
        self.objects.insert(object.uid.clone(), object);
    }

    /// BMCs and Servers that still carry restatus's `ignore`: restored, maybe waiting for
    /// their Servers or claim.
    pub fn held(&self) -> impl Iterator<Item = &String> {
        let waits = |o: &&LiveObject| matches!(o.kind.as_str(), "BMC" | "Server") && o.quiesced_by_restatus();
        self.objects.values().filter(waits).map(|o| &o.uid)
    }

    /// The uids of the live objects of `kind`.
    pub fn uids_of(&self, kind: &str) -> Vec<String> {
        self.objects.values().filter(|o| o.kind == kind).map(|o| o.uid.clone()).collect()
    }

    pub fn remove(&mut self, uid: &str) {
        if let Some(old) = self.objects.remove(uid) {
            for key in &old.keys {
                let digest = key.digest(&old.kind);
                if let Some(uids) = self.by_key.get_mut(&digest) {
                    uids.retain(|u| u != uid);
                    if uids.is_empty() {
                        self.by_key.remove(&digest);
                    }
                }
            }
        }
    }

    /// The planning input for one object: its candidate records, every record sharing their
    /// primary keys, and every live object sharing any of those records' keys. `None` for an
    /// object the index does not hold.
    pub fn neighbourhood(&self, uid: &str, snapshot: &SnapshotIndex) -> Option<Result<(Records, Vec<LiveObject>)>> {
        let object = self.objects.get(uid)?;
        let digests = object.keys.iter().map(|k| k.digest(&object.kind));
        let mut records: BTreeSet<usize> = digests.flat_map(|d| snapshot.with_key(d)).collect();
        let primaries: Vec<KeyDigest> =
            records.iter().filter_map(|&r| snapshot.records.key_digests(r).first().copied()).collect();
        records.extend(primaries.into_iter().flat_map(|d| snapshot.with_key(d)));
        let mut uids: BTreeSet<&String> = BTreeSet::from([&object.uid]);
        for &r in &records {
            for digest in snapshot.records.key_digests(r) {
                uids.extend(self.by_key.get(digest).into_iter().flatten());
            }
        }
        let live = uids.into_iter().filter_map(|u| self.objects.get(u).cloned()).collect();
        let records = records.into_iter().map(|r| snapshot.records.record(r)).collect::<Result<Vec<_>>>();
        Some(records.map(|records| (Records::from_records(records), live)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::identity::{IdentityKey, Profile};
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
