//! Restore planning: which live object gets which record's status, and why not. Pure: the
//! plan is built from records and a view of the live objects, and unit-tested without an
//! API server. The same code plans a one-shot restore and each reconcile of the controller.
//!
//! Verdicts, per object:
//! - `restore`: the live status is empty or initial, or older than the snapshot (or `--force`);
//! - `already-equal`: nothing to write;
//! - `skip-newer`: the live status moved on after the snapshot; never overwritten without force;
//! - `ambiguous`: a key matches several live objects, or several records match one object;
//! - `missing-on-target`: a record whose object is not on the target;
//! - `not-in-snapshot`: a live object the snapshot has no record for.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::format::{ObjectRef, Record, SnapshotId};
use crate::identity::{IdentityKey, KindProfile, Profile};
use crate::object::RawObject;

/// metal-operator's annotation that makes its controllers leave an object alone.
pub const OPERATION_ANNOTATION: &str = "metal.ironcore.dev/operation";
pub const OPERATION_IGNORE: &str = "ignore";
/// Marks an `ignore` that restatus set, so that restatus never removes a user's own.
pub const QUIESCED_BY_ANNOTATION: &str = "restatus.ironcore.dev/quiesced-by";
/// Names the snapshot an object's status was restored from.
pub const RESTORED_FROM_ANNOTATION: &str = "restatus.ironcore.dev/restored-from";

/// The annotations with which restatus quiesces an object: metal-operator's `ignore`, marked
/// as restatus's so that it is never mistaken for a user's.
pub fn quiesce_annotations() -> serde_json::Map<String, Value> {
    let mut annotations = serde_json::Map::new();
    annotations.insert(OPERATION_ANNOTATION.into(), OPERATION_IGNORE.into());
    annotations.insert(QUIESCED_BY_ANNOTATION.into(), crate::TOOL_NAME.into());
    annotations
}

/// The merge-patch annotations that remove restatus's `ignore` (null deletes a key).
pub fn release_annotations() -> serde_json::Map<String, Value> {
    [OPERATION_ANNOTATION, QUIESCED_BY_ANNOTATION].into_iter().map(|k| (k.to_string(), Value::Null)).collect()
}

/// What restatus knows of a live object on the target.
#[derive(Debug, Clone)]
pub struct LiveObject {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub keys: Vec<IdentityKey>,
    /// The status as the API server sent it (parsed only when a decision needs it).
    pub status: Option<Box<RawValue>>,
    pub annotations: BTreeMap<String, String>,
    /// When the status subresource was last written (managedFields), if known.
    pub status_written_at: Option<Timestamp>,
}

impl LiveObject {
    pub fn from_raw(kind: &KindProfile, object: &RawObject<'_>) -> Self {
        let meta = &object.meta;
        LiveObject {
            kind: kind.kind.clone(),
            namespace: meta.namespace.as_ref().map(|n| n.to_string()).filter(|n| !n.is_empty()),
            name: meta.name.to_string(),
            uid: meta.uid.as_deref().unwrap_or_default().to_string(),
            resource_version: meta.resource_version.as_deref().unwrap_or_default().to_string(),
            keys: kind.keys_of(object),
            status: object.status().map(RawValue::to_owned),
            annotations: meta.annotations.clone().unwrap_or_default(),
            status_written_at: meta.status_written_at(),
        }
    }

    /// The same view of an object that came through a typed API call or a watch.
    pub fn from_dynamic(kind: &KindProfile, object: &kube::api::DynamicObject) -> Result<Self, serde_json::Error> {
        let json = serde_json::to_string(object)?;
        Ok(Self::from_raw(kind, &RawObject::parse(&json)?))
    }

    /// The status, parsed.
    pub fn status_value(&self) -> Option<Value> {
        self.status.as_deref().and_then(|s| serde_json::from_str(s.get()).ok())
    }

    pub fn object_ref(&self) -> ObjectRef {
        ObjectRef { kind: self.kind.clone(), namespace: self.namespace.clone(), name: self.name.clone() }
    }

