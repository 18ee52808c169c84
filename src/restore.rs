//! Restore: load → verify → plan → apply, against the target cluster.
//!
//! The snapshot is the newest one that loads and verifies (or the pinned one); a damaged or
//! foreign snapshot is reported and skipped for the previous one. Live objects are read,
//! [`crate::plan`] decides per object, and the plan is applied kind by kind in profile order
//! (BMCs, Servers, ServerClaims): quiesce metal-operator with its `ignore` annotation, write
//! the status through the status subresource with a resourceVersion precondition (a conflict
//! re-reads the object and decides again), then mark the object and remove restatus's
//! `ignore`. Each step is idempotent, so a rerun finishes whatever a crash interrupted.

use std::collections::BTreeMap;

use futures::{StreamExt, stream};
use jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde::Serialize;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::capture::{PageRequest, list_objects};
use crate::fleet::api_for;
use crate::format::{Manifest, ObjectRef, Record, SnapshotId};
use crate::identity::{KindProfile, Profile};
use crate::pairing::Violation;
use crate::plan::{
    self, LiveObject, OPERATION_ANNOTATION, OPERATION_IGNORE, PlanInput, PlanItem, QUIESCED_BY_ANNOTATION,
    RESTORED_FROM_ANNOTATION, RestorePlan, Verdict,
};
use crate::store::SnapshotStore;
use crate::{Error, Result, TOOL_NAME};

/// Field manager of every write restatus makes.
pub const FIELD_MANAGER: &str = TOOL_NAME;
/// How often a conflicting status write is re-read, re-decided and retried.
const CONFLICT_RETRIES: usize = 5;

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

/// The live objects of the profile, their claim/server pairing violations, and the
/// consistency verdict a capture of them would get.
pub struct LiveState {
    pub objects: Vec<LiveObject>,
    pub pairing: Vec<Violation>,
    pub consistency: crate::format::Consistency,
}

pub async fn read_live(client: &kube::Client, profile: &Profile, page: &PageRequest<'_>) -> Result<LiveState> {
    let mut objects = Vec::new();
    let mut collector = crate::capture::Collector::new();
    for kind in profile.kinds.iter().filter(|k| !k.is_denied()) {
        list_objects(client, kind, page, |object| {
            collector.add(kind, object);
            let live = LiveObject::from_raw(kind, object).map_err(|e| Error::InvalidObject {
                kind: kind.qualified_kind(),
                name: object.namespaced_name(),
                reason: e.to_string(),
            })?;
            objects.push(live);
            Ok(())
        })
        .await?;
    }
    let pairing = collector.pairing();
    Ok(LiveState { objects, pairing, consistency: collector.finish(1).consistency })
}

/// What happened to one written item.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub object: ObjectRef,
    /// The verdict finally applied (a conflict may turn `restore` into `skip-newer`).
    pub verdict: Verdict,
    pub writes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
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
    let live = read_live(client, &opts.profile, &opts.page()).await?;
    let plan = plan::plan(&PlanInput {
        profile: &opts.profile,
        snapshot: &manifest.snapshot_id,
        snapshot_time: manifest.created_at,
        records: &loaded.records,
        live: &live.objects,
        force: opts.force,
    });
    let counts = plan.counts();
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
    if opts.dry_run {
        report.pairing = live.pairing;
        return Ok(report);
    }
    let applier = Applier::new(client, &opts.profile, manifest, &loaded.records, opts.force);
    report.outcomes = applier.apply(&report.plan, &live.objects, opts.concurrency).await;
    report.writes = report.outcomes.iter().map(|o| o.writes).sum();
    report.pairing = read_live(client, &opts.profile, &opts.page()).await?.pairing;
    Ok(report)
}

/// Applies plan items to the cluster. Shared by the one-shot restore and the controller.
pub struct Applier<'a> {
    client: &'a kube::Client,
    profile: &'a Profile,
    manifest: &'a Manifest,
    records: &'a [Record],
    force: bool,
    recorder: Recorder,
}

