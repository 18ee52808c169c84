//! Watching: one task per kind streams its objects into the main loop as [`Change`]s, through
//! an [`Inbox`] that keeps only the newest change of each object.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::TryStreamExt;
use tokio::sync::Notify;
use tracing::warn;

use super::Context;
use crate::domain::identity::KindProfile;
use crate::domain::live::LiveObject;
use crate::domain::object::RawObject;
use crate::k8s::watch::{RawResource, WatchEvent, WatchRequest, unavailable_reason, watch_objects};

/// What a watch tells the main loop.
#[derive(Debug)]
pub(super) enum Change {
    Upsert(Box<LiveObject>),
    Delete(String),
    /// A kind is being listed (again): until [`Change::Listed`], the index may hold its
    /// objects deleted meanwhile, and lacks some of those that are there.
    Listing {
        kind: String,
    },
    /// A kind was listed (again): these are all its objects now.
    Listed {
        kind: String,
        uids: HashSet<String>,
    },
    /// A kind cannot be watched (not served, forbidden): why.
    Unavailable {
        kind: String,
        reason: String,
    },
}

/// Objects per page of a watch's (re-)list. A page is held whole (each object's JSON, some
/// 40 KiB for a discovered Server): client-go's 500 would hold 20 MiB at once, freed only into
/// the allocator's arenas.
const WATCH_PAGE_SIZE: u32 = 100;

/// Streams one kind's objects into the main loop: upserts and deletions, each complete
/// (re-)list with the uids it held, and the kind's unavailability while it cannot be watched
/// (the watcher backs off as kube-runtime's default backoff says).
pub(super) async fn watch_kind(ctx: Arc<Context>, kind: KindProfile, tx: Sender) {
    let request =
        WatchRequest { namespace: None, selector: ctx.options.selector.as_deref(), page_size: WATCH_PAGE_SIZE };
    let mut listing: HashSet<String> = HashSet::new();
    let mut events = watch_objects(&ctx.client, &kind, &request);
    loop {
        let change = match events.try_next().await {
            Ok(Some(WatchEvent::Apply(o))) => upsert(&ctx, &kind, &o),
            Ok(Some(WatchEvent::InitApply(o))) => {
                listing.extend(o.metadata.uid.clone());
                upsert(&ctx, &kind, &o)
            }
            Ok(Some(WatchEvent::Delete(o))) => {
                let (namespace, name) = (o.metadata.namespace.as_deref(), o.metadata.name.as_deref());
                ctx.seen.gone(&kind, namespace, name.unwrap_or_default());
                o.metadata.uid.clone().map(Change::Delete)
            }
            Ok(Some(WatchEvent::Init)) => {
                // A (re-)list: the kind may have come with a CRD installed or upgraded since the
                // writer asked discovery about it; its next write asks again. What was seen of
                // its pairing is forgotten: an object deleted while the watch was away is not
                // in the list.
                if let Some(writer) = ctx.writer.get() {
                    writer.forget(&kind);
                }
                ctx.seen.listing(&kind);
                listing.clear();
                Some(Change::Listing { kind: kind.kind.clone() })
            }
            Ok(Some(WatchEvent::InitDone)) => {
                Some(Change::Listed { kind: kind.kind.clone(), uids: std::mem::take(&mut listing) })
            }
            Ok(None) => return,
            Err(e) => {
                ctx.metrics.errors.inc();
                match unavailable_reason(&e) {
                    Some(reason) => Some(Change::Unavailable { kind: kind.kind.clone(), reason }),
                    // A connection lost: the watcher resumes from its resourceVersion; a
                    // resourceVersion expired (410): it lists again.
                    None => {
                        warn!(kind = kind.kind, error = %e, "watch interrupted; resumed after a backoff (listed again if its resourceVersion expired)");
                        None
                    }
                }
            }
        };
        // Never waits for the main loop: a watch that stops reading is closed by the API
        // server (its watch cache does not wait for a slow watcher), resumes from a
        // resourceVersion the cache no longer holds, and lists the whole kind again.
        if let Some(change) = change {
            tx.send(change);
        }
    }
}

/// The changes the watches have sent and the main loop has yet to take, in the order they
/// came, with only the newest of each object (an upsert or deletion replaces the object's
/// change waiting, in its place): so the watches never wait for the main loop, and what waits
/// is bounded by the objects watched, not by the events (a mass arrival, the echoes of the
/// controller's own writes). A (re-)list ([`Change::Listed`]) and a kind's unavailability keep
/// their place among them.
#[derive(Default)]
pub(super) struct Inbox {
    queue: Mutex<Queue>,
    /// One waiter: the main loop. A permit is kept when nobody waits, so a change sent between
    /// its look and its wait wakes it.
    sent: Notify,
}

#[derive(Default)]
struct Queue {
    changes: Vec<Change>,
    /// Where each object's change is in `changes`.
    slot: HashMap<String, usize>,
    /// Senders alive: none left and nothing waiting ends the main loop.
    senders: usize,
}

