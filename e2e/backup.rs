//! Backup on the real test bed: a 300-object fleet through real S3, the CLI's snapshot
//! commands, retention, the schedule, secrets, least-privilege RBAC and failures.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine;
use kube::api::ListParams;
use restatus::domain::identity::Profile;
use restatus::fleet::{self, FLEET_LABEL, FleetSpec};
use serde_json::Value;

use crate::bed::{Bed, ExtraApiServer, assert_success, audit_events, records, stderr, stdout, unique};

/// Live status of every object of a fleet, by `Kind namespace/name`.
async fn live_statuses(client: &kube::Client, fleet: &str) -> BTreeMap<String, Value> {
    let profile = Profile::metal_operator();
    let mut out = BTreeMap::new();
    for kind in ["BMC", "Server", "ServerClaim"] {
        let api = restatus::k8s::api_for(client, profile.kind(kind).unwrap(), None);
        let list = api.list(&ListParams::default().labels(&format!("{FLEET_LABEL}={fleet}"))).await.unwrap();
        for obj in list {
            let name = match &obj.metadata.namespace {
                Some(ns) => format!("{kind} {ns}/{}", obj.metadata.name.clone().unwrap()),
                None => format!("{kind} {}", obj.metadata.name.clone().unwrap()),
            };
            out.insert(name, obj.data["status"].clone());
        }
    }
    out
}

#[tokio::test]
async fn backup_of_a_300_object_fleet_round_trips_through_s3() {
    let bed = Bed::get();
    let client = bed.source().await;
    let spec = FleetSpec::new(&unique("e2e"), 120, 120, 60);
    assert_eq!(spec.total(), 300);
    fleet::create(&client, &spec, 16).await.expect("create fleet");
    let live = live_statuses(&client, &spec.name).await;
    assert_eq!(live.len(), 300);

    let storage = bed.storage("fleet300");
    // Its own fleet only: what other tests leave on the shared source (a claim bound to a
    // Server in discovery) would make the capture inconsistent, and the backup exit 3.
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let out = bed.restatus(&storage, "mgmt", &["backup", "--selector", &selector]);
    assert_success(&out, "backup");
    let id = stdout(&out).trim().to_string();

    // The snapshot verifies end to end and holds every fleet object with its exact status.
    let store = bed.store(&storage, "mgmt");
    let (manifest, records) = records(&store, &id).await;
    assert_eq!(manifest.cluster_id, "mgmt");
    assert_eq!(manifest.payload.records as usize, records.len());
    let mine: BTreeMap<String, &restatus::format::Record> = records
        .iter()
        .filter(|r| r.name.starts_with(&spec.name))
        .map(|r| (format!("{} {}", r.kind, r.object_name()), r))
        .collect();
    assert_eq!(mine.len(), 300, "every fleet object is captured once");
    for (name, status) in &live {
        let record = mine.get(name).unwrap_or_else(|| panic!("{name} missing from the snapshot"));
        let captured: Value = serde_json::from_str(record.status.get()).unwrap();
        assert_eq!(&captured, status, "{name}: captured status differs from the live one");
        assert!(record.uid.is_some() && record.resource_version.is_some() && record.creation_timestamp.is_some());
    }
    let server = mine[&format!("Server {}", spec.server_name(3))];
    let expected_uuid = spec.server(3).0["spec"]["systemUUID"].as_str().unwrap().to_lowercase();
    assert_eq!(server.keys[0].to_string(), format!("spec.systemUUID={expected_uuid}"));
    let claim_ns = spec.claim_ref(1).0;
    assert!(mine.contains_key(&format!("ServerClaim {claim_ns}/{}", spec.claim_ref(1).1)));
    let kinds: BTreeMap<_, _> = manifest.kinds.iter().map(|k| (k.kind.as_str(), k.records)).collect();
    assert!(kinds["Server"] >= 120 && kinds["BMC"] >= 120 && kinds["ServerClaim"] >= 60, "{kinds:?}");
    assert!(manifest.payload.size * 5 < manifest.payload.uncompressed_size, "zstd should compress inventory well");

    // The CLI's views agree.
    let list = bed.restatus(&storage, "mgmt", &["snapshots", "list", "-o", "json"]);
    assert_success(&list, "snapshots list");
    let rows: Vec<Value> = serde_json::from_str(&stdout(&list)).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["id"], id.as_str());
    assert_eq!(rows[0]["state"], "complete");
    assert_eq!(rows[0]["records"], manifest.payload.records);
    let table = bed.restatus(&storage, "mgmt", &["snapshots", "list"]);
    assert!(stdout(&table).lines().nth(1).unwrap().starts_with(&id), "{}", stdout(&table));
    let verify = bed.restatus(&storage, "mgmt", &["snapshots", "verify", &id]);
    assert_success(&verify, "snapshots verify");
    assert!(stdout(&verify).contains("OK"), "{}", stdout(&verify));
    let show = bed.restatus(&storage, "mgmt", &["snapshots", "show", "latest", "-o", "json"]);
    assert_success(&show, "snapshots show");
    let shown: Value = serde_json::from_str(&stdout(&show)).unwrap();
    assert_eq!(shown["payload"]["sha256"], manifest.payload.sha256.as_str());

    // A damaged payload in real S3 fails verification, naming the snapshot.
    let payload =
        object_store::ObjectStoreExt::get(store.object_store().as_ref(), &store.payload_path(&manifest.snapshot_id))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
    let mut damaged = payload.to_vec();
    damaged[100] ^= 0xff;
    object_store::ObjectStoreExt::put(
        store.object_store().as_ref(),
        &store.payload_path(&manifest.snapshot_id),
        damaged.into(),
    )
    .await
    .unwrap();
    let verify = bed.restatus(&storage, "mgmt", &["snapshots", "verify", &id]);
    assert!(!verify.status.success());
    assert!(stdout(&verify).contains("FAILED") && stderr(&verify).contains(&id), "{}", stderr(&verify));
}

