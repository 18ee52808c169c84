//! Restore: load → verify → plan → apply → check pairing, against the target cluster.
//!
//! The snapshot is the newest one that loads and verifies (or the pinned one, see
//! [`crate::store::choose`]); a damaged or foreign snapshot is reported and skipped for the
//! previous one. Live objects are read once ([`live`]), [`plan`] decides per object (pure),
//! [`apply`] writes kind by kind in profile order (BMCs, Servers, ServerClaims), and the
//! claim/server pairing is checked on the objects as the API server answered the last write of
//! each (the others as they were listed).

pub mod apply;
pub mod live;
pub mod plan;

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::Serialize;
use tracing::info;

pub use apply::{Applier, Outcome};
pub use live::{LiveState, read_live};
pub use plan::{PlanInput, RestorePlan, Verdict};

use crate::Result;
use crate::domain::identity::Profile;
use crate::domain::pairing::Violation;
use crate::format::SnapshotId;
use crate::k8s::{DEFAULT_PAGE_SIZE, PageRequest, Writer};
use crate::store::{Passed, SnapshotStore, choose_snapshot};

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
    /// List the status fields each restore changes in the plan (dry runs, JSON reports).
    /// Keeps every live status in memory while planning.
    pub explain: bool,
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
            concurrency: 16,
            page_size: DEFAULT_PAGE_SIZE,
            selector: None,
            explain: false,
            progress: Default::default(),
        }
    }
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
    let live = read_live(client, &opts.profile, &opts.page(), opts.explain).await?;
    info!(objects = live.objects.len(), elapsed = ?started.elapsed(), "target listed");
    let plan = plan::plan(&PlanInput {
        profile: &opts.profile,
        snapshot: &manifest.snapshot_id,
        snapshot_time: manifest.comparable_time(Timestamp::now()),
        records: &loaded.records,
        live: &live.objects,
        force: opts.force,
        explain: opts.explain,
    })?;
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
        let applier = Applier::new(&writer, &opts.profile, manifest, &loaded.records, opts.force)
            .with_progress(opts.progress.clone());
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
