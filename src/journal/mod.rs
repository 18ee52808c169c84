//! The journal (`restatus journal`): between scheduled snapshots, every status change of the
//! source cluster goes to the bucket within an interval, as a segment chained to the newest
//! snapshot (its base). See `docs/FORMAT.md`, "Journal segments".
//!
//! Base → its records and existing chain (a restart resumes after the last good segment) →
//! watch each kind of the profile (the watches' first listing is diffed against the chain, so
//! nothing that changed while the journal was away is lost; a re-list after a 410 the same)
//! → every interval, one segment of the objects whose status differs from what base and chain
//! yield, written create-only (nothing when nothing differs) → when a newer snapshot appears,
//! a final segment on the old chain and a new chain on the new base, whose first segment holds
//! every object whose live status differs from the new base's record. On a stop (SIGTERM),
//! a final segment of what is pending. What it did and its lag: [`metrics::JournalMetrics`].

mod capture;
pub mod metrics;
pub mod state;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use jiff::Timestamp;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};

use crate::domain::identity::{KindProfile, Profile};
use crate::domain::object::RawObject;
use crate::format::{
    CLOCK_SKEW_TOLERANCE, Link, Manifest, PayloadEncoder, Recipients, Records, SegmentHeader, SigningKey, SnapshotId,
    TrustedKeys, sha256_hex,
};
use crate::k8s::watch::{RawResource, WatchEvent, WatchRequest, unavailable_reason, watch_objects};
use crate::store::{Accept, SnapshotStore, choose_snapshot};
use crate::{Error, Result};
use metrics::{JournalError, JournalMetrics};
use state::{Cut, JournalState};

#[derive(Debug, Clone)]
pub struct JournalOptions {
    pub profile: Profile,
    /// Only objects with these labels (a Kubernetes label selector).
    pub selector: Option<String>,
    /// How often a segment is cut (when something changed).
    pub interval: Duration,
    /// How often the bucket is asked for a newer base snapshot.
    pub base_refresh: Duration,
    /// How long to wait for a first snapshot to chain to.
    pub base_wait: Duration,
    pub zstd_level: i32,
    /// Signs each segment header (`--signing-key`).
    pub signing_key: Option<Arc<SigningKey>>,
    /// Encrypts each segment's records (`--encrypt-to`).
    pub recipients: Option<Arc<Recipients>>,
    /// The `--trusted-key`s. The journal judges its base and its chain by these and the public
    /// half of its `--signing-key` ([`JournalOptions::keys`]); `None` and no signing key: any
    /// snapshot.
    pub trusted: Option<Arc<TrustedKeys>>,
    /// Where the run reports what it does (`--metrics-addr` serves them); `None`: its own.
    pub metrics: Option<Arc<JournalMetrics>>,
    /// A chain this long is folded into a new base snapshot (compaction), on which a new
    /// chain starts: a restore never reads more segments than this (and a last one or two
    /// written while the journal moves to the new base).
    pub max_segments: u64,
}

/// The longest wait before a broken watch starts again (with a listing).
const MAX_WATCH_BACKOFF: Duration = Duration::from_secs(30);

/// The default `--max-segments`: an hour of segments at the default 5 s interval.
pub const DEFAULT_MAX_SEGMENTS: u64 = 720;

impl JournalOptions {
    pub fn new(profile: Profile) -> Self {
        JournalOptions {
            profile,
            selector: None,
            interval: Duration::from_secs(5),
            base_refresh: Duration::from_secs(30),
            base_wait: Duration::from_secs(600),
            zstd_level: 3,
            signing_key: None,
            recipients: None,
            trusted: None,
            metrics: None,
            max_segments: DEFAULT_MAX_SEGMENTS,
        }
    }

    /// The keys a base and every segment of its chain must be signed by: the `--trusted-key`s
    /// and the public half of the journal's own `--signing-key`. A signing journal never
    /// adopts, extends or folds a base nobody it trusts signed (a forged snapshot would
    /// otherwise be carried on under its signature); `None` (neither given): anything.
    pub fn keys(&self) -> Option<Arc<TrustedKeys>> {
        match (&self.trusted, &self.signing_key) {
            (Some(trusted), Some(key)) => Some(Arc::new(trusted.and(key.public_key()))),
            (None, Some(key)) => Some(Arc::new(TrustedKeys::new([key.public_key()]))),
            (trusted, None) => trusted.clone(),
        }
    }

    fn kinds(&self) -> Vec<KindProfile> {
        // Secret and BMCSecret never: the profile denies them whatever it says.
        self.profile.kinds.iter().filter(|k| !k.is_denied()).cloned().collect()
    }
}

/// What a journal run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JournalSummary {
    pub segments: u64,
    pub bases: Vec<String>,
}