#[tokio::test]
async fn retention_keeps_the_newest_snapshots() {
    let bed = Bed::get();
    let storage = bed.storage("retention");
    // Retention does not look into payloads: snapshots of a small fleet of its own (what other
    // tests leave on the shared source could make a capture inconsistent, the backup exit 3).
    let spec = FleetSpec::new(&unique("ret"), 2, 2, 1);
    fleet::create(&bed.source().await, &spec, 8).await.expect("create fleet");
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let out = bed.restatus(&storage, "ret", &["backup", "--keep-last", "2", "--selector", &selector]);
        assert_success(&out, "backup");
        ids.push(stdout(&out).trim().to_string());
        // Snapshot ids have second precision; keep them apart.
        std::thread::sleep(Duration::from_millis(1100));
    }
    let store = bed.store(&storage, "ret");
    let left: Vec<String> = store.list().await.unwrap().iter().map(|e| e.id.to_string()).collect();
    assert_eq!(left, ids[1..].to_vec());
    let out = bed.restatus(&storage, "ret", &["snapshots", "prune", "--max-age", "1s"]);
    assert_success(&out, "prune");
    let left: Vec<String> = store.list().await.unwrap().iter().map(|e| e.id.to_string()).collect();
    assert_eq!(left, ids[2..].to_vec(), "the newest complete snapshot is never deleted");
}

#[tokio::test]
async fn secrets_are_never_captured_even_when_a_profile_names_them() {
    let bed = Bed::get();
    let client = bed.source().await;
    let name = unique("e2e-bmcsecret");
    let secret_value = "s3cr3t-p4ssw0rd-do-not-leak";
    let encoded = base64::engine::general_purpose::STANDARD.encode(secret_value);
    let bmc_secret = serde_json::json!({
        "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "BMCSecret",
        "metadata": {"name": name}, "data": {"username": encoded, "password": encoded},
    });
    let profile = Profile::parse(
        "inline",
        "name: greedy\nkinds:\n- {group: metal.ironcore.dev, version: v1alpha1, kind: BMCSecret, plural: bmcsecrets}\n- {version: v1, kind: Secret, plural: secrets, namespaced: true}\n- {group: metal.ironcore.dev, version: v1alpha1, kind: Server, plural: servers, keys: [{path: spec.systemUUID}]}\n",
    )
    .unwrap();
    let api = restatus::k8s::api_for(&client, &profile.kinds[0], None);
    api.create(&Default::default(), &serde_json::from_value(bmc_secret).unwrap()).await.unwrap();
    let path = bed.scratch.path().join("greedy.yaml");
    std::fs::write(&path, serde_json::to_string(&profile).unwrap()).unwrap();

    let storage = bed.storage("secrets");
    let out = bed.restatus(&storage, "sec", &["backup", "--profile", path.to_str().unwrap()]);
    assert_success(&out, "backup");
    let store = bed.store(&storage, "sec");
    let (manifest, records) = records(&store, stdout(&out).trim()).await;
    assert!(records.iter().all(|r| r.kind == "Server"));
    let skipped: Vec<_> =
        manifest.skipped.iter().filter(|s| s.name.is_none()).map(|s| (s.kind.as_str(), s.reason.as_str())).collect();
    assert!(skipped.contains(&("BMCSecret", restatus::domain::capture::reasons::SECRET_KIND)), "{skipped:?}");
    assert!(skipped.contains(&("Secret", restatus::domain::capture::reasons::SECRET_KIND)), "{skipped:?}");
    let raw = zstd::decode_all(
        &object_store::ObjectStoreExt::get(store.object_store().as_ref(), &store.payload_path(&manifest.snapshot_id))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()[..],
    )
    .unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(!text.contains(secret_value) && !text.contains(&encoded), "secret data reached the payload");
}

