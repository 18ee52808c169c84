//! Apply: writes the items of a [`RestorePlan`] to the target cluster (Kubernetes edge).
//!
//! Per object: quiesce metal-operator with its `ignore` annotation (unless the object is
//! ignored already), write the record's status, then mark the object restored and remove
//! restatus's `ignore`; an Event tells what happened. Every write is a JSON merge patch as
//! field manager `restatus`. The first two carry the resourceVersion the decision was made
//! on: when the object changed meanwhile, the write conflicts, the object is re-read and
//! decided again, so a status that moved on after the plan is never overwritten. Each step
//! is idempotent, so a rerun finishes whatever a crash interrupted.
//!
//! The status goes through the status subresource where the kind has one (found by
//! discovery), through the object itself where it has none. Requests and answers stay raw
//! JSON: restatus reads a handful of fields from each answer, never the whole object.

use std::collections::HashSet;

use futures::{StreamExt, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::api::{GetParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::format::{Manifest, ObjectRef, Record};
use crate::identity::{KindProfile, Profile};
use crate::object::RawObject;
use crate::pairing::View;
use crate::plan::{
    self, LiveObject, OPERATION_ANNOTATION, OPERATION_IGNORE, PlanInput, PlanItem, RESTORED_FROM_ANNOTATION,
    RestorePlan, Verdict,
};
use crate::{Error, Result, TOOL_NAME};

/// Field manager of every write restatus makes.
pub const FIELD_MANAGER: &str = TOOL_NAME;
/// How often a conflicting status write is re-read, re-decided and retried.
const CONFLICT_RETRIES: usize = 5;

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
    /// The object's pairing side as the API server answered the last write.
    #[serde(skip)]
    pub after: Option<View>,
}

/// What writing needs beyond one snapshot: the client, the event recorder, and which kinds
/// have a status subresource. Lives as long as the restore run or the controller.
pub struct Writer {
    client: kube::Client,
    recorder: Recorder,
    status_subresource: HashSet<String>,
}

impl Writer {
    /// Asks the API server (discovery) which kinds of the profile have a status subresource.
    pub async fn new(client: &kube::Client, profile: &Profile) -> Result<Self> {
        let mut status_subresource = HashSet::new();
        let mut versions: Vec<(&str, &str)> = profile.kinds.iter().map(|k| (&*k.group, &*k.version)).collect();
        versions.sort();
        versions.dedup();
        for (group, version) in versions {
            let path = if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
            let request = http::Request::get(&path)
                .body(vec![])
                .map_err(|e| Error::kube(format!("discover {path}"), kube::Error::HttpError(e)))?;
            let served: APIResourceList = match client.request(request).await {
                Ok(list) => list,
                // Not served: nothing of it can be written; planning says so per object.
                Err(kube::Error::Api(s)) if s.is_not_found() => continue,
                Err(e) => return Err(Error::kube(format!("discover {path}"), e)),
            };
            let names: HashSet<&str> = served.resources.iter().map(|r| r.name.as_str()).collect();
            for kind in profile.kinds.iter().filter(|k| k.group == group && k.version == version) {
                if names.contains(format!("{}/status", kind.plural).as_str()) {
                    status_subresource.insert(kind.kind.clone());
                }
            }
        }
        let reporter = Reporter { controller: TOOL_NAME.into(), instance: std::env::var("POD_NAME").ok() };
        Ok(Writer { client: client.clone(), recorder: Recorder::new(client.clone(), reporter), status_subresource })
    }

    /// A JSON merge patch of the object (or of its `subresource`), as restatus. The answer
    /// is the object as the API server stored it, raw.
    async fn merge_patch(
        &self,
        kind: &KindProfile,
        object: &LiveObject,
        subresource: Option<&str>,
        body: &impl Serialize,
    ) -> std::result::Result<String, kube::Error> {
        let request = kube::core::Request::new(kind.list_path_in(object.namespace.as_deref()));
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let patch = Patch::Merge(body);
        let request = match subresource {
            Some(sub) => request.patch_subresource(sub, &object.name, &params, &patch),
            None => request.patch(&object.name, &params, &patch),
        }
        .map_err(kube::Error::BuildRequest)?;
        self.client.request_text(request).await
    }

    async fn get(&self, kind: &KindProfile, object: &LiveObject) -> Result<String> {
        let context = || format!("re-read {}", object.object_ref());
        let request = kube::core::Request::new(kind.list_path_in(object.namespace.as_deref()))
            .get(&object.name, &GetParams::default())
            .map_err(|e| Error::kube(context(), kube::Error::BuildRequest(e)))?;
        self.client.request_text(request).await.map_err(|e| Error::kube(context(), e))
    }
}

/// Applies plan items from one snapshot. Shared by the one-shot restore and the controller.
pub struct Applier<'a> {
    writer: &'a Writer,
    profile: &'a Profile,
    manifest: &'a Manifest,
    records: &'a [Record],
    force: bool,
}

