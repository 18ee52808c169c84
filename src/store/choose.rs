//! Which snapshot to restore from: the pinned one, or the newest complete one that loads,
//! verifies, (unless allowed otherwise) is consistent and was not captured from the cluster
//! the restore writes to, and, when keys are trusted, is signed by one of them; an encrypted one
//! only when a decryption key opens it. A damaged, foreign, own, unsigned, badly signed or
//! undecryptable snapshot is reported and passed over for the previous one; a store that cannot
//! be read is an error.

use std::sync::Arc;

use jiff::Timestamp;
use serde::Serialize;
use tracing::{info, warn};

use crate::format::{KeyId, Manifest, Records, SnapshotId, TrustedKeys, choose_point};
use crate::store::SnapshotStore;
use crate::{Error, Result};

/// A snapshot that was passed over, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Passed {
    pub snapshot: String,
    pub reason: String,
}

/// A verified snapshot, ready to plan from.
pub struct Loaded {
    pub manifest: Manifest,
    pub records: Records,
    pub passed_over: Vec<Passed>,
    /// The trusted key whose signature was checked; `None` when no keys are trusted.
    pub signer: Option<KeyId>,
    /// With [`Accept::journal`]: the point of the base's journal the records are at (`None`:
    /// the base has no journal, its records are the snapshot's).
    pub point: Option<Point>,
}

/// The point of a journal a restore goes to: a base and the segments applied to it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Point {
    /// The base snapshot.
    pub base: String,
    /// Segments of its chain applied (1 to this, in order); 0: the base alone.
    pub segments_applied: u64,
    /// Segments the chain holds that verify (the newest complete point).
    pub segments_verified: u64,
    /// The point in time restored to: the last segment's `to`, or the base's capture time.
    pub time: Timestamp,
    /// Where the chain stops before its end, and why (a missing, corrupt or refused segment).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap: Option<String>,
    /// Newer points of the chain passed over because the fleet was inconsistent at them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub passed_over: Vec<String>,
    /// The consistency verdict at this point (the base's, or the last segment's).
    pub consistent: bool,
}

/// Which snapshots a restore accepts besides complete, verified ones.
#[derive(Debug, Clone, Default)]
pub struct Accept {
    /// Snapshots whose capture was inconsistent.
    pub inconsistent: bool,
    /// The cluster the restore writes to (its `kube-system` uid, see
    /// [`crate::k8s::cluster_uid`]): a snapshot captured from it is refused, since restoring it
    /// writes the cluster's own (perhaps status-less) statuses back onto it. `None`: unknown.
    pub this_cluster: Option<String>,
    /// Accept a snapshot captured from `this_cluster` all the same (`--allow-same-cluster`).
    pub same_cluster: bool,
    /// Only snapshots signed by one of these keys (`--trusted-key`), checked before anything
    /// else the manifest says is believed. `None`: signatures are not checked.
    pub trusted: Option<Arc<TrustedKeys>>,
    /// Read each base's journal and restore to its newest complete consistent point (or the
    /// newest at or before [`Accept::at`]). `false`: snapshots alone, as before journals.
    pub journal: bool,
    /// A point in time (`--at`): only bases captured at or before it, and only the segments
    /// that end at or before it.
    pub at: Option<Timestamp>,
}

impl Accept {
    /// Why a snapshot with `manifest` is refused, if it is.
    fn refuses(&self, manifest: &Manifest) -> Option<Error> {
        // This cluster's own snapshot first: whatever else it is, it is not the one to use.
        if let (Some(from), Some(this)) = (&manifest.captured_from, &self.this_cluster)
            && from == this
            && !self.same_cluster
        {
            return Some(Error::SameCluster { snapshot: manifest.snapshot_id.to_string(), cluster: this.clone() });
        }
        if !manifest.is_consistent() && !self.inconsistent && !self.journal {
            let snapshot = manifest.snapshot_id.to_string();
            return Some(Error::Inconsistent { snapshot, reason: inconsistent(manifest) });
        }
        None
    }
}

/// Loads the pinned snapshot, or the newest complete one that verifies and that `accept`
/// accepts (consistent, not captured from this cluster, unless allowed).
pub async fn choose_snapshot(store: &SnapshotStore, pinned: Option<&SnapshotId>, accept: &Accept) -> Result<Loaded> {
    let newest = choose(store, pinned, None, accept).await?;
    match newest {
        Some(loaded) => Ok(loaded),
        None => Err(store.no_snapshot().await),
    }
}

