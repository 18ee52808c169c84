//! Restore on the real test bed, after a simulated move (the same objects created on the
//! target without status, as `clusterctl move` does): every status back, idempotence, the
//! plan's verdicts, quiesce annotations, and faults during a restore.

use std::collections::BTreeMap;

use kube::api::{DeleteParams, Patch, PatchParams};
use restatus::domain::annotations::{OPERATION_ANNOTATION, QUIESCED_BY_ANNOTATION, RESTORED_FROM_ANNOTATION};
use restatus::domain::identity::Profile;
use restatus::fleet::{self, FLEET_LABEL, FleetSpec};
use restatus::k8s::Writer;
use restatus::restore::plan::{self, PlanInput, Verdict};
use restatus::restore::{Applier, RestoreOptions};
use serde_json::{Value, json};

use crate::bed::{
    Bed, TARGET, assert_stopped_cleanly, assert_success, copy_snapshot, fleet_state, forge, generate_age_keys,
    generate_keys, records, simulate_move, stderr, stdout, unique, wait_some_restored,
};

/// A fleet on the source, backed up under a cluster id of its own.
struct Scenario {
    bed: Bed,
    spec: FleetSpec,
    storage: String,
    cluster: String,
    snapshot: String,
}

impl Scenario {
    /// Every status of the source is on the target (`what`: why the message says so).
    async fn assert_source_statuses(&self, what: &str) {
        let (source, target) = (self.source_state().await, self.target_state().await);
        for (name, status) in &source {
            assert_eq!(&target[name].0, status, "{name} {what}");
        }
    }

    async fn new(servers: usize, claims: usize) -> Scenario {
        Self::with_backup(Bed::get(), servers, claims, &[]).await
    }

    /// The backup run with `extra` arguments (a signing key).
    async fn with_backup(bed: Bed, servers: usize, claims: usize, extra: &[&str]) -> Scenario {
        let spec = FleetSpec::new(&unique("rst"), servers, servers, claims);
        fleet::create(&bed.source().await, &spec, 16).await.expect("create fleet");
        let storage = bed.storage(&spec.name);
        let cluster = spec.name.clone();
        let selector = spec.selector();
        let mut args = vec!["backup", "--selector", &selector];
        args.extend(extra);
        let out = bed.restatus(&storage, &cluster, &args);
        assert_success(&out, "backup");
        let snapshot = stdout(&out).trim().to_string();
        Scenario { bed, spec, storage, cluster, snapshot }
    }

    async fn moved(servers: usize, claims: usize) -> Scenario {
        let s = Scenario::new(servers, claims).await;
        simulate_move(&s.bed.source().await, &s.bed.target().await, &s.spec.name, &|n| n.to_string()).await;
        s
    }

    fn restore(&self, extra: &[&str]) -> std::process::Output {
        let selector = self.spec.selector();
        let mut args = vec!["restore", "--selector", &selector, "-o", "json"];
        args.extend(extra);
        self.bed.restatus_with(&self.bed.target_kubeconfig, &self.storage, &self.cluster, &args, &[])
    }

    fn report(&self, extra: &[&str]) -> Value {
        let out = self.restore(extra);
        assert_success(&out, "restore");
        serde_json::from_str(&stdout(&out)).expect("restore -o json")
    }

    async fn source_state(&self) -> BTreeMap<String, Value> {
        fleet_state(&self.bed.source().await, &self.spec.name).await.into_iter().map(|(k, (s, _))| (k, s)).collect()
    }

    async fn target_state(&self) -> BTreeMap<String, (Value, BTreeMap<String, String>)> {
        fleet_state(&self.bed.target().await, &self.spec.name).await
    }

    fn options(&self) -> RestoreOptions {
        RestoreOptions { selector: Some(self.spec.selector()), ..RestoreOptions::new(Profile::metal_operator()) }
    }
}

trait Selector {
    fn selector(&self) -> String;
}

impl Selector for FleetSpec {
    fn selector(&self) -> String {
        format!("{FLEET_LABEL}={}", self.name)
    }
}

/// The report's `writeLimit`: it started at `start`, stayed within [1, `max`], and no more
/// writes were in flight than it ever let through.
fn assert_write_limit(report: &Value, start: u64, max: u64) {
    let limit = &report["writeLimit"];
    let field = |name: &str| limit[name].as_u64().unwrap_or_else(|| panic!("writeLimit.{name}: {limit}"));
    assert_eq!((field("start"), field("max")), (start, max), "{limit}");
    for name in ["final", "lowest", "highest"] {
        assert!((1..=max).contains(&field(name)), "{name} within [1, {max}]: {limit}");
    }
    assert!(field("lowest") <= field("final") && field("final") <= field("highest"), "{limit}");
    assert!((1..=field("highest")).contains(&field("peakInFlight")), "{limit}");
}

fn count(report: &Value, verdict: &str) -> u64 {
    report["counts"][verdict].as_u64().unwrap()
}

#[tokio::test]
async fn a_moved_fleet_gets_every_status_back_and_a_second_restore_writes_nothing() {
    let _target = TARGET.read().await;
    let s = Scenario::moved(40, 20).await;
    let before = s.target_state().await;
    assert_eq!(before.len(), 100);
    assert!(before.values().all(|(status, _)| status.is_null()), "the move must not carry status");

    let report = s.report(&[]);
    assert_eq!(report["snapshot"], s.snapshot.as_str());
    assert_eq!(count(&report, "restore"), 100);
    assert!(report["pairing"].as_array().unwrap().is_empty(), "{}", report["pairing"]);
    assert_eq!(report["writes"], 300, "quiesce, status and release: three writes per object");
    assert_write_limit(&report, 16, 64);

    let source = s.source_state().await;
    let target = s.target_state().await;
    for (name, status) in &source {
        let (restored, annotations) = &target[name];
        assert_eq!(restored, status, "{name}");
        assert_eq!(annotations.get(RESTORED_FROM_ANNOTATION).map(String::as_str), Some(s.snapshot.as_str()), "{name}");
        assert!(
            !annotations.contains_key(OPERATION_ANNOTATION) && !annotations.contains_key(QUIESCED_BY_ANNOTATION),
            "{name}: {annotations:?}"
        );
    }

    // One summary Event per kind, about its CRD, names the snapshot and the count; no restored
    // object has an Event of its own (Events are for people: only objects needing attention).
    let events = |selector: &str| {
        let out = s.bed.kubectl(
            &s.bed.target_kubeconfig,
            &["get", "events.events.k8s.io", "-A", "--field-selector", selector, "-o", "json"],
        );
        assert_success(&out, "kubectl get events");
        serde_json::from_str::<serde_json::Value>(&stdout(&out)).unwrap()["items"].as_array().unwrap().clone()
    };
    let summaries: Vec<String> = events("regarding.name=servers.metal.ironcore.dev")
        .iter()
        .filter_map(|e| e["note"].as_str().map(str::to_string))
        .filter(|note| note.contains(&s.snapshot))
        .collect();
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    assert!(summaries[0].starts_with("restored the status of "), "{}", summaries[0]);
    let own = events(&format!("regarding.name={}", s.spec.server_name(0)));
    assert!(own.is_empty(), "a restored object without trouble has no Event of its own: {own:?}");

    let again = s.report(&[]);
    assert_eq!(again["writes"], 0);
    assert_eq!(count(&again, "already-equal"), 100);
}

