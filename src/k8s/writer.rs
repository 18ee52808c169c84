//! Writes to objects of the profile's kinds, as restatus (field manager `restatus`): JSON
//! merge patches and replaces of an object or its subresource, re-reads, and Events. Requests
//! and answers stay raw JSON. Discovery tells which kinds have a status subresource: asked at
//! start, asked again for a kind its group did not serve then (a CRD installed later), and
//! again after a status write that did not stick ([`Writer::forget`]).

use std::collections::{HashMap, HashSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::api::{GetParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, Reporter};
use serde::Serialize;

use crate::domain::identity::{KindProfile, Profile};
use crate::domain::live::LiveObject;
use crate::k8s::events;
use crate::{Error, Result, TOOL_NAME};

/// Field manager of every write restatus makes.
pub const FIELD_MANAGER: &str = TOOL_NAME;

/// What writing needs beyond one snapshot: the client, who reports Events, and which kinds
/// have a status subresource. Lives as long as the restore run or the controller.
/// How long the controller tries to publish one summary Event.
const EVENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

pub struct Writer {
    client: kube::Client,
    reporter: Reporter,
    /// What discovery said, per kind and version (see [`served_key`]). A kind not here is
    /// asked about on its next write.
    discovered: std::sync::RwLock<HashMap<String, Discovered>>,
}

/// What discovery said of one kind at one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Discovered {
    /// Its group/version is not served: nothing of it can be written (its status subresource
    /// is asked about again on the next write: a CRD may have been installed since).
    GroupNotServed,
    /// Its group/version answered: whether it lists the kind, and its status subresource.
    Answered { served: bool, status: bool },
}

/// A kind at one version: `Kind.group/version`.
fn served_key(kind: &KindProfile) -> String {
    format!("{}/{}", kind.qualified_kind(), kind.version)
}

impl Writer {
    /// Asks the API server (discovery) which kinds of the profile have a status subresource.
    pub async fn new(client: &kube::Client, profile: &Profile) -> Result<Self> {
        let writer = Writer { client: client.clone(), reporter: events::reporter(), discovered: Default::default() };
        // Denied kinds are never written: their groups are not asked (a profile may spell the
        // core group `core`, which no API server serves under /apis).
        let kinds: Vec<&KindProfile> = profile.kinds.iter().filter(|k| !k.is_denied()).collect();
        let mut versions: Vec<(&str, &str)> = kinds.iter().map(|k| (&*k.group, &*k.version)).collect();
        versions.sort();
        versions.dedup();
        for (group, version) in versions {
            writer.discover(group, version, kinds.iter().copied()).await?;
        }
        Ok(writer)
    }

