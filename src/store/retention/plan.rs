//! Retention's decisions, pure: which snapshots a policy deletes ([`plan`]) and what a person
//! may not delete by hand without `force` ([`protected`]), from what the store side
//! (`retention/mod.rs`) read of each snapshot folder. No store, no clock of its own, no I/O.
//!
//! Rules: a complete snapshot is deleted when it is beyond `keep_last` or older than `max_age`;
//! when both are set, either one deletes. `keep_last` counts the snapshots a restore could use,
//! newest first: with trusted keys only those a trusted key signed, so that forgeries (anyone
//! who can write the bucket can write many) never push the signed history out. A snapshot no
//! trusted key signed does not count; it goes once it is older than the oldest one `keep_last`
//! keeps (it falls out with the history around it), or by `max_age`.
//!
//! Never deleted:
//! - the newest complete snapshot that counts, and the newest one that verifies and is
//!   consistent (what a restore without `--allow-inconsistent` needs, however many inconsistent
//!   ones came after it);
//! - snapshots dated ahead of this clock (a skewed writer's; they do not count against
//!   `keep_last` either, so they cannot push out the snapshots that follow them);
//! - the last snapshot before a drop in records (a capture marked `recordDrop`): kept until a
//!   person deletes it by hand, which is how a drop that was meant is acknowledged;
//! - without trusted keys, a snapshot whose manifest says it is signed: retention cannot tell
//!   it from a forgery, so it deletes none of them (give `--trusted-key` to prune them).
//!
//! A folder without a manifest (an aborted or crashed backup) is removed once it is older than
//! [`INCOMPLETE_GRACE`], so a backup still uploading is never touched.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use crate::format::{SnapshotId, is_ahead_of};

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

/// One snapshot folder as retention sees it: the listing's part, and what its manifest said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: SnapshotId,
    /// It has a manifest.
    pub complete: bool,
    /// When the newest object of the folder was written.
    pub last_modified: Timestamp,
    pub signature: Signature,
    /// Its manifest marks a drop in records against this (older) snapshot.
    pub drop_from: Option<SnapshotId>,
}

/// A complete snapshot's signature, as far as the keys of the run can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signature {
    /// Keys are given and one of them verifies it.
    Verified,
    /// Keys are given and none verifies it: unsigned, another key's, forged, or a manifest
    /// that cannot be read.
    Refused,
    /// No keys: its manifest says it is signed (not checked).
    Claimed,
    /// No keys: unsigned, or a manifest that cannot be read.
    Unchecked,
}

impl Entry {
    /// Counts as a snapshot a restore could use (with keys: signed by a trusted key).
    fn counts(&self) -> bool {
        self.complete && self.signature != Signature::Refused
    }
}

/// The snapshots kept as the last before a drop in records, each with the (oldest) snapshot
/// that marks the drop against it. A mark counts only on a snapshot that counts itself: a
/// forgery cannot make retention keep an old snapshot forever.
fn before_drops(entries: &[Entry]) -> BTreeMap<&SnapshotId, &SnapshotId> {
    let mut kept = BTreeMap::new();
    let mut marked: Vec<&Entry> = entries.iter().filter(|e| e.counts() && e.drop_from.is_some()).collect();
    marked.sort_by(|a, b| a.id.cmp(&b.id));
    for entry in marked {
        if let Some(previous) = &entry.drop_from
            && entries.iter().any(|e| e.id == *previous && e.complete)
        {
            kept.entry(previous).or_insert(&entry.id);
        }
    }
    kept
}

fn before_drop_reason(marker: &SnapshotId) -> String {
    format!(
        "the last snapshot before the drop in records that snapshot {marker} marks: kept until a person \
         deletes it (`snapshots delete ID --force`, once the drop is known to be meant)"
    )
}

const CLAIMED: &str = "its manifest says it is signed, and without --trusted-key retention cannot tell it from a \
                       forgery: kept (give --trusted-key to prune signed snapshots)";

