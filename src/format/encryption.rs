//! Encrypted payloads (format 1.5): a backup encrypts the payload to one or more X25519
//! recipients in the age format, so the bucket holds no readable status and the writer needs
//! no secret; a reader with the private key of one recipient decrypts it.
//!
//! What is encrypted is the stored payload as a whole: the zstd frames of records (statuses,
//! names, identity keys) go through one age stream. The manifest stays plain JSON (ids, times,
//! counts, the consistency verdict, the recipients) and its `payload` size and sha256 are over
//! the stored bytes, the ciphertext: listing, retention and the size and checksum checks need no
//! key, and a reader checks the ciphertext against the manifest before it decrypts anything.
//! The object-level lists of the manifest (skipped objects, key conflicts, inconsistency
//! reasons), which name objects and carry identity keys, are withheld from an encrypted
//! snapshot's manifest: only their counts remain ([`Withheld`]).
//!
//! Keys: a recipient is `age1…` (public, one line); a private key is `AGE-SECRET-KEY-1…`, in a
//! file of such lines (`#` comments allowed, the format `age-keygen` writes). Key material never
//! appears in a message or a `Debug` output: only recipients (public) and file names.
//!
//! Pure but for [`Recipients::load`] and [`DecryptionKeys::load`], which read key files, and
//! [`open_payload`], which may write the plaintext to an unnamed temporary file.

use std::fmt;
use std::io::{BufReader, Read, Write};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use age::secrecy::ExposeSecret;

use super::signature::{DECRYPTION_KEY_FLAG, ENCRYPT_TO_FLAG, Takes, key_error, key_files};
use super::spill::{Payload, SpillWriter};
use super::{Encryption, Manifest, Withheld};
use crate::Error;

/// The one scheme: age, X25519 recipients.
pub const SCHEME: &str = "age-x25519";
/// How a recipient (a public key) starts.
pub const RECIPIENT_PREFIX: &str = "age1";
/// How a private key starts.
pub const IDENTITY_PREFIX: &str = "AGE-SECRET-KEY-1";

/// The public keys a backup encrypts to.
#[derive(Clone)]
pub struct Recipients {
    keys: Vec<age::x25519::Recipient>,
}

impl fmt::Debug for Recipients {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.to_strings()).finish()
    }
}

impl Recipients {
    /// The recipients of each `--encrypt-to`: an `age1…` recipient itself, a file of them (one
    /// a line, `#` comments), or a directory whose files (not those starting with `.`, as in a
    /// mounted ConfigMap) hold them. `None` when `specs` is empty: payloads are not encrypted.
    pub fn load(specs: &[String]) -> Result<Option<Recipients>, Error> {
        let mut keys: Vec<age::x25519::Recipient> = Vec::new();
        for spec in specs.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            if spec.starts_with(RECIPIENT_PREFIX) {
                keys.push(parse_recipient(ENCRYPT_TO_FLAG, spec)?);
                continue;
            }
            for (source, text) in key_files(ENCRYPT_TO_FLAG, spec, Takes::Public)? {
                keys.extend(Self::parse_all(&source, &text)?);
            }
        }
        keys.sort_by_key(|k| k.to_string());
        keys.dedup_by_key(|k| k.to_string());
        Ok((!keys.is_empty()).then_some(Recipients { keys }))
    }

    /// Every recipient in `text`: `age1…` lines; blank lines and `#` comments are ignored.
    /// `source` names where it came from in errors.
    pub fn parse_all(source: &str, text: &str) -> Result<Vec<age::x25519::Recipient>, Error> {
        let mut keys = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            if line.starts_with(IDENTITY_PREFIX) {
                return Err(key_error(source, "holds a private key; --encrypt-to takes public keys (age1…)".into()));
            }
            keys.push(parse_recipient(source, line)?);
        }
        if keys.is_empty() {
            return Err(key_error(source, "holds no recipient (age1…)".into()));
        }
        Ok(keys)
    }

    /// The recipients as `age1…` strings, sorted.
    pub fn to_strings(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.to_string()).collect()
    }

    /// The manifest's `encryption` section for a payload encrypted to these recipients.
    pub fn encryption(&self) -> Encryption {
        Encryption { scheme: SCHEME.into(), recipients: self.to_strings(), withheld: Withheld::default() }
    }

    /// An age stream to these recipients whose ciphertext is taken out as it is produced.
    pub(crate) fn sealer(&self) -> std::io::Result<Sealer> {
        let encryptor = age::Encryptor::with_recipients(self.keys.iter().map(|k| k as &dyn age::Recipient))
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let out = Shared::default();
        let writer = encryptor.wrap_output(out.clone())?;
        Ok(Sealer { writer, out })
    }
}

