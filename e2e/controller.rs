//! The restore controller on the real target cluster: objects that appear without status get
//! it back within a second or so, metrics and probes answer, and its RBAC plus admission
//! policy allow exactly what it needs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams, PostParams};
use restatus::domain::annotations::{
    NOT_RESTORED_ANNOTATION, OPERATION_ANNOTATION, QUIESCED_BY_ANNOTATION, RESTORED_FROM_ANNOTATION,
};
use restatus::domain::identity::Profile;
use restatus::fleet::{self, FLEET_LABEL, FleetSpec};
use serde_json::json;

use crate::bed::{
    Bed, CountingProxy, ExtraApiServer, InjectedPolicy, QUIESCE_PATCH, TARGET, assert_stopped_cleanly, assert_success,
    audit_events, copy_snapshot, ensure_namespace, fleet_state, foreign_patches, forge, generate_age_keys,
    generate_keys, merge_patch, records, simulate_move, stderr, stdout, unique, wait_some_restored,
};

/// A controller to start: `ControllerRun::new(&bed, &storage, &cluster, &selector)`, on the
/// target, with a Lease of its own in a namespace of its own and a snapshot refresh every 2 s,
/// until said otherwise. Started as often as wanted (replicas, or one after another), each
/// start on a new port and, unless [`ControllerRun::lease_name`] names one, a new Lease.
#[derive(Clone)]
pub(crate) struct ControllerRun<'a> {
    bed: &'a Bed,
    kubeconfig: &'a Path,
    storage: String,
    cluster: String,
    selector: String,
    lease_namespace: String,
    /// The lease namespace is the run's own: created on the target when the controller starts.
    own_namespace: bool,
    lease_name: Option<String>,
    snapshot_refresh: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl<'a> ControllerRun<'a> {
    /// A controller of the objects `selector` selects, restoring them from the snapshots of
    /// `cluster` in `storage`.
    pub(crate) fn new(bed: &'a Bed, storage: &str, cluster: &str, selector: &str) -> Self {
        ControllerRun {
            bed,
            kubeconfig: &bed.target_kubeconfig,
            storage: storage.into(),
            cluster: cluster.into(),
            selector: selector.into(),
            lease_namespace: unique("lease-ns"),
            own_namespace: true,
            lease_name: None,
            snapshot_refresh: "2s".into(),
            args: vec![],
            env: vec![],
        }
    }

    /// Talks to the API server (and authenticates) as `kubeconfig` says.
    pub(crate) fn kubeconfig(self, kubeconfig: &'a Path) -> Self {
        ControllerRun { kubeconfig, ..self }
    }

    /// Its Lease in the namespace `namespace`, which exists.
    pub(crate) fn lease_namespace(self, namespace: &str) -> Self {
        ControllerRun { lease_namespace: namespace.into(), own_namespace: false, ..self }
    }

    /// Its Lease named `name`: every controller this run starts is a replica of one election.
    pub(crate) fn lease_name(self, name: &str) -> Self {
        ControllerRun { lease_name: Some(name.into()), ..self }
    }

    /// `--lease-duration`.
    pub(crate) fn lease_duration(self, duration: &str) -> Self {
        self.arg("--lease-duration", duration)
    }

    /// `--concurrency`: the objects written at a time.
    pub(crate) fn concurrency(self, objects: usize) -> Self {
        self.arg("--concurrency", &objects.to_string())
    }

    /// `--profile`: a profile file, or a built-in profile's name.
    pub(crate) fn profile(self, profile: &str) -> Self {
        self.arg("--profile", profile)
    }

    /// `--snapshot-refresh` (2 s unless said).
    pub(crate) fn snapshot_refresh(self, every: &str) -> Self {
        ControllerRun { snapshot_refresh: every.into(), ..self }
    }

    /// Any other flag of `restatus controller`, with its value.
    pub(crate) fn arg(mut self, flag: &str, value: &str) -> Self {
        self.args.extend([flag.to_string(), value.to_string()]);
        self
    }

    /// `name=value` in the controller's environment.
    pub(crate) fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// The label selector of the objects it restores.
    pub(crate) fn selector(&self) -> &str {
        &self.selector
    }

    /// The storage URL of the snapshots it restores from.
    pub(crate) fn storage(&self) -> &str {
        &self.storage
    }

    /// Starts a controller (its lease namespace created first if it is the run's own).
    pub(crate) async fn start(&self) -> Controller {
        if self.own_namespace {
            ensure_namespace(&self.bed.target().await, &self.lease_namespace).await;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let http_addr = format!("127.0.0.1:{port}");
        let lease_name = self.lease_name.clone().unwrap_or_else(|| unique("lease"));
        let mut args = vec!["controller", "--selector", &self.selector, "--lease-namespace", &self.lease_namespace];
        args.extend(["--lease-name", &lease_name, "--snapshot-refresh", &self.snapshot_refresh]);
        args.extend(["--http-addr", &http_addr]);
        args.extend(self.args.iter().map(String::as_str));
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (child, log) = self.bed.spawn(Bed::command(self.kubeconfig, &self.storage, &self.cluster, &args, &env));
        Controller { child, port, log }
    }

    /// [`ControllerRun::start`], and waits until the controller is ready.
    pub(crate) async fn start_ready(&self) -> Controller {
        let controller = self.start().await;
        controller.wait_ready().await;
        controller
    }
}

/// A controller a test started; killed when dropped.
pub(crate) struct Controller {
    child: Child,
    port: u16,
    pub(crate) log: PathBuf,
}

impl Controller {
    pub(crate) async fn get(&self, path: &str) -> Option<(u16, String)> {
        let out = Command::new("curl")
            .args(["-s", "-o", "-", "-w", "\n%{http_code}", &format!("http://127.0.0.1:{}{path}", self.port)])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n')?;
        Some((code.trim().parse().ok()?, body.to_string()))
    }

    pub(crate) async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some((200, _)) = self.get("/readyz").await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!(
            "controller not ready within 30 s; its log:\n{}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// SIGTERM, then waits for the exit without blocking the runtime: a test's in-process
    /// proxy must keep answering the controller while it shuts down.
    pub(crate) async fn stop(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "controller did not stop on SIGTERM");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// `spec`'s fleet created on the source (`concurrency` objects at a time) and backed up under
/// its own cluster id in a storage prefix of its own: a controller of the fleet to start.
async fn backed_up<'a>(bed: &'a Bed, spec: &FleetSpec, concurrency: usize) -> ControllerRun<'a> {
    fleet::create(&bed.source().await, spec, concurrency).await.unwrap();
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage(&spec.name);
    assert_success(&bed.restatus(&storage, &spec.name, &["backup", "--selector", &selector]), "backup");
    ControllerRun::new(bed, &storage, &spec.name, &selector)
}

/// Waits until every object of the fleet on the target has the source's status and no
/// quiesce annotation. Returns how long that took.
async fn wait_restored(bed: &Bed, fleet: &str, within: Duration) -> Duration {
    let started = Instant::now();
    let source = fleet_state(&bed.source().await, fleet).await;
    let target = bed.target().await;
    loop {
        let state = fleet_state(&target, fleet).await;
        let done = state.len() == source.len()
            && source.iter().all(|(name, (status, _))| {
                state.get(name).is_some_and(|(s, a)| s == status && !a.contains_key(QUIESCED_BY_ANNOTATION))
            });
        if done {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "not restored within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) fn metric(text: &str, name: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// Server `name` on the target loses its status (state and inventory), as a wiped object would.
async fn wipe_status(bed: &Bed, name: &str) {
    let target = bed.target().await;
    let servers = restatus::k8s::api_for(&target, Profile::metal_operator().kind("Server").unwrap(), None);
    let wiped = json!({"status": {"state": null, "networkInterfaces": null, "processors": null, "storages": null, "serialNumber": null}});
    servers.patch_status(name, &PatchParams::default(), &Patch::Merge(&wiped)).await.unwrap();
}

/// F48: a controller with nothing to do for over a minute keeps its watches. (Its client's read
/// timeout was 60 s: every quiet watch was cut each minute, logged and counted as an error.)
/// After 75 s of quiet no error is counted, no watch was interrupted, and a status wiped then
/// comes back through the same watches.
#[tokio::test]
async fn a_quiet_controller_keeps_its_watches_and_counts_no_error() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let spec = FleetSpec::new(&unique("quiet"), 2, 2, 1);
    let controller = backed_up(&bed, &spec, 4).await.start_ready().await;
    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;

    // Nothing may happen over 75 s: longer than the 60 s read timeout that cut every quiet
    // watch once a minute (each cut logged and counted), and than the minute between bookmarks.
    tokio::time::sleep(Duration::from_secs(75)).await;
    let (_, metrics) = controller.get("/metrics").await.unwrap();
    let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    assert_eq!(metric(&metrics, "restatus_errors_total"), 0.0, "{metrics}\n{log}");
    assert!(!log.contains("watch interrupted"), "{log}");

    wipe_status(&bed, &spec.server_name(1)).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(10)).await;
    assert!(controller.stop().await.success(), "controller exit on SIGTERM");
}

#[tokio::test]
async fn the_controller_restores_objects_as_they_appear() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let spec = FleetSpec::new(&unique("ctl"), 20, 20, 10);
    let controller = backed_up(&bed, &spec, 16).await.start_ready().await;
    assert_eq!(controller.get("/healthz").await.unwrap().0, 200);

    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    let took = wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;
    eprintln!("controller restored {} objects {took:?} after the move finished", spec.total());
    let state = fleet_state(&bed.target().await, &spec.name).await;
    assert!(
        state.values().all(|(_, a)| a.contains_key(RESTORED_FROM_ANNOTATION) && !a.contains_key(OPERATION_ANNOTATION))
    );

    // An object that loses its status later gets it back.
    wipe_status(&bed, &spec.server_name(5)).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(10)).await;

    let (code, metrics) = controller.get("/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        metric(&metrics, "restatus_decisions_total{verdict=\"restore\"}") >= spec.total() as f64 + 1.0,
        "{metrics}"
    );
    assert!(metric(&metrics, "restatus_snapshot_timestamp_seconds") > 1.7e9, "{metrics}");
    assert!(metric(&metrics, "restatus_restore_latency_seconds_count") >= spec.total() as f64, "{metrics}");
    assert_eq!(metric(&metrics, "restatus_leader"), 1.0);
    assert!(controller.stop().await.success(), "controller exit on SIGTERM");
}

