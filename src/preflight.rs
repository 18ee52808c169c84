//! Move readiness: everything that makes a `clusterctl move` unsafe right now, one reason per
//! object. Pure evaluation ([`evaluate`]) over what [`gather`] reads from the source cluster:
//!
//! - the capture consistency verdict on the live objects (pairing, binding claims, Servers in
//!   Initial/Discovery, objects being deleted, duplicate identity keys);
//! - what clusterctl itself refuses: Machines without `status.nodeRef`, Clusters whose
//!   infrastructure or control plane is not up, Clusters already paused;
//! - backup freshness: objects whose status differs from the newest consistent snapshot.
//!
//! [`wait`] re-evaluates on watch events until the cluster is ready or a timeout passes.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::watcher;
use serde::Serialize;
use serde_json::Value;
use tracing::info;

use crate::capture::{PageRequest, list_objects};
use crate::format::{Consistency, ObjectRef, Record};
use crate::identity::{IdentityKey, KindProfile, Profile};
use crate::object::RawObject;
use crate::plan::LiveObject;
use crate::restore::{choose_snapshot, read_live};
use crate::store::SnapshotStore;
use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Blocker {
    pub object: ObjectRef,
    pub reason: String,
}

/// A CAPI Cluster as the move preflight sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    pub namespace: String,
    pub name: String,
    pub paused: bool,
    pub infrastructure_provisioned: bool,
    pub control_plane_initialized: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineView {
    pub namespace: String,
    pub name: String,
    pub node_ref: bool,
}

impl ClusterView {
    /// Reads cluster.x-k8s.io/v1beta2 (and v1beta1) fields.
    pub fn from_raw(object: &RawObject<'_>) -> Self {
        let yes = |path: &str| object.bool_at(path) == Some(true);
        ClusterView {
            namespace: object.meta.namespace.as_deref().unwrap_or_default().to_string(),
            name: object.meta.name.to_string(),
            paused: yes("spec.paused"),
            infrastructure_provisioned: yes("status.initialization.infrastructureProvisioned")
                || yes("status.infrastructureReady"),
            control_plane_initialized: yes("status.initialization.controlPlaneInitialized")
                || condition_true(object, "ControlPlaneInitialized"),
        }
    }
}