/// The chain being extended.
struct Chain {
    base: Manifest,
    next: u64,
    previous: Option<String>,
    /// The point in time the chain brings a restore to.
    point: Timestamp,
    /// The chain stops at a gap this journal cannot write past (a corrupt, refused or
    /// pre-created segment): nothing is written on it; the journal starts a new chain on a
    /// base of its own capture ([`restart`]) once a change is pending.
    broken: Option<String>,
    /// [`restart`] was tried on this chain (once: a failure waits for a newer base).
    restarted: bool,
    /// What its segments and its fold are encrypted to: the journal's `--encrypt-to` and, when
    /// the base is encrypted, the base's recipients (nothing written is clearer than the base).
    recipients: Option<Arc<Recipients>>,
}

/// What a watch tells the loop: the kind (its index) and the event, with when it arrived.
enum Seen {
    Event(usize, Box<WatchEvent<RawResource>>, Instant),
    /// The kind cannot be watched (forbidden, not served; `first`: since it last listed), as
    /// the API server said at that time.
    Unavailable {
        index: usize,
        reason: String,
        not_served: bool,
        first: bool,
        at: Timestamp,
    },
    /// The watch broke at that time (an error it is listed again after).
    Broken(usize, Timestamp),
}

/// Runs the journal until `stop` completes; then writes a final segment of what is pending.
pub async fn run(
    client: &kube::Client,
    store: &SnapshotStore,
    opts: &JournalOptions,
    stop: impl Future<Output = ()>,
) -> Result<JournalSummary> {
    tokio::pin!(stop);
    let kinds = opts.kinds();
    let metrics = opts.metrics.clone().unwrap_or_else(|| Arc::new(JournalMetrics::new(store.cluster_id())));
    let mut summary = JournalSummary::default();
    let first = tokio::select! {
        first = wait_for_base(client, store, opts) => Some(first?),
        _ = &mut stop => None,
    };
    let Some((mut chain, mut state)) = first else {
        info!("journal stopped before a base snapshot was found");
        return Ok(summary);
    };
    summary.bases.push(chain.base.snapshot_id.to_string());
    report_chain(&metrics, &chain);
    report(&metrics, &chain, &mut state, &kinds);
    let (mut watches, mut events) = start_watches(client, &kinds, opts, &metrics);
    let mut cut_tick = tokio::time::interval(opts.interval);
    cut_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut base_tick = tokio::time::interval(opts.base_refresh);
    base_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    base_tick.tick().await;
    // The base whose chain was folded last: folded once, whatever happens next.
    let mut folded: Option<SnapshotId> = None;
    // A base of the journal's own capture that replaces a chain it cannot fold (an encrypted
    // base it cannot read), taken up at the next base tick, now.
    let mut captured: Option<(Chain, JournalState)> = None;
    loop {
        tokio::select! {
            _ = &mut stop => break,
            seen = events.recv() => match seen {
                Some(seen) => {
                    let before = state.all_listed(&kinds);
                    observe(&mut state, &kinds, seen);
                    if !before && state.all_listed(&kinds) {
                        info!(base = %chain.base.snapshot_id, pending = state.pending(), "every kind listed and diffed against the chain");
                    }
                    report(&metrics, &chain, &mut state, &kinds);
                }
                None => return Err(Error::io("journal watches", std::io::Error::other("every watch ended"))),
            },
            _ = cut_tick.tick() => {
                if state.all_listed(&kinds) {
                    summary.segments += write_segment(store, opts, &metrics, &mut chain, &mut state).await;
                    report(&metrics, &chain, &mut state, &kinds);
                }
                // A chain it cannot extend: a new one on a base of its own capture, once a
                // change is pending (nothing is lost meanwhile: the changes wait in the state).
                if chain.broken.is_some() && !chain.restarted && state.all_listed(&kinds) && state.pending() > 0 {
                    chain.restarted = true;
                    if restart(store, opts, &metrics, &chain, &mut state).await {
                        base_tick.reset_immediately();
                    }
                }
                let due = chain.next > opts.max_segments && chain.broken.is_none();
                if due && folded.as_ref() != Some(&chain.base.snapshot_id) {
                    let compacted = compact(client, store, opts, &chain).await;
                    if compacted.is_some() {
                        // The new base is taken up as any newer snapshot is, now.
                        folded = Some(chain.base.snapshot_id.clone());
                        captured = compacted.flatten();
                        base_tick.reset_immediately();
                    }
                }
            }
            _ = base_tick.tick() => {
                let newer = match captured.take() {
                    Some(own) => Some(own),
                    None => newer_base(client, store, opts, &metrics, &chain.base.snapshot_id).await,
                };
                let Some(newer) = newer else { continue };
                // The old chain first: what is pending belongs to it.
                if state.all_listed(&kinds) {
                    summary.segments += write_segment(store, opts, &metrics, &mut chain, &mut state).await;
                }
                info!(old = %chain.base.snapshot_id, new = %newer.0.base.snapshot_id, "a newer base snapshot: a new chain starts on it");
                (chain, state) = newer;
                summary.bases.push(chain.base.snapshot_id.to_string());
                report_chain(&metrics, &chain);
                report(&metrics, &chain, &mut state, &kinds);
                // The watches list everything again, diffed against the new base.
                watches.abort_all();
                (watches, events) = start_watches(client, &kinds, opts, &metrics);
            }
        }
    }
    // Stopped: a final segment of what is pending, if every kind was listed.
    if state.all_listed(&kinds) {
        summary.segments += write_segment(store, opts, &metrics, &mut chain, &mut state).await;
        report(&metrics, &chain, &mut state, &kinds);
    } else if state.pending() > 0 {
        warn!("stopped before every kind was listed: the changes seen are left for the next run, which lists again");
    }
    watches.abort_all();
    info!(segments = summary.segments, base = %chain.base.snapshot_id, next = chain.next, "journal stopped");
    Ok(summary)
}

