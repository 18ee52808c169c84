//! The restore controller: watch-driven restore on the target cluster.
//!
//! Watches every kind of the profile. Each event updates a live index (objects and their
//! identity keys) and marks the object dirty; dirty objects are handled in short batches with
//! the same plan and apply code as the one-shot restore, on a small input: the object, the
//! records that share its keys, and the live objects that share theirs. So an object that
//! appears with an empty status gets its status back, a restored one is "already equal", and
//! ambiguity is judged exactly as the one-shot plan judges it. The newest good snapshot is
//! reloaded every `snapshot_refresh`; a new one makes every object dirty again. A Server or
//! ServerClaim that appears makes the BMCs, Servers and claims restatus still keeps ignored
//! dirty: one may be waiting for it; a Server whose status changes makes the claims it keeps
//! ignored dirty: one may be waiting for it to be Reserved for it.

pub mod http;
pub mod index;
pub mod metrics;
pub mod retry;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, future, stream};
use tokio::sync::{RwLock, mpsc};
use tracing::{debug, info, warn};

use crate::domain::identity::{KindProfile, Profile};
use crate::domain::live::LiveObject;
use crate::domain::pairing::{METAL_GROUP, ServerIdentity, servers_of_bmc};
use crate::format::Records;
use crate::k8s::Writer;
use crate::k8s::leader::{Fence, Leadership, LeaseTiming};
use crate::k8s::watch::{WatchEvent, WatchRequest, unavailable_reason, watch_objects};
use crate::moving::handshake::Handshake;
use crate::restore::Applier;
use crate::restore::plan::{self, PlanInput, Verdict};
use crate::store::{Accept, Loaded, SnapshotStore, choose_newer, choose_snapshot};
use crate::{Error, Result};
use index::{LiveIndex, SnapshotIndex, Uid};
use metrics::Metrics;
use retry::{FIRST_RETRY, Retries};

#[derive(Debug, Clone)]
pub struct ControllerOptions {
    pub profile: Profile,
    pub selector: Option<String>,
    pub force: bool,
    pub allow_inconsistent: bool,
    /// Also use snapshots captured from the cluster the controller writes to.
    pub allow_same_cluster: bool,
    /// Use only snapshots signed by one of these keys.
    pub trusted_keys: Option<Arc<crate::format::TrustedKeys>>,
    pub concurrency: usize,
    /// How often to look for a newer snapshot.
    pub snapshot_refresh: Duration,
    /// How long one refresh (listing, manifests, a payload's download) may take: a store that
    /// stops answering fails the refresh, and the snapshot in use is kept.
    pub snapshot_timeout: Duration,
    /// How long to gather events into one batch.
    pub batch_window: Duration,
}

/// Shared state: what the reconciler, the HTTP endpoints and the main loop see.
pub struct Context {
    pub client: kube::Client,
    pub store: SnapshotStore,
    pub options: ControllerOptions,
    pub metrics: Metrics,
    snapshot: RwLock<Option<Arc<SnapshotIndex>>>,
    /// Made on the first write (by then the profile's kinds are served, so discovery finds
    /// their status subresources), then kept: one event recorder for the controller's life.
    writer: tokio::sync::OnceCell<Writer>,
    /// Which snapshots to use; the cluster's own identity is read before the first choice.
    accept: tokio::sync::OnceCell<Accept>,
    /// Every kind listed (or unavailable) and a snapshot loaded.
    synced: AtomicBool,
    /// This instance holds the lease.
    leading: AtomicBool,
    /// Kinds that cannot be watched now, with why.
    unavailable: std::sync::Mutex<BTreeMap<String, String>>,
}

impl Context {
    /// Which snapshots this controller uses: consistent ones (unless allowed otherwise), not
    /// captured from its own cluster (unless allowed).
    async fn accept(&self) -> &Accept {
        self.accept
            .get_or_init(|| async {
                Accept {
                    inconsistent: self.options.allow_inconsistent,
                    this_cluster: crate::k8s::cluster_uid(&self.client).await,
                    same_cluster: self.options.allow_same_cluster,
                    trusted: self.options.trusted_keys.clone(),
                }
            })
            .await
    }