impl Inbox {
    /// A watch's end of the inbox.
    pub(super) fn sender(self: &Arc<Self>) -> Sender {
        self.lock().senders += 1;
        Sender(self.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for changes and takes them all; `None` once every sender is gone and nothing
    /// waits.
    pub(super) async fn recv(&self) -> Option<Vec<Change>> {
        loop {
            {
                let mut queue = self.lock();
                if !queue.changes.is_empty() {
                    queue.slot.clear();
                    return Some(std::mem::take(&mut queue.changes));
                }
                if queue.senders == 0 {
                    return None;
                }
            }
            self.sent.notified().await;
        }
    }

    /// Changes waiting.
    pub(super) fn len(&self) -> usize {
        self.lock().changes.len()
    }
}

/// A watch's end of the [`Inbox`]; dropped when the watch ends.
pub(super) struct Sender(Arc<Inbox>);

impl Sender {
    /// Queues `change`, in place of the change of the same object waiting, if any.
    pub(super) fn send(&self, change: Change) {
        {
            let mut queue = self.0.lock();
            let queue = &mut *queue;
            let uid = match &change {
                Change::Upsert(object) => Some(object.uid.as_str()),
                Change::Delete(uid) => Some(uid.as_str()),
                Change::Listing { .. } | Change::Listed { .. } | Change::Unavailable { .. } => None,
            };
            match uid {
                Some(uid) => match queue.slot.get(uid) {
                    Some(&at) => queue.changes[at] = change,
                    None => {
                        queue.slot.insert(uid.to_string(), queue.changes.len());
                        queue.changes.push(change);
                    }
                },
                None => queue.changes.push(change),
            }
        }
        self.0.sent.notify_one();
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.0.lock().senders -= 1;
        self.0.sent.notify_one();
    }
}

/// The object as the index keeps it: its status as digests, not JSON (see
/// [`LiveObject::compact`]), already here, so that what waits in the inbox is small too. Its
/// side of the pairing (a Server's or claim's) is known from now on.
fn upsert(ctx: &Context, kind: &KindProfile, object: &RawResource) -> Option<Change> {
    match RawObject::parse(object.json()) {
        Ok(raw) => {
            ctx.seen.saw(kind, &raw);
            Some(Change::Upsert(Box::new(LiveObject::from_raw(kind, &raw).compact())))
        }
        Err(e) => {
            warn!(kind = kind.kind, error = %e, "object not understood; skipped");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::fixtures::{self, uuid};

    fn upsert(name: &str, version: &str) -> Change {
        let mut object = fixtures::live("Server", name, &[uuid(name)], None);
        object.resource_version = version.into();
        Change::Upsert(Box::new(object))
    }

    /// (uid, resourceVersion) of an upsert, the uid of a deletion, the kind of a listing.
    fn seen(changes: &[Change]) -> Vec<String> {
        changes
            .iter()
            .map(|c| match c {
                Change::Upsert(o) => format!("{}@{}", o.uid, o.resource_version),
                Change::Delete(uid) => format!("-{uid}"),
                Change::Listing { kind } => format!("listing {kind}"),
                Change::Listed { kind, .. } => format!("listed {kind}"),
                Change::Unavailable { kind, .. } => format!("unavailable {kind}"),
            })
            .collect()
    }

    /// Issue 22: each object's newest change replaces the one waiting, in its place; listings
    /// keep theirs; what waits is bounded by the objects, not by their events.
    #[tokio::test]
    async fn the_inbox_keeps_each_objects_newest_change_in_its_place() {
        let inbox = Arc::new(Inbox::default());
        let tx = inbox.sender();
        tx.send(upsert("a", "1"));
        tx.send(upsert("b", "2"));
        tx.send(upsert("a", "3"));
        tx.send(Change::Listed { kind: "Server".into(), uids: HashSet::new() });
        tx.send(Change::Delete("b".into()));
        tx.send(upsert("c", "4"));
        assert_eq!(inbox.len(), 4);
        let changes = inbox.recv().await.unwrap();
        assert_eq!(seen(&changes), ["a@3", "-b", "listed Server", "c@4"]);
        // Taken: a change of the same object now waits on its own, at the end.
        tx.send(upsert("c", "5"));
        tx.send(upsert("a", "6"));
        assert_eq!(seen(&inbox.recv().await.unwrap()), ["c@5", "a@6"]);

        // A mass arrival's events, each object written three times (its echoes): one change an
        // object waits.
        for round in 0..3 {
            for i in 0..1000 {
                tx.send(upsert(&format!("s{i}"), &format!("{round}")));
            }
        }
        let changes = inbox.recv().await.unwrap();
        assert_eq!(changes.len(), 1000);
        assert!(seen(&changes).iter().all(|c| c.ends_with("@2")), "each object's newest");
    }

    /// The main loop waits for a change sent later, and learns that every watch ended only
    /// once it took what they sent.
    #[tokio::test]
    async fn a_change_wakes_the_waiting_loop_and_the_end_comes_after_what_was_sent() {
        let inbox = Arc::new(Inbox::default());
        let (one, two) = (inbox.sender(), inbox.sender());
        let waiting = tokio::spawn({
            let inbox = inbox.clone();
            async move { inbox.recv().await }
        });
        tokio::task::yield_now().await;
        one.send(upsert("a", "1"));
        let woken = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("woken within 10 s");
        assert_eq!(seen(&woken.unwrap().unwrap()), ["a@1"]);

        two.send(upsert("b", "2"));
        drop(one);
        drop(two);
        assert_eq!(seen(&inbox.recv().await.unwrap()), ["b@2"], "what was sent before the end comes first");
        assert!(inbox.recv().await.is_none(), "then the end");
    }
}
