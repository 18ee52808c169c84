//! Leader election through a Lease, and the fence every write of the leader passes: one writer
//! at a time, even when the leader is slow.
//!
//! The Lease is read and written on a client of its own (short timeouts, no retries; see
//! [`crate::k8s::client::lease_client`]), every few seconds, each write conditional on the
//! resourceVersion just read, as client-go's leader election does. A standby takes the Lease
//! over once the record it sees has not changed for the Lease's duration, timed on its own
//! monotonic clock from when it first saw that record. The leader, for its part, may write only
//! until [`LeaseTiming::writes_for`] after it *sent* its last successful renewal (a monotonic
//! instant taken before the request): so it stops writing a margin before any standby can take
//! over, whatever made it slow (a throttled or unanswering API server, a paused process, a
//! stalled node). A process stopped and continued finds its monotonic clock past that deadline
//! and writes nothing more.
//!
//! Every write of the controller's client passes the [`Fence`] just before it is sent
//! (`client::fenced_client`), so status writes, quiesces, releases and Events alike stop when
//! the lease is over. kube-lease-manager, used before, renewed through the controller's own
//! client (whose retries last minutes), with an unconditional patch, and kept no instant of its
//! last renewal a fence could use.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::{Error, Result};

/// How long a Lease lasts, and what follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// The Lease's duration: how long a standby waits, after the record last changed, before it
    /// takes over. Whole seconds (a Lease counts in seconds).
    pub duration: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        LeaseTiming { duration: Duration::from_secs(15) }
    }
}

impl LeaseTiming {
    /// How often the leader renews and a standby looks (3 s of 15).
    pub fn renew_every(&self) -> Duration {
        self.duration / 5
    }

    /// How long the leader may write after it sent its last successful renewal: the duration
    /// less a third of it (10 s of 15, client-go's renew deadline), the margin for a request that
    /// passed the fence on its way to the API server and for clocks that run at other rates.
    pub fn writes_for(&self) -> Duration {
        self.duration - self.duration / 3
    }

    /// The longest one look at the Lease (a read and a write) may take: a renewal that takes
    /// longer is abandoned and tried again.
    pub fn attempt_timeout(&self) -> Duration {
        self.renew_every()
    }

    fn seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// Until when this replica may write: the deadline its last renewal gives it, or none.
/// Cloned into the controller's client, where every write checks it just before it is sent.
#[derive(Clone, Default)]
pub struct Fence(Arc<watch::Sender<Option<Instant>>>);

impl Fence {
    /// Whether this replica may write now.
    pub fn may_write(&self) -> bool {
        may_write(*self.0.borrow(), Instant::now())
    }

    /// A renewal sent at `sent` succeeded.
    fn renewed(&self, sent: Instant, timing: &LeaseTiming) {
        let deadline = deadline_after(sent, timing);
        // Renewals are made one after another: a later one never gives an earlier deadline.
        self.0.send_if_modified(|d| {
            let changed = d.is_none_or(|d| d < deadline);
            if changed {
                *d = Some(deadline);
            }
            changed
        });
    }

    /// Whether this replica led and its lease is over (ran out, or taken by another replica):
    /// it sends nothing more at all, not even bytes of a request already past the fence
    /// (see [`crate::k8s::client::fenced_client`]). A replica that never led is not stopped.
    pub fn stopped(&self) -> bool {
        self.0.borrow().is_some_and(|deadline| Instant::now() >= deadline)
    }

    /// Another replica holds the Lease, or this one gave it up. A replica that led keeps a
    /// deadline in the past: [`Fence::stopped`] stays true until it leads again.
    fn revoke(&self) {
        let now = Instant::now();
        self.0.send_if_modified(|d| match d {
            Some(deadline) if *deadline > now => {
                *deadline = now;
                true
            }
            _ => false,
        });
    }
}

#[cfg(test)]
impl Fence {
    /// A fence open until `deadline` (or closed).
    pub(crate) fn set(&self, deadline: Option<Instant>) {
        self.0.send_replace(deadline);
    }
}

/// Whether a replica whose writes are fenced at `deadline` may write at `now`.
fn may_write(deadline: Option<Instant>, now: Instant) -> bool {
    deadline.is_some_and(|deadline| now < deadline)
}

/// The deadline of a renewal sent at `sent`. The instant is taken before the Lease is read: a
/// standby's clock for the renewed record starts no earlier than the write, which comes after.
fn deadline_after(sent: Instant, timing: &LeaseTiming) -> Instant {
    sent + timing.writes_for()
}

/// What one look at the Lease leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// Held by this replica: renew it.
    Renew,
    /// Free, or its holder has not renewed it for its duration: take it.
    Acquire,
    /// Held by another replica that renews it.
    Follow(String),
}

