//! Reconciling: each dirty object planned on its neighbourhood (its records, the live objects
//! that share their keys) with the one-shot restore's plan, and applied when it writes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::info;

use super::Context;
use super::index::{LiveIndex, SnapshotIndex, Uid};
use crate::domain::identity::KindProfile;
use crate::domain::live::LiveObject;
use crate::domain::pairing::ServerIdentity;
use crate::format::Records;
use crate::k8s::Writer;
use crate::restore::Applier;
use crate::restore::hold::{self, Partners};
use crate::restore::plan::{self, PlanInput, Verdict};
use crate::{Error, Result};

/// What the main loop does with an object after its reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Nothing more until it (or a partner, or the snapshot) changes.
    Settled,
    /// Tried again after a backoff: held on purpose (see [`reconcile`]), not an error.
    Retry,
}

/// What became of a dirty object: what the main loop does next with it, and the
/// resourceVersions its writes made (the watch events that carry them are echoes of this
/// reconcile: nothing to reconcile again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Done {
    pub next: Next,
    pub wrote: Vec<String>,
}

impl From<Next> for Done {
    fn from(next: Next) -> Self {
        Done { next, wrote: vec![] }
    }
}

/// A dirty object's reconcile as it starts: what it is planned on, read from the indexes
/// then (the main loop goes on changing them while it runs).
pub(super) struct Work {
    kind: KindProfile,
    snapshot: Arc<SnapshotIndex>,
    records: Records,
    objects: Vec<LiveObject>,
    servers: Vec<ServerIdentity>,
    uid: Uid,
    seen: Instant,
    failing: bool,
}

impl Work {
    /// Reads the neighbourhood of the dirty object `uid` of `kind`, dirty since `seen`, whose
    /// last restore failed if `failing`. `None` for an object the index no longer holds.
    pub(super) fn prepare(
        kind: &KindProfile,
        snapshot: &Arc<SnapshotIndex>,
        live: &LiveIndex,
        (uid, seen, failing): (Uid, Instant, bool),
    ) -> Option<Result<Work>> {
        let (records, objects) = match live.neighbourhood(&uid, snapshot)? {
            Ok(neighbourhood) => neighbourhood,
            Err(e) => return Some(Err(e)),
        };
        let servers = match bmc_servers(kind, snapshot, live, &objects, &uid) {
            Ok(servers) => servers,
            Err(e) => return Some(Err(e)),
        };
        let kind = kind.clone();
        Some(Ok(Work { kind, snapshot: snapshot.clone(), records, objects, servers, uid, seen, failing }))
    }

    /// Plans and applies it (see [`reconcile`]).
    pub(super) async fn run(self, ctx: Arc<Context>) -> Result<Done> {
        let dirty = Dirty { uid: &self.uid, seen: self.seen, failing: self.failing };
        let neighbourhood = (&self.records, &self.objects[..], &self.servers[..]);
        let done = reconcile(&ctx, &self.kind, &self.snapshot, neighbourhood, dirty).await;
        // The limit moves only on the answers to writes: exported as each object ends.
        if let Some(limit) = ctx.options.write_limit.as_ref() {
            ctx.metrics.write_limit(limit);
        }
        done
    }
}

/// The live Servers (from the live index) that the dirty object `uid`, a BMC restatus holds,
/// may wait for: those that share an identity key with a Server the snapshot holds for it
/// (see [`hold::bmc_server_keys`]). Nothing for other objects.
fn bmc_servers(
    kind: &KindProfile,
    snapshot: &SnapshotIndex,
    live: &LiveIndex,
    objects: &[LiveObject],
    uid: &str,
) -> Result<Vec<ServerIdentity>> {
    let Some(object) = objects.iter().find(|o| o.uid == uid) else { return Ok(vec![]) };
    let Some(keys) = hold::bmc_server_keys(kind, object, &snapshot.records, &snapshot.system_servers)? else {
        return Ok(vec![]);
    };
    let servers = live.carrying("Server", keys);
    Ok(servers.into_iter().map(|s| ServerIdentity { name: s.name, keys: s.keys }).collect())
}

/// A dirty object: its uid, when its change was seen, and whether its last restore failed.
struct Dirty<'a> {
    uid: &'a str,
    seen: Instant,
    failing: bool,
}

