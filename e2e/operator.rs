//! The real metal-operator (v0.7.0) through the real `clusterctl move`: what the operator does
//! to the machines when a fleet moves without restatus, and that with restatus it does nothing.
//!
//! The operator reconciles every BMC, Server and ServerClaim of its cluster, whoever made them,
//! so these tests run on a test bed of their own (`$RESTATUS_STATE/operator-bed`, ports from
//! `RESTATUS_PORT_BASE` + 500, the main bed's S3), one scenario at a time.
//!
//! The fleet is made the way production makes it: BMCs and their BMCSecret point at Redfish mocks
//! (metal-operator's own `bmc/mock`, one per BMC, behind the test bed's counting proxy); the
//! operator discovers each BMC's system and creates its Server; discovery completes through the
//! real probe agent (`metalprobe`, run on this host with the Server's system UUID, so the
//! inventory is this host's); ServerClaims owned by IroncoreMetalMachines bind Servers. Stand-ins,
//! written down as such:
//! - no boot operator: [`BootStandIn`] marks every ServerBootConfiguration that metal-operator
//!   left `Pending` as `Ready`, on the source and on the target, and labels the claims' ones with
//!   the fleet label (restatus runs with the fleet's selector here, to stay off other fleets);
//! - no OS: the machines are mocks, the probe reports this host;
//! - no CAPI controllers: the test sets the statuses clusterctl's preflight checks, as in
//!   `moving.rs`.
//!
//! Every scenario prints what the operator asked of the machines; `docs/MOVE.md` quotes them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use restatus::domain::annotations::{OPERATION_ANNOTATION, QUIESCED_BY_ANNOTATION};
use restatus::fleet::FLEET_LABEL;
use serde_json::{Value, json};

use crate::bed::{Bed, assert_success, stdout, unique};
use crate::moving::{
    BLOCK_MOVE, MOVE_LABEL, Reaped, api, cluster_api, condition, create, owner, prepare_clusters, wait_for,
};

const METAL: &str = "metal.ironcore.dev/v1alpha1";
const CAPI: &str = "cluster.x-k8s.io/v1beta2";
const INFRA: &str = "infrastructure.cluster.x-k8s.io/v1alpha1";
/// Servers bound by a claim; the others stay Available.
const BOUND: usize = 5;
/// How long the operators are watched after a move: two and a half of the test bed's
/// `--server-resync-interval` (10 s), so every Server is reconciled at least twice.
const SETTLE: Duration = Duration::from_secs(25);
/// Status fields the operator rewrites on its own after restatus released an object, with the
/// same meaning (see docs/MOVE.md).
const VOLATILE: &[&str] = &[];

/// One operator scenario at a time: they share the operator test bed, its mocks and managers.
static OPERATOR_BED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The operator test bed: its clusters, its Redfish mocks, its scripts.
struct OpBed {
    bed: Bed,
    env: BTreeMap<String, String>,
    endpoints: Vec<String>,
    redfish_log: PathBuf,
}

impl OpBed {
    /// Starts the operator test bed (idempotent) and reads its environment.
    async fn up() -> OpBed {
        let state = var("RESTATUS_STATE")
            .expect("RESTATUS_STATE is not set: source the env file of a current `scripts/testbed up` (it exports it)");
        let base: u32 = var("RESTATUS_PORT_BASE").map_or(23790, |b| b.parse().expect("RESTATUS_PORT_BASE"));
        let mut vars: BTreeMap<String, String> = BTreeMap::new();
        vars.insert("RESTATUS_STATE".into(), format!("{state}/operator-bed"));
        vars.insert("RESTATUS_PORT_BASE".into(), (base + 500).to_string());
        for name in ["RESTATUS_CACHE", "S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"] {
            if let Some(value) = var(name) {
                vars.insert(name.into(), value);
            }
        }
        let script = testbed_script();
        let up = tokio::task::spawn_blocking(move || Command::new(script).arg("up").envs(&vars).output().unwrap())
            .await
            .unwrap();
        assert_success(&up, "scripts/testbed up (operator test bed)");
        let env_file = format!("{state}/operator-bed/env");
        let out = Command::new("bash").args(["-c", "source \"$1\" && env -0", "_", &env_file]).output().unwrap();
        assert_success(&out, "read the operator test bed's env file");
        let env: BTreeMap<String, String> = out
            .stdout
            .split(|b| *b == 0)
            .filter_map(|kv| String::from_utf8_lossy(kv).split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect();
        let bin = PathBuf::from(&env["RESTATUS_CACHE"]).join("bin");
        let bed = Bed {
            source_kubeconfig: env["KUBECONFIG_SOURCE"].clone().into(),
            target_kubeconfig: env["KUBECONFIG_TARGET"].clone().into(),
            bucket: env["RESTATUS_BUCKET"].clone(),
            kubectl: bin.join("kubectl"),
            scratch: tempfile::tempdir().unwrap(),
        };
        let endpoints = env["RESTATUS_REDFISH_ENDPOINTS"].split(',').map(String::from).collect();
        let redfish_log = env["RESTATUS_REDFISH_LOG"].clone().into();
        OpBed { bed, env, endpoints, redfish_log }
    }

    fn bin(&self, name: &str) -> PathBuf {
        PathBuf::from(&self.env["RESTATUS_CACHE"]).join("bin").join(name)
    }

    /// `scripts/testbed ARGS` on the operator test bed.
    async fn testbed(&self, args: &[&str]) {
        let (env, args_owned) = (self.env.clone(), args.iter().map(|a| a.to_string()).collect::<Vec<_>>());
        let out = tokio::task::spawn_blocking(move || {
            Command::new(testbed_script()).args(&args_owned).env_clear().envs(&env).output().unwrap()
        })
        .await
        .unwrap();
        assert_success(&out, &format!("scripts/testbed {}", args.join(" ")));
    }

    /// Both managers and the mocks stopped, every metal-operator object of earlier scenarios gone
    /// from both clusters, then fresh mocks and the source's manager started.
    async fn reset(&self) {
        self.testbed(&["operator", "down"]).await;
        for client in [self.bed.source().await, self.bed.target().await] {
            purge(&client).await;
        }
        prepare_clusters(&self.bed);
        self.testbed(&["operator", "up", "source"]).await;
    }

    /// The length of the Redfish change log now: changes are counted from here.
    fn mark(&self) -> u64 {
        std::fs::metadata(&self.redfish_log).map(|m| m.len()).unwrap_or(0)
    }

    /// Machine-changing Redfish requests since `mark`, in order.
    fn changes_since(&self, mark: u64) -> Vec<Change> {
        let text = std::fs::read(&self.redfish_log).unwrap_or_default();
        let text = String::from_utf8_lossy(&text[(mark as usize).min(text.len())..]).into_owned();
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str::<Change>(l).expect("redfish-proxy log line"))
            .filter(|c| c.change)
            .collect()
    }
}

/// What the operators' logs say they did (their debug lines), per cluster, since `marks`: for
/// the record only; the tests assert on the Redfish requests the proxy saw.
const ACTIONS: &[(&str, &str)] = &[
    ("Server Power On", "power on"),
    ("Server Power Off", "power off"),
    ("Set PXE Boot for Server", "PXE boot for discovery"),
    ("Server is powered off, booting Server in PXE", "PXE boot for its claim"),
    ("Server claim not found, releasing server", "released a Server whose claim is gone"),
];

impl OpBed {
    fn operator_log(&self, cluster: &str) -> PathBuf {
        Path::new(&self.env["RESTATUS_STATE"]).join(format!("operator-{cluster}.log"))
    }

    fn log_marks(&self) -> [u64; 2] {
        ["source", "target"].map(|c| std::fs::metadata(self.operator_log(c)).map(|m| m.len()).unwrap_or(0))
    }

