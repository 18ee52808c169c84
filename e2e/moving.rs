//! The real thing: `clusterctl move` (cluster-api v1.13) of a CAPI Cluster with Machines and
//! a metal-operator fleet, then restatus restores the status the move dropped.
//!
//! Fixture, as the ironcore-metal provider and metal-operator build it: Cluster owns
//! IroncoreMetalCluster and Machines, Machine owns IroncoreMetalMachine, which controls the
//! ServerClaim of the same name; BMC controls its Server. The CRDs start as their installs leave
//! them: Cluster API's and the infrastructure provider's labelled `clusterctl.cluster.x-k8s.io`
//! (as `clusterctl init` does), metal-operator's not; each fixture then runs the `kubectl label`
//! commands `restatus preflight --label-commands` prints (issue 37). With restatus's
//! `--selector` these label the fleet's BMCs and Servers `clusterctl.cluster.x-k8s.io/move` per
//! object (a label on their CRDs would move every fleet on the shared test bed). No controller
//! runs, so the statuses clusterctl's preflight checks are set by the test.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use restatus::domain::annotations::{OPERATION_ANNOTATION, QUIESCED_BY_ANNOTATION, RESTORED_FROM_ANNOTATION};
use restatus::fleet::{FLEET_LABEL, FleetSpec};
use serde_json::{Value, json};

use crate::bed::{
    Bed, InjectedPolicy, MOVES, QUIESCE_PATCH, TARGET, assert_success, fleet_state, foreign_patches, merge_patch,
    stdout, unique,
};

pub(crate) const MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";
pub(crate) const BLOCK_MOVE: &str = restatus::domain::annotations::BLOCK_MOVE_ANNOTATION;

pub(crate) fn api(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
    plural: &str,
    ns: Option<&str>,
) -> Api<DynamicObject> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// Creates an object, sets its status if given, and returns its uid.
pub(crate) async fn create(client: &kube::Client, plural: &str, object: Value, status: Option<Value>) -> String {
    let ns = object["metadata"]["namespace"].as_str().map(str::to_string);
    let api =
        api(client, object["apiVersion"].as_str().unwrap(), object["kind"].as_str().unwrap(), plural, ns.as_deref());
    let name = object["metadata"]["name"].as_str().unwrap().to_string();
    let created = api.create(&PostParams::default(), &serde_json::from_value(object).unwrap()).await.unwrap();
    if let Some(status) = status {
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({ "status": status }))).await.unwrap();
    }
    created.metadata.uid.unwrap()
}

pub(crate) fn owner(api_version: &str, kind: &str, name: &str, uid: &str, controller: bool) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": controller, "blockOwnerDeletion": controller}])
}

pub(crate) fn condition(kind: &str) -> Value {
    json!({"type": kind, "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-11-01T00:00:00Z"})
}

/// The labels on metal-operator's CRDs are the shared bed's: a fixture that needs them as an
/// upstream install leaves them (unlabelled) holds this for writing, every other fixture holds
/// it for reading while it lives (taken after `MOVES`, by those that hold that too).
static CRD_LABELS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

enum LabelGuard {
    Shared(#[allow(dead_code)] tokio::sync::RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code)] tokio::sync::RwLockWriteGuard<'static, ()>),
}

struct Fixture {
    bed: Bed,
    ns: String,
    fleet: FleetSpec,
    storage: String,
    _labels: LabelGuard,
}

impl Fixture {
    /// ~250 objects: Cluster, IroncoreMetalCluster, `machines` Machines with their
    /// IroncoreMetalMachines and Bound ServerClaims, `servers` Servers and BMCs (Reserved,
    /// Available, Maintenance), and Unbound ServerClaims.
    async fn new(servers: usize, machines: usize, unbound: usize) -> Fixture {
        let fx = Fixture::made(servers, machines, unbound, false).await;
        fx.label_as_preflight_says();
        fx
    }

    /// The fixture, with metal-operator's CRDs unlabelled (any label an earlier test put on
    /// them removed: only under `MOVES`, and a test that moves nothing may meet them so) and no
    /// label restatus asks for.
    async fn unlabelled(servers: usize, machines: usize, unbound: usize) -> Fixture {
        Fixture::made(servers, machines, unbound, true).await
    }

    async fn made(servers: usize, machines: usize, unbound: usize, unlabel: bool) -> Fixture {
        let labels = match unlabel {
            true => LabelGuard::Alone(CRD_LABELS.write().await),
            false => LabelGuard::Shared(CRD_LABELS.read().await),
        };
        let bed = Bed::get();
        prepare_upstream_clusters(&bed, unlabel);
        let ns = unique("capi");
        let fleet =
            FleetSpec { namespaces: vec![ns.clone()], ..FleetSpec::new(&unique("mv"), servers, servers, machines) };
        let source = bed.source().await;
        let fleet_labels = |extra: Option<&str>| {
            let mut labels = json!({ FLEET_LABEL: fleet.name });
            if let Some(label) = extra {
                labels[label] = json!("");
            }
            labels
        };
        Command::new(&bed.kubectl)
            .arg("--kubeconfig")
            .arg(&bed.source_kubeconfig)
            .args(["create", "namespace", &ns])
            .output()
            .unwrap();

        let cluster = "workload";
        let capi = "cluster.x-k8s.io/v1beta2";
        let infra = "infrastructure.cluster.x-k8s.io/v1alpha1";
        let cluster_status = json!({
            "initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true},
            "phase": "Provisioned",
            "conditions": [condition("ControlPlaneInitialized"), condition("InfrastructureReady")],
        });
        let cluster_uid = create(&source, "clusters", json!({
            "apiVersion": capi, "kind": "Cluster", "metadata": {"name": cluster, "namespace": ns},
            "spec": {"controlPlaneEndpoint": {"host": "10.0.0.10", "port": 6443},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "IroncoreMetalCluster", "name": cluster}},
        }), Some(cluster_status)).await;
        create(&source, "ironcoremetalclusters", json!({
            "apiVersion": infra, "kind": "IroncoreMetalCluster",
            "metadata": {"name": cluster, "namespace": ns, "ownerReferences": owner(capi, "Cluster", cluster, &cluster_uid, false)},
            "spec": {"controlPlaneEndpoint": {"host": "10.0.0.10", "port": 6443}},
        }), Some(json!({"ready": true}))).await;

