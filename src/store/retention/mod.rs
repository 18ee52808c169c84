//! Retention on the store: each snapshot folder read ([`entries`]: the listing, and each
//! complete one's manifest with its signature checked when keys are given), then the pure
//! decisions of [`plan`] (the rules are there) carried out ([`apply`]). `snapshots delete`
//! removes one snapshot by hand ([`delete_one`]), the same way, and without `force` refuses
//! what retention would never delete ([`protected`]).

pub mod plan;

use jiff::Timestamp;
use tracing::info;

pub use plan::{Deletion, Entry, INCOMPLETE_GRACE, RetentionPlan, RetentionPolicy, Signature, plan, protected};

use super::snapshots::{SnapshotEntry, SnapshotStore};
use crate::Result;
use crate::format::{Manifest, SnapshotId, TrustedKeys, is_ahead_of};

/// Each listed folder as retention sees it: a complete one's manifest read and, with
/// `trusted` keys, its signature checked (one that does not verify or cannot be read is
/// [`Signature::Refused`]); without keys whether its manifest says it is signed. A store
/// error other than a missing object fails the whole read: nothing is judged on a guess.
pub async fn entries(
    store: &SnapshotStore,
    listed: &[SnapshotEntry],
    trusted: Option<&TrustedKeys>,
) -> Result<Vec<Entry>> {
    let mut out = Vec::with_capacity(listed.len());
    for e in listed {
        let mut entry = Entry {
            id: e.id.clone(),
            complete: e.complete,
            last_modified: e.last_modified,
            signature: if trusted.is_some() { Signature::Refused } else { Signature::Unchecked },
            drop_from: None,
        };
        if e.complete {
            match store.verified_manifest(&e.id, trusted).await {
                Ok((manifest, _)) => {
                    entry.signature = match (trusted, &manifest.signed_by) {
                        (Some(_), _) => Signature::Verified,
                        (None, Some(_)) => Signature::Claimed,
                        (None, None) => Signature::Unchecked,
                    };
                    entry.drop_from = manifest.record_drop.map(|d| d.previous);
                }
                Err(err @ crate::Error::Store { .. }) => return Err(err),
                Err(_) => {}
            }
        }
        out.push(entry);
    }
    Ok(out)
}

/// The newest complete snapshot that is consistent and verifies end to end (records are
/// checked and dropped, not kept), its signature by one of `trusted` included when keys are
/// given: a forged snapshot written after it never makes retention delete the real one. An
/// encrypted snapshot the store has no key for is verified as stored (size and sha256 of the
/// ciphertext).
pub async fn newest_restorable(
    store: &SnapshotStore,
    entries: &[SnapshotEntry],
    trusted: Option<&TrustedKeys>,
) -> Result<Option<SnapshotId>> {
    for entry in entries.iter().rev().filter(|e| e.complete) {
        let manifest = match store.verified_manifest(&entry.id, trusted).await {
            Ok((manifest, _)) if manifest.is_consistent() => manifest,
            Ok(_) => continue,
            Err(e @ crate::Error::Store { .. }) => return Err(e),
            Err(_) => continue,
        };
        // An encrypted snapshot, where no key decrypts it (a backup's retention): its stored
        // bytes are checked against the manifest, which is as far as a writer can see.
        if manifest.encryption.is_some() && !store.decrypts() {
            match store.verify_stored_payload(&manifest).await {
                Ok(()) => return Ok(Some(entry.id.clone())),
                Err(e @ crate::Error::Store { .. }) => return Err(e),
                Err(_) => continue,
            }
        }
        match store.load_verified(&entry.id, trusted, |_| Ok(())).await {
            Ok(_) => return Ok(Some(entry.id.clone())),
            Err(e @ crate::Error::Store { .. }) => return Err(e),
            Err(_) => continue,
        }
    }
    Ok(None)
}

/// How many manifests [`drop_baseline`] reads at most, newest first, looking for one that
/// verifies (junk written after the last good snapshot is passed over up to this many).
const BASELINE_LOOKS: usize = 20;