    /// Asks the API server which of `kinds` (those of `group`/`version`) have a status
    /// subresource, and remembers it. A group/version not served is remembered for none.
    async fn discover<'k>(
        &self,
        group: &str,
        version: &str,
        kinds: impl Iterator<Item = &'k KindProfile>,
    ) -> Result<()> {
        let path = if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
        let request = http::Request::get(&path)
            .body(vec![])
            .map_err(|e| Error::kube(format!("discover {path}"), kube::Error::HttpError(e)))?;
        let kinds = kinds.filter(|k| k.group == group && k.version == version);
        let resources: APIResourceList = match self.client.request(request).await {
            Ok(list) => list,
            // Not served: nothing of it can be written; planning says so per object.
            // (A 404 of a group the server does not know comes with a plain-text body.)
            Err(kube::Error::Api(s)) if s.is_not_found() || s.code == 404 => {
                let mut discovered = self.discovered.write().unwrap_or_else(|e| e.into_inner());
                discovered.extend(kinds.map(|k| (served_key(k), Discovered::GroupNotServed)));
                return Ok(());
            }
            Err(e) => return Err(Error::kube(format!("discover {path}"), e)),
        };
        let names: HashSet<&str> = resources.resources.iter().map(|r| r.name.as_str()).collect();
        let mut discovered = self.discovered.write().unwrap_or_else(|e| e.into_inner());
        for kind in kinds {
            let status = names.contains(format!("{}/status", kind.plural).as_str());
            let served = names.contains(kind.plural.as_str());
            discovered.insert(served_key(kind), Discovered::Answered { served, status });
        }
        Ok(())
    }

    /// Whether `kind` has a status subresource; asks the API server when its group/version was
    /// not served when last asked (a CRD installed after restatus started, or upgraded).
    pub async fn status_subresource(&self, kind: &KindProfile) -> Result<bool> {
        if let Some(known) = self.known_status_subresource(kind) {
            return Ok(known);
        }
        self.discover(&kind.group, &kind.version, std::iter::once(kind)).await?;
        Ok(self.known_status_subresource(kind).unwrap_or(false))
    }

    /// What discovery last said of `kind`'s status subresource, if it was asked.
    pub fn known_status_subresource(&self, kind: &KindProfile) -> Option<bool> {
        match self.known(kind)? {
            Discovered::Answered { status, .. } => Some(status),
            Discovered::GroupNotServed => None,
        }
    }

    fn known(&self, kind: &KindProfile) -> Option<Discovered> {
        self.discovered.read().unwrap_or_else(|e| e.into_inner()).get(&served_key(kind)).copied()
    }

    /// Whether the API server serves `kind` at its version (a record captured in another
    /// version than the profile's is written in its own, when the target still serves it).
    pub async fn serves(&self, kind: &KindProfile) -> Result<bool> {
        if self.known(kind).is_none() {
            self.discover(&kind.group, &kind.version, std::iter::once(kind)).await?;
        }
        Ok(matches!(self.known(kind), Some(Discovered::Answered { served: true, .. })))
    }

    /// Forgets what discovery said of `kind`, at every version: a status write that did not
    /// stick means the kind changed (a CRD upgrade added the subresource or a version); its
    /// next write asks again.
    pub fn forget(&self, kind: &KindProfile) {
        let prefix = format!("{}/", kind.qualified_kind());
        self.discovered.write().unwrap_or_else(|e| e.into_inner()).retain(|k, _| !k.starts_with(&prefix));
    }

    /// A JSON merge patch of the object (or of its `subresource`), as restatus. The answer
    /// is the object as the API server stored it, raw.
    pub async fn merge_patch(
        &self,
        kind: &KindProfile,
        object: &LiveObject,
        subresource: Option<&str>,
        body: &impl Serialize,
    ) -> std::result::Result<String, kube::Error> {
        let request = kube::core::Request::new(kind.list_path_in(object.namespace.as_deref()));
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let patch = Patch::Merge(body);
        let request = match subresource {
            Some(sub) => request.patch_subresource(sub, &object.name, &params, &patch),
            None => request.patch(&object.name, &params, &patch),
        }
        .map_err(kube::Error::BuildRequest)?;
        self.client.request_text(request).await
    }

    /// A replace (PUT) of the object (or of its `subresource`) with `body`, as restatus.
    /// The answer is the object as the API server stored it, raw.
    pub async fn replace(
        &self,
        kind: &KindProfile,
        object: &LiveObject,
        subresource: Option<&str>,
        body: String,
    ) -> std::result::Result<String, kube::Error> {
        let request = kube::core::Request::new(kind.list_path_in(object.namespace.as_deref()));
        let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let request = match subresource {
            Some(sub) => request.replace_subresource(sub, &object.name, &params, body.into_bytes()),
            None => request.replace(&object.name, &params, body.into_bytes()),
        }
        .map_err(kube::Error::BuildRequest)?;
        self.client.request_text(request).await
    }

    /// Publishes an Event about `object`, a new one each time (failures are logged only).
    pub async fn event(&self, kind: &KindProfile, object: &LiveObject, event: &Event) {
        let reference = events::reference(kind, object.namespace.as_deref(), &object.name, &object.uid);
        events::publish_once(&self.client, &self.reporter, event, &reference).await;
    }

    /// Publishes an Event summing up a restore of `kind`'s objects, about the kind's
    /// CustomResourceDefinition (cluster-scoped: the Event is in the `default` namespace), so
    /// that `kubectl get events --field-selector regarding.name=<plural>.<group>` finds it.
    pub async fn summary_event(&self, kind: &KindProfile, event: Event) {
        self.summary_event_owned(kind, event).await;
    }

    /// [`Writer::summary_event`] as a future of its own, to be spawned: the controller's loop
    /// never waits for an Event (its retries last up to a minute on an API server that went
    /// away), and gives it up after [`EVENT_TIMEOUT`].
    pub fn summary_event_owned(
        &self,
        kind: &KindProfile,
        event: Event,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (client, reporter, reference) = (self.client.clone(), self.reporter.clone(), events::crd_reference(kind));
        async move {
            let published = events::publish_once(&client, &reporter, &event, &reference);
            if tokio::time::timeout(EVENT_TIMEOUT, published).await.is_err() {
                tracing::warn!(object = ?reference.name, reason = %event.reason, "gave up an event after {EVENT_TIMEOUT:?}");
            }
        }
    }

    /// Reads the object again, raw.
    pub async fn get(&self, kind: &KindProfile, object: &LiveObject) -> Result<String> {
        let context = || format!("re-read {}", object.object_ref());
        self.get_named(kind, object.namespace.as_deref(), &object.name).await.map_err(|e| Error::kube(context(), e))
    }

    /// Lists every object of `kind` (no selector: whatever the target holds), handing each to
    /// `visit`. False when the kind is not served.
    pub async fn list_all(
        &self,
        kind: &KindProfile,
        visit: impl FnMut(&crate::domain::object::RawObject<'_>) -> Result<()>,
    ) -> Result<bool> {
        let page = crate::k8s::PageRequest { size: crate::k8s::DEFAULT_PAGE_SIZE, selector: None, namespace: None };
        crate::k8s::list_objects(&self.client, kind, &page, visit).await
    }

    /// Reads an object of `kind` by name, raw.
    pub async fn get_named(
        &self,
        kind: &KindProfile,
        namespace: Option<&str>,
        name: &str,
    ) -> std::result::Result<String, kube::Error> {
        get_object(&self.client, kind, namespace, name).await
    }
}