#[tokio::test]
async fn the_controller_rbac_is_sufficient_and_nothing_more() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let kubeconfig = bed.deploy(&bed.target_kubeconfig, &["controller"], "restatus-controller");
    // manifests/controller stands alone: no backup CronJob comes with it to the target.
    let cronjobs = bed.kubectl(&bed.target_kubeconfig, &["-n", "restatus", "get", "cronjobs", "-o", "name"]);
    assert_success(&cronjobs, "get cronjobs");
    assert_eq!(stdout(&cronjobs).trim(), "", "a CronJob reached the target");

    // Sufficient: the controller, as this ServiceAccount, restores a moved fleet.
    let spec = FleetSpec::new(&unique("rbac"), 4, 4, 2);
    let run = backed_up(&bed, &spec, 8).await.kubeconfig(&kubeconfig);
    let controller = run.lease_namespace("restatus").start_ready().await;
    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;
    assert!(controller.stop().await.success());

    // Nothing more: no spec, label or foreign annotation writes; no creates, deletes, Secrets.
    let server = format!("servers.metal.ironcore.dev/{}", spec.server_name(0));
    let mut denied = foreign_patches(&server);
    denied.extend([
        vec!["delete", &server],
        vec!["get", "secrets", "-A"],
        vec!["-n", "restatus", "get", "secret", "restatus-s3-readonly"],
        vec!["get", "bmcsecrets.metal.ironcore.dev"],
        vec!["create", "namespace", "nope"],
    ]);
    bed.assert_denied(&kubeconfig, &denied);
    let release = r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":null,"restatus.ironcore.dev/quiesced-by":null}}}"#;
    let allowed = [merge_patch(None, &server, QUIESCE_PATCH), merge_patch(None, &server, release)];
    bed.assert_allowed(&kubeconfig, &allowed);
    // Replaces, as the controller makes them: the status subresource, and the object with
    // only restatus's annotations changed; a replace that changes the spec is denied, and
    // the status may not be patched (nor read: kubectl's status patch would GET it first).
    let as_controller = restatus::k8s::client(Some(&kubeconfig), None).await.unwrap();
    let servers = restatus::k8s::api_for(&as_controller, Profile::metal_operator().kind("Server").unwrap(), None);
    let name = spec.server_name(0);
    let mut server = servers.get(&name).await.unwrap();
    server.data["status"] = json!({"indicatorLED": "Off"});
    let mut server =
        servers.replace_status(&name, &PostParams::default(), &server).await.expect("status replace allowed");
    server.metadata.annotations.get_or_insert_default().insert(RESTORED_FROM_ANNOTATION.into(), "by-hand".into());
    let mut server = servers.replace(&name, &PostParams::default(), &server).await.expect("annotation replace allowed");
    server.data["spec"]["power"] = json!("Off");
    let denied = servers.replace(&name, &PostParams::default(), &server).await.expect_err("spec replace denied");
    assert!(denied.to_string().contains("may not change spec"), "{denied}");
    let status = json!({"status": {"indicatorLED": "On"}});
    let denied = servers.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await;
    assert!(matches!(denied, Err(kube::Error::Api(ref s)) if s.code == 403), "status patch: {denied:?}");

    // An operation restatus did not set: it may not be removed or changed, only kept aside
    // while restatus quiesces, and put back.
    let server = format!("servers.metal.ironcore.dev/{name}");
    let park = r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":"park"}}}"#;
    assert_success(&bed.kubectl(&bed.target_kubeconfig, &merge_patch(None, &server, park)), "a user parks");
    let removal = r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":null}}}"#;
    let out = bed.kubectl(&kubeconfig, &merge_patch(None, &server, removal));
    assert!(stderr(&out).contains("may not remove or change an operation it did not set"), "{}", stderr(&out));
    let keep = r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":"ignore","restatus.ironcore.dev/quiesced-by":"restatus","restatus.ironcore.dev/operation-was":"park"}}}"#;
    let back = r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":"park","restatus.ironcore.dev/quiesced-by":null,"restatus.ironcore.dev/operation-was":null}}}"#;
    bed.assert_allowed(&kubeconfig, &[merge_patch(None, &server, keep), merge_patch(None, &server, back)]);

    // Nothing but restatus's own protocol on the operation annotation (a BMC and a Server).
    for object in [format!("bmcs.metal.ironcore.dev/{}", spec.bmc_name(0)), server] {
        crate::bed::assert_only_the_quiesce_protocol(&bed, &bed.target_kubeconfig, &kubeconfig, &object);
    }
}

/// `kustomize edit set namespace ops`: the controller's admission policy still binds its
/// ServiceAccount, now in another namespace.
#[tokio::test]
async fn the_admission_policy_holds_in_another_namespace() {
    let _target = TARGET.write().await; // re-binds the cluster-wide roles to another namespace
    let bed = Bed::get();
    let ns = unique("ops");
    // What `kustomize edit set namespace NS` does, on a copy of the shipped folders.
    let manifests = format!("{}/manifests", env!("CARGO_MANIFEST_DIR"));
    let copy = bed.scratch.path().join(&ns);
    let kubectl = |args: &[&str]| bed.kubectl(&bed.target_kubeconfig, args);
    for dir in ["namespace", "controller"] {
        let to = copy.join(dir);
        std::fs::create_dir_all(&to).unwrap();
        for file in std::fs::read_dir(format!("{manifests}/{dir}")).unwrap() {
            let file = file.unwrap().path();
            let text = std::fs::read_to_string(&file).unwrap();
            let text = text.replace("\nnamespace: restatus\n", &format!("\nnamespace: {ns}\n"));
            std::fs::write(to.join(file.file_name().unwrap()), text).unwrap();
        }
    }
    let _ = kubectl(&["create", "namespace", &ns]);
    assert_success(&kubectl(&["apply", "-k", copy.join("controller").to_str().unwrap()]), "apply in another namespace");
    let token = kubectl(&["-n", &ns, "create", "token", "restatus-controller"]);
    assert_success(&token, "create token");
    let as_controller = bed.kubeconfig_with_token(&bed.target_kubeconfig, &ns, stdout(&token).trim());

    let spec = FleetSpec::new(&unique("nsx"), 1, 1, 0);
    fleet::create(&bed.target().await, &spec, 2).await.unwrap();
    let server = format!("servers.metal.ironcore.dev/{}", spec.server_name(0));
    // The fleet's unclaimed server is powered off: this patch changes its spec. The re-applied
    // binding takes effect once it reaches the API server's cache: probed with dry runs.
    let power_on = merge_patch(None, &server, r#"{"spec":{"power":"On"}}"#);
    let in_force = bed.wait_denied(&as_controller, &power_on, "may not change spec", Duration::from_secs(60)).await;
    let out = bed.kubectl(&as_controller, &power_on);
    let denied = stderr(&out);
    // Put the shipped namespace's bindings back before asserting, for the tests that follow.
    assert_success(&kubectl(&["apply", "-k", &format!("{manifests}/controller")]), "restore the bindings");
    let _ = kubectl(&["delete", "namespace", &ns, "--wait=false"]);
    in_force.unwrap();
    assert!(denied.contains("may not change spec"), "the policy must hold in {ns}: {denied}");
}

#[tokio::test]
async fn a_metrics_port_that_cannot_be_bound_is_a_clear_error_at_start() {
    let bed = Bed::get();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let storage = bed.storage("bind");
    let started = Instant::now();
    let out = bed.restatus_with(
        &bed.target_kubeconfig,
        &storage,
        "bind",
        &["controller", "--http-addr", &addr, "--lease-namespace", "default", "--lease-name", &unique("lease")],
        &[],
    );
    assert!(!out.status.success(), "the controller must not run without its probes");
    let err = stderr(&out);
    assert!(err.contains(&format!("listen on {addr}")), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "it exits at start, not later");
}

/// A fleet backed up on the source, and a controller for it on the target to start.
async fn fleet_and_controller<'a>(bed: &'a Bed, prefix: &str) -> (FleetSpec, ControllerRun<'a>) {
    let spec = FleetSpec::new(&unique(prefix), 6, 6, 3);
    let run = backed_up(bed, &spec, 16).await;
    (spec, run)
}

