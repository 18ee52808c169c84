//! The restore controller: watch-driven restore on the target cluster.
//!
//! Watches every kind of the profile. Each event updates a live index (objects and their
//! identity keys) and marks the object dirty; dirty objects are handled in short batches with
//! the same plan and apply code as the one-shot restore, on a small input: the object, the
//! records that share its keys, and the live objects that share theirs. So an object that
//! appears with an empty status gets its status back, a restored one is "already equal", and
//! ambiguity is judged exactly as the one-shot plan judges it. The newest good snapshot is
//! reloaded every `snapshot_refresh`; a new one makes every object dirty again. A Server or
//! ServerClaim that appears makes the BMCs and Servers restatus still keeps ignored dirty: one
//! may be waiting for it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use kube::runtime::watcher;
use tokio::sync::{RwLock, mpsc};
use tracing::{debug, info, warn};

use crate::apply::{Applier, Writer};
use crate::format::{Manifest, Record};
use crate::identity::{IdentityKey, KindProfile, Profile};
use crate::metrics::Metrics;
use crate::plan::{self, LiveObject, PlanInput, Verdict};
use crate::restore::choose_snapshot;
use crate::store::SnapshotStore;
use crate::{Error, Result};

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

/// A loaded snapshot with its records indexed by (kind, key).
struct SnapshotIndex {
    manifest: Manifest,
    records: Vec<Record>,
    by_key: HashMap<(String, IdentityKey), Vec<usize>>,
}

impl SnapshotIndex {
    fn new(manifest: Manifest, records: Vec<Record>) -> Self {
        let mut by_key: HashMap<(String, IdentityKey), Vec<usize>> = HashMap::new();
        for (i, record) in records.iter().enumerate() {
            for key in &record.keys {
                by_key.entry((record.kind.clone(), key.clone())).or_default().push(i);
            }
        }
        SnapshotIndex { manifest, records, by_key }
    }
}

/// Live objects by uid, and who carries which key.
#[derive(Default)]
struct LiveIndex {
    objects: HashMap<String, LiveObject>,
    by_key: HashMap<(String, IdentityKey), BTreeSet<String>>,
}

impl LiveIndex {
    fn upsert(&mut self, object: LiveObject) {
        self.remove(&object.uid);
        for key in &object.keys {
            self.by_key.entry((object.kind.clone(), key.clone())).or_default().insert(object.uid.clone());
        }
        self.objects.insert(object.uid.clone(), object);
    }

    fn remove(&mut self, uid: &str) {
        if let Some(old) = self.objects.remove(uid) {
            for key in &old.keys {
                let slot = (old.kind.clone(), key.clone());
                if let Some(uids) = self.by_key.get_mut(&slot) {
                    uids.remove(uid);
                    if uids.is_empty() {
                        self.by_key.remove(&slot);
                    }
                }
            }
        }
    }

    /// BMCs and Servers that still carry restatus's `ignore`: restored, maybe waiting for
    /// their Servers or claim.
    fn held(&self) -> impl Iterator<Item = &String> {
        let waits = |o: &&LiveObject| matches!(o.kind.as_str(), "BMC" | "Server") && o.quiesced_by_restatus();
        self.objects.values().filter(waits).map(|o| &o.uid)
    }

    /// The planning input for one object: its candidate records, every record sharing their
    /// primary keys, and every live object sharing any of those records' keys.
    fn neighbourhood(&self, uid: &str, snapshot: &SnapshotIndex) -> Option<(Vec<Record>, Vec<LiveObject>)> {
        let object = self.objects.get(uid)?;
        let lookup = |key: &IdentityKey| snapshot.by_key.get(&(object.kind.clone(), key.clone()));
        let mut records: BTreeSet<usize> = object.keys.iter().filter_map(lookup).flatten().copied().collect();
        let primaries: Vec<&IdentityKey> = records.iter().filter_map(|&r| snapshot.records[r].primary_key()).collect();
        let rivals: BTreeSet<usize> = primaries.into_iter().filter_map(lookup).flatten().copied().collect();
        records.extend(rivals);
        let mut uids: BTreeSet<&String> = BTreeSet::from([&object.uid]);
        for &r in &records {
            for key in &snapshot.records[r].keys {
                if let Some(holders) = self.by_key.get(&(object.kind.clone(), key.clone())) {
                    uids.extend(holders);
                }
            }
        }
        let live = uids.into_iter().filter_map(|u| self.objects.get(u).cloned()).collect();
        Some((records.into_iter().map(|r| snapshot.records[r].clone()).collect(), live))
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
                let Some(change) = change else { break Err(Error::Leader("every watch ended".into())) };
                let mut next = Some(change);
                // Gather what arrives within the batch window, then act once.
                let deadline = tokio::time::Instant::now() + ctx.options.batch_window;
                while let Some(change) = next.take() {
                    match change {
                        Change::Upsert(object) => {
                            dirty.entry(object.uid.clone()).or_insert_with(Instant::now);
                            // An object restatus keeps ignored may be waiting for this one.
                            let partner = matches!(object.kind.as_str(), "Server" | "ServerClaim");
                            if partner && !live.objects.contains_key(&object.uid) {
                                let now = Instant::now();
                                dirty.extend(live.held().map(|uid| (uid.clone(), now)));
                            }
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
                    reconcile(ctx, kind, &snapshot, &records, &objects, uid, *seen).await;
                }
            })
            .await;
    }
}

