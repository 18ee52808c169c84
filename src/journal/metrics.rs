//! What `restatus journal --metrics-addr` exports on `/metrics`, and its readiness.
//!
//! The lag is the time from a change's watch event arriving to its segment's header being in
//! the bucket: per change written (a histogram), and now (a gauge: the age of the oldest change
//! not yet in the bucket, computed at each scrape, so that it keeps growing while the loop
//! waits on a bucket that does not answer; 0 when nothing is pending, as for an idle fleet).

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::format::SnapshotId;
use crate::metrics::{ClusterLabel, render};

/// What failed, on `restatus_journal_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalError {
    /// A segment not written (its changes wait for the next).
    Segment,
    /// The bucket could not be asked for a newer base.
    Base,
    /// A watch interrupted by an error (it resumes after a backoff).
    Watch,
}

impl JournalError {
    fn as_str(self) -> &'static str {
        match self {
            JournalError::Segment => "segment",
            JournalError::Base => "base",
            JournalError::Watch => "watch",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    cluster_id: String,
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BaseLabel {
    cluster_id: String,
    base: String,
}

/// Lag buckets, seconds: from a fraction of an interval to an hour.
const LAG_BUCKETS: [f64; 14] = [0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0];

fn lag_histogram() -> Histogram {
    Histogram::new(LAG_BUCKETS)
}

/// Readiness and the current lag's reference, shared between the loop and the scrapes.
#[derive(Debug, Default)]
struct Live {
    /// When the oldest change not yet in the bucket was observed.
    oldest: Option<Instant>,
    /// Why the journal is not journaling (`None`: it is).
    not_ready: Option<String>,
}

/// The journal's metrics. Every series exists from the start (counters at 0, the lag 0), so
/// that a first error is an increase.
pub struct JournalMetrics {
    registry: Registry,
    cluster: ClusterLabel,
    live: Mutex<Live>,
    lag: Family<ClusterLabel, Gauge<f64, AtomicU64>>,
    change_lag: Family<ClusterLabel, Histogram, fn() -> Histogram>,
    segments: Family<ClusterLabel, Counter>,
    bytes: Family<ClusterLabel, Counter>,
    changes: Family<ClusterLabel, Counter>,
    errors: Family<OperationLabel, Counter>,
    pending: Family<ClusterLabel, Gauge>,
    newest_segment: Family<ClusterLabel, Gauge<f64, AtomicU64>>,
    chain_segments: Family<ClusterLabel, Gauge>,
    base_timestamp: Family<ClusterLabel, Gauge<f64, AtomicU64>>,
    base: Family<BaseLabel, Gauge>,
    ready: Family<ClusterLabel, Gauge>,
}

impl std::fmt::Debug for JournalMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalMetrics").field("cluster", &self.cluster.cluster_id).finish_non_exhaustive()
    }
}

fn seconds(at: Timestamp) -> f64 {
    at.as_millisecond() as f64 / 1000.0
}

impl JournalMetrics {
    pub fn new(cluster_id: &str) -> Self {
        let mut registry = Registry::with_prefix("restatus");
        crate::metrics::register_build_info(&mut registry);
        let metrics = JournalMetrics {
            registry: Registry::default(),
            cluster: ClusterLabel { cluster_id: cluster_id.to_string() },
            live: Mutex::new(Live { oldest: None, not_ready: Some("no base snapshot chained yet".into()) }),
            lag: Family::default(),
            change_lag: Family::new_with_constructor(lag_histogram),
            segments: Family::default(),
            bytes: Family::default(),
            changes: Family::default(),
            errors: Family::default(),
            pending: Family::default(),
            newest_segment: Family::default(),
            chain_segments: Family::default(),
            base_timestamp: Family::default(),
            base: Family::default(),
            ready: Family::default(),
        };
        registry.register(
            "journal_lag_seconds",
            "Age of the oldest status change the journal observed that is not in the bucket yet (0 when none is pending)",
            metrics.lag.clone(),
        );
        registry.register(
            "journal_change_lag_seconds",
            "Per change journaled: from its watch event's arrival to its segment's header in the bucket",
            metrics.change_lag.clone(),
        );
        registry.register("journal_segments", "Segments the journal wrote", metrics.segments.clone());
        registry.register(
            "journal_bytes",
            "Bytes of the segments the journal wrote (records as stored, and headers)",
            metrics.bytes.clone(),
        );
        registry.register(
            "journal_changes",
            "Changes journaled: objects whose status changed, and tombstones",
            metrics.changes.clone(),
        );
        registry.register(
            "journal_errors",
            "Journal errors, by operation: segment (not written), base (newer base not looked up), watch",
            metrics.errors.clone(),
        );
        registry.register(
            "journal_pending_changes",
            "Objects with a change observed and not in the bucket yet",
            metrics.pending.clone(),
        );
        registry.register(
            "journal_newest_segment_timestamp_seconds",
            "The point in time (to) of the newest segment of the chain in use (Unix seconds, 0 while it has none)",
            metrics.newest_segment.clone(),
        );
        registry.register(
            "journal_chain_segments",
            "Segments in the chain in use (read at start, then written)",
            metrics.chain_segments.clone(),
        );
        registry.register(
            "journal_base_timestamp_seconds",
            "Capture start of the base snapshot the chain in use starts at (Unix seconds, 0 while none)",
            metrics.base_timestamp.clone(),
        );
        registry.register(
            "journal_base",
            "1 for the base snapshot the chain in use starts at (label base: its id)",
            metrics.base.clone(),
        );
        registry.register(
            "journal_ready",
            "1 while the journal journals (a base chained, every kind listed, the chain extendable), else 0",
            metrics.ready.clone(),
        );
        let label = &metrics.cluster;
        metrics.lag.get_or_create(label).set(0.0);
        let _ = metrics.change_lag.get_or_create(label);
        for family in [&metrics.segments, &metrics.bytes, &metrics.changes] {
            let _ = family.get_or_create(label);
        }
        for operation in [JournalError::Segment, JournalError::Base, JournalError::Watch] {
            let _ = metrics.errors.get_or_create(&metrics.operation(operation));
        }
        metrics.pending.get_or_create(label).set(0);
        metrics.newest_segment.get_or_create(label).set(0.0);
        metrics.chain_segments.get_or_create(label).set(0);
        metrics.base_timestamp.get_or_create(label).set(0.0);
        metrics.ready.get_or_create(label).set(0);
        JournalMetrics { registry, ..metrics }
    }