#[tokio::test]
async fn a_renamed_server_is_matched_by_its_system_uuid() {
    let _target = TARGET.read().await;
    // An unclaimed server: renaming a claimed one would break its claim's serverRef.
    let s = Scenario::new(4, 2).await;
    let renamed = s.spec.server_name(3);
    simulate_move(&s.bed.source().await, &s.bed.target().await, &s.spec.name, &|n| {
        if n == renamed { format!("{n}-renamed") } else { n.to_string() }
    })
    .await;
    let report = s.report(&[]);
    let item = report["plan"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["target"]["name"] == format!("{renamed}-renamed"))
        .expect("the renamed server is in the plan");
    assert_eq!(item["verdict"], "restore");
    assert_eq!(item["source"]["name"], renamed.as_str());
    assert!(item["key"].as_str().unwrap().starts_with("spec.systemUUID="));
    let target = s.target_state().await;
    let source = s.source_state().await;
    assert_eq!(target[&format!("Server {renamed}-renamed")].0, source[&format!("Server {renamed}")]);
}

#[tokio::test]
async fn a_dry_run_shows_the_plan_with_diffs_and_writes_nothing() {
    let _target = TARGET.read().await;
    let s = Scenario::moved(3, 1).await;
    let report = s.report(&["--dry-run"]);
    assert_eq!(report["dryRun"], true);
    assert_eq!(count(&report, "restore"), 7);
    let server = report["plan"]["items"].as_array().unwrap().iter().find(|i| i["kind"] == "Server").unwrap();
    let changes: Vec<String> =
        server["changes"].as_array().unwrap().iter().map(|c| c["field"].as_str().unwrap().to_string()).collect();
    assert!(
        changes.contains(&"networkInterfaces".to_string()) && changes.contains(&"state".to_string()),
        "{changes:?}"
    );
    assert!(
        s.target_state()
            .await
            .values()
            .all(|(status, a)| status.is_null() && a.get(RESTORED_FROM_ANNOTATION).is_none())
    );
    // The table form shows each change under its object.
    let out = s.bed.restatus_with(
        &s.bed.target_kubeconfig,
        &s.storage,
        &s.cluster,
        &["restore", "--dry-run", "--selector", &s.spec.selector()],
        &[],
    );
    assert_success(&out, "restore --dry-run");
    assert!(stdout(&out).contains("status.networkInterfaces: (absent) -> [8 items]"), "{}", stdout(&out));
    assert!(stdout(&out).contains("dry run: nothing written"));
}

#[tokio::test]
async fn a_status_that_moved_on_is_kept_unless_forced_and_a_users_ignore_stays() {
    let _target = TARGET.read().await;
    let s = Scenario::moved(3, 1).await;
    let target = s.bed.target().await;
    let profile = Profile::metal_operator();
    let servers = restatus::k8s::api_for(&target, profile.kind("Server").unwrap(), None);
    let newer = json!({"status": {"state": "Maintenance", "powerState": "Off"}});
    servers.patch_status(&s.spec.server_name(2), &PatchParams::default(), &Patch::Merge(&newer)).await.unwrap();
    let users = json!({"metadata": {"annotations": {OPERATION_ANNOTATION: "ignore"}}});
    servers.patch(&s.spec.server_name(1), &PatchParams::default(), &Patch::Merge(&users)).await.unwrap();

    let report = s.report(&[]);
    assert_eq!(count(&report, "skip-newer"), 1);
    let state = s.target_state().await;
    assert_eq!(
        state[&format!("Server {}", s.spec.server_name(2))].0["state"],
        "Maintenance",
        "overwritten without --force"
    );
    let (status, annotations) = &state[&format!("Server {}", s.spec.server_name(1))];
    assert_eq!(status, &s.source_state().await[&format!("Server {}", s.spec.server_name(1))]);
    assert_eq!(
        annotations.get(OPERATION_ANNOTATION).map(String::as_str),
        Some("ignore"),
        "a user's own ignore must stay"
    );

    let out = s.restore(&["--force"]);
    assert_success(&out, "restore --force");
    assert!(stderr(&out).contains("--force"), "--force must say so: {}", stderr(&out));
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(count(&report, "restore"), 1);
    assert_eq!(
        s.target_state().await[&format!("Server {}", s.spec.server_name(2))].0,
        s.source_state().await[&format!("Server {}", s.spec.server_name(2))]
    );
}

#[tokio::test]
async fn objects_arriving_quiesced_by_restatus_are_restored_then_released() {
    let _target = TARGET.read().await;
    let s = Scenario::new(3, 1).await;
    // The source-side handshake (or a crashed run) left restatus's ignore on every object.
    let source = s.bed.source().await;
    let profile = Profile::metal_operator();
    let quiesce =
        json!({"metadata": {"annotations": {OPERATION_ANNOTATION: "ignore", QUIESCED_BY_ANNOTATION: "restatus"}}});
    for (kind, names) in [
        ("Server", (0..3).map(|i| s.spec.server_name(i)).collect::<Vec<_>>()),
        ("BMC", (0..3).map(|i| s.spec.bmc_name(i)).collect()),
    ] {
        let api = restatus::k8s::api_for(&source, profile.kind(kind).unwrap(), None);
        for name in names {
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&quiesce)).await.unwrap();
        }
    }
    simulate_move(&source, &s.bed.target().await, &s.spec.name, &|n| n.to_string()).await;
    assert!(
        s.target_state()
            .await
            .iter()
            .filter(|(k, _)| !k.starts_with("ServerClaim"))
            .all(|(_, (_, a))| a.contains_key(QUIESCED_BY_ANNOTATION))
    );

    let report = s.report(&[]);
    assert_eq!(count(&report, "restore"), 7);
    assert_eq!(report["writes"], 6 * 2 + 3, "pre-quiesced objects need no quiesce write");
    for (name, (_, annotations)) in s.target_state().await {
        assert!(
            !annotations.contains_key(OPERATION_ANNOTATION) && !annotations.contains_key(QUIESCED_BY_ANNOTATION),
            "{name}: {annotations:?}"
        );
    }

    // A crash after the status write but before the release: the next run releases only.
    let target = s.bed.target().await;
    let servers = restatus::k8s::api_for(&target, profile.kind("Server").unwrap(), None);
    servers.patch(&s.spec.server_name(0), &PatchParams::default(), &Patch::Merge(&quiesce)).await.unwrap();
    let report = s.report(&[]);
    assert_eq!(report["writes"], 1);
    assert_eq!(count(&report, "already-equal"), 7);
    assert!(!s.target_state().await[&format!("Server {}", s.spec.server_name(0))].1.contains_key(OPERATION_ANNOTATION));
}

#[tokio::test]
async fn a_snapshot_that_matches_nothing_writes_nothing() {
    let _target = TARGET.read().await;
    let s = Scenario::new(2, 1).await;
    // Nothing moved: every record is missing on the target.
    let report = s.report(&[]);
    assert_eq!(count(&report, "missing-on-target"), 5);
    assert_eq!(report["writes"], 0);
}

#[tokio::test]
async fn two_target_objects_with_one_key_are_ambiguous_and_left_alone() {
    let _target = TARGET.read().await;
    let s = Scenario::new(2, 0).await;
    let twin = s.spec.server_name(0);
    simulate_move(&s.bed.source().await, &s.bed.target().await, &s.spec.name, &|n| n.to_string()).await;
    // A second object on the target with server 0's system UUID.
    simulate_move(&s.bed.source().await, &s.bed.target().await, &s.spec.name, &|n| format!("{n}-twin")).await;
    let report = s.report(&[]);
    let ambiguous: Vec<&Value> =
        report["plan"]["items"].as_array().unwrap().iter().filter(|i| i["verdict"] == "ambiguous").collect();
    assert!(
        ambiguous.iter().any(
            |i| i["source"]["name"] == twin.as_str() && i["reason"].as_str().unwrap().contains("matches 2 objects")
        ),
        "{ambiguous:?}"
    );
    let state = s.target_state().await;
    assert!(state[&format!("Server {twin}")].0.is_null() && state[&format!("Server {twin}-twin")].0.is_null());
}

