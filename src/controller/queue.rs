//! The work queue, pure: which dirty object starts next, which are being reconciled, and the
//! watch events of those in flight, held until their reconcile ends.
//!
//! An object is dirty (waiting), in flight (being reconciled), or neither. The next to start
//! is the best waiting one: an object that changed before one only woken (a retry, a new
//! snapshot, a partner that arrived), then the kinds in profile order (a Server before the
//! claims that wait for it to be Reserved for them), then the most recently dirtied (an object
//! arriving in the middle of a mass arrival does not wait for the backlog, which drains as soon
//! as arrivals pause); one start in [`OLDEST_EVERY`] takes the object that has waited longest,
//! so that none starves. An object is never reconciled twice at once: one dirtied while in flight
//! waits until its reconcile ends, then starts again. Taking, adding and finishing are
//! logarithmic in the objects waiting: no step scans the queue.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use super::index::Uid;

/// Why and since when an object is dirty; the greater starts first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Pending {
    /// The object itself changed or appeared (not only woken).
    pub changed: bool,
    /// Its kind's place in the profile (the first kind ranks highest).
    pub rank: Reverse<usize>,
    /// When it became dirty (kept while it stays dirty): its restore latency counts from here.
    pub seen: Instant,
}

impl Pending {
    /// `self` dirtied again by `other`: a change outranks a wake-up, the first time is kept.
    fn merge(self, other: Pending) -> Pending {
        Pending { changed: self.changed || other.changed, ..self }
    }
}

/// One start in this many takes the object that has waited longest, whatever its place in
/// the order: newest first alone starved the first objects of a mass arrival (the first single
/// Server created before it waited 143 s of a 184 s restore, in the arrival bench).
pub(super) const OLDEST_EVERY: usize = 4;

#[derive(Debug, Default)]
pub(super) struct WorkQueue {
    waiting: HashMap<Uid, Pending>,
    order: BTreeSet<(Pending, Uid)>,
    /// The same objects by when they became dirty.
    by_age: BTreeSet<(Instant, Uid)>,
    /// Starts so far, for [`OLDEST_EVERY`].
    starts: usize,
    /// Objects being reconciled.
    in_flight: HashMap<Uid, Flight>,
}

/// What happened to an object while it was being reconciled.
#[derive(Debug, Default)]
struct Flight {
    /// How it was dirtied again meanwhile (a wake-up, or the controller's own judgement).
    again: Option<Pending>,
    /// The resourceVersions of its watch events meanwhile, judged when its reconcile ends
    /// (echoes of its own writes, or another writer's change).
    events: Vec<String>,
}

impl WorkQueue {
    /// Marks `uid` dirty (merged with how it already is).
    pub fn add(&mut self, uid: Uid, pending: Pending) {
        if let Some(flight) = self.in_flight.get_mut(&uid) {
            flight.again = Some(flight.again.map_or(pending, |a| a.merge(pending)));
            return;
        }
        let merged = match self.waiting.get(&uid) {
            Some(&old) => {
                self.order.remove(&(old, uid.clone()));
                old.merge(pending)
            }
            None => {
                self.by_age.insert((pending.seen, uid.clone()));
                pending
            }
        };
        self.order.insert((merged, uid.clone()));
        self.waiting.insert(uid, merged);
    }

    /// The best waiting object (every [`OLDEST_EVERY`]th time the one that has waited
    /// longest), now in flight, with when it became dirty.
    pub fn take(&mut self) -> Option<(Uid, Instant)> {
        self.starts = self.starts.wrapping_add(1);
        let uid = match self.starts.is_multiple_of(OLDEST_EVERY) {
            true => self.by_age.first()?.1.clone(),
            false => self.order.last()?.1.clone(),
        };
        let pending = self.unwait(&uid)?;
        self.in_flight.insert(uid.clone(), Flight::default());
        Some((uid, pending.seen))
    }

    /// Removes a waiting object from the order and the ages.
    fn unwait(&mut self, uid: &str) -> Option<Pending> {
        let (uid, pending) = self.waiting.remove_entry(uid)?;
        self.by_age.remove(&(pending.seen, uid.clone()));
        self.order.remove(&(pending, uid));
        Some(pending)
    }

    /// A watch event of `uid` at `version`: kept if it is in flight (true), to be judged when
    /// its reconcile ends; otherwise left to the caller (false).
    pub fn hold_event(&mut self, uid: &str, version: &str) -> bool {
        let Some(flight) = self.in_flight.get_mut(uid) else { return false };
        flight.events.push(version.to_string());
        true
    }

    /// Its reconcile ended: dirtied again meanwhile, it waits again. Returns the versions of
    /// the events held meanwhile ([`Self::hold_event`]).
    pub fn finish(&mut self, uid: &Uid) -> Vec<String> {
        let Some(flight) = self.in_flight.remove(uid) else { return Vec::new() };
        if let Some(again) = flight.again {
            self.add(uid.clone(), again);
        }
        flight.events
    }

    /// The object is gone: not waiting, and not started again after its reconcile in flight.
    pub fn remove(&mut self, uid: &str) {
        self.unwait(uid);
        if let Some(flight) = self.in_flight.get_mut(uid) {
            flight.again = None;
        }
    }

    #[cfg(test)]
    pub fn is_waiting(&self, uid: &str) -> bool {
        self.waiting.contains_key(uid)
    }

    #[cfg(test)]
    pub fn pending(&self, uid: &str) -> Option<Pending> {
        self.waiting.get(uid).copied()
    }