fn parse_recipient(source: &str, text: &str) -> Result<age::x25519::Recipient, Error> {
    age::x25519::Recipient::from_str(text).map_err(|_| {
        key_error(source, "not a recipient: expected age1… (an X25519 public key of the age format)".into())
    })
}

/// A buffer the age writer writes into while the encoder takes the ciphertext out.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Shared {
    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Encrypts a payload as it is written: plaintext in, ciphertext out, in order.
pub(crate) struct Sealer {
    writer: age::stream::StreamWriter<Shared>,
    out: Shared,
}

impl Sealer {
    /// Encrypts `plain`; the ciphertext produced so far (age encrypts in 64 KiB chunks).
    pub(crate) fn seal(&mut self, plain: &[u8]) -> std::io::Result<Vec<u8>> {
        self.writer.write_all(plain)?;
        Ok(self.out.take())
    }

    /// Ends the stream: the last ciphertext.
    pub(crate) fn finish(self) -> std::io::Result<Vec<u8>> {
        self.writer.finish()?;
        Ok(self.out.take())
    }
}

/// The private keys a reader decrypts with.
pub struct DecryptionKeys {
    keys: Vec<age::x25519::Identity>,
}

impl fmt::Debug for DecryptionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DecryptionKeys({})", self.recipients().join(", "))
    }
}

impl DecryptionKeys {
    /// The keys in each `--decryption-key` file, or in the files of a directory (not those
    /// starting with `.`, as in a mounted Secret). `None` when `paths` is empty. Errors name
    /// the file, never its content.
    pub fn load(paths: &[PathBuf]) -> Result<Option<DecryptionKeys>, Error> {
        let mut keys = Vec::new();
        for path in paths.iter().filter(|p| !p.as_os_str().is_empty()) {
            for (source, text) in key_files(DECRYPTION_KEY_FLAG, &path.to_string_lossy(), Takes::Private)? {
                keys.extend(Self::parse_all(&source, &text)?.keys);
            }
        }
        Ok((!keys.is_empty()).then_some(DecryptionKeys { keys }))
    }

    /// Every private key in `text`: `AGE-SECRET-KEY-1…` lines; blank lines and `#` comments
    /// (such as `# public key: age1…`) are ignored.
    pub fn parse_all(source: &str, text: &str) -> Result<DecryptionKeys, Error> {
        let mut keys = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            if line.starts_with(RECIPIENT_PREFIX) {
                return Err(key_error(source, "holds a recipient (age1…), not a private key".into()));
            }
            let key = age::x25519::Identity::from_str(line).map_err(|_| {
                key_error(source, format!("not a private key: expected {IDENTITY_PREFIX}… (age format, X25519)"))
            })?;
            keys.push(key);
        }
        if keys.is_empty() {
            return Err(key_error(source, format!("holds no private key ({IDENTITY_PREFIX}…)")));
        }
        Ok(DecryptionKeys { keys })
    }

    /// A new key pair: the key file's text (age-keygen's format) and its recipient.
    pub fn generate(created: jiff::Timestamp) -> (String, String) {
        let key = age::x25519::Identity::generate();
        let recipient = key.to_public().to_string();
        let secret = key.to_string();
        let text = format!("# created: {created}\n# public key: {recipient}\n{}\n", secret.expose_secret());
        (text, recipient)
    }

    /// The recipients (public keys) of these keys, for messages.
    pub fn recipients(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.to_public().to_string()).collect()
    }
}

/// The error for an encrypted snapshot read without a key.
pub(crate) fn encrypted_error(manifest: &Manifest, encryption: &Encryption) -> Error {
    Error::Encrypted { snapshot: manifest.snapshot_id.to_string(), recipients: encryption.recipients_text() }
}