#[tokio::test]
async fn deletions_and_conflicts_during_the_apply_are_handled() {
    let _target = TARGET.read().await;
    let s = Scenario::moved(3, 0).await;
    let target = s.bed.target().await;
    let store = s.bed.store(&s.storage, &s.cluster);
    let options = s.options();
    let loaded = restatus::store::choose_snapshot(&store, None, &Default::default()).await.unwrap();
    let live = restatus::moving::live::read_live(&target, &options.profile, &options.page(), true).await.unwrap();
    let plan = plan::plan(&PlanInput {
        profile: &options.profile,
        snapshot: &loaded.manifest.snapshot_id,
        snapshot_time: Some(loaded.manifest.created_at),
        records: &loaded.records,
        live: &live.objects,
        force: false,
        explain: true,
    })
    .unwrap();
    assert_eq!(plan.counts()[&Verdict::Restore], 6);

    // Between plan and apply: server 0 is deleted, server 1 gets an initial status (a
    // conflict that still restores), server 2 moves on (a conflict that turns into skip-newer).
    let servers = restatus::k8s::api_for(&target, options.profile.kind("Server").unwrap(), None);
    servers.delete(&s.spec.server_name(0), &DeleteParams::default()).await.unwrap();
    let initial = json!({"status": {"state": "Initial"}});
    servers.patch_status(&s.spec.server_name(1), &PatchParams::default(), &Patch::Merge(&initial)).await.unwrap();
    let moved_on = json!({"status": {"state": "Available", "powerState": "On"}});
    servers.patch_status(&s.spec.server_name(2), &PatchParams::default(), &Patch::Merge(&moved_on)).await.unwrap();

    let writer = Writer::new(&target, &options.profile).await.unwrap();
    let applier = Applier::new(&writer, &options.profile, &loaded.manifest, &loaded.records, false);
    let outcomes = applier.apply(&plan, &live.objects, 4).await;
    let by_name: BTreeMap<String, (Verdict, Option<String>)> =
        outcomes.into_iter().map(|o| (o.object.name.clone(), (o.verdict, o.error))).collect();
    assert_eq!(by_name[&s.spec.server_name(0)], (Verdict::MissingOnTarget, None));
    assert_eq!(by_name[&s.spec.server_name(1)], (Verdict::Restore, None));
    assert_eq!(by_name[&s.spec.server_name(2)], (Verdict::SkipNewer, None));
    let state = s.target_state().await;
    let source = s.source_state().await;
    let server = |i: usize| format!("Server {}", s.spec.server_name(i));
    assert_eq!(state[&server(1)].0, source[&server(1)], "restored over the initial status");
    assert_eq!(state[&server(2)].0, moved_on["status"], "the status that moved on is kept");
    let (_, annotations) = &state[&server(2)];
    assert!(!annotations.contains_key(OPERATION_ANNOTATION), "a skipped object is released: {annotations:?}");
}

