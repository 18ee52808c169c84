//! Apply: writes the items of a [`RestorePlan`] to the target cluster (Kubernetes edge).
//!
//! Per object, a [`WriteSequence`]: quiesce metal-operator with its `ignore` annotation
//! (unless the object is ignored already), write the record's status, then mark the object
//! restored and remove restatus's `ignore`; an Event tells what happened. An object
//! metal-operator would mistreat stays ignored (see [`Partners::hold`]); restoring it
//! again releases it once that is over. The first two writes
//! carry the resourceVersion the decision was made on: when the object changed meanwhile, the
//! write conflicts, the object is re-read and decided again, so a status that moved on after
//! the plan is never overwritten. Each step is idempotent, so a rerun finishes whatever a
//! crash interrupted.
//!
//! The status replaces the status subresource where the kind has one (found by discovery);
//! the release then replaces the object as the API server answered that write, with only
//! its annotations changed. Replacing costs the API server less than a merge patch, which
//! re-encodes and merges the whole stored object first; the resourceVersion makes both
//! replaces conditional, and a release whose object changed since falls back to a patch of
//! the annotations alone. Kinds without a status subresource get their status by a merge
//! patch of the object itself. Requests and answers stay raw JSON: restatus reads a handful
//! of fields from each answer, never the whole object.

use futures::{StreamExt, stream};
use kube::runtime::events::{Event, EventType};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::domain::annotations::{self, NOT_RESTORED_ANNOTATION, RESTORED_FROM_ANNOTATION};
use crate::domain::identity::{KindProfile, Profile};
use crate::domain::live::LiveObject;
use crate::domain::object::{self, RawObject};
use crate::domain::pairing::View;
use crate::domain::status;
use crate::format::{Manifest, ObjectRef, Record, Records};
use crate::k8s::{Writer, events};
use crate::restore::hold::{Candidate, Partners};
use crate::restore::plan::{self, PlanItem, RestorePlan, Verdict};
use crate::{Error, Result};

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
    /// Why the verdict changed during the apply (the object changed after the plan).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why restatus kept its `ignore` on the object (the object it waits for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The object's pairing side as the API server answered the last write.
    #[serde(skip)]
    pub after: Option<View>,
    /// The resourceVersion each write made, in order: the watch events that carry them are
    /// this restore's own (see `controller`).
    #[serde(skip)]
    pub versions: Vec<String>,
}

/// Applies plan items from one snapshot. Shared by the one-shot restore and the controller.
pub struct Applier<'a> {
    writer: &'a Writer,
    profile: &'a Profile,
    manifest: &'a Manifest,
    records: &'a Records,
    force: bool,
    /// What a release waits for (see [`Partners::hold`]).
    partners: Partners<'a>,
}

impl<'a> Applier<'a> {
    pub fn new(
        writer: &'a Writer,
        profile: &'a Profile,
        manifest: &'a Manifest,
        records: &'a Records,
        force: bool,
    ) -> Self {
        Applier { writer, profile, manifest, records, force, partners: Partners::listed(records, None) }
    }

