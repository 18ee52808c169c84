//! A cluster's snapshots in one backend ([`SnapshotStore`]): where each object of a snapshot
//! lives (the layout, see `super`), writing a snapshot (payload first, manifest last,
//! create-only, signed), listing, reading a manifest (its signature checked against trusted
//! keys), and the one read of a payload, which verifies it ([`SnapshotStore::verified_payload`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use jiff::Timestamp;
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions};
use tracing::warn;

use super::backend::{Backend, S3Options};
use crate::format::Record;
use crate::format::{
    DecryptionKeys, KeyId, MANIFEST_FILE, MAX_SIGNATURE, Manifest, PAYLOAD_FILE, Payload, SIGNATURE_FILE, SigningKey,
    SnapshotId, SpillFile, SpillWriter, TrustedKeys, decode_records, open_payload,
};
use crate::{Error, Result};

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
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) root: Path,
    pub(super) cluster_id: String,
    /// The storage URL with any credentials removed, for messages.
    pub(super) location: String,
    /// Payloads larger than this are refused before they are downloaded.
    pub(super) max_payload: u64,
    /// Where payloads are spilled while read; `None`: the system's (`TMPDIR`).
    spill_dir: Option<std::path::PathBuf>,
    /// Decrypts encrypted payloads (`--decryption-key`); `None`: they are refused, named.
    pub(super) decryption: Option<Arc<DecryptionKeys>>,
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
        let Backend { store, prefix, location } = Backend::open(url, s3, true)?;
        Self::new(store, &prefix, cluster_id, location)
    }

    /// [`open_with`](Self::open_with) for a command that only reads: a `file://` directory that
    /// does not exist is an error, never created.
    pub fn open_existing_with(url: &str, cluster_id: &str, s3: &S3Options) -> Result<Self> {
        let Backend { store, prefix, location } = Backend::open(url, s3, false)?;
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

    pub(super) fn dir(&self, id: &SnapshotId) -> Path {
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

    /// A snapshot's signature object, if it has one; one larger than a signature can be is
    /// refused before its body is read (and, should the store send more than it announced,
    /// once more than that has arrived).
    async fn signature(&self, id: &SnapshotId) -> Result<Option<Bytes>> {
        let path = self.signature_path(id);
        match self.read_small(&path, MAX_SIGNATURE).await {
            Ok(Small::Read(bytes)) => Ok(Some(bytes)),
            Ok(Small::Missing) => Ok(None),
            Ok(Small::TooLarge(size)) => {
                let reason = format!("{SIGNATURE_FILE} has {size} bytes, more than a signature can have");
                Err(Error::BadSignature { snapshot: id.to_string(), reason })
            }
            Err(e) => Err(Error::store(format!("read signature of snapshot {id}"), e)),
        }
    }

    async fn manifest_and_bytes(&self, id: &SnapshotId) -> Result<(Manifest, Bytes)> {
        let bytes = match self.read_small(&self.manifest_path(id), MAX_MANIFEST).await {
            Ok(Small::Read(bytes)) => bytes,
            Ok(Small::Missing) => return Err(Error::SnapshotNotFound(id.to_string())),
            Ok(Small::TooLarge(size)) => {
                let reason = format!("manifest has {size} bytes, more than a manifest can have ({MAX_MANIFEST})");
                return Err(Error::corrupt(id, reason));
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

    /// A small object (a manifest, a signature, a segment header), read whole only when it has
    /// at most `limit` bytes: one GET, its announced size checked before its body is read, and
    /// the body read no further than `limit` (a store that sends more than it announced is
    /// cut off there). Never sized by a HEAD and then read unbounded: the object can be
    /// replaced between the two.
    pub(super) async fn read_small(&self, path: &Path, limit: u64) -> object_store::Result<Small> {
        let result = match self.store.get(path).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Ok(Small::Missing),
            Err(e) => return Err(e),
        };
        if result.meta.size > limit {
            return Ok(Small::TooLarge(result.meta.size));
        }
        let mut body = result.into_stream();
        let mut bytes = Vec::with_capacity(result_capacity(limit));
        while let Some(chunk) = body.try_next().await? {
            if (bytes.len() + chunk.len()) as u64 > limit {
                return Ok(Small::TooLarge((bytes.len() + chunk.len()) as u64));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(Small::Read(Bytes::from(bytes)))
    }

    /// A payload's stored bytes (a snapshot's, or a segment's with its header as `manifest`),
    /// read through one GET: its announced size checked against `manifest`'s and against the
    /// limit ([`with_max_payload`](Self::with_max_payload)) before its body is read, the body
    /// read no further than the declared size, spilled into a temporary file above
    /// [`SPILL_ABOVE`] (into `spill` whatever its size, when given), and its size and sha256
    /// checked once read. Errors name `manifest`'s snapshot.
    pub(super) async fn read_payload(
        &self,
        path: &Path,
        manifest: &Manifest,
        spill: Option<SpillWriter>,
    ) -> Result<Payload> {
        let id = &manifest.snapshot_id;
        let read_error = |e| payload_error(id, e);
        let spill_error = |e| Error::io(format!("spill payload of snapshot {id}"), e);
        let download = self.store.get(path).await.map_err(read_error)?;
        let declared = manifest.payload.size;
        let size = download.meta.size;
        if size != declared {
            let reason = format!("payload has {size} bytes, manifest declares {declared} (truncated or replaced)");
            return Err(Error::corrupt(id, reason));
        }
        if size > self.max_payload {
            return Err(Error::TooLarge { snapshot: id.to_string(), size, limit: self.max_payload });
        }
        let mut spill = match spill {
            Some(spill) => Some(spill),
            None if size > SPILL_ABOVE => self.spill_writer(id),
            None => None,
        };
        let mut memory = Vec::new();
        let mut read = 0u64;
        let mut body = download.into_stream();
        while let Some(chunk) = body.try_next().await.map_err(read_error)? {
            read += chunk.len() as u64;
            if read > declared {
                let reason = format!("payload has more than the {declared} bytes the manifest declares (replaced)");
                return Err(Error::corrupt(id, reason));
            }
            match &mut spill {
                Some(spill) => spill.write(&chunk).map_err(spill_error)?,
                None => memory.extend_from_slice(&chunk),
            }
        }
        let stored = match spill {
            Some(spill) => spill.finish().map_err(spill_error)?,
            None => Payload::from(memory),
        };
        stored.verify(manifest)?;
        Ok(stored)
    }

    /// The payload, verified: the one read of a payload's bytes. Its stored size is checked
    /// against the manifest's and against the limit ([`with_max_payload`]) before anything is
    /// downloaded, its size and sha256 against the manifest's once it is; an encrypted payload is
    /// then decrypted with the store's keys ([`with_decryption_keys`]), and refused naming its
    /// recipients before it is downloaded when the store holds none. One larger than
    /// [`SPILL_ABOVE`] is streamed into an unnamed temporary file (its sha256 measured on the
    /// way, the plaintext spilled the same way), so that a restore's memory does not grow with
    /// it; where no temporary file can be made, it is held in memory.
    ///
    /// [`with_max_payload`]: SnapshotStore::with_max_payload
    /// [`with_decryption_keys`]: SnapshotStore::with_decryption_keys
    pub async fn verified_payload(&self, manifest: &Manifest) -> Result<Payload> {
        if let Some(encryption) = &manifest.encryption
            && self.decryption.is_none()
        {
            let recipients = encryption.recipients_text();
            return Err(Error::Encrypted { snapshot: manifest.snapshot_id.to_string(), recipients });
        }
        let stored = self.verified_stored_payload(manifest).await?;
        let spill = match manifest.encryption.is_some() && stored.len() > SPILL_ABOVE {
            true => self.spill_writer(&manifest.snapshot_id),
            false => None,
        };
        open_payload(manifest, stored, self.decryption.as_deref(), spill)
    }

    /// Verifies a payload as stored (size and sha256 against the manifest) without decrypting
    /// it: as far as a writer without keys can check an encrypted snapshot (retention). Its
    /// bytes are dropped.
    pub async fn verify_stored_payload(&self, manifest: &Manifest) -> Result<()> {
        self.verified_stored_payload(manifest).await.map(drop)
    }

    /// The payload's bytes as stored (ciphertext, when encrypted), size checked before they are
    /// downloaded, size and sha256 once they are; spilled above [`SPILL_ABOVE`].
    async fn verified_stored_payload(&self, manifest: &Manifest) -> Result<Payload> {
        self.read_payload(&self.payload_path(&manifest.snapshot_id), manifest, None).await
    }

    /// A temporary file many payloads are spilled into (a journal chain's), or `None` (logged)
    /// where none can be made.
    pub(super) fn spill_file(&self, what: &str) -> Option<std::sync::Arc<SpillFile>> {
        SpillFile::create(self.spill_dir.as_deref())
            .inspect_err(|e| warn!(error = %e, "no temporary file for {what}; holding it in memory"))
            .ok()
    }

    /// A temporary file for a payload, or `None` (logged) where none can be made.
    pub(super) fn spill_writer(&self, id: &SnapshotId) -> Option<SpillWriter> {
        SpillWriter::create(self.spill_dir.as_deref())
            .inspect_err(
                |e| warn!(snapshot = %id, error = %e, "no temporary file for the payload; holding it in memory"),
            )
            .ok()
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
        let payload = self.verified_payload(&manifest).await?;
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

/// The reason a snapshot (or a segment) whose payload is not there is corrupt.
pub(super) const PAYLOAD_MISSING: &str = "payload is missing";

/// What a bounded read of a small object found.
#[derive(Debug)]
pub(super) enum Small {
    Missing,
    /// Larger than the limit: its announced size, or as much as had arrived when the read
    /// stopped.
    TooLarge(u64),
    Read(Bytes),
}

/// What a small object's buffer starts with: most are far below their limit.
fn result_capacity(limit: u64) -> usize {
    limit.min(64 << 10) as usize
}

/// A failed HEAD or GET of a snapshot's payload: a missing one makes the snapshot corrupt.
fn payload_error(id: &SnapshotId, e: object_store::Error) -> Error {
    match e {
        object_store::Error::NotFound { .. } => Error::corrupt(id, PAYLOAD_MISSING),
        e => Error::store(format!("read payload of snapshot {id}"), e),
    }
}

pub(super) fn validate_cluster_id(id: &str) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

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

    use crate::fixtures::{record, ts, uuid, write_snapshot};
    use crate::format::{CaptureSummary, PayloadEncoder, Recipients};
    use serde_json::json;

    fn records() -> Vec<Record> {
        (0..3).map(|i| record("Server", &format!("s{i}"), &[uuid(&format!("u{i}"))], json!({"power": "On"}))).collect()
    }

    async fn replace_payload(store: &SnapshotStore, id: &SnapshotId, bytes: Vec<u8>) {
        store.store.put(&store.payload_path(id), bytes.into()).await.unwrap();
    }

    async fn stored_bytes(store: &SnapshotStore, id: &SnapshotId) -> Vec<u8> {
        store.store.get(&store.payload_path(id)).await.unwrap().bytes().await.unwrap().to_vec()
    }

    /// The one read hands out nothing that does not match the manifest: a payload of the right
    /// size with one byte flipped fails its sha256 (the read itself, not a later decoding), one
    /// cut short fails before it is downloaded, each naming the snapshot. (A spilled payload:
    /// `tests/snapshots.rs`.)
    #[tokio::test]
    async fn a_payload_is_verified_before_it_is_handed_out() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let m = write_snapshot(&store, "2026-11-30T09:00:00Z", &records(), true).await;
        let id = &m.snapshot_id;
        let payload = store.verified_payload(&m).await.unwrap();
        assert_eq!(payload.len(), m.payload.size);
        let mut bytes = stored_bytes(&store, id).await;
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
        replace_payload(&store, id, bytes.clone()).await;
        let err = store.verified_payload(&m).await.unwrap_err().to_string();
        assert!(err.contains(id.as_str()) && err.contains("sha256"), "{err}");
        replace_payload(&store, id, bytes[..bytes.len() - 1].to_vec()).await;
        let err = store.verified_payload(&m).await.unwrap_err().to_string();
        assert!(err.contains(id.as_str()) && err.contains("truncated"), "{err}");
    }

    /// F142: a manifest, a signature and a payload are read no further than they can be,
    /// whatever size the store announces (as for an object replaced between a HEAD and its
    /// GET): before, each was sized by a HEAD and then read whole.
    #[tokio::test]
    async fn objects_are_read_no_further_than_their_limits_whatever_size_is_announced() {
        let scripted = crate::fixtures::ScriptedStore::new();
        let chunk = crate::fixtures::ScriptedStore::CHUNK as u64;
        let store = SnapshotStore::new(scripted.clone(), "", "c", "scripted://".into()).unwrap();
        let key = SigningKey::generate();
        let m = crate::fixtures::snapshot(&records()).signed_with(&key).write(&store).await;
        let id = &m.snapshot_id;
        let trusted = TrustedKeys::new([key.public_key()]);
        let big = |n: u64| bytes::Bytes::from(vec![b' '; n as usize]);

        store.store.put(&store.signature_path(id), big(4 << 20).into()).await.unwrap();
        scripted.understate(store.signature_path(id).as_ref());
        let err = store.verified_manifest(id, Some(&trusted)).await.unwrap_err().to_string();
        assert!(err.contains("more than a signature can have"), "{err}");
        assert!(scripted.bytes_read(&store.signature_path(id)) <= MAX_SIGNATURE + chunk);

        let mut payload = stored_bytes(&store, id).await;
        payload.extend(std::iter::repeat_n(0u8, 8 << 20));
        replace_payload(&store, id, payload).await;
        scripted.understate(store.payload_path(id).as_ref());
        let mut declared = m.clone();
        declared.payload.size = 1;
        let before = scripted.bytes_read(&store.payload_path(id));
        let err = store.verified_payload(&declared).await.unwrap_err().to_string();
        assert!(err.contains("more than the 1 bytes"), "{err}");
        assert_eq!(scripted.bytes_read(&store.payload_path(id)) - before, chunk);

        store.store.put(&store.manifest_path(id), big(MAX_MANIFEST + (8 << 20)).into()).await.unwrap();
        scripted.understate(store.manifest_path(id).as_ref());
        let before = scripted.bytes_read(&store.manifest_path(id));
        let err = store.manifest(id).await.unwrap_err().to_string();
        assert!(err.contains("more than a manifest can have"), "{err}");
        assert!(scripted.bytes_read(&store.manifest_path(id)) - before <= MAX_MANIFEST + chunk);
    }

    /// An encrypted payload: refused by name without keys (its stored bytes still verify, and a
    /// damaged one does not), decrypted with them.
    #[tokio::test]
    async fn an_encrypted_payload_is_verified_as_stored_and_decrypted_with_a_key() {
        let (text, recipient) = DecryptionKeys::generate(ts("2026-11-30T08:00:00Z"));
        let keys = Arc::new(DecryptionKeys::parse_all("test.agekey", &text).unwrap());
        let to = Recipients::load(&[recipient]).unwrap().unwrap();
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let (bytes, summary) = PayloadEncoder::encode_all(3, Some(&to), &records()).unwrap();
        let id = SnapshotId::new(ts("2026-11-30T09:00:00Z"));
        replace_payload(&store, &id, bytes.clone()).await;
        let m = Manifest::new("c", id.clone(), ts("2026-11-30T09:00:00Z"), "test", CaptureSummary::empty(), summary);
        store.put_manifest(&m).await.unwrap();

        let err = store.verified_payload(&m).await.unwrap_err();
        assert!(matches!(&err, Error::Encrypted { snapshot, .. } if snapshot == id.as_str()), "{err}");
        store.verify_stored_payload(&m).await.unwrap();
        let reader = store.clone().with_decryption_keys(Some(keys));
        assert!(reader.verified_payload(&m).await.unwrap().is_decrypted());

        let mut damaged = bytes;
        damaged[0] ^= 0x01;
        replace_payload(&store, &id, damaged).await;
        let err = store.verify_stored_payload(&m).await.unwrap_err().to_string();
        assert!(err.contains(id.as_str()) && err.contains("sha256"), "{err}");
        let err = reader.verified_payload(&m).await.unwrap_err().to_string();
        assert!(err.contains(id.as_str()) && err.contains("sha256"), "{err}");
    }
}
