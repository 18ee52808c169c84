//! Signed snapshots (format 1.4): a backup signs the exact bytes of its manifest with an
//! Ed25519 key; a reader given trusted public keys accepts a snapshot only with a good
//! signature by one of them.
//!
//! The signature is a small JSON object beside the manifest (`manifest.json.sig`), written
//! before it: by the time a snapshot exists for readers its signature does too. It names the
//! key that signed (its [`KeyId`], which the manifest's `signedBy` repeats) and signs
//! [`SIGNED_CONTEXT`] followed by the manifest's bytes as stored, so no canonical form is
//! needed and a signature made for anything else is never a manifest's.
//!
//! Keys: the private key is PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`, what
//! `openssl genpkey -algorithm ed25519` writes); a public key is SPKI PEM
//! (`-----BEGIN PUBLIC KEY-----`) or the short form `ed25519:<base64 of its 32 bytes>`.
//! Key material never appears in a message or a `Debug` output: only key ids and file names.
//!
//! Pure but for [`SigningKey::load`] and [`TrustedKeys::load`], which read key files (as
//! `Profile::load` reads a profile file).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::Signer;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Error;

/// The object beside a signed snapshot's manifest.
pub const SIGNATURE_FILE: &str = "manifest.json.sig";
/// No signature object is larger (one is about 150 bytes).
pub const MAX_SIGNATURE: u64 = 4096;
/// What is signed: these bytes, then the manifest's bytes as stored.
pub const SIGNED_CONTEXT: &[u8] = b"restatus snapshot manifest v1\n";
/// What a journal segment's signature signs: these bytes, then the segment header's bytes as
/// stored. Another context than a manifest's: a segment's signature is never a manifest's.
pub const SEGMENT_SIGNED_CONTEXT: &[u8] = b"restatus journal segment v1\n";
/// The prefix of the short form of a public key.
pub const SHORT_PREFIX: &str = "ed25519:";
const ALGORITHM: &str = "ed25519";

/// A public key's id: the first 8 bytes of the sha256 of its 32 bytes, in hex.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct KeyId(String);

impl KeyId {
    fn of(key: &ed25519_dalek::VerifyingKey) -> KeyId {
        KeyId(hex::encode(&Sha256::digest(key.as_bytes())[..8]))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The private key a backup signs with.
pub struct SigningKey {
    key: ed25519_dalek::SigningKey,
    id: KeyId,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({})", self.id)
    }
}

impl SigningKey {
    /// A new key from the system's random source.
    pub fn generate() -> SigningKey {
        let seed: [u8; 32] = rand::random();
        Self::from_dalek(ed25519_dalek::SigningKey::from_bytes(&seed))
    }

    fn from_dalek(key: ed25519_dalek::SigningKey) -> SigningKey {
        let id = KeyId::of(&key.verifying_key());
        SigningKey { key, id }
    }

    /// Reads a PKCS#8 PEM private key from `path`. Errors name the file, never its content.
    pub fn load(path: &Path) -> Result<SigningKey, Error> {
        let mut files = key_files(SIGNING_KEY_FLAG, &path.to_string_lossy(), Takes::Private)?;
        match (files.pop(), files.is_empty()) {
            (Some((source, text)), true) => Self::from_pem(&source, &text),
            _ => Err(key_error(path.display(), "a directory: --signing-key takes one key file".into())),
        }
    }

    /// Parses a PKCS#8 PEM private key; `source` names where it came from in errors.
    pub fn from_pem(source: &str, pem: &str) -> Result<SigningKey, Error> {
        ed25519_dalek::SigningKey::from_pkcs8_pem(pem.trim()).map(Self::from_dalek).map_err(|_| {
            key_error(source, "not an Ed25519 private key in PKCS#8 PEM (-----BEGIN PRIVATE KEY-----)".to_string())
        })
    }

    /// The private key as PKCS#8 PEM, for `restatus keys generate`.
    pub fn to_pem(&self) -> Result<String, Error> {
        let pem = self.key.to_pkcs8_pem(LineEnding::LF).map_err(|e| key_error("new key", e.to_string()))?;
        Ok(pem.as_str().to_string())
    }

