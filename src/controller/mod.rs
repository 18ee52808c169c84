//! The restore controller: watch-driven restore on the target cluster.
//!
//! Watches every kind of the profile. Each event updates a live index (objects and their
//! identity keys) and marks the object dirty; dirty objects are reconciled with the same plan
//! and apply code as the one-shot restore, on a small input: the object, the records that
//! share its keys, and the live objects that share theirs. So an object that appears with an
//! empty status gets its status back, a restored one is "already equal", and ambiguity is
//! judged exactly as the one-shot plan judges it. The newest good snapshot is reloaded every
//! `snapshot_refresh`; a new one makes every object dirty again. A Server or ServerClaim that
//! appears makes the BMCs, Servers and claims restatus still keeps ignored dirty: one may be
//! waiting for it; a Server whose status changes makes the claims it keeps ignored dirty: one
//! may be waiting for it to be Reserved for it.
//!
//! The watches queue their changes in an inbox that keeps each object's newest change only
//! (bounded by the objects, and a watch never waits for the main loop); the events of the
//! controller's own writes (known by the resourceVersions they made) update the index but make
//! nothing dirty; and dirty objects wait in a work queue ([`queue`]): changes before wake-ups,
//! the kinds in profile order, the most recent first, each reconcile a task of its own that
//! starts as soon as another ends, so that an object arriving during a mass arrival waits for
//! a slot, not for the backlog, and no reconcile waits for a slower one.
//!
//! Rooms: [`context`] (shared state, snapshot refresh, readiness), [`watch`] (one watch per
//! kind into the main loop), [`queue`] (which dirty object starts next), [`reconcile`] (plan
//! and apply one object), and here the main loop and the leader election around it.

mod context;
pub mod http;
pub mod index;
pub mod metrics;
mod queue;
mod reconcile;
pub mod retry;
mod watch;

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::domain::identity::KindProfile;
use crate::k8s::leader::{Fence, Leadership, LeaseTiming};
use crate::moving::handshake::Handshake;
use crate::restore::hold::Wake;
use crate::{Error, Result};
use context::refresh_snapshot;
pub use context::{Context, ControllerOptions};
use index::{LiveIndex, SnapshotIndex, Uid};
use queue::{Pending, WorkQueue};
use reconcile::{Done, Next, Work};
use retry::{FIRST_RETRY, Retries};
use watch::{Change, Inbox, watch_kind};

/// The main loop's state.
struct Loop {
    kinds: Vec<KindProfile>,
    live: LiveIndex,
    /// Objects to reconcile, and those being reconciled.
    queue: WorkQueue,
    retries: Retries,
    /// Kinds listed at least once.
    listed: HashSet<String>,
    /// Kinds being listed (again) now: no reconcile starts meanwhile, so that none is planned
    /// on an index that still holds objects deleted while the watch was away (two Servers with
    /// one systemUUID, say: ambiguous) or lacks some that are there.
    listing: HashSet<String>,
    /// A Server or ServerClaim arrived since the last batch: any held object may wait for it.
    partner_arrived: bool,
    /// A Server's status changed since the last batch: a held claim may wait for it to be
    /// Reserved for it.
    server_changed: bool,
    /// The resourceVersions the last reconcile of an object wrote, whose watch events are yet
    /// to come: those events are its own writes' echoes and make nothing dirty (each write of
    /// a restore made three, and each planned again as "already equal").
    echoes: HashMap<Uid, Vec<String>>,
    /// When the gauges that count the whole index were last set.
    gauges_set: Option<Instant>,
}

impl Loop {
    fn new(kinds: Vec<KindProfile>) -> Self {
        Loop {
            kinds,
            live: LiveIndex::default(),
            queue: WorkQueue::default(),
            retries: Retries::default(),
            listed: HashSet::new(),
            listing: HashSet::new(),
            partner_arrived: false,
            server_changed: false,
            echoes: HashMap::new(),
            gauges_set: None,
        }
    }

    fn apply_all(&mut self, ctx: &Context, changes: Vec<Change>) {
        for change in changes {
            self.apply(ctx, change);
        }
    }