#[tokio::test]
async fn a_restore_interrupted_by_an_api_server_restart_is_completed_by_the_rerun() {
    let _exclusive = TARGET.write().await;
    let s = Scenario::moved(150, 60).await;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_restatus"))
        .args(["restore", "--concurrency", "1", "--selector", &s.spec.selector(), "--kubeconfig"])
        .arg(&s.bed.target_kubeconfig)
        .env("RESTATUS_STORAGE", &s.storage)
        .env("RESTATUS_CLUSTER_ID", &s.cluster)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Once it is provably writing (objects restored, one at a time, so most are still to
    // come), kill the target API server hard and bring it back.
    wait_some_restored(&s.bed.target().await, &s.spec.name, 3, std::time::Duration::from_secs(60)).await;
    let restart = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/testbed"))
        .args(["restart-apiserver", "target", "--hard"])
        .output()
        .unwrap();
    assert_success(&restart, "restart-apiserver");
    let first = child.wait().unwrap();
    let midway = s.target_state().await;
    let restored = midway.values().filter(|(st, _)| !st.is_null()).count();
    assert!(restored < midway.len() || !first.success(), "the restart did not interrupt the restore");

    let report = s.report(&[]);
    assert!(report["pairing"].as_array().unwrap().is_empty());
    let source = s.source_state().await;
    let target = s.target_state().await;
    for (name, status) in &source {
        assert_eq!(&target[name].0, status, "{name} lost");
        assert!(!target[name].1.contains_key(QUIESCED_BY_ANNOTATION), "{name} still quiesced");
    }
    assert_eq!(s.report(&[])["writes"], 0);
}

#[tokio::test]
async fn damaged_and_foreign_snapshots_are_skipped_for_the_previous_good_one() {
    let _target = TARGET.read().await;
    let s = Scenario::moved(2, 1).await;
    let store = s.bed.store(&s.storage, &s.cluster);
    // A newer snapshot whose payload is truncated.
    let out = s.bed.restatus(&s.storage, &s.cluster, &["backup", "--selector", &s.spec.selector()]);
    assert_success(&out, "second backup");
    let damaged: restatus::format::SnapshotId = stdout(&out).trim().parse().unwrap();
    let payload = object_store::ObjectStoreExt::get(store.object_store().as_ref(), &store.payload_path(&damaged))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    object_store::ObjectStoreExt::put(
        store.object_store().as_ref(),
        &store.payload_path(&damaged),
        payload.slice(..payload.len() / 2).into(),
    )
    .await
    .unwrap();
    // And a newer one still: another cluster's snapshot copied under this cluster's folder.
    let other = Scenario::new(1, 0).await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let out = other.bed.restatus(&s.storage, &other.cluster, &["backup", "--selector", &other.spec.selector()]);
    assert_success(&out, "other cluster's backup");
    let foreign: restatus::format::SnapshotId = stdout(&out).trim().parse().unwrap();
    let other_store = s.bed.store(&s.storage, &other.cluster);
    for (from, to) in [
        (other_store.manifest_path(&foreign), store.manifest_path(&foreign)),
        (other_store.payload_path(&foreign), store.payload_path(&foreign)),
    ] {
        let bytes = object_store::ObjectStoreExt::get(store.object_store().as_ref(), &from)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        object_store::ObjectStoreExt::put(store.object_store().as_ref(), &to, bytes.into()).await.unwrap();
    }

    let report = s.report(&[]);
    assert_eq!(report["snapshot"], s.snapshot.as_str(), "the oldest, good snapshot is used");
    let passed: Vec<String> =
        report["passedOver"].as_array().unwrap().iter().map(|p| p["reason"].as_str().unwrap().to_string()).collect();
    assert_eq!(passed.len(), 2, "{passed:?}");
    assert!(passed[0].contains(foreign.as_str()) && passed[0].contains("belongs to cluster"), "{passed:?}");
    assert!(passed[1].contains(damaged.as_str()) && passed[1].contains("truncated"), "{passed:?}");
    assert_eq!(count(&report, "restore"), 5);

    // Pinning the damaged one fails, naming it.
    let out = s.restore(&["--snapshot", damaged.as_str()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains(damaged.as_str()) && stderr(&out).contains("truncated"), "{}", stderr(&out));
}

/// A kind whose CRD has no status subresource: its status is part of the object, so restatus
/// writes it through the object itself (found by discovery), with the same quiesce, verdicts
/// and idempotence.
#[tokio::test]
async fn a_kind_without_status_subresource_is_restored_through_the_object() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let crd = r#"{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
      "metadata": {"name": "gadgets.e2e.restatus.dev"},
      "spec": {"group": "e2e.restatus.dev", "scope": "Cluster",
        "names": {"kind": "Gadget", "plural": "gadgets", "singular": "gadget", "listKind": "GadgetList"},
        "versions": [{"name": "v1", "served": true, "storage": true,
          "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}}"#;
    let crd_file = bed.scratch.path().join("gadget-crd.json");
    std::fs::write(&crd_file, crd).unwrap();
    for kubeconfig in [&bed.source_kubeconfig, &bed.target_kubeconfig] {
        assert_success(&bed.kubectl(kubeconfig, &["apply", "-f", crd_file.to_str().unwrap()]), "apply CRD");
        let established = ["wait", "--for=condition=Established", "crd/gadgets.e2e.restatus.dev", "--timeout=60s"];
        assert_success(&bed.kubectl(kubeconfig, &established), "CRD established");
    }
    let profile_file = bed.scratch.path().join("gadgets.yaml");
    std::fs::write(
        &profile_file,
        "name: gadgets\nkinds:\n- {group: e2e.restatus.dev, version: v1, kind: Gadget, plural: gadgets, keys: [{path: spec.serial}]}\n",
    )
    .unwrap();
    let profile = Profile::load(profile_file.to_str().unwrap()).unwrap();
    let kind = &profile.kinds[0];
    let fleet = unique("gdg");
    let gadget = |i: usize, status: bool| {
        let mut object = json!({
            "apiVersion": "e2e.restatus.dev/v1", "kind": "Gadget",
            "metadata": {"name": format!("{fleet}-{i}"), "labels": {FLEET_LABEL: fleet}},
            "spec": {"serial": format!("{fleet}-SN-{i}")},
        });
        if status {
            object["status"] = json!({"state": "Ready", "ports": [{"name": "p0", "speed": 25}, {"name": "p1"}]});
        }
        serde_json::from_value::<kube::api::DynamicObject>(object).unwrap()
    };
    let (source, target) = (bed.source().await, bed.target().await);
    for i in 0..3 {
        let post = kube::api::PostParams::default();
        restatus::k8s::api_for(&source, kind, None).create(&post, &gadget(i, true)).await.unwrap();
        restatus::k8s::api_for(&target, kind, None).create(&post, &gadget(i, false)).await.unwrap();
    }
    let storage = bed.storage(&fleet);
    let selector = format!("{FLEET_LABEL}={fleet}");
    let profile_arg = profile_file.to_str().unwrap();
    let backup = bed.restatus(&storage, &fleet, &["backup", "--profile", profile_arg, "--selector", &selector]);
    assert_success(&backup, "backup");

    let restore = || {
        let args = ["restore", "--profile", profile_arg, "--selector", &selector, "-o", "json"];
        let out = bed.restatus_with(&bed.target_kubeconfig, &storage, &fleet, &args, &[]);
        assert_success(&out, "restore");
        serde_json::from_str::<Value>(&stdout(&out)).unwrap()
    };
    let report = restore();
    assert_eq!(report["counts"]["restore"], 3, "{report:#}");
    assert_eq!(report["writes"], 9, "quiesce, status, release per object");
    for i in 0..3 {
        let live = restatus::k8s::api_for(&target, kind, None).get(&format!("{fleet}-{i}")).await.unwrap();
        assert_eq!(live.data["status"], gadget(i, true).data["status"]);
        let annotations = live.metadata.annotations.unwrap_or_default();
        assert!(!annotations.contains_key(OPERATION_ANNOTATION) && !annotations.contains_key(QUIESCED_BY_ANNOTATION));
        assert_eq!(annotations[RESTORED_FROM_ANNOTATION], stdout(&backup).trim());
    }
    let again = restore();
    assert_eq!((again["writes"].as_u64(), &again["counts"]["already-equal"]), (Some(0), &json!(3)), "{again:#}");
}

/// metal-operator's operation annotation carries many values. A pending operation (`park`, a
/// power reset) is put back exactly when restatus releases the object; the operator's own
/// ignore values count as quiesced, are never removed, and their objects are restored too.
#[tokio::test]
async fn every_value_of_the_operators_operation_annotation_is_respected() {
    let _target = TARGET.read().await;
    let s = Scenario::moved(4, 0).await;
    let target = s.bed.target().await;
    let servers = restatus::k8s::api_for(&target, Profile::metal_operator().kind("Server").unwrap(), None);
    let values = ["park", "ForceOff", "ignore-child-and-self", "ignore-propagated"];
    for (i, value) in values.iter().enumerate() {
        let body = json!({"metadata": {"annotations": {OPERATION_ANNOTATION: value}}});
        servers.patch(&s.spec.server_name(i), &PatchParams::default(), &Patch::Merge(&body)).await.unwrap();
    }
    let report = s.report(&[]);
    assert_eq!(count(&report, "restore"), 8, "{}", report["plan"]);

    let source = s.source_state().await;
    let target_state = s.target_state().await;
    for (i, value) in values.iter().enumerate() {
        let name = format!("Server {}", s.spec.server_name(i));
        let (status, annotations) = &target_state[&name];
        assert_eq!(status, &source[&name], "{name} restored");
        assert_eq!(annotations.get(OPERATION_ANNOTATION).map(String::as_str), Some(*value), "{name}: {annotations:?}");
        assert!(
            !annotations.contains_key(QUIESCED_BY_ANNOTATION)
                && !annotations.contains_key(restatus::domain::annotations::OPERATION_WAS_ANNOTATION),
            "{name}: {annotations:?}"
        );
    }
    // Servers already quiesced by the operator's own values: status and restored-from (2 writes);
    // the other Servers and the BMCs: quiesce, status, release (3 writes).
    assert_eq!(report["writes"], 2 * 2 + 2 * 3 + 4 * 3, "{}", report["outcomes"]);
}

/// F67: `--max-concurrency 1` writes one object's writes at a time, whatever `--concurrency`
/// says: the limit starts at the max and never leaves 1, and the gate never let a second write
/// through (`peakInFlight`, counted at the gate over the whole run), while every status comes
/// back.
#[tokio::test]
async fn a_restore_at_max_concurrency_1_writes_one_at_a_time_and_reports_its_limit() {
    let _target = TARGET.read().await;
    let s = Scenario::moved(20, 10).await;
    let report = s.report(&["--max-concurrency", "1"]);
    assert_eq!(count(&report, "restore"), 50);
    assert_eq!(report["writes"], 150, "quiesce, status and release: three writes per object");
    assert_write_limit(&report, 1, 1);
    let limit = &report["writeLimit"];
    assert_eq!(
        (limit["final"].as_u64(), limit["highest"].as_u64(), limit["peakInFlight"].as_u64()),
        (Some(1), Some(1), Some(1)),
        "{limit}"
    );
    s.assert_source_statuses("restored").await;
}

/// F50: SIGTERM in the middle of a one-shot restore (the issue's repro: 12 s into a restore of
/// 3,000 Servers it exited 143 without a summary and left 13 objects quiesced).
#[tokio::test]
async fn a_restore_stopped_by_sigterm_finishes_what_it_started_releases_it_and_says_what_remains() {
    let _exclusive = TARGET.write().await;
    let s = Scenario::moved(300, 0).await;
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_restatus"))
        .args(["restore", "--concurrency", "2", "--selector", &s.spec.selector(), "-o", "json", "--kubeconfig"])
        .arg(&s.bed.target_kubeconfig)
        .env("RESTATUS_STORAGE", &s.storage)
        .env("RESTATUS_CLUSTER_ID", &s.cluster)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // SIGTERM once the restore has restored some objects: it is writing then.
    wait_some_restored(&s.bed.target().await, &s.spec.name, 5, std::time::Duration::from_secs(120)).await;
    let _ = std::process::Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await.unwrap().unwrap();

    assert!(!out.status.success(), "a stopped restore exits non-zero");
    let report: Value = serde_json::from_str(&stdout(&out)).expect("the report, on stdout, after the signal");
    let not_started = report["stopped"]["writesNotStarted"].as_u64().expect("the report says it stopped");
    let message = stderr(&out);
    assert!(message.contains("restore stopped by a signal"), "{message}");
    assert!(
        not_started > 0 || !report["stopped"]["kindsNotReached"].as_array().unwrap().is_empty(),
        "the report says nothing was left: {}",
        report["stopped"]
    );
    let restored = assert_stopped_cleanly(&s.target_state().await);
    assert_eq!(report["writes"].as_u64().unwrap() as usize, 3 * restored, "quiesce, status, release of each started");

    // The rerun does the rest.
    let rerun = s.report(&[]);
    assert!(rerun.get("stopped").is_none());
    s.assert_source_statuses("lost").await;
}

/// F53: the target backs up under the source's cluster id (one chart value for every role):
/// its own snapshot is newer, consistent, and holds none of the fleet's statuses. A restore
/// on the target passes over it (the manifest says it was captured from the target) and
/// restores from the source's; pinned, it is refused unless `--allow-same-cluster`.
#[tokio::test]
async fn a_restore_never_uses_a_snapshot_captured_from_its_own_cluster() {
    let _exclusive = TARGET.write().await;
    // No claims: the target's own capture of bare objects is then consistent (a bare claim's
    // binding would make it inconsistent, and passed over for that alone).
    let s = Scenario::moved(3, 0).await;
    // The target's bare objects hold no status, far fewer records than the source's snapshot:
    // the record-drop guard (F160) would mark the capture and exit 4; this test is about its origin.
    let backup = ["backup", "--selector", &s.spec.selector(), "--max-record-drop", "100"];
    let out = s.bed.restatus_with(&s.bed.target_kubeconfig, &s.storage, &s.cluster, &backup, &[]);
    assert_success(&out, "backup of the target under the source's id");
    let own = stdout(&out).trim().to_string();

    let pinned = s.restore(&["--snapshot", &own]);
    assert!(!pinned.status.success(), "a pinned own snapshot is refused");
    assert!(stderr(&pinned).contains("captured from this cluster"), "{}", stderr(&pinned));

    let report = s.report(&[]);
    assert_eq!(report["snapshot"], s.snapshot.as_str(), "the source's snapshot");
    let passed = &report["passedOver"][0];
    assert_eq!(passed["snapshot"], own.as_str());
    assert!(passed["reason"].as_str().unwrap().contains("captured from this cluster"), "{passed}");
    s.assert_source_statuses("restored from the source's snapshot").await;
}

/// F70-F73 end to end: a real backup signed with a key from `restatus keys generate`, then a
/// forgery by whoever can write the bucket (payload changed, size and sha256 recomputed into a
/// manifest dated now, unsigned). With the public key, `restore` passes it over, naming it, and
/// restores the signed snapshot as before; with another key it refuses both; with the old and
/// a new key (a rotation) the signed one is used; a signature copied from the real snapshot
/// does not make the forgery pass; `snapshots list` shows who signed what. Without a key the
/// forgery is used, as before signing existed.
#[tokio::test]
async fn signed_snapshots_a_forgery_is_refused_with_the_key_and_the_signed_one_restored() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (private, public, key_id) = generate_keys(&bed, "backup");
    let (_, other, other_id) = generate_keys(&bed, "other");
    let (private, public, other) =
        (private.display().to_string(), public.display().to_string(), other.display().to_string());
    let s = Scenario::with_backup(bed, 2, 1, &["--signing-key", &private]).await;
    simulate_move(&s.bed.source().await, &s.bed.target().await, &s.spec.name, &|n| n.to_string()).await;
    let store = s.bed.store(&s.storage, &s.cluster);
    let forged = forge(&store, &s.snapshot).await;
    let snapshots = |args: &[&str]| s.bed.restatus(&s.storage, &s.cluster, &[&["snapshots"], args].concat());

    // `snapshots list`: who signed what, and with the key, what verifies.
    let out = snapshots(&["list", "-o", "json", "--trusted-key", &public]);
    assert_success(&out, "snapshots list");
    let rows: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let row = |id: &str| rows.as_array().unwrap().iter().find(|r| r["id"] == id).unwrap().clone();
    assert_eq!(
        (row(&s.snapshot)["signedBy"].as_str(), row(&s.snapshot)["signature"].as_str()),
        (Some(key_id.as_str()), Some("verified"))
    );
    let forged_row = row(forged.as_str());
    assert_eq!((forged_row["signedBy"].as_str(), forged_row["signature"].as_str()), (None, Some("refused")));
    assert!(forged_row["error"].as_str().unwrap().contains("not signed"), "{forged_row}");
    let table = stdout(&snapshots(&["list"]));
    assert!(
        table.contains("SIGNED BY") && table.contains(&format!("{key_id} (not checked)")) && table.contains("unsigned"),
        "{table}"
    );

    // Without a key: today's behaviour, the newest complete snapshot (the forgery).
    assert_eq!(s.report(&["--dry-run"])["snapshot"], forged.as_str());

    // Another key only: nothing is trusted; pinned, the signed snapshot is refused by name.
    let out = s.restore(&["--trusted-key", &other]);
    assert!(!out.status.success() && stderr(&out).contains("no good snapshot"), "{}", stderr(&out));
    let out = s.restore(&["--trusted-key", &other, "--snapshot", &s.snapshot]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&s.snapshot)
            && err.contains(&format!("signed by key {key_id}, which is not a trusted key (trusted: {other_id})")),
        "{err}"
    );
    assert!(!err.contains("PRIVATE KEY") && !err.contains("PUBLIC KEY"), "key material in the output: {err}");

    // With the key: the forgery is passed over, naming it, and the signed snapshot restores.
    let report = s.report(&["--trusted-key", &public]);
    assert_eq!(report["snapshot"], s.snapshot.as_str(), "the signed snapshot, not the forgery");
    let passed = report["passedOver"].as_array().unwrap();
    assert_eq!(passed.len(), 1, "{passed:?}");
    assert_eq!(passed[0]["snapshot"], forged.as_str());
    assert!(passed[0]["reason"].as_str().unwrap().contains(&format!("snapshot {forged}: not signed")), "{passed:?}");
    assert_eq!(count(&report, "restore"), 5);
    let target = s.target_state().await;
    let target: BTreeMap<String, Value> = target.into_iter().map(|(k, (status, _))| (k, status)).collect();
    assert_eq!(target, s.source_state().await, "the source's statuses, none of the forgery's");

    // A rotation: the old key and a new one trusted at once (as the environment lists them).
    let out = s.bed.restatus_with(
        &s.bed.target_kubeconfig,
        &s.storage,
        &s.cluster,
        &["restore", "--selector", &s.spec.selector(), "-o", "json"],
        &[("RESTATUS_TRUSTED_KEYS", &format!("{other},{public}"))],
    );
    assert_success(&out, "restore with two trusted keys");
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!((report["snapshot"].as_str(), report["writes"].as_u64()), (Some(s.snapshot.as_str()), Some(0)));

    // The real snapshot's signature copied beside the forgery: a signature of another manifest.
    let signature = object_store::ObjectStoreExt::get(
        store.object_store().as_ref(),
        &store.signature_path(&s.snapshot.parse().unwrap()),
    )
    .await
    .unwrap()
    .bytes()
    .await
    .unwrap();
    object_store::ObjectStoreExt::put(store.object_store().as_ref(), &store.signature_path(&forged), signature.into())
        .await
        .unwrap();
    let out = snapshots(&["verify", forged.as_str(), "--trusted-key", &public]);
    let text = stdout(&out);
    assert!(
        !out.status.success()
            && text.contains(&format!("{forged}: FAILED"))
            && text.contains("a signature of another manifest"),
        "{text}"
    );
    let out = snapshots(&["verify", &s.snapshot, "--trusted-key", &public]);
    assert_success(&out, "verify the signed snapshot");
    assert!(stdout(&out).contains(&format!("signature of trusted key {key_id}")), "{}", stdout(&out));
}

/// Runs `restatus restore` as [`Scenario::restore`] does and returns its report and the most
/// memory it held: its resident set's high-water mark (`VmHWM`), read from `/proc` every 10 ms
/// while it runs (the mark only rises, so the last reading is the peak up to 10 ms before it
/// exits; a download of the size these tests plant takes far longer). Not `wait4`'s `maxrss`:
/// that counts the test process's memory copied into the child before its `exec`.
/// The restores measured here stop behind the bucket: they must exit 5.
async fn restore_measured(s: &Scenario, extra: &[&str]) -> (Value, u64) {
    use std::io::Read;
    let selector = s.spec.selector();
    let mut args = vec!["restore", "--selector", &selector, "-o", "json"];
    args.extend(extra);
    let mut child = Bed::command(&s.bed.target_kubeconfig, &s.storage, &s.cluster, &args, &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start restatus restore");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        stdout.read_to_string(&mut out).map(|_| out)
    });
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0u64;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&status_file)
            && let Some(kb) = text.lines().find_map(|l| l.strip_prefix("VmHWM:"))
        {
            peak = peak.max(kb.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0) * 1024);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "the restore did not end within 120 s");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    let out = reader.join().unwrap().unwrap();
    // Both restores here stop at the planted segment: behind the bucket's newest point (F162).
    assert_eq!(status.code(), Some(5), "restore exits 5, behind the bucket: {out}");
    (serde_json::from_str(&out).expect("restore -o json"), peak)
}

