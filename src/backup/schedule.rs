//! Schedules with Kubernetes CronJob semantics: five fields, UTC, Sunday is 0 or 7, and when
//! both day-of-month and day-of-week are restricted either one matches.
//!
//! [`Schedule`] is pure; [`run`] is the loop: never two backups at once, missed runs are not
//! caught up (after a long backup the next run is the next time that is still ahead), and a
//! shutdown signal lets a running backup finish, then stops.

use std::future::Future;
use std::str::FromStr;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;
use jiff::tz::TimeZone;
use tracing::{error, info, warn};

use crate::Error;

#[derive(Debug, Clone)]
pub struct Schedule {
    expression: String,
    cron: Cron,
}

impl FromStr for Schedule {
    type Err = Error;

    fn from_str(expression: &str) -> Result<Self, Error> {
        let err = |reason: String| Error::Cron { expression: expression.into(), reason };
        let trimmed = expression.trim();
        if !trimmed.starts_with('@') && trimmed.split_whitespace().count() != 5 {
            return Err(err("a schedule has five fields: minute hour day-of-month month day-of-week".into()));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(trimmed)
            .map_err(|e| err(e.to_string()))?;
        Ok(Schedule { expression: trimmed.to_string(), cron })
    }
}

impl Schedule {
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The first fire time strictly after `after`.
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let zoned = after.to_zoned(TimeZone::UTC);
        self.cron.find_next_occurrence(&zoned, false).ok().map(|z| z.timestamp())
    }
}

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
        let missed = missed_between(schedule, next, Timestamp::now());
        if missed > 0 {
            warn!(missed, since = %started, "backup outlasted fire times; they are skipped, not caught up");
        }
    }
}

/// Fire times strictly after `fired` and not after `now`.
fn missed_between(schedule: &Schedule, fired: Timestamp, now: Timestamp) -> usize {
    let mut count = 0;
    let mut t = fired;
    while let Some(next) = schedule.next_after(t) {
        if next > now || count > 10_000 {
            break;
        }
        count += 1;
        t = next;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::Weekday;

    fn next(expr: &str, after: &str) -> Timestamp {
        expr.parse::<Schedule>().unwrap().next_after(after.parse().unwrap()).unwrap()
    }

    #[test]
    fn monday_at_three_fires_on_monday() {
        // 2026-11-30 is a Monday.
        let t = next("0 3 * * 1", "2026-11-27T12:00:00Z");
        assert_eq!(t, "2026-11-30T03:00:00Z".parse().unwrap());
        assert_eq!(t.to_zoned(TimeZone::UTC).weekday(), Weekday::Monday);
        assert_eq!(next("0 3 * * MON", "2026-11-27T12:00:00Z"), t);
    }

    #[test]
    fn sunday_is_zero_and_seven() {
        let zero = next("0 0 * * 0", "2026-11-30T00:00:00Z");
        let seven = next("0 0 * * 7", "2026-11-30T00:00:00Z");
        assert_eq!(zero, seven);
        assert_eq!(zero.to_zoned(TimeZone::UTC).weekday(), Weekday::Sunday);
        assert_eq!(zero, "2026-12-06T00:00:00Z".parse().unwrap());
    }

    #[test]
    fn day_of_month_or_day_of_week_when_both_are_set() {
        // Vixie/Kubernetes: the 15th OR any Friday. After Mon 30 Nov: Fri 4 Dec comes first.
        assert_eq!(next("0 0 15 * 5", "2026-11-30T00:00:00Z"), "2026-12-04T00:00:00Z".parse().unwrap());
        // After Sat 5 Dec: Fri 11 Dec, then the 15th (a Tuesday).
        assert_eq!(next("0 0 15 * 5", "2026-12-11T00:00:00Z"), "2026-12-15T00:00:00Z".parse().unwrap());
    }

    #[test]
    fn steps_ranges_and_macros() {
        assert_eq!(next("*/15 * * * *", "2026-11-30T10:07:00Z"), "2026-11-30T10:15:00Z".parse().unwrap());
        assert_eq!(next("0 9-17/4 * * 1-5", "2026-11-30T10:00:00Z"), "2026-11-30T13:00:00Z".parse().unwrap());
        assert_eq!(next("@daily", "2026-11-30T10:00:00Z"), "2026-12-01T00:00:00Z".parse().unwrap());
        assert_eq!(next("@hourly", "2026-11-30T10:00:00Z"), "2026-11-30T11:00:00Z".parse().unwrap());
    }

    #[test]
    fn rejects_what_kubernetes_rejects() {
        for bad in ["", "* * * *", "0 0 3 * * 1", "61 * * * *", "0 25 * * *", "0 0 * * 8", "0 0 32 * *", "nonsense"] {
            let err = bad.parse::<Schedule>().unwrap_err().to_string();
            assert!(err.starts_with("cron expression"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn missed_runs_are_counted_not_caught_up() {
        let s: Schedule = "*/10 * * * *".parse().unwrap();
        let fired: Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        assert_eq!(missed_between(&s, fired, "2026-11-30T10:35:00Z".parse().unwrap()), 3);
        assert_eq!(missed_between(&s, fired, "2026-11-30T10:05:00Z".parse().unwrap()), 0);
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
