//! A payload as a reader holds it: in memory, or spilled to an unnamed temporary file so that
//! memory does not grow with the size of the snapshot. Either way it is verified (size and
//! sha256 against the manifest) before anything is decompressed, and frames are read from it
//! by byte range. The payload format ([`super::payload`]) reads through it.

use std::borrow::Cow;
use std::io::Write;
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
/// the process dies), with its size and sha256 measured as it was written.
#[derive(Debug)]
pub struct Spilled {
    file: std::fs::File,
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
                spilled.file.read_exact_at(&mut buf, start)?;
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

/// Writes a payload into an unnamed temporary file as it downloads.
pub struct SpillWriter {
    file: std::io::BufWriter<std::fs::File>,
    len: u64,
    hasher: Sha256,
}

impl SpillWriter {
    /// A new temporary file in `dir`, or in the system's temporary directory (`TMPDIR`).
    pub fn create(dir: Option<&std::path::Path>) -> std::io::Result<Self> {
        let file = match dir {
            Some(dir) => tempfile::tempfile_in(dir)?,
            None => tempfile::tempfile()?,
        };
        Ok(SpillWriter { file: std::io::BufWriter::with_capacity(256 << 10, file), len: 0, hasher: Sha256::new() })
    }

    pub fn write(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        self.file.write_all(chunk)?;
        self.hasher.update(chunk);
        self.len += chunk.len() as u64;
        Ok(())
    }

    pub fn finish(self) -> std::io::Result<Payload> {
        let file = self.file.into_inner().map_err(|e| e.into_error())?;
        let sha256 = hex::encode(self.hasher.finalize());
        Ok(Payload::Spilled(std::sync::Arc::new(Spilled { file, len: self.len, sha256 })))
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
}
