//! The restore controller: watch-driven restore on the target cluster.
//!
//! Watches every kind of the profile. Each event updates a live index (objects and their
//! identity keys) and marks the object dirty; dirty objects are handled in short batches with
//! the same plan and apply code as the one-shot restore, on a small input: the object, the
//! records that share its keys, and the live objects that share theirs. So an object that
//! appears with an empty status gets its status back, a restored one is "already equal", and
//! ambiguity is judged exactly as the one-shot plan judges it. The newest good snapshot is
//! reloaded every `snapshot_refresh`; a new one makes every object dirty again.

pub mod http;
pub mod index;
pub mod metrics;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use kube::runtime::watcher;
use tokio::sync::{RwLock, mpsc};
use tracing::{debug, info, warn};

use crate::domain::identity::{KindProfile, Profile};
use crate::domain::live::LiveObject;
use crate::format::{Manifest, Record};
use crate::k8s::leader::Leadership;
use crate::k8s::{Writer, api_for};
use crate::moving::handshake::Handshake;
use crate::restore::Applier;
use crate::restore::plan::{self, PlanInput, Verdict};
use crate::store::{SnapshotStore, choose_snapshot};
use crate::{Error, Result};
use index::{LiveIndex, SnapshotIndex};
use metrics::Metrics;

#[derive(Debug, Clone)]
pub struct ControllerOptions {
    pub profile: Profile,
    pub selector: Option<String>,
    pub force: bool,
    pub allow_inconsistent: bool,
    pub concurrency: usize,
    /// How often to look for a newer snapshot.
    pub snapshot_refresh: Duration,
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
    ready: AtomicBool,
}

impl Context {
    pub fn new(client: kube::Client, store: SnapshotStore, options: ControllerOptions) -> Arc<Self> {
        Arc::new(Context {
            client,
            store,
            options,
            metrics: Metrics::default(),
            snapshot: RwLock::new(None),
            writer: tokio::sync::OnceCell::new(),
            ready: AtomicBool::new(false),
        })
    }

    /// Ready once a snapshot is loaded and every watch has listed its kind.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// For roles that need no snapshot to start (the source-side handshake).
    pub fn mark_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }
}

enum Change {
    Upsert(LiveObject),
    Delete(String),
    Listed,
}

/// Runs until `shutdown` completes. Call only while leading.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    tokio::pin!(shutdown);
    let kinds: Vec<KindProfile> = ctx.options.profile.kinds.iter().filter(|k| !k.is_denied()).cloned().collect();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut watches = Vec::new();
    for kind in kinds.clone() {
        watches.push(tokio::spawn(watch_kind(ctx.clone(), kind, tx.clone())));
    }
    drop(tx);

    let mut live = LiveIndex::default();
    let mut dirty: HashMap<String, Instant> = HashMap::new();
    let mut listed = 0;
    let mut refresh = tokio::time::interval(ctx.options.snapshot_refresh);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let result = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            _ = refresh.tick() => {
                if refresh_snapshot(&ctx).await {
                    let now = Instant::now();
                    dirty.extend(live.objects.keys().map(|uid| (uid.clone(), now)));
                }
            }
            change = rx.recv() => {
                let Some(change) = change else { break Err(Error::WatchesEnded) };
                let mut next = Some(change);
                // Gather what arrives within the batch window, then act once.
                let deadline = tokio::time::Instant::now() + ctx.options.batch_window;
                while let Some(change) = next.take() {
                    match change {
                        Change::Upsert(object) => {
                            dirty.entry(object.uid.clone()).or_insert_with(Instant::now);
                            live.upsert(object);
                        }
                        Change::Delete(uid) => {
                            dirty.remove(&uid);
                            live.remove(&uid);
                        }
                        Change::Listed => listed += 1,
                    }
                    next = tokio::time::timeout_at(deadline, rx.recv()).await.ok().flatten();
                }
                if listed >= kinds.len() && ctx.snapshot.read().await.is_some() {
                    ctx.ready.store(true, Ordering::Relaxed);
                    process(&ctx, &kinds, &live, std::mem::take(&mut dirty)).await;
                }
            }
        }
    };
    for watch in watches {
        watch.abort();
    }
    result
}

/// Loads the newest good snapshot if it is not the one in use. True when it changed.
async fn refresh_snapshot(ctx: &Context) -> bool {
    let current = ctx.snapshot.read().await.as_ref().map(|s| s.manifest.snapshot_id.clone());
    match choose_snapshot(&ctx.store, None, ctx.options.allow_inconsistent).await {
        Ok(loaded) if Some(&loaded.manifest.snapshot_id) != current.as_ref() => {
            info!(snapshot = %loaded.manifest.snapshot_id, records = loaded.records.len(), "using snapshot");
            ctx.metrics.snapshot_timestamp.set(loaded.manifest.created_at.as_millisecond() as f64 / 1000.0);
            *ctx.snapshot.write().await = Some(Arc::new(SnapshotIndex::new(loaded.manifest, loaded.records)));
            true
        }
        Ok(_) => false,
        Err(e) => {
            ctx.metrics.errors.inc();
            warn!(error = %e, "no snapshot to restore from yet");
            false
        }
    }
}