/// Reads an object of `kind` by name, raw.
pub async fn get_object(
    client: &kube::Client,
    kind: &KindProfile,
    namespace: Option<&str>,
    name: &str,
) -> std::result::Result<String, kube::Error> {
    let request = kube::core::Request::new(kind.list_path_in(namespace))
        .get(name, &GetParams::default())
        .map_err(kube::Error::BuildRequest)?;
    client.request_text(request).await
}

/// What became of an annotation patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Annotated {
    Done,
    /// The object is gone.
    Gone,
    /// The object is no longer the version the patch was conditional on.
    Conflict,
}

/// A JSON merge patch of the annotations of `kind` `name`, as restatus: each key set to its
/// value, or removed where the value is null; conditional on `version` (uid and
/// resourceVersion) when given.
pub async fn annotate(
    client: &kube::Client,
    kind: &KindProfile,
    namespace: Option<&str>,
    name: &str,
    version: Option<(&str, &str)>,
    annotations: &impl Serialize,
) -> Result<Annotated> {
    let context = || match namespace {
        Some(ns) => format!("annotate {} {ns}/{name}", kind.kind),
        None => format!("annotate {} {name}", kind.kind),
    };
    let body = match version {
        Some((uid, resource_version)) => serde_json::json!({"metadata": {
            "uid": uid, "resourceVersion": resource_version, "annotations": annotations,
        }}),
        None => serde_json::json!({"metadata": {"annotations": annotations}}),
    };
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    let request = kube::core::Request::new(kind.list_path_in(namespace))
        .patch(name, &params, &Patch::Merge(&body))
        .map_err(|e| Error::kube(context(), kube::Error::BuildRequest(e)))?;
    match client.request_text(request).await {
        Ok(_) => Ok(Annotated::Done),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(Annotated::Gone),
        Err(kube::Error::Api(s)) if s.is_conflict() && version.is_some() => Ok(Annotated::Conflict),
        Err(e) => Err(Error::kube(context(), e)),
    }
}

#[cfg(test)]
impl Writer {
    /// A writer on a scripted client that knows which kinds have a status subresource.
    /// (`status_subresource`: kinds of the metal-operator profile, e.g. `Server`; the other
    /// kinds of the profile are known to have none.)
    pub(crate) fn scripted(client: kube::Client, status_subresource: &[&str]) -> Self {
        let reporter = Reporter { controller: TOOL_NAME.into(), instance: None };
        let kinds = Profile::metal_operator().kinds;
        let discovered = kinds
            .iter()
            .map(|k| {
                let status = status_subresource.contains(&k.kind.as_str());
                (served_key(k), Discovered::Answered { served: true, status })
            })
            .collect();
        Writer { client, reporter, discovered: std::sync::RwLock::new(discovered) }
    }
}

#[cfg(test)]
mod tests {
    use http::Method;
    use kube::runtime::events::EventType;

    use super::*;
    use crate::fixtures::{api, live, uuid};

    /// Each restored object's Event is created, never a patch of an earlier one: the writer
    /// remembers no Event (kube's recorder holds each for six minutes and turns a repeat
    /// into a series), so a restore's memory does not grow by an Event an object.
    #[tokio::test]
    async fn every_event_is_a_new_one_and_none_is_remembered() {
        let (client, mut handle) = api::client();
        let writer = Writer::scripted(client, &["Server"]);
        let profile = Profile::metal_operator();
        let kind = profile.kind("Server").unwrap();
        let object = LiveObject { uid: "u-1".into(), ..live("Server", "server-1", &[uuid("uuid-1")], None) };
        let event = Event {
            type_: EventType::Normal,
            reason: "StatusRestored".into(),
            note: Some("status restored".into()),
            action: "RestoreStatus".into(),
            secondary: None,
        };
        let api_server = tokio::spawn(async move {
            let mut seen = vec![];
            for _ in 0..2 {
                seen.push(api::echo(&mut handle).await);
            }
            seen
        });
        writer.event(kind, &object, &event).await;
        writer.event(kind, &object, &event).await;
        let seen = api_server.await.unwrap();
        let create = (Method::POST, "/apis/events.k8s.io/v1/namespaces/default/events".to_string());
        assert_eq!(seen, [create.clone(), create]);
    }
}
