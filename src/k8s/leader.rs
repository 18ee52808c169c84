//! Leader election through a Lease (kube-lease-manager): one controller writes at a time.

use kube_lease_manager::{DurationSeconds, LeaseManagerBuilder};
use tokio::sync::watch;
use tracing::info;

use crate::{Error, Result};

pub struct Leadership {
    is_leader: watch::Receiver<bool>,
}

impl Leadership {
    /// Joins the election for `lease` in `namespace` as `identity` (usually the pod name).
    pub async fn join(client: &kube::Client, namespace: &str, lease: &str, identity: &str) -> Result<Leadership> {
        const DURATION: DurationSeconds = 15;
        const GRACE: DurationSeconds = 5;
        let manager = LeaseManagerBuilder::new(client.clone(), lease)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(DURATION)
            .with_grace(GRACE)
            .with_field_manager(crate::TOOL_NAME)
            .build()
            .await
            .map_err(|e| Error::Leader(e.to_string()))?;
        let (is_leader, _task) = manager.watch().await;
        Ok(Leadership { is_leader })
    }

    pub fn is_leader(&self) -> bool {
        *self.is_leader.borrow()
    }

    /// Waits until this instance leads.
    pub async fn acquired(&mut self) -> Result<()> {
        self.is_leader.wait_for(|leader| *leader).await.map_err(|_| Error::Leader("lease manager stopped".into()))?;
        info!("leadership acquired");
        Ok(())
    }

    /// Completes when leadership is lost (or the lease manager stops).
    pub async fn lost(&mut self) {
        let _ = self.is_leader.wait_for(|leader| !*leader).await;
    }
}
// Dropping the receiver closes the channel: the lease manager releases the lease and stops.