/// The snapshot a new capture's record count is compared with: the newest complete one that
/// verifies (with `trusted` keys, signed by one of them), or, while the drop that one marks
/// is not acknowledged (the snapshot before the drop is still there: nobody deleted it), that
/// snapshot before the drop, so that every capture after an accident stays marked and the
/// alert goes on until a person decides.
pub async fn drop_baseline(store: &SnapshotStore, trusted: Option<&TrustedKeys>) -> Result<Option<Manifest>> {
    let listed = store.list().await?;
    let now = Timestamp::now();
    let newest = listed.iter().rev().filter(|e| e.complete && !e.id.timestamp().is_some_and(|t| is_ahead_of(t, now)));
    for entry in newest.take(BASELINE_LOOKS) {
        let manifest = match store.verified_manifest(&entry.id, trusted).await {
            Ok((manifest, _)) => manifest,
            Err(e @ crate::Error::Store { .. }) => return Err(e),
            Err(_) => continue,
        };
        let Some(drop) = &manifest.record_drop else { return Ok(Some(manifest)) };
        if listed.iter().any(|e| e.id == drop.previous && e.complete) {
            match store.verified_manifest(&drop.previous, trusted).await {
                Ok((previous, _)) => return Ok(Some(previous)),
                Err(e @ crate::Error::Store { .. }) => return Err(e),
                Err(_) => {}
            }
        }
        return Ok(Some(manifest));
    }
    Ok(None)
}

/// Lists and plans (nothing deleted); `trusted`: see [`newest_restorable`].
pub async fn plan_for(
    store: &SnapshotStore,
    policy: RetentionPolicy,
    trusted: Option<&TrustedKeys>,
) -> Result<RetentionPlan> {
    let listed = store.list().await?;
    let entries = entries(store, &listed, trusted).await?;
    let restorable = newest_restorable(store, &listed, trusted).await?;
    Ok(plan(&entries, policy, Timestamp::now(), restorable.as_ref()))
}

/// Lists, plans and deletes. Returns the plan carried out.
pub async fn apply(
    store: &SnapshotStore,
    policy: RetentionPolicy,
    trusted: Option<&TrustedKeys>,
) -> Result<RetentionPlan> {
    let plan = plan_for(store, policy, trusted).await?;
    for deletion in &plan.deletions {
        store.delete(&deletion.id).await?;
        info!(snapshot = %deletion.id, reason = %deletion.reason, "snapshot deleted by retention");
    }
    for kept in &plan.kept {
        info!(snapshot = %kept.id, reason = %kept.reason, "snapshot kept by retention");
    }
    Ok(plan)
}

/// What [`delete_one`] removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deleted {
    pub id: SnapshotId,
    /// It had a manifest.
    pub complete: bool,
    /// The objects removed: file name and size.
    pub files: Vec<(String, u64)>,
}