    fn apply(&mut self, ctx: &Context, change: Change) {
        match change {
            Change::Upsert(object) => {
                // An object restatus keeps ignored may be waiting for this one: for it to
                // appear, or (a claim) for its Server to become Reserved for it. Those are
                // looked for once per batch (`wake_waiting`), not per event.
                let arrived = !self.live.contains(&object.uid);
                match Wake::of(&object.kind, arrived, || self.live.status_changed(&object)) {
                    Some(Wake::Arrival) => self.partner_arrived = true,
                    Some(Wake::ServerStatus) => self.server_changed = true,
                    None => {}
                }
                if self.queue.hold_event(&object.uid, &object.resource_version) {
                    // In flight: judged once its reconcile ends and says what it wrote.
                    self.live.upsert(*object);
                    return;
                }
                let echo = self.is_echo(&object.uid, &object.resource_version);
                let uid = self.live.upsert(*object);
                if !echo {
                    self.changed(uid);
                }
            }
            Change::Delete(uid) => self.forget(&uid),
            Change::Listing { kind } => {
                self.listing.insert(kind);
            }
            Change::Listed { kind, uids } => {
                // A re-list (after 410 Gone or an API server restart) is the whole truth:
                // objects it does not hold are gone.
                for uid in self.live.uids_of(&kind).into_iter().filter(|u| !uids.contains(u)) {
                    self.forget(&uid);
                }
                ctx.kind_available(&kind);
                self.listing.remove(&kind);
                self.listed.insert(kind);
            }
            Change::Unavailable { kind, reason } => {
                // Its list failed: nothing of it is coming to wait for.
                self.listing.remove(&kind);
                ctx.kind_unavailable(&kind, &reason);
            }
        }
    }

    /// Marks dirty the held objects that may be waiting for what arrived or changed in this
    /// batch. Once per batch: a scan of the index for every arriving object made a mass
    /// arrival quadratic in the fleet.
    fn wake_waiting(&mut self) {
        let wake = match (std::mem::take(&mut self.partner_arrived), std::mem::take(&mut self.server_changed)) {
            (true, _) => Wake::Arrival,
            (false, true) => Wake::ServerStatus,
            (false, false) => return,
        };
        let held: Vec<Uid> = self.live.held(|kind| wake.ends_wait_of(kind)).cloned().collect();
        self.wake(held);
    }

    /// Whether an event with `version` of the object is the echo of a write its last reconcile
    /// made. Events of an object come in order: one carrying a later write's version passes the
    /// earlier ones, and one carrying a version not written here (another writer, or a re-list
    /// after a write of its own) ends the wait for echoes.
    fn is_echo(&mut self, uid: &str, version: &str) -> bool {
        let Some(versions) = self.echoes.get_mut(uid) else { return false };
        match versions.iter().position(|v| v == version) {
            Some(at) => {
                versions.drain(..=at);
                if versions.is_empty() {
                    self.echoes.remove(uid);
                }
                true
            }
            None => {
                self.echoes.remove(uid);
                false
            }
        }
    }

    /// Its kind's place in the profile: an earlier kind starts first (see [`WorkQueue`]).
    fn rank(&self, uid: &str) -> Reverse<usize> {
        let kind = self.live.kind_of(uid);
        Reverse(self.kinds.iter().position(|k| Some(k.kind.as_str()) == kind).unwrap_or(usize::MAX))
    }

    /// Marks an object dirty because it changed (or appeared): reconciled before those woken.
    fn changed(&mut self, uid: Uid) {
        let pending = Pending { changed: true, rank: self.rank(&uid), seen: Instant::now() };
        self.queue.add(uid, pending);
    }

    /// Marks objects dirty that did not change themselves (a retry, a new snapshot, a partner
    /// that arrived): reconciled after the changed ones.
    fn wake(&mut self, uids: impl IntoIterator<Item = Uid>) {
        let now = Instant::now();
        for uid in uids {
            let pending = Pending { changed: false, rank: self.rank(&uid), seen: now };
            self.queue.add(uid, pending);
        }
    }

