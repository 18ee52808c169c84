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
use std::ops::Range;

use sha2::{Digest, Sha256};

use super::spill::Payload;
use super::{Manifest, PayloadSummary, Record};
use crate::Error;

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
    /// A frame is ended once it holds this many uncompressed bytes ([`FRAME_BYTES`]).
    frame_limit: u64,
    frames: u64,
    line: Vec<u8>,
    hasher: Sha256,
    size: u64,
    uncompressed_size: u64,
    records: u64,
    /// Encrypts the compressed bytes (format 1.5): size and sha256 are then the ciphertext's.
    sealer: Option<super::encryption::Sealer>,
    encryption: Option<super::Encryption>,
    sealing_failed: Option<std::io::Error>,
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
            frame_limit: FRAME_BYTES,
            frames: 0,
            line: Vec::with_capacity(64 << 10),
            hasher: Sha256::new(),
            size: 0,
            uncompressed_size: 0,
            records: 0,
            sealer: None,
            encryption: None,
            sealing_failed: None,
        })
    }

    /// Frames of about `bytes` instead of [`FRAME_BYTES`]: smaller frames for a payload whose
    /// records are read out of order (each read decompresses its frame).
    pub fn with_frame_bytes(mut self, bytes: u64) -> Self {
        self.frame_limit = bytes.max(1);
        self
    }

    /// An encoder whose output is encrypted to `recipients` (plain without them).
    pub fn with_recipients(level: i32, recipients: Option<&super::Recipients>) -> std::io::Result<Self> {
        let mut encoder = Self::new(level)?;
        if let Some(recipients) = recipients {
            encoder.sealer = Some(recipients.sealer()?);
            encoder.encryption = Some(recipients.encryption());
        }
        Ok(encoder)
    }

    /// `records` encoded whole, in memory (encrypted to `recipients`): a journal segment, or a
    /// test's payload. A backup streams its payload part by part instead.
    pub fn encode_all<'r>(
        level: i32,
        recipients: Option<&super::Recipients>,
        records: impl IntoIterator<Item = &'r Record>,
    ) -> std::io::Result<(Vec<u8>, PayloadSummary)> {
        let mut encoder = Self::with_recipients(level, recipients)?;
        let mut bytes = Vec::new();
        for record in records {
            encoder.push(record)?;
            bytes.extend(encoder.take_output());
        }
        let (tail, summary) = encoder.finish()?;
        bytes.extend(tail);
        Ok((bytes, summary))
    }

    pub fn push(&mut self, record: &Record) -> std::io::Result<()> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, record)?;
        self.line.push(b'\n');
        self.zstd.write_all(&self.line)?;
        self.uncompressed_size += self.line.len() as u64;
        self.frame_bytes += self.line.len() as u64;
        self.records += 1;
        if self.frame_bytes >= self.frame_limit {
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

    /// The compressed (and, with recipients, encrypted) bytes produced since the last call
    /// (possibly none).
    pub fn take_output(&mut self) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.ended);
        out.append(self.zstd.get_mut());
        if let Some(sealer) = &mut self.sealer {
            // Writes into memory: an error here is kept for `finish`, which fails with it.
            out = match sealer.seal(&out) {
                Ok(sealed) => sealed,
                Err(e) => {
                    self.sealing_failed.get_or_insert(e);
                    Vec::new()
                }
            };
        }
        self.account(&out);
        out
    }

    /// Ends the last zstd frame (an empty payload is one empty frame); returns the last
    /// compressed bytes and the summary.
    pub fn finish(mut self) -> std::io::Result<(Vec<u8>, PayloadSummary)> {
        if self.frame_bytes > 0 || self.frames == 0 {
            self.end_frame()?;
        }
        let mut out = self.take_output();
        if let Some(e) = self.sealing_failed.take() {
            return Err(e);
        }
        if let Some(sealer) = self.sealer.take() {
            let last = sealer.finish()?;
            self.account(&last);
            out.extend_from_slice(&last);
        }
        let summary = PayloadSummary {
            size: self.size,
            uncompressed_size: self.uncompressed_size,
            sha256: hex::encode(self.hasher.finalize()),
            records: self.records,
            frames: self.frames,
            encryption: self.encryption,
        };
        Ok((out, summary))
    }

    fn account(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
    }
}

/// Verifies the payload (size and sha256, before anything is decompressed), then
/// decompresses its zstd frames in order, never more than the manifest declares in all, and
/// hands each to `visit` with its byte range in the payload; checks at the end that they
/// decompress to exactly the declared size. (A 1.0/1.1 payload is one frame.)
pub(crate) fn walk_frames(
    manifest: &Manifest,
    payload: &Payload,
    mut visit: impl FnMut(Range<u64>, Vec<u8>) -> Result<(), Error>,
) -> Result<(), Error> {
    payload.verify(manifest)?;
    if let Some(encryption) = &manifest.encryption
        && !payload.is_decrypted()
    {
        return Err(super::encryption::encrypted_error(manifest, encryption));
    }
    let id = &manifest.snapshot_id;
    let declared = manifest.payload.uncompressed_size;
    let (mut total, mut at) = (0u64, 0u64);
    while at < payload.len() {
        let frame = next_frame(id.as_str(), payload, at)?;
        let size = frame.len() as u64;
        let data = decompress(id.as_str(), &frame, declared - total)?;
        total += data.len() as u64;
        visit(at..at + size, data)?;
        at += size;
    }
    if total != declared {
        return Err(Error::corrupt(id, format!("payload decompresses to {total} bytes, manifest declares {declared}")));
    }
    Ok(())
}