    /// `ignore` set by restatus (by any snapshot or run), which restatus may remove.
    pub fn quiesced_by_restatus(&self) -> bool {
        self.ignored() && self.annotations.contains_key(QUIESCED_BY_ANNOTATION)
    }

    /// metal-operator ignores this object, whoever asked for it.
    pub fn ignored(&self) -> bool {
        self.annotations.get(OPERATION_ANNOTATION).map(String::as_str) == Some(OPERATION_IGNORE)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Restore,
    AlreadyEqual,
    SkipNewer,
    Ambiguous,
    MissingOnTarget,
    NotInSnapshot,
}

impl Verdict {
    pub const ALL: [Verdict; 6] = [
        Verdict::Restore,
        Verdict::AlreadyEqual,
        Verdict::SkipNewer,
        Verdict::Ambiguous,
        Verdict::MissingOnTarget,
        Verdict::NotInSnapshot,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Restore => "restore",
            Verdict::AlreadyEqual => "already-equal",
            Verdict::SkipNewer => "skip-newer",
            Verdict::Ambiguous => "ambiguous",
            Verdict::MissingOnTarget => "missing-on-target",
            Verdict::NotInSnapshot => "not-in-snapshot",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One top-level status field a restore changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldChange {
    pub field: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

impl fmt::Display for FieldChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".into());
        write!(f, "status.{}: {} -> {}", self.field, show(&self.from), show(&self.to))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanItem {
    pub kind: String,
    pub verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The live object on the target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<ObjectRef>,
    /// The object the record was captured from, on the source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<ObjectRef>,
    pub reason: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub forced: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<FieldChange>,
    /// restatus's own `ignore` is to be removed from the target object.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub release: bool,
    /// Indexes into the planned records and live objects.
    #[serde(skip)]
    pub record: Option<usize>,
    #[serde(skip)]
    pub live: Option<usize>,
}

impl PlanItem {
    /// Whether applying this item writes anything.
    pub fn writes(&self) -> bool {
        self.verdict == Verdict::Restore || self.release
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestorePlan {
    pub snapshot: SnapshotId,
    pub items: Vec<PlanItem>,
}

impl RestorePlan {
    pub fn counts(&self) -> BTreeMap<Verdict, usize> {
        let mut counts: BTreeMap<Verdict, usize> = Verdict::ALL.iter().map(|v| (*v, 0)).collect();
        for item in &self.items {
            *counts.entry(item.verdict).or_default() += 1;
        }
        counts
    }

    pub fn writes(&self) -> usize {
        self.items.iter().filter(|i| i.writes()).count()
    }
}

pub struct PlanInput<'a> {
    pub profile: &'a Profile,
    pub snapshot: &'a SnapshotId,
    /// When the snapshot's capture started.
    pub snapshot_time: Timestamp,
    pub records: &'a [Record],
    pub live: &'a [LiveObject],
    /// Overwrite live statuses that moved on after the snapshot.
    pub force: bool,
}

/// Builds the plan: kinds in profile order (the order to apply them in), records in payload
/// order, then the live objects no record matched.
pub fn plan(input: &PlanInput<'_>) -> RestorePlan {
    let mut items = Vec::new();
    for kind in &input.profile.kinds {
        plan_kind(input, kind, &mut items);
    }
    RestorePlan { snapshot: input.snapshot.clone(), items }
}

fn plan_kind(input: &PlanInput<'_>, kind: &KindProfile, items: &mut Vec<PlanItem>) {
    let records: Vec<usize> = (0..input.records.len()).filter(|&i| input.records[i].kind == kind.kind).collect();
    let live: Vec<usize> = (0..input.live.len()).filter(|&i| input.live[i].kind == kind.kind).collect();

    let mut by_key: HashMap<&IdentityKey, Vec<usize>> = HashMap::new();
    for &l in &live {
        for key in &input.live[l].keys {
            by_key.entry(key).or_default().push(l);
        }
    }
    let mut primaries: HashMap<&IdentityKey, usize> = HashMap::new();
    for &r in &records {
        if let Some(key) = input.records[r].primary_key() {
            *primaries.entry(key).or_default() += 1;
        }
    }

    // First pass: match records to live objects by the first key that finds any.
    let mut matches: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut touched = vec![false; input.live.len()];
    let mut pending: Vec<(usize, Option<usize>, PlanItem)> = Vec::new();
    for &r in &records {
        let record = &input.records[r];
        let hit = record.keys.iter().find_map(|k| by_key.get(k).map(|ls| (k, ls)));
        let base = PlanItem {
            kind: kind.kind.clone(),
            verdict: Verdict::MissingOnTarget,
            key: record.primary_key().map(ToString::to_string),
            target: None,
            source: Some(ObjectRef {
                kind: record.kind.clone(),
                namespace: record.namespace.clone(),
                name: record.name.clone(),
            }),
            reason: "no object on the target has any of the record's keys".into(),
            forced: false,
            changes: vec![],
            release: false,
            record: Some(r),
            live: None,
        };
        match hit {
            None => pending.push((r, None, base)),
            Some((key, ls)) if ls.len() > 1 => {
                for &l in ls {
                    touched[l] = true;
                }
                let names: Vec<String> = ls.iter().map(|&l| input.live[l].object_ref().to_string()).collect();
                let reason = format!("key {key} matches {} objects on the target: {}", ls.len(), names.join(", "));
                pending.push((
                    r,
                    None,
                    PlanItem { verdict: Verdict::Ambiguous, key: Some(key.to_string()), reason, ..base },
                ));
            }
            Some((key, ls)) => {
                let l = ls[0];
                touched[l] = true;
                let in_snapshot = record.primary_key().map_or(1, |p| primaries[p]);
                if in_snapshot > 1 {
                    let reason = format!("key {key} is carried by {in_snapshot} records in the snapshot");
                    let target = Some(input.live[l].object_ref());
                    pending.push((
                        r,
                        Some(l),
                        PlanItem { verdict: Verdict::Ambiguous, key: Some(key.to_string()), target, reason, ..base },
                    ));
                } else {
                    matches.entry(l).or_default().push(r);
                    pending.push((r, Some(l), PlanItem { key: Some(key.to_string()), ..base }));
                }
            }
        }
    }

    // Second pass: decide each record matched to exactly one live object.
    for (r, l, mut item) in pending {
        if let (Some(l), Verdict::MissingOnTarget) = (l, item.verdict) {
            let object = &input.live[l];
            item.target = Some(object.object_ref());
            item.live = Some(l);
            let rivals = &matches[&l];
            if rivals.len() > 1 {
                item.verdict = Verdict::Ambiguous;
                item.reason = format!("{} records of the snapshot match this object", rivals.len());
            } else {
                decide(input, kind, &input.records[r], object, &mut item);
            }
        }
        items.push(item);
    }

    for &l in &live {
        if touched[l] {
            continue;
        }
        let object = &input.live[l];
        items.push(PlanItem {
            kind: kind.kind.clone(),
            verdict: Verdict::NotInSnapshot,
            key: object.keys.first().map(ToString::to_string),
            target: Some(object.object_ref()),
            source: None,
            reason: if object.keys.is_empty() {
                "object has no identity key".into()
            } else {
                "no record has its keys".into()
            },
            forced: false,
            changes: vec![],
            // Nothing to restore: metal-operator may take over.
            release: object.quiesced_by_restatus(),
            record: None,
            live: Some(l),
        });
    }
}

/// The verdict for one record and its one live object.
pub fn decide(input: &PlanInput<'_>, kind: &KindProfile, record: &Record, object: &LiveObject, item: &mut PlanItem) {
    // An object ignored on restatus's behalf is released whatever the verdict: its status is
    // settled (restored, equal, or moved on and its controller has state to work from).
    item.release = object.quiesced_by_restatus();
    if object.status.as_deref().is_some_and(|s| s.get() == record.status.get()) {
        (item.verdict, item.forced, item.changes) = (Verdict::AlreadyEqual, false, vec![]);
        item.reason = "live status equals the snapshot".into();
        return;
    }
    let wanted: Value = serde_json::from_str(record.status.get()).unwrap_or(Value::Null);
    let live = object.status_value();
    item.changes = diff(live.as_ref(), &wanted);
    let (verdict, reason, forced) = if live.as_ref() == Some(&wanted) {
        (Verdict::AlreadyEqual, "live status equals the snapshot".to_string(), false)
    } else if live.is_none() {
        (Verdict::Restore, "live status is empty".into(), false)
    } else if kind.is_initial_status(live.as_ref()) {
        (Verdict::Restore, "live status is still initial".into(), false)
    } else if object.status_written_at.is_some_and(|t| written_before(t, input.snapshot_time)) {
        (Verdict::Restore, "live status was last written before the snapshot".into(), false)
    } else {
        let when = match object.status_written_at {
            Some(t) => format!("written {t}, after the snapshot"),
            None => "write time unknown".into(),
        };
        if input.force {
            (Verdict::Restore, format!("--force: overwrites a live status that moved on ({when})"), true)
        } else {
            (Verdict::SkipNewer, format!("live status moved on ({when}); --force overwrites it"), false)
        }
    };
    item.verdict = verdict;
    item.reason = reason;
    item.forced = forced;
    if verdict != Verdict::Restore {
        item.changes.clear();
    }
}

/// managedFields times have second precision: a write in the snapshot's own second may have
/// come after it, so only writes in an earlier second count as before.
fn written_before(written: Timestamp, snapshot: Timestamp) -> bool {
    written.as_second() < snapshot.as_second()
}

/// Top-level fields of `to` that differ from `from`, summarised for people.
pub fn diff(from: Option<&Value>, to: &Value) -> Vec<FieldChange> {
    let empty = serde_json::Map::new();
    let from = from.and_then(Value::as_object).unwrap_or(&empty);
    let to = to.as_object().unwrap_or(&empty);
    let mut fields: Vec<&String> = from.keys().chain(to.keys()).collect();
    fields.sort();
    fields.dedup();
    fields
        .into_iter()
        .filter(|f| from.get(*f) != to.get(*f))
        .map(|f| FieldChange { field: f.clone(), from: from.get(f).map(summary), to: to.get(f).map(summary) })
        .collect()
}

fn summary(v: &Value) -> String {
    match v {
        Value::Array(items) => format!("[{} items]", items.len()),
        Value::Object(map) => format!("{{{} fields}}", map.len()),
        other => other.to_string(),
    }
}

/// The status to write: the record's, with `null` for live top-level fields the record lacks,
/// so a JSON merge patch leaves exactly the record's status.
pub fn status_patch(live: Option<&Value>, record: &Value) -> Value {
    let mut patch = record.clone();
    if let (Some(Value::Object(live)), Value::Object(out)) = (live, &mut patch) {
        for key in live.keys() {
            out.entry(key.clone()).or_insert(Value::Null);
        }
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use serde_json::value::RawValue;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const SNAP: &str = "2026-11-30T09:00:00Z";

    fn key(field: &str, value: &str) -> IdentityKey {
        IdentityKey { field: field.into(), value: value.into() }
    }

    fn record(kind: &str, name: &str, keys: &[IdentityKey], status: Value) -> Record {
        Record {
            api_version: "metal.ironcore.dev/v1alpha1".into(),
            kind: kind.into(),
            namespace: None,
            name: name.into(),
            keys: keys.to_vec(),
            uid: Some(format!("src-{name}")),
            resource_version: None,
            generation: None,
            creation_timestamp: None,
            labels: Default::default(),
            annotations: Default::default(),
            status: RawValue::from_string(status.to_string()).unwrap(),
        }
    }

    fn live(kind: &str, name: &str, keys: &[IdentityKey], status: Option<Value>) -> LiveObject {
        LiveObject {
            kind: kind.into(),
            namespace: None,
            name: name.into(),
            uid: format!("dst-{name}"),
            resource_version: "1".into(),
            keys: keys.to_vec(),
            status: status.map(|s| RawValue::from_string(s.to_string()).unwrap()),
            annotations: Default::default(),
            status_written_at: None,
        }
    }

    fn run(records: &[Record], live: &[LiveObject], force: bool) -> RestorePlan {
        let profile = Profile::metal_operator();
        let id = SnapshotId::new(ts(SNAP));
        plan(&PlanInput { profile: &profile, snapshot: &id, snapshot_time: ts(SNAP), records, live, force })
    }

    fn verdicts(plan: &RestorePlan) -> Vec<(String, Verdict)> {
        plan.items
            .iter()
            .map(|i| (i.target.as_ref().or(i.source.as_ref()).map(|o| o.name.clone()).unwrap_or_default(), i.verdict))
            .collect()
    }

    fn reserved() -> Value {
        json!({"state": "Reserved", "networkInterfaces": [{"name": "eth0", "macAddress": "aa"}]})
    }

    #[test]
    fn empty_status_is_restored_by_key_even_under_another_name() {
        let k = key("spec.systemUUID", "u1");
        let p = run(
            &[record("Server", "s1", std::slice::from_ref(&k), reserved())],
            &[live("Server", "renamed", &[k], None)],
            false,
        );
        assert_eq!(verdicts(&p), [("renamed".to_string(), Verdict::Restore)]);
        let item = &p.items[0];
        assert_eq!(item.source.as_ref().unwrap().name, "s1");
        assert_eq!(item.reason, "live status is empty");
        let changes: Vec<String> = item.changes.iter().map(ToString::to_string).collect();
        assert_eq!(
            changes,
            ["status.networkInterfaces: (absent) -> [1 items]", "status.state: (absent) -> \"Reserved\""]
        );
        assert_eq!((item.record, item.live), (Some(0), Some(0)));
    }

    #[test]
    fn equal_status_needs_no_write() {
        let k = key("spec.systemUUID", "u1");
        let p = run(
            &[record("Server", "s1", std::slice::from_ref(&k), reserved())],
            &[live("Server", "s1", &[k], Some(reserved()))],
            false,
        );
        assert_eq!(p.items[0].verdict, Verdict::AlreadyEqual);
        assert!(p.items[0].changes.is_empty());
        assert_eq!(p.writes(), 0);
    }

    #[test]
    fn initial_states_are_overwritten() {
        let k = key("spec.systemUUID", "u1");
        let initial = json!({"state": "Initial", "powerState": "Off"});
        let p = run(
            &[record("Server", "s1", std::slice::from_ref(&k), reserved())],
            &[live("Server", "s1", &[k], Some(initial))],
            false,
        );
        assert_eq!(p.items[0].verdict, Verdict::Restore);
        assert_eq!(p.items[0].reason, "live status is still initial");
    }

    #[test]
    fn a_boot_configuration_metal_operator_set_pending_is_restored() {
        let k = key(crate::identity::NAMESPACED_NAME, "ns/claim-1");
        let mut object = live("ServerBootConfiguration", "claim-1", std::slice::from_ref(&k), None);
        object.status = Some(RawValue::from_string(json!({"state": "Pending"}).to_string()).unwrap());
        object.status_written_at = Some(ts("2026-11-30T09:05:00Z"));
        let ready = json!({"state": "Ready"});
        let p = run(&[record("ServerBootConfiguration", "claim-1", &[k], ready)], &[object], false);
        assert_eq!(p.items[0].verdict, Verdict::Restore);
        assert_eq!(p.items[0].reason, "live status is still initial");
    }

    #[test]
    fn a_status_that_moved_on_is_skipped_unless_forced() {
        let k = key("spec.systemUUID", "u1");
        let mut object = live("Server", "s1", std::slice::from_ref(&k), Some(json!({"state": "Available"})));
        object.status_written_at = Some(ts("2026-11-30T09:05:00Z"));
        let records = [record("Server", "s1", &[k], reserved())];
        let p = run(&records, std::slice::from_ref(&object), false);
        assert_eq!(p.items[0].verdict, Verdict::SkipNewer);
        assert!(p.items[0].reason.contains("after the snapshot") && p.items[0].reason.contains("--force"));
        assert!(p.items[0].changes.is_empty());
        let forced = run(&records, std::slice::from_ref(&object), true);
        assert_eq!(forced.items[0].verdict, Verdict::Restore);
        assert!(forced.items[0].forced && forced.items[0].reason.starts_with("--force"));
        // Unknown write time counts as newer too.
        object.status_written_at = None;
        assert_eq!(run(&records, &[object], false).items[0].verdict, Verdict::SkipNewer);
    }

    #[test]
    fn a_write_in_the_snapshots_own_second_counts_as_newer() {
        let k = key("spec.systemUUID", "u1");
        let mut object = live("Server", "s1", std::slice::from_ref(&k), Some(json!({"state": "Available"})));
        object.status_written_at = Some(ts("2026-11-30T09:00:00Z"));
        let profile = Profile::metal_operator();
        let id = SnapshotId::new(ts(SNAP));
        let records = [record("Server", "s1", &[k], reserved())];
        let input = PlanInput {
            profile: &profile,
            snapshot: &id,
            snapshot_time: ts("2026-11-30T09:00:00.400Z"),
            records: &records,
            live: std::slice::from_ref(&object),
            force: false,
        };
        assert_eq!(plan(&input).items[0].verdict, Verdict::SkipNewer);
    }

    #[test]
    fn a_status_older_than_the_snapshot_is_restored() {
        let k = key("spec.systemUUID", "u1");
        let mut object = live("Server", "s1", std::slice::from_ref(&k), Some(json!({"state": "Available"})));
        object.status_written_at = Some(ts("2026-11-30T08:00:00Z"));
        let p = run(&[record("Server", "s1", &[k], reserved())], &[object], false);
        assert_eq!(p.items[0].verdict, Verdict::Restore);
    }

    #[test]
    fn two_live_objects_with_one_key_are_ambiguous_and_untouched() {
        let k = key("spec.systemUUID", "u1");
        let p = run(
            &[record("Server", "s1", std::slice::from_ref(&k), reserved())],
            &[live("Server", "a", std::slice::from_ref(&k), None), live("Server", "b", &[k], None)],
            false,
        );
        assert_eq!(p.items.len(), 1, "the live objects are covered by the ambiguous item");
        assert_eq!(p.items[0].verdict, Verdict::Ambiguous);
        assert!(
            p.items[0].reason.contains("matches 2 objects on the target: Server a, Server b"),
            "{}",
            p.items[0].reason
        );
        assert_eq!(p.writes(), 0);
    }

    #[test]
    fn a_key_conflict_in_the_snapshot_is_ambiguous() {
        let k = key("spec.systemUUID", "u1");
        let p = run(
            &[
                record("Server", "x", std::slice::from_ref(&k), reserved()),
                record("Server", "y", std::slice::from_ref(&k), reserved()),
            ],
            &[live("Server", "s", &[k], None)],
            false,
        );
        assert!(p.items.iter().all(|i| i.verdict == Verdict::Ambiguous), "{p:?}");
        assert!(p.items[0].reason.contains("carried by 2 records"));
    }

    #[test]
    fn two_records_reaching_one_object_through_different_keys_are_ambiguous() {
        let (uuid, mac) = (key("spec.bmcUUID", "u"), key("spec.access.macAddress", "aa"));
        let p = run(
            &[
                record("BMC", "x", std::slice::from_ref(&uuid), json!({"state": "Enabled"})),
                record("BMC", "y", std::slice::from_ref(&mac), json!({"state": "Enabled"})),
            ],
            &[live("BMC", "b", &[uuid, mac], None)],
            false,
        );
        assert_eq!(verdicts(&p), [("b".to_string(), Verdict::Ambiguous), ("b".to_string(), Verdict::Ambiguous)]);
        assert!(p.items[0].reason.contains("2 records of the snapshot match this object"));
    }

    #[test]
    fn alternate_keys_match_when_the_primary_differs() {
        let record_keys = [key("spec.bmcUUID", "old-uuid"), key("spec.access.macAddress", "aa")];
        let p = run(
            &[record("BMC", "b", &record_keys, json!({"state": "Enabled"}))],
            &[live("BMC", "b2", &[key("spec.access.macAddress", "aa")], None)],
            false,
        );
        assert_eq!(p.items[0].verdict, Verdict::Restore);
        assert_eq!(p.items[0].key.as_deref(), Some("spec.access.macAddress=aa"));
    }

    #[test]
    fn missing_and_unknown_objects_are_reported() {
        let p = run(
            &[record("Server", "gone", &[key("spec.systemUUID", "u1")], reserved())],
            &[live("Server", "new", &[key("spec.systemUUID", "u2")], None)],
            false,
        );
        assert_eq!(
            verdicts(&p),
            [("gone".to_string(), Verdict::MissingOnTarget), ("new".to_string(), Verdict::NotInSnapshot)]
        );
    }

    #[test]
    fn kinds_are_planned_in_profile_order() {
        let p = run(
            &[
                record("ServerClaim", "c", &[key("namespace/name", "ns/c")], json!({"phase": "Bound"})),
                record("Server", "s", &[key("spec.systemUUID", "u")], reserved()),
                record("BMC", "b", &[key("spec.bmcUUID", "b")], json!({"state": "Enabled"})),
            ],
            &[],
            false,
        );
        let kinds: Vec<&str> = p.items.iter().map(|i| i.kind.as_str()).collect();
        assert_eq!(kinds, ["BMC", "Server", "ServerClaim"]);
    }

    #[test]
    fn restatus_quiesce_is_released_but_a_users_ignore_is_not() {
        let k = key("spec.systemUUID", "u1");
        let mut ours = live("Server", "s1", std::slice::from_ref(&k), Some(reserved()));
        ours.annotations.insert(OPERATION_ANNOTATION.into(), OPERATION_IGNORE.into());
        ours.annotations.insert(QUIESCED_BY_ANNOTATION.into(), "restatus".into());
        let p =
            run(&[record("Server", "s1", std::slice::from_ref(&k), reserved())], std::slice::from_ref(&ours), false);
        assert_eq!(p.items[0].verdict, Verdict::AlreadyEqual);
        assert!(p.items[0].release, "a crash after the status write must be finished by the next run");
        assert_eq!(p.writes(), 1);

        let mut users = ours.clone();
        users.annotations.remove(QUIESCED_BY_ANNOTATION);
        let p = run(&[record("Server", "s1", &[k], reserved())], &[users], false);
        assert!(!p.items[0].release);
        assert_eq!(p.writes(), 0);
    }

    #[test]
    fn status_patch_removes_fields_the_record_lacks() {
        let live = json!({"state": "Initial", "powerState": "Off"});
        let patch = status_patch(Some(&live), &json!({"state": "Reserved"}));
        assert_eq!(patch, json!({"state": "Reserved", "powerState": null}));
    }

    #[test]
    fn live_objects_read_keys_status_and_status_write_time() {
        let profile = Profile::metal_operator();
        let json = r#"{"metadata":{"name":"s","uid":"u","resourceVersion":"5",
            "annotations":{"metal.ironcore.dev/operation":"ignore","restatus.ironcore.dev/quiesced-by":"restatus"},
            "managedFields":[{"manager":"a","operation":"Update","time":"2026-11-30T08:00:00Z"},
                             {"manager":"m","operation":"Update","subresource":"status","time":"2026-11-30T08:30:00Z"},
                             {"manager":"n","operation":"Update","subresource":"status","time":"2026-11-30T08:10:00Z"}]},
            "spec":{"systemUUID":"ABC"},"status":{"state":"Available"}}"#;
        let object = LiveObject::from_raw(profile.kind("Server").unwrap(), &RawObject::parse(json).unwrap());
        assert_eq!(object.keys, [key("spec.systemUUID", "abc")]);
        assert_eq!(object.status_value(), Some(json!({"state": "Available"})));
        assert_eq!(object.status_written_at, Some(ts("2026-11-30T08:30:00Z")));
        assert!(object.quiesced_by_restatus());
    }
}
