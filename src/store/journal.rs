//! Journal segments in the store: beside their base snapshot, in its folder's `journal/`.
//!
//! ```text
//! <prefix>/<cluster-id>/<base-snapshot-id>/journal/00000001.jsonl.zst   the records, first
//! <prefix>/<cluster-id>/<base-snapshot-id>/journal/00000001.json.sig    a signed segment's signature
//! <prefix>/<cluster-id>/<base-snapshot-id>/journal/00000001.json        the header, last, create-only
//! ```
//!
//! A segment without its header does not exist for readers, as a snapshot without its manifest:
//! an upload that dies half-way never looks complete. Snapshot listings see only the objects
//! directly in a snapshot's folder, so a bucket with segments lists as before.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions};
use tracing::{info, warn};

use super::snapshots::SnapshotStore;
use super::snapshots::{PAYLOAD_MISSING, Small};
use crate::format::{
    Chain, ChainStop, JOURNAL_DIR, Link, MAX_SEGMENT_HEADER, MAX_SIGNATURE, Manifest, Payload, SEGMENT_HEADER_SUFFIX,
    SEGMENT_PAYLOAD_SUFFIX, SEGMENT_SIGNATURE_SUFFIX, SegmentHeader, SigningKey, SnapshotId, TrustedKeys, check_header,
    check_records, open_payload, segment_file, segment_name,
};
use crate::{Error, Result};

/// What a listing knows of one sequence number of a base's journal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentEntry {
    pub sequence: u64,
    /// Its header exists: for readers the segment exists.
    pub header: bool,
    pub payload_size: Option<u64>,
    pub signature: bool,
}

/// What a listing of a base's journal and its newest header tell, without reading the chain
/// (`snapshots list`): cheap, and not verified (no payload, signature or hash chain is read).
#[derive(Debug, Clone, PartialEq)]
pub struct JournalListing {
    /// Segments with a header.
    pub segments: u64,
    /// The first sequence number without a header below the newest header: a restore's chain
    /// stops before it.
    pub gap: Option<u64>,
    /// The header of the newest segment (the highest sequence number with one), or why it
    /// cannot be read; `None` without segments.
    pub newest: Option<std::result::Result<SegmentHeader, String>>,
}

impl SnapshotStore {
    /// Lists a base's journal and reads its newest header only.
    pub async fn journal_listing(&self, base: &SnapshotId) -> Result<JournalListing> {
        let entries = self.list_segments(base).await?;
        let headers: Vec<u64> = entries.iter().filter(|e| e.header).map(|e| e.sequence).collect();
        let Some(&last) = headers.last() else { return Ok(JournalListing { segments: 0, gap: None, newest: None }) };
        let gap = (1..last).find(|sequence| headers.binary_search(sequence).is_err());
        let what = segment_name(base, last);
        let path = self.segment_path(base, last, SEGMENT_HEADER_SUFFIX);
        let newest = match self.segment_object(&path, MAX_SEGMENT_HEADER).await? {
            Err(reason) => Err(format!("{what} is corrupt: {reason}")),
            Ok(None) => Err(format!("{what} is missing (removed while listed)")),
            Ok(Some(bytes)) => SegmentHeader::from_json(&what, &bytes),
        };
        Ok(JournalListing { segments: headers.len() as u64, gap, newest: Some(newest) })
    }

    fn journal_dir(&self, base: &SnapshotId) -> Path {
        self.dir(base).join(JOURNAL_DIR)
    }

    fn segment_path(&self, base: &SnapshotId, sequence: u64, suffix: &str) -> Path {
        self.journal_dir(base).join(segment_file(sequence, suffix))
    }