/// One object: the plan's verdict for it, applied if it writes.
async fn reconcile(
    ctx: &Context,
    kind: &KindProfile,
    snapshot: &SnapshotIndex,
    records: &[Record],
    objects: &[LiveObject],
    uid: &str,
    seen: Instant,
) {
    let manifest = &snapshot.manifest;
    let input = PlanInput {
        profile: &ctx.options.profile,
        snapshot: &manifest.snapshot_id,
        snapshot_time: manifest.created_at,
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
    let applier = Applier::new(writer, &ctx.options.profile, manifest, records, ctx.options.force)
        .with_snapshot_records(&snapshot.records);
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
    let api = crate::fleet::api_for(&ctx.client, &kind, None);
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

/// Serves `/metrics`, `/healthz` and `/readyz` until the process ends.
pub async fn serve_http(ctx: Arc<Context>, addr: std::net::SocketAddr) -> Result<()> {
    use axum::http::StatusCode;
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(|axum::extract::State(ctx): axum::extract::State<Arc<Context>>| async move { ctx.metrics.render() }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|axum::extract::State(ctx): axum::extract::State<Arc<Context>>| async move {
                if ctx.is_ready() { (StatusCode::OK, "ready") } else { (StatusCode::SERVICE_UNAVAILABLE, "not ready") }
            }),
        )
        .with_state(ctx);
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| Error::io(format!("listen on {addr}"), e))?;
    info!(%addr, "serving /metrics, /healthz, /readyz");
    axum::serve(listener, app).await.map_err(|e| Error::io("HTTP server", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::SnapshotId;

    fn key(v: &str) -> IdentityKey {
        IdentityKey { field: "spec.systemUUID".into(), value: v.into() }
    }

    fn live(uid: &str, keys: &[&str]) -> LiveObject {
        LiveObject {
            kind: "Server".into(),
            namespace: None,
            name: format!("n-{uid}"),
            uid: uid.into(),
            resource_version: "1".into(),
            keys: keys.iter().map(|k| key(k)).collect(),
            status: None,
            annotations: Default::default(),
            status_written_at: None,
        }
    }

    fn snapshot(keys: &[&str]) -> SnapshotIndex {
        let records = keys
            .iter()
            .enumerate()
            .map(|(i, k)| Record::test_server(&format!("r{i}"), vec![key(k)], r#"{"state":"Reserved"}"#))
            .collect();
        let manifest_id = SnapshotId::new("2026-11-30T09:00:00Z".parse().unwrap());
        let capture = crate::capture::CaptureSummary {
            kinds: vec![],
            skipped: vec![],
            conflicts: vec![],
            consistency: crate::capture::judge(&Default::default(), vec![], &[], 1),
        };
        let summary =
            crate::format::PayloadSummary { size: 0, uncompressed_size: 0, sha256: String::new(), records: 0 };
        let manifest = Manifest::new("c", manifest_id, "2026-11-30T09:00:00Z".parse().unwrap(), "t", capture, summary);
        SnapshotIndex::new(manifest, records)
    }

    #[test]
    fn the_neighbourhood_holds_the_object_its_records_and_key_rivals() {
        let mut index = LiveIndex::default();
        index.upsert(live("a", &["k1"]));
        index.upsert(live("b", &["k1"]));
        index.upsert(live("c", &["k2"]));
        let snap = snapshot(&["k1", "k2", "k3"]);
        let (records, objects) = index.neighbourhood("a", &snap).unwrap();
        assert_eq!(records.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["r0"]);
        let mut uids: Vec<_> = objects.iter().map(|o| o.uid.as_str()).collect();
        uids.sort();
        assert_eq!(uids, ["a", "b"], "b shares the key and makes the match ambiguous");
    }

    #[test]
    fn upsert_replaces_old_keys_and_remove_forgets_them() {
        let mut index = LiveIndex::default();
        index.upsert(live("a", &["k1"]));
        index.upsert(live("a", &["k2"]));
        assert!(!index.by_key.contains_key(&("Server".to_string(), key("k1"))));
        index.remove("a");
        assert!(index.by_key.is_empty() && index.objects.is_empty());
    }

    #[test]
    fn one_object_plans_like_the_whole_fleet() {
        let mut index = LiveIndex::default();
        for (uid, k) in [("a", "k1"), ("b", "k1"), ("c", "k2")] {
            index.upsert(live(uid, &[k]));
        }
        let snap = snapshot(&["k1", "k2"]);
        let profile = Profile::metal_operator();
        let verdict_of = |uid: &str| {
            let (records, objects) = index.neighbourhood(uid, &snap).unwrap();
            let input = PlanInput {
                profile: &profile,
                snapshot: &snap.manifest.snapshot_id,
                snapshot_time: snap.manifest.created_at,
                records: &records,
                live: &objects,
                force: false,
            };
            plan::plan(&input)
                .items
                .into_iter()
                .find(|i| {
                    i.target.as_ref().is_some_and(|t| t.name == format!("n-{uid}")) || i.verdict == Verdict::Ambiguous
                })
                .map(|i| i.verdict)
        };
        assert_eq!(verdict_of("a"), Some(Verdict::Ambiguous));
        assert_eq!(verdict_of("c"), Some(Verdict::Restore));
    }
}