impl<'a> Applier<'a> {
    pub fn new(
        writer: &'a Writer,
        profile: &'a Profile,
        manifest: &'a Manifest,
        records: &'a [Record],
        force: bool,
    ) -> Self {
        Applier { writer, profile, manifest, records, force }
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
        let mut outcome =
            Outcome { object: object.object_ref(), verdict: item.verdict, writes: 0, error: None, after: None };
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
        let mut current = object.clone();
        let mut owns_ignore = object.quiesced_by_restatus();
        let mut answer = None;
        if item.verdict == Verdict::Restore {
            let record = &self.records[item.record.expect("restore items have a record")];
            let (verdict, written) =
                self.quiesce_and_write(kind, record, &mut current, &mut owns_ignore, outcome).await?;
            outcome.verdict = verdict;
            answer = written;
        }
        let restored = outcome.verdict == Verdict::Restore;
        let mut annotations = serde_json::Map::new();
        if restored {
            annotations.insert(RESTORED_FROM_ANNOTATION.into(), self.manifest.snapshot_id.as_str().into());
        }
        // Whatever the outcome, an ignore that restatus set is removed: the object's status is
        // settled (restored, equal, or moved on) and metal-operator may take over.
        if owns_ignore {
            annotations.extend(plan::release_annotations());
        }
        if !annotations.is_empty() {
            let body = json!({"metadata": {"annotations": annotations}});
            let patched = self
                .writer
                .merge_patch(kind, &current, None, &body)
                .await
                .map_err(|e| Error::kube(format!("annotate {}", current.object_ref()), e))?;
            outcome.writes += 1;
            answer = Some(patched);
        }
        if restored {
            self.event(kind, &current, item).await;
        }
        outcome.after = answer.as_deref().and_then(|json| RawObject::parse(json).ok()).and_then(|o| View::of(kind, &o));
        Ok(())
    }

    /// Sets restatus's `ignore` (unless the object is ignored already), then writes the
    /// record's status. Both writes carry the resourceVersion the decision was made on: when
    /// the object changed meanwhile, it is re-read and decided again. Returns the verdict
    /// finally applied and, when the status was written, the API server's answer.
    async fn quiesce_and_write(
        &self,
        kind: &KindProfile,
        record: &Record,
        current: &mut LiveObject,
        owns_ignore: &mut bool,
        outcome: &mut Outcome,
    ) -> Result<(Verdict, Option<String>)> {
        let status_endpoint = self.writer.status_subresource.contains(&kind.kind).then_some("status");
        for _ in 0..CONFLICT_RETRIES {
            let result = if current.ignored() {
                let body = self.status_body(current, record)?;
                self.writer.merge_patch(kind, current, status_endpoint, &body).await.map(Some)
            } else {
                let body = json!({"metadata": {
                    "resourceVersion": current.resource_version,
                    "annotations": plan::quiesce_annotations(),
                }});
                self.writer.merge_patch(kind, current, None, &body).await.map(|patched| {
                    let patched = RawObject::parse(&patched).ok();
                    current.resource_version = patched
                        .and_then(|o| o.meta.resource_version.as_deref().map(str::to_string))
                        .unwrap_or_default();
                    current.annotations.insert(OPERATION_ANNOTATION.into(), OPERATION_IGNORE.into());
                    *owns_ignore = true;
                    None
                })
            };
            outcome.writes += 1;
            match result {
                Ok(Some(answer)) => return Ok((Verdict::Restore, Some(answer))),
                Ok(None) => continue,
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    let fresh = self.writer.get(kind, current).await?;
                    let fresh = RawObject::parse(&fresh).map_err(|e| Error::InvalidObject {
                        kind: kind.qualified_kind(),
                        name: current.name.clone(),
                        reason: e.to_string(),
                    })?;
                    *current = LiveObject::from_raw(kind, &fresh);
                    let verdict = self.decide_again(kind, record, current);
                    info!(object = %current.object_ref(), %verdict, "object changed during the restore; decided again");
                    if verdict != Verdict::Restore {
                        return Ok((verdict, None));
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

    /// The merge patch that leaves exactly the record's status, with the resourceVersion
    /// precondition. The record's raw JSON is carried as is when the live status is empty.
    fn status_body(&self, current: &LiveObject, record: &Record) -> Result<Box<RawValue>> {
        let corrupt = |e: serde_json::Error| {
            Error::corrupt(&self.manifest.snapshot_id, format!("record {}: {e}", record.object_name()))
        };
        let status = match current.status_value() {
            None => record.status.clone(),
            Some(live) => {
                let wanted: Value = serde_json::from_str(record.status.get()).map_err(corrupt)?;
                serde_json::value::to_raw_value(&plan::status_patch(Some(&live), &wanted)).map_err(corrupt)?
            }
        };
        let version = serde_json::to_string(&current.resource_version).map_err(corrupt)?;
        let body = format!(r#"{{"metadata":{{"resourceVersion":{version}}},"status":{}}}"#, status.get());
        RawValue::from_string(body).map_err(corrupt)
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
        if let Err(e) = self.writer.recorder.publish(&event, &reference).await {
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
