//! The restore controller on the real target cluster: objects that appear without status get
//! it back within a second or so, metrics and probes answer, and its RBAC plus admission
//! policy allow exactly what it needs.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams, PostParams};
use restatus::domain::annotations::{OPERATION_ANNOTATION, QUIESCED_BY_ANNOTATION, RESTORED_FROM_ANNOTATION};
use restatus::domain::identity::Profile;
use restatus::fleet::{self, FLEET_LABEL, FleetSpec};
use serde_json::json;

use crate::bed::{
    Bed, QUIESCE_PATCH, TARGET, assert_success, fleet_state, foreign_patches, merge_patch, simulate_move, stderr,
    stdout, unique,
};

struct Controller {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Controller {
    fn start(
        bed: &Bed,
        kubeconfig: &std::path::Path,
        storage: &str,
        cluster: &str,
        selector: &str,
        lease_ns: &str,
    ) -> Controller {
        Self::start_with(bed, kubeconfig, storage, cluster, selector, lease_ns, &[])
    }

    /// Starts a controller with `extra` arguments.
    fn start_with(
        bed: &Bed,
        kubeconfig: &std::path::Path,
        storage: &str,
        cluster: &str,
        selector: &str,
        lease_ns: &str,
        extra: &[&str],
    ) -> Controller {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = bed.scratch.path().join(format!("controller-{port}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_restatus"))
            .args(["controller", "--selector", selector, "--snapshot-refresh", "2s", "--lease-namespace", lease_ns])
            .args(["--http-addr", &format!("127.0.0.1:{port}")])
            .args(if extra.contains(&"--lease-name") {
                vec![]
            } else {
                vec!["--lease-name".to_string(), unique("lease")]
            })
            .args(extra)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env("RESTATUS_STORAGE", storage)
            .env("RESTATUS_CLUSTER_ID", cluster)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Controller { child, port, log }
    }

    async fn get(&self, path: &str) -> Option<(u16, String)> {
        let out = Command::new("curl")
            .args(["-s", "-o", "-", "-w", "\n%{http_code}", &format!("http://127.0.0.1:{}{path}", self.port)])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n')?;
        Some((code.trim().parse().ok()?, body.to_string()))
    }