/// The snapshot [`choose_snapshot`] would load now, unless that is `current`: then `None`,
/// and no payload is downloaded (the controller's periodic refresh).
pub async fn choose_newer(store: &SnapshotStore, current: &SnapshotId, accept: &Accept) -> Result<Option<Loaded>> {
    choose(store, None, Some(current), accept).await
}

async fn choose(
    store: &SnapshotStore,
    pinned: Option<&SnapshotId>,
    current: Option<&SnapshotId>,
    accept: &Accept,
) -> Result<Option<Loaded>> {
    // The manifest says whether the snapshot is consistent and where it was captured: a
    // refused one is passed over before its payload is downloaded.
    let load = |id: SnapshotId| async move {
        let (manifest, signer) = store.verified_manifest(&id, accept.trusted.as_deref()).await?;
        if let Some(refused) = accept.refuses(&manifest) {
            return Err(refused);
        }
        // An inconsistent base without a journal is refused before its payload is downloaded,
        // as before journals.
        let refused_alone = !manifest.is_consistent() && !accept.inconsistent;
        if accept.journal && refused_alone && !store.list_segments(&id).await?.iter().any(|s| s.header) {
            return Err(Error::Inconsistent { snapshot: id.to_string(), reason: inconsistent(&manifest) });
        }
        let records = Records::decode(&manifest, store.fetch_payload(&manifest).await?)?;
        if !accept.journal {
            return Ok::<_, Error>(Loaded { manifest, records, passed_over: vec![], signer, point: None });
        }
        let (records, point) = at_point(store, &manifest, records, accept).await?;
        Ok::<_, Error>(Loaded { manifest, records, passed_over: vec![], signer, point })
    };
    if let Some(id) = pinned {
        return load(id.clone()).await.map(Some);
    }
    let mut passed_over = Vec::new();
    let before_at = |id: &SnapshotId| accept.at.is_none_or(|at| id.timestamp().is_some_and(|t| t <= at));
    for entry in store.list().await?.into_iter().rev().filter(|e| e.complete && before_at(&e.id)) {
        if Some(&entry.id) == current {
            return Ok(None);
        }
        match load(entry.id.clone()).await {
            Err(Error::Inconsistent { snapshot, reason }) => {
                warn!(snapshot = %entry.id, "snapshot is inconsistent; trying the previous one");
                passed_over.push(Passed { snapshot, reason });
            }
            Err(e @ Error::SameCluster { .. }) => {
                warn!(snapshot = %entry.id, "snapshot was captured from this cluster; trying the previous one");
                passed_over.push(Passed { snapshot: entry.id.to_string(), reason: e.to_string() });
            }
            Ok(loaded) => return Ok(Some(Loaded { passed_over, ..loaded })),
            Err(e @ (Error::Store { .. } | Error::Io { .. } | Error::TooLarge { .. })) => return Err(e),
            Err(e @ (Error::Unsigned { .. } | Error::BadSignature { .. })) => {
                warn!(snapshot = %entry.id, error = %e, "snapshot is not signed by a trusted key; trying the previous one");
                passed_over.push(Passed { snapshot: entry.id.to_string(), reason: e.to_string() });
            }
            Err(e @ (Error::Encrypted { .. } | Error::Undecryptable { .. })) => {
                warn!(snapshot = %entry.id, error = %e, "snapshot cannot be decrypted with the keys given; trying the previous one");
                passed_over.push(Passed { snapshot: entry.id.to_string(), reason: e.to_string() });
            }
            Err(e) => {
                warn!(snapshot = %entry.id, error = %e, "snapshot skipped; trying the previous one");
                passed_over.push(Passed { snapshot: entry.id.to_string(), reason: e.to_string() });
            }
        }
    }
    if let Some(at) = accept.at
        && passed_over.is_empty()
    {
        return Err(Error::NoSnapshot {
            cluster: store.cluster_id().to_string(),
            location: store.location().to_string(),
            known: format!(" captured at or before {at} (--at)"),
        });
    }
    Err(Error::NoGoodSnapshot {
        cluster: store.cluster_id().to_string(),
        location: store.location().to_string(),
        passed_over: passed_over.len(),
    })
}