/// F140 and F146 on the bed: 200 MiB planted at the records of segment 1 of the signed
/// snapshot, its header signed by a forger's key and declaring those 200 MiB (under the 1 GiB
/// limit). With the key, a restore stops the chain at that header and never downloads the
/// records: its peak memory stays far below them (before: read whole into memory, the pod's
/// 512 MiB limit reached at a few hundred MB). Without keys, the same records are read into a
/// temporary file, found corrupt, and memory stays as low. With a forged manifest dated after
/// it, `snapshots show latest` and `verify latest` with the key are the signed snapshot.
#[tokio::test]
async fn a_planted_segment_is_not_downloaded_and_latest_with_a_key_is_the_signed_snapshot() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (private, public, _) = generate_keys(&bed, "backup");
    let (private, public) = (private.display().to_string(), public.display().to_string());
    let s = Scenario::with_backup(bed, 2, 1, &["--signing-key", &private]).await;
    let store = s.bed.store(&s.storage, &s.cluster);
    let base: restatus::format::SnapshotId = s.snapshot.parse().unwrap();
    let manifest = store.manifest(&base).await.unwrap();
    const PLANTED: usize = 200 << 20;
    let planted: Vec<u8> = (0..PLANTED).map(|i| (i % 251) as u8).collect();
    let (_, mut summary) = restatus::fixtures::encode(&[]);
    summary.size = PLANTED as u64;
    summary.sha256 = restatus::format::sha256_hex(&planted);
    let mut header = restatus::format::SegmentHeader::new(
        &s.cluster,
        &base,
        1,
        None,
        manifest.created_at,
        manifest.created_at + jiff::SignedDuration::from_secs(5),
        BTreeMap::new(),
        (0, 0),
        summary,
        None,
    );
    let forger = restatus::format::SigningKey::generate();
    store.put_segment(&mut header, planted, Some(&forger)).await.unwrap();

    let bound = 120 << 20;
    let (report, peak) = restore_measured(&s, &["--dry-run", "--trusted-key", &public]).await;
    let gap = report["restoredTo"]["gap"].as_str().unwrap_or_default().to_string();
    assert!(gap.contains("segment 1 of base") && gap.contains("signature refused"), "{report}");
    assert_eq!(report["snapshot"], s.snapshot.as_str());
    eprintln!("restore with the key: peak resident {} MiB", peak >> 20);
    assert!(peak < bound, "the restore held {} MiB: the planted records were downloaded", peak >> 20);

    let (report, peak) = restore_measured(&s, &["--dry-run"]).await;
    let gap = report["restoredTo"]["gap"].as_str().unwrap_or_default().to_string();
    assert!(gap.contains("segment 1 of base") && gap.contains("corrupt"), "{report}");
    eprintln!("restore without keys: peak resident {} MiB", peak >> 20);
    assert!(peak < bound, "the restore held {} MiB: the records were read into memory", peak >> 20);

    let forged = forge(&store, &s.snapshot).await;
    let snapshots = |args: &[&str]| s.bed.restatus(&s.storage, &s.cluster, &[&["snapshots"], args].concat());
    let out = snapshots(&["show", "latest", "--no-journal", "-o", "json", "--trusted-key", &public]);
    assert_success(&out, "snapshots show latest");
    let shown: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(shown["snapshotId"], s.snapshot.as_str(), "latest is the forgery {forged}: {shown}");
    let out = snapshots(&["verify", "latest", "--trusted-key", &public]);
    assert_success(&out, "snapshots verify latest");
    assert!(stdout(&out).starts_with(&format!("{}: OK", s.snapshot)), "{}", stdout(&out));
}