/// The payload as records are read from it: `stored` itself for a plain snapshot; for an
/// encrypted one, the stored bytes are checked against the manifest (size and sha256) first,
/// then decrypted with `keys` into memory, or into the temporary file `spill` gives (the
/// plaintext is never longer than the ciphertext). Refused, naming the snapshot and its
/// recipients, without keys, with keys none of which is a recipient, or for another scheme.
pub fn open_payload(
    manifest: &Manifest,
    stored: Payload,
    keys: Option<&DecryptionKeys>,
    spill: Option<SpillWriter>,
) -> Result<Payload, Error> {
    let Some(encryption) = &manifest.encryption else { return Ok(stored) };
    let id = manifest.snapshot_id.as_str();
    if encryption.scheme != SCHEME {
        let reason =
            format!("encrypted with scheme {:?}, which this restatus does not read ({SCHEME})", encryption.scheme);
        return Err(Error::Undecryptable { snapshot: id.to_string(), reason });
    }
    let Some(keys) = keys else { return Err(encrypted_error(manifest, encryption)) };
    stored.verify(manifest)?;
    let corrupt = |e: &dyn fmt::Display| Error::corrupt(id, format!("payload does not decrypt: {e}"));
    let reader = BufReader::with_capacity(64 << 10, PayloadReader { payload: &stored, at: 0 });
    let decryptor = age::Decryptor::new_buffered(reader).map_err(|e| corrupt(&e))?;
    let identities = keys.keys.iter().map(|k| k as &dyn age::Identity);
    let mut plain = match decryptor.decrypt(identities) {
        Ok(plain) => plain,
        Err(age::DecryptError::NoMatchingKeys) => {
            let reason = format!(
                "none of the decryption keys (of {}) is one of its recipients ({})",
                keys.recipients().join(", "),
                encryption.recipients_text()
            );
            return Err(Error::Undecryptable { snapshot: id.to_string(), reason });
        }
        Err(e) => return Err(corrupt(&e)),
    };
    let spill_error = |e| Error::io(format!("spill decrypted payload of snapshot {id}"), e);
    let mut sink = match spill {
        Some(spill) => Sink::Spill(spill),
        None => Sink::Memory(Vec::new()),
    };
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0u64;
    loop {
        let n = match plain.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(corrupt(&e)),
        };
        total += n as u64;
        if total > stored.len() {
            return Err(corrupt(&"more plaintext than ciphertext"));
        }
        match &mut sink {
            Sink::Memory(memory) => memory.extend_from_slice(&buf[..n]),
            Sink::Spill(spill) => spill.write(&buf[..n]).map_err(spill_error)?,
        }
    }
    let plain = match sink {
        Sink::Memory(memory) => Payload::from(memory),
        Sink::Spill(spill) => spill.finish().map_err(spill_error)?,
    };
    Ok(Payload::Decrypted(Box::new(plain)))
}

/// Where a decrypted payload goes.
enum Sink {
    Memory(Vec<u8>),
    Spill(SpillWriter),
}

/// Reads a payload from the start, in order.
struct PayloadReader<'a> {
    payload: &'a Payload,
    at: u64,
}

