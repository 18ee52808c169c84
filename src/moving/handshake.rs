//! The move handshake on the source cluster (`restatus controller --role source`).
//!
//! clusterctl pauses the Clusters of a move and then waits while any moved object carries
//! `clusterctl.cluster.x-k8s.io/block-move`. restatus uses that:
//!
//! 1. While no Cluster is paused, it keeps `block-move` on every CAPI Cluster. Clusters are the
//!    roots of every move graph, so they are certain to be in it; one object per cluster is
//!    the smallest such set.
//! 2. When Clusters become paused, it takes a **final snapshot**. If it is consistent, it records
//!    its id on the paused Clusters (`restatus.ironcore.dev/final-snapshot`: the phase survives a
//!    leader change or a failed step), sets
//!    metal-operator's `ignore` (marked as restatus's) on the profile's objects, so they arrive
//!    on the target quiesced, then removes `block-move`: the move proceeds with a snapshot that
//!    is fresh by construction. The quiesce compares each status it sees with the final
//!    snapshot's; one that moved on in between (metal-operator acted after the capture) makes
//!    it take the final snapshot again, now of quiesced objects. If a final snapshot is not
//!    consistent, `block-move` stays, a Warning Event on each Cluster and the log say why, and
//!    it tries again (after removing its `ignore`, when it had quiesced already).
//!    Before the final snapshot it checks the move set ([`crate::moving::graph`]): while
//!    clusterctl would leave objects of the profile behind (or lose them to the garbage
//!    collector), `block-move` stays, with the reason and the label commands in an annotation
//!    (`restatus.ironcore.dev/move-blocked`) and a Warning Event on the paused Clusters; a pause
//!    that began so is held to its end (clusterctl built its graph before it paused).
//! 3. When the Clusters are unpaused again and still here (the move was aborted), it removes
//!    the `ignore` it set and blocks again. When they are gone (the move completed), the
//!    cluster-scoped copies clusterctl leaves behind stay ignored: two metal-operators must
//!    not drive the same hardware.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::{Map, Value, json};
use tracing::{info, warn};

use crate::backup::{self, BackupOptions};
use crate::domain::annotations::{
    self, BLOCK_MOVE_ANNOTATION, FINAL_SNAPSHOT_ANNOTATION, MOVE_BLOCKED_ANNOTATION, QUIESCED_BY_ANNOTATION,
};
use crate::domain::identity::KindProfile;
use crate::domain::live::LiveObject;
use crate::domain::object::RawObject;
use crate::format::{Manifest, TrustedKeys};
use crate::k8s::{Annotated, annotate, events, get_object, list_objects};
use crate::moving::cluster::{self, ClusterView};
use crate::moving::graph::MovePlan;
use crate::moving::preflight::{Against, Staleness, move_plan};
use crate::store::{Accept, Loaded, SnapshotStore, choose_snapshot};
use crate::{Error, Result, TOOL_NAME};

/// The handshake's memory between two steps. It is also written on the paused Clusters (their
/// final-snapshot annotation) before anything is quiesced, so a new leader picks it up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Phase {
    /// The final snapshot taken for the current pause, once consistent.
    pub final_snapshot: Option<String>,
}

impl Phase {
    /// What the Clusters remember, where this instance remembers nothing (a new leader).
    pub fn recall(&mut self, clusters: &[ClusterView]) {
        if self.final_snapshot.is_none() {
            self.final_snapshot = clusters.iter().find_map(|c| c.final_snapshot.clone());
        }
    }
}

/// What to do next: pure, from the Clusters and the phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Put `block-move` on these Clusters.
    Block(Vec<ClusterView>),
    /// Clusters are paused and no final snapshot is taken yet: take it.
    FinalSnapshot,
    /// Final snapshot taken: let these paused Clusters go.
    Unblock(Vec<ClusterView>),
    /// The move was aborted: release restatus's `ignore`, then block again.
    Release,
    Nothing,
}

