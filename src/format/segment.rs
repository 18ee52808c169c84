//! Journal segments (see `docs/FORMAT.md`, "Journal segments"): the status changes of a
//! cluster since the previous point of a chain that starts at a full snapshot (its base).
//!
//! A segment is a payload of [`Record`] lines exactly as a snapshot's (zstd frames, sha256,
//! optionally encrypted), holding the objects whose status changed and, for an object that
//! is gone, a tombstone (the record with a `null` status), and a small JSON
//! [`SegmentHeader`] written last, create-only, that names its base, its sequence number
//! (1, 2, …), the sha256 of the previous segment's header (the hash chain), the time window it
//! covers and, per kind, the resourceVersion of the newest event it holds.
//!
//! Pure: [`check_link`] judges one segment against the chain so far, [`Chain`] holds the
//! verified segments and where (and why) the chain stops, and [`point`] merges a base's
//! records with the segments up to a point in time.

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::{
    CaptureSummary, Consistency, Encryption, FormatVersion, KeyId, KindCount, Manifest, Payload, PayloadInfo,
    PayloadSummary, Record, Records, SnapshotId, decode_records,
};
use crate::Error;

/// The folder of a base snapshot's journal, inside the snapshot's folder.
pub const JOURNAL_DIR: &str = "journal";
/// The journal format: readers accept every minor of this major.
pub const SEGMENT_FORMAT: FormatVersion = FormatVersion { major: 1, minor: 0 };
/// No segment header is larger (the per-kind resourceVersions and 100 reasons take a few KiB).
pub const MAX_SEGMENT_HEADER: u64 = 1 << 20;

/// A segment's objects in its base's folder: `journal/00000007.jsonl.zst` (the records),
/// `journal/00000007.json.sig` (a signed segment's signature) and `journal/00000007.json` (the
/// header, written last).
pub fn segment_file(sequence: u64, suffix: &str) -> String {
    format!("{sequence:08}{suffix}")
}
pub const SEGMENT_PAYLOAD_SUFFIX: &str = ".jsonl.zst";
pub const SEGMENT_HEADER_SUFFIX: &str = ".json";
pub const SEGMENT_SIGNATURE_SUFFIX: &str = ".json.sig";

/// The header of one segment. Its stored bytes are what the next segment's
/// `previousSha256` names and what a signature signs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SegmentHeader {
    pub format_version: FormatVersion,
    pub cluster_id: String,
    /// The full snapshot this chain starts at.
    pub base_snapshot_id: SnapshotId,
    /// 1 for the first segment of a chain, then one more each.
    pub sequence: u64,
    /// Hex sha256 of the previous segment's header bytes as stored; absent for segment 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_sha256: Option<String>,
    /// The point the previous segment (or, for segment 1, the base's capture) brought a
    /// restore to.
    pub from: Timestamp,
    /// The point in time this segment brings a restore to: every change seen up to then is in
    /// the chain up to this segment.
    pub to: Timestamp,
    /// Per group-qualified kind, the resourceVersion of the newest event this segment holds.
    #[serde(default)]
    pub resource_versions: BTreeMap<String, String>,
    /// Objects whose status changed (or that appeared), and objects gone (tombstones).
    pub changed: u64,
    pub deleted: u64,
    pub payload: PayloadInfo,
    /// The consistency verdict of the fleet at `to` (claims and Servers pair up, nothing
    /// transitional), judged on the live objects the records came from: records carry no
    /// spec, and pairing needs the spec's references.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<Consistency>,
    pub tool_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<KeyId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
}

/// "segment 7 of base X", for messages.
pub fn segment_name(base: &SnapshotId, sequence: u64) -> String {
    format!("segment {sequence} of base {base}")
}

impl SegmentHeader {
    /// The header of a segment whose payload the encoder measured as `payload`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cluster_id: &str,
        base: &SnapshotId,
        sequence: u64,
        previous_sha256: Option<String>,
        from: Timestamp,
        to: Timestamp,
        resource_versions: BTreeMap<String, String>,
        (changed, deleted): (u64, u64),
        payload: PayloadSummary,
        consistency: Option<Consistency>,
    ) -> SegmentHeader {
        let consistency = match (&payload.encryption, consistency) {
            // An encrypted segment's header names no object, as an encrypted manifest.
            (Some(_), Some(mut c)) => {
                c.reasons.clear();
                Some(c)
            }
            (_, c) => c,
        };
        SegmentHeader {
            format_version: SEGMENT_FORMAT,
            cluster_id: cluster_id.to_string(),
            base_snapshot_id: base.clone(),
            sequence,
            previous_sha256,
            from,
            to,
            resource_versions,
            changed,
            deleted,
            payload: PayloadInfo {
                file: segment_file(sequence, SEGMENT_PAYLOAD_SUFFIX),
                encoding: "zstd+jsonl".into(),
                size: payload.size,
                uncompressed_size: payload.uncompressed_size,
                sha256: payload.sha256,
                records: payload.records,
                frames: Some(payload.frames),
            },
            consistency,
            tool_version: crate::TOOL_VERSION.into(),
            signed_by: None,
            encryption: payload.encryption,
        }
    }

    pub fn name(&self) -> String {
        segment_name(&self.base_snapshot_id, self.sequence)
    }

    pub fn to_json(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a segment header serialises");
        bytes.push(b'\n');
        bytes
    }

    /// Parses a header, refusing another major format version first.
    pub fn from_json(what: &str, bytes: &[u8]) -> Result<SegmentHeader, String> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct VersionOnly {
            format_version: String,
        }
        let version: VersionOnly =
            serde_json::from_slice(bytes).map_err(|e| format!("{what}: header is not valid: {e}"))?;
        let version: FormatVersion = version.format_version.parse().map_err(|e| format!("{what}: {e}"))?;
        if version.major != SEGMENT_FORMAT.major {
            return Err(format!(
                "{what}: journal format {version} is not supported; this restatus reads {}.x",
                SEGMENT_FORMAT.major
            ));
        }
        serde_json::from_slice(bytes).map_err(|e| format!("{what}: header is not valid: {e}"))
    }

    /// The header as a manifest of its payload, for the payload readers (size, sha256,
    /// bounded decompression, record count, decryption), which name the base in their errors.
    pub fn payload_manifest(&self) -> Manifest {
        Manifest {
            format_version: super::FormatVersion::CURRENT,
            cluster_id: self.cluster_id.clone(),
            snapshot_id: self.base_snapshot_id.clone(),
            created_at: self.from,
            completed_at: self.to,
            tool: crate::TOOL_NAME.into(),
            tool_version: self.tool_version.clone(),
            profile: String::new(),
            kinds: vec![],
            payload: self.payload.clone(),
            skipped: vec![],
            conflicts: vec![],
            consistency: self.consistency.clone(),
            captured_from: None,
            signed_by: None,
            encryption: self.encryption.clone(),
            record_drop: None,
        }
    }
}

