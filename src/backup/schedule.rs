//! The backup schedule's loop, on the times of a [`Schedule`] (`backup/cron.rs`, Kubernetes
//! CronJob semantics).
//!
//! [`run`] is the loop: never two backups at once, missed runs are not
//! caught up (after a long backup the next run is the next time that is still ahead), and a
//! shutdown signal lets a running backup finish, then stops. [`ScheduleMetrics`] is what the
//! schedule exports on `/metrics`.

use std::future::Future;
use std::sync::atomic::AtomicU64;

use jiff::Timestamp;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::{error, info, warn};

pub use crate::backup::cron::Schedule;
use crate::format::Manifest;
use crate::metrics::{ClusterLabel, NewestSnapshotMetrics};

/// Runs `job` at every fire time of `schedule` until `shutdown` completes. `job` errors are
/// logged and the schedule goes on. Returns how many runs happened.
pub async fn run<J, F>(schedule: &Schedule, mut job: J, shutdown: impl Future<Output = ()>) -> u64
where
    J: FnMut() -> F,
    F: Future<Output = crate::Result<()>>,
{
    tokio::pin!(shutdown);
    let mut runs = 0;
    loop {
        let now = Timestamp::now();
        let Some(next) = schedule.next_after(now) else {
            warn!(schedule = schedule.expression(), "schedule has no future fire time; stopping");
            return runs;
        };
        info!(schedule = schedule.expression(), next = %next, "waiting for the next run");
        let wait: std::time::Duration = now.duration_until(next).try_into().unwrap_or_default();
        tokio::select! {
            _ = &mut shutdown => {
                info!("shutdown requested; no backup was running");
                return runs;
            }
            _ = tokio::time::sleep(wait) => {}
        }
        // A shutdown during a backup lets that backup finish (its manifest is worth having),
        // then stops; the pod's grace period bounds how long that may take.
        let started = Timestamp::now();
        let run_job = job();
        tokio::pin!(run_job);
        let (result, stopping) = tokio::select! {
            result = &mut run_job => (result, false),
            _ = &mut shutdown => {
                info!("shutdown requested; finishing the running backup first");
                (run_job.await, true)
            }
        };
        runs += 1;
        if let Err(e) = result {
            error!(error = %e, "scheduled backup failed");
        }
        if stopping {
            return runs;
        }
        let missed = schedule.missed_between(next, Timestamp::now());
        if missed > 0 {
            warn!(missed, since = %started, "backup outlasted fire times; they are skipped, not caught up");
        }
    }
}

/// What `restatus schedule` exports on `/metrics`: its own backups' outcome, and the bucket's
/// newest snapshot (refreshed at start and after each backup).
pub struct ScheduleMetrics {
    registry: Registry,
    cluster_id: ClusterLabel,
    pub newest: NewestSnapshotMetrics,
    last_success: Family<ClusterLabel, Gauge<f64, AtomicU64>>,
    backups: Family<OutcomeLabel, Counter>,
    duration: Family<ClusterLabel, Gauge<f64, AtomicU64>>,
    records: Family<ClusterLabel, Gauge>,
    bytes: Family<ClusterLabel, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub cluster_id: String,
    /// `success` or `failure`.
    pub outcome: String,
}