#[tokio::test]
async fn writes_denied_for_30_seconds_are_retried_until_everything_is_restored_and_released() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (spec, run) = fleet_and_controller(&bed, "deny").await;
    let controller = run.start_ready().await;

    // Every update of this fleet's objects on the target is denied, status included.
    let name = spec.name.clone();
    let this_fleet = format!(
        "has(object.metadata.labels) && '{FLEET_LABEL}' in object.metadata.labels && \
         object.metadata.labels['{FLEET_LABEL}'] == '{name}'"
    );
    let resources = "[servers, servers/status, bmcs, bmcs/status, serverclaims, serverclaims/status]";
    let deny = InjectedPolicy::deny_updates(
        &bed,
        &bed.target_kubeconfig,
        &format!("{name}-deny"),
        resources,
        &this_fleet,
        "false",
    )
    .await;
    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    // The fault lasts 30 s (the row's duration, not a wait for something): over it every object
    // fails again and again, its backoff growing 1, 2, 4, 8, 16 s.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let state = fleet_state(&bed.target().await, &spec.name).await;
    assert!(state.values().all(|(status, _)| status.is_null()), "the fault held: nothing restored yet");
    let (_, metrics) = controller.get("/metrics").await.unwrap();
    assert!(metric(&metrics, "restatus_objects_retrying") >= 1.0, "{metrics}");
    // Each object failed more than once: it backs off, it does not give up after the first.
    let objects = state.len() as f64;
    assert!(metric(&metrics, "restatus_errors_total") > objects, "retried: {metrics}");

    deny.remove(&bed);
    // The fault has cleared once the API server no longer enforces the policy (a dry-run
    // update of a fleet object is admitted). From then on each object is tried again when its
    // current backoff step ends: at most one step, and no step is longer than MAX_RETRY.
    let server = format!("servers.metal.ironcore.dev/{}", spec.server_name(0));
    let probe = merge_patch(None, &server, r#"{"metadata":{"annotations":{"restatus-test/probed":"yes"}}}"#);
    bed.wait_allowed(&bed.target_kubeconfig, &probe, Duration::from_secs(60)).await.unwrap();
    let one_step = restatus::controller::retry::MAX_RETRY + Duration::from_secs(15); // + the writes themselves
    let took = wait_restored(&bed, &spec.name, one_step).await;
    eprintln!("restored and released {took:?} after the fault cleared");
    // The gauges count the index, which learns of the last releases from their watch events:
    // a moment after the API server has them (bounded: 10 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, metrics) = controller.get("/metrics").await.unwrap();
        let settled = ["restatus_objects_retrying", "restatus_objects_quiesced"].map(|m| metric(&metrics, m));
        if settled == [0.0, 0.0] {
            break;
        }
        assert!(Instant::now() < deadline, "still retrying or quiesced after 10 s: {metrics}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(controller.stop().await.success());
}

#[tokio::test]
async fn a_kind_the_target_does_not_serve_is_reported_and_the_rest_is_restored() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let mut profile = serde_json::to_value(Profile::metal_operator()).unwrap();
    let gone =
        json!({"group": "metal.ironcore.dev", "version": "v1alpha1", "kind": "ServerGone", "plural": "servergones"});
    profile["kinds"].as_array_mut().unwrap().push(gone);
    let file = bed.scratch.path().join(format!("{}-profile.json", unique("gone")));
    std::fs::write(&file, profile.to_string()).unwrap();
    let (spec, run) = fleet_and_controller(&bed, "gone").await;
    let controller = run.profile(file.to_str().unwrap()).start().await;
    // Once leading, the controller lists every kind: the missing one is reported, not waited for.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = controller.get("/readyz").await.unwrap_or_default();
        if code == 200 && body.contains("kind ServerGone skipped: not served by the API server") {
            break;
        }
        assert!(Instant::now() < deadline, "/readyz never reported the missing kind: {code} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;
    let (_, metrics) = controller.get("/metrics").await.unwrap();
    assert_eq!(metric(&metrics, "restatus_kind_unavailable{kind=\"ServerGone\"}"), 1.0, "{metrics}");
    assert!(controller.stop().await.success());
}

/// Two replicas: the leader is killed in the middle of restoring a fleet. The standby is ready
/// all along, takes over within the lease duration and finishes; no object is restored twice
/// (each named at most once in the two replicas' logs of restored statuses) and none is left
/// quiesced.
#[tokio::test]
async fn a_leader_killed_mid_restore_is_replaced_and_nothing_is_written_twice() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let spec = FleetSpec::new(&unique("failover"), 60, 60, 30);
    let replica = backed_up(&bed, &spec, 16).await.lease_name(&unique("lease")).concurrency(2);
    let (mut a, mut b) = (replica.start().await, replica.start().await);
    a.wait_ready().await;
    b.wait_ready().await;
    let leader_of = |text: &str| metric(text, "restatus_leader") == 1.0;
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader_is_a = loop {
        let (_, ma) = a.get("/metrics").await.unwrap_or_default();
        let (_, mb) = b.get("/metrics").await.unwrap_or_default();
        if leader_of(&ma) || leader_of(&mb) {
            break leader_of(&ma);
        }
        assert!(Instant::now() < deadline, "no leader within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (leader, standby) = if leader_is_a { (&mut a, &mut b) } else { (&mut b, &mut a) };
    assert_eq!(standby.get("/readyz").await.map(|(code, _)| code), Some(200), "a standby is ready");

    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    // In the middle of the restore: once the leader has restored a few objects (before: a fixed
    // 700 ms, which on a slow machine could come before the first write or after the last).
    wait_some_restored(&bed.target().await, &spec.name, 5, Duration::from_secs(60)).await;
    leader.child.kill().unwrap();
    leader.child.wait().unwrap();
    // Work is provably left when the leader dies: read after its death, objects without status
    // (nothing of a dead process writes any more). Were there none, the standby would only
    // have had releases to do, and the test would not show a takeover mid-restore.
    let at_death = fleet_state(&bed.target().await, &spec.name).await;
    let left = at_death.values().filter(|(status, _)| status.is_null()).count();
    assert!(left > 0, "the leader had restored all {} objects before it was killed", at_death.len());
    eprintln!("{left} of {} objects left without status when the leader died", at_death.len());
    let took = wait_restored(&bed, &spec.name, Duration::from_secs(90)).await;
    eprintln!("the standby finished the restore {took:?} after the leader was killed");
    let (_, metrics) = standby.get("/metrics").await.unwrap();
    let restored_by_standby = metric(&metrics, "restatus_decisions_total{verdict=\"restore\"}");
    assert!(restored_by_standby >= left as f64, "the standby restored what was left ({left}): {metrics}");

    // Each replica logs every status it restored ("status restored object=Server name
    // snapshot=…"); the dead leader's log is still there. (Per-object Events said it before;
    // a restore now publishes one summary Event per kind.)
    let mut restored: std::collections::BTreeMap<String, u64> = Default::default();
    for log in [&leader.log, &standby.log] {
        let log = std::fs::read_to_string(log).unwrap_or_default();
        for line in log.lines().filter(|l| l.contains("status restored")) {
            let object = line.split("object=").nth(1).and_then(|o| o.split(" snapshot=").next()).unwrap_or_default();
            *restored.entry(object.to_string()).or_default() += 1;
        }
    }
    // The control: the standby's restores are in the logs (else they could not show one twice).
    assert!(restored.len() >= left, "the logs name {} objects restored, {left} were left", restored.len());
    let twice: Vec<_> = restored.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "restored by both replicas: {twice:?}");
    assert!(standby.get("/metrics").await.is_some_and(|(_, m)| leader_of(&m)), "the standby leads now");
}

/// A write request of the API server's audit log (`audit_events`): who sent it, when the API
/// server received it, and what it wrote.
struct AuditedWrite {
    user: String,
    received: jiff::Timestamp,
    verb: String,
    what: String,
}

/// The writes in `events` by the users `users`, Leases aside (the election's own writes).
fn audited_writes(events: &[serde_json::Value], users: &[&str]) -> Vec<AuditedWrite> {
    let mut writes: Vec<AuditedWrite> = events
        .iter()
        .filter(|e| ["create", "update", "patch", "delete"].contains(&e["verb"].as_str().unwrap_or_default()))
        .filter(|e| users.contains(&e["user"]["username"].as_str().unwrap_or_default()))
        .filter(|e| e["objectRef"]["resource"] != "leases")
        .filter_map(|e| {
            Some(AuditedWrite {
                user: e["user"]["username"].as_str()?.to_string(),
                received: e["requestReceivedTimestamp"].as_str()?.parse().ok()?,
                verb: e["verb"].as_str()?.to_string(),
                what: format!(
                    "{}{} {}",
                    e["objectRef"]["resource"].as_str()?,
                    e["objectRef"]["subresource"].as_str().map(|s| format!("/{s}")).unwrap_or_default(),
                    e["objectRef"]["name"].as_str().unwrap_or_default()
                ),
            })
        })
        .collect();
    writes.sort_by_key(|w| w.received);
    writes
}

/// F63: one writer at a time, even when the leader is slow. Two replicas, each with a token of
/// its own on a kube-apiserver of the test's own on the target's etcd that audits every write
/// of theirs. The leader (lease of 6 s, eight objects at a time) is SIGSTOPped in the middle of a
/// moved fleet, and three statuses it had restored are lost then (so the standby has writes to
/// make even if the leader was through, and the stopped leader has events waiting), stays
/// stopped until the standby has taken the lease over and made its first write, then is
/// SIGCONTed. It must find its lease over before it sends anything: by the
/// audit log, no write of the stale leader was received after the new leader's first one. It
/// steps down (exits non-zero, "stepped down"), and the new leader restores and releases the
/// whole fleet. The window over which "no write" is proved is the stale leader's whole life
/// after the SIGCONT: the audit log is read after it has exited (and after the fleet is
/// restored), and the API server logs each request before it answers (`blocking` mode).
///
/// Before the fence (kube-lease-manager renewing through the controller's own client), the
/// continued leader went on with the objects it was writing until its lease manager had read the
/// Lease again (one write after the new leader's first in one of three runs; with eight objects
/// at a time, 8 and 6 writes in two of three). With the fence on writes alone, a request that
/// passed it just before the stop and still waited in its connection (for a TLS handshake,
/// say) went out after the SIGCONT (once in four runs at eight at a time): the connections are
/// now driven by an executor that drops each at its next poll once the lease is over.
#[tokio::test]
async fn a_leader_stopped_past_its_lease_writes_nothing_after_the_new_leader_began() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let state = std::env::var("RESTATUS_STATE").expect("RESTATUS_STATE (from the test bed's env file)");
    let (user_a, user_b) = ("restatus-replica-a", "restatus-replica-b");
    let (token_a, token_b) = (format!("{:032x}", rand::random::<u128>()), format!("{:032x}", rand::random::<u128>()));
    let tokens = bed.scratch.path().join("slow-leader-tokens.csv");
    let mut users = std::fs::read_to_string(format!("{state}/target/tokens.csv")).expect("the target's token file");
    for (token, user) in [(&token_a, user_a), (&token_b, user_b)] {
        users.push_str(&format!("{token},{user},{user},system:masters\n"));
    }
    std::fs::write(&tokens, users).unwrap();
    let policy = bed.scratch.path().join("slow-leader-audit-policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
             - level: Metadata\n  users: [{user_a}, {user_b}]\n  verbs: [create, update, patch, delete]\n\
             - level: None\n"
        ),
    )
    .unwrap();
    let audit_log = bed.scratch.path().join("slow-leader-audit.jsonl");
    let flags = [
        format!("--token-auth-file={}", tokens.display()),
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", audit_log.display()),
        "--audit-log-format=json".to_string(),
        "--audit-log-mode=blocking".to_string(),
    ];
    let apiserver = ExtraApiServer::start(&bed, "target", &flags).await;
    let kubeconfig_a = bed.kubeconfig_with_token(&apiserver.kubeconfig, &unique("replica-a"), &token_a);
    let kubeconfig_b = bed.kubeconfig_with_token(&apiserver.kubeconfig, &unique("replica-b"), &token_b);

    let spec = FleetSpec::new(&unique("slow-leader"), 150, 150, 0);
    let replica = backed_up(&bed, &spec, 16).await.lease_name(&unique("lease"));
    let replica = replica.lease_duration("6s").concurrency(8);
    // A leads: it is started first, and B only once A holds the lease.
    let mut a = replica.clone().kubeconfig(&kubeconfig_a).start_ready().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !a.get("/metrics").await.is_some_and(|(_, m)| metric(&m, "restatus_leader") == 1.0) {
        assert!(Instant::now() < deadline, "A does not lead within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b = replica.kubeconfig(&kubeconfig_b).start_ready().await;

    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    wait_some_restored(&bed.target().await, &spec.name, 5, Duration::from_secs(120)).await;
    let signal = |name: &str, pid: u32| {
        let out = Command::new("kill").args([name, &pid.to_string()]).output().unwrap();
        assert_success(&out, &format!("kill {name}"));
    };
    signal("-STOP", a.child.id());
    let stopped = Instant::now();
    // A may have restored the whole fleet before the stop (a few seconds' work): three statuses
    // lost now give the new leader writes to make whatever A left, and give the stale leader
    // watch events it must not act on after its SIGCONT.
    let at_stop = fleet_state(&bed.target().await, &spec.name).await;
    let restored_at_stop: Vec<String> = at_stop
        .iter()
        .filter(|(_, (_, annotations))| annotations.contains_key(RESTORED_FROM_ANNOTATION))
        .filter_map(|(key, _)| key.strip_prefix("Server ").map(str::to_string))
        .collect();
    eprintln!("A stopped with {} of {} objects restored", restored_at_stop.len(), at_stop.len());
    for server in restored_at_stop.iter().take(3) {
        wipe_status(&bed, server).await;
    }
    // Stopped until the new leader wrote (taking the lease over takes 6 s and a look or two).
    let deadline = stopped + Duration::from_secs(60);
    while !audited_writes(&audit_events(&audit_log), &[user_b]).iter().any(|w| w.what.contains(&spec.name)) {
        assert!(
            Instant::now() < deadline,
            "B did not write within 60 s of A's stop; B's log:\n{}",
            std::fs::read_to_string(&b.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("A stopped for {:?} (lease 6 s), until B's first write", stopped.elapsed());
    signal("-CONT", a.child.id());

    // A steps down: it exits (a restart would rejoin the election as a standby).
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(status) = a.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "A still runs 30 s after SIGCONT");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    wait_restored(&bed, &spec.name, Duration::from_secs(180)).await;
    assert!(b.stop().await.success(), "B exit on SIGTERM");

    let writes = audited_writes(&audit_events(&audit_log), &[user_a, user_b]);
    let first_b = writes.iter().find(|w| w.user == user_b).map(|w| w.received).expect("B wrote");
    let (before, after): (Vec<&AuditedWrite>, Vec<&AuditedWrite>) =
        writes.iter().filter(|w| w.user == user_a).partition(|w| w.received < first_b);
    let objects = |ws: &[&AuditedWrite]| ws.iter().map(|w| &w.what).collect::<std::collections::BTreeSet<_>>().len();
    eprintln!(
        "A wrote {} times before B's first write ({} objects), {} after; B wrote {} times",
        before.len(),
        objects(&before),
        after.len(),
        writes.iter().filter(|w| w.user == user_b).count()
    );
    // The control: A's writes are in the log (else the log could not show a late one).
    assert!(before.len() >= 5, "A's writes before its stop are not in the audit log: {}", before.len());
    let late: Vec<String> = after.iter().map(|w| format!("{} {} {}", w.received, w.verb, w.what)).collect();
    assert!(late.is_empty(), "the stale leader wrote after the new leader's first write ({first_b}): {late:#?}");
    let log_a = std::fs::read_to_string(&a.log).unwrap_or_default();
    assert!(!exit.success() && log_a.contains("stepped down"), "A after SIGCONT: {exit}; its log:\n{log_a}");
}

/// F31 end to end: a re-list after a hard API server restart is the whole truth.
///
/// The controller talks to a kube-apiserver of the test's own on the target's etcd (the flags of
/// the target's, `scripts/testbed apiserver-args`), so killing it disturbs no other test. Once the
/// fleet is restored, that apiserver is SIGKILLed: the controller's watches break and it sees
/// nothing of what follows. Through the target's main apiserver (same etcd), Server X is deleted
/// and Y is created under another name with X's identity key (its `spec.systemUUID`), as a
/// machine re-registered under a new name would be. Then the killed apiserver is started again:
/// its watch cache is new, so the controller's watches cannot resume where they were (410 Gone)
/// and re-list, which the apiserver's audit log shows. Y must be restored from X's record; had X
/// stayed in the controller's index, Y would share a key with it and be `ambiguous`.
#[tokio::test]
async fn a_relist_after_a_hard_api_server_restart_forgets_what_vanished_meanwhile() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let audit_log = bed.scratch.path().join("relist-audit.jsonl");
    let policy = bed.scratch.path().join("relist-audit-policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
         - level: Metadata\n  verbs: [list, watch]\n  resources: [{group: metal.ironcore.dev, resources: [servers]}]\n\
         - level: None\n",
    )
    .unwrap();
    let audit = [
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", audit_log.display()),
        "--audit-log-format=json".to_string(),
        "--audit-log-mode=blocking".to_string(),
    ];
    let mut apiserver = ExtraApiServer::start(&bed, "target", &audit).await;

    let spec = FleetSpec::new(&unique("relist"), 4, 4, 2);
    // Its Lease lives on the API server the test kills: a lease that outlasts a slow restart
    // (tens of seconds on a busy machine), or the controller steps down and exits, as it must.
    let run = backed_up(&bed, &spec, 8).await.kubeconfig(&apiserver.kubeconfig);
    let controller = run.lease_duration("120s").start_ready().await;
    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;

    let target = bed.target().await;
    let servers = restatus::k8s::api_for(&target, Profile::metal_operator().kind("Server").unwrap(), None);
    let x = spec.server_name(0);
    let x_object = servers.get(&x).await.unwrap();
    let x_status = x_object.data["status"].clone();
    assert!(!x_status.is_null(), "X was restored before the fault");

    apiserver.kill();
    servers.delete(&x, &Default::default()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while servers.get_opt(&x).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "X not deleted within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let y = format!("{x}-again");
    let y_object = json!({
        "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": y, "labels": x_object.metadata.labels},
        "spec": x_object.data["spec"],
    });
    servers.create(&PostParams::default(), &serde_json::from_value(y_object).unwrap()).await.unwrap();
    let _ = std::fs::remove_file(&audit_log); // what the restarted apiserver logs, only
    apiserver.restart(&bed).await;

    // Restored, then released: the release is a write of its own after the status.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let y_now = servers.get(&y).await.unwrap();
        let status = &y_now.data["status"];
        let annotations = y_now.metadata.annotations.unwrap_or_default();
        if *status == x_status && !annotations.contains_key(QUIESCED_BY_ANNOTATION) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Y not restored with X's status and released within 90 s of the restart: {status}, \
             annotations {annotations:?}; metrics:\n{}\nlog:\n{}",
            controller.get("/metrics").await.unwrap_or_default().1,
            std::fs::read_to_string(&controller.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, metrics) = controller.get("/metrics").await.unwrap();
    assert_eq!(metric(&metrics, "restatus_decisions_total{verdict=\"ambiguous\"}"), 0.0, "{metrics}");
    // The controller re-listed (rather than resumed its watches) on the restarted apiserver,
    // and named itself.
    let relisted = audit_events(&audit_log).iter().any(|e| {
        e["verb"] == "list"
            && e["userAgent"] == restatus::k8s::USER_AGENT
            && e["objectRef"]["resource"] == "servers"
            && e["requestURI"].as_str().is_some_and(|uri| !uri.contains("watch=true"))
    });
    assert!(relisted, "no LIST of servers on the restarted apiserver: {:?}", audit_events(&audit_log));
    assert!(controller.stop().await.success());
}

/// F30 with the shipped RBAC: the controller's ServiceAccount is bound to the shipped controller
/// ClusterRole minus its rules for one kind (Endpoint: `endpoints`, `endpoints/status`), in a
/// namespace of the test's own (the ServiceAccount keeps the shipped name, so the shipped
/// admission policy binds it too). Its watch of Endpoints is forbidden: the kind is reported
/// (`/readyz` line, `restatus_kind_unavailable{kind="Endpoint"}`, a warning) and a moved fleet
/// of the other kinds is restored within 30 s.
#[tokio::test]
async fn a_kind_forbidden_by_the_shipped_rbac_is_reported_and_the_rest_is_restored() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    bed.deploy(&bed.target_kubeconfig, &["controller"], "restatus-controller");
    let ns = unique("forbid");
    ensure_namespace(&bed.target().await, &ns).await;
    let get = |args: &[&str]| {
        let out = bed.kubectl(&bed.target_kubeconfig, args);
        assert_success(&out, &format!("{args:?}"));
        serde_json::from_str::<serde_json::Value>(&stdout(&out)).unwrap()
    };
    let shipped = get(&["get", "clusterrole", "restatus-controller", "-o", "json"]);
    let mut removed = 0;
    let rules: Vec<serde_json::Value> = shipped["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|rule| {
            let mut rule = rule.clone();
            let resources = rule["resources"].as_array_mut()?;
            let before = resources.len();
            resources.retain(|r| r != "endpoints" && r != "endpoints/status");
            removed += before - resources.len();
            (!resources.is_empty()).then_some(rule)
        })
        .collect();
    assert_eq!(removed, 2, "the shipped role grants endpoints and endpoints/status: {shipped}");
    let lease_rules =
        get(&["-n", "restatus", "get", "role", "restatus-controller-lease", "-o", "json"])["rules"].clone();
    let subject = json!([{"kind": "ServiceAccount", "name": "restatus-controller", "namespace": ns}]);
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "restatus-controller", "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": ns}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ns}, "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "lease", "namespace": ns},
         "rules": lease_rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "lease", "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lease"}, "subjects": subject},
    ]});
    let file = bed.scratch.path().join(format!("{ns}-rbac.json"));
    std::fs::write(&file, objects.to_string()).unwrap();
    assert_success(&bed.kubectl(&bed.target_kubeconfig, &["apply", "-f", file.to_str().unwrap()]), "apply RBAC");
    let token = bed.kubectl(&bed.target_kubeconfig, &["-n", &ns, "create", "token", "restatus-controller"]);
    assert_success(&token, "create token");
    let kubeconfig = bed.kubeconfig_with_token(&bed.target_kubeconfig, &ns, stdout(&token).trim());
    bed.assert_denied(&kubeconfig, &[vec!["get", "endpoints.metal.ironcore.dev"]]);

    let spec = FleetSpec::new(&unique("forbid"), 6, 6, 3);
    let run = backed_up(&bed, &spec, 16).await.kubeconfig(&kubeconfig);
    let controller = run.lease_namespace(&ns).start().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, body) = controller.get("/readyz").await.unwrap_or_default();
        if code == 200 && body.contains("kind Endpoint skipped: forbidden by RBAC") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never reported the forbidden kind: {code} {body}\nlog:\n{}",
            std::fs::read_to_string(&controller.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    let took = wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;
    eprintln!("restored {} objects {took:?} after the move, Endpoints forbidden", spec.total());
    let (_, metrics) = controller.get("/metrics").await.unwrap();
    assert_eq!(metric(&metrics, "restatus_kind_unavailable{kind=\"Endpoint\"}"), 1.0, "{metrics}");
    assert_eq!(metric(&metrics, "restatus_kind_unavailable{kind=\"Server\"}"), 0.0, "{metrics}");
    let log = std::fs::read_to_string(&controller.log).unwrap();
    assert!(
        log.lines().any(|l| l.contains("WARN") && l.contains("Endpoint") && l.contains("forbidden by RBAC")),
        "no warning about the forbidden kind:\n{log}"
    );
    assert!(controller.stop().await.success());
    let _ = bed.kubectl(&bed.target_kubeconfig, &["delete", "clusterrolebinding,clusterrole", &ns, "--wait=false"]);
    let _ = bed.kubectl(&bed.target_kubeconfig, &["delete", "namespace", &ns, "--wait=false"]);
}

