//! Move readiness: everything that makes a `clusterctl move` unsafe right now, one reason per
//! object. Pure evaluation ([`evaluate`]) over what [`gather`] reads from the source cluster:
//!
//! - the capture consistency verdict on the live objects (pairing, binding claims, Servers in
//!   Initial/Discovery, objects being deleted, duplicate identity keys);
//! - what clusterctl itself refuses: Machines without `status.nodeRef`, Clusters whose
//!   infrastructure or control plane is not up, Clusters already paused;
//! - backup freshness: objects whose status differs from the newest consistent snapshot;
//! - the move set: objects of the profile that `clusterctl move` would leave behind, or that
//!   the garbage collector would delete on the source ([`crate::moving::graph`]), with the
//!   `kubectl label` commands that make the move carry them.
//!
//! [`wait`] re-evaluates on watch events until the cluster is ready or a timeout passes.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use tracing::info;

use crate::backup::{self, BackupOptions};
use crate::domain::identity::{KindProfile, Profile};
use crate::domain::live::LiveObject;
use crate::format::{Consistency, KeyDigest, ObjectRef, Records};
use crate::k8s::watch::changes;
use crate::k8s::{DEFAULT_PAGE_SIZE, PageRequest};
use crate::moving::cluster::{self, ClusterView, MachineView};
use crate::moving::discover::read_move_inputs;
use crate::moving::graph::{self, MovePlan};
use crate::moving::live::read_live;
use crate::store::{Accept, SnapshotStore, choose_snapshot, newest_verified};
use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Blocker {
    pub object: ObjectRef,
    pub reason: String,
}

/// Everything the verdict looks at.
pub struct Observed {
    pub consistency: Consistency,
    pub clusters: Vec<ClusterView>,
    pub machines: Vec<MachineView>,
    /// Objects whose status is not what the newest consistent snapshot holds (`None`: not
    /// checked, e.g. a fresh snapshot is about to be taken).
    pub stale: Option<Vec<Blocker>>,
    /// What clusterctl would leave behind of the profile's objects.
    pub move_plan: MovePlan,
}

pub fn evaluate(observed: &Observed) -> Vec<Blocker> {
    let mut out: Vec<Blocker> = observed
        .consistency
        .reasons
        .iter()
        .map(|r| Blocker { object: r.object.clone(), reason: r.reason.clone() })
        .collect();
    for c in &observed.clusters {
        let object = ObjectRef { kind: "Cluster".into(), namespace: Some(c.namespace.clone()), name: c.name.clone() };
        let reason = if c.paused {
            Some("already paused (an earlier move may have stopped half-way)")
        } else if !c.infrastructure_provisioned {
            Some("still provisioning its infrastructure (clusterctl refuses to move)")
        } else if !c.control_plane_initialized {
            Some("control plane not initialized yet (clusterctl refuses to move)")
        } else {
            None
        };
        out.extend(reason.map(|r| Blocker { object, reason: r.into() }));
    }
    for m in observed.machines.iter().filter(|m| !m.node_ref) {
        let object = ObjectRef { kind: "Machine".into(), namespace: Some(m.namespace.clone()), name: m.name.clone() };
        out.push(Blocker {
            object,
            reason: "no status.nodeRef: still provisioning its node (clusterctl refuses to move)".into(),
        });
    }
    out.extend(observed.stale.iter().flatten().cloned());
    let unmoved = observed.move_plan.unmoved.iter();
    out.extend(unmoved.map(|u| Blocker { object: u.object.clone(), reason: u.reason.clone() }));
    out
}

/// Live objects whose status differs from their record, or that have a status and no record
/// (`profile` gives each object's group).
pub fn stale_objects(
    snapshot: &str,
    profile: &Profile,
    records: &Records,
    live: &[LiveObject],
) -> Result<Vec<Blocker>> {
    let against = Against::new(records);
    let out = live
        .iter()
        .filter_map(|object| {
            let kind = profile.kind(&object.kind)?;
            let reason = match against.compare(kind, object)? {
                Staleness::NotInSnapshot => format!("has a status and is not in snapshot {snapshot}"),
                Staleness::Changed => format!("status changed after snapshot {snapshot}"),
            };
            Some(Blocker { object: object.object_ref(), reason })
        })
        .collect();
    Ok(out)
}