/// Why the move must stay blocked before its final snapshot, if it must: `clusterctl move`
/// would leave objects of the profile behind (`plan`), or did when this pause began: clusterctl
/// builds its object graph before it pauses the Clusters, so labels added during the pause do
/// not reach the move that is waiting; it must be started again.
pub fn move_hold(clusters: &[ClusterView], plan: &MovePlan) -> Option<String> {
    if !plan.complete() {
        let first: Vec<String> = plan.unmoved.iter().take(3).map(|u| format!("{}: {}", u.object, u.reason)).collect();
        let mut note = format!(
            "move blocked: clusterctl move would leave {} of the profile's objects (or kinds) behind; first: {}",
            plan.unmoved.len(),
            first.join("; ")
        );
        if !plan.commands.is_empty() {
            note += &format!(
                ". Label as clusterctl needs (on the source), then run clusterctl move again: {}",
                plan.commands.join(" && ")
            );
        }
        return Some(note);
    }
    clusters.iter().any(|c| c.paused && c.move_blocked.is_some()).then(|| {
        "move blocked: the move set was incomplete when this move began, and clusterctl built its object graph \
         then: stop clusterctl move, unpause the Clusters, and run it again"
            .to_string()
    })
}

pub fn next_step(clusters: &[ClusterView], phase: &Phase) -> Step {
    let paused: Vec<&ClusterView> = clusters.iter().filter(|c| c.paused).collect();
    if !paused.is_empty() {
        if phase.final_snapshot.is_none() {
            return Step::FinalSnapshot;
        }
        let blocked: Vec<ClusterView> = paused.into_iter().filter(|c| c.blocked_by_restatus).cloned().collect();
        return if blocked.is_empty() { Step::Nothing } else { Step::Unblock(blocked) };
    }
    if phase.final_snapshot.is_some() && !clusters.is_empty() {
        return Step::Release;
    }
    let unblocked: Vec<ClusterView> = clusters.iter().filter(|c| !c.blocked_by_restatus).cloned().collect();
    if unblocked.is_empty() { Step::Nothing } else { Step::Block(unblocked) }
}

pub struct Handshake {
    pub client: kube::Client,
    pub store: SnapshotStore,
    pub backup: BackupOptions,
    /// Pause between two looks at the Clusters.
    pub interval: Duration,
    /// Guard only the Clusters of this namespace (the one `clusterctl move -n` moves).
    pub cluster_namespace: Option<String>,
    /// The keys the final snapshot is read back with (the run's trusted keys and the public
    /// half of its signing key): `None`, not checked.
    trusted: Option<Arc<TrustedKeys>>,
    recorder: Recorder,
}

impl Handshake {
    pub fn new(
        client: kube::Client,
        store: SnapshotStore,
        backup: BackupOptions,
        interval: Duration,
        cluster_namespace: Option<String>,
    ) -> Self {
        let recorder = events::recorder(&client);
        Handshake { client, store, backup, interval, cluster_namespace, trusted: None, recorder }
    }

    /// Reads the final snapshot back verified with `keys` (those the run has): one a forger
    /// wrote at its name is not taken for it.
    pub fn with_trusted_keys(mut self, keys: Option<Arc<TrustedKeys>>) -> Self {
        self.trusted = keys;
        self
    }

