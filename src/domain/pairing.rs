//! Claim/server pairing, metal-operator's invariant: every Bound ServerClaim's Server is
//! Reserved and points back to the claim, and every Reserved Server's claim is Bound to it.
//! Pure; checked after a restore and (for consistency) on every capture.

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use serde::Serialize;

use crate::Result;
use crate::domain::identity::KindProfile;
use crate::domain::object::RawObject;
use crate::format::{IdentityKey, Names, ObjectRef, RecordHead, Records, digest};

/// The API group whose Servers and ServerClaims pair up.
pub const METAL_GROUP: &str = "metal.ironcore.dev";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerView {
    pub name: String,
    pub state: String,
    /// `spec.serverClaimRef` as (namespace, name).
    pub claim: Option<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimView {
    pub namespace: String,
    pub name: String,
    pub phase: String,
    /// `spec.serverRef.name`.
    pub server: Option<String>,
}

impl ServerView {
    pub fn from_raw(object: &RawObject<'_>) -> Self {
        let claim =
            match (object.string_at("spec.serverClaimRef.namespace"), object.string_at("spec.serverClaimRef.name")) {
                (Some(ns), Some(name)) => Some((ns, name)),
                _ => None,
            };
        ServerView {
            name: object.meta.name.to_string(),
            state: object.string_at("status.state").unwrap_or_default(),
            claim,
        }
    }
}

impl ClaimView {
    pub fn from_raw(object: &RawObject<'_>) -> Self {
        ClaimView {
            namespace: object.meta.namespace.as_deref().unwrap_or_default().to_string(),
            name: object.meta.name.to_string(),
            phase: object.string_at("status.phase").unwrap_or_default(),
            server: object.string_at("spec.serverRef.name"),
        }
    }
}

/// One object's side of the pairing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum View {
    Server(ServerView),
    Claim(ClaimView),
}

impl View {
    /// The view of an object whose kind takes part in the pairing: metal-operator's Servers
    /// and ServerClaims.
    pub fn of(kind: &KindProfile, object: &RawObject<'_>) -> Option<View> {
        if kind.group != METAL_GROUP {
            return None;
        }
        match kind.kind.as_str() {
            "Server" => Some(View::Server(ServerView::from_raw(object))),
            "ServerClaim" => Some(View::Claim(ClaimView::from_raw(object))),
            _ => None,
        }
    }
}

/// The pairing views of a cluster's Servers and ServerClaims, by name: a later view of an
/// object (say, the answer to a write) replaces the earlier one.
///
/// Only objects that take part in a pairing are kept whole: a Reserved Server or one whose
/// spec names a claim, a Bound claim or one whose spec names a server. Of the others, which a
/// pairing can only name as "not Reserved" or "not Bound", the state is kept by a digest of
/// their name: a fleet of free Servers costs a few bytes an object.
#[derive(Debug, Clone, Default)]
pub struct Views {
    servers: BTreeMap<String, ServerView>,
    claims: BTreeMap<(String, String), ClaimView>,
    free_servers: HashMap<u64, u32>,
    free_claims: HashMap<u64, u32>,
    /// The states and phases of free objects, each once.
    states: Names,
}

