//! Hold: when restatus keeps its `ignore` on a restored object because metal-operator would
//! mistreat it without its pairing partner, and what ends such a wait. The one home of
//! metal-operator's pairing waits: the apply step asks [`Partners::hold`] before a release,
//! the one-shot restore and the controller tell [`Seen`] what their listings and watches show,
//! and the controller wakes held objects as [`Wake`] says.
//!
//! `clusterctl move` creates owners before what they own, and claims last (deepest in the
//! owner chain), so an object released as soon as its status is back can meet metal-operator's
//! handling of a missing partner. The rules of the pairing itself (the views, the invariant,
//! what a claim waits for given its Server, a BMC's Servers by name and identity) are pure and
//! live in [`crate::domain::pairing`]; this module looks the partners up on the target.

use std::sync::{RwLock, RwLockWriteGuard};

use tracing::info;

use crate::domain::identity::{KindProfile, Profile};
use crate::domain::live::LiveObject;
use crate::domain::object::RawObject;
use crate::domain::pairing::{
    ClaimView, METAL_GROUP, ServerIdentity, ServerThere, ServerView, SystemServers, View, Views, Violation,
    claim_waits_for, servers_not_there, servers_of_bmc,
};
use crate::format::{IdentityKey, ObjectRef, RecordHead, Records};
use crate::k8s::{PageRequest, Writer, list_objects};
use crate::{Error, Result};

/// What the caller saw of metal-operator's pairing on the target: the controller's watches,
/// kept up to date as they run, or the one-shot restore's listings and the answers to its
/// writes. Only what it knows saves a look-up: a bound Server's claim seen and not seen gone,
/// a Bound claim's Server last seen Reserved for it; anything else is read from the API server
/// as without it. Safe because a release waits for a partner to *arrive* (`clusterctl move`
/// creates claims last), and a partner seen is one that arrived: a claim deleted (or a Server
/// that moves on) after it was seen is a change metal-operator is meant to act on, as it would
/// on the source, and a look-up just before the release would miss the same change a moment
/// later. A watch delivers such changes within the moment a GET would take; the one-shot's
/// views are minutes old at most (claims listed before the Servers, Servers as this restore
/// wrote them). A listing of a kind forgets what was seen of it before.
#[derive(Debug, Default)]
pub struct Seen(RwLock<Views>);

/// What one page of a listing shows, taken under one lock (see [`Seen::page`]).
pub struct SeenPage<'s>(RwLockWriteGuard<'s, Views>);

impl SeenPage<'_> {
    /// The object's side of the pairing, if its kind takes part, replaces what was seen of it.
    pub fn saw(&mut self, kind: &KindProfile, object: &RawObject<'_>) {
        self.0.extend(View::of(kind, object));
    }
}