/// The newest complete snapshot that verifies, its records and its chain as the journal's
/// state; waits for one (polling every interval, logged) up to `base_wait`.
async fn wait_for_base(
    client: &kube::Client,
    store: &SnapshotStore,
    opts: &JournalOptions,
) -> Result<(Chain, JournalState)> {
    let deadline = tokio::time::Instant::now() + opts.base_wait;
    loop {
        match load_base(client, store, opts, None).await {
            Ok(Some(loaded)) => return Ok(loaded),
            Ok(None) => unreachable!("no current base: a base or an error"),
            Err(e @ (Error::NoSnapshot { .. } | Error::NoGoodSnapshot { .. })) => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(e);
                }
                info!(error = %e, wait = ?opts.base_wait, "waiting for a first snapshot to chain the journal to");
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(opts.interval.max(Duration::from_secs(1))).await;
    }
}

/// A newer base than `current`, loaded, or `None` (none, or it cannot be read: logged).
async fn newer_base(
    client: &kube::Client,
    store: &SnapshotStore,
    opts: &JournalOptions,
    metrics: &JournalMetrics,
    current: &SnapshotId,
) -> Option<(Chain, JournalState)> {
    match load_base(client, store, opts, Some(current)).await {
        Ok(newer) => newer,
        Err(e) => {
            metrics.error(JournalError::Base);
            warn!(error = %e, "cannot look for a newer base snapshot; the current chain goes on");
            None
        }
    }
}

/// The chain in use, for the metrics: its base, its segments and the newest one's point.
fn report_chain(metrics: &JournalMetrics, chain: &Chain) {
    let segments = chain.next.saturating_sub(1);
    metrics.chain(&chain.base.snapshot_id, chain.base.created_at, segments, (segments > 0).then_some(chain.point));
}

/// The lag and readiness, for the metrics and `/readyz`.
fn report(metrics: &JournalMetrics, chain: &Chain, state: &mut JournalState, kinds: &[KindProfile]) {
    metrics.pending(state.oldest_unwritten(), state.pending());
    let base = &chain.base.snapshot_id;
    let not_ready = match &chain.broken {
        Some(broken) => {
            Some(format!("the chain of base {base} cannot be extended ({broken}): waiting for a newer base"))
        }
        None if !state.all_listed(kinds) => {
            Some(format!("listing the profile's kinds to diff them against base {base}"))
        }
        None => None,
    };
    metrics.ready(not_ready);
}

/// Loads the newest good snapshot (unless it is `current`: `None`) and its chain. When that
/// snapshot is encrypted and the journal holds no key to read it, a base of its own capture,
/// encrypted to the same recipients, takes its place ([`capture::capture_base`]): the journal
/// never stays on an older, clearer base, and never needs the private key.
async fn load_base(
    client: &kube::Client,
    store: &SnapshotStore,
    opts: &JournalOptions,
    current: Option<&SnapshotId>,
) -> Result<Option<(Chain, JournalState)>> {
    // Any capture will do as a base (a restore judges the points of the chain itself), if it
    // is signed by a key the journal trusts and not dated ahead of this clock: segments chained
    // to a base from the future would all be dated after it, later than anything they saw.
    let keys = opts.keys();
    let not_after = Timestamp::now() + CLOCK_SKEW_TOLERANCE;
    let accept = Accept {
        inconsistent: true,
        same_cluster: true,
        trusted: keys.clone(),
        not_after: Some(not_after),
        ..Accept::default()
    };
    if !store.decrypts()
        && let Some(newest) = unreadable_newest(store, &accept, current).await?
    {
        return own_base(client, store, opts, &newest).await.map(Some);
    }
    let loaded = match current {
        None => choose_snapshot(store, None, &accept).await?,
        Some(current) => match crate::store::choose_newer(store, current, &accept).await? {
            Some(loaded) => loaded,
            None => return Ok(None),
        },
    };
    let manifest = loaded.manifest;
    let id = manifest.snapshot_id.clone();
    let mut records = Vec::with_capacity(loaded.records.len());
    for i in 0..loaded.records.len() {
        records.push(loaded.records.record(i)?);
    }
    let mut state = JournalState::at_point(records.iter());
    drop(records);
    let read = store.read_chain(&id, manifest.created_at, keys.as_deref()).await?;
    for link in &read.links {
        state.apply(&link.records()?);
    }
    let broken = read.stop_message(manifest.created_at);
    if let Some(broken) = &broken {
        error!(base = %id, "the journal cannot extend this chain: {broken}; it waits for a newer base snapshot");
    }
    let chain = Chain {
        next: read.next_sequence(),
        previous: read.last_sha256(),
        point: read.links.last().map_or(manifest.created_at, |l| l.header.to),
        recipients: chain_recipients(opts, &manifest)?,
        base: manifest,
        broken,
        restarted: false,
    };
    info!(base = %id, objects = state.objects(), resumes_at = chain.next,
        encrypted_to = ?chain.recipients.as_ref().map(|r| r.to_strings()), "journal chained to its base");
    Ok(Some((chain, state)))
}

