//! Watching, the Kubernetes edge of the controller and of `preflight --wait`: a kind's objects
//! as kube-runtime's watcher streams them (list, then watch, re-listed when its
//! resourceVersion expired), and what a watch error means.

use std::borrow::Cow;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::core::{ApiResource, DynamicResourceScope, Resource};
use kube::runtime::{WatchStreamExt, watcher};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::domain::identity::KindProfile;
use crate::k8s::api_as;

pub use kube::runtime::watcher::{Error as WatchError, Event as WatchEvent};

/// What to watch of a kind: an optional namespace (default: all), an optional label selector,
/// and the page size of its (re-)lists (0: the watcher's default).
#[derive(Debug, Clone, Copy, Default)]
pub struct WatchRequest<'a> {
    pub namespace: Option<&'a str>,
    pub selector: Option<&'a str>,
    pub page_size: u32,
}

/// An object as a watch streams it: its JSON as it came, for the caller to read with
/// `RawObject::parse`, and the few metadata fields the watcher itself needs. Parsing a
/// `DynamicObject` built a `serde_json::Value` tree of every event (some 40 KiB for a discovered
/// Server: the watch events of a mass arrival, and of the controller's own writes, cost more CPU
/// in the controller than anything else it did); this only scans it.
#[derive(Clone, Debug)]
pub struct RawResource {
    /// Name, namespace, uid and resourceVersion only.
    pub metadata: ObjectMeta,
    json: Box<RawValue>,
}

impl RawResource {
    /// The object's JSON.
    pub fn json(&self) -> &str {
        self.json.get()
    }
}

impl<'de> Deserialize<'de> for RawResource {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Head {
            #[serde(default)]
            metadata: Meta,
        }
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct Meta {
            name: Option<String>,
            namespace: Option<String>,
            uid: Option<String>,
            resource_version: Option<String>,
        }
        let json = Box::<RawValue>::deserialize(deserializer)?;
        let Head { metadata: m } = serde_json::from_str(json.get()).map_err(serde::de::Error::custom)?;
        let metadata = ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            ..ObjectMeta::default()
        };
        Ok(RawResource { metadata, json })
    }
}

impl Resource for RawResource {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The events of `kind`'s objects, each object's JSON kept raw; after an error the watcher
/// backs off (kube-runtime's default backoff) and resumes, or lists again.
pub fn watch_objects(
    client: &kube::Client,
    kind: &KindProfile,
    request: &WatchRequest<'_>,
) -> BoxStream<'static, Result<WatchEvent<RawResource>, WatchError>> {
    let api: Api<RawResource> = api_as(client, kind, request.namespace);
    let mut config = watcher::Config::default();
    if request.page_size > 0 {
        config = config.page_size(request.page_size);
    }
    if let Some(selector) = request.selector {
        config = config.labels(selector);
    }
    watcher(api, config).default_backoff().boxed()
}

/// A stream that yields once for every change to any object of `kind` (errors included: the
/// caller only wants to look again).
pub fn changes(client: &kube::Client, kind: &KindProfile, namespace: Option<&str>) -> BoxStream<'static, ()> {
    let request = WatchRequest { namespace, ..Default::default() };
    watch_objects(client, kind, &request).map_ok(|_| ()).map(|_| ()).boxed()
}

/// Why a kind cannot be watched (not served, forbidden); `None` for an interruption the
/// watcher recovers from by itself (a connection lost, a resourceVersion expired).
pub fn unavailable_reason(error: &WatchError) -> Option<String> {
    let status = match error {
        WatchError::InitialListFailed(kube::Error::Api(s)) | WatchError::WatchStartFailed(kube::Error::Api(s)) => {
            Some(s)
        }
        WatchError::WatchError(s) => Some(s),
        _ => None,
    };
    match status {
        Some(s) if s.code == 404 => Some("not served by the API server (no CRD)".into()),
        Some(s) if s.code == 403 => Some("forbidden by RBAC".into()),
        _ => None,
    }
}

#[cfg(test)]
mod raw_tests {
    use kube::core::{ObjectList, WatchEvent as ApiWatchEvent};

    use super::*;

    const SERVER: &str = r#"{"apiVersion":"metal.ironcore.dev/v1alpha1","kind":"Server","metadata":{"name":"s1","uid":"u1","resourceVersion":"7","managedFields":[{"manager":"m"}]},"spec":{"systemUUID":"x"},"status":{"state":"Reserved"}}"#;

    /// A watch event and a list page as the API server sends them: the object's JSON is kept
    /// byte for byte, and the watcher's metadata is read from it.
    #[test]
    fn a_raw_resource_keeps_the_json_as_it_came_and_its_metadata() {
        let line = format!(r#"{{"type":"MODIFIED","object":{SERVER}}}"#);
        let event: ApiWatchEvent<RawResource> = serde_json::from_str(&line).unwrap();
        let ApiWatchEvent::Modified(object) = event else { panic!("{event:?}") };
        assert_eq!(object.json(), SERVER);
        assert_eq!(object.meta().name.as_deref(), Some("s1"));
        assert_eq!(object.meta().uid.as_deref(), Some("u1"));
        assert_eq!(object.meta().resource_version.as_deref(), Some("7"));
        assert_eq!(object.meta().namespace, None);

        let page = format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{"resourceVersion":"9"}},"items":[{SERVER},{SERVER}]}}"#
        );
        let list: ObjectList<RawResource> = serde_json::from_str(&page).unwrap();
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.items[1].json(), SERVER);

        let bookmark = r#"{"type":"BOOKMARK","object":{"kind":"Server","apiVersion":"metal.ironcore.dev/v1alpha1","metadata":{"resourceVersion":"12"}}}"#;
        assert!(serde_json::from_str::<ApiWatchEvent<RawResource>>(bookmark).is_ok());
        assert!(serde_json::from_str::<RawResource>("[1]").is_err(), "not an object");
    }
}