/// What to do with a Lease whose record is `spec`, first seen unchanged at `seen` (monotonic);
/// `fallback` is the duration of a record that names none.
fn next_step(spec: &LeaseSpec, me: &str, seen: Instant, now: Instant, fallback: Duration) -> Step {
    match spec.holder_identity.as_deref().filter(|h| !h.is_empty()) {
        None => Step::Acquire,
        Some(holder) if holder == me => Step::Renew,
        Some(holder) => {
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .filter(|s| *s > 0)
                .map_or(fallback, Duration::from_secs);
            match now.checked_duration_since(seen).is_some_and(|unchanged| unchanged >= duration) {
                true => Step::Acquire,
                false => Step::Follow(holder.to_string()),
            }
        }
    }
}

/// The record `spec` becomes when this replica renews or takes it at `now`.
fn written(spec: &LeaseSpec, step: &Step, me: &str, now: MicroTime, timing: &LeaseTiming) -> LeaseSpec {
    let renewed =
        LeaseSpec { renew_time: Some(now.clone()), lease_duration_seconds: Some(timing.seconds()), ..spec.clone() };
    match step {
        Step::Acquire => LeaseSpec {
            holder_identity: Some(me.to_string()),
            acquire_time: Some(now),
            lease_transitions: Some(spec.lease_transitions.unwrap_or(0).saturating_add(1)),
            ..renewed
        },
        _ => renewed,
    }
}

/// This replica's part in the election for one Lease.
pub struct Leadership {
    fence: Fence,
    elector: tokio::task::JoinHandle<()>,
    lease: Api<Lease>,
    name: String,
    identity: String,
    timing: LeaseTiming,
}

impl Leadership {
    /// Joins the election for `lease` in `namespace` as `identity` (usually the pod name),
    /// through `client` (the Lease's own, see [`crate::k8s::client::lease_client`]). `fence`
    /// opens while this replica holds the Lease and closes when a renewal is overdue.
    pub fn join(
        client: &kube::Client,
        namespace: &str,
        lease: &str,
        identity: &str,
        timing: LeaseTiming,
        fence: Fence,
    ) -> Leadership {
        let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let elector = tokio::spawn(elect(api.clone(), lease.to_string(), identity.to_string(), timing, fence.clone()));
        Leadership { fence, elector, lease: api, name: lease.to_string(), identity: identity.to_string(), timing }
    }

    pub fn is_leader(&self) -> bool {
        self.fence.may_write()
    }

    /// Waits until this instance leads.
    pub async fn acquired(&self) -> Result<()> {
        let mut changes = self.fence.0.subscribe();
        changes
            .wait_for(|deadline| may_write(*deadline, Instant::now()))
            .await
            .map_err(|_| Error::Leader("the election stopped".into()))?;
        info!(lease = self.name, identity = self.identity, "leadership acquired");
        Ok(())
    }

    /// Completes when this replica may no longer write: another replica took the Lease, or a
    /// renewal is overdue. Checked on every poll, before anything else the caller selects on:
    /// a process continued after a stop completes this at once, before any write of its own.
    pub async fn lost(&self) {
        let fence = self.fence.clone();
        let mut changes = fence.0.subscribe();
        let expiry = async move {
            loop {
                let deadline = *changes.borrow_and_update();
                let Some(deadline) = deadline.filter(|d| Instant::now() < *d) else { return };
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline.into()) => {}
                    _ = changes.changed() => {}
                }
            }
        };
        tokio::pin!(expiry);
        std::future::poll_fn(|cx| match fence.may_write() {
            true => expiry.as_mut().poll(cx),
            false => Poll::Ready(()),
        })
        .await
    }

    /// Stops taking part and, if this replica still holds the Lease, frees it (conditionally on
    /// what it read) so that a standby takes over at once rather than after the duration.
    pub async fn release(self) {
        self.elector.abort();
        self.fence.revoke();
        let free = async {
            let Some(mut lease) = self.lease.get_opt(&self.name).await? else { return Ok(()) };
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() != Some(&self.identity) {
                return Ok(());
            }
            spec.holder_identity = None;
            spec.acquire_time = None;
            spec.renew_time = None;
            spec.lease_duration_seconds = None;
            self.lease.replace(&self.name, &post_params(), &lease).await.map(|_| ())
        };
        match tokio::time::timeout(self.timing.attempt_timeout(), free).await {
            Ok(Ok(())) => info!(lease = self.name, "lease released"),
            Ok(Err(e)) => warn!(lease = self.name, error = %e, "could not release the lease; it expires on its own"),
            Err(_) => warn!(lease = self.name, "releasing the lease timed out; it expires on its own"),
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.elector.abort();
    }
}

