//! Fixtures shared by the unit tests: identity keys, records, live objects, manifests, and a
//! scripted API server (tower-test) that plays the API server's side of a conversation.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::domain::identity::Profile;
use crate::domain::live::{LiveObject, LiveStatus};
use crate::format::{CaptureSummary, IdentityKey, Manifest, PayloadSummary, Record, SnapshotId};

/// When the fixtures' snapshots were taken.
pub const SNAPSHOT_TIME: &str = "2026-11-30T09:00:00Z";

pub fn ts(s: &str) -> Timestamp {
    s.parse().expect("a test timestamp")
}

pub fn key(field: &str, value: &str) -> IdentityKey {
    IdentityKey { field: field.into(), value: value.into() }
}

/// A Server's primary key.
pub fn uuid(value: &str) -> IdentityKey {
    key("spec.systemUUID", value)
}

fn raw(json: &Value) -> Box<RawValue> {
    RawValue::from_string(json.to_string()).expect("a test status is JSON")
}

/// A cluster-scoped metal-operator record of `kind`, captured from `name`.
pub fn record(kind: &str, name: &str, keys: &[IdentityKey], status: Value) -> Record {
    Record {
        api_version: "metal.ironcore.dev/v1alpha1".into(),
        kind: kind.into(),
        namespace: None,
        name: name.into(),
        keys: keys.to_vec(),
        uid: Some(format!("src-{name}")),
        resource_version: None,
        generation: None,
        creation_timestamp: None,
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        status: raw(&status),
    }
}

/// A live, cluster-scoped object of `kind` named `name` (its uid is its name), at
/// resourceVersion 1.
pub fn live(kind: &str, name: &str, keys: &[IdentityKey], status: Option<Value>) -> LiveObject {
    LiveObject {
        kind: kind.into(),
        namespace: None,
        name: name.into(),
        uid: name.into(),
        resource_version: "1".into(),
        keys: keys.to_vec(),
        status: status.as_ref().map(|s| {
            let profile = Profile::metal_operator();
            LiveStatus::new(profile.kind(kind).expect("a kind of the metal-operator profile"), &raw(s))
        }),
        annotations: BTreeMap::new(),
        status_written_at: None,
    }
}

/// The manifest of a consistent snapshot of cluster `c` taken at `at`.
pub fn manifest(id: SnapshotId, at: Timestamp) -> Manifest {
    manifest_of(id, at, CaptureSummary::empty())
}

pub fn manifest_of(id: SnapshotId, at: Timestamp, capture: CaptureSummary) -> Manifest {
    let payload = PayloadSummary {
        size: 0,
        uncompressed_size: 0,
        sha256: String::new(),
        records: 0,
        frames: 0,
        encryption: None,
    };
    Manifest::new("c", id, at, "metal-operator", capture, payload)
}

/// A scripted API server: the test plays the API server's side, request by request.
pub mod api {
    use http::{Method, Request, Response, StatusCode};
    use kube::client::Body;
    use serde_json::{Value, json};
    use tower_test::mock;

    pub type Handle = mock::Handle<Request<Body>, Response<Body>>;

