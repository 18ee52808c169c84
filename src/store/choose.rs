//! Which snapshot to restore from: the pinned one, or the newest complete one that loads,
//! verifies, (unless allowed otherwise) is consistent and was not captured from the cluster
//! the restore writes to, and, when keys are trusted, is signed by one of them; an encrypted one
//! only when a decryption key opens it. A damaged, foreign, own, unsigned, badly signed or
//! undecryptable snapshot is reported and passed over for the previous one; a store that cannot
//! be read is an error.

use std::sync::Arc;

use serde::Serialize;
use tracing::warn;

use crate::format::{KeyId, Manifest, Records, SnapshotId, TrustedKeys};
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
    /// The trusted key whose signature was checked; `None` when no keys are trusted.
    pub signer: Option<KeyId>,
}

/// Which snapshots a restore accepts besides complete, verified ones.
#[derive(Debug, Clone, Default)]
pub struct Accept {
    /// Snapshots whose capture was inconsistent.
    pub inconsistent: bool,
    /// The cluster the restore writes to (its `kube-system` uid, see
    /// [`crate::k8s::cluster_uid`]): a snapshot captured from it is refused, since restoring it
    /// writes the cluster's own (perhaps status-less) statuses back onto it. `None`: unknown.
    pub this_cluster: Option<String>,
    /// Accept a snapshot captured from `this_cluster` all the same (`--allow-same-cluster`).
    pub same_cluster: bool,
    /// Only snapshots signed by one of these keys (`--trusted-key`), checked before anything
    /// else the manifest says is believed. `None`: signatures are not checked.
    pub trusted: Option<Arc<TrustedKeys>>,
}

impl Accept {
    /// Why a snapshot with `manifest` is refused, if it is.
    fn refuses(&self, manifest: &Manifest) -> Option<Error> {
        // This cluster's own snapshot first: whatever else it is, it is not the one to use.
        if let (Some(from), Some(this)) = (&manifest.captured_from, &self.this_cluster)
            && from == this
            && !self.same_cluster
        {
            return Some(Error::SameCluster { snapshot: manifest.snapshot_id.to_string(), cluster: this.clone() });
        }
        if !manifest.is_consistent() && !self.inconsistent {
            let snapshot = manifest.snapshot_id.to_string();
            return Some(Error::Inconsistent { snapshot, reason: inconsistent(manifest) });
        }
        None
    }
}

/// Loads the pinned snapshot, or the newest complete one that verifies and that `accept`
/// accepts (consistent, not captured from this cluster, unless allowed).
pub async fn choose_snapshot(store: &SnapshotStore, pinned: Option<&SnapshotId>, accept: &Accept) -> Result<Loaded> {
    let newest = choose(store, pinned, None, accept).await?;
    match newest {
        Some(loaded) => Ok(loaded),
        None => Err(store.no_snapshot().await),
    }
}

/// The snapshot [`choose_snapshot`] would load now, unless that is `current`: then `None`,
/// and no payload is downloaded (the controller's periodic refresh).
pub async fn choose_newer(store: &SnapshotStore, current: &SnapshotId, accept: &Accept) -> Result<Option<Loaded>> {
    choose(store, None, Some(current), accept).await
}

async fn choose(
    store: &SnapshotStore,
    pinned: Option<&SnapshotId>,
    current: Option<&SnapshotId>,
    accept: &Accept,
) -> Result<Option<Loaded>> {
    // The manifest says whether the snapshot is consistent and where it was captured: a
    // refused one is passed over before its payload is downloaded.
    let load = |id: SnapshotId| async move {
        let (manifest, signer) = store.verified_manifest(&id, accept.trusted.as_deref()).await?;
        if let Some(refused) = accept.refuses(&manifest) {
            return Err(refused);
        }
        let records = Records::decode(&manifest, store.fetch_payload(&manifest).await?)?;
        Ok::<_, Error>(Loaded { manifest, records, passed_over: vec![], signer })
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
            Err(e @ Error::SameCluster { .. }) => {
                warn!(snapshot = %entry.id, "snapshot was captured from this cluster; trying the previous one");
                passed_over.push(Passed { snapshot: entry.id.to_string(), reason: e.to_string() });
            }
            Ok(loaded) => return Ok(Some(Loaded { passed_over, ..loaded })),
            Err(e @ (Error::Store { .. } | Error::Io { .. } | Error::TooLarge { .. })) => return Err(e),
            Err(e @ (Error::Unsigned { .. } | Error::BadSignature { .. })) => {
                warn!(snapshot = %entry.id, error = %e, "snapshot is not signed by a trusted key; trying the previous one");
                passed_over.push(Passed { snapshot: entry.id.to_string(), reason: e.to_string() });
            }
            Err(e @ (Error::Encrypted { .. } | Error::Undecryptable { .. })) => {
                warn!(snapshot = %entry.id, error = %e, "snapshot cannot be decrypted with the keys given; trying the previous one");
                passed_over.push(Passed { snapshot: entry.id.to_string(), reason: e.to_string() });
            }
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
    match entries.into_iter().rev().find(|e| e.complete) {
        Some(entry) => Ok(entry.id),
        None => Err(store.no_snapshot().await),
    }
}
