//! The object-store edge: where snapshots live and how they are written and read.
//!
//! Layout under a storage URL's prefix (see `docs/FORMAT.md`):
//!
//! ```text
//! <prefix>/<cluster-id>/<snapshot-id>/payload.jsonl.zst   written first, streamed
//! <prefix>/<cluster-id>/<snapshot-id>/manifest.json.sig   a signed snapshot's signature, before the manifest
//! <prefix>/<cluster-id>/<snapshot-id>/manifest.json       written last, create-only
//! ```

pub mod choose;
pub mod clusters;
pub mod retention;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use jiff::Timestamp;
use object_store::aws::AmazonS3Builder;
use object_store::buffered::BufWriter;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, RetryConfig};
use tracing::warn;
use url::Url;

pub use choose::{Accept, Loaded, Passed, choose_newer, choose_snapshot, resolve};
pub use retention::{Deletion, RetentionPolicy};

use crate::format::Record;
use crate::format::{
    KeyId, MANIFEST_FILE, MAX_SIGNATURE, Manifest, PAYLOAD_FILE, Payload, SIGNATURE_FILE, SigningKey, SnapshotId,
    SpillWriter, TrustedKeys, decode_records, verify_payload,
};
use crate::{Error, Result};

/// Where snapshots go when nothing is configured.
pub const DEFAULT_STORAGE: &str = "file://./restatus-snapshots";

/// No manifest is larger: 100 reasons and the per-kind counts take a few KiB; key conflicts
/// are listed in full, so leave room for many.
pub const MAX_MANIFEST: u64 = 16 << 20;
/// The largest payload read unless raised (`--max-snapshot-size`): some 400k records.
pub const DEFAULT_MAX_PAYLOAD: u64 = 1 << 30;

/// Payloads larger than this are spilled to a temporary file when read for a restore.
pub const SPILL_ABOVE: u64 = 1 << 20;

/// Multipart part size for payload uploads (S3's smallest); also the most a backup buffers
/// before uploading.
const UPLOAD_CAPACITY: usize = 5 << 20;
/// Parts uploaded at once: a backup holds at most this many parts plus the one it fills.
const UPLOAD_PARTS_IN_FLIGHT: usize = 2;

/// What a listing knows about a snapshot without reading it.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotEntry {
    pub id: SnapshotId,
    /// A manifest exists: for readers the snapshot exists.
    pub complete: bool,
    pub payload_size: Option<u64>,
    /// When the newest object of the snapshot was written.
    pub last_modified: Timestamp,
}

#[derive(Clone)]
pub struct SnapshotStore {
    store: Arc<dyn ObjectStore>,
    root: Path,
    cluster_id: String,
    /// The storage URL with any credentials removed, for messages.
    location: String,
    /// Payloads larger than this are refused before they are downloaded.
    max_payload: u64,
    /// Where payloads are spilled while read; `None`: the system's (`TMPDIR`).
    spill_dir: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for SnapshotStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotStore").field("location", &self.location).field("cluster_id", &self.cluster_id).finish()
    }
}