    pub fn id(&self) -> &KeyId {
        &self.id
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey { key: self.key.verifying_key(), id: self.id.clone() }
    }

    /// The signature object for a manifest whose stored bytes are `manifest` (which must
    /// name this key in `signedBy`).
    pub fn sign(&self, manifest: &[u8]) -> Vec<u8> {
        self.sign_in(SIGNED_CONTEXT, manifest)
    }

    /// The signature object for a journal segment header whose stored bytes are `header`
    /// (which must name this key in `signedBy`).
    pub fn sign_segment(&self, header: &[u8]) -> Vec<u8> {
        self.sign_in(SEGMENT_SIGNED_CONTEXT, header)
    }

    fn sign_in(&self, context: &[u8], bytes: &[u8]) -> Vec<u8> {
        let signature = self.key.sign(&[context, bytes].concat());
        let file = SignatureFile {
            algorithm: ALGORITHM.into(),
            key_id: self.id.clone(),
            signature: BASE64.encode(signature.to_bytes()),
        };
        // Plain data: serialising it cannot fail.
        serde_json::to_vec(&file).expect("signature serialises")
    }
}

/// A public key a reader trusts.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    key: ed25519_dalek::VerifyingKey,
    id: KeyId,
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.id)
    }
}

impl PublicKey {
    pub fn id(&self) -> &KeyId {
        &self.id
    }

    /// `ed25519:<base64>`: one line, for flags, environment and chart values.
    pub fn to_short(&self) -> String {
        format!("{SHORT_PREFIX}{}", BASE64.encode(self.key.as_bytes()))
    }

    /// SPKI PEM (`-----BEGIN PUBLIC KEY-----`).
    pub fn to_pem(&self) -> Result<String, Error> {
        self.key.to_public_key_pem(LineEnding::LF).map_err(|e| key_error(&self.id, e.to_string()))
    }

    /// Every public key in `text`: SPKI PEM blocks and `ed25519:` lines (blank lines and
    /// lines starting with `#` are ignored). `source` names where it came from in errors.
    pub fn parse_all(source: &str, text: &str) -> Result<Vec<PublicKey>, Error> {
        let mut keys = Vec::new();
        let mut block: Option<String> = None;
        for line in text.lines().map(str::trim) {
            if let Some(pem) = block.as_mut() {
                pem.push_str(line);
                pem.push('\n');
                if line.starts_with("-----END ") {
                    keys.push(Self::from_pem(source, pem)?);
                    block = None;
                }
            } else if line.starts_with("-----BEGIN ") {
                if line != "-----BEGIN PUBLIC KEY-----" {
                    return Err(key_error(source, format!("holds a {line} block, not a public key")));
                }
                block = Some(format!("{line}\n"));
            } else if line.is_empty() || line.starts_with('#') {
                continue;
            } else {
                keys.push(Self::from_short(source, line)?);
            }
        }
        if block.is_some() {
            return Err(key_error(source, "a PEM block without its END line".to_string()));
        }
        if keys.is_empty() {
            return Err(key_error(source, "holds no public key".to_string()));
        }
        Ok(keys)
    }

    fn from_pem(source: &str, pem: &str) -> Result<PublicKey, Error> {
        ed25519_dalek::VerifyingKey::from_public_key_pem(pem)
            .map(Self::from_dalek)
            .map_err(|_| key_error(source, "a PUBLIC KEY block that is not an Ed25519 public key".to_string()))
    }

    /// `ed25519:<base64 of 32 bytes>`.
    pub fn from_short(source: &str, text: &str) -> Result<PublicKey, Error> {
        let bad = || key_error(source, format!("not a public key: expected {SHORT_PREFIX}<base64 of 32 bytes>"));
        let encoded = text.trim().strip_prefix(SHORT_PREFIX).ok_or_else(bad)?;
        let bytes: [u8; 32] = BASE64.decode(encoded).ok().and_then(|b| b.try_into().ok()).ok_or_else(bad)?;
        ed25519_dalek::VerifyingKey::from_bytes(&bytes).map(Self::from_dalek).map_err(|_| bad())
    }

