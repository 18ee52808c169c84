//! Restore: load → verify → plan → apply → check pairing, against the target cluster.
//!
//! The snapshot is the newest one that loads and verifies (or the pinned one, see
//! [`crate::store::choose`]); a damaged or foreign snapshot is reported and skipped for the
//! previous one. Live objects are read once ([`live`]), [`plan`] decides per object (pure),
//! [`apply`] writes kind by kind in profile order (BMCs, Servers, ServerClaims), and the
//! claim/server pairing is checked on the objects as the API server answered the last write of
//! each (the others as they were listed).

pub mod apply;
pub mod hold;
pub mod plan;
pub mod summary;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt, future};
use jiff::Timestamp;
use serde::Serialize;
use tracing::{debug, info, warn};

pub use apply::{Applier, Outcome};
pub use hold::{Partners, Seen};
pub use plan::{KindMatcher, LiveKeys, PlanInput, PlanItem, RestorePlan, Verdict};

use crate::Result;
use crate::domain::identity::{KindProfile, Profile};
use crate::domain::live::LiveObject;
use crate::domain::pairing::{Views, Violation};
use crate::format::{SnapshotId, TrustedKeys};
use crate::k8s::{DEFAULT_PAGE_SIZE, LimitReport, PageRequest, Pager, WriteLimit, Writer, list_objects};
use crate::store::{Accept, Passed, Point, SnapshotStore, choose_snapshot};
use summary::KindSummary;

#[derive(Debug, Clone)]
pub struct RestoreOptions {
    pub profile: Profile,
    /// Use this snapshot instead of the newest good one.
    pub snapshot: Option<SnapshotId>,
    pub force: bool,
    pub dry_run: bool,
    /// Use snapshots whose capture was inconsistent.
    pub allow_inconsistent: bool,
    /// Use snapshots captured from the cluster the restore writes to.
    pub allow_same_cluster: bool,
    /// Use only snapshots signed by one of these keys.
    pub trusted_keys: Option<Arc<TrustedKeys>>,
    /// What the restore demands of a snapshot besides (`--expect-source`,
    /// `--require-encryption`).
    pub demands: crate::store::Demands,
    /// Restore to the point in time a base's journal reaches (its newest complete point, or
    /// the newest at or before [`RestoreOptions::at`]); `false`: the snapshot alone.
    pub journal: bool,
    /// Restore to this point in time (`--at`): the newest base captured at or before it, with
    /// the segments of its journal that end at or before it.
    pub at: Option<Timestamp>,
    /// Objects whose writes are under way at once (the work queue). With a
    /// [`RestoreOptions::write_limit`], the writes themselves are limited by it; make this its
    /// max.
    pub concurrency: usize,
    /// The adaptive limit the client's writes pass (`k8s::limited_client`), reported at the
    /// end ([`RestoreReport::write_limit`]) and as it changes (the progress's note).
    pub write_limit: Option<WriteLimit>,
    pub page_size: u32,
    /// Only objects with these labels (a Kubernetes label selector).
    pub selector: Option<String>,
    /// List every object in the report, with the status fields each restore changes (dry
    /// runs, JSON reports). Otherwise the report keeps the counts and only the items and
    /// outcomes that need attention, so that its memory does not grow with the fleet.
    /// With a [`RestoreOptions::sink`], the items carry the changes but go to the sink.
    pub explain: bool,
    /// Hand each object's line to this as soon as it is decided or written, instead of keeping
    /// it: the report then holds no plan item and, of the outcomes, only the failures
    /// ([`RestoreReport::ok`]), so that a restore streaming its lines does not grow with the
    /// fleet.
    pub sink: Option<Sink>,
    /// Told of each object written.
    pub progress: crate::progress::ProgressHook,
}

impl RestoreOptions {
    pub fn page(&self) -> PageRequest<'_> {
        PageRequest { size: self.page_size, selector: self.selector.as_deref(), namespace: None }
    }

    pub fn new(profile: Profile) -> Self {
        RestoreOptions {
            profile,
            snapshot: None,
            force: false,
            dry_run: false,
            allow_inconsistent: false,
            allow_same_cluster: false,
            trusted_keys: None,
            demands: Default::default(),
            journal: true,
            at: None,
            concurrency: crate::k8s::limit::DEFAULT_START,
            write_limit: None,
            page_size: DEFAULT_PAGE_SIZE,
            selector: None,
            explain: false,
            sink: None,
            progress: Default::default(),
        }
    }
}

/// One object of a restore, as soon as it is decided (a dry run; an object with nothing to
/// write; a record with no live object) or its writes are done: its plan item, and then what
/// the writes did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectLine {
    #[serde(flatten)]
    pub item: PlanItem,
    /// Absent when nothing was written: a dry run, or an item with nothing to write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
}

/// Where a streaming restore hands its [`ObjectLine`]s. Called from the restore's task, one
/// line at a time: keep it cheap (a buffered write, a send on a channel).
#[derive(Clone)]
pub struct Sink(Arc<dyn Fn(ObjectLine) + Send + Sync>);

impl Sink {
    pub fn new(f: impl Fn(ObjectLine) + Send + Sync + 'static) -> Self {
        Sink(Arc::new(f))
    }