/// Hex sha256 of bytes: what `previousSha256` holds of a header.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The status a tombstone carries: the object is gone at this point.
const TOMBSTONE: &str = "null";

/// A tombstone for the object `record` was captured from: its head with a `null` status.
pub fn tombstone<S>(record: &Record<S>) -> Record {
    let head = Record {
        api_version: record.api_version.clone(),
        kind: record.kind.clone(),
        namespace: record.namespace.clone(),
        name: record.name.clone(),
        keys: record.keys.clone(),
        uid: record.uid.clone(),
        resource_version: record.resource_version.clone(),
        generation: None,
        creation_timestamp: None,
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        status: (),
    };
    head.with_status(RawValue::from_string(TOMBSTONE.into()).expect("null is JSON"))
}

/// Whether a segment record says its object is gone.
pub fn is_tombstone(record: &Record) -> bool {
    record.status.get().trim() == TOMBSTONE
}

/// Which object a record is of, across a chain: group-qualified kind, namespace, name.
pub fn object_key<S>(record: &Record<S>) -> String {
    format!("{}/{}/{}", record.qualified_kind(), record.namespace.as_deref().unwrap_or(""), record.name)
}

/// One verified segment.
#[derive(Debug, Clone)]
pub struct Link {
    pub header: SegmentHeader,
    /// Hex sha256 of the header's bytes as stored.
    pub sha256: String,
    /// Its records, verified (and decrypted) but not held decoded: compressed, in memory or in
    /// a temporary file (a chain's reader spills every segment into one); decoded one at a time
    /// when visited ([`Link::visit`]).
    pub payload: Payload,
    /// The trusted key whose signature was checked (`None`: keys were not checked).
    pub signer: Option<KeyId>,
}

impl Link {
    /// Hands each of its records to `visit`, in order, decoding them one frame at a time.
    pub fn visit(&self, visit: impl FnMut(Record) -> Result<(), Error>) -> Result<(), Error> {
        decode_records(&self.header.payload_manifest(), self.payload.clone(), visit).map(drop)
    }

    /// Its records, decoded, all at once.
    pub fn records(&self) -> Result<Vec<Record>, Error> {
        let mut records = Vec::with_capacity(self.header.payload.records.min(1 << 16) as usize);
        self.visit(|r| {
            records.push(r);
            Ok(())
        })?;
        Ok(records)
    }

    /// The link without its records (its header and hash are all a chain read on from it needs).
    pub fn without_records(mut self) -> Link {
        self.payload = Payload::Memory(Default::default());
        self
    }
}

/// Where a chain stops before its last segment, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainStop {
    /// The first segment not used.
    pub sequence: u64,
    pub reason: String,
}

/// A base's verified segments, in order, up to the first gap.
#[derive(Debug, Clone)]
pub struct Chain {
    pub base: SnapshotId,
    pub links: Vec<Link>,
    pub stop: Option<ChainStop>,
    /// The temporary file its reader spills the segments' records into, one after another
    /// (made at the first segment read; shared by the chains read on from this one).
    pub spill: Option<std::sync::Arc<super::SpillFile>>,
}

impl Chain {
    pub fn empty(base: SnapshotId) -> Chain {
        Chain { base, links: vec![], stop: None, spill: None }
    }

    /// The sequence number the next segment gets.
    pub fn next_sequence(&self) -> u64 {
        self.links.last().map_or(1, |l| l.header.sequence + 1)
    }

    /// The hash the next segment names as `previousSha256`.
    pub fn last_sha256(&self) -> Option<String> {
        self.links.last().map(|l| l.sha256.clone())
    }

    /// The message for a stop: "segment 7 of base X is corrupt: …; restoring to <time of 6>".
    pub fn stop_message(&self, base_time: Timestamp) -> Option<String> {
        let stop = self.stop.as_ref()?;
        let to = self.links.last().map_or(base_time, |l| l.header.to);
        let point = match self.links.last() {
            Some(l) => format!("segment {} at {to}", l.header.sequence),
            None => format!("the base snapshot at {to}"),
        };
        Some(format!("{}: {}; restoring to {point}", segment_name(&self.base, stop.sequence), stop.reason))
    }
}

/// What the store read of one segment, for [`check_link`].
pub struct Candidate<'a> {
    pub sequence: u64,
    /// The header's bytes; `None`: no header (the segment does not exist).
    pub header: Option<&'a [u8]>,
    /// The signature check's outcome, when keys are trusted: the signer, or why it is refused.
    pub signature: Option<Result<KeyId, String>>,
    /// The stored payload bytes; `None`: missing.
    pub payload: Option<super::Payload>,
    /// Opens an encrypted payload (the store holds the keys); plain payloads pass through.
    pub open: &'a dyn Fn(&Manifest, super::Payload) -> Result<super::Payload, Error>,
}