/// How a live status stands against a snapshot that does not hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staleness {
    /// The object has a status and the snapshot no record of it.
    NotInSnapshot,
    /// Its record holds another status.
    Changed,
}

/// A snapshot's records by key digest: what a live object's status is compared with (by its
/// group-qualified kind and identity keys, as a restore finds it).
pub struct Against<'a> {
    records: &'a Records,
    by_key: HashMap<KeyDigest, Vec<usize>>,
}

impl<'a> Against<'a> {
    pub fn new(records: &'a Records) -> Self {
        let mut by_key: HashMap<KeyDigest, Vec<usize>> = HashMap::new();
        for i in 0..records.len() {
            for &digest in records.key_digests(i) {
                by_key.entry(digest).or_default().push(i);
            }
        }
        Against { records, by_key }
    }

    /// Why the snapshot does not hold the status of `object` (of `kind`), if it does not. An
    /// object without status has nothing to hold.
    pub fn compare(&self, kind: &KindProfile, object: &LiveObject) -> Option<Staleness> {
        let status = object.status.as_ref()?;
        let records = self.records;
        let qualified = kind.qualified_kind();
        // A digest finds the records; their group-qualified kind and the keys confirm one.
        let carries = |r: usize, key| {
            records.kind(r) == Some(qualified.as_str()) && records.head(r).is_ok_and(|h| h.keys.contains(key))
        };
        let record = object
            .keys
            .iter()
            .find_map(|k| self.by_key.get(&k.digest(&object.kind))?.iter().copied().find(|&r| carries(r, k)));
        match record {
            None => Some(Staleness::NotInSnapshot),
            Some(record) if records.status(record).is_ok_and(|r| status.equals(&r)) => None,
            Some(_) => Some(Staleness::Changed),
        }
    }
}

#[derive(Debug, Clone)]
pub struct PreflightOptions {
    pub profile: Profile,
    pub selector: Option<String>,
    /// Compare live status with the newest consistent snapshot.
    pub freshness: bool,
    /// Check only the CAPI Clusters and Machines of this namespace (the one to move).
    pub cluster_namespace: Option<String>,
    /// Freshness counts only snapshots signed by one of these keys (`None`: any).
    pub trusted: Option<std::sync::Arc<crate::format::TrustedKeys>>,
}

#[derive(Debug, Serialize)]
pub struct PreflightReport {
    pub ready: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    pub blockers: Vec<Blocker>,
    /// The `kubectl label` commands that make `clusterctl move` carry every object of the
    /// profile (printed, never run by restatus).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub label_commands: Vec<String>,
}

/// Reads the source cluster (and the snapshot store for freshness) and evaluates.
pub async fn gather(client: &kube::Client, store: &SnapshotStore, opts: &PreflightOptions) -> Result<PreflightReport> {
    let page = PageRequest { size: DEFAULT_PAGE_SIZE, selector: opts.selector.as_deref(), namespace: None };
    let live = read_live(client, &opts.profile, &page, false).await?;
    let clusters = cluster::clusters(client, opts.cluster_namespace.as_deref()).await?;
    let machines = cluster::machines(client, opts.cluster_namespace.as_deref()).await?;
    let (stale, snapshot) = match opts.freshness {
        true => freshness(store, &opts.profile, &live.objects, opts.trusted.clone()).await?,
        false => (None, None),
    };
    let move_plan =
        move_plan(client, &opts.profile, opts.selector.as_deref(), opts.cluster_namespace.as_deref()).await?;
    let label_commands = move_plan.commands.clone();
    let blockers = evaluate(&Observed { consistency: live.consistency, clusters, machines, stale, move_plan });
    Ok(PreflightReport { ready: blockers.is_empty(), snapshot, blockers, label_commands })
}

