//! The object-store edge: where snapshots live and how they are written and read.
//!
//! Layout under a storage URL's prefix (see `docs/FORMAT.md`):
//!
//! ```text
//! <prefix>/<cluster-id>/<snapshot-id>/payload.jsonl.zst   written first, streamed
//! <prefix>/<cluster-id>/<snapshot-id>/manifest.json.sig   a signed snapshot's signature, before the manifest
//! <prefix>/<cluster-id>/<snapshot-id>/manifest.json       written last, create-only
//! <prefix>/<cluster-id>/<snapshot-id>/journal/…            journal segments on this base ([`journal`])
//! ```
//!
//! The files, bottom first: [`backend`] opens a storage URL (S3, TLS, SSE, local, memory);
//! [`snapshots`] is the [`SnapshotStore`] on it (layout, writes, listing, manifests and their
//! signatures, the one verified payload read); [`journal`] and [`clusters`] add to it; [`choose`]
//! picks the snapshot (and point) a restore uses, [`retention`] what is deleted, [`listing`]
//! describes each snapshot for `snapshots list`. This file only declares and re-exports them.

pub mod backend;
pub mod choose;
pub mod clusters;
pub mod journal;
pub mod listing;
pub mod retention;
pub mod snapshots;

pub use backend::{DEFAULT_STORAGE, S3Options, SSE_MODES};
pub use choose::{
    Accept, Demands, Loaded, Passed, Point, ReadOn, Refused, Tail, choose_newer, choose_snapshot, newest_verified,
    newest_verified_remembering, read_on, resolve, resolve_at, snapshot_at,
};
pub use listing::{JournalSummary, SignatureCheck, SnapshotState, SnapshotSummary, describe_snapshots};
pub use retention::{Deletion, RetentionPolicy};
pub use snapshots::{DEFAULT_MAX_PAYLOAD, MAX_MANIFEST, SPILL_ABOVE, SnapshotEntry, SnapshotStore};
