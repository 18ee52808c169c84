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
//! - `not-in-snapshot`: a live object the snapshot has no record for;
//! - `incompatible`: the target cannot take the record's status (its version is not served,
//!   or the served schema refuses it); the object is released, never retried on this snapshot.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::Result;
use crate::domain::annotations::NOT_RESTORED_ANNOTATION;
use crate::domain::identity::{KindProfile, Profile};
use crate::domain::live::LiveObject;
use crate::domain::status::{FieldChange, diff};
use crate::format::{CLOCK_SKEW_TOLERANCE, IdentityKey, KeyDigest, ObjectRef, Record, Records, SnapshotId};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Restore,
    AlreadyEqual,
    SkipNewer,
    Ambiguous,
    MissingOnTarget,
    NotInSnapshot,
    Incompatible,
}

impl Verdict {
    pub const ALL: [Verdict; 7] = [
        Verdict::Restore,
        Verdict::AlreadyEqual,
        Verdict::SkipNewer,
        Verdict::Ambiguous,
        Verdict::MissingOnTarget,
        Verdict::NotInSnapshot,
        Verdict::Incompatible,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Restore => "restore",
            Verdict::AlreadyEqual => "already-equal",
            Verdict::SkipNewer => "skip-newer",
            Verdict::Ambiguous => "ambiguous",
            Verdict::MissingOnTarget => "missing-on-target",
            Verdict::NotInSnapshot => "not-in-snapshot",
            Verdict::Incompatible => "incompatible",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
    /// When the snapshot's capture started, if comparable with the target's write times
    /// (see [`Manifest::comparable_time`](crate::format::Manifest::comparable_time)).
    pub snapshot_time: Option<Timestamp>,
    pub records: &'a Records,
    pub live: &'a [LiveObject],
    /// Overwrite live statuses that moved on after the snapshot.
    pub force: bool,
    /// List the status fields each restore changes (for people: dry runs and reports). Costs
    /// memory at scale, and needs the live statuses' JSON.
    pub explain: bool,
}

/// Builds the plan: kinds in profile order (the order to apply them in), records in payload
/// order, then the live objects no record matched. Fails only when a record cannot be read
/// back from its verified payload.
///
/// This is the whole of [`KindMatcher`] for live objects held in memory: one page.
pub fn plan(input: &PlanInput<'_>) -> Result<RestorePlan> {
    let mut items = Vec::new();
    for kind in &input.profile.kinds {
        let live: Vec<usize> = (0..input.live.len()).filter(|&l| input.live[l].kind == kind.kind).collect();
        let mut keys = LiveKeys::default();
        for &l in &live {
            keys.add(&kind.kind, &input.live[l].keys);
        }
        let mut matcher = KindMatcher::new(kind, input.records, &keys);
        let mut kind_items = matcher.page(input, live.into_iter())?;
        kind_items.extend(matcher.finish(input)?);
        kind_items.sort_by_key(|i| (i.record.unwrap_or(usize::MAX), i.live));
        items.extend(kind_items);
    }
    Ok(RestorePlan { snapshot: input.snapshot.clone(), items })
}

/// How many live objects of one kind carry each key, by digest: what matching a record needs
/// to know of the objects it does not hold (a restore holds one page of them at a time).
#[derive(Debug, Default)]
pub struct LiveKeys {
    counts: HashMap<KeyDigest, u32>,
}

impl LiveKeys {
    pub fn add(&mut self, kind: &str, keys: &[IdentityKey]) {
        for key in keys {
            *self.counts.entry(key.digest(kind)).or_default() += 1;
        }
    }

    pub(crate) fn count(&self, key: KeyDigest) -> u32 {
        self.counts.get(&key).copied().unwrap_or(0)
    }
}

/// Matches one kind's records to its live objects, by key, a page of live objects at a time:
/// a record takes the first of its keys that any live object carries; that key must be
/// carried by exactly one live object, and the record's primary key by no other record, and
/// no other record may reach the same object through another key; otherwise the record is
/// ambiguous. Built from the digests of every record's keys and of every live object's keys;
/// keys are compared themselves before a record and an object are paired.
pub struct KindMatcher<'a> {
    kind: &'a KindProfile,
    records: &'a Records,
    /// (key that finds one live object, record), sorted.
    found: Vec<(KeyDigest, u32)>,
    /// Records by the key that finds several live objects, and those objects as met.
    several: HashMap<KeyDigest, (Vec<u32>, Vec<ObjectRef>)>,
    /// Records no live object has a key of.
    missing: Vec<u32>,
    /// Primary keys carried by several records, and by how many.
    shared: HashMap<KeyDigest, usize>,
    /// Per record of the snapshot: paired with a live object (or found ambiguous with one).
    placed: Vec<bool>,
}

