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

    /// A snapshot whose capture was inconsistent, asked for without `--allow-inconsistent`.
    #[error("snapshot {snapshot}: {reason}")]
    Inconsistent { snapshot: String, reason: String },

    /// A snapshot captured from the cluster a restore writes to (its `kube-system` uid).
    #[error(
        "snapshot {snapshot} was captured from this cluster (kube-system uid {cluster}): restoring it would \
         write this cluster's own statuses back; --allow-same-cluster uses it"
    )]
    SameCluster { snapshot: String, cluster: String },

    /// An unsigned snapshot, read with trusted keys configured.
    #[error("snapshot {snapshot}: not signed, and only signed snapshots are trusted (--trusted-key)")]
    Unsigned { snapshot: String },

    /// A snapshot whose signature is missing, unreadable, by an untrusted key or not over its
    /// manifest.
    #[error("snapshot {snapshot}: signature refused: {reason}")]
    BadSignature { snapshot: String, reason: String },

    /// A key file or key that cannot be used (named, never shown).
    #[error("key {source_name}: {reason}")]
    Key { source_name: String, reason: String },

    /// No complete snapshot of the cluster verified.
    #[error(
        "no good snapshot of cluster {cluster:?} in {location} ({passed_over} complete snapshots failed verification)"
    )]
    NoGoodSnapshot { cluster: String, location: String, passed_over: usize },

    /// A payload above the read limit (checked before downloading it).
    #[error(
        "snapshot {snapshot}: payload is {size} bytes, above the limit of {limit} bytes (--max-snapshot-size raises it)"
    )]
    TooLarge { snapshot: String, size: u64, limit: u64 },

    /// No complete snapshot of the cluster at all.
    #[error("no complete snapshot for cluster {cluster} in {location}")]
    NoSnapshot { cluster: String, location: String },

    #[error("invalid snapshot id {0:?}")]
    InvalidSnapshotId(String),

    #[error("profile {source_name}: {reason}")]
    Profile { source_name: String, reason: String },

    #[error("cron expression {expression:?}: {reason}")]
    Cron { expression: String, reason: String },

    #[error("storage URL {url}: {reason}")]
    StorageUrl { url: String, reason: String },

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
            Error::Inconsistent { .. } => "inconsistent_snapshot",
            Error::SameCluster { .. } => "same_cluster_snapshot",
            Error::Unsigned { .. } => "unsigned_snapshot",
            Error::BadSignature { .. } => "bad_signature",
            Error::Key { .. } => "key",
            Error::NoGoodSnapshot { .. } => "no_good_snapshot",
            Error::NoSnapshot { .. } => "no_snapshot",
            Error::TooLarge { .. } => "too_large",
            Error::InvalidSnapshotId(_) => "invalid_snapshot_id",
            Error::Profile { .. } => "profile",
            Error::Cron { .. } => "cron",
            Error::StorageUrl { .. } => "storage_url",
            Error::Store { .. } => "store",
            Error::StoreTimeout { .. } => "store_timeout",
            Error::Kube { .. } => "kube",
            Error::Kubeconfig { .. } => "kubeconfig",
            Error::InvalidObject { .. } => "invalid_object",
            Error::KeptChanging { .. } => "kept_changing",
            Error::StatusNotStored { .. } => "status_not_stored",
            Error::Leader(_) => "leader",
            Error::WatchesEnded => "watches_ended",
            Error::Io { .. } => "io",
        }
    }

    pub(crate) fn corrupt(snapshot: impl ToString, reason: impl Into<String>) -> Self {
        Error::CorruptSnapshot { snapshot: snapshot.to_string(), reason: reason.into() }
    }

    pub(crate) fn store(context: impl Into<String>, source: object_store::Error) -> Self {
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
}
