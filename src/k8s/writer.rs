//! Writes to objects of the profile's kinds, as restatus (field manager `restatus`): JSON
//! merge patches and replaces of an object or its subresource, re-reads, and Events. Requests
//! and answers stay raw JSON. Discovery tells which kinds have a status subresource.

use std::collections::HashSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::api::{GetParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, Recorder};
use serde::Serialize;

use crate::domain::identity::{KindProfile, Profile};
use crate::domain::live::LiveObject;
use crate::k8s::events;
use crate::{Error, Result, TOOL_NAME};

/// Field manager of every write restatus makes.
pub const FIELD_MANAGER: &str = TOOL_NAME;

/// What writing needs beyond one snapshot: the client, the event recorder, and which kinds
/// have a status subresource. Lives as long as the restore run or the controller.
pub struct Writer {
    client: kube::Client,
    recorder: Recorder,
    status_subresource: HashSet<String>,
}

impl Writer {
    /// Asks the API server (discovery) which kinds of the profile have a status subresource.
    pub async fn new(client: &kube::Client, profile: &Profile) -> Result<Self> {
        let mut status_subresource = HashSet::new();
        // Denied kinds are never written: their groups are not asked (a profile may spell the
        // core group `core`, which no API server serves under /apis).
        let kinds = || profile.kinds.iter().filter(|k| !k.is_denied());
        let mut versions: Vec<(&str, &str)> = kinds().map(|k| (&*k.group, &*k.version)).collect();
        versions.sort();
        versions.dedup();
        for (group, version) in versions {
            let path = if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
            let request = http::Request::get(&path)
                .body(vec![])
                .map_err(|e| Error::kube(format!("discover {path}"), kube::Error::HttpError(e)))?;
            let served: APIResourceList = match client.request(request).await {
                Ok(list) => list,
                // Not served: nothing of it can be written; planning says so per object.
                // (A 404 of a group the server does not know comes with a plain-text body.)
                Err(kube::Error::Api(s)) if s.is_not_found() || s.code == 404 => continue,
                Err(e) => return Err(Error::kube(format!("discover {path}"), e)),
            };
            let names: HashSet<&str> = served.resources.iter().map(|r| r.name.as_str()).collect();
            for kind in kinds().filter(|k| k.group == group && k.version == version) {
                if names.contains(format!("{}/status", kind.plural).as_str()) {
                    status_subresource.insert(kind.kind.clone());
                }
            }
        }
        Ok(Writer { client: client.clone(), recorder: events::recorder(client), status_subresource })
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

    pub fn has_status_subresource(&self, kind: &KindProfile) -> bool {
        self.status_subresource.contains(&kind.kind)
    }

    /// Publishes an Event about `object` (failures are logged only).
    pub async fn event(&self, kind: &KindProfile, object: &LiveObject, event: &Event) {
        let reference = events::reference(kind, object.namespace.as_deref(), &object.name, &object.uid);
        events::publish(&self.recorder, event, &reference).await;
    }

    /// Reads the object again, raw.
    pub async fn get(&self, kind: &KindProfile, object: &LiveObject) -> Result<String> {
        let context = || format!("re-read {}", object.object_ref());
        self.get_named(kind, object.namespace.as_deref(), &object.name).await.map_err(|e| Error::kube(context(), e))
    }

    /// Reads an object of `kind` by name, raw.
    pub async fn get_named(
        &self,
        kind: &KindProfile,
        namespace: Option<&str>,
        name: &str,
    ) -> std::result::Result<String, kube::Error> {
        let request = kube::core::Request::new(kind.list_path_in(namespace))
            .get(name, &GetParams::default())
            .map_err(kube::Error::BuildRequest)?;
        self.client.request_text(request).await
    }
}

#[cfg(test)]
impl Writer {
    /// A writer on a scripted client that knows which kinds have a status subresource.
    pub(crate) fn scripted(client: kube::Client, status_subresource: &[&str]) -> Self {
        let reporter = kube::runtime::events::Reporter { controller: TOOL_NAME.into(), instance: None };
        let recorder = Recorder::new(client.clone(), reporter);
        Writer { client, recorder, status_subresource: status_subresource.iter().map(|k| k.to_string()).collect() }
    }
}