impl<'a> KindMatcher<'a> {
    pub fn new(kind: &'a KindProfile, records: &'a Records, live: &LiveKeys) -> Self {
        let mut matcher = KindMatcher {
            kind,
            records,
            found: Vec::new(),
            several: HashMap::new(),
            missing: Vec::new(),
            shared: HashMap::new(),
            placed: vec![false; records.len()],
        };
        let mut primaries = Vec::new();
        for r in records.of_kind(&kind.qualified_kind()) {
            let digests = records.key_digests(r);
            primaries.extend(digests.first().copied());
            match digests.iter().map(|&d| (d, live.count(d))).find(|&(_, n)| n > 0) {
                None => matcher.missing.push(r as u32),
                Some((d, 1)) => matcher.found.push((d, r as u32)),
                Some((d, _)) => matcher.several.entry(d).or_default().0.push(r as u32),
            }
        }
        matcher.found.sort_unstable();
        primaries.sort_unstable();
        for run in primaries.chunk_by(|a, b| a == b).filter(|run| run.len() > 1) {
            matcher.shared.insert(run[0], run.len());
        }
        matcher
    }

    /// The records whose key of this digest finds one live object.
    fn found(&self, digest: KeyDigest) -> impl Iterator<Item = usize> + '_ {
        let start = self.found.partition_point(|(d, _)| *d < digest);
        self.found[start..].iter().take_while(move |(d, _)| *d == digest).map(|(_, r)| *r as usize)
    }

    /// The items of a page of live objects (indexes into `input.live`, all of this kind):
    /// each object's records, or `not-in-snapshot`. Objects that share a key several records
    /// look for are named in those records' items, at [`KindMatcher::finish`].
    pub fn page(&mut self, input: &PlanInput<'_>, live: impl Iterator<Item = usize>) -> Result<Vec<PlanItem>> {
        let kind = &self.kind.kind;
        let mut items = Vec::new();
        for l in live {
            let object = &input.live[l];
            let mut claims: Vec<(usize, Record, IdentityKey)> = Vec::new();
            let mut accounted = false;
            for key in &object.keys {
                let digest = key.digest(kind);
                if let Some((_, names)) = self.several.get_mut(&digest) {
                    names.push(object.object_ref());
                    accounted = true;
                }
                for r in self.found(digest) {
                    if claims.iter().any(|(c, ..)| *c == r) {
                        continue;
                    }
                    // The record must carry the key itself, not only its digest.
                    let record = self.records.record(r)?;
                    if record.keys.contains(key) {
                        claims.push((r, record, key.clone()));
                    }
                }
            }
            if claims.is_empty() && !accounted {
                items.push(unmatched_item(self.kind, l, object));
            }
            let shared = |record: &Record| record.keys.first().and_then(|p| self.shared.get(&p.digest(kind))).copied();
            let rivals = claims.iter().filter(|(_, record, _)| shared(record).is_none()).count();
            for (r, record, key) in claims {
                let m = match (self.placed[r], shared(&record)) {
                    // Paired with an object of an earlier page already: this one was created
                    // with the same key while the kind was listed.
                    (true, _) => Match::Taken { key, live: l },
                    (false, Some(records)) => Match::SharedKey { key, live: l, records },
                    (false, None) => Match::One { key, live: l, rivals },
                };
                self.placed[r] = true;
                items.push(record_item(input, self.kind, r, record, m));
            }
        }
        Ok(items)
    }

    /// The items of the records no page placed: missing on the target (no object carries
    /// their keys, or it went away between pages), or ambiguous because their key finds
    /// several objects.
    pub fn finish(self, input: &PlanInput<'_>) -> Result<Vec<PlanItem>> {
        let mut items = Vec::new();
        for (digest, (records, objects)) in &self.several {
            for &r in records {
                let record = self.records.record(r as usize)?;
                let key = record.keys.iter().find(|k| k.digest(&self.kind.kind) == *digest).cloned();
                let m = match key {
                    Some(key) if !objects.is_empty() => Match::SeveralObjects { key, objects: objects.clone() },
                    _ => Match::Missing,
                };
                items.push(record_item(input, self.kind, r as usize, record, m));
            }
        }
        let unplaced = self.found.iter().map(|(_, r)| r).filter(|&&r| !self.placed[r as usize]);
        for &r in self.missing.iter().chain(unplaced) {
            let record = self.records.record(r as usize)?;
            items.push(record_item(input, self.kind, r as usize, record, Match::Missing));
        }
        Ok(items)
    }
}

