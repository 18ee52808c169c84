//! The move set, as `clusterctl move` (cluster-api v1.13) computes it, and what it leaves
//! behind. Pure: a function of the CustomResourceDefinitions and objects [`super::discover`]
//! reads.
//!
//! clusterctl's rules (`cmd/clusterctl/client/cluster/objectgraph.go`, `mover.go`):
//!
//! - it discovers only kinds whose CRD carries the label `clusterctl.cluster.x-k8s.io` (any
//!   value), at their storage version; objects of other kinds are never listed, and an owner
//!   reference to one of them ends the owner chain there;
//! - it lists namespaced kinds in the namespace moved, cluster-scoped kinds whole;
//! - an object moves when it carries `clusterctl.cluster.x-k8s.io/move` or its CRD does
//!   ("force move"), or when it reaches, through owner references, an object of a
//!   "move hierarchy": a Cluster, ClusterClass or ClusterResourceSet, or an object or CRD
//!   labelled `clusterctl.cluster.x-k8s.io/move-hierarchy` (which moves too). A force-moved
//!   object without hierarchy carries none of its dependents;
//! - it deletes the moved objects on the source, except cluster-scoped ones and the
//!   dependents of a cluster-scoped hierarchy; the garbage collector then deletes every object
//!   whose owners are all gone: an object a moved one owns but that does not move itself is
//!   lost on both clusters.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde::Deserialize;

use crate::domain::identity::CAPI_GROUP;
use crate::domain::object::RawObject;
use crate::format::ObjectRef;

/// clusterctl discovers a kind only when its CRD carries this label.
pub const CLUSTERCTL_LABEL: &str = "clusterctl.cluster.x-k8s.io";
/// On an object or a CRD: the object (every object of the kind) moves.
pub const MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";
/// On an object or a CRD: the object moves with everything it owns.
pub const MOVE_HIERARCHY_LABEL: &str = "clusterctl.cluster.x-k8s.io/move-hierarchy";

/// Kinds clusterctl treats as move hierarchies whatever their labels: (group, kind).
const HIERARCHY_KINDS: &[(&str, &str)] =
    &[(CAPI_GROUP, "Cluster"), (CAPI_GROUP, "ClusterClass"), ("addons.cluster.x-k8s.io", "ClusterResourceSet")];

/// A CustomResourceDefinition, as far as the move graph reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrdView {
    /// `plural.group`.
    pub name: String,
    pub group: String,
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
    /// The version clusterctl lists the kind at.
    pub storage_version: Option<String>,
    /// The keys of its labels.
    pub labels: BTreeSet<String>,
}

impl CrdView {
    /// `None` for an object that is not a CRD.
    pub fn from_raw(object: &RawObject<'_>) -> Option<Self> {
        #[derive(Deserialize)]
        struct Version {
            name: String,
            #[serde(default)]
            storage: bool,
        }
        let group = object.string_at("spec.group")?;
        let kind = object.string_at("spec.names.kind")?;
        let plural = object.string_at("spec.names.plural")?;
        let versions: Vec<Version> = serde_json::from_str(object.field("spec")?.get())
            .ok()
            .and_then(|spec: serde_json::Value| serde_json::from_value(spec.get("versions")?.clone()).ok())?;
        Some(CrdView {
            name: object.meta.name.to_string(),
            group,
            kind,
            plural,
            namespaced: object.string_at("spec.scope").as_deref() == Some("Namespaced"),
            storage_version: versions.into_iter().find(|v| v.storage).map(|v| v.name),
            labels: object.meta.labels.iter().flatten().map(|(k, _)| k.clone()).collect(),
        })
    }

    /// clusterctl lists this kind.
    pub fn discovered(&self) -> bool {
        self.labels.contains(CLUSTERCTL_LABEL)
    }

    fn hierarchy(&self) -> bool {
        let builtin = HIERARCHY_KINDS.iter().any(|(g, k)| *g == self.group && *k == self.kind);
        self.discovered() && (builtin || self.labels.contains(MOVE_HIERARCHY_LABEL))
    }

    fn force_move(&self) -> bool {
        self.hierarchy() || (self.discovered() && self.labels.contains(MOVE_LABEL))
    }
}

/// The name of the CRD of a kind, as clusterctl derives it (`lower(kind)s.group`).
pub fn crd_name(group: &str, kind: &str) -> String {
    format!("{}s.{group}", kind.to_lowercase())
}

/// One owner reference.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl OwnerRef {
    pub fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map_or("", |(group, _)| group)
    }
}

/// An object of the graph: one of the profile's, or an owner read to follow a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphObject {
    pub group: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
    /// The keys of its labels.
    pub labels: BTreeSet<String>,
    pub owners: Vec<OwnerRef>,
    /// An object of the profile that the move must carry.
    pub required: bool,
}