    fn from_dalek(key: ed25519_dalek::VerifyingKey) -> PublicKey {
        PublicKey { id: KeyId::of(&key), key }
    }
}

/// The public keys a reader accepts signatures of; several at once, so keys can be rotated.
#[derive(Clone, PartialEq, Eq)]
pub struct TrustedKeys {
    keys: BTreeMap<KeyId, PublicKey>,
}

impl fmt::Debug for TrustedKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.keys.keys()).finish()
    }
}

impl TrustedKeys {
    pub fn new(keys: impl IntoIterator<Item = PublicKey>) -> TrustedKeys {
        TrustedKeys { keys: keys.into_iter().map(|k| (k.id.clone(), k)).collect() }
    }

    /// The keys of each `--trusted-key`: an `ed25519:` key itself, a file of keys, or a
    /// directory whose files (not those starting with `.`, as in a mounted ConfigMap) hold
    /// keys. `None` when `specs` is empty: no verification.
    pub fn load(specs: &[String]) -> Result<Option<TrustedKeys>, Error> {
        let mut keys = Vec::new();
        for spec in specs.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            if spec.starts_with(SHORT_PREFIX) {
                keys.push(PublicKey::from_short(TRUSTED_KEY_FLAG, spec)?);
                continue;
            }
            for (source, text) in key_files(TRUSTED_KEY_FLAG, spec, Takes::Public)? {
                keys.extend(PublicKey::parse_all(&source, &text)?);
            }
        }
        Ok((!keys.is_empty()).then(|| TrustedKeys::new(keys)))
    }

    pub fn ids(&self) -> impl Iterator<Item = &KeyId> {
        self.keys.keys()
    }

    /// These keys and `key`.
    pub fn and(&self, key: PublicKey) -> TrustedKeys {
        TrustedKeys::new(self.keys.values().cloned().chain(std::iter::once(key)))
    }

    /// Checks the signature of snapshot `snapshot`: `manifest` its manifest's bytes as stored,
    /// `signed_by` what the manifest says, `signature` the signature object, if there is one.
    /// The key that signed it, or why the snapshot is refused.
    pub fn verify(
        &self,
        snapshot: &str,
        manifest: &[u8],
        signed_by: Option<&KeyId>,
        signature: Option<&[u8]>,
    ) -> Result<KeyId, Error> {
        self.verify_in(SIGNED_CONTEXT, snapshot, manifest, signed_by, signature)
    }

    /// Checks the signature of a journal segment header (`header` its bytes as stored, signed
    /// in [`SEGMENT_SIGNED_CONTEXT`]); `what` names the segment in errors.
    pub fn verify_segment(
        &self,
        what: &str,
        header: &[u8],
        signed_by: Option<&KeyId>,
        signature: Option<&[u8]>,
    ) -> Result<KeyId, Error> {
        self.verify_in(SEGMENT_SIGNED_CONTEXT, what, header, signed_by, signature)
    }

    fn verify_in(
        &self,
        context: &[u8],
        snapshot: &str,
        manifest: &[u8],
        signed_by: Option<&KeyId>,
        signature: Option<&[u8]>,
    ) -> Result<KeyId, Error> {
        let refuse = |reason: String| Error::BadSignature { snapshot: snapshot.to_string(), reason };
        let Some(signature) = signature else {
            return Err(match signed_by {
                None => Error::Unsigned { snapshot: snapshot.to_string() },
                Some(key) => refuse(format!("the manifest says key {key} signed it, but it has no {SIGNATURE_FILE}")),
            });
        };
        let file: SignatureFile = serde_json::from_slice(signature)
            .map_err(|e| refuse(format!("{SIGNATURE_FILE} is not a signature object: {e}")))?;
        if file.algorithm != ALGORITHM {
            return Err(refuse(format!("{SIGNATURE_FILE} uses algorithm {:?}, not {ALGORITHM}", file.algorithm)));
        }
        if signed_by != Some(&file.key_id) {
            let says = signed_by.map_or_else(|| "it is unsigned".to_string(), |k| format!("key {k} signed it"));
            return Err(refuse(format!(
                "the signature is by key {}, but the manifest says {says} (a signature of another manifest)",
                file.key_id
            )));
        }
        let Some(key) = self.keys.get(&file.key_id) else {
            let trusted: Vec<&str> = self.keys.keys().map(KeyId::as_str).collect();
            return Err(refuse(format!(
                "signed by key {}, which is not a trusted key (trusted: {})",
                file.key_id,
                trusted.join(", ")
            )));
        };
        let bytes: [u8; 64] = BASE64
            .decode(&file.signature)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| refuse(format!("the signature of key {} is not 64 bytes of base64", file.key_id)))?;
        let signature = ed25519_dalek::Signature::from_bytes(&bytes);
        key.key.verify_strict(&[context, manifest].concat(), &signature).map_err(|_| {
            refuse(format!(
                "the signature of key {} does not match the manifest (changed after it was signed, or the \
                 signature of another manifest)",
                file.key_id
            ))
        })?;
        Ok(file.key_id)
    }
}