    pub fn new(client: kube::Client, store: SnapshotStore, options: ControllerOptions) -> Arc<Self> {
        Arc::new(Context {
            client,
            store,
            options,
            metrics: Metrics::default(),
            snapshot: RwLock::new(None),
            writer: tokio::sync::OnceCell::new(),
            accept: tokio::sync::OnceCell::new(),
            synced: AtomicBool::new(false),
            leading: AtomicBool::new(false),
            unavailable: Default::default(),
        })
    }

    /// A standby is ready (it serves and waits for the lease; leadership is a metric); the
    /// leader once a snapshot is loaded and every kind is listed or known to be unavailable.
    pub fn is_ready(&self) -> bool {
        !self.leading.load(Ordering::Relaxed) || self.synced.load(Ordering::Relaxed)
    }

    /// For roles that need no snapshot to start (the source-side handshake).
    pub fn mark_ready(&self) {
        self.synced.store(true, Ordering::Relaxed);
    }

    /// The kinds that cannot be watched now, with why.
    pub fn unavailable_kinds(&self) -> BTreeMap<String, String> {
        self.unavailable.lock().map(|u| u.clone()).unwrap_or_default()
    }

    fn is_unavailable(&self, kind: &str) -> bool {
        self.unavailable.lock().is_ok_and(|u| u.contains_key(kind))
    }

    fn kind_unavailable(&self, kind: &str, reason: &str) {
        let Ok(mut unavailable) = self.unavailable.lock() else { return };
        if unavailable.get(kind).map(String::as_str) != Some(reason) {
            warn!(kind, reason, "kind cannot be watched; skipped until it can (watch backs off)");
            unavailable.insert(kind.to_string(), reason.to_string());
            self.metrics.unavailable(kind, true);
        }
    }

    fn kind_available(&self, kind: &str) {
        let Ok(mut unavailable) = self.unavailable.lock() else { return };
        if unavailable.remove(kind).is_some() {
            info!(kind, "kind can be watched again");
            self.metrics.unavailable(kind, false);
        }
    }
}

enum Change {
    Upsert(Box<LiveObject>),
    Delete(String),
    /// A kind was listed (again): these are all its objects now.
    Listed {
        kind: String,
        uids: HashSet<String>,
    },
    /// A kind cannot be watched (not served, forbidden): why.
    Unavailable {
        kind: String,
        reason: String,
    },
}

/// The main loop's state.
struct Loop {
    kinds: Vec<KindProfile>,
    live: LiveIndex,
    /// Objects to reconcile, with when they were first seen dirty.
    dirty: HashMap<Uid, Instant>,
    retries: Retries,
    /// Kinds listed at least once.
    listed: HashSet<String>,
}

impl Loop {
    fn apply(&mut self, ctx: &Context, change: Change) {
        match change {
            Change::Upsert(object) => {
                // An object restatus keeps ignored may be waiting for this one: for it to
                // appear, or (a claim) for its Server to become Reserved for it.
                let partner = matches!(object.kind.as_str(), "Server" | "ServerClaim");
                let now = Instant::now();
                if partner && !self.live.contains(&object.uid) {
                    self.dirty.extend(self.live.held().map(|uid| (uid.clone(), now)));
                } else if object.kind == "Server" && self.live.status_changed(&object) {
                    self.dirty.extend(self.live.held_claims().map(|uid| (uid.clone(), now)));
                }
                let uid = self.live.upsert(*object);
                self.dirty.entry(uid).or_insert_with(Instant::now);
            }
            Change::Delete(uid) => self.forget(&uid),
            Change::Listed { kind, uids } => {
                // A re-list (after 410 Gone or an API server restart) is the whole truth:
                // objects it does not hold are gone.
                for uid in self.live.uids_of(&kind).into_iter().filter(|u| !uids.contains(u)) {
                    self.forget(&uid);
                }
                ctx.kind_available(&kind);
                self.listed.insert(kind);
            }
            Change::Unavailable { kind, reason } => ctx.kind_unavailable(&kind, &reason),
        }
    }

    fn forget(&mut self, uid: &str) {
        self.dirty.remove(uid);
        self.retries.settled(uid);
        self.live.remove(uid);
    }

