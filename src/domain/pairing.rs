//! Claim/server pairing, metal-operator's invariant: every Bound ServerClaim's Server is
//! Reserved and points back to the claim, and every Reserved Server's claim is Bound to it.
//! Pure; checked after a restore and (for consistency) on every capture.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::domain::identity::KindProfile;
use crate::domain::object::RawObject;
use crate::format::ObjectRef;

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
#[derive(Debug, Clone, Default)]
pub struct Views {
    servers: BTreeMap<String, ServerView>,
    claims: BTreeMap<(String, String), ClaimView>,
}

impl Views {
    pub fn add(&mut self, view: View) {
        match view {
            View::Server(s) => {
                self.servers.insert(s.name.clone(), s);
            }
            View::Claim(c) => {
                self.claims.insert((c.namespace.clone(), c.name.clone()), c);
            }
        }
    }

    /// Later views replace earlier ones.
    pub fn extend(&mut self, views: impl IntoIterator<Item = View>) {
        for view in views {
            self.add(view);
        }
    }

    pub fn servers(&self) -> impl Iterator<Item = &ServerView> + Clone {
        self.servers.values()
    }

    pub fn claims(&self) -> impl Iterator<Item = &ClaimView> + Clone {
        self.claims.values()
    }

    pub fn check(&self) -> Vec<Violation> {
        check(self.servers(), self.claims())
    }
}

impl IntoIterator for Views {
    type Item = View;
    type IntoIter = std::iter::Chain<
        std::iter::Map<std::collections::btree_map::IntoValues<String, ServerView>, fn(ServerView) -> View>,
        std::iter::Map<std::collections::btree_map::IntoValues<(String, String), ClaimView>, fn(ClaimView) -> View>,
    >;

    fn into_iter(self) -> Self::IntoIter {
        let servers = self.servers.into_values().map(View::Server as fn(ServerView) -> View);
        servers.chain(self.claims.into_values().map(View::Claim as fn(ClaimView) -> View))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub object: ObjectRef,
    pub reason: String,
}

pub fn check<'a>(
    servers: impl IntoIterator<Item = &'a ServerView> + Clone,
    claims: impl IntoIterator<Item = &'a ClaimView> + Clone,
) -> Vec<Violation> {
    let by_server: HashMap<&str, &ServerView> = servers.clone().into_iter().map(|s| (s.name.as_str(), s)).collect();
    let by_claim: HashMap<(&str, &str), &ClaimView> =
        claims.clone().into_iter().map(|c| ((c.namespace.as_str(), c.name.as_str()), c)).collect();
    let mut out = Vec::new();
    for claim in claims.into_iter().filter(|c| c.phase == "Bound") {
        let object = ObjectRef {
            kind: "ServerClaim".into(),
            namespace: Some(claim.namespace.clone()),
            name: claim.name.clone(),
        };
        let reason = match claim.server.as_deref().map(|s| (s, by_server.get(s))) {
            None => Some("Bound without spec.serverRef".to_string()),
            Some((name, None)) => Some(format!("Bound to Server {name}, which does not exist")),
            Some((name, Some(server))) if server.state != "Reserved" => {
                Some(format!("Bound to Server {name}, which is {:?}, not Reserved", server.state))
            }
            Some((name, Some(server)))
                if server.claim.as_ref() != Some(&(claim.namespace.clone(), claim.name.clone())) =>
            {
                Some(format!("Bound to Server {name}, whose spec.serverClaimRef does not point back"))
            }
            Some(_) => None,
        };
        out.extend(reason.map(|reason| Violation { object, reason }));
    }
    for server in servers.into_iter().filter(|s| s.state == "Reserved") {
        let object = ObjectRef { kind: "Server".into(), namespace: None, name: server.name.clone() };
        let reason = match &server.claim {
            None => Some("Reserved without spec.serverClaimRef".to_string()),
            Some((ns, name)) => match by_claim.get(&(ns.as_str(), name.as_str())) {
                None => Some(format!("Reserved for ServerClaim {ns}/{name}, which does not exist")),
                Some(claim) if claim.phase != "Bound" => {
                    Some(format!("Reserved for ServerClaim {ns}/{name}, which is {:?}, not Bound", claim.phase))
                }
                Some(claim) if claim.server.as_deref() != Some(server.name.as_str()) => {
                    Some(format!("Reserved for ServerClaim {ns}/{name}, whose spec.serverRef names another server"))
                }
                Some(_) => None,
            },
        };
        out.extend(reason.map(|reason| Violation { object, reason }));
    }
    out
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
        check(servers.iter(), claims.iter()).into_iter().map(|v| format!("{}: {}", v.object, v.reason)).collect()
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
    }

    #[test]
    fn views_read_the_fields_metal_operator_sets() {
        let s = RawObject::parse(r#"{"metadata":{"name":"s1"},"spec":{"serverClaimRef":{"namespace":"a","name":"c1"}},"status":{"state":"Reserved"}}"#).unwrap();
        assert_eq!(ServerView::from_raw(&s), server("s1", "Reserved", Some(("a", "c1"))));
        let c = RawObject::parse(r#"{"metadata":{"name":"c1","namespace":"a"},"spec":{"serverRef":{"name":"s1"}},"status":{"phase":"Bound"}}"#).unwrap();
        assert_eq!(ClaimView::from_raw(&c), claim("a", "c1", "Bound", Some("s1")));
    }
}