/// Checks one segment as the next link of `chain` (cluster `cluster`): its header parses, names
/// this cluster, this base and the expected sequence number and the previous header's hash,
/// its window starts where the chain left off, its signature (when checked) is good
/// ([`check_header`]), and its payload verifies (size and sha256 before anything is
/// decompressed, then every record: [`check_records`]). The link, or why the chain stops here.
pub fn check_link(
    chain: &Chain,
    cluster: &str,
    base_time: Timestamp,
    candidate: Candidate<'_>,
) -> Result<Link, String> {
    if candidate.sequence != chain.next_sequence() {
        return Err(format!("is missing (the next segment found is {})", candidate.sequence));
    }
    let Some(bytes) = candidate.header else { return Err("is missing (no header)".into()) };
    let (header, signer) = check_header(chain, cluster, base_time, bytes, candidate.signature)?;
    check_records(header, bytes, signer, candidate.payload, candidate.open)
}

/// The checks of [`check_link`] that need the header alone (its bytes, and the signature
/// check's outcome when keys are trusted): a segment refused here is refused before its
/// payload is downloaded. The parsed header and the key that signed it.
pub fn check_header(
    chain: &Chain,
    cluster: &str,
    base_time: Timestamp,
    bytes: &[u8],
    signature: Option<Result<KeyId, String>>,
) -> Result<(SegmentHeader, Option<KeyId>), String> {
    let expected = chain.next_sequence();
    let what = segment_name(&chain.base, expected);
    let header = SegmentHeader::from_json(&what, bytes).map_err(|e| strip(&what, e))?;
    if header.cluster_id != cluster {
        return Err(format!("belongs to cluster {:?}, not {cluster:?}", header.cluster_id));
    }
    if header.base_snapshot_id != chain.base {
        return Err(format!("names base {}, not {}", header.base_snapshot_id, chain.base));
    }
    if header.sequence != expected {
        return Err(format!("names sequence number {}, not {expected}", header.sequence));
    }
    let previous = chain.last_sha256();
    if header.previous_sha256 != previous {
        return Err(match previous {
            None => "is the first segment but names a previous one".to_string(),
            Some(_) => format!("does not chain to segment {}: previousSha256 differs", expected - 1),
        });
    }
    let since = chain.links.last().map_or(base_time, |l| l.header.to);
    if header.to < header.from || header.from < since {
        return Err(format!("covers {} to {}, before the chain's point {since}", header.from, header.to));
    }
    let signer = match signature {
        None => None,
        Some(Ok(key)) => Some(key),
        Some(Err(reason)) => return Err(format!("signature refused: {reason}")),
    };
    Ok((header, signer))
}

/// The rest of [`check_link`], for a header [`check_header`] accepted (`bytes` as stored):
/// the payload (`None`: missing) has the header's size and sha256 (before anything is
/// decompressed), opens (`open`: decryption) and holds the records the header counts.
pub fn check_records(
    header: SegmentHeader,
    bytes: &[u8],
    signer: Option<KeyId>,
    payload: Option<super::Payload>,
    open: &dyn Fn(&Manifest, super::Payload) -> Result<super::Payload, Error>,
) -> Result<Link, String> {
    let Some(payload) = payload else { return Err("is corrupt: its records are missing".into()) };
    let manifest = header.payload_manifest();
    let invalid = |e: Error| match e {
        Error::Encrypted { .. } | Error::Undecryptable { .. } => {
            format!("cannot be read: {}", strip_snapshot(&e.to_string()))
        }
        e => format!("is corrupt: {}", strip_snapshot(&e.to_string())),
    };
    if payload.len() != header.payload.size {
        return Err(format!(
            "is corrupt: its records have {} bytes, its header says {}",
            payload.len(),
            header.payload.size
        ));
    }
    let payload = open(&manifest, payload).map_err(invalid)?;
    let (mut changed, mut deleted) = (0u64, 0u64);
    decode_records(&manifest, payload.clone(), |r| {
        match is_tombstone(&r) {
            true => deleted += 1,
            false => changed += 1,
        }
        Ok(())
    })
    .map_err(invalid)?;
    if deleted != header.deleted || changed != header.changed {
        return Err(format!(
            "is corrupt: it holds {changed} changes and {deleted} deletions, its header says {} and {}",
            header.changed, header.deleted
        ));
    }
    Ok(Link { sha256: sha256_hex(bytes), header, payload, signer })
}

fn strip(what: &str, message: String) -> String {
    message.strip_prefix(&format!("{what}: ")).map(str::to_string).unwrap_or(message)
}

/// "snapshot X: reason" → "reason": a payload reader names the base, the chain names the segment.
fn strip_snapshot(message: &str) -> String {
    match message.strip_prefix("snapshot ").and_then(|m| m.split_once(": ")) {
        Some((_, reason)) => reason.to_string(),
        None => message.to_string(),
    }
}

/// Which point of a chain a restore goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointChoice {
    /// Segments applied (0: the base alone).
    pub applied: usize,
    /// The points passed over because they were inconsistent: (segment, summary).
    pub passed_over: Vec<(u64, String)>,
}