fn post_params() -> PostParams {
    PostParams { field_manager: Some(crate::TOOL_NAME.into()), ..Default::default() }
}

/// Looks at the Lease every [`LeaseTiming::renew_every`]: renews it while held, takes it when
/// free or expired, and moves the fence accordingly. A look that fails or times out moves
/// nothing: the fence closes on its own when renewals stay overdue.
async fn elect(api: Api<Lease>, name: String, identity: String, timing: LeaseTiming, fence: Fence) {
    let mut seen: Option<(LeaseSpec, Instant)> = None;
    loop {
        let sent = Instant::now();
        let look = look(&api, &name, &identity, &timing, &mut seen);
        match tokio::time::timeout(timing.attempt_timeout(), look).await {
            Ok(Ok(None)) => {
                if !fence.may_write() {
                    info!(lease = name, identity, "lease acquired");
                }
                fence.renewed(sent, &timing);
            }
            Ok(Ok(Some(holder))) => {
                if fence.may_write() {
                    warn!(lease = name, holder, "the lease is held by another replica");
                }
                debug!(lease = name, holder, "following");
                fence.revoke();
            }
            Ok(Err(e)) => warn!(lease = name, error = %e, "could not renew or acquire the lease; trying again"),
            Err(_) => {
                warn!(lease = name, timeout = ?timing.attempt_timeout(), "the lease's API server did not answer in time; trying again")
            }
        }
        tokio::time::sleep_until((sent + timing.renew_every()).into()).await;
    }
}

