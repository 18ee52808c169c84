//! The payload: records as JSON Lines, zstd-compressed, sha256 over the compressed bytes.
//!
//! Writing streams: [`PayloadEncoder::push`] compresses as it goes and
//! [`PayloadEncoder::take_output`] hands out the compressed bytes so far, so a backup holds one
//! page of objects in memory, never the whole payload. The records are cut into zstd frames of
//! about [`FRAME_BYTES`] (format 1.2), between records: a reader decompresses one frame to read
//! one status. Concatenated frames are one valid zstd stream, so a reader that decompresses
//! the payload as a whole (every 1.x reader) reads them unchanged. Reading verifies before it
//! decompresses.

use std::io::{BufRead, BufReader, Read, Write};

use sha2::{Digest, Sha256};

use super::{Manifest, Record};
use crate::Error;

/// What the encoder measured; goes into the manifest's `payload` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadSummary {
    pub size: u64,
    pub uncompressed_size: u64,
    pub sha256: String,
    pub records: u64,
    pub frames: u64,
}

/// A frame is ended after the record that takes it to this many uncompressed bytes. Small
/// enough that reading one status costs little; large enough that racks of similar servers
/// still compress together.
pub const FRAME_BYTES: u64 = 256 << 10;

pub struct PayloadEncoder {
    level: i32,
    zstd: zstd::Encoder<'static, Vec<u8>>,
    /// Ended frames not yet handed out.
    ended: Vec<u8>,
    frame_bytes: u64,
    frames: u64,
    line: Vec<u8>,
    hasher: Sha256,
    size: u64,
    uncompressed_size: u64,
    records: u64,
}

fn frame_encoder(level: i32) -> std::io::Result<zstd::Encoder<'static, Vec<u8>>> {
    let mut zstd = zstd::Encoder::new(Vec::with_capacity(FRAME_BYTES as usize / 4), level)?;
    zstd.include_checksum(true)?;
    Ok(zstd)
}

impl PayloadEncoder {
    pub fn new(level: i32) -> std::io::Result<Self> {
        Ok(PayloadEncoder {
            level,
            zstd: frame_encoder(level)?,
            ended: Vec::new(),
            frame_bytes: 0,
            frames: 0,
            line: Vec::with_capacity(64 << 10),
            hasher: Sha256::new(),
            size: 0,
            uncompressed_size: 0,
            records: 0,
        })
    }

    pub fn push(&mut self, record: &Record) -> std::io::Result<()> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, record)?;
        self.line.push(b'\n');
        self.zstd.write_all(&self.line)?;
        self.uncompressed_size += self.line.len() as u64;
        self.frame_bytes += self.line.len() as u64;
        self.records += 1;
        if self.frame_bytes >= FRAME_BYTES {
            self.end_frame()?;
        }
        Ok(())
    }

    fn end_frame(&mut self) -> std::io::Result<()> {
        let ended = std::mem::replace(&mut self.zstd, frame_encoder(self.level)?).finish()?;
        self.ended.extend_from_slice(&ended);
        self.frames += 1;
        self.frame_bytes = 0;
        Ok(())
    }

    /// The compressed bytes produced since the last call (possibly none).
    pub fn take_output(&mut self) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.ended);
        out.append(self.zstd.get_mut());
        self.account(&out);
        out
    }

    /// Ends the last zstd frame (an empty payload is one empty frame); returns the last
    /// compressed bytes and the summary.
    pub fn finish(mut self) -> std::io::Result<(Vec<u8>, PayloadSummary)> {
        if self.frame_bytes > 0 || self.frames == 0 {
            self.end_frame()?;
        }
        let out = self.take_output();
        let summary = PayloadSummary {
            size: self.size,
            uncompressed_size: self.uncompressed_size,
            sha256: hex::encode(self.hasher.finalize()),
            records: self.records,
            frames: self.frames,
        };
        Ok((out, summary))
    }

    fn account(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
    }
}

/// Checks size and sha256 of a stored payload against its manifest. Nothing is decompressed.
pub fn verify_payload(manifest: &Manifest, payload: &[u8]) -> Result<(), Error> {
    let id = &manifest.snapshot_id;
    if payload.len() as u64 != manifest.payload.size {
        return Err(Error::corrupt(
            id,
            format!(
                "payload has {} bytes, manifest declares {} (truncated or replaced)",
                payload.len(),
                manifest.payload.size
            ),
        ));
    }
    let actual = hex::encode(Sha256::digest(payload));
    if !actual.eq_ignore_ascii_case(&manifest.payload.sha256) {
        return Err(Error::corrupt(
            id,
            format!("payload sha256 is {actual}, manifest declares {}", manifest.payload.sha256),
        ));
    }
    Ok(())
}

/// Verifies the payload, then decompresses it, never more than the manifest declares, and
/// hands each record to `visit` in payload order. Returns the number of records.
pub fn decode_records(
    manifest: &Manifest,
    payload: &[u8],
    mut visit: impl FnMut(Record) -> Result<(), Error>,
) -> Result<u64, Error> {
    verify_payload(manifest, payload)?;
    let id = &manifest.snapshot_id;
    let declared = manifest.payload.uncompressed_size;
    let decoder =
        zstd::Decoder::with_buffer(payload).map_err(|e| Error::corrupt(id, format!("payload is not zstd: {e}")))?;
    // One byte more than declared is enough to notice a payload that inflates past its size.
    let mut reader = BufReader::new(decoder.take(declared.saturating_add(1)));
    let mut line = Vec::new();
    let mut total: u64 = 0;
    let mut records: u64 = 0;
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| Error::corrupt(id, format!("payload does not decompress: {e}")))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > declared {
            return Err(Error::corrupt(
                id,
                format!("payload decompresses to more than the {declared} bytes its manifest declares"),
            ));
        }
        if line.last() != Some(&b'\n') {
            return Err(Error::corrupt(id, format!("record {} is cut off", records + 1)));
        }
        let record: Record = serde_json::from_slice(&line)
            .map_err(|e| Error::corrupt(id, format!("record {} is not valid: {e}", records + 1)))?;
        records += 1;
        visit(record)?;
    }
    if total != declared {
        return Err(Error::corrupt(id, format!("payload decompresses to {total} bytes, manifest declares {declared}")));
    }
    if records != manifest.payload.records {
        return Err(Error::corrupt(
            id,
            format!("payload holds {records} records, manifest declares {}", manifest.payload.records),
        ));
    }
    Ok(records)
}