/// `manifest.json.sig`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SignatureFile {
    algorithm: String,
    key_id: KeyId,
    /// base64 of the 64-byte Ed25519 signature of [`SIGNED_CONTEXT`] + the manifest's bytes.
    signature: String,
}

/// The key flags, as errors name them (with the environment variable that sets each): a flag's
/// value is never repeated in an error, since it may be a key given where a path is expected.
pub const SIGNING_KEY_FLAG: &str = "--signing-key (RESTATUS_SIGNING_KEY)";
pub const TRUSTED_KEY_FLAG: &str = "--trusted-key (RESTATUS_TRUSTED_KEYS)";
pub const DECRYPTION_KEY_FLAG: &str = "--decryption-key (RESTATUS_DECRYPTION_KEY)";
pub const ENCRYPT_TO_FLAG: &str = "--encrypt-to (RESTATUS_ENCRYPT_TO)";

/// What a key flag takes where it takes a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Takes {
    /// Files of private keys (`--signing-key`, `--decryption-key`).
    Private,
    /// Files of public keys (`--trusted-key`, `--encrypt-to`).
    Public,
}

/// What a value given where a path is expected visibly is, if it is key material: `None` for
/// anything that may be a path.
fn key_material(value: &str) -> Option<(&'static str, bool)> {
    const PRIVATE: bool = true;
    if value.contains("AGE-SECRET-KEY-") {
        Some(("an age private key (AGE-SECRET-KEY-1…)", PRIVATE))
    } else if value.contains("PRIVATE KEY-----") {
        Some(("a private key in PEM (-----BEGIN PRIVATE KEY-----)", PRIVATE))
    } else if value.contains("-----BEGIN") {
        Some(("a PEM block", !PRIVATE))
    } else if value.trim_start().starts_with("age1") {
        // An age recipient (`encryption::RECIPIENT_PREFIX`; named here, since `encryption`
        // sits on this module).
        Some(("an age recipient (age1…), a public key", !PRIVATE))
    } else if value.trim_start().starts_with(SHORT_PREFIX) {
        Some(("an ed25519: public key", !PRIVATE))
    } else if value.contains('\n') {
        Some(("several lines of text", !PRIVATE))
    } else {
        None
    }
}

