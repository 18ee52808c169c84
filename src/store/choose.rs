//! Which snapshot to restore from: the pinned one, or the newest complete one that loads,
//! verifies, (unless allowed otherwise) is consistent and was not captured from the cluster
//! the restore writes to, and, when keys are trusted, is signed by one of them; an encrypted one
//! only when a decryption key opens it. A damaged, foreign, own, unsigned, badly signed or
//! undecryptable snapshot is reported and passed over for the previous one, and so is one the
//! store will not hand out (a permission, an archived object, one under a key restatus does not
//! hold); a store that cannot be listed is an error, and so is one of which no snapshot could
//! be read.

use std::sync::Arc;

use jiff::Timestamp;
use serde::Serialize;
use tracing::{debug, info, warn};

use super::snapshots::SnapshotStore;
use crate::format::{Chain, ChainStop, KeyId, Manifest, Records, SnapshotId, TrustedKeys, choose_point};
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
    /// With [`Accept::journal`]: where the journal was read to, to read on from there
    /// ([`read_on`]).
    pub tail: Option<Tail>,
}

impl Loaded {
    /// The manifest a restore plans with: the base's, or at a point of its journal
    /// [`Point::manifest`].
    pub fn restore_manifest(&self) -> Manifest {
        match &self.point {
            Some(point) => point.manifest(&self.manifest),
            None => self.manifest.clone(),
        }
    }
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

impl Point {
    /// The manifest a restore plans with at this point: the base's, with the point's time as
    /// its capture time (a live status written after the point moved on, not one written after
    /// the base's capture) and the point's consistency verdict. The one-shot restore and the
    /// controller both plan with it.
    pub fn manifest(&self, base: &Manifest) -> Manifest {
        let mut manifest = base.clone();
        manifest.created_at = self.time;
        if let Some(consistency) = &mut manifest.consistency {
            consistency.consistent = self.consistent;
        }
        manifest
    }

    /// "base X + 3 segments at T", for logs and reports.
    pub fn describe(&self) -> String {
        match self.segments_applied {
            0 => format!("snapshot {} (no journal segment applied), at {}", self.base, self.time),
            1 => format!("snapshot {} + 1 journal segment, at {}", self.base, self.time),
            n => format!("snapshot {} + {n} journal segments, at {}", self.base, self.time),
        }
    }
}

/// Where a base's journal was read to, to read on from there: the base's manifest, the last
/// segment applied (its header and hash; its records are in the point's records already) and
/// the point.
#[derive(Debug, Clone)]
pub struct Tail {
    pub base: Manifest,
    /// The chain up to the point, holding only its last link (none at the base), records dropped.
    chain: Chain,
    /// The point the records are at.
    pub point: Point,
}

impl Tail {
    fn new(base: &Manifest, mut chain: Chain, applied: usize, point: Point) -> Tail {
        chain.links.truncate(applied);
        let last = chain.links.pop().map(crate::format::Link::without_records);
        chain.links = last.into_iter().collect();
        chain.stop = None;
        Tail { base: base.clone(), chain, point }
    }
}

/// What reading on from a [`Tail`] found.
#[derive(Debug)]
pub struct ReadOn {
    /// A newer point (its records, its tail), `None` when the point stays where it is.
    pub newer: Option<(Records, Tail)>,
    /// Where the chain stops before its end, and why (the point stays before it).
    pub gap: Option<String>,
}

/// Reads the segments written after `tail` (only those: the chain read so far is not read
/// again) and, when a newer point qualifies (as in [`choose_snapshot`]: the newest consistent
/// one, any with `accept.inconsistent`), the records at it: `records` (those at the tail's
/// point) with the new segments merged. Nothing is downloaded but the new segments.
pub async fn read_on(store: &SnapshotStore, tail: &Tail, records: &Records, accept: &Accept) -> Result<ReadOn> {
    let base = &tail.base;
    let known = tail.chain.links.len();
    let mut chain = store.read_chain_from(tail.chain.clone(), base.created_at, accept.trusted.as_deref()).await?;
    accept.demands.cut(&mut chain, known);
    let gap = chain.stop_message(base.created_at);
    let new = &chain.links[known..];
    let choice = choose_point(new, None, tail.point.consistent, accept.inconsistent);
    let Some(choice) = choice.filter(|c| c.applied > 0) else { return Ok(ReadOn { newer: None, gap }) };
    let applied = &new[..choice.applied];
    let last = &applied[applied.len() - 1].header;
    let passed_over: Vec<String> = choice
        .passed_over
        .iter()
        .map(|(seq, summary)| format!("segment {seq}: the fleet was inconsistent then ({summary})"))
        .collect();
    let point = Point {
        base: base.snapshot_id.to_string(),
        segments_applied: tail.point.segments_applied + choice.applied as u64,
        segments_verified: tail.point.segments_applied + new.len() as u64,
        time: last.to,
        gap: gap.clone(),
        passed_over,
        consistent: last.consistency.as_ref().is_none_or(|c| c.consistent),
    };
    let merged = merge(store, records, applied, &base.snapshot_id)?;
    let applied_in_chain = known + choice.applied;
    Ok(ReadOn { newer: Some((merged, Tail::new(base, chain, applied_in_chain, point))), gap })
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
    /// The snapshots refused so far for what they hold, not read again (see [`Refused`]).
    pub refused: Refused,
    /// What a reader demands of the snapshots themselves (`--expect-source`,
    /// `--require-encryption`).
    pub demands: Demands,
    /// Only snapshots whose manifest dates them (`createdAt`) at or before this (the journal:
    /// now plus the clock-skew tolerance); a later one is passed over, named.
    pub not_after: Option<Timestamp>,
}

/// Snapshots refused for what they hold (their manifest, signature, encryption or payload:
/// unsigned, forged, foreign, damaged, captured from this cluster, not decryptable with the
/// keys given), with why, remembered so that a long-running reader (the controller's refresh,
/// which keeps one `Accept`) does not read and verify every junk object again at each refresh:
/// a manifest is written create-only, so what refused it stays. Inconsistent ones are not
/// remembered (their journal may reach a consistent point), nor store errors. Only snapshots
/// still listed are kept. Consulted by [`choose_newer`] only (a one-shot choice reads afresh);
/// a clone starts empty (its options may differ).
#[derive(Debug, Default)]
pub struct Refused(Arc<std::sync::Mutex<std::collections::BTreeMap<SnapshotId, String>>>);

impl Clone for Refused {
    fn clone(&self) -> Self {
        Refused::default()
    }
}

impl Refused {
    fn get(&self, id: &SnapshotId) -> Option<String> {
        self.0.lock().ok().and_then(|known| known.get(id).cloned())
    }

