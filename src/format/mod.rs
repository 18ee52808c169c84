//! Snapshot format v1 (see `docs/FORMAT.md`): a zstd-compressed JSON Lines payload of
//! [`Record`]s and a small JSON [`Manifest`] that is written last and makes the snapshot exist.
//!
//! Everything here is pure: no I/O but `std::io::Write`/`Read` on memory, the spill file and
//! key files ([`SigningKey::load`], [`TrustedKeys::load`], [`Recipients::load`],
//! [`DecryptionKeys::load`]).

mod encryption;
mod id;
mod key;
mod manifest;
mod names;
mod payload;
mod record;
mod records;
mod segment;
mod signature;
mod spill;

pub use encryption::{
    DecryptionKeys, IDENTITY_PREFIX, RECIPIENT_PREFIX, Recipients, SCHEME as ENCRYPTION_SCHEME, open_payload,
};
pub use id::SnapshotId;
pub use key::{IdentityKey, KeyDigest, digest};
pub use manifest::{
    CLOCK_SKEW_TOLERANCE, CaptureSummary, Consistency, Encryption, FormatVersion, Inconsistency, KeyConflict,
    KindCount, Manifest, ObjectRef, PayloadInfo, PayloadSummary, RecordDrop, Skipped, Withheld, is_ahead_of,
};
pub use names::Names;
pub use payload::{FRAME_BYTES, PayloadEncoder, decode_records};
pub use record::{CARRIED_ANNOTATION_PREFIXES, Record, RecordHead, is_carried, qualified_kind, split_api_version};
pub use records::Records;
pub use segment::{
    Candidate, Chain, ChainStop, Folded, JOURNAL_DIR, Link, MAX_SEGMENT_HEADER, PointChoice, SEGMENT_FORMAT,
    SEGMENT_HEADER_SUFFIX, SEGMENT_PAYLOAD_SUFFIX, SEGMENT_SIGNATURE_SUFFIX, SegmentHeader, check_header, check_link,
    check_records, choose_point, fold, is_tombstone, merge, object_key, point, segment_file, segment_name, sha256_hex,
    tombstone,
};
pub use signature::{KeyId, MAX_SIGNATURE, PublicKey, SIGNATURE_FILE, SigningKey, TrustedKeys, hides_a_key};
pub use spill::{Payload, SpillFile, SpillWriter, verify_payload};

/// The major format version this build writes and reads. Readers refuse other majors.
pub const FORMAT_MAJOR: u32 = 1;
/// The minor version this build writes. Readers accept any minor of their major.
pub const FORMAT_MINOR: u32 = 5;

/// Object names inside a snapshot's folder.
pub const MANIFEST_FILE: &str = "manifest.json";
pub const PAYLOAD_FILE: &str = "payload.jsonl.zst";