#[tokio::test]
async fn least_privilege_service_account_can_back_up_and_cannot_read_secrets() {
    let bed = Bed::get();
    let manifests = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/backup");
    let apply = bed.kubectl(&bed.source_kubeconfig, &["apply", "-k", manifests]);
    assert_success(&apply, "kubectl apply -k manifests/backup");
    let token = bed.kubectl(&bed.source_kubeconfig, &["-n", "restatus", "create", "token", "restatus-backup"]);
    assert_success(&token, "kubectl create token");
    let kubeconfig = bed.kubeconfig_with_token(&bed.source_kubeconfig, "restatus-backup", stdout(&token).trim());

    // Servers of its own: the source's other objects come and go with the other tests (a move
    // takes them away), and a backup that finds none would prove nothing.
    let spec = FleetSpec::new(&unique("rbac"), 2, 2, 1);
    fleet::create(&bed.source().await, &spec, 4).await.expect("create fleet");
    let storage = bed.storage("rbac");
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let out = bed.restatus_with(&kubeconfig, &storage, "rbac", &["backup", "--selector", &selector], &[]);
    assert_success(&out, "backup as the restatus-backup ServiceAccount");
    let store = bed.store(&storage, "rbac");
    let (manifest, _) = records(&store, stdout(&out).trim()).await;
    assert!(manifest.kinds.iter().any(|k| k.kind == "Server" && k.records > 0));
    assert!(manifest.captured_from.is_some(), "the ServiceAccount reads the cluster's identity (kube-system's uid)");

    // Nothing beyond reading the profile's kinds.
    for args in [
        vec!["get", "secrets", "-A"],
        vec!["-n", "restatus", "get", "secret", "restatus-s3"],
        vec!["get", "bmcsecrets.metal.ironcore.dev"],
        vec!["get", "configmaps", "-A"],
    ] {
        let out = bed.kubectl(&kubeconfig, &args);
        assert!(!out.status.success() && stderr(&out).contains("forbidden"), "{args:?} was allowed: {}", stdout(&out));
    }
    for verb_resource in [
        "patch servers.metal.ironcore.dev",
        "update servers.metal.ironcore.dev/status",
        "delete bmcs.metal.ironcore.dev",
        "create serverclaims.metal.ironcore.dev",
    ] {
        let mut args = vec!["auth", "can-i"];
        args.extend(verb_resource.split(' '));
        let out = bed.kubectl(&kubeconfig, &args);
        assert_eq!(stdout(&out).trim(), "no", "ServiceAccount may {verb_resource}");
    }

    // A failure in the middle (a kind this account may not list, after others were uploaded)
    // leaves no manifest: the half-written backup never looks complete.
    let profile = bed.scratch.path().join("too-much.yaml");
    std::fs::write(
        &profile,
        "name: too-much\nkinds:\n- {group: metal.ironcore.dev, version: v1alpha1, kind: Server, plural: servers, keys: [{path: spec.systemUUID}]}\n- {group: metal.ironcore.dev, version: v1alpha1, kind: BIOSSettings, plural: biossettings}\n",
    )
    .unwrap();
    let storage = bed.storage("rbac-fail");
    let out =
        bed.restatus_with(&kubeconfig, &storage, "rbac", &["backup", "--profile", profile.to_str().unwrap()], &[]);
    assert!(!out.status.success(), "backup must fail");
    assert!(
        stderr(&out).contains("list BIOSSettings.metal.ironcore.dev") && stderr(&out).contains("forbidden"),
        "{}",
        stderr(&out)
    );
    let entries = bed.store(&storage, "rbac").list().await.unwrap();
    assert!(entries.iter().all(|e| !e.complete), "a failed backup left a manifest: {entries:?}");
}