impl Seen {
    fn write(&self) -> RwLockWriteGuard<'_, Views> {
        self.0.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `fact` holds of what was seen.
    fn knows(&self, fact: impl FnOnce(&Views) -> bool) -> bool {
        fact(&self.0.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// A later view of an object replaces the earlier one.
    pub fn add(&self, view: View) {
        self.write().add(view);
    }

    /// The object's side of the pairing, if its kind takes part (a watch event).
    pub fn saw(&self, kind: &KindProfile, object: &RawObject<'_>) {
        self.page().saw(kind, object);
    }

    /// Records a page of objects under one lock; the appliers read between pages.
    pub fn page(&self) -> SeenPage<'_> {
        SeenPage(self.write())
    }

    /// Everything `views` holds (say, the answers to a kind's writes) replaces what was seen
    /// of the same objects.
    pub fn merge(&self, views: Views) {
        self.write().merge(views);
    }

    /// The object `namespace/name` of `kind` was deleted.
    pub fn gone(&self, kind: &KindProfile, namespace: Option<&str>, name: &str) {
        if kind.group == METAL_GROUP {
            self.write().remove(&kind.kind, namespace, name);
        }
    }

    /// `kind` is listed (again): the listing replaces what was seen of it before, so an object
    /// deleted meanwhile is not taken for there.
    pub fn listing(&self, kind: &KindProfile) {
        if kind.group == METAL_GROUP {
            self.write().clear(&kind.kind);
        }
    }

    /// Every Bound claim whose Server is not Reserved for it, and every Reserved Server whose
    /// claim is not Bound to it, as seen.
    pub fn check(&self) -> Vec<Violation> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).check()
    }

    /// Before metal-operator's Servers (`kind`; nothing for any other): its ServerClaims,
    /// listed once for their pairing views (the one-shot restore). A bound Server restored
    /// waits for its claim, which `clusterctl move` creates last, and a claim seen here saves
    /// that Server's look-up of it. Safe though the listing is minutes old when the last
    /// Servers are released: the wait is for a claim yet to *arrive*, and a claim that was
    /// there and is deleted since is a deletion metal-operator is meant to act on (it frees the
    /// Server as it would on the source); a look-up just before the release would have missed a
    /// deletion a moment later all the same. A claim not seen here is still looked up.
    pub async fn list_claims_before(
        &self,
        client: &kube::Client,
        kind: &KindProfile,
        profile: &Profile,
        page: &PageRequest<'_>,
    ) -> Result<()> {
        if kind.group != METAL_GROUP || kind.kind != "Server" {
            return Ok(());
        }
        let claims = profile.kind("ServerClaim").filter(|k| k.group == METAL_GROUP && !k.is_denied());
        let Some(claims) = claims else { return Ok(()) };
        list_objects(client, claims, page, |object| {
            self.saw(claims, object);
            Ok(())
        })
        .await
        .map(|_served| ())
    }
}

/// A change among the live objects that may end the waits of objects restatus holds: the
/// controller tries those objects again, once a batch of changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A Server or ServerClaim arrived: any held BMC, Server or claim may wait for it.
    Arrival,
    /// A Server's status changed: a held claim may wait for it to be Reserved for it.
    ServerStatus,
}

impl Wake {
    /// What the change of a live object of `kind` may end: its arrival (`arrived`: new to the
    /// caller), or a change of its status (asked only of a Server that did not arrive).
    pub fn of(kind: &str, arrived: bool, status_changed: impl FnOnce() -> bool) -> Option<Wake> {
        let partner = matches!(kind, "Server" | "ServerClaim");
        if partner && arrived {
            Some(Wake::Arrival)
        } else if kind == "Server" && status_changed() {
            Some(Wake::ServerStatus)
        } else {
            None
        }
    }

    /// Whether a held object of `kind` may wait for this change.
    pub fn ends_wait_of(self, kind: &str) -> bool {
        match self {
            Wake::Arrival => matches!(kind, "BMC" | "Server" | "ServerClaim"),
            Wake::ServerStatus => kind == "ServerClaim",
        }
    }
}

/// For the controller, which reads the target's Servers from its live index: the identity
/// keys of the Servers the snapshot (`records`) holds for `object`, a metal-operator BMC that
/// restatus holds, so that its wait finds them by identity whatever their names. `None` for
/// any other object (nothing to find).
pub fn bmc_server_keys<'r>(
    kind: &KindProfile,
    object: &LiveObject,
    records: &'r Records,
    system_servers: &'r SystemServers,
) -> Result<Option<impl Iterator<Item = &'r IdentityKey>>> {
    if kind.kind != "BMC" || kind.group != METAL_GROUP || !object.quiesced_by_restatus() {
        return Ok(None);
    }
    let recorded = servers_of_bmc(&object.name, system_servers.get(records)?);
    Ok(Some(recorded.into_iter().flat_map(|r| &r.keys)))
}