    /// Runs until `shutdown` completes.
    pub async fn run(&self, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
        tokio::pin!(shutdown);
        let mut phase = Phase::default();
        loop {
            if let Err(e) = self.step(&mut phase).await {
                warn!(error = %e, "move handshake step failed; retrying");
            }
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }

    pub async fn step(&self, phase: &mut Phase) -> Result<()> {
        let clusters = self.clusters().await?;
        phase.recall(&clusters);
        // The move that was held is over (aborted): the next one is judged afresh.
        for c in clusters.iter().filter(|c| !c.paused && c.move_blocked.is_some()) {
            self.annotate_cluster(c, json!({ MOVE_BLOCKED_ANNOTATION: null })).await?;
        }
        match next_step(&clusters, phase) {
            Step::Nothing => {}
            Step::Block(clusters) => {
                for c in &clusters {
                    self.annotate_cluster(c, json!({ BLOCK_MOVE_ANNOTATION: TOOL_NAME })).await?;
                    info!(cluster = %format!("{}/{}", c.namespace, c.name), "block-move set until a final snapshot is taken");
                }
            }
            Step::FinalSnapshot => {
                if self.hold_for_move_set(&clusters).await? {
                    return Ok(());
                }
                let paused_at = Timestamp::now();
                let manifest = backup::run(&self.client, &self.store, &self.backup).await?;
                if manifest.is_consistent() {
                    info!(snapshot = %manifest.snapshot_id, %paused_at, "final snapshot is consistent");
                    phase.final_snapshot = Some(manifest.snapshot_id.to_string());
                    // Remembered on the Clusters before anything is quiesced: whoever leads next
                    // (or this one after a failed quiesce) releases what was quiesced if the move
                    // is aborted, and finishes the quiesce before letting the move go.
                    for c in clusters.iter().filter(|c| c.paused) {
                        self.annotate_cluster(c, json!({ FINAL_SNAPSHOT_ANNOTATION: phase.final_snapshot })).await?;
                        self.event(c, EventType::Normal, "FinalSnapshot", final_note(&manifest)).await;
                    }
                    // Unblock in the same step: clusterctl is waiting.
                    if let Step::Unblock(paused) = next_step(&clusters, phase) {
                        self.unblock(&paused, phase).await?;
                    }
                } else {
                    let note = blocked_note(&manifest);
                    warn!(snapshot = %manifest.snapshot_id, "{note}");
                    for c in clusters.iter().filter(|c| c.paused) {
                        self.event(c, EventType::Warning, "MoveBlocked", note.clone()).await;
                    }
                }
            }
            Step::Unblock(clusters) => self.unblock(&clusters, phase).await?,
            Step::Release => {
                let released = self.release().await?;
                for c in clusters.iter().filter(|c| c.final_snapshot.is_some()) {
                    self.annotate_cluster(c, json!({ FINAL_SNAPSHOT_ANNOTATION: null })).await?;
                }
                info!(released, "Clusters unpaused: the move was aborted; restatus's ignore removed");
                *phase = Phase::default();
            }
        }
        Ok(())
    }

    /// Quiesces every object not quiesced yet (all of them after the final snapshot; the rest
    /// after a failed quiesce or a leader change), then lets the move go with a final snapshot
    /// that holds every status as it was quiesced: the statuses the quiesce saw are compared
    /// with the final snapshot's, and when one moved on in between (metal-operator acted after
    /// the capture) the snapshot is taken again, of objects that can no longer change.
    async fn unblock(&self, clusters: &[ClusterView], phase: &mut Phase) -> Result<()> {
        let loaded = match &phase.final_snapshot {
            Some(id) => self.load(id).await,
            None => None,
        };
        let against = loaded.as_ref().map(|l| Against::new(&l.records));
        let (quiesced, moved) = self.quiesce(against.as_ref()).await?;
        info!(quiesced, snapshot = ?phase.final_snapshot, "objects quiesced");
        if (loaded.is_none() || !moved.is_empty()) && !self.retake(clusters, phase, &moved).await? {
            return Ok(());
        }
        for c in clusters {
            let annotations = json!({ BLOCK_MOVE_ANNOTATION: null, FINAL_SNAPSHOT_ANNOTATION: phase.final_snapshot });
            self.annotate_cluster(c, annotations).await?;
            info!(cluster = %format!("{}/{}", c.namespace, c.name), snapshot = ?phase.final_snapshot, "block-move removed: the move may proceed");
        }
        Ok(())
    }

    /// The final snapshot, read back and verified; `None` (logged) when it cannot be: then
    /// nothing shows its statuses are the quiesced ones, and it is taken again.
    async fn load(&self, id: &str) -> Option<Loaded> {
        let accept = Accept {
            inconsistent: false,
            this_cluster: None,
            same_cluster: true,
            trusted: self.trusted.clone(),
            ..Accept::default()
        };
        let loaded = match id.parse() {
            Ok(id) => choose_snapshot(&self.store, Some(&id), &accept).await,
            Err(e) => Err(e),
        };
        loaded.inspect_err(|e| warn!(snapshot = id, error = %e, "cannot read the final snapshot back")).ok()
    }

    /// Takes the final snapshot again, now that every object is quiesced: the statuses of
    /// `moved` changed after the first one was captured. True when it is consistent (it is then
    /// the final snapshot, on the Clusters too). When it is not (an object was quiesced in the
    /// middle of settling), restatus's ignore is removed so that metal-operator finishes, and
    /// the handshake starts over with a new final snapshot; block-move stays.
    async fn retake(&self, clusters: &[ClusterView], phase: &mut Phase, moved: &BTreeSet<String>) -> Result<bool> {
        let first: Vec<&String> = moved.iter().take(5).collect();
        info!(moved = moved.len(), objects = ?first, snapshot = ?phase.final_snapshot,
            "statuses moved on between the final snapshot and the quiesce (or it cannot be read back): taking it again");
        let manifest = backup::run(&self.client, &self.store, &self.backup).await?;
        if manifest.is_consistent() {
            info!(snapshot = %manifest.snapshot_id, "final snapshot taken again, of quiesced objects; it is consistent");
            phase.final_snapshot = Some(manifest.snapshot_id.to_string());
            for c in clusters {
                self.annotate_cluster(c, json!({ FINAL_SNAPSHOT_ANNOTATION: phase.final_snapshot })).await?;
                self.event(c, EventType::Normal, "FinalSnapshot", final_note(&manifest)).await;
            }
            return Ok(true);
        }
        let released = self.release().await?;
        let note = blocked_note(&manifest);
        warn!(snapshot = %manifest.snapshot_id, released, "{note}");
        for c in clusters {
            self.event(c, EventType::Warning, "MoveBlocked", note.clone()).await;
            self.annotate_cluster(c, json!({ FINAL_SNAPSHOT_ANNOTATION: null })).await?;
        }
        *phase = Phase::default();
        Ok(false)
    }

    /// Keeps `block-move` (true) while `clusterctl move` would leave objects of the profile
    /// behind: the reason on the paused Clusters (annotation and Warning Event) and in the log.
    async fn hold_for_move_set(&self, clusters: &[ClusterView]) -> Result<bool> {
        let (selector, namespace) = (self.backup.selector.as_deref(), self.cluster_namespace.as_deref());
        let plan = move_plan(&self.client, &self.backup.profile, selector, namespace).await?;
        let Some(note) = move_hold(clusters, &plan) else { return Ok(false) };
        warn!(unmoved = plan.unmoved.len(), "{note}");
        for c in clusters.iter().filter(|c| c.paused) {
            if c.move_blocked.as_deref() != Some(note.as_str()) {
                self.annotate_cluster(c, json!({ MOVE_BLOCKED_ANNOTATION: note })).await?;
                self.event(c, EventType::Warning, "MoveBlocked", events::note(note.clone())).await;
            }
        }
        Ok(true)
    }

    async fn clusters(&self) -> Result<Vec<ClusterView>> {
        cluster::clusters(&self.client, self.cluster_namespace.as_deref()).await
    }

    async fn annotate_cluster(&self, c: &ClusterView, annotations: Value) -> Result<()> {
        // A Cluster deleted meanwhile is gone from the next step's view: nothing to annotate.
        annotate(&self.client, &cluster::cluster_kind(), Some(&c.namespace), &c.name, None, &annotations).await?;
        Ok(())
    }

    /// Sets restatus's `ignore` on every profile object not quiesced already (keeping any
    /// other operation value for the release). Returns how many, and the objects whose status
    /// (as the quiesce saw it) is not the one `final_snapshot` holds for them.
    async fn quiesce(&self, final_snapshot: Option<&Against<'_>>) -> Result<(usize, BTreeSet<String>)> {
        let moved = Mutex::new(BTreeSet::new());
        let seen = |kind: &KindProfile, object: &RawObject<'_>| {
            let object = LiveObject::from_raw(kind, object);
            if final_snapshot.is_some_and(|s| s.compare(kind, &object) == Some(Staleness::Changed)) {
                moved.lock().unwrap_or_else(|e| e.into_inner()).insert(object.object_ref().to_string());
            }
        };
        let quiesce =
            |a: &BTreeMap<String, String>| (!annotations::is_quiesced(a)).then(|| annotations::quiesce_annotations(a));
        let count = self.for_each_object(quiesce, seen).await?;
        Ok((count, moved.into_inner().unwrap_or_else(|e| e.into_inner())))
    }

