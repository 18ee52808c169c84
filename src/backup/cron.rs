//! Schedules with Kubernetes CronJob semantics: five fields, UTC, Sunday is 0 or 7, and when
//! both day-of-month and day-of-week are restricted either one matches. Pure: the loop that
//! fires at these times is `backup::schedule::run`.

use std::str::FromStr;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;
use jiff::tz::TimeZone;

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

    /// Fire times strictly after `fired` and not after `now`: the runs a backup that ended at
    /// `now` made the schedule miss.
    pub fn missed_between(&self, fired: Timestamp, now: Timestamp) -> usize {
        let mut count = 0;
        let mut t = fired;
        while let Some(next) = self.next_after(t) {
            if next > now || count > 10_000 {
                break;
            }
            count += 1;
            t = next;
        }
        count
    }
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
        assert_eq!(s.missed_between(fired, "2026-11-30T10:35:00Z".parse().unwrap()), 3);
        assert_eq!(s.missed_between(fired, "2026-11-30T10:05:00Z".parse().unwrap()), 0);
    }
}