/// The newest point of the chain at or before `at` (any time when `None`) whose consistency
/// verdict is good, or the newest at all with `allow_inconsistent`. The base is point 0 and
/// `base_consistent` its verdict. `None`: no point qualifies.
pub fn choose_point(
    links: &[Link],
    at: Option<Timestamp>,
    base_consistent: bool,
    allow_inconsistent: bool,
) -> Option<PointChoice> {
    let within = links.iter().take_while(|l| at.is_none_or(|at| l.header.to <= at)).count();
    let mut passed_over = Vec::new();
    for applied in (0..=within).rev() {
        let consistent = match applied {
            0 => base_consistent,
            n => links[n - 1].header.consistency.as_ref().is_none_or(|c| c.consistent),
        };
        if consistent || allow_inconsistent {
            return Some(PointChoice { applied, passed_over });
        }
        if applied > 0 {
            let summary = links[applied - 1].header.consistency.as_ref().map(|c| c.summary()).unwrap_or_default();
            passed_over.push((links[applied - 1].header.sequence, summary));
        }
    }
    None
}

/// The records at the point `applied` segments into the chain: the base's records with each
/// segment's records replacing those of the same object (kind, namespace, name), tombstones
/// removing them and new objects added after the base's, in chain order.
pub fn point(base: &Records, links: &[Link]) -> Result<Vec<Record>, Error> {
    let decoded: Vec<Vec<Record>> = links.iter().map(Link::records).collect::<Result<_, _>>()?;
    let mut latest: HashMap<String, &Record> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    for record in decoded.iter().flatten() {
        let key = object_key(record);
        if latest.insert(key.clone(), record).is_none() {
            order.push(key);
        }
    }
    let mut out = Vec::with_capacity(base.len() + order.len());
    for i in 0..base.len() {
        let record = base.record(i)?;
        match latest.remove(&object_key(&record)) {
            None => out.push(record),
            Some(newer) if is_tombstone(newer) => {}
            Some(newer) => out.push(newer.clone()),
        }
    }
    for key in order {
        if let Some(record) = latest.remove(&key).filter(|r| !is_tombstone(r)) {
            out.push(record.clone());
        }
    }
    Ok(out)
}

/// Frames of the payload [`merge`] holds the chain's newest records in: read out of order (in
/// the base's), so small, that each read decompresses little.
const WINNER_FRAME_BYTES: u64 = 16 << 10;

/// The records at the point `applied` segments into the chain, as [`point`] merges them (same
/// records, same order), without holding them decoded: each segment's records are visited
/// twice (the newest record of each object found, then those written into a payload of their
/// own), the base's once, and the merged records are written into a new payload as they come,
/// indexed as a snapshot's are ([`Records::decode`]: some 32 bytes a record). `spill` gives each
/// of the two payloads a temporary file (`None`: in memory). Memory holds one name per object
/// the chain changed and the indexes, whatever the chain holds; `snapshot` names the point in
/// errors.
pub fn merge(
    base: &Records,
    links: &[Link],
    snapshot: &SnapshotId,
    mut spill: impl FnMut() -> Option<super::SpillWriter>,
) -> Result<Records, Error> {
    /// Where the newest record of an object is: (segment, record) while the chain is read,
    /// then its place in the winners' payload, or gone.
    #[derive(Clone, Copy, PartialEq)]
    enum Newest {
        At(usize, u64),
        Winner(usize),
        Gone,
    }
    let mut latest: HashMap<String, Newest> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    for (l, link) in links.iter().enumerate() {
        let mut n = 0u64;
        link.visit(|record| {
            let key = object_key(&record);
            if latest.insert(key.clone(), Newest::At(l, n)).is_none() {
                order.push(key);
            }
            n += 1;
            Ok(())
        })?;
    }
    let mut winners = Writer::new(snapshot, spill(), WINNER_FRAME_BYTES)?;
    let mut won = 0usize;
    for (l, link) in links.iter().enumerate() {
        let mut n = 0u64;
        link.visit(|record| {
            let key = object_key(&record);
            if let Some(newest) = latest.get_mut(&key)
                && *newest == Newest::At(l, n)
            {
                *newest = match is_tombstone(&record) {
                    true => Newest::Gone,
                    false => {
                        winners.push(&record)?;
                        won += 1;
                        Newest::Winner(won - 1)
                    }
                };
            }
            n += 1;
            Ok(())
        })?;
    }
    let winners = winners.finish()?;
    let mut out = Writer::new(snapshot, spill(), super::FRAME_BYTES)?;
    for i in 0..base.len() {
        let record = base.record(i)?;
        match latest.remove(&object_key(&record)) {
            None => out.push(&record)?,
            Some(Newest::Winner(w)) => out.push(&winners.record(w)?)?,
            Some(_) => {}
        }
    }
    for key in order {
        if let Some(Newest::Winner(w)) = latest.remove(&key) {
            out.push(&winners.record(w)?)?;
        }
    }
    out.finish()
}

/// A payload written record by record (into a temporary file, or memory), read back as
/// [`Records`]: what [`merge`] writes.
struct Writer {
    snapshot: SnapshotId,
    encoder: super::PayloadEncoder,
    spill: Option<super::SpillWriter>,
    memory: Vec<u8>,
}

impl Writer {
    fn new(snapshot: &SnapshotId, spill: Option<super::SpillWriter>, frame_bytes: u64) -> Result<Writer, Error> {
        let encoder =
            super::PayloadEncoder::new(1).map_err(|e| merge_error(snapshot, e))?.with_frame_bytes(frame_bytes);
        Ok(Writer { snapshot: snapshot.clone(), encoder, spill, memory: Vec::new() })
    }

    fn push(&mut self, record: &Record) -> Result<(), Error> {
        self.encoder.push(record).map_err(|e| merge_error(&self.snapshot, e))?;
        let bytes = self.encoder.take_output();
        self.put(&bytes)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), Error> {
        match &mut self.spill {
            Some(spill) => spill.write(bytes).map_err(|e| merge_error(&self.snapshot, e)),
            None => {
                self.memory.extend_from_slice(bytes);
                Ok(())
            }
        }
    }