/// The pairing an applier holds objects for: the snapshot's Servers of each BMC, the target's
/// Servers by identity, and what the caller saw ([`Seen`]). The one-shot restore builds it
/// with [`Partners::listed`], the controller from its indexes with [`Partners::indexed`].
pub struct Partners<'a> {
    /// Every record of the snapshot (an applier may plan with a part of them), for the
    /// Servers a BMC waits for.
    records: &'a Records,
    /// The system Servers of `records`, read when a BMC first needs them.
    system_servers: SystemServersOf<'a>,
    /// The target's Servers by identity, for what a BMC waits for.
    live_servers: LiveServers<'a>,
    /// Each partner seen saves its look-up.
    seen: Option<&'a Seen>,
}

/// The system Servers of the snapshot: read by the applier, or kept by the caller.
enum SystemServersOf<'a> {
    Own(SystemServers),
    Shared(&'a SystemServers),
}

/// Where the target's Servers by identity are found (see [`servers_not_there`]).
enum LiveServers<'a> {
    /// Listed once, when the first BMC needs them (the one-shot restore: one listing a
    /// restore, whatever the number of BMCs). A Server created after the listing is still
    /// found by its name.
    Listed(tokio::sync::OnceCell<Vec<ServerIdentity>>),
    /// The caller's, from its own live index (the controller).
    Given(&'a [ServerIdentity]),
}

/// An object whose release is up for decision, as [`Partners::hold`] looks at it.
pub struct Candidate<'c> {
    pub kind: &'c KindProfile,
    /// The object as last seen.
    pub object: &'c LiveObject,
    /// The answer to its status write, when there was one: the object as stored.
    pub written: Option<&'c str>,
    /// Its status is the snapshot's (restored, or equal to it).
    pub snapshots_status: bool,
}

impl<'a> Partners<'a> {
    /// Partners found on the target as a release needs them: the target's Servers listed once,
    /// when the first BMC needs them; with what the caller `seen`, if anything.
    pub fn listed(records: &'a Records, seen: Option<&'a Seen>) -> Self {
        Partners {
            records,
            system_servers: SystemServersOf::Own(SystemServers::default()),
            live_servers: LiveServers::Listed(tokio::sync::OnceCell::new()),
            seen,
        }
    }

    /// Partners as the caller's indexes hold them: the snapshot's records and their system
    /// Servers, the target's Servers a BMC may wait for (see [`bmc_server_keys`]), and what its
    /// watches `seen`.
    pub fn indexed(
        records: &'a Records,
        system_servers: &'a SystemServers,
        servers: &'a [ServerIdentity],
        seen: &'a Seen,
    ) -> Self {
        Partners {
            records,
            system_servers: SystemServersOf::Shared(system_servers),
            live_servers: LiveServers::Given(servers),
            seen: Some(seen),
        }
    }

    /// Whether `fact` holds of what the caller saw (false when it saw nothing).
    fn knows(&self, fact: impl FnOnce(&Views) -> bool) -> bool {
        self.seen.is_some_and(|seen| seen.knows(fact))
    }

    fn system_servers(&self) -> Result<&[RecordHead]> {
        match &self.system_servers {
            SystemServersOf::Own(own) => own.get(self.records),
            SystemServersOf::Shared(shared) => shared.get(self.records),
        }
    }

    /// The target's Servers by identity: the caller's, or every Server listed once.
    async fn live_servers(&self, writer: &Writer, servers: &KindProfile) -> Result<&[ServerIdentity]> {
        match &self.live_servers {
            LiveServers::Given(given) => Ok(given),
            LiveServers::Listed(listed) => {
                let listed = listed
                    .get_or_try_init(|| async {
                        let mut out = Vec::new();
                        writer
                            .list_all(servers, |object| {
                                let keys = servers.keys_of(object);
                                out.push(ServerIdentity { name: object.meta.name.to_string(), keys });
                                Ok(())
                            })
                            .await?;
                        info!(servers = out.len(), "listed the target's Servers to find BMCs' Servers by identity");
                        Ok::<_, Error>(out)
                    })
                    .await?;
                Ok(listed)
            }
        }
    }