/// Item 10 of issue 9: the controller's periodic refresh lists the snapshots and downloads a
/// payload only when a newer snapshot arrived. The controller reaches S3 through a counting
/// proxy (plain http on loopback, in the test); with `--snapshot-refresh 1s` it refreshes many
/// times: exactly one GET of the payload; a new backup: exactly one more; a newer inconsistent
/// one: none.
#[tokio::test]
async fn the_snapshot_refresh_downloads_each_payload_once() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (proxy, proxied) = CountingProxy::for_s3().await;

    let spec = FleetSpec::new(&unique("gets"), 2, 2, 1);
    fleet::create(&bed.source().await, &spec, 4).await.unwrap();
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage(&spec.name);
    let prefix = storage.rsplit('/').next().unwrap().to_string();
    assert_success(&bed.restatus(&storage, &spec.name, &["backup", "--selector", &selector]), "backup");
    let run = ControllerRun::new(&bed, &storage, &spec.name, &selector).snapshot_refresh("1s");
    let run = run.env("S3_ENDPOINT", &proxied).env("AWS_ENDPOINT_URL_S3", &proxied);
    let controller = run.start_ready().await;

    let count = |what: &dyn Fn(&str, &str) -> bool| {
        proxy.requests().iter().filter(|(method, target)| target.contains(&prefix) && what(method, target)).count()
    };
    let payload_gets = || count(&|m, t| m == "GET" && t.contains("payload"));
    let lists = || count(&|m, t| m == "GET" && t.contains("list-type=2"));
    // Refreshes: each lists the prefix. Wait for six more after the first load.
    async fn refreshes(lists: &dyn Fn() -> usize, more: usize) {
        let (start, deadline) = (lists(), Instant::now() + Duration::from_secs(60));
        while lists() < start + more {
            assert!(Instant::now() < deadline, "fewer than {more} refreshes within 60 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    refreshes(&lists, 6).await;
    assert_eq!(payload_gets(), 1, "one download while nothing new arrived: {:?}", proxy.requests());

    let (_, metrics) = controller.get("/metrics").await.unwrap();
    let first = metric(&metrics, "restatus_snapshot_timestamp_seconds");
    tokio::time::sleep(Duration::from_millis(1100)).await; // snapshot ids have second precision
    assert_success(&bed.restatus(&storage, &spec.name, &["backup", "--selector", &selector]), "second backup");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, metrics) = controller.get("/metrics").await.unwrap_or_default();
        if metric(&metrics, "restatus_snapshot_timestamp_seconds") > first {
            break;
        }
        assert!(Instant::now() < deadline, "the new snapshot was not taken up within 60 s: {metrics}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    refreshes(&lists, 6).await;
    assert_eq!(payload_gets(), 2, "one more download for the new snapshot: {:?}", proxy.requests());

    // A newer snapshot that is inconsistent (a Server in Discovery) is passed over by its
    // manifest: neither its payload nor the one in use is downloaded again.
    let servers = crate::moving::api(&bed.source().await, "metal.ironcore.dev/v1alpha1", "Server", "servers", None);
    let discovery = Patch::Merge(json!({"status": {"state": "Discovery"}}));
    servers.patch_status(&spec.server_name(0), &PatchParams::default(), &discovery).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let backup = ["backup", "--selector", &selector, "--capture-attempts", "1"];
    let _ = bed.restatus(&storage, &spec.name, &backup);
    let store = bed.store(&storage, &spec.name);
    let newest = store.list().await.unwrap().into_iter().rev().find(|e| e.complete).unwrap();
    assert!(!store.manifest(&newest.id).await.unwrap().is_consistent(), "the newest snapshot is inconsistent");
    refreshes(&lists, 6).await;
    assert_eq!(payload_gets(), 2, "nothing downloaded for an inconsistent newer snapshot: {:?}", proxy.requests());
    assert!(controller.stop().await.success());
}

/// F65: the store stops answering (a proxy in front of S3 that stops forwarding) while the
/// controller refreshes its snapshot. The refresh fails after `--snapshot-timeout` with an
/// error that says so, counted in `restatus_errors_total`; the snapshot in use is kept and
/// nothing on the cluster is written (every object's resourceVersion is what it was). When the
/// proxy forwards again, the next refresh takes up a new snapshot. Before, the refresh waited
/// for the object store's own timeouts and retries (30 s and more), with the controller's loop.
/// While the refresh hangs, the controller restores a wiped status from the snapshot in use:
/// the loop does not wait for the refresh (until then it waited up to --snapshot-timeout).
#[tokio::test]
async fn a_store_that_stops_answering_during_a_refresh_fails_it_in_time_and_nothing_is_rewritten() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (proxy, proxied) = CountingProxy::for_s3().await;
    let spec = FleetSpec::new(&unique("stall"), 2, 2, 1);
    let run = backed_up(&bed, &spec, 4).await.snapshot_refresh("1s").arg("--snapshot-timeout", "20s");
    let run = run.env("S3_ENDPOINT", &proxied).env("AWS_ENDPOINT_URL_S3", &proxied);
    let controller = run.start_ready().await;
    let (selector, storage) = (run.selector(), run.storage());
    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;
    let versions = || async {
        let target = bed.target().await;
        let profile = Profile::metal_operator();
        let mut versions = std::collections::BTreeMap::new();
        for kind in ["BMC", "Server", "ServerClaim"] {
            let api = restatus::k8s::api_for(&target, profile.kind(kind).unwrap(), None);
            for o in api.list(&kube::api::ListParams::default().labels(selector)).await.unwrap() {
                versions.insert(format!("{kind} {}", o.metadata.name.unwrap()), o.metadata.resource_version.unwrap());
            }
        }
        versions
    };
    let before = versions().await;
    let (_, metrics) = controller.get("/metrics").await.unwrap();
    let (errors_before, in_use) =
        (metric(&metrics, "restatus_errors_total"), metric(&metrics, "restatus_snapshot_timestamp_seconds"));

    let asked = proxy.requests().len();
    proxy.hold();
    let stalled = Instant::now();
    let failed = "snapshot refresh failed; keeping the snapshot in use";
    // A refresh hangs on the store (its request held) ...
    while proxy.requests().len() == asked {
        assert!(stalled.elapsed() < Duration::from_secs(10), "no request to the store within 10 s of the hold");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ... and the controller goes on meanwhile: a wiped status comes back from the snapshot in
    // use before the refresh fails (the loop does not wait for it; before, a refresh hanging
    // until --snapshot-timeout, 2 minutes by default, held every restore back).
    let wiped = spec.server_name(1);
    wipe_status(&bed, &wiped).await;
    let took = wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;
    let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    assert!(!log.contains(failed), "restored only after the refresh failed ({took:?}):\n{log}");
    let deadline = stalled + Duration::from_secs(60);
    let log = loop {
        let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
        if log.contains(failed) {
            break log;
        }
        assert!(Instant::now() < deadline, "no failed refresh within 60 s of the stall:\n{log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The refresh fails by its own timeout (20 s), not by the object store's (30 s and more,
    // with retries); a refresh already past its reads when the hold began may succeed first.
    assert!(stalled.elapsed() < Duration::from_secs(30), "took {:?}", stalled.elapsed());
    assert!(log.contains("did not finish within 20s; the store stopped answering"), "{log}");
    assert!(log.contains(&proxied), "the error names the store: {log}");
    let (_, metrics) = controller.get("/metrics").await.unwrap();
    assert!(metric(&metrics, "restatus_errors_total") > errors_before, "counted: {metrics}");
    assert_eq!(metric(&metrics, "restatus_snapshot_timestamp_seconds"), in_use, "the snapshot in use is kept");

    proxy.resume();
    // A new snapshot is taken up once the store answers again (snapshot ids have second
    // precision: the backup is taken at least a second after the one in use).
    let second = Instant::now();
    assert_success(&bed.restatus(storage, &spec.name, &["backup", "--selector", selector]), "second backup");
    let deadline = second + Duration::from_secs(60);
    loop {
        let (_, metrics) = controller.get("/metrics").await.unwrap_or_default();
        if metric(&metrics, "restatus_snapshot_timestamp_seconds") > in_use {
            break;
        }
        assert!(Instant::now() < deadline, "the new snapshot was not taken up within 60 s of the resume: {metrics}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing was written but the wiped status (and its quiesce and release).
    let after = versions().await;
    let wiped = format!("Server {wiped}");
    let rewritten: Vec<_> =
        before.iter().filter(|(name, rv)| **name != wiped && after.get(*name) != Some(rv)).collect();
    assert!(rewritten.is_empty(), "written during or after the stall: {rewritten:?}");
    let state = fleet_state(&bed.target().await, &spec.name).await;
    assert!(state.values().all(|(_, a)| !a.contains_key(QUIESCED_BY_ANNOTATION)), "nothing left quiesced");
    assert!(controller.stop().await.success());
}

/// F51: SIGTERM while the controller writes a large batch (a moved fleet it found all at once).
/// It starts no further object, finishes and releases those in flight, and exits in time (the
/// Controller harness allows 20 s; the manifests grant 60 s): nothing is left quiesced by
/// restatus, and a controller started afterwards restores the rest.
#[tokio::test]
async fn a_controller_stopped_mid_batch_finishes_what_it_started_and_leaves_nothing_quiesced() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let spec = FleetSpec::new(&unique("stop"), 300, 300, 0);
    let run = backed_up(&bed, &spec, 16).await;
    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    // Started after the move: the whole fleet is one batch, written two objects at a time.
    let run = run.concurrency(2);
    let controller = run.start().await;
    wait_some_restored(&bed.target().await, &spec.name, 5, Duration::from_secs(120)).await;
    let log = controller.log.clone();
    assert!(controller.stop().await.success(), "controller exit on SIGTERM");
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(log.contains("finishing the objects being written"), "{log}");

    assert_stopped_cleanly(&fleet_state(&bed.target().await, &spec.name).await);

    let controller = run.start().await;
    wait_restored(&bed, &spec.name, Duration::from_secs(180)).await;
    assert!(controller.stop().await.success(), "controller exit on SIGTERM");
}

/// F53: with the controller running on the target, the target backs up under the source's id
/// (an empty selection: a consistent snapshot with nothing in it, newer than the source's). The
/// controller passes over it at every refresh (its manifest names the target as where it was
/// captured) and restores a fleet that arrives afterwards from the source's snapshot.
#[tokio::test]
async fn the_controller_never_adopts_a_snapshot_captured_from_its_own_cluster() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let spec = FleetSpec::new(&unique("self"), 3, 3, 1);
    let run = backed_up(&bed, &spec, 8).await;
    let controller = run.start_ready().await;
    let (selector, storage) = (run.selector(), run.storage());
    // The target's capture holds no status, far fewer records than the source's snapshot:
    // the record-drop guard (F160) would mark it and exit 4; this test is about its origin.
    let backup = ["backup", "--selector", selector, "--max-record-drop", "100"];
    let out = bed.restatus_with(&bed.target_kubeconfig, storage, &spec.name, &backup, &[]);
    assert_success(&out, "backup of the target under the source's id");
    // Bounded: the controller refreshes every 2 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&controller.log).unwrap_or_default().contains("captured from this cluster") {
        assert!(
            Instant::now() < deadline,
            "the controller never looked at the target's own snapshot; its log:\n{}",
            std::fs::read_to_string(&controller.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;
    let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    let own = stdout(&out).trim().to_string();
    assert!(!log.lines().any(|l| l.contains("using snapshot") && l.contains(&own)), "adopted its own snapshot:\n{log}");
    assert!(controller.stop().await.success(), "controller exit on SIGTERM");
}

/// The CRD of a kind of the test's own (cluster-scoped `Widget` in group `group`), with a status
/// subresource, installed on `kubeconfig`'s cluster and Established.
fn install_widget_crd(bed: &Bed, kubeconfig: &std::path::Path, group: &str) {
    let preserve = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {"group": group, "scope": "Cluster",
                 "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
                 "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": preserve, "status": preserve}}}}]},
    });
    let file = bed.scratch.path().join(format!("crd-{group}.json"));
    std::fs::write(&file, crd.to_string()).unwrap();
    assert_success(&bed.kubectl(kubeconfig, &["apply", "-f", file.to_str().unwrap()]), "install the Widget CRD");
    wait_established(bed, kubeconfig, &format!("widgets.{group}"));
}

