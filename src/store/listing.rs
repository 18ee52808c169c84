//! What `snapshots list` shows of each snapshot, read from the store: a listing's entries, each
//! complete one's manifest (small) and its journal's listing, and with trusted keys its
//! signature checked. A snapshot that cannot be read is a summary that says why, not a failed
//! listing. No payload is read: `snapshots verify` and `restore --dry-run` check those.

use jiff::Timestamp;
use serde::Serialize;

use super::journal::JournalListing;
use super::snapshots::{SnapshotEntry, SnapshotStore};
use crate::format::{Manifest, TrustedKeys, is_ahead_of};

/// One snapshot of a listing, as far as its manifest tells.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSummary {
    pub id: String,
    pub state: SnapshotState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncompressed_bytes: Option<u64>,
    pub conflicts: usize,
    pub skipped: usize,
    /// `consistent`, `inconsistent`, or `unchecked` (format 1.0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consistency: Option<String>,
    /// Why the capture is inconsistent (the first few reasons).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub inconsistencies: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The snapshot is dated ahead of this clock (its writer's clock was ahead).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ahead_of_clock: bool,
    /// The cluster it was captured from, as its manifest says (`capturedFrom`: the uid of the
    /// source's `kube-system` namespace; what `--expect-source` names).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub captured_from: Option<String>,
    /// The key id the manifest says signed it (absent: unsigned).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<String>,
    /// With trusted keys: verified or refused (the reason in `error`); without: not checked.
    /// Absent for an incomplete or unreadable snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<SignatureCheck>,
    /// The recipients an encrypted snapshot's payload is encrypted to (absent: plain).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encrypted_to: Option<Vec<String>>,
    /// The journal of this snapshot as a base (complete snapshots only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal: Option<JournalSummary>,
}

/// Whether a listed snapshot exists for readers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotState {
    /// It has a manifest, and the manifest reads.
    Complete,
    /// No manifest (yet): a backup writing it, or one that failed.
    Incomplete,
    /// A manifest that cannot be read (the reason in `error`).
    Unreadable,
}

/// A listed snapshot's signature, against the trusted keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SignatureCheck {
    #[serde(rename = "verified")]
    Verified,
    #[serde(rename = "refused")]
    Refused,
    /// No keys are trusted: signatures are not looked at.
    #[serde(rename = "not checked")]
    NotChecked,
}

/// A base's journal in a listing: from a listing of its journal folder and its newest header
/// only (neither verified nor decrypted: `restore --dry-run` reads the chain).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalSummary {
    /// Segments with a header.
    pub segments: u64,
    /// The newest segment's sequence number and the point in time it brings a restore to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub newest_segment: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub newest_at: Option<String>,
    /// How far the newest segment's point is behind `now`, whole seconds (negative: the
    /// writer's clock is ahead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<i64>,
    /// The first sequence number missing below the newest: a restore stops before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_at: Option<u64>,
    /// Why the journal (or its newest header) cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl JournalSummary {
    pub fn of(listing: &JournalListing, now: Timestamp) -> JournalSummary {
        let mut summary = JournalSummary { segments: listing.segments, gap_at: listing.gap, ..Default::default() };
        match &listing.newest {
            None => {}
            Some(Ok(header)) => {
                summary.newest_segment = Some(header.sequence);
                summary.newest_at = Some(header.to.to_string());
                summary.lag_seconds = Some(now.duration_since(header.to).as_secs());
            }
            Some(Err(reason)) => summary.error = Some(reason.clone()),
        }
        summary
    }
}

/// Describes each listed snapshot, newest first: its manifest read (an unreadable one says
/// why), and for a complete one its journal's listing and, with `trusted` keys, its signature
/// checked. `now`: the clock the dates and the journal's lag are judged by.
pub async fn describe_snapshots(
    store: &SnapshotStore,
    entries: &[SnapshotEntry],
    trusted: Option<&TrustedKeys>,
    now: Timestamp,
) -> Vec<SnapshotSummary> {
    let mut summaries = Vec::with_capacity(entries.len());
    for entry in entries.iter().rev() {
        let mut summary = SnapshotSummary::listed(entry, now);
        if entry.complete {
            match store.manifest(&entry.id).await {
                Ok(m) => summary.fill(&m),
                Err(e) => {
                    summary.state = SnapshotState::Unreadable;
                    summary.error = Some(e.to_string());
                }
            }
        }
        if summary.state == SnapshotState::Complete {
            summary.journal = Some(match store.journal_listing(&entry.id).await {
                Ok(listing) => JournalSummary::of(&listing, now),
                Err(e) => JournalSummary { error: Some(e.to_string()), ..JournalSummary::default() },
            });
            summary.signature = Some(match trusted {
                None => SignatureCheck::NotChecked,
                Some(trusted) => match store.verified_manifest(&entry.id, Some(trusted)).await {
                    Ok(_) => SignatureCheck::Verified,
                    Err(e) => {
                        summary.error = Some(e.to_string());
                        SignatureCheck::Refused
                    }
                },
            });
        }
        summaries.push(summary);
    }
    summaries
}