    fn remember(&self, id: &SnapshotId, reason: &str) {
        if let Ok(mut known) = self.0.lock() {
            known.insert(id.clone(), reason.to_string());
        }
    }

    /// Forgets the snapshots no longer listed.
    fn keep_listed(&self, listed: &[super::SnapshotEntry]) {
        if let Ok(mut known) = self.0.lock() {
            known.retain(|id, _| listed.iter().any(|e| e.id == *id));
        }
    }

    /// How many are remembered.
    pub fn len(&self) -> usize {
        self.0.lock().map_or(0, |known| known.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a reader demands of a snapshot's manifest and of its journal's segments besides a good
/// signature: checked where a snapshot is chosen, before its payload is downloaded.
#[derive(Debug, Clone, Default)]
pub struct Demands {
    /// The sources a snapshot may have been captured from (their `kube-system` uids, as the
    /// manifest's signed `capturedFrom` says; `--expect-source`): a snapshot copied from
    /// another environment's prefix, or one that names no source, is refused. Empty: any.
    pub sources: Vec<String>,
    /// Only encrypted snapshots and segments (`--require-encryption`): a plain one is refused.
    pub encryption: bool,
}

impl Demands {
    /// Why a snapshot with `manifest` is refused, if it is.
    pub fn refuses(&self, manifest: &Manifest) -> Option<Error> {
        let snapshot = || manifest.snapshot_id.to_string();
        if !self.sources.is_empty() && !manifest.captured_from.as_ref().is_some_and(|from| self.sources.contains(from))
        {
            let captured_from = manifest.captured_from.clone().unwrap_or_else(|| "an unknown source".into());
            return Some(Error::WrongSource { snapshot: snapshot(), captured_from, expected: self.sources.join(", ") });
        }
        if self.encryption && manifest.encryption.is_none() {
            return Some(Error::NotEncrypted { snapshot: format!("snapshot {}", snapshot()) });
        }
        None
    }

    /// Cuts `chain` before its first link from `from` on that these demands refuse (a plain
    /// segment, with encryption required), as a gap: the point stays before it.
    pub fn cut(&self, chain: &mut Chain, from: usize) {
        if !self.encryption {
            return;
        }
        let Some(at) = chain.links.iter().skip(from).position(|l| l.header.encryption.is_none()) else { return };
        let refused = chain.links.drain(from + at..).next().map(|l| l.header.sequence);
        if let Some(sequence) = refused {
            let reason = Error::NotEncrypted { snapshot: "the segment".into() }.to_string();
            chain.stop = Some(ChainStop { sequence, reason });
        }
    }
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
        if let Some(refused) = self.demands.refuses(manifest) {
            return Some(refused);
        }
        if let Some(limit) = self.not_after
            && manifest.created_at > limit
        {
            let (snapshot, at) = (manifest.snapshot_id.to_string(), manifest.created_at.to_string());
            return Some(Error::DatedAhead { snapshot, at });
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
/// and no payload is downloaded (the controller's periodic refresh). Never one older than
/// `current`: when `current` is gone from the bucket and nothing newer is good, the error
/// [`Error::SnapshotInUseGone`] says so (the controller keeps `current` and alerts).
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
        if !accept.journal {
            let records = Records::decode(&manifest, store.verified_payload(&manifest).await?)?;
            return Ok::<_, Error>(Loaded { manifest, records, passed_over: vec![], signer, point: None, tail: None });
        }
        // The chain first: a base no point of which qualifies (an inconsistent base without
        // a journal, as before journals, or whose every point is inconsistent) is refused
        // before its payload is downloaded (the controller asks at every refresh).
        let (records, point, tail) = at_point(store, &manifest, accept).await?;
        Ok::<_, Error>(Loaded { manifest, records, passed_over: vec![], signer, point, tail: Some(tail) })
    };
    if let Some(id) = pinned {
        return load(id.clone()).await.map(Some);
    }
    let mut passed_over = Vec::new();
    // The first store error met: when every snapshot passed over was unreadable, the store is
    // what failed, and that is the error.
    let mut unreadable: (usize, Option<Error>) = (0, None);
    let before_at = |id: &SnapshotId| accept.at.is_none_or(|at| id.timestamp().is_some_and(|t| t <= at));
    let listed = store.list().await?;
    accept.refused.keep_listed(&listed);
    for entry in listed.into_iter().rev().filter(|e| e.complete && before_at(&e.id)) {
        // The one in use, or (it is gone) an older one: never back in time.
        if let Some(current) = current
            && entry.id <= *current
        {
            return match entry.id == *current {
                true => Ok(None),
                false => Err(in_use_gone(store, current, Some(&entry.id))),
            };
        }
        if let Some(reason) = current.and_then(|_| accept.refused.get(&entry.id)) {
            debug!(snapshot = %entry.id, "refused before, not read again: {reason}");
            passed_over.push(Passed { snapshot: entry.id.to_string(), reason });
            continue;
        }
        let refused = |e: &Error| {
            accept.refused.remember(&entry.id, &e.to_string());
            Passed { snapshot: entry.id.to_string(), reason: e.to_string() }
        };
        match load(entry.id.clone()).await {
            Err(Error::Inconsistent { snapshot, reason }) => {
                warn!(snapshot = %entry.id, "snapshot is inconsistent; trying the previous one");
                passed_over.push(Passed { snapshot, reason });
            }
            Err(e @ Error::SameCluster { .. }) => {
                warn!(snapshot = %entry.id, "snapshot was captured from this cluster; trying the previous one");
                passed_over.push(refused(&e));
            }
            Ok(loaded) => return Ok(Some(Loaded { passed_over, ..loaded })),
            Err(e @ (Error::Io { .. } | Error::TooLarge { .. })) => return Err(e),
            Err(e @ Error::Store { .. }) => {
                warn!(snapshot = %entry.id, error = %e, "snapshot cannot be read from the store; trying the previous one");
                passed_over.push(Passed { snapshot: entry.id.to_string(), reason: format!("cannot be read: {e}") });
                unreadable.0 += 1;
                unreadable.1.get_or_insert(e);
            }
            Err(e @ (Error::Unsigned { .. } | Error::BadSignature { .. })) => {
                warn!(snapshot = %entry.id, error = %e, "snapshot is not signed by a trusted key; trying the previous one");
                passed_over.push(refused(&e));
            }
            Err(e @ (Error::Encrypted { .. } | Error::Undecryptable { .. })) => {
                warn!(snapshot = %entry.id, error = %e, "snapshot cannot be decrypted with the keys given; trying the previous one");
                passed_over.push(refused(&e));
            }
            Err(e) => {
                warn!(snapshot = %entry.id, error = %e, "snapshot skipped; trying the previous one");
                passed_over.push(refused(&e));
            }
        }
    }
    if let Some(current) = current {
        return Err(in_use_gone(store, current, None));
    }
    if let (count, Some(e)) = unreadable
        && count == passed_over.len()
    {
        return Err(e);
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

/// The controller's snapshot in use is gone from the listing; `older`: the newest one left
/// before it.
fn in_use_gone(store: &SnapshotStore, current: &SnapshotId, older: Option<&SnapshotId>) -> Error {
    Error::SnapshotInUseGone {
        in_use: current.to_string(),
        location: store.location().to_string(),
        older: older.map_or_else(|| "none older either".into(), |id| format!("the newest before it is {id}")),
    }
}

/// The records of a verified base at the point of its journal a restore goes to: the newest
/// complete point (or the newest at or before `accept.at`) at which the fleet was consistent
/// (any, with `accept.inconsistent`). `None` as the point when the base has no journal: its
/// records as they are. A base no point of which qualifies is refused as inconsistent.
async fn at_point(
    store: &SnapshotStore,
    manifest: &Manifest,
    accept: &Accept,
) -> Result<(Records, Option<Point>, Tail)> {
    let (chain, point) = chain_point(store, manifest, accept).await?;
    let records = Records::decode(manifest, store.verified_payload(manifest).await?)?;
    let applied = &chain.links[..point.segments_applied as usize];
    let records = match applied.is_empty() {
        true => records,
        false => merge(store, &records, applied, &manifest.snapshot_id)?,
    };
    let no_journal = chain.links.is_empty() && point.gap.is_none();
    let tail = Tail::new(manifest, chain, point.segments_applied as usize, point.clone());
    if no_journal {
        return Ok((records, None, tail));
    }
    info!(base = %manifest.snapshot_id, segments = point.segments_applied, at = %point.time, "restoring to a point of the journal");
    Ok((records, Some(point), tail))
}

/// The base's chain, read and verified, and the point of it `accept` goes to (see
/// [`at_point`]).
async fn chain_point(store: &SnapshotStore, manifest: &Manifest, accept: &Accept) -> Result<(Chain, Point)> {
    let id = &manifest.snapshot_id;
    let empty = crate::format::Chain::empty(id.clone());
    let mut chain = store.read_chain_from(empty, manifest.created_at, accept.trusted.as_deref()).await?;
    accept.demands.cut(&mut chain, 0);
    let gap = chain.stop_message(manifest.created_at);
    let Some(choice) = choose_point(&chain.links, accept.at, manifest.is_consistent(), accept.inconsistent) else {
        let reason = match chain.links.is_empty() {
            true => inconsistent(manifest),
            false => format!("{}, and so is every point of its journal", inconsistent(manifest)),
        };
        return Err(Error::Inconsistent { snapshot: id.to_string(), reason });
    };
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
    Ok((chain, point))
}

/// A snapshot as `snapshots show` and `snapshots diff` see it: with `at`, its journal's newest
/// complete point at or before `at` (any time: the newest complete point), whatever the
/// fleet's verdict there (the point says it); without a journal (or `journal` false), the
/// snapshot alone (no point). `records` false: the manifest and the point only, the base's
/// payload is not downloaded (the records are empty).
pub async fn snapshot_at(
    store: &SnapshotStore,
    id: &SnapshotId,
    trusted: Option<&TrustedKeys>,
    journal: bool,
    at: Option<Timestamp>,
    records: bool,
) -> Result<(Manifest, Records, Option<Point>)> {
    let (manifest, _) = store.verified_manifest(id, trusted).await?;
    let base = match records {
        true => Records::decode(&manifest, store.verified_payload(&manifest).await?)?,
        false => Records::from_records(vec![]),
    };
    if !journal {
        return Ok((manifest, base, None));
    }
    let accept = Accept {
        inconsistent: true,
        trusted: trusted.map(|t| Arc::new(t.clone())),
        journal: true,
        at,
        ..Accept::default()
    };
    let (chain, point) = chain_point(store, &manifest, &accept).await?;
    if chain.links.is_empty() && point.gap.is_none() {
        return Ok((manifest, base, None));
    }
    let applied = &chain.links[..point.segments_applied as usize];
    let merged = match records && !applied.is_empty() {
        true => merge(store, &base, applied, id)?,
        false => base,
    };
    Ok((manifest, merged, Some(point)))
}

/// The records of a base (`records`) with the segments `applied` merged in
/// ([`crate::format::merge`]): written into temporary files as they are merged, so that
/// neither the chain's records nor the merged ones are held decoded in memory.
fn merge(
    store: &SnapshotStore,
    records: &Records,
    applied: &[crate::format::Link],
    base: &SnapshotId,
) -> Result<Records> {
    crate::format::merge(records, applied, base, || store.spill_writer(base))
}

fn inconsistent(manifest: &Manifest) -> String {
    let summary = manifest.consistency.as_ref().map_or_else(|| "0 reasons".into(), |c| c.summary());
    format!("inconsistent capture ({summary}); --allow-inconsistent uses it")
}

/// A snapshot id, or `latest`: the newest snapshot with a manifest.
pub async fn resolve(store: &SnapshotStore, id: &str) -> Result<SnapshotId> {
    resolve_at(store, id, None, None).await
}

/// [`resolve`], and with `at` (`latest@TIME`, `--at`), `latest` is the newest snapshot with a
/// manifest captured at or before `at` (an id stays that id: `at` picks its journal's point);
/// with `trusted` keys, the newest whose manifest one of them signed ([`newest_verified`]: a
/// forged newer manifest is passed over, named, and never becomes `latest`).
pub async fn resolve_at(
    store: &SnapshotStore,
    id: &str,
    at: Option<Timestamp>,
    trusted: Option<&TrustedKeys>,
) -> Result<SnapshotId> {
    if id != "latest" {
        return id.parse();
    }
    match newest_verified(store, at, trusted).await? {
        Some((manifest, _)) => Ok(manifest.snapshot_id),
        None => match at {
            Some(at) => Err(Error::NoSnapshotAt { at: at.to_string(), location: store.location().to_string() }),
            None => Err(store.no_snapshot().await),
        },
    }
}

/// The manifest of the newest complete snapshot (captured at or before `at`, when given), and
/// with `trusted` keys the newest whose manifest verifies: one unsigned or signed by another
/// key is passed over (logged, named) before anything it says is believed, its date above all.
/// Without keys, the newest manifest as it is (the run has no keys to judge it by). What the
/// readers of "the newest snapshot" share: `latest`, the bucket's metrics, preflight's look at
/// the newest snapshot. `None` when there is none.
pub async fn newest_verified(
    store: &SnapshotStore,
    at: Option<Timestamp>,
    trusted: Option<&TrustedKeys>,
) -> Result<Option<(Manifest, Option<KeyId>)>> {
    newest_verified_remembering(store, at, trusted, &Refused::default()).await
}

/// [`newest_verified`] for a reader that asks again and again (the controller's metrics of
/// the bucket's newest snapshot, every refresh): a snapshot whose signature was refused once
/// is remembered in `refused` and not read again (a manifest is written create-only).
pub async fn newest_verified_remembering(
    store: &SnapshotStore,
    at: Option<Timestamp>,
    trusted: Option<&TrustedKeys>,
    refused: &Refused,
) -> Result<Option<(Manifest, Option<KeyId>)>> {
    let by_then = |id: &SnapshotId| at.is_none_or(|at| id.timestamp().is_some_and(|t| t <= at));
    let listed = store.list().await?;
    refused.keep_listed(&listed);
    for entry in listed.into_iter().rev().filter(|e| e.complete && by_then(&e.id)) {
        if refused.get(&entry.id).is_some() {
            continue;
        }
        match store.verified_manifest(&entry.id, trusted).await {
            Ok(verified) => return Ok(Some(verified)),
            Err(e @ (Error::Unsigned { .. } | Error::BadSignature { .. })) => {
                warn!(snapshot = %entry.id, error = %e, "snapshot is not signed by a trusted key; passed over");
                refused.remember(&entry.id, &e.to_string());
            }
            Err(e) => return Err(e),
        }
    }
    Ok(None)
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

    /// F151: with one signing key across environments, a staging snapshot copied into the
    /// production prefix is newer and verifies: without a named source it is used (the
    /// attack); with `--expect-source` it is passed over, named, for the production one, and
    /// pinned it is refused; a snapshot that names no source is refused too.
    #[tokio::test]
    async fn a_snapshot_of_another_source_is_refused_when_the_expected_source_is_named() {
        use crate::fixtures::snapshot;
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let key = crate::format::SigningKey::generate();
        let trusted = Some(Arc::new(TrustedKeys::new([key.public_key()])));
        let prod = [server("a", "Reserved")];
        let staging = [server("a", "Available")];
        let at = |t: &str| ts(t);
        let genuine = snapshot(&prod)
            .at(at("2026-11-30T09:00:00Z"))
            .captured_from("prod-uid")
            .signed_with(&key)
            .write(&store)
            .await;
        let copied = snapshot(&staging)
            .at(at("2026-11-30T10:00:00Z"))
            .captured_from("stg-uid")
            .signed_with(&key)
            .write(&store)
            .await;
        let trusting = Accept { trusted: trusted.clone(), ..journal() };
        let loaded = choose_snapshot(&store, None, &trusting).await.unwrap();
        assert_eq!(loaded.manifest.snapshot_id, copied.snapshot_id, "the attack: the copy verifies and is newest");

        let demands = Demands { sources: vec!["prod-uid".into()], encryption: false };
        let expecting = Accept { demands, ..trusting };
        let loaded = choose_snapshot(&store, None, &expecting).await.unwrap();
        assert_eq!(loaded.manifest.snapshot_id, genuine.snapshot_id);
        assert_eq!(states(&loaded), [r#"a={"state":"Reserved"}"#]);
        assert_eq!(loaded.passed_over.len(), 1);
        let reason = &loaded.passed_over[0].reason;
        assert!(reason.contains("captured from stg-uid, not from the expected source (prod-uid"), "{reason}");
        let pinned = choose_snapshot(&store, Some(&copied.snapshot_id), &expecting).await.err().unwrap();
        assert!(matches!(pinned, Error::WrongSource { .. }), "{pinned}");

        // A snapshot that names no source is not one of the expected sources.
        let unnamed = snapshot(&staging).at(at("2026-11-30T11:00:00Z")).signed_with(&key).write(&store).await;
        let err = choose_snapshot(&store, Some(&unnamed.snapshot_id), &expecting).await.err().unwrap();
        assert!(err.to_string().contains("captured from an unknown source"), "{err}");
    }

    /// F152: whoever can write the bucket writes a plain snapshot (no key needed) and plain
    /// segments on an encrypted base: a reader that requires encryption passes the snapshot
    /// over for the encrypted one and stops the chain before the plain segment, naming it.
    #[tokio::test]
    async fn a_reader_that_requires_encryption_refuses_plain_snapshots_and_segments() {
        use crate::fixtures::snapshot;
        use crate::format::{DecryptionKeys, Recipients};
        let (text, recipient) = DecryptionKeys::generate(ts("2026-11-30T08:00:00Z"));
        let keys = DecryptionKeys::parse_all("k", &text).unwrap();
        let recipients = Recipients::load(&[recipient]).unwrap().unwrap();
        let store = SnapshotStore::open("memory://", "c").unwrap().with_decryption_keys(Some(Arc::new(keys)));
        let genuine = [server("a", "Reserved")];
        let base = snapshot(&genuine).at(ts("2026-11-30T09:00:00Z")).encrypted_to(&recipients).write(&store).await;
        append_segment(&store, &base, &[server("a", "Forged")], 5, true).await;
        let forged = [server("a", "Available")];
        let plain = snapshot(&forged).at(ts("2026-11-30T10:00:00Z")).write(&store).await;
        let loaded = choose_snapshot(&store, None, &journal()).await.unwrap();
        assert_eq!(loaded.manifest.snapshot_id, plain.snapshot_id, "the attack: the plain forgery is newest");

        let requiring = Accept { demands: Demands { sources: vec![], encryption: true }, ..journal() };
        let loaded = choose_snapshot(&store, None, &requiring).await.unwrap();
        assert_eq!(loaded.manifest.snapshot_id, base.snapshot_id);
        assert!(loaded.passed_over[0].reason.contains("not encrypted"), "{:?}", loaded.passed_over);
        assert_eq!(states(&loaded), [r#"a={"state":"Reserved"}"#], "the plain segment is not applied");
        let point = loaded.point.unwrap();
        assert_eq!(point.segments_applied, 0);
        let gap = point.gap.unwrap();
        assert!(gap.contains("segment 1 of base") && gap.contains("not encrypted"), "{gap}");

        // The controller's refresh reads on: a plain segment after an encrypted one stops it too.
        let tail = loaded.tail.unwrap();
        let read = read_on(&store, &tail, &loaded.records, &requiring).await.unwrap();
        assert!(read.newer.is_none() && read.gap.is_some_and(|g| g.contains("not encrypted")));
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

    /// The controller's refresh: only the segments written since are read; the point moves on
    /// to the newest consistent one; nothing new, no newer point; a missing segment keeps the
    /// point before it and names the gap.
    #[tokio::test]
    async fn reading_on_from_a_tail_reads_the_new_segments_only_and_stops_at_a_gap() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let base =
            write_snapshot(&store, "2026-11-30T09:00:00Z", &[server("a", "Available"), server("b", "Available")], true)
                .await;
        append_segment(&store, &base, &[server("a", "Reserved")], 5, true).await;
        let loaded = choose_snapshot(&store, None, &journal()).await.unwrap();
        let tail = loaded.tail.clone().unwrap();
        assert_eq!(tail.point.segments_applied, 1);
        let nothing = read_on(&store, &tail, &loaded.records, &journal()).await.unwrap();
        assert!(nothing.newer.is_none() && nothing.gap.is_none(), "{nothing:?}");

        // Segment 1 damaged now: it is not read again (a full read would stop before it).
        let one = store.segment_object_path(&base.snapshot_id, 1, crate::format::SEGMENT_PAYLOAD_SUFFIX);
        append_segment(&store, &base, &[server("b", "Binding")], 5, false).await;
        append_segment(&store, &base, &[server("b", "Reserved"), server("c", "Initial")], 5, true).await;
        let original = object_store::ObjectStoreExt::get(store.object_store().as_ref(), &one).await.unwrap();
        let original = original.bytes().await.unwrap();
        object_store::ObjectStoreExt::put(store.object_store().as_ref(), &one, bytes::Bytes::from_static(b"x").into())
            .await
            .unwrap();
        let read = read_on(&store, &tail, &loaded.records, &journal()).await.unwrap();
        let (records, newer) = read.newer.unwrap();
        assert_eq!(
            (newer.point.segments_applied, newer.point.segments_verified, newer.point.time),
            (3, 3, ts("2026-11-30T09:00:15Z"))
        );
        assert_eq!(newer.point.passed_over.len(), 0, "segment 2 is behind the point, not passed over");
        let loaded_at = Loaded { records, point: Some(newer.point.clone()), tail: None, ..loaded };
        assert_eq!(
            states(&loaded_at),
            [r#"a={"state":"Reserved"}"#, r#"b={"state":"Reserved"}"#, r#"c={"state":"Initial"}"#]
        );
        assert_eq!(loaded_at.restore_manifest().created_at, ts("2026-11-30T09:00:15Z"), "the point's time");

        // Segment 4 missing (5 there): the point stays at 3, the gap named.
        object_store::ObjectStoreExt::put(store.object_store().as_ref(), &one, original.into()).await.unwrap();
        append_segment(&store, &base, &[server("a", "Tainted")], 5, true).await;
        append_segment(&store, &base, &[server("a", "Error")], 5, true).await;
        let four = store.segment_object_path(&base.snapshot_id, 4, crate::format::SEGMENT_HEADER_SUFFIX);
        object_store::ObjectStoreExt::delete(store.object_store().as_ref(), &four).await.unwrap();
        let read = read_on(&store, &newer, &loaded_at.records, &journal()).await.unwrap();
        assert!(read.newer.is_none());
        let gap = read.gap.unwrap();
        assert!(gap.starts_with(&format!("segment 4 of base {}: is missing", base.snapshot_id)), "{gap}");
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

    /// F143: what the store will not hand out (`PermissionDenied`, as S3 answers for a
    /// permission, an object under SSE-C or in an archive tier) is passed over, named, as a
    /// corrupt snapshot or segment is: a segment stops the chain before it (a restore and the
    /// controller's read on stay at the point before, the gap named), a snapshot is passed
    /// over for the previous one. Only when no snapshot can be read is the store's error the
    /// error. (Before, each aborted the choice, and every read on failed.)
    #[tokio::test]
    async fn what_the_store_will_not_hand_out_is_passed_over_named() {
        let scripted = crate::fixtures::ScriptedStore::new();
        let store = SnapshotStore::new(scripted.clone(), "", "c", "scripted://".into()).unwrap();
        let older = write_snapshot(&store, "2026-11-30T08:00:00Z", &[server("a", "Old")], true).await;
        let newer = write_snapshot(&store, "2026-11-30T09:00:00Z", &[server("a", "Available")], true).await;
        append_segment(&store, &newer, &[server("a", "Reserved")], 5, true).await;
        append_segment(&store, &newer, &[server("a", "Tainted")], 5, true).await;
        let two = store.segment_object_path(&newer.snapshot_id, 2, crate::format::SEGMENT_PAYLOAD_SUFFIX);
        scripted.refuse(two.as_ref());

        let loaded = choose_snapshot(&store, None, &journal()).await.unwrap();
        assert_eq!(states(&loaded), [r#"a={"state":"Reserved"}"#]);
        let gap = loaded.point.clone().unwrap().gap.unwrap();
        assert!(gap.starts_with(&format!("segment 2 of base {}: cannot be read", newer.snapshot_id)), "{gap}");
        assert!(gap.contains("AccessDenied"), "{gap}");
        let tail = loaded.tail.clone().unwrap();
        let read = read_on(&store, &tail, &loaded.records, &journal()).await.unwrap();
        assert!(read.newer.is_none() && read.gap.is_some_and(|g| g.contains("cannot be read")));

        scripted.refuse(store.manifest_path(&newer.snapshot_id).as_ref());
        let loaded = choose_snapshot(&store, None, &journal()).await.unwrap();
        assert_eq!(loaded.manifest.snapshot_id, older.snapshot_id);
        let passed = &loaded.passed_over[0];
        assert_eq!(passed.snapshot, newer.snapshot_id.to_string());
        assert!(passed.reason.starts_with("cannot be read") && passed.reason.contains("AccessDenied"), "{passed:?}");

        scripted.refuse(store.payload_path(&older.snapshot_id).as_ref());
        let err = choose_snapshot(&store, None, &journal()).await.err().unwrap();
        assert!(matches!(&err, Error::Store { .. }), "nothing readable: the store's error, not {err}");
    }

    /// F146: with keys, `latest` (`snapshots show|diff|verify`) is the newest snapshot a
    /// trusted key signed: a forged newer manifest is passed over, never shown as the newest.
    #[tokio::test]
    async fn latest_with_keys_is_the_newest_signed_snapshot() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let key = crate::format::SigningKey::generate();
        let trusted = TrustedKeys::new([key.public_key()]);
        let signed = crate::fixtures::snapshot(&[server("a", "On")])
            .at(ts("2026-11-30T08:00:00Z"))
            .signed_with(&key)
            .write(&store)
            .await;
        let forged = write_snapshot(&store, "2999-01-01T00:00:00Z", &[server("a", "Off")], true).await;
        assert_eq!(resolve_at(&store, "latest", None, None).await.unwrap(), forged.snapshot_id);
        assert_eq!(resolve_at(&store, "latest", None, Some(&trusted)).await.unwrap(), signed.snapshot_id);
        let (manifest, records, _) =
            snapshot_at(&store, &signed.snapshot_id, Some(&trusted), true, None, true).await.unwrap();
        assert_eq!((manifest.snapshot_id, records.len()), (signed.snapshot_id, 1));
    }

    /// `latest` is the newest complete snapshot, `latest@TIME` the newest captured by then (one
    /// being written does not count), and none by then is an error naming the time; an id is
    /// that id, whatever the time.
    #[tokio::test]
    async fn latest_at_a_time_is_the_newest_complete_snapshot_captured_by_then() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let older = write_snapshot(&store, "2026-11-30T08:00:00Z", &[server("a", "On")], true).await;
        let newer = write_snapshot(&store, "2026-11-30T09:00:00Z", &[server("a", "Off")], true).await;
        let writing = SnapshotId::new(ts("2026-11-30T08:30:00Z"));
        object_store::ObjectStoreExt::put(
            store.object_store().as_ref(),
            &store.payload_path(&writing),
            bytes::Bytes::from_static(b"x").into(),
        )
        .await
        .unwrap();
        assert_eq!(resolve(&store, "latest").await.unwrap(), newer.snapshot_id);
        let at = |t: &str| Some(ts(t));
        assert_eq!(resolve_at(&store, "latest", at("2026-11-30T08:59:59Z"), None).await.unwrap(), older.snapshot_id);
        assert_eq!(resolve_at(&store, "latest", at("2026-11-30T09:00:00Z"), None).await.unwrap(), newer.snapshot_id);
        let err = resolve_at(&store, "latest", at("2026-11-30T07:00:00Z"), None).await.unwrap_err();
        assert!(matches!(&err, Error::NoSnapshotAt { at, .. } if at == "2026-11-30T07:00:00Z"), "{err}");
        let id = resolve_at(&store, newer.snapshot_id.as_str(), at("2026-11-30T07:00:00Z"), None).await.unwrap();
        assert_eq!(id, newer.snapshot_id);
    }
}