/// The first bytes of every zstd frame restatus writes.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// The compressed zstd frame that starts at byte `at`. A spilled payload is read in windows
/// that grow until the frame fits (a 1.2 frame is some tens of KiB; older payloads are one
/// frame).
fn next_frame<'a>(id: &str, payload: &'a Payload, at: u64) -> Result<std::borrow::Cow<'a, [u8]>, Error> {
    // Bytes that do not start a zstd frame are refused at once: the window grows only for a
    // frame that is one, never to read a whole payload of garbage.
    let head =
        payload.read(at..at.saturating_add(4)).map_err(|e| Error::io(format!("read payload of snapshot {id}"), e))?;
    if head.as_ref() != ZSTD_MAGIC {
        return Err(Error::corrupt(id, format!("payload frame at byte {at} does not decompress: not zstd")));
    }
    let mut window = 256 << 10;
    loop {
        let end = at.saturating_add(window).min(payload.len());
        let bytes = payload.read(at..end).map_err(|e| Error::io(format!("read payload of snapshot {id}"), e))?;
        match zstd::zstd_safe::find_frame_compressed_size(&bytes) {
            Ok(size) => {
                return Ok(match bytes {
                    std::borrow::Cow::Borrowed(b) => std::borrow::Cow::Borrowed(&b[..size]),
                    std::borrow::Cow::Owned(mut b) => {
                        b.truncate(size);
                        std::borrow::Cow::Owned(b)
                    }
                });
            }
            Err(_) if end < payload.len() => window = window.saturating_mul(4),
            Err(code) => {
                let reason = zstd::zstd_safe::get_error_name(code);
                return Err(Error::corrupt(
                    id,
                    format!("payload frame at byte {at} does not decompress: not zstd ({reason})"),
                ));
            }
        }
    }
}

/// The records (JSON lines) of one decompressed frame, as byte ranges; `before`: records in
/// the frames before it (for errors).
pub(crate) fn frame_lines(id: &str, data: &[u8], before: usize) -> Result<Vec<Range<usize>>, Error> {
    let mut lines = Vec::new();
    let mut start = 0;
    while start < data.len() {
        let Some(len) = data[start..].iter().position(|&b| b == b'\n') else {
            return Err(Error::corrupt(id, format!("record {} is cut off", before + lines.len() + 1)));
        };
        lines.push(start..start + len);
        start += len + 1;
    }
    Ok(lines)
}

/// The error for a payload whose record count is not the manifest's.
pub(crate) fn check_count(manifest: &Manifest, records: u64) -> Result<(), Error> {
    match records == manifest.payload.records {
        true => Ok(()),
        false => Err(Error::corrupt(
            &manifest.snapshot_id,
            format!("payload holds {records} records, manifest declares {}", manifest.payload.records),
        )),
    }
}

/// Verifies the payload, then decodes it frame by frame, never more than the manifest
/// declares, and hands each record to `visit` in payload order. Returns the number of records.
pub fn decode_records(
    manifest: &Manifest,
    payload: impl Into<Payload>,
    mut visit: impl FnMut(Record) -> Result<(), Error>,
) -> Result<u64, Error> {
    let id = manifest.snapshot_id.as_str();
    let mut records = 0;
    walk_frames(manifest, &payload.into(), |_, data| {
        for line in frame_lines(id, &data, records)? {
            records += 1;
            let record: Record = serde_json::from_slice(&data[line])
                .map_err(|e| Error::corrupt(id, format!("record {records} is not valid: {e}")))?;
            visit(record)?;
        }
        Ok(())
    })?;
    check_count(manifest, records as u64)?;
    Ok(records as u64)
}

/// Decompresses one zstd frame, at most `limit` bytes of it (one more is an error).
pub(crate) fn decompress(id: &str, frame: &[u8], limit: u64) -> Result<Vec<u8>, Error> {
    let decoder = zstd::Decoder::with_buffer(frame)
        .map_err(|e| Error::corrupt(id, format!("payload is not zstd: {e}")))?
        .single_frame();
    let mut data = Vec::new();
    let mut reader = BufReader::new(decoder.take(limit.saturating_add(1)));
    loop {
        let chunk = reader.fill_buf().map_err(|e| Error::corrupt(id, format!("payload does not decompress: {e}")))?;
        if chunk.is_empty() {
            break;
        }
        let n = chunk.len();
        data.extend_from_slice(chunk);
        reader.consume(n);
        if data.len() as u64 > limit {
            return Err(Error::corrupt(
                id,
                format!("payload decompresses to more than the {limit} bytes its manifest declares"),
            ));
        }
    }
    Ok(data)
}