/// How one record found (or did not find) its live object.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Match {
    /// No live object has any of the record's keys.
    Missing,
    /// The first of the record's keys that finds anything finds several live objects.
    SeveralObjects { key: IdentityKey, objects: Vec<ObjectRef> },
    /// One live object, but the record's primary key is carried by several records.
    SharedKey { key: IdentityKey, live: usize, records: usize },
    /// One live object, reached by `rivals` records (this one included) through their keys.
    One { key: IdentityKey, live: usize, rivals: usize },
    /// A second live object met with the key the record was paired by (created meanwhile).
    Taken { key: IdentityKey, live: usize },
}

/// The item of record `r` given its match.
fn record_item(input: &PlanInput<'_>, kind: &KindProfile, r: usize, record: Record, m: Match) -> PlanItem {
    let mut item = PlanItem {
        kind: kind.kind.clone(),
        verdict: Verdict::Ambiguous,
        key: record.primary_key().map(ToString::to_string),
        target: None,
        source: Some(record.object_ref()),
        reason: String::new(),
        forced: false,
        changes: vec![],
        release: false,
        record: Some(r),
        live: None,
    };
    match m {
        Match::Missing => {
            item.verdict = Verdict::MissingOnTarget;
            item.reason = "no object on the target has any of the record's keys".into();
        }
        Match::SeveralObjects { key, objects } => {
            let names: Vec<String> = objects.iter().map(ToString::to_string).collect();
            item.key = Some(key.to_string());
            item.reason = format!("key {key} matches {} objects on the target: {}", objects.len(), names.join(", "));
        }
        Match::Taken { key, live } => {
            item.key = Some(key.to_string());
            item.target = Some(input.live[live].object_ref());
            item.reason = format!("key {key} also matched another object on the target, listed earlier");
        }
        Match::SharedKey { key, live, records } => {
            item.key = Some(key.to_string());
            item.target = Some(input.live[live].object_ref());
            item.reason = format!("key {key} is carried by {records} records in the snapshot");
        }
        Match::One { key, live, rivals } => {
            let object = &input.live[live];
            item.key = Some(key.to_string());
            item.target = Some(object.object_ref());
            item.live = Some(live);
            if rivals > 1 {
                item.reason = format!("{rivals} records of the snapshot match this object");
            } else {
                // An object ignored on restatus's behalf is released whatever the verdict:
                // its status is settled (restored, equal, or moved on and its controller has
                // state to work from).
                item.release = object.quiesced_by_restatus();
                let decision = decide_from(&record.status, object, input.snapshot, input.snapshot_time, input.force);
                (item.verdict, item.reason, item.forced) = (decision.verdict, decision.reason, decision.forced);
                if input.explain && item.verdict == Verdict::Restore {
                    let wanted: Value = serde_json::from_str(record.status.get()).unwrap_or(Value::Null);
                    item.changes = diff(object.status_value().as_ref(), &wanted);
                }
            }
        }
    }
    item
}

/// A live object that no record matched.
fn unmatched_item(kind: &KindProfile, l: usize, object: &LiveObject) -> PlanItem {
    let mut reason: String =
        if object.keys.is_empty() { "object has no identity key" } else { "no record has its keys" }.into();
    // Nothing to restore: metal-operator may take over, unless restatus holds the object for a
    // person. A snapshot without its record (a newer one, taken without it) ends no hold.
    let held = object.held_by_restatus();
    if held {
        reason += "; restatus keeps holding it (restored, kept ignored for a person): remove restatus's ignore \
                   once its status is right";
    }
    PlanItem {
        kind: kind.kind.clone(),
        verdict: Verdict::NotInSnapshot,
        key: object.keys.first().map(ToString::to_string),
        target: Some(object.object_ref()),
        source: None,
        reason,
        forced: false,
        changes: vec![],
        release: object.quiesced_by_restatus() && !held,
        record: None,
        live: Some(l),
    }
}