/// F55 as a user met it: the controller restored a moved fleet while one kind of its profile
/// was not served on the target (its CRD absent: its writer learnt no status subresource for
/// it); then the CRD was installed and one object of the kind arrived bare. Its status was
/// merge-patched onto the object, dropped by the API server, counted restored and released,
/// again and again (about 1,400 "status restored" in 90 s). Now its status comes back through
/// the subresource, nothing is left quiesced, and it is written once.
#[tokio::test]
async fn a_kind_whose_crd_arrives_after_the_controller_started_gets_its_status_once() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let spec = FleetSpec::new(&unique("late-crd"), 2, 2, 0);
    let group = format!("{}.e2e.restatus.dev", spec.name);
    let mut profile = serde_json::to_value(Profile::metal_operator()).unwrap();
    let widget = json!({"group": group, "version": "v1", "kind": "Widget", "plural": "widgets"});
    profile["kinds"].as_array_mut().unwrap().push(widget);
    let profile_file = bed.scratch.path().join(format!("{}-profile.json", spec.name));
    std::fs::write(&profile_file, profile.to_string()).unwrap();
    let profile = Profile::load(profile_file.to_str().unwrap()).unwrap();
    let widgets = |client: &kube::Client| restatus::k8s::api_for(client, profile.kind("Widget").unwrap(), None);
    let widget_object = |name: &str| {
        serde_json::from_value::<kube::api::DynamicObject>(json!({
            "apiVersion": format!("{group}/v1"), "kind": "Widget",
            "metadata": {"name": name, "labels": {FLEET_LABEL: spec.name}}, "spec": {"size": 3},
        }))
        .unwrap()
    };

    // The source: the fleet and one Widget with a status, backed up with the profile.
    install_widget_crd(&bed, &bed.source_kubeconfig, &group);
    let source = bed.source().await;
    widgets(&source).create(&PostParams::default(), &widget_object("w1")).await.unwrap();
    let status = json!({"status": {"phase": "Ready", "parts": [{"id": 1}, {"id": 2}]}});
    widgets(&source).patch_status("w1", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    fleet::create(&source, &spec, 4).await.unwrap();
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage(&spec.name);
    let profile_arg = profile_file.to_str().unwrap();
    let backup = ["backup", "--profile", profile_arg, "--selector", &selector];
    assert_success(&bed.restatus(&storage, &spec.name, &backup), "backup");

    // The target: no Widget CRD yet; the controller restores the moved fleet.
    let controller = ControllerRun::new(&bed, &storage, &spec.name, &selector).profile(profile_arg).start_ready().await;
    simulate_move(&source, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;

    // The CRD is installed; the Widget arrives bare.
    install_widget_crd(&bed, &bed.target_kubeconfig, &group);
    let target = bed.target().await;
    widgets(&target).create(&PostParams::default(), &widget_object("w1")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let restored = loop {
        let w = widgets(&target).get("w1").await.unwrap();
        let annotations = w.metadata.annotations.clone().unwrap_or_default();
        if w.data.get("status") == Some(&status["status"]) && !annotations.contains_key(QUIESCED_BY_ANNOTATION) {
            break w;
        }
        assert!(
            Instant::now() < deadline,
            "the Widget's status did not come back within 60 s: {w:?}\n{}",
            std::fs::read_to_string(&controller.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let annotations = restored.metadata.annotations.unwrap_or_default();
    assert!(!annotations.contains_key(OPERATION_ANNOTATION), "left quiesced: {annotations:?}");
    // Written once: the loop wrote it some 15 times a second; 10 s without a second
    // "status restored" for it shows the loop is gone (the window also holds five snapshot
    // refreshes at 2 s and ten retry ticks at 1 s, each of which would have written again).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    let writes = log.lines().filter(|l| l.contains("status restored") && l.contains("Widget")).count();
    assert_eq!(writes, 1, "the Widget was restored {writes} times:\n{log}");
    assert!(controller.stop().await.success());
    for client in [&source, &target] {
        let crds: kube::Api<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        > = kube::Api::all(client.clone());
        let _ = crds.delete(&format!("widgets.{group}"), &Default::default()).await;
    }
}

/// Waits (at most 60 s) until CRD `name` is established. Polled rather than `kubectl wait
/// --for condition=established`, which fails at once on a CRD whose status has no conditions
/// yet ("accessor error"), as a just-created one may.
fn wait_established(bed: &Bed, kubeconfig: &std::path::Path, name: &str) {
    let query = r#"jsonpath={.status.conditions[?(@.type=="Established")].status}"#;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = bed.kubectl(kubeconfig, &["get", "crd", name, "-o", query]);
        if out.status.success() && stdout(&out).trim() == "True" {
            return;
        }
        assert!(Instant::now() < deadline, "CRD {name} not established within 60 s: {}{}", stdout(&out), stderr(&out));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Installs a CustomResourceDefinition (JSON) on one cluster and waits until it is established.
pub(crate) fn install_crd(bed: &Bed, kubeconfig: &std::path::Path, crd: &serde_json::Value) {
    let name = crd["metadata"]["name"].as_str().unwrap();
    let file = bed.scratch.path().join(format!("crd-{name}-{}.json", unique("v")));
    std::fs::write(&file, crd.to_string()).unwrap();
    assert_success(&bed.kubectl(kubeconfig, &["apply", "-f", file.to_str().unwrap()]), "install a CRD");
    wait_established(bed, kubeconfig, name);
}

/// A cluster-scoped CRD of `group` with a status subresource at each of `versions`
/// ((name, status schema); the first is the storage version).
fn crd(group: &str, kind: &str, plural: &str, versions: &[(&str, serde_json::Value)]) -> serde_json::Value {
    let preserve = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let versions: Vec<serde_json::Value> = versions
        .iter()
        .enumerate()
        .map(|(i, (name, status))| {
            json!({"name": name, "served": true, "storage": i == 0, "subresources": {"status": {}},
                   "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": preserve, "status": status}}}})
        })
        .collect();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Cluster", "versions": versions,
                 "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")}},
    })
}

