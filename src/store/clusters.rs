//! The cluster ids under a storage URL's prefix: each is a folder of snapshots. In a disaster
//! the old cluster's id may be forgotten; the bucket still knows it.

use jiff::Timestamp;
use object_store::path::Path;
use serde::Serialize;

use super::snapshots::{SnapshotStore, validate_cluster_id};
use crate::format::SnapshotId;
use crate::{Error, Result};

/// At most this many cluster ids are named in a "no complete snapshot" error.
pub const KNOWN_IDS_SHOWN: usize = 10;

/// One cluster id found under the prefix, and what its newest snapshot is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterEntry {
    pub cluster_id: String,
    /// Snapshot folders, complete or not.
    pub snapshots: usize,
    /// Snapshots with a manifest.
    pub complete: usize,
    /// The newest complete snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub newest: Option<SnapshotId>,
    /// When it was taken (from its id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub newest_at: Option<Timestamp>,
}

impl SnapshotStore {
    /// The folder the cluster folders are in (the storage URL's prefix).
    fn prefix(&self) -> Path {
        let parts: Vec<_> = self.root.parts().collect();
        Path::from_iter(parts[..parts.len().saturating_sub(1)].iter().cloned())
    }

    /// The same bucket and prefix, another cluster id.
    pub fn for_cluster(&self, cluster_id: &str) -> Result<SnapshotStore> {
        let store = SnapshotStore::new(self.store.clone(), self.prefix().as_ref(), cluster_id, self.location.clone())?;
        Ok(store.with_max_payload(self.max_payload))
    }

    /// [`Error::NoSnapshot`] for this cluster id, naming (at most [`KNOWN_IDS_SHOWN`]) the
    /// other cluster ids under the prefix: one listing with a delimiter, no manifest read.
    pub async fn no_snapshot(&self) -> Error {
        let prefix = self.prefix();
        let listing = self.store.list_with_delimiter((!prefix.as_ref().is_empty()).then_some(&prefix)).await;
        let mut ids: Vec<String> = listing
            .map(|l| l.common_prefixes)
            .unwrap_or_default()
            .iter()
            .filter_map(|folder| folder.filename())
            .filter(|id| *id != self.cluster_id && validate_cluster_id(id).is_ok())
            .map(str::to_string)
            .collect();
        ids.sort();
        let known = match ids.len() {
            0 => String::new(),
            n if n > KNOWN_IDS_SHOWN => {
                format!("; cluster ids there: {} and {} more", ids[..KNOWN_IDS_SHOWN].join(", "), n - KNOWN_IDS_SHOWN)
            }
            _ => format!("; cluster ids there: {}", ids.join(", ")),
        };
        Error::NoSnapshot { cluster: self.cluster_id.clone(), location: self.location.clone(), known }
    }

    /// Every cluster id under the prefix that holds at least one snapshot folder, by id, each
    /// with its newest complete snapshot. Lists one level with a delimiter, then each cluster.
    pub async fn clusters(&self) -> Result<Vec<ClusterEntry>> {
        let prefix = self.prefix();
        let listing = self
            .store
            .list_with_delimiter((!prefix.as_ref().is_empty()).then_some(&prefix))
            .await
            .map_err(|e| Error::store(format!("list cluster ids under {}", self.location), e))?;
        let mut clusters = Vec::new();
        for folder in listing.common_prefixes {
            let Some(id) = folder.filename().filter(|id| validate_cluster_id(id).is_ok()) else {
                continue;
            };
            let entries = self.for_cluster(id)?.list().await?;
            if entries.is_empty() {
                continue;
            }
            let newest = entries.iter().rev().find(|e| e.complete).map(|e| e.id.clone());
            clusters.push(ClusterEntry {
                cluster_id: id.to_string(),
                snapshots: entries.len(),
                complete: entries.iter().filter(|e| e.complete).count(),
                newest_at: newest.as_ref().and_then(SnapshotId::timestamp),
                newest,
            });
        }
        clusters.sort_by(|a, b| a.cluster_id.cmp(&b.cluster_id));
        Ok(clusters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use object_store::ObjectStoreExt;

    #[tokio::test]
    async fn lists_the_cluster_ids_under_the_prefix_with_their_newest_snapshot() {
        let store: std::sync::Arc<dyn object_store::ObjectStore> =
            std::sync::Arc::new(object_store::memory::InMemory::new());
        let location = "memory://".to_string();
        let open = |id: &str| SnapshotStore::new(store.clone(), "team/restatus", id, location.clone()).unwrap();
        let (older, newer): (Timestamp, Timestamp) =
            ("2026-11-30T10:00:00Z".parse().unwrap(), "2026-11-30T11:00:00Z".parse().unwrap());
        let mut manifest = fixtures::manifest(SnapshotId::new(older), older);
        manifest.cluster_id = "mgmt-eu1".into();
        open("mgmt-eu1").put_manifest(&manifest).await.unwrap();
        let newest = SnapshotId::new(newer);
        manifest.snapshot_id = newest.clone();
        open("mgmt-eu1").put_manifest(&manifest).await.unwrap();
        // A cluster whose only snapshot is still being written; a stray object beside them;
        // the same layout under another prefix.
        let pending = open("mgmt-us2");
        let id = SnapshotId::new(newer);
        store.put(&pending.payload_path(&id), bytes::Bytes::from_static(b"x").into()).await.unwrap();
        store.put(&Path::from("team/restatus/README"), bytes::Bytes::from_static(b"x").into()).await.unwrap();
        let other = SnapshotStore::new(store.clone(), "team/other", "elsewhere", location.clone()).unwrap();
        store.put(&other.payload_path(&id), bytes::Bytes::from_static(b"x").into()).await.unwrap();

        let clusters = open("default").clusters().await.unwrap();
        let ids: Vec<&str> = clusters.iter().map(|c| c.cluster_id.as_str()).collect();
        assert_eq!(ids, ["mgmt-eu1", "mgmt-us2"]);
        assert_eq!((clusters[0].snapshots, clusters[0].complete), (2, 2));
        assert_eq!(clusters[0].newest, Some(newest));
        assert_eq!(clusters[0].newest_at, Some(newer));
        assert_eq!((clusters[1].snapshots, clusters[1].complete, clusters[1].newest.as_ref()), (1, 0, None));
    }

    /// "no complete snapshot for cluster X" names the other cluster ids under the prefix,
    /// at most KNOWN_IDS_SHOWN of them, then how many more.
    #[tokio::test]
    async fn no_snapshot_names_the_cluster_ids_the_bucket_has_bounded() {
        let store: std::sync::Arc<dyn object_store::ObjectStore> =
            std::sync::Arc::new(object_store::memory::InMemory::new());
        let open = |id: &str| SnapshotStore::new(store.clone(), "p", id, "memory://p".into()).unwrap();
        let id = SnapshotId::new("2026-11-30T10:00:00Z".parse().unwrap());
        let none = open("wrong").no_snapshot().await.to_string();
        assert_eq!(none, "no complete snapshot for cluster wrong in memory://p");
        for n in 0..12 {
            let c = open(&format!("c{n:02}"));
            store.put(&c.payload_path(&id), bytes::Bytes::from_static(b"x").into()).await.unwrap();
        }
        let err = open("wrong").no_snapshot().await.to_string();
        assert!(
            err.ends_with("; cluster ids there: c00, c01, c02, c03, c04, c05, c06, c07, c08, c09 and 2 more"),
            "{err}"
        );
        let err = open("c00").no_snapshot().await.to_string();
        assert!(err.contains("there: c01, ") && !err.contains("c00,"), "not itself: {err}");
    }
}