/// The journal's `--encrypt-to` and, when `base` is encrypted, its recipients.
fn chain_recipients(opts: &JournalOptions, base: &Manifest) -> Result<Option<Arc<Recipients>>> {
    let Some(encryption) = &base.encryption else { return Ok(opts.recipients.clone()) };
    let mut all = encryption.recipients.clone();
    all.extend(opts.recipients.iter().flat_map(|r| r.to_strings()));
    Ok(Recipients::load(&all)?.map(Arc::new))
}

/// The newest snapshot the journal would take as its base (after `current`: `None` when that
/// is the newest), when it is encrypted: this journal has no key to read it. `None` when the
/// newest such snapshot is plain (it is loaded as usual).
async fn unreadable_newest(
    store: &SnapshotStore,
    accept: &Accept,
    current: Option<&SnapshotId>,
) -> Result<Option<Manifest>> {
    for entry in store.list().await?.into_iter().rev().filter(|e| e.complete) {
        if Some(&entry.id) == current {
            return Ok(None);
        }
        match store.verified_manifest(&entry.id, accept.trusted.as_deref()).await {
            Ok((manifest, _)) if accept.not_after.is_some_and(|limit| manifest.created_at > limit) => continue,
            Ok((manifest, _)) => return Ok(manifest.encryption.is_some().then_some(manifest)),
            Err(e @ (Error::Store { .. } | Error::Io { .. })) => return Err(e),
            // Refused (unsigned, corrupt…): the choice passes it over, and says so.
            Err(_) => continue,
        }
    }
    Ok(None)
}

/// A new chain on a base of the journal's own capture, encrypted to `like`'s recipients and
/// its own.
async fn own_base(
    client: &kube::Client,
    store: &SnapshotStore,
    opts: &JournalOptions,
    like: &Manifest,
) -> Result<(Chain, JournalState)> {
    let recipients = chain_recipients(opts, like)?
        .ok_or_else(|| Error::io("capture a base", std::io::Error::other("no recipient")))?;
    warn!(snapshot = %like.snapshot_id, recipients = %recipients.to_strings().join(","),
        "the newest snapshot is encrypted and this journal holds no key to read it: it captures a base of its own, encrypted to the same recipients");
    let capture = capture::Capture {
        profile: &opts.profile,
        selector: opts.selector.as_deref(),
        zstd_level: opts.zstd_level,
        signing_key: opts.signing_key.as_deref(),
    };
    let (manifest, records) = capture::capture_base(client, store, &capture, like, &recipients).await?;
    let state = JournalState::at_point(records.iter());
    drop(records);
    info!(base = %manifest.snapshot_id, objects = state.objects(), records = manifest.payload.records,
        "journal chained to a base of its own capture");
    let chain = Chain {
        next: 1,
        previous: None,
        point: manifest.created_at,
        recipients: Some(recipients),
        base: manifest,
        broken: None,
        restarted: false,
    };
    Ok((chain, state))
}