/// One object: the plan's verdict for it, applied if it writes (with its records, the live
/// objects around it and, for a BMC, its Servers on the target).
async fn reconcile(
    ctx: &Context,
    kind: &KindProfile,
    snapshot: &SnapshotIndex,
    (records, objects, servers): (&Records, &[LiveObject], &[ServerIdentity]),
    Dirty { uid, seen, failing }: Dirty<'_>,
) -> Result<Done> {
    let manifest = &snapshot.manifest;
    let input = PlanInput {
        profile: &ctx.options.profile,
        snapshot: &manifest.snapshot_id,
        snapshot_time: manifest.comparable_time(jiff::Timestamp::now()),
        records,
        live: objects,
        force: ctx.options.force,
        explain: false,
    };
    let plan = plan::plan(&input)?;
    let mine = |i: &&plan::PlanItem| i.live.is_some_and(|l| objects[l].uid == uid);
    let Some(item) = plan.items.iter().find(mine) else { return Ok(Next::Settled.into()) };
    ctx.metrics.decided(item.verdict);
    if failing && item.verdict == Verdict::NotInSnapshot && item.release {
        // Its restore failed; a newer snapshot without its record does not make it safe to
        // hand over bare. It stays quiesced (and retried) until a snapshot restores it or a
        // person removes the ignore.
        info!(uid, "keeping restatus's ignore: its restore failed and this snapshot has no record for it");
        return Ok(Next::Retry.into());
    }
    if !item.writes() {
        return Ok(Next::Settled.into());
    }
    let writer = ctx.writer.get_or_try_init(|| Writer::new(&ctx.client, &ctx.options.profile)).await?;
    let applier = Applier::new(writer, &ctx.options.profile, manifest, records, ctx.options.force)
        .with_partners(Partners::indexed(&snapshot.records, &snapshot.system_servers, servers, &ctx.seen));
    let outcome = applier.apply_item(kind, item, objects).await;
    {
        let mut summaries = ctx.summaries.lock().unwrap_or_else(|e| e.into_inner());
        summaries.since.get_or_insert_with(Instant::now);
        let key = (kind.kind.clone(), manifest.snapshot_id.to_string());
        summaries.by_kind.entry(key).or_default().add(&outcome);
    }
    if let Some(reason) = outcome.error {
        return Err(Error::RestoreFailed { object: outcome.object.to_string(), reason });
    }
    if outcome.verdict == Verdict::Restore {
        ctx.metrics.restore_latency.observe(seen.elapsed().as_secs_f64());
        info!(object = %outcome.object, snapshot = %manifest.snapshot_id, "status restored");
    }
    Ok(Done { next: Next::Settled, wrote: outcome.versions })
}

/// How long a long restore goes between summary Events.
const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// Publishes one summary Event per kind and snapshot for what the reconciles wrote since the
/// last ones, once there is nothing left to reconcile (`drained`), or every
/// [`SUMMARY_EVERY`] while a long restore goes on; objects that need attention have Events of
/// their own (see `restore::apply`).
pub(super) fn summarize(ctx: &Context, kinds: &[KindProfile], drained: bool) {
    let due = {
        let mut summaries = ctx.summaries.lock().unwrap_or_else(|e| e.into_inner());
        let ready = summaries.since.is_some_and(|since| drained || since.elapsed() >= SUMMARY_EVERY);
        if !ready {
            return;
        }
        summaries.since = None;
        std::mem::take(&mut summaries.by_kind)
    };
    let Some(writer) = ctx.writer.get() else { return };
    for ((kind, snapshot), summary) in due.iter().filter(|(_, s)| !s.is_empty()) {
        if let Some(kind) = kinds.iter().find(|k| &k.kind == kind) {
            // Spawned: the loop never waits on an API server for an Event (see `Writer`).
            tokio::spawn(writer.summary_event_owned(kind, summary.event(&kind.plural, snapshot)));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::tests::context;
    use super::*;
    use crate::domain::annotations::{OPERATION_ANNOTATION, OPERATION_IGNORE, QUIESCED_BY_ANNOTATION};
    use crate::fixtures::{self, SNAPSHOT_TIME, record, ts, uuid};
    use crate::format::SnapshotId;

    /// The keep-quiesced rule: an object restatus quiesced and failed to restore is not handed
    /// to metal-operator bare because a newer snapshot has no record for it. It stays quiesced
    /// and is tried again, with no request at all. Not failing, the same object is released:
    /// its writes start (and fail at the first request, as no API server answers).
    #[tokio::test]
    async fn a_failing_object_the_snapshot_has_no_record_for_stays_quiesced_and_is_retried() {
        let ctx = context();
        let kind = ctx.options.profile.kind("Server").unwrap().clone();
        let at = ts(SNAPSHOT_TIME);
        let other = record("Server", "other", &[uuid("other")], json!({"state": "Available"}));
        let snapshot = Arc::new(SnapshotIndex::new(
            fixtures::manifest(SnapshotId::new(at), at),
            Records::from_records(vec![other]),
        ));
        let mut quiesced = fixtures::live("Server", "s", &[uuid("s")], None);
        quiesced.annotations.insert(OPERATION_ANNOTATION.into(), OPERATION_IGNORE.into());
        quiesced.annotations.insert(QUIESCED_BY_ANNOTATION.into(), "restatus".into());
        let mut live = LiveIndex::default();
        let uid = live.upsert(quiesced);
        let reconcile = |failing| {
            let work = Work::prepare(&kind, &snapshot, &live, (uid.clone(), Instant::now(), failing));
            work.expect("in the index").expect("prepared").run(ctx.clone())
        };

        let kept = reconcile(true).await.expect("no request made");
        assert_eq!(kept, Done { next: Next::Retry, wrote: vec![] }, "kept quiesced, tried again");
        let released = reconcile(false).await;
        assert!(matches!(released, Err(Error::Kube { .. })), "not failing: its writes start: {released:?}");
    }
}