impl GraphObject {
    pub fn from_raw(group: &str, kind: &str, object: &RawObject<'_>, required: bool) -> Self {
        let owners = object.meta.owner_references.and_then(|raw| serde_json::from_str(raw.get()).ok());
        GraphObject {
            group: group.into(),
            kind: kind.into(),
            namespace: object.meta.namespace.as_deref().filter(|ns| !ns.is_empty()).map(str::to_string),
            name: object.meta.name.to_string(),
            uid: object.meta.uid.as_deref().unwrap_or_default().to_string(),
            labels: object.meta.labels.iter().flatten().map(|(k, _)| k.clone()).collect(),
            owners: owners.unwrap_or_default(),
            required,
        }
    }

    pub fn object_ref(&self) -> ObjectRef {
        ObjectRef { kind: self.kind.clone(), namespace: self.namespace.clone(), name: self.name.clone() }
    }

    /// `Kind ns/name`.
    fn title(&self) -> String {
        self.object_ref().to_string()
    }
}

/// What clusterctl does with each object (by its index in the objects given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fates {
    pub moved: Vec<bool>,
    /// Moved and then deleted on the source by clusterctl.
    pub deleted: Vec<bool>,
    /// Not moved, and deleted on the source by the garbage collector: the owner that takes
    /// it along (moved and deleted, or collected itself).
    pub collected: Vec<Option<usize>>,
}

/// The CRDs by (group, kind), and the objects' owner links by uid.
struct Graph<'a> {
    crds: HashMap<(&'a str, &'a str), &'a CrdView>,
    objects: &'a [GraphObject],
    by_uid: HashMap<&'a str, usize>,
}

impl<'a> Graph<'a> {
    fn new(crds: &'a [CrdView], objects: &'a [GraphObject]) -> Self {
        let crds = crds.iter().map(|c| ((c.group.as_str(), c.kind.as_str()), c)).collect();
        let by_uid = objects.iter().enumerate().map(|(i, o)| (o.uid.as_str(), i)).collect();
        Graph { crds, objects, by_uid }
    }

    fn crd(&self, i: usize) -> Option<&'a CrdView> {
        let o = &self.objects[i];
        self.crds.get(&(o.group.as_str(), o.kind.as_str())).copied()
    }

    /// clusterctl sees it (a node of its graph, not a virtual one).
    fn node(&self, i: usize) -> bool {
        self.crd(i).is_some_and(CrdView::discovered)
    }

    fn owners(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        self.objects[i].owners.iter().filter_map(|o| self.by_uid.get(o.uid.as_str()).copied())
    }

    fn hierarchy(&self, i: usize) -> bool {
        self.node(i)
            && (self.objects[i].labels.contains(MOVE_HIERARCHY_LABEL) || self.crd(i).is_some_and(|c| c.hierarchy()))
    }

    fn force_move(&self, i: usize) -> bool {
        self.node(i) && (self.objects[i].labels.contains(MOVE_LABEL) || self.crd(i).is_some_and(|c| c.force_move()))
    }

    fn global(&self, i: usize) -> bool {
        self.crd(i).is_some_and(|c| !c.namespaced)
    }

    /// The dependents of each object that clusterctl links (both nodes).
    fn dependents(&self) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new(); self.objects.len()];
        for i in (0..self.objects.len()).filter(|&i| self.node(i)) {
            for owner in self.owners(i).filter(|&o| self.node(o)) {
                out[owner].push(i);
            }
        }
        out
    }
}

