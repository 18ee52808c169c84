//! Kubernetes Events, as restatus publishes them: one reporter name, the pod as instance.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder, Reporter};
use tracing::warn;

use crate::TOOL_NAME;
use crate::domain::identity::KindProfile;

/// restatus, from this pod (`POD_NAME`) where it runs in one.
pub fn reporter() -> Reporter {
    Reporter { controller: TOOL_NAME.into(), instance: std::env::var("POD_NAME").ok() }
}

/// A recorder reporting as restatus. It keeps every Event it published for six minutes (to
/// turn a repeat into a series) and scans them all on each publish: right for the few objects
/// of a handshake, not for one Event per restored object (see [`publish_once`]).
pub fn recorder(client: &kube::Client) -> Recorder {
    Recorder::new(client.clone(), reporter())
}

/// Publishes `event` as a new Event, remembering nothing. A restore publishes one Event per
/// object it restores, and an object is rarely restored twice within minutes; kube's
/// [`Recorder`] would hold each of them for six minutes and scan them all on every publish:
/// some 4 KiB an object (60 MiB for a restore of 15,000) and time quadratic in the objects.
pub async fn publish_once(client: &kube::Client, reporter: &Reporter, event: &Event, reference: &ObjectReference) {
    publish(&Recorder::new(client.clone(), reporter.clone()), event, reference).await;
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

/// The reference of an Event about a whole kind: its CustomResourceDefinition.
pub fn crd_reference(kind: &KindProfile) -> ObjectReference {
    ObjectReference {
        api_version: Some("apiextensions.k8s.io/v1".into()),
        kind: Some("CustomResourceDefinition".into()),
        name: Some(match kind.group.as_str() {
            "" => kind.plural.clone(),
            group => format!("{}.{group}", kind.plural),
        }),
        ..Default::default()
    }
}

/// An Event's note as the API server takes it: at most 1 KiB, cut at a character boundary.
pub fn note(mut text: String) -> String {
    const MAX: usize = 1024;
    if text.len() > MAX {
        let mut end = MAX - '…'.len_utf8();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// Publishes `event`; a failure is logged, never fatal (an Event is a courtesy to people).
pub async fn publish(recorder: &Recorder, event: &Event, reference: &ObjectReference) {
    if let Err(e) = recorder.publish(event, reference).await {
        warn!(object = ?reference.name, reason = %event.reason, error = %e, "could not record an event");
    }
}
