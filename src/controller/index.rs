//! The controller's two indexes, pure: the snapshot in use with its records by (kind, key),
//! and the live objects by uid with who carries which key. An object's neighbourhood is the
//! small planning input that judges it exactly as the one-shot plan would.

use std::collections::{BTreeSet, HashMap};

use crate::Result;
use crate::domain::identity::IdentityKey;
use crate::domain::live::LiveObject;
use crate::format::{Manifest, Records};

/// A loaded snapshot with its records indexed by (kind, key). The statuses stay compressed
/// in the payload until an object is planned.
pub struct SnapshotIndex {
    pub manifest: Manifest,
    pub records: Records,
    by_key: HashMap<(String, IdentityKey), Vec<usize>>,
}

impl SnapshotIndex {
    pub fn new(manifest: Manifest, records: Records) -> Self {
        let mut by_key: HashMap<(String, IdentityKey), Vec<usize>> = HashMap::new();
        for (i, record) in records.heads().iter().enumerate() {
            for key in &record.keys {
                by_key.entry((record.kind.clone(), key.clone())).or_default().push(i);
            }
        }
        SnapshotIndex { manifest, records, by_key }
    }

    /// Where the first record carrying one of the object's keys is in the payload: objects
    /// handled in this order read the payload's frames one after the other.
    pub fn position(&self, object: &LiveObject) -> usize {
        let first = |key: &IdentityKey| self.by_key.get(&(object.kind.clone(), key.clone())).and_then(|r| r.first());
        object.keys.iter().filter_map(first).min().copied().unwrap_or(usize::MAX)
    }
}

/// Live objects by uid, and who carries which key.
#[derive(Default)]
pub struct LiveIndex {
    pub objects: HashMap<String, LiveObject>,
    by_key: HashMap<(String, IdentityKey), BTreeSet<String>>,
}

impl LiveIndex {
    pub fn upsert(&mut self, object: LiveObject) {
        self.remove(&object.uid);
        for key in &object.keys {
            self.by_key.entry((object.kind.clone(), key.clone())).or_default().insert(object.uid.clone());
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
                let slot = (old.kind.clone(), key.clone());
                if let Some(uids) = self.by_key.get_mut(&slot) {
                    uids.remove(uid);
                    if uids.is_empty() {
                        self.by_key.remove(&slot);
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
        let heads = snapshot.records.heads();
        let lookup = |key: &IdentityKey| snapshot.by_key.get(&(object.kind.clone(), key.clone()));
        let mut records: BTreeSet<usize> = object.keys.iter().filter_map(lookup).flatten().copied().collect();
        let primaries: Vec<&IdentityKey> = records.iter().filter_map(|&r| heads[r].primary_key()).collect();
        let rivals: BTreeSet<usize> = primaries.into_iter().filter_map(lookup).flatten().copied().collect();
        records.extend(rivals);
        let mut uids: BTreeSet<&String> = BTreeSet::from([&object.uid]);
        for &r in &records {
            for key in &heads[r].keys {
                if let Some(holders) = self.by_key.get(&(object.kind.clone(), key.clone())) {
                    uids.extend(holders);
                }
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
        assert_eq!(records.heads().iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["r0"]);
        let mut uids: Vec<_> = objects.iter().map(|o| o.uid.as_str()).collect();
        uids.sort();
        assert_eq!(uids, ["a", "b"], "b shares the key and makes the match ambiguous");
    }

    #[test]
    fn upsert_replaces_old_keys_and_remove_forgets_them() {
        let mut index = LiveIndex::default();
        index.upsert(live("a", &["k1"]));
        index.upsert(live("a", &["k2"]));
        assert!(!index.by_key.contains_key(&("Server".to_string(), key("k1"))));
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
