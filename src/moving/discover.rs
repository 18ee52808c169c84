//! The move graph's reads (Kubernetes edge): the profile's objects, their owners kind by kind
//! as far as the owner chains go, and the CRDs of those kinds (each read by name). What
//! clusterctl will make of them is decided in [`super::graph`].

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::domain::identity::{KindProfile, Profile};
use crate::domain::object::RawObject;
use crate::k8s::{DEFAULT_PAGE_SIZE, PageRequest, get_object, list_objects};
use crate::moving::graph::{CrdView, GraphObject, crd_name};
use crate::{Error, Result};

/// Owner chains are followed this many owners up, at most (Cluster API's longest is
/// Machine → MachineSet → MachineDeployment → Cluster).
const MAX_DEPTH: usize = 8;

/// What [`super::graph::plan`] decides on.
#[derive(Debug, Default)]
pub struct MoveInputs {
    pub crds: Vec<CrdView>,
    pub objects: Vec<GraphObject>,
}

/// The API server's CustomResourceDefinitions kind.
pub fn crd_kind() -> KindProfile {
    KindProfile {
        group: "apiextensions.k8s.io".into(),
        version: "v1".into(),
        kind: "CustomResourceDefinition".into(),
        plural: "customresourcedefinitions".into(),
        namespaced: false,
        keys: vec![],
        initial_states: None,
        transitional_states: None,
        moves: false,
    }
}

/// Reads the profile's objects (by `selector`; namespaced kinds in `namespace`, the one
/// `clusterctl move -n` moves, or all), their owners, and the CRDs of both.
pub async fn read_move_inputs(
    client: &kube::Client,
    profile: &Profile,
    selector: Option<&str>,
    namespace: Option<&str>,
) -> Result<MoveInputs> {
    let mut crds = Crds::default();
    let mut objects = Vec::new();
    let mut uids = HashSet::new();
    for kind in profile.kinds.iter().filter(|k| !k.is_denied()) {
        if !kind.group.is_empty() {
            crds.get(client, &format!("{}.{}", kind.plural, kind.group)).await?;
        }
        let page = PageRequest { size: DEFAULT_PAGE_SIZE, selector, namespace: namespace.filter(|_| kind.namespaced) };
        list_objects(client, kind, &page, |o| {
            let object = GraphObject::from_raw(&kind.group, &kind.kind, o, kind.moves);
            if uids.insert(object.uid.clone()) {
                objects.push(object);
            }
            Ok(())
        })
        .await?;
    }
    read_owners(client, &mut crds, &mut objects, &mut uids).await?;
    Ok(MoveInputs { crds: crds.0.into_values().flatten().collect(), objects })
}

/// Lists, round by round, every kind that owns an object read and is not read yet (in the
/// owned object's namespace when it is namespaced), until no owner is missing. An owner of a
/// kind without a CRD (a core kind) or of a credential kind is not read: it ends the chain,
/// as it does for clusterctl.
async fn read_owners(
    client: &kube::Client,
    crds: &mut Crds,
    objects: &mut Vec<GraphObject>,
    uids: &mut HashSet<String>,
) -> Result<()> {
    // What was asked for (the owned object's namespace), and what was listed (namespaced
    // kinds in a namespace, cluster-scoped ones whole).
    let mut listed: HashSet<(String, String, Option<String>)> = HashSet::new();
    let mut read: HashSet<(String, String, Option<String>)> = HashSet::new();
    for _ in 0..MAX_DEPTH {
        let wanted: BTreeSet<(String, String, Option<String>)> = objects
            .iter()
            .flat_map(|o| {
                o.owners
                    .iter()
                    .filter(|r| !uids.contains(&r.uid))
                    .map(|r| (r.group().to_string(), r.kind.clone(), o.namespace.clone()))
            })
            .filter(|key| !listed.contains(key) && !key.0.is_empty())
            .collect();
        if wanted.is_empty() {
            break;
        }
        for (group, kind, namespace) in wanted {
            listed.insert((group.clone(), kind.clone(), namespace.clone()));
            let Some(crd) = crds.get(client, &crd_name(&group, &kind)).await? else { continue };
            let Some(version) = crd.storage_version.clone() else { continue };
            let owner_kind = KindProfile {
                group,
                version,
                kind,
                plural: crd.plural.clone(),
                namespaced: crd.namespaced,
                ..crd_kind()
            };
            let namespace = namespace.filter(|_| crd.namespaced);
            let key = (owner_kind.group.clone(), owner_kind.kind.clone(), namespace.clone());
            if owner_kind.is_denied() || !read.insert(key) {
                continue;
            }
            let page = PageRequest { size: DEFAULT_PAGE_SIZE, selector: None, namespace: namespace.as_deref() };
            list_objects(client, &owner_kind, &page, |o| {
                let object = GraphObject::from_raw(&owner_kind.group, &owner_kind.kind, o, false);
                if uids.insert(object.uid.clone()) {
                    objects.push(object);
                }
                Ok(())
            })
            .await?;
        }
    }
    Ok(())
}

/// The CRDs read so far, by name (`None`: there is none of that name).
#[derive(Default)]
struct Crds(BTreeMap<String, Option<CrdView>>);

impl Crds {
    async fn get(&mut self, client: &kube::Client, name: &str) -> Result<Option<CrdView>> {
        if let Some(known) = self.0.get(name) {
            return Ok(known.clone());
        }
        let view = match get_object(client, &crd_kind(), None, name).await {
            Ok(text) => {
                let object = RawObject::parse(&text).map_err(|e| Error::InvalidObject {
                    kind: "CustomResourceDefinition".into(),
                    name: name.into(),
                    reason: e.to_string(),
                })?;
                CrdView::from_raw(&object)
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => None,
            Err(e) => return Err(Error::kube(format!("get CustomResourceDefinition {name}"), e)),
        };
        self.0.insert(name.into(), view.clone());
        Ok(view)
    }
}
