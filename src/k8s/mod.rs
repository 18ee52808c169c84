//! The Kubernetes edge: clients (and the adaptive limit on their writes), listing, writing,
//! events and leader election. Every flow
//! reaches the API server through here; nothing in this folder decides anything.

pub mod client;
pub mod events;
pub mod leader;
pub mod limit;
pub mod limiter;
pub mod list;
pub mod proxy;
pub mod watch;
pub mod writer;

use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};

use crate::domain::identity::KindProfile;

pub use client::{USER_AGENT, client, cluster_uid, connect, limited_client};
pub use limit::{LimitReport, WriteLimit};
pub use list::{DEFAULT_PAGE_SIZE, LIST_RESTARTS, Page, PageRequest, Pager, list_objects};
pub use writer::{Annotated, FIELD_MANAGER, Writer, annotate, get_object};

/// A dynamic API handle for `kind`: in `namespace` for a namespaced kind, else cluster-wide.
pub fn api_for(client: &kube::Client, kind: &KindProfile, namespace: Option<&str>) -> Api<DynamicObject> {
    api_as(client, kind, namespace)
}

/// [`api_for`], its objects read as `K` (a watch's `RawResource`, say).
pub fn api_as<K>(client: &kube::Client, kind: &KindProfile, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
{
    let gvk = GroupVersionKind::gvk(&kind.group, &kind.version, &kind.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &kind.plural);
    match namespace {
        Some(ns) if kind.namespaced => Api::namespaced_with(client.clone(), ns, &resource),
        _ => Api::all_with(client.clone(), &resource),
    }
}