    fn finish(self) -> Result<Records, Error> {
        let Writer { snapshot, encoder, spill, mut memory } = self;
        let (tail, summary) = encoder.finish().map_err(|e| merge_error(&snapshot, e))?;
        let payload = match spill {
            Some(mut spill) => {
                spill.write(&tail).map_err(|e| merge_error(&snapshot, e))?;
                spill.finish().map_err(|e| merge_error(&snapshot, e))?
            }
            None => {
                memory.extend_from_slice(&tail);
                Payload::from(memory)
            }
        };
        let manifest = Manifest::new("merged", snapshot, Timestamp::UNIX_EPOCH, "", CaptureSummary::empty(), summary);
        Records::decode(&manifest, payload)
    }
}

fn merge_error(snapshot: &SnapshotId, e: std::io::Error) -> Error {
    Error::io(format!("merge the journal of snapshot {snapshot}"), e)
}

/// A chain folded into a new base (compaction): what a full snapshot of the point holds.
#[derive(Debug)]
pub struct Folded {
    /// The records at the point: the base's with every segment applied ([`point`]).
    pub records: Vec<Record>,
    /// The point's time: the last segment's `to`, the new snapshot's capture time.
    pub created_at: Timestamp,
    /// The new manifest's capture summary: the base's kinds with their records counted again
    /// (a kind that appeared in a segment added), the base's skips and key conflicts (what its
    /// capture could not see), and the last segment's consistency verdict.
    pub capture: CaptureSummary,
}