impl<'a> Applier<'a> {
    pub fn new(
        client: &'a kube::Client,
        profile: &'a Profile,
        manifest: &'a Manifest,
        records: &'a [Record],
        force: bool,
    ) -> Self {
        let reporter = Reporter { controller: TOOL_NAME.into(), instance: std::env::var("POD_NAME").ok() };
        Applier { client, profile, manifest, records, force, recorder: Recorder::new(client.clone(), reporter) }
    }

    /// Applies every writing item, kind by kind in plan order, `concurrency` objects at a time.
    pub async fn apply(&self, plan: &RestorePlan, live: &[LiveObject], concurrency: usize) -> Vec<Outcome> {
        let mut outcomes = Vec::new();
        for kind in &self.profile.kinds {
            let items = plan.items.iter().filter(|i| i.kind == kind.kind && i.writes());
            let done: Vec<Outcome> = stream::iter(items)
                .map(|item| self.apply_item(kind, item, live))
                .buffer_unordered(concurrency.max(1))
                .collect()
                .await;
            outcomes.extend(done);
        }
        outcomes
    }

    pub async fn apply_item(&self, kind: &KindProfile, item: &PlanItem, live: &[LiveObject]) -> Outcome {
        let object = item.live.map(|l| &live[l]).expect("writing items have a live object");
        let mut outcome = Outcome { object: object.object_ref(), verdict: item.verdict, writes: 0, error: None };
        match self.apply_object(kind, item, object, &mut outcome).await {
            Ok(()) => {}
            Err(Error::Kube { source: kube::Error::Api(status), .. }) if status.is_not_found() => {
                info!(object = %outcome.object, "object deleted during the restore; nothing to do");
                outcome.verdict = Verdict::MissingOnTarget;
            }
            Err(e) => {
                warn!(object = %outcome.object, error = %e, "restore of object failed");
                outcome.error = Some(e.to_string());
            }
        }
        outcome
    }

    async fn apply_object(
        &self,
        kind: &KindProfile,
        item: &PlanItem,
        object: &LiveObject,
        outcome: &mut Outcome,
    ) -> Result<()> {
        let api = api_for(self.client, kind, object.namespace.as_deref());
        let mut owns_ignore = object.quiesced_by_restatus();
        if item.verdict == Verdict::Restore {
            let record = &self.records[item.record.expect("restore items have a record")];
            outcome.verdict =
                self.quiesce_and_write(kind, &api, record, object.clone(), &mut owns_ignore, outcome).await?;
        }
        let restored = outcome.verdict == Verdict::Restore;
        let mut annotations = serde_json::Map::new();
        if restored {
            annotations.insert(RESTORED_FROM_ANNOTATION.into(), self.manifest.snapshot_id.as_str().into());
        }
        // Whatever the outcome, an ignore that restatus set is removed: the object's status is
        // settled (restored, equal, or moved on) and metal-operator may take over.
        if owns_ignore {
            annotations.insert(OPERATION_ANNOTATION.into(), Value::Null);
            annotations.insert(QUIESCED_BY_ANNOTATION.into(), Value::Null);
        }
        if !annotations.is_empty() {
            patch(&api, &object.name, &json!({"metadata": {"annotations": annotations}})).await?;
            outcome.writes += 1;
        }
        if restored {
            self.event(kind, object, item).await;
        }
        Ok(())
    }