impl SnapshotSummary {
    /// What the listing alone tells: incomplete until a manifest is read.
    fn listed(entry: &SnapshotEntry, now: Timestamp) -> SnapshotSummary {
        SnapshotSummary {
            id: entry.id.to_string(),
            state: SnapshotState::Incomplete,
            created_at: entry.id.timestamp().map(|t| t.to_string()),
            records: None,
            payload_bytes: entry.payload_size,
            uncompressed_bytes: None,
            conflicts: 0,
            skipped: 0,
            consistency: None,
            inconsistencies: vec![],
            error: None,
            ahead_of_clock: entry.id.timestamp().is_some_and(|t| is_ahead_of(t, now)),
            captured_from: None,
            signed_by: None,
            signature: None,
            encrypted_to: None,
            journal: None,
        }
    }

    /// What its manifest `m` tells.
    fn fill(&mut self, m: &Manifest) {
        self.state = SnapshotState::Complete;
        self.created_at = Some(m.created_at.to_string());
        self.records = Some(m.payload.records);
        self.payload_bytes = Some(m.payload.size);
        self.uncompressed_bytes = Some(m.payload.uncompressed_size);
        self.conflicts = m.conflict_count();
        self.skipped = m.skipped_count();
        self.captured_from = m.captured_from.clone();
        self.signed_by = m.signed_by.as_ref().map(|k| k.to_string());
        self.encrypted_to = m.encryption.as_ref().map(|e| e.recipients.clone());
        let (consistency, inconsistencies) = consistency(m);
        self.consistency = Some(consistency);
        self.inconsistencies = inconsistencies;
    }
}

/// A manifest's capture verdict: `consistent`, `inconsistent` (with the first few reasons) or
/// `unchecked` (format 1.0).
pub fn consistency(m: &Manifest) -> (String, Vec<String>) {
    match &m.consistency {
        None => ("unchecked".into(), vec![]),
        Some(c) if c.consistent => ("consistent".into(), vec![]),
        Some(c) => {
            let reasons = c.reasons.iter().take(5).map(|r| format!("{}: {}", r.object, r.reason)).collect();
            ("inconsistent".into(), reasons)
        }
    }
}

#[cfg(test)]
mod tests {
    use object_store::ObjectStoreExt;
    use serde_json::json;

    use super::*;
    use crate::fixtures::{encode, record, ts, uuid, write_snapshot};
    use crate::format::{CaptureSummary, Record, SegmentHeader, SigningKey, SnapshotId};

    fn records() -> Vec<Record> {
        (0..3).map(|i| record("Server", &format!("s{i}"), &[uuid(&format!("u{i}"))], json!({"power": "On"}))).collect()
    }

    /// Newest first: a folder still being written (dated ahead of the clock), an unreadable
    /// manifest (why, no failed listing), a signed and an unsigned snapshot; signatures looked
    /// at only with trusted keys, and then a refused one says why.
    #[tokio::test]
    async fn each_snapshot_is_described_from_its_manifest_newest_first() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let unsigned = write_snapshot(&store, "2026-11-30T07:00:00Z", &records(), false).await;
        let key = SigningKey::generate();
        let (payload, summary) = encode(&records());
        let at = ts("2026-11-30T08:00:00Z");
        let mut signed = Manifest::new("c", SnapshotId::new(at), at, "test", CaptureSummary::empty(), summary);
        store.store.put(&store.payload_path(&signed.snapshot_id), payload.clone().into()).await.unwrap();
        store.put_signed_manifest(&mut signed, &key).await.unwrap();
        let broken = SnapshotId::new(ts("2026-11-30T09:00:00Z"));
        store.store.put(&store.manifest_path(&broken), bytes::Bytes::from_static(b"{not json").into()).await.unwrap();
        let writing = SnapshotId::new(ts("2026-11-30T10:00:00Z"));
        store.store.put(&store.payload_path(&writing), payload.into()).await.unwrap();
        let now = ts("2026-11-30T09:30:00Z");
        let entries = store.list().await.unwrap();

