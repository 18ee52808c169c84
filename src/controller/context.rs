//! The controller's shared state, [`Context`]: its options, the snapshot in use and how it is
//! refreshed, and readiness (every kind listed or known to be unavailable, and a snapshot
//! loaded; a standby is always ready).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::RwLock;
use tracing::{info, warn};

use super::index::SnapshotIndex;
use super::metrics::Metrics;
use crate::domain::identity::Profile;
use crate::format::{Manifest, Records};
use crate::k8s::Writer;
use crate::restore::Seen;
use crate::store::{Accept, Loaded, SnapshotStore, Tail, choose_newer, choose_snapshot, read_on};
use crate::{Error, Result};

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
    /// What it demands of a snapshot besides (`--expect-source`, `--require-encryption`).
    pub demands: crate::store::Demands,
    /// Objects reconciled at once (the work queue); their writes pass the client's
    /// [`ControllerOptions::write_limit`] when it has one (make this its max).
    pub concurrency: usize,
    /// The adaptive limit the client's writes pass (`k8s::client::fenced_client`), exported
    /// as `restatus_write_limit`.
    pub write_limit: Option<crate::k8s::WriteLimit>,
    /// How often to look for a newer snapshot.
    pub snapshot_refresh: Duration,
    /// How long one refresh (listing, manifests, a payload's download) may take: a store that
    /// stops answering fails the refresh, and the snapshot in use is kept.
    pub snapshot_timeout: Duration,
    /// How long to gather events into one batch.
    pub batch_window: Duration,
    /// Restore to the newest complete consistent point of the base's journal, and read on at
    /// each refresh; `false` (`--no-journal`): snapshots alone.
    pub journal: bool,
}

/// Shared state: what the reconciler, the HTTP endpoints and the main loop see.
pub struct Context {
    pub client: kube::Client,
    pub store: SnapshotStore,
    pub options: ControllerOptions,
    pub metrics: Metrics,
    pub(super) snapshot: RwLock<Option<Arc<SnapshotIndex>>>,
    /// Made on the first write (by then the profile's kinds are served, so discovery finds
    /// their status subresources), then kept: one event recorder for the controller's life.
    pub(super) writer: tokio::sync::OnceCell<Writer>,
    /// Which snapshots to use; the cluster's own identity is read before the first choice.
    accept: tokio::sync::OnceCell<Accept>,
    /// Every kind listed (or unavailable) and a snapshot loaded.
    pub(super) synced: AtomicBool,
    /// This instance holds the lease.
    pub(super) leading: AtomicBool,
    /// Kinds that cannot be watched now, with why.
    unavailable: std::sync::Mutex<BTreeMap<String, String>>,
    /// What the reconciles wrote since the last summary Events (see `reconcile::summarize`).
    pub(super) summaries: std::sync::Mutex<Summaries>,
    /// Where the journal of the snapshot in use was read to (with journals read), and the gap
    /// last reported: the refresh reads on from there.
    pub(super) journal: tokio::sync::Mutex<Journal>,
    /// What `/readyz` says of the snapshot in use: its id, or the point of its journal.
    in_use: std::sync::Mutex<Option<String>>,
    /// The pairing of metal-operator's Servers and ServerClaims as the watches see it, kept
    /// as each event comes: the look-ups a release would make that it answers are saved (see
    /// `restore::Seen`).
    pub(super) seen: Seen,
}

/// The controller's position in the journal of the snapshot in use.
#[derive(Debug, Default)]
pub(super) struct Journal {
    pub(super) tail: Option<Tail>,
    /// The gap last logged, so that a gap that stays is logged once.
    pub(super) gap: Option<String>,
}

/// The objects written per kind and snapshot since the last summary Events, and since when.
#[derive(Debug, Default)]
pub(super) struct Summaries {
    pub by_kind: BTreeMap<(String, String), crate::restore::summary::KindSummary>,
    pub since: Option<std::time::Instant>,
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
                    journal: self.options.journal,
                    at: None,
                    // Remembered across refreshes: junk is read and verified once.
                    refused: Default::default(),
                    demands: self.options.demands.clone(),
                    not_after: None,
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
            summaries: Default::default(),
            journal: Default::default(),
            in_use: Default::default(),
            seen: Seen::default(),
        })
    }

    /// What `/readyz` says of the snapshot in use, if one is loaded.
    pub fn in_use(&self) -> Option<String> {
        self.in_use.lock().ok().and_then(|s| s.clone())
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

    pub(super) fn is_unavailable(&self, kind: &str) -> bool {
        self.unavailable.lock().is_ok_and(|u| u.contains_key(kind))
    }

    pub(super) fn kind_unavailable(&self, kind: &str, reason: &str) {
        let Ok(mut unavailable) = self.unavailable.lock() else { return };
        if unavailable.get(kind).map(String::as_str) != Some(reason) {
            warn!(kind, reason, "kind cannot be watched; skipped until it can (watch backs off)");
            unavailable.insert(kind.to_string(), reason.to_string());
            self.metrics.unavailable(kind, true);
        }
    }

    pub(super) fn kind_available(&self, kind: &str) {
        let Ok(mut unavailable) = self.unavailable.lock() else { return };
        if unavailable.remove(kind).is_some() {
            info!(kind, "kind can be watched again");
            self.metrics.unavailable(kind, false);
        }
    }
}