/// One side of a pair as the other side finds it.
enum Partner<'a, V> {
    Missing,
    Whole(&'a V),
    /// Takes no part in a pairing; in this state.
    Free(&'a str),
}

fn name_digest(namespace: &str, name: &str) -> u64 {
    digest((namespace, name))
}

impl Views {
    pub fn add(&mut self, view: View) {
        match view {
            View::Server(s) => {
                let digest = name_digest("", &s.name);
                if s.state == "Reserved" || s.claim.is_some() {
                    self.free_servers.remove(&digest);
                    self.servers.insert(s.name.clone(), s);
                } else {
                    self.servers.remove(&s.name);
                    let state = self.states.intern(&s.state);
                    self.free_servers.insert(digest, state);
                }
            }
            View::Claim(c) => {
                let digest = name_digest(&c.namespace, &c.name);
                if c.phase == "Bound" || c.server.is_some() {
                    self.free_claims.remove(&digest);
                    self.claims.insert((c.namespace.clone(), c.name.clone()), c);
                } else {
                    self.claims.remove(&(c.namespace.clone(), c.name.clone()));
                    let phase = self.states.intern(&c.phase);
                    self.free_claims.insert(digest, phase);
                }
            }
        }
    }

    /// Forgets a Server (`namespace` `None`) or a claim that is gone.
    pub fn remove(&mut self, kind: &str, namespace: Option<&str>, name: &str) {
        match (kind, namespace) {
            ("Server", _) => {
                self.servers.remove(name);
                self.free_servers.remove(&name_digest("", name));
            }
            ("ServerClaim", Some(ns)) => {
                self.claims.remove(&(ns.to_string(), name.to_string()));
                self.free_claims.remove(&name_digest(ns, name));
            }
            _ => {}
        }
    }

    /// Later views replace earlier ones.
    pub fn extend(&mut self, views: impl IntoIterator<Item = View>) {
        for view in views {
            self.add(view);
        }
    }

    /// Everything the other holds replaces what this one holds of the same objects.
    pub fn merge(&mut self, other: Views) {
        self.servers.retain(|name, _| !other.free_servers.contains_key(&name_digest("", name)));
        self.claims.retain(|(ns, name), _| !other.free_claims.contains_key(&name_digest(ns, name)));
        for (digest, state) in other.free_servers {
            let state = self.states.intern(other.states.get(state));
            self.free_servers.insert(digest, state);
        }
        for (digest, phase) in other.free_claims {
            let phase = self.states.intern(other.states.get(phase));
            self.free_claims.insert(digest, phase);
        }
        let (servers, claims) = (other.servers, other.claims);
        self.extend(servers.into_values().map(View::Server).chain(claims.into_values().map(View::Claim)));
    }

    /// Forgets every object of `kind` (`Server` or `ServerClaim`): a re-list of it follows.
    pub fn clear(&mut self, kind: &str) {
        match kind {
            "Server" => {
                self.servers.clear();
                self.free_servers.clear();
            }
            "ServerClaim" => {
                self.claims.clear();
                self.free_claims.clear();
            }
            _ => {}
        }
    }

    /// The claim `namespace/name` was seen (in whatever phase) and not seen gone.
    pub fn has_claim(&self, namespace: &str, name: &str) -> bool {
        !matches!(self.claim(namespace, name), Partner::Missing)
    }

    /// The Server `server` was last seen Reserved for the claim `namespace/name`.
    pub fn reserved_for(&self, server: &str, namespace: &str, name: &str) -> bool {
        match self.server(server) {
            Partner::Whole(s) => {
                s.state == "Reserved" && s.claim.as_ref().is_some_and(|(ns, n)| ns == namespace && n == name)
            }
            Partner::Free(_) | Partner::Missing => false,
        }
    }

    /// The Servers and claims that take part in a pairing.
    pub fn servers(&self) -> impl Iterator<Item = &ServerView> + Clone {
        self.servers.values()
    }

    pub fn claims(&self) -> impl Iterator<Item = &ClaimView> + Clone {
        self.claims.values()
    }

    fn server(&self, name: &str) -> Partner<'_, ServerView> {
        match (self.servers.get(name), self.free_servers.get(&name_digest("", name))) {
            (Some(server), _) => Partner::Whole(server),
            (None, Some(&state)) => Partner::Free(self.states.get(state)),
            (None, None) => Partner::Missing,
        }
    }

    fn claim(&self, namespace: &str, name: &str) -> Partner<'_, ClaimView> {
        let whole = self.claims.get(&(namespace.to_string(), name.to_string()));
        match (whole, self.free_claims.get(&name_digest(namespace, name))) {
            (Some(claim), _) => Partner::Whole(claim),
            (None, Some(&phase)) => Partner::Free(self.states.get(phase)),
            (None, None) => Partner::Missing,
        }
    }

    /// Every Bound claim whose Server is not Reserved for it, and every Reserved Server whose
    /// claim is not Bound to it.
    pub fn check(&self) -> Vec<Violation> {
        let mut out = Vec::new();
        for claim in self.claims().filter(|c| c.phase == "Bound") {
            let object = ObjectRef {
                kind: "ServerClaim".into(),
                namespace: Some(claim.namespace.clone()),
                name: claim.name.clone(),
            };
            let reason = match claim.server.as_deref().map(|s| (s, self.server(s))) {
                None => Some("Bound without spec.serverRef".to_string()),
                Some((name, Partner::Missing)) => Some(format!("Bound to Server {name}, which does not exist")),
                Some((name, Partner::Free(state))) => {
                    Some(format!("Bound to Server {name}, which is {state:?}, not Reserved"))
                }
                Some((name, Partner::Whole(server))) if server.state != "Reserved" => {
                    Some(format!("Bound to Server {name}, which is {:?}, not Reserved", server.state))
                }
                Some((name, Partner::Whole(server)))
                    if server.claim.as_ref() != Some(&(claim.namespace.clone(), claim.name.clone())) =>
                {
                    Some(format!("Bound to Server {name}, whose spec.serverClaimRef does not point back"))
                }
                Some(_) => None,
            };
            out.extend(reason.map(|reason| Violation { object, reason }));
        }
        for server in self.servers().filter(|s| s.state == "Reserved") {
            let object = ObjectRef { kind: "Server".into(), namespace: None, name: server.name.clone() };
            let reason = match &server.claim {
                None => Some("Reserved without spec.serverClaimRef".to_string()),
                Some((ns, name)) => match self.claim(ns, name) {
                    Partner::Missing => Some(format!("Reserved for ServerClaim {ns}/{name}, which does not exist")),
                    Partner::Free(phase) => {
                        Some(format!("Reserved for ServerClaim {ns}/{name}, which is {phase:?}, not Bound"))
                    }
                    Partner::Whole(claim) if claim.phase != "Bound" => {
                        Some(format!("Reserved for ServerClaim {ns}/{name}, which is {:?}, not Bound", claim.phase))
                    }
                    Partner::Whole(claim) if claim.server.as_deref() != Some(server.name.as_str()) => {
                        Some(format!("Reserved for ServerClaim {ns}/{name}, whose spec.serverRef names another server"))
                    }
                    Partner::Whole(_) => None,
                },
            };
            out.extend(reason.map(|reason| Violation { object, reason }));
        }
        out
    }
}

