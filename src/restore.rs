//! Restore: load → verify → plan → apply → check pairing, against the target cluster.
//!
//! The snapshot is the newest one that loads and verifies (or the pinned one); a damaged or
//! foreign snapshot is reported and skipped for the previous one. Live objects are read once,
//! [`crate::plan`] decides per object, [`crate::apply`] writes kind by kind in profile order
//! (BMCs, Servers, ServerClaims), and the claim/server pairing is checked on the objects as
//! the API server answered the last write of each (the others as they were listed).

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::Serialize;
use tracing::{info, warn};

pub use crate::apply::{Applier, FIELD_MANAGER, Outcome, Writer};
use crate::capture::{PageRequest, list_objects};
use crate::format::{Manifest, Record, SnapshotId};
use crate::identity::Profile;
use crate::pairing::{Views, Violation};
use crate::plan::{self, LiveObject, PlanInput, RestorePlan, Verdict};
use crate::store::SnapshotStore;
use crate::{Error, Result};

#[derive(Debug, Clone)]
pub struct RestoreOptions {
    pub profile: Profile,
    /// Use this snapshot instead of the newest good one.
    pub snapshot: Option<SnapshotId>,
    pub force: bool,
    pub dry_run: bool,
    /// Use snapshots whose capture was inconsistent.
    pub allow_inconsistent: bool,
    /// Writes in flight at once.
    pub concurrency: usize,
    pub page_size: u32,
    /// Only objects with these labels (a Kubernetes label selector).
    pub selector: Option<String>,
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
            concurrency: 16,
            page_size: 500,
            selector: None,
        }
    }
}

/// A snapshot that was passed over, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Passed {
    pub snapshot: String,
    pub reason: String,
}

/// A verified snapshot, ready to plan from.
pub struct Loaded {
    pub manifest: Manifest,
    pub records: Vec<Record>,
    pub passed_over: Vec<Passed>,
}

/// Loads the pinned snapshot, or the newest complete one that verifies and, unless
/// `allow_inconsistent`, is consistent.
pub async fn choose_snapshot(
    store: &SnapshotStore,
    pinned: Option<&SnapshotId>,
    allow_inconsistent: bool,
) -> Result<Loaded> {
    let load = |id: SnapshotId| async move {
        let mut records = Vec::new();
        let manifest = store
            .load(&id, |r| {
                records.push(r);
                Ok(())
            })
            .await?;
        Ok::<_, Error>((manifest, records))
    };
    let inconsistent = |manifest: &Manifest| {
        let (count, first) = match &manifest.consistency {
            Some(c) => (c.reason_count, c.reasons.first().map(|r| format!(", first: {}: {}", r.object, r.reason))),
            None => (0, None),
        };
        format!("inconsistent capture ({count} reasons{}); --allow-inconsistent uses it", first.unwrap_or_default())
    };
    if let Some(id) = pinned {
        let (manifest, records) = load(id.clone()).await?;
        if !manifest.is_consistent() && !allow_inconsistent {
            return Err(Error::Inconsistent { snapshot: id.to_string(), reason: inconsistent(&manifest) });
        }
        return Ok(Loaded { manifest, records, passed_over: vec![] });
    }
    let mut passed_over = Vec::new();
    for entry in store.list().await?.into_iter().rev().filter(|e| e.complete) {
        match load(entry.id.clone()).await {
            Ok((manifest, _)) if !manifest.is_consistent() && !allow_inconsistent => {
                warn!(snapshot = %entry.id, "snapshot is inconsistent; trying the previous one");
                passed_over.push(Passed { snapshot: entry.id.to_string(), reason: inconsistent(&manifest) });
            }
            Ok((manifest, records)) => return Ok(Loaded { manifest, records, passed_over }),
            Err(e @ (Error::Store { .. } | Error::Io { .. })) => return Err(e),
            Err(e) => {
                warn!(snapshot = %entry.id, error = %e, "snapshot skipped; trying the previous one");
                passed_over.push(Passed { snapshot: entry.id.to_string(), reason: e.to_string() });
            }
        }
    }
    Err(Error::NoGoodSnapshot {
        cluster: store.cluster_id().to_string(),
        location: store.location().to_string(),
        passed_over: passed_over.len(),
    })
}

