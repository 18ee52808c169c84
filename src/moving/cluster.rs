//! One view of the Cluster API objects that decide whether a move may go ahead: Clusters
//! (paused? provisioned? blocked by restatus?) and Machines (node up?). Pure views, and the
//! listing that fills them (Kubernetes edge).

use serde_json::Value;

use crate::Result;
use crate::TOOL_NAME;
use crate::domain::annotations::{
    BLOCK_MOVE_ANNOTATION, CAPI_PAUSED_ANNOTATION, FINAL_SNAPSHOT_ANNOTATION, MOVE_BLOCKED_ANNOTATION,
};
use crate::domain::identity::KindProfile;
use crate::domain::object::RawObject;
use crate::k8s::{DEFAULT_PAGE_SIZE, PageRequest, list_objects};

pub fn cluster_kind() -> KindProfile {
    KindProfile::cluster_api("Cluster", "clusters")
}

pub fn machine_kind() -> KindProfile {
    KindProfile::cluster_api("Machine", "machines")
}

/// A Cluster API Cluster, as preflight and the handshake see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.paused`, or Cluster API's paused annotation.
    pub paused: bool,
    pub infrastructure_provisioned: bool,
    pub control_plane_initialized: bool,
    /// restatus's `block-move` is on it.
    pub blocked_by_restatus: bool,
    /// The final snapshot restatus took before letting this Cluster's move go.
    pub final_snapshot: Option<String>,
    /// restatus held this pause because the move set was incomplete (its reason).
    pub move_blocked: Option<String>,
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
        let annotations = object.meta.annotations.as_ref();
        let annotation = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
        ClusterView {
            namespace: object.meta.namespace.as_deref().unwrap_or_default().to_string(),
            name: object.meta.name.to_string(),
            uid: object.meta.uid.as_deref().unwrap_or_default().to_string(),
            paused: yes("spec.paused") || annotation(CAPI_PAUSED_ANNOTATION).is_some(),
            blocked_by_restatus: annotation(BLOCK_MOVE_ANNOTATION) == Some(TOOL_NAME),
            final_snapshot: annotation(FINAL_SNAPSHOT_ANNOTATION).map(str::to_string),
            move_blocked: annotation(MOVE_BLOCKED_ANNOTATION).map(str::to_string),
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

/// The Clusters in `namespace` (all namespaces: `None`).
pub async fn clusters(client: &kube::Client, namespace: Option<&str>) -> Result<Vec<ClusterView>> {
    views(client, &cluster_kind(), namespace, ClusterView::from_raw).await
}

/// The Machines in `namespace` (all namespaces: `None`).
pub async fn machines(client: &kube::Client, namespace: Option<&str>) -> Result<Vec<MachineView>> {
    views(client, &machine_kind(), namespace, MachineView::from_raw).await
}

async fn views<T>(
    client: &kube::Client,
    kind: &KindProfile,
    namespace: Option<&str>,
    view: impl Fn(&RawObject<'_>) -> T,
) -> Result<Vec<T>> {
    let mut out = Vec::new();
    let page = PageRequest { size: DEFAULT_PAGE_SIZE, selector: None, namespace };
    list_objects(client, kind, &page, |o| {
        out.push(view(o));
        Ok(())
    })
    .await?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn paused_and_blocked_come_from_spec_and_annotations() {
        let annotated = r#"{"metadata":{"name":"c","namespace":"n","uid":"u",
            "annotations":{"cluster.x-k8s.io/paused":"","clusterctl.cluster.x-k8s.io/block-move":"restatus"}}}"#;
        let view = ClusterView::from_raw(&RawObject::parse(annotated).unwrap());
        assert!(view.paused && view.blocked_by_restatus);
        assert_eq!(view.uid, "u");
        let users = r#"{"metadata":{"name":"c","namespace":"n","annotations":{"clusterctl.cluster.x-k8s.io/block-move":"someone"}}}"#;
        let view = ClusterView::from_raw(&RawObject::parse(users).unwrap());
        assert!(!view.paused && !view.blocked_by_restatus, "a block-move of someone else's is not restatus's");
    }
}