    async fn wait_ready(&self) {
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

    fn stop(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "controller did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

async fn ensure_namespace(bed: &Bed, ns: &str) {
    let out = bed.kubectl(&bed.target_kubeconfig, &["create", "namespace", ns]);
    assert!(out.status.success() || stderr(&out).contains("AlreadyExists"), "{}", stderr(&out));
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

fn metric(text: &str, name: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

#[tokio::test]
async fn the_controller_restores_objects_as_they_appear() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let spec = FleetSpec::new(&unique("ctl"), 20, 20, 10);
    fleet::create(&bed.source().await, &spec, 16).await.unwrap();
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage(&spec.name);
    assert_success(&bed.restatus(&storage, &spec.name, &["backup", "--selector", &selector]), "backup");

    let lease_ns = unique("lease-ns");
    ensure_namespace(&bed, &lease_ns).await;
    let controller = Controller::start(&bed, &bed.target_kubeconfig, &storage, &spec.name, &selector, &lease_ns);
    controller.wait_ready().await;
    assert_eq!(controller.get("/healthz").await.unwrap().0, 200);

    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    let took = wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;
    eprintln!("controller restored {} objects {took:?} after the move finished", spec.total());
    let state = fleet_state(&bed.target().await, &spec.name).await;
    assert!(
        state.values().all(|(_, a)| a.contains_key(RESTORED_FROM_ANNOTATION) && !a.contains_key(OPERATION_ANNOTATION))
    );

    // An object that loses its status later gets it back.
    let target = bed.target().await;
    let servers = restatus::k8s::api_for(&target, Profile::metal_operator().kind("Server").unwrap(), None);
    let wiped = json!({"status": {"state": null, "networkInterfaces": null, "processors": null, "storages": null, "serialNumber": null}});
    servers.patch_status(&spec.server_name(5), &PatchParams::default(), &Patch::Merge(&wiped)).await.unwrap();
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
    assert!(controller.stop().success(), "controller exit on SIGTERM");
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
    fleet::create(&bed.source().await, &spec, 8).await.unwrap();
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage(&spec.name);
    assert_success(&bed.restatus(&storage, &spec.name, &["backup", "--selector", &selector]), "backup");
    let controller = Controller::start(&bed, &kubeconfig, &storage, &spec.name, &selector, "restatus");
    controller.wait_ready().await;
    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    wait_restored(&bed, &spec.name, Duration::from_secs(30)).await;
    assert!(controller.stop().success());

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
    tokio::time::sleep(Duration::from_secs(2)).await; // the re-applied policy reaches the API server's cache
    // The fleet's unclaimed server is powered off: this patch changes its spec.
    let out = bed.kubectl(&as_controller, &merge_patch(None, &server, r#"{"spec":{"power":"On"}}"#));
    let denied = stderr(&out);
    // Put the shipped namespace's bindings back before asserting, for the tests that follow.
    assert_success(&kubectl(&["apply", "-k", &format!("{manifests}/controller")]), "restore the bindings");
    let _ = kubectl(&["delete", "namespace", &ns, "--wait=false"]);
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

/// A fleet backed up on the source, and a controller for it on the target.
async fn fleet_and_controller(bed: &Bed, prefix: &str, extra: &[&str]) -> (FleetSpec, Controller) {
    let spec = FleetSpec::new(&unique(prefix), 6, 6, 3);
    fleet::create(&bed.source().await, &spec, 16).await.unwrap();
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage(&spec.name);
    assert_success(&bed.restatus(&storage, &spec.name, &["backup", "--selector", &selector]), "backup");
    let lease_ns = unique("lease-ns");
    ensure_namespace(bed, &lease_ns).await;
    let controller =
        Controller::start_with(bed, &bed.target_kubeconfig, &storage, &spec.name, &selector, &lease_ns, extra);
    (spec, controller)
}

#[tokio::test]
async fn writes_denied_for_30_seconds_are_retried_until_everything_is_restored_and_released() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (spec, controller) = fleet_and_controller(&bed, "deny", &[]).await;
    controller.wait_ready().await;

    // Every update of this fleet's objects on the target is denied, status included.
    let name = spec.name.clone();
    let policy = format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: {name}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [metal.ironcore.dev]
      apiVersions: ["*"]
      operations: [UPDATE]
      resources: [servers, servers/status, bmcs, bmcs/status, serverclaims, serverclaims/status]
  matchConditions:
  - name: this-fleet
    expression: "has(object.metadata.labels) && '{FLEET_LABEL}' in object.metadata.labels && object.metadata.labels['{FLEET_LABEL}'] == '{name}'"
  validations:
  - expression: "false"
    message: injected fault
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: {name}}}
spec: {{policyName: {name}, validationActions: [Deny]}}
"#
    );
    let file = bed.scratch.path().join(format!("{name}-deny.yaml"));
    std::fs::write(&file, policy).unwrap();
    assert_success(&bed.kubectl(&bed.target_kubeconfig, &["apply", "-f", file.to_str().unwrap()]), "deny");
    tokio::time::sleep(Duration::from_secs(3)).await; // the policy reaches the API server's cache
    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let state = fleet_state(&bed.target().await, &spec.name).await;
    assert!(state.values().all(|(status, _)| status.is_null()), "the fault held: nothing restored yet");
    let (_, metrics) = controller.get("/metrics").await.unwrap();
    assert!(metric(&metrics, "restatus_objects_retrying") >= 1.0, "{metrics}");

    assert_success(&bed.kubectl(&bed.target_kubeconfig, &["delete", "-f", file.to_str().unwrap()]), "allow");
    let took = wait_restored(&bed, &spec.name, Duration::from_secs(60)).await;
    eprintln!("restored and released {took:?} after the fault cleared");
    let (_, metrics) = controller.get("/metrics").await.unwrap();
    assert_eq!(metric(&metrics, "restatus_objects_retrying"), 0.0, "{metrics}");
    assert_eq!(metric(&metrics, "restatus_objects_quiesced"), 0.0, "{metrics}");
    assert!(controller.stop().success());
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
    let (spec, controller) = fleet_and_controller(&bed, "gone", &["--profile", file.to_str().unwrap()]).await;
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
    assert!(controller.stop().success());
}

/// Two replicas: the leader is killed in the middle of restoring a fleet. The standby is ready
/// all along, takes over within the lease duration and finishes; no object is restored twice
/// (one StatusRestored Event each at most) and none is left quiesced.
#[tokio::test]
async fn a_leader_killed_mid_restore_is_replaced_and_nothing_is_written_twice() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let spec = FleetSpec::new(&unique("failover"), 60, 60, 30);
    fleet::create(&bed.source().await, &spec, 16).await.unwrap();
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage(&spec.name);
    assert_success(&bed.restatus(&storage, &spec.name, &["backup", "--selector", &selector]), "backup");
    let lease_ns = unique("lease-ns");
    ensure_namespace(&bed, &lease_ns).await;
    let lease = unique("lease");
    let start = || {
        let args = ["--lease-name", lease.as_str(), "--concurrency", "2"];
        Controller::start_with(&bed, &bed.target_kubeconfig, &storage, &spec.name, &selector, &lease_ns, &args)
    };
    let (mut a, mut b) = (start(), start());
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
    tokio::time::sleep(Duration::from_millis(700)).await; // in the middle of the restore
    leader.child.kill().unwrap();
    let took = wait_restored(&bed, &spec.name, Duration::from_secs(90)).await;
    eprintln!("the standby finished the restore {took:?} after the leader was killed");

    let events = bed.kubectl(&bed.target_kubeconfig, &["get", "events.events.k8s.io", "-A", "-o", "json"]);
    assert_success(&events, "kubectl get events");
    let events: serde_json::Value = serde_json::from_str(&stdout(&events)).unwrap();
    let mut restored: std::collections::BTreeMap<String, u64> = Default::default();
    for event in events["items"].as_array().unwrap() {
        let name = event["regarding"]["name"].as_str().unwrap_or_default();
        if event["reason"] == "StatusRestored" && name.starts_with(&spec.name) {
            *restored.entry(name.to_string()).or_default() += event["series"]["count"].as_u64().unwrap_or(1);
        }
    }
    let twice: Vec<_> = restored.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "restored by both replicas: {twice:?}");
    assert!(standby.get("/metrics").await.is_some_and(|(_, m)| leader_of(&m)), "the standby leads now");
}