/// What to do with one record and its one live object, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    pub reason: String,
    /// `--force` made this a restore.
    pub forced: bool,
}

impl Decision {
    fn new(verdict: Verdict, reason: impl Into<String>) -> Self {
        Decision { verdict, reason: reason.into(), forced: false }
    }
}

/// The decision for one record's status and its one live object: restore when the live
/// status is empty, initial or older than the snapshot (or `force`); equal needs nothing; a
/// status that moved on is skipped.
pub fn decide(recorded: &RawValue, object: &LiveObject, snapshot_time: Option<Timestamp>, force: bool) -> Decision {
    let equal = || Decision::new(Verdict::AlreadyEqual, "live status equals the snapshot");
    let restore = |reason: &str| Decision::new(Verdict::Restore, reason);
    let Some(live) = &object.status else { return restore("live status is empty") };
    if live.same_bytes(recorded) {
        return equal();
    }
    let wanted: Value = serde_json::from_str(recorded.get()).unwrap_or(Value::Null);
    if live.same_value(&wanted) {
        equal()
    } else if live.is_initial() {
        restore("live status is still initial")
    } else if object.status_written_at.zip(snapshot_time).is_some_and(|(t, s)| written_before(t, s)) {
        restore("live status was last written before the snapshot")
    } else {
        let when = match (object.status_written_at, snapshot_time) {
            (_, None) => "the snapshot is dated ahead of this clock: write times cannot be compared".into(),
            (Some(t), Some(_)) => format!("written {t}, after the snapshot"),
            (None, Some(_)) => "write time unknown".into(),
        };
        if force {
            Decision { forced: true, ..restore(&format!("--force: overwrites a live status that moved on ({when})")) }
        } else {
            Decision::new(Verdict::SkipNewer, format!("live status moved on ({when}); --force overwrites it"))
        }
    }
}

/// [`decide`], for a record of snapshot `snapshot`: an object the target did not take this
/// snapshot's status for whole before (refused it, or pruned fields; it carries the snapshot's
/// `not-restored-from` mark) is `incompatible`, not quiesced and written again for the same
/// answer. A newer snapshot, or a person removing the mark, tries again.
pub fn decide_from(
    recorded: &RawValue,
    object: &LiveObject,
    snapshot: &SnapshotId,
    snapshot_time: Option<Timestamp>,
    force: bool,
) -> Decision {
    let decision = decide(recorded, object, snapshot_time, force);
    if decision.verdict == Verdict::Restore && object.refused(snapshot.as_str()) {
        let reason = format!(
            "the target did not take the status of snapshot {snapshot} whole before ({NOT_RESTORED_ANNOTATION}); \
             a newer snapshot, or removing the annotation, tries again"
        );
        return Decision::new(Verdict::Incompatible, reason);
    }
    decision
}