    /// The objects of a base's journal, by sequence number.
    pub async fn list_segments(&self, base: &SnapshotId) -> Result<Vec<SegmentEntry>> {
        let dir = self.journal_dir(base);
        let objects: Vec<_> = self
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| Error::store(format!("list the journal of snapshot {base}"), e))?;
        let mut entries: BTreeMap<u64, SegmentEntry> = BTreeMap::new();
        for object in objects {
            let Some(name) = object.location.filename() else { continue };
            let Some((digits, suffix)) = name.split_at_checked(8) else { continue };
            let Ok(sequence) = digits.parse::<u64>() else { continue };
            if !digits.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let entry = entries.entry(sequence).or_insert(SegmentEntry { sequence, ..Default::default() });
            match suffix {
                SEGMENT_HEADER_SUFFIX => entry.header = true,
                SEGMENT_PAYLOAD_SUFFIX => entry.payload_size = Some(object.size),
                SEGMENT_SIGNATURE_SUFFIX => entry.signature = true,
                _ => {}
            }
        }
        Ok(entries.into_values().collect())
    }

    /// Writes a segment: its records first, then (signed, `signedBy` set to the key) its
    /// signature, then its header, each create-only, so that a segment exists for readers only
    /// once whole. Records left by an upload that died before its header (no header of that
    /// sequence number) are replaced. The header's bytes as stored.
    pub async fn put_segment(
        &self,
        header: &mut SegmentHeader,
        records: Vec<u8>,
        signing_key: Option<&SigningKey>,
    ) -> Result<Bytes> {
        let (base, seq) = (header.base_snapshot_id.clone(), header.sequence);
        let what = segment_name(&base, seq);
        let create = PutOptions { mode: PutMode::Create, ..Default::default() };
        let payload_path = self.segment_path(&base, seq, SEGMENT_PAYLOAD_SUFFIX);
        let header_path = self.segment_path(&base, seq, SEGMENT_HEADER_SUFFIX);
        let records = Bytes::from(records);
        match self.store.put_opts(&payload_path, records.clone().into(), create.clone()).await {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) if !self.exists(&header_path).await? => {
                warn!(segment = %what, "records of an upload that never completed (no header) replaced");
                self.store
                    .put(&payload_path, records.into())
                    .await
                    .map_err(|e| Error::store(format!("write the records of {what}"), e))?;
            }
            Err(e) => return Err(Error::store(format!("write the records of {what}"), e)),
        }
        if let Some(key) = signing_key {
            header.signed_by = Some(key.id().clone());
        }
        let bytes = Bytes::from(header.to_json());
        if let Some(key) = signing_key {
            let path = self.segment_path(&base, seq, SEGMENT_SIGNATURE_SUFFIX);
            let signature = Bytes::from(key.sign_segment(&bytes));
            match self.store.put_opts(&path, signature.clone().into(), create.clone()).await {
                Ok(_) => {}
                Err(object_store::Error::AlreadyExists { .. }) if !self.exists(&header_path).await? => {
                    self.store
                        .put(&path, signature.into())
                        .await
                        .map_err(|e| Error::store(format!("write the signature of {what}"), e))?;
                }
                Err(e) => return Err(Error::store(format!("write the signature of {what}"), e)),
            }
        }
        self.store
            .put_opts(&header_path, bytes.clone().into(), create)
            .await
            .map_err(|e| Error::store(format!("write the header of {what}"), e))?;
        Ok(bytes)
    }

    async fn exists(&self, path: &Path) -> Result<bool> {
        match self.store.head(path).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(Error::store(format!("read {path}"), e)),
        }
    }

    /// An object of a segment, at most `limit` bytes (a larger one is not read, see
    /// [`SnapshotStore::read_small`]): `Ok(None)` when missing, `Err(reason)` when too large.
    async fn segment_object(&self, path: &Path, limit: u64) -> Result<std::result::Result<Option<Bytes>, String>> {
        match self.read_small(path, limit).await {
            Ok(Small::Read(bytes)) => Ok(Ok(Some(bytes))),
            Ok(Small::Missing) => Ok(Ok(None)),
            Ok(Small::TooLarge(size)) => Ok(Err(format!("{path} has {size} bytes, more than it can have ({limit})"))),
            Err(e) => Err(Error::store(format!("read {path}"), e)),
        }
    }

    /// One segment, checked as the next link of `chain` (see [`check_link`](crate::format::check_link)): its header (at
    /// most [`MAX_SEGMENT_HEADER`] bytes), with `trusted` keys its signature, then the header
    /// judged ([`check_header`]) before anything of the payload is read: a refused segment is
    /// never downloaded. Its payload is then read as a snapshot's is
    /// ([`SnapshotStore::read_payload`]: the size the store announces against the header's and
    /// the limit before the body is read, no more than that read, spilled to a temporary file
    /// above [`super::SPILL_ABOVE`], sha256 checked), and opened (decrypted, spilled as well).
    /// The link, or why the chain stops here; a store that cannot be read is an error.
    async fn read_link(
        &self,
        chain: &Chain,
        sequence: u64,
        base_time: jiff::Timestamp,
        trusted: Option<&TrustedKeys>,
    ) -> Result<std::result::Result<Link, String>> {
        let base = &chain.base;
        let what = segment_name(base, sequence);
        let header_path = self.segment_path(base, sequence, SEGMENT_HEADER_SUFFIX);
        let bytes = match self.segment_object(&header_path, MAX_SEGMENT_HEADER).await? {
            Err(reason) => return Ok(Err(format!("is corrupt: {reason}"))),
            Ok(None) => return Ok(Err("is missing (no header)".to_string())),
            Ok(Some(bytes)) => bytes,
        };
        let signature = match trusted {
            None => None,
            Some(keys) => Some(self.check_segment_signature(keys, base, sequence, &what, &bytes).await?),
        };
        let (header, signer) = match check_header(chain, self.cluster_id(), base_time, &bytes, signature) {
            Ok(checked) => checked,
            Err(reason) => return Ok(Err(reason)),
        };
        let payload_path = self.segment_path(base, sequence, SEGMENT_PAYLOAD_SUFFIX);
        let spill = chain.spill.as_ref().map(|file| file.writer());
        let payload = match self.read_payload(&payload_path, &header.payload_manifest(), spill).await {
            Ok(payload) => Some(payload),
            Err(Error::CorruptSnapshot { reason, .. }) if reason == PAYLOAD_MISSING => None,
            Err(Error::CorruptSnapshot { reason, .. }) => return Ok(Err(format!("is corrupt: {reason}"))),
            Err(Error::TooLarge { size, limit, .. }) => {
                let reason = format!("is corrupt: its records have {size} bytes, more than the limit ({limit})");
                return Ok(Err(reason));
            }
            Err(e) => return Err(e),
        };
        let open = |m: &Manifest, p: Payload| {
            let spill = match (&chain.spill, m.encryption.is_some()) {
                (_, false) => None,
                (Some(file), true) => Some(file.writer()),
                (None, true) if p.len() > super::snapshots::SPILL_ABOVE => self.spill_writer(&m.snapshot_id),
                (None, true) => None,
            };
            open_payload(m, p, self.decryption.as_deref(), spill)
        };
        Ok(check_records(header, &bytes, signer, payload, &open))
    }

    /// Reads and verifies a base's chain: segment 1, 2, … while each has a header, checked
    /// against the chain so far (see [`check_link`](crate::format::check_link)); with `trusted` keys, each header's
    /// signature first. Stops at the first gap (a missing sequence number before a later
    /// header, a corrupt, foreign, unchained, unsigned or badly signed segment), saying where
    /// and why. Segments without a header after the last one are uploads that never completed:
    /// not there. A store that cannot be read is an error.
    pub async fn read_chain(
        &self,
        base: &SnapshotId,
        base_time: jiff::Timestamp,
        trusted: Option<&TrustedKeys>,
    ) -> Result<Chain> {
        self.read_chain_on(Chain::empty(base.clone()), base_time, trusted, false).await
    }

    /// [`SnapshotStore::read_chain`] from a chain already read: the segments after its last
    /// link (all it needs of the chain so far is that link's header and hash, see
    /// [`check_link`](crate::format::check_link)), appended to it. The controller reads on this way at each refresh,
    /// reading only the segments written since.
    ///
    /// A restore reads this way (from an empty chain, or on from one): a segment the store
    /// answers with an error other than "not found" (a permission, an object archived or
    /// under a key restatus does not hold) stops the chain before it, named, as a corrupt one
    /// does, rather than failing the whole read; the point stays before it and the next read
    /// tries it again. (The journal's own [`read_chain`](Self::read_chain) fails instead: it
    /// must not take an unread segment for the end of its chain.)
    pub async fn read_chain_from(
        &self,
        chain: Chain,
        base_time: jiff::Timestamp,
        trusted: Option<&TrustedKeys>,
    ) -> Result<Chain> {
        self.read_chain_on(chain, base_time, trusted, true).await
    }

    async fn read_chain_on(
        &self,
        mut chain: Chain,
        base_time: jiff::Timestamp,
        trusted: Option<&TrustedKeys>,
        stop_where_unreadable: bool,
    ) -> Result<Chain> {
        let base = &chain.base.clone();
        let known = chain.links.len();
        chain.stop = None;
        let entries = self.list_segments(base).await?;
        let last_header = entries.iter().filter(|e| e.header).map(|e| e.sequence).max();
        let Some(last_header) = last_header else { return Ok(chain) };
        if chain.spill.is_none() && last_header >= chain.next_sequence() {
            // One file for every segment of the chain: their records are not held in memory,
            // however many there are (a restore merges them from there, `format::merge`).
            chain.spill = self.spill_file(&format!("the journal of snapshot {base}"));
        }
        loop {
            let sequence = chain.next_sequence();
            if sequence > last_header {
                break;
            }
            let stop = |reason: String| Some(ChainStop { sequence, reason });
            let entry = entries.iter().find(|e| e.sequence == sequence && e.header);
            let result = match entry {
                None => {
                    let next = entries.iter().filter(|e| e.header && e.sequence > sequence).map(|e| e.sequence).min();
                    Err(format!("is missing (the next segment found is {})", next.unwrap_or(sequence)))
                }
                Some(_) => match self.read_link(&chain, sequence, base_time, trusted).await {
                    Ok(result) => result,
                    Err(e @ Error::Store { .. }) if stop_where_unreadable => Err(format!("cannot be read: {e}")),
                    Err(e) => return Err(e),
                },
            };
            match result {
                Ok(link) => chain.links.push(link),
                Err(reason) => {
                    chain.stop = stop(reason);
                    break;
                }
            }
        }
        if let Some(message) = chain.stop_message(base_time) {
            warn!(base = %base, "journal chain stops early: {message}");
        } else if chain.links.len() > known {
            info!(base = %base, segments = chain.links.len() - known, "journal chain read and verified");
        }
        Ok(chain)
    }

    /// The signature check of a segment header: the signer, or why it is refused.
    async fn check_segment_signature(
        &self,
        keys: &TrustedKeys,
        base: &SnapshotId,
        sequence: u64,
        what: &str,
        header: &[u8],
    ) -> Result<std::result::Result<crate::format::KeyId, String>> {
        let path = self.segment_path(base, sequence, SEGMENT_SIGNATURE_SUFFIX);
        let signature = match self.segment_object(&path, MAX_SIGNATURE).await? {
            Err(reason) => return Ok(Err(reason)),
            Ok(signature) => signature,
        };
        let signed_by = SegmentHeader::from_json(what, header).ok().and_then(|h| h.signed_by);
        Ok(keys.verify_segment(what, header, signed_by.as_ref(), signature.as_deref()).map_err(|e| match e {
            Error::Unsigned { .. } => "the segment is not signed, and only signed segments are trusted".to_string(),
            Error::BadSignature { reason, .. } => reason,
            e => e.to_string(),
        }))
    }

    /// Removes a base's journal (after its manifest: see [`SnapshotStore::delete`]), headers
    /// first, so that a half-removed journal stops at a gap for readers.
    pub(super) async fn delete_journal(&self, base: &SnapshotId) -> Result<()> {
        let entries = self.list_segments(base).await?;
        let mut paths: Vec<Path> = Vec::new();
        for entry in entries.iter().rev() {
            paths.push(self.segment_path(base, entry.sequence, SEGMENT_HEADER_SUFFIX));
        }
        for entry in &entries {
            paths.push(self.segment_path(base, entry.sequence, SEGMENT_SIGNATURE_SUFFIX));
            paths.push(self.segment_path(base, entry.sequence, SEGMENT_PAYLOAD_SUFFIX));
        }
        // Anything else in the journal folder (an object of a newer writer) goes too.
        let dir = self.journal_dir(base);
        let objects: Vec<_> = self
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| Error::store(format!("list the journal of snapshot {base}"), e))?;
        for object in objects {
            if !paths.contains(&object.location) {
                paths.push(object.location);
            }
        }
        for path in paths {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::store(format!("delete {path} of snapshot {base}"), e)),
            }
        }
        Ok(())
    }

    /// The stored bytes of a segment's object (tests damage them): `suffix` one of the
    /// `SEGMENT_*_SUFFIX`es.
    pub fn segment_object_path(&self, base: &SnapshotId, sequence: u64, suffix: &str) -> Path {
        self.segment_path(base, sequence, suffix)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::fixtures::{ScriptedStore, record, ts, uuid};
    use crate::format::{PayloadEncoder, Recipients, Record, tombstone};

    const BASE_TIME: &str = "2026-11-30T09:00:00Z";

    fn store() -> SnapshotStore {
        SnapshotStore::open("memory://", "c").unwrap()
    }

    fn encode(records: &[Record], recipients: Option<&Recipients>) -> (Vec<u8>, crate::format::PayloadSummary) {
        PayloadEncoder::encode_all(3, recipients, records).unwrap()
    }

    /// Appends one segment of `records` to the chain in the store.
    async fn append(store: &SnapshotStore, base: &SnapshotId, records: &[Record], key: Option<&SigningKey>) -> u64 {
        let chain = store.read_chain(base, ts(BASE_TIME), None).await.unwrap();
        let seq = chain.next_sequence();
        let (bytes, summary) = encode(records, None);
        let from = chain.links.last().map_or(ts(BASE_TIME), |l| l.header.to);
        let to = from + jiff::SignedDuration::from_secs(5);
        let deleted = records.iter().filter(|r| crate::format::is_tombstone(r)).count() as u64;
        let mut header = SegmentHeader::new(
            "c",
            base,
            seq,
            chain.last_sha256(),
            from,
            to,
            BTreeMap::new(),
            (records.len() as u64 - deleted, deleted),
            summary,
            None,
        );
        let stored = store.put_segment(&mut header, bytes, key).await.unwrap();
        assert_eq!(stored.as_ref(), header.to_json().as_slice());
        seq
    }

    fn server(name: &str, state: &str) -> Record {
        record("Server", name, &[uuid(name)], json!({"state": state}))
    }

    #[tokio::test]
    async fn segments_are_written_listed_and_read_back_as_a_verified_chain() {
        let store = store();
        let base = SnapshotId::new(ts(BASE_TIME));
        assert!(store.read_chain(&base, ts(BASE_TIME), None).await.unwrap().links.is_empty());
        assert_eq!(append(&store, &base, &[server("a", "Reserved")], None).await, 1);
        assert_eq!(append(&store, &base, &[tombstone(&server("b", "x"))], None).await, 2);
        let listed = store.list_segments(&base).await.unwrap();
        assert_eq!(listed.iter().map(|e| (e.sequence, e.header)).collect::<Vec<_>>(), [(1, true), (2, true)]);
        let chain = store.read_chain(&base, ts(BASE_TIME), None).await.unwrap();
        assert_eq!(chain.links.len(), 2);
        assert_eq!(chain.stop, None);
        assert_eq!(chain.links[1].header.previous_sha256, Some(chain.links[0].sha256.clone()));
        // Snapshot listings do not see the journal.
        assert!(store.list().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_header_is_never_overwritten_and_a_headerless_upload_is_not_there() {
        let store = store();
        let base = SnapshotId::new(ts(BASE_TIME));
        append(&store, &base, &[server("a", "Reserved")], None).await;
        // The upload of segment 2 died after its records: no header.
        let path = store.segment_object_path(&base, 2, SEGMENT_PAYLOAD_SUFFIX);
        store.store.put(&path, Bytes::from_static(b"half").into()).await.unwrap();
        let chain = store.read_chain(&base, ts(BASE_TIME), None).await.unwrap();
        assert_eq!((chain.links.len(), chain.stop.clone()), (1, None), "not there, and no gap");
        // The next writer replaces the dead records and completes segment 2.
        assert_eq!(append(&store, &base, &[server("a", "Available")], None).await, 2);
        let chain = store.read_chain(&base, ts(BASE_TIME), None).await.unwrap();
        assert_eq!(chain.links.len(), 2);
        // A header is create-only: writing segment 2 again fails.
        let (bytes, summary) = encode(&[server("z", "x")], None);
        let mut header = SegmentHeader::new(
            "c",
            &base,
            2,
            None,
            ts(BASE_TIME),
            ts(BASE_TIME),
            BTreeMap::new(),
            (1, 0),
            summary,
            None,
        );
        assert!(store.put_segment(&mut header, bytes, None).await.is_err());
        assert_eq!(store.read_chain(&base, ts(BASE_TIME), None).await.unwrap().links.len(), 2);
    }

    #[tokio::test]
    async fn a_missing_or_corrupt_segment_stops_the_chain_before_it() {
        let store = store();
        let base = SnapshotId::new(ts(BASE_TIME));
        for state in ["a", "b", "c"] {
            append(&store, &base, &[server("s", state)], None).await;
        }
        let payload = store.segment_object_path(&base, 2, SEGMENT_PAYLOAD_SUFFIX);
        let mut bytes = store.store.get(&payload).await.unwrap().bytes().await.unwrap().to_vec();
        bytes[4] ^= 0x55;
        store.store.put(&payload, Bytes::from(bytes).into()).await.unwrap();
        let chain = store.read_chain(&base, ts(BASE_TIME), None).await.unwrap();
        assert_eq!(chain.links.len(), 1);
        let stop = chain.stop.clone().unwrap();
        assert_eq!(stop.sequence, 2);
        assert!(stop.reason.contains("corrupt"), "{}", stop.reason);
        // Missing header in the middle: a gap.
        store.store.delete(&store.segment_object_path(&base, 2, SEGMENT_HEADER_SUFFIX)).await.unwrap();
        let chain = store.read_chain(&base, ts(BASE_TIME), None).await.unwrap();
        assert_eq!(chain.links.len(), 1);
        assert!(chain.stop.unwrap().reason.contains("missing (the next segment found is 3)"));
    }

    #[tokio::test]
    async fn with_trusted_keys_an_unsigned_or_forged_segment_stops_the_chain() {
        let store = store();
        let base = SnapshotId::new(ts(BASE_TIME));
        let key = SigningKey::generate();
        let trusted = TrustedKeys::new([key.public_key()]);
        append(&store, &base, &[server("s", "a")], Some(&key)).await;
        append(&store, &base, &[server("s", "b")], None).await;
        let chain = store.read_chain(&base, ts(BASE_TIME), Some(&trusted)).await.unwrap();
        assert_eq!(chain.links.len(), 1);
        assert_eq!(chain.links[0].signer.as_ref(), Some(key.id()));
        let stop = chain.stop.unwrap();
        assert_eq!(stop.sequence, 2);
        assert!(stop.reason.contains("not signed"), "{}", stop.reason);
        // Without keys nothing is checked.
        assert_eq!(store.read_chain(&base, ts(BASE_TIME), None).await.unwrap().links.len(), 2);
        // A forger's signature beside a rewritten header.
        let forger = SigningKey::generate();
        let other = SnapshotId::new(ts("2026-11-30T10:00:00Z"));
        append(&store, &other, &[server("s", "a")], Some(&forger)).await;
        let chain = store.read_chain(&other, ts(BASE_TIME), Some(&trusted)).await.unwrap();
        assert!(chain.links.is_empty());
        assert!(chain.stop.unwrap().reason.contains("not a trusted key"));
    }

    /// `snapshots list`'s view: the segments listed, the newest header read (unverified), a
    /// gap named by its first missing sequence number, a corrupt newest header said so.
    #[tokio::test]
    async fn a_journal_listing_counts_segments_and_reads_the_newest_header() {
        let store = store();
        let base = SnapshotId::new(ts(BASE_TIME));
        let none = store.journal_listing(&base).await.unwrap();
        assert_eq!(none, JournalListing { segments: 0, gap: None, newest: None });
        for state in ["a", "b", "c"] {
            append(&store, &base, &[server("s", state)], None).await;
        }
        let listing = store.journal_listing(&base).await.unwrap();
        assert_eq!((listing.segments, listing.gap), (3, None));
        let newest = listing.newest.unwrap().unwrap();
        assert_eq!(newest.sequence, 3);
        assert_eq!(newest.to, ts(BASE_TIME) + jiff::SignedDuration::from_secs(15));
        // A removed middle segment: a gap at 2; a headerless upload after the last is not there.
        store.store.delete(&store.segment_object_path(&base, 2, SEGMENT_HEADER_SUFFIX)).await.unwrap();
        let path = store.segment_object_path(&base, 4, SEGMENT_PAYLOAD_SUFFIX);
        store.store.put(&path, Bytes::from_static(b"half").into()).await.unwrap();
        let listing = store.journal_listing(&base).await.unwrap();
        assert_eq!((listing.segments, listing.gap), (2, Some(2)));
        assert_eq!(listing.newest.unwrap().unwrap().sequence, 3);
        // The newest header damaged: said, not an error of the listing.
        let header = store.segment_object_path(&base, 3, SEGMENT_HEADER_SUFFIX);
        store.store.put(&header, Bytes::from_static(b"{not json").into()).await.unwrap();
        let reason = store.journal_listing(&base).await.unwrap().newest.unwrap().unwrap_err();
        assert!(reason.contains("segment 3 of base") && reason.contains("not valid"), "{reason}");
    }

    /// A store that counts the bytes each GET pulls (see [`ScriptedStore`]).
    fn scripted() -> (std::sync::Arc<ScriptedStore>, SnapshotStore) {
        let scripted = ScriptedStore::new();
        let store = SnapshotStore::new(scripted.clone(), "", "c", "scripted://".into()).unwrap();
        (scripted, store)
    }

    /// Writes segment `seq` (after `chain`) whose payload object is `payload` and whose header
    /// declares `declared` bytes for it (sha256 of `payload`).
    async fn plant(
        store: &SnapshotStore,
        chain: &Chain,
        payload: Vec<u8>,
        declared: u64,
        key: Option<&SigningKey>,
    ) -> SegmentHeader {
        let (_, mut summary) = encode(&[server("s", "planted")], None);
        summary.size = declared;
        summary.sha256 = crate::format::sha256_hex(&payload);
        let from = chain.links.last().map_or(ts(BASE_TIME), |l| l.header.to);
        let mut header = SegmentHeader::new(
            "c",
            &chain.base,
            chain.next_sequence(),
            chain.last_sha256(),
            from,
            from + jiff::SignedDuration::from_secs(5),
            BTreeMap::new(),
            (1, 0),
            summary,
            None,
        );
        store.put_segment(&mut header, payload, key).await.unwrap();
        header
    }

    /// 8 MiB where a segment's records belong: well under the payload limit (1 GiB), far over
    /// what a segment of one record holds.
    fn big() -> Vec<u8> {
        (0..8u32 << 20).map(|i| (i % 251) as u8).collect()
    }

    /// F140: a segment whose signature is refused is never downloaded, however large its
    /// records: the chain stops at its header. (Before, its records were read whole into memory
    /// before the signature was looked at.) Without keys, the same segment is read, spilled and
    /// found corrupt: the counter sees what a read pulls.
    #[tokio::test]
    async fn a_segment_whose_signature_is_refused_is_never_downloaded() {
        let (scripted, store) = scripted();
        let base = SnapshotId::new(ts(BASE_TIME));
        let key = SigningKey::generate();
        let trusted = TrustedKeys::new([key.public_key()]);
        append(&store, &base, &[server("s", "a")], Some(&key)).await;
        let chain = store.read_chain(&base, ts(BASE_TIME), Some(&trusted)).await.unwrap();
        let big = big();
        let size = big.len() as u64;
        plant(&store, &chain, big, size, Some(&SigningKey::generate())).await;
        let payload = store.segment_object_path(&base, 2, SEGMENT_PAYLOAD_SUFFIX);

        let chain = store.read_chain(&base, ts(BASE_TIME), Some(&trusted)).await.unwrap();
        let stop = chain.stop.unwrap();
        assert_eq!((chain.links.len(), stop.sequence), (1, 2));
        assert!(stop.reason.starts_with("signature refused"), "{}", stop.reason);
        assert_eq!(scripted.bytes_read(&payload), 0, "the records of a refused segment were downloaded");

        let chain = store.read_chain(&base, ts(BASE_TIME), None).await.unwrap();
        assert!(chain.stop.unwrap().reason.contains("corrupt"));
        assert_eq!(scripted.bytes_read(&payload), size, "read, without keys");
    }

    /// F141: an object at a segment's records larger than its header declares is refused
    /// before its body is read (before: sized by a HEAD, then read whole when under the limit);
    /// and one that announces the declared size but sends more is cut off one chunk past it.
    #[tokio::test]
    async fn records_larger_than_their_header_declares_are_not_read() {
        let (scripted, store) = scripted();
        let base = SnapshotId::new(ts(BASE_TIME));
        plant(&store, &Chain::empty(base.clone()), big(), 1_000, None).await;
        let payload = store.segment_object_path(&base, 1, SEGMENT_PAYLOAD_SUFFIX);
        let chain = store.read_chain(&base, ts(BASE_TIME), None).await.unwrap();
        let reason = chain.stop.unwrap().reason;
        assert!(reason.contains("8388608 bytes") && reason.contains("declares 1000"), "{reason}");
        assert_eq!(scripted.bytes_read(&payload), 0);

        // Announced as 1 byte, as declared, and 8 MiB sent.
        let other = SnapshotId::new(ts("2026-11-30T10:00:00Z"));
        plant(&store, &Chain::empty(other.clone()), big(), 1, None).await;
        let payload = store.segment_object_path(&other, 1, SEGMENT_PAYLOAD_SUFFIX);
        scripted.understate(payload.as_ref());
        let chain = store.read_chain(&other, ts(BASE_TIME), None).await.unwrap();
        let reason = chain.stop.unwrap().reason;
        assert!(reason.contains("more than the 1 bytes"), "{reason}");
        assert_eq!(scripted.bytes_read(&payload), ScriptedStore::CHUNK as u64);
    }

    /// F142: a segment header is read no further than a header can be, whatever size the store
    /// announced (before: a HEAD, then the GET read whole).
    #[tokio::test]
    async fn a_segment_header_is_read_no_further_than_its_limit() {
        let (scripted, store) = scripted();
        let base = SnapshotId::new(ts(BASE_TIME));
        append(&store, &base, &[server("s", "a")], None).await;
        let header = store.segment_object_path(&base, 1, SEGMENT_HEADER_SUFFIX);
        store.store.put(&header, Bytes::from(big()).into()).await.unwrap();
        scripted.understate(header.as_ref());
        let chain = store.read_chain(&base, ts(BASE_TIME), None).await.unwrap();
        let reason = chain.stop.unwrap().reason;
        assert!(reason.contains("more than it can have"), "{reason}");
        let read = scripted.bytes_read(&header);
        assert!(read <= MAX_SEGMENT_HEADER + ScriptedStore::CHUNK as u64, "{read} bytes of the header read");
    }

    #[tokio::test]
    async fn deleting_a_snapshot_removes_its_journal() {
        let store = store();
        let base = SnapshotId::new(ts(BASE_TIME));
        append(&store, &base, &[server("s", "a")], None).await;
        append(&store, &base, &[server("s", "b")], None).await;
        store.delete(&base).await.unwrap();
        assert!(store.files(&base).await.unwrap().is_empty(), "{:?}", store.files(&base).await.unwrap());
    }
}
