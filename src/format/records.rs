//! A verified snapshot's records, held for planning in a few dozen bytes each: where the
//! record is in the payload, its kind, and digests of its identity keys. The records
//! themselves stay compressed in the payload until one is needed.
//!
//! A 1.2 payload is cut into zstd frames of about [`FRAME_BYTES`](super::FRAME_BYTES); a
//! record is read by decompressing its frame (a few recently used frames are kept, and
//! planning reads records in payload order), so memory grows with the number of records by
//! some 32 bytes each, not with the size of their statuses. Records of frames much larger
//! than that (a 1.0/1.1 payload is one frame) are kept in memory as they are decoded: such
//! snapshots cost what they always cost.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use super::payload::{check_count, decompress, frame_lines, walk_frames};
use super::spill::Payload;
use super::{FRAME_BYTES, IdentityKey, KeyDigest, Manifest, Names, Record, RecordHead, qualified_kind};
use crate::Error;

/// Frames larger than this keep their records in memory when decoded.
const LARGE_FRAME: u64 = 4 * FRAME_BYTES;
/// Decompressed frames kept for the records read next (records are read in payload order).
const CACHED_FRAMES: usize = 8;

/// Where one record is.
#[derive(Debug, Clone)]
enum At {
    /// Bytes `start..start+len` of decompressed frame `frame`: one JSON line.
    Frame {
        frame: u32,
        start: u32,
        len: u32,
    },
    Held(Box<Record>),
}

#[derive(Debug, Clone)]
struct Slot {
    at: At,
    /// Index into [`Records::kinds`].
    kind: u32,
    /// The end of its keys' digests in [`Records::digests`] (they start where the previous
    /// record's end).
    keys_end: u32,
}

/// The records of one snapshot, in payload order.
pub struct Records {
    /// The snapshot, for errors.
    snapshot: String,
    kinds: Names,
    slots: Vec<Slot>,
    /// Every record's key digests, in record order.
    digests: Vec<KeyDigest>,
    payload: Payload,
    frames: Vec<Range<u64>>,
    cache: Mutex<VecDeque<(u32, Arc<Vec<u8>>)>>,
}

impl std::fmt::Debug for Records {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records").field("records", &self.slots.len()).field("frames", &self.frames.len()).finish()
    }
}

impl Records {
    fn empty(snapshot: String, payload: Payload, capacity: usize) -> Self {
        Records {
            snapshot,
            kinds: Names::default(),
            slots: Vec::with_capacity(capacity),
            digests: Vec::with_capacity(capacity),
            payload,
            frames: Vec::new(),
            cache: Mutex::default(),
        }
    }

    /// Records held whole in memory (a few, or in tests).
    pub fn from_records(records: Vec<Record>) -> Self {
        let mut out = Records::empty("(records in memory)".into(), Payload::Memory(Default::default()), records.len());
        for record in records {
            let (kind, keys_end) = out.index(&record.kind, &record.api_version, &record.keys);
            out.slots.push(Slot { at: At::Held(Box::new(record)), kind, keys_end });
        }
        out
    }

    /// Verifies a payload against its manifest (size and sha256 before anything is
    /// decompressed), then decodes every frame once, never more than the manifest declares,
    /// and keeps where each record is, its kind and its keys' digests.
    pub fn decode(manifest: &Manifest, payload: impl Into<Payload>) -> Result<Self, Error> {
        let payload = payload.into();
        let id = manifest.snapshot_id.as_str();
        let capacity = manifest.payload.records.min(1 << 20) as usize;
        let mut records = Records::empty(id.to_string(), payload.clone(), capacity);
        walk_frames(manifest, &payload, |range, data| {
            let frame = records.frames.len() as u32;
            records.frames.push(range);
            records.add_frame(id, frame, &data)
        })?;
        check_count(manifest, records.slots.len() as u64)?;
        Ok(records)
    }

    /// Reads one frame's records: where each is, its kind and keys.
    fn add_frame(&mut self, id: &str, frame: u32, data: &[u8]) -> Result<(), Error> {
        let hold = data.len() as u64 > LARGE_FRAME;
        for line in frame_lines(id, data, self.slots.len())? {
            let n = self.slots.len() + 1;
            let invalid = |e: serde_json::Error| Error::corrupt(id, format!("record {n} is not valid: {e}"));
            let at = At::Frame { frame, start: line.start as u32, len: line.len() as u32 };
            let line = &data[line];
            if hold {
                let record: Record = serde_json::from_slice(line).map_err(invalid)?;
                let (kind, keys_end) = self.index(&record.kind, &record.api_version, &record.keys);
                self.slots.push(Slot { at: At::Held(Box::new(record)), kind, keys_end });
            } else {
                let record: Record<&RawValue> = serde_json::from_slice(line).map_err(invalid)?;
                let (kind, keys_end) = self.index(&record.kind, &record.api_version, &record.keys);
                self.slots.push(Slot { at, kind, keys_end });
            }
        }
        Ok(())
    }