    /// Every kind is listed or known to be unavailable.
    fn synced(&self, ctx: &Context) -> bool {
        self.kinds.iter().all(|k| self.listed.contains(&k.kind) || ctx.is_unavailable(&k.kind))
    }

    /// Reconciles the dirty objects; failures wait for a retry.
    async fn process(&mut self, ctx: &Context, stopping: &AtomicBool) {
        let dirty = std::mem::take(&mut self.dirty);
        for (uid, failed) in process(ctx, &self.kinds, &self.live, &self.retries, dirty, stopping).await {
            match failed {
                true => {
                    let wait = self.retries.failed(&uid, Instant::now());
                    debug!(uid = &*uid, ?wait, "restore failed; retrying after a backoff");
                }
                false => self.retries.settled(&uid),
            }
        }
        ctx.metrics.retrying.set(self.retries.len() as i64);
        ctx.metrics.quiesced.set(self.live.quiesced() as i64);
    }
}

/// Runs until `shutdown` completes. Call only while leading.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    tokio::pin!(shutdown);
    let kinds: Vec<KindProfile> = ctx.options.profile.kinds.iter().filter(|k| !k.is_denied()).cloned().collect();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let watches: Vec<_> =
        kinds.iter().map(|kind| tokio::spawn(watch_kind(ctx.clone(), kind.clone(), tx.clone()))).collect();
    drop(tx);
    let mut state = Loop {
        kinds,
        live: LiveIndex::default(),
        dirty: HashMap::new(),
        retries: Retries::default(),
        listed: HashSet::new(),
    };
    let mut refresh = tokio::time::interval(ctx.options.snapshot_refresh);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retry = tokio::time::interval(FIRST_RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let result = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            _ = refresh.tick() => {
                // A download can take a while (or hang on an unanswering store): SIGTERM
                // does not wait for it.
                let changed = tokio::select! {
                    _ = &mut shutdown => break Ok(()),
                    changed = refresh_snapshot(&ctx) => changed,
                };
                if changed {
                    let now = Instant::now();
                    state.dirty.extend(state.live.uids().map(|uid| (uid.clone(), now)));
                }
            }
            _ = retry.tick() => {
                let now = Instant::now();
                let due = state.retries.due(now).into_iter().filter_map(|uid| state.live.uid(&uid));
                state.dirty.extend(due.map(|uid| (uid, now)));
            }
            change = rx.recv() => {
                let Some(change) = change else { break Err(Error::WatchesEnded) };
                let mut next = Some(change);
                // Gather what arrives within the batch window, then act once.
                let deadline = tokio::time::Instant::now() + ctx.options.batch_window;
                while let Some(change) = next.take() {
                    state.apply(&ctx, change);
                    next = tokio::time::timeout_at(deadline, rx.recv()).await.ok().flatten();
                }
            }
        }
        if state.synced(&ctx) && ctx.snapshot.read().await.is_some() {
            ctx.synced.store(true, Ordering::Relaxed);
            if !state.dirty.is_empty() {
                // A shutdown in the middle of a batch: no object's writes start after it, those
                // in flight finish (each ends with its release), then the loop ends. The
                // manifests' terminationGracePeriodSeconds leave time for that.
                let stopping = AtomicBool::new(false);
                let processed = state.process(&ctx, &stopping);
                tokio::pin!(processed);
                tokio::select! {
                    _ = &mut processed => {}
                    _ = &mut shutdown => {
                        stopping.store(true, Ordering::Relaxed);
                        info!("shutting down: finishing the objects being written");
                        processed.await;
                        break Ok(());
                    }
                }
            }
        }
    };
    for watch in watches {
        watch.abort();
    }
    result
}