/// F60, F61: the target's CRDs changed since the snapshot. Gadgets were captured in v1 and
/// the target serves them only in v2 (the profile says v2 there); Widgets keep v1, but its
/// schema now lists the status fields and the values of `phase`. Each object gets a verdict
/// that says why, nothing stays quiesced, and the controller writes none of them again (before:
/// written to the profile's version, pruned silently, or refused and retried with the ignore
/// on forever).
#[tokio::test]
async fn a_crd_version_or_schema_change_gets_a_verdict_and_nothing_is_retried() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let name = unique("crd-change");
    let group = format!("{name}.e2e.restatus.dev");
    let preserve = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let strict = json!({"type": "object", "properties": {"phase": {"type": "string", "enum": ["Ready", "Failed"]}}});
    let profile_file = |gadget_version: &str| {
        let mut profile = serde_json::to_value(Profile::metal_operator()).unwrap();
        let kinds = profile["kinds"].as_array_mut().unwrap();
        kinds.push(json!({"group": group, "version": "v1", "kind": "Widget", "plural": "widgets"}));
        kinds.push(json!({"group": group, "version": gadget_version, "kind": "Gadget", "plural": "gadgets"}));
        let file = bed.scratch.path().join(format!("{name}-profile-{gadget_version}.json"));
        std::fs::write(&file, profile.to_string()).unwrap();
        file
    };
    let (source_profile, target_profile) = (profile_file("v1"), profile_file("v2"));
    let object = |kind: &str, version: &str, name: &str| {
        serde_json::from_value::<kube::api::DynamicObject>(json!({
            "apiVersion": format!("{group}/{version}"), "kind": kind,
            "metadata": {"name": name, "labels": {FLEET_LABEL: name}}, "spec": {"size": 3},
        }))
        .unwrap()
    };
    let api = |client: &kube::Client, kind: &str, plural: &str, version: &str| {
        let resource = kube::api::ApiResource {
            group: group.clone(),
            version: version.into(),
            api_version: format!("{group}/{version}"),
            kind: kind.into(),
            plural: plural.into(),
        };
        kube::Api::<kube::api::DynamicObject>::all_with(client.clone(), &resource)
    };
    let selector = format!("{FLEET_LABEL} in (w-pruned,w-refused,w-late,g-moved)");
    let objects =
        [("Widget", "widgets", "w-pruned"), ("Widget", "widgets", "w-refused"), ("Widget", "widgets", "w-late")];
    let statuses = [
        json!({"phase": "Ready", "inventory": {"cpus": 2}}),
        json!({"phase": "Calibrating"}),
        json!({"phase": "Failed"}),
    ];

    // The source: both kinds in v1, statuses kept as they come; backed up with its profile.
    install_crd(&bed, &bed.source_kubeconfig, &crd(&group, "Widget", "widgets", &[("v1", preserve.clone())]));
    install_crd(&bed, &bed.source_kubeconfig, &crd(&group, "Gadget", "gadgets", &[("v1", preserve.clone())]));
    let source = bed.source().await;
    let moved = objects.iter().zip(&statuses).map(|((k, p, n), s)| (*k, *p, "v1", *n, s.clone()));
    for (kind, plural, version, n, status) in
        moved.chain([("Gadget", "gadgets", "v1", "g-moved", json!({"phase": "Ready"}))])
    {
        let api = api(&source, kind, plural, version);
        api.create(&PostParams::default(), &object(kind, version, n)).await.unwrap();
        api.patch_status(n, &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await.unwrap();
    }
    let storage = bed.storage(&name);
    let backup = ["backup", "--profile", source_profile.to_str().unwrap(), "--selector", &selector];
    assert_success(&bed.restatus(&storage, &name, &backup), "backup");

    // The target: Widgets' schema strict, Gadgets served in v2 only; the objects arrive bare.
    install_crd(&bed, &bed.target_kubeconfig, &crd(&group, "Widget", "widgets", &[("v1", strict)]));
    install_crd(&bed, &bed.target_kubeconfig, &crd(&group, "Gadget", "gadgets", &[("v2", preserve)]));
    let target = bed.target().await;
    let widgets = api(&target, "Widget", "widgets", "v1");
    let gadgets = api(&target, "Gadget", "gadgets", "v2");
    for n in ["w-pruned", "w-refused"] {
        widgets.create(&PostParams::default(), &object("Widget", "v1", n)).await.unwrap();
    }
    gadgets.create(&PostParams::default(), &object("Gadget", "v2", "g-moved")).await.unwrap();
    let run = ControllerRun::new(&bed, &storage, &name, &selector).profile(target_profile.to_str().unwrap());
    let controller = run.start_ready().await;

    // Each object's outcome, as its annotations and Events show it.
    let events_for = |object: &str| {
        let events = bed.kubectl(&bed.target_kubeconfig, &["get", "events.events.k8s.io", "-A", "-o", "json"]);
        let events: serde_json::Value = serde_json::from_str(&stdout(&events)).unwrap_or_default();
        let reasons: Vec<String> = events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["regarding"]["name"] == object)
            .filter_map(|e| e["reason"].as_str().map(String::from))
            .collect();
        reasons
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let settled = loop {
        let pruned = widgets.get("w-pruned").await.unwrap();
        let refused = widgets.get("w-refused").await.unwrap();
        let gadget = gadgets.get("g-moved").await.unwrap();
        let marks = |o: &kube::api::DynamicObject| o.metadata.annotations.clone().unwrap_or_default();
        let done = marks(&pruned).contains_key(NOT_RESTORED_ANNOTATION)
            && marks(&refused).contains_key(NOT_RESTORED_ANNOTATION)
            && events_for("g-moved").contains(&"StatusNotRestored".to_string());
        if done {
            break [pruned, refused, gadget];
        }
        assert!(
            Instant::now() < deadline,
            "no verdict within 60 s: {pruned:?}\n{refused:?}\n{gadget:?}\n{}",
            std::fs::read_to_string(&controller.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let [pruned, refused, gadget] = &settled;
    let marks = |o: &kube::api::DynamicObject| o.metadata.annotations.clone().unwrap_or_default();
    // Restored in part: the schema's fields back, what it prunes named; released.
    assert_eq!(pruned.data["status"], json!({"phase": "Ready"}));
    let snapshot = marks(pruned)[RESTORED_FROM_ANNOTATION].clone();
    assert_eq!(marks(pruned)[NOT_RESTORED_ANNOTATION], snapshot);
    assert!(events_for("w-pruned").contains(&"StatusPartlyRestored".to_string()));
    // Refused by the schema: no status, released, marked.
    assert_eq!(refused.data.get("status"), None, "{refused:?}");
    assert_eq!(marks(refused)[NOT_RESTORED_ANNOTATION], snapshot);
    assert!(events_for("w-refused").contains(&"StatusNotRestored".to_string()));
    // Captured in a version the target does not serve: untouched.
    assert_eq!(gadget.data.get("status"), None, "{gadget:?}");
    for object in &settled {
        let annotations = marks(object);
        assert!(!annotations.contains_key(OPERATION_ANNOTATION), "left quiesced: {annotations:?}");
        assert!(!annotations.contains_key(QUIESCED_BY_ANNOTATION), "left quiesced: {annotations:?}");
    }
    assert!(marks(gadget).is_empty(), "a Gadget no write was made to: {:?}", marks(gadget));
    let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    for reason in ["captured as", "Unsupported value", "status.inventory"] {
        assert!(log.contains(reason), "the log says why ({reason}):\n{log}");
    }

    // Nothing is written again. The window: a Widget that arrives now is seen, planned and
    // restored by the same loop; a retry of the three (each write of theirs makes them dirty
    // again at once) would come before it is done, and move their resourceVersions.
    let versions: Vec<Option<String>> = settled.iter().map(|o| o.metadata.resource_version.clone()).collect();
    widgets.create(&PostParams::default(), &object("Widget", "v1", "w-late")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let late = widgets.get("w-late").await.unwrap();
        if late.data.get("status") == Some(&statuses[2]) && !marks(&late).contains_key(QUIESCED_BY_ANNOTATION) {
            break;
        }
        assert!(Instant::now() < deadline, "w-late not restored within 60 s: {late:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let now = [
        widgets.get("w-pruned").await.unwrap(),
        widgets.get("w-refused").await.unwrap(),
        gadgets.get("g-moved").await.unwrap(),
    ];
    let now: Vec<Option<String>> = now.iter().map(|o| o.metadata.resource_version.clone()).collect();
    assert_eq!(now, versions, "an object restatus could not restore was written again");
    assert!(controller.stop().await.success());
    for client in [&source, &target] {
        let crds: kube::Api<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        > = kube::Api::all(client.clone());
        for plural in ["widgets", "gadgets"] {
            let _ = crds.delete(&format!("{plural}.{group}"), &Default::default()).await;
        }
    }
}

/// Issue 21, item 4: a BMC's Servers are found by identity, not by the names the snapshot
/// recorded. On the source, BMC `X-bmc` has its system's Server `X-bmc-system-0`, as
/// metal-operator names it; on the target that machine's Server exists as `X-renamed` (the same
/// systemUUID, `spec.bmcRef` naming the BMC). Both arrive quiesced, as after the handshake. The
/// Server is restored and released; the BMC is restored and kept for a person with a reason
/// naming both Servers (before: "waits for Server X-bmc-system-0", a Server that is not
/// coming). Released, metal-operator v0.7.0 would create `X-bmc-system-0` again for the same
/// machine (it creates a BMC's Servers by name) and discover it: a machine touched.
#[tokio::test]
async fn a_bmc_whose_server_is_on_the_target_under_another_name_is_held_with_why() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let name = unique("bmcid");
    let selector = format!("{FLEET_LABEL}={name}");
    let storage = bed.storage(&name);
    let profile = Profile::metal_operator();
    let (bmcs, servers) = (profile.kind("BMC").unwrap(), profile.kind("Server").unwrap());
    let bmc = format!("{name}-bmc");
    let (recorded, renamed) = (format!("{bmc}-system-0"), format!("{name}-renamed"));
    let uuid = "4c4c4544-0000-4000-8000-000000000042";
    let bmc_status = json!({"state": "Enabled", "powerState": "On", "macAddress": "02:00:5e:42:00:01"});
    let server_status = json!({"state": "Available", "powerState": "Off", "serialNumber": "SN42"});
    let make = async |client: &kube::Client, server_name: &str, annotations: serde_json::Value, status: bool| {
        let bmc_object = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "BMC",
            "metadata": {"name": bmc, "labels": {FLEET_LABEL: name}, "annotations": annotations},
            "spec": {"access": {"macAddress": "02:00:5e:42:00:01", "ip": "10.0.42.1"},
                     "bmcSecretRef": {"name": "none"}, "protocol": {"name": "Redfish", "port": 443, "scheme": "https"}}});
        let server_object = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": server_name, "labels": {FLEET_LABEL: name}, "annotations": annotations},
            "spec": {"systemUUID": uuid, "bmcRef": {"name": bmc}, "power": "Off"}});
        for (kind, object, object_status, object_name) in
            [(bmcs, bmc_object, &bmc_status, bmc.as_str()), (servers, server_object, &server_status, server_name)]
        {
            let api = restatus::k8s::api_for(client, kind, None);
            api.create(&PostParams::default(), &serde_json::from_value(object).unwrap()).await.unwrap();
            if status {
                let patch = json!({"status": object_status});
                api.patch_status(object_name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
            }
        }
    };
    make(&bed.source().await, &recorded, json!({}), true).await;
    assert_success(&bed.restatus(&storage, &name, &["backup", "--selector", &selector]), "backup");
    let controller = ControllerRun::new(&bed, &storage, &name, &selector).start_ready().await;
    let quiesced = json!({OPERATION_ANNOTATION: "ignore", QUIESCED_BY_ANNOTATION: "restatus"});
    make(&bed.target().await, &renamed, quiesced, false).await;

    // Bounded: the controller restores and releases within a second or so of an object's
    // arrival; 30 s leaves room on a loaded machine.
    let target = bed.target().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = fleet_state(&target, &name).await;
        let restored = |kind: &str, object: &str, status: &serde_json::Value, held: bool| {
            state.iter().any(|(k, (s, a))| {
                k.starts_with(kind)
                    && k.ends_with(&format!(" {object}"))
                    && s == status
                    && a.contains_key(RESTORED_FROM_ANNOTATION)
                    && a.contains_key(QUIESCED_BY_ANNOTATION) == held
                    && a.contains_key(OPERATION_ANNOTATION) == held
            })
        };
        let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
        let why = format!("its Server {recorded} is on the target as {renamed}");
        if restored("BMC", &bmc, &bmc_status, true)
            && restored("Server", &renamed, &server_status, false)
            && log.contains(&why)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not restored (the Server released, the BMC held with why) within 30 s: {state:#?}\nthe controller's log:\n{}",
            std::fs::read_to_string(&controller.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(controller.stop().await.success(), "controller exit on SIGTERM");
}

/// Waits (bounded) until the controller's log has a line with every one of `parts`.
async fn wait_logged(controller: &Controller, parts: &[&str], within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
        if log.lines().any(|l| parts.iter().all(|p| l.contains(p))) {
            return log;
        }
        assert!(Instant::now() < deadline, "no log line with {parts:?} within {within:?}; the log:\n{log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// F70 (the controller): with a trusted key, a forged snapshot newer than the signed one (there
/// at the start, and another appearing while it runs) is passed over, naming it: the controller
/// uses and keeps the signed snapshot, and restores the source's statuses, none of the forgery's.
#[tokio::test]
async fn signed_snapshots_the_controller_passes_over_forgeries_and_keeps_the_signed_one() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (private, public, key_id) = generate_keys(&bed, "backup");
    let spec = FleetSpec::new(&unique("sig"), 3, 3, 1);
    fleet::create(&bed.source().await, &spec, 8).await.unwrap();
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage(&spec.name);
    let private = private.display().to_string();
    let out = bed.restatus(&storage, &spec.name, &["backup", "--selector", &selector, "--signing-key", &private]);
    assert_success(&out, "signed backup");
    let signed = stdout(&out).trim().to_string();
    let store = bed.store(&storage, &spec.name);
    let forged = forge(&store, &signed).await;

    let public = public.display().to_string();
    let run = ControllerRun::new(&bed, &storage, &spec.name, &selector).arg("--trusted-key", &public);
    let controller = run.start_ready().await;
    wait_logged(&controller, &["using snapshot", &signed], Duration::from_secs(30)).await;
    wait_logged(&controller, &[forged.as_str(), "not signed"], Duration::from_secs(30)).await;
    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;

    // A forgery appearing while it runs: refused at the next refresh (every 2 s); a status
    // wiped after that comes back from the signed snapshot.
    let later = forge(&store, &signed).await;
    wait_logged(&controller, &[later.as_str(), "not signed"], Duration::from_secs(30)).await;
    let server = fleet_state(&bed.source().await, &spec.name)
        .await
        .into_keys()
        .find_map(|k| k.strip_prefix("Server ").map(str::to_string))
        .unwrap();
    wipe_status(&bed, &server).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;
    let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    for id in [forged.as_str(), later.as_str()] {
        assert!(!log.lines().any(|l| l.contains("using snapshot") && l.contains(id)), "adopted forgery {id}:\n{log}");
    }
    assert!(log.lines().any(|l| l.contains("using snapshot") && l.contains(&key_id)), "the signer is logged:\n{log}");
    assert!(!log.contains("PRIVATE KEY") && !log.contains("PUBLIC KEY"), "key material in the log:\n{log}");
    assert!(controller.stop().await.success(), "controller exit on SIGTERM");
}

/// F80, F81 (the controller): the target's controller holds the decryption key and restores a
/// moved fleet from an encrypted snapshot; a newer snapshot encrypted to another recipient,
/// appearing while it runs, is passed over, named ("does not decrypt"): the snapshot in use is
/// kept, and a status wiped after that comes back from it. No key material in its log.
#[tokio::test]
async fn encrypted_snapshots_the_controller_decrypts_with_its_key_and_passes_over_what_it_cannot() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (key, _, recipient) = generate_age_keys(&bed, "controller-side");
    let (_, _, other) = generate_age_keys(&bed, "elsewhere");
    let spec = FleetSpec::new(&unique("enc"), 3, 3, 1);
    fleet::create(&bed.source().await, &spec, 8).await.unwrap();
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage(&spec.name);
    let out = bed.restatus(&storage, &spec.name, &["backup", "--selector", &selector, "--encrypt-to", &recipient]);
    assert_success(&out, "encrypted backup");
    let sealed = stdout(&out).trim().to_string();

    let key = key.display().to_string();
    let run = ControllerRun::new(&bed, &storage, &spec.name, &selector).arg("--decryption-key", &key);
    let controller = run.start_ready().await;
    wait_logged(&controller, &["using snapshot", &sealed], Duration::from_secs(30)).await;
    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;

    // A newer snapshot the controller cannot decrypt: passed over at the next refresh, named.
    let out = bed.restatus(&storage, &spec.name, &["backup", "--selector", &selector, "--encrypt-to", &other]);
    assert_success(&out, "backup encrypted to another recipient");
    let foreign = stdout(&out).trim().to_string();
    wait_logged(&controller, &[foreign.as_str(), "does not decrypt"], Duration::from_secs(30)).await;
    let server = fleet_state(&bed.source().await, &spec.name)
        .await
        .into_keys()
        .find_map(|k| k.strip_prefix("Server ").map(str::to_string))
        .unwrap();
    wipe_status(&bed, &server).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;
    let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    assert!(
        !log.lines().any(|l| l.contains("using snapshot") && l.contains(&foreign)),
        "adopted a snapshot it cannot read:\n{log}"
    );
    assert!(!log.contains("AGE-SECRET-KEY"), "key material in the log:\n{log}");
    assert!(controller.stop().await.success(), "controller exit on SIGTERM");
}

/// F165 (issue 38, item 13): forged (unsigned) snapshots newer than the signed one a controller
/// with `--trusted-key` uses. Before, every refresh read and verified each of them again (its
/// manifest, its signature) — any number of junk objects, every `--snapshot-refresh`. Now each
/// refused snapshot is verified once by each reader (the choice, the bucket's gauges) and
/// remembered: over six more refreshes, no forged snapshot's signature is read more than twice,
/// and the snapshot in use stays the signed one.
#[tokio::test]
async fn forged_snapshots_are_read_once_not_at_every_refresh() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (proxy, proxied) = CountingProxy::for_s3().await;
    let spec = FleetSpec::new(&unique("junk"), 2, 2, 1);
    fleet::create(&bed.source().await, &spec, 4).await.unwrap();
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage(&spec.name);
    let prefix = storage.rsplit('/').next().unwrap().to_string();
    let (key, public, _) = generate_keys(&bed, &unique("junk-key"));
    let signed = bed.restatus(
        &storage,
        &spec.name,
        &["backup", "--selector", &selector, "--signing-key", key.to_str().unwrap()],
    );
    assert_success(&signed, "signed backup");
    let signed = stdout(&signed).trim().to_string();
    let store = bed.store(&storage, &spec.name);
    let mut forged = vec![];
    for _ in 0..3 {
        forged.push(forge(&store, &signed).await.to_string());
    }
    let run = ControllerRun::new(&bed, &storage, &spec.name, &selector).snapshot_refresh("1s");
    let run = run.arg("--trusted-key", public.to_str().unwrap());
    let run = run.env("S3_ENDPOINT", &proxied).env("AWS_ENDPOINT_URL_S3", &proxied);
    let controller = run.start_ready().await;
    let count = |what: &dyn Fn(&str, &str) -> bool| {
        proxy.requests().iter().filter(|(method, target)| target.contains(&prefix) && what(method, target)).count()
    };
    let lists = || count(&|m, t| m == "GET" && t.contains("list-type=2"));
    let (start, deadline) = (lists(), Instant::now() + Duration::from_secs(60));
    while lists() < start + 6 {
        assert!(Instant::now() < deadline, "fewer than 6 refreshes within 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Verifying reads its signature object (none is there). Two readers verify: the choice of
    // the snapshot to use, and the `restatus_snapshot_newest_*` gauges (which verify too, F141),
    // each with its own memory: each may read a forgery's signature once, never at every refresh.
    for id in &forged {
        let checks = count(&|_, t| t.contains(&format!("{id}/manifest.json.sig")));
        assert!(checks <= 2, "forged {id} verified {checks} times over 6 refreshes: {:?}", proxy.requests());
    }
    let (_, ready) = controller.get("/readyz").await.unwrap();
    assert!(ready.contains(&signed), "the signed snapshot stays in use: {ready}");
    assert!(controller.stop().await.success());
}

/// F151 with the controller, deployed as kustomize deploys it (RESTATUS_EXPECT_SOURCE): staging
/// and production share one signing key and one cluster id in two prefixes; a newer staging
/// snapshot (a real signed backup of the bed's source) is copied into production's prefix,
/// beside production's signed snapshot of another source. The controller naming production's
/// source never adopts the copy (it uses production's; its log names the copy passed
/// over and why) and restores the moved fleet from production's snapshot (each object's
/// restored-from annotation names it; it never logs "using snapshot" of the copy).
#[tokio::test]
async fn the_controller_naming_its_source_never_adopts_a_snapshot_copied_from_another() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (private, public, _) = generate_keys(&bed, "one-key-for-the-controller");
    let spec = FleetSpec::new(&unique("src"), 3, 3, 1);
    fleet::create(&bed.source().await, &spec, 8).await.unwrap();
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let staging_storage = bed.storage("staging");
    let backup = ["backup", "--selector", &selector, "--signing-key", private.to_str().unwrap()];
    let out = bed.restatus(&staging_storage, &spec.name, &backup);
    assert_success(&out, "staging's signed backup");
    let copied = stdout(&out).trim().to_string();
    let (staging, production_storage) = (bed.store(&staging_storage, &spec.name), bed.storage("production"));
    let production = bed.store(&production_storage, &spec.name);
    let (manifest, fleet) = records(&staging, &copied).await;
    let production_source = "5b0f6c1e-0000-4000-8000-0000000c0ffe";
    let key = restatus::format::SigningKey::load(&private).unwrap();
    let capture =
        restatus::format::CaptureSummary { kinds: manifest.kinds.clone(), ..restatus::format::CaptureSummary::empty() };
    let genuine = restatus::fixtures::snapshot(&fleet)
        .at(manifest.created_at - jiff::SignedDuration::from_hours(1))
        .profile(&manifest.profile)
        .capture(capture)
        .captured_from(production_source)
        .signed_with(&key)
        .write(&production)
        .await
        .snapshot_id
        .to_string();
    copy_snapshot(&staging, &production, &copied).await;

    let controller = ControllerRun::new(&bed, &production_storage, &spec.name, &selector)
        .env("RESTATUS_TRUSTED_KEYS", public.to_str().unwrap())
        .env("RESTATUS_EXPECT_SOURCE", production_source)
        .start_ready()
        .await;
    // Bounded: it loads a snapshot as soon as it leads (a Lease of its own, at once).
    let deadline = Instant::now() + Duration::from_secs(30);
    let using = |log: &str, id: &str| log.lines().any(|l| l.contains("using snapshot") && l.contains(id));
    let mut log = String::new();
    while !using(&log, &genuine) {
        assert!(Instant::now() < deadline, "production's snapshot never used; its log:\n{log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    }
    assert!(log.contains("not from the expected source") && log.contains(&copied), "the copy passed over:\n{log}");

    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(60)).await;
    let state = fleet_state(&bed.target().await, &spec.name).await;
    for (name, (_, annotations)) in &state {
        assert_eq!(annotations.get(RESTORED_FROM_ANNOTATION), Some(&genuine), "{name} restored from");
    }
    let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    assert!(!log.lines().any(|l| l.contains("using snapshot") && l.contains(&copied)), "adopted the copy:\n{log}");
    assert!(controller.stop().await.success(), "controller exit on SIGTERM");
}

/// F152 with the controller, deployed as the kustomize components `decryption-key` and
/// `require-encryption` deploy it: backups encrypted to a recipient, then a plain forgery
/// (newer, no key needed to write it). The controller requiring encryption never adopts the
/// forgery (its log names it passed over, not encrypted) and restores the moved fleet from the
/// encrypted snapshot (each object's restored-from annotation names it).
#[tokio::test]
async fn the_controller_requiring_encryption_never_adopts_a_plain_forgery() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (key, recipients, _) = generate_age_keys(&bed, "controller-requires");
    let spec = FleetSpec::new(&unique("req"), 3, 3, 1);
    fleet::create(&bed.source().await, &spec, 8).await.unwrap();
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage(&spec.name);
    let backup = ["backup", "--selector", &selector, "--encrypt-to", recipients.to_str().unwrap()];
    let out = bed.restatus(&storage, &spec.name, &backup);
    assert_success(&out, "encrypted backup");
    let sealed = stdout(&out).trim().to_string();
    let keys = restatus::format::DecryptionKeys::load(std::slice::from_ref(&key)).unwrap().map(std::sync::Arc::new);
    let forged = forge(&bed.store(&storage, &spec.name).with_decryption_keys(keys), &sealed).await.to_string();

    let controller = ControllerRun::new(&bed, &storage, &spec.name, &selector)
        .env("RESTATUS_DECRYPTION_KEY", key.to_str().unwrap())
        .env("RESTATUS_REQUIRE_ENCRYPTION", "true")
        .start_ready()
        .await;
    // Bounded: it loads a snapshot as soon as it leads (a Lease of its own, at once).
    let deadline = Instant::now() + Duration::from_secs(30);
    let using = |log: &str, id: &str| log.lines().any(|l| l.contains("using snapshot") && l.contains(id));
    let mut log = String::new();
    while !using(&log, &sealed) {
        assert!(Instant::now() < deadline, "the encrypted snapshot never used; its log:\n{log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    }
    assert!(log.contains("not encrypted") && log.contains(&forged), "the forgery passed over:\n{log}");

    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(60)).await;
    for (name, (_, annotations)) in &fleet_state(&bed.target().await, &spec.name).await {
        assert_eq!(annotations.get(RESTORED_FROM_ANNOTATION), Some(&sealed), "{name} restored from");
    }
    let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    assert!(!using(&log, &forged), "adopted the forgery:\n{log}");
    assert!(controller.stop().await.success(), "controller exit on SIGTERM");
}