/// Every string under a `serialNumber` or `macAddress` field of `value`: what identifies the
/// fleet's machines.
fn identities(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("serialNumber" | "macAddress", Value::String(s)) => out.push(s.clone()),
                    _ => identities(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| identities(v, out)),
        _ => {}
    }
}

/// What a reader of the bucket without a key sees of a payload: its bytes, and what they
/// decompress to when they are zstd at all.
fn readable(bytes: &[u8]) -> String {
    let mut out = String::from_utf8_lossy(bytes).into_owned();
    if let Ok(plain) = zstd::decode_all(bytes) {
        out.push_str(&String::from_utf8_lossy(&plain));
    }
    out
}

/// F80-F82 end to end: a fleet backed up plain, then encrypted to a recipient from `restatus
/// keys generate --age`. The encrypted payload in the bucket holds none of the fleet's serial
/// numbers or MACs (the plain one, decompressed, holds every one), nor does its manifest.
/// Without the key a restore passes it over for the plain snapshot, naming it, and refuses it
/// pinned, saying it is encrypted and to whom; with another key the same, saying it does not
/// decrypt; with the key every status comes back from it. `snapshots list` shows which
/// snapshots are encrypted, and `verify` reads it only with the key.
#[tokio::test]
async fn encrypted_snapshots_hold_no_readable_status_and_restore_only_with_the_key() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (key, recipient_file, recipient) = generate_age_keys(&bed, "restore-side");
    let (other, _, other_recipient) = generate_age_keys(&bed, "another");
    let (key, recipient_file, other) =
        (key.display().to_string(), recipient_file.display().to_string(), other.display().to_string());
    let s = Scenario::with_backup(bed, 4, 2, &[]).await;
    let plain = s.snapshot.clone();
    let backup = ["backup", "--selector", &s.spec.selector(), "--encrypt-to", &recipient_file];
    let out = s.bed.restatus(&s.storage, &s.cluster, &backup);
    assert_success(&out, "encrypted backup");
    let sealed = stdout(&out).trim().to_string();
    assert!(!stderr(&out).contains("AGE-SECRET-KEY"), "{}", stderr(&out));

    // The bucket: the plain payload shows every serial and MAC, the encrypted one none.
    let mut ids = vec![];
    for status in s.source_state().await.values() {
        identities(status, &mut ids);
    }
    assert!(ids.len() >= 8, "the fleet's serials and MACs: {ids:?}");
    let store = s.bed.store(&s.storage, &s.cluster);
    let payload = |id: &str| {
        let store = store.clone();
        let id = id.parse().unwrap();
        async move {
            object_store::ObjectStoreExt::get(store.object_store().as_ref(), &store.payload_path(&id))
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap()
        }
    };
    let (plain_bytes, sealed_bytes) = (readable(&payload(&plain).await), readable(&payload(&sealed).await));
    for id in &ids {
        assert!(plain_bytes.contains(id.as_str()), "the plain payload holds {id}");
        assert!(!sealed_bytes.contains(id.as_str()), "the encrypted payload shows {id}");
    }
    let manifest = store.manifest(&sealed.parse().unwrap()).await.unwrap();
    let manifest_text = String::from_utf8_lossy(&manifest.to_json()).into_owned();
    assert!(ids.iter().all(|id| !manifest_text.contains(id.as_str())), "{manifest_text}");
    assert_eq!(manifest.encryption.as_ref().map(|e| e.recipients.clone()), Some(vec![recipient.clone()]));
    assert_eq!(manifest.payload.records, 10, "counts stay readable");

    // `snapshots list`: which snapshots are encrypted, to whom, without a key.
    let snapshots = |args: &[&str]| s.bed.restatus(&s.storage, &s.cluster, &[&["snapshots"], args].concat());
    let out = snapshots(&["list", "-o", "json"]);
    assert_success(&out, "snapshots list");
    let rows: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let row = |id: &str| rows.as_array().unwrap().iter().find(|r| r["id"] == id).unwrap().clone();
    assert_eq!(row(&sealed)["encryptedTo"], json!([recipient]));
    assert_eq!(row(&plain)["encryptedTo"], Value::Null);
    assert!(stdout(&snapshots(&["list"])).contains("ENCRYPTED TO"));

    simulate_move(&s.bed.source().await, &s.bed.target().await, &s.spec.name, &|n| n.to_string()).await;
    // Without the key: passed over for the plain snapshot, named; pinned, refused by name.
    let report = s.report(&["--dry-run"]);
    assert_eq!(report["snapshot"], plain.as_str());
    let passed = report["passedOver"].as_array().unwrap();
    assert_eq!((passed.len(), passed[0]["snapshot"].as_str()), (1, Some(sealed.as_str())), "{passed:?}");
    assert!(passed[0]["reason"].as_str().unwrap().contains("--decryption-key"), "{passed:?}");
    let out = s.restore(&["--snapshot", &sealed]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("snapshot {sealed}: its payload is encrypted to {recipient}"))
            && err.contains("--decryption-key"),
        "{err}"
    );
    // Another key: the same, saying it does not decrypt.
    let report = s.report(&["--dry-run", "--decryption-key", &other]);
    assert_eq!(report["snapshot"], plain.as_str());
    let out = s.restore(&["--snapshot", &sealed, "--decryption-key", &other]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("snapshot {sealed}: payload does not decrypt: none of the decryption keys"))
            && err.contains(&other_recipient),
        "{err}"
    );
    assert!(!err.contains("AGE-SECRET-KEY"), "key material in the output: {err}");
    let out = snapshots(&["verify", &sealed]);
    assert!(!out.status.success() && stdout(&out).contains(&format!("{sealed}: FAILED")), "{}", stdout(&out));

    // With the key: every status back, from the encrypted snapshot.
    let report = s.report(&["--decryption-key", &key]);
    assert_eq!(report["snapshot"], sealed.as_str());
    assert!(report["passedOver"].as_array().is_none_or(|p| p.is_empty()), "{report}");
    assert_eq!(count(&report, "restore"), 10);
    let target: BTreeMap<String, Value> =
        s.target_state().await.into_iter().map(|(k, (status, _))| (k, status)).collect();
    assert_eq!(target, s.source_state().await, "every status back");
    let out = snapshots(&["verify", &sealed, "--decryption-key", &key]);
    assert_success(&out, "verify with the key");
}