/// The live objects of the profile, their claim/server pairing views, and the consistency
/// verdict a capture of them would get.
pub struct LiveState {
    pub objects: Vec<LiveObject>,
    pub views: Views,
    pub consistency: crate::format::Consistency,
}

impl LiveState {
    pub fn pairing(&self) -> Vec<Violation> {
        self.views.check()
    }
}

pub async fn read_live(client: &kube::Client, profile: &Profile, page: &PageRequest<'_>) -> Result<LiveState> {
    let mut objects = Vec::new();
    let mut collector = crate::capture::Collector::new();
    for kind in profile.kinds.iter().filter(|k| !k.is_denied()) {
        list_objects(client, kind, page, |object| {
            collector.add(kind, object);
            objects.push(LiveObject::from_raw(kind, object));
            Ok(())
        })
        .await?;
    }
    let views = collector.views().clone();
    Ok(LiveState { objects, views, consistency: collector.finish(1).consistency })
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreReport {
    pub snapshot: String,
    pub snapshot_created_at: Timestamp,
    pub passed_over: Vec<Passed>,
    pub dry_run: bool,
    pub plan: RestorePlan,
    pub counts: BTreeMap<Verdict, usize>,
    pub outcomes: Vec<Outcome>,
    /// API writes issued (status PATCHes and annotation PATCHes; Events not counted).
    pub writes: usize,
    pub pairing: Vec<Violation>,
}

impl RestoreReport {
    pub fn failures(&self) -> impl Iterator<Item = &Outcome> {
        self.outcomes.iter().filter(|o| o.error.is_some())
    }

    pub fn ok(&self) -> bool {
        self.failures().next().is_none() && self.pairing.is_empty()
    }
}

/// One-shot restore: choose, plan, apply (unless dry run), verify pairing.
pub async fn run(client: &kube::Client, store: &SnapshotStore, opts: &RestoreOptions) -> Result<RestoreReport> {
    let loaded = choose_snapshot(store, opts.snapshot.as_ref(), opts.allow_inconsistent).await?;
    let manifest = &loaded.manifest;
    info!(snapshot = %manifest.snapshot_id, records = loaded.records.len(), "snapshot loaded and verified");
    let started = std::time::Instant::now();
    let live = read_live(client, &opts.profile, &opts.page()).await?;
    info!(objects = live.objects.len(), elapsed = ?started.elapsed(), "target listed");
    let plan = plan::plan(&PlanInput {
        profile: &opts.profile,
        snapshot: &manifest.snapshot_id,
        snapshot_time: manifest.created_at,
        records: &loaded.records,
        live: &live.objects,
        force: opts.force,
    });
    let counts = plan.counts();
    info!(writing = plan.writes(), elapsed = ?started.elapsed(), "plan built");
    let mut report = RestoreReport {
        snapshot: manifest.snapshot_id.to_string(),
        snapshot_created_at: manifest.created_at,
        passed_over: loaded.passed_over.clone(),
        dry_run: opts.dry_run,
        counts,
        outcomes: vec![],
        writes: 0,
        pairing: vec![],
        plan,
    };
    let mut views = live.views;
    if !opts.dry_run {
        let writer = Writer::new(client, &opts.profile).await?;
        let applier = Applier::new(&writer, &opts.profile, manifest, &loaded.records, opts.force);
        report.outcomes = applier.apply(&report.plan, &live.objects, opts.concurrency).await;
        report.writes = report.outcomes.iter().map(|o| o.writes).sum();
        info!(writes = report.writes, elapsed = ?started.elapsed(), "plan applied");
        for after in report.outcomes.iter_mut().filter_map(|o| o.after.take()) {
            views.add(after);
        }
    }
    report.pairing = views.check();
    Ok(report)
}