/// One watch task per kind, into one channel.
fn start_watches(
    client: &kube::Client,
    kinds: &[KindProfile],
    opts: &JournalOptions,
    metrics: &Arc<JournalMetrics>,
) -> (JoinSet<()>, mpsc::Receiver<Seen>) {
    let (tx, rx) = mpsc::channel(1024);
    let mut set = JoinSet::new();
    for (index, kind) in kinds.iter().enumerate() {
        let (client, kind, tx, selector) = (client.clone(), kind.clone(), tx.clone(), opts.selector.clone());
        let metrics = metrics.clone();
        let retry_not_served = opts.interval.clamp(Duration::from_secs(1), MAX_WATCH_BACKOFF);
        set.spawn(async move {
            let request = WatchRequest { namespace: None, selector: selector.as_deref(), page_size: 100 };
            // After any error the watch starts again with a listing: until that listing is done
            // the kind counts as seen up to the error only (a segment's `to` waits for it), and
            // a watcher resumed without a listing would never say when it has caught up.
            let mut backoff = Duration::from_secs(1);
            let mut unavailable = false;
            loop {
                let mut events = watch_objects(&client, &kind, &request);
                let retry = loop {
                    let seen = match events.try_next().await {
                        Ok(Some(event)) => {
                            if matches!(event, WatchEvent::InitDone) {
                                backoff = Duration::from_secs(1);
                                if std::mem::take(&mut unavailable) {
                                    info!(kind = kind.kind, "kind watched again: listed, journaled from now on");
                                }
                            }
                            Seen::Event(index, Box::new(event), Instant::now())
                        }
                        Ok(None) => return,
                        Err(e) => {
                            let at = Timestamp::now();
                            let seen = match unavailable_reason(&e) {
                                Some(reason) => {
                                    let first = !std::mem::replace(&mut unavailable, true);
                                    let not_served = reason.contains("not served");
                                    Seen::Unavailable { index, reason, not_served, first, at }
                                }
                                None => {
                                    metrics.error(JournalError::Watch);
                                    warn!(kind = kind.kind, error = %e, "watch interrupted; listed again after a backoff");
                                    Seen::Broken(index, at)
                                }
                            };
                            let retry = match &seen {
                                Seen::Unavailable { not_served: true, .. } => retry_not_served,
                                _ => backoff,
                            };
                            if tx.send(seen).await.is_err() {
                                return;
                            }
                            break retry;
                        }
                    };
                    if tx.send(seen).await.is_err() {
                        return;
                    }
                };
                drop(events);
                tokio::time::sleep(retry).await;
                backoff = (backoff * 2).min(MAX_WATCH_BACKOFF);
            }
        });
    }
    (set, rx)
}

fn observe(state: &mut JournalState, kinds: &[KindProfile], seen: Seen) {
    let (index, event, at) = match seen {
        Seen::Unavailable { index, reason, not_served, first, at } => {
            let kind = &kinds[index];
            if first {
                warn!(
                    kind = kind.kind,
                    reason,
                    "kind cannot be watched; journaled without it, and no segment claims a time after it was last seen"
                );
            }
            match not_served {
                true => state.not_served(kind, at),
                false => state.watch_broken(kind, at),
            }
            state.unavailable(kind);
            return;
        }
        Seen::Broken(index, at) => {
            state.watch_broken(&kinds[index], at);
            return;
        }
        Seen::Event(index, event, at) => (index, event, at),
    };
    let kind = &kinds[index];
    let parse = |object: &RawResource, state: &mut JournalState| match RawObject::parse(object.json()) {
        Ok(raw) => state.seen_at(kind, &raw, at),
        Err(e) => warn!(kind = kind.kind, error = %e, "object not understood; skipped"),
    };
    match *event {
        WatchEvent::Init => state.list_started(kind),
        WatchEvent::InitApply(object) | WatchEvent::Apply(object) => parse(&object, state),
        WatchEvent::InitDone => {
            state.list_done_at(kind, at);
            debug!(kind = kind.kind, "kind listed");
        }
        WatchEvent::Delete(object) => {
            let rv = object.metadata.resource_version.clone();
            let name = object.metadata.name.clone().unwrap_or_default();
            state.deleted_at(kind, object.metadata.namespace.as_deref().filter(|n| !n.is_empty()), &name, rv, at);
        }
    }
}

/// Writes one segment of what differs from the chain, if anything does. 1 when one was written.
async fn write_segment(
    store: &SnapshotStore,
    opts: &JournalOptions,
    metrics: &JournalMetrics,
    chain: &mut Chain,
    state: &mut JournalState,
) -> u64 {
    if let Some(broken) = &chain.broken {
        if state.pending() > 0 {
            debug!(base = %chain.base.snapshot_id, "changes not journaled: {broken}");
        }
        return 0;
    }
    let Some(cut) = state.cut() else { return 0 };
    // Never later than what every kind's watch has seen: a restore takes a live status written
    // before `to` for one the segment knows to be older.
    let (seen, held_by) = state.seen_until(&opts.kinds(), Timestamp::now());
    let to = seen.map_or(chain.point, |seen| seen.max(chain.point));
    match put(store, opts, chain, &cut, to, held_by).await {
        Ok(bytes) => {
            state.written(&cut);
            metrics.written(bytes, cut.lags(Instant::now()), chain.point, chain.next.saturating_sub(1));
            1
        }
        Err(e) => {
            metrics.error(JournalError::Segment);
            warn!(base = %chain.base.snapshot_id, segment = chain.next, error = %e, "segment not written; its changes go into the next");
            // A header written whose answer was lost, or another writer: read the chain again.
            if matches!(&e, Error::Store { source: object_store::Error::AlreadyExists { .. }, .. }) {
                match store.read_chain(&chain.base.snapshot_id, chain.base.created_at, opts.keys().as_deref()).await {
                    Ok(read) => {
                        for link in read.links.iter().filter(|l| l.header.sequence >= chain.next) {
                            match link.records() {
                                Ok(records) => state.apply(&records),
                                Err(e) => {
                                    warn!(error = %e, segment = link.header.sequence, "cannot read a segment again")
                                }
                            }
                        }
                        chain.next = read.next_sequence();
                        chain.previous = read.last_sha256();
                        chain.point = read.links.last().map_or(chain.base.created_at, |l| l.header.to);
                        chain.broken = read.stop_message(chain.base.created_at);
                        report_chain(metrics, chain);
                    }
                    Err(e) => warn!(error = %e, "cannot read the chain again"),
                }
            }
            state.put_back(cut);
            0
        }
    }
}