    /// Indexes the next record's kind and keys: its group-qualified kind's index, and the end
    /// of its digests (digests are of the kind's name: a prefilter, the keys decide).
    fn index(&mut self, kind: &str, api_version: &str, keys: &[IdentityKey]) -> (u32, u32) {
        let kind_index = self.kinds.intern(&qualified_kind(kind, api_version));
        self.digests.extend(keys.iter().map(|k| k.digest(kind)));
        (kind_index, self.digests.len() as u32)
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Record `i`'s group-qualified kind (`Server.metal.ironcore.dev`).
    pub fn kind(&self, i: usize) -> Option<&str> {
        self.slots.get(i).map(|s| self.kinds.get(s.kind))
    }

    /// The records of a group-qualified kind (`Server.metal.ironcore.dev`, see
    /// [`KindProfile::qualified_kind`](crate::domain::identity::KindProfile::qualified_kind)),
    /// in payload order: a kind of the same name in another group is another kind.
    pub fn of_kind<'a>(&'a self, qualified_kind: &str) -> impl Iterator<Item = usize> + 'a {
        let wanted = self.kinds.find(qualified_kind);
        (0..self.slots.len()).filter(move |&i| Some(self.slots[i].kind) == wanted)
    }

    /// The digests of record `i`'s keys (of its kind), in key order: the first is its
    /// primary key's.
    pub fn key_digests(&self, i: usize) -> &[KeyDigest] {
        let start = match i {
            0 => 0,
            _ => self.slots.get(i - 1).map_or(0, |s| s.keys_end as usize),
        };
        let end = self.slots.get(i).map_or(start, |s| s.keys_end as usize);
        &self.digests[start..end]
    }

    /// Record `i` without its status, read from its frame.
    pub fn head(&self, i: usize) -> Result<RecordHead, Error> {
        match &self.slot(i)?.at {
            At::Held(record) => Ok(record.clone().split().0),
            At::Frame { .. } => {
                let record: Record<IgnoredAny> = self.parse(i)?;
                Ok(record.split().0)
            }
        }
    }

    /// Every record's head, in payload order (each frame is decompressed once).
    pub fn heads(&self) -> impl Iterator<Item = Result<(usize, RecordHead), Error>> + '_ {
        (0..self.len()).map(|i| self.head(i).map(|h| (i, h)))
    }

    /// Record `i`'s status, read from its frame.
    pub fn status(&self, i: usize) -> Result<Box<RawValue>, Error> {
        Ok(self.record(i)?.status)
    }

    /// Record `i`, whole.
    pub fn record(&self, i: usize) -> Result<Record, Error> {
        match &self.slot(i)?.at {
            At::Held(record) => Ok((**record).clone()),
            At::Frame { .. } => self.parse(i),
        }
    }

    fn slot(&self, i: usize) -> Result<&Slot, Error> {
        self.slots.get(i).ok_or_else(|| self.corrupt(format!("no record {i}")))
    }

    /// Record `i`, parsed from its line in its frame.
    fn parse<T: serde::de::DeserializeOwned>(&self, i: usize) -> Result<T, Error> {
        let At::Frame { frame, start, len } = self.slot(i)?.at else {
            return Err(self.corrupt(format!("record {i} is not in a frame")));
        };
        let data = self.frame(frame)?;
        let line = data
            .get(start as usize..(start + len) as usize)
            .ok_or_else(|| self.corrupt(format!("record {} is cut off", i + 1)))?;
        serde_json::from_slice(line).map_err(|e| self.corrupt(format!("record {} is not valid: {e}", i + 1)))
    }

    /// The decompressed frame, from the cache or decompressed again.
    fn frame(&self, frame: u32) -> Result<Arc<Vec<u8>>, Error> {
        if let Ok(cache) = self.cache.lock()
            && let Some((_, data)) = cache.iter().find(|(f, _)| *f == frame)
        {
            return Ok(data.clone());
        }
        let range = self.frames.get(frame as usize).ok_or_else(|| self.corrupt(format!("no frame {frame}")))?;
        let compressed = self
            .payload
            .read(range.clone())
            .map_err(|e| Error::io(format!("read payload of snapshot {}", self.snapshot), e))?;
        let data = Arc::new(decompress(&self.snapshot, &compressed, LARGE_FRAME)?);
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() == CACHED_FRAMES {
                cache.pop_back();
            }
            cache.push_front((frame, data.clone()));
        }
        Ok(data)
    }

    fn corrupt(&self, reason: String) -> Error {
        Error::corrupt(&self.snapshot, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, record, ts, uuid};
    use crate::format::{PayloadEncoder, SnapshotId, decode_records};
    use bytes::Bytes;
    use serde_json::json;

    /// A manifest and payload of `n` Servers with statuses of about 1 KiB each.
    fn snapshot(n: usize) -> (Manifest, Bytes, Vec<Record>) {
        let records: Vec<Record> = (0..n)
            .map(|i| {
                let nics: Vec<_> =
                    (0..8).map(|j| json!({"name": format!("eth{j}"), "mac": format!("{i:06x}{j:02x}")})).collect();
                record(
                    "Server",
                    &format!("s{i}"),
                    &[uuid(&format!("u{i}"))],
                    json!({"state": "Reserved", "nics": nics}),
                )
            })
            .collect();
        encoded(records)
    }

    /// `records` as a writer encodes them, with their manifest.
    fn encoded(records: Vec<Record>) -> (Manifest, Bytes, Vec<Record>) {
        let mut encoder = PayloadEncoder::new(3).unwrap();
        let mut payload = Vec::new();
        for r in &records {
            encoder.push(r).unwrap();
            payload.extend(encoder.take_output());
        }
        let (tail, summary) = encoder.finish().unwrap();
        payload.extend(tail);
        let at = ts(fixtures::SNAPSHOT_TIME);
        let mut manifest = fixtures::manifest(SnapshotId::new(at), at);
        manifest.payload.size = summary.size;
        manifest.payload.uncompressed_size = summary.uncompressed_size;
        manifest.payload.sha256 = summary.sha256;
        manifest.payload.records = summary.records;
        manifest.payload.frames = Some(summary.frames);
        (manifest, Bytes::from(payload), records)
    }

    #[test]
    fn statuses_are_read_back_from_their_frames() {
        let (manifest, payload, records) = snapshot(2000);
        assert!(manifest.payload.frames.unwrap() > 3, "{:?}", manifest.payload);
        let decoded = Records::decode(&manifest, payload).unwrap();
        assert_eq!(decoded.len(), 2000);
        for i in [0, 1, 999, 1999, 5] {
            assert_eq!(decoded.head(i).unwrap().name, records[i].name);
            assert_eq!(decoded.key_digests(i), [records[i].keys[0].digest("Server")]);
            assert_eq!(decoded.status(i).unwrap().get(), records[i].status.get(), "record {i}");
        }
        assert!(decoded.slots.iter().all(|s| matches!(s.at, At::Frame { .. })), "nothing held in memory");
        assert_eq!(decoded.of_kind("Server.metal.ironcore.dev").count(), 2000);
        assert_eq!(decoded.of_kind("BMC.metal.ironcore.dev").count(), 0);
        assert_eq!(decoded.of_kind("Server").count(), 0, "a kind's name alone names no kind of a group");
    }

    #[test]
    fn a_whole_stream_reader_reads_the_frames_as_one_payload() {
        let (manifest, payload, records) = snapshot(1500);
        let mut names = Vec::new();
        decode_records(&manifest, &payload, |r| {
            names.push(r.name);
            Ok(())
        })
        .unwrap();
        assert_eq!(names, records.iter().map(|r| r.name.clone()).collect::<Vec<_>>());
    }

    #[test]
    fn a_single_frame_payload_of_an_older_writer_keeps_its_statuses() {
        let (manifest, _, records) = snapshot(1200);
        let mut lines = Vec::new();
        for r in &records {
            serde_json::to_writer(&mut lines, r).unwrap();
            lines.push(b'\n');
        }
        let payload = zstd::encode_all(&lines[..], 3).unwrap();
        let mut old = manifest.clone();
        old.payload.size = payload.len() as u64;
        old.payload.uncompressed_size = lines.len() as u64;
        old.payload.sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&payload));
        old.payload.frames = None;
        let decoded = Records::decode(&old, Bytes::from(payload)).unwrap();
        assert_eq!(decoded.frames.len(), 1);
        assert_eq!(decoded.status(700).unwrap().get(), records[700].status.get());
    }

    /// The same bytes, spilled to a temporary file as a restore holds a large payload.
    fn spilled(bytes: &[u8]) -> Payload {
        let mut writer = crate::format::SpillWriter::create(None).unwrap();
        for chunk in bytes.chunks(64 << 10) {
            writer.write(chunk).unwrap();
        }
        writer.finish().unwrap()
    }

    /// Records of a kind of the same name in another group (or the core group) are another
    /// kind's: a `Server` of `example.com` never matches metal-operator's.
    #[test]
    fn kinds_of_the_same_name_in_other_groups_are_other_kinds() {
        let mut other = record("Server", "other", &[uuid("u-1")], json!({"state": "Up"}));
        other.api_version = "example.com/v1".into();
        let mut core = record("Server", "core", &[uuid("u-1")], json!({}));
        core.api_version = "v1".into();
        let metal = record("Server", "metal", &[uuid("u-1")], json!({"state": "Available"}));
        let records = Records::from_records(vec![other, core, metal]);
        assert_eq!(records.of_kind("Server.metal.ironcore.dev").collect::<Vec<_>>(), [2]);
        assert_eq!(records.of_kind("Server.example.com").collect::<Vec<_>>(), [0]);
        assert_eq!(records.of_kind("Server").collect::<Vec<_>>(), [1]);
    }

    /// A well-formed payload of 70,000 kinds (a crafted one: restatus writes a few): every
    /// record keeps its own kind (an index of 16 bits wrapped at 65,536 and gave record 65,536
    /// the first record's kind).
    #[test]
    fn a_payload_of_more_kinds_than_16_bits_hold_keeps_every_records_kind() {
        let records =
            (0..70_000).map(|i| record(&format!("K{i}"), "x", &[uuid(&format!("u{i}"))], json!({}))).collect();
        let (manifest, payload, _) = encoded(records);
        let decoded = Records::decode(&manifest, payload).unwrap();
        assert_eq!(
            (decoded.kind(0), decoded.kind(65_536), decoded.kind(69_999)),
            (Some("K0.metal.ironcore.dev"), Some("K65536.metal.ironcore.dev"), Some("K69999.metal.ironcore.dev"))
        );
        assert_eq!(decoded.of_kind("K0.metal.ironcore.dev").collect::<Vec<_>>(), [0]);
        assert_eq!(decoded.of_kind("K65536.metal.ironcore.dev").collect::<Vec<_>>(), [65_536]);
    }

    #[test]
    fn a_record_costs_24_bytes_of_slot() {
        assert_eq!(std::mem::size_of::<Slot>(), 24);
    }

    #[test]
    fn a_spilled_payload_decodes_to_the_same_records_as_in_memory() {
        let (manifest, payload, records) = snapshot(2000);
        let decoded = Records::decode(&manifest, spilled(&payload)).unwrap();
        assert!(matches!(decoded.payload, Payload::Spilled(_)));
        assert_eq!(decoded.len(), 2000);
        for i in [0, 1, 999, 1999, 5] {
            assert_eq!(decoded.head(i).unwrap().name, records[i].name);
            assert_eq!(decoded.status(i).unwrap().get(), records[i].status.get(), "record {i}");
        }
        // One frame larger than the first window a spilled payload is read in (older writers):
        // statuses of hex digests hardly compress.
        let noisy: Vec<Record> = (0..2000u32)
            .map(|i| {
                let noise: Vec<String> = (0..8u32)
                    .map(|j| hex::encode(<sha2::Sha256 as sha2::Digest>::digest((i * 8 + j).to_le_bytes())))
                    .collect();
                record("Server", &format!("s{i}"), &[uuid(&format!("u{i}"))], json!({ "noise": noise }))
            })
            .collect();
        let mut lines = Vec::new();
        for r in &noisy {
            serde_json::to_writer(&mut lines, r).unwrap();
            lines.push(b'\n');
        }
        let whole = zstd::encode_all(&lines[..], 0).unwrap();
        let one_frame = whole;
        let mut old = manifest.clone();
        old.payload.size = one_frame.len() as u64;
        old.payload.uncompressed_size = lines.len() as u64;
        old.payload.sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&one_frame));
        old.payload.frames = None;
        assert!(one_frame.len() > 256 << 10, "larger than the first window: {}", one_frame.len());
        let decoded = Records::decode(&old, spilled(&one_frame)).unwrap();
        assert_eq!(decoded.frames.len(), 1);
        assert_eq!(decoded.status(1500).unwrap().get(), noisy[1500].status.get());
        let mut damaged = payload.to_vec();
        damaged[payload.len() / 3] ^= 0x01;
        let err = Records::decode(&manifest, spilled(&damaged)).unwrap_err().to_string();
        assert!(err.contains("sha256"), "{err}");
        let err = Records::decode(&manifest, spilled(&payload[..payload.len() - 1])).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
    }

    #[test]
    fn damage_is_refused_before_and_while_decoding() {
        let (manifest, payload, _) = snapshot(300);
        let mut damaged = payload.to_vec();
        damaged[payload.len() / 2] ^= 0xff;
        let err = Records::decode(&manifest, Bytes::from(damaged)).unwrap_err().to_string();
        assert!(err.contains("sha256"), "{err}");
        let mut short = manifest.clone();
        short.payload.uncompressed_size -= 10;
        let err = Records::decode(&short, payload.clone()).unwrap_err().to_string();
        assert!(err.contains("more than"), "{err}");
        let mut fewer = manifest.clone();
        fewer.payload.records -= 1;
        let err = Records::decode(&fewer, payload).unwrap_err().to_string();
        assert!(err.contains("manifest declares 299"), "{err}");
    }
}