    /// Holds objects for the partners as the caller knows them (the controller's indexes, the
    /// one-shot's listings) instead of finding them all on the target.
    pub fn with_partners(mut self, partners: Partners<'a>) -> Self {
        self.partners = partners;
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

    /// Applies one writing item (its live object is `live[item.live]`); never fails: an error
    /// is part of the outcome.
    pub async fn apply_item(&self, kind: &KindProfile, item: &PlanItem, live: &[LiveObject]) -> Outcome {
        match item.live.and_then(|l| live.get(l)) {
            Some(object) => self.apply_to(kind, item, object).await,
            None => {
                let object = item.target.clone().or_else(|| item.source.clone()).unwrap_or_else(|| ObjectRef {
                    kind: kind.kind.clone(),
                    namespace: None,
                    name: String::new(),
                });
                let error = Some("plan item without a live object: nothing to write".into());
                Outcome {
                    object,
                    verdict: item.verdict,
                    writes: 0,
                    reason: None,
                    held: None,
                    error,
                    after: None,
                    versions: vec![],
                }
            }
        }
    }

    /// Applies one writing item to its live object; never fails: an error is part of the
    /// outcome.
    pub async fn apply_to(&self, kind: &KindProfile, item: &PlanItem, object: &LiveObject) -> Outcome {
        let mut sequence = WriteSequence::new(self, kind, object);
        let result = match item.record.map(|r| self.records.record(r)).transpose() {
            Ok(record) => sequence.run(item, record.as_ref()).await,
            Err(e) => Err(e),
        };
        let mut outcome = Outcome {
            object: object.object_ref(),
            verdict: sequence.verdict.unwrap_or(item.verdict),
            writes: sequence.writes,
            reason: sequence.reason.take(),
            held: sequence.held.take(),
            error: None,
            after: None,
            versions: std::mem::take(&mut sequence.versions),
        };
        match result {
            Ok(answer) => {
                if let Some(stored) = answer.as_deref().and_then(|json| RawObject::parse(json).ok()) {
                    outcome.after = View::of(kind, &stored);
                    if let Some(version) =
                        stored.meta.resource_version.filter(|v| outcome.versions.last().is_none_or(|l| l != v))
                    {
                        outcome.versions.push(version.to_string());
                    }
                }
            }
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
}

/// One object's writes, in order: quiesce, write status, release. Holds the object as last
/// seen, whether restatus owns its `ignore`, and how many writes were made.
struct WriteSequence<'a> {
    applier: &'a Applier<'a>,
    kind: &'a KindProfile,
    current: LiveObject,
    owns_ignore: bool,
    /// The verdict after a re-decision (a conflict may turn `restore` into `skip-newer`),
    /// and why.
    verdict: Option<Verdict>,
    reason: Option<String>,
    /// What the object waits for, when restatus keeps its `ignore`.
    held: Option<String>,
    /// The kind at the record's version, when it is not the profile's: the status is written
    /// in the version it was captured in, and the API server converts it.
    status_kind: Option<KindProfile>,
    /// The target refused the record's status (see [`Verdict::Incompatible`]).
    refused: bool,
    /// Fields of the record's status that the target's schema did not keep.
    dropped: Vec<String>,
    writes: usize,
    /// The resourceVersions of the quiesce and the status write (the last write's answer is
    /// the outcome's).
    versions: Vec<String>,
}

/// How many dropped fields an outcome names.
const DROPPED_SHOWN: usize = 8;

impl<'a> WriteSequence<'a> {
    fn new(applier: &'a Applier<'a>, kind: &'a KindProfile, object: &LiveObject) -> Self {
        let owns_ignore = object.quiesced_by_restatus();
        WriteSequence {
            applier,
            kind,
            current: object.clone(),
            owns_ignore,
            verdict: None,
            reason: None,
            held: None,
            status_kind: None,
            refused: false,
            dropped: vec![],
            writes: 0,
            versions: vec![],
        }
    }

    /// Restores (for a `restore` item), releases, and records an Event for a restore. Returns
    /// the API server's answer to the last write, if any.
    async fn run(&mut self, item: &PlanItem, record: Option<&Record>) -> Result<Option<String>> {
        let mut written = None;
        if item.verdict == Verdict::Restore {
            let record = record.ok_or_else(|| self.invalid("restore item without a record".into()))?;
            match self.version_for(record).await? {
                Ok(status_kind) => {
                    self.status_kind = status_kind;
                    written = self.retry_on_conflict(record).await?;
                }
                Err(reason) => self.refuse(reason),
            }
        }
        let restored = written.is_some();
        if restored && !self.dropped.is_empty() {
            let reason =
                format!("restored without fields the target's schema does not keep: {}", self.dropped.join(", "));
            warn!(object = %self.current.object_ref(), %reason, "status restored in part");
            self.reason = Some(reason);
        }
        // Whatever the outcome, an ignore that restatus set is removed: the object's status is
        // settled (restored, equal, moved on, or refused by the target) and metal-operator may
        // take over; but not while the object's pairing partner has yet to arrive.
        let mut release = false;
        if self.owns_ignore && self.refused {
            release = true;
        } else if self.owns_ignore {
            let verdict = self.verdict.unwrap_or(item.verdict);
            let snapshots_status = matches!(verdict, Verdict::Restore | Verdict::AlreadyEqual);
            let candidate =
                Candidate { kind: self.kind, object: &self.current, written: written.as_deref(), snapshots_status };
            match self.applier.partners.hold(self.applier.writer, self.applier.profile, &candidate).await? {
                Some(reason) => {
                    info!(object = %self.current.object_ref(), %reason, "keeping restatus's ignore");
                    self.held = Some(reason);
                }
                None => release = true,
            }
        }
        let answer = match self.marks(restored, release).is_empty() {
            true => written,
            false => Some(self.annotate(written.as_deref(), restored, release).await?),
        };
        // Events are for people: one per object only where it needs attention (refused, restored
        // in part, kept quiesced); a restore's other objects are counted in its summary Event
        // (`Writer::summary_event`), and the snapshot restored from is on each object anyway.
        if self.refused || (restored && (!self.dropped.is_empty() || self.held.is_some())) {
            self.event(item).await;
        }
        Ok(answer)
    }

    /// The kind at the version the record's status is written in: the profile's (`None`), or
    /// the record's own when it was captured in another version the target serves. An error
    /// (inner) when the target serves the kind in no version the status can be written in.
    async fn version_for(&self, record: &Record) -> Result<std::result::Result<Option<KindProfile>, String>> {
        let version = record.version();
        if version == self.kind.version {
            return Ok(Ok(None));
        }
        let at = self.kind.at_version(version);
        if self.applier.writer.serves(&at).await? {
            return Ok(Ok(Some(at)));
        }
        Ok(Err(format!(
            "captured as {}, which the target does not serve (the profile writes {}): its status \
             cannot be written without a conversion restatus does not know",
            record.api_version,
            self.kind.api_version()
        )))
    }

    /// The target cannot take the record's status: nothing is written, the object is released
    /// (when restatus quiesced it) and marked so that the same snapshot does not try again.
    fn refuse(&mut self, reason: String) {
        warn!(object = %self.current.object_ref(), %reason, "status not restored: the target refuses it");
        self.verdict = Some(Verdict::Incompatible);
        self.reason = Some(reason);
        self.refused = true;
    }

    /// Quiesces (unless the object is ignored already) and writes the record's status. On a
    /// conflict the object is re-read and decided again; returns the answer to the status
    /// write, or `None` when the object is no longer to be restored (see `verdict`).
    async fn retry_on_conflict(&mut self, record: &Record) -> Result<Option<String>> {
        for _ in 0..CONFLICT_RETRIES {
            let result = match self.current.ignored() {
                true => match self.write_status(record).await? {
                    // The served schema refuses the record's status (a field it does not allow,
                    // a value out of its enum): the same write would be refused again.
                    Err(kube::Error::Api(s)) if s.code == 422 => {
                        self.refuse(format!("the target's schema refuses the status: {}", s.message));
                        return Ok(None);
                    }
                    other => other.map(Some),
                },
                false => self.quiesce().await.map(|()| None),
            };
            match result {
                Ok(Some(answer)) => return Ok(Some(answer)),
                Ok(None) => continue,
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    if self.decide_again(record).await? != Verdict::Restore {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(Error::kube(format!("restore {}", self.current.object_ref()), e)),
            }
        }
        Err(Error::KeptChanging {
            kind: self.kind.qualified_kind(),
            name: self.current.name.clone(),
            attempts: CONFLICT_RETRIES,
        })
    }

    /// Sets restatus's `ignore` on the planned resourceVersion.
    async fn quiesce(&mut self) -> std::result::Result<(), kube::Error> {
        let changes = annotations::quiesce_annotations(&self.current.annotations);
        let body = json!({"metadata": {
            "uid": self.current.uid, "resourceVersion": self.current.resource_version, "annotations": changes,
        }});
        self.writes += 1;
        let patched = self.applier.writer.merge_patch(self.kind, &self.current, None, &body).await?;
        let version = RawObject::parse(&patched).ok().and_then(|o| o.meta.resource_version.map(|v| v.to_string()));
        self.current.resource_version = version.unwrap_or_default();
        self.versions.push(self.current.resource_version.clone());
        for (key, value) in changes {
            if let Value::String(value) = value {
                self.current.annotations.insert(key, value);
            }
        }
        self.owns_ignore = true;
        Ok(())
    }

    /// Writes the record's status on the current resourceVersion. The outer error: the record
    /// cannot be written (a damaged snapshot); the inner result: the API server's answer.
    async fn write_status(&mut self, record: &Record) -> Result<std::result::Result<String, kube::Error>> {
        let writer = self.applier.writer;
        let corrupt =
            |e| Error::corrupt(&self.applier.manifest.snapshot_id, format!("record {}: {e}", record.object_name()));
        let status_kind = self.status_kind.as_ref().unwrap_or(self.kind);
        let answer = if writer.status_subresource(status_kind).await? {
            let body = status_replacement(status_kind, &self.current, record).map_err(corrupt)?;
            self.writes += 1;
            writer.replace(status_kind, &self.current, Some("status"), body).await
        } else {
            if self.current.status.as_ref().is_some_and(|s| s.json().is_none()) {
                // The patch must name the live fields the record lacks: read them.
                let fresh = writer.get(self.kind, &self.current).await?;
                let fresh = RawObject::parse(&fresh).map_err(|e| self.invalid(e.to_string()))?;
                self.current = LiveObject::from_raw(self.kind, &fresh);
            }
            let body = status_patch(&self.current, record).map_err(corrupt)?;
            self.writes += 1;
            let answer = writer.merge_patch(status_kind, &self.current, None, &body).await;
            if let Ok(stored) = &answer {
                self.check_stored(stored, record)?;
            }
            answer
        };
        if let Ok(stored) = &answer {
            self.dropped = dropped_fields(stored, record);
        }
        // The release that follows is conditional on the version the status write made.
        if let Some(version) = answer.as_ref().ok().and_then(|a| RawObject::parse(a).ok()?.meta.resource_version) {
            self.current.resource_version = version.to_string();
            self.versions.push(self.current.resource_version.clone());
        }
        Ok(answer)
    }

    /// A status merge-patched onto the object itself is stored only where the kind has no
    /// status subresource: with one (a CRD installed or upgraded since discovery), the API
    /// server drops it silently. The answer must show the status changed (to the record's, or
    /// to it with the schema's defaults); an answer with the status as it was means the write
    /// failed (retried; the kind's subresources are asked again first), and the object is
    /// neither counted restored nor released.
    fn check_stored(&self, stored: &str, record: &Record) -> Result<()> {
        let object = RawObject::parse(stored).map_err(|e| self.invalid(format!("answer to the status write: {e}")))?;
        let stored: Option<Value> = object.status().and_then(|s| serde_json::from_str(s.get()).ok());
        let stored = stored.filter(|s| !s.is_null() && s.as_object().is_none_or(|m| !m.is_empty()));
        let wanted: Option<Value> = serde_json::from_str(record.status.get()).ok();
        let unchanged = match (&self.current.status, &stored) {
            (None, None) => true,
            (Some(before), Some(now)) => before.same_value(now),
            _ => false,
        };
        if !unchanged || stored == wanted {
            return Ok(());
        }
        self.applier.writer.forget(self.kind);
        Err(Error::StatusNotStored {
            kind: self.kind.qualified_kind(),
            name: self.current.name.clone(),
            snapshot: self.applier.manifest.snapshot_id.to_string(),
        })
    }

    /// Re-reads the object after a conflict and decides again. The new verdict is kept. An
    /// object recreated under the same name for another machine (none of the record's keys)
    /// gets nothing: its status is another machine's business.
    async fn decide_again(&mut self, record: &Record) -> Result<Verdict> {
        let fresh = self.applier.writer.get(self.kind, &self.current).await?;
        let fresh = RawObject::parse(&fresh).map_err(|e| self.invalid(e.to_string()))?;
        let fresh = LiveObject::from_raw(self.kind, &fresh);
        let decision = if record.keys.iter().any(|k| fresh.keys.contains(k)) {
            let (manifest, force) = (self.applier.manifest, self.applier.force);
            let snapshot_time = manifest.comparable_time(jiff::Timestamp::now());
            plan::decide_from(&record.status, &fresh, &manifest.snapshot_id, snapshot_time, force)
        } else {
            let keys: Vec<String> = fresh.keys.iter().map(ToString::to_string).collect();
            let reason = format!(
                "recreated during the restore (uid {} -> {}) with none of the record's keys (now {})",
                self.current.uid,
                fresh.uid,
                keys.join(", ")
            );
            plan::Decision { verdict: Verdict::MissingOnTarget, reason, forced: false }
        };
        info!(object = %fresh.object_ref(), verdict = %decision.verdict, reason = %decision.reason, "object changed during the restore; decided again");
        // What restatus owns is what the object carries now.
        self.owns_ignore = fresh.quiesced_by_restatus();
        self.current = fresh;
        self.verdict = Some(decision.verdict);
        self.reason = Some(decision.reason);
        Ok(decision.verdict)
    }

    /// restatus's annotation changes on the object as last seen (null removes a key): the
    /// snapshot it was `restored` from, and the `release` of restatus's ignore.
    fn marks(&self, restored: bool, release: bool) -> serde_json::Map<String, Value> {
        let mut changes = serde_json::Map::new();
        if restored {
            changes.insert(RESTORED_FROM_ANNOTATION.into(), self.applier.manifest.snapshot_id.as_str().into());
        }
        if (self.refused && self.owns_ignore) || (restored && !self.dropped.is_empty()) {
            changes.insert(NOT_RESTORED_ANNOTATION.into(), self.applier.manifest.snapshot_id.as_str().into());
        }
        if release {
            changes.extend(annotations::release_annotations(&self.current.annotations));
        }
        changes
    }

    /// Writes restatus's marks (see [`WriteSequence::marks`]). Right after a status write
    /// through the subresource, `written` (its answer) is the object as stored: it is replaced
    /// with only its annotations changed, on that resourceVersion. Otherwise, or when the object
    /// changed since, the annotations alone are patched on the resourceVersion they were
    /// computed from; on a conflict the object is read again and the marks computed again, so
    /// an operation a person set meanwhile (a `park`, their own `ignore`) is never overwritten.
    async fn annotate(&mut self, written: Option<&str>, restored: bool, release: bool) -> Result<String> {
        let writer = self.applier.writer;
        let context = |current: &LiveObject| format!("annotate {}", current.object_ref());
        let mut stale = false;
        // The answer is in the version the status was written in: replaced in that one.
        let status_kind = self.status_kind.clone();
        let status_kind = status_kind.as_ref().unwrap_or(self.kind);
        if let Some(written) = written.filter(|_| writer.known_status_subresource(status_kind) == Some(true)) {
            let body = object::annotations_replaced(written, &self.marks(restored, release))
                .map_err(|e| self.invalid(format!("answer to the status write: {e}")))?;
            self.writes += 1;
            match writer.replace(status_kind, &self.current, None, body).await {
                Ok(answer) => return Ok(answer),
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    info!(object = %self.current.object_ref(), "object changed after its status was written; reading it again for the release");
                    stale = true;
                }
                Err(e) => return Err(Error::kube(context(&self.current), e)),
            }
        }
        for _ in 0..CONFLICT_RETRIES {
            if stale {
                let fresh = writer.get(self.kind, &self.current).await?;
                let fresh = RawObject::parse(&fresh).map_err(|e| self.invalid(e.to_string()))?;
                self.current = LiveObject::from_raw(self.kind, &fresh);
            }
            let body = json!({"metadata": {
                "uid": self.current.uid, "resourceVersion": self.current.resource_version,
                "annotations": self.marks(restored, release),
            }});
            self.writes += 1;
            match writer.merge_patch(self.kind, &self.current, None, &body).await {
                Ok(answer) => return Ok(answer),
                Err(kube::Error::Api(s)) if s.is_conflict() => stale = true,
                Err(e) => return Err(Error::kube(context(&self.current), e)),
            }
        }
        Err(Error::KeptChanging {
            kind: self.kind.qualified_kind(),
            name: self.current.name.clone(),
            attempts: CONFLICT_RETRIES,
        })
    }

    /// The Event of an object that needs attention: `StatusNotRestored` (the target refused
    /// it), `StatusPartlyRestored` (the schema dropped fields) or `StatusRestored` with why
    /// restatus keeps its `ignore` on the object.
    async fn event(&self, item: &PlanItem) {
        let (type_, reason, what) = match (self.refused, self.dropped.is_empty()) {
            (true, _) => (EventType::Warning, "StatusNotRestored", "status not restored from"),
            (false, false) => (EventType::Warning, "StatusPartlyRestored", "status restored in part from"),
            (false, true) => (EventType::Normal, "StatusRestored", "status restored from"),
        };
        let note = format!(
            "{what} snapshot {} ({}){}{}",
            self.applier.manifest.snapshot_id,
            self.reason.as_deref().unwrap_or(&item.reason),
            item.source.as_ref().map(|s| format!("; captured from {s}")).unwrap_or_default(),
            self.held.as_ref().map(|h| format!("; kept quiesced: {h}")).unwrap_or_default()
        );
        let note = events::note(note);
        let event =
            Event { type_, reason: reason.into(), note: Some(note), action: "RestoreStatus".into(), secondary: None };
        self.applier.writer.event(self.kind, &self.current, &event).await;
    }

    fn invalid(&self, reason: String) -> Error {
        Error::InvalidObject { kind: self.kind.qualified_kind(), name: self.current.name.clone(), reason }
    }
}

/// The fields of the record's status that the API server's answer (the object as stored)
/// lacks: what the served schema pruned. An answer that cannot be read drops nothing here
/// (the release reads it again).
fn dropped_fields(stored: &str, record: &Record) -> Vec<String> {
    let Ok(object) = RawObject::parse(stored) else { return vec![] };
    // The common case, without parsing either: stored as written, byte for byte (both API
    // servers write JSON the same way).
    if object.status().is_some_and(|s| s.get() == record.status.get()) {
        return vec![];
    }
    let Ok(written) = serde_json::from_str::<Value>(record.status.get()) else { return vec![] };
    let stored: Option<Value> = object.status().and_then(|s| serde_json::from_str(s.get()).ok());
    status::dropped_fields(&written, stored.as_ref(), DROPPED_SHOWN)
}

/// The status subresource's new content: exactly the record's status (its raw JSON, as
/// is), on the resourceVersion the decision was made on. The API server takes nothing
/// else from a status replace.
fn status_replacement(kind: &KindProfile, current: &LiveObject, record: &Record) -> serde_json::Result<String> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta<'a> {
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        namespace: Option<&'a str>,
        uid: &'a str,
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
            uid: &current.uid,
            resource_version: &current.resource_version,
        },
        status: &record.status,
    };
    serde_json::to_string(&replacement)
}

