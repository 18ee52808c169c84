//! A payload as a reader holds it: in memory, or spilled to an unnamed temporary file so that
//! memory does not grow with the size of the snapshot. Either way it is verified (size and
//! sha256 against the manifest) before anything is decompressed, and frames are read from it
//! by byte range. The payload format ([`super::payload`]) reads through it.

use std::borrow::Cow;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::Manifest;
use crate::Error;

/// A payload's compressed bytes.
#[derive(Debug, Clone)]
pub enum Payload {
    Memory(Bytes),
    Spilled(std::sync::Arc<Spilled>),
    /// The plaintext of an encrypted payload (format 1.5), decrypted after its stored bytes
    /// were verified against the manifest (see [`super::open_payload`]).
    Decrypted(Box<Payload>),
}

/// A payload written to an unnamed temporary file (gone when the last handle closes, even if
/// the process dies), with its size and sha256 measured as it was written: the bytes at
/// `offset..offset + len` of the file, which it may share with other payloads (a journal
/// chain's segments, [`SpillFile`]).
#[derive(Debug)]
pub struct Spilled {
    file: std::sync::Arc<std::fs::File>,
    offset: u64,
    len: u64,
    sha256: String,
}

impl From<Bytes> for Payload {
    fn from(bytes: Bytes) -> Self {
        Payload::Memory(bytes)
    }
}

impl From<&Bytes> for Payload {
    fn from(bytes: &Bytes) -> Self {
        Payload::Memory(bytes.clone())
    }
}

impl From<Vec<u8>> for Payload {
    fn from(bytes: Vec<u8>) -> Self {
        Payload::Memory(bytes.into())
    }
}

impl Payload {
    pub fn len(&self) -> u64 {
        match self {
            Payload::Memory(bytes) => bytes.len() as u64,
            Payload::Spilled(spilled) => spilled.len,
            Payload::Decrypted(plain) => plain.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size and sha256 against the manifest's. A decrypted payload was verified before it
    /// was decrypted: the manifest's size and sha256 are the ciphertext's.
    pub fn verify(&self, manifest: &Manifest) -> Result<(), Error> {
        match self {
            Payload::Memory(bytes) => verify_payload(manifest, bytes),
            Payload::Spilled(spilled) => check_digest(manifest, spilled.len, &spilled.sha256),
            Payload::Decrypted(_) => Ok(()),
        }
    }

    /// Whether this is the plaintext of an encrypted payload.
    pub fn is_decrypted(&self) -> bool {
        matches!(self, Payload::Decrypted(_))
    }

    /// The bytes in `range`, or fewer where the payload ends first.
    pub fn read(&self, range: Range<u64>) -> std::io::Result<Cow<'_, [u8]>> {
        let end = range.end.min(self.len());
        let start = range.start.min(end);
        match self {
            Payload::Memory(bytes) => Ok(Cow::Borrowed(&bytes[start as usize..end as usize])),
            Payload::Spilled(spilled) => {
                let mut buf = vec![0; (end - start) as usize];
                spilled.file.read_exact_at(&mut buf, spilled.offset + start)?;
                Ok(Cow::Owned(buf))
            }
            Payload::Decrypted(plain) => plain.read(range),
        }
    }
}

/// Checks size and sha256 of a stored payload against its manifest. Nothing is decompressed.
pub fn verify_payload(manifest: &Manifest, payload: &[u8]) -> Result<(), Error> {
    check_digest(manifest, payload.len() as u64, &hex::encode(Sha256::digest(payload)))
}

/// Checks a payload's measured size and sha256 against its manifest's.
fn check_digest(manifest: &Manifest, size: u64, sha256: &str) -> Result<(), Error> {
    let id = &manifest.snapshot_id;
    if size != manifest.payload.size {
        let declared = manifest.payload.size;
        return Err(Error::corrupt(
            id,
            format!("payload has {size} bytes, manifest declares {declared} (truncated or replaced)"),
        ));
    }
    if !sha256.eq_ignore_ascii_case(&manifest.payload.sha256) {
        let declared = &manifest.payload.sha256;
        return Err(Error::corrupt(id, format!("payload sha256 is {sha256}, manifest declares {declared}")));
    }
    Ok(())
}

/// One unnamed temporary file that many payloads are written into, one after another: a
/// journal chain's segments (hundreds of them) cost one file and one descriptor, not one each.
/// Writers take turns ([`SpillFile::writer`] after the previous one finished).
#[derive(Debug)]
pub struct SpillFile {
    file: std::sync::Arc<std::fs::File>,
    end: std::sync::Mutex<u64>,
}

impl SpillFile {
    /// A new temporary file in `dir`, or in the system's temporary directory (`TMPDIR`).
    pub fn create(dir: Option<&std::path::Path>) -> std::io::Result<std::sync::Arc<SpillFile>> {
        let file = match dir {
            Some(dir) => tempfile::tempfile_in(dir)?,
            None => tempfile::tempfile()?,
        };
        Ok(std::sync::Arc::new(SpillFile { file: std::sync::Arc::new(file), end: std::sync::Mutex::new(0) }))
    }