impl SnapshotStore {
    /// Opens `s3://bucket/prefix`, `file:///path` or `memory://`. S3 endpoint, region,
    /// credentials and path style come from the standard `AWS_*` environment (and `S3_ENDPOINT`).
    pub fn open(url: &str, cluster_id: &str) -> Result<Self> {
        let (store, prefix, location) = open_url(url)?;
        Self::new(store, &prefix, cluster_id, location)
    }

    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str, cluster_id: &str, location: String) -> Result<Self> {
        validate_cluster_id(cluster_id)?;
        let mut root = Path::from(prefix);
        root = root.clone().join(cluster_id);
        Ok(SnapshotStore {
            store,
            root,
            cluster_id: cluster_id.to_string(),
            location,
            max_payload: DEFAULT_MAX_PAYLOAD,
            spill_dir: None,
        })
    }

    /// Reads payloads of up to `bytes`; larger ones fail before they are downloaded.
    pub fn with_max_payload(mut self, bytes: u64) -> Self {
        self.max_payload = bytes;
        self
    }

    /// Spills payloads into `dir` instead of the system's temporary directory.
    pub fn with_spill_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.spill_dir = Some(dir.into());
        self
    }

    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    pub fn location(&self) -> &str {
        &self.location
    }

    fn dir(&self, id: &SnapshotId) -> Path {
        self.root.clone().join(id.as_str())
    }

    pub fn manifest_path(&self, id: &SnapshotId) -> Path {
        self.dir(id).join(MANIFEST_FILE)
    }

    pub fn signature_path(&self, id: &SnapshotId) -> Path {
        self.dir(id).join(SIGNATURE_FILE)
    }

    pub fn payload_path(&self, id: &SnapshotId) -> Path {
        self.dir(id).join(PAYLOAD_FILE)
    }

    /// A streaming writer for a new payload: small payloads are one PUT, large ones multipart.
    pub fn payload_writer(&self, id: &SnapshotId) -> BufWriter {
        BufWriter::with_capacity(Arc::clone(&self.store), self.payload_path(id), UPLOAD_CAPACITY)
            .with_max_concurrency(UPLOAD_PARTS_IN_FLIGHT)
    }

    /// Writes the manifest with a create-only PUT: it never replaces an existing one.
    pub async fn put_manifest(&self, manifest: &Manifest) -> Result<()> {
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        self.store
            .put_opts(&self.manifest_path(&manifest.snapshot_id), manifest.to_json().into(), opts)
            .await
            .map_err(|e| Error::store(format!("write manifest of snapshot {}", manifest.snapshot_id), e))?;
        Ok(())
    }

    /// Signs the manifest with `key` (its `signedBy` set to the key's id) and writes the
    /// signature, then the manifest, both create-only: by the time the snapshot exists for
    /// readers, its signature does too. A signature without a manifest is a snapshot that
    /// does not exist (retention removes it with the folder).
    pub async fn put_signed_manifest(&self, manifest: &mut Manifest, key: &SigningKey) -> Result<()> {
        manifest.signed_by = Some(key.id().clone());
        let bytes = manifest.to_json();
        let id = &manifest.snapshot_id;
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        self.store
            .put_opts(&self.signature_path(id), key.sign(&bytes).into(), opts.clone())
            .await
            .map_err(|e| Error::store(format!("write signature of snapshot {id}"), e))?;
        self.store
            .put_opts(&self.manifest_path(id), bytes.into(), opts)
            .await
            .map_err(|e| Error::store(format!("write manifest of snapshot {id}"), e))?;
        Ok(())
    }

    /// Every snapshot folder of this cluster, oldest first, complete or not.
    pub async fn list(&self) -> Result<Vec<SnapshotEntry>> {
        let objects: Vec<_> = self
            .store
            .list(Some(&self.root))
            .try_collect()
            .await
            .map_err(|e| Error::store(format!("list snapshots under {}", self.describe_root()), e))?;
        let mut entries: BTreeMap<SnapshotId, SnapshotEntry> = BTreeMap::new();
        for object in objects {
            let mut parts = object.location.prefix_match(&self.root).into_iter().flatten();
            let (Some(dir), Some(file), None) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            let Ok(id) = dir.as_ref().parse::<SnapshotId>() else {
                continue;
            };
            let modified =
                Timestamp::from_millisecond(object.last_modified.timestamp_millis()).unwrap_or(Timestamp::UNIX_EPOCH);
            let entry = entries.entry(id.clone()).or_insert(SnapshotEntry {
                id,
                complete: false,
                payload_size: None,
                last_modified: modified,
            });
            entry.last_modified = entry.last_modified.max(modified);
            match file.as_ref() {
                MANIFEST_FILE => entry.complete = true,
                PAYLOAD_FILE => entry.payload_size = Some(object.size),
                _ => {}
            }
        }
        Ok(entries.into_values().collect())
    }

    /// Reads and checks a manifest: known major version, and this cluster's.
    pub async fn manifest(&self, id: &SnapshotId) -> Result<Manifest> {
        self.manifest_and_bytes(id).await.map(|(manifest, _)| manifest)
    }

    /// Reads a manifest as [`SnapshotStore::manifest`] does, and with `trusted` keys checks its
    /// signature over the bytes read: an unsigned snapshot, or one whose signature is not a
    /// trusted key's over exactly these bytes, is refused naming the snapshot. Without keys,
    /// nothing is checked (and no signature read). The manifest, and the key that signed it.
    pub async fn verified_manifest(
        &self,
        id: &SnapshotId,
        trusted: Option<&TrustedKeys>,
    ) -> Result<(Manifest, Option<KeyId>)> {
        let (manifest, bytes) = self.manifest_and_bytes(id).await?;
        let Some(trusted) = trusted else { return Ok((manifest, None)) };
        let signature = self.signature(id).await?;
        let signer = trusted.verify(id.as_str(), &bytes, manifest.signed_by.as_ref(), signature.as_deref())?;
        Ok((manifest, Some(signer)))
    }

    /// A snapshot's signature object, if it has one.
    async fn signature(&self, id: &SnapshotId) -> Result<Option<Bytes>> {
        let path = self.signature_path(id);
        let context = || format!("read signature of snapshot {id}");
        match self.store.head(&path).await {
            Ok(meta) if meta.size > MAX_SIGNATURE => {
                let reason = format!("{SIGNATURE_FILE} has {} bytes, more than a signature can have", meta.size);
                return Err(Error::BadSignature { snapshot: id.to_string(), reason });
            }
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(Error::store(context(), e)),
        }
        match self.store.get(&path).await {
            Ok(result) => result.bytes().await.map(Some).map_err(|e| Error::store(context(), e)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::store(context(), e)),
        }
    }

    async fn manifest_and_bytes(&self, id: &SnapshotId) -> Result<(Manifest, Bytes)> {
        match self.store.head(&self.manifest_path(id)).await {
            Ok(meta) if meta.size > MAX_MANIFEST => {
                let reason =
                    format!("manifest has {} bytes, more than a manifest can have ({MAX_MANIFEST})", meta.size);
                return Err(Error::corrupt(id, reason));
            }
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => return Err(Error::SnapshotNotFound(id.to_string())),
            Err(e) => return Err(Error::store(format!("read manifest of snapshot {id}"), e)),
        }
        let bytes = match self.store.get(&self.manifest_path(id)).await {
            Ok(result) => result.bytes().await,
            Err(e) => Err(e),
        };
        let bytes = match bytes {
            Ok(bytes) => bytes,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::SnapshotNotFound(id.to_string()));
            }
            Err(e) => return Err(Error::store(format!("read manifest of snapshot {id}"), e)),
        };
        let manifest = Manifest::from_json(id.as_str(), &bytes)?;
        if manifest.snapshot_id != *id {
            return Err(Error::corrupt(id, format!("manifest names snapshot {}", manifest.snapshot_id)));
        }
        if manifest.cluster_id != self.cluster_id {
            return Err(Error::ForeignSnapshot {
                snapshot: id.to_string(),
                found: manifest.cluster_id,
                expected: self.cluster_id.clone(),
            });
        }
        Ok((manifest, bytes))
    }

    /// The payload's bytes, after checking the stored object's size against the manifest's
    /// and against [`SnapshotStore::max_payload`], before anything is downloaded.
    pub async fn payload(&self, manifest: &Manifest) -> Result<Bytes> {
        self.check_payload_size(manifest).await?;
        self.payload_bytes(&manifest.snapshot_id).await
    }

    /// The payload for reading record by record, checked as [`SnapshotStore::payload`] checks
    /// it. One larger than [`SPILL_ABOVE`] is streamed into an unnamed temporary file (its
    /// sha256 measured on the way), so that a restore's memory does not grow with it; where no
    /// temporary file can be made, it is held in memory.
    pub async fn fetch_payload(&self, manifest: &Manifest) -> Result<Payload> {
        let size = self.check_payload_size(manifest).await?;
        let id = &manifest.snapshot_id;
        let spill = match size > SPILL_ABOVE {
            true => SpillWriter::create(self.spill_dir.as_deref())
                .inspect_err(
                    |e| warn!(snapshot = %id, error = %e, "no temporary file for the payload; holding it in memory"),
                )
                .ok(),
            false => None,
        };
        let Some(mut spill) = spill else { return self.payload_bytes(id).await.map(Payload::from) };
        let read_error = |e| payload_error(id, e);
        let spill_error = |e| Error::io(format!("spill payload of snapshot {id}"), e);
        let mut chunks = self.store.get(&self.payload_path(id)).await.map_err(read_error)?.into_stream();
        while let Some(chunk) = chunks.try_next().await.map_err(read_error)? {
            spill.write(&chunk).map_err(spill_error)?;
        }
        spill.finish().map_err(spill_error)
    }

    /// The stored payload's size, checked against the manifest's and the limit.
    async fn check_payload_size(&self, manifest: &Manifest) -> Result<u64> {
        let id = &manifest.snapshot_id;
        let path = self.payload_path(id);
        let stored = self.store.head(&path).await.map_err(|e| payload_error(id, e))?.size;
        if stored != manifest.payload.size {
            let reason = format!(
                "payload has {stored} bytes, manifest declares {} (truncated or replaced)",
                manifest.payload.size
            );
            return Err(Error::corrupt(id, reason));
        }
        if stored > self.max_payload {
            return Err(Error::TooLarge { snapshot: id.to_string(), size: stored, limit: self.max_payload });
        }
        Ok(stored)
    }

    /// The payload's bytes as stored, unchecked (tests damage them).
    pub async fn payload_bytes(&self, id: &SnapshotId) -> Result<Bytes> {
        let result = match self.store.get(&self.payload_path(id)).await {
            Ok(result) => result.bytes().await,
            Err(e) => Err(e),
        };
        result.map_err(|e| payload_error(id, e))
    }

    /// Reads a snapshot and checks it end to end: manifest, size, sha256, decompressed size,
    /// every record. Hands each record to `visit`.
    pub async fn load(&self, id: &SnapshotId, visit: impl FnMut(Record) -> Result<()>) -> Result<Manifest> {
        self.load_verified(id, None, visit).await.map(|(manifest, _)| manifest)
    }

    /// [`SnapshotStore::load`], with the manifest's signature checked first against `trusted`
    /// keys (see [`SnapshotStore::verified_manifest`]). The manifest and the key that signed it.
    pub async fn load_verified(
        &self,
        id: &SnapshotId,
        trusted: Option<&TrustedKeys>,
        visit: impl FnMut(Record) -> Result<()>,
    ) -> Result<(Manifest, Option<KeyId>)> {
        let (manifest, signer) = self.verified_manifest(id, trusted).await?;
        let payload = self.payload(&manifest).await?;
        verify_payload(&manifest, &payload)?;
        decode_records(&manifest, &payload, visit)?;
        Ok((manifest, signer))
    }

    /// Deletes a snapshot: the manifest first, so a half-deleted snapshot no longer exists for
    /// readers, then its signature and the payload.
    pub async fn delete(&self, id: &SnapshotId) -> Result<()> {
        for path in [self.manifest_path(id), self.signature_path(id), self.payload_path(id)] {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::store(format!("delete {path} of snapshot {id}"), e)),
            }
        }
        Ok(())
    }

    /// The underlying object store (tests reach past the layout to damage snapshots).
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    fn describe_root(&self) -> String {
        format!("{}/{}", self.location.trim_end_matches('/'), self.cluster_id)
    }
}