    #[cfg(test)]
    pub fn in_flight(&self, uid: &str) -> bool {
        self.in_flight.contains_key(uid)
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn running(&self) -> usize {
        self.in_flight.len()
    }

    /// Nothing waits and nothing is in flight.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.in_flight.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn pending(seconds_ago: u64, changed: bool, rank: usize) -> Pending {
        Pending { changed, rank: Reverse(rank), seen: Instant::now() - Duration::from_secs(seconds_ago) }
    }

    fn drain(queue: &mut WorkQueue) -> Vec<String> {
        let taken: Vec<Uid> = std::iter::from_fn(|| queue.take()).map(|(uid, _)| uid).collect();
        for uid in &taken {
            queue.finish(uid);
        }
        taken.iter().map(|u| u.to_string()).collect()
    }

    /// Issue 22: changes before wake-ups, then the kinds in profile order, then the most
    /// recent first; the time each became dirty is kept.
    #[test]
    fn the_next_is_a_change_before_a_wakeup_then_the_first_kind_then_the_newest() {
        let mut queue = WorkQueue::default();
        let seen = pending(1, true, 1);
        queue.add("server-new".into(), seen);
        queue.add("server-old".into(), pending(30, true, 1));
        queue.add("claim-newest".into(), pending(0, true, 2));
        queue.add("woken-server".into(), pending(0, false, 1));
        queue.add("woken-claim".into(), pending(20, false, 2));
        queue.add("bmc".into(), pending(40, true, 0));
        assert_eq!(queue.take().map(|(uid, _)| uid.to_string()).as_deref(), Some("bmc"));
        assert_eq!(queue.take(), Some((Uid::from("server-new"), seen.seen)), "the time it became dirty is kept");
        // The fourth start takes the one that has waited longest.
        assert_eq!(drain(&mut queue), ["server-old", "woken-claim", "claim-newest", "woken-server"]);
        assert!(queue.take().is_none());
    }

    /// Issue 22: under a stream of newer arrivals the first ones do not starve: every
    /// [`OLDEST_EVERY`]th start takes the one that has waited longest.
    #[test]
    fn the_longest_waiting_object_starts_every_few_starts() {
        let mut queue = WorkQueue::default();
        for i in 0..12 {
            queue.add(format!("s{i:02}").into(), pending(100 - i, true, 1));
        }
        let started: Vec<String> = (0..8)
            .map(|i| {
                // A newer object arrives before each start.
                queue.add(format!("new{i}").into(), pending(0, true, 1));
                let (uid, _) = queue.take().unwrap();
                queue.finish(&uid);
                uid.to_string()
            })
            .collect();
        assert_eq!(started[3], "s00", "the oldest, at the fourth start");
        assert_eq!(started[7], "s01");
        assert!(
            started
                .iter()
                .enumerate()
                .filter(|(i, _)| !(i + 1).is_multiple_of(OLDEST_EVERY))
                .all(|(_, u)| u.starts_with("new"))
        );
        assert_eq!(queue.waiting(), 12, "10 old and 2 new left");
    }

    /// A change to an object already woken makes it a change (it keeps its time); a wake-up of
    /// an object already dirty changes nothing.
    #[test]
    fn a_change_outranks_a_wakeup_of_the_same_object() {
        let mut queue = WorkQueue::default();
        let woken = pending(5, false, 1);
        queue.add("a".into(), woken);
        queue.add("b".into(), pending(1, false, 1));
        queue.add("a".into(), pending(0, true, 1));
        assert_eq!(queue.pending("a"), Some(Pending { changed: true, ..woken }));
        queue.add("a".into(), pending(0, false, 1));
        assert_eq!(queue.pending("a"), Some(Pending { changed: true, ..woken }));
        assert_eq!(queue.waiting(), 2);
        assert_eq!(drain(&mut queue), ["a", "b"], "no stale entry left behind");
    }

    /// Issue 22: an object is never reconciled twice at once; dirtied while in flight, it
    /// waits for its reconcile to end (how it was dirtied merged), then starts again; one gone
    /// meanwhile does not.
    #[test]
    fn an_object_dirtied_while_in_flight_starts_again_after_its_reconcile_ends() {
        let mut queue = WorkQueue::default();
        queue.add("a".into(), pending(3, true, 1));
        queue.add("gone".into(), pending(2, true, 1));
        let (gone, _) = queue.take().unwrap();
        let (a, _) = queue.take().unwrap();
        assert_eq!((&*gone, &*a), ("gone", "a"), "the most recent first");
        assert!(queue.in_flight("a") && queue.running() == 2 && !queue.is_idle());
        let again = pending(0, false, 1);
        queue.add("a".into(), again);
        queue.add("a".into(), pending(0, true, 1));
        queue.add("gone".into(), pending(0, true, 1));
        assert!(queue.take().is_none(), "in flight: not started twice");
        assert!(queue.hold_event("a", "7") && queue.hold_event("a", "8") && !queue.hold_event("b", "1"));
        queue.remove("gone");
        assert_eq!(queue.finish(&a), ["7", "8"], "the events held while in flight");
        assert!(queue.finish(&gone).is_empty());
        assert_eq!(queue.pending("a"), Some(Pending { changed: true, ..again }));
        assert!(!queue.is_waiting("gone"));
        assert_eq!(drain(&mut queue), ["a"]);
        assert!(queue.is_idle());
    }

    /// Removing a waiting object leaves nothing behind; removing one never added is harmless.
    #[test]
    fn a_removed_object_is_not_taken() {
        let mut queue = WorkQueue::default();
        queue.add("a".into(), pending(1, true, 1));
        queue.add("b".into(), pending(0, true, 1));
        queue.remove("b");
        queue.remove("never");
        assert_eq!(drain(&mut queue), ["a"]);
        assert!(queue.is_idle());
    }
}