/// The files `value` of key flag `flag` names, with their text: the file `value`, or the files
/// of the directory `value`. A value that is neither an existing path nor visibly one (absolute,
/// `./`, `../`) is never repeated: the error names the flag and, when the value is visibly key
/// material, what it is (a private key where a public one is expected is refused as such).
pub(super) fn key_files(flag: &str, value: &str, takes: Takes) -> Result<Vec<(String, String)>, Error> {
    let path = Path::new(value);
    let material = key_material(value);
    if material.is_none() && path.exists() {
        return read_key_files(path);
    }
    let reason = match (material, takes) {
        (Some((what, true)), Takes::Public) => format!(
            "the value is {what}: this flag takes public keys, and a private key belongs only where \
             snapshots are {} (the value is not repeated here)",
            if flag == ENCRYPT_TO_FLAG { "restored" } else { "written" }
        ),
        (Some((what, true)), Takes::Private) => format!(
            "the value is {what}, not the path of a key file: put the key in a file (mode 0600, or a \
             Kubernetes Secret mounted as one) and give its path (the value is not repeated here)"
        ),
        (Some((what, false)), Takes::Private) => {
            format!("the value is {what}, not the path of a file of private keys (the value is not repeated here)")
        }
        (Some((what, false)), Takes::Public) => {
            format!("the value is {what}, which this flag takes neither inline nor as a path (not repeated here)")
        }
        // An absolute or `./` path is named (no key's text starts so: PEM's base64 of an
        // Ed25519 key starts `MC4C`, an age key `AGE-`); anything else may be a key's text.
        (None, _) if looks_like_a_path(value) => {
            let reason =
                std::fs::metadata(path).err().map_or_else(|| "cannot read".into(), |e| format!("cannot read: {e}"));
            return Err(key_error(value, reason));
        }
        (None, _) => "no file or directory at the path given (the value is not repeated here: it may be a key)".into(),
    };
    Err(key_error(flag, reason))
}

/// Whether `value` (a command-line argument, say) visibly holds a private key or key text of
/// several lines (PEM): never to be repeated in a message.
pub fn hides_a_key(value: &str) -> bool {
    key_material(value).is_some_and(|(what, private)| private || what.contains("PEM") || what.contains("lines"))
}

/// A single line that starts as an absolute or a `./`, `../` path does, without whitespace.
fn looks_like_a_path(value: &str) -> bool {
    (value.starts_with('/') || value.starts_with("./") || value.starts_with("../"))
        && !value.chars().any(char::is_whitespace)
        && value.len() <= 4096
}

/// A key spec's files with their text: `path` itself, or the files of the directory `path`.
fn read_key_files(path: &Path) -> Result<Vec<(String, String)>, Error> {
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .map(|text| (p.display().to_string(), text))
            .map_err(|e| key_error(p.display(), format!("cannot read: {e}")))
    };
    if !path.is_dir() {
        return Ok(vec![read(path)?]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| key_error(path.display(), format!("cannot read: {e}")))?;
    let mut files: Vec<_> = entries
        .filter_map(|e| e.ok())
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(key_error(path.display(), "a directory without key files".into()));
    }
    files.iter().map(|f| read(f)).collect()
}