    fn actions_since(&self, marks: [u64; 2]) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for (cluster, mark) in ["source", "target"].into_iter().zip(marks) {
            let text = std::fs::read(self.operator_log(cluster)).unwrap_or_default();
            let text = String::from_utf8_lossy(&text[(mark as usize).min(text.len())..]).into_owned();
            for line in text.lines() {
                if let Some((_, action)) = ACTIONS.iter().find(|(needle, _)| line.contains(&format!("\t{needle}\t"))) {
                    *out.entry(format!("{cluster}: {action}")).or_insert(0) += 1;
                }
            }
        }
        out
    }

    /// Prints a line of a scenario's results and keeps it in `scenarios.log` of the test bed
    /// (cargo shows a passing test's output only with `--nocapture`).
    fn say(&self, line: String) {
        eprintln!("{line}");
        let path = Path::new(&self.env["RESTATUS_STATE"]).join("scenarios.log");
        if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            use std::io::Write;
            let _ = writeln!(file, "{line}");
        }
    }
}

fn testbed_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testbed")
}

#[derive(serde::Deserialize, Debug, Clone)]
struct Change {
    time: String,
    mock: String,
    method: String,
    path: String,
    body: String,
    change: bool,
}

impl Change {
    /// `POST ComputerSystem.Reset {"ResetType":"On"}`, `PATCH Systems/X {...}`.
    fn short(&self) -> String {
        let what = self
            .path
            .rsplit_once("/Actions/")
            .map_or_else(|| self.path.trim_start_matches("/redfish/v1/").to_string(), |(_, action)| action.to_string());
        format!("{} {what} {}", self.method, self.body.split_whitespace().collect::<String>())
    }
}

/// Every metal-operator object of earlier scenarios, finalizers dropped, deleted.
async fn purge(client: &kube::Client) {
    for (kind, plural) in [
        ("ServerClaim", "serverclaims"),
        ("ServerBootConfiguration", "serverbootconfigurations"),
        ("Server", "servers"),
        ("BMC", "bmcs"),
        ("BMCSecret", "bmcsecrets"),
    ] {
        for object in api(client, METAL, kind, plural, None).list(&ListParams::default()).await.unwrap() {
            let ns = object.metadata.namespace.as_deref();
            let name = object.metadata.name.clone().unwrap();
            let api = api(client, METAL, kind, plural, ns);
            if object.metadata.finalizers.as_ref().is_some_and(|f| !f.is_empty()) {
                let drop = json!({"metadata": {"finalizers": null}});
                let _ = api.patch(&name, &PatchParams::default(), &Patch::Merge(&drop)).await;
            }
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    }
}

/// What a boot operator would do, and nothing else: every ServerBootConfiguration metal-operator
/// set to `Pending` becomes `Ready`. Those of the fleet's namespace also get the fleet label.
struct BootStandIn {
    task: tokio::task::JoinHandle<()>,
}

impl BootStandIn {
    fn start(client: kube::Client, ns: String, fleet: String) -> BootStandIn {
        let task = tokio::spawn(async move {
            let all = api(&client, METAL, "ServerBootConfiguration", "serverbootconfigurations", None);
            loop {
                if let Ok(list) = all.list(&ListParams::default()).await {
                    for sbc in list {
                        let pending = sbc.data["status"]["state"] == "Pending";
                        let (name, sbc_ns) = (sbc.metadata.name.clone().unwrap(), sbc.metadata.namespace.clone());
                        let api = api(
                            &client,
                            METAL,
                            "ServerBootConfiguration",
                            "serverbootconfigurations",
                            sbc_ns.as_deref(),
                        );
                        let labelled = sbc.metadata.labels.as_ref().is_some_and(|l| l.contains_key(FLEET_LABEL));
                        if sbc_ns.as_deref() == Some(ns.as_str()) && !labelled {
                            let label = json!({"metadata": {"labels": {FLEET_LABEL: fleet}}});
                            let _ = api.patch(&name, &PatchParams::default(), &Patch::Merge(&label)).await;
                        }
                        if pending {
                            let ready = json!({"status": {"state": "Ready"}});
                            let _ = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&ready)).await;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        BootStandIn { task }
    }
}

impl Drop for BootStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The `status.state` of each Server of a fleet as it changes, from a watch.
struct StateLog {
    states: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StateLog {
    fn start(client: &kube::Client, fleet: &str) -> StateLog {
        let states: Arc<Mutex<BTreeMap<String, Vec<String>>>> = Arc::default();
        let api = api(client, METAL, "Server", "servers", None);
        let config = watcher::Config::default().labels(&format!("{FLEET_LABEL}={fleet}"));
        let sink = states.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(api, config).boxed();
            while let Some(Ok(event)) = events.next().await {
                let objects = match event {
                    watcher::Event::Apply(o) | watcher::Event::InitApply(o) => vec![o],
                    _ => vec![],
                };
                for o in objects {
                    let state = o.data["status"]["state"].as_str().unwrap_or("(none)").to_string();
                    let mut states = sink.lock().unwrap();
                    let seen = states.entry(o.metadata.name.clone().unwrap()).or_default();
                    if seen.last() != Some(&state) {
                        seen.push(state);
                    }
                }
            }
        });
        StateLog { states, task }
    }

    fn stop(self) -> BTreeMap<String, Vec<String>> {
        self.task.abort();
        self.states.lock().unwrap().clone()
    }
}

/// Status of every fleet object (and the claims' ServerBootConfigurations) by `Kind name`.
async fn statuses(client: &kube::Client, fleet: &str, ns: &str) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let by_label = ListParams::default().labels(&format!("{FLEET_LABEL}={fleet}"));
    for (kind, plural, namespaced) in [
        ("BMC", "bmcs", false),
        ("Server", "servers", false),
        ("ServerClaim", "serverclaims", true),
        ("ServerBootConfiguration", "serverbootconfigurations", true),
    ] {
        let api = api(client, METAL, kind, plural, namespaced.then_some(ns));
        for o in api.list(&by_label).await.unwrap() {
            out.insert(format!("{kind} {}", o.metadata.name.clone().unwrap()), o.data["status"].clone());
        }
    }
    out
}

/// Annotations of every fleet object, by `Kind name`.
async fn annotations(client: &kube::Client, fleet: &str, ns: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let by_label = ListParams::default().labels(&format!("{FLEET_LABEL}={fleet}"));
    for (kind, plural, namespaced) in [
        ("BMC", "bmcs", false),
        ("Server", "servers", false),
        ("ServerClaim", "serverclaims", true),
        ("ServerBootConfiguration", "serverbootconfigurations", true),
    ] {
        for o in api(client, METAL, kind, plural, namespaced.then_some(ns)).list(&by_label).await.unwrap() {
            out.insert(
                format!("{kind} {}", o.metadata.name.clone().unwrap()),
                o.metadata.annotations.unwrap_or_default(),
            );
        }
    }
    out
}

/// A Machine of the workload cluster, its IroncoreMetalMachine and the ServerClaim it controls,
/// for `server`; returns the claim's name.
async fn bind(source: &kube::Client, ns: &str, fleet: &str, cluster_uid: &str, i: usize, server: &str) -> String {
    let machine = format!("{fleet}-m{i}");
    let machine_uid = create(source, "machines", json!({
        "apiVersion": CAPI, "kind": "Machine",
        "metadata": {"name": machine, "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": "workload"},
                     "ownerReferences": owner(CAPI, "Cluster", "workload", cluster_uid, false)},
        "spec": {"clusterName": "workload", "bootstrap": {"dataSecretName": format!("{machine}-bootstrap")},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "IroncoreMetalMachine", "name": machine}},
    }), Some(json!({"nodeRef": {"name": format!("node-{i}")}, "phase": "Running"}))).await;
    let imm_uid = create(
        source,
        "ironcoremetalmachines",
        json!({
            "apiVersion": INFRA, "kind": "IroncoreMetalMachine",
            "metadata": {"name": machine, "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": "workload"},
                         "ownerReferences": owner(CAPI, "Machine", &machine, &machine_uid, true)},
            "spec": {"image": "ghcr.io/ironcore-dev/os-images/gardenlinux:1877.0"},
        }),
        Some(json!({"ready": true})),
    )
    .await;
    create(source, "serverclaims", json!({
        "apiVersion": METAL, "kind": "ServerClaim",
        "metadata": {"name": machine, "namespace": ns, "labels": {FLEET_LABEL: fleet},
                     "ownerReferences": owner(INFRA, "IroncoreMetalMachine", &machine, &imm_uid, true)},
        "spec": {"power": "On", "serverRef": {"name": server}, "image": "ghcr.io/ironcore-dev/os-images/gardenlinux:1877.0"},
    }), None).await;
    machine
}