/// What `clusterctl move -n namespace` would leave behind of the profile's objects (selected by
/// `selector`), and the label commands that fix it.
pub async fn move_plan(
    client: &kube::Client,
    profile: &Profile,
    selector: Option<&str>,
    namespace: Option<&str>,
) -> Result<MovePlan> {
    let inputs = read_move_inputs(client, profile, selector, namespace).await?;
    Ok(graph::plan(&inputs.crds, &inputs.objects, selector))
}

/// The objects whose status differs from the newest consistent snapshot (signed by a trusted
/// key, when keys are given: a forgery never makes a cluster look backed up), and its id.
async fn freshness(
    store: &SnapshotStore,
    profile: &Profile,
    live: &[LiveObject],
    trusted: Option<std::sync::Arc<crate::format::TrustedKeys>>,
) -> Result<(Option<Vec<Blocker>>, Option<String>)> {
    // The newest snapshot encrypted, and no key to read it (the source holds none): its
    // statuses cannot be compared, and an older plain one is not the one a restore would use.
    // With keys, the newest one a trusted key signed: a forged manifest says nothing.
    if !store.decrypts()
        && let Ok(Some((manifest, _))) = newest_verified(store, None, trusted.as_deref()).await
        && let Some(encryption) = manifest.encryption
    {
        let object = ObjectRef { kind: "Snapshot".into(), namespace: None, name: manifest.snapshot_id.to_string() };
        let reason = format!(
            "the newest snapshot is encrypted (to {}): without --decryption-key preflight cannot compare the live \
             statuses with it; --snapshot-when-ready takes a new one when the cluster is ready",
            encryption.recipients_text()
        );
        return Ok((Some(vec![Blocker { object, reason }]), None));
    }
    match choose_snapshot(store, None, &Accept { trusted, ..Accept::default() }).await {
        Ok(loaded) => {
            let id = loaded.manifest.snapshot_id.to_string();
            Ok((Some(stale_objects(&id, profile, &loaded.records, live)?), Some(id)))
        }
        Err(Error::NoGoodSnapshot { .. }) => {
            let object = ObjectRef { kind: "Snapshot".into(), namespace: None, name: store.cluster_id().into() };
            let blocker = Blocker { object, reason: format!("no consistent snapshot in {}", store.location()) };
            Ok((Some(vec![blocker]), None))
        }
        Err(e) => Err(e),
    }
}

/// `--snapshot-when-ready`: a ready cluster gets its snapshot now. The report names it, and
/// turns not ready, with the snapshot's reasons, when that capture came out inconsistent.
pub async fn snapshot_when_ready(
    client: &kube::Client,
    store: &SnapshotStore,
    backup: &BackupOptions,
    report: &mut PreflightReport,
) -> Result<()> {
    if !report.ready {
        return Ok(());
    }
    let manifest = backup::run(client, store, backup).await?;
    report.snapshot = Some(manifest.snapshot_id.to_string());
    if let Some(c) = manifest.consistency.as_ref().filter(|c| !c.consistent) {
        report.ready = false;
        report.blockers = c
            .reasons
            .iter()
            .map(|r| Blocker { object: r.object.clone(), reason: format!("snapshot inconsistent: {}", r.reason) })
            .collect();
    }
    Ok(())
}