    /// Sets restatus's `ignore` (unless the object is ignored already), then writes the
    /// record's status. Both writes carry the resourceVersion the decision was made on: when
    /// the object changed meanwhile, it is re-read and decided again, so a status that moved
    /// on after the plan is never overwritten. Returns the verdict finally applied.
    async fn quiesce_and_write(
        &self,
        kind: &KindProfile,
        api: &Api<DynamicObject>,
        record: &Record,
        mut current: LiveObject,
        owns_ignore: &mut bool,
        outcome: &mut Outcome,
    ) -> Result<Verdict> {
        let wanted: Value = serde_json::from_str(record.status.get())
            .map_err(|e| Error::corrupt(&self.manifest.snapshot_id, format!("record {}: {e}", record.object_name())))?;
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        for _ in 0..CONFLICT_RETRIES {
            let result = if current.ignored() {
                let body = json!({
                    "metadata": {"resourceVersion": current.resource_version},
                    "status": plan::status_patch(current.status.as_ref(), &wanted),
                });
                api.patch_status(&current.name, &params, &Patch::Merge(&body)).await.map(|_| true)
            } else {
                let body = json!({"metadata": {
                    "resourceVersion": current.resource_version,
                    "annotations": {OPERATION_ANNOTATION: OPERATION_IGNORE, QUIESCED_BY_ANNOTATION: TOOL_NAME},
                }});
                api.patch(&current.name, &params, &Patch::Merge(&body)).await.map(|patched| {
                    current.resource_version = patched.metadata.resource_version.unwrap_or_default();
                    current.annotations.insert(OPERATION_ANNOTATION.into(), OPERATION_IGNORE.into());
                    *owns_ignore = true;
                    false
                })
            };
            outcome.writes += 1;
            match result {
                Ok(true) => return Ok(Verdict::Restore),
                Ok(false) => continue,
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    current = self.reread(kind, api, &current.name).await?;
                    let verdict = self.decide_again(kind, record, &current);
                    info!(object = %current.object_ref(), %verdict, "object changed during the restore; decided again");
                    if verdict != Verdict::Restore {
                        return Ok(verdict);
                    }
                }
                Err(e) => return Err(Error::kube(format!("restore {}", current.object_ref()), e)),
            }
        }
        Err(Error::InvalidObject {
            kind: kind.qualified_kind(),
            name: current.name.clone(),
            reason: format!("object kept changing: {CONFLICT_RETRIES} conflicting writes"),
        })
    }

    fn decide_again(&self, kind: &KindProfile, record: &Record, fresh: &LiveObject) -> Verdict {
        let input = PlanInput {
            profile: self.profile,
            snapshot: &self.manifest.snapshot_id,
            snapshot_time: self.manifest.created_at,
            records: self.records,
            live: std::slice::from_ref(fresh),
            force: self.force,
        };
        let mut item = blank_item(kind);
        plan::decide(&input, kind, record, fresh, &mut item);
        item.verdict
    }

    async fn reread(&self, kind: &KindProfile, api: &Api<DynamicObject>, name: &str) -> Result<LiveObject> {
        let object = api.get(name).await.map_err(|e| Error::kube(format!("re-read {} {name}", kind.kind), e))?;
        LiveObject::from_dynamic(kind, &object).map_err(|e| Error::InvalidObject {
            kind: kind.qualified_kind(),
            name: name.into(),
            reason: e.to_string(),
        })
    }

    async fn event(&self, kind: &KindProfile, object: &LiveObject, item: &PlanItem) {
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(kind.api_version()),
            kind: Some(kind.kind.clone()),
            name: Some(object.name.clone()),
            namespace: object.namespace.clone(),
            uid: Some(object.uid.clone()),
            ..Default::default()
        };
        let note = format!(
            "status restored from snapshot {} ({}){}",
            self.manifest.snapshot_id,
            item.reason,
            item.source.as_ref().map(|s| format!("; captured from {s}")).unwrap_or_default()
        );
        let event = Event {
            type_: EventType::Normal,
            reason: "StatusRestored".into(),
            note: Some(note),
            action: "RestoreStatus".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            warn!(object = %object.object_ref(), error = %e, "could not record the restore event");
        }
    }
}

fn blank_item(kind: &KindProfile) -> PlanItem {
    PlanItem {
        kind: kind.kind.clone(),
        verdict: Verdict::Restore,
        key: None,
        target: None,
        source: None,
        reason: String::new(),
        forced: false,
        changes: vec![],
        release: false,
        record: None,
        live: None,
    }
}

/// A JSON merge patch of the object's metadata, as restatus.
async fn patch(api: &Api<DynamicObject>, name: &str, body: &Value) -> Result<DynamicObject> {
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    api.patch(name, &params, &Patch::Merge(body)).await.map_err(|e| Error::kube(format!("patch {name}"), e))
}