/// `restore -o jsonl` with `extra` arguments: its lines, each parsed.
fn jsonl(s: &Scenario, extra: &[&str]) -> Vec<Value> {
    let selector = s.spec.selector();
    let mut args = vec!["restore", "--selector", &selector, "-o", "jsonl"];
    args.extend(extra);
    let out = s.bed.restatus_with(&s.bed.target_kubeconfig, &s.storage, &s.cluster, &args, &[]);
    assert_success(&out, "restore -o jsonl");
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a line that is not JSON ({e}): {l}")))
        .collect()
}

/// The object lines and the summary of a jsonl output, checked against each other: the
/// summary last and only there, one object line per object (no object twice), the verdicts
/// counted as the summary counts them.
fn lines_and_summary(lines: &[Value]) -> (&[Value], &Value) {
    let (summary, objects) = lines.split_last().expect("at least the summary line");
    assert_eq!(summary["type"], "summary", "the last line is the summary: {summary}");
    assert!(summary.get("plan").is_none() && summary.get("outcomes").is_none(), "{summary}");
    assert!(objects.iter().all(|l| l["type"] == "object"), "one summary, last");
    assert_eq!(summary["objects"].as_u64(), Some(objects.len() as u64), "one line per object");
    let names: std::collections::BTreeSet<String> =
        objects.iter().map(|l| format!("{}/{}", l["kind"], l["target"]["name"])).collect();
    assert_eq!(names.len(), objects.len(), "no object twice");
    for (verdict, n) in summary["counts"].as_object().unwrap() {
        let lines = objects.iter().filter(|l| l["verdict"] == verdict.as_str()).count();
        assert_eq!(n.as_u64(), Some(lines as u64), "{verdict}");
    }
    (objects, summary)
}

/// Issue 22, item 2: `restore --dry-run -o jsonl` and `restore -o jsonl` stream one line per
/// object (the dry run's with the fields each restore changes, the restore's with what its
/// writes did) and a summary line last that counts them.
#[tokio::test]
async fn jsonl_streams_one_line_per_object_and_a_summary_last() {
    let _target = TARGET.read().await;
    let s = Scenario::moved(6, 3).await;
    let dry = jsonl(&s, &["--dry-run"]);
    let (objects, summary) = lines_and_summary(&dry);
    assert_eq!(objects.len(), 15, "6 BMCs, 6 Servers, 3 claims");
    assert_eq!(
        (summary["dryRun"].clone(), summary["writes"].clone(), summary["ok"].clone()),
        (json!(true), json!(0), json!(true))
    );
    assert_eq!(summary["counts"]["restore"], 15);
    assert!(objects.iter().all(|l| l.get("outcome").is_none()), "a dry run writes nothing");
    assert!(objects.iter().all(|l| l["changes"].as_array().is_some_and(|c| !c.is_empty())), "each restore's changes");
    assert!(s.target_state().await.values().all(|(status, _)| status.is_null()), "nothing written");

    let real = jsonl(&s, &[]);
    let (objects, summary) = lines_and_summary(&real);
    assert_eq!(objects.len(), 15);
    assert_eq!(
        (summary["dryRun"].clone(), summary["ok"].clone(), summary["failed"].clone()),
        (json!(false), json!(true), json!(0))
    );
    let writes: u64 = objects
        .iter()
        .map(|l| {
            let outcome = &l["outcome"];
            assert!(outcome.get("error").is_none(), "{l}");
            assert_eq!(outcome["verdict"], "restore", "{l}");
            outcome["writes"].as_u64().expect("each restore is written")
        })
        .sum();
    assert_eq!(summary["writes"].as_u64(), Some(writes), "the summary's writes are the lines'");
    assert_eq!(writes, 45, "quiesce, status and release");
    s.assert_source_statuses("restored").await;
}