/// The records of a verified base at the point of its journal a restore goes to: the newest
/// complete point (or the newest at or before `accept.at`) at which the fleet was consistent
/// (any, with `accept.inconsistent`). `None` as the point when the base has no journal: its
/// records as they are. A base no point of which qualifies is refused as inconsistent.
async fn at_point(
    store: &SnapshotStore,
    manifest: &Manifest,
    records: Records,
    accept: &Accept,
) -> Result<(Records, Option<Point>)> {
    let id = &manifest.snapshot_id;
    let chain = store.read_chain(id, manifest.created_at, accept.trusted.as_deref()).await?;
    let gap = chain.stop_message(manifest.created_at);
    let Some(choice) = choose_point(&chain.links, accept.at, manifest.is_consistent(), accept.inconsistent) else {
        let reason = match chain.links.is_empty() {
            true => inconsistent(manifest),
            false => format!("{}, and so is every point of its journal", inconsistent(manifest)),
        };
        return Err(Error::Inconsistent { snapshot: id.to_string(), reason });
    };
    if chain.links.is_empty() && gap.is_none() {
        return Ok((records, None));
    }
    let applied = &chain.links[..choice.applied];
    let (time, consistent) = match applied.last() {
        Some(link) => (link.header.to, link.header.consistency.as_ref().is_none_or(|c| c.consistent)),
        None => (manifest.created_at, manifest.is_consistent()),
    };
    let passed_over: Vec<String> = choice
        .passed_over
        .iter()
        .map(|(seq, summary)| format!("segment {seq}: the fleet was inconsistent then ({summary})"))
        .collect();
    for passed in &passed_over {
        warn!(base = %id, "journal point passed over: {passed}");
    }
    let point = Point {
        base: id.to_string(),
        segments_applied: choice.applied as u64,
        segments_verified: chain.links.len() as u64,
        time,
        gap,
        passed_over,
        consistent,
    };
    info!(base = %id, segments = point.segments_applied, at = %point.time, "restoring to a point of the journal");
    if applied.is_empty() {
        return Ok((records, Some(point)));
    }
    Ok((Records::from_records(crate::format::point(&records, applied)?), Some(point)))
}

fn inconsistent(manifest: &Manifest) -> String {
    let summary = manifest.consistency.as_ref().map_or_else(|| "0 reasons".into(), |c| c.summary());
    format!("inconsistent capture ({summary}); --allow-inconsistent uses it")
}