/// clusterctl's verdict on every object.
pub fn fates(crds: &[CrdView], objects: &[GraphObject]) -> Fates {
    let graph = Graph::new(crds, objects);
    let n = objects.len();
    let dependents = graph.dependents();
    let (mut tenant, mut global_hierarchy) = (vec![false; n], vec![false; n]);
    for root in (0..n).filter(|&i| graph.hierarchy(i)) {
        let mut queue = VecDeque::from([root]);
        let mut seen = BTreeSet::from([root]);
        while let Some(i) = queue.pop_front() {
            tenant[i] = true;
            global_hierarchy[i] |= graph.global(root);
            queue.extend(dependents[i].iter().copied().filter(|&d| seen.insert(d)));
        }
    }
    let moved: Vec<bool> = (0..n).map(|i| graph.node(i) && (tenant[i] || graph.force_move(i))).collect();
    let deleted: Vec<bool> = (0..n).map(|i| moved[i] && !graph.global(i) && !global_hierarchy[i]).collect();
    // The garbage collector deletes an object once every owner it has is gone.
    let mut collected: Vec<Option<usize>> = vec![None; n];
    loop {
        let mut changed = false;
        for i in 0..n {
            if moved[i] || collected[i].is_some() {
                continue;
            }
            let owners: Vec<usize> = graph.owners(i).collect();
            let all_gone = owners.iter().all(|&o| deleted[o] || collected[o].is_some());
            if !owners.is_empty() && owners.len() == objects[i].owners.len() && all_gone {
                collected[i] = owners.first().copied();
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    Fates { moved, deleted, collected }
}

/// One reason a profile object (or a whole kind) will not be carried by the move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmoved {
    pub object: ObjectRef,
    pub reason: String,
}

/// What the move leaves behind, and the labels that make it carry everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MovePlan {
    pub unmoved: Vec<Unmoved>,
    /// `kubectl label …` commands, to be run on the source by a person; restatus never
    /// applies them.
    pub commands: Vec<String>,
}

impl MovePlan {
    pub fn complete(&self) -> bool {
        self.unmoved.is_empty()
    }
}

/// The labels to add: on CRDs (by name), and `move` on objects (by index).
#[derive(Debug, Default)]
struct Fix {
    crd_labels: BTreeMap<String, BTreeSet<&'static str>>,
    object_moves: BTreeSet<usize>,
}

/// The move plan of the `required` objects: why each that clusterctl would leave behind is
/// left (one reason per kind when the reason is the kind's, per object when it is lost to the
/// garbage collector), and the label commands that make the move carry them. `selector`
/// (restatus's `--selector`) scopes the commands that label objects.
pub fn plan(crds: &[CrdView], objects: &[GraphObject], selector: Option<&str>) -> MovePlan {
    let fates = fates(crds, objects);
    let graph = Graph::new(crds, objects);
    let left: Vec<usize> = (0..objects.len()).filter(|&i| objects[i].required && !fates.moved[i]).collect();
    if left.is_empty() {
        return MovePlan::default();
    }
    let fix = fix(&graph, &left, selector);
    let mut unmoved = Vec::new();
    let mut by_cause: BTreeMap<(String, String), (ObjectRef, usize)> = BTreeMap::new();
    for &i in &left {
        let cause = cause(&graph, i);
        match fates.collected[i] {
            Some(owner) => {
                let owner_goes = match fates.deleted[owner] {
                    true => {
                        format!("clusterctl moves its owner {} and deletes it on the source", objects[owner].title())
                    }
                    false => format!("its owner {} is deleted by the garbage collector too", objects[owner].title()),
                };
                let reason = format!(
                    "deleted on the source by the garbage collector: {owner_goes}; clusterctl does not move this object ({cause})"
                );
                unmoved.push(Unmoved { object: objects[i].object_ref(), reason });
            }
            None => {
                let kind = crd_ref(&graph, i);
                by_cause.entry((objects[i].kind.clone(), cause)).or_insert((kind, 0)).1 += 1;
            }
        }
    }
    for ((kind, cause), (object, count)) in by_cause {
        unmoved.push(Unmoved { object, reason: format!("{count} {kind} will not move: {cause}") });
    }
    MovePlan { unmoved, commands: commands(&graph, &fix, selector) }
}

/// The CRD of an object's kind, as the object a per-kind reason names.
fn crd_ref(graph: &Graph<'_>, i: usize) -> ObjectRef {
    let o = &graph.objects[i];
    let name = graph.crd(i).map_or_else(|| crd_name(&o.group, &o.kind), |c| c.name.clone());
    ObjectRef { kind: "CustomResourceDefinition".into(), namespace: None, name }
}

/// Why clusterctl does not move object `i`, naming the label that is missing.
fn cause(graph: &Graph<'_>, i: usize) -> String {
    let Some(crd) = graph.crd(i) else {
        return "its kind is not a CustomResourceDefinition: clusterctl moves no such kind".into();
    };
    if !crd.discovered() {
        return format!(
            "the CRD {} lacks the label {CLUSTERCTL_LABEL} (clusterctl builds its move graph only from CRDs that carry it)",
            crd.name
        );
    }
    match path_to_hierarchy(graph, i) {
        Some(path) => {
            let cut: BTreeSet<String> =
                path.iter().filter_map(|&p| graph.crd(p)).filter(|c| !c.discovered()).map(|c| c.name.clone()).collect();
            let names: Vec<String> = cut.into_iter().collect();
            format!(
                "its owner chain to {} is cut at the CRD {}, which lacks the label {CLUSTERCTL_LABEL}",
                graph.objects[*path.last().unwrap_or(&i)].title(),
                names.join(", ")
            )
        }
        None => format!(
            "it reaches no Cluster through owner references, and neither it nor its CRD {} carries {MOVE_LABEL}",
            crd.name
        ),
    }
}

/// The shortest owner chain from `i` to an object that would be a move hierarchy were every
/// CRD on the way discovered: `[i, owner, …, root]`.
fn path_to_hierarchy(graph: &Graph<'_>, i: usize) -> Option<Vec<usize>> {
    let would_be_root = |o: usize| {
        let labelled = graph.objects[o].labels.contains(MOVE_HIERARCHY_LABEL);
        let crd = graph.crd(o)?;
        let builtin = HIERARCHY_KINDS.iter().any(|(g, k)| *g == crd.group && *k == crd.kind);
        Some(labelled || builtin || crd.labels.contains(MOVE_HIERARCHY_LABEL))
    };
    let mut from: HashMap<usize, usize> = HashMap::new();
    let mut queue = VecDeque::from([i]);
    while let Some(o) = queue.pop_front() {
        if would_be_root(o) == Some(true) {
            let mut path = vec![o];
            while let Some(&prev) = from.get(path.last()?) {
                path.push(prev);
            }
            path.reverse();
            return Some(path);
        }
        for owner in graph.owners(o).filter(|&p| graph.crd(p).is_some()) {
            if owner != i && !from.contains_key(&owner) {
                from.insert(owner, o);
                queue.push_back(owner);
            }
        }
    }
    None
}

/// The labels that make clusterctl move every object of `left`: the discovery label on every
/// CRD of an owner chain to a Cluster, or, with no such chain, `move` on the objects.
fn fix(graph: &Graph<'_>, left: &[usize], selector: Option<&str>) -> Fix {
    let mut fix = Fix::default();
    let discover = |fix: &mut Fix, p: usize| {
        if let Some(crd) = graph.crd(p).filter(|c| !c.discovered()) {
            fix.crd_labels.entry(crd.name.clone()).or_default().insert(CLUSTERCTL_LABEL);
        }
    };
    let mut need_move: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for &i in left {
        discover(&mut fix, i);
        match path_to_hierarchy(graph, i) {
            Some(path) => path.into_iter().for_each(|p| discover(&mut fix, p)),
            None if !graph.objects[i].labels.contains(MOVE_LABEL) => {
                let o = &graph.objects[i];
                need_move.entry((o.group.clone(), o.kind.clone())).or_default().push(i);
            }
            None => {}
        }
    }
    for ((group, kind), objects) in need_move {
        let all = graph.objects.iter().filter(|o| o.required && o.group == group && o.kind == kind).count();
        let crd = graph.crds.get(&(group.as_str(), kind.as_str()));
        match crd {
            Some(crd) if selector.is_none() && objects.len() == all => {
                fix.crd_labels.entry(crd.name.clone()).or_default().insert(MOVE_LABEL);
            }
            _ => fix.object_moves.extend(objects),
        }
    }
    fix
}

/// The fix as `kubectl label` commands: one for the discovery label on CRDs, one for `move` on
/// CRDs, one per kind and namespace for `move` on objects (by `selector` when every selected
/// object of the kind there needs it, else by name).
fn commands(graph: &Graph<'_>, fix: &Fix, selector: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    for label in [CLUSTERCTL_LABEL, MOVE_LABEL] {
        let crds: Vec<&str> =
            fix.crd_labels.iter().filter(|(_, l)| l.contains(label)).map(|(name, _)| name.as_str()).collect();
        if !crds.is_empty() {
            out.push(format!("kubectl label crd {} {label}=", crds.join(" ")));
        }
    }
    let mut groups: BTreeMap<(String, Option<String>), Vec<usize>> = BTreeMap::new();
    for &i in &fix.object_moves {
        let o = &graph.objects[i];
        let resource = graph.crd(i).map_or_else(|| crd_name(&o.group, &o.kind), |c| c.name.clone());
        groups.entry((resource, o.namespace.clone())).or_default().push(i);
    }
    for ((resource, namespace), objects) in groups {
        let first = &graph.objects[objects[0]];
        let selected = graph
            .objects
            .iter()
            .filter(|o| o.required && o.group == first.group && o.kind == first.kind && o.namespace == namespace)
            .count();
        let ns = namespace.map(|ns| format!(" -n {ns}")).unwrap_or_default();
        let which = match selector {
            Some(selector) if objects.len() == selected => format!("-l {selector}"),
            _ => objects.iter().map(|&i| graph.objects[i].name.as_str()).collect::<Vec<_>>().join(" "),
        };
        out.push(format!("kubectl label {resource}{ns} {which} {MOVE_LABEL}="));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const METAL: &str = "metal.ironcore.dev";
    const INFRA: &str = "infrastructure.cluster.x-k8s.io";

    fn crd(group: &str, kind: &str, namespaced: bool, labels: &[&str]) -> CrdView {
        CrdView {
            name: crd_name(group, kind),
            group: group.into(),
            kind: kind.into(),
            plural: format!("{}s", kind.to_lowercase()),
            namespaced,
            storage_version: Some("v1".into()),
            labels: labels.iter().map(|l| l.to_string()).collect(),
        }
    }

    fn object(group: &str, kind: &str, ns: Option<&str>, name: &str, owners: &[&GraphObject]) -> GraphObject {
        GraphObject {
            group: group.into(),
            kind: kind.into(),
            namespace: ns.map(str::to_string),
            name: name.into(),
            uid: format!("uid-{kind}-{name}"),
            labels: BTreeSet::new(),
            owners: owners
                .iter()
                .map(|o| OwnerRef {
                    api_version: format!("{}/v1", o.group),
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                })
                .collect(),
            required: group == METAL,
        }
    }

    /// As `clusterctl init` and an upstream metal-operator install leave a cluster: the CAPI
    /// and infrastructure CRDs labelled, metal-operator's not.
    fn upstream_crds() -> Vec<CrdView> {
        vec![
            crd(CAPI_GROUP, "Cluster", true, &[CLUSTERCTL_LABEL]),
            crd(CAPI_GROUP, "Machine", true, &[CLUSTERCTL_LABEL]),
            crd(INFRA, "IroncoreMetalMachine", true, &[CLUSTERCTL_LABEL]),
            crd(METAL, "Server", false, &[]),
            crd(METAL, "BMC", false, &[]),
            crd(METAL, "ServerClaim", true, &[]),
            crd(METAL, "ServerBootConfiguration", true, &[]),
        ]
    }

    /// A Cluster with 2 Machines, each with its IroncoreMetalMachine controlling a bound claim
    /// (and the claim's boot configuration); an unbound claim; 2 BMCs with their Servers.
    fn fleet() -> Vec<GraphObject> {
        let ns = Some("capi");
        let cluster = object(CAPI_GROUP, "Cluster", ns, "c", &[]);
        let mut out = vec![cluster.clone()];
        for i in 0..2 {
            let machine = object(CAPI_GROUP, "Machine", ns, &format!("m{i}"), &[&cluster]);
            let imm = object(INFRA, "IroncoreMetalMachine", ns, &format!("m{i}"), &[&machine]);
            let claim = object(METAL, "ServerClaim", ns, &format!("m{i}"), &[&imm]);
            let boot = object(METAL, "ServerBootConfiguration", ns, &format!("m{i}"), &[&claim]);
            out.extend([machine, imm, claim, boot]);
        }
        out.push(object(METAL, "ServerClaim", ns, "waiting", &[]));
        for i in 0..2 {
            let bmc = object(METAL, "BMC", None, &format!("b{i}"), &[]);
            let server = object(METAL, "Server", None, &format!("b{i}-system-0"), &[&bmc]);
            out.extend([bmc, server]);
        }
        out
    }

    fn names(objects: &[GraphObject], pick: impl Fn(usize) -> bool) -> Vec<String> {
        (0..objects.len()).filter(|&i| pick(i)).map(|i| objects[i].title()).collect()
    }

    fn reasons(plan: &MovePlan) -> Vec<String> {
        plan.unmoved.iter().map(|u| format!("{}: {}", u.object, u.reason)).collect()
    }

    /// Runs `kubectl label` commands on the inputs, as the API server would; `selected` stands
    /// for a `-l` selector (the required objects).
    fn apply(commands: &[String], crds: &mut [CrdView], objects: &mut [GraphObject]) {
        for command in commands {
            let words: Vec<&str> = command.split_whitespace().collect();
            assert_eq!(words[..2], ["kubectl", "label"], "{command}");
            let label = words.last().unwrap().strip_suffix('=').unwrap();
            let targets = &words[2..words.len() - 1];
            if targets[0] == "crd" {
                for name in &targets[1..] {
                    let crd = crds.iter_mut().find(|c| c.name == *name).unwrap_or_else(|| panic!("{name}"));
                    assert!(crd.labels.insert(label.into()), "{command}: {name} had it already");
                }
                continue;
            }
            let (resource, mut rest) = (targets[0], &targets[1..]);
            let mut namespace = None;
            if rest.first() == Some(&"-n") {
                namespace = Some(rest[1].to_string());
                rest = &rest[2..];
            }
            let by_selector = rest.first() == Some(&"-l");
            for o in objects.iter_mut() {
                let hit = crd_name(&o.group, &o.kind) == resource
                    && o.namespace == namespace
                    && if by_selector { o.required } else { rest.contains(&o.name.as_str()) };
                if hit {
                    o.labels.insert(label.into());
                }
            }
        }
    }

    /// Issue 37: as installed upstream, clusterctl moves the CAPI objects and none of
    /// metal-operator's; the bound claims (and their boot configurations) are deleted on the
    /// source by the garbage collector when clusterctl deletes their IroncoreMetalMachines.
    #[test]
    fn upstream_crds_move_no_metal_object_and_lose_the_bound_claims() {
        let (crds, objects) = (upstream_crds(), fleet());
        let fates = fates(&crds, &objects);
        assert_eq!(
            names(&objects, |i| fates.moved[i]),
            [
                "Cluster capi/c",
                "Machine capi/m0",
                "IroncoreMetalMachine capi/m0",
                "Machine capi/m1",
                "IroncoreMetalMachine capi/m1"
            ]
        );
        assert_eq!(
            names(&objects, |i| fates.collected[i].is_some()),
            [
                "ServerClaim capi/m0",
                "ServerBootConfiguration capi/m0",
                "ServerClaim capi/m1",
                "ServerBootConfiguration capi/m1"
            ]
        );
        let plan = plan(&crds, &objects, None);
        assert_eq!(
            reasons(&plan),
            [
                "ServerClaim capi/m0: deleted on the source by the garbage collector: clusterctl moves its owner \
                 IroncoreMetalMachine capi/m0 and deletes it on the source; clusterctl does not move this object (the CRD \
                 serverclaims.metal.ironcore.dev lacks the label clusterctl.cluster.x-k8s.io (clusterctl builds its \
                 move graph only from CRDs that carry it))",
                "ServerBootConfiguration capi/m0: deleted on the source by the garbage collector: its owner \
                 ServerClaim capi/m0 is deleted by the garbage collector too; clusterctl does not move this object (the CRD \
                 serverbootconfigurations.metal.ironcore.dev lacks the label clusterctl.cluster.x-k8s.io (clusterctl \
                 builds its move graph only from CRDs that carry it))",
                "ServerClaim capi/m1: deleted on the source by the garbage collector: clusterctl moves its owner \
                 IroncoreMetalMachine capi/m1 and deletes it on the source; clusterctl does not move this object (the CRD \
                 serverclaims.metal.ironcore.dev lacks the label clusterctl.cluster.x-k8s.io (clusterctl builds its \
                 move graph only from CRDs that carry it))",
                "ServerBootConfiguration capi/m1: deleted on the source by the garbage collector: its owner \
                 ServerClaim capi/m1 is deleted by the garbage collector too; clusterctl does not move this object (the CRD \
                 serverbootconfigurations.metal.ironcore.dev lacks the label clusterctl.cluster.x-k8s.io (clusterctl \
                 builds its move graph only from CRDs that carry it))",
                "CustomResourceDefinition bmcs.metal.ironcore.dev: 2 BMC will not move: the CRD bmcs.metal.ironcore.dev \
                 lacks the label clusterctl.cluster.x-k8s.io (clusterctl builds its move graph only from CRDs that carry it)",
                "CustomResourceDefinition servers.metal.ironcore.dev: 2 Server will not move: the CRD \
                 servers.metal.ironcore.dev lacks the label clusterctl.cluster.x-k8s.io (clusterctl builds its move \
                 graph only from CRDs that carry it)",
                "CustomResourceDefinition serverclaims.metal.ironcore.dev: 1 ServerClaim will not move: the CRD \
                 serverclaims.metal.ironcore.dev lacks the label clusterctl.cluster.x-k8s.io (clusterctl builds its \
                 move graph only from CRDs that carry it)",
            ]
        );
        assert_eq!(
            plan.commands,
            [
                "kubectl label crd bmcs.metal.ironcore.dev serverbootconfigurations.metal.ironcore.dev \
                 serverclaims.metal.ironcore.dev servers.metal.ironcore.dev clusterctl.cluster.x-k8s.io=",
                "kubectl label crd bmcs.metal.ironcore.dev servers.metal.ironcore.dev clusterctl.cluster.x-k8s.io/move=",
                "kubectl label serverclaims.metal.ironcore.dev -n capi waiting clusterctl.cluster.x-k8s.io/move=",
            ]
        );
    }

    /// The commands restatus prints are the whole fix: run, every object of the profile moves,
    /// the Servers and BMCs are not deleted on the source (cluster-scoped), and nothing is left
    /// for the garbage collector.
    #[test]
    fn after_the_printed_commands_everything_moves() {
        for selector in [None, Some("fleet=a")] {
            let (mut crds, mut objects) = (upstream_crds(), fleet());
            let commands = plan(&crds, &objects, selector).commands;
            apply(&commands, &mut crds, &mut objects);
            let fates = fates(&crds, &objects);
            assert!(fates.moved.iter().all(|&m| m), "{selector:?}: {:?}", names(&objects, |i| !fates.moved[i]));
            assert!(fates.collected.iter().all(Option::is_none));
            assert_eq!(
                names(&objects, |i| fates.moved[i] && !fates.deleted[i]),
                ["BMC b0", "Server b0-system-0", "BMC b1", "Server b1-system-0"],
                "clusterctl copies cluster-scoped objects and leaves them on the source"
            );
            assert!(plan(&crds, &objects, selector).complete(), "{selector:?}");
        }
    }

    /// With restatus's `--selector`, the objects of a kind with no owner chain are labelled by
    /// that selector (the profile's objects, none other), not by a label on their CRD, which
    /// would move every object of the kind in the cluster.
    #[test]
    fn a_selector_labels_the_selected_objects_not_the_crd() {
        let plan = plan(&upstream_crds(), &fleet(), Some("restatus.ironcore.dev/fleet=a"));
        assert_eq!(
            plan.commands[1..],
            [
                "kubectl label bmcs.metal.ironcore.dev -l restatus.ironcore.dev/fleet=a clusterctl.cluster.x-k8s.io/move=",
                "kubectl label serverclaims.metal.ironcore.dev -n capi waiting clusterctl.cluster.x-k8s.io/move=",
                "kubectl label servers.metal.ironcore.dev -l restatus.ironcore.dev/fleet=a clusterctl.cluster.x-k8s.io/move=",
            ],
            "the unbound claim alone, by name: the bound ones move with their Cluster"
        );
    }

    /// A label on the objects alone does not move them: clusterctl never lists a kind whose CRD
    /// lacks the discovery label. With it, the object's own `move` label suffices.
    #[test]
    fn an_object_move_label_needs_the_discovery_label_on_its_crd() {
        let mut objects = fleet();
        objects.iter_mut().filter(|o| o.kind == "Server" || o.kind == "BMC").for_each(|o| {
            o.labels.insert(MOVE_LABEL.into());
        });
        let mut crds = upstream_crds();
        assert!(fates(&crds, &objects).moved.iter().zip(&objects).all(|(&m, o)| !m || o.group != METAL));
        let plan = plan(&crds, &objects, None);
        assert!(plan.commands[0].contains("bmcs.metal.ironcore.dev") && plan.commands[0].contains("servers.metal"));
        assert!(
            !plan.commands.iter().any(|c| c.contains("servers.metal.ironcore.dev clusterctl.cluster.x-k8s.io/move"))
        );
        crds.iter_mut().filter(|c| c.kind == "Server" || c.kind == "BMC").for_each(|c| {
            c.labels.insert(CLUSTERCTL_LABEL.into());
        });
        let fates = fates(&crds, &objects);
        assert_eq!(names(&objects, |i| fates.moved[i] && objects[i].group == METAL).len(), 4);
    }

    /// The claims' owner chain is cut at an infrastructure CRD without the discovery label:
    /// the IroncoreMetalMachines are collected when their Machines are deleted, and the claims
    /// with them; the reason names that CRD, and the fix labels it too.
    #[test]
    fn an_owner_chain_cut_at_an_unlabelled_owner_kind_names_that_crd() {
        let mut crds = upstream_crds();
        for c in crds.iter_mut() {
            if c.group == METAL {
                c.labels.insert(CLUSTERCTL_LABEL.into());
            }
            if c.kind == "IroncoreMetalMachine" {
                c.labels.clear();
            }
        }
        let objects = fleet();
        let fates = fates(&crds, &objects);
        assert_eq!(
            names(&objects, |i| fates.collected[i].is_some()),
            [
                "IroncoreMetalMachine capi/m0",
                "ServerClaim capi/m0",
                "ServerBootConfiguration capi/m0",
                "IroncoreMetalMachine capi/m1",
                "ServerClaim capi/m1",
                "ServerBootConfiguration capi/m1"
            ],
            "the IroncoreMetalMachines go with their Machines, and what they own with them"
        );
        let plan = plan(&crds, &objects, Some("fleet=a"));
        assert_eq!(
            plan.unmoved[0].reason,
            "deleted on the source by the garbage collector: its owner IroncoreMetalMachine capi/m0 is deleted by the \
             garbage collector too; clusterctl does not move this object (its owner chain to Cluster capi/c is cut at the CRD \
             ironcoremetalmachines.infrastructure.cluster.x-k8s.io, which lacks the label clusterctl.cluster.x-k8s.io)"
        );
        assert_eq!(
            plan.commands[0],
            "kubectl label crd ironcoremetalmachines.infrastructure.cluster.x-k8s.io clusterctl.cluster.x-k8s.io="
        );
    }

    /// `move-hierarchy` on the BMC CRD carries each BMC's Server (its dependent) along, and
    /// clusterctl deletes neither on the source (a cluster-scoped hierarchy).
    #[test]
    fn a_move_hierarchy_crd_carries_the_dependents_without_deleting_them() {
        let mut crds = upstream_crds();
        for c in crds.iter_mut().filter(|c| c.kind == "BMC" || c.kind == "Server") {
            c.labels.insert(CLUSTERCTL_LABEL.into());
        }
        crds.iter_mut().find(|c| c.kind == "BMC").unwrap().labels.insert(MOVE_HIERARCHY_LABEL.into());
        let objects = fleet();
        let fates = fates(&crds, &objects);
        let moved = names(&objects, |i| fates.moved[i] && !fates.deleted[i]);
        assert_eq!(moved, ["BMC b0", "Server b0-system-0", "BMC b1", "Server b1-system-0"]);
        assert!(plan(&crds, &objects, None).unmoved.iter().all(|u| !u.reason.contains("Server will not")));
    }

    /// A `move` label (not hierarchy) carries the object alone: a Server whose BMC is force
    /// moved stays unless it is labelled too.
    #[test]
    fn a_force_move_carries_no_dependents() {
        let mut crds = upstream_crds();
        for c in crds.iter_mut().filter(|c| c.kind == "BMC" || c.kind == "Server") {
            c.labels.insert(CLUSTERCTL_LABEL.into());
        }
        crds.iter_mut().find(|c| c.kind == "BMC").unwrap().labels.insert(MOVE_LABEL.into());
        let objects = fleet();
        let plan = plan(&crds, &objects, None);
        assert!(
            reasons(&plan).contains(
                &"CustomResourceDefinition servers.metal.ironcore.dev: 2 Server will not move: it reaches no Cluster \
              through owner references, and neither it nor its CRD servers.metal.ironcore.dev carries \
              clusterctl.cluster.x-k8s.io/move"
                    .to_string()
            )
        );
    }

    /// Objects that are not required (a kind the profile marks as not moving, owners read to
    /// follow a chain) never block; an object with an owner restatus could not see is not
    /// counted as collected.
    #[test]
    fn only_required_objects_block_and_unknown_owners_keep_an_object() {
        let crds = upstream_crds();
        let mut objects = fleet();
        objects.iter_mut().filter(|o| o.kind == "ServerBootConfiguration").for_each(|o| o.required = false);
        assert!(!plan(&crds, &objects, None).unmoved.iter().any(|u| u.reason.contains("ServerBootConfiguration")));
        let claim = objects.iter_mut().find(|o| o.name == "m0" && o.kind == "ServerClaim").unwrap();
        claim.owners.push(OwnerRef {
            api_version: "v1".into(),
            kind: "Other".into(),
            name: "x".into(),
            uid: "unseen".into(),
        });
        let fates = fates(&crds, &objects);
        let i = objects.iter().position(|o| o.name == "m0" && o.kind == "ServerClaim").unwrap();
        assert_eq!(fates.collected[i], None, "an owner restatus did not see may keep it");
    }

    #[test]
    fn crd_and_object_views_read_what_the_graph_needs() {
        let crd = r#"{"metadata":{"name":"servers.metal.ironcore.dev","labels":{"clusterctl.cluster.x-k8s.io":""}},
            "spec":{"group":"metal.ironcore.dev","names":{"kind":"Server","plural":"servers"},"scope":"Cluster",
                    "versions":[{"name":"v1alpha0","storage":false},{"name":"v1alpha1","storage":true}]}}"#;
        let view = CrdView::from_raw(&RawObject::parse(crd).unwrap()).unwrap();
        assert_eq!(
            (view.namespaced, view.storage_version.as_deref(), view.discovered()),
            (false, Some("v1alpha1"), true)
        );
        assert_eq!(view.name, crd_name("metal.ironcore.dev", "Server"));
        let claim = r#"{"metadata":{"name":"c","namespace":"n","uid":"u","labels":{"clusterctl.cluster.x-k8s.io/move":""},
            "ownerReferences":[{"apiVersion":"infrastructure.cluster.x-k8s.io/v1alpha1","kind":"IroncoreMetalMachine",
                                "name":"m","uid":"um","controller":true}]}}"#;
        let object = GraphObject::from_raw(METAL, "ServerClaim", &RawObject::parse(claim).unwrap(), true);
        assert_eq!(object.owners[0].group(), INFRA);
        assert!(object.labels.contains(MOVE_LABEL) && object.namespace.as_deref() == Some("n"));
        assert!(CrdView::from_raw(&RawObject::parse(r#"{"metadata":{"name":"x"}}"#).unwrap()).is_none());
    }
}
