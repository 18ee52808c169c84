use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::{FORMAT_MAJOR, FORMAT_MINOR, SnapshotId};
use crate::Error;

/// `major.minor`. A reader accepts every minor of its own major and refuses other majors.
/// What the encoder measured; goes into the manifest's `payload` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadSummary {
    pub size: u64,
    pub uncompressed_size: u64,
    pub sha256: String,
    pub records: u64,
    pub frames: u64,
    /// Set when the payload was encrypted (its size and sha256 are the ciphertext's).
    pub encryption: Option<Encryption>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct FormatVersion {
    pub major: u32,
    pub minor: u32,
}

impl FormatVersion {
    pub const CURRENT: FormatVersion = FormatVersion { major: FORMAT_MAJOR, minor: FORMAT_MINOR };
}

impl fmt::Display for FormatVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for FormatVersion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (major, minor) = s.split_once('.').ok_or_else(|| format!("format version {s:?} is not major.minor"))?;
        let parse = |part: &str| part.parse::<u32>().map_err(|_| format!("format version {s:?} is not major.minor"));
        Ok(FormatVersion { major: parse(major)?, minor: parse(minor)? })
    }
}

impl TryFrom<String> for FormatVersion {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<FormatVersion> for String {
    fn from(v: FormatVersion) -> String {
        v.to_string()
    }
}

/// The small JSON document that describes a snapshot. Written last, create-only: a snapshot
/// without a manifest does not exist for readers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub format_version: FormatVersion,
    pub cluster_id: String,
    pub snapshot_id: SnapshotId,
    /// When the capture started (the first LIST).
    pub created_at: Timestamp,
    /// When the payload was complete.
    pub completed_at: Timestamp,
    pub tool: String,
    pub tool_version: String,
    pub profile: String,
    /// Per captured kind: records written and objects skipped.
    pub kinds: Vec<KindCount>,
    pub payload: PayloadInfo,
    /// Everything not captured, and why.
    #[serde(default)]
    pub skipped: Vec<Skipped>,
    /// Identity keys that more than one object of a kind carried in this capture.
    #[serde(default)]
    pub conflicts: Vec<KeyConflict>,
    /// Whether the capture is a consistent picture of the fleet (format 1.1; absent in 1.0
    /// manifests, which count as consistent: their writers did not check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<Consistency>,
    /// The cluster the objects were listed from: the uid of its `kube-system` namespace
    /// (format 1.3; absent before, or where the capture could not read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured_from: Option<String>,
    /// The key whose signature (`manifest.json.sig`) covers these bytes (format 1.4; absent
    /// in an unsigned snapshot). Readers with trusted keys check it against the signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<super::KeyId>,
    /// How the payload is encrypted and to whom (format 1.5; absent in a plain snapshot).
    /// `payload.size` and `payload.sha256` are then the ciphertext's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
    /// Set when this capture holds far fewer records than the snapshot before it (an
    /// accidental deletion on the source, a selector or profile gone wrong): written all the
    /// same, but marked, and retention keeps `previous` until a person deletes it. Absent in
    /// an ordinary capture (and before restatus 0.x wrote it; readers that do not know the
    /// field ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_drop: Option<RecordDrop>,
}

/// A capture's record count fell sharply against the snapshot before it: which snapshot, by
/// how much, against which threshold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordDrop {
    /// The last snapshot before the drop: retention keeps it while this mark is in the bucket.
    pub previous: SnapshotId,
    /// Its records.
    pub previous_records: u64,
    /// The threshold crossed: the count fell by more than this many percent.
    pub threshold_percent: u8,
}

impl RecordDrop {
    /// The default threshold: a capture with less than half the records of the one before.
    pub const DEFAULT_THRESHOLD_PERCENT: u8 = 50;

    /// Whether `records` fell by more than `threshold_percent` against `previous`'s count
    /// (100 and above: never). Pure.
    pub fn judge(previous: &Manifest, records: u64, threshold_percent: u8) -> Option<RecordDrop> {
        let before = previous.payload.records;
        let kept_percent = 100u128.saturating_sub(u128::from(threshold_percent));
        // records / before < (100 - threshold) / 100, in integers.
        let dropped =
            before > 0 && threshold_percent < 100 && u128::from(records) * 100 < u128::from(before) * kept_percent;
        dropped.then(|| RecordDrop {
            previous: previous.snapshot_id.clone(),
            previous_records: before,
            threshold_percent,
        })
    }
}

/// How far a snapshot's time may be ahead of the reader's clock before it counts as skewed.
pub const CLOCK_SKEW_TOLERANCE: std::time::Duration = std::time::Duration::from_secs(300);