/// The fleet the operator made on the source, settled: `BOUND` Servers Reserved by Bound
/// claims and powered on, the others Available and off, one claim Unbound.
struct Fleet {
    ob: OpBed,
    name: String,
    ns: String,
    servers: Vec<String>,
    cluster_uid: String,
    storage: String,
    _boot: BootStandIn,
}

impl Fleet {
    /// What a scenario did, from `marks` (Redfish log, operator logs) on: the Redfish changes,
    /// the operators' actions, the states the target's Servers went through (`states`), and the
    /// statuses on the target now against `before`.
    async fn outcome(
        &self,
        scenario: &'static str,
        (mark, logs): (u64, [u64; 2]),
        states: StateLog,
        before: BTreeMap<String, Value>,
    ) -> Outcome {
        let target = self.ob.bed.target().await;
        Outcome {
            scenario,
            changes: self.ob.changes_since(mark),
            actions: self.ob.actions_since(logs),
            states: states.stop(),
            after: statuses(&target, &self.name, &self.ns).await,
            before,
        }
    }

    async fn build(tag: &str) -> Fleet {
        let started = Instant::now();
        let ob = OpBed::up().await;
        ob.reset().await;
        let source = ob.bed.source().await;
        let name = unique(&format!("op{tag}"));
        let ns = name.clone();
        assert_success(&ob.bed.kubectl(&ob.bed.source_kubeconfig, &["create", "namespace", &ns]), "create namespace");
        let boot = BootStandIn::start(source.clone(), ns.clone(), name.clone());
        let moved = json!({ FLEET_LABEL: name, MOVE_LABEL: "" });

        // BMCs and their secret; the operator discovers each BMC's system and makes its Server.
        let secret = format!("{name}-bmc");
        create(
            &source,
            "bmcsecrets",
            json!({
                "apiVersion": METAL, "kind": "BMCSecret", "metadata": {"name": secret, "labels": moved},
                "data": {"username": "YWRtaW4=", "password": "YWRtaW4="},
            }),
            None,
        )
        .await;
        let mut servers = Vec::new();
        for (i, endpoint) in ob.endpoints.iter().enumerate() {
            let (ip, port) = endpoint.split_once(':').unwrap();
            let bmc = format!("{name}-bmc-{i}");
            create(
                &source,
                "bmcs",
                json!({
                    "apiVersion": METAL, "kind": "BMC", "metadata": {"name": bmc, "labels": moved},
                    "spec": {"access": {"ip": ip, "macAddress": format!("02:00:5e:10:00:{i:02x}")},
                             "protocol": {"name": "Redfish", "port": port.parse::<u16>().unwrap(), "scheme": "http"},
                             "bmcSecretRef": {"name": secret}},
                }),
                None,
            )
            .await;
            servers.push(format!("{bmc}-system-0"));
        }
        let server_api = api(&source, METAL, "Server", "servers", None);
        let state_of = async |api: &Api<DynamicObject>, name: &str| {
            api.get_opt(name).await.unwrap().map(|s| s.data["status"]["state"].as_str().unwrap_or("").to_string())
        };
        wait_for(
            "the operator discovers every BMC's system and starts its discovery",
            Duration::from_secs(180),
            async || {
                for s in &servers {
                    if state_of(&server_api, s).await.as_deref() != Some("Discovery") {
                        return false;
                    }
                }
                true
            },
        )
        .await;

        let discovering = started.elapsed();

        // Discovery: the probe agent reports the inventory to the source manager's registry.
        let registry = ob.env["RESTATUS_OPERATOR_REGISTRY_SOURCE"].clone();
        let mut probes = Vec::new();
        for s in &servers {
            let uuid = server_api.get(s).await.unwrap().data["spec"]["systemUUID"].as_str().unwrap().to_string();
            let probe = Command::new(ob.bin("metalprobe"))
                .args(["--registry-url", &registry, "--server-uuid", &uuid, "--lldp-sync-duration", "1s"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            probes.push(Reaped(probe));
        }
        wait_for("every Server discovered: Available and powered off", Duration::from_secs(180), async || {
            for s in &servers {
                let server = server_api.get(s).await.unwrap();
                if server.data["status"]["state"] != "Available" || server.data["status"]["powerState"] != "Off" {
                    return false;
                }
            }
            true
        })
        .await;
        drop(probes);
        let discovered = started.elapsed();

        // The workload cluster: Cluster, IroncoreMetalCluster, and per bound Server a Machine, its
        // IroncoreMetalMachine and the ServerClaim it controls; plus one claim nothing matches.
        let cluster_uid = create(&source, "clusters", json!({
            "apiVersion": CAPI, "kind": "Cluster", "metadata": {"name": "workload", "namespace": ns},
            "spec": {"controlPlaneEndpoint": {"host": "10.0.0.10", "port": 6443},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "IroncoreMetalCluster", "name": "workload"}},
        }), Some(json!({
            "initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true}, "phase": "Provisioned",
            "conditions": [condition("ControlPlaneInitialized"), condition("InfrastructureReady")],
        }))).await;
        create(&source, "ironcoremetalclusters", json!({
            "apiVersion": INFRA, "kind": "IroncoreMetalCluster",
            "metadata": {"name": "workload", "namespace": ns, "ownerReferences": owner(CAPI, "Cluster", "workload", &cluster_uid, false)},
            "spec": {"controlPlaneEndpoint": {"host": "10.0.0.10", "port": 6443}},
        }), Some(json!({"ready": true}))).await;
        let mut claims = Vec::new();
        for (i, server) in servers.iter().take(BOUND).enumerate() {
            claims.push(bind(&source, &ns, &name, &cluster_uid, i, server).await);
        }
        let waiting = format!("{name}-waiting");
        create(
            &source,
            "serverclaims",
            json!({
                "apiVersion": METAL, "kind": "ServerClaim",
                "metadata": {"name": waiting, "namespace": ns, "labels": {FLEET_LABEL: name, MOVE_LABEL: ""}},
                "spec": {"power": "On", "serverSelector": {"matchLabels": {"restatus.test/matches": "nothing"}},
                         "image": "ghcr.io/ironcore-dev/os-images/gardenlinux:1877.0"},
            }),
            None,
        )
        .await;
        claims.push(waiting.clone());

        let claim_api = api(&source, METAL, "ServerClaim", "serverclaims", Some(&ns));
        wait_for("claims Bound, their Servers Reserved and powered on", Duration::from_secs(180), async || {
            for (i, s) in servers.iter().enumerate() {
                let server = server_api.get(s).await.unwrap();
                let want = if i < BOUND { ("Reserved", "On") } else { ("Available", "Off") };
                if server.data["status"]["state"] != want.0 || server.data["status"]["powerState"] != want.1 {
                    return false;
                }
            }
            for c in &claims {
                let phase = claim_api.get(c).await.unwrap().data["status"]["phase"].clone();
                if phase != if *c == waiting { "Unbound" } else { "Bound" } {
                    return false;
                }
            }
            let sbcs = statuses(&source, &name, &ns).await;
            sbcs.iter().filter(|(k, _)| k.starts_with("ServerBootConfiguration ")).count() == BOUND
                && sbcs.iter().all(|(k, s)| !k.starts_with("ServerBootConfiguration ") || s["state"] == "Ready")
        })
        .await;

        let bound = started.elapsed();

        // Settled: the operator asks nothing more of the machines.
        let mark = ob.mark();
        tokio::time::sleep(Duration::from_secs(12)).await;
        let idle = ob.changes_since(mark);
        assert!(idle.is_empty(), "the settled fleet still changes machines: {idle:#?}");
        let storage = ob.bed.storage(&name);
        ob.say(format!(
            "[{tag}] fleet {name}: {} BMCs and Servers made by metal-operator in {:?} (discovery started {discovering:?}, \
             every Server Available {discovered:?}, claims Bound {bound:?}; quiet for 12 s)",
            servers.len(),
            started.elapsed()
        ));
        Fleet { ob, name, ns, servers, cluster_uid, storage, _boot: boot }
    }

    fn selector(&self) -> String {
        format!("{FLEET_LABEL}={}", self.name)
    }

    fn clusterctl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.ob.bin("clusterctl"));
        cmd.args(args)
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .env("XDG_CONFIG_HOME", self.ob.bed.scratch.path().join("clusterctl-config"));
        cmd
    }

    /// One more claim binds the first Available Server (`BOUND`), which the operator reserves
    /// and powers on; the Server's and the claim's names once it has.
    async fn bind_late(&self) -> (String, String) {
        let source = self.ob.bed.source().await;
        let late = self.servers[BOUND].clone();
        let late_claim = bind(&source, &self.ns, &self.name, &self.cluster_uid, BOUND, &late).await;
        let servers = api(&source, METAL, "Server", "servers", None);
        wait_for("the late claim's Server Reserved and on", Duration::from_secs(120), async || {
            let s = servers.get(&late).await.unwrap();
            s.data["status"]["state"] == "Reserved" && s.data["status"]["powerState"] == "On"
        })
        .await;
        (late, late_claim)
    }

    /// The namespace's specs written by `clusterctl move --to-directory` from the source; the
    /// directory.
    fn specs_to_directory(&self) -> PathBuf {
        let dir = self.ob.bed.scratch.path().join("specs");
        std::fs::create_dir_all(&dir).unwrap();
        let mut backup =
            self.clusterctl(&["move", "-n", &self.ns, "--to-directory", dir.to_str().unwrap(), "--kubeconfig"]);
        backup.arg(&self.ob.bed.source_kubeconfig);
        assert_success(&backup.output().unwrap(), "clusterctl move --to-directory");
        dir
    }

    /// The real `clusterctl move` of the fleet's namespace, in the background.
    fn start_move(&self) -> std::thread::JoinHandle<std::process::Output> {
        let mut cmd = self.clusterctl(&["move", "-n", &self.ns]);
        cmd.arg("--kubeconfig")
            .arg(&self.ob.bed.source_kubeconfig)
            .arg("--to-kubeconfig")
            .arg(&self.ob.bed.target_kubeconfig);
        std::thread::spawn(move || cmd.output().unwrap())
    }

    async fn clusterctl_move(&self) -> Duration {
        let started = Instant::now();
        let mover = self.start_move();
        let out = tokio::task::spawn_blocking(move || mover.join().unwrap()).await.unwrap();
        assert_success(&out, "clusterctl move");
        started.elapsed()
    }

    /// A restatus child process (a controller) against `kubeconfig`.
    fn restatus_child(&self, kubeconfig: &Path, args: &[&str]) -> Reaped {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // Kept with the test bed's logs, for a look after a failure.
        let log = Path::new(&self.ob.env["RESTATUS_STATE"]).join(format!("restatus-{}-{}.log", self.name, args[0]));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        Reaped(
            Command::new(env!("CARGO_BIN_EXE_restatus"))
                .args(args)
                .args(["--selector", &self.selector(), "--http-addr", &format!("127.0.0.1:{port}")])
                .args(["--lease-namespace", "default", "--lease-name", &unique("lease"), "--kubeconfig"])
                .arg(kubeconfig)
                .env("RESTATUS_STORAGE", &self.storage)
                .env("RESTATUS_CLUSTER_ID", &self.name)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }

    /// The move handshake on the source (`controller --role source`), holding the Cluster.
    async fn handshake(&self) -> Reaped {
        let child = self.restatus_child(
            &self.ob.bed.source_kubeconfig,
            &["controller", "--role", "source", "--cluster-namespace", &self.ns, "--interval", "1s"],
        );
        let clusters = cluster_api(&self.ob.bed.source().await, &self.ns);
        wait_for("block-move on the Cluster", Duration::from_secs(30), async || {
            clusters
                .get("workload")
                .await
                .unwrap()
                .metadata
                .annotations
                .unwrap_or_default()
                .get(BLOCK_MOVE)
                .map(String::as_str)
                == Some("restatus")
        })
        .await;
        child
    }

    /// The restore controller on the target.
    fn restore_controller(&self) -> Reaped {
        self.restatus_child(&self.ob.bed.target_kubeconfig, &["controller", "--snapshot-refresh", "2s"])
    }

    /// `restatus journal` on the source, every second, its log with the test bed's logs.
    fn journal(&self) -> Reaped {
        let log = Path::new(&self.ob.env["RESTATUS_STATE"]).join(format!("restatus-{}-journal.log", self.name));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        Reaped(
            Command::new(env!("CARGO_BIN_EXE_restatus"))
                .args(["journal", "--selector", &self.selector(), "--journal-interval", "1s", "--kubeconfig"])
                .arg(&self.ob.bed.source_kubeconfig)
                .env("RESTATUS_STORAGE", &self.storage)
                .env("RESTATUS_CLUSTER_ID", &self.name)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }

    /// One-shot `restatus restore` on the target; its JSON report.
    fn restore(&self) -> Value {
        let args = ["restore", "--selector", &self.selector(), "-o", "json"];
        let out = self.ob.bed.restatus_with(&self.ob.bed.target_kubeconfig, &self.storage, &self.name, &args, &[]);
        assert_success(&out, "restatus restore");
        serde_json::from_str(&stdout(&out)).expect("restore -o json")
    }
}

/// What one scenario measured, printed as the rows docs/MOVE.md quotes.
struct Outcome {
    scenario: &'static str,
    changes: Vec<Change>,
    actions: BTreeMap<String, usize>,
    states: BTreeMap<String, Vec<String>>,
    before: BTreeMap<String, Value>,
    after: BTreeMap<String, Value>,
}

impl Outcome {
    /// The promise of scenarios 2 and 3: the operators changed no machine, no Server lost its
    /// state or inventory, no claim lost Bound, claims and Servers pair up on the target, and
    /// every status is as it was on the source.
    async fn assert_no_machine_touched_and_nothing_lost(&self, fx: &Fleet) {
        assert!(self.changes.is_empty(), "the move changed machines: {:#?}", self.changes);
        assert!(self.servers_changed().is_empty() && self.claims_unbound().is_empty());
        assert!(self.inventory_lost().is_empty());
        let target = fx.ob.bed.target().await;
        assert_paired(&self.after, &refs(&target, &fx.name, &fx.ns).await);
        assert_kept(&self.before, &self.after);
    }

    fn per_mock(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for c in &self.changes {
            *out.entry(c.mock.clone()).or_insert(0) += 1;
        }
        out
    }

    /// Servers not in the state they had before the move.
    fn servers_changed(&self) -> Vec<String> {
        self.before
            .iter()
            .filter(|(k, _)| k.starts_with("Server "))
            .filter(|(k, s)| self.after.get(*k).map(|a| &a["state"]) != Some(&s["state"]))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Claims that were Bound before the move and are not now.
    fn claims_unbound(&self) -> Vec<String> {
        self.before
            .iter()
            .filter(|(k, s)| k.starts_with("ServerClaim ") && s["phase"] == "Bound")
            .filter(|(k, _)| self.after.get(*k).map(|a| &a["phase"]) != Some(&json!("Bound")))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Servers whose discovered inventory (`status.networkInterfaces`) is not what it was.
    fn inventory_lost(&self) -> Vec<String> {
        self.before
            .iter()
            .filter(|(k, _)| k.starts_with("Server "))
            .filter(|(k, s)| self.after.get(*k).map(|a| &a["networkInterfaces"]) != Some(&s["networkInterfaces"]))
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn print(&self, ob: &OpBed) {
        let s = self.scenario;
        let mocks = self.per_mock();
        ob.say(format!("[{s}] Redfish changes: {} in total, per mock {mocks:?}", self.changes.len()));
        if let (Some(first), Some(last)) = (self.changes.first(), self.changes.last()) {
            ob.say(format!("[{s}]   from {} to {}", first.time, last.time));
        }
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for c in &self.changes {
            *kinds.entry(c.short()).or_insert(0) += 1;
        }
        for (what, n) in kinds {
            ob.say(format!("[{s}]   {n} x {what}"));
        }
        ob.say(format!("[{s}] the operators' logs: {:?}", self.actions));
        for (server, states) in &self.states {
            ob.say(format!("[{s}]   Server {server}: {}", states.join(" -> ")));
        }
        ob.say(format!(
            "[{s}] Servers whose state changed: {}, Bound claims unbound: {}, Servers without their inventory: {}",
            self.servers_changed().len(),
            self.claims_unbound().len(),
            self.inventory_lost().len()
        ));
    }
}

/// Every Bound claim's Server points back at it and is Reserved.
fn assert_paired(after: &BTreeMap<String, Value>, specs: &BTreeMap<String, (Option<String>, Option<String>)>) {
    for (name, status) in after.iter().filter(|(k, _)| k.starts_with("ServerClaim ")) {
        if status["phase"] != "Bound" {
            continue;
        }
        let claim = name.trim_start_matches("ServerClaim ");
        let server = specs[name].0.clone().unwrap_or_else(|| panic!("{name} is Bound without spec.serverRef"));
        let key = format!("Server {server}");
        assert_eq!(after[&key]["state"], "Reserved", "{key}, bound by {claim}");
        assert_eq!(specs[&key].1.as_deref(), Some(claim), "{key}: spec.serverClaimRef");
    }
}

/// `spec.serverRef` of claims and `spec.serverClaimRef` of Servers, by `Kind name`.
async fn refs(client: &kube::Client, fleet: &str, ns: &str) -> BTreeMap<String, (Option<String>, Option<String>)> {
    let by_label = ListParams::default().labels(&format!("{FLEET_LABEL}={fleet}"));
    let mut out = BTreeMap::new();
    for o in api(client, METAL, "ServerClaim", "serverclaims", Some(ns)).list(&by_label).await.unwrap() {
        let server = o.data["spec"]["serverRef"]["name"].as_str().map(String::from);
        out.insert(format!("ServerClaim {}", o.metadata.name.unwrap()), (server, None));
    }
    for o in api(client, METAL, "Server", "servers", None).list(&by_label).await.unwrap() {
        let claim = o.data["spec"]["serverClaimRef"]["name"].as_str().map(String::from);
        out.insert(format!("Server {}", o.metadata.name.unwrap()), (None, claim));
    }
    out
}

/// Fields (dotted paths) in which two statuses differ.
fn differing_fields(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for key in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                let sub = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                differing_fields(&sub, x.get(key).unwrap_or(&Value::Null), y.get(key).unwrap_or(&Value::Null), out);
            }
        }
        _ if a != b => out.push(path.to_string()),
        _ => {}
    }
}

/// After restatus let go: every restored object keeps its status, but for the fields listed as
/// volatile.
fn assert_kept(before: &BTreeMap<String, Value>, after: &BTreeMap<String, Value>) {
    for (name, status) in before {
        let now = after.get(name).unwrap_or_else(|| panic!("{name} did not arrive on the target"));
        let mut fields = Vec::new();
        differing_fields("", status, now, &mut fields);
        let kind = name.split_once(' ').unwrap().0;
        fields.retain(|f| !VOLATILE.contains(&format!("{kind} {f}").as_str()));
        assert!(fields.is_empty(), "{name}: the operator rewrote {fields:?}\nbefore: {status}\nafter: {now}");
    }
}

/// Waits until every object of `before` has its status back on the target, released.
async fn wait_restored(fx: &Fleet, before: &BTreeMap<String, Value>, within: Duration) -> Duration {
    let started = Instant::now();
    let target = fx.ob.bed.target().await;
    loop {
        let now = statuses(&target, &fx.name, &fx.ns).await;
        let notes = annotations(&target, &fx.name, &fx.ns).await;
        let differ: Vec<String> = before
            .iter()
            .filter(|(k, s)| now.get(*k) != Some(*s))
            .map(|(k, s)| format!("{k}: before {s}, now {}", now.get(k).map_or("absent".into(), Value::to_string)))
            .collect();
        let held: Vec<&String> = notes
            .iter()
            .filter(|(_, a)| a.contains_key(QUIESCED_BY_ANNOTATION) || a.contains_key(OPERATION_ANNOTATION))
            .map(|(k, _)| k)
            .collect();
        if differ.is_empty() && held.is_empty() {
            return started.elapsed();
        }
        // What is still missing, so that a timeout says why (the controller's log is kept
        // with the operator bed's logs).
        assert!(
            started.elapsed() < within,
            "every status restored and released on the target: not within {within:?}\n\
             statuses that differ: {differ:#?}\nstill held: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn without_restatus_the_move_makes_metal_operator_rediscover_reserved_servers() {
    let _bed = OPERATOR_BED.lock().await;
    let fx = Fleet::build("1").await;
    let (source, target) = (fx.ob.bed.source().await, fx.ob.bed.target().await);
    fx.ob.testbed(&["operator", "up", "target"]).await;
    let _boot = BootStandIn::start(target.clone(), fx.ns.clone(), fx.name.clone());
    let before = statuses(&source, &fx.name, &fx.ns).await;
    let states = StateLog::start(&target, &fx.name);
    let (mark, logs) = (fx.ob.mark(), fx.ob.log_marks());

    let took = fx.clusterctl_move().await;
    tokio::time::sleep(SETTLE).await;
    let outcome = fx.outcome("1 without restatus", (mark, logs), states, before).await;
    fx.ob.say(format!("[1] clusterctl move took {took:?}; operators watched for {SETTLE:?} after it"));
    outcome.print(&fx.ob);

    // The loss, as users fear it. Should a metal-operator release keep these, this test fails
    // and docs/MOVE.md must change.
    assert!(!outcome.changes.is_empty(), "the operators changed no machine");
    assert_eq!(outcome.servers_changed().len(), fx.servers.len(), "every Server lost its state");
    assert_eq!(outcome.claims_unbound().len(), BOUND, "every Bound claim lost Bound");
    assert!(!outcome.inventory_lost().is_empty(), "the discovered inventory is gone");
}

#[tokio::test]
async fn with_the_handshake_metal_operator_on_the_target_changes_no_machine() {
    let _bed = OPERATOR_BED.lock().await;
    let fx = Fleet::build("2").await;
    let (source, target) = (fx.ob.bed.source().await, fx.ob.bed.target().await);
    // The target is ready before the move: its operator runs, the restore controller waits.
    fx.ob.testbed(&["operator", "up", "target"]).await;
    let _boot = BootStandIn::start(target.clone(), fx.ns.clone(), fx.name.clone());
    let _restorer = fx.restore_controller();
    let _handshake = fx.handshake().await;
    let before = statuses(&source, &fx.name, &fx.ns).await;
    let states = StateLog::start(&target, &fx.name);
    let (mark, logs) = (fx.ob.mark(), fx.ob.log_marks());

    let took = fx.clusterctl_move().await;
    let restored_in = wait_restored(&fx, &before, Duration::from_secs(90)).await;
    tokio::time::sleep(SETTLE).await;
    let outcome = fx.outcome("2 handshake", (mark, logs), states, before).await;
    fx.ob.say(format!("[2] clusterctl move took {took:?}; every status back and released {restored_in:?} after it"));
    outcome.print(&fx.ob);

    outcome.assert_no_machine_touched_and_nothing_lost(&fx).await;
}

#[tokio::test]
async fn a_one_shot_restore_before_metal_operator_starts_on_the_target_changes_no_machine() {
    let _bed = OPERATOR_BED.lock().await;
    let fx = Fleet::build("3").await;
    let (source, target) = (fx.ob.bed.source().await, fx.ob.bed.target().await);
    let _handshake = fx.handshake().await;
    let before = statuses(&source, &fx.name, &fx.ns).await;
    let (mark, logs) = (fx.ob.mark(), fx.ob.log_marks());

    let took = fx.clusterctl_move().await;
    let started = Instant::now();
    let report = fx.restore();
    let restored_in = started.elapsed();
    // Only now does the target get its operator (and a boot operator).
    fx.ob.testbed(&["operator", "up", "target"]).await;
    let states = StateLog::start(&target, &fx.name);
    let _boot = BootStandIn::start(target.clone(), fx.ns.clone(), fx.name.clone());
    tokio::time::sleep(SETTLE).await;
    let outcome = fx.outcome("3 one-shot restore", (mark, logs), states, before).await;
    fx.ob.say(format!("[3] clusterctl move took {took:?}; restore {restored_in:?}: {}", report["counts"]));
    outcome.print(&fx.ob);

    outcome.assert_no_machine_touched_and_nothing_lost(&fx).await;
}

#[tokio::test]
async fn after_losing_the_source_the_last_snapshot_restores_the_fleet_and_holds_what_changed_since() {
    let _bed = OPERATOR_BED.lock().await;
    let fx = Fleet::build("4").await;
    let (source, target) = (fx.ob.bed.source().await, fx.ob.bed.target().await);

    // The last scheduled snapshot (what `restatus schedule` or the CronJob of manifests/base takes).
    let out = fx.ob.bed.restatus(&fx.storage, &fx.name, &["backup", "--selector", &fx.selector()]);
    assert_success(&out, "restatus backup");
    let snapshot = stdout(&out).trim().to_string();
    let (_, records) = crate::bed::records(&fx.ob.bed.store(&fx.storage, &fx.name), &snapshot).await;
    let in_snapshot: BTreeMap<String, Value> = records
        .iter()
        .map(|r| (format!("{} {}", r.kind, r.name), serde_json::from_str(r.status.get()).unwrap()))
        .collect();

    // After it, one more claim binds an Available Server, which the operator powers on.
    let (late, late_claim) = fx.bind_late().await;

    // The specs' backup, as clusterctl writes it (a Velero backup or a GitOps repository would do).
    let dir = fx.specs_to_directory();
    let at_loss = statuses(&source, &fx.name, &fx.ns).await;

    // The source is lost: its manager is gone, the machines run on.
    fx.ob.testbed(&["operator", "down", "source"]).await;
    let (mark, logs) = (fx.ob.mark(), fx.ob.log_marks());

    // Rebuilt, in the runbook's order: restore controller, then the specs, then the operator.
    let started = Instant::now();
    let _restorer = fx.restore_controller();
    let mut rebuild = fx.clusterctl(&["move", "--from-directory", dir.to_str().unwrap(), "--to-kubeconfig"]);
    rebuild.arg(&fx.ob.bed.target_kubeconfig);
    assert_success(&rebuild.output().unwrap(), "clusterctl move --from-directory");
    wait_for("every object of the snapshot restored", Duration::from_secs(90), async || {
        let now = statuses(&target, &fx.name, &fx.ns).await;
        in_snapshot.iter().all(|(k, s)| now.get(k) == Some(s))
    })
    .await;
    let restored_in = started.elapsed();
    let restored = statuses(&target, &fx.name, &fx.ns).await;
    // restatus keeps its ignore on the Server bound after the snapshot: a person decides.
    let quiesced = async || -> Vec<String> {
        let notes = annotations(&target, &fx.name, &fx.ns).await;
        notes.into_iter().filter(|(_, a)| a.contains_key(QUIESCED_BY_ANNOTATION)).map(|(k, _)| k).collect()
    };
    wait_for("everything released but what a person must decide", Duration::from_secs(60), async || {
        quiesced().await == [format!("Server {late}")]
    })
    .await;

    fx.ob.testbed(&["operator", "up", "target"]).await;
    let states = StateLog::start(&target, &fx.name);
    let _boot = BootStandIn::start(target.clone(), fx.ns.clone(), fx.name.clone());
    tokio::time::sleep(SETTLE).await;
    let while_held = fx.ob.changes_since(mark);

    // The runbook's step 5, by the person: the machine serves the late claim, so its Server
    // gets the status metal-operator would have written; then restatus's ignore goes.
    let servers = api(&target, METAL, "Server", "servers", None);
    let reserved = json!({"status": {"state": "Reserved", "powerState": "On"}});
    servers.patch_status(&late, &PatchParams::default(), &Patch::Merge(&reserved)).await.unwrap();
    let release = json!({"metadata": {"annotations": {OPERATION_ANNOTATION: null, QUIESCED_BY_ANNOTATION: null}}});
    servers.patch(&late, &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    tokio::time::sleep(SETTLE).await;
    let outcome = fx.outcome("4 disaster recovery", (mark, logs), states, at_loss.clone()).await;
    let stale: Vec<&String> = at_loss.iter().filter(|(k, s)| in_snapshot.get(*k) != Some(s)).map(|(k, _)| k).collect();
    let missing: Vec<&String> = at_loss.keys().filter(|k| !in_snapshot.contains_key(*k)).collect();
    fx.ob.say(format!(
        "[4] snapshot {snapshot}: {} of {} objects restored in {restored_in:?}; changed since the snapshot: {stale:?}; \
         not in it: {missing:?}; kept ignored for a person: Server {late}",
        in_snapshot.len(),
        at_loss.len()
    ));
    for (k, s) in restored.iter().filter(|(k, _)| stale.contains(k) && in_snapshot.contains_key(*k)) {
        fx.ob.say(format!("[4]   restored {k}: state {}, powerState {}", s["state"], s["powerState"]));
    }
    fx.ob.say(format!("[4] Redfish changes while that Server was held: {}", while_held.len()));
    outcome.print(&fx.ob);

    // Everything the snapshot holds came back; the one object the snapshot has wrong waited for
    // a person, and the machines were not touched.
    assert_eq!(missing.len(), 2, "the late claim and its ServerBootConfiguration: {missing:?}");
    assert!(stale.iter().any(|k| **k == format!("Server {late}")) && missing.iter().any(|k| k.ends_with(&late_claim)));
    assert!(outcome.changes.is_empty(), "the recovery changed machines: {:#?}", outcome.changes);
    for (name, status) in at_loss.iter().filter(|(k, _)| !stale.contains(k)) {
        assert_eq!(outcome.after.get(name), Some(status), "{name} lost its state");
    }
    assert!(outcome.servers_changed().is_empty() && outcome.claims_unbound().is_empty());
    assert!(outcome.inventory_lost().is_empty());
}

/// Issue 23: scenario 4 with the continuous journal on the source. The claim bound after the
/// last full snapshot reaches the bucket within seconds as journal segments; the source (its
/// operator and its journal, killed without a chance to finish) is then lost, and the target is
/// rebuilt in the runbook's order. The restore controller restores every status as the source
/// last had it, the late claim Bound on its Reserved Server included: nothing is held for a
/// person and no machine is touched. The operator is watched for `SETTLE` after it starts on
/// the target, as in the other scenarios.
#[tokio::test]
async fn after_losing_the_source_the_journal_restores_what_changed_since_the_last_snapshot() {
    let _bed = OPERATOR_BED.lock().await;
    let fx = Fleet::build("5").await;
    let (source, target) = (fx.ob.bed.source().await, fx.ob.bed.target().await);

    let out = fx.ob.bed.restatus(&fx.storage, &fx.name, &["backup", "--selector", &fx.selector()]);
    assert_success(&out, "restatus backup");
    let snapshot = stdout(&out).trim().to_string();
    let mut journal = fx.journal();

    // After the snapshot, one more claim binds an Available Server, which the operator powers on.
    let (late, late_claim) = fx.bind_late().await;
    let dir = fx.specs_to_directory();

    // The fleet settles; its last statuses reach the bucket (the journal's point), then the
    // source is lost: the journal is killed (no final segment) and the operator goes.
    let store = fx.ob.bed.store(&fx.storage, &fx.name);
    let base: restatus::format::SnapshotId = snapshot.parse().unwrap();
    let (manifest, base_records) = crate::bed::records(&store, &snapshot).await;
    let base_records = restatus::format::Records::from_records(base_records);
    let journaled = async || -> BTreeMap<String, Value> {
        let chain = store.read_chain(&base, manifest.created_at, None).await.unwrap();
        let applied = restatus::format::choose_point(&chain.links, None, true, false).map_or(0, |c| c.applied);
        let merged = restatus::format::point(&base_records, &chain.links[..applied]).unwrap();
        merged
            .iter()
            .map(|r| (format!("{} {}", r.kind, r.name), serde_json::from_str(r.status.get()).unwrap()))
            .collect()
    };
    let mut at_loss = statuses(&source, &fx.name, &fx.ns).await;
    let started = Instant::now();
    wait_for("the source's statuses in the journal", Duration::from_secs(60), async || {
        let point = journaled().await;
        let now = statuses(&source, &fx.name, &fx.ns).await;
        let caught_up = now.iter().all(|(k, s)| point.get(k) == Some(s));
        at_loss = now;
        caught_up
    })
    .await;
    let behind = started.elapsed();
    let _ = journal.0.kill();
    fx.ob.testbed(&["operator", "down", "source"]).await;
    let (mark, logs) = (fx.ob.mark(), fx.ob.log_marks());

    let started = Instant::now();
    let _restorer = fx.restore_controller();
    let mut rebuild = fx.clusterctl(&["move", "--from-directory", dir.to_str().unwrap(), "--to-kubeconfig"]);
    rebuild.arg(&fx.ob.bed.target_kubeconfig);
    assert_success(&rebuild.output().unwrap(), "clusterctl move --from-directory");
    wait_for("every status the source last had, restored", Duration::from_secs(90), async || {
        let now = statuses(&target, &fx.name, &fx.ns).await;
        at_loss.iter().all(|(k, s)| now.get(k) == Some(s))
    })
    .await;
    let restored_in = started.elapsed();
    wait_for("every object released", Duration::from_secs(60), async || {
        annotations(&target, &fx.name, &fx.ns).await.values().all(|a| !a.contains_key(QUIESCED_BY_ANNOTATION))
    })
    .await;

    fx.ob.testbed(&["operator", "up", "target"]).await;
    let states = StateLog::start(&target, &fx.name);
    let _boot = BootStandIn::start(target.clone(), fx.ns.clone(), fx.name.clone());
    tokio::time::sleep(SETTLE).await;
    let outcome = fx.outcome("5 disaster recovery with the journal", (mark, logs), states, at_loss.clone()).await;
    let segments = store.read_chain(&base, manifest.created_at, None).await.unwrap().links.len();
    fx.ob.say(format!(
        "[5] snapshot {snapshot} + {segments} journal segments: {} objects restored in {restored_in:?} \
         (the journal caught up {behind:?} after the fleet settled); claim {late_claim} on Server {late}: {} / {}",
        at_loss.len(),
        outcome.after.get(&format!("ServerClaim {late_claim}")).map_or(Value::Null, |s| s["phase"].clone()),
        outcome.after.get(&format!("Server {late}")).map_or(Value::Null, |s| s["state"].clone()),
    ));
    outcome.print(&fx.ob);

    assert!(at_loss.contains_key(&format!("ServerClaim {late_claim}")), "the late claim is in the fleet: {at_loss:?}");
    outcome.assert_no_machine_touched_and_nothing_lost(&fx).await;
}

/// Issue 21, item 4: a ServerClaim arrives on the target, and its Server only 30 s later. The
/// fleet arrives as a handshake delivers it (every object quiesced by restatus), rebuilt from
/// `clusterctl move --to-directory` without one bound Server's file; the target's operator and
/// restore controller run throughout. The claim, restored Bound, stays quiesced while its
/// Server is missing; the Server then arrives, is restored Reserved for it, and only after that
/// (by the API server's resourceVersions, which one etcd orders on the test bed) is the claim
/// released Bound. No machine is touched over the whole window.
///
/// 30 s is the delay and three of the test bed's operator resyncs (10 s): had the
/// claim been released Bound without its Server, the operator would have acted on it in that
/// window.
#[tokio::test]
async fn a_claim_that_arrives_before_its_server_stays_quiesced_until_the_server_is_reserved_for_it() {
    let _bed = OPERATOR_BED.lock().await;
    let fx = Fleet::build("5").await;
    let (source, target) = (fx.ob.bed.source().await, fx.ob.bed.target().await);
    let out = fx.ob.bed.restatus(&fx.storage, &fx.name, &["backup", "--selector", &fx.selector()]);
    assert_success(&out, "restatus backup");
    let before = statuses(&source, &fx.name, &fx.ns).await;

    // The specs, as the move carries them: every object of the profile quiesced by restatus.
    let dir = fx.specs_to_directory();
    fx.ob.testbed(&["operator", "down", "source"]).await;
    let (late, claim) = (fx.servers[0].clone(), format!("{}-m0", fx.name));
    let held_back = fx.ob.bed.scratch.path().join("late-server.json");
    let quiesce = [format!("{OPERATION_ANNOTATION}=ignore"), format!("{QUIESCED_BY_ANNOTATION}=restatus")];
    // clusterctl names each object's file `Kind_namespace_name.yaml` (JSON inside).
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let kind = file.split('_').next().unwrap_or_default();
        if !["BMC", "Server", "ServerClaim", "ServerBootConfiguration"].contains(&kind) {
            continue;
        }
        let mut annotate = std::process::Command::new(&fx.ob.bed.kubectl);
        annotate.args(["annotate", "--local", "--overwrite", "-o", "json", "-f"]).arg(&path).args(&quiesce);
        let annotated = annotate.output().unwrap();
        assert_success(&annotated, "kubectl annotate --local");
        let late_server = file == format!("Server__{late}.yaml");
        std::fs::write(if late_server { &held_back } else { &path }, &annotated.stdout).unwrap();
        if late_server {
            std::fs::remove_file(&path).unwrap();
        }
    }
    assert!(held_back.exists(), "Server {late} among the specs");

    let (mark, logs) = (fx.ob.mark(), fx.ob.log_marks());
    fx.ob.testbed(&["operator", "up", "target"]).await;
    let _boot = BootStandIn::start(target.clone(), fx.ns.clone(), fx.name.clone());
    let _restorer = fx.restore_controller();
    let states = StateLog::start(&target, &fx.name);
    let order = ReleaseOrder::start(&target, &fx.ns, &late, &claim);
    let mut rebuild = fx.clusterctl(&["move", "--from-directory", dir.to_str().unwrap(), "--to-kubeconfig"]);
    rebuild.arg(&fx.ob.bed.target_kubeconfig);
    assert_success(&rebuild.output().unwrap(), "clusterctl move --from-directory");

    let claims = api(&target, METAL, "ServerClaim", "serverclaims", Some(&fx.ns));
    let quiesced = async || {
        let c = claims.get(&claim).await.unwrap();
        c.metadata.annotations.unwrap_or_default().contains_key(QUIESCED_BY_ANNOTATION)
    };
    wait_for("the claim restored Bound on the target", Duration::from_secs(60), async || {
        claims.get(&claim).await.unwrap().data["status"]["phase"] == "Bound"
    })
    .await;
    // Its Server is missing by construction: nothing to wait for but the window itself.
    let window = Duration::from_secs(30);
    let arrived = Instant::now();
    while arrived.elapsed() < window {
        assert!(
            quiesced().await,
            "claim {claim} released {:?} after it was restored, its Server missing",
            arrived.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let create = fx.ob.bed.kubectl(&fx.ob.bed.target_kubeconfig, &["create", "-f", held_back.to_str().unwrap()]);
    assert_success(&create, "the late Server created");
    let restored_in = wait_restored(&fx, &before, Duration::from_secs(60)).await;
    let (reserved, released) = order.stop();
    tokio::time::sleep(SETTLE).await;
    let outcome = fx.outcome("5 claim before its Server", (mark, logs), states, before).await;
    fx.ob.say(format!(
        "[5] claim {claim} quiesced for {window:?} without its Server; Server {late} created, everything \
         released {restored_in:?} later; Server Reserved for it at resourceVersion {reserved}, claim released at {released}"
    ));
    outcome.print(&fx.ob);

    assert!(
        reserved < released,
        "the claim was released ({released}) before its Server was Reserved for it ({reserved})"
    );
    outcome.assert_no_machine_touched_and_nothing_lost(&fx).await;
}

/// From a watch of the target: the resourceVersion at which Server `server` was first seen
/// `Reserved` for claim `claim`, and the one at which the claim was first seen without
/// restatus's quiesce. One etcd serves the test bed's API server, so its resourceVersions
/// (etcd revisions) order the two.
struct ReleaseOrder {
    seen: Arc<Mutex<(u64, u64)>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ReleaseOrder {
    fn start(client: &kube::Client, ns: &str, server: &str, claim: &str) -> ReleaseOrder {
        let seen: Arc<Mutex<(u64, u64)>> = Arc::new(Mutex::new((u64::MAX, u64::MAX)));
        let rv =
            |o: &DynamicObject| o.metadata.resource_version.as_deref().and_then(|v| v.parse().ok()).unwrap_or(u64::MAX);
        let mut tasks = Vec::new();
        let servers = api(client, METAL, "Server", "servers", None);
        let (sink, name, claim_name) = (seen.clone(), server.to_string(), claim.to_string());
        tasks.push(tokio::spawn(async move {
            let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
            let mut events = watcher(servers, config).boxed();
            while let Some(Ok(event)) = events.next().await {
                if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = event
                    && o.data["status"]["state"] == "Reserved"
                    && o.data["spec"]["serverClaimRef"]["name"] == claim_name.as_str()
                {
                    let mut seen = sink.lock().unwrap();
                    seen.0 = seen.0.min(rv(&o));
                }
            }
        }));
        let claims = api(client, METAL, "ServerClaim", "serverclaims", Some(ns));
        let (sink, name) = (seen.clone(), claim.to_string());
        tasks.push(tokio::spawn(async move {
            let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
            let mut events = watcher(claims, config).boxed();
            while let Some(Ok(event)) = events.next().await {
                if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = event
                    && !o.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(QUIESCED_BY_ANNOTATION))
                {
                    let mut seen = sink.lock().unwrap();
                    seen.1 = seen.1.min(rv(&o));
                }
            }
        }));
        ReleaseOrder { seen, tasks }
    }

    /// (Server Reserved for the claim, claim released); `u64::MAX` for what was not seen.
    fn stop(self) -> (u64, u64) {
        for task in &self.tasks {
            task.abort();
        }
        *self.seen.lock().unwrap()
    }
}

/// Issue 21, item 5 (F57, F62) with metal-operator: a person asks for a reset of a Reserved
/// Server (`metal.ironcore.dev/operation: hard-restart-server`) while the move handshake is
/// quiescing. The handshake's quiesce of that Server is held back (an admission policy on the
/// source refuses restatus's `ignore` on it) until the source's operator has consumed the
/// reset; then the policy goes, the quiesce finishes, clusterctl moves, the restore controller
/// and the target's operator take over. The machine is reset exactly once, by the source's
/// operator (before F57 the consumed reset could be kept in `operation-was` and replayed by
/// the target's release: a second reset), and the move changes no machine after it (the
/// source's operator may power the machine on again right after its reset, see `resets`). Watched
/// until every status is back and released, and `SETTLE` (two and a half operator resyncs)
/// more, as the other scenarios are.
#[tokio::test]
async fn a_reset_asked_for_during_the_handshake_happens_once() {
    let _bed = OPERATOR_BED.lock().await;
    let fx = Fleet::build("6").await;
    let (source, target) = (fx.ob.bed.source().await, fx.ob.bed.target().await);
    fx.ob.testbed(&["operator", "up", "target"]).await;
    let _boot = BootStandIn::start(target.clone(), fx.ns.clone(), fx.name.clone());
    let _restorer = fx.restore_controller();
    let server = fx.servers[0].clone();
    let servers = api(&source, METAL, "Server", "servers", None);
    let unquiesced =
        format!("!has(object.metadata.annotations) || !('{QUIESCED_BY_ANNOTATION}' in object.metadata.annotations)");
    let policy = crate::bed::InjectedPolicy::deny_updates(
        &fx.ob.bed,
        &fx.ob.bed.source_kubeconfig,
        &format!("{}-reset", fx.name),
        "[servers]",
        &format!("object.metadata.name == '{server}'"),
        &unquiesced,
    )
    .await;
    let _handshake = fx.handshake().await;
    let (mark, logs) = (fx.ob.mark(), fx.ob.log_marks());
    // A restart, not a power-on: the mock passes through Off for 50 ms while it restarts, and a
    // source operator that looks in that window powers the machine on again (its own reaction,
    // before the move; the check on `later` below keeps the move from changing anything).
    let resets = |changes: &[Change]| {
        let restart = ["ForceRestart", "GracefulRestart", "PowerCycle", "Nmi"];
        changes
            .iter()
            .filter(|c| c.path.ends_with("ComputerSystem.Reset"))
            .filter(|c| restart.iter().any(|r| c.body.contains(&format!("\"ResetType\":\"{r}\""))))
            .count()
    };

    // clusterctl pauses the Cluster; the handshake takes its final snapshot and quiesces all
    // but the held-back Server.
    let mover = fx.start_move();
    let clusters = cluster_api(&source, &fx.ns);
    let final_snapshot = restatus::domain::annotations::FINAL_SNAPSHOT_ANNOTATION;
    wait_for("the final snapshot taken, the quiesce held back", Duration::from_secs(90), async || {
        let cluster = clusters.get("workload").await.unwrap();
        let held = servers.get(&server).await.unwrap().metadata.annotations.unwrap_or_default();
        cluster.metadata.annotations.unwrap_or_default().contains_key(final_snapshot)
            && !held.contains_key(QUIESCED_BY_ANNOTATION)
    })
    .await;
    // The person's reset, consumed by the source's operator (the annotation goes, the machine
    // is reset).
    let reset = json!({"metadata": {"annotations": {OPERATION_ANNOTATION: "hard-restart-server"}}});
    servers.patch(&server, &PatchParams::default(), &Patch::Merge(&reset)).await.unwrap();
    wait_for("the reset consumed by the source's operator", Duration::from_secs(60), async || {
        let annotations = servers.get(&server).await.unwrap().metadata.annotations.unwrap_or_default();
        !annotations.contains_key(OPERATION_ANNOTATION) && resets(&fx.ob.changes_since(mark)) >= 1
    })
    .await;
    let before = statuses(&source, &fx.name, &fx.ns).await;
    policy.remove(&fx.ob.bed);
    let states = StateLog::start(&target, &fx.name);
    let moved = tokio::task::spawn_blocking(move || mover.join().unwrap()).await.unwrap();
    assert_success(&moved, "clusterctl move");
    let after_move = fx.ob.mark();
    let restored_in = wait_restored(&fx, &before, Duration::from_secs(90)).await;
    tokio::time::sleep(SETTLE).await;
    let outcome = fx.outcome("6 reset during the handshake", (mark, logs), states, before).await;
    fx.ob.say(format!("[6] every status back and released {restored_in:?} after the move"));
    outcome.print(&fx.ob);

    assert_eq!(resets(&outcome.changes), 1, "the machine reset once, not again on the target: {:#?}", outcome.changes);
    let later = fx.ob.changes_since(after_move);
    assert!(later.is_empty(), "the move changed machines: {later:#?}");
    assert!(outcome.servers_changed().is_empty() && outcome.claims_unbound().is_empty());
    assert!(outcome.inventory_lost().is_empty());
}