    fn send(&self, line: ObjectLine) {
        (self.0)(line)
    }
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sink")
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreReport {
    pub snapshot: String,
    pub snapshot_created_at: Timestamp,
    /// The point of the snapshot's journal restored to (base, segments applied, time, a gap);
    /// absent when the snapshot has no journal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restored_to: Option<Point>,
    /// Set when the point restored to is older than the newest one the bucket shows (its
    /// journal stops at a gap: a missing, corrupt or refused segment): why. The CLI exits 5.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub behind: Option<String>,
    pub passed_over: Vec<Passed>,
    pub dry_run: bool,
    pub plan: RestorePlan,
    pub counts: BTreeMap<Verdict, usize>,
    pub outcomes: Vec<Outcome>,
    /// API writes issued (status PATCHes and annotation PATCHes; Events not counted).
    pub writes: usize,
    pub pairing: Vec<Violation>,
    /// What the adaptive limit on the writes in flight did (start, max, final, lowest,
    /// highest, halvings, peak in flight); absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_limit: Option<LimitReport>,
    /// Set when the restore was stopped (a signal) before it was done: what it left undone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<Stopped>,
    /// Objects restatus keeps quiesced (each also in `outcomes`, unless streamed).
    #[serde(skip)]
    pub held: usize,
}

/// A streamed restore's closing line: the report without its per-object lists (those went to
/// the [`Sink`]), with the failures and holds counted.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreSummary<'a> {
    pub snapshot: &'a str,
    pub snapshot_created_at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restored_to: Option<&'a Point>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub behind: Option<&'a str>,
    pub passed_over: &'a [Passed],
    pub dry_run: bool,
    pub counts: &'a BTreeMap<Verdict, usize>,
    /// Objects in the counts: one line each (but the writes a stop left unstarted).
    pub objects: usize,
    pub writes: usize,
    /// Objects whose writes failed, and objects restatus keeps quiesced.
    pub failed: usize,
    pub held: usize,
    pub pairing: &'a [Violation],
    /// What the adaptive write limit did (`writeLimit`, as in `-o json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_limit: Option<&'a LimitReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<&'a Stopped>,
    /// [`RestoreReport::ok`]: no failure, no pairing violation, not stopped.
    pub ok: bool,
}

/// What a stopped restore left undone. Every write sequence it had started was finished
/// (quiesce, status, release), so nothing is left quiesced by restatus but the objects it holds
/// on purpose; a rerun does the rest.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Stopped {
    /// Objects planned for a write whose writes never started.
    pub writes_not_started: usize,
    /// Kinds not listed at all.
    pub kinds_not_reached: Vec<String>,
}

impl RestoreReport {
    pub fn failures(&self) -> impl Iterator<Item = &Outcome> {
        self.outcomes.iter().filter(|o| o.error.is_some())
    }

    pub fn ok(&self) -> bool {
        self.failures().next().is_none() && self.pairing.is_empty() && self.stopped.is_none()
    }

    pub fn summary(&self) -> RestoreSummary<'_> {
        RestoreSummary {
            snapshot: &self.snapshot,
            snapshot_created_at: self.snapshot_created_at,
            restored_to: self.restored_to.as_ref(),
            behind: self.behind.as_deref(),
            passed_over: &self.passed_over,
            dry_run: self.dry_run,
            counts: &self.counts,
            objects: self.counts.values().sum(),
            writes: self.writes,
            failed: self.failures().count(),
            held: self.held,
            pairing: &self.pairing,
            write_limit: self.write_limit.as_ref(),
            stopped: self.stopped.as_ref(),
            ok: self.ok(),
        }
    }
}

/// One-shot restore: choose the snapshot, then a kind at a time in profile order (BMCs,
/// Servers, ServerClaims): list the kind once for its keys (their digests), then again page
/// by page, plan each page against the snapshot and write its restores while the next page
/// is listed; then check the pairing. Memory holds the records' index, one kind's key digests,
/// the pages and writes in flight, and what the report keeps (see [`RestoreOptions::explain`]),
/// not the fleet.
pub async fn run(client: &kube::Client, store: &SnapshotStore, opts: &RestoreOptions) -> Result<RestoreReport> {
    run_until(client, store, opts, future::pending()).await
}

/// [`run`], stopped early when `stop` completes (SIGTERM, Ctrl-C): no page is listed and no
/// object's writes are started after it, the write sequences in flight are finished (each ends
/// with its release), and the report says what was left undone ([`RestoreReport::stopped`]).
pub async fn run_until(
    client: &kube::Client,
    store: &SnapshotStore,
    opts: &RestoreOptions,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<RestoreReport> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_task = tokio::spawn(async move {
        stop.await;
        let _ = stop_tx.send(true);
    });
    let report = restore(client, store, opts, Stop(stop_rx)).await;
    stop_task.abort();
    report
}

/// Whether the restore is to stop, and a future that completes when it is.
#[derive(Clone)]
struct Stop(tokio::sync::watch::Receiver<bool>);

impl Stop {
    fn now(&self) -> bool {
        *self.0.borrow()
    }

    async fn wait(mut self) {
        // An error: the sender is gone without a stop; never complete then.
        if self.0.wait_for(|stop| *stop).await.is_err() {
            future::pending::<()>().await;
        }
    }
}