/// Whether `at` lies more than [`CLOCK_SKEW_TOLERANCE`] ahead of `now`.
pub fn is_ahead_of(at: Timestamp, now: Timestamp) -> bool {
    at.duration_since(now).try_into().is_ok_and(|ahead: std::time::Duration| ahead > CLOCK_SKEW_TOLERANCE)
}

/// The consistency verdict of a capture, with every reason it is not consistent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Consistency {
    pub consistent: bool,
    /// Captures taken before this one was written (the earlier ones were inconsistent).
    pub attempts: u32,
    /// The first [`Consistency::MAX_REASONS`] reasons; `reasonCount` has them all.
    #[serde(default)]
    pub reasons: Vec<Inconsistency>,
    #[serde(default)]
    pub reason_count: usize,
}

impl Consistency {
    /// Reasons kept in a manifest: enough to act on, few enough to keep manifests small.
    pub const MAX_REASONS: usize = 100;

    /// "N reasons, first: OBJECT: REASON", for logs, Events and errors.
    pub fn summary(&self) -> String {
        match self.reasons.first() {
            Some(first) => format!("{} reasons, first: {}: {}", self.reason_count, first.object, first.reason),
            None => format!("{} reasons", self.reason_count),
        }
    }
}

/// What a capture saw, as the manifest records it: counts per kind, what was skipped, which
/// keys collide, and the consistency verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct CaptureSummary {
    pub kinds: Vec<KindCount>,
    pub skipped: Vec<Skipped>,
    pub conflicts: Vec<KeyConflict>,
    pub consistency: Consistency,
}

