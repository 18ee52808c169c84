//! Watching: one task per kind streams its objects into the main loop as [`Change`]s.

use std::collections::HashSet;
use std::sync::Arc;

use futures::TryStreamExt;
use tokio::sync::mpsc;
use tracing::warn;

use super::Context;
use crate::domain::identity::KindProfile;
use crate::domain::live::LiveObject;
use crate::k8s::watch::{WatchEvent, WatchRequest, unavailable_reason, watch_objects};

/// What a watch tells the main loop.
pub(super) enum Change {
    Upsert(Box<LiveObject>),
    Delete(String),
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

/// Objects per page of a watch's (re-)list. A page is parsed whole into `DynamicObject`s, some
/// 40 KiB each for a discovered Server: client-go's 500 would hold 20 MiB at once, freed only
/// into the allocator's arenas.
const WATCH_PAGE_SIZE: u32 = 100;

/// Streams one kind's objects into the main loop: upserts and deletions, each complete
/// (re-)list with the uids it held, and the kind's unavailability while it cannot be watched
/// (the watcher backs off as kube-runtime's default backoff says).
pub(super) async fn watch_kind(ctx: Arc<Context>, kind: KindProfile, tx: mpsc::Sender<Change>) {
    let request =
        WatchRequest { namespace: None, selector: ctx.options.selector.as_deref(), page_size: WATCH_PAGE_SIZE };
    let mut listing: HashSet<String> = HashSet::new();
    let mut events = watch_objects(&ctx.client, &kind, &request);
    loop {
        let change = match events.try_next().await {
            Ok(Some(WatchEvent::Apply(o))) => upsert(&kind, &o),
            Ok(Some(WatchEvent::InitApply(o))) => {
                listing.extend(o.metadata.uid.clone());
                upsert(&kind, &o)
            }
            Ok(Some(WatchEvent::Delete(o))) => o.metadata.uid.clone().map(Change::Delete),
            Ok(Some(WatchEvent::Init)) => {
                // A (re-)list: the kind may have come with a CRD installed or upgraded since the
                // writer asked discovery about it; its next write asks again.
                if let Some(writer) = ctx.writer.get() {
                    writer.forget(&kind);
                }
                listing.clear();
                None
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
        // Waits while the main loop's queue is full: the watch stops reading, and the API
        // server holds (or, past its own limit, drops the watch, which resumes).
        if let Some(change) = change
            && tx.send(change).await.is_err()
        {
            return;
        }
    }
}

/// The object as the index keeps it: its status as digests, not JSON (see
/// [`LiveObject::compact`]), already here, so that what waits in the channel is small too.
fn upsert(kind: &KindProfile, object: &kube::api::DynamicObject) -> Option<Change> {
    LiveObject::from_dynamic(kind, object).ok().map(|o| Change::Upsert(Box::new(o.compact())))
}
