//! Which objects to try again, and when: capped exponential backoff per object (kube-runtime's
//! requeue semantics: 1 s, 2 s, 4 s, ... up to a minute). Pure.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The first retry waits this long; each failure doubles it.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// No retry waits longer.
pub const MAX_RETRY: Duration = Duration::from_secs(60);

/// Failed objects by uid: failures so far, and when to try next (`None`: being tried now).
#[derive(Debug, Default)]
pub struct Retries {
    entries: HashMap<String, (u32, Option<Instant>)>,
}

impl Retries {
    /// Notes a failure at `now`; returns how long until the next try.
    pub fn failed(&mut self, uid: &str, now: Instant) -> Duration {
        let entry = self.entries.entry(uid.to_string()).or_insert((0, None));
        entry.0 += 1;
        let delay = backoff(entry.0);
        entry.1 = Some(now + delay);
        delay
    }

    /// The object was settled (restored, or nothing to do): no more retries.
    pub fn settled(&mut self, uid: &str) {
        self.entries.remove(uid);
    }

    /// The objects whose next try is due at `now`, marked as being tried.
    pub fn due(&mut self, now: Instant) -> Vec<String> {
        let mut due = Vec::new();
        for (uid, (_, next)) in &mut self.entries {
            if next.is_some_and(|at| at <= now) {
                *next = None;
                due.push(uid.clone());
            }
        }
        due.sort();
        due
    }

    /// Whether the object's last try failed (it waits for a retry or is being retried).
    pub fn contains(&self, uid: &str) -> bool {
        self.entries.contains_key(uid)
    }

    /// Objects waiting for a retry or being retried.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The wait before try `failures + 1`.
pub fn backoff(failures: u32) -> Duration {
    FIRST_RETRY.saturating_mul(1 << failures.saturating_sub(1).min(16)).min(MAX_RETRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let waits: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(backoff(1000), MAX_RETRY);
    }

    #[test]
    fn a_failed_object_is_due_after_its_backoff_and_forgotten_once_settled() {
        let mut retries = Retries::default();
        let t0 = Instant::now();
        assert_eq!(retries.failed("a", t0), Duration::from_secs(1));
        assert!(retries.due(t0).is_empty());
        assert_eq!(retries.due(t0 + Duration::from_secs(1)), ["a"]);
        assert!(retries.due(t0 + Duration::from_secs(5)).is_empty(), "being tried: not due twice");
        assert_eq!(retries.failed("a", t0 + Duration::from_secs(1)), Duration::from_secs(2));
        assert_eq!(retries.len(), 1);
        retries.settled("a");
        assert!(retries.is_empty());
    }
}