/// Writes the cut as the chain's next segment, bringing a restore to `to` (held there by
/// `held_by`'s watch, if one holds it back); the bytes written (records and header).
async fn put(
    store: &SnapshotStore,
    opts: &JournalOptions,
    chain: &mut Chain,
    cut: &Cut,
    to: Timestamp,
    held_by: Option<String>,
) -> Result<u64> {
    let (bytes, payload) = PayloadEncoder::encode_all(opts.zstd_level, chain.recipients.as_deref(), &cut.records)
        .map_err(|e| Error::io("encode a segment", e))?;
    let mut header = SegmentHeader::new(
        store.cluster_id(),
        &chain.base.snapshot_id,
        chain.next,
        chain.previous.clone(),
        chain.point,
        to,
        cut.resource_versions.clone(),
        (cut.changed, cut.deleted),
        payload,
        Some(cut.consistency.clone()),
    );
    let size = bytes.len();
    let stored = store.put_segment(&mut header, bytes, opts.signing_key.as_deref()).await?;
    info!(base = %chain.base.snapshot_id, segment = chain.next, changed = cut.changed, deleted = cut.deleted,
        bytes = size, consistent = cut.consistency.consistent, to = %to, held_by, "journal segment written");
    chain.previous = Some(sha256_hex(&stored));
    chain.next += 1;
    chain.point = to;
    Ok((size + stored.len()) as u64)
}

/// Compaction: the chain, `max_segments` long, folded into a new base snapshot (see
/// [`crate::format::fold`]): the base's records read back from the store with every segment
/// of its chain applied, written as any snapshot is (payload first, manifest last,
/// create-only; signed with the journal's key, encrypted as its segments are) with the point's
/// time as its capture time, the last segment's verdict, and the base's `capturedFrom`. A base
/// the journal cannot read (encrypted, no key) is not folded: a base of its own capture takes
/// the chain's place. `Some` when written (the loop then moves to it, with `Some` chain when it
/// is the journal's own capture); a failure is logged and the chain goes on (the next cut tries
/// again).
async fn compact(
    client: &kube::Client,
    store: &SnapshotStore,
    opts: &JournalOptions,
    chain: &Chain,
) -> Option<Option<(Chain, JournalState)>> {
    let base = &chain.base;
    if base.encryption.is_some() && !store.decrypts() {
        return match own_base(client, store, opts, base).await {
            Ok(own) => Some(Some(own)),
            Err(e) => {
                warn!(base = %base.snapshot_id, error = %e, "cannot capture a new base for the journal chain; the chain goes on");
                None
            }
        };
    }
    match fold(store, opts, base, chain.recipients.as_deref()).await {
        Ok(Some(manifest)) => {
            info!(base = %base.snapshot_id, new_base = %manifest.snapshot_id, segments = chain.next - 1,
                records = manifest.payload.records, at = %manifest.created_at,
                encrypted = manifest.encryption.is_some(), "journal chain folded into a new base snapshot");
            Some(None)
        }
        Ok(None) => None,
        Err(e) => {
            warn!(base = %base.snapshot_id, error = %e, "cannot fold the journal chain into a new base; the chain goes on");
            None
        }
    }
}

async fn fold(
    store: &SnapshotStore,
    opts: &JournalOptions,
    base: &Manifest,
    recipients: Option<&Recipients>,
) -> Result<Option<Manifest>> {
    let records = Records::decode(base, store.verified_payload(base).await?)?;
    let read = store.read_chain(&base.snapshot_id, base.created_at, opts.keys().as_deref()).await?;
    if let Some(stop) = read.stop_message(base.created_at) {
        return Err(Error::io("fold the journal", std::io::Error::other(stop)));
    }
    let Some(folded) = crate::format::fold(base, &records, &read.links)? else { return Ok(None) };
    drop(records);
    write_base(store, opts, base, folded, recipients).await.map(Some)
}