        for i in 0..servers {
            let (mut bmc, bmc_status) = fleet.bmc(i);
            bmc["metadata"]["labels"] = fleet_labels(None);
            let bmc_uid = create(&source, "bmcs", bmc, Some(bmc_status)).await;
            let (mut server, mut status) = fleet.server(i);
            server["metadata"]["labels"] = fleet_labels(None);
            server["metadata"]["ownerReferences"] =
                owner("metal.ironcore.dev/v1alpha1", "BMC", &fleet.bmc_name(i), &bmc_uid, true);
            if i >= machines && i % 5 == 4 {
                status["state"] = json!("Maintenance");
            }
            create(&source, "servers", server, Some(status)).await;
        }
        for i in 0..machines {
            let (_, machine) = fleet.claim_ref(i);
            let machine_uid = create(&source, "machines", json!({
                "apiVersion": capi, "kind": "Machine",
                "metadata": {"name": machine, "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": cluster},
                             "ownerReferences": owner(capi, "Cluster", cluster, &cluster_uid, false)},
                "spec": {"clusterName": cluster, "bootstrap": {"dataSecretName": format!("{machine}-bootstrap")},
                         "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "IroncoreMetalMachine", "name": machine}},
            }), Some(json!({"nodeRef": {"name": format!("node-{i}")}, "phase": "Running"}))).await;
            let imm_uid = create(
                &source,
                "ironcoremetalmachines",
                json!({
                    "apiVersion": infra, "kind": "IroncoreMetalMachine",
                    "metadata": {"name": machine, "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": cluster},
                                 "ownerReferences": owner(capi, "Machine", &machine, &machine_uid, true)},
                    "spec": {"image": "ghcr.io/ironcore-dev/os-images/gardenlinux:1877.0"},
                }),
                Some(json!({"ready": true})),
            )
            .await;
            let (mut claim, claim_status) = fleet.claim(i);
            claim["metadata"]["labels"] = fleet_labels(None);
            claim["metadata"]["ownerReferences"] = owner(infra, "IroncoreMetalMachine", &machine, &imm_uid, true);
            create(&source, "serverclaims", claim, Some(claim_status)).await;
        }
        for i in 0..unbound {
            create(&source, "serverclaims", json!({
                "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim",
                "metadata": {"name": format!("{}-waiting-{i}", fleet.name), "namespace": ns, "labels": fleet_labels(None)},
                "spec": {"power": "Off", "image": "ghcr.io/ironcore-dev/os-images/gardenlinux:1877.0"},
            }), Some(json!({"phase": "Unbound"}))).await;
        }
        let storage = bed.storage(&fleet.name);
        Fixture { bed, ns, fleet, storage, _labels: labels }
    }

    /// `restatus preflight --label-commands` on the source: the commands it prints.
    fn preflight_label_commands(&self) -> Vec<String> {
        let args = ["preflight", "--label-commands", "--selector", &self.selector(), "--cluster-namespace", &self.ns];
        let out = self.bed.restatus(&self.storage, &self.fleet.name, &args);
        assert!(out.status.code().is_some_and(|c| c <= 1), "preflight --label-commands: {out:?}");
        stdout(&out).lines().map(str::to_string).filter(|l| !l.is_empty()).collect()
    }

    /// Runs, on the source, the `kubectl label` commands restatus prints, as a user would. A
    /// label another fixture put on a shared CRD in between is there already: that is fine.
    fn label_as_preflight_says(&self) -> Vec<String> {
        let commands = self.preflight_label_commands();
        self.run_label_commands(&commands);
        commands
    }

    /// Runs `kubectl label` commands restatus printed on the source, as a user would.
    fn run_label_commands(&self, commands: &[String]) {
        for command in commands {
            let words: Vec<&str> = command.split_whitespace().collect();
            assert_eq!(words[0], "kubectl", "{command}");
            let out = self.bed.kubectl(&self.bed.source_kubeconfig, &words[1..]);
            let text = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() || text.contains("already has a value"), "{command}: {text}");
        }
    }

    fn selector(&self) -> String {
        format!("{FLEET_LABEL}={}", self.fleet.name)
    }

    /// The source-role controller guarding the fixture's namespace.
    fn handshake(&self) -> std::process::Child {
        self.handshake_as(&self.bed.source_kubeconfig, "default")
    }

    /// The same, with the credentials of `kubeconfig` and its Lease in `lease_namespace`.
    fn handshake_as(&self, kubeconfig: &std::path::Path, lease_namespace: &str) -> std::process::Child {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        Command::new(env!("CARGO_BIN_EXE_restatus"))
            .args(["controller", "--role", "source", "--selector", &self.selector(), "--cluster-namespace", &self.ns])
            .args(["--interval", "1s", "--lease-namespace", lease_namespace, "--lease-name", &unique("src-lease")])
            .args(["--http-addr", &format!("127.0.0.1:{port}"), "--kubeconfig"])
            .arg(kubeconfig)
            .env("RESTATUS_STORAGE", &self.storage)
            .env("RESTATUS_CLUSTER_ID", &self.fleet.name)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    }

    /// An admission policy on the source that refuses restatus's `ignore` on the Server
    /// `server` (any update that leaves it unquiesced): its quiesce fails until it is removed.
    async fn refuse_quiesce_of(&self, server: &str, tag: &str) -> InjectedPolicy {
        let name = format!("{}-{tag}", self.fleet.name);
        let the_server = format!("object.metadata.name == '{server}'");
        let unquiesced = format!(
            "!has(object.metadata.annotations) || !('{QUIESCED_BY_ANNOTATION}' in object.metadata.annotations)"
        );
        let kubeconfig = &self.bed.source_kubeconfig;
        InjectedPolicy::deny_updates(&self.bed, kubeconfig, &name, "[servers]", &the_server, &unquiesced).await
    }

    /// A source-role replica of a pair sharing `lease`: its process, its metrics URL and its log.
    fn replica(&self, lease: &str) -> (Reaped, String, std::path::PathBuf) {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = self.bed.scratch.path().join(format!("source-{port}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_restatus"))
            .args(["controller", "--role", "source", "--selector", &self.selector(), "--cluster-namespace", &self.ns])
            .args(["--interval", "1s", "--lease-namespace", "default", "--lease-name", lease])
            .args(["--http-addr", &format!("127.0.0.1:{port}"), "--kubeconfig"])
            .arg(&self.bed.source_kubeconfig)
            .env("RESTATUS_STORAGE", &self.storage)
            .env("RESTATUS_CLUSTER_ID", &self.fleet.name)
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        (Reaped(child), format!("http://127.0.0.1:{port}/metrics"), log)
    }

    /// `restatus restore` of the fleet on the target; the JSON report.
    fn restore(&self) -> Value {
        let args = ["restore", "--selector", &self.selector(), "-o", "json"];
        let out = self.bed.restatus_with(&self.bed.target_kubeconfig, &self.storage, &self.fleet.name, &args, &[]);
        assert_success(&out, "restore");
        serde_json::from_str(&stdout(&out)).expect("restore -o json")
    }

    fn backup(&self) -> String {
        let out = self.bed.restatus(&self.storage, &self.fleet.name, &["backup", "--selector", &self.selector()]);
        assert_success(&out, "backup");
        stdout(&out).trim().to_string()
    }

    /// The real `clusterctl move` of the fixture's namespace, ready to run.
    fn clusterctl_move_command(&self) -> Command {
        let bin = std::env::var("RESTATUS_BIN").expect("RESTATUS_BIN: the test bed's bin folder");
        let mut cmd = Command::new(std::path::Path::new(&bin).join("clusterctl"));
        cmd.args(["move", "-n", &self.ns, "--kubeconfig"])
            .arg(&self.bed.source_kubeconfig)
            .arg("--to-kubeconfig")
            .arg(&self.bed.target_kubeconfig)
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .env("XDG_CONFIG_HOME", self.bed.scratch.path().join("clusterctl-config"));
        cmd
    }

    fn clusterctl_move(&self) -> Duration {
        let started = Instant::now();
        assert_success(&self.clusterctl_move_command().output().unwrap(), "clusterctl move");
        started.elapsed()
    }
}

/// The CRDs of this test bed `clusterctl init` labels (the core and infrastructure providers').
const CLUSTERCTL_CRDS: &[&str] = &[
    "clusters.cluster.x-k8s.io",
    "machines.cluster.x-k8s.io",
    "clusterclasses.cluster.x-k8s.io",
    "ironcoremetalclusters.infrastructure.cluster.x-k8s.io",
    "ironcoremetalmachines.infrastructure.cluster.x-k8s.io",
    "ironcoremetalmachinetemplates.infrastructure.cluster.x-k8s.io",
];

/// metal-operator's CRDs the fixtures use: installed by its chart or kustomize, unlabelled.
const METAL_CRDS: &[&str] = &[
    "servers.metal.ironcore.dev",
    "bmcs.metal.ironcore.dev",
    "serverclaims.metal.ironcore.dev",
    "serverbootconfigurations.metal.ironcore.dev",
    "endpoints.metal.ironcore.dev",
    "bmcsecrets.metal.ironcore.dev",
];

/// Both clusters as `clusterctl init` leaves them (the providers' CRDs labelled, their
/// inventory) and, with `unlabel`, metal-operator's CRDs as its install leaves them: without
/// clusterctl's labels (any an earlier test put on them removed).
pub(crate) fn prepare_upstream_clusters(bed: &Bed, unlabel: bool) {
    prepare_providers(bed);
    for kubeconfig in [&bed.source_kubeconfig, &bed.target_kubeconfig].into_iter().filter(|_| unlabel) {
        let mut args = vec!["label", "crd"];
        args.extend(METAL_CRDS);
        args.extend(["clusterctl.cluster.x-k8s.io-", "clusterctl.cluster.x-k8s.io/move-"]);
        let out = bed.kubectl(kubeconfig, &args);
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() || text.contains("not found"), "unlabel metal-operator CRDs: {text}");
    }
}

