//! The library's one error type. Every variant names what it is about (a snapshot, an object,
//! a profile file, a storage URL), so a message on its own tells an operator where to look.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A snapshot exists but its content cannot be trusted: checksum, size, compression, records.
    #[error("snapshot {snapshot}: {reason}")]
    CorruptSnapshot { snapshot: String, reason: String },

    /// A snapshot written by a restatus of another major format version.
    #[error("snapshot {snapshot}: format version {found} is not supported; this restatus reads format {supported}.x")]
    UnsupportedFormat { snapshot: String, found: String, supported: u32 },

    /// A snapshot whose manifest names another cluster than the one asked for.
    #[error("snapshot {snapshot}: it belongs to cluster {found:?}, not to {expected:?}")]
    ForeignSnapshot { snapshot: String, found: String, expected: String },

    /// No manifest: for readers the snapshot does not exist.
    #[error("snapshot {0}: not found (no manifest)")]
    SnapshotNotFound(String),

    /// `snapshots delete` refused: no such snapshot, or one a restore would use (without
    /// `--force`), or objects left behind.
    #[error("snapshot {snapshot}: not deleted: {reason}")]
    NotDeleted { snapshot: String, reason: String },

    /// A snapshot whose capture was inconsistent, asked for without `--allow-inconsistent`.
    #[error("snapshot {snapshot}: {reason}")]
    Inconsistent { snapshot: String, reason: String },

    /// A snapshot captured from the cluster a restore writes to (its `kube-system` uid).
    #[error(
        "snapshot {snapshot} was captured from this cluster (kube-system uid {cluster}): restoring it would \
         write this cluster's own statuses back; --allow-same-cluster uses it"
    )]
    SameCluster { snapshot: String, cluster: String },

    /// A snapshot captured from another source than the one a reader expects
    /// (`--expect-source`): one copied from another environment's prefix.
    #[error(
        "snapshot {snapshot} was captured from {captured_from}, not from the expected source ({expected}, \
         --expect-source): a snapshot of another cluster, copied here"
    )]
    WrongSource { snapshot: String, captured_from: String, expected: String },

    /// A plain snapshot (or journal segment), read with `--require-encryption`.
    #[error(
        "{snapshot}: not encrypted, and only encrypted snapshots are used (--require-encryption); \
         only a signature (--trusted-key) says who wrote a snapshot"
    )]
    NotEncrypted { snapshot: String },

    /// An unsigned snapshot, read with trusted keys configured.
    #[error("snapshot {snapshot}: not signed, and only signed snapshots are trusted (--trusted-key)")]
    Unsigned { snapshot: String },

    /// A snapshot whose signature is missing, unreadable, by an untrusted key or not over its
    /// manifest.
    #[error("snapshot {snapshot}: signature refused: {reason}")]
    BadSignature { snapshot: String, reason: String },

    /// An encrypted snapshot, read without a decryption key.
    #[error(
        "snapshot {snapshot}: its payload is encrypted to {recipients}; reading it needs the private key of one \
         of them (--decryption-key)"
    )]
    Encrypted { snapshot: String, recipients: String },

    /// An encrypted snapshot none of the decryption keys opens, or of a scheme this build does
    /// not read.
    #[error("snapshot {snapshot}: payload does not decrypt: {reason}")]
    Undecryptable { snapshot: String, reason: String },

    /// A snapshot dated further ahead of this clock than the clock-skew tolerance: not taken
    /// as a journal's base (every segment chained to it would claim a time nobody saw yet).
    #[error("snapshot {snapshot}: dated {at}, ahead of this clock by more than the clock-skew tolerance")]
    DatedAhead { snapshot: String, at: String },

    /// A key file or key that cannot be used (named, never shown).
    #[error("key {source_name}: {reason}")]
    Key { source_name: String, reason: String },

    /// No complete snapshot of the cluster verified.
    #[error(
        "no good snapshot of cluster {cluster:?} in {location} ({passed_over} complete snapshots failed verification)"
    )]
    NoGoodSnapshot { cluster: String, location: String, passed_over: usize },

    /// The snapshot a controller uses is no longer in the bucket, and nothing newer is good:
    /// it keeps the one it uses rather than going back in time.
    #[error(
        "the snapshot in use, {in_use}, is no longer in {location} and no newer one is good ({older}): \
         kept rather than going back in time"
    )]
    SnapshotInUseGone { in_use: String, location: String, older: String },

    /// A payload above the read limit (checked before downloading it).
    #[error(
        "snapshot {snapshot}: payload is {size} bytes, above the limit of {limit} bytes (--max-snapshot-size raises it)"
    )]
    TooLarge { snapshot: String, size: u64, limit: u64 },

    /// No complete snapshot of the cluster at all.
    /// `known`: "; cluster ids there: a, b" (bounded), or empty when the prefix holds no other.
    #[error("no complete snapshot for cluster {cluster} in {location}{known}")]
    NoSnapshot { cluster: String, location: String, known: String },

    /// `latest@TIME`: no complete snapshot captured at or before the time asked for.
    #[error("no complete snapshot captured at or before {at} in {location}")]
    NoSnapshotAt { at: String, location: String },

    #[error("invalid snapshot id {0:?}")]
    InvalidSnapshotId(String),

    #[error("profile {source_name}: {reason}")]
    Profile { source_name: String, reason: String },

    #[error("cron expression {expression:?}: {reason}")]
    Cron { expression: String, reason: String },

    #[error("storage URL {url}: {reason}")]
    StorageUrl { url: String, reason: String },

    #[error(
        "{context}: no S3 credentials found; looked in the environment (AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY), for a web identity (AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN), \
         the container endpoint (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI) and the instance metadata \
         service, which answered: {metadata}"
    )]
    NoCredentials { context: String, metadata: String },

    #[error("object store: {context}: {source}")]
    Store {
        context: String,
        #[source]
        source: object_store::Error,
    },

    /// The object store did not finish `what` in time (it stopped answering).
    #[error("object store {location}: {what} did not finish within {}s; the store stopped answering", after.as_secs_f64())]
    StoreTimeout { location: String, what: String, after: std::time::Duration },

    #[error("Kubernetes API: {context}: {source}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },

    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig { path: PathBuf, reason: String },

    /// An object returned by the API server that restatus cannot read.
    #[error("{kind} {name}: {reason}")]
    InvalidObject { kind: String, name: String, reason: String },

    /// An object changed under every one of restatus's conditional writes.
    #[error("{kind} {name}: kept changing: {attempts} conflicting writes")]
    KeptChanging { kind: String, name: String, attempts: usize },

    /// A status write the API server answered without storing the status (its kind gained a
    /// status subresource since restatus asked).
    #[error(
        "{kind} {name}: the status of snapshot {snapshot} was not stored (the answer shows another); \
         the kind's subresources are asked again before the retry"
    )]
    StatusNotStored { kind: String, name: String, snapshot: String },

    /// One object's restore failed (an API error, an answer restatus cannot use); the
    /// controller tries it again after a backoff.
    #[error("{object}: restore failed: {reason}")]
    RestoreFailed { object: String, reason: String },

    #[error("leader election: {0}")]
    Leader(String),

    /// The controller's watches all ended (the API server closed them for good).
    #[error("every watch ended")]
    WatchesEnded,

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// A short, stable label for metrics and logs: what kind of failure this is.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::CorruptSnapshot { .. } => "corrupt_snapshot",
            Error::UnsupportedFormat { .. } => "unsupported_format",
            Error::ForeignSnapshot { .. } => "foreign_snapshot",
            Error::SnapshotNotFound(_) => "snapshot_not_found",
            Error::NotDeleted { .. } => "not_deleted",
            Error::Inconsistent { .. } => "inconsistent_snapshot",
            Error::SameCluster { .. } => "same_cluster_snapshot",
            Error::WrongSource { .. } => "wrong_source_snapshot",
            Error::NotEncrypted { .. } => "plain_snapshot",
            Error::Unsigned { .. } => "unsigned_snapshot",
            Error::BadSignature { .. } => "bad_signature",
            Error::Encrypted { .. } => "encrypted_snapshot",
            Error::Undecryptable { .. } => "undecryptable_snapshot",
            Error::DatedAhead { .. } => "dated_ahead",
            Error::Key { .. } => "key",
            Error::NoGoodSnapshot { .. } => "no_good_snapshot",
            Error::SnapshotInUseGone { .. } => "snapshot_in_use_gone",
            Error::NoSnapshot { .. } | Error::NoSnapshotAt { .. } => "no_snapshot",
            Error::TooLarge { .. } => "too_large",
            Error::InvalidSnapshotId(_) => "invalid_snapshot_id",
            Error::Profile { .. } => "profile",
            Error::Cron { .. } => "cron",
            Error::StorageUrl { .. } => "storage_url",
            Error::Store { .. } => "store",
            Error::NoCredentials { .. } => "no_credentials",
            Error::StoreTimeout { .. } => "store_timeout",
            Error::Kube { .. } => "kube",
            Error::Kubeconfig { .. } => "kubeconfig",
            Error::InvalidObject { .. } => "invalid_object",
            Error::KeptChanging { .. } => "kept_changing",
            Error::StatusNotStored { .. } => "status_not_stored",
            Error::RestoreFailed { .. } => "restore_failed",
            Error::Leader(_) => "leader",
            Error::WatchesEnded => "watches_ended",
            Error::Io { .. } => "io",
        }
    }

    pub(crate) fn corrupt(snapshot: impl ToString, reason: impl Into<String>) -> Self {
        Error::CorruptSnapshot { snapshot: snapshot.to_string(), reason: reason.into() }
    }

    pub(crate) fn store(context: impl Into<String>, source: object_store::Error) -> Self {
        // With no credentials configured, object_store falls back to the instance metadata
        // service; off EC2 its refusal, repeated once per wrapping layer, hides the real cause.
        if no_credentials_configured(|k| std::env::var_os(k).is_some()) && source.to_string().contains(IMDS_HOST) {
            let mut cause: &dyn std::error::Error = &source;
            while let Some(next) = cause.source() {
                cause = next;
            }
            return Error::NoCredentials { context: context.into(), metadata: cause.to_string() };
        }
        Error::Store { context: context.into(), source }
    }

    pub(crate) fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube { context: context.into(), source }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }

    /// A paginated LIST outlived its continue token (410 Gone: the API server compacted its
    /// storage meanwhile, every 5 minutes by default); listing again from the start works.
    pub fn is_expired_list(&self) -> bool {
        matches!(self, Error::Kube { source: kube::Error::Api(status), .. } if status.code == 410)
    }

    /// The continue token a 410 of an expired listing offers: the rest of the listing at the
    /// API server's current revision (`None` when it offers none).
    pub fn expired_list_continue(&self) -> Option<&str> {
        match self {
            Error::Kube { source: kube::Error::Api(status), .. } if status.code == 410 => {
                status.metadata.as_ref()?.continue_.as_deref().filter(|t| !t.is_empty())
            }
            _ => None,
        }
    }
}

/// The instance metadata service, object_store's last place to look for S3 credentials.
const IMDS_HOST: &str = "169.254.169.254";

/// Where S3 credentials are looked for before the instance metadata service; none set means
/// a metadata failure is a missing-credentials failure.
const CREDENTIAL_VARS: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
];

fn no_credentials_configured(is_set: impl Fn(&str) -> bool) -> bool {
    !CREDENTIAL_VARS.iter().any(|k| is_set(k))
}

#[cfg(test)]
mod credential_tests {
    use super::*;

    /// Any credential source configured: a metadata error is not a missing-credentials one.
    #[test]
    fn credentials_are_missing_only_when_no_source_is_set() {
        assert!(no_credentials_configured(|_| false));
        for var in CREDENTIAL_VARS {
            assert!(!no_credentials_configured(|k| k == *var), "{var}");
        }
        let e = Error::NoCredentials { context: "list snapshots under s3://b/p".into(), metadata: "403".into() };
        let text = e.to_string();
        for part in ["no S3 credentials found", "AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "instance metadata"]
        {
            assert!(text.contains(part), "{part} in {text}");
        }
    }
}
