//! The builders tests share: identity keys, records, live objects, manifests, snapshots and
//! journal segments written to a store, and (unit tests only) a scripted API server (tower-test)
//! that plays the API server's side of a conversation.
//!
//! The unit tests have it; the tests, benches and e2e tests outside `src/` have it through the
//! feature `test-support`, as restatus's own dev-dependency. Not part of restatus's API: a
//! builder panics where a test would fail.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::domain::identity::Profile;
use crate::domain::live::{LiveObject, LiveStatus};
use crate::format::{
    CaptureSummary, IdentityKey, Manifest, PayloadEncoder, PayloadSummary, Recipients, Record, SigningKey, SnapshotId,
};

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

/// A Server as a backup captures it: `server-<i>` (uid `uid-<i>`, systemUUID `uuid-<i>`) at
/// resourceVersion 1, with `status` (JSON text).
pub fn server(i: usize, status: &str) -> Record {
    Record {
        api_version: "metal.ironcore.dev/v1alpha1".into(),
        kind: "Server".into(),
        namespace: None,
        name: format!("server-{i}"),
        keys: vec![uuid(&format!("uuid-{i}"))],
        uid: Some(format!("uid-{i}")),
        resource_version: Some("1".into()),
        generation: Some(1),
        creation_timestamp: Some(SNAPSHOT_TIME.into()),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        status: RawValue::from_string(status.into()).expect("a test status is JSON"),
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

/// A snapshot of `records` written to `store` (captured at `at`; `consistent` its verdict).
pub async fn write_snapshot(
    store: &crate::store::SnapshotStore,
    at: &str,
    records: &[Record],
    consistent: bool,
) -> Manifest {
    let mut capture = CaptureSummary::empty();
    capture.consistency.consistent = consistent;
    capture.consistency.reason_count = usize::from(!consistent);
    snapshot(records).at(ts(at)).capture(capture).write(store).await
}

/// A snapshot of `records` to write to a store the way a backup writes one (payload, then
/// manifest): taken at [`SNAPSHOT_TIME`] with the metal-operator profile, consistent, plain and
/// unsigned until said otherwise: `snapshot(&records).at(ts(..)).signed_with(&key).write(&store)`.
pub fn snapshot(records: &[Record]) -> NewSnapshot<'_> {
    NewSnapshot {
        records,
        at: ts(SNAPSHOT_TIME),
        profile: "metal-operator",
        capture: CaptureSummary::empty(),
        recipients: None,
        key: None,
        captured_from: None,
        record_drop: None,
    }
}

/// A snapshot [`snapshot`] builds.
pub struct NewSnapshot<'a> {
    records: &'a [Record],
    at: Timestamp,
    profile: &'a str,
    capture: CaptureSummary,
    recipients: Option<&'a Recipients>,
    key: Option<&'a SigningKey>,
    captured_from: Option<&'a str>,
    record_drop: Option<crate::format::RecordDrop>,
}

impl<'a> NewSnapshot<'a> {
    /// Taken at `at` (its id, and the manifest's time).
    pub fn at(self, at: Timestamp) -> Self {
        NewSnapshot { at, ..self }
    }

    /// Captured with the profile named `profile`.
    pub fn profile(self, profile: &'a str) -> Self {
        NewSnapshot { profile, ..self }
    }

    /// The manifest's capture summary (kinds, consistency).
    pub fn capture(self, capture: CaptureSummary) -> Self {
        NewSnapshot { capture, ..self }
    }

    /// The payload encrypted to `recipients`.
    pub fn encrypted_to(self, recipients: &'a Recipients) -> Self {
        NewSnapshot { recipients: Some(recipients), ..self }
    }

    /// The manifest signed with `key` (its signature written before it).
    pub fn signed_with(self, key: &'a SigningKey) -> Self {
        NewSnapshot { key: Some(key), ..self }
    }

    /// Captured from the cluster of uid `uid` (what a target that backs itself up records).
    pub fn captured_from(self, uid: &'a str) -> Self {
        NewSnapshot { captured_from: Some(uid), ..self }
    }

    /// Marked as a drop in records against `previous` (which held `records`).
    pub fn dropped_from(self, previous: &Manifest) -> Self {
        let drop = crate::format::RecordDrop {
            previous: previous.snapshot_id.clone(),
            previous_records: previous.payload.records,
            threshold_percent: crate::format::RecordDrop::DEFAULT_THRESHOLD_PERCENT,
        };
        NewSnapshot { record_drop: Some(drop), ..self }
    }

    /// Writes the payload, then the manifest; the manifest written.
    pub async fn write(self, store: &crate::store::SnapshotStore) -> Manifest {
        let id = SnapshotId::new(self.at);
        let (payload, summary) = PayloadEncoder::encode_all(3, self.recipients, self.records).expect("records encode");
        object_store::ObjectStoreExt::put(store.object_store().as_ref(), &store.payload_path(&id), payload.into())
            .await
            .expect("payload written");
        let mut manifest = Manifest::new(store.cluster_id(), id, self.at, self.profile, self.capture, summary);
        manifest.captured_from = self.captured_from.map(String::from);
        manifest.record_drop = self.record_drop;
        match self.key {
            Some(key) => store.put_signed_manifest(&mut manifest, key).await.expect("signed manifest written"),
            None => store.put_manifest(&manifest).await.expect("manifest written"),
        }
        manifest
    }
}