/// A snapshot id, or `latest`: the newest snapshot with a manifest.
pub async fn resolve(store: &SnapshotStore, id: &str) -> Result<SnapshotId> {
    if id != "latest" {
        return id.parse();
    }
    let entries = store.list().await?;
    match entries.into_iter().rev().find(|e| e.complete) {
        Some(entry) => Ok(entry.id),
        None => Err(store.no_snapshot().await),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures::{append_segment, record, ts, uuid, write_snapshot};
    use crate::format::{Record, tombstone};

    fn server(name: &str, state: &str) -> Record {
        record("Server", name, &[uuid(name)], json!({"state": state}))
    }

    fn states(loaded: &Loaded) -> Vec<String> {
        (0..loaded.records.len())
            .map(|i| {
                let r = loaded.records.record(i).unwrap();
                format!("{}={}", r.name, r.status.get())
            })
            .collect()
    }

    fn journal() -> Accept {
        Accept { journal: true, ..Accept::default() }
    }

    #[tokio::test]
    async fn a_restore_reads_its_base_and_the_journal_to_the_newest_point() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let base =
            write_snapshot(&store, "2026-11-30T09:00:00Z", &[server("a", "Available"), server("b", "Available")], true)
                .await;
        append_segment(&store, &base, &[server("a", "Reserved")], 5, true).await;
        append_segment(&store, &base, &[tombstone(&server("b", "x")), server("c", "Initial")], 5, true).await;
        let loaded = choose_snapshot(&store, None, &journal()).await.unwrap();
        assert_eq!(states(&loaded), [r#"a={"state":"Reserved"}"#, r#"c={"state":"Initial"}"#]);
        let point = loaded.point.unwrap();
        assert_eq!((point.segments_applied, point.segments_verified, point.gap), (2, 2, None));
        assert_eq!(point.time, ts("2026-11-30T09:00:10Z"));
        assert_eq!(point.base, base.snapshot_id.to_string());

        // --at between the two segments.
        let at = Accept { at: Some(ts("2026-11-30T09:00:07Z")), ..journal() };
        let loaded = choose_snapshot(&store, None, &at).await.unwrap();
        assert_eq!(states(&loaded), [r#"a={"state":"Reserved"}"#, r#"b={"state":"Available"}"#]);
        assert_eq!(loaded.point.unwrap().segments_applied, 1);

        // Without journal reading: the snapshot alone.
        let loaded = choose_snapshot(&store, None, &Accept::default()).await.unwrap();
        assert_eq!(states(&loaded).len(), 2);
        assert!(loaded.point.is_none());
    }

    #[tokio::test]
    async fn a_base_without_journal_loads_as_before_and_at_picks_an_older_base() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let old = write_snapshot(&store, "2026-11-30T08:00:00Z", &[server("a", "Old")], true).await;
        write_snapshot(&store, "2026-11-30T09:00:00Z", &[server("a", "New")], true).await;
        let loaded = choose_snapshot(&store, None, &journal()).await.unwrap();
        assert!(loaded.point.is_none(), "no journal: no point");
        assert_eq!(states(&loaded), [r#"a={"state":"New"}"#]);
        let at = Accept { at: Some(ts("2026-11-30T08:30:00Z")), ..journal() };
        let loaded = choose_snapshot(&store, None, &at).await.unwrap();
        assert_eq!(loaded.manifest.snapshot_id, old.snapshot_id);
        let before_all = Accept { at: Some(ts("2026-11-30T07:00:00Z")), ..journal() };
        let err = choose_snapshot(&store, None, &before_all).await.err().unwrap().to_string();
        assert!(err.contains("no complete snapshot") && err.contains("at or before 2026-11-30T07:00:00Z"), "{err}");
    }

    #[tokio::test]
    async fn an_inconsistent_newest_point_steps_back_to_the_newest_consistent_one() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let base = write_snapshot(&store, "2026-11-30T09:00:00Z", &[server("a", "Available")], true).await;
        append_segment(&store, &base, &[server("a", "Reserved")], 5, true).await;
        append_segment(&store, &base, &[server("a", "Binding")], 5, false).await;
        let loaded = choose_snapshot(&store, None, &journal()).await.unwrap();
        let point = loaded.point.clone().unwrap();
        assert_eq!(point.segments_applied, 1);
        assert_eq!(point.passed_over.len(), 1, "{:?}", point.passed_over);
        assert_eq!(states(&loaded), [r#"a={"state":"Reserved"}"#]);
        let allowed = Accept { inconsistent: true, ..journal() };
        assert_eq!(choose_snapshot(&store, None, &allowed).await.unwrap().point.unwrap().segments_applied, 2);
    }

    #[tokio::test]
    async fn an_inconsistent_base_is_used_at_a_consistent_point_of_its_journal() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let older = write_snapshot(&store, "2026-11-30T08:00:00Z", &[server("a", "Old")], true).await;
        let base = write_snapshot(&store, "2026-11-30T09:00:00Z", &[server("a", "Binding")], false).await;
        // No journal: passed over for the older one, as before.
        let loaded = choose_snapshot(&store, None, &journal()).await.unwrap();
        assert_eq!(loaded.manifest.snapshot_id, older.snapshot_id);
        assert_eq!(loaded.passed_over.len(), 1);
        append_segment(&store, &base, &[server("a", "Reserved")], 5, true).await;
        let loaded = choose_snapshot(&store, None, &journal()).await.unwrap();
        assert_eq!(loaded.manifest.snapshot_id, base.snapshot_id);
        assert!(loaded.point.unwrap().consistent);
    }

    #[tokio::test]
    async fn a_corrupt_segment_restores_to_the_point_before_it_and_says_so() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let base = write_snapshot(&store, "2026-11-30T09:00:00Z", &[server("a", "Available")], true).await;
        append_segment(&store, &base, &[server("a", "Reserved")], 5, true).await;
        append_segment(&store, &base, &[server("a", "Tainted")], 5, true).await;
        let path = store.segment_object_path(&base.snapshot_id, 2, crate::format::SEGMENT_PAYLOAD_SUFFIX);
        object_store::ObjectStoreExt::put(
            store.object_store().as_ref(),
            &path,
            bytes::Bytes::from_static(b"garbage").into(),
        )
        .await
        .unwrap();
        let loaded = choose_snapshot(&store, None, &journal()).await.unwrap();
        assert_eq!(states(&loaded), [r#"a={"state":"Reserved"}"#]);
        let point = loaded.point.unwrap();
        assert_eq!((point.segments_applied, point.segments_verified), (1, 1));
        let gap = point.gap.unwrap();
        assert!(gap.starts_with(&format!("segment 2 of base {}: is corrupt", base.snapshot_id)), "{gap}");
        assert!(gap.ends_with("restoring to segment 1 at 2026-11-30T09:00:05Z"), "{gap}");
    }
}