/// Loads the newest good snapshot if it is not the one in use. True when it changed. The
/// listing and the manifests are read first: the payload of the snapshot in use, or of an
/// inconsistent one, is not downloaded again. A refresh that takes longer than
/// `snapshot_timeout` (a store that stopped answering) is an error, counted and logged; the
/// snapshot in use stays, and the next refresh tries again.
async fn refresh_snapshot(ctx: &Context) -> bool {
    let current = ctx.snapshot.read().await.as_ref().map(|s| s.manifest.snapshot_id.clone());
    let chosen = newer_snapshot(ctx, current.as_ref()).await;
    match chosen {
        Ok(Some(loaded)) => {
            info!(snapshot = %loaded.manifest.snapshot_id, records = loaded.records.len(), signed_by = loaded.signer.as_ref().map(|k| k.as_str()), "using snapshot");
            ctx.metrics.snapshot_timestamp.set(loaded.manifest.created_at.as_millisecond() as f64 / 1000.0);
            *ctx.snapshot.write().await = Some(Arc::new(SnapshotIndex::new(loaded.manifest, loaded.records)));
            true
        }
        Ok(None) => false,
        Err(e) => {
            ctx.metrics.errors.inc();
            match &current {
                Some(current) => {
                    warn!(error = %e, snapshot = %current, "snapshot refresh failed; keeping the snapshot in use")
                }
                None => warn!(error = %e, "no snapshot to restore from yet"),
            }
            false
        }
    }
}

/// The snapshot to use instead of `current` (any, when `None`), read within `snapshot_timeout`.
async fn newer_snapshot(ctx: &Context, current: Option<&crate::format::SnapshotId>) -> Result<Option<Loaded>> {
    let accept = ctx.accept().await;
    let chosen = async {
        match current {
            Some(current) => choose_newer(&ctx.store, current, accept).await,
            None => choose_snapshot(&ctx.store, None, accept).await.map(Some),
        }
    };
    let timeout = ctx.options.snapshot_timeout;
    tokio::time::timeout(timeout, chosen).await.unwrap_or_else(|_| {
        Err(Error::StoreTimeout {
            location: ctx.store.location().to_string(),
            what: "the snapshot refresh".into(),
            after: timeout,
        })
    })
}

/// Plans and applies every dirty object, kinds in profile order. Returns each object's uid
/// and whether its restore failed.
async fn process(
    ctx: &Context,
    kinds: &[KindProfile],
    live: &LiveIndex,
    retries: &Retries,
    dirty: HashMap<Uid, Instant>,
    stopping: &AtomicBool,
) -> Vec<(Uid, bool)> {
    let Some(snapshot) = ctx.snapshot.read().await.clone() else { return vec![] };
    let mut results = Vec::with_capacity(dirty.len());
    for kind in kinds {
        let mut uids: Vec<(usize, &Uid, &Instant)> = dirty
            .iter()
            .filter(|(uid, _)| live.kind_of(uid) == Some(kind.kind.as_str()))
            .map(|(uid, seen)| (live.position(uid, &snapshot), uid, seen))
            .collect();
        // In payload order: each frame of the payload is decompressed once.
        uids.sort_unstable();
        let done: Vec<(Uid, bool)> = stream::iter(uids)
            .take_while(|_| future::ready(!stopping.load(Ordering::Relaxed)))
            .map(|(_, uid, seen)| {
                let snapshot = snapshot.clone();
                async move {
                    let failed = match live.neighbourhood(uid, &snapshot) {
                        Some(Ok((records, objects))) => {
                            let dirty = Dirty { uid, seen: *seen, failing: retries.contains(uid) };
                            match bmc_servers(kind, &snapshot, live, &objects, uid) {
                                Ok(servers) => {
                                    reconcile(ctx, kind, &snapshot, (&records, &objects, &servers), dirty).await
                                }
                                Err(e) => {
                                    ctx.metrics.errors.inc();
                                    warn!(uid = &**uid, error = %e, "cannot read the BMC's Servers from the snapshot; retried after a backoff");
                                    true
                                }
                            }
                        }
                        Some(Err(e)) => {
                            ctx.metrics.errors.inc();
                            warn!(uid = &**uid, error = %e, "cannot read the object's records; retried after a backoff");
                            true
                        }
                        None => false,
                    };
                    (uid.clone(), failed)
                }
            })
            .buffer_unordered(ctx.options.concurrency.max(1))
            .collect()
            .await;
        results.extend(done);
    }
    results
}