/// Records as a payload: its bytes and summary.
pub fn encode(records: &[Record]) -> (Vec<u8>, PayloadSummary) {
    PayloadEncoder::encode_all(3, None, records).expect("records encode")
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
    append_signed_segment(store, base, records, secs, consistent, None).await
}

/// [`append_segment`], signed with `key` when one is given.
pub async fn append_signed_segment(
    store: &crate::store::SnapshotStore,
    base: &Manifest,
    records: &[Record],
    secs: i64,
    consistent: bool,
    key: Option<&SigningKey>,
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
    store.put_segment(&mut header, bytes, key).await.expect("segment written");
    seq
}

/// A scripted API server: the test plays the API server's side, request by request.
#[cfg(test)]
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

/// An object store scripted for tests that the in-memory one cannot play: every call goes to an
/// in-memory store, except that a GET's body comes in chunks of [`ScriptedStore::CHUNK`] bytes,
/// pulled lazily and counted per object ([`ScriptedStore::bytes_read`], so a test proves a
/// read stopped after so many bytes, not only that it failed), and that the objects whose path
/// contains a string given to [`ScriptedStore::refuse`] answer every read (HEAD, GET) with
/// `PermissionDenied`, as S3 does for a permission, a key under SSE-C or an archived object,
/// and that those given to [`ScriptedStore::understate`] announce 1 byte whatever they hold (as
/// an object replaced between the size a reader asked for and its read).
#[derive(Debug, Default)]
pub struct ScriptedStore {
    inner: object_store::memory::InMemory,
    pulled: std::sync::Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
    refused: std::sync::Mutex<Vec<String>>,
    understated: std::sync::Mutex<Vec<String>>,
}

impl ScriptedStore {
    pub const CHUNK: usize = 64 << 10;

    /// A store to give `SnapshotStore::new`, and this handle to script and question it.
    pub fn new() -> std::sync::Arc<ScriptedStore> {
        std::sync::Arc::default()
    }

    /// Bytes of `path`'s body pulled by GETs so far.
    pub fn bytes_read(&self, path: &object_store::path::Path) -> u64 {
        self.pulled.lock().expect("not poisoned").get(path.as_ref()).copied().unwrap_or(0)
    }

    /// From now on, every read of an object whose path contains `part` is refused.
    pub fn refuse(&self, part: &str) {
        self.refused.lock().expect("not poisoned").push(part.to_string());
    }

    /// From now on, every HEAD and GET of an object whose path contains `part` announces 1 byte.
    pub fn understate(&self, part: &str) {
        self.understated.lock().expect("not poisoned").push(part.to_string());
    }

    fn check(&self, path: &object_store::path::Path) -> object_store::Result<()> {
        let refused = self.refused.lock().expect("not poisoned");
        match refused.iter().any(|part| path.as_ref().contains(part.as_str())) {
            true => Err(object_store::Error::PermissionDenied {
                path: path.to_string(),
                source: "AccessDenied (scripted)".into(),
            }),
            false => Ok(()),
        }
    }
}

impl std::fmt::Display for ScriptedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScriptedStore")
    }
}

#[async_trait::async_trait]
impl object_store::ObjectStore for ScriptedStore {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        use futures::StreamExt;
        self.check(location)?;
        let mut result = self.inner.get_opts(location, options).await?;
        let understated = self.understated.lock().expect("not poisoned");
        if understated.iter().any(|part| location.as_ref().contains(part.as_str())) {
            result.meta.size = 1;
        }
        drop(understated);
        let object_store::GetResultPayload::Stream(body) = result.payload else { return Ok(result) };
        let pulled = std::sync::Arc::clone(&self.pulled);
        let key = location.to_string();
        let chunks = body
            .map(|chunk| {
                let chunk = chunk?;
                let pieces: Vec<object_store::Result<bytes::Bytes>> = (0..chunk.len())
                    .step_by(Self::CHUNK)
                    .map(|at| Ok(chunk.slice(at..chunk.len().min(at + Self::CHUNK))))
                    .collect();
                Ok::<_, object_store::Error>(futures::stream::iter(pieces))
            })
            .map(|r| match r {
                Ok(pieces) => pieces.boxed(),
                Err(e) => futures::stream::once(async { Err(e) }).boxed(),
            })
            .flatten()
            .inspect(move |chunk| {
                if let Ok(chunk) = chunk {
                    *pulled.lock().expect("not poisoned").entry(key.clone()).or_default() += chunk.len() as u64;
                }
            });
        result.payload = object_store::GetResultPayload::Stream(chunks.boxed());
        Ok(result)
    }

    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