/// What a restored ServerClaim waits for before metal-operator may see it, given its Server
/// as the target holds it (`None`: not there). A claim that names a Server waits for it to
/// exist; a Bound claim also for it to be `Reserved` for this claim (`spec.serverClaimRef`
/// naming the claim's namespace/name): released Bound before that, metal-operator finds a
/// Bound claim whose Server is not its own and binds again. A Server restored `Reserved` for
/// the claim counts, even while restatus holds it (waiting for the claim in turn): the two
/// never wait for each other.
pub fn claim_waits_for(claim: &ClaimView, server: Option<&ServerView>) -> Option<String> {
    let name = claim.server.as_deref()?;
    let Some(server) = server else { return Some(format!("waits for Server {name}")) };
    if claim.phase != "Bound" {
        return None;
    }
    let own = (claim.namespace.clone(), claim.name.clone());
    if server.state == "Reserved" && server.claim.as_ref() == Some(&own) {
        return None;
    }
    let claim_ref = match &server.claim {
        Some((ns, n)) => format!("{ns}/{n}"),
        None => "none".into(),
    };
    Some(format!(
        "waits for Server {name} to be Reserved for it (now {:?}, spec.serverClaimRef {claim_ref})",
        server.state
    ))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub object: ObjectRef,
    pub reason: String,
}

/// The snapshot's metal-operator Servers named as a BMC's systems (`<bmc>-system-<n>`): the
/// Servers a BMC waits for. Read from the records once, when a BMC first needs them.
#[derive(Debug, Default)]
pub struct SystemServers(OnceLock<Vec<RecordHead>>);

impl SystemServers {
    pub fn get(&self, records: &Records) -> Result<&[RecordHead]> {
        if let Some(heads) = self.0.get() {
            return Ok(heads);
        }
        let mut heads = Vec::new();
        for r in records.of_kind(&format!("Server.{METAL_GROUP}")) {
            let head = records.head(r)?;
            if head.name.contains("-system-") {
                heads.push(head);
            }
        }
        Ok(self.0.get_or_init(|| heads))
    }
}

/// A Server on the target as a BMC's wait sees it: its name and identity keys
/// (`spec.systemUUID`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerIdentity {
    pub name: String,
    pub keys: Vec<IdentityKey>,
}

/// How a Server the snapshot holds for a BMC stands on the target, when not as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerThere {
    /// No Server on the target has its name or any of its identity keys.
    Missing,
    /// A Server has one of its identity keys (the same `spec.systemUUID`) under another name.
    /// metal-operator (v0.7.0 `discoverServers`) creates and patches a BMC's Servers by name
    /// (`<bmc>-system-<n>`): released, the BMC would get a second Server for the same machine,
    /// and its discovery would power the machine on. A person decides.
    Renamed { name: String, key: IdentityKey },
}