impl Read for PayloadReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let bytes = self.payload.read(self.at..self.at.saturating_add(buf.len() as u64))?;
        buf[..bytes.len()].copy_from_slice(&bytes);
        self.at += bytes.len() as u64;
        Ok(bytes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, record, ts, uuid};
    use crate::format::{
        CaptureSummary, KeyConflict, ObjectRef, PayloadEncoder, Record, Records, Skipped, SnapshotId, decode_records,
    };
    use serde_json::json;
    use sha2::Digest;

    const SERIAL: &str = "SRV0DDC0FFE";
    const MAC: &str = "aa:bb:cc:12:34:56";

    /// A key pair: its private key file's text, its recipient.
    fn pair() -> (DecryptionKeys, String) {
        let (text, recipient) = DecryptionKeys::generate(ts(fixtures::SNAPSHOT_TIME));
        (DecryptionKeys::parse_all("test.agekey", &text).unwrap(), recipient)
    }

    fn recipients(of: &[&str]) -> Recipients {
        Recipients::load(&of.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap().expect("recipients")
    }

    /// `n` Servers, the first with [`SERIAL`] and [`MAC`] in its status.
    fn records(n: usize) -> Vec<Record> {
        (0..n)
            .map(|i| {
                let nics: Vec<_> =
                    (0..4).map(|j| json!({"name": format!("eth{j}"), "mac": format!("{i:06x}{j:02x}")})).collect();
                let status = match i {
                    0 => json!({"state": "Reserved", "serialNumber": SERIAL, "nics": [{"macAddress": MAC}]}),
                    _ => json!({"state": "Reserved", "serialNumber": format!("SRV{i:08X}"), "nics": nics}),
                };
                record("Server", &format!("s{i}"), &[uuid(&format!("u{i}"))], status)
            })
            .collect()
    }

    /// `records` as a backup writes them (encrypted to `to`), with their manifest.
    fn written(records: &[Record], to: Option<&Recipients>, capture: CaptureSummary) -> (Manifest, Vec<u8>) {
        let (payload, summary) = PayloadEncoder::encode_all(3, to, records).unwrap();
        let at = ts(fixtures::SNAPSHOT_TIME);
        let manifest = Manifest::new("c", SnapshotId::new(at), at, "metal-operator", capture, summary);
        (manifest, payload)
    }

    /// The bytes, and what they decompress to when they are zstd at all: what a reader of the
    /// bucket without a key can see.
    fn readable(bytes: &[u8]) -> Vec<u8> {
        let mut out = bytes.to_vec();
        if let Ok(plain) = zstd::decode_all(bytes) {
            out.extend(plain);
        }
        out
    }

    fn contains(haystack: &[u8], needle: &str) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
    }

    fn names(manifest: &Manifest, payload: Payload) -> Vec<String> {
        let mut names = vec![];
        decode_records(manifest, payload, |r| {
            names.push(r.name);
            Ok(())
        })
        .unwrap();
        names
    }

    #[test]
    fn an_encrypted_payload_holds_no_readable_status_and_decrypts_with_the_key() {
        let (key, recipient) = pair();
        let records = records(3000);
        let (plain_manifest, plain) = written(&records, None, CaptureSummary::empty());
        assert!(
            contains(&readable(&plain), SERIAL) && contains(&readable(&plain), MAC),
            "the plain payload shows them"
        );

        let (manifest, sealed) = written(&records, Some(&recipients(&[&recipient])), CaptureSummary::empty());
        assert!(!contains(&readable(&sealed), SERIAL) && !contains(&readable(&sealed), MAC), "ciphertext shows them");
        assert!(!contains(&sealed, "Reserved") && !contains(&sealed, r#""name":"s1"#), "no status, no name");
        assert!(contains(&readable(&plain), r#""name":"s1"#), "the plain payload names them");
        assert!(!contains(&manifest.to_json(), SERIAL) && !contains(&manifest.to_json(), "\"s0\""));
        let encryption = manifest.encryption.clone().expect("an encryption section");
        assert_eq!((encryption.scheme.as_str(), encryption.recipients.clone()), (SCHEME, vec![recipient]));
        // The manifest's payload section is the ciphertext's: checkable without a key.
        assert_eq!(manifest.payload.size, sealed.len() as u64);
        assert_eq!(manifest.payload.sha256, hex::encode(sha2::Sha256::digest(&sealed)));
        assert_eq!(manifest.payload.records, 3000);
        assert_eq!(manifest.payload.uncompressed_size, plain_manifest.payload.uncompressed_size);
        assert_eq!(manifest.format_version.to_string(), "1.5");
        Payload::from(sealed.clone()).verify(&manifest).unwrap();

        // In memory and spilled, the records come back in order, statuses intact.
        let opened = open_payload(&manifest, Payload::from(sealed.clone()), Some(&key), None).unwrap();
        assert!(opened.is_decrypted());
        assert_eq!(names(&manifest, opened.clone()), records.iter().map(|r| r.name.clone()).collect::<Vec<_>>());
        let spill = SpillWriter::create(None).unwrap();
        let spilled = open_payload(&manifest, Payload::from(sealed), Some(&key), Some(spill)).unwrap();
        let Payload::Decrypted(inner) = &spilled else { panic!("decrypted") };
        assert!(matches!(**inner, Payload::Spilled(_)), "spilled when asked to");
        let decoded = Records::decode(&manifest, spilled).unwrap();
        assert_eq!(decoded.len(), 3000);
        assert_eq!(decoded.status(0).unwrap().get(), records[0].status.get());
        assert_eq!(decoded.status(2999).unwrap().get(), records[2999].status.get());
        // A plain payload is left as it is.
        assert!(!open_payload(&plain_manifest, Payload::from(plain), Some(&key), None).unwrap().is_decrypted());
    }

    #[test]
    fn any_one_recipient_decrypts_and_an_empty_payload_round_trips() {
        let ((a, ra), (b, rb)) = (pair(), pair());
        let (manifest, sealed) = written(&records(2), Some(&recipients(&[&ra, &rb])), CaptureSummary::empty());
        assert_eq!(manifest.encryption.as_ref().unwrap().recipients.len(), 2);
        for key in [&a, &b] {
            let opened = open_payload(&manifest, Payload::from(sealed.clone()), Some(key), None).unwrap();
            assert_eq!(names(&manifest, opened), ["s0", "s1"]);
        }
        let (manifest, sealed) = written(&[], Some(&recipients(&[&ra])), CaptureSummary::empty());
        let opened = open_payload(&manifest, Payload::from(sealed), Some(&a), None).unwrap();
        assert!(names(&manifest, opened).is_empty());
    }

    #[test]
    fn without_a_key_or_with_another_the_snapshot_is_refused_by_name() {
        let ((_, recipient), (other, other_recipient)) = (pair(), pair());
        let (manifest, sealed) = written(&records(5), Some(&recipients(&[&recipient])), CaptureSummary::empty());
        let id = manifest.snapshot_id.to_string();
        let err = open_payload(&manifest, Payload::from(sealed.clone()), None, None).unwrap_err();
        assert!(matches!(err, Error::Encrypted { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(&id) && text.contains(&recipient) && text.contains("--decryption-key"), "{text}");
        // Decoding the stored bytes as if plain says the same, not "not zstd".
        let err = Records::decode(&manifest, sealed.clone()).unwrap_err().to_string();
        assert!(err.contains("is encrypted to") && err.contains(&id), "{err}");

        let err = open_payload(&manifest, Payload::from(sealed), Some(&other), None).unwrap_err();
        assert!(matches!(err, Error::Undecryptable { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("snapshot {id}: payload does not decrypt: none of the decryption keys"))
                && text.contains(&other_recipient)
                && text.contains(&recipient),
            "{text}"
        );
        assert!(!text.contains(IDENTITY_PREFIX), "key material in {text}");
    }

    #[test]
    fn truncated_or_tampered_ciphertext_is_caught_by_the_checksum_before_decrypting() {
        let (key, recipient) = pair();
        let (manifest, sealed) = written(&records(50), Some(&recipients(&[&recipient])), CaptureSummary::empty());
        let err = open_payload(&manifest, Payload::from(sealed[..sealed.len() - 1].to_vec()), Some(&key), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("truncated or replaced"), "{err}");
        let mut tampered = sealed.clone();
        let at = tampered.len() / 2;
        tampered[at] ^= 1;
        let err = open_payload(&manifest, Payload::from(tampered.clone()), Some(&key), None).unwrap_err().to_string();
        assert!(err.contains("payload sha256 is"), "the checksum, before any decryption: {err}");
        // Tampered with the manifest rewritten to match: age's authentication refuses it.
        let mut rewritten = manifest.clone();
        rewritten.payload.sha256 = hex::encode(sha2::Sha256::digest(&tampered));
        let err = open_payload(&rewritten, Payload::from(tampered), Some(&key), None).unwrap_err();
        assert!(matches!(err, Error::CorruptSnapshot { .. }) && err.to_string().contains("does not decrypt"), "{err}");
        // Another scheme is refused by name.
        let mut other = manifest.clone();
        other.encryption.as_mut().unwrap().scheme = "age-mlkem".into();
        let err = open_payload(&other, Payload::from(sealed), Some(&key), None).unwrap_err().to_string();
        assert!(err.contains("scheme \"age-mlkem\""), "{err}");
    }

    #[test]
    fn an_encrypted_manifest_withholds_what_names_objects_and_counts_it() {
        let (_, recipient) = pair();
        let mut capture = CaptureSummary::empty();
        let object = ObjectRef { kind: "Server".into(), namespace: None, name: "s0".into() };
        capture.skipped = vec![Skipped {
            kind: "Server".into(),
            namespace: None,
            name: Some("skipped-server".into()),
            reason: "no status".into(),
        }];
        capture.conflicts = vec![KeyConflict {
            kind: "Server".into(),
            key: format!("status.serialNumber={SERIAL}"),
            objects: vec![object.clone(), object.clone()],
        }];
        capture.consistency.consistent = false;
        capture.consistency.reason_count = 1;
        capture.consistency.reasons = vec![crate::format::Inconsistency { object, reason: format!("MAC {MAC}") }];
        let (plain, _) = written(&records(1), None, capture.clone());
        assert!(contains(&plain.to_json(), SERIAL), "a plain manifest lists them");
        assert_eq!((plain.skipped_count(), plain.conflict_count()), (1, 1));
        let (manifest, _) = written(&records(1), Some(&recipients(&[&recipient])), capture);
        let json = manifest.to_json();
        assert!(!contains(&json, SERIAL) && !contains(&json, MAC) && !contains(&json, "skipped-server"), "{json:?}");
        let withheld = &manifest.encryption.as_ref().unwrap().withheld;
        assert_eq!(*withheld, Withheld { skipped: 1, conflicts: 1, reasons: 1 });
        assert_eq!((manifest.skipped_count(), manifest.conflict_count()), (1, 1));
        let consistency = manifest.consistency.as_ref().unwrap();
        assert!(!manifest.is_consistent() && consistency.reason_count == 1, "the verdict stays");
        // And it reads back as it was written.
        assert_eq!(Manifest::from_json("x", &json).unwrap(), manifest);
    }

    #[test]
    fn bad_key_files_name_the_file_and_never_their_content() {
        let dir = tempfile::tempdir().unwrap();
        let (text, recipient) = DecryptionKeys::generate(ts(fixtures::SNAPSHOT_TIME));
        let secret = text.lines().find(|l| l.starts_with(IDENTITY_PREFIX)).unwrap().to_string();
        let write = |name: &str, content: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, content).unwrap();
            path
        };
        let good = write("good.agekey", &text);
        let keys = DecryptionKeys::load(std::slice::from_ref(&good)).unwrap().expect("keys");
        assert_eq!(keys.recipients(), std::slice::from_ref(&recipient));
        assert!(!format!("{keys:?}").contains(IDENTITY_PREFIX), "no key material in Debug");
        for (name, content, expected) in [
            ("garbage.agekey", "AGE-SECRET-KEY-1NOTAKEY\n", "not a private key"),
            ("public.agekey", &format!("{recipient}\n") as &str, "holds a recipient"),
            ("empty.agekey", "# nothing\n", "holds no private key"),
        ] {
            let path = write(name, content);
            let err = DecryptionKeys::load(std::slice::from_ref(&path)).unwrap_err().to_string();
            assert!(err.starts_with(&format!("key {}: ", path.display())) && err.contains(expected), "{err}");
            assert!(!err.contains("NOTAKEY"), "content in {err}");
        }
        let err = DecryptionKeys::load(&[dir.path().join("missing.agekey")]).unwrap_err().to_string();
        assert!(err.contains("missing.agekey: cannot read"), "{err}");

        let private = write("private.recipient", &text);
        let err = Recipients::load(&[private.display().to_string()]).unwrap_err().to_string();
        assert!(err.contains("private.recipient") && err.contains("holds a private key"), "{err}");
        assert!(!err.contains(&secret), "key material in {err}");
        let err = Recipients::load(&["age1notarecipient".into()]).unwrap_err().to_string();
        assert!(err.starts_with("key --encrypt-to (RESTATUS_ENCRYPT_TO): not a recipient"), "{err}");
        let garbage = write("garbage.recipient", "hello\n");
        let err = Recipients::load(&[garbage.display().to_string()]).unwrap_err().to_string();
        assert!(err.contains("garbage.recipient: not a recipient") && !err.contains("hello"), "{err}");
        assert!(Recipients::load(&[]).unwrap().is_none(), "no recipients: plain payloads");
    }

    #[test]
    fn recipients_come_from_flags_files_and_directories() {
        let dir = tempfile::tempdir().unwrap();
        let ((_, a), (_, b), (_, c)) = (pair(), pair(), pair());
        std::fs::write(dir.path().join("a.recipient"), format!("# the restore side\n{a}\n")).unwrap();
        std::fs::write(dir.path().join("b.recipient"), format!("{b}\n{a}\n")).unwrap();
        std::fs::write(dir.path().join("..data"), "ignored, as in a mounted ConfigMap").unwrap();
        let loaded = recipients(&[&dir.path().display().to_string(), &c]);
        let mut expected = vec![a, b, c];
        expected.sort();
        assert_eq!(loaded.to_strings(), expected, "sorted, each once");
    }
}