/// Deletes one snapshot whole (manifest first, then signature and payload, as retention does).
/// Refused, naming the snapshot: an id with no object under this cluster, and without `force`
/// what [`protected`] protects (`trusted`: see [`newest_restorable`]).
pub async fn delete_one(
    store: &SnapshotStore,
    id: &SnapshotId,
    trusted: Option<&TrustedKeys>,
    force: bool,
) -> Result<Deleted> {
    let refused = |reason: String| crate::Error::NotDeleted { snapshot: id.to_string(), reason };
    let listed = store.list().await?;
    let Some(at) = listed.iter().position(|e| e.id == *id) else {
        let reason = format!("no such snapshot in {} (`snapshots list` shows the ids)", store.snapshot_url(id));
        return Err(refused(reason));
    };
    if !force {
        let now = Timestamp::now();
        let entries = entries(store, &listed, trusted).await?;
        // One entry for each listed folder, in the listing's order.
        let entry = &entries[at];
        // The cheap checks first; the newest restorable one is read (its payload verified) only
        // when they pass.
        let mut reason = protected(&entries, entry, None, trusted.is_some(), now);
        if reason.is_none() && entry.complete {
            let restorable = newest_restorable(store, &listed, trusted).await?;
            reason = protected(&entries, entry, restorable.as_ref(), trusted.is_some(), now);
        }
        if let Some(reason) = reason {
            return Err(refused(format!("{reason}; --force deletes it anyway")));
        }
    }
    let files = store.files(id).await?;
    store.delete(id).await?;
    let left = store.files(id).await?;
    if !left.is_empty() {
        let names: Vec<&str> = left.iter().map(|(name, _)| name.as_str()).collect();
        return Err(refused(format!("objects left behind that are not a snapshot's: {}", names.join(", "))));
    }
    info!(snapshot = %id, force, "snapshot deleted");
    Ok(Deleted { id: id.clone(), complete: listed[at].complete, files })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Segments are kept with their base and removed with it: retention deleting an old
    /// snapshot takes its journal along, and leaves the newer snapshot's alone; a bucket with
    /// segments lists the same snapshots.
    #[tokio::test]
    async fn retention_removes_a_bases_segments_with_it() {
        use crate::fixtures::{append_segment, record, uuid, write_snapshot};
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let server = |state: &str| record("Server", "s", &[uuid("s")], serde_json::json!({"state": state}));
        let old = write_snapshot(&store, "2026-11-30T08:00:00Z", &[server("a")], true).await;
        let new = write_snapshot(&store, "2026-11-30T09:00:00Z", &[server("b")], true).await;
        append_segment(&store, &old, &[server("c")], 5, true).await;
        append_segment(&store, &new, &[server("d")], 5, true).await;
        let listed: Vec<SnapshotId> = store.list().await.unwrap().into_iter().map(|e| e.id).collect();
        assert_eq!(listed, [old.snapshot_id.clone(), new.snapshot_id.clone()], "segments are not snapshots");
        let plan = apply(&store, RetentionPolicy { keep_last: Some(1), max_age: None }, None).await.unwrap();
        let deleted: Vec<SnapshotId> = plan.deletions.iter().map(|d| d.id.clone()).collect();
        assert_eq!(deleted, std::slice::from_ref(&old.snapshot_id));
        assert!(store.files(&old.snapshot_id).await.unwrap().is_empty(), "the old base's journal went with it");
        assert_eq!(store.list_segments(&new.snapshot_id).await.unwrap().len(), 1, "the new base's journal stays");
    }

    /// F161 (issue 38, item 8): what a capture is compared with: the newest snapshot that
    /// verifies (a newer forgery is passed over with keys), or while the drop it marks is not
    /// acknowledged the snapshot before the drop; once a person deleted that one, the newest.
    /// With a policy, retention keeps the snapshot before the drop and deletes the rest.
    #[tokio::test]
    async fn a_capture_is_compared_with_the_snapshot_before_an_unacknowledged_drop() {
        use crate::fixtures::{record, snapshot, ts, uuid};
        use crate::format::SigningKey;
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let key = SigningKey::generate();
        let trusted = TrustedKeys::new([key.public_key()]);
        let fleet: Vec<_> = (0..4)
            .map(|i| record("Server", &format!("s{i}"), &[uuid(&format!("u{i}"))], serde_json::json!({})))
            .collect();
        let baseline = |keys: bool| {
            let (store, trusted) = (store.clone(), trusted.clone());
            async move { drop_baseline(&store, keys.then_some(&trusted)).await.unwrap().map(|m| m.snapshot_id) }
        };
        assert_eq!(baseline(true).await, None, "an empty bucket");
        let good = snapshot(&fleet).at(ts("2026-11-30T08:00:00Z")).signed_with(&key).write(&store).await;
        assert_eq!(baseline(true).await, Some(good.snapshot_id.clone()));
        let first =
            snapshot(&[]).at(ts("2026-11-30T08:30:00Z")).signed_with(&key).dropped_from(&good).write(&store).await;
        let second =
            snapshot(&[]).at(ts("2026-11-30T09:00:00Z")).signed_with(&key).dropped_from(&good).write(&store).await;
        assert_eq!(baseline(true).await, Some(good.snapshot_id.clone()), "not acknowledged: the one before the drop");
        // A forgery (unsigned) after them is no yardstick with keys.
        snapshot(&fleet[..1]).at(ts("2026-11-30T09:10:00Z")).write(&store).await;
        assert_eq!(baseline(true).await, Some(good.snapshot_id.clone()));
        let policy = RetentionPolicy { keep_last: Some(1), max_age: None };
        let plan = apply(&store, policy, Some(&trusted)).await.unwrap();
        let deleted: Vec<_> = plan.deletions.iter().map(|d| d.id.clone()).collect();
        assert_eq!(deleted, std::slice::from_ref(&first.snapshot_id), "{plan:?}");
        assert!(plan.kept.iter().any(|k| k.id == good.snapshot_id && k.reason.contains("before the drop")), "{plan:?}");
        // A person deletes it: the drop is acknowledged, the newest is the yardstick again.
        let refused = delete_one(&store, &good.snapshot_id, Some(&trusted), false).await.unwrap_err().to_string();
        assert!(refused.contains("last snapshot before the drop") && refused.contains("--force"), "{refused}");
        delete_one(&store, &good.snapshot_id, Some(&trusted), true).await.unwrap();
        assert_eq!(baseline(true).await, Some(second.snapshot_id.clone()));
    }
}
