//! Watching, the Kubernetes edge of the controller and of `preflight --wait`: a kind's objects
//! as kube-runtime's watcher streams them (list, then watch, re-listed when its
//! resourceVersion expired), and what a watch error means.

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use kube::api::DynamicObject;
use kube::runtime::{WatchStreamExt, watcher};

use crate::domain::identity::KindProfile;
use crate::k8s::api_for;

pub use kube::runtime::watcher::{Error as WatchError, Event as WatchEvent};

/// What to watch of a kind: an optional namespace (default: all), an optional label selector,
/// and the page size of its (re-)lists (0: the watcher's default).
#[derive(Debug, Clone, Copy, Default)]
pub struct WatchRequest<'a> {
    pub namespace: Option<&'a str>,
    pub selector: Option<&'a str>,
    pub page_size: u32,
}

/// The events of `kind`'s objects; after an error the watcher backs off (kube-runtime's default
/// backoff) and resumes, or lists again.
pub fn watch_objects(
    client: &kube::Client,
    kind: &KindProfile,
    request: &WatchRequest<'_>,
) -> BoxStream<'static, Result<WatchEvent<DynamicObject>, WatchError>> {
    let api = api_for(client, kind, request.namespace);
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