/// A failed HEAD or GET of a snapshot's payload: a missing one makes the snapshot corrupt.
fn payload_error(id: &SnapshotId, e: object_store::Error) -> Error {
    match e {
        object_store::Error::NotFound { .. } => Error::corrupt(id, "payload is missing"),
        e => Error::store(format!("read payload of snapshot {id}"), e),
    }
}

fn validate_cluster_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !id.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(Error::StorageUrl {
            url: id.into(),
            reason: "cluster id must be 1-128 characters of letters, digits, '-', '_' or '.'".into(),
        })
    }
}

/// Parses a storage URL into a store, a prefix inside it, and a description free of secrets.
fn open_url(raw: &str) -> Result<(Arc<dyn ObjectStore>, String, String)> {
    let err = |reason: String| Error::StorageUrl { url: redact(raw), reason };
    if let Some(rest) = raw.strip_prefix("file://") {
        let dir = std::path::absolute(if rest.is_empty() { "." } else { rest })
            .map_err(|e| err(format!("cannot resolve path: {e}")))?;
        std::fs::create_dir_all(&dir).map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
        let store =
            LocalFileSystem::new_with_prefix(&dir).map_err(|e| err(e.to_string()))?.with_automatic_cleanup(true);
        return Ok((Arc::new(store), String::new(), format!("file://{}", dir.display())));
    }
    let url = Url::parse(raw).map_err(|e| err(format!("not a URL: {e}")))?;
    match url.scheme() {
        "memory" => Ok((Arc::new(InMemory::new()), url.path().trim_matches('/').to_string(), "memory://".into())),
        "s3" => {
            if !url.username().is_empty() || url.password().is_some() {
                return Err(err(
                    "credentials do not belong in the URL; use AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY".into()
                ));
            }
            let bucket = url.host_str().filter(|b| !b.is_empty()).ok_or_else(|| err("no bucket".into()))?;
            let prefix = url.path().trim_matches('/').to_string();
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket).with_retry(retry_config());
            let endpoint = std::env::var("AWS_ENDPOINT_URL_S3")
                .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
                .or_else(|_| std::env::var("AWS_ENDPOINT"))
                .or_else(|_| std::env::var("S3_ENDPOINT"))
                .ok()
                .filter(|e| !e.is_empty());
            if let Some(endpoint) = &endpoint {
                builder = builder.with_endpoint(endpoint).with_allow_http(endpoint.starts_with("http://"));
            }
            if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() {
                builder = builder.with_region("us-east-1");
            }
            let store = builder.build().map_err(|e| err(e.to_string()))?;
            let location = match &endpoint {
                Some(endpoint) => format!("s3://{bucket}/{prefix} at {}", redact(endpoint)),
                None => format!("s3://{bucket}/{prefix}"),
            };
            Ok((Arc::new(store), prefix, location))
        }
        other => Err(err(format!("unsupported scheme {other:?}; use s3://, file:// or memory://"))),
    }
}