/// The Servers the snapshot holds for a BMC (see [`servers_of_bmc`]) that are not on the
/// target as they were: found by neither name nor identity, or found by identity (the same
/// `spec.systemUUID`) under another name. Pure; `live` may hold any Servers.
pub fn servers_not_there<'r>(
    recorded: &[&'r RecordHead],
    live: &[ServerIdentity],
) -> Vec<(&'r RecordHead, ServerThere)> {
    recorded
        .iter()
        .filter(|r| !live.iter().any(|s| s.name == r.name))
        .map(|r| {
            let renamed = live.iter().find_map(|s| {
                let key = s.keys.iter().find(|k| r.keys.contains(k))?;
                Some(ServerThere::Renamed { name: s.name.clone(), key: key.clone() })
            });
            (*r, renamed.unwrap_or(ServerThere::Missing))
        })
        .collect()
}

/// The Servers the snapshot holds for BMC `bmc`, by metal-operator's naming of the Servers a
/// BMC's systems get: `<bmc>-system-<index>`.
pub fn servers_of_bmc<'r>(bmc: &str, records: &'r [RecordHead]) -> Vec<&'r RecordHead> {
    let prefix = format!("{bmc}-system-");
    // `records` are metal-operator Servers already (see `SystemServers`).
    records
        .iter()
        .filter(|r| {
            r.name.strip_prefix(&prefix).is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &str, state: &str, claim: Option<(&str, &str)>) -> ServerView {
        ServerView { name: name.into(), state: state.into(), claim: claim.map(|(a, b)| (a.into(), b.into())) }
    }

    fn claim(ns: &str, name: &str, phase: &str, server: Option<&str>) -> ClaimView {
        ClaimView { namespace: ns.into(), name: name.into(), phase: phase.into(), server: server.map(Into::into) }
    }

    fn reasons(servers: &[ServerView], claims: &[ClaimView]) -> Vec<String> {
        let mut views = Views::default();
        views.extend(servers.iter().cloned().map(View::Server).chain(claims.iter().cloned().map(View::Claim)));
        views.check().into_iter().map(|v| format!("{}: {}", v.object, v.reason)).collect()
    }

    #[test]
    fn a_proper_pair_and_free_objects_are_fine() {
        let servers = [server("s1", "Reserved", Some(("a", "c1"))), server("s2", "Available", None)];
        let claims = [claim("a", "c1", "Bound", Some("s1")), claim("a", "c2", "Unbound", None)];
        assert!(reasons(&servers, &claims).is_empty());
    }

    #[test]
    fn every_broken_side_is_named() {
        let servers = [
            server("s1", "Available", Some(("a", "c1"))),
            server("s2", "Reserved", Some(("a", "other"))),
            server("s3", "Reserved", None),
            server("s4", "Reserved", Some(("a", "c4"))),
            server("s5", "Reserved", Some(("a", "c5"))),
        ];
        let claims = [
            claim("a", "c1", "Bound", Some("s1")),
            claim("a", "c2", "Bound", Some("s2")),
            claim("a", "c3", "Bound", Some("missing")),
            claim("a", "c4", "Unbound", Some("s4")),
            claim("a", "c5", "Bound", Some("s1")),
            claim("a", "c6", "Bound", None),
        ];
        assert_eq!(
            reasons(&servers, &claims),
            [
                "ServerClaim a/c1: Bound to Server s1, which is \"Available\", not Reserved",
                "ServerClaim a/c2: Bound to Server s2, whose spec.serverClaimRef does not point back",
                "ServerClaim a/c3: Bound to Server missing, which does not exist",
                "ServerClaim a/c5: Bound to Server s1, which is \"Available\", not Reserved",
                "ServerClaim a/c6: Bound without spec.serverRef",
                "Server s2: Reserved for ServerClaim a/other, which does not exist",
                "Server s3: Reserved without spec.serverClaimRef",
                "Server s4: Reserved for ServerClaim a/c4, which is \"Unbound\", not Bound",
                "Server s5: Reserved for ServerClaim a/c5, whose spec.serverRef names another server",
            ]
        );
    }

    #[test]
    fn a_later_view_of_an_object_replaces_the_earlier_one() {
        let mut views = Views::default();
        views.add(View::Server(server("s1", "", Some(("a", "c1")))));
        views.add(View::Claim(claim("a", "c1", "Bound", Some("s1"))));
        assert_eq!(views.check().len(), 1, "the claim is Bound, its server not yet Reserved");
        views.add(View::Server(server("s1", "Reserved", Some(("a", "c1")))));
        assert!(views.check().is_empty());
        assert_eq!(views.servers().count(), 1);
        views.add(View::Server(server("s1", "Available", None)));
        assert_eq!(views.servers().count(), 0, "a free Server is kept by its state alone");
        let reasons: Vec<String> = views.check().into_iter().map(|v| v.reason).collect();
        assert_eq!(reasons, ["Bound to Server s1, which is \"Available\", not Reserved"]);
    }

    /// Issue 22, item 3: what the controller's watches saw answers a release's look-ups with
    /// positive facts only: a claim seen and not seen gone, a Server last seen Reserved for the
    /// claim; a Server that moved on, one Reserved for another claim, one never seen, or one
    /// whose kind is being listed again is not.
    #[test]
    fn seen_claims_and_reservations_are_known_and_nothing_else() {
        let mut views = Views::default();
        views.add(View::Claim(claim("a", "c1", "", None)));
        views.add(View::Server(server("s1", "Reserved", Some(("a", "c1")))));
        views.add(View::Server(server("s2", "Reserved", Some(("a", "other")))));
        views.add(View::Server(server("s3", "Available", None)));
        assert!(views.has_claim("a", "c1") && !views.has_claim("a", "c2") && !views.has_claim("b", "c1"));
        assert!(views.reserved_for("s1", "a", "c1"));
        assert!(!views.reserved_for("s2", "a", "c1") && !views.reserved_for("s3", "a", "c1"));
        assert!(!views.reserved_for("s4", "a", "c1"), "never seen");
        views.add(View::Server(server("s1", "Available", Some(("a", "c1")))));
        assert!(!views.reserved_for("s1", "a", "c1"), "moved on");
        views.add(View::Server(server("s1", "Reserved", Some(("a", "c1")))));
        views.remove("ServerClaim", Some("a"), "c1");
        assert!(!views.has_claim("a", "c1"), "seen gone");
        views.add(View::Claim(claim("a", "c1", "Bound", Some("s1"))));
        views.clear("Server");
        assert!(!views.reserved_for("s1", "a", "c1") && views.has_claim("a", "c1"), "Servers listed again");
        views.clear("ServerClaim");
        assert!(!views.has_claim("a", "c1"));
    }

    #[test]
    fn merged_views_replace_the_older_ones() {
        let mut listed = Views::default();
        listed.add(View::Server(server("s1", "", None)));
        listed.add(View::Claim(claim("a", "c1", "", None)));
        let mut written = Views::default();
        written.add(View::Server(server("s1", "Reserved", Some(("a", "c1")))));
        listed.merge(written);
        let reasons: Vec<String> = listed.check().into_iter().map(|v| v.reason).collect();
        assert_eq!(reasons, ["Reserved for ServerClaim a/c1, which is \"\", not Bound"]);
        let mut bound = Views::default();
        bound.add(View::Claim(claim("a", "c1", "Bound", Some("s1"))));
        listed.merge(bound);
        assert!(listed.check().is_empty());
        let mut freed = Views::default();
        freed.add(View::Server(server("s1", "Available", None)));
        listed.merge(freed);
        let reasons: Vec<String> = listed.check().into_iter().map(|v| v.reason).collect();
        assert_eq!(reasons, ["Bound to Server s1, which is \"Available\", not Reserved"]);
    }

    #[test]
    fn views_read_the_fields_metal_operator_sets() {
        let s = RawObject::parse(r#"{"metadata":{"name":"s1"},"spec":{"serverClaimRef":{"namespace":"a","name":"c1"}},"status":{"state":"Reserved"}}"#).unwrap();
        assert_eq!(ServerView::from_raw(&s), server("s1", "Reserved", Some(("a", "c1"))));
        let c = RawObject::parse(r#"{"metadata":{"name":"c1","namespace":"a"},"spec":{"serverRef":{"name":"s1"}},"status":{"phase":"Bound"}}"#).unwrap();
        assert_eq!(ClaimView::from_raw(&c), claim("a", "c1", "Bound", Some("s1")));
    }

    /// Issue 21, item 4: a Bound claim waits for its Server to exist and to be Reserved for
    /// it; a Server held by restatus for the claim (restored Reserved, pointing back) counts.
    #[test]
    fn a_bound_claim_waits_for_its_server_to_be_reserved_for_it() {
        let bound = claim("a", "c1", "Bound", Some("s1"));
        assert_eq!(claim_waits_for(&bound, None).as_deref(), Some("waits for Server s1"));
        let bare = server("s1", "", Some(("a", "c1")));
        assert_eq!(
            claim_waits_for(&bound, Some(&bare)).as_deref(),
            Some("waits for Server s1 to be Reserved for it (now \"\", spec.serverClaimRef a/c1)")
        );
        let other = server("s1", "Reserved", Some(("a", "c2")));
        assert_eq!(
            claim_waits_for(&bound, Some(&other)).as_deref(),
            Some("waits for Server s1 to be Reserved for it (now \"Reserved\", spec.serverClaimRef a/c2)")
        );
        let unclaimed = server("s1", "Reserved", None);
        assert!(claim_waits_for(&bound, Some(&unclaimed)).unwrap().contains("spec.serverClaimRef none"));
        let other_namespace = server("s1", "Reserved", Some(("b", "c1")));
        assert!(claim_waits_for(&bound, Some(&other_namespace)).is_some());
        assert_eq!(claim_waits_for(&bound, Some(&server("s1", "Reserved", Some(("a", "c1"))))), None);
        // Not Bound: being bound by metal-operator, which needs it released; its Server must
        // only be there.
        let binding = claim("a", "c1", "", Some("s1"));
        assert_eq!(claim_waits_for(&binding, Some(&bare)), None);
        assert_eq!(claim_waits_for(&binding, None).as_deref(), Some("waits for Server s1"));
        assert_eq!(claim_waits_for(&claim("a", "c1", "Bound", None), None), None);
    }

    /// Issue 21, item 4: a BMC's Server is found by identity: a Server on the target with the
    /// recorded one's systemUUID is it, whatever its name; one with neither its name nor its
    /// systemUUID is another machine.
    #[test]
    fn a_bmcs_server_is_found_by_its_system_uuid_whatever_its_name() {
        let uuid = crate::fixtures::uuid;
        let head = |name: &str, key: &str| {
            crate::fixtures::record("Server", name, &[uuid(key)], serde_json::json!({})).split().0
        };
        let live = |name: &str, key: &str| ServerIdentity { name: name.into(), keys: vec![uuid(key)] };
        let (s0, s1) = (head("bmc-system-0", "uuid-0"), head("bmc-system-1", "uuid-1"));
        let recorded = [&s0, &s1];
        let missing = |live: &[ServerIdentity]| {
            servers_not_there(&recorded, live)
                .into_iter()
                .map(|(h, there)| match there {
                    ServerThere::Missing => format!("{} missing", h.name),
                    ServerThere::Renamed { name, key } => format!("{} is {name} by {key}", h.name),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(missing(&[]), ["bmc-system-0 missing", "bmc-system-1 missing"]);
        assert_eq!(
            missing(&[live("renamed", "uuid-0")]),
            ["bmc-system-0 is renamed by spec.systemUUID=uuid-0", "bmc-system-1 missing"],
            "found by systemUUID, not by name: there, under another name"
        );
        assert_eq!(missing(&[live("bmc-system-1", "other")]), ["bmc-system-0 missing"], "by name still");
        assert_eq!(missing(&[live("bmc-system-0", "uuid-0"), live("bmc-system-1", "uuid-1")]), Vec::<String>::new());
        assert_eq!(missing(&[live("stranger", "uuid-9")]).len(), 2, "another machine");
    }

    #[test]
    fn a_bmc_awaits_the_servers_of_its_systems_named_as_metal_operator_names_them() {
        let server = |name: &str| crate::fixtures::record("Server", name, &[], serde_json::json!({})).split().0;
        let records = [
            server("rack1-bmc-system-0"),
            server("rack1-bmc-system-1"),
            server("rack1-bmc-system-x"),
            server("rack1-bmc-system-"),
            server("rack1-bmc-2-system-0"),
            server("other-bmc-system-0"),
        ];
        let names = |heads: Vec<&RecordHead>| heads.into_iter().map(|h| h.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(servers_of_bmc("rack1-bmc", &records)), ["rack1-bmc-system-0", "rack1-bmc-system-1"]);
        assert!(servers_of_bmc("rack2-bmc", &records).is_empty());
    }
}