/// Loads the newest good snapshot if it is not the one in use, or (journals read) the newer
/// point of its journal. True when the records changed. The listing and the manifests are
/// read first: the payload of the snapshot in use, or of an inconsistent one, is not
/// downloaded again; on the same base only the segments written since the last refresh are
/// read. A refresh that takes longer than `snapshot_timeout` (a store that stopped answering)
/// is an error, counted and logged; the snapshot (and point) in use stays, and the next
/// refresh tries again.
pub(super) async fn refresh_snapshot(ctx: &Context) -> bool {
    let current = ctx.snapshot.read().await.clone();
    let current_id = current.as_ref().map(|s| s.manifest.snapshot_id.clone());
    let chosen = newer_snapshot(ctx, current_id.as_ref()).await;
    ctx.metrics.snapshot_in_use_gone.set(i64::from(matches!(chosen, Err(Error::SnapshotInUseGone { .. }))));
    match chosen {
        Ok(Some(loaded)) => {
            let manifest = loaded.restore_manifest();
            let point = loaded.point.as_ref();
            info!(snapshot = %loaded.manifest.snapshot_id, records = loaded.records.len(),
                signed_by = loaded.signer.as_ref().map(|k| k.as_str()),
                segments = point.map(|p| p.segments_applied), at = %manifest.created_at, "using snapshot");
            let mut journal = ctx.journal.lock().await;
            journal.gap = point.and_then(|p| p.gap.clone());
            if let Some(gap) = &journal.gap {
                warn!(base = %loaded.manifest.snapshot_id, "journal: {gap}");
            }
            let describe = point.map_or_else(|| format!("snapshot {}", manifest.snapshot_id), |p| p.describe());
            use_records(ctx, manifest, loaded.records, point.map_or(0, |p| p.segments_applied), describe).await;
            journal.tail = loaded.tail;
            true
        }
        Ok(None) => match current {
            Some(current) if ctx.options.journal => read_on_journal(ctx, &current).await,
            _ => false,
        },
        Err(e) => {
            ctx.metrics.errors.inc();
            match &current_id {
                Some(current) => {
                    warn!(error = %e, snapshot = %current, "snapshot refresh failed; keeping the snapshot in use")
                }
                None => warn!(error = %e, "no snapshot to restore from yet"),
            }
            false
        }
    }
}

/// Puts records (at the point `manifest` says) in use.
async fn use_records(ctx: &Context, manifest: Manifest, records: Records, segments: u64, describe: String) {
    ctx.metrics.snapshot_timestamp.set(manifest.created_at.as_millisecond() as f64 / 1000.0);
    ctx.metrics.snapshot_segments.set(segments as i64);
    if let Ok(mut in_use) = ctx.in_use.lock() {
        *in_use = Some(describe);
    }
    *ctx.snapshot.write().await = Some(Arc::new(SnapshotIndex::new(manifest, records)));
}

/// The same base: reads the segments of its journal written since the point in use; a newer
/// point replaces it. A gap keeps the point before it, logged once (until it changes).
async fn read_on_journal(ctx: &Context, current: &SnapshotIndex) -> bool {
    let mut journal = ctx.journal.lock().await;
    let Some(tail) = journal.tail.clone() else { return false };
    let accept = ctx.accept().await;
    let timeout = ctx.options.snapshot_timeout;
    let read = tokio::time::timeout(timeout, read_on(&ctx.store, &tail, &current.records, accept)).await;
    let read = read.unwrap_or_else(|_| {
        Err(Error::StoreTimeout {
            location: ctx.store.location().to_string(),
            what: "reading the journal on".into(),
            after: timeout,
        })
    });
    let read = match read {
        Ok(read) => read,
        Err(e) => {
            ctx.metrics.errors.inc();
            warn!(error = %e, point = %tail.point.describe(), "journal refresh failed; keeping the point in use");
            return false;
        }
    };
    if read.gap != journal.gap {
        match &read.gap {
            Some(gap) => warn!(base = %tail.base.snapshot_id, "journal: {gap}"),
            None => info!(base = %tail.base.snapshot_id, "journal: the chain goes on past the gap"),
        }
        journal.gap = read.gap.clone();
    }
    let Some((records, newer)) = read.newer else { return false };
    let point = &newer.point;
    for passed in &point.passed_over {
        warn!(base = %point.base, "journal point passed over: {passed}");
    }
    info!(snapshot = %point.base, segments = point.segments_applied, at = %point.time, records = records.len(),
        "journal point advanced; using it");
    use_records(ctx, point.manifest(&newer.base), records, point.segments_applied, point.describe()).await;
    journal.tail = Some(newer);
    true
}

/// The snapshot to use instead of `current` (any, when `None`), read within `snapshot_timeout`.
pub(super) async fn newer_snapshot(
    ctx: &Context,
    current: Option<&crate::format::SnapshotId>,
) -> Result<Option<Loaded>> {
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

/// Every `period`, refreshes the metrics of the bucket's newest snapshot (`Metrics::newest`) from the bucket; runs until aborted. Each
/// replica runs it, leading or not, so the bucket's view is there on any of them.
pub(super) async fn export_newest(ctx: Arc<Context>, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let refused = crate::store::Refused::default();
    loop {
        tick.tick().await;
        if let Err(e) = ctx.metrics.newest.refresh(&ctx.store, ctx.options.trusted_keys.as_deref(), &refused).await {
            warn!(error = %e, "cannot read the newest snapshot for the metrics");
        }
    }
}