/// Bounded retries: an unreachable S3 fails a backup in seconds, not minutes.
fn retry_config() -> RetryConfig {
    RetryConfig { max_retries: 3, retry_timeout: Duration::from_secs(30), ..Default::default() }
}

/// A URL without user info or query (which may carry credentials).
pub fn redact(raw: &str) -> String {
    match Url::parse(raw) {
        Ok(mut url) => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.set_query(None);
            url.to_string()
        }
        Err(_) => raw.split('@').next_back().unwrap_or_default().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_credentials() {
        assert_eq!(redact("http://user:secret@minio:9000/"), "http://minio:9000/");
        assert_eq!(redact("s3://bucket/p?X-Amz-Signature=abc"), "s3://bucket/p");
    }

    #[test]
    fn rejects_bad_urls_and_cluster_ids() {
        for (url, expected) in [
            ("ftp://x/y", "unsupported scheme"),
            ("s3://key:secret@bucket/p", "credentials do not belong"),
            ("nonsense", "not a URL"),
        ] {
            let err = SnapshotStore::open(url, "c").unwrap_err().to_string();
            assert!(err.contains(expected), "{url}: {err}");
            assert!(!err.contains("secret"), "credentials leaked: {err}");
        }
        for bad in ["", "../x", "a/b", ".hidden"] {
            assert!(SnapshotStore::open("memory://", bad).is_err(), "{bad:?} accepted");
        }
    }
}
