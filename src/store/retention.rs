//! Retention: which snapshots to delete. Pure planning ([`plan`]), applied by [`apply`].
//!
//! Rules: a complete snapshot is deleted when it is beyond `keep_last` (counting complete
//! snapshots, newest first) or older than `max_age`; when both are set, either one deletes.
//! Never deleted: the newest complete snapshot, the newest one that verifies and is consistent
//! (what a restore without `--allow-inconsistent` needs, however many inconsistent ones came
//! after it), and snapshots dated ahead of this clock (a skewed writer's; they do not count
//! against `keep_last` either, so they cannot push out the snapshots that follow them). A
//! folder without a manifest (an aborted or crashed backup) is removed once it is older than
//! [`INCOMPLETE_GRACE`], so a backup still uploading is never touched.
//!
//! `snapshots delete` removes one snapshot by hand ([`delete_one`]), the same way, and without
//! `force` refuses what retention would never delete ([`protected`]).

use std::time::Duration;

use jiff::Timestamp;
use tracing::info;

use super::snapshots::{SnapshotEntry, SnapshotStore};
use crate::Result;
use crate::format::{SnapshotId, TrustedKeys, is_ahead_of};

/// How long a snapshot folder without a manifest is left alone (a backup may still be writing).
pub const INCOMPLETE_GRACE: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    pub keep_last: Option<usize>,
    pub max_age: Option<Duration>,
}

impl RetentionPolicy {
    pub fn is_set(&self) -> bool {
        self.keep_last.is_some() || self.max_age.is_some()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    pub id: SnapshotId,
    pub reason: String,
}

/// What retention deletes, and what it keeps that the policy alone would not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionPlan {
    pub deletions: Vec<Deletion>,
    /// Kept whatever the policy says, with the reason.
    pub kept: Vec<Deletion>,
}