/// [`run_until`] without the stop's task: the snapshot chosen, then each kind in profile order
/// (see [`Restore::kind`]), then the report finished.
async fn restore(
    client: &kube::Client,
    store: &SnapshotStore,
    opts: &RestoreOptions,
    stop: Stop,
) -> Result<RestoreReport> {
    let (loaded, manifest) = load(client, store, opts).await?;
    let started = std::time::Instant::now();
    let writer = match opts.dry_run {
        true => None,
        false => Some(Writer::new(client, &opts.profile).await?),
    };
    // The pairing as this restore lists and writes it: a release's look-ups of partners it
    // answers are saved (see `Seen`).
    let seen = Seen::default();
    let applier = writer.as_ref().map(|w| {
        Applier::new(w, &opts.profile, &manifest, &loaded.records, opts.force)
            .with_partners(Partners::listed(&loaded.records, Some(&seen)))
    });
    let mut report = RestoreReport::start(&loaded, &manifest, opts.dry_run);
    report.behind = behind(loaded.point.as_ref(), opts.at);
    if let Some(behind) = &report.behind {
        warn!("{behind}");
    }
    let mut tally = Tally { report, seen: &seen };
    let input = PlanInput {
        profile: &opts.profile,
        snapshot: &manifest.snapshot_id,
        snapshot_time: manifest.comparable_time(Timestamp::now()),
        records: &loaded.records,
        live: &[],
        force: opts.force,
        explain: opts.explain,
    };
    let run = Restore { client, opts, input, writer: writer.as_ref(), applier, seen: &seen, stop, started };
    opts.progress.start("restore", Some(loaded.records.len() as u64));
    let mut last_limit = None;
    note_limit(opts, &mut last_limit);
    let mut not_started = 0;
    for kind in opts.profile.kinds.iter().filter(|k| !k.is_denied()) {
        not_started += run.kind(kind, &mut tally, &mut last_limit).await?;
    }
    opts.progress.finish();
    Ok(run.finish(tally.report, not_started))
}

/// The snapshot to restore, chosen and verified (see [`choose_snapshot`]), and the manifest
/// to plan with: at a point of its journal, statuses written after that point moved on (not
/// after the base's capture), and the verdict is the point's.
async fn load(
    client: &kube::Client,
    store: &SnapshotStore,
    opts: &RestoreOptions,
) -> Result<(crate::store::Loaded, crate::format::Manifest)> {
    let accept = Accept {
        inconsistent: opts.allow_inconsistent,
        this_cluster: crate::k8s::cluster_uid(client).await,
        same_cluster: opts.allow_same_cluster,
        trusted: opts.trusted_keys.clone(),
        journal: opts.journal,
        at: opts.at,
        refused: Default::default(),
        demands: opts.demands.clone(),
        not_after: None,
    };
    let loaded = choose_snapshot(store, opts.snapshot.as_ref(), &accept).await?;
    let manifest = loaded.restore_manifest();
    if let Some(point) = &loaded.point
        && let Some(gap) = &point.gap
    {
        warn!(base = %point.base, segments = point.segments_applied, at = %point.time, "journal: {gap}");
    }
    info!(snapshot = %manifest.snapshot_id, records = loaded.records.len(), signed_by = loaded.signer.as_ref().map(|k| k.as_str()), "snapshot loaded and verified");
    Ok((loaded, manifest))
}

/// Why the point a restore goes to is older than the newest one the bucket shows, if it is:
/// the base's journal stops at a gap (a missing, corrupt or refused segment) before its end, so
/// the segments after it, and what changed in them, are not restored. With `--at`, only when
/// the chain stops right after the point (a segment read after it ends past `--at`, and so
/// does the gap). Pure.
pub fn behind(point: Option<&Point>, at: Option<jiff::Timestamp>) -> Option<String> {
    let point = point?;
    let gap = point.gap.as_ref()?;
    if at.is_some() && point.segments_applied < point.segments_verified {
        return None;
    }
    Some(format!(
        "restored to {}, older than the newest point the bucket shows: the journal stops there ({gap})",
        point.describe()
    ))
}

impl RestoreReport {
    /// The report of a restore from `loaded` (planned with `manifest`) before any kind.
    fn start(loaded: &crate::store::Loaded, manifest: &crate::format::Manifest, dry_run: bool) -> Self {
        RestoreReport {
            snapshot: manifest.snapshot_id.to_string(),
            snapshot_created_at: loaded.manifest.created_at,
            restored_to: loaded.point.clone(),
            behind: None,
            passed_over: loaded.passed_over.clone(),
            dry_run,
            counts: Verdict::ALL.iter().map(|v| (*v, 0)).collect(),
            outcomes: vec![],
            writes: 0,
            pairing: vec![],
            plan: RestorePlan { snapshot: manifest.snapshot_id.clone(), items: vec![] },
            write_limit: None,
            stopped: None,
            held: 0,
        }
    }
}

/// What every kind of one restore shares.
struct Restore<'r> {
    client: &'r kube::Client,
    opts: &'r RestoreOptions,
    /// The snapshot's records and how to plan with them (each page brings its `live`).
    input: PlanInput<'r>,
    /// `None` in a dry run, as is `applier`.
    writer: Option<&'r Writer>,
    applier: Option<Applier<'r>>,
    seen: &'r Seen,
    stop: Stop,
    started: std::time::Instant,
}

