//! The object-store edge: where snapshots live and how they are written and read.
//!
//! Layout under a storage URL's prefix (see `docs/FORMAT.md`):
//!
//! ```text
//! <prefix>/<cluster-id>/<snapshot-id>/payload.jsonl.zst   written first, streamed
//! <prefix>/<cluster-id>/<snapshot-id>/manifest.json.sig   a signed snapshot's signature, before the manifest
//! <prefix>/<cluster-id>/<snapshot-id>/manifest.json       written last, create-only
//! <prefix>/<cluster-id>/<snapshot-id>/journal/…            journal segments on this base ([`journal`])
//! ```

pub mod choose;
pub mod clusters;
pub mod journal;
pub mod retention;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use jiff::Timestamp;
use object_store::aws::AmazonS3Builder;
use object_store::aws::AmazonS3ConfigKey;
use object_store::buffered::BufWriter;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{Certificate, ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, RetryConfig};
use tracing::warn;
use url::Url;

pub use choose::{
    Accept, Loaded, Passed, Point, ReadOn, Tail, choose_newer, choose_snapshot, read_on, resolve, snapshot_at,
};
pub use retention::{Deletion, RetentionPolicy};

use crate::format::Record;
use crate::format::{
    DecryptionKeys, KeyId, MANIFEST_FILE, MAX_SIGNATURE, Manifest, PAYLOAD_FILE, Payload, SIGNATURE_FILE, SigningKey,
    SnapshotId, SpillWriter, TrustedKeys, decode_records, open_payload,
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
    /// Decrypts encrypted payloads (`--decryption-key`); `None`: they are refused, named.
    decryption: Option<Arc<DecryptionKeys>>,
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
        Self::open_with(url, cluster_id, &S3Options::default())
    }

    /// [`Self::open`] with server-side encryption and a private CA for `s3://` URLs.
    pub fn open_with(url: &str, cluster_id: &str, s3: &S3Options) -> Result<Self> {
        let (store, prefix, location) = open_url(url, s3, true)?;
        Self::new(store, &prefix, cluster_id, location)
    }

    /// [`open_with`](Self::open_with) for a command that only reads: a `file://` directory that
    /// does not exist is an error, never created.
    pub fn open_existing_with(url: &str, cluster_id: &str, s3: &S3Options) -> Result<Self> {
        let (store, prefix, location) = open_url(url, s3, false)?;
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
            decryption: None,
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

    /// Decrypts encrypted payloads with `keys` as they are read.
    pub fn with_decryption_keys(mut self, keys: Option<Arc<DecryptionKeys>>) -> Self {
        self.decryption = keys;
        self
    }

    /// Whether this store can read encrypted payloads (has decryption keys).
    pub fn decrypts(&self) -> bool {
        self.decryption.is_some()
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

    /// Completes a snapshot, as the backup pipeline and the journal's fold write them: the
    /// rest of its payload (`tail`) through `upload` (this snapshot's [`payload_writer`]),
    /// the upload completed, then (`completedAt` set now) its manifest, signed with
    /// `signing_key` (signature first), create-only. Payload first, manifest last: a snapshot
    /// exists for readers only once whole; an upload that fails leaves no manifest (and the
    /// folder is removed by retention).
    ///
    /// [`payload_writer`]: SnapshotStore::payload_writer
    pub async fn finish_snapshot(
        &self,
        mut upload: BufWriter,
        tail: &[u8],
        manifest: &mut Manifest,
        signing_key: Option<&SigningKey>,
    ) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        let id = manifest.snapshot_id.clone();
        let uploaded = async {
            upload.write_all(tail).await?;
            upload.shutdown().await
        }
        .await;
        if let Err(e) = uploaded {
            // Not aborted: after a failed shutdown object_store has nothing left to abort (a
            // single PUT failed, or completing the multipart upload did). No manifest is
            // written either way.
            return Err(Error::io(format!("upload payload of snapshot {id} to {}", self.location()), e));
        }
        manifest.completed_at = jiff::Timestamp::now().max(manifest.created_at);
        match signing_key {
            Some(key) => self.put_signed_manifest(manifest, key).await,
            None => self.put_manifest(manifest).await,
        }
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
    /// temporary file can be made, it is held in memory. An encrypted payload is refused before
    /// it is downloaded without decryption keys; with them, its stored bytes are verified, then
    /// decrypted (spilled the same way).
    pub async fn fetch_payload(&self, manifest: &Manifest) -> Result<Payload> {
        if let Some(encryption) = &manifest.encryption
            && self.decryption.is_none()
        {
            let recipients = encryption.recipients_text();
            return Err(Error::Encrypted { snapshot: manifest.snapshot_id.to_string(), recipients });
        }
        let stored = self.fetch_stored(manifest).await?;
        let spill = match manifest.encryption.is_some() && stored.len() > SPILL_ABOVE {
            true => self.spill_writer(&manifest.snapshot_id),
            false => None,
        };
        open_payload(manifest, stored, self.decryption.as_deref(), spill)
    }

    /// The payload's bytes as stored (ciphertext, when encrypted), fetched as
    /// [`SnapshotStore::fetch_payload`] fetches them; not verified.
    pub async fn fetch_stored(&self, manifest: &Manifest) -> Result<Payload> {
        let size = self.check_payload_size(manifest).await?;
        let id = &manifest.snapshot_id;
        let spill = match size > SPILL_ABOVE {
            true => self.spill_writer(id),
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

    /// A temporary file for a payload, or `None` (logged) where none can be made.
    fn spill_writer(&self, id: &SnapshotId) -> Option<SpillWriter> {
        SpillWriter::create(self.spill_dir.as_deref())
            .inspect_err(
                |e| warn!(snapshot = %id, error = %e, "no temporary file for the payload; holding it in memory"),
            )
            .ok()
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
        let payload = self.fetch_payload(&manifest).await?;
        decode_records(&manifest, payload, visit)?;
        Ok((manifest, signer))
    }

    /// Deletes a snapshot: the manifest first, so a half-deleted snapshot no longer exists for
    /// readers, then its signature and the payload, then its journal (segments are kept with
    /// their base and removed with it).
    pub async fn delete(&self, id: &SnapshotId) -> Result<()> {
        for path in [self.manifest_path(id), self.signature_path(id), self.payload_path(id)] {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::store(format!("delete {path} of snapshot {id}"), e)),
            }
        }
        self.delete_journal(id).await
    }

    /// The objects of a snapshot's folder, whatever they are: file name and size, by name.
    pub async fn files(&self, id: &SnapshotId) -> Result<Vec<(String, u64)>> {
        let dir = self.dir(id);
        let objects: Vec<_> = self
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| Error::store(format!("list the objects of snapshot {id}"), e))?;
        let mut files: Vec<(String, u64)> =
            objects.into_iter().map(|o| (o.location.filename().unwrap_or_default().to_string(), o.size)).collect();
        files.sort();
        Ok(files)
    }

    /// The underlying object store (tests reach past the layout to damage snapshots).
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Where a snapshot lives, as a person types it: `<storage>/<cluster id>/<snapshot id>/`.
    pub fn snapshot_url(&self, id: &SnapshotId) -> String {
        format!("{}/{id}/", self.describe_root())
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
/// How `s3://` storage is reached beyond the `AWS_*` environment: server-side encryption
/// and CAs trusted on top of the system's. Set fields override `AWS_SERVER_SIDE_ENCRYPTION`,
/// `AWS_SSE_KMS_KEY_ID` and `AWS_SSE_BUCKET_KEY_ENABLED`, which object_store reads itself.
#[derive(Debug, Clone, Default)]
pub struct S3Options {
    /// `AES256` (SSE-S3) or `aws:kms` (SSE-KMS); `None`: the bucket's default.
    pub sse: Option<String>,
    /// The KMS key for SSE-KMS; without it S3 uses the account's default key.
    pub sse_kms_key_id: Option<String>,
    /// With SSE-KMS: use (or refuse) an S3 Bucket Key.
    pub sse_bucket_key: Option<bool>,
    /// A PEM file of CA certificates trusted for the endpoint, besides the system's.
    pub ca_file: Option<std::path::PathBuf>,
}

/// The server-side encryption modes restatus passes on (SSE-C would put a key in every
/// request and is not offered).
pub const SSE_MODES: [&str; 2] = ["AES256", "aws:kms"];

/// object_store's names of its SSE settings (its key enum is not exported).
const SSE: &str = "aws_server_side_encryption";
const SSE_KMS_KEY_ID: &str = "aws_sse_kms_key_id";
const SSE_BUCKET_KEY: &str = "aws_sse_bucket_key_enabled";

fn sse_key(name: &str) -> Result<AmazonS3ConfigKey> {
    name.parse().map_err(|e: object_store::Error| Error::StorageUrl { url: "s3 options".into(), reason: e.to_string() })
}

impl S3Options {
    fn apply(&self, mut builder: AmazonS3Builder) -> Result<AmazonS3Builder> {
        let err = |reason: String| Error::StorageUrl { url: "s3 options".into(), reason };
        if let Some(mode) = &self.sse {
            if !SSE_MODES.contains(&mode.as_str()) {
                return Err(err(format!("server-side encryption {mode:?}: use one of {}", SSE_MODES.join(", "))));
            }
            builder = builder.with_config(sse_key(SSE)?, mode);
        }
        if let Some(key) = &self.sse_kms_key_id {
            builder = builder.with_config(sse_key(SSE_KMS_KEY_ID)?, key);
        }
        if let Some(on) = self.sse_bucket_key {
            builder = builder.with_config(sse_key(SSE_BUCKET_KEY)?, on.to_string());
        }
        let mode = builder.get_config_value(&sse_key(SSE)?);
        let kms_only = builder.get_config_value(&sse_key(SSE_KMS_KEY_ID)?).is_some()
            || builder.get_config_value(&sse_key(SSE_BUCKET_KEY)?).is_some();
        if kms_only && mode.as_deref() != Some("aws:kms") {
            return Err(err("a KMS key id or bucket key needs server-side encryption aws:kms".into()));
        }
        Ok(builder)
    }

    /// Client options trusting the CA file's certificates besides the system's.
    fn client_options(&self) -> Result<ClientOptions> {
        let mut options = ClientOptions::new();
        if let Some(path) = &self.ca_file {
            let err = |reason: String| Error::StorageUrl { url: format!("CA file {}", path.display()), reason };
            let pem = std::fs::read(path).map_err(|e| err(format!("cannot read: {e}")))?;
            let certs = Certificate::from_pem_bundle(&pem).map_err(|_| err("not a PEM certificate bundle".into()))?;
            if certs.is_empty() {
                return Err(err("holds no PEM certificate".into()));
            }
            for cert in certs {
                options = options.with_root_certificate(cert);
            }
        }
        Ok(options)
    }
}

/// The host of a plain `http://` endpoint that is not loopback: traffic, request signatures
/// and snapshots cross the network readable. `None` for `https://` and for loopback
/// (`localhost`, 127.0.0.0/8, `::1`).
pub fn plain_http_host(endpoint: &str) -> Option<String> {
    let url = Url::parse(endpoint).ok()?;
    if url.scheme() != "http" {
        return None;
    }
    let loopback = match url.host()? {
        url::Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    };
    (!loopback).then(|| url.host_str().unwrap_or_default().to_string())
}

/// Refuses an endpoint with user info: object_store puts the endpoint into its error
/// messages, so credentials there would reach logs.
fn check_endpoint(endpoint: &str) -> std::result::Result<(), String> {
    match Url::parse(endpoint) {
        Ok(url) if !url.username().is_empty() || url.password().is_some() => Err(format!(
            "the S3 endpoint {} has credentials in it; use AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
            redact(endpoint)
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("the S3 endpoint {} is not a URL: {e}", redact(endpoint))),
    }
}

/// Warns, once a process, that the S3 endpoint is plain HTTP outside loopback.
fn warn_plain_http(endpoint: &str) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if let Some(host) = plain_http_host(endpoint) {
        WARNED.call_once(|| {
            warn!(
                host,
                "the S3 endpoint is plain http:// outside loopback: snapshots and request signatures cross the network unencrypted; use https://"
            );
        });
    }
}

fn open_url(raw: &str, s3: &S3Options, create: bool) -> Result<(Arc<dyn ObjectStore>, String, String)> {
    let err = |reason: String| Error::StorageUrl { url: redact(raw), reason };
    if let Some(rest) = raw.strip_prefix("file://") {
        let dir = std::path::absolute(if rest.is_empty() { "." } else { rest })
            .map_err(|e| err(format!("cannot resolve path: {e}")))?;
        if create {
            std::fs::create_dir_all(&dir).map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
        } else if !dir.is_dir() {
            return Err(err(format!(
                "directory {} does not exist (a reading command does not create it)",
                dir.display()
            )));
        }
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
            let mut builder = s3_builder(s3)?.with_bucket_name(bucket).with_retry(retry_config());
            let endpoint = std::env::var("AWS_ENDPOINT_URL_S3")
                .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
                .or_else(|_| std::env::var("AWS_ENDPOINT"))
                .or_else(|_| std::env::var("S3_ENDPOINT"))
                .ok()
                .filter(|e| !e.is_empty());
            if let Some(endpoint) = &endpoint {
                check_endpoint(endpoint).map_err(err)?;
                warn_plain_http(endpoint);
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

/// The `AWS_*` environment and `s3` on one builder. The CA goes into the client options
/// first: the environment's client settings (`AWS_ALLOW_HTTP`, timeouts, proxies) then add to
/// them, as `AmazonS3Builder::from_env` would (which would lose the CA).
fn s3_builder(s3: &S3Options) -> Result<AmazonS3Builder> {
    let mut builder = AmazonS3Builder::new().with_client_options(s3.client_options()?);
    for (key, value) in std::env::vars_os() {
        let (Some(key), Some(value)) = (key.to_str(), value.to_str()) else { continue };
        if key.starts_with("AWS_")
            && let Ok(key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>()
        {
            builder = builder.with_config(key, value);
        }
    }
    s3.apply(builder)
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

    /// A reader on a missing local directory fails naming it and creates nothing; a writer creates it.
    #[test]
    fn a_reader_never_creates_a_missing_local_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("absent");
        let url = format!("file://{}", dir.display());
        let err = SnapshotStore::open_existing_with(&url, "c", &S3Options::default()).unwrap_err().to_string();
        assert!(err.contains("does not exist") && err.contains("absent"), "{err}");
        assert!(!dir.exists(), "a reader created {}", dir.display());
        SnapshotStore::open(&url, "c").unwrap();
        assert!(dir.is_dir(), "a writer creates it");
        SnapshotStore::open_existing_with(&url, "c", &S3Options::default()).unwrap();
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

    fn kms(mode: Option<&str>, key: Option<&str>, bucket_key: Option<bool>) -> S3Options {
        S3Options {
            sse: mode.map(Into::into),
            sse_kms_key_id: key.map(Into::into),
            sse_bucket_key: bucket_key,
            ca_file: None,
        }
    }

    fn sse_value(builder: &AmazonS3Builder, key: &str) -> Option<String> {
        builder.get_config_value(&sse_key(key).unwrap())
    }

    #[test]
    fn sse_settings_reach_the_s3_config() {
        let builder = kms(Some("AES256"), None, None).apply(AmazonS3Builder::new()).unwrap();
        assert_eq!(sse_value(&builder, SSE).as_deref(), Some("AES256"));
        assert_eq!(sse_value(&builder, SSE_KMS_KEY_ID), None);

        let builder = kms(Some("aws:kms"), Some("alias/restatus"), Some(true)).apply(AmazonS3Builder::new()).unwrap();
        assert_eq!(sse_value(&builder, SSE).as_deref(), Some("aws:kms"));
        assert_eq!(sse_value(&builder, SSE_KMS_KEY_ID).as_deref(), Some("alias/restatus"));
        assert_eq!(sse_value(&builder, SSE_BUCKET_KEY).as_deref(), Some("true"));

        // A flag overrides what object_store read from the environment.
        let from_env = AmazonS3Builder::new().with_config(sse_key(SSE).unwrap(), "aws:kms");
        let builder = kms(Some("AES256"), None, None).apply(from_env).unwrap();
        assert_eq!(sse_value(&builder, SSE).as_deref(), Some("AES256"));
        let builder = S3Options::default().apply(AmazonS3Builder::new()).unwrap();
        assert_eq!(sse_value(&builder, SSE), None);
    }

    #[test]
    fn bad_sse_settings_are_refused_without_showing_the_key() {
        for (options, expected) in [
            (kms(Some("aes256"), None, None), "use one of AES256, aws:kms"),
            (kms(Some("sse-c"), None, None), "use one of AES256, aws:kms"),
            (kms(None, Some("arn:aws:kms:eu-1:1:key/k-123"), None), "needs server-side encryption aws:kms"),
            (kms(Some("AES256"), Some("arn:aws:kms:eu-1:1:key/k-123"), None), "needs server-side encryption aws:kms"),
            (kms(Some("AES256"), None, Some(true)), "needs server-side encryption aws:kms"),
        ] {
            let err = options.apply(AmazonS3Builder::new()).unwrap_err().to_string();
            assert!(err.contains(expected), "{options:?}: {err}");
            assert!(!err.contains("k-123"), "key id in the error: {err}");
        }
        // A key id given by flag while the environment asked for SSE-S3.
        let from_env = AmazonS3Builder::new().with_config(sse_key(SSE).unwrap(), "AES256");
        let err = kms(None, Some("k-123"), None).apply(from_env).unwrap_err().to_string();
        assert!(err.contains("needs server-side encryption aws:kms"), "{err}");
    }

    #[test]
    fn a_ca_file_is_read_or_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let with = |path: std::path::PathBuf| S3Options { ca_file: Some(path), ..Default::default() }.client_options();
        let ca = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/test-ca.pem");
        with(ca).unwrap();
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        let truncated = dir.path().join("truncated.pem");
        std::fs::write(&truncated, "-----BEGIN CERTIFICATE-----\nMIIB\n").unwrap();
        for path in [dir.path().join("missing.pem"), garbage, truncated] {
            let err = with(path.clone()).unwrap_err().to_string();
            assert!(err.contains(&path.display().to_string()), "{err}");
        }
    }

    #[test]
    fn endpoints_with_credentials_are_refused_without_showing_them() {
        for endpoint in ["http://user:secret@minio:9000", "https://secret@minio", "http://:secret@minio"] {
            let err = check_endpoint(endpoint).unwrap_err();
            assert!(err.contains("has credentials in it") && err.contains("minio"), "{endpoint}: {err}");
            assert!(!err.contains("secret"), "credentials leaked: {err}");
        }
        assert!(check_endpoint("not a url:secret@x").is_err_and(|e| !e.contains("secret")));
        check_endpoint("https://minio.example:9000").unwrap();
    }

    #[test]
    fn plain_http_is_flagged_only_outside_loopback() {
        for (endpoint, flagged) in [
            ("http://minio.minio.svc:9000", Some("minio.minio.svc")),
            ("http://10.0.0.5:9000/", Some("10.0.0.5")),
            ("http://[fd00::1]:9000", Some("[fd00::1]")),
            ("http://localhost:9000", None),
            ("http://LOCALHOST:9000", None),
            ("http://127.0.0.1:9000", None),
            ("http://127.8.9.10:9000", None),
            ("http://[::1]:9000", None),
            ("https://minio.minio.svc:9000", None),
            ("http://user:secret@s3.example:80", Some("s3.example")),
        ] {
            assert_eq!(plain_http_host(endpoint).as_deref(), flagged, "{endpoint}");
        }
    }

    /// Reads one HTTP request from a real socket, answers 200 with an ETag, and returns the
    /// request's head lowercased: what the S3 client actually sent.
    fn record_one_request(listener: std::net::TcpListener) -> std::thread::JoinHandle<String> {
        use std::io::{Read, Write};
        std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).unwrap();
                assert!(n > 0, "connection closed before the request head");
                seen.extend_from_slice(&buf[..n]);
            }
            socket
                .write_all(b"HTTP/1.1 200 OK\r\nETag: \"e\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .unwrap();
            let end = seen.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(seen.len());
            String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase()
        })
    }

    #[tokio::test]
    async fn the_sse_headers_are_sent_with_every_put() {
        for (options, expected) in [
            (kms(Some("AES256"), None, None), vec!["x-amz-server-side-encryption: aes256"]),
            (
                kms(Some("aws:kms"), Some("alias/restatus"), Some(true)),
                vec![
                    "x-amz-server-side-encryption: aws:kms",
                    "x-amz-server-side-encryption-aws-kms-key-id: alias/restatus",
                    "x-amz-server-side-encryption-bucket-key-enabled: true",
                ],
            ),
            (S3Options::default(), vec![]),
        ] {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let endpoint = format!("http://{}", listener.local_addr().unwrap());
            let recorder = record_one_request(listener);
            let store = options
                .apply(AmazonS3Builder::new())
                .unwrap()
                .with_endpoint(endpoint)
                .with_allow_http(true)
                .with_bucket_name("b")
                .with_region("us-east-1")
                .with_access_key_id("k")
                .with_secret_access_key("s")
                .with_retry(RetryConfig { max_retries: 0, ..Default::default() })
                .build()
                .unwrap();
            store.put(&Path::from("p"), Bytes::from_static(b"x").into()).await.unwrap();
            let head = recorder.join().unwrap();
            assert!(head.starts_with("put /b/p "), "{head}");
            for header in &expected {
                assert!(head.lines().any(|l| l == *header), "{header} not sent: {head}");
            }
            if expected.is_empty() {
                assert!(!head.contains("x-amz-server-side-encryption"), "{head}");
            }
        }
    }
}
