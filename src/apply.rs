//! Apply: writes the items of a [`RestorePlan`] to the target cluster (Kubernetes edge).
//!
//! Per object: quiesce metal-operator with its `ignore` annotation (unless the object is
//! ignored already), write the record's status, then mark the object restored and remove
//! restatus's `ignore`; an Event tells what happened. An object metal-operator would mistreat
//! stays ignored (see [`Applier::hold`]); restoring it again releases it once that is over.
//! Every write is made as field manager `restatus`. The first two carry the resourceVersion the decision was made on: when the
//! object changed meanwhile, the write conflicts, the object is re-read and decided again,
//! so a status that moved on after the plan is never overwritten. Each step is idempotent,
//! so a rerun finishes whatever a crash interrupted.
//!
//! The status replaces the status subresource where the kind has one (found by discovery);
//! the release then replaces the object as the API server answered that write, with only
//! its annotations changed. Replacing costs the API server less than a merge patch, which
//! re-encodes and merges the whole stored object first; the resourceVersion makes both
//! replaces conditional, and a release whose object changed since falls back to a patch of
//! the annotations alone. Kinds without a status subresource get their status by a merge
//! patch of the object itself. Requests and answers stay raw JSON: restatus reads a handful
//! of fields from each answer, never the whole object.

use std::collections::HashSet;