#[tokio::test]
async fn unreachable_s3_fails_the_backup_without_a_manifest() {
    let bed = Bed::get();
    let storage = bed.storage("s3-down");
    let started = Instant::now();
    let out = bed.restatus_with(
        &bed.source_kubeconfig,
        &storage,
        "down",
        // Nothing to list: the time bound is S3's retries, not the size of a busy test cluster.
        &["backup", "--selector", "restatus.ironcore.dev/sample-fleet=none-such"],
        &[("S3_ENDPOINT", "http://127.0.0.1:9"), ("AWS_ENDPOINT_URL", "http://127.0.0.1:9")],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("backup failed; no snapshot was written") && err.contains("127.0.0.1:9"), "{err}");
    assert!(!err.contains(&std::env::var("AWS_SECRET_ACCESS_KEY").unwrap()), "credentials in the log");
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
    assert!(bed.store(&storage, "down").list().await.unwrap().is_empty());
}

#[tokio::test]
async fn unreachable_api_server_fails_the_backup_without_a_manifest() {
    let bed = Bed::get();
    let kubeconfig = bed.scratch.path().join("nowhere.kubeconfig");
    let mut config = kube::config::Kubeconfig::read_from(&bed.source_kubeconfig).unwrap();
    for cluster in &mut config.clusters {
        if let Some(c) = cluster.cluster.as_mut() {
            c.server = Some("https://127.0.0.1:9".into());
        }
    }
    std::fs::write(&kubeconfig, serde_json::to_vec(&config).unwrap()).unwrap();
    let storage = bed.storage("api-down");
    let out = bed.restatus_with(&kubeconfig, &storage, "down", &["backup"], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("Kubernetes API: list"), "{}", stderr(&out));
    assert!(bed.store(&storage, "down").list().await.unwrap().iter().all(|e| !e.complete));
}

/// `restatus schedule` with `--cron '* * * * *'` against the source, S3 at `s3` (the bed's, or
/// a proxy in front of it), its log in a file of the test's own.
fn start_schedule(bed: &Bed, storage: &str, selector: &str, s3: &str) -> (std::process::Child, std::path::PathBuf) {
    let log = bed.scratch.path().join(format!("{}.log", unique("schedule")));
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_restatus"))
        .args(["schedule", "--cron", "* * * * *", "--selector", selector, "--kubeconfig"])
        .arg(&bed.source_kubeconfig)
        .env("RESTATUS_STORAGE", storage)
        .env("RESTATUS_CLUSTER_ID", "sched")
        .env("S3_ENDPOINT", s3)
        .env("AWS_ENDPOINT_URL_S3", s3)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    (child, log)
}