/// For a BMC restatus holds: the live Servers that share an identity key (systemUUID) with a
/// Server the snapshot holds for it, from the live index, so that its wait finds them by
/// identity whatever their names (see `restore::apply`). Nothing for other objects.
fn bmc_servers(
    kind: &KindProfile,
    snapshot: &SnapshotIndex,
    live: &LiveIndex,
    objects: &[LiveObject],
    uid: &str,
) -> Result<Vec<ServerIdentity>> {
    let Some(bmc) = objects.iter().find(|o| o.uid == uid) else { return Ok(vec![]) };
    if kind.kind != "BMC" || kind.group != METAL_GROUP || !bmc.quiesced_by_restatus() {
        return Ok(vec![]);
    }
    let recorded = servers_of_bmc(&bmc.name, snapshot.system_servers.get(&snapshot.records)?);
    let servers = live.carrying("Server", recorded.iter().flat_map(|r| &r.keys));
    Ok(servers.into_iter().map(|s| ServerIdentity { name: s.name, keys: s.keys }).collect())
}

/// A dirty object: its uid, when its change was seen, and whether its last restore failed.
struct Dirty<'a> {
    uid: &'a str,
    seen: Instant,
    failing: bool,
}

/// One object: the plan's verdict for it, applied if it writes (with its records, the live
/// objects around it and, for a BMC, its Servers on the target). True when the write failed.
async fn reconcile(
    ctx: &Context,
    kind: &KindProfile,
    snapshot: &SnapshotIndex,
    (records, objects, servers): (&Records, &[LiveObject], &[ServerIdentity]),
    Dirty { uid, seen, failing }: Dirty<'_>,
) -> bool {
    let manifest = &snapshot.manifest;
    let input = PlanInput {
        profile: &ctx.options.profile,
        snapshot: &manifest.snapshot_id,
        snapshot_time: manifest.comparable_time(jiff::Timestamp::now()),
        records,
        live: objects,
        force: ctx.options.force,
        explain: false,
    };
    let plan = match plan::plan(&input) {
        Ok(plan) => plan,
        Err(e) => {
            ctx.metrics.errors.inc();
            warn!(uid, error = %e, "cannot plan the object; retried after a backoff");
            return true;
        }
    };
    let mine = |i: &&plan::PlanItem| i.live.is_some_and(|l| objects[l].uid == uid);
    let Some(item) = plan.items.iter().find(mine) else { return false };
    ctx.metrics.decided(item.verdict);
    if failing && item.verdict == Verdict::NotInSnapshot && item.release {
        // Its restore failed; a newer snapshot without its record does not make it safe to
        // hand over bare. It stays quiesced (and retried) until a snapshot restores it or a
        // person removes the ignore.
        info!(uid, "keeping restatus's ignore: its restore failed and this snapshot has no record for it");
        return true;
    }
    if !item.writes() {
        return false;
    }
    let writer = match ctx.writer.get_or_try_init(|| Writer::new(&ctx.client, &ctx.options.profile)).await {
        Ok(writer) => writer,
        Err(e) => {
            ctx.metrics.errors.inc();
            warn!(error = %e, "cannot write yet; retried after a backoff");
            return true;
        }
    };
    let applier = Applier::new(writer, &ctx.options.profile, manifest, records, ctx.options.force)
        .with_snapshot_records(&snapshot.records, &snapshot.system_servers)
        .with_live_servers(servers);
    let outcome = applier.apply_item(kind, item, objects).await;
    if let Some(error) = &outcome.error {
        ctx.metrics.errors.inc();
        warn!(object = %outcome.object, error, "restore failed; retried after a backoff");
        return true;
    }
    if outcome.verdict == Verdict::Restore {
        ctx.metrics.restore_latency.observe(seen.elapsed().as_secs_f64());
        info!(object = %outcome.object, snapshot = %manifest.snapshot_id, "status restored");
    }
    false
}

/// Objects per page of a watch's (re-)list. A page is parsed whole into `DynamicObject`s, some
/// 40 KiB each for a discovered Server: client-go's 500 would hold 20 MiB at once, freed only
/// into the allocator's arenas.
const WATCH_PAGE_SIZE: u32 = 100;

