//! Kubernetes Events, as restatus publishes them: one reporter name, the pod as instance.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder, Reporter};
use tracing::warn;

use crate::TOOL_NAME;
use crate::domain::identity::KindProfile;

/// A recorder reporting as restatus, from this pod (`POD_NAME`) where it runs in one.
pub fn recorder(client: &kube::Client) -> Recorder {
    let reporter = Reporter { controller: TOOL_NAME.into(), instance: std::env::var("POD_NAME").ok() };
    Recorder::new(client.clone(), reporter)
}

/// The reference an Event about an object of `kind` points at.
pub fn reference(kind: &KindProfile, namespace: Option<&str>, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(kind.api_version()),
        kind: Some(kind.kind.clone()),
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        uid: Some(uid.to_string()),
        ..Default::default()
    }
}

/// Publishes `event`; a failure is logged, never fatal (an Event is a courtesy to people).
pub async fn publish(recorder: &Recorder, event: &Event, reference: &ObjectReference) {
    if let Err(e) = recorder.publish(event, reference).await {
        warn!(object = ?reference.name, reason = %event.reason, error = %e, "could not record an event");
    }
}