    /// Why restatus must not let metal-operator act on the object yet, if it must not. The
    /// object waits for:
    /// - a Server, for its ServerClaim (`spec.serverClaimRef`): without it, metal-operator
    ///   powers the Server off, drops its boot configuration and frees it for other claims;
    /// - a ServerClaim, for its Server (`spec.serverRef`), and a Bound one for that Server to be
    ///   `Reserved` for it (see [`claim_waits_for`]): a Bound claim released before is one
    ///   metal-operator would try to bind again;
    /// - a BMC, for its Servers: metal-operator creates each system's Server itself (named
    ///   `<bmc>-system-<n>`, as v0.7.0 does), without status; clusterctl then finds it there
    ///   and does not copy the source's. The snapshot tells which Servers the BMC had; they are
    ///   found on the target by identity (see [`Partners::bmc_waits`]).
    ///
    /// And a Server whose status, the snapshot's (`snapshots_status`), says `Available` while
    /// its spec names a claim was bound after the snapshot (a disaster recovery from an older
    /// snapshot): metal-operator would power the machine off, which serves that claim, and boot
    /// it again. A person decides (set its status, or remove restatus's `ignore`); see
    /// docs/MOVE.md, disaster recovery.
    ///
    /// The object is the status write's answer, or read again when there was none.
    pub async fn hold(&self, writer: &Writer, profile: &Profile, candidate: &Candidate<'_>) -> Result<Option<String>> {
        if candidate.kind.group != METAL_GROUP {
            return Ok(None);
        }
        let partner = |kind: &str| profile.kind(kind).filter(|k| k.group == METAL_GROUP);
        match (candidate.kind.kind.as_str(), partner("ServerClaim"), partner("Server")) {
            ("Server", Some(claims), _) => match view(writer, candidate).await? {
                Some(View::Server(ServerView { state, claim: Some((namespace, name)), .. })) => {
                    if candidate.snapshots_status && state == "Available" {
                        return Ok(Some(format!(
                            "bound after the snapshot: Available, yet spec.serverClaimRef names {namespace}/{name}"
                        )));
                    }
                    self.server_waits(writer, candidate, claims, namespace, name).await
                }
                _ => Ok(None),
            },
            ("ServerClaim", _, Some(servers)) => match view(writer, candidate).await? {
                Some(View::Claim(claim)) => self.claim_waits(writer, candidate, servers, &claim).await,
                _ => Ok(None),
            },
            ("BMC", _, Some(servers)) => self.bmc_waits(writer, candidate, servers).await,
            _ => Ok(None),
        }
    }

    /// What a bound Server waits for: its claim `namespace/name`, unless seen, read by name.
    async fn server_waits(
        &self,
        writer: &Writer,
        candidate: &Candidate<'_>,
        claims: &KindProfile,
        namespace: String,
        name: String,
    ) -> Result<Option<String>> {
        if self.knows(|seen| seen.has_claim(&namespace, &name)) {
            return Ok(None);
        }
        match look_up(writer, candidate, claims, Some(&namespace), &name).await? {
            Some(_) => Ok(None),
            None => {
                let claim = ObjectRef { kind: claims.kind.clone(), namespace: Some(namespace), name };
                Ok(Some(format!("waits for {claim}")))
            }
        }
    }

    /// What a claim waits for (see [`claim_waits_for`]): its Server, read by name, unless a
    /// Bound claim's Server was seen Reserved for it.
    async fn claim_waits(
        &self,
        writer: &Writer,
        candidate: &Candidate<'_>,
        servers: &KindProfile,
        claim: &ClaimView,
    ) -> Result<Option<String>> {
        let Some(name) = claim.server.as_deref() else { return Ok(None) };
        if claim.phase == "Bound" && self.knows(|seen| seen.reserved_for(name, &claim.namespace, &claim.name)) {
            return Ok(None);
        }
        let server = match look_up(writer, candidate, servers, None, name).await? {
            Some(json) => {
                let object = RawObject::parse(&json)
                    .map_err(|e| invalid(candidate, format!("its Server {name} cannot be read: {e}")))?;
                Some(ServerView::from_raw(&object))
            }
            None => None,
        };
        Ok(claim_waits_for(claim, server.as_ref()))
    }