/// CRD labels and Provider inventory on both clusters, as `clusterctl init` would leave them,
/// and metal-operator's CRDs labelled by hand (e2e/operator.rs; the moving tests start from
/// [`prepare_upstream_clusters`] and label what restatus asks for).
pub(crate) fn prepare_clusters(bed: &Bed) {
    prepare_providers(bed);
    for kubeconfig in [&bed.source_kubeconfig, &bed.target_kubeconfig] {
        let mut args = vec!["label", "--overwrite", "crd"];
        args.extend(CLUSTERCTL_CRDS.iter().chain(METAL_CRDS));
        args.push("clusterctl.cluster.x-k8s.io=");
        assert_success(&bed.kubectl(kubeconfig, &args), "label CRDs");
    }
}

/// The providers' CRDs labelled and their inventory, on both clusters, as `clusterctl init`
/// leaves them.
fn prepare_providers(bed: &Bed) {
    for kubeconfig in [&bed.source_kubeconfig, &bed.target_kubeconfig] {
        let mut args = vec!["label", "--overwrite", "crd"];
        args.extend(CLUSTERCTL_CRDS);
        args.push("clusterctl.cluster.x-k8s.io=");
        assert_success(&bed.kubectl(kubeconfig, &args), "label CRDs as clusterctl init does");
        let providers = r#"
apiVersion: v1
kind: Namespace
metadata: {name: capi-system}
---
apiVersion: v1
kind: Namespace
metadata: {name: capi-provider-ironcore-metal-system}
---
apiVersion: clusterctl.cluster.x-k8s.io/v1alpha3
kind: Provider
metadata:
  name: cluster-api
  namespace: capi-system
  labels: {clusterctl.cluster.x-k8s.io: "", clusterctl.cluster.x-k8s.io/core: inventory, cluster.x-k8s.io/provider: cluster-api}
providerName: cluster-api
type: CoreProvider
version: v1.13.5
---
apiVersion: clusterctl.cluster.x-k8s.io/v1alpha3
kind: Provider
metadata:
  name: infrastructure-ironcore-metal
  namespace: capi-provider-ironcore-metal-system
  labels: {clusterctl.cluster.x-k8s.io: "", clusterctl.cluster.x-k8s.io/core: inventory, cluster.x-k8s.io/provider: infrastructure-ironcore-metal}
providerName: ironcore-metal
type: InfrastructureProvider
version: v0.2.0
"#;
        let path = bed.scratch.path().join("providers.yaml");
        std::fs::write(&path, providers).unwrap();
        assert_success(&bed.kubectl(kubeconfig, &["apply", "-f", path.to_str().unwrap()]), "apply Provider inventory");
    }
}

type State = BTreeMap<String, (Value, BTreeMap<String, String>)>;

fn assert_restored(before: &State, after: &State, snapshot: &str) {
    assert_eq!(after.len(), before.len(), "every fleet object arrived on the target");
    for (name, (status, _)) in before {
        let (restored, annotations) = &after[name];
        assert_eq!(restored, status, "{name}: status differs from the source");
        assert!(
            !annotations.contains_key(OPERATION_ANNOTATION) && !annotations.contains_key(QUIESCED_BY_ANNOTATION),
            "{name}: {annotations:?}"
        );
        assert_eq!(annotations.get(RESTORED_FROM_ANNOTATION).map(String::as_str), Some(snapshot), "{name}");
    }
}

#[tokio::test]
async fn clusterctl_move_then_restore_brings_every_status_back() {
    let _moves = MOVES.lock().await;
    let _target = TARGET.read().await;
    let fx = Fixture::new(60, 40, 10).await;
    let before = fleet_state(&fx.bed.source().await, &fx.fleet.name).await;
    assert_eq!(before.len(), 170);
    let snapshot = fx.backup();

    let took = fx.clusterctl_move();
    eprintln!("clusterctl move of ~250 objects took {took:?}");
    let target = fx.bed.target().await;
    let moved = fleet_state(&target, &fx.fleet.name).await;
    assert_eq!(moved.len(), 170, "clusterctl moved the whole fleet");
    assert!(moved.values().all(|(status, _)| status.is_null()), "clusterctl move drops status");
    // Owner references were rebuilt with the target's uids.
    let claim = api(&target, "metal.ironcore.dev/v1alpha1", "ServerClaim", "serverclaims", Some(&fx.ns))
        .get(&fx.fleet.claim_ref(0).1)
        .await
        .unwrap();
    let owner = &claim.metadata.owner_references.as_ref().unwrap()[0];
    let imm = api(
        &target,
        "infrastructure.cluster.x-k8s.io/v1alpha1",
        "IroncoreMetalMachine",
        "ironcoremetalmachines",
        Some(&fx.ns),
    )
    .get(&owner.name)
    .await
    .unwrap();
    assert_eq!(Some(&owner.uid), imm.metadata.uid.as_ref());

    let report = fx.restore();
    assert_eq!(report["snapshot"], snapshot.as_str());
    assert_eq!(report["counts"]["restore"], 170);
    assert!(report["pairing"].as_array().unwrap().is_empty(), "{}", report["pairing"]);
    assert_restored(&before, &fleet_state(&target, &fx.fleet.name).await, &snapshot);

    let again = fx.restore();
    assert_eq!(again["writes"], 0, "a second restore writes nothing");
}