fn condition_true(object: &RawObject<'_>, kind: &str) -> bool {
    let Some(status) = object.field("status") else { return false };
    let Ok(status) = serde_json::from_str::<Value>(status.get()) else { return false };
    let conditions = status.get("conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    conditions.iter().any(|c| c["type"] == kind && c["status"] == "True")
}

impl MachineView {
    pub fn from_raw(object: &RawObject<'_>) -> Self {
        MachineView {
            namespace: object.meta.namespace.as_deref().unwrap_or_default().to_string(),
            name: object.meta.name.to_string(),
            node_ref: object.string_at("status.nodeRef.name").is_some(),
        }
    }
}

/// Everything the verdict looks at.
pub struct Observed {
    pub consistency: Consistency,
    pub clusters: Vec<ClusterView>,
    pub machines: Vec<MachineView>,
    /// Objects whose status is not what the newest consistent snapshot holds (`None`: not
    /// checked, e.g. a fresh snapshot is about to be taken).
    pub stale: Option<Vec<Blocker>>,
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
    out
}

/// Live objects whose status differs from their record, or that have a status and no record.
pub fn stale_objects(snapshot: &str, records: &[Record], live: &[LiveObject]) -> Vec<Blocker> {
    let mut by_key: HashMap<(&str, &IdentityKey), &Record> = HashMap::new();
    for record in records {
        for key in &record.keys {
            by_key.insert((record.kind.as_str(), key), record);
        }
    }
    let mut out = Vec::new();
    for object in live.iter().filter(|o| o.status.is_some()) {
        let record = object.keys.iter().find_map(|k| by_key.get(&(object.kind.as_str(), k)));
        let reason = match record {
            None => format!("has a status and is not in snapshot {snapshot}"),
            Some(record) => {
                if object.status.as_deref().is_some_and(|s| crate::object::same_json(s, &record.status)) {
                    continue;
                }
                format!("status changed after snapshot {snapshot}")
            }
        };
        out.push(Blocker { object: object.object_ref(), reason });
    }
    out
}

#[derive(Debug, Clone)]
pub struct PreflightOptions {
    pub profile: Profile,
    pub selector: Option<String>,
    /// Compare live status with the newest consistent snapshot.
    pub freshness: bool,
    /// Check only the CAPI Clusters and Machines of this namespace (the one to move).
    pub cluster_namespace: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct PreflightReport {
    pub ready: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    pub blockers: Vec<Blocker>,
}

/// Reads the source cluster (and the snapshot store for freshness) and evaluates.
pub async fn gather(client: &kube::Client, store: &SnapshotStore, opts: &PreflightOptions) -> Result<PreflightReport> {
    let page = PageRequest { size: 500, selector: opts.selector.as_deref(), namespace: None };
    let live = read_live(client, &opts.profile, &page).await?;
    let mut clusters = Vec::new();
    let mut machines = Vec::new();
    let capi = PageRequest { size: 500, selector: None, namespace: opts.cluster_namespace.as_deref() };
    list_objects(client, &KindProfile::cluster_api("Cluster", "clusters"), &capi, |o| {
        clusters.push(ClusterView::from_raw(o));
        Ok(())
    })
    .await?;
    list_objects(client, &KindProfile::cluster_api("Machine", "machines"), &capi, |o| {
        machines.push(MachineView::from_raw(o));
        Ok(())
    })
    .await?;
    let (stale, snapshot) = if opts.freshness {
        match choose_snapshot(store, None, false).await {
            Ok(loaded) => {
                let id = loaded.manifest.snapshot_id.to_string();
                (Some(stale_objects(&id, &loaded.records, &live.objects)), Some(id))
            }
            Err(Error::NoGoodSnapshot { .. }) => {
                let object = ObjectRef { kind: "Snapshot".into(), namespace: None, name: store.cluster_id().into() };
                let blocker = Blocker { object, reason: format!("no consistent snapshot in {}", store.location()) };
                (Some(vec![blocker]), None)
            }
            Err(e) => return Err(e),
        }
    } else {
        (None, None)
    };
    let blockers = evaluate(&Observed { consistency: live.consistency, clusters, machines, stale });
    Ok(PreflightReport { ready: blockers.is_empty(), snapshot, blockers })
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
    let mut kinds: Vec<KindProfile> = opts.profile.kinds.iter().filter(|k| !k.is_denied()).cloned().collect();
    kinds.extend([KindProfile::cluster_api("Cluster", "clusters"), KindProfile::cluster_api("Machine", "machines")]);
    let streams = kinds.iter().map(|kind| {
        let api = crate::fleet::api_for(
            client,
            kind,
            opts.cluster_namespace.as_deref().filter(|_| kind.group == crate::identity::CAPI_GROUP),
        );
        watcher(api, watcher::Config::default()).map(|_| ()).boxed()
    });
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
    use crate::format::Inconsistency;
    use serde_json::json;
    use serde_json::value::RawValue;

    fn consistent() -> Consistency {
        crate::capture::judge(&Default::default(), vec![], &[], 1)
    }

    fn cluster(paused: bool, infra: bool, cp: bool) -> ClusterView {
        ClusterView {
            namespace: "capi".into(),
            name: "c1".into(),
            paused,
            infrastructure_provisioned: infra,
            control_plane_initialized: cp,
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
    fn cluster_views_read_v1beta2_and_v1beta1() {
        let v1beta2 = r#"{"metadata":{"name":"c","namespace":"n"},"spec":{"paused":false},
            "status":{"initialization":{"infrastructureProvisioned":true,"controlPlaneInitialized":true}}}"#;
        let view = ClusterView::from_raw(&RawObject::parse(v1beta2).unwrap());
        assert!(view.infrastructure_provisioned && view.control_plane_initialized && !view.paused);
        let v1beta1 = r#"{"metadata":{"name":"c","namespace":"n"},"spec":{"paused":true},
            "status":{"infrastructureReady":true,"conditions":[{"type":"ControlPlaneInitialized","status":"True"}]}}"#;
        let view = ClusterView::from_raw(&RawObject::parse(v1beta1).unwrap());
        assert!(view.infrastructure_provisioned && view.control_plane_initialized && view.paused);
        let machine = r#"{"metadata":{"name":"m","namespace":"n"},"status":{"nodeRef":{"name":"node-1"}}}"#;
        assert!(MachineView::from_raw(&RawObject::parse(machine).unwrap()).node_ref);
    }

    #[test]
    fn freshness_compares_live_status_with_the_snapshot() {
        let key = IdentityKey { field: "spec.systemUUID".into(), value: "u".into() };
        let record = Record::test_server("s", vec![key.clone()], r#"{"state":"Reserved"}"#);
        let live = |name: &str, keys: Vec<IdentityKey>, status: Value| LiveObject {
            kind: "Server".into(),
            namespace: None,
            name: name.into(),
            uid: name.into(),
            resource_version: "1".into(),
            keys,
            status: Some(RawValue::from_string(status.to_string()).unwrap()),
            annotations: Default::default(),
            status_written_at: None,
        };
        let objects = [
            live("same", vec![key.clone()], json!({"state": "Reserved"})),
            live("changed", vec![key], json!({"state": "Available"})),
            live("new", vec![], json!({"state": "Available"})),
        ];
        let stale: Vec<String> =
            stale_objects("S1", &[record], &objects).iter().map(|b| format!("{}: {}", b.object, b.reason)).collect();
        assert_eq!(
            stale,
            ["Server changed: status changed after snapshot S1", "Server new: has a status and is not in snapshot S1"]
        );
    }
}