    /// The object is gone. Those that shared a key with it are planned again: planned beside
    /// it, one may have matched nothing of the snapshot (its record went to this one, or both
    /// were ambiguous).
    fn forget(&mut self, uid: &str) {
        let sharing = self.live.sharing_keys(uid);
        self.wake(sharing);
        self.queue.remove(uid);
        self.echoes.remove(uid);
        self.retries.settled(uid);
        self.live.remove(uid);
    }

    /// Every kind is listed or known to be unavailable.
    fn synced(&self, ctx: &Context) -> bool {
        self.kinds.iter().all(|k| self.listed.contains(&k.kind) || ctx.is_unavailable(&k.kind))
    }

    /// Starts the best waiting objects (see [`WorkQueue`]) until `concurrency` are in flight,
    /// each planned on its neighbourhood as the indexes hold it now; none while a kind is
    /// being listed (again).
    fn start(&mut self, ctx: &Arc<Context>, snapshot: &Arc<SnapshotIndex>, running: &mut Running) {
        if !self.listing.is_empty() {
            return;
        }
        while self.queue.running() < ctx.options.concurrency.max(1) {
            let Some((uid, seen)) = self.queue.take() else { break };
            let kind = self.live.kind_of(&uid).and_then(|kind| self.kinds.iter().find(|k| k.kind == kind));
            let failing = self.retries.contains(&uid);
            let work = kind.and_then(|kind| Work::prepare(kind, snapshot, &self.live, (uid.clone(), seen, failing)));
            match work {
                // Gone from the index meanwhile.
                None => self.finish(ctx, uid, Ok(Next::Settled.into())),
                Some(Err(e)) => self.finish(ctx, uid, Err(e)),
                Some(Ok(work)) => running.spawn(uid, work.run(ctx.clone())),
            }
        }
    }

    /// An object's reconcile ended: settled, held for a retry, or failed (counted and logged,
    /// retried after a backoff); the events that came meanwhile are judged, and it starts
    /// again if it was dirtied meanwhile.
    fn finish(&mut self, ctx: &Context, uid: Uid, done: Result<Done>) {
        let events = self.queue.finish(&uid);
        if self.live.contains(&uid) {
            match done {
                Ok(Done { next, wrote }) => {
                    if !wrote.is_empty() {
                        self.echoes.insert(uid.clone(), wrote);
                    }
                    match next {
                        Next::Settled => self.retries.settled(&uid),
                        Next::Retry => {
                            self.retries.failed(&uid, Instant::now());
                        }
                    }
                }
                Err(e) => {
                    ctx.metrics.errors.inc();
                    let wait = self.retries.failed(&uid, Instant::now());
                    warn!(uid = &*uid, error = %e, ?wait, "cannot restore the object yet; retried after a backoff");
                }
            }
            for version in events {
                if !self.is_echo(&uid, &version) {
                    self.changed(uid.clone());
                }
            }
        }
        let drained = self.queue.is_idle();
        reconcile::summarize(ctx, &self.kinds, drained);
        self.set_gauges(ctx, drained);
    }

    /// The gauges that count the whole index: when the work is drained (`now`), and at most
    /// once a second meanwhile (not once an object).
    fn set_gauges(&mut self, ctx: &Context, now: bool) {
        if !now && self.gauges_set.is_some_and(|at| at.elapsed() < GAUGES_EVERY) {
            return;
        }
        self.gauges_set = Some(Instant::now());
        ctx.metrics.retrying.set(self.retries.len() as i64);
        ctx.metrics.quiesced.set(self.live.quiesced() as i64);
    }
}

/// How often the gauges that count the whole index are set while objects are reconciled.
const GAUGES_EVERY: Duration = Duration::from_secs(1);

/// The reconciles in flight, each a task of its own (so it goes on while the main loop waits
/// for changes), by uid.
#[derive(Default)]
struct Running {
    tasks: tokio::task::JoinSet<Result<Done>>,
    uids: HashMap<tokio::task::Id, Uid>,
}

impl Running {
    fn spawn(&mut self, uid: Uid, reconcile: impl std::future::Future<Output = Result<Done>> + Send + 'static) {
        let task = self.tasks.spawn(reconcile);
        self.uids.insert(task.id(), uid);
    }

    fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The next reconcile to end, with its uid; `None` when none runs. A reconcile that
    /// panicked failed.
    async fn next(&mut self) -> Option<(Uid, Result<Done>)> {
        loop {
            let joined = self.tasks.join_next_with_id().await?;
            let id = match &joined {
                Ok((id, _)) => *id,
                Err(e) => e.id(),
            };
            let Some(uid) = self.uids.remove(&id) else { continue };
            let done = joined.map(|(_, done)| done).unwrap_or_else(|e| {
                Err(Error::RestoreFailed { object: uid.to_string(), reason: format!("its reconcile ended: {e}") })
            });
            return Some((uid, done));
        }
    }
}

/// Runs until `shutdown` completes. Call only while leading.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    tokio::pin!(shutdown);
    let kinds: Vec<KindProfile> = ctx.options.profile.kinds.iter().filter(|k| !k.is_denied()).cloned().collect();
    let inbox = Arc::new(Inbox::default());
    let watches: Vec<_> =
        kinds.iter().map(|kind| tokio::spawn(watch_kind(ctx.clone(), kind.clone(), inbox.sender()))).collect();
    let mut state = Loop::new(kinds);
    let mut running = Running::default();
    let mut refresh = tokio::time::interval(ctx.options.snapshot_refresh);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retry = tokio::time::interval(FIRST_RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The refresh under way: a download can take a while, or hang on a store that stopped
    // answering until `--snapshot-timeout`; the loop goes on restoring from the snapshot in use
    // meanwhile.
    let mut refreshing: Option<tokio::task::JoinHandle<bool>> = None;
    // The end of the batch window open: changes gathered until then wake the objects waiting
    // for them once (see `Loop::wake_waiting`).
    let mut window: Option<tokio::time::Instant> = None;
    let result = loop {
        // What the watches sent while the loop was busy, and the work queue.
        ctx.metrics.watch_pending.set(inbox.len() as i64);
        ctx.metrics.queue_waiting.set(state.queue.waiting() as i64);
        ctx.metrics.reconciling.set(state.queue.running() as i64);
        // Not biased: a stream of events must not starve the refresh or the reconciles ending.
        tokio::select! {
            _ = &mut shutdown => {
                // No object's writes start after it, those in flight finish (each ends with its
                // release), then the loop ends. The manifests' terminationGracePeriodSeconds
                // leave time for that.
                if !running.is_empty() {
                    info!("shutting down: finishing the objects being written");
                }
                while let Some((uid, done)) = running.next().await {
                    state.finish(&ctx, uid, done);
                }
                reconcile::summarize(&ctx, &state.kinds, true);
                break Ok(());
            }
            _ = refresh.tick(), if refreshing.is_none() => {
                let ctx = ctx.clone();
                refreshing = Some(tokio::spawn(async move { refresh_snapshot(&ctx).await }));
            }
            changed = async {
                match refreshing.as_mut() {
                    Some(under_way) => under_way.await,
                    None => std::future::pending().await,
                }
            }, if refreshing.is_some() => {
                refreshing = None;
                // A refresh that panicked changed nothing; the next tick tries again.
                if changed.unwrap_or(false) {
                    let all: Vec<Uid> = state.live.uids().cloned().collect();
                    state.wake(all);
                }
            }
            _ = retry.tick() => {
                let due: Vec<Uid> =
                    state.retries.due(Instant::now()).into_iter().filter_map(|uid| state.live.uid(&uid)).collect();
                state.wake(due);
            }
            changes = inbox.recv() => {
                let Some(changes) = changes else { break Err(Error::WatchesEnded) };
                state.apply_all(&ctx, changes);
                window.get_or_insert_with(|| tokio::time::Instant::now() + ctx.options.batch_window);
            }
            // The window ends however fast changes keep coming.
            _ = tokio::time::sleep_until(window.unwrap_or_else(tokio::time::Instant::now)), if window.is_some() => {
                window = None;
                state.wake_waiting();
                // The echoes of the last writes (a release) come after their reconcile ended.
                let idle = state.queue.is_idle();
                state.set_gauges(&ctx, idle);
            }
            Some((uid, done)) = running.next(), if !running.is_empty() => state.finish(&ctx, uid, done),
        }
        if state.synced(&ctx) {
            let snapshot = ctx.snapshot.read().await.clone();
            if let Some(snapshot) = snapshot {
                ctx.synced.store(true, Ordering::Relaxed);
                // A reconcile starts as soon as another ends: no chunk waits for its slowest.
                state.start(&ctx, &snapshot, &mut running);
            }
        }
    };
    for watch in watches {
        watch.abort();
    }
    if let Some(refreshing) = refreshing {
        refreshing.abort();
    }
    result
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
    let server = tokio::spawn(http::serve(ctx.clone(), crate::metrics::bind(election.http_addr).await?));
    let newest = tokio::spawn(context::export_newest(ctx.clone(), ctx.options.snapshot_refresh));
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
    use std::time::Duration;

    use super::context::newer_snapshot;
    use super::index::SnapshotIndex;
    use super::*;
    use crate::domain::identity::Profile;
    use crate::fixtures::{self, uuid};
    use crate::format::Records;
    use crate::store::SnapshotStore;

    pub(super) fn context() -> Arc<Context> {
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
            demands: Default::default(),
            concurrency: 1,
            write_limit: None,
            snapshot_refresh: Duration::from_secs(60),
            snapshot_timeout,
            batch_window: Duration::from_millis(10),
            journal: true,
        };
        Context::new(client, store, options)
    }

    fn state(ctx: &Context) -> Loop {
        Loop::new(ctx.options.profile.kinds.clone())
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
        // Nothing starts until the list is complete: z planned beside x, which the index still
        // holds, would be ambiguous.
        let at = jiff::Timestamp::now();
        let manifest = fixtures::manifest(crate::format::SnapshotId::new(at), at);
        let snapshot = Arc::new(SnapshotIndex::new(manifest, Records::from_records(vec![])));
        let mut running = Running::default();
        state.apply(&ctx, Change::Listing { kind: "Server".into() });
        state.apply(&ctx, Change::Upsert(Box::new(fixtures::live("Server", "z", &[uuid("x")], None))));
        state.start(&ctx, &snapshot, &mut running);
        assert_eq!((state.queue.running(), running.is_empty()), (0, true), "nothing starts while a kind is listed");
        state.apply(&ctx, Change::Listed { kind: "Server".into(), uids: ["y", "z"].map(String::from).into() });
        let mut uids = state.live.uids_of("Server");
        uids.sort();
        assert_eq!(uids, ["y", "z"]);
        assert!(!state.queue.is_waiting("x") && state.retries.is_empty(), "x is forgotten everywhere");
        assert!(state.queue.is_waiting("z"), "z, which shared x's key, is planned again without it");
        state.start(&ctx, &snapshot, &mut running);
        let started = (state.queue.running(), state.queue.waiting());
        assert_eq!(started, (1, 1), "y and z start once the list is complete, one at a time (concurrency 1)");
        // A kind whose list fails (not served, forbidden) holds nothing back.
        state.apply(&ctx, Change::Listing { kind: "BMC".into() });
        state.apply(&ctx, Change::Unavailable { kind: "BMC".into(), reason: "not served".into() });
        assert!(state.listing.is_empty());
    }

    /// The objects waiting, sorted; taken (and their reconciles ended), so none waits after.
    fn take_dirty(state: &mut Loop) -> Vec<String> {
        let taken: Vec<Uid> = std::iter::from_fn(|| state.queue.take()).map(|(uid, _)| uid).collect();
        for uid in &taken {
            state.queue.finish(uid);
        }
        let mut uids: Vec<String> = taken.iter().map(|u| u.to_string()).collect();
        uids.sort();
        uids
    }

    /// Issue 22: the watch events of an object's own writes (quiesce, status, release) make
    /// nothing dirty, whichever of them arrive; an event of another writer does, and ends the
    /// wait for echoes; a Server's own status write still wakes the claims held for it.
    #[tokio::test]
    async fn the_echoes_of_its_own_writes_make_nothing_dirty() {
        let ctx = context();
        let mut state = state(&ctx);
        let at = |version: &str, status: Option<serde_json::Value>| {
            let mut server = fixtures::live("Server", "s", &[uuid("s")], status);
            server.resource_version = version.into();
            Change::Upsert(Box::new(server.compact()))
        };
        state.apply(&ctx, at("1", None));
        take_dirty(&mut state);
        state.echoes.insert("s".into(), ["2", "3", "4"].map(String::from).to_vec());
        // The quiesce's echo is lost (a watch resumed past it): the status write's passes it.
        state.apply(&ctx, at("3", Some(serde_json::json!({"state": "Reserved"}))));
        assert!(state.queue.waiting() == 0 && state.server_changed, "an echo: not dirty, but held claims are woken");
        assert_eq!(state.echoes["s"], ["4"]);
        state.apply(&ctx, at("4", Some(serde_json::json!({"state": "Reserved"}))));
        assert!(state.queue.waiting() == 0 && state.echoes.is_empty(), "the last echo ends the wait");
        state.apply(&ctx, at("5", Some(serde_json::json!({"state": "Available"}))));
        assert!(state.queue.is_waiting("s"), "another writer's change is reconciled");

        take_dirty(&mut state);
        state.echoes.insert("s".into(), ["7", "8"].map(String::from).to_vec());
        state.apply(&ctx, at("6", None));
        assert!(state.queue.is_waiting("s") && state.echoes.is_empty(), "not one of its writes: dirty, wait over");
        state.echoes.insert("s".into(), ["9"].map(String::from).to_vec());
        state.apply(&ctx, Change::Delete("s".into()));
        assert!(state.echoes.is_empty(), "a deleted object's echoes are forgotten");
    }

    /// Issue 22: the events of an object in flight wait for its reconcile to end: the echoes
    /// of the writes it made then make nothing dirty, an echo still to come is expected, and
    /// another writer's change makes it dirty again (it starts again once its reconcile ended,
    /// never twice at once); the end of the reconcile of an object deleted meanwhile changes
    /// nothing.
    #[tokio::test]
    async fn the_events_of_an_object_in_flight_are_judged_when_its_reconcile_ends() {
        let ctx = context();
        let mut state = state(&ctx);
        let at = |version: &str| {
            let mut server = fixtures::live("Server", "s", &[uuid("s")], None);
            server.resource_version = version.into();
            Change::Upsert(Box::new(server.compact()))
        };
        let wrote = |versions: &[&str]| {
            Ok(Done { next: Next::Settled, wrote: versions.iter().map(|v| v.to_string()).collect() })
        };
        state.apply(&ctx, at("1"));
        let (uid, _) = state.queue.take().unwrap();
        state.apply(&ctx, at("2"));
        state.apply(&ctx, at("3"));
        assert!(!state.queue.is_waiting("s"), "not judged while in flight");
        state.finish(&ctx, uid.clone(), wrote(&["2", "3", "4"]));
        assert_eq!(state.queue.waiting(), 0, "its own writes' echoes");
        assert_eq!(state.echoes["s"], ["4"], "the release's echo is still to come");
        assert!(!state.queue.in_flight("s"));

        state.apply(&ctx, at("4"));
        state.changed(uid.clone());
        let (uid, _) = state.queue.take().unwrap();
        state.apply(&ctx, at("5"));
        state.apply(&ctx, at("6"));
        assert!(state.queue.take().is_none(), "never twice at once");
        state.finish(&ctx, uid.clone(), wrote(&["6"]));
        assert!(state.queue.is_waiting("s"), "5 was another writer's: dirty again");

        let (uid, _) = state.queue.take().unwrap();
        state.apply(&ctx, Change::Delete("s".into()));
        state.finish(&ctx, uid, Err(Error::RestoreFailed { object: "s".into(), reason: "gone".into() }));
        assert!(state.queue.is_idle() && state.retries.is_empty() && state.echoes.is_empty());
        assert_eq!(ctx.metrics.errors.get(), 0, "a deleted object's failure is not counted");
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
        state.wake_waiting();
        take_dirty(&mut state);
        state.apply(&ctx, Change::Upsert(server(None)));
        assert_eq!(state.queue.waiting(), 1, "not before the batch ends");
        state.wake_waiting();
        assert_eq!(
            take_dirty(&mut state),
            ["c", "s"],
            "a Server arrived: the held claim is tried again, the free one is not"
        );
        state.apply(&ctx, Change::Upsert(server(None)));
        state.wake_waiting();
        assert_eq!(take_dirty(&mut state), ["s"], "the same status: only itself");
        // Twice in one batch: the held claims are looked for once, after it.
        state.apply(&ctx, Change::Upsert(server(Some(serde_json::json!({"state": "Reserved"})))));
        assert_eq!(state.queue.waiting(), 1, "not before the batch ends");
        state.wake_waiting();
        assert_eq!(take_dirty(&mut state), ["c", "s"], "the held claim is tried again, the free one is not");
        state.apply(&ctx, Change::Upsert(server(Some(serde_json::json!({"state": "Reserved"})))));
        state.wake_waiting();
        assert_eq!(state.queue.waiting(), 1, "unchanged again");
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

    fn server(name: &str, state: &str) -> crate::format::Record {
        fixtures::record("Server", name, &[uuid(name)], serde_json::json!({"state": state}))
    }

    fn states(index: &SnapshotIndex) -> Vec<String> {
        (0..index.records.len())
            .map(|i| {
                let r = index.records.record(i).unwrap();
                format!("{}={}", r.name, r.status.get())
            })
            .collect()
    }

    /// F105, F106: the refresh reads the journal of the snapshot in use on. The first load goes
    /// to the newest point (the manifest planned with carries the point's time); a refresh with
    /// nothing new changes nothing; a new segment advances the point (records, the timestamp
    /// gauge, the segments gauge, what /readyz says); a missing segment keeps the point before
    /// it and the gap is remembered (logged once); once the segment is back the point moves
    /// past it. With journals off, the snapshot alone.
    #[tokio::test]
    async fn the_refresh_reads_the_journal_on_and_keeps_the_point_before_a_gap() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let base = fixtures::write_snapshot(&store, "2026-11-30T09:00:00Z", &[server("a", "Available")], true).await;
        fixtures::append_segment(&store, &base, &[server("a", "Reserved")], 5, true).await;
        let ctx = context_on(store.clone(), Duration::from_secs(120));
        let in_use = |ctx: &Arc<Context>| {
            let ctx = ctx.clone();
            async move { ctx.snapshot.read().await.clone().unwrap() }
        };
        assert!(refresh_snapshot(&ctx).await);
        let index = in_use(&ctx).await;
        assert_eq!(states(&index), [r#"a={"state":"Reserved"}"#]);
        assert_eq!(index.manifest.created_at, fixtures::ts("2026-11-30T09:00:05Z"), "the point's time");
        assert_eq!(index.manifest.snapshot_id, base.snapshot_id);
        assert_eq!(ctx.metrics.snapshot_segments.get(), 1);
        assert!(!refresh_snapshot(&ctx).await, "nothing new");

        fixtures::append_segment(&store, &base, &[server("b", "Initial")], 5, true).await;
        assert!(refresh_snapshot(&ctx).await, "a new segment");
        let index = in_use(&ctx).await;
        assert_eq!(states(&index), [r#"a={"state":"Reserved"}"#, r#"b={"state":"Initial"}"#]);
        assert_eq!(ctx.metrics.snapshot_segments.get(), 2);
        let expected = fixtures::ts("2026-11-30T09:00:10Z").as_millisecond() as f64 / 1000.0;
        assert_eq!(ctx.metrics.snapshot_timestamp.get(), expected);
        let said = ctx.in_use().unwrap();
        assert!(said.contains("+ 2 journal segments, at 2026-11-30T09:00:10Z"), "{said}");

        // Segment 3 missing while 4 is there: the point stays at 2, the gap is known.
        fixtures::append_segment(&store, &base, &[server("a", "Tainted")], 5, true).await;
        fixtures::append_segment(&store, &base, &[server("a", "Error")], 5, true).await;
        let three = store.segment_object_path(&base.snapshot_id, 3, crate::format::SEGMENT_HEADER_SUFFIX);
        let objects = store.object_store().clone();
        let header = object_store::ObjectStoreExt::get(objects.as_ref(), &three).await.unwrap().bytes().await.unwrap();
        object_store::ObjectStoreExt::delete(objects.as_ref(), &three).await.unwrap();
        assert!(!refresh_snapshot(&ctx).await, "the point stays before the gap");
        assert_eq!(ctx.metrics.snapshot_segments.get(), 2);
        let gap = ctx.journal.lock().await.gap.clone().unwrap();
        assert!(gap.starts_with(&format!("segment 3 of base {}: is missing", base.snapshot_id)), "{gap}");
        assert_eq!(ctx.metrics.errors.get(), 0, "a gap is no error");
        object_store::ObjectStoreExt::put(objects.as_ref(), &three, header.into()).await.unwrap();
        assert!(refresh_snapshot(&ctx).await, "past the gap");
        assert_eq!(states(&*in_use(&ctx).await), [r#"a={"state":"Error"}"#, r#"b={"state":"Initial"}"#]);
        assert_eq!(ctx.metrics.snapshot_segments.get(), 4);
        assert!(ctx.journal.lock().await.gap.is_none());

        // --no-journal: the snapshot alone.
        // No API server answers (the handle is dropped): the cluster's identity is unknown.
        let (client, api) = fixtures::api::client();
        drop(api);
        let options = ControllerOptions { journal: false, ..ctx.options.clone() };
        let alone = Context::new(client, store, options);
        assert!(refresh_snapshot(&alone).await);
        let index = in_use(&alone).await;
        assert_eq!(states(&index), [r#"a={"state":"Available"}"#]);
        assert_eq!(index.manifest.created_at, base.created_at);
        assert_eq!(alone.metrics.snapshot_segments.get(), 0);
    }

    /// F163 (issue 38, item 9): the snapshot in use deleted from the bucket, an older one left:
    /// the refresh keeps the one in use (records, what /readyz says) rather than going back in
    /// time, counts an error and sets `restatus_snapshot_in_use_gone`; a newer good snapshot
    /// is taken up as before, and the gauge clears. Before: the older one was loaded.
    #[tokio::test]
    async fn a_snapshot_in_use_gone_from_the_bucket_is_kept_rather_than_an_older_one() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let older = fixtures::write_snapshot(&store, "2026-11-30T08:00:00Z", &[server("a", "Available")], true).await;
        let newer = fixtures::write_snapshot(&store, "2026-11-30T09:00:00Z", &[server("a", "Reserved")], true).await;
        let ctx = context_on(store.clone(), Duration::from_secs(120));
        assert!(refresh_snapshot(&ctx).await);
        let id = |ctx: &Arc<Context>| {
            let ctx = ctx.clone();
            async move { ctx.snapshot.read().await.as_ref().map(|s| s.manifest.snapshot_id.clone()) }
        };
        assert_eq!(id(&ctx).await, Some(newer.snapshot_id.clone()));

        store.delete(&newer.snapshot_id).await.unwrap();
        assert!(!refresh_snapshot(&ctx).await, "nothing taken up");
        assert_eq!(id(&ctx).await, Some(newer.snapshot_id.clone()), "kept, not the 08:00 one");
        let index = ctx.snapshot.read().await.clone().unwrap();
        assert_eq!(states(&index), [r#"a={"state":"Reserved"}"#]);
        assert!(ctx.in_use().unwrap().contains(newer.snapshot_id.as_str()));
        assert_eq!((ctx.metrics.snapshot_in_use_gone.get(), ctx.metrics.errors.get()), (1, 1));
        let err = newer_snapshot(&ctx, Some(&newer.snapshot_id)).await.err().unwrap().to_string();
        assert!(err.contains("no longer in") && err.contains(older.snapshot_id.as_str()), "{err}");

        let newest = fixtures::write_snapshot(&store, "2026-11-30T10:00:00Z", &[server("a", "Error")], true).await;
        assert!(refresh_snapshot(&ctx).await, "a newer one is taken up");
        assert_eq!(id(&ctx).await, Some(newest.snapshot_id));
        assert_eq!(ctx.metrics.snapshot_in_use_gone.get(), 0);
    }
}