/// Re-evaluates whenever a watched kind changes (at most once a `settle`), until ready or
/// `timeout`. `progress` sees each evaluation.
pub async fn wait(
    client: &kube::Client,
    store: &SnapshotStore,
    opts: &PreflightOptions,
    timeout: Duration,
    settle: Duration,
    mut progress: impl FnMut(&PreflightReport),
) -> Result<PreflightReport> {
    let deadline = tokio::time::Instant::now() + timeout;
    let profile_kinds = opts.profile.kinds.iter().filter(|k| !k.is_denied()).map(|k| (k.clone(), None));
    let capi = [cluster::cluster_kind(), cluster::machine_kind()].map(|k| (k, opts.cluster_namespace.as_deref()));
    // A label put on a CRD changes the move set.
    let capi = capi.into_iter().chain([(crate::moving::discover::crd_kind(), None)]);
    let kinds: Vec<(KindProfile, Option<&str>)> = profile_kinds.chain(capi).collect();
    let streams = kinds.iter().map(|(kind, namespace)| changes(client, kind, *namespace));
    let mut changes = futures::stream::select_all(streams);
    loop {
        let report = gather(client, store, opts).await?;
        progress(&report);
        if report.ready {
            return Ok(report);
        }
        // Wait for a change, then let a burst of changes settle.
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return Ok(report),
            _ = changes.next() => {}
        }
        let settle_until = (tokio::time::Instant::now() + settle).min(deadline);
        while tokio::time::timeout_at(settle_until, changes.next()).await.is_ok() {}
        info!("change seen; checking again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{live, record, uuid};
    use crate::format::Inconsistency;
    use serde_json::json;

    /// A snapshot of `records` at `at` in `store`, signed with `key` when given.
    async fn snapshot(
        store: &SnapshotStore,
        at: &str,
        records: &[crate::format::Record],
        key: Option<&crate::format::SigningKey>,
    ) -> String {
        let mut encoder = crate::format::PayloadEncoder::new(3).unwrap();
        let mut payload = Vec::new();
        for r in records {
            encoder.push(r).unwrap();
            payload.extend(encoder.take_output());
        }
        let (tail, summary) = encoder.finish().unwrap();
        payload.extend(tail);
        let at = crate::fixtures::ts(at);
        let id = crate::format::SnapshotId::new(at);
        object_store::ObjectStoreExt::put(store.object_store().as_ref(), &store.payload_path(&id), payload.into())
            .await
            .unwrap();
        let mut manifest = crate::format::Manifest::new(
            store.cluster_id(),
            id,
            at,
            "test",
            crate::format::CaptureSummary::empty(),
            summary,
        );
        match key {
            Some(key) => store.put_signed_manifest(&mut manifest, key).await.unwrap(),
            None => store.put_manifest(&manifest).await.unwrap(),
        }
        manifest.snapshot_id.to_string()
    }

    /// F76: a forged snapshot (unsigned, newer, holding the live statuses) never makes a cluster
    /// look backed up when keys are given: freshness compares with the newest signed snapshot.
    #[tokio::test]
    async fn freshness_with_keys_compares_with_the_newest_signed_snapshot_not_a_forgery() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let key = crate::format::SigningKey::generate();
        let trusted = std::sync::Arc::new(crate::format::TrustedKeys::new([key.public_key()]));
        let old = json!({"state": "Available"});
        let now = json!({"state": "Reserved"});
        let signed =
            snapshot(&store, "2026-11-30T08:00:00Z", &[record("Server", "s1", &[uuid("u1")], old)], Some(&key)).await;
        let forged =
            snapshot(&store, "2026-11-30T09:00:00Z", &[record("Server", "s1", &[uuid("u1")], now.clone())], None).await;
        let objects = [live("Server", "s1", &[uuid("u1")], Some(now))];
        let profile = Profile::metal_operator();
        let (stale, id) = freshness(&store, &profile, &objects, None).await.unwrap();
        assert_eq!((stale.unwrap().len(), id.as_deref()), (0, Some(forged.as_str())), "without keys: the newest");
        let (stale, id) = freshness(&store, &profile, &objects, Some(trusted)).await.unwrap();
        assert_eq!(id.as_deref(), Some(signed.as_str()));
        let reasons: Vec<String> = stale.unwrap().into_iter().map(|b| b.reason).collect();
        assert_eq!(reasons, [format!("status changed after snapshot {signed}")]);
    }

    /// F80 on the source: the newest snapshot is encrypted and preflight has no key. Freshness
    /// cannot compare with it and says so (not "changed after" an older plain snapshot); with
    /// the key it compares as before.
    #[tokio::test]
    async fn freshness_without_the_key_of_an_encrypted_newest_snapshot_says_so() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let (text, recipient) = crate::format::DecryptionKeys::generate(crate::fixtures::ts("2026-11-30T08:00:00Z"));
        let keys = std::sync::Arc::new(crate::format::DecryptionKeys::parse_all("k", &text).unwrap());
        let to = crate::format::Recipients::load(std::slice::from_ref(&recipient)).unwrap().unwrap();
        let now = json!({"state": "Reserved"});
        snapshot(
            &store,
            "2026-11-30T08:00:00Z",
            &[record("Server", "s1", &[uuid("u1")], json!({"state": "Available"}))],
            None,
        )
        .await;
        let mut encoder = crate::format::PayloadEncoder::with_recipients(3, Some(&to)).unwrap();
        encoder.push(&record("Server", "s1", &[uuid("u1")], now.clone())).unwrap();
        let mut payload = encoder.take_output();
        let (tail, summary) = encoder.finish().unwrap();
        payload.extend(tail);
        let at = crate::fixtures::ts("2026-11-30T09:00:00Z");
        let id = crate::format::SnapshotId::new(at);
        object_store::ObjectStoreExt::put(store.object_store().as_ref(), &store.payload_path(&id), payload.into())
            .await
            .unwrap();
        let capture = crate::format::CaptureSummary::empty();
        let manifest = crate::format::Manifest::new(store.cluster_id(), id.clone(), at, "test", capture, summary);
        store.put_manifest(&manifest).await.unwrap();

        let objects = [live("Server", "s1", &[uuid("u1")], Some(now))];
        let profile = Profile::metal_operator();
        let (stale, compared) = freshness(&store, &profile, &objects, None).await.unwrap();
        let blockers = stale.unwrap();
        assert_eq!((blockers.len(), compared), (1, None));
        assert_eq!(blockers[0].object.name, id.to_string());
        let reason = &blockers[0].reason;
        assert!(reason.contains("is encrypted") && reason.contains(&recipient) && reason.contains("--decryption-key"));
        let with_key = store.clone().with_decryption_keys(Some(keys));
        let (stale, compared) = freshness(&with_key, &profile, &objects, None).await.unwrap();
        assert_eq!((stale.unwrap().len(), compared), (0, Some(id.to_string())), "with the key: up to date");
    }

    /// F145: with keys, the newest-is-encrypted check reads the newest signed manifest: a
    /// forged encrypted-looking one neither blocks preflight nor hides the real comparison.
    #[tokio::test]
    async fn the_encrypted_newest_check_believes_no_forged_manifest() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let key = crate::format::SigningKey::generate();
        let trusted = std::sync::Arc::new(crate::format::TrustedKeys::new([key.public_key()]));
        let now = json!({"state": "Reserved"});
        let signed =
            snapshot(&store, "2026-11-30T08:00:00Z", &[record("Server", "s1", &[uuid("u1")], now.clone())], Some(&key))
                .await;
        let (_, recipient) = crate::format::DecryptionKeys::generate(crate::fixtures::ts("2026-11-30T08:00:00Z"));
        let to = crate::format::Recipients::load(std::slice::from_ref(&recipient)).unwrap().unwrap();
        let forged = crate::fixtures::snapshot(&[record("Server", "s1", &[uuid("u1")], now.clone())])
            .at(crate::fixtures::ts("2026-11-30T09:00:00Z"))
            .encrypted_to(&to)
            .write(&store)
            .await;
        let objects = [live("Server", "s1", &[uuid("u1")], Some(now))];
        let profile = Profile::metal_operator();
        let (stale, compared) = freshness(&store, &profile, &objects, Some(trusted)).await.unwrap();
        assert_eq!(
            compared.as_deref(),
            Some(signed.as_str()),
            "compared with the signed one, not {}",
            forged.snapshot_id
        );
        assert_eq!(stale.unwrap().len(), 0);
    }

    fn consistent() -> Consistency {
        crate::format::CaptureSummary::empty().consistency
    }

    fn cluster(paused: bool, infra: bool, cp: bool) -> ClusterView {
        ClusterView {
            namespace: "capi".into(),
            name: "c1".into(),
            uid: "u1".into(),
            paused,
            infrastructure_provisioned: infra,
            control_plane_initialized: cp,
            blocked_by_restatus: false,
            final_snapshot: None,
            move_blocked: None,
        }
    }

    fn reasons(observed: &Observed) -> Vec<String> {
        evaluate(observed).iter().map(|b| format!("{}: {}", b.object, b.reason)).collect()
    }

    #[test]
    fn a_settled_cluster_is_ready() {
        let observed = Observed {
            consistency: consistent(),
            clusters: vec![cluster(false, true, true)],
            machines: vec![MachineView { namespace: "capi".into(), name: "m1".into(), node_ref: true }],
            stale: Some(vec![]),
            move_plan: MovePlan::default(),
        };
        assert!(evaluate(&observed).is_empty());
    }

    #[test]
    fn every_blocker_is_named_with_its_reason() {
        let mut consistency = consistent();
        consistency.reasons.push(Inconsistency {
            object: ObjectRef { kind: "Server".into(), namespace: None, name: "s1".into() },
            reason: "in transitional state \"Discovery\"".into(),
        });
        let observed = Observed {
            consistency,
            clusters: vec![
                cluster(false, false, false),
                ClusterView { name: "c2".into(), ..cluster(true, true, true) },
            ],
            machines: vec![MachineView { namespace: "capi".into(), name: "m1".into(), node_ref: false }],
            stale: Some(vec![Blocker {
                object: ObjectRef { kind: "Server".into(), namespace: None, name: "s2".into() },
                reason: "status changed after snapshot X".into(),
            }]),
            move_plan: MovePlan::default(),
        };
        assert_eq!(
            reasons(&observed),
            [
                "Server s1: in transitional state \"Discovery\"",
                "Cluster capi/c1: still provisioning its infrastructure (clusterctl refuses to move)",
                "Cluster capi/c2: already paused (an earlier move may have stopped half-way)",
                "Machine capi/m1: no status.nodeRef: still provisioning its node (clusterctl refuses to move)",
                "Server s2: status changed after snapshot X",
            ]
        );
    }

    #[test]
    fn freshness_compares_live_status_with_the_snapshot() {
        let key = uuid("u");
        let record = record("Server", "s", std::slice::from_ref(&key), json!({"state": "Reserved"}));
        // A Server of another group with the same status and another key: no record of ours.
        let other = crate::format::Record {
            api_version: "inventory.example.com/v1".into(),
            ..crate::fixtures::record("Server", "o", &[uuid("v")], json!({"state": "Reserved"}))
        };
        let objects = [
            live("Server", "same", std::slice::from_ref(&key), Some(json!({"state": "Reserved"}))),
            live("Server", "changed", &[key], Some(json!({"state": "Available"}))),
            live("Server", "new", &[], Some(json!({"state": "Available"}))),
            live("Server", "elsewhere", &[uuid("v")], Some(json!({"state": "Reserved"}))),
        ];
        let records = Records::from_records(vec![record, other]);
        let stale: Vec<String> = stale_objects("S1", &Profile::metal_operator(), &records, &objects)
            .unwrap()
            .iter()
            .map(|b| format!("{}: {}", b.object, b.reason))
            .collect();
        assert_eq!(
            stale,
            [
                "Server changed: status changed after snapshot S1",
                "Server new: has a status and is not in snapshot S1",
                "Server elsewhere: has a status and is not in snapshot S1",
            ],
            "a record of a kind of the same name in another group is not this object's"
        );
    }
}