    /// A writer of the next payload, after the last one written.
    pub fn writer(self: &std::sync::Arc<Self>) -> SpillWriter {
        let start = *self.end.lock().unwrap_or_else(|e| e.into_inner());
        SpillWriter::on(std::sync::Arc::clone(&self.file), start, Some(std::sync::Arc::clone(self)))
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        *self.end.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Writes a payload into an unnamed temporary file as it downloads (a file of its own, or the
/// next bytes of a [`SpillFile`]).
pub struct SpillWriter {
    file: std::sync::Arc<std::fs::File>,
    start: u64,
    len: u64,
    buffer: Vec<u8>,
    hasher: Sha256,
    shared: Option<std::sync::Arc<SpillFile>>,
}

/// Bytes gathered before a write to the file.
const SPILL_BUFFER: usize = 256 << 10;

impl SpillWriter {
    /// A new temporary file in `dir`, or in the system's temporary directory (`TMPDIR`).
    pub fn create(dir: Option<&std::path::Path>) -> std::io::Result<Self> {
        let file = match dir {
            Some(dir) => tempfile::tempfile_in(dir)?,
            None => tempfile::tempfile()?,
        };
        Ok(SpillWriter::on(std::sync::Arc::new(file), 0, None))
    }

    fn on(file: std::sync::Arc<std::fs::File>, start: u64, shared: Option<std::sync::Arc<SpillFile>>) -> Self {
        SpillWriter { file, start, len: 0, buffer: Vec::new(), hasher: Sha256::new(), shared }
    }

    pub fn write(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        self.hasher.update(chunk);
        if self.buffer.len() + chunk.len() > SPILL_BUFFER {
            self.flush()?;
        }
        match chunk.len() >= SPILL_BUFFER {
            true => {
                self.file.write_all_at(chunk, self.start + self.len)?;
                self.len += chunk.len() as u64;
            }
            false => self.buffer.extend_from_slice(chunk),
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buffer.is_empty() {
            self.file.write_all_at(&self.buffer, self.start + self.len)?;
            self.len += self.buffer.len() as u64;
            self.buffer.clear();
        }
        Ok(())
    }

    pub fn finish(mut self) -> std::io::Result<Payload> {
        self.flush()?;
        if let Some(shared) = &self.shared {
            let mut end = shared.end.lock().unwrap_or_else(|e| e.into_inner());
            *end = (*end).max(self.start + self.len);
        }
        let sha256 = hex::encode(self.hasher.finalize());
        Ok(Payload::Spilled(std::sync::Arc::new(Spilled {
            file: self.file,
            offset: self.start,
            len: self.len,
            sha256,
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spilled_payload_reads_and_verifies_like_the_same_bytes_in_memory() {
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut writer = SpillWriter::create(None).unwrap();
        for chunk in bytes.chunks(7_000) {
            writer.write(chunk).unwrap();
        }
        let spilled = writer.finish().unwrap();
        let memory = Payload::from(bytes.clone());
        assert_eq!(spilled.len(), memory.len());
        for range in [0..10, 6_990..7_010, 299_990..300_000, 299_990..400_000, 400_000..400_010] {
            assert_eq!(spilled.read(range.clone()).unwrap(), memory.read(range).unwrap());
        }
        let Payload::Spilled(s) = &spilled else { panic!("spilled") };
        assert_eq!(s.sha256, hex::encode(Sha256::digest(&bytes)));
    }

    /// Payloads one after another in one shared file read back each as its own bytes.
    #[test]
    fn payloads_in_one_shared_file_read_back_each_as_its_own() {
        let shared = SpillFile::create(None).unwrap();
        let payloads: Vec<Vec<u8>> =
            (1..4u32).map(|n| (0..n * 100_000).map(|i| (i % (n + 250)) as u8).collect()).collect();
        let spilled: Vec<Payload> = payloads
            .iter()
            .map(|bytes| {
                let mut writer = shared.writer();
                for chunk in bytes.chunks(300_000) {
                    writer.write(chunk).unwrap();
                }
                writer.finish().unwrap()
            })
            .collect();
        assert_eq!(shared.len(), 600_000);
        for (bytes, payload) in payloads.iter().zip(&spilled) {
            assert_eq!(payload.read(0..bytes.len() as u64).unwrap().as_ref(), bytes.as_slice());
            let Payload::Spilled(s) = payload else { panic!("spilled") };
            assert_eq!(s.sha256, hex::encode(Sha256::digest(bytes)));
        }
    }
}