impl Restore<'_> {
    /// One kind: its live keys listed, then its pages listed and planned while their writes
    /// run; the records with no live object; the kind's summary Event. Returns how many of its
    /// writes a stop left unstarted (a stop before its keys are listed leaves the whole kind,
    /// counted in the report as not reached).
    async fn kind(&self, kind: &KindProfile, tally: &mut Tally<'_>, last_limit: &mut Option<usize>) -> Result<usize> {
        let (opts, stop) = (self.opts, &self.stop);
        // A stop while the keys are listed: nothing of this kind is quiesced yet.
        let page = opts.page();
        let keys = tokio::select! {
            keys = live_keys(self.client, kind, &page), if !stop.now() => keys?,
            _ = stop.clone().wait() => {
                tally.report.stopped.get_or_insert_default().kinds_not_reached.push(kind.kind.clone());
                return Ok(0);
            }
        };
        let mut matcher = KindMatcher::new(kind, self.input.records, &keys);
        drop(keys);
        if self.applier.is_some() && !stop.now() {
            self.seen.list_claims_before(self.client, kind, &opts.profile, &opts.page()).await?;
        }
        self.seen.listing(kind);
        let (tx, rx) = mpsc::channel::<(PlanItem, LiveObject)>(opts.concurrency.max(1) * 4);
        let plan_pages = plan_pages(self.client, kind, opts, &self.input, &mut matcher, tally, tx, stop);
        let (planned, applied) = tokio::join!(plan_pages, self.apply(kind, rx, last_limit));
        let not_started = planned? - applied.started;
        for item in matcher.finish(&self.input)? {
            tally.keep(&item, opts, true);
        }
        self.kind_done(kind, applied, tally).await;
        Ok(not_started)
    }

    /// Writes the items `planned` sends, `concurrency` objects at a time (nothing in a dry
    /// run); after a stop, no object's writes start, and those in flight finish.
    async fn apply(
        &self,
        kind: &KindProfile,
        planned: mpsc::Receiver<(PlanItem, LiveObject)>,
        last_limit: &mut Option<usize>,
    ) -> Applied {
        let mut applied = Applied::default();
        let Some(applier) = &self.applier else { return applied };
        planned
            .take_until(self.stop.clone().wait())
            .map(|(item, object)| async move { (applier.apply_to(kind, &item, &object).await, item) })
            .buffer_unordered(self.opts.concurrency.max(1))
            .for_each(|(outcome, item)| {
                applied.add(outcome, item, self.opts);
                note_limit(self.opts, last_limit);
                future::ready(())
            })
            .await;
        applied
    }

    /// What a kind's writes did: logged, told in its summary Event, added to the report, and
    /// their answers' pairing taken as seen.
    async fn kind_done(&self, kind: &KindProfile, applied: Applied, tally: &mut Tally<'_>) {
        let records = self.input.records.of_kind(&kind.qualified_kind()).count();
        match (records, applied.writes) {
            (0, 0) => debug!(kind = %kind.kind, "no records of this kind in the snapshot"),
            (records, writes) => {
                let write_limit = self.opts.write_limit.as_ref().map(WriteLimit::current);
                info!(kind = %kind.kind, records, writes, write_limit, elapsed = ?self.started.elapsed(), "kind restored")
            }
        }
        if let Some(writer) = self.writer.filter(|_| !applied.summary.is_empty()) {
            writer.summary_event(kind, applied.summary.event(&kind.plural, self.input.snapshot.as_str())).await;
        }
        tally.report.writes += applied.writes;
        tally.report.held += applied.summary.held;
        tally.report.outcomes.extend(applied.outcomes);
        self.seen.merge(applied.views);
    }

    /// The report once every kind is done or a stop came: what was left undone, what the
    /// write limit did, and the pairing check.
    fn finish(&self, mut report: RestoreReport, not_started: usize) -> RestoreReport {
        if self.stop.now() {
            let stopped = report.stopped.get_or_insert_default();
            stopped.writes_not_started = not_started;
            warn!(writes = report.writes, not_started, kinds_not_reached = ?stopped.kinds_not_reached,
                "restore stopped: the writes in flight were finished and released; rerun to do the rest");
        }
        report.write_limit = self.opts.write_limit.as_ref().map(WriteLimit::report);
        let elapsed = self.started.elapsed();
        match &report.write_limit {
            Some(l) => info!(
                writes = report.writes,
                ?elapsed,
                write_limit = l.final_limit,
                lowest = l.lowest,
                highest = l.highest,
                halvings = l.halvings,
                peak_in_flight = l.peak_in_flight,
                "restore done"
            ),
            None => info!(writes = report.writes, ?elapsed, "restore done"),
        }
        report.pairing = self.seen.check();
        report
    }
}

/// Tells the progress the write limit when it changed since `last`.
fn note_limit(opts: &RestoreOptions, last: &mut Option<usize>) {
    let Some(limit) = opts.write_limit.as_ref().map(WriteLimit::current) else { return };
    if *last != Some(limit) {
        *last = Some(limit);
        opts.progress.note(&format!("write limit {limit}"));
    }
}

/// The digests of every key the live objects of `kind` carry, and how many carry each.
async fn live_keys(client: &kube::Client, kind: &KindProfile, page: &PageRequest<'_>) -> Result<LiveKeys> {
    let mut keys = LiveKeys::default();
    list_objects(client, kind, page, |object| {
        keys.add(&kind.kind, &kind.keys_of(object));
        Ok(())
    })
    .await?;
    Ok(keys)
}