/// Whether a status written at `written` (the target API server's clock, from managedFields)
/// certainly predates the snapshot taken at `snapshot` (the backup machine's clock). The two
/// clocks may disagree by up to [`CLOCK_SKEW_TOLERANCE`]: a backup clock 4 minutes ahead
/// would otherwise date the snapshot after a status metal-operator wrote a minute after the
/// real capture, and the restore would revert the operator. So only writes more than the
/// tolerance before the snapshot count as older; managedFields times have second precision,
/// so the snapshot's own second never counts as before.
fn written_before(written: Timestamp, snapshot: Timestamp) -> bool {
    written.as_second() < snapshot.as_second() - CLOCK_SKEW_TOLERANCE.as_secs() as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::annotations::{OPERATION_ANNOTATION, OPERATION_IGNORE, QUIESCED_BY_ANNOTATION};
    use crate::fixtures::{SNAPSHOT_TIME, key, live, record, ts};
    use crate::format::Record;
    use serde_json::json;

    const SNAP: &str = SNAPSHOT_TIME;

    /// The id of the snapshot [`run`] plans from.
    const SNAP_ID: &str = "20261130T090000.000Z-0a1b2c";

    fn run(records: &[Record], live: &[LiveObject], force: bool) -> RestorePlan {
        let profile = Profile::metal_operator();
        let id: SnapshotId = SNAP_ID.parse().unwrap();
        let records = &Records::from_records(records.to_vec());
        plan(&PlanInput {
            profile: &profile,
            snapshot: &id,
            snapshot_time: Some(ts(SNAP)),
            records,
            live,
            force,
            explain: true,
        })
        .unwrap()
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

    /// F59: records match by group and kind: a `Server` of another group (a CRD of the same
    /// kind name, another operator's) never gives its status to metal-operator's Server that
    /// carries the same key, and is no record of it.
    #[test]
    fn a_record_of_a_kind_of_the_same_name_in_another_group_matches_nothing() {
        let k = key("spec.systemUUID", "u1");
        let other = Record {
            api_version: "inventory.example.com/v1".into(),
            ..record("Server", "s1", std::slice::from_ref(&k), json!({"state": "Racked"}))
        };
        let p = run(&[other], &[live("Server", "s1", &[k], None)], false);
        assert_eq!(verdicts(&p), [("s1".to_string(), Verdict::NotInSnapshot)]);
    }

    /// F61: an object whose status the target did not take whole from this snapshot (refused
    /// by its schema, or pruned) is not quiesced and written again: `incompatible`, and
    /// released if restatus still holds its ignore; a newer snapshot tries again.
    #[test]
    fn an_object_the_target_refused_this_snapshots_status_is_not_tried_again() {
        use crate::domain::annotations::NOT_RESTORED_ANNOTATION;
        let k = key("spec.systemUUID", "u1");
        let mut refused = live("Server", "s1", std::slice::from_ref(&k), None);
        let snapshot = SNAP_ID.to_string();
        refused.annotations.insert(NOT_RESTORED_ANNOTATION.into(), snapshot.clone());
        let records = [record("Server", "s1", std::slice::from_ref(&k), reserved())];
        let p = run(&records, std::slice::from_ref(&refused), false);
        assert_eq!((p.items[0].verdict, p.items[0].release, p.writes()), (Verdict::Incompatible, false, 0));
        assert!(p.items[0].reason.contains(&snapshot), "{}", p.items[0].reason);

        refused.annotations.insert(OPERATION_ANNOTATION.into(), OPERATION_IGNORE.into());
        refused.annotations.insert(QUIESCED_BY_ANNOTATION.into(), "restatus".into());
        let p = run(&records, std::slice::from_ref(&refused), false);
        assert_eq!((p.items[0].verdict, p.items[0].release), (Verdict::Incompatible, true));

        refused.annotations.insert(NOT_RESTORED_ANNOTATION.into(), "20250101T000000.000Z-000000".into());
        let p = run(&records, std::slice::from_ref(&refused), false);
        assert_eq!(p.items[0].verdict, Verdict::Restore, "another snapshot's mark");
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
        let k = key(crate::domain::identity::NAMESPACED_NAME, "ns/claim-1");
        let mut object = live("ServerBootConfiguration", "claim-1", std::slice::from_ref(&k), None);
        let pending = serde_json::value::RawValue::from_string(json!({"state": "Pending"}).to_string()).unwrap();
        let profile = Profile::metal_operator();
        let kind = profile.kind("ServerBootConfiguration").unwrap();
        object.status = Some(crate::domain::live::LiveStatus::new(kind, &pending));
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
        let records = Records::from_records(vec![record("Server", "s1", &[k], reserved())]);
        let input = PlanInput {
            profile: &profile,
            snapshot: &id,
            snapshot_time: Some(ts("2026-11-30T09:00:00.400Z")),
            records: &records,
            live: std::slice::from_ref(&object),
            force: false,
            explain: true,
        };
        assert_eq!(plan(&input).unwrap().items[0].verdict, Verdict::SkipNewer);
    }

    /// Issue 21, item 11: the backup machine's clock 5 minutes ahead of the target's API server,
    /// or behind it; metal-operator writes a status one minute after the real capture. It is
    /// never reverted; a status written well before the snapshot still is restored.
    #[test]
    fn clock_skew_of_five_minutes_either_way_never_reverts_a_status_written_after_the_capture() {
        let k = key("spec.systemUUID", "u1");
        let real_capture = ts("2026-11-30T09:00:00Z");
        let operator_wrote = ts("2026-11-30T09:01:00Z");
        let profile = Profile::metal_operator();
        let records = Records::from_records(vec![record("Server", "s1", std::slice::from_ref(&k), reserved())]);
        let verdict = |skew_secs: i64, written: Timestamp| {
            let mut object = live("Server", "s1", std::slice::from_ref(&k), Some(json!({"state": "Available"})));
            object.status_written_at = Some(written);
            let dated = real_capture + jiff::SignedDuration::from_secs(skew_secs);
            let id = SnapshotId::new(dated);
            let input = PlanInput {
                profile: &profile,
                snapshot: &id,
                snapshot_time: Some(dated),
                records: &records,
                live: std::slice::from_ref(&object),
                force: false,
                explain: false,
            };
            plan(&input).unwrap().items[0].verdict
        };
        for skew in [-300, -60, 0, 60, 240, 300] {
            assert_eq!(verdict(skew, operator_wrote), Verdict::SkipNewer, "backup clock {skew:+} s off");
        }
        // Restored: a status written an hour before the capture, whatever the skew.
        for skew in [-300, 0, 300] {
            assert_eq!(verdict(skew, ts("2026-11-30T08:00:00Z")), Verdict::Restore, "backup clock {skew:+} s off");
        }
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

    /// Plans `live` one object a page, as a restore does, against keys counted beforehand over
    /// `counted` (the first listing); returns (target or source name, verdict) per item.
    fn paged(records: &[Record], counted: &[LiveObject], live: &[LiveObject]) -> Vec<(String, Verdict)> {
        let profile = Profile::metal_operator();
        let kind = profile.kind("Server").unwrap();
        let id = SnapshotId::new(ts(SNAP));
        let records = Records::from_records(records.to_vec());
        let mut keys = LiveKeys::default();
        for object in counted {
            keys.add("Server", &object.keys);
        }
        let input = |live| PlanInput {
            profile: &profile,
            snapshot: &id,
            snapshot_time: Some(ts(SNAP)),
            records: &records,
            live,
            force: false,
            explain: false,
        };
        let mut matcher = KindMatcher::new(kind, &records, &keys);
        let mut items = Vec::new();
        for object in live {
            items.extend(matcher.page(&input(std::slice::from_ref(object)), 0..1).unwrap());
        }
        items.extend(matcher.finish(&input(&[])).unwrap());
        let name = |i: &PlanItem| i.target.as_ref().or(i.source.as_ref()).map(|o| o.name.clone()).unwrap_or_default();
        items.iter().map(|i| (name(i), i.verdict)).collect()
    }

    #[test]
    fn pages_are_planned_as_the_whole_kind_would_be() {
        let (k1, k2, k3) = (key("spec.systemUUID", "u1"), key("spec.systemUUID", "u2"), key("spec.systemUUID", "u3"));
        let records = [
            record("Server", "s1", std::slice::from_ref(&k1), reserved()),
            record("Server", "s2", std::slice::from_ref(&k2), reserved()),
            record("Server", "s3", std::slice::from_ref(&k3), reserved()),
        ];
        // u1 is carried by two objects on different pages; u2 by one; u3 by none.
        let live = [
            live("Server", "a", std::slice::from_ref(&k1), None),
            live("Server", "b", std::slice::from_ref(&k2), None),
            live("Server", "c", &[key("spec.systemUUID", "other")], None),
            live("Server", "d", std::slice::from_ref(&k1), None),
        ];
        let whole = run(&records, &live, false);
        let mut expected: Vec<(String, Verdict)> = whole
            .items
            .iter()
            .map(|i| (i.target.as_ref().or(i.source.as_ref()).unwrap().name.clone(), i.verdict))
            .collect();
        let mut got = paged(&records, &live, &live);
        expected.sort();
        got.sort();
        assert_eq!(got, expected);
        assert!(got.contains(&("s1".into(), Verdict::Ambiguous)), "{got:?}");
        assert!(!got.iter().any(|(n, _)| n == "a" || n == "d"), "a and d are named in s1's item: {got:?}");
    }

    #[test]
    fn objects_that_change_between_the_two_listings_are_never_written_twice() {
        let k1 = key("spec.systemUUID", "u1");
        let k2 = key("spec.systemUUID", "u2");
        let records = [
            record("Server", "s1", std::slice::from_ref(&k1), reserved()),
            record("Server", "s2", std::slice::from_ref(&k2), reserved()),
        ];
        let counted = [
            live("Server", "a", std::slice::from_ref(&k1), None),
            live("Server", "b", std::slice::from_ref(&k2), None),
        ];
        // Meanwhile b was deleted and x created with a's key, listed after a.
        let listed = [live("Server", "a", std::slice::from_ref(&k1), None), live("Server", "x", &[k1], None)];
        let got = paged(&records, &counted, &listed);
        assert_eq!(
            got,
            [("a".into(), Verdict::Restore), ("x".into(), Verdict::Ambiguous), ("s2".into(), Verdict::MissingOnTarget)]
        );
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

    /// Issue 21, item 2: a newer snapshot without an object's record ends no hold. A Server
    /// restatus restored and holds for a person (bound after the snapshot) stays held; one it
    /// quiesced and never restored is released as before.
    #[test]
    fn a_snapshot_without_the_record_of_a_held_object_does_not_release_it() {
        let k = key("spec.systemUUID", "u1");
        let mut held = live("Server", "s1", std::slice::from_ref(&k), Some(json!({"state": "Available"})));
        held.annotations.insert(OPERATION_ANNOTATION.into(), OPERATION_IGNORE.into());
        held.annotations.insert(QUIESCED_BY_ANNOTATION.into(), "restatus".into());
        held.annotations.insert(crate::domain::annotations::RESTORED_FROM_ANNOTATION.into(), "older".into());
        let other = record("Server", "s2", &[key("spec.systemUUID", "u2")], reserved());
        let p = run(std::slice::from_ref(&other), std::slice::from_ref(&held), false);
        let item = p.items.iter().find(|i| i.verdict == Verdict::NotInSnapshot).unwrap();
        assert!(!item.release, "a held object is not handed to metal-operator bare");
        assert!(item.reason.contains("keeps holding it"), "{}", item.reason);
        assert_eq!(p.writes(), 0);

        let mut quiesced = held.clone();
        quiesced.annotations.remove(crate::domain::annotations::RESTORED_FROM_ANNOTATION);
        let p = run(&[other], &[quiesced], false);
        let item = p.items.iter().find(|i| i.verdict == Verdict::NotInSnapshot).unwrap();
        assert!(item.release, "quiesced, never restored, nothing to restore: released");
    }

    #[test]
    fn a_snapshot_dated_ahead_of_the_clock_never_turns_a_newer_status_into_a_restore() {
        let k = key("spec.systemUUID", "u1");
        let mut object = live("Server", "s1", std::slice::from_ref(&k), Some(json!({"state": "Available"})));
        // Written an hour before the snapshot's (skewed) time, yet after its real capture.
        object.status_written_at = Some(ts("2026-11-30T08:00:00Z"));
        let profile = Profile::metal_operator();
        let id = SnapshotId::new(ts(SNAP));
        let records = Records::from_records(vec![record("Server", "s1", &[k], reserved())]);
        let mut input = PlanInput {
            profile: &profile,
            snapshot: &id,
            snapshot_time: None,
            records: &records,
            live: std::slice::from_ref(&object),
            force: false,
            explain: true,
        };
        let item = &plan(&input).unwrap().items[0];
        assert_eq!(item.verdict, Verdict::SkipNewer);
        assert!(item.reason.contains("dated ahead of this clock"), "{}", item.reason);
        // An empty status is still restored.
        let bare = LiveObject { status: None, ..object.clone() };
        input.live = std::slice::from_ref(&bare);
        assert_eq!(plan(&input).unwrap().items[0].verdict, Verdict::Restore);
    }

    #[test]
    fn only_snapshots_beyond_the_tolerance_count_as_ahead() {
        let id = SnapshotId::new(ts("2026-11-30T10:00:00Z"));
        let manifest = crate::fixtures::manifest(id, ts("2026-11-30T10:00:00Z"));
        assert_eq!(manifest.comparable_time(ts("2026-11-30T09:58:00Z")), Some(manifest.created_at));
        assert_eq!(manifest.comparable_time(ts("2026-11-30T09:00:00Z")), None, "an hour ahead");
    }
}