/// For a kind without a status subresource: the merge patch of the object that leaves
/// exactly the record's status, with the resourceVersion precondition. The record's raw
/// JSON is carried as is when the live status is empty.
fn status_patch(current: &LiveObject, record: &Record) -> serde_json::Result<Box<RawValue>> {
    let status = match current.status_value() {
        None => record.status.clone(),
        Some(live) => {
            let wanted: Value = serde_json::from_str(record.status.get())?;
            serde_json::value::to_raw_value(&status::status_patch(Some(&live), &wanted))?
        }
    };
    let version = serde_json::to_string(&current.resource_version)?;
    let body = format!(r#"{{"metadata":{{"resourceVersion":{version}}},"status":{}}}"#, status.get());
    RawValue::from_string(body)
}

#[cfg(test)]
mod tests {
    //! The apply step's writes against a scripted API server (tower-test): what each request
    //! carries, and what happens when the object changed between two writes. That the writes
    //! restore real objects is shown end to end on the test bed (e2e/restore.rs).

    use std::future::Future;

    use http::{Method, StatusCode};

    use super::*;
    use crate::domain::annotations::{
        OPERATION_ANNOTATION, OPERATION_IGNORE, OPERATION_WAS_ANNOTATION, QUIESCED_BY_ANNOTATION,
    };
    use crate::domain::pairing::{ClaimView, ServerView};
    use crate::fixtures::api::{self, Handle, answer, conflict, echo};
    use crate::fixtures::{SNAPSHOT_TIME, key, live, manifest, record, ts, uuid};
    use crate::restore::hold::Seen;

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

    /// Restores `server-1`, which arrives bare (resourceVersion 1), while `script` plays the
    /// API server; the script's assertions fail the test.
    async fn restore_one<F, Fut>(script: F) -> Outcome
    where
        F: FnOnce(Handle) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        restore_one_with(wanted(), script).await
    }

    /// [`restore_one`] from a record whose status is `recorded`.
    async fn restore_one_with<F, Fut>(recorded: Value, script: F) -> Outcome
    where
        F: FnOnce(Handle) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        restore_one_by(|client| Writer::scripted(client, &["Server"]), recorded, script).await
    }

    /// [`restore_one_with`] through the writer `writer` makes of the scripted client.
    async fn restore_one_by<F, Fut>(writer: impl FnOnce(kube::Client) -> Writer, recorded: Value, script: F) -> Outcome
    where
        F: FnOnce(Handle) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        restore_record(writer, record("Server", "server-1", &[uuid("uuid-1")], recorded), script).await
    }

    /// [`restore_one_by`] from `record`.
    async fn restore_record<F, Fut>(writer: impl FnOnce(kube::Client) -> Writer, record: Record, script: F) -> Outcome
    where
        F: FnOnce(Handle) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        restore_knowing(writer, record, None, script).await
    }

    /// [`restore_record`] by an applier that knows the pairing as `known` says.
    async fn restore_knowing<F, Fut>(
        writer: impl FnOnce(kube::Client) -> Writer,
        record: Record,
        known: Option<&Seen>,
        script: F,
    ) -> Outcome
    where
        F: FnOnce(Handle) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (client, handle) = api::client();
        let api_server = tokio::spawn(script(handle));
        let profile = Profile::metal_operator();
        let kind = profile.kind("Server").unwrap();
        let writer = writer(client);
        let manifest = manifest(SNAPSHOT.parse().unwrap(), ts(SNAPSHOT_TIME));
        let records = Records::from_records(vec![record]);
        let live = LiveObject { uid: "u-1".into(), ..live("Server", "server-1", &[uuid("uuid-1")], None) };
        let mut applier = Applier::new(&writer, &profile, &manifest, &records, false);
        if let Some(known) = known {
            applier = applier.with_partners(Partners::listed(&records, Some(known)));
        }
        let item = PlanItem {
            kind: "Server".into(),
            verdict: Verdict::Restore,
            key: Some(uuid("uuid-1").to_string()),
            target: Some(live.object_ref()),
            source: Some(records.head(0).unwrap().object_ref()),
            reason: "live status is empty".into(),
            forced: false,
            changes: vec![],
            release: false,
            record: Some(0),
            live: Some(0),
        };
        let outcome = applier.apply_item(kind, &item, std::slice::from_ref(&live)).await;
        drop(writer); // the script's next_request() ends instead of waiting for a request that never comes
        api_server.await.expect("the scripted API server saw what it expected");
        outcome
    }

    /// Quiesce (patch), status (replace of the subresource): the same in every test below.
    async fn quiesce_and_replace_status(api: &mut Handle) {
        let (method, path, body) = answer(api, StatusCode::OK, server("2", quiesced(), json!({}))).await;
        assert_eq!((method, path.as_str()), (Method::PATCH, SERVER));
        assert_eq!(
            body,
            json!({"metadata": {"uid": "u-1", "resourceVersion": "1", "annotations": annotations::quiesce_annotations(&Default::default())}})
        );

        let (method, path, body) = answer(api, StatusCode::OK, server("3", quiesced(), wanted())).await;
        assert_eq!((method, path.as_str()), (Method::PUT, format!("{SERVER}/status").as_str()));
        let expected = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
                              "metadata": {"name": "server-1", "uid": "u-1", "resourceVersion": "2"}, "status": wanted()});
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
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error), (Verdict::Restore, 3, None));
        assert_eq!(outcome.versions, ["2", "3", "4"], "the versions its writes made: their watch events are echoes");
        let Some(View::Server(after)) = outcome.after else { panic!("no pairing view: {:?}", outcome.after) };
        assert_eq!(after.state, "Reserved");
    }

    /// Issue 22, item 3: a bound Server whose claim the controller's watches saw is released
    /// without looking the claim up (three requests); one whose claim they have not seen is
    /// looked up as without them, and held when it is not there.
    #[tokio::test]
    async fn a_bound_server_whose_claim_was_seen_is_released_without_a_look_up() {
        let known = Seen::default();
        let writer = |client| Writer::scripted(client, &["Server"]);
        let recorded = || record("Server", "server-1", &[uuid("uuid-1")], wanted());
        let outcome = restore_knowing(writer, recorded(), Some(&known), |mut api| async move {
            quiesce_and_replace_status(&mut api).await;
            claim_lookup(&mut api, StatusCode::NOT_FOUND).await;
            let (method, path, _) = answer(&mut api, StatusCode::OK, server("4", quiesced(), wanted())).await;
            assert_eq!((method, path.as_str()), (Method::PUT, SERVER));
            assert_eq!(echo(&mut api).await, (Method::POST, EVENTS.to_string()));
        })
        .await;
        assert_eq!(outcome.held.as_deref(), Some("waits for ServerClaim a/claim-1"), "not seen: looked up");

        let claim = ClaimView { namespace: "a".into(), name: "claim-1".into(), phase: String::new(), server: None };
        known.add(View::Claim(claim));
        let outcome = restore_knowing(writer, recorded(), Some(&known), |mut api| async move {
            quiesce_and_replace_status(&mut api).await;
            let released = json!({"user": "kept", RESTORED_FROM_ANNOTATION: snapshot_id()});
            let (method, path, _) = answer(&mut api, StatusCode::OK, server("4", released, wanted())).await;
            assert_eq!((method, path.as_str()), (Method::PUT, SERVER), "released, no look-up first");
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error, outcome.held), (Verdict::Restore, 3, None, None));
    }

    #[tokio::test]
    async fn a_release_whose_object_changed_since_the_status_write_patches_the_annotations() {
        let outcome = restore_one(|mut api| async move {
            quiesce_and_replace_status(&mut api).await;
            claim_lookup(&mut api, StatusCode::OK).await;
            let (method, path, _) = answer(&mut api, StatusCode::CONFLICT, conflict()).await;
            assert_eq!((method, path.as_str()), (Method::PUT, SERVER));
            let mut meanwhile = quiesced();
            meanwhile["added"] = "meanwhile".into();
            let (method, path, _) = answer(&mut api, StatusCode::OK, server("4", meanwhile, wanted())).await;
            assert_eq!((method, path.as_str()), (Method::GET, SERVER), "read again before the release");
            let released = json!({"user": "kept", "added": "meanwhile", RESTORED_FROM_ANNOTATION: snapshot_id()});
            let (method, path, body) = answer(&mut api, StatusCode::OK, server("5", released, wanted())).await;
            assert_eq!((method, path.as_str()), (Method::PATCH, SERVER));
            let expected = json!({"metadata": {"uid": "u-1", "resourceVersion": "4", "annotations": {
                OPERATION_ANNOTATION: null, QUIESCED_BY_ANNOTATION: null, OPERATION_WAS_ANNOTATION: null,
                RESTORED_FROM_ANNOTATION: snapshot_id()}}});
            assert_eq!(body, expected, "the annotations alone, on the version read, whatever else changed");
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error), (Verdict::Restore, 4, None));
    }

    #[tokio::test]
    async fn a_release_never_overwrites_an_operation_a_person_set_after_the_status_write() {
        let outcome = restore_one(|mut api| async move {
            quiesce_and_replace_status(&mut api).await;
            claim_lookup(&mut api, StatusCode::OK).await;
            let (method, _, _) = answer(&mut api, StatusCode::CONFLICT, conflict()).await;
            assert_eq!(method, Method::PUT);
            // Between the status write and the release, a person parks the machine.
            let mut parked = quiesced();
            parked[OPERATION_ANNOTATION] = "park".into();
            let (method, _, _) = answer(&mut api, StatusCode::OK, server("4", parked.clone(), wanted())).await;
            assert_eq!(method, Method::GET);
            // The conditional patch loses to another change: read again, decide again.
            let (method, _, body) = answer(&mut api, StatusCode::CONFLICT, conflict()).await;
            assert_eq!((method, &body["metadata"]["resourceVersion"]), (Method::PATCH, &json!("4")));
            let (method, _, _) = answer(&mut api, StatusCode::OK, server("6", parked, wanted())).await;
            assert_eq!(method, Method::GET);
            let (method, _, body) = answer(&mut api, StatusCode::OK, server("7", json!({}), wanted())).await;
            assert_eq!(method, Method::PATCH);
            let expected = json!({"metadata": {"uid": "u-1", "resourceVersion": "6", "annotations": {
                QUIESCED_BY_ANNOTATION: null, OPERATION_WAS_ANNOTATION: null, RESTORED_FROM_ANNOTATION: snapshot_id()}}});
            assert_eq!(body, expected, "the park stays; only restatus's marks go");
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error), (Verdict::Restore, 5, None));
    }

    /// Restores `a/claim-1` Bound (its `spec.serverRef` names `server-1`), the API server
    /// answering the look-up of its Server with `server`; the claim is then released or kept
    /// quiesced as `released` says. Returns the outcome.
    async fn restore_claim(server: (StatusCode, String), released: bool) -> Outcome {
        restore_claim_knowing(Some(server), released, None).await
    }

    /// [`restore_claim`] by an applier that knows the pairing as `known` says; `server: None`:
    /// its Server is not looked up.
    async fn restore_claim_knowing(
        server: Option<(StatusCode, String)>,
        released: bool,
        known: Option<&Seen>,
    ) -> Outcome {
        let claim = |rv: &str, annotations: Value, status: Value| {
            json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim",
                   "metadata": {"name": "claim-1", "namespace": "a", "uid": "u-c", "resourceVersion": rv,
                                "annotations": annotations},
                   "spec": {"serverRef": {"name": "server-1"}}, "status": status})
            .to_string()
        };
        let bound = json!({"phase": "Bound"});
        let (client, handle) = api::client();
        let script = tokio::spawn({
            let bound = bound.clone();
            async move {
                let mut api = handle;
                let (method, path, _) = answer(&mut api, StatusCode::OK, claim("2", quiesced(), json!({}))).await;
                assert_eq!((method, path.as_str()), (Method::PATCH, CLAIM), "quiesce");
                let (method, path, _) = answer(&mut api, StatusCode::OK, claim("3", quiesced(), bound)).await;
                assert_eq!((method, path.as_str()), (Method::PUT, format!("{CLAIM}/status").as_str()));
                if let Some(server) = server {
                    let (method, path, _) = answer(&mut api, server.0, server.1).await;
                    assert_eq!((method, path.as_str()), (Method::GET, SERVER), "its Server is looked up");
                }
                let (method, _, body) = answer(&mut api, StatusCode::OK, claim("4", json!({}), json!({}))).await;
                assert_eq!(method, Method::PUT, "marked restored");
                let annotations = &body["metadata"]["annotations"];
                assert_eq!(annotations[RESTORED_FROM_ANNOTATION], snapshot_id(), "{annotations}");
                if released {
                    assert_eq!(annotations.get(QUIESCED_BY_ANNOTATION), None, "released: {annotations}");
                    assert_eq!(annotations.get(OPERATION_ANNOTATION), None, "released: {annotations}");
                } else {
                    assert_eq!(annotations[QUIESCED_BY_ANNOTATION], "restatus", "held: {annotations}");
                    assert_eq!(annotations[OPERATION_ANNOTATION], OPERATION_IGNORE, "held: {annotations}");
                    // Kept quiesced: an Event of its own says why (a plain restore has none).
                    let (method, path, body) = answer(&mut api, StatusCode::OK, "{}".into()).await;
                    assert_eq!((method, path.as_str()), (Method::POST, "/apis/events.k8s.io/v1/namespaces/a/events"));
                    assert!(body["note"].as_str().is_some_and(|n| n.contains("; kept quiesced: waits for")), "{body}");
                }
            }
        });
        let writer = Writer::scripted(client, &["ServerClaim"]);
        let profile = Profile::metal_operator();
        let kind = profile.kind("ServerClaim").unwrap();
        let manifest = manifest(SNAPSHOT.parse().unwrap(), ts(SNAPSHOT_TIME));
        let mut recorded =
            record("ServerClaim", "claim-1", &[key(crate::domain::identity::NAMESPACED_NAME, "a/claim-1")], bound);
        recorded.namespace = Some("a".into());
        let records = Records::from_records(vec![recorded]);
        let mut object =
            live("ServerClaim", "claim-1", &[key(crate::domain::identity::NAMESPACED_NAME, "a/claim-1")], None);
        object.namespace = Some("a".into());
        object.uid = "u-c".into();
        let mut applier = Applier::new(&writer, &profile, &manifest, &records, false);
        if let Some(known) = known {
            applier = applier.with_partners(Partners::listed(&records, Some(known)));
        }
        let plan = plan::plan(&plan::PlanInput {
            profile: &profile,
            snapshot: &manifest.snapshot_id,
            snapshot_time: Some(ts(SNAPSHOT_TIME)),
            records: &records,
            live: std::slice::from_ref(&object),
            force: false,
            explain: false,
        })
        .unwrap();
        let outcome = applier.apply_item(kind, &plan.items[0], std::slice::from_ref(&object)).await;
        drop(writer);
        script.await.expect("the scripted API server saw what it expected");
        assert_eq!((outcome.verdict, outcome.error.as_deref()), (Verdict::Restore, None));
        outcome
    }

    /// Issue 21, item 4 (F58): a ServerClaim restored Bound before its Server arrived stays
    /// quiesced ("waits for Server …"); the controller tries it again when a Server appears.
    #[tokio::test]
    async fn a_claim_restored_before_its_server_arrives_stays_quiesced() {
        let outcome = restore_claim((StatusCode::NOT_FOUND, not_found("server-1")), false).await;
        assert_eq!(outcome.held.as_deref(), Some("waits for Server server-1"));
    }

    /// Issue 21, item 4: a Bound claim whose Server is there but not `Reserved` for it (bare,
    /// as clusterctl creates it, or Reserved for another claim) stays quiesced, saying so; once
    /// the Server is Reserved for it (restored by restatus, even while held itself for the
    /// claim), the claim is released.
    #[tokio::test]
    async fn a_bound_claim_is_released_only_once_its_server_is_reserved_for_it() {
        let server_as = |state: Value, claim: Value| {
            let mut server: Value = serde_json::from_str(&server("5", quiesced(), state)).unwrap();
            server["spec"]["serverClaimRef"] = claim;
            (StatusCode::OK, server.to_string())
        };
        let ours = json!({"namespace": "a", "name": "claim-1"});
        let outcome = restore_claim(server_as(Value::Null, ours.clone()), false).await;
        let held = outcome.held.expect("held while its Server is bare");
        assert!(held.starts_with("waits for Server server-1 to be Reserved for it"), "{held}");
        let outcome =
            restore_claim(server_as(json!({"state": "Reserved"}), json!({"namespace": "a", "name": "other"})), false)
                .await;
        let held = outcome.held.expect("held while its Server is Reserved for another claim");
        assert!(held.contains("spec.serverClaimRef a/other"), "{held}");
        let outcome = restore_claim(server_as(json!({"state": "Available"}), Value::Null), false).await;
        assert!(outcome.held.expect("held while its Server is Available").contains("\"Available\""));
        // Restored Reserved for the claim, and still held by restatus (quiesced) for the claim.
        let outcome = restore_claim(server_as(json!({"state": "Reserved"}), ours), true).await;
        assert_eq!(outcome.held, None);
    }

    /// Issue 22, item 3: a Bound claim whose Server the controller's watches last saw Reserved
    /// for it is released without looking the Server up; one they saw Reserved for another
    /// claim, or not at all, is looked up as without them.
    #[tokio::test]
    async fn a_claim_whose_server_was_seen_reserved_for_it_is_released_without_a_look_up() {
        let known = Seen::default();
        let seen = |claim: (&str, &str)| {
            let claim = Some((claim.0.to_string(), claim.1.to_string()));
            View::Server(ServerView { name: "server-1".into(), state: "Reserved".into(), claim })
        };
        known.add(seen(("a", "other")));
        let ours = {
            let mut server: Value =
                serde_json::from_str(&server("5", quiesced(), json!({"state": "Reserved"}))).unwrap();
            server["spec"]["serverClaimRef"] = json!({"namespace": "a", "name": "claim-1"});
            (StatusCode::OK, server.to_string())
        };
        let outcome = restore_claim_knowing(Some(ours), true, Some(&known)).await;
        assert_eq!(outcome.held, None, "seen Reserved for another: looked up, and Reserved for it by now");
        known.add(seen(("a", "claim-1")));
        let outcome = restore_claim_knowing(None, true, Some(&known)).await;
        assert_eq!((outcome.held, outcome.writes), (None, 3), "no look-up");
    }

    /// Issue 21, item 4: a BMC's Servers are found by identity. The snapshot holds
    /// `bmc-1-system-0` for bmc-1; on the target that machine's Server is `renamed` (the same
    /// systemUUID): bmc-1 is held for a person with a reason that names both (released,
    /// metal-operator would create `bmc-1-system-0` again for the same machine), not left
    /// waiting for a Server that is not coming. The target's Servers are listed once a restore:
    /// bmc-2, whose Server is nowhere, is then held after a look-up by name, without a second
    /// listing.
    #[tokio::test]
    async fn a_bmcs_server_under_another_name_holds_it_with_why_and_servers_are_listed_once() {
        const BMCS: &str = "/apis/metal.ironcore.dev/v1alpha1/bmcs";
        let bmc = |name: &str, rv: &str, annotations: Value, status: Value| {
            json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "BMC",
                   "metadata": {"name": name, "uid": format!("u-{name}"), "resourceVersion": rv, "annotations": annotations},
                   "spec": {"bmcUUID": format!("b-{name}")}, "status": status})
            .to_string()
        };
        let ready = json!({"state": "Enabled", "powerState": "On"});
        let (client, handle) = api::client();
        let script = tokio::spawn({
            let ready = ready.clone();
            async move {
                let mut api = handle;
                for (name, found) in [("bmc-1", true), ("bmc-2", false)] {
                    let path = format!("{BMCS}/{name}");
                    let (method, at, _) = answer(&mut api, StatusCode::OK, bmc(name, "2", quiesced(), json!({}))).await;
                    assert_eq!((method, at.as_str()), (Method::PATCH, path.as_str()), "quiesce");
                    let (method, at, _) =
                        answer(&mut api, StatusCode::OK, bmc(name, "3", quiesced(), ready.clone())).await;
                    assert_eq!((method, at), (Method::PUT, format!("{path}/status")));
                    if found {
                        let (method, at, _) =
                            answer(&mut api, StatusCode::OK, api::server_page(&["renamed"], "", None)).await;
                        assert_eq!(
                            (method, at.as_str()),
                            (Method::GET, "/apis/metal.ironcore.dev/v1alpha1/servers"),
                            "listed"
                        );
                    } else {
                        let (method, at, _) =
                            answer(&mut api, StatusCode::NOT_FOUND, not_found("bmc-2-system-0")).await;
                        assert_eq!(
                            (method, at.as_str()),
                            (Method::GET, "/apis/metal.ironcore.dev/v1alpha1/servers/bmc-2-system-0"),
                            "looked up by name, not listed again"
                        );
                    }
                    let (method, at, body) =
                        answer(&mut api, StatusCode::OK, bmc(name, "4", json!({}), ready.clone())).await;
                    assert_eq!((method, at.as_str()), (Method::PUT, path.as_str()));
                    let annotations = &body["metadata"]["annotations"];
                    assert!(annotations.get(QUIESCED_BY_ANNOTATION).is_some(), "{name} stays held: {annotations}");
                    assert_eq!(echo(&mut api).await.0, Method::POST);
                }
            }
        });
        let writer = Writer::scripted(client, &["BMC"]);
        let profile = Profile::metal_operator();
        let kind = profile.kind("BMC").unwrap();
        let manifest = manifest(SNAPSHOT.parse().unwrap(), ts(SNAPSHOT_TIME));
        let bmc_key = |name: &str| key("spec.bmcUUID", &format!("b-{name}"));
        let records = Records::from_records(vec![
            record("BMC", "bmc-1", &[bmc_key("bmc-1")], ready.clone()),
            record("BMC", "bmc-2", &[bmc_key("bmc-2")], ready.clone()),
            record("Server", "bmc-1-system-0", &[uuid("uuid-renamed")], json!({"state": "Reserved"})),
            record("Server", "bmc-2-system-0", &[uuid("uuid-gone")], json!({"state": "Reserved"})),
        ]);
        let objects: Vec<LiveObject> = ["bmc-1", "bmc-2"]
            .map(|name| LiveObject { uid: format!("u-{name}"), ..live("BMC", name, &[bmc_key(name)], None) })
            .into();
        let applier = Applier::new(&writer, &profile, &manifest, &records, false);
        let plan = plan::plan(&plan::PlanInput {
            profile: &profile,
            snapshot: &manifest.snapshot_id,
            snapshot_time: Some(ts(SNAPSHOT_TIME)),
            records: &records,
            live: &objects,
            force: false,
            explain: false,
        })
        .unwrap();
        let mut held = vec![];
        for name in ["bmc-1", "bmc-2"] {
            let item = plan.items.iter().find(|i| i.target.as_ref().is_some_and(|t| t.name == name)).unwrap();
            let outcome = applier.apply_item(kind, item, &objects).await;
            assert_eq!((outcome.verdict, outcome.error.as_deref()), (Verdict::Restore, None), "{name}");
            held.push(outcome.held);
        }
        drop(writer);
        script.await.expect("the scripted API server saw what it expected");
        let renamed = held[0].as_deref().unwrap_or_default();
        assert!(
            renamed.starts_with("its Server bmc-1-system-0 is on the target as renamed (spec.systemUUID=uuid-renamed)"),
            "{renamed}"
        );
        assert_eq!(held[1].as_deref(), Some("waits for Server bmc-2-system-0"));
    }

    /// [`Writer::scripted`], the usual one.
    fn scripted(client: kube::Client) -> Writer {
        Writer::scripted(client, &["Server"])
    }

    /// A record of `server-1` captured in `api_version`.
    fn record_in(api_version: &str) -> Record {
        Record { api_version: api_version.into(), ..record("Server", "server-1", &[uuid("uuid-1")], wanted()) }
    }

    fn not_found(what: &str) -> String {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
               "message": format!("{what} not found")})
        .to_string()
    }

    /// F60: a record captured in a version the target does not serve (the CRD moved on to
    /// another) is not written in the profile's version, where the schema would prune or refuse
    /// it: the object gets `incompatible` and why, untouched (it was not quiesced), and an Event.
    #[tokio::test]
    async fn a_record_of_a_version_the_target_does_not_serve_is_incompatible_and_nothing_is_written() {
        let outcome = restore_record(scripted, record_in("metal.ironcore.dev/v1beta9"), |mut api| async move {
            let (method, path, _) = answer(&mut api, StatusCode::NOT_FOUND, not_found("v1beta9")).await;
            assert_eq!((method, path.as_str()), (Method::GET, "/apis/metal.ironcore.dev/v1beta9"));
            let (method, path, body) = answer(&mut api, StatusCode::OK, "{}".into()).await;
            assert_eq!((method, path.as_str()), (Method::POST, EVENTS));
            assert_eq!(body["reason"], "StatusNotRestored");
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error), (Verdict::Incompatible, 0, None));
        let reason = outcome.reason.unwrap();
        assert!(reason.contains("captured as metal.ironcore.dev/v1beta9"), "{reason}");
    }

    /// A record captured in another version the target still serves is written in that
    /// version (the API server converts it), and released in it.
    #[tokio::test]
    async fn a_record_of_another_served_version_is_written_in_its_own_version() {
        const V1BETA1: &str = "/apis/metal.ironcore.dev/v1beta1/servers/server-1";
        let outcome = restore_record(scripted, record_in("metal.ironcore.dev/v1beta1"), |mut api| async move {
            let (method, path, _) = answer(&mut api, StatusCode::OK, discovery_of("v1beta1", true)).await;
            assert_eq!((method, path.as_str()), (Method::GET, "/apis/metal.ironcore.dev/v1beta1"));
            let (method, path, _) = answer(&mut api, StatusCode::OK, server("2", quiesced(), json!({}))).await;
            assert_eq!((method, path.as_str()), (Method::PATCH, SERVER), "quiesce, in the profile's version");
            let stored = server("3", quiesced(), wanted()).replace("v1alpha1", "v1beta1");
            let (method, path, body) = answer(&mut api, StatusCode::OK, stored).await;
            assert_eq!((method, path.as_str()), (Method::PUT, format!("{V1BETA1}/status").as_str()));
            assert_eq!(body["apiVersion"], "metal.ironcore.dev/v1beta1");
            claim_lookup(&mut api, StatusCode::OK).await;
            let released = json!({"user": "kept", RESTORED_FROM_ANNOTATION: snapshot_id()});
            let (method, path, body) = answer(&mut api, StatusCode::OK, server("4", released, wanted())).await;
            assert_eq!((method, path.as_str()), (Method::PUT, V1BETA1), "the release replaces the answer as it came");
            assert_eq!(body["apiVersion"], "metal.ironcore.dev/v1beta1");
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error, outcome.reason), (Verdict::Restore, 3, None, None));
    }

    /// F61: the served schema refuses the record's status (422): the object is released with
    /// the mark that keeps the same snapshot from trying again, and gets `incompatible`.
    #[tokio::test]
    async fn a_status_the_schema_refuses_is_incompatible_and_released_with_a_mark() {
        let outcome = restore_one(|mut api| async move {
            let (method, _, _) = answer(&mut api, StatusCode::OK, server("2", quiesced(), json!({}))).await;
            assert_eq!(method, Method::PATCH, "quiesce");
            let invalid = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid",
                                 "code": 422, "message": "Server.metal.ironcore.dev \"server-1\" is invalid: status.state: Unsupported value: \"Reserved\""});
            let (method, path, _) = answer(&mut api, StatusCode::UNPROCESSABLE_ENTITY, invalid.to_string()).await;
            assert_eq!((method, path.as_str()), (Method::PUT, format!("{SERVER}/status").as_str()));
            let (method, path, body) = answer(&mut api, StatusCode::OK, server("3", json!({}), json!({}))).await;
            assert_eq!((method, path.as_str()), (Method::PATCH, SERVER), "release");
            let mut marks = annotations::release_annotations(&quiesced().as_object().unwrap().iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string())).collect());
            marks.insert(NOT_RESTORED_ANNOTATION.into(), snapshot_id().into());
            assert_eq!(body, json!({"metadata": {"uid": "u-1", "resourceVersion": "2", "annotations": marks}}));
            let (method, _, body) = answer(&mut api, StatusCode::OK, "{}".into()).await;
            assert_eq!((method, body["reason"].as_str()), (Method::POST, Some("StatusNotRestored")));
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error), (Verdict::Incompatible, 3, None));
        assert!(outcome.reason.unwrap().contains("Unsupported value"));
    }

    /// F61 when the plan saw the object before its mark: the write conflicts, and the re-read
    /// object carries the snapshot's `not-restored-from` (another pass refused it and released
    /// it meanwhile). It is decided again as the plan would: `incompatible`, nothing more
    /// written (before, it was quiesced, refused and released once more).
    #[tokio::test]
    async fn an_object_refused_meanwhile_is_not_quiesced_again_after_a_conflict() {
        let outcome = restore_one(|mut api| async move {
            let (method, _, _) = answer(&mut api, StatusCode::CONFLICT, conflict()).await;
            assert_eq!(method, Method::PATCH, "quiesce, on the version the plan saw");
            let refused = json!({NOT_RESTORED_ANNOTATION: snapshot_id()});
            let (method, path, _) = answer(&mut api, StatusCode::OK, server("5", refused, json!({}))).await;
            assert_eq!((method, path.as_str()), (Method::GET, SERVER), "read again");
            // Nothing more: no quiesce, no release, no Event.
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error), (Verdict::Incompatible, 1, None));
    }

    /// F61: fields the served schema prunes are named: the status is restored in part, the
    /// object released with both marks, and the Event is a warning.
    #[tokio::test]
    async fn fields_the_schema_prunes_are_named_and_the_restore_is_partial() {
        let outcome = restore_one(|mut api| async move {
            let (method, _, _) = answer(&mut api, StatusCode::OK, server("2", quiesced(), json!({}))).await;
            assert_eq!(method, Method::PATCH, "quiesce");
            let pruned = json!({"state": "Reserved"});
            let (method, _, _) = answer(&mut api, StatusCode::OK, server("3", quiesced(), pruned.clone())).await;
            assert_eq!(method, Method::PUT, "status");
            claim_lookup(&mut api, StatusCode::OK).await;
            let (method, path, body) = answer(&mut api, StatusCode::OK, server("4", json!({}), pruned)).await;
            assert_eq!((method, path.as_str()), (Method::PUT, SERVER), "release");
            let annotations = &body["metadata"]["annotations"];
            assert_eq!(annotations[RESTORED_FROM_ANNOTATION], snapshot_id());
            assert_eq!(annotations[NOT_RESTORED_ANNOTATION], snapshot_id());
            let (method, _, body) = answer(&mut api, StatusCode::OK, "{}".into()).await;
            assert_eq!(
                (method, body["reason"].as_str(), body["type"].as_str()),
                (Method::POST, Some("StatusPartlyRestored"), Some("Warning"))
            );
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error), (Verdict::Restore, 3, None));
        let reason = outcome.reason.unwrap();
        assert!(reason.contains("status.networkInterfaces"), "{reason}");
    }

    /// The metal-operator group's discovery, with or without `servers/status`.
    fn discovery(status: bool) -> String {
        discovery_of("v1alpha1", status)
    }

    /// The metal-operator group's discovery at `version`, with or without `servers/status`.
    fn discovery_of(version: &str, status: bool) -> String {
        let mut resources = vec![
            json!({"name": "servers", "singularName": "server", "namespaced": false, "kind": "Server", "verbs": ["get"]}),
        ];
        if status {
            resources.push(json!({"name": "servers/status", "singularName": "", "namespaced": false, "kind": "Server", "verbs": ["update"]}));
        }
        let group_version = format!("metal.ironcore.dev/{version}");
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
            .to_string()
    }

    /// F55: a kind whose CRD was not served when the writer asked (installed after restatus
    /// started) is asked about again before its first write, and gets its status through the
    /// subresource.
    #[tokio::test]
    async fn a_kind_not_known_when_the_writer_started_is_asked_about_before_its_first_write() {
        let undiscovered = |client| {
            let writer = Writer::scripted(client, &[]);
            writer.forget(Profile::metal_operator().kind("Server").unwrap());
            writer
        };
        let outcome = restore_one_by(undiscovered, wanted(), |mut api| async move {
            let (method, _, _) = answer(&mut api, StatusCode::OK, server("2", quiesced(), json!({}))).await;
            assert_eq!(method, Method::PATCH, "quiesce");
            let (method, path, _) = answer(&mut api, StatusCode::OK, discovery(true)).await;
            assert_eq!((method, path.as_str()), (Method::GET, "/apis/metal.ironcore.dev/v1alpha1"));
            let (method, path, _) = answer(&mut api, StatusCode::OK, server("3", quiesced(), wanted())).await;
            assert_eq!((method, path.as_str()), (Method::PUT, format!("{SERVER}/status").as_str()));
            claim_lookup(&mut api, StatusCode::OK).await;
            let released = json!({"user": "kept", RESTORED_FROM_ANNOTATION: snapshot_id()});
            let (method, _, _) = answer(&mut api, StatusCode::OK, server("4", released, wanted())).await;
            assert_eq!(method, Method::PUT, "release");
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error), (Verdict::Restore, 3, None));
    }

    /// F55: a status merge-patched onto the object that the API server did not store (the kind
    /// gained a status subresource since discovery) is an error, not a restore: no release, no
    /// Event (the controller retried such a "restored" object about 1,400 times in 90 s), and
    /// the kind is asked about again on the next try.
    #[tokio::test]
    async fn a_status_the_api_server_did_not_store_is_an_error_and_not_a_restore() {
        let (client, handle) = api::client();
        let script = tokio::spawn(async move {
            let mut api = handle;
            let (method, _, _) = answer(&mut api, StatusCode::OK, server("2", quiesced(), json!({}))).await;
            assert_eq!(method, Method::PATCH, "quiesce");
            // The status merge patch: the answer is the object without the status written.
            let (method, path, body) = answer(&mut api, StatusCode::OK, server("3", quiesced(), Value::Null)).await;
            assert_eq!((method, path.as_str()), (Method::PATCH, SERVER));
            assert_eq!(body["status"], wanted());
            // Nothing more: no release, no Event.
        });
        let writer = Writer::scripted(client, &[]);
        let profile = Profile::metal_operator();
        let kind = profile.kind("Server").unwrap();
        let manifest = manifest(SNAPSHOT.parse().unwrap(), ts(SNAPSHOT_TIME));
        let records = Records::from_records(vec![record("Server", "server-1", &[uuid("uuid-1")], wanted())]);
        let live = LiveObject { uid: "u-1".into(), ..live("Server", "server-1", &[uuid("uuid-1")], None) };
        let applier = Applier::new(&writer, &profile, &manifest, &records, false);
        let plan = plan::plan(&plan::PlanInput {
            profile: &profile,
            snapshot: &manifest.snapshot_id,
            snapshot_time: Some(ts(SNAPSHOT_TIME)),
            records: &records,
            live: std::slice::from_ref(&live),
            force: false,
            explain: false,
        })
        .unwrap();
        let outcome = applier.apply_item(kind, &plan.items[0], std::slice::from_ref(&live)).await;
        script.await.expect("the scripted API server saw what it expected");
        assert_eq!(outcome.writes, 2);
        let error = outcome.error.expect("an error");
        assert!(error.contains("server-1") && error.contains("was not stored"), "{error}");
        assert_eq!(writer.known_status_subresource(kind), None, "asked again before the next write");
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
            let release =
                json!({OPERATION_ANNOTATION: null, QUIESCED_BY_ANNOTATION: null, OPERATION_WAS_ANNOTATION: null});
            assert_eq!(body, json!({"metadata": {"uid": "u-1", "resourceVersion": "3", "annotations": release}}));
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error), (Verdict::SkipNewer, 3, None));
    }

    #[tokio::test]
    async fn an_object_recreated_for_another_machine_between_plan_and_write_is_left_untouched() {
        let outcome = restore_one(|mut api| async move {
            let (method, _, _) = answer(&mut api, StatusCode::OK, server("2", quiesced(), json!({}))).await;
            assert_eq!(method, Method::PATCH);
            let (method, _, _) = answer(&mut api, StatusCode::CONFLICT, conflict()).await;
            assert_eq!(method, Method::PUT);
            let other = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
                "metadata": {"name": "server-1", "uid": "u-2", "resourceVersion": "9"},
                "spec": {"systemUUID": "OTHER-MACHINE"}});
            let (method, path, _) = answer(&mut api, StatusCode::OK, other.to_string()).await;
            assert_eq!((method, path.as_str()), (Method::GET, SERVER));
            // Nothing more: no status, no release of annotations restatus did not set there.
        })
        .await;
        assert_eq!((outcome.verdict, outcome.writes, outcome.error), (Verdict::MissingOnTarget, 2, None));
        let reason = outcome.reason.expect("a reason");
        assert!(
            reason.contains("recreated") && reason.contains("u-1 -> u-2") && reason.contains("other-machine"),
            "{reason}"
        );
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

    #[tokio::test]
    async fn a_server_available_yet_claimed_stays_ignored_for_a_person_to_decide() {
        let outcome = restore_one_with(json!({"state": "Available", "powerState": "Off"}), |mut api| async move {
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
