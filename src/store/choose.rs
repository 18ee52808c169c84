//! Which snapshot to restore from: the pinned one, or the newest complete one that loads,
//! verifies and (unless allowed otherwise) is consistent. A damaged or foreign snapshot is
//! reported and passed over for the previous one; a store that cannot be read is an error.

use serde::Serialize;
use tracing::warn;

use crate::format::{Manifest, Records, SnapshotId};
use crate::store::SnapshotStore;
use crate::{Error, Result};

/// A snapshot that was passed over, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Passed {
    pub snapshot: String,
    pub reason: String,
}

/// A verified snapshot, ready to plan from.
pub struct Loaded {
    pub manifest: Manifest,
    pub records: Records,
    pub passed_over: Vec<Passed>,
}

/// Loads the pinned snapshot, or the newest complete one that verifies and, unless
/// `allow_inconsistent`, is consistent.
pub async fn choose_snapshot(
    store: &SnapshotStore,
    pinned: Option<&SnapshotId>,
    allow_inconsistent: bool,
) -> Result<Loaded> {
    let newest = choose(store, pinned, None, allow_inconsistent).await?;
    newest.ok_or_else(|| Error::NoSnapshot {
        cluster: store.cluster_id().to_string(),
        location: store.location().to_string(),
    })
}

/// The snapshot [`choose_snapshot`] would load now, unless that is `current`: then `None`,
/// and no payload is downloaded (the controller's periodic refresh).
pub async fn choose_newer(
    store: &SnapshotStore,
    current: &SnapshotId,
    allow_inconsistent: bool,
) -> Result<Option<Loaded>> {
    choose(store, None, Some(current), allow_inconsistent).await
}

async fn choose(
    store: &SnapshotStore,
    pinned: Option<&SnapshotId>,
    current: Option<&SnapshotId>,
    allow_inconsistent: bool,
) -> Result<Option<Loaded>> {
    // The manifest says whether the snapshot is consistent: an inconsistent one is passed
    // over before its payload is downloaded.
    let load = |id: SnapshotId| async move {
        let manifest = store.manifest(&id).await?;
        if !manifest.is_consistent() && !allow_inconsistent {
            return Err(Error::Inconsistent { snapshot: id.to_string(), reason: inconsistent(&manifest) });
        }
        let records = Records::decode(&manifest, store.fetch_payload(&manifest).await?)?;
        Ok::<_, Error>(Loaded { manifest, records, passed_over: vec![] })
    };
    if let Some(id) = pinned {
        return load(id.clone()).await.map(Some);
    }
    let mut passed_over = Vec::new();
    for entry in store.list().await?.into_iter().rev().filter(|e| e.complete) {
        if Some(&entry.id) == current {
            return Ok(None);
        }
        match load(entry.id.clone()).await {
            Err(Error::Inconsistent { snapshot, reason }) => {
                warn!(snapshot = %entry.id, "snapshot is inconsistent; trying the previous one");
                passed_over.push(Passed { snapshot, reason });
            }
            Ok(loaded) => return Ok(Some(Loaded { passed_over, ..loaded })),
            Err(e @ (Error::Store { .. } | Error::Io { .. } | Error::TooLarge { .. })) => return Err(e),
            Err(e) => {
                warn!(snapshot = %entry.id, error = %e, "snapshot skipped; trying the previous one");
                passed_over.push(Passed { snapshot: entry.id.to_string(), reason: e.to_string() });
            }
        }
    }
    Err(Error::NoGoodSnapshot {
        cluster: store.cluster_id().to_string(),
        location: store.location().to_string(),
        passed_over: passed_over.len(),
    })
}

fn inconsistent(manifest: &Manifest) -> String {
    let summary = manifest.consistency.as_ref().map_or_else(|| "0 reasons".into(), |c| c.summary());
    format!("inconsistent capture ({summary}); --allow-inconsistent uses it")
}

/// A snapshot id, or `latest`: the newest snapshot with a manifest.
pub async fn resolve(store: &SnapshotStore, id: &str) -> Result<SnapshotId> {
    if id != "latest" {
        return id.parse();
    }
    let entries = store.list().await?;
    entries.into_iter().rev().find(|e| e.complete).map(|e| e.id).ok_or_else(|| Error::NoSnapshot {
        cluster: store.cluster_id().to_string(),
        location: store.location().to_string(),
    })
}