/// Streams one kind's objects into the main loop: upserts and deletions, each complete
/// (re-)list with the uids it held, and the kind's unavailability while it cannot be watched
/// (the watcher backs off as kube-runtime's default backoff says).
async fn watch_kind(ctx: Arc<Context>, kind: KindProfile, tx: mpsc::UnboundedSender<Change>) {
    let request =
        WatchRequest { namespace: None, selector: ctx.options.selector.as_deref(), page_size: WATCH_PAGE_SIZE };
    let mut listing: HashSet<String> = HashSet::new();
    let mut events = watch_objects(&ctx.client, &kind, &request);
    loop {
        let change = match events.try_next().await {
            Ok(Some(WatchEvent::Apply(o))) => upsert(&kind, &o),
            Ok(Some(WatchEvent::InitApply(o))) => {
                listing.extend(o.metadata.uid.clone());
                upsert(&kind, &o)
            }
            Ok(Some(WatchEvent::Delete(o))) => o.metadata.uid.clone().map(Change::Delete),
            Ok(Some(WatchEvent::Init)) => {
                // A (re-)list: the kind may have come with a CRD installed or upgraded since the
                // writer asked discovery about it; its next write asks again.
                if let Some(writer) = ctx.writer.get() {
                    writer.forget(&kind);
                }
                listing.clear();
                None
            }
            Ok(Some(WatchEvent::InitDone)) => {
                Some(Change::Listed { kind: kind.kind.clone(), uids: std::mem::take(&mut listing) })
            }
            Ok(None) => return,
            Err(e) => {
                ctx.metrics.errors.inc();
                match unavailable_reason(&e) {
                    Some(reason) => Some(Change::Unavailable { kind: kind.kind.clone(), reason }),
                    // A connection lost: the watcher resumes from its resourceVersion; a
                    // resourceVersion expired (410): it lists again.
                    None => {
                        warn!(kind = kind.kind, error = %e, "watch interrupted; resumed after a backoff (listed again if its resourceVersion expired)");
                        None
                    }
                }
            }
        };
        if let Some(change) = change
            && tx.send(change).is_err()
        {
            return;
        }
    }
}

/// The object as the index keeps it: its status as digests, not JSON (see
/// [`LiveObject::compact`]), already here, so that what waits in the channel is small too.
fn upsert(kind: &KindProfile, object: &kube::api::DynamicObject) -> Option<Change> {
    LiveObject::from_dynamic(kind, object).ok().map(|o| Change::Upsert(Box::new(o.compact())))
}

/// What this instance does while it leads.
pub enum Role {
    /// Restore status on the target of a move (or a rebuilt cluster).
    Target,
    /// Guard the source of a move: block clusterctl until a final consistent snapshot exists.
    Source(Box<Handshake>),
}

/// Where the controller serves and how it joins the leader election.
#[derive(Clone)]
pub struct Election {
    /// Address of /metrics, /healthz and /readyz.
    pub http_addr: SocketAddr,
    pub lease_namespace: String,
    pub lease_name: String,
    /// This instance's identity in the election.
    pub identity: String,
    pub timing: LeaseTiming,
    /// The Lease's own client (`k8s::client::lease_client`).
    pub lease_client: kube::Client,
    /// The fence of the context's client (`k8s::client::fenced_client`): open while this
    /// instance holds the Lease.
    pub fence: Fence,
}