    /// What a BMC waits for: each Server the snapshot holds for it, on the target under its
    /// name. One found by neither name nor identity among the Servers the applier knows is
    /// looked up by name (created since the listing, or outside the controller's selection);
    /// one found by identity under another name holds the BMC for a person (see
    /// [`ServerThere::Renamed`]).
    async fn bmc_waits(
        &self,
        writer: &Writer,
        candidate: &Candidate<'_>,
        servers: &KindProfile,
    ) -> Result<Option<String>> {
        let recorded = servers_of_bmc(&candidate.object.name, self.system_servers()?);
        if recorded.is_empty() {
            return Ok(None);
        }
        let live = self.live_servers(writer, servers).await?;
        for (head, there) in servers_not_there(&recorded, live) {
            if let ServerThere::Renamed { name, key } = there {
                return Ok(Some(format!(
                    "its Server {} is on the target as {name} ({key}): metal-operator names a BMC's Servers \
                     <bmc>-system-<n> and, released, would create {} again for the same machine and discover it; \
                     rename {name} to {}, or remove restatus's ignore from this BMC to hand it over as it is",
                    head.name, head.name, head.name
                )));
            }
            if look_up(writer, candidate, servers, None, &head.name).await?.is_none() {
                return Ok(Some(format!("waits for Server {}", head.name)));
            }
        }
        Ok(None)
    }
}

/// A partner of the candidate, read by name: `None` when it is not there.
async fn look_up(
    writer: &Writer,
    candidate: &Candidate<'_>,
    kind: &KindProfile,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<String>> {
    match writer.get_named(kind, namespace, name).await {
        Ok(json) => Ok(Some(json)),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(None),
        Err(e) => Err(Error::kube(format!("look up what {} waits for", candidate.object.object_ref()), e)),
    }
}

/// The candidate's pairing view (a Server's state and `spec.serverClaimRef`, a claim's
/// `spec.serverRef`), from the status write's answer or a fresh read.
async fn view(writer: &Writer, candidate: &Candidate<'_>) -> Result<Option<View>> {
    let json = match candidate.written {
        Some(json) => json.to_string(),
        None => writer.get(candidate.kind, candidate.object).await?,
    };
    let object = RawObject::parse(&json).map_err(|e| match candidate.written {
        Some(_) => invalid(candidate, format!("answer to the status write: {e}")),
        None => invalid(candidate, e.to_string()),
    })?;
    Ok(View::of(candidate.kind, &object))
}

fn invalid(candidate: &Candidate<'_>, reason: String) -> Error {
    Error::InvalidObject { kind: candidate.kind.qualified_kind(), name: candidate.object.name.clone(), reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What was seen of metal-operator's claims is forgotten by a listing or deletion of its
    /// own ServerClaims, not by those of a kind of the same name in another group.
    #[test]
    fn only_metal_operators_own_kinds_make_seen_forget() {
        let profile = Profile::metal_operator();
        let claims = profile.kind("ServerClaim").unwrap();
        let foreign = KindProfile { group: "example.com".into(), ..claims.clone() };
        let seen = Seen::default();
        let claim = ClaimView { namespace: "a".into(), name: "c".into(), phase: "Bound".into(), server: None };
        seen.add(View::Claim(claim));
        let has_claim = || seen.knows(|views| views.has_claim("a", "c"));
        seen.listing(&foreign);
        seen.gone(&foreign, Some("a"), "c");
        assert!(has_claim(), "another group's kind says nothing of metal-operator's pairing");
        seen.gone(claims, Some("a"), "c");
        assert!(!has_claim(), "deleted");
        seen.add(View::Claim(ClaimView {
            namespace: "a".into(),
            name: "c".into(),
            phase: String::new(),
            server: None,
        }));
        seen.listing(claims);
        assert!(!has_claim(), "listed again: forgotten until the listing shows it");
    }
}