use futures::{StreamExt, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::api::{GetParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::format::{Manifest, ObjectRef, Record};
use crate::identity::{KindProfile, Profile};
use crate::object::{self, RawObject};
use crate::pairing::{METAL_GROUP, ServerView, View};
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
    /// Why restatus kept its `ignore` on the object (the object it waits for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
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

    /// A replace (PUT) of the object (or of its `subresource`) with `body`, as restatus.
    /// The answer is the object as the API server stored it, raw.
    async fn replace(
        &self,
        kind: &KindProfile,
        object: &LiveObject,
        subresource: Option<&str>,
        body: String,
    ) -> std::result::Result<String, kube::Error> {
        let request = kube::core::Request::new(kind.list_path_in(object.namespace.as_deref()));
        let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let request = match subresource {
            Some(sub) => request.replace_subresource(sub, &object.name, &params, body.into_bytes()),
            None => request.replace(&object.name, &params, body.into_bytes()),
        }
        .map_err(kube::Error::BuildRequest)?;
        self.client.request_text(request).await
    }

    fn has_status_subresource(&self, kind: &KindProfile) -> bool {
        self.status_subresource.contains(&kind.kind)
    }

    async fn get(&self, kind: &KindProfile, object: &LiveObject) -> Result<String> {
        let context = || format!("re-read {}", object.object_ref());
        self.get_named(kind, object.namespace.as_deref(), &object.name).await.map_err(|e| Error::kube(context(), e))
    }

    async fn get_named(
        &self,
        kind: &KindProfile,
        namespace: Option<&str>,
        name: &str,
    ) -> std::result::Result<String, kube::Error> {
        let request = kube::core::Request::new(kind.list_path_in(namespace))
            .get(name, &GetParams::default())
            .map_err(kube::Error::BuildRequest)?;
        self.client.request_text(request).await
    }
}

/// Applies plan items from one snapshot. Shared by the one-shot restore and the controller.
pub struct Applier<'a> {
    writer: &'a Writer,
    profile: &'a Profile,
    manifest: &'a Manifest,
    records: &'a [Record],
    /// Every record of the snapshot (`records` may be a part of them), for what a BMC awaits.
    snapshot_records: &'a [Record],
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
        Applier { writer, profile, manifest, records, snapshot_records: records, force }
    }

    /// Every record of the snapshot, when the applier plans with a part of them.
    pub fn with_snapshot_records(mut self, all: &'a [Record]) -> Self {
        self.snapshot_records = all;
        self
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
        let mut outcome = Outcome {
            object: object.object_ref(),
            verdict: item.verdict,
            writes: 0,
            error: None,
            after: None,
            held: None,
        };
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
        let mut written = None;
        if item.verdict == Verdict::Restore {
            let record = &self.records[item.record.expect("restore items have a record")];
            (outcome.verdict, written) =
                self.quiesce_and_write(kind, record, &mut current, &mut owns_ignore, outcome).await?;
        }
        let restored = outcome.verdict == Verdict::Restore;
        let mut annotations = serde_json::Map::new();
        if restored {
            annotations.insert(RESTORED_FROM_ANNOTATION.into(), self.manifest.snapshot_id.as_str().into());
        }
        // Whatever the outcome, an ignore that restatus set is removed: the object's status is
        // settled (restored, equal, or moved on) and metal-operator may take over; but not
        // while the object's pairing partner has yet to arrive.
        if owns_ignore {
            let snapshots_status = matches!(outcome.verdict, Verdict::Restore | Verdict::AlreadyEqual);
            match self.hold(kind, &current, written.as_deref(), snapshots_status).await? {
                Some(reason) => {
                    info!(object = %outcome.object, %reason, "keeping restatus's ignore");
                    outcome.held = Some(reason);
                }
                None => annotations.extend(plan::release_annotations()),
            }
        }
        let answer = match annotations.is_empty() {
            true => written,
            false => Some(self.annotate(kind, &current, written.as_deref(), annotations, outcome).await?),
        };
        if restored {
            self.event(kind, &current, item).await;
        }
        outcome.after = answer.as_deref().and_then(|json| RawObject::parse(json).ok()).and_then(|o| View::of(kind, &o));
        Ok(())
    }

    /// Why restatus must not let metal-operator act on the object yet, if it must not.
    ///
    /// `clusterctl move` creates owners before what they own, and claims last (deepest in the
    /// owner chain), so an object released as soon as its status is back can meet
    /// metal-operator's handling of a missing partner; the object waits for:
    /// - a Server, for its ServerClaim (`spec.serverClaimRef`): without it, metal-operator
    ///   powers the Server off, drops its boot configuration and frees it for other claims;
    /// - a BMC, for its Servers: metal-operator creates each system's Server itself (named
    ///   `<bmc>-system-<n>`, as v0.7.0 does), without status; clusterctl then finds it there
    ///   and does not copy the source's. The snapshot tells which Servers the BMC had.
    ///
    /// And a Server whose status, the snapshot's (`snapshots_status`), says `Available` while
    /// its spec names a claim was bound after the snapshot (a disaster recovery from an older
    /// snapshot): metal-operator would power the machine off, which serves that claim, and boot
    /// it again. A person decides (set its status, or remove restatus's `ignore`);
    /// docs/MOVE.md, disaster recovery.
    ///
    /// The object is the status write's answer, or read again when there was none.
    async fn hold(
        &self,
        kind: &KindProfile,
        current: &LiveObject,
        written: Option<&str>,
        snapshots_status: bool,
    ) -> Result<Option<String>> {
        if kind.group != METAL_GROUP {
            return Ok(None);
        }
        let partner = |kind: &str| self.profile.kind(kind).filter(|k| k.group == METAL_GROUP);
        let wanted: Vec<(&KindProfile, Option<String>, String)> = match (
            kind.kind.as_str(),
            partner("ServerClaim"),
            partner("Server"),
        ) {
            ("Server", Some(claims), _) => {
                let json = match written {
                    Some(json) => json.to_string(),
                    None => self.writer.get(kind, current).await?,
                };
                let object = RawObject::parse(&json).map_err(|e| Error::InvalidObject {
                    kind: kind.qualified_kind(),
                    name: current.name.clone(),
                    reason: match written {
                        Some(_) => format!("answer to the status write: {e}"),
                        None => e.to_string(),
                    },
                })?;
                match View::of(kind, &object) {
                    Some(View::Server(ServerView { state, claim: Some((namespace, name)), .. })) => {
                        if snapshots_status && state == "Available" {
                            return Ok(Some(format!(
                                "bound after the snapshot: Available, yet spec.serverClaimRef names {namespace}/{name}"
                            )));
                        }
                        vec![(claims, Some(namespace), name)]
                    }
                    _ => vec![],
                }
            }
            ("BMC", _, Some(servers)) => servers_of_bmc(&current.name, self.snapshot_records)
                .into_iter()
                .map(|name| (servers, None, name.to_string()))
                .collect(),
            _ => vec![],
        };
        for (kind, namespace, name) in wanted {
            match self.writer.get_named(kind, namespace.as_deref(), &name).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => {
                    return Ok(Some(format!("waits for {}", ObjectRef { kind: kind.kind.clone(), namespace, name })));
                }
                Err(e) => return Err(Error::kube(format!("look up what {} waits for", current.object_ref()), e)),
            }
        }
        Ok(None)
    }

    /// Writes restatus's annotation `changes` (null removes a key). Right after a status
    /// write through the subresource, `written` (its answer) is the object as stored: it is
    /// replaced with only its annotations changed, on that resourceVersion. When the object
    /// changed since, or there was no such write, the annotations alone are patched.
    async fn annotate(
        &self,
        kind: &KindProfile,
        current: &LiveObject,
        written: Option<&str>,
        changes: serde_json::Map<String, Value>,
        outcome: &mut Outcome,
    ) -> Result<String> {
        let context = || format!("annotate {}", current.object_ref());
        if let Some(written) = written.filter(|_| self.writer.has_status_subresource(kind)) {
            let body = object::annotations_replaced(written, &changes).map_err(|e| Error::InvalidObject {
                kind: kind.qualified_kind(),
                name: current.name.clone(),
                reason: format!("answer to the status write: {e}"),
            })?;
            outcome.writes += 1;
            match self.writer.replace(kind, current, None, body).await {
                Ok(answer) => return Ok(answer),
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    info!(object = %current.object_ref(), "object changed after its status was written; patching the annotations");
                }
                Err(e) => return Err(Error::kube(context(), e)),
            }
        }
        let body = json!({"metadata": {"annotations": changes}});
        outcome.writes += 1;
        self.writer.merge_patch(kind, current, None, &body).await.map_err(|e| Error::kube(context(), e))
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
        let subresource = self.writer.has_status_subresource(kind);
        for _ in 0..CONFLICT_RETRIES {
            let result = if current.ignored() && subresource {
                let body = self.status_replacement(kind, current, record)?;
                self.writer.replace(kind, current, Some("status"), body).await.map(Some)
            } else if current.ignored() {
                let body = self.status_patch(current, record)?;
                self.writer.merge_patch(kind, current, None, &body).await.map(Some)
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

    /// The status subresource's new content: exactly the record's status (its raw JSON, as
    /// is), on the resourceVersion the decision was made on. The API server takes nothing
    /// else from a status replace.
    fn status_replacement(&self, kind: &KindProfile, current: &LiveObject, record: &Record) -> Result<String> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Meta<'a> {
            name: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            namespace: Option<&'a str>,
            resource_version: &'a str,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Replacement<'a> {
            api_version: String,
            kind: &'a str,
            metadata: Meta<'a>,
            status: &'a RawValue,
        }
        let replacement = Replacement {
            api_version: kind.api_version(),
            kind: &kind.kind,
            metadata: Meta {
                name: &current.name,
                namespace: current.namespace.as_deref(),
                resource_version: &current.resource_version,
            },
            status: &record.status,
        };
        serde_json::to_string(&replacement).map_err(|e| self.corrupt(record, e))
    }

    /// For a kind without a status subresource: the merge patch of the object that leaves
    /// exactly the record's status, with the resourceVersion precondition. The record's raw
    /// JSON is carried as is when the live status is empty.
    fn status_patch(&self, current: &LiveObject, record: &Record) -> Result<Box<RawValue>> {
        let corrupt = |e: serde_json::Error| self.corrupt(record, e);
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

    fn corrupt(&self, record: &Record, e: serde_json::Error) -> Error {
        Error::corrupt(&self.manifest.snapshot_id, format!("record {}: {e}", record.object_name()))
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

/// The Servers the snapshot holds for BMC `bmc`, by metal-operator's naming of the Servers a
/// BMC's systems get: `<bmc>-system-<index>`.
fn servers_of_bmc<'r>(bmc: &str, records: &'r [Record]) -> Vec<&'r str> {
    let prefix = format!("{bmc}-system-");
    records
        .iter()
        .filter(|r| r.kind == "Server" && r.api_version.starts_with(METAL_GROUP))
        .filter(|r| {
            r.name.strip_prefix(&prefix).is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|r| r.name.as_str())
        .collect()
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

#[cfg(test)]
mod tests {
    //! The apply step's writes against a scripted API server (tower-test): what each request
    //! carries, and what happens when the object changed between two writes. That the writes
    //! restore real objects is shown end to end on the test bed (e2e/restore.rs).

    use std::future::Future;

    use http::{Method, Request, Response, StatusCode};
    use jiff::Timestamp;
    use kube::client::Body;
    use tower_test::mock;

    use super::*;
    use crate::capture::{CaptureSummary, judge};
    use crate::format::PayloadSummary;
    use crate::identity::IdentityKey;
    use crate::plan::QUIESCED_BY_ANNOTATION;

    type Handle = mock::Handle<Request<Body>, Response<Body>>;

    const SERVER: &str = "/apis/metal.ironcore.dev/v1alpha1/servers/server-1";
    const CLAIM: &str = "/apis/metal.ironcore.dev/v1alpha1/namespaces/a/serverclaims/claim-1";
    const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
    const SNAPSHOT: &str = "20261130T090000.000Z-0a1b2c";

    fn server(resource_version: &str, annotations: Value, status: Value) -> String {
        json!({
            "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": "server-1", "uid": "u-1", "resourceVersion": resource_version,
                         "finalizers": ["metal.ironcore.dev/server"], "annotations": annotations,
                         "managedFields": [{"manager": "restatus", "operation": "Update"}]},
            "spec": {"systemUUID": "UUID-1", "serverClaimRef": {"namespace": "a", "name": "claim-1"}},
            "status": status,
        })
        .to_string()
    }

    fn wanted() -> Value {
        json!({"state": "Reserved", "networkInterfaces": [{"name": "eth0", "macAddress": "aa:bb"}]})
    }

    fn quiesced() -> Value {
        json!({OPERATION_ANNOTATION: OPERATION_IGNORE, QUIESCED_BY_ANNOTATION: "restatus", "user": "kept"})
    }

    fn snapshot_id() -> String {
        SNAPSHOT.into()
    }

    /// Answers the next request with `code` and `answer`; returns its method, path and body.
    async fn answer(api: &mut Handle, code: StatusCode, answer: String) -> (Method, String, Value) {
        let (request, send) = api.next_request().await.expect("a request");
        let (method, path) = (request.method().clone(), request.uri().path().to_string());
        let body = request.into_body().collect_bytes().await.expect("request body");
        send.send_response(Response::builder().status(code).body(Body::from(answer.into_bytes())).unwrap());
        (method, path, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// Creates what is posted (the Event).
    async fn echo(api: &mut Handle) -> (Method, String) {
        let (request, send) = api.next_request().await.expect("a request");
        let (method, path) = (request.method().clone(), request.uri().path().to_string());
        let body = request.into_body().collect_bytes().await.expect("request body");
        send.send_response(Response::builder().status(StatusCode::CREATED).body(Body::from(body)).unwrap());
        (method, path)
    }

    /// The Server's ServerClaim is looked up before the release; answers it with `code`.
    async fn claim_lookup(api: &mut Handle, code: StatusCode) {
        let claim = match code {
            StatusCode::OK => json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim",
                                     "metadata": {"name": "claim-1", "namespace": "a"}}),
            _ => json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                        "code": 404, "message": "serverclaims.metal.ironcore.dev \"claim-1\" not found"}),
        };
        let (method, path, _) = answer(api, code, claim.to_string()).await;
        assert_eq!((method, path.as_str()), (Method::GET, CLAIM));
    }

    fn conflict() -> String {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
               "message": "the object has been modified; please apply your changes to the latest version"})
        .to_string()
    }

    /// Restores `server-1`, which arrives bare (resourceVersion 1), while `script` plays the
    /// API server; the script's assertions fail the test.
    async fn restore_one<F, Fut>(script: F) -> Outcome
    where
        F: FnOnce(Handle) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let api_server = tokio::spawn(script(handle));
        let client = kube::Client::new(service, "default");
        let profile = Profile::metal_operator();
        let kind = profile.kind("Server").unwrap();
        let writer = Writer {
            client: client.clone(),
            recorder: Recorder::new(client, Reporter { controller: TOOL_NAME.into(), instance: None }),
            status_subresource: ["Server".to_string()].into(),
        };
        let at: Timestamp = "2026-11-30T09:00:00Z".parse().unwrap();
        let capture = CaptureSummary {
            kinds: vec![],
            skipped: vec![],
            conflicts: vec![],
            consistency: judge(&Default::default(), vec![], &[], 1),
        };
        let payload = PayloadSummary { size: 0, uncompressed_size: 0, sha256: String::new(), records: 1 };
        let manifest = Manifest::new("c", SNAPSHOT.parse().unwrap(), at, "metal-operator", capture, payload);
        let key = IdentityKey { field: "spec.systemUUID".into(), value: "uuid-1".into() };
        let record = Record::test_server("server-1", vec![key.clone()], &wanted().to_string());
        let live = LiveObject {
            kind: "Server".into(),
            namespace: None,
            name: "server-1".into(),
            uid: "u-1".into(),
            resource_version: "1".into(),
            keys: vec![key],
            status: None,
            annotations: Default::default(),
            status_written_at: None,
        };
        let records = [record];
        let applier = Applier::new(&writer, &profile, &manifest, &records, false);
        let item = PlanItem { record: Some(0), live: Some(0), ..blank_item(kind) };
        let outcome = applier.apply_item(kind, &item, std::slice::from_ref(&live)).await;
        drop(writer); // the script's next_request() ends instead of waiting for a request that never comes
        api_server.await.expect("the scripted API server saw what it expected");
        outcome
    }

    /// Quiesce (patch), status (replace of the subresource): the same in every test below.
    async fn quiesce_and_replace_status(api: &mut Handle) {
        let (method, path, body) = answer(api, StatusCode::OK, server("2", quiesced(), json!({}))).await;
        assert_eq!((method, path.as_str()), (Method::PATCH, SERVER));
        assert_eq!(body, json!({"metadata": {"resourceVersion": "1", "annotations": plan::quiesce_annotations()}}));

        let (method, path, body) = answer(api, StatusCode::OK, server("3", quiesced(), wanted())).await;
        assert_eq!((method, path.as_str()), (Method::PUT, format!("{SERVER}/status").as_str()));
        let expected = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
                              "metadata": {"name": "server-1", "resourceVersion": "2"}, "status": wanted()});
        assert_eq!(body, expected, "exactly the record's status, on the quiesced version");
    }

    #[tokio::test]
    async fn the_release_replaces_the_object_as_written_with_only_annotations_changed() {
        let outcome = restore_one(|mut api| async move {
            quiesce_and_replace_status(&mut api).await;
            claim_lookup(&mut api, StatusCode::OK).await;
            let released = json!({"user": "kept", RESTORED_FROM_ANNOTATION: snapshot_id()});
            let (method, path, body) = answer(&mut api, StatusCode::OK, server("4", released.clone(), wanted())).await;
            assert_eq!((method, path.as_str()), (Method::PUT, SERVER));
            let mut expected: Value = serde_json::from_str(&server("3", released, Value::Null)).unwrap();
            expected.as_object_mut().unwrap().remove("status");
            expected["metadata"].as_object_mut().unwrap().remove("managedFields");
            assert_eq!(body, expected, "the answer to the status write, annotations changed, on its version");
            assert_eq!(echo(&mut api).await, (Method::POST, EVENTS.to_string()));
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error), (Verdict::Restore, 3, None));
        let Some(View::Server(after)) = outcome.after else { panic!("no pairing view: {:?}", outcome.after) };
        assert_eq!(after.state, "Reserved");
    }

    #[tokio::test]
    async fn a_release_whose_object_changed_since_the_status_write_patches_the_annotations() {
        let outcome = restore_one(|mut api| async move {
            quiesce_and_replace_status(&mut api).await;
            claim_lookup(&mut api, StatusCode::OK).await;
            let (method, path, _) = answer(&mut api, StatusCode::CONFLICT, conflict()).await;
            assert_eq!((method, path.as_str()), (Method::PUT, SERVER));
            let released = json!({"user": "kept", "added": "meanwhile", RESTORED_FROM_ANNOTATION: snapshot_id()});
            let (method, path, body) = answer(&mut api, StatusCode::OK, server("5", released, wanted())).await;
            assert_eq!((method, path.as_str()), (Method::PATCH, SERVER));
            let expected = json!({"metadata": {"annotations": {
                OPERATION_ANNOTATION: null, QUIESCED_BY_ANNOTATION: null, RESTORED_FROM_ANNOTATION: snapshot_id()}}});
            assert_eq!(body, expected, "the annotations alone, whatever else changed");
            assert_eq!(echo(&mut api).await, (Method::POST, EVENTS.to_string()));
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error), (Verdict::Restore, 4, None));
    }

    #[tokio::test]
    async fn an_unreadable_answer_to_the_status_write_is_an_error_naming_the_object() {
        let outcome = restore_one(|mut api| async move {
            let (method, _, _) = answer(&mut api, StatusCode::OK, server("2", quiesced(), json!({}))).await;
            assert_eq!(method, Method::PATCH);
            let (method, _, _) = answer(&mut api, StatusCode::OK, "<html>proxy error</html>".into()).await;
            assert_eq!(method, Method::PUT);
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes), (Verdict::Restore, 2));
        let error = outcome.error.expect("an error");
        assert!(error.contains("server-1") && error.contains("answer to the status write"), "{error}");
    }

    #[tokio::test]
    async fn a_status_that_moved_on_before_the_status_write_is_kept_and_released() {
        let outcome = restore_one(|mut api| async move {
            let (method, _, _) = answer(&mut api, StatusCode::OK, server("2", quiesced(), json!({}))).await;
            assert_eq!(method, Method::PATCH);
            let (method, _, _) = answer(&mut api, StatusCode::CONFLICT, conflict()).await;
            assert_eq!(method, Method::PUT);
            let moved_on = json!({"state": "Available", "powerState": "On"});
            let (method, path, _) = answer(&mut api, StatusCode::OK, server("3", quiesced(), moved_on.clone())).await;
            assert_eq!((method, path.as_str()), (Method::GET, SERVER), "re-read to decide again");
            let (method, path, _) = answer(&mut api, StatusCode::OK, server("3", quiesced(), moved_on.clone())).await;
            assert_eq!((method, path.as_str()), (Method::GET, SERVER), "read for its serverClaimRef");
            claim_lookup(&mut api, StatusCode::OK).await;
            let (method, path, body) =
                answer(&mut api, StatusCode::OK, server("4", json!({"user": "kept"}), moved_on)).await;
            assert_eq!((method, path.as_str()), (Method::PATCH, SERVER));
            assert_eq!(body, json!({"metadata": {"annotations": plan::release_annotations()}}));
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error), (Verdict::SkipNewer, 3, None));
    }

    #[tokio::test]
    async fn a_server_whose_claim_is_not_on_the_target_yet_is_restored_but_stays_ignored() {
        let outcome = restore_one(|mut api| async move {
            quiesce_and_replace_status(&mut api).await;
            claim_lookup(&mut api, StatusCode::NOT_FOUND).await;
            let mut kept = quiesced();
            kept[RESTORED_FROM_ANNOTATION] = json!(snapshot_id());
            let (method, path, body) = answer(&mut api, StatusCode::OK, server("4", kept.clone(), wanted())).await;
            assert_eq!((method, path.as_str()), (Method::PUT, SERVER));
            assert_eq!(body["metadata"]["annotations"], kept, "restored-from added, restatus's ignore kept");
            assert_eq!(echo(&mut api).await, (Method::POST, EVENTS.to_string()));
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error), (Verdict::Restore, 3, None));
        assert_eq!(outcome.held.as_deref(), Some("waits for ServerClaim a/claim-1"));
    }

    #[test]
    fn a_bmc_awaits_the_servers_of_its_systems_named_as_metal_operator_names_them() {
        let server = |name: &str| Record::test_server(name, vec![], "{}");
        let records = [
            server("rack1-bmc-system-0"),
            server("rack1-bmc-system-1"),
            server("rack1-bmc-system-x"),
            server("rack1-bmc-system-"),
            server("rack1-bmc-2-system-0"),
            server("other-bmc-system-0"),
        ];
        assert_eq!(servers_of_bmc("rack1-bmc", &records), ["rack1-bmc-system-0", "rack1-bmc-system-1"]);
        assert!(servers_of_bmc("rack2-bmc", &records).is_empty());
    }

    #[tokio::test]
    async fn a_server_available_yet_claimed_stays_ignored_for_a_person_to_decide() {
        let outcome = restore_one(|mut api| async move {
            let (method, _, _) = answer(&mut api, StatusCode::OK, server("2", quiesced(), json!({}))).await;
            assert_eq!(method, Method::PATCH);
            let available = json!({"state": "Available", "powerState": "Off"});
            let (method, _, _) = answer(&mut api, StatusCode::OK, server("3", quiesced(), available.clone())).await;
            assert_eq!(method, Method::PUT);
            let mut kept = quiesced();
            kept[RESTORED_FROM_ANNOTATION] = json!(snapshot_id());
            let (method, path, body) = answer(&mut api, StatusCode::OK, server("4", kept.clone(), available)).await;
            assert_eq!((method, path.as_str()), (Method::PUT, SERVER), "no claim lookup: nothing to wait for");
            assert_eq!(body["metadata"]["annotations"], kept);
            assert_eq!(echo(&mut api).await, (Method::POST, EVENTS.to_string()));
        })
        .await;
        assert_eq!((outcome.verdict, outcome.error), (Verdict::Restore, None));
        let held = outcome.held.expect("held");
        assert!(held.starts_with("bound after the snapshot") && held.contains("a/claim-1"), "{held}");
    }
}