/// Lists `kind` page by page, plans each page, tallies it and sends each writing item with
/// its live object to `writes` (unless a dry run); after a stop, lists no further page and
/// sends nothing more, counting what it would have sent. Returns how many it meant to send.
#[allow(clippy::too_many_arguments)]
async fn plan_pages(
    client: &kube::Client,
    kind: &KindProfile,
    opts: &RestoreOptions,
    input: &PlanInput<'_>,
    matcher: &mut KindMatcher<'_>,
    tally: &mut Tally<'_>,
    mut writes: mpsc::Sender<(PlanItem, LiveObject)>,
    stop: &Stop,
) -> Result<usize> {
    let mut meant = 0;
    // A listing slowed down by the writes can outlive its continue token: the pager then
    // lists again, past the objects it handed out already.
    let mut pager = Pager::new(client, kind, &opts.page());
    loop {
        let page = tokio::select! {
            page = pager.next(), if !stop.now() => page?,
            _ = stop.clone().wait() => None,
        };
        let Some(page) = page else { break };
        let mut live = Vec::with_capacity(page.len());
        {
            // One lock a page; the appliers read what was seen between pages.
            let mut seen = tally.seen.page();
            for object in pager.objects(&page) {
                let object = object?;
                seen.saw(kind, &object);
                let object = LiveObject::from_raw(kind, &object);
                live.push(if opts.explain { object } else { object.compact() });
            }
        }
        drop(page);
        let items = matcher.page(&PlanInput { live: &live, ..*input }, 0..live.len())?;
        opts.progress.advance(items.iter().filter(|i| i.record.is_some()).count() as u64);
        for item in items {
            let object = item.live.and_then(|l| live.get(l)).filter(|_| item.writes() && !opts.dry_run);
            // An item to write is streamed with its outcome; after a stop, not at all.
            tally.keep(&item, opts, object.is_none());
            if let Some(object) = object.cloned() {
                meant += 1;
                if !stop.now() {
                    // The receiver ends only when the restore does, or stops.
                    let _ = writes.send((item, object)).await;
                }
            }
        }
    }
    Ok(meant)
}

/// What the writes of one kind left for the report.
#[derive(Default)]
struct Applied {
    /// Objects whose writes were started (and finished: each has its outcome).
    started: usize,
    writes: usize,
    outcomes: Vec<Outcome>,
    views: Views,
    /// For the kind's summary Event.
    summary: KindSummary,
}

impl Applied {
    /// Counts the outcome and keeps it when the report lists every outcome
    /// ([`RestoreOptions::explain`]) or it needs attention; streaming, hands it to the sink
    /// with its item and keeps only a failure.
    fn add(&mut self, mut outcome: Outcome, item: PlanItem, opts: &RestoreOptions) {
        self.started += 1;
        self.writes += outcome.writes;
        self.summary.add(&outcome);
        self.views.extend(outcome.after.take());
        if let Some(sink) = &opts.sink {
            if outcome.error.is_some() {
                self.outcomes.push(outcome.clone());
            }
            sink.send(ObjectLine { item, outcome: Some(outcome) });
            return;
        }
        let notable = outcome.error.is_some() || outcome.held.is_some() || outcome.verdict != item.verdict;
        if opts.explain || notable {
            self.outcomes.push(outcome);
        }
    }
}

/// The report as the pages come in, and the pairing of the objects listed.
struct Tally<'p> {
    report: RestoreReport,
    seen: &'p Seen,
}