    /// Removes the `ignore` restatus set, putting back what it replaced. Returns how many.
    async fn release(&self) -> Result<usize> {
        let release = |a: &BTreeMap<String, String>| {
            a.contains_key(QUIESCED_BY_ANNOTATION).then(|| annotations::release_annotations(a))
        };
        self.for_each_object(release, |_: &KindProfile, _: &RawObject<'_>| {}).await
    }

    /// Patches the annotations of every profile object for which `changes` has any, each on
    /// the version it was listed at: when the object changed in between (metal-operator
    /// consumed a power reset, a person parked it), it is read again and `changes` decided
    /// again on what it carries now, so an operation already done is never kept for a replay.
    /// Each object as listed, and as read again after a conflict, is shown to `seen`.
    async fn for_each_object(
        &self,
        changes: impl Fn(&BTreeMap<String, String>) -> Option<Map<String, Value>>,
        seen: impl Fn(&KindProfile, &RawObject<'_>),
    ) -> Result<usize> {
        let mut count = 0;
        for kind in self.backup.profile.kinds.iter().filter(|k| !k.is_denied()) {
            let mut targets: Vec<Target> = Vec::new();
            list_objects(&self.client, kind, &self.backup.page(), |object| {
                seen(kind, object);
                if let Some(changes) = changes(&object.meta.annotations.clone().unwrap_or_default()) {
                    targets.push(Target::of(object, changes));
                }
                Ok(())
            })
            .await?;
            for target in targets {
                if self.annotate_object(kind, target, &changes, &seen).await? {
                    count += 1;
                }
            }
        }
        Ok(count)
    }

    /// One object of [`Handshake::for_each_object`]: true when it was annotated.
    async fn annotate_object(
        &self,
        kind: &KindProfile,
        mut target: Target,
        changes: &impl Fn(&BTreeMap<String, String>) -> Option<Map<String, Value>>,
        seen: &impl Fn(&KindProfile, &RawObject<'_>),
    ) -> Result<bool> {
        let namespace = target.namespace.clone();
        for _ in 0..CONFLICT_RETRIES {
            let listed = !target.uid.is_empty() && !target.resource_version.is_empty();
            let version = listed.then_some((target.uid.as_str(), target.resource_version.as_str()));
            match annotate(&self.client, kind, namespace.as_deref(), &target.name, version, &target.changes).await? {
                Annotated::Done => return Ok(true),
                Annotated::Gone => return Ok(false),
                Annotated::Conflict => {}
            }
            let context = || format!("re-read {} {}", kind.kind, target.name);
            let fresh = match get_object(&self.client, kind, namespace.as_deref(), &target.name).await {
                Ok(fresh) => fresh,
                Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(false),
                Err(e) => return Err(Error::kube(context(), e)),
            };
            let object = RawObject::parse(&fresh).map_err(|e| Error::InvalidObject {
                kind: kind.qualified_kind(),
                name: target.name.clone(),
                reason: e.to_string(),
            })?;
            seen(kind, &object);
            match changes(&object.meta.annotations.clone().unwrap_or_default()) {
                Some(now) => target = Target::of(&object, now),
                None => return Ok(false),
            }
        }
        Err(Error::KeptChanging { kind: kind.qualified_kind(), name: target.name, attempts: CONFLICT_RETRIES })
    }

    async fn event(&self, c: &ClusterView, type_: EventType, reason: &str, note: String) {
        let reference = events::reference(&cluster::cluster_kind(), Some(&c.namespace), &c.name, &c.uid);
        let event =
            Event { type_, reason: reason.into(), note: Some(note), action: "MoveHandshake".into(), secondary: None };
        events::publish(&self.recorder, &event, &reference).await;
    }
}

/// Conditional annotation patches retried at most, per object.
const CONFLICT_RETRIES: usize = 5;

/// An object to annotate, at the version its `changes` were decided on.
struct Target {
    namespace: Option<String>,
    name: String,
    uid: String,
    resource_version: String,
    changes: Map<String, Value>,
}

impl Target {
    fn of(object: &RawObject<'_>, changes: Map<String, Value>) -> Self {
        Target {
            namespace: object.meta.namespace.as_ref().map(|n| n.to_string()),
            name: object.meta.name.to_string(),
            uid: object.meta.uid.as_deref().unwrap_or_default().to_string(),
            resource_version: object.meta.resource_version.as_deref().unwrap_or_default().to_string(),
            changes,
        }
    }
}

fn final_note(manifest: &Manifest) -> String {
    format!(
        "final snapshot {} is consistent ({} records); block-move removed",
        manifest.snapshot_id, manifest.payload.records
    )
}

fn blocked_note(manifest: &Manifest) -> String {
    let summary = manifest.consistency.as_ref().map_or_else(|| "0 reasons".into(), |c| c.summary());
    format!(
        "move blocked: final snapshot {} is inconsistent ({summary}); retrying. \
         Override: kubectl annotate cluster <name> {BLOCK_MOVE_ANNOTATION}-",
        manifest.snapshot_id
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str, paused: bool, blocked: bool) -> ClusterView {
        ClusterView {
            namespace: "ns".into(),
            name: name.into(),
            uid: name.into(),
            paused,
            infrastructure_provisioned: true,
            control_plane_initialized: true,
            blocked_by_restatus: blocked,
            final_snapshot: None,
            move_blocked: None,
        }
    }

    #[test]
    fn a_new_leader_recalls_the_final_snapshot_from_the_clusters() {
        let mut let_go = cluster("a", true, false);
        let_go.final_snapshot = Some("S".into());
        let mut phase = Phase::default();
        phase.recall(std::slice::from_ref(&let_go));
        assert_eq!(phase.final_snapshot.as_deref(), Some("S"));
        assert_eq!(next_step(std::slice::from_ref(&let_go), &phase), Step::Nothing, "no second final snapshot");
        // The move is aborted under the new leader: it releases what the old one quiesced.
        let aborted = ClusterView { paused: false, ..let_go };
        let mut phase = Phase::default();
        phase.recall(std::slice::from_ref(&aborted));
        assert_eq!(next_step(&[aborted], &phase), Step::Release);
    }

    /// Issue 37 (F115): the handshake keeps block-move while the move would leave objects
    /// behind, says how to fix it, and holds a pause that began with an incomplete move set
    /// even once the labels are there (clusterctl's graph is built before its pause).
    #[test]
    fn an_incomplete_move_set_holds_the_move_and_so_does_a_pause_that_began_with_one() {
        let paused = [cluster("a", true, true)];
        let incomplete = MovePlan {
            unmoved: vec![crate::moving::graph::Unmoved {
                object: crate::format::ObjectRef { kind: "CustomResourceDefinition".into(), namespace: None, name: "servers.metal.ironcore.dev".into() },
                reason: "2 Server will not move: the CRD servers.metal.ironcore.dev lacks the label clusterctl.cluster.x-k8s.io".into(),
            }],
            commands: vec!["kubectl label crd servers.metal.ironcore.dev clusterctl.cluster.x-k8s.io=".into()],
        };
        let note = move_hold(&paused, &incomplete).unwrap();
        assert!(
            note.contains("2 Server will not move") && note.contains("kubectl label crd servers.metal.ironcore.dev"),
            "{note}"
        );
        assert_eq!(move_hold(&paused, &MovePlan::default()), None, "complete: the handshake goes on");
        let held = [ClusterView { move_blocked: Some(note), ..cluster("a", true, true) }];
        let again = move_hold(&held, &MovePlan::default()).unwrap();
        assert!(again.contains("run it again"), "{again}");
        let aborted = [ClusterView { paused: false, ..held[0].clone() }];
        assert_eq!(move_hold(&aborted, &MovePlan::default()), None, "a new pause is judged afresh");
    }

    #[test]
    fn unpaused_clusters_are_blocked_once() {
        let clusters = [cluster("a", false, false), cluster("b", false, true)];
        assert_eq!(next_step(&clusters, &Phase::default()), Step::Block(vec![cluster("a", false, false)]));
        assert_eq!(next_step(&[cluster("b", false, true)], &Phase::default()), Step::Nothing);
    }

    #[test]
    fn a_pause_asks_for_the_final_snapshot_then_unblocks() {
        let clusters = [cluster("a", true, true)];
        assert_eq!(next_step(&clusters, &Phase::default()), Step::FinalSnapshot);
        let taken = Phase { final_snapshot: Some("S".into()) };
        assert_eq!(next_step(&clusters, &taken), Step::Unblock(vec![cluster("a", true, true)]));
        assert_eq!(next_step(&[cluster("a", true, false)], &taken), Step::Nothing, "already let go");
    }

    #[test]
    fn an_aborted_move_releases_and_a_completed_one_does_not() {
        let taken = Phase { final_snapshot: Some("S".into()) };
        assert_eq!(next_step(&[cluster("a", false, false)], &taken), Step::Release, "unpaused and still here: aborted");
        assert_eq!(next_step(&[], &taken), Step::Nothing, "gone: moved; the leftovers stay ignored");
    }

    #[test]
    fn the_blocked_note_says_why_and_how_to_override() {
        let capture = crate::format::CaptureSummary {
            consistency: crate::format::Consistency {
                consistent: false,
                attempts: 3,
                reasons: vec![crate::format::Inconsistency {
                    object: crate::format::ObjectRef {
                        kind: "ServerClaim".into(),
                        namespace: Some("n".into()),
                        name: "c".into(),
                    },
                    reason: "binding".into(),
                }],
                reason_count: 1,
            },
            ..crate::format::CaptureSummary::empty()
        };
        let summary = crate::format::PayloadSummary {
            size: 0,
            uncompressed_size: 0,
            sha256: String::new(),
            records: 0,
            frames: 0,
            encryption: None,
        };
        let id = crate::format::SnapshotId::new(Timestamp::now());
        let manifest = Manifest::new("c", id, Timestamp::now(), "p", capture, summary);
        let note = blocked_note(&manifest);
        assert!(note.contains("inconsistent (1 reasons, first: ServerClaim n/c: binding)"), "{note}");
        assert!(note.contains("kubectl annotate cluster <name> clusterctl.cluster.x-k8s.io/block-move-"), "{note}");
    }

    /// Issue 21, item 5 (F57): metal-operator consumes a power reset between the handshake's
    /// listing and its quiesce. The quiesce is conditional on the listed version: it conflicts,
    /// the Server is read again, and the ignore is set without keeping the reset in
    /// `operation-was` (the target's release would have replayed it: a second reset). The
    /// reset changed the Server's status after the final snapshot: the quiesce names it as
    /// moved on, so the final snapshot is taken again (F62).
    /// F147: the handshake reads its final snapshot back with the run's keys: a manifest a
    /// forger wrote at its name (unsigned) is not taken for it (and the snapshot is taken
    /// again); the one the run signed is.
    #[tokio::test]
    async fn the_final_snapshot_is_read_back_with_the_runs_keys() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let key = crate::format::SigningKey::generate();
        let keys = Arc::new(TrustedKeys::new([key.public_key()]));
        let record = crate::fixtures::record("Server", "s1", &[crate::fixtures::uuid("u1")], serde_json::json!({}));
        let records = [record];
        let signed = crate::fixtures::snapshot(&records).signed_with(&key).write(&store).await;
        let forged =
            crate::fixtures::snapshot(&records).at(crate::fixtures::ts("2026-11-30T10:00:00Z")).write(&store).await;
        let (client, _api) = crate::fixtures::api::client();
        let backup = BackupOptions::new(crate::domain::identity::Profile::metal_operator());
        let handshake = Handshake::new(client, store, backup, Duration::from_secs(1), None);
        assert!(handshake.load(forged.snapshot_id.as_str()).await.is_some(), "without keys: not checked");
        let handshake = handshake.with_trusted_keys(Some(keys));
        assert!(handshake.load(forged.snapshot_id.as_str()).await.is_none(), "a forged final snapshot was believed");
        assert!(handshake.load(signed.snapshot_id.as_str()).await.is_some());
    }

    #[tokio::test]
    async fn a_reset_consumed_between_the_listing_and_the_quiesce_is_not_kept_for_a_replay() {
        use crate::fixtures::api::{self, answer, conflict};
        use http::{Method, StatusCode};
        use serde_json::json;
        let on = json!({"state": "Reserved", "powerState": "On"});
        let server = |rv: &str, annotations: Value, status: &Value| {
            json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
                   "metadata": {"name": "s1", "uid": "uid-s1", "resourceVersion": rv, "annotations": annotations},
                   "spec": {"systemUUID": "u1"}, "status": status})
        };
        let final_snapshot = crate::format::Records::from_records(vec![crate::fixtures::record(
            "Server",
            "s1",
            &[crate::fixtures::uuid("u1")],
            on.clone(),
        )]);
        let (client, mut api) = api::client();
        let script = tokio::spawn(async move {
            let listed = server("1", json!({annotations::OPERATION_ANNOTATION: "ForceReset"}), &on);
            let page = json!({"kind": "ServerList", "metadata": {"continue": ""}, "items": [listed]});
            let (method, _, _) = answer(&mut api, StatusCode::OK, page.to_string()).await;
            assert_eq!(method, Method::GET, "the listing");
            let (method, _, body) = answer(&mut api, StatusCode::CONFLICT, conflict()).await;
            assert_eq!(method, Method::PATCH);
            assert_eq!(body["metadata"]["resourceVersion"], "1", "conditional on the listed version");
            assert_eq!(body["metadata"]["annotations"][annotations::OPERATION_WAS_ANNOTATION], "ForceReset");
            // Meanwhile metal-operator reset the machine and removed the annotation.
            let off = json!({"state": "Reserved", "powerState": "Off"});
            let (method, path, _) = answer(&mut api, StatusCode::OK, server("2", json!({}), &off).to_string()).await;
            assert_eq!((method, path.as_str()), (Method::GET, "/apis/metal.ironcore.dev/v1alpha1/servers/s1"));
            let (method, _, body) = answer(&mut api, StatusCode::OK, server("3", json!({}), &off).to_string()).await;
            assert_eq!(method, Method::PATCH);
            assert_eq!(
                body,
                json!({"metadata": {"uid": "uid-s1", "resourceVersion": "2", "annotations": {
                    annotations::OPERATION_ANNOTATION: "ignore", QUIESCED_BY_ANNOTATION: "restatus"}}}),
                "quiesced as it is now: nothing kept to replay"
            );
        });
        let metal = crate::domain::identity::Profile::metal_operator();
        let profile = crate::domain::identity::Profile { kinds: vec![metal.kind("Server").unwrap().clone()], ..metal };
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let handshake = Handshake::new(client, store, BackupOptions::new(profile), Duration::from_secs(1), None);
        let (quiesced, moved) = handshake.quiesce(Some(&Against::new(&final_snapshot))).await.unwrap();
        script.await.unwrap();
        assert_eq!(quiesced, 1);
        assert_eq!(
            moved.into_iter().collect::<Vec<_>>(),
            ["Server s1"],
            "its status moved on after the final snapshot"
        );
    }
}