#[tokio::test]
async fn the_controller_restores_a_clusterctl_move_as_it_lands() {
    let _moves = MOVES.lock().await;
    let _target = TARGET.read().await;
    let fx = Fixture::new(30, 20, 4).await;
    let before = fleet_state(&fx.bed.source().await, &fx.fleet.name).await;
    let snapshot = fx.backup();

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut controller = Command::new(env!("CARGO_BIN_EXE_restatus"))
        .args([
            "controller",
            "--selector",
            &fx.selector(),
            "--lease-namespace",
            "default",
            "--lease-name",
            &unique("mv-lease"),
        ])
        .args(["--http-addr", &format!("127.0.0.1:{port}"), "--kubeconfig"])
        .arg(&fx.bed.target_kubeconfig)
        .env("RESTATUS_STORAGE", &fx.storage)
        .env("RESTATUS_CLUSTER_ID", &fx.fleet.name)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ready = Instant::now();
    while !Command::new("curl")
        .args(["-sf", &format!("http://127.0.0.1:{port}/readyz")])
        .output()
        .unwrap()
        .status
        .success()
    {
        assert!(ready.elapsed() < Duration::from_secs(30), "controller not ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    fx.clusterctl_move();
    let target = fx.bed.target().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let after = fleet_state(&target, &fx.fleet.name).await;
        let done = after.len() == before.len()
            && before.iter().all(|(n, (s, _))| {
                after.get(n).is_some_and(|(t, a)| t == s && !a.contains_key(QUIESCED_BY_ANNOTATION))
            });
        if done {
            assert_restored(&before, &after, &snapshot);
            break;
        }
        assert!(Instant::now() < deadline, "controller did not restore the moved fleet within 60 s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let _ = Command::new("kill").arg("-TERM").arg(controller.id().to_string()).status();
    assert!(controller.wait().unwrap().success());
}

pub(crate) fn cluster_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    api(client, "cluster.x-k8s.io/v1beta2", "Cluster", "clusters", Some(ns))
}

pub(crate) async fn wait_for(what: &str, within: Duration, done: impl AsyncFnMut() -> bool) {
    wait_for_logged(what, within, &[], done).await;
}

/// `wait_for`; a timeout shows the last lines of `logs` (the replicas' own), to tell why.
pub(crate) async fn wait_for_logged(
    what: &str,
    within: Duration,
    logs: &[&std::path::Path],
    mut done: impl AsyncFnMut() -> bool,
) {
    let deadline = Instant::now() + within;
    while !done().await {
        if Instant::now() >= deadline {
            let tails: Vec<String> = logs
                .iter()
                .map(|log| {
                    let text = std::fs::read_to_string(log).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    format!("{}:\n{}", log.display(), lines[lines.len().saturating_sub(40)..].join("\n"))
                })
                .collect();
            panic!("{what}: not within {within:?}\n{}", tails.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn the_source_handshake_holds_the_move_until_a_consistent_final_snapshot() {
    let _moves = MOVES.lock().await;
    let _target = TARGET.read().await;
    let fx = Fixture::new(20, 10, 2).await;
    let source = fx.bed.source().await;
    let claims = api(&source, "metal.ironcore.dev/v1alpha1", "ServerClaim", "serverclaims", Some(&fx.ns));
    let servers = api(&source, "metal.ironcore.dev/v1alpha1", "Server", "servers", None);
    // A claim in the middle of binding: Unbound, yet with a serverRef.
    let binding = format!("{}-waiting-0", fx.fleet.name);
    let free_server = fx.fleet.server_name(15);
    let serverref = json!({"spec": {"serverRef": {"name": free_server}}});
    claims.patch(&binding, &PatchParams::default(), &Patch::Merge(&serverref)).await.unwrap();

    let mut handshake = fx.handshake();
    let clusters = cluster_api(&source, &fx.ns);
    let annotation = |c: &DynamicObject| c.metadata.annotations.clone().unwrap_or_default().get(BLOCK_MOVE).cloned();
    wait_for("block-move on the Cluster", Duration::from_secs(30), async || {
        annotation(&clusters.get("workload").await.unwrap()).as_deref() == Some("restatus")
    })
    .await;

    // clusterctl pauses the Cluster and waits on block-move, which stays: the claim is binding.
    let move_started = jiff::Timestamp::now();
    let mut command = fx.clusterctl_move_command();
    let mover = std::thread::spawn(move || command.output().unwrap());
    let events = |bed: &Bed, ns: &str| {
        stdout(&bed.kubectl(&bed.source_kubeconfig, &["-n", ns, "get", "events.events.k8s.io", "-o", "json"]))
    };
    wait_for("a MoveBlocked Event on the paused Cluster", Duration::from_secs(60), async || {
        events(&fx.bed, &fx.ns).contains("MoveBlocked")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = clusters.get("workload").await.unwrap();
    assert_eq!(held.data["spec"]["paused"], true, "clusterctl paused the Cluster");
    assert_eq!(annotation(&held).as_deref(), Some("restatus"), "block-move stays while the capture is inconsistent");
    assert!(!mover.is_finished(), "clusterctl must be waiting");
    assert!(events(&fx.bed, &fx.ns).contains("binding"), "the Event says why");

    // The claim settles; the next final snapshot is consistent and the move proceeds.
    claims
        .patch_status(&binding, &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Bound"}})))
        .await
        .unwrap();
    let reserve = json!({"spec": {"serverClaimRef": {"namespace": fx.ns, "name": binding}}});
    servers.patch(&free_server, &PatchParams::default(), &Patch::Merge(&reserve)).await.unwrap();
    servers
        .patch_status(&free_server, &PatchParams::default(), &Patch::Merge(json!({"status": {"state": "Reserved"}})))
        .await
        .unwrap();
    let settled = jiff::Timestamp::now();
    let out = tokio::task::spawn_blocking(move || mover.join().unwrap()).await.unwrap();
    assert_success(&out, "clusterctl move");

    let store = fx.bed.store(&fx.storage, &fx.fleet.name);
    let newest = store.list().await.unwrap().into_iter().rev().find(|e| e.complete).unwrap();
    let manifest = store.manifest(&newest.id).await.unwrap();
    assert!(manifest.is_consistent(), "the final snapshot is consistent");
    assert!(
        manifest.created_at > settled && settled > move_started,
        "the final snapshot was taken after the pause and the settling"
    );

    // Everything arrived quiesced by restatus, without status.
    let target = fx.bed.target().await;
    let arrived = fleet_state(&target, &fx.fleet.name).await;
    assert_eq!(arrived.len(), 20 + 20 + 10 + 2);
    for (name, (status, annotations)) in &arrived {
        assert!(status.is_null(), "{name} arrived with status");
        assert_eq!(
            annotations.get(OPERATION_ANNOTATION).map(String::as_str),
            Some("ignore"),
            "{name} arrived unquiesced"
        );
        assert!(annotations.contains_key(QUIESCED_BY_ANNOTATION), "{name}: the ignore must be marked as restatus's");
    }

    // The restore uses exactly the final snapshot and releases every object.
    let report = fx.restore();
    assert_eq!(report["snapshot"], manifest.snapshot_id.as_str());
    let mut records = BTreeMap::new();
    store
        .load(&manifest.snapshot_id, |r| {
            records.insert(
                format!("{} {}", r.kind, r.object_name()),
                serde_json::from_str::<Value>(r.status.get()).unwrap(),
            );
            Ok(())
        })
        .await
        .unwrap();
    let restored = fleet_state(&target, &fx.fleet.name).await;
    for (name, (status, annotations)) in &restored {
        assert_eq!(Some(status), records.get(name), "{name}");
        assert!(!annotations.contains_key(OPERATION_ANNOTATION), "{name} still ignored after the restore");
    }
    let _ = Command::new("kill").arg("-TERM").arg(handshake.id().to_string()).status();
    assert!(handshake.wait().unwrap().success());
}

#[tokio::test]
async fn preflight_names_what_blocks_a_move_and_waits_until_it_settles() {
    let fx = Fixture::new(6, 3, 0).await;
    let source = fx.bed.source().await;
    let machines = api(&source, "cluster.x-k8s.io/v1beta2", "Machine", "machines", Some(&fx.ns));
    let servers = api(&source, "metal.ironcore.dev/v1alpha1", "Server", "servers", None);
    let (machine, server) = (fx.fleet.claim_ref(1).1, fx.fleet.server_name(4));
    machines
        .patch_status(&machine, &PatchParams::default(), &Patch::Merge(json!({"status": {"nodeRef": null}})))
        .await
        .unwrap();
    servers
        .patch_status(&server, &PatchParams::default(), &Patch::Merge(json!({"status": {"state": "Discovery"}})))
        .await
        .unwrap();
    let selector = fx.selector();
    let preflight = |extra: &[&str]| {
        let mut args = vec!["preflight", "--selector", &selector, "--cluster-namespace", &fx.ns];
        args.extend(extra);
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_restatus"));
        cmd.args(&args)
            .arg("--kubeconfig")
            .arg(&fx.bed.source_kubeconfig)
            .env("RESTATUS_STORAGE", &fx.storage)
            .env("RESTATUS_CLUSTER_ID", &fx.fleet.name);
        cmd
    };

    let out = preflight(&["-o", "json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "not ready: {}", stdout(&out));
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let reasons: Vec<String> = report["blockers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| format!("{} {}: {}", b["object"]["kind"], b["object"]["name"], b["reason"]))
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains(&format!("\"Machine\" \"{machine}\"")) && r.contains("nodeRef")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains(&format!("\"Server\" \"{server}\"")) && r.contains("Discovery")),
        "{reasons:?}"
    );
    assert!(reasons.iter().any(|r| r.contains("no consistent snapshot")), "freshness: {reasons:?}");
    let table = preflight(&[]).output().unwrap();
    assert!(stdout(&table).starts_with("NOT READY"), "{}", stdout(&table));

    // --wait holds until both settle, then takes the snapshot and succeeds.
    let waiting = preflight(&["--wait", "--timeout", "60s", "--snapshot-when-ready"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    machines
        .patch_status(
            &machine,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeRef": {"name": "node-1"}}})),
        )
        .await
        .unwrap();
    servers
        .patch_status(&server, &PatchParams::default(), &Patch::Merge(json!({"status": {"state": "Available"}})))
        .await
        .unwrap();
    let out = tokio::task::spawn_blocking(move || waiting.wait_with_output().unwrap()).await.unwrap();
    assert!(out.status.success(), "--wait: {}", stdout(&out));
    assert!(stdout(&out).starts_with("READY") && stdout(&out).contains("snapshot"), "{}", stdout(&out));
    let progress = crate::bed::stderr(&out);
    assert!(progress.contains(&format!("cleared: Machine {}/{machine}", fx.ns)), "what changed: {progress}");
    assert!(progress.contains(&format!("cleared: Server {server}")), "what changed: {progress}");
    assert_eq!(preflight(&[]).output().unwrap().status.code(), Some(0), "fresh snapshot, nothing blocks");

    // Could not check: exit 2.
    let nowhere = fx.bed.scratch.path().join("nowhere.kubeconfig");
    let mut config = kube::config::Kubeconfig::read_from(&fx.bed.source_kubeconfig).unwrap();
    for c in &mut config.clusters {
        if let Some(c) = c.cluster.as_mut() {
            c.server = Some("https://127.0.0.1:9".into());
        }
    }
    std::fs::write(&nowhere, serde_json::to_vec(&config).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_restatus"))
        .args(["preflight", "--kubeconfig", nowhere.to_str().unwrap()])
        .env("RESTATUS_STORAGE", &fx.storage)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test]
async fn an_aborted_move_releases_restatus_ignore_and_blocks_again() {
    let fx = Fixture::new(4, 2, 0).await;
    block_pause_unpause(&fx, fx.handshake()).await;
}

/// The handshake through a move that is aborted: block-move on the Cluster; once clusterctl
/// pauses it, the final snapshot, every object quiesced and block-move removed; once the
/// Cluster is unpaused and still here, restatus's ignore released and block-move back.
async fn block_pause_unpause(fx: &Fixture, handshake: std::process::Child) {
    let mut handshake = Reaped(handshake);
    let source = fx.bed.source().await;
    let clusters = cluster_api(&source, &fx.ns);
    let block = |c: &DynamicObject| c.metadata.annotations.clone().unwrap_or_default().get(BLOCK_MOVE).cloned();
    wait_for("block-move on the Cluster", Duration::from_secs(30), async || {
        block(&clusters.get("workload").await.unwrap()).as_deref() == Some("restatus")
    })
    .await;

    // What clusterctl does first: pause the Cluster. The handshake lets go after its snapshot.
    let pause = |paused: bool| json!({"spec": {"paused": paused}});
    clusters.patch("workload", &PatchParams::default(), &Patch::Merge(pause(true))).await.unwrap();
    wait_for("block-move removed after the final snapshot", Duration::from_secs(30), async || {
        block(&clusters.get("workload").await.unwrap()).is_none()
    })
    .await;
    let quiesced = fleet_state(&source, &fx.fleet.name).await;
    assert!(
        quiesced.values().all(|(_, a)| a.contains_key(QUIESCED_BY_ANNOTATION)),
        "every object quiesced before the move may go"
    );

    // The move is aborted: the Cluster is unpaused and still here.
    clusters.patch("workload", &PatchParams::default(), &Patch::Merge(pause(false))).await.unwrap();
    wait_for("restatus's ignore released and block-move back", Duration::from_secs(30), async || {
        let released = fleet_state(&source, &fx.fleet.name)
            .await
            .values()
            .all(|(_, a)| !a.contains_key(QUIESCED_BY_ANNOTATION) && !a.contains_key(OPERATION_ANNOTATION));
        released && block(&clusters.get("workload").await.unwrap()).as_deref() == Some("restatus")
    })
    .await;
    let _ = Command::new("kill").arg("-TERM").arg(handshake.0.id().to_string()).status();
    assert!(handshake.0.wait().unwrap().success());
}

/// A child process killed when a failed assertion unwinds past it.
pub(crate) struct Reaped(pub(crate) std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_source_role_rbac_is_sufficient_and_nothing_more() {
    let fx = Fixture::new(4, 2, 0).await;
    let bed = &fx.bed;
    let kubeconfig = bed.deploy(&bed.source_kubeconfig, &["source"], "restatus-source");

    // Sufficient: as this ServiceAccount, the handshake blocks, snapshots, quiesces, lets go
    // and, the move aborted, releases and blocks again.
    block_pause_unpause(&fx, fx.handshake_as(&kubeconfig, "restatus")).await;
    let snapshots = fx.bed.store(&fx.storage, &fx.fleet.name).list().await.unwrap();
    assert!(snapshots.iter().any(|s| s.complete), "the final snapshot was written as the ServiceAccount");

    // Nothing more: no spec, status, label or foreign annotation writes; no deletes, Secrets.
    let server = format!("servers.metal.ironcore.dev/{}", fx.fleet.server_name(0));
    let cluster = "clusters.cluster.x-k8s.io/workload";
    let ns = fx.ns.as_str();
    let mut denied = foreign_patches(&server);
    denied.extend([
        vec!["patch", &server, "--subresource=status", "--type=merge", "-p", r#"{"status":{"state":"Available"}}"#],
        merge_patch(Some(ns), cluster, r#"{"spec":{"paused":true}}"#),
        merge_patch(Some(ns), cluster, r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":"ignore"}}}"#),
        vec!["-n", ns, "delete", cluster],
        vec!["delete", &server],
        vec!["get", "secrets", "-A"],
        vec!["get", "bmcsecrets.metal.ironcore.dev"],
        // The move set reads CRDs one by one and lists owner kinds, nothing more.
        vec!["get", "customresourcedefinitions"],
        vec!["-n", ns, "get", "clusterclasses.cluster.x-k8s.io"],
        vec!["-n", ns, "get", "machines.cluster.x-k8s.io", "-o", "name", "--watch-only", "--request-timeout=1s"],
    ]);
    bed.assert_denied(&kubeconfig, &denied);
    let allowed = [
        vec!["get", "customresourcedefinitions", "servers.metal.ironcore.dev"],
        vec!["-n", ns, "get", "machines.cluster.x-k8s.io"],
        merge_patch(
            Some(ns),
            cluster,
            r#"{"metadata":{"annotations":{"clusterctl.cluster.x-k8s.io/block-move":"restatus"}}}"#,
        ),
        merge_patch(
            Some(ns),
            cluster,
            r#"{"metadata":{"annotations":{"clusterctl.cluster.x-k8s.io/block-move":null}}}"#,
        ),
        merge_patch(None, &server, QUIESCE_PATCH),
        merge_patch(Some(ns), cluster, r#"{"metadata":{"annotations":{"restatus.ironcore.dev/move-blocked":"why"}}}"#),
        merge_patch(Some(ns), cluster, r#"{"metadata":{"annotations":{"restatus.ironcore.dev/move-blocked":null}}}"#),
    ];
    bed.assert_allowed(&kubeconfig, &allowed);
    for object in [format!("bmcs.metal.ironcore.dev/{}", fx.fleet.bmc_name(0)), server] {
        crate::bed::assert_only_the_quiesce_protocol(bed, &bed.source_kubeconfig, &kubeconfig, &object);
    }
}

/// Whether the replica serving `url` leads (its `restatus_leader` is 1).
fn leads(url: &str) -> bool {
    let out = Command::new("curl").args(["-s", "-m", "5", url]).output().unwrap();
    stdout(&out).lines().any(|l| l.starts_with("restatus_leader ") && l.ends_with(" 1"))
}

/// F37 end to end: two source-role replicas on one Lease. The leader blocks the move; the
/// Cluster is paused (what `clusterctl move` does first); the leader takes the final snapshot,
/// quiesces the fleet and lets the Cluster go, and is SIGKILLed right then, in the middle of
/// the move. The move is then aborted: the Cluster is unpaused and stays. (With the real
/// clusterctl, a move that may go completes within a second or two and cannot be aborted any
/// more; its pause is the same `spec.paused` patch, and an abort is its undoing.) The standby
/// takes over within the lease duration (15 s), recalls the final snapshot from the Cluster's
/// annotation instead of taking a second one, and releases the fleet (no restatus `ignore`
/// left) and puts block-move back as it was.
#[tokio::test]
async fn a_source_leader_killed_mid_move_is_replaced_and_the_aborted_move_released() {
    let fx = Fixture::new(4, 2, 0).await;
    let lease = unique("src-lease");
    let (mut a, a_url, a_log) = fx.replica(&lease);
    let (mut b, b_url, b_log) = fx.replica(&lease);
    let source = fx.bed.source().await;
    let clusters = cluster_api(&source, &fx.ns);
    let annotation =
        |c: &DynamicObject, key: &str| c.metadata.annotations.clone().unwrap_or_default().get(key).cloned();
    wait_for("block-move on the Cluster", Duration::from_secs(60), async || {
        annotation(&clusters.get("workload").await.unwrap(), BLOCK_MOVE).as_deref() == Some("restatus")
    })
    .await;
    let a_leads = leads(&a_url);
    assert_ne!(a_leads, leads(&b_url), "exactly one replica leads");
    let (leader, standby_url) = if a_leads { (&mut a, &b_url) } else { (&mut b, &a_url) };

    clusters
        .patch("workload", &PatchParams::default(), &Patch::Merge(json!({"spec": {"paused": true}})))
        .await
        .unwrap();
    wait_for("block-move removed after the final snapshot", Duration::from_secs(60), async || {
        annotation(&clusters.get("workload").await.unwrap(), BLOCK_MOVE).is_none()
    })
    .await;
    leader.0.kill().unwrap();
    let killed = Instant::now();
    leader.0.wait().unwrap();
    let cluster = clusters.get("workload").await.unwrap();
    let final_snapshot = annotation(&cluster, restatus::domain::annotations::FINAL_SNAPSHOT_ANNOTATION)
        .expect("the leader wrote the final snapshot's id on the Cluster it let go");
    let quiesced = fleet_state(&source, &fx.fleet.name).await;
    assert!(
        quiesced.values().all(|(_, a)| a.contains_key(QUIESCED_BY_ANNOTATION)),
        "the killed leader had quiesced the fleet: {quiesced:?}"
    );

    // The move is aborted.
    clusters
        .patch("workload", &PatchParams::default(), &Patch::Merge(json!({"spec": {"paused": false}})))
        .await
        .unwrap();
    // The lease (15 s) runs out, then the standby wakes at the expiry it last read: a loaded API
    // server stretches both.
    let logs = [a_log.as_path(), b_log.as_path()];
    wait_for_logged("the standby leads", Duration::from_secs(60), &logs, async || leads(standby_url)).await;
    let took_over = killed.elapsed();
    wait_for_logged("restatus's ignore released and block-move back", Duration::from_secs(60), &logs, async || {
        let released = fleet_state(&source, &fx.fleet.name)
            .await
            .values()
            .all(|(_, a)| !a.contains_key(QUIESCED_BY_ANNOTATION) && !a.contains_key(OPERATION_ANNOTATION));
        let cluster = clusters.get("workload").await.unwrap();
        released && annotation(&cluster, BLOCK_MOVE).as_deref() == Some("restatus")
    })
    .await;
    eprintln!("standby led {took_over:?} after the kill; fleet released {:?} after it", killed.elapsed());
    let cluster = clusters.get("workload").await.unwrap();
    assert_eq!(annotation(&cluster, restatus::domain::annotations::FINAL_SNAPSHOT_ANNOTATION), None, "phase reset");
    let complete: Vec<String> = fx
        .bed
        .store(&fx.storage, &fx.fleet.name)
        .list()
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.complete)
        .map(|e| e.id.to_string())
        .collect();
    assert_eq!(complete, vec![final_snapshot], "the new leader took no second final snapshot");
    let killed_log = std::fs::read_to_string(&a_log).unwrap_or_default();
    assert!(!a_leads || killed_log.contains("block-move removed"), "the killed replica let the move go: {killed_log}");
    let survivor = if a_leads { &mut b } else { &mut a };
    let _ = Command::new("kill").arg("-TERM").arg(survivor.0.id().to_string()).status();
    assert!(survivor.0.wait().unwrap().success());
}

/// F37 in the middle of the quiesce: the leader's quiesce fails half-way (an admission policy on
/// the source refuses restatus's `ignore` on one Server of the fleet: the BMCs and some Servers
/// are quiesced, block-move stays, so the move cannot go with an object unquiesced), the leader
/// is SIGKILLed, the move aborted. The final snapshot's id is on the Cluster before anything was
/// quiesced, so the standby that takes over knows a quiesce was under way and releases every
/// object quiesced by the killed leader, and block-move stays as it was.
#[tokio::test]
async fn a_source_leader_killed_in_the_middle_of_its_quiesce_releases_everything_after_an_abort() {
    let fx = Fixture::new(4, 2, 0).await;
    let stuck_policy = fx.refuse_quiesce_of(&fx.fleet.server_name(2), "stuck").await;

    let lease = unique("src-lease");
    let (mut a, a_url, a_log) = fx.replica(&lease);
    let (mut b, b_url, b_log) = fx.replica(&lease);
    let logs = [a_log.as_path(), b_log.as_path()];
    let source = fx.bed.source().await;
    let clusters = cluster_api(&source, &fx.ns);
    let annotation =
        |c: &DynamicObject, key: &str| c.metadata.annotations.clone().unwrap_or_default().get(key).cloned();
    wait_for_logged("block-move on the Cluster", Duration::from_secs(60), &logs, async || {
        annotation(&clusters.get("workload").await.unwrap(), BLOCK_MOVE).as_deref() == Some("restatus")
    })
    .await;
    let a_leads = leads(&a_url);
    assert_ne!(a_leads, leads(&b_url), "exactly one replica leads");
    let (leader, standby_url) = if a_leads { (&mut a, &b_url) } else { (&mut b, &a_url) };

    clusters
        .patch("workload", &PatchParams::default(), &Patch::Merge(json!({"spec": {"paused": true}})))
        .await
        .unwrap();
    let final_snapshot = restatus::domain::annotations::FINAL_SNAPSHOT_ANNOTATION;
    wait_for_logged(
        "the final snapshot recorded and the quiesce stuck half-way",
        Duration::from_secs(60),
        &logs,
        async || {
            let state = fleet_state(&source, &fx.fleet.name).await;
            let quiesced = state.values().filter(|(_, a)| a.contains_key(QUIESCED_BY_ANNOTATION)).count();
            annotation(&clusters.get("workload").await.unwrap(), final_snapshot).is_some() && quiesced >= 4
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await; // it keeps failing on the stuck Server
    let cluster = clusters.get("workload").await.unwrap();
    assert_eq!(annotation(&cluster, BLOCK_MOVE).as_deref(), Some("restatus"), "the move may not go half-quiesced");
    let state = fleet_state(&source, &fx.fleet.name).await;
    assert!(state.values().any(|(_, a)| !a.contains_key(QUIESCED_BY_ANNOTATION)), "the quiesce is incomplete");
    leader.0.kill().unwrap();
    leader.0.wait().unwrap();
    let killed = Instant::now();

    // The move is aborted.
    clusters
        .patch("workload", &PatchParams::default(), &Patch::Merge(json!({"spec": {"paused": false}})))
        .await
        .unwrap();
    // The lease (15 s) runs out, then the standby wakes at the expiry it last read: a loaded API
    // server stretches both.
    wait_for_logged("the standby leads", Duration::from_secs(60), &logs, async || leads(standby_url)).await;
    wait_for_logged("restatus's ignore released and block-move back", Duration::from_secs(60), &logs, async || {
        let released = fleet_state(&source, &fx.fleet.name)
            .await
            .values()
            .all(|(_, a)| !a.contains_key(QUIESCED_BY_ANNOTATION) && !a.contains_key(OPERATION_ANNOTATION));
        // block-move never left: the Cluster's final-snapshot annotation goes last.
        let cluster = clusters.get("workload").await.unwrap();
        released
            && annotation(&cluster, BLOCK_MOVE).as_deref() == Some("restatus")
            && annotation(&cluster, final_snapshot).is_none()
    })
    .await;
    eprintln!("the standby released the half-quiesced fleet {:?} after the kill", killed.elapsed());
    stuck_policy.remove(&fx.bed);
    let survivor = if a_leads { &mut b } else { &mut a };
    let _ = Command::new("kill").arg("-TERM").arg(survivor.0.id().to_string()).status();
    assert!(survivor.0.wait().unwrap().success());
}

/// F62: a status moves on between the final snapshot and the quiesce (metal-operator acted
/// after the capture: a power change). The quiesce of one Server is held back (an admission
/// policy refuses restatus's `ignore` on it) while its status changes, as metal-operator's
/// would; then the policy goes. The quiesce sees that the Server's status is not the final
/// snapshot's, and takes the final snapshot again, of objects that can no longer change: the
/// move goes with the status the Server has (before: with the one the first snapshot holds,
/// and the target would have got the machine's old power state back).
#[tokio::test]
async fn a_status_that_moves_on_before_the_quiesce_is_in_the_final_snapshot() {
    let fx = Fixture::new(4, 2, 0).await;
    let stuck = fx.fleet.server_name(2);
    let policy = fx.refuse_quiesce_of(&stuck, "late").await;
    let (handshake, _, log) = fx.replica(&unique("src-lease"));
    let logs = [log.as_path()];
    let source = fx.bed.source().await;
    let clusters = cluster_api(&source, &fx.ns);
    let servers = api(&source, "metal.ironcore.dev/v1alpha1", "Server", "servers", None);
    let annotation =
        |c: &DynamicObject, key: &str| c.metadata.annotations.clone().unwrap_or_default().get(key).cloned();
    let final_snapshot = restatus::domain::annotations::FINAL_SNAPSHOT_ANNOTATION;
    wait_for_logged("block-move on the Cluster", Duration::from_secs(60), &logs, async || {
        annotation(&clusters.get("workload").await.unwrap(), BLOCK_MOVE).as_deref() == Some("restatus")
    })
    .await;

    clusters
        .patch("workload", &PatchParams::default(), &Patch::Merge(json!({"spec": {"paused": true}})))
        .await
        .unwrap();
    wait_for_logged("the final snapshot taken and the quiesce held back", Duration::from_secs(60), &logs, async || {
        let state = fleet_state(&source, &fx.fleet.name).await;
        let quiesced = state.values().filter(|(_, a)| a.contains_key(QUIESCED_BY_ANNOTATION)).count();
        annotation(&clusters.get("workload").await.unwrap(), final_snapshot).is_some() && quiesced >= 4
    })
    .await;
    let first = annotation(&clusters.get("workload").await.unwrap(), final_snapshot).unwrap();
    // The machine is powered off meanwhile, as metal-operator would record it.
    let before = servers.get(&stuck).await.unwrap().data["status"]["powerState"].clone();
    let after = if before == "On" { "Off" } else { "On" };
    let power = json!({"status": {"powerState": after}});
    servers.patch_status(&stuck, &PatchParams::default(), &Patch::Merge(&power)).await.unwrap();
    policy.remove(&fx.bed);

    wait_for_logged("block-move removed", Duration::from_secs(60), &logs, async || {
        annotation(&clusters.get("workload").await.unwrap(), BLOCK_MOVE).is_none()
    })
    .await;
    let cluster = clusters.get("workload").await.unwrap();
    let last = annotation(&cluster, final_snapshot).expect("the final snapshot on the Cluster");
    assert_ne!(last, first, "the final snapshot was taken again");
    let store = fx.bed.store(&fx.storage, &fx.fleet.name);
    let power_in = async |id: &str| {
        let mut power = Value::Null;
        store
            .load(&id.parse().unwrap(), |r| {
                if r.kind == "Server" && r.name == stuck {
                    power = serde_json::from_str::<Value>(r.status.get()).unwrap()["powerState"].clone();
                }
                Ok(())
            })
            .await
            .unwrap();
        power
    };
    assert_eq!(power_in(&first).await, before, "the first final snapshot holds the old power state");
    assert_eq!(power_in(&last).await, after, "the move goes with the power state the machine has");
    let manifest = store.manifest(&last.parse().unwrap()).await.unwrap();
    assert!(manifest.is_consistent());
    let state = fleet_state(&source, &fx.fleet.name).await;
    assert!(state.values().all(|(_, a)| a.contains_key(QUIESCED_BY_ANNOTATION)), "every object quiesced: {state:?}");
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(logged.contains("statuses moved on between the final snapshot and the quiesce"), "{logged}");
    let _ = Command::new("kill").arg("-TERM").arg(handshake.0.id().to_string()).status();
}

/// Counts of a fleet's objects by kind ("BMC", "Server", "ServerClaim").
fn by_kind(state: &State) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for name in state.keys() {
        *out.entry(name.split(' ').next().unwrap_or_default().to_string()).or_default() += 1;
    }
    out
}

/// Issue 37 (F115), without restatus: metal-operator's CRDs as installed upstream (unlabelled),
/// the real `clusterctl move`. It moves the CAPI objects and none of the fleet's: every BMC,
/// Server and claim stays on the source, and the bound claims are deleted there by the garbage
/// collector once clusterctl deletes their IroncoreMetalMachines: gone from both clusters. The
/// test bed runs no garbage collector (no kube-controller-manager): the claims whose every
/// owner clusterctl deleted are counted, as the ones it deletes.
#[tokio::test]
async fn upstream_crds_leave_the_fleet_behind_and_lose_the_bound_claims() {
    let _moves = MOVES.lock().await;
    let _target = TARGET.read().await;
    let (servers, machines, unbound) = (8, 5, 1);
    let fx = Fixture::unlabelled(servers, machines, unbound).await;
    let source = fx.bed.source().await;
    let before = by_kind(&fleet_state(&source, &fx.fleet.name).await);
    fx.clusterctl_move();
    let target = fx.bed.target().await;
    let moved = by_kind(&fleet_state(&target, &fx.fleet.name).await);
    // This test bed runs no kube-controller-manager, so no garbage collector: what it would
    // delete is counted instead, the claims whose every owner clusterctl deleted.
    let claims = api(&source, "metal.ironcore.dev/v1alpha1", "ServerClaim", "serverclaims", Some(&fx.ns));
    let infra = "infrastructure.cluster.x-k8s.io/v1alpha1";
    let machines_left = api(&source, infra, "IroncoreMetalMachine", "ironcoremetalmachines", Some(&fx.ns));
    assert!(machines_left.list(&Default::default()).await.unwrap().items.is_empty(), "clusterctl deleted them");
    let orphaned = claims
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|c| c.metadata.owner_references.as_ref().is_some_and(|o| !o.is_empty()))
        .count();
    eprintln!("MEASURED without restatus: {orphaned} claims left on the source whose owner clusterctl deleted");
    assert_eq!(orphaned, machines, "every bound claim: the garbage collector deletes it");
    let left = by_kind(&fleet_state(&source, &fx.fleet.name).await);
    eprintln!("MEASURED without restatus: before {before:?}, on the target {moved:?}, left on the source {left:?}");
    assert!(moved.is_empty(), "clusterctl moved none of the fleet: {moved:?}");
    assert_eq!(left.get("BMC"), Some(&servers));
    assert_eq!(left.get("Server"), Some(&servers));
    assert_eq!(left.get("ServerClaim"), Some(&(machines + unbound)), "every claim stayed (until collected)");
}

/// Issue 37 (F116), with restatus: from the same unlabelled CRDs, preflight names what the move
/// would leave behind (the bound claims as deleted by the garbage collector) and prints the
/// label commands; the handshake keeps block-move on the paused Cluster with the reason (Event
/// and annotation) while clusterctl waits. After the commands are run as printed and the move
/// started again, it carries the whole fleet and the restore brings every status back.
#[tokio::test]
async fn restatus_names_what_the_move_would_leave_and_holds_it_until_labelled() {
    let _moves = MOVES.lock().await;
    let _target = TARGET.read().await;
    let fx = Fixture::unlabelled(8, 5, 1).await;
    let source = fx.bed.source().await;
    let before = fleet_state(&source, &fx.fleet.name).await;

    let args = ["preflight", "--selector", &fx.selector(), "--cluster-namespace", &fx.ns, "-o", "json"];
    let out = fx.bed.restatus(&fx.storage, &fx.fleet.name, &args);
    let report: Value = serde_json::from_str(&stdout(&out)).expect("preflight -o json");
    let reasons: Vec<String> = report["blockers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| format!("{} {}: {}", b["kind"], b["name"], b["reason"]))
        .collect();
    eprintln!("MEASURED preflight: {} reasons; label commands {}", reasons.len(), report["label_commands"]);
    let collected = reasons.iter().filter(|r| r.contains("deleted on the source by the garbage collector")).count();
    assert_eq!(collected, 5, "each bound claim named: {reasons:#?}");
    for kind in ["8 BMC will not move", "8 Server will not move", "1 ServerClaim will not move"] {
        assert!(
            reasons.iter().any(|r| r.contains(kind) && r.contains("lacks the label clusterctl.cluster.x-k8s.io")),
            "{kind}: {reasons:#?}"
        );
    }
    let commands = fx.preflight_label_commands();
    assert!(commands.iter().all(|c| c.starts_with("kubectl label ")), "{commands:?}");

    // The handshake holds the move clusterctl starts now (its graph is built without the fleet).
    let mut handshake = fx.handshake();
    let clusters = cluster_api(&source, &fx.ns);
    let annotation =
        |c: &DynamicObject, key: &str| c.metadata.annotations.clone().unwrap_or_default().get(key).cloned();
    wait_for("block-move on the Cluster", Duration::from_secs(30), async || {
        annotation(&clusters.get("workload").await.unwrap(), BLOCK_MOVE).as_deref() == Some("restatus")
    })
    .await;
    let mut mover = fx
        .clusterctl_move_command()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let blocked = restatus::domain::annotations::MOVE_BLOCKED_ANNOTATION;
    wait_for("move-blocked on the paused Cluster", Duration::from_secs(60), async || {
        annotation(&clusters.get("workload").await.unwrap(), blocked).is_some()
    })
    .await;
    let held = clusters.get("workload").await.unwrap();
    assert_eq!(held.data["spec"]["paused"], true, "clusterctl paused the Cluster");
    assert_eq!(annotation(&held, BLOCK_MOVE).as_deref(), Some("restatus"), "block-move stays");
    let note = annotation(&held, blocked).unwrap();
    assert!(note.contains("garbage collector") && note.contains("kubectl label"), "{note}");
    let events = || {
        let args = ["-n", &fx.ns, "get", "events.events.k8s.io", "-o", "json"];
        stdout(&fx.bed.kubectl(&fx.bed.source_kubeconfig, &args))
    };
    wait_for("a MoveBlocked Event that says why", Duration::from_secs(30), async || {
        let events = events();
        events.contains("MoveBlocked") && events.contains("garbage collector")
    })
    .await;
    assert!(mover.try_wait().unwrap().is_none(), "clusterctl must be waiting");
    assert_eq!(by_kind(&fleet_state(&source, &fx.fleet.name).await).get("ServerClaim"), Some(&6), "no claim lost");

    // The user stops that move, labels as told, unpauses, and moves again.
    mover.kill().unwrap();
    mover.wait().unwrap();
    let ran = fx.label_as_preflight_says();
    assert_eq!(ran, commands, "the commands preflight printed before");
    assert!(fx.preflight_label_commands().is_empty(), "nothing more to label");
    clusters
        .patch("workload", &PatchParams::default(), &Patch::Merge(json!({"spec": {"paused": false}})))
        .await
        .unwrap();
    wait_for("move-blocked removed once unpaused", Duration::from_secs(30), async || {
        annotation(&clusters.get("workload").await.unwrap(), blocked).is_none()
    })
    .await;
    let took = fx.clusterctl_move();
    let target = fx.bed.target().await;
    let arrived = fleet_state(&target, &fx.fleet.name).await;
    eprintln!("MEASURED with restatus, after labelling: {:?} on the target (move took {took:?})", by_kind(&arrived));
    assert_eq!(arrived.len(), before.len(), "the whole fleet moved");
    let report = fx.restore();
    assert!(report["pairing"].as_array().unwrap().is_empty(), "{}", report["pairing"]);
    let restored = fleet_state(&target, &fx.fleet.name).await;
    for (name, (status, _)) in &before {
        assert_eq!(&restored[name].0, status, "{name}");
    }
    let _ = Command::new("kill").arg("-TERM").arg(handshake.id().to_string()).status();
    assert!(handshake.wait().unwrap().success());
}

/// Issue 37, item 5: a custom profile's own kinds get the move-set check too. `Widget`, a kind
/// of the user's own whose CRD is installed as its chart would (unlabelled), is named by
/// preflight with the command that fixes it; `Gadget`, marked `moves: false` in the profile (a
/// kind its controller rebuilds on the target), is neither named nor labelled. After the
/// printed commands, nothing of the profile blocks the move.
#[tokio::test]
async fn a_custom_profile_kind_gets_the_move_check_and_moves_false_exempts_one() {
    let _moves = MOVES.lock().await;
    let fx = Fixture::new(2, 1, 0).await;
    let group = format!("{}.e2e.restatus.dev", fx.fleet.name);
    let preserve = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let namespaced_crd = |kind: &str, plural: &str| {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                     "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                                   "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": preserve, "status": preserve}}}}]},
        })
    };
    let mut profile = serde_json::to_value(restatus::domain::identity::Profile::metal_operator()).unwrap();
    for (kind, plural, moves) in [("Widget", "widgets", true), ("Gadget", "gadgets", false)] {
        crate::controller::install_crd(&fx.bed, &fx.bed.source_kubeconfig, &namespaced_crd(kind, plural));
        let mut entry = json!({"group": group, "version": "v1", "kind": kind, "plural": plural, "namespaced": true});
        if !moves {
            entry["moves"] = json!(false);
        }
        profile["kinds"].as_array_mut().unwrap().push(entry);
        let source = fx.bed.source().await;
        let object = json!({"apiVersion": format!("{group}/v1"), "kind": kind,
                            "metadata": {"name": "one", "namespace": fx.ns, "labels": {FLEET_LABEL: fx.fleet.name}}});
        create(&source, plural, object, Some(json!({"phase": "Ready"}))).await;
    }
    let profile_file = fx.bed.scratch.path().join(format!("{}-profile.json", fx.fleet.name));
    std::fs::write(&profile_file, profile.to_string()).unwrap();
    let profile_arg = profile_file.to_str().unwrap();

    let selector = fx.selector();
    let preflight = |extra: &[&str]| {
        let mut args = vec!["preflight", "--profile", profile_arg, "--selector", &selector];
        args.extend(["--cluster-namespace", &fx.ns]);
        args.extend(extra);
        fx.bed.restatus(&fx.storage, &fx.fleet.name, &args)
    };
    let blockers = |kind: &str| -> Vec<String> {
        let report: Value = serde_json::from_str(&stdout(&preflight(&["-o", "json"]))).expect("preflight -o json");
        report["blockers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| format!("{} {}: {}", b["object"]["kind"], b["object"]["name"], b["reason"]))
            .filter(|r| r.contains(&format!(" {kind} will not move")) || r.contains(&format!(" {kind} ")))
            .collect()
    };
    let widgets = blockers("Widget");
    eprintln!("MEASURED preflight with a custom profile: Widget {widgets:?}, Gadget {:?}", blockers("Gadget"));
    assert!(
        widgets.iter().any(|r| r.contains("will not move") && r.contains("clusterctl.cluster.x-k8s.io")),
        "the user's own kind is checked like metal-operator's: {widgets:?}"
    );
    assert!(blockers("Gadget").is_empty(), "moves: false exempts the kind");
    let commands: Vec<String> =
        stdout(&preflight(&["--label-commands"])).lines().filter(|l| !l.is_empty()).map(str::to_string).collect();
    assert!(commands.iter().any(|c| c.contains(&format!("widgets.{group}"))), "{commands:?}");
    assert!(
        !commands.iter().any(|c| c.contains("gadgets")),
        "a kind that does not move is never labelled: {commands:?}"
    );

    fx.run_label_commands(&commands);
    assert!(blockers("Widget").is_empty(), "after the printed commands the Widget moves");
}