impl CaptureSummary {
    /// A capture that saw nothing: consistent at the first attempt.
    pub fn empty() -> Self {
        let consistency = Consistency { consistent: true, attempts: 1, reasons: vec![], reason_count: 0 };
        CaptureSummary { kinds: vec![], skipped: vec![], conflicts: vec![], consistency }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inconsistency {
    pub object: ObjectRef,
    pub reason: String,
}

impl Manifest {
    /// The manifest of a finished capture, stamped with this build's format and tool version.
    pub fn new(
        cluster_id: &str,
        snapshot_id: SnapshotId,
        created_at: Timestamp,
        profile: &str,
        capture: CaptureSummary,
        payload: PayloadSummary,
    ) -> Manifest {
        Manifest {
            format_version: FormatVersion::CURRENT,
            cluster_id: cluster_id.to_string(),
            snapshot_id,
            created_at,
            completed_at: Timestamp::now(),
            tool: crate::TOOL_NAME.into(),
            tool_version: crate::TOOL_VERSION.into(),
            profile: profile.to_string(),
            kinds: capture.kinds,
            payload: PayloadInfo {
                file: super::PAYLOAD_FILE.into(),
                encoding: "zstd+jsonl".into(),
                size: payload.size,
                uncompressed_size: payload.uncompressed_size,
                sha256: payload.sha256,
                records: payload.records,
                frames: Some(payload.frames),
            },
            skipped: capture.skipped,
            conflicts: capture.conflicts,
            consistency: Some(capture.consistency),
            captured_from: None,
            signed_by: None,
            encryption: None,
            record_drop: None,
        }
        .withheld_when_encrypted(payload.encryption)
    }

    /// With `encryption`, the manifest of an encrypted payload: the lists that name objects or
    /// carry identity keys (skipped objects, key conflicts, inconsistency reasons) are left out
    /// and counted in `encryption.withheld`, so that the plain manifest shows no inventory.
    fn withheld_when_encrypted(mut self, encryption: Option<Encryption>) -> Manifest {
        let Some(mut encryption) = encryption else { return self };
        encryption.withheld = Withheld {
            skipped: std::mem::take(&mut self.skipped).len(),
            conflicts: std::mem::take(&mut self.conflicts).len(),
            reasons: self.consistency.as_mut().map_or(0, |c| std::mem::take(&mut c.reasons).len()),
        };
        self.encryption = Some(encryption);
        self
    }

    /// Skipped objects and kinds, those an encrypted manifest withholds included.
    pub fn skipped_count(&self) -> usize {
        self.skipped.len() + self.encryption.as_ref().map_or(0, |e| e.withheld.skipped)
    }

    /// Key conflicts, those an encrypted manifest withholds included.
    pub fn conflict_count(&self) -> usize {
        self.conflicts.len() + self.encryption.as_ref().map_or(0, |e| e.withheld.conflicts)
    }

    /// The capture time, when it can be compared with write times read on a clock at `now`:
    /// `None` when the snapshot is dated more than [`CLOCK_SKEW_TOLERANCE`] ahead of it (the
    /// writer's clock was ahead), so that "written before the snapshot" cannot be trusted.
    pub fn comparable_time(&self, now: Timestamp) -> Option<Timestamp> {
        (!is_ahead_of(self.created_at, now)).then_some(self.created_at)
    }

    /// Consistent, or written by a restatus that did not judge (format 1.0).
    pub fn is_consistent(&self) -> bool {
        self.consistency.as_ref().is_none_or(|c| c.consistent)
    }

    /// Parses a manifest and refuses other major versions before looking at anything else,
    /// so a future format gets a clear "version" error rather than a confusing field error.
    pub fn from_json(snapshot: &str, bytes: &[u8]) -> Result<Manifest, Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct VersionOnly {
            format_version: String,
        }
        let version = serde_json::from_slice::<VersionOnly>(bytes)
            .map_err(|e| Error::corrupt(snapshot, format!("manifest is not valid: {e}")))?;
        let parsed: FormatVersion = version.format_version.parse().map_err(|e: String| Error::corrupt(snapshot, e))?;
        if parsed.major != FORMAT_MAJOR {
            return Err(Error::UnsupportedFormat {
                snapshot: snapshot.to_string(),
                found: version.format_version,
                supported: FORMAT_MAJOR,
            });
        }
        serde_json::from_slice(bytes).map_err(|e| Error::corrupt(snapshot, format!("manifest is not valid: {e}")))
    }

    pub fn to_json(&self) -> Vec<u8> {
        // A manifest is plain data: serialising it cannot fail.
        serde_json::to_vec_pretty(self).expect("manifest serialises")
    }

    pub fn records(&self) -> u64 {
        self.payload.records
    }

    /// Records per kind, keyed by `Kind.group`.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.kinds.iter().map(|k| (k.kind.clone(), k.records)).collect()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KindCount {
    pub api_version: String,
    pub kind: String,
    pub records: u64,
    pub skipped: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PayloadInfo {
    /// Object name relative to the snapshot's folder.
    pub file: String,
    /// `zstd` over JSON Lines: one record per line.
    pub encoding: String,
    /// Compressed bytes, as stored.
    pub size: u64,
    /// Bytes after decompression; readers refuse to decompress more.
    pub uncompressed_size: u64,
    /// Hex sha256 of the stored (compressed) bytes; readers check it before decompressing.
    pub sha256: String,
    pub records: u64,
    /// zstd frames the payload is cut into (format 1.2): records never span two frames, so
    /// one record's status is read by decompressing one frame. Absent before 1.2 (one frame).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frames: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// Something the capture left out: a whole kind (no `name`), or one object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Skipped {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyConflict {
    pub kind: String,
    pub key: String,
    pub objects: Vec<ObjectRef>,
}

/// The manifest's `encryption` section (format 1.5; absent in a plain snapshot).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Encryption {
    /// `age-x25519` (see `encryption.rs`).
    pub scheme: String,
    /// The recipients (`age1…`): the private key of any one of them decrypts the payload.
    pub recipients: Vec<String>,
    /// What the manifest leaves out because it names objects or carries identity keys.
    #[serde(default)]
    pub withheld: Withheld,
}

/// Entries an encrypted snapshot's manifest leaves out, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Withheld {
    /// Skipped objects and kinds (`skipped`).
    pub skipped: usize,
    /// Key conflicts (`conflicts`).
    pub conflicts: usize,
    /// Inconsistency reasons (`consistency.reasons`; `reasonCount` stays).
    pub reasons: usize,
}

impl Encryption {
    /// The recipients, comma-separated, for messages.
    pub fn recipients_text(&self) -> String {
        self.recipients.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// F161 (issue 38, item 8): a drop by more than the threshold is marked, naming the
    /// snapshot before; less, an empty snapshot before, or a threshold of 100 is not.
    #[test]
    fn a_record_count_that_fell_by_more_than_the_threshold_is_a_drop() {
        let at: Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        let mut previous = crate::fixtures::manifest(SnapshotId::new(at), at);
        previous.payload.records = 150;
        let drop = RecordDrop::judge(&previous, 0, 50).unwrap();
        assert_eq!(
            (drop.previous, drop.previous_records, drop.threshold_percent),
            (previous.snapshot_id.clone(), 150, 50)
        );
        assert!(RecordDrop::judge(&previous, 74, 50).is_some(), "fell by 51%");
        assert_eq!(RecordDrop::judge(&previous, 75, 50), None, "by exactly 50%");
        assert_eq!(RecordDrop::judge(&previous, 149, 0).map(|d| d.threshold_percent), Some(0), "0: any fall");
        assert_eq!(RecordDrop::judge(&previous, 0, 100), None, "100: never");
        assert_eq!(RecordDrop::judge(&previous, 300, 50), None, "growth");
        previous.payload.records = 0;
        assert_eq!(RecordDrop::judge(&previous, 0, 0), None, "nothing to fall from");
    }
}