pub(super) fn key_error(source: impl fmt::Display, reason: String) -> Error {
    Error::Key { source_name: source.to_string(), reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &[u8] = br#"{"formatVersion":"1.4","snapshotId":"a","signedBy":"x"}"#;

    fn trusted(keys: &[&SigningKey]) -> TrustedKeys {
        TrustedKeys::new(keys.iter().map(|k| k.public_key()))
    }

    fn reason(result: Result<KeyId, Error>) -> String {
        result.expect_err("refused").to_string()
    }

    #[test]
    fn a_signed_manifest_verifies_with_its_key_and_names_it() {
        let key = SigningKey::generate();
        let signature = key.sign(MANIFEST);
        let verified = trusted(&[&key]).verify("s1", MANIFEST, Some(key.id()), Some(&signature)).unwrap();
        assert_eq!(&verified, key.id());
        assert_eq!(key.id().as_str().len(), 16);
    }

    #[test]
    fn a_rotated_key_set_accepts_the_old_and_the_new_key() {
        let (old, new) = (SigningKey::generate(), SigningKey::generate());
        let keys = trusted(&[&old, &new]);
        for key in [&old, &new] {
            assert_eq!(&keys.verify("s1", MANIFEST, Some(key.id()), Some(&key.sign(MANIFEST))).unwrap(), key.id());
        }
        // Once the old key is dropped from the set, its snapshots are refused by name.
        let err = reason(trusted(&[&new]).verify("s1", MANIFEST, Some(old.id()), Some(&old.sign(MANIFEST))));
        assert!(
            err.contains(&format!("signed by key {}, which is not a trusted key (trusted: {})", old.id(), new.id())),
            "{err}"
        );
    }

    #[test]
    fn a_wrong_key_an_unsigned_manifest_and_a_stripped_signature_are_refused() {
        let (key, other) = (SigningKey::generate(), SigningKey::generate());
        let err = reason(trusted(&[&other]).verify("s1", MANIFEST, Some(key.id()), Some(&key.sign(MANIFEST))));
        assert!(err.starts_with("snapshot s1: signature refused: signed by key"), "{err}");
        let err = reason(trusted(&[&key]).verify("s1", MANIFEST, None, None));
        assert!(err.contains("snapshot s1: not signed"), "{err}");
        let err = reason(trusted(&[&key]).verify("s1", MANIFEST, Some(key.id()), None));
        assert!(err.contains(&format!("says key {} signed it, but it has no manifest.json.sig", key.id())), "{err}");
    }

    #[test]
    fn tampered_manifest_bytes_and_a_signature_of_another_manifest_are_refused() {
        let key = SigningKey::generate();
        let keys = trusted(&[&key]);
        let signature = key.sign(MANIFEST);
        let mut tampered = MANIFEST.to_vec();
        tampered[2] ^= 1;
        let err = reason(keys.verify("s1", &tampered, Some(key.id()), Some(&signature)));
        assert!(err.contains("does not match the manifest"), "{err}");
        // One more space is another manifest: the stored bytes are signed, not a parse of them.
        let respaced = [MANIFEST, b" "].concat();
        assert!(keys.verify("s1", &respaced, Some(key.id()), Some(&signature)).is_err());
        let another = key.sign(br#"{"snapshotId":"b"}"#);
        let err = reason(keys.verify("s1", MANIFEST, Some(key.id()), Some(&another)));
        assert!(err.contains("does not match the manifest"), "{err}");
        // A signature copied from a snapshot another key signed: the manifest names another key.
        let other = SigningKey::generate();
        let err = reason(trusted(&[&key, &other]).verify("s1", MANIFEST, Some(key.id()), Some(&other.sign(MANIFEST))));
        assert!(err.contains("a signature of another manifest"), "{err}");
        // Signed without the context (a signature made for something else) does not verify.
        let bare = ed25519_dalek::Signer::sign(&key.key, MANIFEST);
        let file = format!(
            r#"{{"algorithm":"ed25519","keyId":"{}","signature":"{}"}}"#,
            key.id(),
            BASE64.encode(bare.to_bytes())
        );
        assert!(keys.verify("s1", MANIFEST, Some(key.id()), Some(file.as_bytes())).is_err());
        for garbage in [&b"not json"[..], br#"{"algorithm":"rsa","keyId":"x","signature":""}"#] {
            assert!(reason(keys.verify("s1", MANIFEST, Some(key.id()), Some(garbage))).contains("signature refused"));
        }
    }

    #[test]
    fn keys_round_trip_through_pem_and_the_short_form() {
        let key = SigningKey::generate();
        let again = SigningKey::from_pem("k", &key.to_pem().unwrap()).unwrap();
        assert_eq!(again.id(), key.id());
        let public = key.public_key();
        let text =
            format!("# rotated in\n{}\n{}\n", public.to_pem().unwrap(), SigningKey::generate().public_key().to_short());
        let parsed = PublicKey::parse_all("f", &text).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0], public);
        assert_eq!(PublicKey::from_short("f", &public.to_short()).unwrap(), public);
        assert_eq!(format!("{key:?}"), format!("SigningKey({})", key.id()), "no key material in Debug");
    }

    #[test]
    fn bad_keys_name_their_source_and_never_their_content() {
        let private = SigningKey::generate().to_pem().unwrap();
        for (text, expected) in [
            ("ed25519:AAAA", "not a public key"),
            ("hello", "not a public key"),
            (private.as_str(), "not a public key"),
            ("", "holds no public key"),
            ("-----BEGIN PUBLIC KEY-----\nAAAA\n", "without its END line"),
        ] {
            let err = PublicKey::parse_all("keys.pub", text).unwrap_err().to_string();
            assert!(err.starts_with("key keys.pub: ") && err.contains(expected), "{text:?}: {err}");
            assert!(!err.contains("MC4CAQAw") && !err.contains("hello"), "content in the error: {err}");
        }
        let err = SigningKey::from_pem("signing.key", "garbage").unwrap_err().to_string();
        assert!(err.starts_with("key signing.key: not an Ed25519 private key"), "{err}");
        let err = SigningKey::load(Path::new("/nonexistent/signing.key")).unwrap_err().to_string();
        assert!(err.starts_with("key /nonexistent/signing.key: cannot read"), "{err}");
    }

    /// F150: a key given as the value of a key flag is refused naming the flag, never repeated;
    /// a private key where a public one is expected is refused as such; a path is named.
    #[test]
    fn a_key_given_where_a_path_is_expected_names_the_flag_never_the_key() {
        let pem = SigningKey::generate().to_pem().unwrap();
        let body: Vec<&str> = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let age = "AGE-SECRET-KEY-1QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQ";
        let refused = |flag: &str, value: &str, takes: Takes| key_files(flag, value, takes).unwrap_err().to_string();
        for (flag, value, takes, says) in [
            (SIGNING_KEY_FLAG, pem.as_str(), Takes::Private, "a private key in PEM"),
            (DECRYPTION_KEY_FLAG, age, Takes::Private, "an age private key"),
            (TRUSTED_KEY_FLAG, pem.as_str(), Takes::Public, "takes public keys"),
            (ENCRYPT_TO_FLAG, age, Takes::Public, "takes public keys"),
            (DECRYPTION_KEY_FLAG, "age1abc", Takes::Private, "a public key"),
            (SIGNING_KEY_FLAG, "MC4CAQAwBQYDK2VwBCIEIabc", Takes::Private, "no file or directory"),
        ] {
            let err = refused(flag, value, takes);
            assert!(err.starts_with(&format!("key {flag}: ")) && err.contains(says), "{flag}: {err}");
            assert!(!err.contains(age) && !err.contains("MC4CAQAw"), "{flag}: key material in {err}");
            assert!(body.iter().all(|line| !err.contains(line)), "{flag}: key material in {err}");
            assert!(hides_a_key(value) || !value.contains("SECRET") && !value.contains("PRIVATE"), "{value}");
        }
        let err = refused(SIGNING_KEY_FLAG, "/nonexistent/signing.key", Takes::Private);
        assert!(err.starts_with("key /nonexistent/signing.key: cannot read"), "a path is named: {err}");
        assert!(!hides_a_key("/etc/restatus/signing/signing.key") && !hides_a_key("age1abc"));
    }

    #[test]
    fn trusted_keys_come_from_flags_files_and_directories() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (SigningKey::generate(), SigningKey::generate(), SigningKey::generate());
        std::fs::write(dir.path().join("a.pub"), a.public_key().to_pem().unwrap()).unwrap();
        std::fs::write(dir.path().join("b.pub"), b.public_key().to_short()).unwrap();
        std::fs::write(dir.path().join("..data"), "ignored, as in a mounted ConfigMap").unwrap();
        let specs = vec![dir.path().display().to_string(), c.public_key().to_short()];
        let keys = TrustedKeys::load(&specs).unwrap().expect("keys");
        let mut expected = vec![a.id().clone(), b.id().clone(), c.id().clone()];
        expected.sort();
        assert_eq!(keys.ids().cloned().collect::<Vec<_>>(), expected);
        assert_eq!(TrustedKeys::load(&[]).unwrap(), None, "no keys: no verification");
        assert!(TrustedKeys::load(&["/nonexistent.pub".into()]).is_err());
    }
}