/// Serves the HTTP endpoints, joins the election and, while leading, runs `role` until
/// `shutdown` completes. Losing the lease is an error: a restart rejoins the election. The
/// lease is lost too when a renewal is overdue (a slow API server, a paused process): then the
/// work in flight is dropped at once and the fence of the client refuses any write still
/// underway; what it left quiesced is the next leader's to restore and release (restatus's own
/// quiesce is released by whoever restores).
pub async fn run_elected(
    ctx: Arc<Context>,
    role: Role,
    election: &Election,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    tokio::pin!(shutdown);
    let server = tokio::spawn(http::serve(ctx.clone(), http::bind(election.http_addr).await?));
    let newest = tokio::spawn(metrics::export_newest(ctx.clone(), ctx.options.snapshot_refresh));
    let leadership = Leadership::join(
        &election.lease_client,
        &election.lease_namespace,
        &election.lease_name,
        &election.identity,
        election.timing,
        election.fence.clone(),
    );
    tokio::select! {
        _ = &mut shutdown => {
            leadership.release().await;
            return Ok(());
        }
        acquired = leadership.acquired() => acquired?,
    }
    ctx.metrics.leader.set(1);
    ctx.leading.store(true, Ordering::Relaxed);
    info!(identity = election.identity, "leading: controller running");
    let work = async {
        match role {
            Role::Target => run(ctx.clone(), &mut shutdown).await,
            Role::Source(handshake) => {
                ctx.mark_ready();
                handshake.run(&mut shutdown).await
            }
        }
    };
    // Biased: after a stop, the lease is found over before the work takes another step.
    let result = tokio::select! {
        biased;
        _ = leadership.lost() => {
            warn!(
                identity = election.identity,
                "lease not renewed in time or taken by another replica: stepped down, writing nothing more"
            );
            Err(Error::Leader("leadership lost; exiting so that a restart rejoins the election".into()))
        }
        result = work => result,
    };
    ctx.metrics.leader.set(0);
    ctx.leading.store(false, Ordering::Relaxed);
    if result.is_ok() {
        leadership.release().await;
    }
    server.abort();
    newest.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, uuid};

    fn context() -> Arc<Context> {
        context_on(SnapshotStore::open("memory://", "c").unwrap(), Duration::from_secs(120))
    }

    fn context_on(store: SnapshotStore, snapshot_timeout: Duration) -> Arc<Context> {
        let (client, _api) = fixtures::api::client();
        let options = ControllerOptions {
            profile: Profile::metal_operator(),
            selector: None,
            force: false,
            allow_inconsistent: false,
            allow_same_cluster: false,
            trusted_keys: None,
            concurrency: 1,
            snapshot_refresh: Duration::from_secs(60),
            snapshot_timeout,
            batch_window: Duration::from_millis(10),
        };
        Context::new(client, store, options)
    }

    fn state(ctx: &Context) -> Loop {
        Loop {
            kinds: ctx.options.profile.kinds.clone(),
            live: LiveIndex::default(),
            dirty: HashMap::new(),
            retries: Retries::default(),
            listed: HashSet::new(),
        }
    }

    #[tokio::test]
    async fn a_relist_drops_the_objects_it_no_longer_holds() {
        let ctx = context();
        let mut state = state(&ctx);
        for name in ["x", "y"] {
            state.apply(&ctx, Change::Upsert(Box::new(fixtures::live("Server", name, &[uuid(name)], None))));
        }
        state.retries.failed("x", Instant::now());
        // After an API server restart the watch lists again: x was deleted meanwhile, and z
        // came with x's identity key.
        state.apply(&ctx, Change::Upsert(Box::new(fixtures::live("Server", "z", &[uuid("x")], None))));
        state.apply(&ctx, Change::Listed { kind: "Server".into(), uids: ["y", "z"].map(String::from).into() });
        let mut uids = state.live.uids_of("Server");
        uids.sort();
        assert_eq!(uids, ["y", "z"]);
        assert!(!state.dirty.contains_key("x") && state.retries.is_empty(), "x is forgotten everywhere");
    }

    /// Issue 21, item 4: a claim restatus holds until its Server is Reserved for it is tried
    /// again when that Server's status changes, not only when a Server appears; a Server
    /// event that leaves its status as it was makes nothing dirty.
    #[tokio::test]
    async fn a_held_claim_is_tried_again_when_its_servers_status_changes() {
        use crate::domain::annotations::{OPERATION_ANNOTATION, OPERATION_IGNORE, QUIESCED_BY_ANNOTATION};
        let ctx = context();
        let mut state = state(&ctx);
        let mut claim = fixtures::live("ServerClaim", "c", &[fixtures::key("namespace/name", "a/c")], None);
        claim.namespace = Some("a".into());
        claim.annotations.insert(OPERATION_ANNOTATION.into(), OPERATION_IGNORE.into());
        claim.annotations.insert(QUIESCED_BY_ANNOTATION.into(), "restatus".into());
        let free = fixtures::live("ServerClaim", "f", &[fixtures::key("namespace/name", "a/f")], None);
        let server = |status: Option<serde_json::Value>| {
            let mut server = fixtures::live("Server", "s", &[uuid("s")], status);
            server.resource_version = "2".into();
            Box::new(server.compact())
        };
        state.apply(&ctx, Change::Upsert(Box::new(claim)));
        state.apply(&ctx, Change::Upsert(Box::new(free)));
        state.apply(&ctx, Change::Upsert(server(None)));
        state.dirty.clear();
        state.apply(&ctx, Change::Upsert(server(None)));
        assert_eq!(state.dirty.keys().map(|u| &**u).collect::<Vec<_>>(), ["s"], "the same status: only itself");
        state.dirty.clear();
        state.apply(&ctx, Change::Upsert(server(Some(serde_json::json!({"state": "Reserved"})))));
        let mut dirty: Vec<&str> = state.dirty.keys().map(|u| &**u).collect();
        dirty.sort();
        assert_eq!(dirty, ["c", "s"], "the held claim is tried again, the free one is not");
        state.dirty.clear();
        state.apply(&ctx, Change::Upsert(server(Some(serde_json::json!({"state": "Reserved"})))));
        assert_eq!(state.dirty.len(), 1, "unchanged again");
    }

    #[tokio::test]
    async fn readiness_waits_for_every_kind_listed_or_unavailable_and_a_standby_is_ready() {
        let ctx = context();
        let mut state = state(&ctx);
        ctx.leading.store(true, Ordering::Relaxed);
        assert!(!ctx.is_ready());
        let kinds: Vec<String> = state.kinds.iter().map(|k| k.kind.clone()).collect();
        for kind in &kinds[1..] {
            state.apply(&ctx, Change::Listed { kind: kind.clone(), uids: HashSet::new() });
        }
        assert!(!state.synced(&ctx));
        state.apply(&ctx, Change::Unavailable { kind: kinds[0].clone(), reason: "forbidden by RBAC".into() });
        assert!(state.synced(&ctx), "an unavailable kind is reported, not waited for");
        assert_eq!(ctx.unavailable_kinds().get(&kinds[0]).map(String::as_str), Some("forbidden by RBAC"));
        state.apply(&ctx, Change::Listed { kind: kinds[0].clone(), uids: HashSet::new() });
        assert!(ctx.unavailable_kinds().is_empty(), "picked up when it can be listed");
        ctx.leading.store(false, Ordering::Relaxed);
        assert!(ctx.is_ready(), "a standby is ready");
    }

    /// F65: the S3 endpoint accepts connections and never answers (a proxy that stopped
    /// forwarding). Without the refresh's own timeout the refresh waited for the object
    /// store's request timeout and retries (30 s and more), and the controller's loop with it.
    #[tokio::test]
    async fn a_refresh_from_a_store_that_stops_answering_times_out_and_keeps_the_snapshot_in_use() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", silent.local_addr().unwrap());
        let held = tokio::spawn(async move {
            let mut connections = vec![];
            while let Ok((connection, _)) = silent.accept().await {
                connections.push(connection); // held open, never answered
            }
        });
        let s3 = object_store::aws::AmazonS3Builder::new()
            .with_endpoint(&endpoint)
            .with_allow_http(true)
            .with_bucket_name("b")
            .with_region("us-east-1")
            .with_access_key_id("k")
            .with_secret_access_key("s")
            .build()
            .unwrap();
        let store = SnapshotStore::new(Arc::new(s3), "p", "c", format!("s3://b/p at {endpoint}")).unwrap();
        let ctx = context_on(store, Duration::from_millis(300));
        let at = jiff::Timestamp::now();
        let in_use = crate::format::SnapshotId::new(at);
        let index = SnapshotIndex::new(fixtures::manifest(in_use.clone(), at), Records::from_records(vec![]));
        *ctx.snapshot.write().await = Some(Arc::new(index));

        let started = Instant::now();
        let err = newer_snapshot(&ctx, Some(&in_use)).await.err().expect("a store that does not answer fails");
        assert!(started.elapsed() < Duration::from_secs(5), "bounded by the refresh timeout: {:?}", started.elapsed());
        assert!(matches!(err, Error::StoreTimeout { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains(&endpoint) && message.contains("did not finish within 0.3s"), "{message}");

        assert!(!refresh_snapshot(&ctx).await, "nothing new");
        assert_eq!(ctx.metrics.errors.get(), 1, "counted");
        let kept = ctx.snapshot.read().await.as_ref().map(|s| s.manifest.snapshot_id.clone());
        assert_eq!(kept, Some(in_use), "the snapshot in use is kept");
        held.abort();
    }
}