/// Folds `links` (the whole verified chain, in order) onto the base `manifest` with `records`.
/// `None` when there is nothing to fold (no segment).
pub fn fold(manifest: &Manifest, records: &Records, links: &[Link]) -> Result<Option<Folded>, Error> {
    let Some(last) = links.last() else { return Ok(None) };
    let merged = point(records, links)?;
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    for record in &merged {
        *counts.entry((record.api_version.clone(), record.kind.clone())).or_default() += 1;
    }
    let mut kinds: Vec<KindCount> = manifest
        .kinds
        .iter()
        .map(|k| KindCount {
            records: counts.remove(&(k.api_version.clone(), k.kind.clone())).unwrap_or(0),
            ..k.clone()
        })
        .collect();
    kinds.extend(counts.into_iter().map(|((api_version, kind), records)| KindCount {
        api_version,
        kind,
        records,
        skipped: 0,
    }));
    let consistency = last.header.consistency.clone().unwrap_or(Consistency {
        consistent: true,
        attempts: 1,
        reasons: vec![],
        reason_count: 0,
    });
    let capture =
        CaptureSummary { kinds, skipped: manifest.skipped.clone(), conflicts: manifest.conflicts.clone(), consistency };
    Ok(Some(Folded { records: merged, created_at: last.header.to, capture }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{record, ts, uuid};
    use crate::format::{Payload, PayloadEncoder, Recipients, SigningKey, TrustedKeys};
    use serde_json::json;

    const BASE_TIME: &str = "2026-11-30T09:00:00Z";

    fn base_id() -> SnapshotId {
        SnapshotId::new(ts(BASE_TIME))
    }

    fn server(name: &str, state: &str) -> Record {
        record("Server", name, &[uuid(&format!("u-{name}"))], json!({"state": state}))
    }

    fn plain(_: &Manifest, payload: Payload) -> Result<Payload, Error> {
        Ok(payload)
    }

    /// A written segment: header bytes and payload bytes.
    struct Written {
        header: Vec<u8>,
        payload: Vec<u8>,
    }

    fn write(base: &SnapshotId, seq: u64, previous: Option<String>, minute: u32, records: &[Record]) -> Written {
        write_with(base, seq, previous, minute, records, None, None)
    }

    fn write_with(
        base: &SnapshotId,
        seq: u64,
        previous: Option<String>,
        minute: u32,
        records: &[Record],
        recipients: Option<&Recipients>,
        key: Option<&SigningKey>,
    ) -> Written {
        let (payload, summary) = PayloadEncoder::encode_all(3, recipients, records).unwrap();
        let deleted = records.iter().filter(|r| is_tombstone(r)).count() as u64;
        let from = if minute == 1 { ts(BASE_TIME) } else { ts(&format!("2026-11-30T09:{:02}:00Z", minute - 1)) };
        let to = ts(&format!("2026-11-30T09:{minute:02}:00Z"));
        let mut header = SegmentHeader::new(
            "c",
            base,
            seq,
            previous,
            from,
            to,
            BTreeMap::from([("Server.metal.ironcore.dev".into(), format!("{}", 100 + seq))]),
            (records.len() as u64 - deleted, deleted),
            summary,
            None,
        );
        if let Some(key) = key {
            header.signed_by = Some(key.id().clone());
        }
        Written { header: header.to_json(), payload }
    }

    fn candidate<'a>(seq: u64, w: &'a Written) -> Candidate<'a> {
        Candidate {
            sequence: seq,
            header: Some(&w.header),
            signature: None,
            payload: Some(Payload::from(w.payload.clone())),
            open: &plain,
        }
    }

    /// Builds a chain from written segments the way the store does: stops at the first bad one.
    fn chain_of(base: &SnapshotId, segments: &[(u64, &Written)]) -> Chain {
        let mut chain = Chain::empty(base.clone());
        for (seq, w) in segments {
            match check_link(&chain, "c", ts(BASE_TIME), candidate(*seq, w)) {
                Ok(link) => chain.links.push(link),
                Err(reason) => {
                    chain.stop = Some(ChainStop { sequence: chain.next_sequence(), reason });
                    break;
                }
            }
        }
        chain
    }

    /// Three segments chained by hash: s1 Reserved, s2 deleted, s3 new.
    fn three(base: &SnapshotId) -> (Written, Written, Written) {
        let one = write(base, 1, None, 1, &[server("s1", "Reserved")]);
        let two = write(base, 2, Some(sha256_hex(&one.header)), 2, &[tombstone(&server("s2", "x"))]);
        let three = write(base, 3, Some(sha256_hex(&two.header)), 3, &[server("s3", "Available")]);
        (one, two, three)
    }

    fn states(records: &[Record]) -> Vec<String> {
        records.iter().map(|r| format!("{}={}", r.name, r.status.get())).collect()
    }

    #[test]
    fn a_good_chain_verifies_and_merges_onto_its_base_in_order() {
        let base = base_id();
        let (one, two, three) = three(&base);
        let chain = chain_of(&base, &[(1, &one), (2, &two), (3, &three)]);
        assert_eq!(chain.stop, None);
        assert_eq!(chain.links.len(), 3);
        assert_eq!(chain.next_sequence(), 4);
        let records = Records::from_records(vec![server("s1", "Available"), server("s2", "Available")]);
        assert_eq!(
            states(&point(&records, &chain.links).unwrap()),
            [r#"s1={"state":"Reserved"}"#, r#"s3={"state":"Available"}"#]
        );
        assert_eq!(
            states(&point(&records, &chain.links[..1]).unwrap()),
            [r#"s1={"state":"Reserved"}"#, r#"s2={"state":"Available"}"#]
        );
        assert_eq!(states(&point(&records, &[]).unwrap()).len(), 2, "no segment: the base as it is");
    }

    /// The streaming merge (what a restore and the controller use) gives exactly the records
    /// and the order [`point`] gives, at every point, written into temporary files or held in
    /// memory; a record's object changed twice, deleted, or new, each as `point` has it.
    #[test]
    fn the_streaming_merge_gives_the_records_point_gives() {
        let base = base_id();
        let (one, two, three) = three(&base);
        let chain = chain_of(&base, &[(1, &one), (2, &two), (3, &three)]);
        let records = Records::from_records(vec![server("s1", "Available"), server("s2", "Available")]);
        for applied in 0..=3 {
            let links = &chain.links[..applied];
            let expected = states(&point(&records, links).unwrap());
            for spilled in [false, true] {
                let spill = || spilled.then(|| crate::format::SpillWriter::create(None).unwrap());
                let merged = merge(&records, links, &base, spill).unwrap();
                let merged: Vec<Record> = (0..merged.len()).map(|i| merged.record(i).unwrap()).collect();
                assert_eq!(states(&merged), expected, "{applied} segments, spilled: {spilled}");
            }
        }
    }

    /// The fold (compaction): base + chain as one snapshot's records, its time the last
    /// segment's `to`, its verdict the last segment's, its kinds counted again.
    #[test]
    fn a_chain_folds_into_the_records_at_its_point_with_the_last_verdict() {
        let base = base_id();
        let (one, two, three) = three(&base);
        let mut chain = chain_of(&base, &[(1, &one), (2, &two), (3, &three)]);
        let records = Records::from_records(vec![server("s1", "Available"), server("s2", "Available")]);
        let mut manifest = crate::fixtures::manifest(base.clone(), ts(BASE_TIME));
        manifest.kinds = vec![KindCount {
            api_version: "metal.ironcore.dev/v1alpha1".into(),
            kind: "Server".into(),
            records: 2,
            skipped: 1,
        }];
        assert!(fold(&manifest, &records, &[]).unwrap().is_none(), "no segment, nothing to fold");
        let folded = fold(&manifest, &records, &chain.links).unwrap().unwrap();
        assert_eq!(states(&folded.records), states(&point(&records, &chain.links).unwrap()));
        assert_eq!(states(&folded.records), [r#"s1={"state":"Reserved"}"#, r#"s3={"state":"Available"}"#]);
        assert_eq!(folded.created_at, chain.links[2].header.to);
        assert_eq!(folded.capture.kinds.len(), 1);
        assert_eq!((folded.capture.kinds[0].records, folded.capture.kinds[0].skipped), (2, 1));
        assert!(folded.capture.consistency.consistent, "no verdict in the header: consistent");
        let inconsistent = Consistency { consistent: false, attempts: 1, reasons: vec![], reason_count: 1 };
        chain.links[2].header.consistency = Some(inconsistent.clone());
        assert_eq!(fold(&manifest, &records, &chain.links).unwrap().unwrap().capture.consistency, inconsistent);
    }

    #[test]
    fn a_later_change_of_the_same_object_wins_and_a_deleted_object_can_come_back() {
        let base = base_id();
        let one = write(&base, 1, None, 1, &[server("s1", "Reserved"), tombstone(&server("s2", "x"))]);
        let two =
            write(&base, 2, Some(sha256_hex(&one.header)), 2, &[server("s1", "Tainted"), server("s2", "Initial")]);
        let chain = chain_of(&base, &[(1, &one), (2, &two)]);
        let records = Records::from_records(vec![server("s1", "Available"), server("s2", "Available")]);
        assert_eq!(
            states(&point(&records, &chain.links).unwrap()),
            [r#"s1={"state":"Tainted"}"#, r#"s2={"state":"Initial"}"#]
        );
    }

    #[test]
    fn a_missing_segment_stops_the_chain_at_the_one_before_it() {
        let base = base_id();
        let (one, _, three) = three(&base);
        let chain = chain_of(&base, &[(1, &one), (3, &three)]);
        assert_eq!(chain.links.len(), 1);
        let stop = chain.stop.clone().unwrap();
        assert_eq!(stop.sequence, 2);
        assert!(stop.reason.contains("missing") && stop.reason.contains('3'), "{}", stop.reason);
        let message = chain.stop_message(ts(BASE_TIME)).unwrap();
        assert!(message.starts_with(&format!("segment 2 of base {base}: is missing")), "{message}");
        assert!(message.ends_with("restoring to segment 1 at 2026-11-30T09:01:00Z"), "{message}");
    }

    #[test]
    fn a_missing_first_segment_restores_the_base_and_says_so() {
        let base = base_id();
        let (_, two, _) = three(&base);
        let chain = chain_of(&base, &[(2, &two)]);
        assert!(chain.links.is_empty());
        let message = chain.stop_message(ts(BASE_TIME)).unwrap();
        assert!(
            message.contains("segment 1 of base")
                && message.ends_with("restoring to the base snapshot at 2026-11-30T09:00:00Z"),
            "{message}"
        );
    }

    #[test]
    fn a_corrupt_payload_stops_the_chain_naming_the_segment() {
        let base = base_id();
        let (one, two, three) = three(&base);
        // One byte changed: same size, another sha256.
        let mut flipped = Written { header: two.header.clone(), payload: two.payload.clone() };
        let last = flipped.payload.len() - 1;
        flipped.payload[last] ^= 0xff;
        let chain = chain_of(&base, &[(1, &one), (2, &flipped), (3, &three)]);
        assert_eq!(chain.links.len(), 1);
        let stop = chain.stop.unwrap();
        assert_eq!(stop.sequence, 2);
        assert!(stop.reason.starts_with("is corrupt") && stop.reason.contains("sha256"), "{}", stop.reason);
        // Truncated: the size says it before the hash.
        let truncated = Written { header: two.header.clone(), payload: two.payload[..two.payload.len() - 3].to_vec() };
        let chain = chain_of(&base, &[(1, &one), (2, &truncated)]);
        assert!(chain.stop.unwrap().reason.contains("bytes"), "truncated");
        // Records missing altogether.
        let chain = chain_of(&base, &[(1, &one)]);
        let mut c = candidate(2, &two);
        c.payload = None;
        let reason = check_link(&chain, "c", ts(BASE_TIME), c).unwrap_err();
        assert!(reason.contains("records are missing"), "{reason}");
    }

    #[test]
    fn a_header_that_does_not_chain_or_is_not_this_chains_stops_it() {
        let base = base_id();
        let (one, _, _) = three(&base);
        let unchained = write(&base, 2, Some("00".repeat(32)), 2, &[server("s1", "x")]);
        let chain = chain_of(&base, &[(1, &one), (2, &unchained)]);
        assert!(chain.stop.unwrap().reason.contains("does not chain to segment 1"));
        let other_base = SnapshotId::new(ts("2026-11-30T08:00:00Z"));
        let foreign = write(&other_base, 1, None, 1, &[server("s1", "x")]);
        assert!(chain_of(&base, &[(1, &foreign)]).stop.unwrap().reason.contains("names base"));
        let wrong_seq = write(&base, 5, None, 1, &[server("s1", "x")]);
        assert!(chain_of(&base, &[(1, &wrong_seq)]).stop.unwrap().reason.contains("names sequence number 5"));
        let first_with_previous = write(&base, 1, Some("ab".into()), 1, &[server("s1", "x")]);
        assert!(chain_of(&base, &[(1, &first_with_previous)]).stop.unwrap().reason.contains("first segment"));
        let garbage = Written { header: b"{not json".to_vec(), payload: one.payload.clone() };
        assert!(chain_of(&base, &[(1, &garbage)]).stop.unwrap().reason.contains("header is not valid"));
        let mut future: serde_json::Value = serde_json::from_slice(&one.header).unwrap();
        future["formatVersion"] = json!("2.0");
        let future = Written { header: serde_json::to_vec(&future).unwrap(), payload: one.payload.clone() };
        assert!(chain_of(&base, &[(1, &future)]).stop.unwrap().reason.contains("journal format 2.0 is not supported"));
    }

    #[test]
    fn a_header_whose_counts_lie_is_corrupt() {
        let base = base_id();
        let one = write(&base, 1, None, 1, &[server("s1", "x")]);
        let mut header: serde_json::Value = serde_json::from_slice(&one.header).unwrap();
        header["changed"] = json!(2);
        let lying = Written { header: serde_json::to_vec(&header).unwrap(), payload: one.payload.clone() };
        let reason = chain_of(&base, &[(1, &lying)]).stop.unwrap().reason;
        assert!(reason.contains("header says 2 and 0"), "{reason}");
    }

    #[test]
    fn a_segment_dated_before_the_chain_point_is_refused() {
        let base = base_id();
        let one = write(&base, 1, None, 5, &[server("s1", "x")]);
        let two = write(&base, 2, Some(sha256_hex(&one.header)), 3, &[server("s1", "y")]);
        let reason = chain_of(&base, &[(1, &one), (2, &two)]).stop.unwrap().reason;
        assert!(reason.contains("before the chain's point"), "{reason}");
    }

    #[test]
    fn signatures_are_checked_as_the_store_reports_them() {
        let base = base_id();
        let key = SigningKey::generate();
        let one = write_with(&base, 1, None, 1, &[server("s1", "x")], None, Some(&key));
        let trusted = TrustedKeys::new([key.public_key()]);
        let signature = key.sign_segment(&one.header);
        let verdict = trusted.verify_segment("segment 1", &one.header, Some(key.id()), Some(&signature));
        let mut c = candidate(1, &one);
        c.signature = Some(verdict.map_err(|e| e.to_string()));
        let link = check_link(&Chain::empty(base.clone()), "c", ts(BASE_TIME), c).unwrap();
        assert_eq!(link.signer.as_ref(), Some(key.id()));
        // A manifest signature over the same bytes is not a segment's.
        let manifest_signature = key.sign(&one.header);
        assert!(trusted.verify_segment("segment 1", &one.header, Some(key.id()), Some(&manifest_signature)).is_err());
        // Unsigned, with keys trusted.
        let unsigned = write(&base, 1, None, 1, &[server("s1", "x")]);
        let verdict = trusted.verify_segment("segment 1", &unsigned.header, None, None);
        let mut c = candidate(1, &unsigned);
        c.signature = Some(verdict.map(|_| unreachable!()).map_err(|e| e.to_string()));
        let reason = check_link(&Chain::empty(base.clone()), "c", ts(BASE_TIME), c).unwrap_err();
        assert!(reason.starts_with("signature refused") && reason.contains("not signed"), "{reason}");
        // Forged: another key.
        let forger = SigningKey::generate();
        let forged = forger.sign_segment(&one.header);
        assert!(trusted.verify_segment("segment 1", &one.header, Some(key.id()), Some(&forged)).is_err());
    }

    #[test]
    fn an_encrypted_segment_needs_its_key_and_hides_its_records() {
        let base = base_id();
        let (keys, recipient) = {
            let (secret, public) = crate::format::DecryptionKeys::generate(ts(BASE_TIME));
            (crate::format::DecryptionKeys::parse_all("k", &secret).unwrap(), public)
        };
        let recipients = Recipients::load(std::slice::from_ref(&recipient)).unwrap().unwrap();
        let one = write_with(&base, 1, None, 1, &[server("secret-serial-1", "Reserved")], Some(&recipients), None);
        assert!(!one.payload.windows(15).any(|w| w == b"secret-serial-1"), "plain text in an encrypted segment");
        let header = SegmentHeader::from_json("s", &one.header).unwrap();
        assert!(header.encryption.is_some());
        let open = |m: &Manifest, p: Payload| crate::format::open_payload(m, p, Some(&keys), None);
        let c = Candidate { open: &open, ..candidate(1, &one) };
        let link = check_link(&Chain::empty(base.clone()), "c", ts(BASE_TIME), c).unwrap();
        assert_eq!(link.records().unwrap()[0].name, "secret-serial-1");
        let closed = |m: &Manifest, p: Payload| crate::format::open_payload(m, p, None, None);
        let c = Candidate { open: &closed, ..candidate(1, &one) };
        let reason = check_link(&Chain::empty(base), "c", ts(BASE_TIME), c).unwrap_err();
        assert!(reason.contains("encrypted"), "{reason}");
    }

    fn consistent(link: &mut Link, good: bool) {
        link.header.consistency =
            Some(Consistency { consistent: good, attempts: 1, reasons: vec![], reason_count: usize::from(!good) });
    }

    #[test]
    fn the_point_is_the_newest_consistent_one_at_or_before_the_time_asked() {
        let base = base_id();
        let (one, two, three) = three(&base);
        let mut chain = chain_of(&base, &[(1, &one), (2, &two), (3, &three)]);
        let all = choose_point(&chain.links, None, true, false).unwrap();
        assert_eq!(all, PointChoice { applied: 3, passed_over: vec![] });
        let at = |s: &str| Some(ts(s));
        assert_eq!(choose_point(&chain.links, at("2026-11-30T09:02:30Z"), true, false).unwrap().applied, 2);
        assert_eq!(
            choose_point(&chain.links, at("2026-11-30T09:02:00Z"), true, false).unwrap().applied,
            2,
            "to is inclusive"
        );
        assert_eq!(choose_point(&chain.links, at("2026-11-30T09:00:30Z"), true, false).unwrap().applied, 0);
        consistent(&mut chain.links[2], false);
        consistent(&mut chain.links[1], false);
        let choice = choose_point(&chain.links, None, true, false).unwrap();
        assert_eq!(choice.applied, 1);
        assert_eq!(choice.passed_over.iter().map(|p| p.0).collect::<Vec<_>>(), [3, 2]);
        assert_eq!(choose_point(&chain.links, None, true, true).unwrap().applied, 3, "allowed");
        consistent(&mut chain.links[0], false);
        assert_eq!(choose_point(&chain.links, None, true, false).unwrap().applied, 0, "the base");
        assert_eq!(choose_point(&chain.links, None, false, false), None, "nothing consistent");
        // An inconsistent base with a consistent later point: the point.
        consistent(&mut chain.links[2], true);
        assert_eq!(choose_point(&chain.links, None, false, false).unwrap().applied, 3);
    }

    #[test]
    fn a_segment_reads_with_zstd_and_its_header_with_any_json_reader() {
        let base = base_id();
        let one = write(&base, 1, None, 1, &[server("s1", "Reserved"), tombstone(&server("s2", "x"))]);
        let text = String::from_utf8(zstd::decode_all(one.payload.as_slice()).unwrap()).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines[0]["status"]["state"], "Reserved");
        assert!(lines[1]["status"].is_null(), "a tombstone's status is null");
        let header: serde_json::Value = serde_json::from_slice(&one.header).unwrap();
        assert_eq!(header["sequence"], 1);
        assert_eq!(header["payload"]["sha256"], sha256_hex(&one.payload));
        assert_eq!(header["payload"]["file"], "00000001.jsonl.zst");
        assert_eq!((header["changed"].as_u64(), header["deleted"].as_u64()), (Some(1), Some(1)));
        assert!(header.get("previousSha256").is_none());
        assert_eq!(header["resourceVersions"]["Server.metal.ironcore.dev"], "101");
    }

    #[test]
    fn object_keys_tell_kinds_groups_and_namespaces_apart() {
        let mut a = server("x", "s");
        let b = a.clone();
        assert_eq!(object_key(&a), object_key(&b));
        a.namespace = Some("ns".into());
        assert_ne!(object_key(&a), object_key(&b));
        let mut c = b.clone();
        c.api_version = "other.example/v1".into();
        assert_ne!(object_key(&c), object_key(&b));
    }
}