/// The fire time the schedule logged it waits for first ("waiting for the next run …
/// next=T"), once it has (at most 30 s).
async fn first_fire_time(log: &std::path::Path) -> jiff::Timestamp {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let next = text.lines().filter(|l| l.contains("waiting for the next run")).find_map(|l| {
            let (_, rest) = l.split_once(" next=")?;
            rest.split_whitespace().next()?.parse::<jiff::Timestamp>().ok()
        });
        if let Some(next) = next {
            return next;
        }
        assert!(Instant::now() < deadline, "the schedule logged no fire time within 30 s:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (at most `within`) for the child to exit, without blocking the runtime (a test's
/// in-process proxy must keep answering it).
async fn exit_of(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the schedule did not exit within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn schedule_takes_a_backup_at_the_next_minute_and_stops_on_sigterm() {
    let bed = Bed::get();
    let storage = bed.storage("schedule");
    // Its own (empty) selection: the shared source changes under parallel tests, and an
    // inconsistent capture is retaken, which would move the snapshot off the minute.
    let selector = format!("{}={}", restatus::fleet::FLEET_LABEL, unique("sched"));
    let (mut child, log) = start_schedule(&bed, &storage, &selector, &std::env::var("S3_ENDPOINT").unwrap());
    let fire = first_fire_time(&log).await;
    assert_eq!(fire.to_zoned(jiff::tz::TimeZone::UTC).second(), 0, "fire times are on the minute: {fire}");
    let store = bed.store(&storage, "sched");
    // The fire time is at most a minute ahead; the backup of an empty selection then takes
    // seconds. 90 s bounds both.
    let deadline = Instant::now() + Duration::from_secs(90);
    let entry = loop {
        if let Some(entry) = store.list().await.unwrap().into_iter().find(|e| e.complete) {
            break entry;
        }
        assert!(Instant::now() < deadline, "no scheduled snapshot within 90 s (fire time {fire})");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Taken for that fire time: not before it, and before the next one (a run that slipped a
    // minute would be the next fire time's, which the schedule never catches up).
    let created = store.manifest(&entry.id).await.unwrap().created_at;
    let next = fire + jiff::SignedDuration::from_secs(60);
    assert!(fire <= created && created < next, "snapshot {} created at {created}, for the fire time {fire}", entry.id);
    // SIGTERM while waiting for the next minute (the log says so once the backup is done): a
    // prompt, clean exit.
    let waiting = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&log).unwrap_or_default().matches("waiting for the next run").count() < 2 {
        assert!(Instant::now() < waiting, "the schedule did not go back to waiting");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = std::process::Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let status = exit_of(&mut child, Duration::from_secs(20)).await;
    assert!(status.success(), "schedule exited with {status}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("shutdown requested; no backup was running"), "{text}");
}

/// F27 with a backup in flight: SIGTERM reaches the schedule while its backup's payload upload
/// is provably under way (the upload's PUT is held, unanswered, by a proxy in front of S3: the
/// capture is done and no manifest is written). The backup finishes once the store answers
/// again (its manifest is written, consistent, with every record of the fleet), no further
/// backup is started, and the process exits 0. Before this test only the pure loop was shown
/// to do so, with a fake job.
#[tokio::test]
async fn a_schedule_stopped_while_its_backup_runs_finishes_that_backup_then_exits() {
    let bed = Bed::get();
    let spec = FleetSpec::new(&unique("sched-term"), 3, 3, 1);
    fleet::create(&bed.source().await, &spec, 8).await.unwrap();
    let storage = bed.storage(&spec.name);
    let (proxy, proxied) = crate::bed::CountingProxy::for_s3().await;
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let (mut child, log) = start_schedule(&bed, &storage, &selector, &proxied);
    let fire = first_fire_time(&log).await;
    let prefix = storage.rsplit('/').next().unwrap().to_string();
    // The store stops answering before the fire time: the backup runs into it with its upload.
    proxy.hold();
    let deadline = Instant::now() + Duration::from_secs(90);
    let upload = |(method, target): &(String, String)| {
        target.contains(&prefix) && target.contains("payload") && (method == "PUT" || method == "POST")
    };
    while !proxy.requests().iter().any(upload) {
        assert!(Instant::now() < deadline, "no payload upload within 90 s (fire time {fire}): {:?}", proxy.requests());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let store = bed.store(&storage, "sched");
    assert!(store.list().await.unwrap().iter().all(|e| !e.complete), "no manifest yet: the backup is in flight");

    let _ = std::process::Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("finishing the running backup first") {
        assert!(Instant::now() < deadline, "SIGTERM not taken in: {}", std::fs::read_to_string(&log).unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(child.try_wait().unwrap().is_none(), "it waits for its backup, it does not exit");
    proxy.resume();
    let status = exit_of(&mut child, Duration::from_secs(60)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "schedule exited with {status}: {text}");
    assert!(text.contains("snapshot written") && text.contains("runs=1"), "one run, completed: {text}");

    let complete: Vec<_> = store.list().await.unwrap().into_iter().filter(|e| e.complete).collect();
    assert_eq!(complete.len(), 1, "the backup in flight, and no other: {complete:?}");
    let (manifest, records) = records(&store, complete[0].id.as_str()).await;
    assert!(manifest.is_consistent(), "{manifest:?}");
    assert!(manifest.created_at >= fire, "taken for the fire time {fire}: {}", manifest.created_at);
    assert_eq!(records.len(), 7, "every object of the fleet: {manifest:?}");
}

/// Two backups of one cluster id on one prefix at once (a CronJob overlapping a manual run,
/// or two clusters misconfigured with the same id): both snapshots are complete and verify;
/// no manifest points at the other's payload.
#[tokio::test]
async fn two_backups_on_one_prefix_at_once_leave_two_complete_snapshots() {
    let bed = Bed::get();
    let spec = FleetSpec::new(&unique("twice"), 20, 20, 10);
    fleet::create(&bed.source().await, &spec, 16).await.unwrap();
    let storage = bed.storage(&spec.name);
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let args = ["backup", "--selector", selector.as_str()];
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| bed.restatus(&storage, "twice", &args));
        let b = s.spawn(|| bed.restatus(&storage, "twice", &args));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_success(&a, "first backup");
    assert_success(&b, "second backup");
    let (id_a, id_b) = (stdout(&a).trim().to_string(), stdout(&b).trim().to_string());
    assert_ne!(id_a, id_b, "each writer has its own snapshot id");
    for id in [&id_a, &id_b] {
        let verify = bed.restatus(&storage, "twice", &["snapshots", "verify", id]);
        assert_success(&verify, "snapshots verify");
        let (manifest, records) = records(&bed.store(&storage, "twice"), id).await;
        assert_eq!(manifest.payload.records as usize, records.len());
        assert_eq!(records.len(), spec.total());
    }
}

/// Item 12 of issue 9, checked where it matters, at the API server: whatever the spelling of a
/// credential kind in a profile (`kind: secret`, `kind: Secrets`, `plural: secrets`, group `""` or
/// `core`, `bmcsecret`, an upper-case group), neither `restatus backup` nor `restatus restore`
/// sends a single request for Secrets or BMCSecrets. restatus talks to a kube-apiserver of the
/// test's own on the source's etcd, with an audit policy that logs every request for `secrets` and
/// `bmcsecrets` and every request of restatus's user (a static token of its own), at Metadata
/// level. A `kubectl get secrets` through the same apiserver must show up in that log (so the
/// test can fail), and restatus's own requests must (it was audited), none for credentials.
#[tokio::test]
async fn no_spelling_of_a_secret_kind_makes_a_request_for_secrets_says_the_audit_log() {
    let bed = Bed::get();
    let state = std::env::var("RESTATUS_STATE").expect("RESTATUS_STATE (from the test bed's env file)");
    let token = format!("{:032x}", rand::random::<u128>());
    let tokens = bed.scratch.path().join("audit-tokens.csv");
    let mut users = std::fs::read_to_string(format!("{state}/source/tokens.csv")).expect("the source's token file");
    users.push_str(&format!("{token},restatus-audited,restatus-audited,system:masters\n"));
    std::fs::write(&tokens, users).unwrap();
    let policy = bed.scratch.path().join("secrets-audit-policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
         - level: Metadata\n  resources: [{group: \"\", resources: [secrets]}, {group: metal.ironcore.dev, resources: [bmcsecrets]}]\n\
         - level: Metadata\n  users: [restatus-audited]\n\
         - level: None\n",
    )
    .unwrap();
    let audit_log = bed.scratch.path().join("secrets-audit.jsonl");
    let flags = [
        format!("--token-auth-file={}", tokens.display()),
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", audit_log.display()),
        "--audit-log-format=json".to_string(),
    ];
    let apiserver = ExtraApiServer::start(&bed, "source", &flags).await;
    let kubeconfig = bed.kubeconfig_with_token(&apiserver.kubeconfig, "restatus-audited", &token);

    let spec = FleetSpec::new(&unique("audit"), 2, 2, 0);
    fleet::create(&bed.source().await, &spec, 4).await.unwrap();
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let server = "{group: metal.ironcore.dev, version: v1alpha1, kind: Server, plural: servers, keys: [{path: spec.systemUUID}]}";
    let spellings = [
        "{version: v1, kind: secret, namespaced: true}",
        "{version: v1, kind: Secrets, plural: secrets, namespaced: true}",
        "{group: '', version: v1, kind: Opaque, plural: secrets, namespaced: true}",
        "{group: core, version: v1, kind: Secret, namespaced: true}",
        "{version: v1, kind: SECRET, plural: secrets}",
        "{group: metal.ironcore.dev, version: v1alpha1, kind: bmcsecret}",
        "{group: METAL.ironcore.dev, version: v1alpha1, kind: Thing, plural: bmcsecrets}",
    ];
    let mut backed_up = 0;
    for (i, spelling) in spellings.iter().enumerate() {
        let file = bed.scratch.path().join(format!("spelling-{i}.yaml"));
        std::fs::write(&file, format!("name: spelling-{i}\nkinds:\n- {spelling}\n- {server}\n")).unwrap();
        let profile = file.to_str().unwrap();
        let storage = bed.storage(&format!("audit-{i}"));
        let backup = ["backup", "--profile", profile, "--selector", &selector];
        let out = bed.restatus_with(&kubeconfig, &storage, &spec.name, &backup, &[]);
        if !out.status.success() {
            // A spelling the profile's validation refuses is fine too: nothing was requested.
            assert!(stderr(&out).contains("is not a"), "{spelling}: backup failed: {}", stderr(&out));
            continue;
        }
        backed_up += 1;
        // Onto the cluster it was captured from, on purpose: its requests are what is audited.
        let restore = ["restore", "--allow-same-cluster", "--profile", profile, "--selector", &selector];
        assert_success(&bed.restatus_with(&kubeconfig, &storage, &spec.name, &restore, &[]), "restore");
    }
    assert!(backed_up >= 6, "only {backed_up} spellings got as far as a backup");

    // The control: a request for Secrets through this apiserver is in its audit log.
    assert_success(&bed.kubectl(&apiserver.kubeconfig, &["get", "secrets", "-A"]), "kubectl get secrets");
    let events = audit_events(&audit_log);
    let credential = |e: &Value| {
        e["objectRef"]["resource"]
            .as_str()
            .is_some_and(|r| r.eq_ignore_ascii_case("secrets") || r.eq_ignore_ascii_case("bmcsecrets"))
            || e["requestURI"].as_str().is_some_and(|uri| uri.to_ascii_lowercase().contains("secrets"))
    };
    assert!(
        events.iter().any(|e| credential(e) && e["userAgent"].as_str().is_some_and(|ua| ua.starts_with("kubectl"))),
        "the control request for Secrets is not in the audit log: the test cannot see such requests"
    );
    let by_restatus: Vec<&Value> = events.iter().filter(|e| e["user"]["username"] == "restatus-audited").collect();
    assert!(
        by_restatus.iter().any(|e| e["objectRef"]["resource"] == "servers" && e["verb"] == "list"),
        "restatus's requests are not in the audit log: {by_restatus:?}"
    );
    let to_credentials: Vec<&&Value> = by_restatus.iter().filter(|e| credential(e)).collect();
    assert!(to_credentials.is_empty(), "restatus requested credentials: {to_credentials:?}");
    let agents: std::collections::BTreeSet<&str> = by_restatus.iter().filter_map(|e| e["userAgent"].as_str()).collect();
    assert_eq!(agents, [restatus::k8s::USER_AGENT].into(), "every request of restatus names it");
    eprintln!("{} requests of restatus audited ({agents:?}), none for secrets", by_restatus.len());
}

/// F44 with a real 410: a backup's listing outlives its continue token on a kube-apiserver
/// that compacts its storage every second (and reads from etcd, no watch cache: a token is
/// good only while etcd keeps its revision). The backup is SIGSTOPped in the middle of its
/// listing (one object a page, seen in the audit log), held until etcd compacted past a
/// probe's token taken after the stop (so past the backup's too), then continued: its next
/// page is refused with 410 Gone, the pager lists the kind again past the objects it handed
/// out, and the snapshot holds each object once, exactly those a backup without the fault
/// holds. Runs on the target, exclusively: the compaction would expire other tests' tokens.
#[tokio::test]
async fn a_backup_whose_continue_token_expires_lists_again_and_captures_each_object_once() {
    let _exclusive = crate::bed::TARGET.write().await;
    let bed = Bed::get();
    let policy = bed.scratch.path().join("list-audit-policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
         - level: Metadata\n  verbs: [list]\n  resources: [{group: metal.ironcore.dev, resources: [bmcs, servers]}]\n\
         - level: None\n",
    )
    .unwrap();
    let audit_log = bed.scratch.path().join(format!("{}-list-audit.jsonl", unique("f44")));
    let flags = [
        "--etcd-compaction-interval=1s".to_string(),
        "--watch-cache=false".to_string(),
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", audit_log.display()),
        "--audit-log-format=json".to_string(),
        "--audit-log-mode=blocking".to_string(),
    ];
    let apiserver = ExtraApiServer::start(&bed, "target", &flags).await;
    let spec = FleetSpec::new(&unique("expired"), 150, 150, 0);
    fleet::create(&bed.target().await, &spec, 16).await.unwrap();
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage(&spec.name);

    let log = bed.scratch.path().join(format!("{}-backup.log", spec.name));
    let mut backup = std::process::Command::new(env!("CARGO_BIN_EXE_restatus"))
        .args(["backup", "--selector", &selector, "--page-size", "1", "--kubeconfig"])
        .arg(&apiserver.kubeconfig)
        .env("RESTATUS_STORAGE", &storage)
        .env("RESTATUS_CLUSTER_ID", &spec.name)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let pid = backup.id().to_string();
    // Stopped once it asks for a page with a continue token: in the middle of a listing.
    let paged = |events: &[Value]| {
        events.iter().filter(|e| e["requestURI"].as_str().is_some_and(|u| u.contains("continue="))).count()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while paged(&audit_events(&audit_log)) == 0 {
        assert!(Instant::now() < deadline, "no second page within 60 s: {}", std::fs::read_to_string(&log).unwrap());
        assert!(backup.try_wait().unwrap().is_none(), "the backup ended before its second page");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_success(&std::process::Command::new("kill").args(["-STOP", &pid]).output().unwrap(), "SIGSTOP");
    let pages_before = paged(&audit_events(&audit_log));
    assert!(pages_before < 250, "stopped in the middle of its listing ({pages_before} pages of 300)");

    // Etcd compacts past a token taken now (after the stop): the backup's is older.
    let probe = bed.kubectl(&apiserver.kubeconfig, &["get", "--raw", "/api/v1/namespaces?limit=1"]);
    assert_success(&probe, "probe list");
    let token = serde_json::from_str::<Value>(&stdout(&probe)).unwrap()["metadata"]["continue"]
        .as_str()
        .expect("a continue token (more than one namespace)")
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // A write moves etcd's revision on, so that the next compaction passes the token's.
        let marker = bed.kubectl(
            &apiserver.kubeconfig,
            &[
                "annotate",
                "namespace",
                "default",
                "--overwrite",
                &format!("restatus-test/f44={}", rand::random::<u32>()),
            ],
        );
        assert_success(&marker, "advance etcd's revision");
        let uri = format!("/api/v1/namespaces?limit=1&continue={token}");
        let out = bed.kubectl(&apiserver.kubeconfig, &["get", "--raw", &uri]);
        if !out.status.success() && stderr(&out).contains("Expired") {
            break;
        }
        assert!(Instant::now() < deadline, "etcd did not compact past the probe's token within 60 s: {}", stderr(&out));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_success(&std::process::Command::new("kill").args(["-CONT", &pid]).output().unwrap(), "SIGCONT");
    let status = exit_of(&mut backup, Duration::from_secs(120)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "backup exited with {status}: {text}");
    assert!(text.contains("listing outlived its continue token"), "the 410 was met and handled: {text}");
    let relisted = audit_events(&audit_log).iter().filter(|e| e["responseStatus"]["code"] == 410).count();
    assert!(relisted >= 1, "the API server answered 410");

    // The same objects as a backup without the fault, each once.
    let store = bed.store(&storage, &spec.name);
    let written: Vec<_> = store.list().await.unwrap().into_iter().filter(|e| e.complete).collect();
    assert_eq!(written.len(), 1, "{written:?}");
    let (manifest, records_) = records(&store, written[0].id.as_str()).await;
    assert!(manifest.is_consistent(), "{manifest:?}");
    let names = |records: &[restatus::format::Record]| {
        let mut names: Vec<String> = records.iter().map(|r| format!("{} {}", r.kind, r.object_name())).collect();
        names.sort();
        names
    };
    let reference_storage = bed.storage(&format!("{}-ref", spec.name));
    let args = ["backup", "--selector", selector.as_str()];
    assert_success(&bed.restatus_with(&bed.target_kubeconfig, &reference_storage, &spec.name, &args, &[]), "reference");
    let reference = bed.store(&reference_storage, &spec.name);
    let id = reference.list().await.unwrap().into_iter().find(|e| e.complete).unwrap().id;
    let (_, expected) = records(&reference, id.as_str()).await;
    assert_eq!(names(&records_), names(&expected), "each object once");
    drop(apiserver);
}
