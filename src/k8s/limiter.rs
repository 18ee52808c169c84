//! The adaptive limit on the writes in flight to one API server (issue 22): the API server is
//! the only limit. A [`Limiter`] (pure: it decides from what it is told) starts at
//! `--concurrency` (default [`DEFAULT_START`]), grows by one for each window of successes whose
//! latency stays within [`LATENCY_TOLERANCE`] times its recent minimum, halves (not below 1)
//! when the API server sheds load (429, 503, 504, an API Priority and Fairness rejection, any
//! answer with `Retry-After`), and never exceeds `--max-concurrency` (default [`DEFAULT_MAX`]).
//! In the spirit of Netflix's concurrency-limits (AIMD with a latency gate): one window is
//! `limit` successes (a round trip of the whole limit), and one halving per window, so the
//! answers to requests sent before a halving do not halve it again.
//!
//! The gate the writes pass, on this decision, is `k8s/limit.rs`.

use std::collections::VecDeque;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde::Serialize;

/// The limit a run starts at unless told otherwise (`--concurrency`).
pub const DEFAULT_START: usize = 16;

/// The highest the limit grows to unless told otherwise (`--max-concurrency`): beyond it a
/// single kube-apiserver's write path (etcd's, really) gains nothing in the bench and adds
/// queueing; a larger API server can be given more.
pub const DEFAULT_MAX: usize = 64;

/// A window's mean latency may be up to this many times the lowest of the recent windows' and
/// still count as flat: the API server is not queueing the writes (yet).
pub const LATENCY_TOLERANCE: f64 = 2.0;

/// How many flat windows' mean latencies the recent minimum is taken over (windows slower than
/// the tolerance are not taken in; a halving forgets them all, so that after the API server
/// shed load its latency at the lower limit becomes the normal). Until commit 3217eaa every
/// window was taken in, over the last 8: the limit grows by one a window, and a saturated API
/// server's latency with it, a little a window, so such a ramp never looked twice as slow as
/// its start, and the limit grew to the max on an API server whose throughput was flat
/// (BENCHMARKS.md, "Adaptive write limit").
const RECENT_WINDOWS: usize = 64;

/// What became of a write, as the limiter sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Answered, not by shedding load (2xx, but also a 404, 409, 422: the API server did the
    /// work), after this long.
    Done(Duration),
    /// The API server shed load: 429 (API Priority and Fairness, a max-in-flight limit), 503,
    /// 504, or any answer with `Retry-After`.
    Overloaded,
    /// No answer (a connection error, the request given up): says nothing about load.
    Unknown,
}

impl Answer {
    /// What an answer with `status` and `headers` says about load, after `latency`.
    pub fn of(status: StatusCode, headers: &HeaderMap, latency: Duration) -> Answer {
        let shed = matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
        );
        match shed || headers.contains_key(http::header::RETRY_AFTER) {
            true => Answer::Overloaded,
            false => Answer::Done(latency),
        }
    }
}

/// What a write saw when it was let through: the limiter's epoch (bumped at each halving) and
/// the writes in flight, itself included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    pub epoch: u64,
    pub in_flight: usize,
}

/// What the limit did after an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    Grew(usize),
    Halved(usize),
}

/// The adaptive limit, pure: told what each write saw and what became of it, it decides.
#[derive(Debug, Clone)]
pub struct Limiter {
    limit: usize,
    start: usize,
    max: usize,
    epoch: u64,
    /// Successes of this window that used the limit, and their latencies' sum.
    successes: usize,
    latency_sum: Duration,
    /// The mean latencies of the last [`RECENT_WINDOWS`] windows.
    recent: VecDeque<Duration>,
    lowest: usize,
    highest: usize,
    halvings: usize,
}