/// One look at the Lease: `None` when this replica holds it now (renewed or taken), else the
/// holder's identity. Writes are conditional on the resourceVersion read.
async fn look(
    api: &Api<Lease>,
    name: &str,
    identity: &str,
    timing: &LeaseTiming,
    seen: &mut Option<(LeaseSpec, Instant)>,
) -> std::result::Result<Option<String>, kube::Error> {
    let conflict = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 409);
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let Some(mut lease) = api.get_opt(name).await? else {
        let spec = written(&LeaseSpec::default(), &Step::Acquire, identity, now, timing);
        let lease = Lease {
            metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
            spec: Some(LeaseSpec { lease_transitions: Some(0), ..spec }),
        };
        return match api.create(&post_params(), &lease).await {
            Ok(_) => Ok(None),
            Err(e) if conflict(&e) => Ok(Some("(created by another replica)".into())),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.take().unwrap_or_default();
    let at = Instant::now();
    let first_seen = match seen {
        Some((record, first_seen)) if *record == spec => *first_seen,
        _ => {
            *seen = Some((spec.clone(), at));
            at
        }
    };
    let step = next_step(&spec, identity, first_seen, at, timing.duration);
    if let Step::Follow(holder) = step {
        return Ok(Some(holder));
    }
    lease.spec = Some(written(&spec, &step, identity, now, timing));
    match api.replace(name, &post_params(), &lease).await {
        Ok(_) => Ok(None),
        Err(e) if conflict(&e) => Ok(Some(spec.holder_identity.unwrap_or_else(|| "(another replica)".into()))),
        Err(e) => Err(e),
    }
}

/// Why a write was not sent: this replica's lease is over.
#[derive(Debug, thiserror::Error)]
#[error("{request} not sent: this replica's lease was not renewed in time (another replica may lead now)")]
pub struct NotLeading {
    pub request: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica that led stays stopped when another takes its Lease (its connections send
    /// nothing more); one that never led is not stopped; leading again opens it.
    #[test]
    fn a_replica_that_lost_its_lease_stays_stopped_until_it_leads_again() {
        let fence = Fence::default();
        assert!(!fence.stopped(), "never led");
        fence.revoke();
        assert!(!fence.stopped(), "a standby following another");
        let timing = LeaseTiming::default();
        fence.renewed(Instant::now(), &timing);
        assert!(fence.may_write() && !fence.stopped());
        fence.revoke();
        assert!(!fence.may_write() && fence.stopped(), "lost: stopped");
        fence.renewed(Instant::now(), &timing);
        assert!(fence.may_write() && !fence.stopped(), "leads again");
    }

    fn held_by(holder: &str, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(seconds),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            ..Default::default()
        }
    }

    #[test]
    fn the_leader_writes_until_a_margin_before_its_lease_could_be_taken_over() {
        let timing = LeaseTiming { duration: Duration::from_secs(15) };
        let sent = Instant::now();
        let deadline = deadline_after(sent, &timing);
        assert_eq!(deadline - sent, Duration::from_secs(10));
        assert!(may_write(Some(deadline), sent));
        assert!(may_write(Some(deadline), deadline - Duration::from_millis(1)));
        assert!(!may_write(Some(deadline), deadline), "the deadline itself is past it");
        assert!(!may_write(None, sent), "no renewal, no write");
        // A standby takes over once the record has not changed for the duration, counted from
        // when it first saw it, which is after the leader sent it: the leader has stopped by then.
        let takeover = sent + timing.duration;
        assert!(!may_write(Some(deadline), takeover));
        assert!(timing.renew_every() * 3 <= timing.writes_for(), "three renewals fit before the fence closes");
    }

    #[test]
    fn a_process_continued_after_a_stop_longer_than_its_lease_may_not_write() {
        let timing = LeaseTiming { duration: Duration::from_secs(6) };
        let fence = Fence::default();
        assert!(!fence.may_write());
        let sent = Instant::now();
        fence.renewed(sent, &timing);
        assert!(fence.may_write());
        // Its monotonic clock ran on while it was stopped: after SIGCONT, "now" is past the
        // deadline, whatever its timers have yet to notice.
        let after_stop = sent + timing.duration + Duration::from_secs(1);
        assert!(!may_write(*fence.0.borrow(), after_stop));
        // An older renewal (answered late) never moves the deadline back.
        fence.renewed(sent - Duration::from_secs(3), &timing);
        assert_eq!(*fence.0.borrow(), Some(deadline_after(sent, &timing)));
        fence.revoke();
        assert!(!fence.may_write());
    }

    #[test]
    fn a_standby_takes_over_only_after_the_record_stayed_unchanged_for_the_leases_duration() {
        let seen = Instant::now();
        let fallback = Duration::from_secs(15);
        let held = held_by("a", 6);
        assert_eq!(next_step(&held, "b", seen, seen, fallback), Step::Follow("a".into()));
        let just_before = seen + Duration::from_secs(6) - Duration::from_millis(1);
        assert_eq!(next_step(&held, "b", seen, just_before, fallback), Step::Follow("a".into()));
        assert_eq!(next_step(&held, "b", seen, seen + Duration::from_secs(6), fallback), Step::Acquire);
        assert_eq!(next_step(&held, "a", seen, seen + Duration::from_secs(60), fallback), Step::Renew);
        let free = LeaseSpec { holder_identity: Some(String::new()), ..held.clone() };
        assert_eq!(next_step(&free, "b", seen, seen, fallback), Step::Acquire);
        assert_eq!(next_step(&LeaseSpec::default(), "b", seen, seen, fallback), Step::Acquire);
        // A record without a duration lasts this replica's own.
        let no_duration = LeaseSpec { lease_duration_seconds: None, ..held };
        assert_eq!(
            next_step(&no_duration, "b", seen, seen + Duration::from_secs(6), fallback),
            Step::Follow("a".into())
        );
        assert_eq!(next_step(&no_duration, "b", seen, seen + fallback, fallback), Step::Acquire);
    }

    #[test]
    fn taking_a_lease_counts_a_transition_and_renewing_it_does_not() {
        let timing = LeaseTiming { duration: Duration::from_secs(6) };
        let now = MicroTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let held = LeaseSpec { lease_transitions: Some(4), ..held_by("a", 15) };
        let taken = written(&held, &Step::Acquire, "b", now.clone(), &timing);
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!((taken.lease_transitions, taken.lease_duration_seconds), (Some(5), Some(6)));
        assert_eq!(taken.acquire_time, Some(now.clone()));
        let renewed = written(&taken, &Step::Renew, "b", now.clone(), &timing);
        assert_eq!((renewed.holder_identity.as_deref(), renewed.lease_transitions), (Some("b"), Some(5)));
        assert_eq!(renewed.renew_time, Some(now));
    }
}