    /// A client whose requests `Handle` answers.
    pub fn client() -> (kube::Client, Handle) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        (kube::Client::new(service, "default"), handle)
    }

    /// Answers the next request with `code` and `answer`; returns its method, path and body.
    pub async fn answer(api: &mut Handle, code: StatusCode, answer: String) -> (Method, String, Value) {
        let (request, send) = api.next_request().await.expect("a request");
        let (method, path) = (request.method().clone(), request.uri().path().to_string());
        let body = request.into_body().collect_bytes().await.expect("request body");
        send.send_response(Response::builder().status(code).body(Body::from(answer.into_bytes())).unwrap());
        (method, path, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// Creates what is posted (an Event): answers with the request's own body.
    pub async fn echo(api: &mut Handle) -> (Method, String) {
        let (request, send) = api.next_request().await.expect("a request");
        let (method, path) = (request.method().clone(), request.uri().path().to_string());
        let body = request.into_body().collect_bytes().await.expect("request body");
        send.send_response(Response::builder().status(StatusCode::CREATED).body(Body::from(body)).unwrap());
        (method, path)
    }

    /// A metal-operator Server as listed: uid `uid-<name>`, systemUUID `uuid-<name>`, and
    /// `status` (none: a bare Server).
    pub fn server(name: &str, status: Option<&Value>) -> Value {
        let mut server = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
               "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "1"},
               "spec": {"systemUUID": format!("uuid-{name}")}});
        if let Some(status) = status {
            server["status"] = status.clone();
        }
        server
    }

    /// A page of Servers named `names` (with `status`), continued by `next` ("" on the last page).
    pub fn server_page(names: &[&str], next: &str, status: Option<&Value>) -> String {
        let items: Vec<_> = names.iter().map(|n| server(n, status)).collect();
        json!({"kind": "ServerList", "metadata": {"continue": next}, "items": items}).to_string()
    }

    /// The API server's answer to a continue token it compacted away (410 Gone).
    pub fn expired() -> String {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
               "message": "The provided continue parameter is too old to display a consistent list result."})
        .to_string()
    }

    /// The API server lists Servers a, b; expires the continue token; then lists a, b and c
    /// (each with `status`).
    pub async fn list_with_an_expired_token(api: &mut Handle, status: Option<Value>) {
        let status = status.as_ref();
        answer(api, StatusCode::OK, server_page(&["a", "b"], "t1", status)).await;
        answer(api, StatusCode::GONE, expired()).await;
        answer(api, StatusCode::OK, server_page(&["a", "b"], "t2", status)).await;
        answer(api, StatusCode::OK, server_page(&["c"], "", status)).await;
    }

    /// The API server's answer to a write on a stale resourceVersion.
    pub fn conflict() -> String {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
               "message": "the object has been modified; please apply your changes to the latest version"})
        .to_string()
    }
}

/// A snapshot of `records` written to `store` (captured at `at`; `consistent` its verdict).
pub async fn write_snapshot(
    store: &crate::store::SnapshotStore,
    at: &str,
    records: &[Record],
    consistent: bool,
) -> Manifest {
    let (payload, summary) = encode(records);
    let at = ts(at);
    let id = SnapshotId::new(at);
    object_store::ObjectStoreExt::put(store.object_store().as_ref(), &store.payload_path(&id), payload.into())
        .await
        .expect("payload written");
    let mut capture = CaptureSummary::empty();
    capture.consistency.consistent = consistent;
    capture.consistency.reason_count = usize::from(!consistent);
    let manifest = Manifest::new(store.cluster_id(), id, at, "metal-operator", capture, summary);
    store.put_manifest(&manifest).await.expect("manifest written");
    manifest
}

/// Records as a payload: its bytes and summary.
pub fn encode(records: &[Record]) -> (Vec<u8>, PayloadSummary) {
    crate::format::PayloadEncoder::encode_all(3, None, records).expect("records encode")
}

/// Appends a segment of `records` to the journal of `base`, `secs` seconds after the chain's
/// point, with the verdict `consistent`. Its sequence number.
pub async fn append_segment(
    store: &crate::store::SnapshotStore,
    base: &Manifest,
    records: &[Record],
    secs: i64,
    consistent: bool,
) -> u64 {
    let chain = store.read_chain(&base.snapshot_id, base.created_at, None).await.expect("chain read");
    let seq = chain.next_sequence();
    let (bytes, summary) = encode(records);
    let from = chain.links.last().map_or(base.created_at, |l| l.header.to);
    let deleted = records.iter().filter(|r| crate::format::is_tombstone(r)).count() as u64;
    let consistency =
        crate::format::Consistency { consistent, attempts: 1, reasons: vec![], reason_count: usize::from(!consistent) };
    let mut header = crate::format::SegmentHeader::new(
        store.cluster_id(),
        &base.snapshot_id,
        seq,
        chain.last_sha256(),
        from,
        from + jiff::SignedDuration::from_secs(secs),
        BTreeMap::new(),
        (records.len() as u64 - deleted, deleted),
        summary,
        Some(consistency),
    );
    store.put_segment(&mut header, bytes, None).await.expect("segment written");
    seq
}
