//! A cluster's live objects for preflight: every object of the profile, read once (one listing
//! a kind), with the claim/server pairing views and the consistency verdict a capture of them
//! would get.

use crate::Result;
use crate::domain::capture::Collector;
use crate::domain::identity::Profile;
use crate::domain::live::LiveObject;
use crate::domain::pairing::{Views, Violation};
use crate::format::Consistency;
use crate::k8s::{PageRequest, list_objects};

/// The live objects of the profile, their claim/server pairing views, and the consistency
/// verdict a capture of them would get.
pub struct LiveState {
    pub objects: Vec<LiveObject>,
    pub views: Views,
    pub consistency: Consistency,
}

impl LiveState {
    pub fn pairing(&self) -> Vec<Violation> {
        self.views.check()
    }
}

/// Lists every kind of the profile (Secrets never) and views each object. Statuses are kept
/// as digests, their JSON only with `keep_json` (to show what a restore changes).
pub async fn read_live(
    client: &kube::Client,
    profile: &Profile,
    page: &PageRequest<'_>,
    keep_json: bool,
) -> Result<LiveState> {
    let mut objects = Vec::new();
    let mut collector = Collector::new();
    for kind in profile.kinds.iter().filter(|k| !k.is_denied()) {
        list_objects(client, kind, page, |object| {
            collector.add(kind, object);
            let live = LiveObject::from_raw(kind, object);
            objects.push(if keep_json { live } else { live.compact() });
            Ok(())
        })
        .await?;
    }
    let views = collector.views().clone();
    Ok(LiveState { objects, views, consistency: collector.finish(1).consistency })
}