impl Limiter {
    /// A limit starting at `start`, never above `max` (`max` at least 1; `start` within 1..=max).
    pub fn new(start: usize, max: usize) -> Limiter {
        let max = max.max(1);
        let limit = start.clamp(1, max);
        Limiter {
            limit,
            start: limit,
            max,
            epoch: 0,
            successes: 0,
            latency_sum: Duration::ZERO,
            recent: VecDeque::with_capacity(RECENT_WINDOWS),
            lowest: limit,
            highest: limit,
            halvings: 0,
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The recent minimum of the windows' mean latencies, once a window has ended.
    pub fn recent_minimum(&self) -> Option<Duration> {
        self.recent.iter().min().copied()
    }

    /// Takes in what became of a write that saw `sent`.
    pub fn answered(&mut self, sent: Sent, answer: Answer) -> Change {
        match answer {
            Answer::Unknown => Change::None,
            Answer::Overloaded => self.overloaded(sent),
            Answer::Done(latency) => self.done(sent, latency),
        }
    }

    /// Halves the limit, once per window: a write sent before the last halving (an older
    /// epoch) was part of the load that was shed already.
    fn overloaded(&mut self, sent: Sent) -> Change {
        if sent.epoch != self.epoch {
            return Change::None;
        }
        self.epoch += 1;
        self.halvings += 1;
        self.limit = (self.limit / 2).max(1);
        self.lowest = self.lowest.min(self.limit);
        self.successes = 0;
        self.latency_sum = Duration::ZERO;
        self.recent.clear();
        Change::Halved(self.limit)
    }

    /// Counts a success into the window when the write used the limit (at least half of it in
    /// flight: a limit nobody reaches says nothing about the API server); at the window's end
    /// (`limit` such successes), grows by one if its mean latency stayed within
    /// [`LATENCY_TOLERANCE`] of the recent minimum.
    fn done(&mut self, sent: Sent, latency: Duration) -> Change {
        if sent.in_flight * 2 < self.limit {
            return Change::None;
        }
        self.successes += 1;
        self.latency_sum += latency;
        if self.successes < self.limit {
            return Change::None;
        }
        let mean = self.latency_sum / self.successes as u32;
        let flat = self.recent_minimum().is_none_or(|min| mean.as_secs_f64() <= min.as_secs_f64() * LATENCY_TOLERANCE);
        // Only a flat window joins the recent ones: slow windows at a saturated API server
        // must not age the fast ones out, or a ramp creeps up to the max. A halving forgets
        // them all, and the latency at the lower limit becomes the normal.
        if flat {
            if self.recent.len() == RECENT_WINDOWS {
                self.recent.pop_front();
            }
            self.recent.push_back(mean);
        }
        self.successes = 0;
        self.latency_sum = Duration::ZERO;
        if !flat || self.limit >= self.max {
            return Change::None;
        }
        self.limit += 1;
        self.highest = self.highest.max(self.limit);
        Change::Grew(self.limit)
    }

    /// What the limit did so far, with the most writes the gate ever let through at once.
    pub fn report(&self, peak_in_flight: usize) -> LimitReport {
        LimitReport {
            start: self.start,
            max: self.max,
            final_limit: self.limit,
            lowest: self.lowest,
            highest: self.highest,
            halvings: self.halvings,
            peak_in_flight,
        }
    }
}

/// What a run's limit did, for its report (`restore -o json`: `writeLimit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitReport {
    /// Where it started (`--concurrency`, at most the max).
    pub start: usize,
    /// `--max-concurrency`.
    pub max: usize,
    /// Where it ended.
    #[serde(rename = "final")]
    pub final_limit: usize,
    pub lowest: usize,
    pub highest: usize,
    /// Times the API server shed load and the limit halved.
    pub halvings: usize,
    /// The most writes that were ever in flight at once.
    pub peak_in_flight: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A full window of successes at `limit` in flight, each after `latency`.
    fn window(l: &mut Limiter, latency: Duration) -> Vec<Change> {
        let sent = Sent { epoch: l.epoch(), in_flight: l.limit() };
        (0..l.limit()).map(|_| l.answered(sent, Answer::Done(latency))).collect()
    }

    #[test]
    fn the_limit_grows_by_one_per_window_while_latency_stays_flat() {
        let mut l = Limiter::new(16, 64);
        assert_eq!(l.limit(), 16);
        let changes = window(&mut l, 10 * MS);
        assert_eq!(changes.iter().filter(|c| **c != Change::None).count(), 1, "one change per window");
        assert_eq!(changes.last(), Some(&Change::Grew(17)));
        for expected in 18..=30 {
            window(&mut l, 10 * MS + MS * (expected as u32 % 3));
            assert_eq!(l.limit(), expected, "flat within the tolerance");
        }
        // Up to the tolerance, still flat.
        window(&mut l, 20 * MS);
        assert_eq!(l.limit(), 31);
    }

    #[test]
    fn the_limit_does_not_grow_while_latency_rises() {
        let mut l = Limiter::new(16, 64);
        window(&mut l, 10 * MS);
        assert_eq!(l.limit(), 17);
        // The API server queues: each window slower than twice the recent minimum.
        for latency in [21, 30, 45, 80] {
            window(&mut l, latency * MS);
            assert_eq!(l.limit(), 17, "no growth at {latency} ms against 10 ms");
        }
        assert_eq!(l.recent_minimum(), Some(10 * MS));
        // Slow windows never become the normal by themselves (they would let a ramp creep up):
        // a halving forgets the fast ones, and growth resumes once latency is flat against the
        // latency at the lower limit.
        for _ in 0..200 {
            window(&mut l, 80 * MS);
        }
        assert_eq!(l.limit(), 17, "no growth at 80 ms, however long");
        l.answered(Sent { epoch: l.epoch(), in_flight: 17 }, Answer::Overloaded);
        assert_eq!((l.limit(), l.recent_minimum()), (8, None));
        window(&mut l, 80 * MS);
        window(&mut l, 90 * MS);
        assert_eq!(l.limit(), 10, "flat against 80 ms now");
        assert_eq!(l.recent_minimum(), Some(80 * MS));
    }

    /// A saturated API server: its latency grows with the writes in flight (a little each
    /// window as the limit grows by one). The limit stops at about twice where latency began.
    #[test]
    fn a_slow_ramp_of_latency_stops_the_growth_at_twice_the_starting_latency() {
        let mut l = Limiter::new(16, 64);
        for _ in 0..500 {
            let latency = MS * l.limit() as u32;
            window(&mut l, latency);
        }
        assert!((31..=33).contains(&l.limit()), "grew to {} on a server whose throughput is flat", l.limit());
    }

    #[test]
    fn successes_at_a_limit_nobody_reaches_do_not_raise_it() {
        let mut l = Limiter::new(16, 64);
        let idle = Sent { epoch: 0, in_flight: 7 };
        for _ in 0..1000 {
            assert_eq!(l.answered(idle, Answer::Done(MS)), Change::None);
        }
        assert_eq!(l.limit(), 16);
    }

    #[test]
    fn a_429_halves_the_limit_once_per_window_never_below_one() {
        let mut l = Limiter::new(16, 64);
        let before = Sent { epoch: l.epoch(), in_flight: 16 };
        assert_eq!(l.answered(before, Answer::Overloaded), Change::Halved(8));
        // The other writes of the same round shed too: they were sent before the halving.
        for _ in 0..15 {
            assert_eq!(l.answered(before, Answer::Overloaded), Change::None);
        }
        assert_eq!(l.limit(), 8);
        for expected in [4, 2, 1, 1, 1] {
            let now = Sent { epoch: l.epoch(), in_flight: l.limit() };
            l.answered(now, Answer::Overloaded);
            assert_eq!(l.limit(), expected);
        }
        // And from 1 it grows again once the API server answers.
        window(&mut l, MS);
        assert_eq!(l.limit(), 2);
    }

    #[test]
    fn the_limit_never_exceeds_its_max_and_starts_within_it() {
        let mut l = Limiter::new(16, 20);
        for _ in 0..50 {
            window(&mut l, MS);
        }
        assert_eq!(l.limit(), 20);
        assert_eq!(Limiter::new(16, 1).limit(), 1, "--max-concurrency 1 starts at 1");
        assert_eq!(Limiter::new(0, 64).limit(), 1);
        assert_eq!(Limiter::new(16, 0).max(), 1);
        let mut one = Limiter::new(16, 1);
        for _ in 0..10 {
            window(&mut one, MS);
        }
        assert_eq!(one.limit(), 1);
    }

    #[test]
    fn answers_that_shed_load_are_told_from_the_others() {
        let none = HeaderMap::new();
        let mut retry_after = HeaderMap::new();
        retry_after.insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("1"));
        for code in [StatusCode::TOO_MANY_REQUESTS, StatusCode::SERVICE_UNAVAILABLE, StatusCode::GATEWAY_TIMEOUT] {
            assert_eq!(Answer::of(code, &none, MS), Answer::Overloaded, "{code}");
        }
        assert_eq!(Answer::of(StatusCode::INTERNAL_SERVER_ERROR, &retry_after, MS), Answer::Overloaded);
        for code in [StatusCode::OK, StatusCode::NOT_FOUND, StatusCode::CONFLICT, StatusCode::UNPROCESSABLE_ENTITY] {
            assert_eq!(Answer::of(code, &none, MS), Answer::Done(MS), "{code}");
        }
        let mut l = Limiter::new(4, 8);
        assert_eq!(l.answered(Sent { epoch: 0, in_flight: 4 }, Answer::Unknown), Change::None);
    }
}