/// F110: the reader of `restore -o jsonl` goes away (`| head -1`). A real restore stops as on
/// a signal: what it started is finished and released, it says so on stderr and exits 1. A dry
/// run's reader that has seen enough: exit 0. Neither panics.
#[tokio::test]
async fn a_closed_stdout_stops_a_jsonl_restore_cleanly() {
    use std::io::BufRead;
    let _target = TARGET.read().await;
    let s = Scenario::moved(60, 0).await;
    let first_line_then_close = |extra: &[&str]| {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_restatus"))
            .args(["restore", "--concurrency", "1", "--selector", &s.spec.selector(), "-o", "jsonl", "--kubeconfig"])
            .arg(&s.bed.target_kubeconfig)
            .args(extra)
            .env("RESTATUS_STORAGE", &s.storage)
            .env("RESTATUS_CLUSTER_ID", &s.cluster)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        // The reader is dropped: the pipe is closed.
        let out = child.wait_with_output().unwrap();
        let line: Value = serde_json::from_str(&first).expect("the first line");
        assert_eq!(line["type"], "object");
        out
    };
    let dry = first_line_then_close(&["--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    assert!(!stderr(&dry).contains("panicked"), "{}", stderr(&dry));

    let out = first_line_then_close(&[]);
    let message = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{message}");
    assert!(!message.contains("panicked"), "{message}");
    assert!(message.contains("restore stopped by a closed stdout"), "{message}");
    assert_stopped_cleanly(&s.target_state().await);
}

/// F151 end to end: staging and production share one signing key and one cluster id, in two
/// prefixes. Production's snapshot, captured from its source (a cluster not on this bed: its
/// uid), is signed; a newer staging snapshot, a real signed backup of the bed's source, is
/// copied into the production prefix. The restore with the key alone takes the copy (the
/// signature binds the cluster id only: the attack); named with `--expect-source` (or
/// `RESTATUS_EXPECT_SOURCE`), the copy is passed over, named with its source, production's is
/// restored, and the copy pinned is refused. `snapshots list` and `show` name each source.
#[tokio::test]
async fn a_snapshot_copied_from_another_source_is_refused_when_the_expected_source_is_named() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (private, public, _) = generate_keys(&bed, "one-key-everywhere");
    let public = public.display().to_string();
    let s = Scenario::with_backup(bed, 3, 1, &["--signing-key", &private.display().to_string()]).await;
    simulate_move(&s.bed.source().await, &s.bed.target().await, &s.spec.name, &|n| n.to_string()).await;
    let staging = s.bed.store(&s.storage, &s.cluster);
    let production_storage = s.bed.storage("production");
    let production = s.bed.store(&production_storage, &s.cluster);
    let (copied, fleet) = records(&staging, &s.snapshot).await;
    let staging_source = copied.captured_from.clone().expect("the backup records its source");
    let production_source = "5b0f6c1e-0000-4000-8000-00000000prod";
    let key = restatus::format::SigningKey::load(&private).unwrap();
    let capture =
        restatus::format::CaptureSummary { kinds: copied.kinds.clone(), ..restatus::format::CaptureSummary::empty() };
    let genuine = restatus::fixtures::snapshot(&fleet)
        .at(copied.created_at - jiff::SignedDuration::from_hours(1))
        .profile(&copied.profile)
        .capture(capture)
        .captured_from(production_source)
        .signed_with(&key)
        .write(&production)
        .await
        .snapshot_id
        .to_string();
    copy_snapshot(&staging, &production, &s.snapshot).await;

    let selector = s.spec.selector();
    let restore = |extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["restore", "--selector", &selector, "-o", "json", "--trusted-key", &public];
        args.extend(extra);
        s.bed.restatus_with(&s.bed.target_kubeconfig, &production_storage, &s.cluster, &args, env)
    };
    let report = |extra: &[&str], env: &[(&str, &str)]| -> Value {
        let out = restore(extra, env);
        assert_success(&out, &format!("restore {extra:?} {env:?}"));
        serde_json::from_str(&stdout(&out)).expect("restore -o json")
    };

    // The attack: the copy verifies, is the newest, and would be restored.
    assert_eq!(report(&["--dry-run"], &[])["snapshot"], s.snapshot.as_str());

    // Named by the environment (as the chart sets it): passed over for production's.
    let env = report(&["--dry-run"], &[("RESTATUS_EXPECT_SOURCE", production_source)]);
    assert_eq!(env["snapshot"], genuine.as_str(), "{env}");

    // Named by the flag: the same, and production's statuses written.
    let restored = report(&["--expect-source", production_source], &[]);
    assert_eq!(restored["snapshot"], genuine.as_str());
    let passed = &restored["passedOver"][0];
    assert_eq!(passed["snapshot"], s.snapshot.as_str(), "{restored}");
    let reason = passed["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("captured from {staging_source}, not from the expected source ({production_source}")),
        "{reason}"
    );
    s.assert_source_statuses("restored from production's snapshot").await;

    // Pinned, the copy is refused, naming both sources.
    let pinned = restore(&["--expect-source", production_source, "--snapshot", &s.snapshot, "--dry-run"], &[]);
    assert!(!pinned.status.success(), "the copy pinned is refused");
    assert!(stderr(&pinned).contains(&staging_source) && stderr(&pinned).contains(production_source));

    // `snapshots list` and `show` name each snapshot's source.
    let list = s.bed.restatus(&production_storage, &s.cluster, &["snapshots", "list", "-o", "json"]);
    let rows: Value = serde_json::from_str(&stdout(&list)).unwrap();
    let source_of = |id: &str| rows.as_array().unwrap().iter().find(|r| r["id"] == id).unwrap()["capturedFrom"].clone();
    assert_eq!((source_of(&genuine), source_of(&s.snapshot)), (json!(production_source), json!(staging_source)));
    let table = stdout(&s.bed.restatus(&production_storage, &s.cluster, &["snapshots", "list"]));
    assert!(table.contains("SOURCE") && table.contains(production_source), "{table}");
    let show = stdout(&s.bed.restatus(&production_storage, &s.cluster, &["snapshots", "show", &s.snapshot]));
    assert!(show.contains(&format!("Source:       {staging_source}")), "{show}");
}

/// F152 end to end: backups encrypted to a recipient (public: anyone can encrypt to it, and
/// anyone who can write the bucket can write a plain snapshot). A plain forgery, newer, is
/// taken by a restore with the decryption key (the attack: encryption says nothing of who
/// wrote a snapshot); with `--require-encryption` (or `RESTATUS_REQUIRE_ENCRYPTION=true`) it is
/// passed over, named, and the encrypted snapshot restored; required without a decryption
/// key, the restore refuses to start.
#[tokio::test]
async fn a_reader_that_requires_encryption_refuses_a_plain_forgery() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (key, recipient_file, _) = generate_age_keys(&bed, "required");
    let s = Scenario::with_backup(bed, 3, 1, &["--encrypt-to", &recipient_file.display().to_string()]).await;
    simulate_move(&s.bed.source().await, &s.bed.target().await, &s.spec.name, &|n| n.to_string()).await;
    let keys = restatus::format::DecryptionKeys::load(std::slice::from_ref(&key)).unwrap().map(std::sync::Arc::new);
    let store = s.bed.store(&s.storage, &s.cluster).with_decryption_keys(keys);
    let forged = forge(&store, &s.snapshot).await.to_string();
    let key = key.display().to_string();

    // The attack: the plain forgery is the newest and is used.
    assert_eq!(s.report(&["--dry-run", "--decryption-key", &key])["snapshot"], forged.as_str());

    let selector = s.spec.selector();
    let env = [("RESTATUS_REQUIRE_ENCRYPTION", "true"), ("RESTATUS_DECRYPTION_KEY", key.as_str())];
    let args = ["restore", "--selector", &selector, "-o", "json", "--dry-run"];
    let out = s.bed.restatus_with(&s.bed.target_kubeconfig, &s.storage, &s.cluster, &args, &env);
    assert_success(&out, "restore with RESTATUS_REQUIRE_ENCRYPTION=true");
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["snapshot"], s.snapshot.as_str(), "{report}");

    let report = s.report(&["--decryption-key", &key, "--require-encryption"]);
    assert_eq!(report["snapshot"], s.snapshot.as_str());
    let passed = &report["passedOver"][0];
    assert_eq!(passed["snapshot"], forged.as_str());
    assert!(passed["reason"].as_str().unwrap().contains("not encrypted"), "{passed}");
    s.assert_source_statuses("restored from the encrypted snapshot").await;

    let out = s.restore(&["--require-encryption", "--dry-run"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--require-encryption needs --decryption-key"), "{}", stderr(&out));
}