/// A chain this journal cannot extend (a corrupt or refused segment, or a segment header
/// someone created at the next sequence number before it could): a new base of its own
/// capture, so that the journal goes on by itself rather than waiting for the next backup.
/// The base's records with the chain's readable segments (those before the stop) and the
/// changes pending now (the live fleet diffed against them), dated now with the live fleet's
/// verdict: what the fleet is, as the journal's watches see it. Written as a fold is (signed,
/// encrypted, create-only); the loop takes it up as any newer base. True when written.
async fn restart(
    store: &SnapshotStore,
    opts: &JournalOptions,
    metrics: &JournalMetrics,
    chain: &Chain,
    state: &mut JournalState,
) -> bool {
    let Some(cut) = state.cut() else { return false };
    let written = restart_base(store, opts, chain, &cut).await;
    // Whatever happened, the changes stay pending: the new base's chain lists them again.
    state.put_back(cut);
    let broken = chain.broken.as_deref().unwrap_or_default();
    match written {
        Ok(manifest) => {
            warn!(base = %chain.base.snapshot_id, new_base = %manifest.snapshot_id, records = manifest.payload.records,
                "the chain of base {} cannot be extended ({broken}): a new chain starts on snapshot {}, \
                 a base of the journal's own capture", chain.base.snapshot_id, manifest.snapshot_id);
            true
        }
        Err(e) => {
            metrics.error(JournalError::Segment);
            error!(base = %chain.base.snapshot_id, error = %e,
                "the chain cannot be extended ({broken}) and no new base could be written; waiting for a newer base");
            false
        }
    }
}

/// The base of [`restart`]: the chain's base's records, its readable segments and `cut` on
/// top, encrypted as the chain is (never clearer than its base).
async fn restart_base(store: &SnapshotStore, opts: &JournalOptions, chain: &Chain, cut: &Cut) -> Result<Manifest> {
    let base = &chain.base;
    let records = Records::decode(base, store.verified_payload(base).await?)?;
    let read = store.read_chain(&base.snapshot_id, base.created_at, opts.keys().as_deref()).await?;
    let from = read.links.last().map_or(base.created_at, |l| l.header.to);
    let (pending, payload) = PayloadEncoder::encode_all(opts.zstd_level, None, &cut.records)
        .map_err(|e| Error::io("encode the changes pending", e))?;
    let header = SegmentHeader::new(
        store.cluster_id(),
        &base.snapshot_id,
        read.next_sequence(),
        read.last_sha256(),
        from,
        Timestamp::now().max(from),
        cut.resource_versions.clone(),
        (cut.changed, cut.deleted),
        payload,
        Some(cut.consistency.clone()),
    );
    let mut links = read.links;
    // The changes pending as one more link, never stored: the fold merges its records.
    let pending = crate::format::Payload::Memory(pending.into());
    links.push(Link { header, sha256: String::new(), payload: pending, signer: None });
    let folded = crate::format::fold(base, &records, &links)?
        .ok_or_else(|| Error::io("start a new chain", std::io::Error::other("nothing to fold")))?;
    drop(records);
    write_base(store, opts, base, folded, chain.recipients.as_deref()).await
}

