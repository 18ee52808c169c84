//! Prometheus metrics of the restore controller, served on `/metrics`, with the bucket's view of
//! the newest snapshot ([`NewestSnapshotMetrics`], shared with `restatus schedule`).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::restore::Verdict;

pub use crate::metrics::{ClusterLabel, NewestSnapshotMetrics, OPENMETRICS_CONTENT_TYPE, render};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabel {
    pub verdict: String,
}

pub struct Metrics {
    registry: Registry,
    pub decisions: Family<VerdictLabel, Counter>,
    pub errors: Counter,
    pub snapshot_timestamp: Gauge<f64, AtomicU64>,
    /// Journal segments applied on top of the snapshot in use (0: the snapshot alone).
    pub snapshot_segments: Gauge,
    pub restore_latency: Histogram,
    pub leader: Gauge,
    /// Objects carrying restatus's own `ignore` now.
    pub quiesced: Gauge,
    /// Objects whose restore failed, waiting for a retry.
    pub retrying: Gauge,
    /// Watch events waiting for the main loop, each object's newest only.
    pub watch_pending: Gauge,
    /// Objects waiting in the work queue, and being reconciled now.
    pub queue_waiting: Gauge,
    pub reconciling: Gauge,
    /// The adaptive limit on the writes in flight now (`k8s::limit`), and the times the API
    /// server shed load and it halved.
    pub write_limit: Gauge,
    pub write_limit_halvings: Gauge,
    /// 1 while a kind of the profile cannot be watched (not served, forbidden).
    pub kind_unavailable: Family<KindLabel, Gauge>,
    /// The newest snapshot in the bucket, refreshed by every replica (see `context::export_newest`).
    pub newest: NewestSnapshotMetrics,
    /// 1 while the snapshot in use is gone from the bucket and nothing newer is good (the
    /// controller keeps it rather than going back to an older one).
    pub snapshot_in_use_gone: Gauge,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("restatus");
        crate::metrics::register_build_info(&mut registry);
        let decisions = Family::<VerdictLabel, Counter>::default();
        registry.register("decisions", "Objects decided by the restore controller, by verdict", decisions.clone());
        let errors = Counter::default();
        registry.register("errors", "Failed restores and snapshot loads", errors.clone());
        let snapshot_timestamp = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "snapshot_timestamp_seconds",
            "Point in time the controller restores to (Unix seconds): the snapshot's capture, or the last journal segment applied",
            snapshot_timestamp.clone(),
        );
        let snapshot_segments = Gauge::default();
        registry.register(
            "snapshot_journal_segments",
            "Journal segments applied on top of the snapshot in use (0: the snapshot alone)",
            snapshot_segments.clone(),
        );
        let restore_latency = Histogram::new(exponential_buckets(0.01, 2.0, 12));
        registry.register(
            "restore_latency_seconds",
            "From the watch event that showed an object to its status restored",
            restore_latency.clone(),
        );
        let leader = Gauge::default();
        registry.register("leader", "1 while this instance holds the lease", leader.clone());
        let quiesced = Gauge::default();
        registry.register("objects_quiesced", "Objects carrying restatus's own ignore", quiesced.clone());
        let retrying = Gauge::default();
        registry.register("objects_retrying", "Objects whose restore failed, waiting for a retry", retrying.clone());
        let watch_pending = Gauge::default();
        registry.register(
            "watch_pending",
            "Watch events waiting for the controller's main loop (each object's newest only)",
            watch_pending.clone(),
        );
        let queue_waiting = Gauge::default();
        registry.register("queue_waiting", "Dirty objects waiting to be reconciled", queue_waiting.clone());
        let reconciling = Gauge::default();
        registry.register("reconciling", "Objects being reconciled now", reconciling.clone());
        let write_limit = Gauge::default();
        registry.register(
            "write_limit",
            "Writes the controller lets be in flight at once now: grows while the API server's latency stays flat, halves when it sheds load",
            write_limit.clone(),
        );
        let write_limit_halvings = Gauge::default();
        registry.register(
            "write_limit_halvings",
            "Times the API server shed the controller's writes (429, 503, 504, Retry-After) and the write limit halved",
            write_limit_halvings.clone(),
        );
        let kind_unavailable = Family::<KindLabel, Gauge>::default();
        registry.register(
            "kind_unavailable",
            "1 while a kind of the profile cannot be watched (not served, forbidden)",
            kind_unavailable.clone(),
        );
        let newest = NewestSnapshotMetrics::default();
        newest.register(&mut registry);
        let snapshot_in_use_gone = Gauge::default();
        registry.register(
            "snapshot_in_use_gone",
            "1 while the snapshot the controller uses is gone from the bucket and no newer one is good: it keeps it rather than going back in time",
            snapshot_in_use_gone.clone(),
        );
        Metrics {
            registry,
            decisions,
            errors,
            snapshot_timestamp,
            snapshot_segments,
            restore_latency,
            leader,
            quiesced,
            retrying,
            watch_pending,
            queue_waiting,
            reconciling,
            write_limit,
            write_limit_halvings,
            kind_unavailable,
            newest,
            snapshot_in_use_gone,
        }
    }
}

impl Metrics {
    pub fn decided(&self, verdict: Verdict) {
        self.decisions.get_or_create(&VerdictLabel { verdict: verdict.to_string() }).inc();
    }

    pub fn unavailable(&self, kind: &str, unavailable: bool) {
        self.kind_unavailable.get_or_create(&KindLabel { kind: kind.to_string() }).set(i64::from(unavailable));
    }

    /// Exports what `limit` is now.
    pub fn write_limit(&self, limit: &crate::k8s::WriteLimit) {
        let report = limit.report();
        self.write_limit.set(report.final_limit as i64);
        self.write_limit_halvings.set(report.halvings as i64);
    }

    pub fn render(&self) -> String {
        render(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::WriteLimit;

    /// `/metrics` says where the controller's write limit is, and how often the API server
    /// shed its writes.
    #[tokio::test]
    async fn the_write_limit_and_its_halvings_are_exported() {
        let metrics = Metrics::default();
        let limit = WriteLimit::new(16, 64);
        metrics.write_limit(&limit);
        let text = metrics.render();
        assert!(text.contains("restatus_write_limit 16\n"), "{text}");
        assert!(text.contains("restatus_write_limit_halvings 0\n"), "{text}");
        let mut permit = limit.acquire().await;
        permit.answered(http::StatusCode::TOO_MANY_REQUESTS, &http::HeaderMap::new());
        drop(permit);
        metrics.write_limit(&limit);
        let text = metrics.render();
        assert!(text.contains("restatus_write_limit 8\n"), "{text}");
        assert!(text.contains("restatus_write_limit_halvings 1\n"), "{text}");
    }
}