    fn operation(&self, operation: JournalError) -> OperationLabel {
        OperationLabel { cluster_id: self.cluster.cluster_id.clone(), operation: operation.as_str().into() }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The oldest change not yet in the bucket (observed then), and how many objects have one.
    pub fn pending(&self, oldest: Option<Instant>, objects: usize) {
        self.live().oldest = oldest;
        self.pending.get_or_create(&self.cluster).set(i64::try_from(objects).unwrap_or(i64::MAX));
    }

    /// A segment is in the bucket: `bytes` written, the lag of each of its changes, its point.
    pub fn written(&self, bytes: u64, lags: impl IntoIterator<Item = Duration>, to: Timestamp, chain_segments: u64) {
        let label = &self.cluster;
        self.segments.get_or_create(label).inc();
        self.bytes.get_or_create(label).inc_by(bytes);
        let histogram = self.change_lag.get_or_create(label);
        let mut changes = 0;
        for lag in lags {
            histogram.observe(lag.as_secs_f64());
            changes += 1;
        }
        self.changes.get_or_create(label).inc_by(changes);
        self.newest_segment.get_or_create(label).set(seconds(to));
        self.chain_segments.get_or_create(label).set(i64::try_from(chain_segments).unwrap_or(i64::MAX));
    }

    pub fn error(&self, operation: JournalError) {
        self.errors.get_or_create(&self.operation(operation)).inc();
    }

    /// The chain in use: its base (id, capture start), its segments and the newest one's point
    /// (`None`: it has none).
    pub fn chain(&self, base: &SnapshotId, base_time: Timestamp, segments: u64, newest: Option<Timestamp>) {
        let label = &self.cluster;
        self.base.clear();
        self.base.get_or_create(&BaseLabel { cluster_id: label.cluster_id.clone(), base: base.to_string() }).set(1);
        self.base_timestamp.get_or_create(label).set(seconds(base_time));
        self.chain_segments.get_or_create(label).set(i64::try_from(segments).unwrap_or(i64::MAX));
        self.newest_segment.get_or_create(label).set(newest.map_or(0.0, seconds));
    }

    /// Whether the journal journals now, or why not.
    pub fn ready(&self, not_ready: Option<String>) {
        self.ready.get_or_create(&self.cluster).set(i64::from(not_ready.is_none()));
        self.live().not_ready = not_ready;
    }

    /// `/readyz`: `Ok` while the journal journals, else why not.
    pub fn readiness(&self) -> Result<(), String> {
        match &self.live().not_ready {
            None => Ok(()),
            Some(reason) => Err(reason.clone()),
        }
    }

    /// The current lag at `now`: the age of the oldest change not in the bucket, 0 when none.
    pub fn lag_at(&self, now: Instant) -> Duration {
        self.live().oldest.map_or(Duration::ZERO, |at| now.saturating_duration_since(at))
    }

    /// The OpenMetrics text, the current lag taken now.
    pub fn render(&self) -> String {
        self.lag.get_or_create(&self.cluster).set(self.lag_at(Instant::now()).as_secs_f64());
        render(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find(|l| l.starts_with(series)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
    }

    /// Before anything happens every series exists: the lag 0, the counters 0, not ready.
    #[test]
    fn every_series_exists_from_the_start_and_the_lag_is_zero() {
        let metrics = JournalMetrics::new("c");
        let text = metrics.render();
        let label = r#"{cluster_id="c"}"#;
        assert_eq!(value(&text, &format!("restatus_journal_lag_seconds{label}")), Some(0.0), "{text}");
        for name in ["segments", "bytes", "changes"] {
            assert_eq!(value(&text, &format!("restatus_journal_{name}_total{label}")), Some(0.0), "{name}: {text}");
        }
        for operation in ["segment", "base", "watch"] {
            let series = format!(r#"restatus_journal_errors_total{{cluster_id="c",operation="{operation}"}}"#);
            assert_eq!(value(&text, &series), Some(0.0), "{series}: {text}");
        }
        assert_eq!(value(&text, &format!("restatus_journal_change_lag_seconds_count{label}")), Some(0.0), "{text}");
        assert_eq!(value(&text, &format!("restatus_journal_ready{label}")), Some(0.0));
        assert!(metrics.readiness().unwrap_err().contains("no base snapshot"));
        assert!(text.contains("restatus_build_info{") && text.ends_with("# EOF\n"), "{text}");
    }

    /// The gauge is the age of the oldest pending change at each scrape; the histogram counts
    /// each change written with its lag; the base's series follow the chain in use.
    #[test]
    fn lag_counters_and_base_follow_what_the_journal_reports() {
        let metrics = JournalMetrics::new("c");
        let t0 = Instant::now();
        metrics.pending(Some(t0), 2);
        assert_eq!(metrics.lag_at(t0 + Duration::from_secs(7)), Duration::from_secs(7));
        assert!(metrics.lag_at(t0) < Duration::from_secs(1));
        let to: Timestamp = "2026-12-03T10:00:05Z".parse().unwrap();
        metrics.written(1000, [Duration::from_millis(1500), Duration::from_secs(40)], to, 3);
        metrics.pending(None, 0);
        metrics.error(JournalError::Segment);
        let base = SnapshotId::new("2026-12-03T09:00:00Z".parse().unwrap());
        metrics.chain(&base, "2026-12-03T09:00:00Z".parse().unwrap(), 3, Some(to));
        let newer = SnapshotId::new("2026-12-03T10:00:00Z".parse().unwrap());
        metrics.chain(&newer, "2026-12-03T10:00:00Z".parse().unwrap(), 0, None);
        metrics.ready(None);
        let text = metrics.render();
        let label = r#"{cluster_id="c"}"#;
        let get = |name: &str| value(&text, &format!("{name}{label}")).unwrap_or_else(|| panic!("{name}: {text}"));
        assert_eq!(get("restatus_journal_lag_seconds"), 0.0, "nothing pending");
        assert_eq!(get("restatus_journal_segments_total"), 1.0);
        assert_eq!(get("restatus_journal_bytes_total"), 1000.0);
        assert_eq!(get("restatus_journal_changes_total"), 2.0);
        assert_eq!(get("restatus_journal_change_lag_seconds_count"), 2.0);
        assert_eq!(get("restatus_journal_change_lag_seconds_sum"), 41.5);
        let bucket = |le: &str| {
            value(&text, &format!(r#"restatus_journal_change_lag_seconds_bucket{{le="{le}",cluster_id="c"}}"#))
                .or_else(|| {
                    value(&text, &format!(r#"restatus_journal_change_lag_seconds_bucket{{cluster_id="c",le="{le}"}}"#))
                })
                .unwrap_or_else(|| panic!("bucket {le}: {text}"))
        };
        assert_eq!((bucket("1.0"), bucket("2.0"), bucket("30.0"), bucket("60.0")), (0.0, 1.0, 1.0, 2.0));
        let errors = r#"restatus_journal_errors_total{cluster_id="c",operation="segment"}"#;
        assert_eq!(value(&text, errors), Some(1.0));
        // The newer base replaced the older one: one base series, its chain empty so far.
        assert_eq!(text.matches("restatus_journal_base{").count(), 1, "{text}");
        assert_eq!(value(&text, &format!(r#"restatus_journal_base{{cluster_id="c",base="{newer}"}}"#)), Some(1.0));
        assert_eq!(get("restatus_journal_base_timestamp_seconds"), 1_796_292_000.0);
        assert_eq!(get("restatus_journal_newest_segment_timestamp_seconds"), 0.0);
        assert_eq!(get("restatus_journal_chain_segments"), 0.0);
        assert_eq!(get("restatus_journal_ready"), 1.0);
        assert_eq!(metrics.readiness(), Ok(()));
    }
}