impl Tally<'_> {
    /// Counts the item, and keeps it when the report lists every item ([`RestoreOptions::explain`])
    /// or it needs attention (anything but a restore or an equal status). Streaming, keeps none:
    /// hands it to the sink when it is `done` (nothing to write), else its outcome will.
    fn keep(&mut self, item: &PlanItem, opts: &RestoreOptions, done: bool) {
        *self.report.counts.entry(item.verdict).or_default() += 1;
        if let Some(sink) = &opts.sink {
            if done {
                sink.send(ObjectLine { item: item.clone(), outcome: None });
            }
        } else if opts.explain || !matches!(item.verdict, Verdict::Restore | Verdict::AlreadyEqual) {
            self.report.plan.items.push(item.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::api::{self, list_with_an_expired_token};
    use crate::fixtures::{SNAPSHOT_TIME, manifest, record, ts, uuid};
    use crate::format::Records;
    use serde_json::json;

    #[tokio::test]
    async fn a_key_count_that_outlives_its_continue_token_lists_again_from_the_start() {
        let (client, handle) = api::client();
        let server = tokio::spawn(async move {
            let mut api = handle;
            list_with_an_expired_token(&mut api, None).await
        });
        let profile = Profile::metal_operator();
        let kind = profile.kind("Server").unwrap();
        let keys = live_keys(&client, kind, &PageRequest { size: 2, ..Default::default() }).await.unwrap();
        server.await.unwrap();
        for name in ["a", "b", "c"] {
            assert_eq!(keys.count(uuid(&format!("uuid-{name}")).digest("Server")), 1, "{name} counted once");
        }
    }

    #[tokio::test]
    async fn pages_listed_again_after_an_expired_token_plan_each_object_once() {
        let (client, handle) = api::client();
        let server = tokio::spawn(async move {
            let mut api = handle;
            list_with_an_expired_token(&mut api, None).await
        });
        let profile = Profile::metal_operator();
        let kind = profile.kind("Server").unwrap();
        let records = Records::from_records(
            ["a", "b", "c"]
                .iter()
                .map(|n| record("Server", n, &[uuid(&format!("uuid-{n}"))], json!({"state": "Available"})))
                .collect(),
        );
        let id = SnapshotId::new(ts(SNAPSHOT_TIME));
        let opts = RestoreOptions { dry_run: true, page_size: 2, ..RestoreOptions::new(profile.clone()) };
        let input = PlanInput {
            profile: &profile,
            snapshot: &id,
            snapshot_time: Some(ts(SNAPSHOT_TIME)),
            records: &records,
            live: &[],
            force: false,
            explain: false,
        };
        let mut keys = LiveKeys::default();
        for n in ["a", "b", "c"] {
            keys.add("Server", &[uuid(&format!("uuid-{n}"))]);
        }
        let mut matcher = KindMatcher::new(kind, &records, &keys);
        let at = ts(SNAPSHOT_TIME);
        let report = RestoreReport {
            snapshot: id.to_string(),
            snapshot_created_at: at,
            restored_to: None,
            behind: None,
            passed_over: vec![],
            dry_run: true,
            plan: RestorePlan { snapshot: manifest(id.clone(), at).snapshot_id, items: vec![] },
            counts: BTreeMap::new(),
            outcomes: vec![],
            writes: 0,
            pairing: vec![],
            write_limit: None,
            stopped: None,
            held: 0,
        };
        let seen = Seen::default();
        let mut tally = Tally { report, seen: &seen };
        let (tx, _rx) = mpsc::channel(1);
        let go_on = Stop(tokio::sync::watch::channel(false).1);
        plan_pages(&client, kind, &opts, &input, &mut matcher, &mut tally, tx, &go_on).await.unwrap();
        server.await.unwrap();
        assert!(matcher.finish(&input).unwrap().is_empty(), "every record found its object");
        assert_eq!(tally.report.counts.get(&Verdict::Restore), Some(&3), "{:?}", tally.report.counts);
    }

    /// A sink that keeps what it is handed, for a test to look at.
    fn collecting() -> (Sink, Arc<std::sync::Mutex<Vec<ObjectLine>>>) {
        let lines = Arc::new(std::sync::Mutex::new(vec![]));
        let sink = Sink::new({
            let lines = lines.clone();
            move |line| lines.lock().unwrap().push(line)
        });
        (sink, lines)
    }

    /// Answers a dry run's requests for a profile of Servers only: no kube-system namespace
    /// (404), then Servers a (bare), b (as recorded) and c (no record) for each listing.
    async fn dry_run_api(mut api: api::Handle) -> usize {
        let page = json!({"kind": "ServerList", "metadata": {"continue": ""}, "items": [
            api::server("a", None), api::server("b", Some(&json!({"state": "Available"}))), api::server("c", None)]})
        .to_string();
        let mut requests = 0;
        while let Some((request, send)) = api.next_request().await {
            requests += 1;
            let path = request.uri().path().to_string();
            let (code, body) = match path.as_str() {
                "/apis/metal.ironcore.dev/v1alpha1/servers" => (http::StatusCode::OK, page.clone()),
                _ => (
                    http::StatusCode::NOT_FOUND,
                    json!({"kind": "Status", "code": 404, "reason": "NotFound"}).to_string(),
                ),
            };
            send.send_response(
                http::Response::builder().status(code).body(kube::client::Body::from(body.into_bytes())).unwrap(),
            );
        }
        requests
    }

    /// Issue 22, item 2: a streaming dry run hands every object to the sink as it is decided,
    /// with the status fields a restore changes, and its report holds no item, only the counts.
    #[tokio::test]
    async fn a_streaming_dry_run_hands_every_object_to_the_sink_and_holds_none() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let available = json!({"state": "Available"});
        let records: Vec<_> = ["a", "b", "d"]
            .iter()
            .map(|n| record("Server", n, &[uuid(&format!("uuid-{n}"))], available.clone()))
            .collect();
        crate::fixtures::write_snapshot(&store, SNAPSHOT_TIME, &records, true).await;
        let profile = Profile::metal_operator();
        let servers = Profile { kinds: vec![profile.kind("Server").unwrap().clone()], ..profile };
        let (client, handle) = api::client();
        let server = tokio::spawn(dry_run_api(handle));
        let (sink, lines) = collecting();
        let opts =
            RestoreOptions { dry_run: true, explain: true, sink: Some(sink), ..RestoreOptions::new(servers.clone()) };
        let report = run(&client, &store, &opts).await.unwrap();
        drop(client);
        server.await.unwrap();

        let lines = std::mem::take(&mut *lines.lock().unwrap());
        let verdicts: BTreeMap<String, Verdict> = lines
            .iter()
            .map(|l| {
                let name = l.item.target.as_ref().or(l.item.source.as_ref()).unwrap().name.clone();
                (name, l.item.verdict)
            })
            .collect();
        assert_eq!(lines.len(), 4, "one line per object: {verdicts:?}");
        assert_eq!(
            verdicts,
            BTreeMap::from([
                ("a".into(), Verdict::Restore),
                ("b".into(), Verdict::AlreadyEqual),
                ("c".into(), Verdict::NotInSnapshot),
                ("d".into(), Verdict::MissingOnTarget),
            ])
        );
        let a = lines.iter().find(|l| l.item.verdict == Verdict::Restore).unwrap();
        assert_eq!(a.item.changes.len(), 1, "the changes are streamed: {:?}", a.item.changes);
        assert!(lines.iter().all(|l| l.outcome.is_none()), "a dry run writes nothing");
        assert!(report.plan.items.is_empty() && report.outcomes.is_empty(), "nothing held: {report:?}");
        let summary = serde_json::to_value(report.summary()).unwrap();
        assert_eq!(summary["objects"], 4);
        assert_eq!(summary["counts"]["restore"], 1);
        assert_eq!(summary["counts"]["missing-on-target"], 1);
        assert_eq!(
            (summary["dryRun"].clone(), summary["ok"].clone(), summary["writes"].clone()),
            (json!(true), json!(true), json!(0))
        );
        assert!(summary.get("plan").is_none() && summary.get("outcomes").is_none(), "{summary}");

        // Without a sink, the same dry run holds every item (as `-o json` shows them).
        let (client, handle) = api::client();
        let server = tokio::spawn(dry_run_api(handle));
        let opts = RestoreOptions { dry_run: true, explain: true, ..RestoreOptions::new(servers) };
        let held = run(&client, &store, &opts).await.unwrap();
        drop(client);
        server.await.unwrap();
        assert_eq!(held.plan.items.len(), 4);
        assert_eq!(held.counts, report.counts);
    }

    /// Plays a small API server holding metal-operator Servers and claims: discovery, listings,
    /// merge PATCHes, PUTs (of an object or its status), Events; every GET of a single object
    /// is a partner look-up, and is counted.
    async fn metal_api(mut api: api::Handle, mut objects: BTreeMap<String, serde_json::Value>) -> Vec<String> {
        const GROUP: &str = "/apis/metal.ironcore.dev/v1alpha1";
        fn merge(into: &mut serde_json::Value, patch: &serde_json::Value) {
            match (into.as_object_mut(), patch.as_object()) {
                (Some(into), Some(patch)) => {
                    for (k, v) in patch {
                        match v {
                            serde_json::Value::Null => drop(into.remove(k)),
                            _ => merge(into.entry(k.clone()).or_insert(json!({})), v),
                        }
                    }
                }
                _ => *into = patch.clone(),
            }
        }
        let (mut version, mut lookups) = (10, vec![]);
        while let Some((request, send)) = api.next_request().await {
            let (method, path) = (request.method().clone(), request.uri().path().to_string());
            let body: serde_json::Value = {
                let bytes = request.into_body().collect_bytes().await.unwrap();
                serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)
            };
            let object_path = path.trim_end_matches("/status").to_string();
            let (code, answer) = match (method.as_str(), path.as_str()) {
                ("GET", GROUP) => {
                    let resources = ["servers", "servers/status", "serverclaims", "serverclaims/status"].map(|name| {
                        json!({"name": name, "singularName": "", "namespaced": name.starts_with("serverclaims"),
                               "kind": "", "verbs": []})
                    });
                    (
                        200,
                        json!({"kind": "APIResourceList", "groupVersion": "metal.ironcore.dev/v1alpha1", "resources": resources}),
                    )
                }
                ("GET", p) if p.ends_with("/servers") || p.ends_with("/serverclaims") => {
                    let items: Vec<_> = objects
                        .iter()
                        .filter(|(k, _)| k.contains(&format!("/{}/", p.rsplit('/').next().unwrap())))
                        .map(|(_, o)| o.clone())
                        .collect();
                    (200, json!({"kind": "List", "metadata": {"continue": "", "resourceVersion": "1"}, "items": items}))
                }
                ("POST", p) if p.ends_with("/events") => (201, body),
                ("GET", p) if p.starts_with(GROUP) => {
                    lookups.push(path.clone());
                    match objects.get(&object_path) {
                        Some(object) => (200, object.clone()),
                        None => (404, json!({"kind": "Status", "code": 404, "reason": "NotFound"})),
                    }
                }
                (_, _) if !objects.contains_key(&object_path) => {
                    (404, json!({"kind": "Status", "code": 404, "reason": "NotFound"}))
                }
                (method, _) => {
                    let object = objects.get_mut(&object_path).unwrap();
                    match (method, path.ends_with("/status")) {
                        ("PATCH", _) => merge(object, &body),
                        ("PUT", true) => object["status"] = body["status"].clone(),
                        _ => {
                            let status = object["status"].clone();
                            *object = body;
                            object["status"] = status;
                        }
                    }
                    version += 1;
                    object["metadata"]["resourceVersion"] = version.to_string().into();
                    (200, object.clone())
                }
            };
            let response =
                http::Response::builder().status(code).body(kube::client::Body::from(answer.to_string().into_bytes()));
            send.send_response(response.unwrap());
        }
        lookups
    }

    /// Issue 22, item 3: the one-shot restore of a bound pair that arrived bare looks neither
    /// partner up. The claims are listed once before the Servers, so the Server's wait for its
    /// claim is answered by that listing; the Server's write answered Reserved for the claim,
    /// so the claim's wait for it is answered too. Each object: quiesce, status, release. A
    /// Server whose claim the listing did not see (yet to arrive) is looked up, and held.
    #[tokio::test]
    async fn a_one_shot_restore_of_a_bound_pair_looks_neither_partner_up() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let server =
            |name: &str| record("Server", name, &[uuid(&format!("uuid-{name}"))], json!({"state": "Reserved"}));
        let claim = crate::format::Record {
            namespace: Some("a".into()),
            ..record("ServerClaim", "c1", &[crate::fixtures::key("namespace/name", "a/c1")], json!({"phase": "Bound"}))
        };
        crate::fixtures::write_snapshot(&store, SNAPSHOT_TIME, &[server("s1"), server("s2"), claim], true).await;
        let profile = Profile::metal_operator();
        let kinds = ["Server", "ServerClaim"].map(|k| profile.kind(k).unwrap().clone());
        let profile = Profile { kinds: kinds.to_vec(), ..profile };
        let live_server = |name: &str, claim: &str| {
            let mut server = api::server(name, None);
            server["spec"]["serverClaimRef"] = json!({"namespace": "a", "name": claim});
            server
        };
        let live_claim = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim",
            "metadata": {"name": "c1", "namespace": "a", "uid": "uid-c1", "resourceVersion": "1"},
            "spec": {"serverRef": {"name": "s1"}}});
        let objects = BTreeMap::from([
            ("/apis/metal.ironcore.dev/v1alpha1/servers/s1".to_string(), live_server("s1", "c1")),
            ("/apis/metal.ironcore.dev/v1alpha1/servers/s2".to_string(), live_server("s2", "c2")),
            ("/apis/metal.ironcore.dev/v1alpha1/namespaces/a/serverclaims/c1".to_string(), live_claim),
        ]);
        let (client, handle) = api::client();
        let api = tokio::spawn(metal_api(handle, objects));
        let report = run(&client, &store, &RestoreOptions::new(profile)).await.unwrap();
        drop(client);
        let lookups = api.await.unwrap();

        let c2 = "/apis/metal.ironcore.dev/v1alpha1/namespaces/a/serverclaims/c2";
        assert_eq!(lookups, [c2], "the pair's partners not looked up, the claim not listed looked up");
        assert_eq!(report.held, 1, "s2 waits for its claim: {report:?}");
        let held: Vec<_> = report.outcomes.iter().filter_map(|o| o.held.as_deref()).collect();
        assert_eq!(held, ["waits for ServerClaim a/c2"]);
        assert_eq!((report.counts[&Verdict::Restore], report.writes), (3, 9), "{report:?}");
    }

    /// Streaming, each outcome goes to the sink with its item, and the report keeps only the
    /// failures: `ok()` and the failure count still see them; holds are counted.
    #[test]
    fn a_streamed_outcome_goes_to_the_sink_and_only_a_failure_is_kept() {
        let (sink, lines) = collecting();
        let opts = RestoreOptions { sink: Some(sink), ..RestoreOptions::new(Profile::metal_operator()) };
        let item = |name: &str| PlanItem {
            kind: "Server".into(),
            verdict: Verdict::Restore,
            key: None,
            target: Some(crate::format::ObjectRef { kind: "Server".into(), namespace: None, name: name.into() }),
            source: None,
            reason: "restore".into(),
            forced: false,
            changes: vec![],
            release: false,
            record: None,
            live: None,
        };
        let outcome = |name: &str, held: bool, error: bool| Outcome {
            object: item(name).target.unwrap(),
            verdict: Verdict::Restore,
            writes: 3,
            reason: None,
            held: held.then(|| "waits".into()),
            error: error.then(|| "boom".into()),
            after: None,
            versions: vec![],
        };
        let mut applied = Applied::default();
        applied.add(outcome("ok", false, false), item("ok"), &opts);
        applied.add(outcome("held", true, false), item("held"), &opts);
        applied.add(outcome("failed", false, true), item("failed"), &opts);
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|l| l.outcome.is_some()));
        let line = serde_json::to_value(&lines[2]).unwrap();
        assert_eq!(
            (line["target"]["name"].clone(), line["outcome"]["error"].clone()),
            (json!("failed"), json!("boom"))
        );
        assert_eq!(applied.outcomes.len(), 1, "only the failure is kept");
        assert_eq!((applied.started, applied.writes, applied.summary.held), (3, 9, 1));
    }

    /// F162 (issue 38, item 9): a point stopped by a gap is behind the bucket (the CLI exits 5);
    /// with `--at`, only when the chain stops right after the point.
    #[test]
    fn a_point_before_a_gap_is_behind_the_bucket() {
        let point = |applied: u64, verified: u64, gap: Option<&str>| Point {
            base: "b".into(),
            segments_applied: applied,
            segments_verified: verified,
            time: ts(SNAPSHOT_TIME),
            gap: gap.map(str::to_string),
            passed_over: vec![],
            consistent: true,
        };
        assert_eq!(behind(None, None), None, "no journal");
        assert_eq!(behind(Some(&point(3, 3, None)), None), None, "the chain's end");
        let gap = "segment 4 of base b: signature refused";
        let said = behind(Some(&point(3, 3, Some(gap))), None).unwrap();
        assert!(said.contains("older than the newest point the bucket shows") && said.contains(gap), "{said}");
        let at = Some(ts(SNAPSHOT_TIME));
        assert!(behind(Some(&point(3, 3, Some(gap))), at).is_some(), "--at past the gap's segment, maybe");
        assert_eq!(behind(Some(&point(2, 3, Some(gap))), at), None, "segment 3 ends past --at, and so does the gap");
    }
}