/// Plans and applies every dirty object, kinds in profile order.
async fn process(ctx: &Context, kinds: &[KindProfile], live: &LiveIndex, dirty: HashMap<String, Instant>) {
    let Some(snapshot) = ctx.snapshot.read().await.clone() else { return };
    for kind in kinds {
        let uids: Vec<(&String, &Instant)> =
            dirty.iter().filter(|(uid, _)| live.objects.get(*uid).is_some_and(|o| o.kind == kind.kind)).collect();
        stream::iter(uids)
            .for_each_concurrent(ctx.options.concurrency.max(1), |(uid, seen)| {
                let snapshot = snapshot.clone();
                async move {
                    let Some((records, objects)) = live.neighbourhood(uid, &snapshot) else { return };
                    reconcile(ctx, kind, &snapshot.manifest, &records, &objects, uid, *seen).await;
                }
            })
            .await;
    }
}

/// One object: the plan's verdict for it, applied if it writes.
async fn reconcile(
    ctx: &Context,
    kind: &KindProfile,
    manifest: &Manifest,
    records: &[Record],
    objects: &[LiveObject],
    uid: &str,
    seen: Instant,
) {
    let input = PlanInput {
        profile: &ctx.options.profile,
        snapshot: &manifest.snapshot_id,
        snapshot_time: manifest.comparable_time(jiff::Timestamp::now()),
        records,
        live: objects,
        force: ctx.options.force,
    };
    let plan = plan::plan(&input);
    let mine = |i: &&plan::PlanItem| i.live.is_some_and(|l| objects[l].uid == uid);
    let Some(item) = plan.items.iter().find(mine) else { return };
    ctx.metrics.decided(item.verdict);
    if !item.writes() {
        return;
    }
    let writer = match ctx.writer.get_or_try_init(|| Writer::new(&ctx.client, &ctx.options.profile)).await {
        Ok(writer) => writer,
        Err(e) => {
            ctx.metrics.errors.inc();
            warn!(error = %e, "cannot write yet; retried on the next change or snapshot refresh");
            return;
        }
    };
    let applier = Applier::new(writer, &ctx.options.profile, manifest, records, ctx.options.force);
    let outcome = applier.apply_item(kind, item, objects).await;
    if let Some(error) = &outcome.error {
        ctx.metrics.errors.inc();
        warn!(object = %outcome.object, error, "restore failed; retried on the next change or snapshot refresh");
    } else if outcome.verdict == Verdict::Restore {
        ctx.metrics.restore_latency.observe(seen.elapsed().as_secs_f64());
        info!(object = %outcome.object, snapshot = %manifest.snapshot_id, "status restored");
    }
}

/// Streams one kind's objects into the main loop.
async fn watch_kind(ctx: Arc<Context>, kind: KindProfile, tx: mpsc::UnboundedSender<Change>) {
    let api = api_for(&ctx.client, &kind, None);
    let mut config = watcher::Config::default();
    if let Some(selector) = &ctx.options.selector {
        config = config.labels(selector);
    }
    let mut seen: HashSet<String> = HashSet::new();
    let mut events = watcher(api, config).boxed();
    loop {
        match events.try_next().await {
            Ok(Some(event)) => {
                let change = match event {
                    watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                        LiveObject::from_dynamic(&kind, &o).ok().map(Change::Upsert)
                    }
                    watcher::Event::Delete(o) => o.metadata.uid.clone().map(Change::Delete),
                    watcher::Event::InitDone if seen.insert(kind.kind.clone()) => Some(Change::Listed),
                    watcher::Event::Init | watcher::Event::InitDone => None,
                };
                if let Some(change) = change
                    && tx.send(change).is_err()
                {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                ctx.metrics.errors.inc();
                debug!(kind = %kind.qualified_kind(), error = %e, "watch error; the watcher retries");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// What this instance does while it leads.
pub enum Role {
    /// Restore status on the target of a move (or a rebuilt cluster).
    Target,
    /// Guard the source of a move: block clusterctl until a final consistent snapshot exists.
    Source(Box<Handshake>),
}

/// Where the controller serves and how it joins the leader election.
#[derive(Debug, Clone)]
pub struct Election {
    /// Address of /metrics, /healthz and /readyz.
    pub http_addr: SocketAddr,
    pub lease_namespace: String,
    pub lease_name: String,
    /// This instance's identity in the election.
    pub identity: String,
}

/// Serves the HTTP endpoints, joins the election and, while leading, runs `role` until
/// `shutdown` completes. Losing the lease is an error: a restart rejoins the election.
pub async fn run_elected(
    ctx: Arc<Context>,
    role: Role,
    election: &Election,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    tokio::pin!(shutdown);
    let server = tokio::spawn(http::serve(ctx.clone(), http::bind(election.http_addr).await?));
    let mut leadership =
        Leadership::join(&ctx.client, &election.lease_namespace, &election.lease_name, &election.identity).await?;
    tokio::select! {
        _ = &mut shutdown => return Ok(()),
        acquired = leadership.acquired() => acquired?,
    }
    ctx.metrics.leader.set(1);
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
    let result = tokio::select! {
        result = work => result,
        _ = leadership.lost() => Err(Error::Leader("leadership lost; exiting so that a restart rejoins the election".into())),
    };
    ctx.metrics.leader.set(0);
    server.abort();
    result
}