/// Writes a folded base as a snapshot: payload first, manifest last, create-only, signed and
/// encrypted with the journal's keys, `capturedFrom` and a drop mark carried from `base`.
async fn write_base(
    store: &SnapshotStore,
    opts: &JournalOptions,
    base: &Manifest,
    folded: crate::format::Folded,
    recipients: Option<&Recipients>,
) -> Result<Manifest> {
    let (bytes, payload) = PayloadEncoder::encode_all(opts.zstd_level, recipients, &folded.records)
        .map_err(|e| Error::io("encode a folded base", e))?;
    let id = SnapshotId::new(folded.created_at);
    let mut manifest =
        Manifest::new(store.cluster_id(), id.clone(), folded.created_at, &base.profile, folded.capture, payload);
    manifest.captured_from = base.captured_from.clone();
    // A drop in records not yet acknowledged stays marked: retention keeps the snapshot
    // before it, and the alert goes on, whether a backup or a fold wrote the newest snapshot.
    manifest.record_drop = base.record_drop.clone();
    store.finish_snapshot(store.payload_writer(&id), &bytes, &mut manifest, opts.signing_key.as_deref()).await?;
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures::{append_segment, append_signed_segment, record, ts, uuid, write_snapshot};
    use crate::format::{Record, tombstone};
    use crate::store::{Accept, choose_snapshot};

    fn server(name: &str, state: &str) -> Record {
        record("Server", name, &[uuid(name)], json!({"state": state}))
    }

    fn states(records: &Records) -> Vec<String> {
        (0..records.len())
            .map(|i| {
                let r = records.record(i).unwrap();
                format!("{}={}", r.name, r.status.get())
            })
            .collect()
    }

    /// Compaction on a store: the folded base is a snapshot like any other (signed with the
    /// journal's key, verified by a restore trusting it) holding base + chain, dated at the
    /// last segment's `to` with its verdict; a restore uses it alone, with the same records as
    /// the old base at its chain's point. F107: a fold that dies after its payload and before
    /// its manifest leaves a folder that does not exist for readers: a restore goes to the old
    /// base's point as before, nothing wrong looks complete. F130: a signing journal never
    /// folds a chain its key did not sign.
    #[tokio::test]
    async fn a_chain_folds_into_a_signed_snapshot_and_a_fold_without_manifest_is_not_there() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let mut base_records = vec![server("a", "Available"), server("b", "Available")];
        let key = Arc::new(SigningKey::generate());
        let base = crate::fixtures::snapshot(&base_records)
            .at(ts("2026-11-30T09:00:00Z"))
            .signed_with(&key)
            .write(&store)
            .await;
        let opts = JournalOptions {
            signing_key: Some(key.clone()),
            ..JournalOptions::new(crate::domain::identity::Profile::metal_operator())
        };
        // An unsigned segment (anyone who can write the bucket): not folded under the key.
        append_segment(&store, &base, &[server("a", "Forged")], 5, true).await;
        let err = fold(&store, &opts, &base, None).await.unwrap_err().to_string();
        assert!(err.contains("not signed"), "{err}");
        let one = store.segment_object_path(&base.snapshot_id, 1, crate::format::SEGMENT_HEADER_SUFFIX);
        object_store::ObjectStoreExt::delete(store.object_store().as_ref(), &one).await.unwrap();
        append_signed_segment(&store, &base, &[server("a", "Reserved")], 5, true, Some(&key)).await;
        let last = [tombstone(&server("b", "x")), server("c", "Initial")];
        append_signed_segment(&store, &base, &last, 5, false, Some(&key)).await;
        base_records.clear();
        let folded = fold(&store, &opts, &base, None).await.unwrap().unwrap();
        assert_ne!(folded.snapshot_id, base.snapshot_id);
        assert_eq!(folded.created_at, ts("2026-11-30T09:00:10Z"));
        assert!(!folded.is_consistent(), "the last segment's verdict");
        assert_eq!(folded.signed_by.as_ref(), Some(key.id()));

        let trusting = Accept {
            inconsistent: true,
            journal: true,
            trusted: Some(Arc::new(TrustedKeys::new([key.public_key()]))),
            ..Accept::default()
        };
        let loaded = choose_snapshot(&store, None, &trusting).await.unwrap();
        assert_eq!(loaded.manifest.snapshot_id, folded.snapshot_id);
        assert!(loaded.point.is_none(), "a new base, no chain yet");
        assert_eq!(states(&loaded.records), [r#"a={"state":"Reserved"}"#, r#"c={"state":"Initial"}"#]);

        // Interrupted between payload and manifest: the manifest (and its signature) gone.
        for path in [store.manifest_path(&folded.snapshot_id), store.signature_path(&folded.snapshot_id)] {
            object_store::ObjectStoreExt::delete(store.object_store().as_ref(), &path).await.unwrap();
        }
        let plain = Accept { inconsistent: true, journal: true, ..Accept::default() };
        let loaded = choose_snapshot(&store, None, &plain).await.unwrap();
        assert_eq!(loaded.manifest.snapshot_id, base.snapshot_id, "the old base, at its point");
        assert_eq!(loaded.point.unwrap().segments_applied, 2);
        assert_eq!(states(&loaded.records), [r#"a={"state":"Reserved"}"#, r#"c={"state":"Initial"}"#]);
        assert!(!store.list().await.unwrap().iter().any(|e| e.id == folded.snapshot_id && e.complete));
    }

    /// F108: a chain with a gap is not folded (the fold would carry the records before the gap
    /// only, under a new name): the fold refuses, naming the gap.
    #[tokio::test]
    async fn a_chain_with_a_gap_is_not_folded() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let base = write_snapshot(&store, "2026-11-30T09:00:00Z", &[server("a", "Available")], true).await;
        append_segment(&store, &base, &[server("a", "Reserved")], 5, true).await;
        append_segment(&store, &base, &[server("a", "Tainted")], 5, true).await;
        let one = store.segment_object_path(&base.snapshot_id, 1, crate::format::SEGMENT_HEADER_SUFFIX);
        object_store::ObjectStoreExt::delete(store.object_store().as_ref(), &one).await.unwrap();
        let opts = JournalOptions::new(crate::domain::identity::Profile::metal_operator());
        let err = fold(&store, &opts, &base, None).await.unwrap_err().to_string();
        assert!(err.contains("segment 1 of base") && err.contains("missing"), "{err}");
        assert_eq!(store.list().await.unwrap().len(), 1, "nothing written");
    }
}
