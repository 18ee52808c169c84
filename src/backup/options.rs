//! What one backup takes: the profile, paging, capture attempts, signing and encryption.

use crate::domain::identity::Profile;
use crate::format::{Recipients, RecordDrop, SigningKey, TrustedKeys};
use crate::k8s::{DEFAULT_PAGE_SIZE, PageRequest};

#[derive(Debug, Clone)]
pub struct BackupOptions {
    pub profile: Profile,
    /// Objects per LIST page.
    pub page_size: u32,
    /// Only objects with these labels (a Kubernetes label selector).
    pub selector: Option<String>,
    pub zstd_level: i32,
    /// Captures to take at most while they come out inconsistent.
    pub capture_attempts: u32,
    /// Pause between two captures.
    pub retry_delay: std::time::Duration,
    /// Told of each page of objects captured (phase `backup`, total unknown).
    pub progress: crate::progress::ProgressHook,
    /// Signs each manifest (`--signing-key`); `None`: snapshots are unsigned.
    pub signing_key: Option<std::sync::Arc<SigningKey>>,
    /// Encrypts each payload to these recipients (`--encrypt-to`); `None`: payloads are plain.
    pub recipients: Option<std::sync::Arc<Recipients>>,
    /// A capture whose record count fell by more than this many percent against the snapshot
    /// before it is written marked (`recordDrop`); 100 turns the check off.
    pub max_record_drop: u8,
    /// The keys the snapshot before is judged by (a forgery is no yardstick): the trusted keys
    /// and the public half of the signing key. `None`: any complete snapshot.
    pub trusted: Option<std::sync::Arc<TrustedKeys>>,
}

impl BackupOptions {
    pub fn page(&self) -> PageRequest<'_> {
        PageRequest { size: self.page_size, selector: self.selector.as_deref(), namespace: None }
    }

    pub fn new(profile: Profile) -> Self {
        BackupOptions {
            profile,
            page_size: DEFAULT_PAGE_SIZE,
            selector: None,
            zstd_level: 3,
            capture_attempts: 3,
            retry_delay: std::time::Duration::from_secs(2),
            progress: Default::default(),
            signing_key: None,
            recipients: None,
            max_record_drop: RecordDrop::DEFAULT_THRESHOLD_PERCENT,
            trusted: None,
        }
    }
}