/// Plans deletions for `entries` (any order) at `now`, oldest first. `restorable` is the
/// newest snapshot that verifies and is consistent, if any: it is kept.
pub fn plan(
    entries: &[Entry],
    policy: RetentionPolicy,
    now: Timestamp,
    restorable: Option<&SnapshotId>,
) -> RetentionPlan {
    let age = |entry: &Entry| -> Duration {
        let created = entry.id.timestamp().unwrap_or(entry.last_modified);
        now.duration_since(created).try_into().unwrap_or(Duration::ZERO)
    };
    let ahead = |entry: &Entry| entry.id.timestamp().is_some_and(|t| is_ahead_of(t, now));
    let keys = entries.iter().any(|e| matches!(e.signature, Signature::Verified | Signature::Refused));
    let before_drop = before_drops(entries);
    let mut out = RetentionPlan::default();
    let mut complete: Vec<&Entry> = entries.iter().filter(|e| e.complete).collect();
    complete.sort_by(|a, b| b.id.cmp(&a.id));
    for entry in complete.iter().filter(|e| ahead(e)) {
        out.kept.push(Deletion { id: entry.id.clone(), reason: "dated ahead of this clock (skewed writer)".into() });
    }
    let counted: Vec<&Entry> = complete.iter().copied().filter(|e| !ahead(e) && e.counts()).collect();
    // The oldest snapshot `keep_last` keeps: what does not count goes once older than it.
    let cutoff = policy.keep_last.and_then(|keep| counted.get(keep.max(1) - 1)).map(|e| &e.id);
    let which = if keys { " signed by a trusted key" } else { "" };
    for entry in complete.iter().filter(|e| !ahead(e)) {
        let rank = counted.iter().position(|c| c.id == entry.id);
        let too_old = policy.max_age.filter(|max| age(entry) > *max);
        let reason = match rank {
            // The newest one that counts is always kept.
            Some(0) => None,
            Some(rank) => match (policy.keep_last, too_old) {
                (Some(keep), _) if rank >= keep => Some(format!("beyond the newest {keep}{which}")),
                (_, Some(max)) => Some(format!("older than {}", humantime::format_duration(max))),
                _ => None,
            },
            None => match (cutoff, too_old) {
                (Some(cutoff), _) if entry.id < *cutoff => Some(format!(
                    "not signed by a trusted key, and older than the newest {}{which}",
                    policy.keep_last.unwrap_or(1).max(1)
                )),
                (_, Some(max)) => Some(format!("older than {}", humantime::format_duration(max))),
                _ => None,
            },
        };
        let Some(reason) = reason else { continue };
        let keep = |why: String| Deletion { id: entry.id.clone(), reason: why };
        if restorable == Some(&entry.id) {
            out.kept.push(keep("the newest verified consistent snapshot: a restore needs it".into()));
        } else if let Some(marker) = before_drop.get(&entry.id) {
            out.kept.push(keep(before_drop_reason(marker)));
        } else if entry.signature == Signature::Claimed {
            out.kept.push(keep(CLAIMED.into()));
        } else {
            out.deletions.push(Deletion { id: entry.id.clone(), reason });
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

/// Why a snapshot must not be deleted by hand without `force`, if it must not: the newest
/// complete one (`latest`, where a restore starts), the newest one that verifies and is
/// consistent (`restorable`: what a restore uses; signed by a trusted key when keys are given),
/// the last one before a drop in records, without keys the newest one that says it is signed,
/// or a folder without a manifest written to within [`INCOMPLETE_GRACE`] (a backup may still
/// be uploading it).
pub fn protected(
    entries: &[Entry],
    entry: &Entry,
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
    let newest = |keep: &dyn Fn(&Entry) -> bool| entries.iter().filter(|e| e.complete && keep(e)).max_by_key(|e| &e.id);
    if newest(&|_| true).is_some_and(|newest| newest.id == entry.id) {
        return Some("it is the newest complete snapshot (`latest`), the first one a restore tries".into());
    }
    if restorable == Some(&entry.id) {
        let which = if signed { "signed by a trusted key, " } else { "" };
        return Some(format!("it is the newest snapshot that verifies ({which}consistent): what a restore uses"));
    }
    if let Some(marker) = before_drops(entries).get(&entry.id) {
        return Some(format!(
            "it is the last snapshot before the drop in records that snapshot {marker} marks, kept until a \
             person deletes it"
        ));
    }
    if newest(&|e| e.signature == Signature::Claimed).is_some_and(|newest| newest.id == entry.id) {
        return Some(
            "it is the newest snapshot whose manifest says it is signed, and without --trusted-key its \
             signature cannot be checked"
                .into(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at: &str, complete: bool) -> Entry {
        let ts: Timestamp = at.parse().unwrap();
        Entry { id: SnapshotId::new(ts), complete, last_modified: ts, signature: Signature::Unchecked, drop_from: None }
    }

    fn deleted(entries: &[Entry], policy: RetentionPolicy, now: &str) -> Vec<usize> {
        deleted_keeping(entries, policy, now, None)
    }

    fn deleted_keeping(entries: &[Entry], policy: RetentionPolicy, now: &str, restorable: Option<usize>) -> Vec<usize> {
        let restorable = restorable.map(|i| entries[i].id.clone());
        let plan = plan(entries, policy, now.parse().unwrap(), restorable.as_ref());
        let deleted = |e: &Entry| plan.deletions.iter().any(|d| d.id == e.id);
        entries.iter().enumerate().filter(|(_, e)| deleted(e)).map(|(i, _)| i).collect()
    }

    fn day(d: u32) -> String {
        format!("2026-11-{d:02}T03:00:00Z")
    }

    fn hourly(n: usize) -> Vec<Entry> {
        (0..n).map(|i| entry(&format!("2026-11-30T{:02}:{:02}:00Z", i / 60, i % 60), true)).collect()
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
        let entries = hourly(53);
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

    /// F161 (issue 38, item 8): an empty capture after the fleet was deleted, then a day of
    /// schedule (48 more at `keepLast: 48`): the last snapshot before the drop is kept, named,
    /// while the snapshot marking the drop is in the bucket; without the mark it would go.
    #[test]
    fn the_last_snapshot_before_a_drop_in_records_is_kept_until_a_person_deletes_it() {
        let mut entries = hourly(60);
        // 0..=9 held the fleet; 10 is the first capture after the deletion, marked; the rest
        // compare with 9 as well (the drop is not acknowledged), and are marked too.
        let before = entries[9].id.clone();
        for e in &mut entries[10..] {
            e.drop_from = Some(before.clone());
        }
        let policy = RetentionPolicy { keep_last: Some(48), max_age: None };
        let now = "2026-11-30T02:00:00Z";
        assert_eq!(deleted(&entries, policy, now), (0..12).filter(|i| *i != 9).collect::<Vec<_>>());
        let plan = plan(&entries, policy, now.parse().unwrap(), None);
        assert_eq!(plan.kept.len(), 1, "{plan:?}");
        assert!(plan.kept[0].reason.contains(&format!("drop in records that snapshot {} marks", entries[10].id)));
        // By hand: refused without force, naming the snapshot that marks the drop.
        let why = protected(&entries, &entries[9], None, false, now.parse().unwrap()).unwrap();
        assert!(why.contains("last snapshot before the drop") && why.contains(entries[10].id.as_str()), "{why}");
        // With keys, a mark counts only on a snapshot a trusted key signed: a forgery marking
        // an old snapshot keeps nothing.
        let mut entries = hourly(10);
        for e in &mut entries {
            e.signature = Signature::Verified;
        }
        entries[9].drop_from = Some(entries[3].id.clone());
        let policy = RetentionPolicy { keep_last: Some(2), max_age: None };
        assert_eq!(deleted(&entries, policy, now), [0, 1, 2, 4, 5, 6, 7]);
        entries[9].signature = Signature::Refused;
        assert_eq!(deleted(&entries, policy, now), [0, 1, 2, 3, 4, 5, 6]);
    }

    /// F166 (issue 38, item 13): with trusted keys, `keep_last` counts only what a trusted key
    /// signed: fifty forgeries written after three signed snapshots push none of them out, and
    /// go themselves once older than the oldest signed one kept.
    #[test]
    fn keep_last_counts_only_signed_snapshots_and_forgeries_push_none_out() {
        let mut entries = hourly(53);
        for (i, e) in entries.iter_mut().enumerate() {
            e.signature = if i < 3 { Signature::Verified } else { Signature::Refused };
        }
        let policy = RetentionPolicy { keep_last: Some(2), max_age: None };
        assert_eq!(deleted(&entries, policy, "2026-11-30T12:00:00Z"), [0], "signed 1 and 2 kept; forgeries after");
        // Older forgeries go with the history around them.
        let mut entries = hourly(10);
        for (i, e) in entries.iter_mut().enumerate() {
            e.signature = if i % 2 == 0 { Signature::Verified } else { Signature::Refused };
        }
        // Signed: 0 2 4 6 8; keep 2 → 6 and 8; everything older than 6 goes, 7 and 9 stay.
        assert_eq!(deleted(&entries, policy, "2026-11-30T12:00:00Z"), [0, 1, 2, 3, 4, 5]);
    }

    /// F167 (issue 38, item 13): without keys, retention cannot tell a signed snapshot from a
    /// forgery, so it deletes no snapshot that says it is signed; by hand, the newest one that
    /// says so is refused without force.
    #[test]
    fn without_keys_no_snapshot_that_says_it_is_signed_is_pruned() {
        let mut entries = hourly(6);
        entries[1].signature = Signature::Claimed;
        entries[2].signature = Signature::Claimed;
        let policy = RetentionPolicy { keep_last: Some(1), max_age: None };
        let now = "2026-11-30T12:00:00Z";
        assert_eq!(deleted(&entries, policy, now), [0, 3, 4]);
        let plan = plan(&entries, policy, now.parse().unwrap(), None);
        assert!(plan.kept.iter().all(|k| k.reason.contains("--trusted-key")), "{plan:?}");
        let why = |i: usize| protected(&entries, &entries[i], None, false, now.parse().unwrap());
        assert!(why(2).is_some_and(|w| w.contains("says it is signed")), "{:?}", why(2));
        assert_eq!(why(1), None, "only the newest signed one is refused by hand");
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
}
