//! Prometheus metrics of the restore controller, served on `/metrics`.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::restore::Verdict;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabel {
    pub verdict: String,
}

pub struct Metrics {
    registry: Registry,
    pub decisions: Family<VerdictLabel, Counter>,
    pub errors: Counter,
    pub snapshot_timestamp: Gauge<f64, AtomicU64>,
    pub restore_latency: Histogram,
    pub leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("restatus");
        let decisions = Family::<VerdictLabel, Counter>::default();
        registry.register("decisions", "Objects decided by the restore controller, by verdict", decisions.clone());
        let errors = Counter::default();
        registry.register("errors", "Failed restores and snapshot loads", errors.clone());
        let snapshot_timestamp = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "snapshot_timestamp_seconds",
            "Capture time of the snapshot in use (Unix seconds)",
            snapshot_timestamp.clone(),
        );
        let restore_latency = Histogram::new(exponential_buckets(0.01, 2.0, 12));
        registry.register(
            "restore_latency_seconds",
            "From the watch event that showed an object to its status restored",
            restore_latency.clone(),
        );
        let leader = Gauge::default();
        registry.register("leader", "1 while this instance holds the lease", leader.clone());
        Metrics { registry, decisions, errors, snapshot_timestamp, restore_latency, leader }
    }
}

impl Metrics {
    pub fn decided(&self, verdict: Verdict) {
        self.decisions.get_or_create(&VerdictLabel { verdict: verdict.to_string() }).inc();
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