/// Plans deletions for `entries` (any order) at `now`, oldest first. `restorable` is the
/// newest snapshot that verifies and is consistent, if any: it is kept.
pub fn plan(
    entries: &[SnapshotEntry],
    policy: RetentionPolicy,
    now: Timestamp,
    restorable: Option<&SnapshotId>,
) -> RetentionPlan {
    let age = |entry: &SnapshotEntry| -> Duration {
        let created = entry.id.timestamp().unwrap_or(entry.last_modified);
        now.duration_since(created).try_into().unwrap_or(Duration::ZERO)
    };
    let ahead = |entry: &SnapshotEntry| entry.id.timestamp().is_some_and(|t| is_ahead_of(t, now));
    let mut out = RetentionPlan::default();
    let mut complete: Vec<&SnapshotEntry> = entries.iter().filter(|e| e.complete).collect();
    complete.sort_by(|a, b| b.id.cmp(&a.id));
    for entry in complete.iter().filter(|e| ahead(e)) {
        out.kept.push(Deletion { id: entry.id.clone(), reason: "dated ahead of this clock (skewed writer)".into() });
    }
    // The newest complete snapshot (rank 0) is always kept.
    for (rank, entry) in complete.iter().filter(|e| !ahead(e)).enumerate().skip(1) {
        let reason = match (policy.keep_last, policy.max_age) {
            (Some(keep), _) if rank >= keep => Some(format!("beyond the newest {keep}")),
            (_, Some(max)) if age(entry) > max => Some(format!("older than {}", humantime::format_duration(max))),
            _ => None,
        };
        match reason {
            Some(_) if restorable == Some(&entry.id) => out.kept.push(Deletion {
                id: entry.id.clone(),
                reason: "the newest verified consistent snapshot: a restore needs it".into(),
            }),
            Some(reason) => out.deletions.push(Deletion { id: entry.id.clone(), reason }),
            None => {}
        }
    }
    for entry in entries.iter().filter(|e| !e.complete) {
        let idle = now.duration_since(entry.last_modified).try_into().unwrap_or(Duration::ZERO);
        if idle > INCOMPLETE_GRACE {
            out.deletions.push(Deletion { id: entry.id.clone(), reason: "incomplete: no manifest".into() });
        }
    }
    out.deletions.sort_by(|a, b| a.id.cmp(&b.id));
    out
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

/// Lists and plans (nothing deleted); `trusted`: see [`newest_restorable`].
pub async fn plan_for(
    store: &SnapshotStore,
    policy: RetentionPolicy,
    trusted: Option<&TrustedKeys>,
) -> Result<RetentionPlan> {
    let entries = store.list().await?;
    let restorable = newest_restorable(store, &entries, trusted).await?;
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

/// Why a snapshot must not be deleted by hand without `force`, if it must not: the newest
/// complete one (`latest`, where a restore starts), the newest one that verifies and is
/// consistent (`restorable`: what a restore uses; signed by a trusted key when keys are given),
/// or a folder without a manifest written to within [`INCOMPLETE_GRACE`] (a backup may still be
/// uploading it). Pure.
pub fn protected(
    entries: &[SnapshotEntry],
    entry: &SnapshotEntry,
    restorable: Option<&SnapshotId>,
    signed: bool,
    now: Timestamp,
) -> Option<String> {
    if !entry.complete {
        let idle: Duration = now.duration_since(entry.last_modified).try_into().unwrap_or(Duration::ZERO);
        return (idle <= INCOMPLETE_GRACE).then(|| {
            format!(
                "it has no manifest and was written to {} ago: a backup may still be uploading it",
                humantime::format_duration(Duration::from_secs(idle.as_secs()))
            )
        });
    }
    if entries.iter().rev().find(|e| e.complete).is_some_and(|newest| newest.id == entry.id) {
        return Some("it is the newest complete snapshot (`latest`), the first one a restore tries".into());
    }
    if restorable == Some(&entry.id) {
        let which = if signed { "signed by a trusted key, " } else { "" };
        return Some(format!("it is the newest snapshot that verifies ({which}consistent): what a restore uses"));
    }
    None
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
    let entries = store.list().await?;
    let Some(entry) = entries.iter().find(|e| e.id == *id) else {
        let reason = format!("no such snapshot in {} (`snapshots list` shows the ids)", store.snapshot_url(id));
        return Err(refused(reason));
    };
    if !force {
        let now = Timestamp::now();
        // The cheap checks first; the newest restorable one is read (its payload verified) only
        // when they pass.
        let mut reason = protected(&entries, entry, None, false, now);
        if reason.is_none() && entry.complete {
            let restorable = newest_restorable(store, &entries, trusted).await?;
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
    Ok(Deleted { id: id.clone(), complete: entry.complete, files })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at: &str, complete: bool) -> SnapshotEntry {
        let ts: Timestamp = at.parse().unwrap();
        SnapshotEntry { id: SnapshotId::new(ts), complete, payload_size: Some(10), last_modified: ts }
    }

    fn deleted(entries: &[SnapshotEntry], policy: RetentionPolicy, now: &str) -> Vec<usize> {
        deleted_keeping(entries, policy, now, None)
    }

    fn deleted_keeping(
        entries: &[SnapshotEntry],
        policy: RetentionPolicy,
        now: &str,
        restorable: Option<usize>,
    ) -> Vec<usize> {
        let restorable = restorable.map(|i| entries[i].id.clone());
        let plan = plan(entries, policy, now.parse().unwrap(), restorable.as_ref());
        let deleted = |e: &SnapshotEntry| plan.deletions.iter().any(|d| d.id == e.id);
        entries.iter().enumerate().filter(|(_, e)| deleted(e)).map(|(i, _)| i).collect()
    }

    fn day(d: u32) -> String {
        format!("2026-11-{d:02}T03:00:00Z")
    }

    #[test]
    fn keep_last_counts_complete_snapshots_newest_first() {
        let entries: Vec<_> = (1..=5).map(|d| entry(&day(d), true)).collect();
        let policy = RetentionPolicy { keep_last: Some(2), max_age: None };
        assert_eq!(deleted(&entries, policy, &day(6)), [0, 1, 2]);
    }

    #[test]
    fn max_age_deletes_old_ones_but_never_the_newest_complete() {
        let entries = vec![entry(&day(1), true), entry(&day(2), true), entry(&day(3), false)];
        let policy = RetentionPolicy { keep_last: None, max_age: Some(Duration::from_secs(86400)) };
        // Everything is old; the newest complete (day 2) survives; the incomplete one goes.
        assert_eq!(deleted(&entries, policy, &day(20)), [0, 2]);
    }

    #[test]
    fn either_rule_deletes_when_both_are_set() {
        let entries: Vec<_> = (1..=4).map(|d| entry(&day(d), true)).collect();
        let policy = RetentionPolicy { keep_last: Some(3), max_age: Some(Duration::from_secs(2 * 86400 + 60)) };
        // keep_last drops day 1; max_age (2 days) at day 5 also drops day 2.
        assert_eq!(deleted(&entries, policy, &day(5)), [0, 1]);
    }

    #[test]
    fn keep_last_zero_still_keeps_the_newest() {
        let entries: Vec<_> = (1..=3).map(|d| entry(&day(d), true)).collect();
        let policy = RetentionPolicy { keep_last: Some(0), max_age: None };
        assert_eq!(deleted(&entries, policy, &day(4)), [0, 1]);
    }

    #[test]
    fn a_fresh_incomplete_snapshot_is_left_alone() {
        let entries = vec![entry("2026-11-30T10:00:00Z", true), entry("2026-11-30T10:30:00Z", false)];
        let policy = RetentionPolicy { keep_last: Some(1), max_age: None };
        assert!(deleted(&entries, policy, "2026-11-30T11:00:00Z").is_empty());
        assert_eq!(deleted(&entries, policy, "2026-11-30T12:00:00Z"), [1]);
    }

    #[test]
    fn the_newest_restorable_snapshot_survives_many_inconsistent_ones() {
        // 3 consistent snapshots, then 50 inconsistent ones; the newest consistent is index 2.
        let entries: Vec<_> =
            (0..53).map(|i| entry(&format!("2026-11-30T{:02}:{:02}:00Z", i / 60, i % 60), true)).collect();
        let policy = RetentionPolicy { keep_last: Some(48), max_age: None };
        let deleted = deleted_keeping(&entries, policy, "2026-11-30T12:00:00Z", Some(2));
        assert_eq!(deleted, [0, 1, 3, 4], "keep_last keeps the newest 48; index 2 is kept for restores");
    }

    #[test]
    fn a_snapshot_dated_ahead_of_the_clock_pushes_nothing_out_and_is_kept() {
        let now = "2026-11-30T12:00:00Z";
        let mut entries: Vec<_> = (1..=3).map(|h| entry(&format!("2026-11-30T{:02}:00:00Z", 8 + h), true)).collect();
        entries.push(entry("2026-11-30T13:00:00Z", true)); // an hour ahead of now
        let policy = RetentionPolicy { keep_last: Some(1), max_age: None };
        let plan = plan(&entries, policy, now.parse().unwrap(), None);
        let deleted: Vec<_> = plan.deletions.iter().map(|d| d.id.clone()).collect();
        assert_eq!(deleted, [entries[0].id.clone(), entries[1].id.clone()], "the newest real one (11:00) stays");
        assert!(plan.kept.iter().any(|k| k.id == entries[3].id && k.reason.contains("ahead of this clock")));
    }

    #[test]
    fn by_hand_the_newest_the_restorable_and_an_uploading_folder_are_protected() {
        let mut entries: Vec<_> = (1..=4).map(|h| entry(&format!("2026-11-30T{:02}:00:00Z", 8 + h), true)).collect();
        entries.push(entry("2026-11-30T11:30:00Z", false));
        let now: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
        let why = |i: usize, restorable: Option<usize>, signed: bool| {
            let restorable = restorable.map(|r| entries[r].id.clone());
            protected(&entries, &entries[i], restorable.as_ref(), signed, now)
        };
        assert!(why(3, None, false).unwrap().contains("newest complete"), "12:00 is `latest`");
        assert_eq!(why(2, None, false), None, "an older one goes");
        let restorable = why(1, Some(1), true).unwrap();
        assert!(restorable.contains("newest snapshot that verifies (signed by a trusted key"), "{restorable}");
        assert!(!why(1, Some(1), false).unwrap().contains("signed"));
        let uploading = why(4, None, false).unwrap();
        assert!(uploading.contains("may still be uploading") && uploading.contains("30m"), "{uploading}");
        let later: Timestamp = "2026-11-30T13:00:01Z".parse().unwrap();
        assert_eq!(protected(&entries, &entries[4], None, false, later), None, "abandoned after the grace");
    }

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
}