        let listed = describe_snapshots(&store, &entries, None, now).await;
        let ids: Vec<&str> = listed.iter().map(|s| s.id.as_str()).collect();
        let expected = [&writing, &broken, &signed.snapshot_id, &unsigned.snapshot_id].map(|id| id.as_str());
        assert_eq!(ids, expected);
        let states: Vec<SnapshotState> = listed.iter().map(|s| s.state).collect();
        use SnapshotState::*;
        assert_eq!(states, [Incomplete, Unreadable, Complete, Complete]);
        assert!(listed[0].ahead_of_clock && !listed[2].ahead_of_clock);
        assert!(listed[1].error.as_deref().is_some_and(|e| e.contains(broken.as_str())), "{:?}", listed[1].error);
        let signatures: Vec<_> = listed.iter().map(|s| s.signature).collect();
        assert_eq!(signatures, [None, None, Some(SignatureCheck::NotChecked), Some(SignatureCheck::NotChecked)]);
        assert_eq!(listed[3].consistency.as_deref(), Some("inconsistent"));

        let trusted = TrustedKeys::new([key.public_key()]);
        let checked = describe_snapshots(&store, &entries, Some(&trusted), now).await;
        assert_eq!(checked[2].signature, Some(SignatureCheck::Verified));
        assert_eq!(checked[3].signature, Some(SignatureCheck::Refused));
        assert!(checked[3].error.as_deref().is_some_and(|e| e.contains(unsigned.snapshot_id.as_str())));
        assert_eq!(
            serde_json::to_value(&checked[2]).unwrap(),
            json!({
                "id": signed.snapshot_id.as_str(), "state": "complete", "createdAt": "2026-11-30T08:00:00Z",
                "records": 3, "payloadBytes": signed.payload.size,
                "uncompressedBytes": signed.payload.uncompressed_size, "conflicts": 0, "skipped": 0,
                "consistency": "consistent", "signedBy": key.id().to_string(), "signature": "verified",
                "journal": {"segments": 0},
            })
        );
        assert_eq!(serde_json::to_value(listed[2].signature).unwrap(), json!("not checked"));
    }

    /// A journal in a listing: none, the newest point and its lag behind now, a gap, an
    /// unreadable newest header, a writer's clock ahead.
    #[test]
    fn a_journal_summary_says_segments_newest_point_and_lag() {
        let now = ts("2026-12-03T10:05:07Z");
        let none = JournalSummary::of(&JournalListing { segments: 0, gap: None, newest: None }, now);
        assert_eq!(serde_json::to_value(&none).unwrap(), json!({"segments": 0}));
        let header = |to: &str| {
            let base = SnapshotId::new(ts("2026-12-03T10:00:00Z"));
            let summary = crate::format::PayloadEncoder::encode_all(3, None, &[]).unwrap().1;
            SegmentHeader::new(
                "c",
                &base,
                12,
                None,
                ts("2026-12-03T10:00:00Z"),
                ts(to),
                Default::default(),
                (1, 0),
                summary,
                None,
            )
        };
        let listing = JournalListing { segments: 12, gap: Some(4), newest: Some(Ok(header("2026-12-03T10:05:00Z"))) };
        assert_eq!(
            serde_json::to_value(JournalSummary::of(&listing, now)).unwrap(),
            json!({"segments": 12, "newestSegment": 12, "newestAt": "2026-12-03T10:05:00Z", "lagSeconds": 7, "gapAt": 4})
        );
        let ahead = JournalListing { segments: 1, gap: None, newest: Some(Ok(header("2026-12-03T10:06:00Z"))) };
        assert_eq!(JournalSummary::of(&ahead, now).lag_seconds, Some(-53));
        let broken = JournalListing { segments: 2, gap: None, newest: Some(Err("segment 2 is corrupt".into())) };
        let summary = JournalSummary::of(&broken, now);
        assert_eq!((summary.error.as_deref(), summary.newest_at), (Some("segment 2 is corrupt"), None));
    }
}