impl ScheduleMetrics {
    /// Every series exists from the start, at 0: a first failure is then an increase.
    pub fn new(cluster_id: &str) -> Self {
        let mut registry = Registry::with_prefix("restatus");
        crate::metrics::register_build_info(&mut registry);
        let newest = NewestSnapshotMetrics::default();
        newest.register(&mut registry);
        let last_success = Family::<ClusterLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "backup_last_success_timestamp_seconds",
            "When this process's last successful backup completed (Unix seconds, 0 before)",
            last_success.clone(),
        );
        let backups = Family::<OutcomeLabel, Counter>::default();
        registry.register("backups", "Backups this process ran, by outcome", backups.clone());
        let duration = Family::<ClusterLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "backup_duration_seconds",
            "Wall time of this process's last backup, either outcome",
            duration.clone(),
        );
        let records = Family::<ClusterLabel, Gauge>::default();
        registry.register("backup_records", "Records of the last successful backup", records.clone());
        let bytes = Family::<ClusterLabel, Gauge>::default();
        registry.register("backup_bytes", "Payload bytes of the last successful backup", bytes.clone());
        let label = ClusterLabel { cluster_id: cluster_id.to_string() };
        for family in [&last_success, &duration] {
            drop(family.get_or_create(&label));
        }
        for family in [&records, &bytes] {
            drop(family.get_or_create(&label));
        }
        for outcome in ["success", "failure"] {
            drop(backups.get_or_create(&OutcomeLabel { cluster_id: cluster_id.to_string(), outcome: outcome.into() }));
        }
        ScheduleMetrics { registry, cluster_id: label, newest, last_success, backups, duration, records, bytes }
    }

    /// Records one backup: its manifest when it succeeded, and how long it took.
    pub fn backup_finished(&self, manifest: Option<&Manifest>, took: std::time::Duration) {
        let outcome = if manifest.is_some() { "success" } else { "failure" };
        let outcome = OutcomeLabel { cluster_id: self.cluster_id.cluster_id.clone(), outcome: outcome.into() };
        self.backups.get_or_create(&outcome).inc();
        self.duration.get_or_create(&self.cluster_id).set(took.as_secs_f64());
        if let Some(m) = manifest {
            let done = m.completed_at.max(m.created_at);
            self.last_success.get_or_create(&self.cluster_id).set(done.as_millisecond() as f64 / 1000.0);
            self.records.get_or_create(&self.cluster_id).set(i64::try_from(m.payload.records).unwrap_or(i64::MAX));
            self.bytes.get_or_create(&self.cluster_id).set(i64::try_from(m.payload.size).unwrap_or(i64::MAX));
        }
    }

    /// The OpenMetrics text of `/metrics`.
    pub fn render(&self) -> String {
        crate::metrics::render(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_metrics_count_outcomes_and_keep_the_last_success() {
        let metrics = ScheduleMetrics::new("c");
        let value = |text: &str, series: &str| {
            text.lines().find(|l| l.starts_with(series)).and_then(|l| l.rsplit(' ').next()).map(str::to_string)
        };
        let text = metrics.render();
        assert_eq!(value(&text, r#"restatus_backups_total{cluster_id="c",outcome="failure"}"#).as_deref(), Some("0"));
        assert_eq!(value(&text, "restatus_backup_last_success_timestamp_seconds").as_deref(), Some("0.0"));

        let at: Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        let mut manifest = crate::fixtures::manifest(crate::format::SnapshotId::new(at), at);
        manifest.payload.records = 12;
        manifest.payload.size = 3456;
        metrics.backup_finished(Some(&manifest), std::time::Duration::from_millis(1500));
        metrics.backup_finished(None, std::time::Duration::from_secs(3));
        let text = metrics.render();
        assert_eq!(value(&text, r#"restatus_backups_total{cluster_id="c",outcome="success"}"#).as_deref(), Some("1"));
        assert_eq!(value(&text, r#"restatus_backups_total{cluster_id="c",outcome="failure"}"#).as_deref(), Some("1"));
        // The failure does not erase what the last success wrote; the duration is the last run's.
        assert_eq!(value(&text, "restatus_backup_records").as_deref(), Some("12"));
        assert_eq!(value(&text, "restatus_backup_bytes").as_deref(), Some("3456"));
        assert_eq!(value(&text, "restatus_backup_duration_seconds").as_deref(), Some("3.0"));
        let success: f64 = value(&text, "restatus_backup_last_success_timestamp_seconds").unwrap().parse().unwrap();
        assert!(success >= at.as_second() as f64, "{success}");
    }

    #[tokio::test(start_paused = true)]
    async fn runs_never_overlap_and_stop_on_shutdown() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let schedule: Schedule = "* * * * *".parse().unwrap();
        let running = Arc::new(AtomicUsize::new(0));
        let max_seen = Arc::new(AtomicUsize::new(0));
        let (r, m) = (running.clone(), max_seen.clone());
        let job = move || {
            let (r, m) = (r.clone(), m.clone());
            async move {
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(now, Ordering::SeqCst);
                // Longer than the one-minute period.
                tokio::time::sleep(std::time::Duration::from_secs(150)).await;
                r.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
        };
        let shutdown = tokio::time::sleep(std::time::Duration::from_secs(600));
        let runs = run(&schedule, job, shutdown).await;
        assert_eq!(max_seen.load(Ordering::SeqCst), 1, "two backups overlapped");
        assert!((2..=4).contains(&runs), "runs = {runs}");
    }
}
