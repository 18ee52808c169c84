//! Retention: which snapshots to delete. Pure planning, applied by [`apply`].
//!
//! Rules: a complete snapshot is deleted when it is beyond `keep_last` (counting complete
//! snapshots, newest first) or older than `max_age`; when both are set, either one deletes.
//! The newest complete snapshot is never deleted. A folder without a manifest (an aborted or
//! crashed backup) is removed once it is older than [`INCOMPLETE_GRACE`], so a backup still
//! uploading is never touched.

use std::time::Duration;

use jiff::Timestamp;
use tracing::info;

use crate::Result;
use crate::format::SnapshotId;
use crate::store::{SnapshotEntry, SnapshotStore};

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

/// Plans deletions for `entries` (any order) at `now`, oldest first.
pub fn plan(entries: &[SnapshotEntry], policy: RetentionPolicy, now: Timestamp) -> Vec<Deletion> {
    let age = |entry: &SnapshotEntry| -> Duration {
        let created = entry.id.timestamp().unwrap_or(entry.last_modified);
        now.duration_since(created).try_into().unwrap_or(Duration::ZERO)
    };
    let mut complete: Vec<&SnapshotEntry> = entries.iter().filter(|e| e.complete).collect();
    complete.sort_by(|a, b| b.id.cmp(&a.id));
    let mut deletions = Vec::new();
    // The newest complete snapshot (index 0) is always kept.
    for (rank, entry) in complete.iter().enumerate().skip(1) {
        let reason = match (policy.keep_last, policy.max_age) {
            (Some(keep), _) if rank >= keep => Some(format!("beyond the newest {keep}")),
            (_, Some(max)) if age(entry) > max => Some(format!("older than {}", humantime::format_duration(max))),
            _ => None,
        };
        if let Some(reason) = reason {
            deletions.push(Deletion { id: entry.id.clone(), reason });
        }
    }
    for entry in entries.iter().filter(|e| !e.complete) {
        let idle = now.duration_since(entry.last_modified).try_into().unwrap_or(Duration::ZERO);
        if idle > INCOMPLETE_GRACE {
            deletions.push(Deletion { id: entry.id.clone(), reason: "incomplete: no manifest".into() });
        }
    }
    deletions.sort_by(|a, b| a.id.cmp(&b.id));
    deletions
}

/// Lists, plans and deletes. Returns what was deleted.
pub async fn apply(store: &SnapshotStore, policy: RetentionPolicy) -> Result<Vec<Deletion>> {
    let entries = store.list().await?;
    let deletions = plan(&entries, policy, Timestamp::now());
    for deletion in &deletions {
        store.delete(&deletion.id).await?;
        info!(snapshot = %deletion.id, reason = %deletion.reason, "snapshot deleted by retention");
    }
    Ok(deletions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at: &str, complete: bool) -> SnapshotEntry {
        let ts: Timestamp = at.parse().unwrap();
        SnapshotEntry { id: SnapshotId::new(ts), complete, payload_size: Some(10), last_modified: ts }
    }

    fn deleted(entries: &[SnapshotEntry], policy: RetentionPolicy, now: &str) -> Vec<usize> {
        let plan = plan(entries, policy, now.parse().unwrap());
        entries.iter().enumerate().filter(|(_, e)| plan.iter().any(|d| d.id == e.id)).map(|(i, _)| i).collect()
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
}
