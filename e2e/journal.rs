//! The journal on the real test bed: status changes after the last snapshot reach the bucket as
//! segments, a restore after a simulated move brings them back, a restarted journal resumes its
//! chain, an idle fleet writes nothing, and a corrupt segment stops a restore at the point
//! before it, saying so.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams, PostParams};
use restatus::domain::identity::Profile;
use restatus::fleet::{self, FLEET_LABEL, FleetSpec};
use restatus::format::{Chain, Records, SEGMENT_PAYLOAD_SUFFIX, SnapshotId, choose_point, point};
use restatus::store::SnapshotStore;
use serde_json::{Value, json};

use crate::controller::{Controller, ControllerRun, metric};

use crate::bed::{
    Bed, TARGET, assert_success, fleet_state, generate_age_keys, generate_keys, records, simulate_move, stderr, stdout,
    unique,
};

/// A fleet made on the source, and where its snapshots go: the storage URL, the cluster id and
/// the selector that picks the fleet.
struct Fleet {
    spec: FleetSpec,
    source: kube::Client,
    storage: String,
    cluster: String,
    selector: String,
}

impl Fleet {
    async fn on_source(bed: &Bed, prefix: &str, servers: usize, bmcs: usize, claims: usize) -> Fleet {
        let spec = FleetSpec::new(&unique(prefix), servers, bmcs, claims);
        let source = bed.source().await;
        fleet::create(&source, &spec, 8).await.expect("create fleet");
        let (storage, cluster) = (bed.storage(&spec.name), spec.name.clone());
        let selector = format!("{FLEET_LABEL}={}", spec.name);
        Fleet { spec, source, storage, cluster, selector }
    }
}

/// `restatus backup` of the fleet `selector` picks (with `args`): the snapshot's id.
fn backup(bed: &Bed, storage: &str, cluster: &str, selector: &str, args: &[&str]) -> SnapshotId {
    let out = bed.restatus(storage, cluster, &[&["backup", "--selector", selector], args].concat());
    assert_success(&out, "backup");
    stdout(&out).trim().parse().unwrap()
}

/// A snapshot's manifest and records, loaded and verified through `store`.
async fn records_of(store: &SnapshotStore, id: &SnapshotId) -> (restatus::format::Manifest, Records) {
    let (manifest, records) = records(store, id.as_str()).await;
    (manifest, Records::from_records(records))
}

/// `restatus journal` against the source, its log in a file of the test's own.
fn start_journal(bed: &Bed, storage: &str, cluster: &str, selector: &str, interval: &str) -> (Child, PathBuf) {
    start_journal_with(bed, storage, cluster, selector, &["--journal-interval", interval])
}

fn start_journal_with(bed: &Bed, storage: &str, cluster: &str, selector: &str, args: &[&str]) -> (Child, PathBuf) {
    start_journal_as(bed, &bed.source_kubeconfig, storage, cluster, selector, args)
}

/// [`start_journal_with`] as whoever `kubeconfig` authenticates.
fn start_journal_as(
    bed: &Bed,
    kubeconfig: &std::path::Path,
    storage: &str,
    cluster: &str,
    selector: &str,
    args: &[&str],
) -> (Child, PathBuf) {
    let args: Vec<&str> = ["journal", "--selector", selector].into_iter().chain(args.iter().copied()).collect();
    bed.spawn(Bed::command(kubeconfig, storage, cluster, &args, &[]))
}

fn log_of(log: &PathBuf) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Waits (at most `within`) until the journal's log holds `text` `times` times.
async fn wait_log(log: &PathBuf, text: &str, times: usize, within: Duration) {
    let deadline = Instant::now() + within;
    while log_of(log).matches(text).count() < times {
        assert!(Instant::now() < deadline, "{text:?} not logged {times} times within {within:?}:\n{}", log_of(log));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn stop(child: &mut Child, log: &PathBuf) {
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the journal did not exit within 30 s of SIGTERM:\n{}", log_of(log));
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "the journal exited with {status}:\n{}", log_of(log));
}

/// The statuses, by object name, at the newest consistent point of the base's chain, and the
/// chain.
async fn at_newest_point(store: &SnapshotStore, base: &SnapshotId, records: &Records) -> (Chain, Vec<(String, Value)>) {
    let created = base.timestamp().unwrap();
    let manifest = store.manifest(base).await.unwrap();
    let chain = store.read_chain(base, manifest.created_at.max(created), None).await.unwrap();
    let applied = choose_point(&chain.links, None, true, false).map_or(0, |c| c.applied);
    let merged = point(records, &chain.links[..applied]).unwrap();
    let statuses =
        merged.into_iter().map(|r| (r.name.clone(), serde_json::from_str(r.status.get()).unwrap())).collect();
    (chain, statuses)
}

/// Waits (at most `within`) until the newest consistent point of the chain satisfies `holds`.
async fn wait_point(
    store: &SnapshotStore,
    base: &SnapshotId,
    records: &Records,
    within: Duration,
    holds: impl Fn(&[(String, Value)]) -> bool,
) -> Chain {
    let deadline = Instant::now() + within;
    loop {
        let (chain, statuses) = at_newest_point(store, base, records).await;
        if holds(&statuses) {
            return chain;
        }
        assert!(
            Instant::now() < deadline,
            "the chain did not reach the expected point within {within:?}: {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn status_of<'a>(statuses: &'a [(String, Value)], name: &str) -> &'a Value {
    statuses.iter().find(|(n, _)| n == name).map_or(&Value::Null, |(_, s)| s)
}

fn api(client: &kube::Client, kind: &str, namespace: Option<&str>) -> kube::Api<kube::api::DynamicObject> {
    restatus::k8s::api_for(client, Profile::metal_operator().kind(kind).unwrap(), namespace)
}

async fn patch_status(client: &kube::Client, kind: &str, namespace: Option<&str>, name: &str, status: Value) {
    api(client, kind, namespace)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(json!({"status": status})))
        .await
        .unwrap_or_else(|e| panic!("patch the status of {kind} {name}: {e}"));
}

async fn patch_spec(client: &kube::Client, kind: &str, namespace: Option<&str>, name: &str, spec: Value) {
    api(client, kind, namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": spec})))
        .await
        .unwrap_or_else(|e| panic!("patch the spec of {kind} {name}: {e}"));
}

/// A fleet backed up; the journal, started against it, journals a Server's status change and a
/// claim becoming Bound (on a Server becoming Reserved for it) after the snapshot; an idle fleet
/// writes no segment; a journal stopped and started again resumes the chain (the next sequence
/// number, and the change made while it was away, written as its final segment on SIGTERM);
/// after a simulated move, a restore brings back every status as the source has it, and a
/// second one writes nothing; a corrupt segment makes a restore stop at the point before it and
/// say so, naming the base and the segment.
#[tokio::test]
async fn the_journal_carries_changes_after_the_snapshot_through_a_move() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let Fleet { spec, source, storage, cluster, selector } = Fleet::on_source(&bed, "jrn", 4, 4, 2).await;
    // A claim not yet bound, and the Server it will bind to (Available, the first without claim).
    let namespace = spec.namespaces[0].clone();
    let claim = format!("{}-late", spec.name);
    let server = spec.server_name(spec.claims);
    let other = spec.server_name(spec.claims + 1);
    let object = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim",
        "metadata": {"name": claim, "namespace": namespace, "labels": {FLEET_LABEL: spec.name}},
        "spec": {"power": "On", "image": "gardenlinux:1877.0"}});
    api(&source, "ServerClaim", Some(&namespace))
        .create(&PostParams::default(), &serde_json::from_value(object).unwrap())
        .await
        .expect("create the claim");
    patch_status(&source, "ServerClaim", Some(&namespace), &claim, json!({"phase": "Unbound"})).await;

    let base = backup(&bed, &storage, &cluster, &selector, &[]);
    let store = bed.store(&storage, &cluster);
    let (_, base_records) = records_of(&store, &base).await;
    assert_eq!(base_records.len(), spec.total() + 1);

    // The journal, every second.
    let (mut journal, log) = start_journal(&bed, &storage, &cluster, &selector, "1s");
    wait_log(&log, "every kind listed", 1, Duration::from_secs(60)).await;
    assert!(store.list_segments(&base).await.unwrap().is_empty(), "nothing changed yet: no segment");

    // After the snapshot: a Server's status changes; the claim binds.
    patch_status(&source, "Server", None, &other, json!({"powerState": "On", "indicatorLED": "Blinking"})).await;
    patch_spec(&source, "Server", None, &server, json!({"serverClaimRef": {"namespace": namespace, "name": claim}}))
        .await;
    patch_status(&source, "Server", None, &server, json!({"state": "Reserved", "powerState": "On"})).await;
    patch_spec(&source, "ServerClaim", Some(&namespace), &claim, json!({"serverRef": {"name": server}})).await;
    patch_status(&source, "ServerClaim", Some(&namespace), &claim, json!({"phase": "Bound"})).await;
    let changed = |s: &[(String, Value)]| {
        status_of(s, &claim)["phase"] == "Bound"
            && status_of(s, &server)["state"] == "Reserved"
            && status_of(s, &other)["indicatorLED"] == "Blinking"
    };
    // Within 30 s: a 1 s interval, with room for a slow, shared test bed.
    let chain = wait_point(&store, &base, &base_records, Duration::from_secs(30), changed).await;
    assert_eq!(chain.stop, None);
    let written = chain.links.len();
    assert!(written >= 1);
    assert!(chain.links.last().unwrap().header.consistency.as_ref().unwrap().consistent);

    // Idle: no change to the fleet, no segment. The window, 5 s, is five cuts of a journal that
    // has every event of the fleet (the point above holds the last change made); a cut writes
    // only what differs from the chain (unit tests in journal::state show a re-listed,
    // unchanged fleet and a change undone before the cut write nothing).
    let headers = |entries: Vec<restatus::store::journal::SegmentEntry>| entries.iter().filter(|e| e.header).count();
    let before = headers(store.list_segments(&base).await.unwrap());
    assert_eq!(before, written);
    let window = Instant::now() + Duration::from_secs(5);
    while Instant::now() < window {
        assert_eq!(headers(store.list_segments(&base).await.unwrap()), before, "a segment written for an idle fleet");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Stopped, a change made while it is away, started again with an interval no cut reaches
    // in this test: the change is found by its first listing and written as the final segment
    // on SIGTERM, as the next segment of the same chain.
    stop(&mut journal, &log).await;
    patch_status(&source, "Server", None, &other, json!({"indicatorLED": "Off", "powerState": "Off"})).await;
    let (mut journal, log) = start_journal(&bed, &storage, &cluster, &selector, "1h");
    wait_log(&log, &format!("resumes_at={}", written + 1), 1, Duration::from_secs(60)).await;
    wait_log(&log, "every kind listed", 1, Duration::from_secs(60)).await;
    stop(&mut journal, &log).await;
    let (chain, statuses) = at_newest_point(&store, &base, &base_records).await;
    assert_eq!(chain.stop, None, "no gap");
    assert_eq!(chain.links.len(), written + 1, "one more segment: {}", log_of(&log));
    assert_eq!(chain.links.last().unwrap().header.sequence, written as u64 + 1);
    assert_eq!(status_of(&statuses, &other)["indicatorLED"], "Off", "the change made while it was away");
    assert_eq!(status_of(&statuses, &claim)["phase"], "Bound", "nothing lost");
    assert_eq!(status_of(&statuses, &server)["state"], "Reserved", "nothing lost");

    // The move, then the restore: every status as the source has it, the later changes too.
    simulate_move(&source, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    let restore_exits = |extra: &[&str], code: i32| {
        let mut args = vec!["restore", "--selector", &selector, "-o", "json"];
        args.extend(extra);
        let out = bed.restatus_with(&bed.target_kubeconfig, &storage, &cluster, &args, &[]);
        assert_eq!(out.status.code(), Some(code), "restore: {}", stderr(&out));
        (serde_json::from_str::<Value>(&stdout(&out)).expect("restore -o json"), stderr(&out))
    };
    let restore = |extra: &[&str]| restore_exits(extra, 0);
    let (report, _) = restore(&[]);
    assert_eq!(report["snapshot"], base.as_str());
    let point = &report["restoredTo"];
    assert_eq!(point["base"], base.as_str(), "{report}");
    assert_eq!(point["segmentsApplied"], written as u64 + 1, "{point}");
    assert!(point.get("gap").is_none(), "{point}");
    assert!(report["pairing"].as_array().unwrap().is_empty(), "{}", report["pairing"]);
    let source_state = fleet_state(&source, &spec.name).await;
    let target_state = fleet_state(&bed.target().await, &spec.name).await;
    assert_eq!(source_state.len(), spec.total() + 1);
    for (name, (status, _)) in &source_state {
        assert_eq!(&target_state[name].0, status, "{name}");
    }
    let (again, _) = restore(&[]);
    assert_eq!(again["writes"], 0, "a second restore writes nothing: {again}");

    // The last segment corrupt: the restore stops at the one before it, and says so.
    let last = written as u64 + 1;
    let path = store.segment_object_path(&base, last, SEGMENT_PAYLOAD_SUFFIX);
    object_store::ObjectStoreExt::put(
        store.object_store().as_ref(),
        &path,
        bytes::Bytes::from_static(b"garbage").into(),
    )
    .await
    .unwrap();
    // F162 (issue 38, item 9): an older point than the bucket shows is exit 5 and `behind`,
    // never a silent 0.
    let (report, err) = restore_exits(&["--dry-run"], 5);
    let point = &report["restoredTo"];
    assert_eq!(point["segmentsApplied"], written as u64, "{point}");
    let gap = point["gap"].as_str().unwrap_or_default();
    let expected = format!("segment {last} of base {base}: is corrupt");
    assert!(gap.starts_with(&expected), "{gap}");
    assert!(gap.contains(&format!("restoring to segment {written} at")), "{gap}");
    assert!(err.contains(&expected), "the log says it too: {err}");
    let behind = report["behind"].as_str().unwrap_or_default();
    assert!(behind.contains("older than the newest point the bucket shows") && behind.contains(&expected), "{report}");
}

/// A signed journal: when the scheduled backup writes a newer snapshot, the journal starts a new
/// chain on it, whose first segment holds the change made after that snapshot; its segments
/// are signed and a restore trusting the key uses them; a segment written by someone without
/// the key (unsigned, the next of the chain) stops the chain before it, and the restore says so;
/// without keys nothing is checked.
#[tokio::test]
async fn a_newer_base_starts_a_new_signed_chain_and_an_unsigned_segment_is_refused() {
    let bed = Bed::get();
    let Fleet { spec, source, storage, cluster, selector } = Fleet::on_source(&bed, "jrn-base", 2, 2, 1).await;
    let (key, public, key_id) = generate_keys(&bed, &unique("journal-key"));
    let (key, public) = (key.display().to_string(), public.display().to_string());
    let backup = || backup(&bed, &storage, &cluster, &selector, &["--signing-key", &key]);
    let first = backup();
    let store = bed.store(&storage, &cluster);
    let args = ["--journal-interval", "1s", "--base-refresh", "1s", "--signing-key", &key];
    let (mut journal, log) = start_journal_with(&bed, &storage, &cluster, &selector, &args);
    wait_log(&log, "every kind listed", 1, Duration::from_secs(60)).await;
    let server = spec.server_name(1);
    patch_status(&source, "Server", None, &server, json!({"indicatorLED": "Blinking"})).await;
    let (_, first_records) = records_of(&store, &first).await;
    let blinking = |s: &[(String, Value)]| status_of(s, &server)["indicatorLED"] == "Blinking";
    wait_point(&store, &first, &first_records, Duration::from_secs(30), blinking).await;

    // The schedule's next snapshot, then a change after it: the journal moves to the new base,
    // and the new chain's first segment holds the change.
    let second = backup();
    patch_status(&source, "Server", None, &server, json!({"indicatorLED": "Lit"})).await;
    wait_log(&log, "a newer base snapshot", 1, Duration::from_secs(30)).await;
    let (_, second_records) = records_of(&store, &second).await;
    let lit = |s: &[(String, Value)]| status_of(s, &server)["indicatorLED"] == "Lit";
    let chain = wait_point(&store, &second, &second_records, Duration::from_secs(30), lit).await;
    assert_eq!(chain.links[0].header.sequence, 1, "a new chain");
    assert_eq!(chain.links[0].header.base_snapshot_id, second);
    stop(&mut journal, &log).await;
    let segments = chain.links.len() as u64;

    // Trusting the key: every segment verifies; the restore (a dry run on the source itself)
    // goes to the newest point.
    let trusted = restatus::format::TrustedKeys::load(std::slice::from_ref(&public)).unwrap().unwrap();
    let verified = store.read_chain(&second, second.timestamp().unwrap(), Some(&trusted)).await.unwrap();
    assert_eq!((verified.links.len() as u64, verified.stop.clone()), (segments, None));
    assert!(verified.links.iter().all(|l| l.signer.as_ref().map(|k| k.as_str()) == Some(key_id.as_str())));
    let dry_run_exits = |extra: &[&str], code: i32| {
        let mut args = vec!["restore", "--dry-run", "--allow-same-cluster", "--selector", &selector, "-o", "json"];
        args.extend(extra);
        let out = bed.restatus(&storage, &cluster, &args);
        assert_eq!(out.status.code(), Some(code), "restore --dry-run: {}", stderr(&out));
        serde_json::from_str::<Value>(&stdout(&out)).expect("restore -o json")
    };
    let dry_run = |extra: &[&str]| dry_run_exits(extra, 0);
    let report = dry_run(&["--trusted-key", &public]);
    assert_eq!(report["snapshot"], second.as_str());
    assert_eq!(report["restoredTo"]["segmentsApplied"], segments, "{}", report["restoredTo"]);

    // A segment by someone without the key: unsigned, the next of the chain, well formed.
    let mut forged = second_records.record(0).unwrap();
    forged.status = serde_json::value::RawValue::from_string(r#"{"state":"Forged"}"#.into()).unwrap();
    let (bytes, summary) = restatus::fixtures::encode(std::slice::from_ref(&forged));
    let last = &verified.links.last().unwrap().header;
    let mut header = restatus::format::SegmentHeader::new(
        &cluster,
        &second,
        segments + 1,
        verified.last_sha256(),
        last.to,
        jiff::Timestamp::now(),
        Default::default(),
        (1, 0),
        summary,
        None,
    );
    store.put_segment(&mut header, bytes, None).await.unwrap();
    // F162: stopped at a refused segment, the restore exits 5 and says it is behind.
    let report = dry_run_exits(&["--trusted-key", &public], 5);
    let point = &report["restoredTo"];
    assert_eq!(point["segmentsApplied"], segments, "{point}");
    let gap = point["gap"].as_str().unwrap_or_default();
    assert!(gap.starts_with(&format!("segment {} of base {second}: signature refused", segments + 1)), "{gap}");
    assert!(report["behind"].as_str().is_some_and(|b| b.contains("signature refused")), "{report}");
    // Without keys nothing is checked: the unsigned segment is used (as unsigned snapshots are).
    assert_eq!(dry_run(&[])["restoredTo"]["segmentsApplied"], segments + 1);
}

/// Encrypted backups and an encrypted journal: the journal reads its base with the decryption
/// key and encrypts its segments to the recipient (no object name readable in the bucket); a
/// restore with the key goes to the newest point.
#[tokio::test]
async fn an_encrypted_journal_reads_its_base_with_the_key_and_hides_its_records() {
    let bed = Bed::get();
    let Fleet { spec, source, storage, cluster, selector } = Fleet::on_source(&bed, "jrn-age", 2, 2, 1).await;
    let (agekey, recipient, _) = generate_age_keys(&bed, &unique("journal-age"));
    let (agekey, recipient) = (agekey.display().to_string(), recipient.display().to_string());
    let base = backup(&bed, &storage, &cluster, &selector, &["--encrypt-to", &recipient]);
    let args = ["--journal-interval", "1s", "--encrypt-to", &recipient, "--decryption-key", &agekey];
    let (mut journal, log) = start_journal_with(&bed, &storage, &cluster, &selector, &args);
    wait_log(&log, "every kind listed", 1, Duration::from_secs(60)).await;
    let server = spec.server_name(1);
    patch_status(&source, "Server", None, &server, json!({"indicatorLED": "Blinking"})).await;
    let keys = restatus::format::DecryptionKeys::load(&[PathBuf::from(&agekey)]).unwrap().map(std::sync::Arc::new);
    let store = bed.store(&storage, &cluster).with_decryption_keys(keys);
    let (_, base_records) = records_of(&store, &base).await;
    let blinking = |s: &[(String, Value)]| status_of(s, &server)["indicatorLED"] == "Blinking";
    let chain = wait_point(&store, &base, &base_records, Duration::from_secs(30), blinking).await;
    stop(&mut journal, &log).await;
    let header = &chain.links[0].header;
    assert!(header.encryption.is_some(), "{header:?}");
    let path = store.segment_object_path(&base, 1, SEGMENT_PAYLOAD_SUFFIX);
    let stored = object_store::ObjectStoreExt::get(store.object_store().as_ref(), &path).await.unwrap();
    let stored = stored.bytes().await.unwrap();
    assert!(!stored.windows(server.len()).any(|w| w == server.as_bytes()), "an object name readable in the bucket");
    // Without the key the chain stops before its first segment, and says why.
    let plain = bed.store(&storage, &cluster);
    let unread = plain.read_chain(&base, base.timestamp().unwrap(), None).await.unwrap();
    assert!(unread.links.is_empty());
    assert!(unread.stop.unwrap().reason.contains("encrypted"), "needs the key");
    let out = bed.restatus(
        &storage,
        &cluster,
        &[
            "restore",
            "--dry-run",
            "--allow-same-cluster",
            "--selector",
            &selector,
            "--decryption-key",
            &agekey,
            "-o",
            "json",
        ],
    );
    assert_success(&out, "restore --dry-run");
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["restoredTo"]["segmentsApplied"], chain.links.len() as u64, "{}", report["restoredTo"]);
}

/// `GET path` on 127.0.0.1:`port`: the HTTP status code and the body, or None while nothing answers.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", &format!("http://127.0.0.1:{port}{path}")])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n')?;
    Some((code.trim().parse().ok()?, body.to_string()))
}

/// Scrapes the journal's /metrics until `done` holds (at most `within`), the body then.
async fn scrape_until(port: u16, log: &PathBuf, within: Duration, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + within;
    let mut last = None;
    loop {
        if let Some((_, body)) = crate::metrics::scrape(port) {
            if done(&body) {
                return body;
            }
            last = Some(body);
        }
        assert!(Instant::now() < deadline, "metrics not as expected within {within:?}: {last:?}\n{}", log_of(log));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Operating the journal: `--metrics-addr` serves /metrics, /healthz and /readyz. Before a base
/// it is not ready and its lag is 0; chained and listed it is ready, names its base and, with
/// nothing changing, still says lag 0. A change is pending (the lag gauge grows, one object
/// pending) until the next cut writes it: then one segment, one change, its lag in the
/// histogram, bytes counted, the newest segment's time, and the lag back to 0. `snapshots
/// list` shows the base's journal: its segments, the newest one's time and its lag behind now.
#[tokio::test]
async fn the_journal_exports_its_lag_and_snapshots_list_shows_its_segments() {
    let bed = Bed::get();
    let Fleet { spec, source, storage, cluster, selector } = Fleet::on_source(&bed, "jrn-ops", 2, 2, 1).await;
    let port = crate::metrics::free_port();
    let addr = format!("127.0.0.1:{port}");
    // A cut every 8 s: a change waits long enough for a scrape to see it pending.
    let args = ["--journal-interval", "8s", "--base-wait", "2m", "--metrics-addr", &addr];
    let (mut journal, log) = start_journal_with(&bed, &storage, &cluster, &selector, &args);
    let label = format!(r#"{{cluster_id="{cluster}"}}"#);
    let get = |body: &str, name: &str| crate::metrics::value(body, &format!("{name}{label}"));

    // No snapshot yet: served, not ready, lag 0.
    let body = scrape_until(port, &log, Duration::from_secs(30), |_| true).await;
    assert_eq!(get(&body, "restatus_journal_ready"), Some(0.0), "{body}");
    assert_eq!(get(&body, "restatus_journal_lag_seconds"), Some(0.0), "{body}");
    let (code, text) = http_get(port, "/readyz").unwrap();
    assert_eq!(code, 503, "{text}");
    assert!(text.contains("not ready: no base snapshot"), "{text}");
    assert_eq!(http_get(port, "/healthz").map(|(c, _)| c), Some(200));
    // A second journal on the same address stops at once, saying why.
    let taken = bed.restatus(&storage, &cluster, &["journal", "--metrics-addr", &addr]);
    assert!(!taken.status.success());
    assert!(stderr(&taken).contains(&format!("--metrics-addr {addr}")), "{}", stderr(&taken));

    let base = backup(&bed, &storage, &cluster, &selector, &[]);
    wait_log(&log, "every kind listed", 1, Duration::from_secs(60)).await;
    let body =
        scrape_until(port, &log, Duration::from_secs(10), |b| get(b, "restatus_journal_ready") == Some(1.0)).await;
    assert_eq!(http_get(port, "/readyz").map(|(c, _)| c), Some(200));
    let base_series = format!(r#"restatus_journal_base{{cluster_id="{cluster}",base="{base}"}}"#);
    assert_eq!(crate::metrics::value(&body, &base_series), Some(1.0), "{body}");
    let base_time = base.timestamp().unwrap().as_millisecond() as f64 / 1000.0;
    assert_eq!(get(&body, "restatus_journal_base_timestamp_seconds"), Some(base_time));
    // Listed and unchanged: lag 0, nothing written, over two cuts (16 s): the idle fleet.
    let idle_until = Instant::now() + Duration::from_secs(16);
    while Instant::now() < idle_until {
        let body = crate::metrics::scrape(port).expect("scrape").1;
        assert_eq!(get(&body, "restatus_journal_lag_seconds"), Some(0.0), "idle: {body}");
        assert_eq!(get(&body, "restatus_journal_segments_total"), Some(0.0), "idle: {body}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(store_headers(&bed.store(&storage, &cluster), &base).await == 0);

    // A change, written by the next cut; then (at once, so that the next cut is most of an
    // interval away) another: pending (the gauge passes 1 s, one object pending) until the cut
    // after, then written too.
    let segments = |n: f64| move |b: &str| get(b, "restatus_journal_segments_total").is_some_and(|s| s >= n);
    let server = spec.server_name(1);
    patch_status(&source, "Server", None, &server, json!({"indicatorLED": "Blinking"})).await;
    scrape_until(port, &log, Duration::from_secs(30), segments(1.0)).await;
    patch_status(&source, "Server", None, &server, json!({"indicatorLED": "Off"})).await;
    let body = scrape_until(port, &log, Duration::from_secs(10), |b| {
        get(b, "restatus_journal_lag_seconds").is_some_and(|lag| lag >= 1.0) || segments(2.0)(b)
    })
    .await;
    assert_eq!(get(&body, "restatus_journal_segments_total"), Some(1.0), "written before it was seen pending: {body}");
    assert_eq!(get(&body, "restatus_journal_pending_changes"), Some(1.0), "{body}");
    let body = scrape_until(port, &log, Duration::from_secs(30), segments(2.0)).await;
    assert_eq!(get(&body, "restatus_journal_segments_total"), Some(2.0), "{body}");
    assert_eq!(get(&body, "restatus_journal_changes_total"), Some(2.0), "{body}");
    assert_eq!(get(&body, "restatus_journal_lag_seconds"), Some(0.0), "written: {body}");
    assert_eq!(get(&body, "restatus_journal_pending_changes"), Some(0.0), "{body}");
    assert_eq!(get(&body, "restatus_journal_change_lag_seconds_count"), Some(2.0), "{body}");
    let lag = get(&body, "restatus_journal_change_lag_seconds_sum").unwrap();
    assert!((1.0..=30.0).contains(&lag), "the changes waited for their cuts: {lag} s in all");
    let errors = format!(r#"restatus_journal_errors_total{{cluster_id="{cluster}",operation="segment"}}"#);
    assert_eq!(crate::metrics::value(&body, &errors), Some(0.0));
    let store = bed.store(&storage, &cluster);
    let chain = store.read_chain(&base, base.timestamp().unwrap(), None).await.unwrap();
    assert_eq!(chain.links.len(), 2);
    let header = &chain.links[1].header;
    let stored: u64 = store.list_segments(&base).await.unwrap().iter().filter_map(|e| e.payload_size).sum();
    let bytes = get(&body, "restatus_journal_bytes_total").unwrap();
    assert!(bytes > stored as f64, "records ({stored}) and headers: {bytes}");
    let to = header.to.as_millisecond() as f64 / 1000.0;
    assert_eq!(get(&body, "restatus_journal_newest_segment_timestamp_seconds"), Some(to));
    assert_eq!(get(&body, "restatus_journal_chain_segments"), Some(2.0));

    // snapshots list: the base's journal, from its listing and newest header.
    let out = bed.restatus(&storage, &cluster, &["snapshots", "list", "-o", "json"]);
    assert_success(&out, "snapshots list");
    let rows: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let row = rows.as_array().unwrap().iter().find(|r| r["id"] == base.as_str()).expect("the base listed");
    let listed = &row["journal"];
    assert_eq!(listed["segments"], 2, "{row}");
    assert_eq!(listed["newestSegment"], 2, "{row}");
    assert_eq!(listed["newestAt"], header.to.to_string(), "{row}");
    let behind = listed["lagSeconds"].as_i64().unwrap();
    let since = jiff::Timestamp::now().duration_since(header.to).as_secs();
    assert!((0..=since).contains(&behind), "{behind} s behind, written {since} s ago");
    let out = bed.restatus(&storage, &cluster, &["snapshots", "list"]);
    let table = stdout(&out);
    let line = table.lines().find(|l| l.starts_with(base.as_str())).unwrap_or_else(|| panic!("{table}"));
    assert!(line.contains(&format!("2 to {}", header.to)) && line.contains(" behind)"), "{table}");
    stop(&mut journal, &log).await;
}

/// Segments of `base` with a header.
async fn store_headers(store: &SnapshotStore, base: &SnapshotId) -> usize {
    store.list_segments(base).await.unwrap().iter().filter(|e| e.header).count()
}

/// manifests/journal's ServiceAccount (applied to the source, its token used): the journal
/// runs as it (every kind listed, a change written as a segment, nothing forbidden in its log),
/// and it may read nothing but the profile's kinds: no Secret (the S3 keys' among them), no
/// BMCSecret, no ConfigMap, no namespace; nor write anything.
#[tokio::test]
async fn least_privilege_journal_service_account_journals_and_cannot_read_secrets() {
    let bed = Bed::get();
    let kubeconfig = bed.deploy(&bed.source_kubeconfig, &["journal"], "restatus-journal");
    let Fleet { spec, source, storage, cluster, selector } = Fleet::on_source(&bed, "jrn-rbac", 2, 2, 1).await;
    let base = backup(&bed, &storage, &cluster, &selector, &[]);
    let store = bed.store(&storage, &cluster);
    let (_, base_records) = records_of(&store, &base).await;

    let args = ["--journal-interval", "1s"];
    let (mut journal, log) = start_journal_as(&bed, &kubeconfig, &storage, &cluster, &selector, &args);
    wait_log(&log, "every kind listed", 1, Duration::from_secs(60)).await;
    let server = spec.server_name(0);
    patch_status(&source, "Server", None, &server, json!({"indicatorLED": "Blinking"})).await;
    let blinking = |s: &[(String, Value)]| status_of(s, &server)["indicatorLED"] == "Blinking";
    wait_point(&store, &base, &base_records, Duration::from_secs(30), blinking).await;
    stop(&mut journal, &log).await;
    let text = log_of(&log);
    assert!(!text.contains("forbidden") && !text.contains("cannot be watched"), "{text}");

    bed.assert_denied(
        &kubeconfig,
        &[
            vec!["get", "secrets", "-A"],
            vec!["-n", "restatus", "get", "secret", "restatus-s3"],
            vec!["get", "bmcsecrets.metal.ironcore.dev"],
            vec!["get", "configmaps", "-A"],
            vec!["get", "namespace", "kube-system"],
            crate::bed::merge_patch(
                None,
                &format!("servers.metal.ironcore.dev/{server}"),
                r#"{"spec":{"power":"Off"}}"#,
            ),
        ],
    );
    for verb_resource in [
        "patch servers.metal.ironcore.dev",
        "update servers.metal.ironcore.dev/status",
        "delete bmcs.metal.ironcore.dev",
        "create serverclaims.metal.ironcore.dev",
        "create events.events.k8s.io",
        "get secrets",
    ] {
        let mut args = vec!["auth", "can-i"];
        args.extend(verb_resource.split(' '));
        let out = bed.kubectl(&kubeconfig, &args);
        assert_eq!(stdout(&out).trim(), "no", "the journal's ServiceAccount may {verb_resource}");
    }
    bed.assert_allowed(&kubeconfig, &[vec!["get", "serverclaims.metal.ironcore.dev", "-A", "-l", &selector]]);
}

/// The bucket stops answering while a change is pending (S3 held by a proxy, the segment's
/// upload waiting in it): the lag gauge keeps growing at each scrape (past 5 s here, where the
/// alert's threshold is 60 s) and nothing is counted written; once the bucket answers again the
/// segment is written, the gauge is back at 0 and the change's lag, more than the stall, is in
/// the histogram.
#[tokio::test]
async fn a_stalled_bucket_shows_as_a_growing_lag_until_the_segment_is_written() {
    let bed = Bed::get();
    let Fleet { spec, source, storage, cluster, selector } = Fleet::on_source(&bed, "jrn-stall", 2, 2, 1).await;
    backup(&bed, &storage, &cluster, &selector, &[]);
    let (proxy, proxied) = crate::bed::CountingProxy::for_s3().await;
    let port = crate::metrics::free_port();
    let addr = format!("127.0.0.1:{port}");
    let args = ["journal", "--selector", &selector, "--journal-interval", "1s", "--metrics-addr", &addr];
    let env = [("S3_ENDPOINT", proxied.as_str()), ("AWS_ENDPOINT_URL_S3", proxied.as_str())];
    let journal =
        crate::metrics::Process::start(&bed, Bed::command(&bed.source_kubeconfig, &storage, &cluster, &args, &env));
    let label = format!(r#"{{cluster_id="{cluster}"}}"#);
    let get = |body: &str, name: &str| crate::metrics::value(body, &format!("{name}{label}"));
    use crate::metrics::scrape_until as until;
    until(&journal, port, Duration::from_secs(60), |b| get(b, "restatus_journal_ready") == Some(1.0)).await;

    proxy.hold();
    let server = spec.server_name(0);
    patch_status(&source, "Server", None, &server, json!({"indicatorLED": "Blinking"})).await;
    let lagging = |b: &str| get(b, "restatus_journal_lag_seconds").is_some_and(|l| l >= 5.0);
    let (_, body) = until(&journal, port, Duration::from_secs(20), lagging).await;
    assert_eq!(get(&body, "restatus_journal_segments_total"), Some(0.0), "nothing written while held: {body}");
    assert!(
        proxy.requests().iter().any(|(method, target)| method == "PUT" && target.contains("/journal/")),
        "the segment's upload waits in the proxy: {:?}",
        proxy.requests()
    );
    proxy.resume();
    let (_, body) = until(&journal, port, Duration::from_secs(60), |b| {
        get(b, "restatus_journal_segments_total").is_some_and(|n| n >= 1.0)
            && get(b, "restatus_journal_lag_seconds") == Some(0.0)
    })
    .await;
    assert_eq!(get(&body, "restatus_journal_change_lag_seconds_count"), Some(1.0), "{body}");
    let lag = get(&body, "restatus_journal_change_lag_seconds_sum").unwrap();
    assert!(lag >= 5.0, "the change waited out the stall: {lag} s");
}

/// The journal killed (SIGKILL) in the middle of a segment upload, on the real S3 server: its
/// records are in the bucket, its header is not (written here as the upload left them). A
/// restore does not see that segment and names no gap; the next journal writes the same
/// sequence number over the orphaned records and completes the chain.
#[tokio::test]
async fn a_journal_killed_in_the_middle_of_an_upload_leaves_no_segment_and_the_next_one_completes_it() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let Fleet { spec, source, storage, cluster, selector } = Fleet::on_source(&bed, "jrk", 3, 0, 0).await;
    let base = backup(&bed, &storage, &cluster, &selector, &[]);
    let store = bed.store(&storage, &cluster);
    let (_, base_records) = records_of(&store, &base).await;
    let (first, second) = (spec.server_name(0), spec.server_name(1));

    let (mut journal, log) = start_journal(&bed, &storage, &cluster, &selector, "1s");
    wait_log(&log, "every kind listed", 1, Duration::from_secs(60)).await;
    patch_status(&source, "Server", None, &first, json!({"indicatorLED": "Blinking"})).await;
    let one = |s: &[(String, Value)]| status_of(s, &first)["indicatorLED"] == "Blinking";
    let chain = wait_point(&store, &base, &base_records, Duration::from_secs(30), one).await;
    let written = chain.links.len() as u64;

    // Killed; the records of its next segment reached the bucket, the header did not.
    journal.kill().unwrap();
    journal.wait().unwrap();
    let orphan = store.segment_object_path(&base, written + 1, SEGMENT_PAYLOAD_SUFFIX);
    object_store::ObjectStoreExt::put(
        store.object_store().as_ref(),
        &orphan,
        bytes::Bytes::from_static(b"records of an upload that died").into(),
    )
    .await
    .unwrap();
    let args = ["restore", "--dry-run", "--selector", &selector, "-o", "json"];
    let dry_run = bed.restatus_with(&bed.target_kubeconfig, &storage, &cluster, &args, &[]);
    assert_success(&dry_run, "restore --dry-run");
    let report: Value = serde_json::from_str(&stdout(&dry_run)).expect("restore -o json");
    assert_eq!(report["restoredTo"]["segmentsApplied"], written, "{report}");
    assert!(report["restoredTo"].get("gap").is_none(), "records without a header are no segment, and no gap: {report}");

    // A change while no journal runs; the next journal writes it as the same sequence number.
    patch_status(&source, "Server", None, &second, json!({"indicatorLED": "Blinking"})).await;
    let (mut journal, log) = start_journal(&bed, &storage, &cluster, &selector, "1s");
    let both = |s: &[(String, Value)]| one(s) && status_of(s, &second)["indicatorLED"] == "Blinking";
    let chain = wait_point(&store, &base, &base_records, Duration::from_secs(30), both).await;
    stop(&mut journal, &log).await;
    assert_eq!(chain.stop, None, "no gap: {}", log_of(&log));
    assert_eq!(chain.links[written as usize].header.sequence, written + 1, "the orphaned sequence number, completed");
}

/// Waits (at most `within`) until `holds` is true of the controller's `/metrics`.
async fn wait_metrics(controller: &Controller, within: Duration, holds: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + within;
    loop {
        let (_, metrics) = controller.get("/metrics").await.unwrap_or_default();
        if holds(&metrics) {
            return metrics;
        }
        assert!(
            Instant::now() < deadline,
            "metrics not as expected within {within:?}: {metrics}\nlog:\n{}",
            log_of(&controller.log)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (at most `within`) until `name`'s status on `client` is `status`.
async fn wait_status(client: &kube::Client, kind: &str, name: &str, status: &Value, within: Duration, log: &PathBuf) {
    let deadline = Instant::now() + within;
    loop {
        let object = api(client, kind, None).get(name).await.unwrap();
        let now = object.data.get("status").cloned().unwrap_or(Value::Null);
        if &now == status {
            return;
        }
        assert!(Instant::now() < deadline, "{kind} {name} is {now}, not {status}, after {within:?}:\n{}", log_of(log));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Item 1 of issue 23: the restore controller reads the journal. A Server's status changed
/// after the snapshot (only in segment 1) is restored by a controller started on the target
/// after the move; a second Server's change, journaled after the controller loaded its point
/// (a segment it has not seen), is picked up at a refresh (`--snapshot-refresh 1s`): the
/// point advances (log, `restatus_snapshot_journal_segments`, the timestamp gauge is the last
/// segment's `to`, `/readyz` names the point), and that Server, created on the target
/// without status afterwards, gets the status the segment holds. `snapshots show` names the
/// same point.
#[tokio::test]
async fn the_controller_restores_to_the_journal_point_and_reads_on_at_each_refresh() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let Fleet { spec, source, storage, cluster, selector } = Fleet::on_source(&bed, "jrn-ctl", 4, 4, 2).await;
    let (first, second) = (spec.server_name(2), spec.server_name(3));
    let base = backup(&bed, &storage, &cluster, &selector, &[]);
    let store = bed.store(&storage, &cluster);
    let (_, base_records) = records_of(&store, &base).await;
    let (mut journal, log) = start_journal(&bed, &storage, &cluster, &selector, "1s");
    wait_log(&log, "every kind listed", 1, Duration::from_secs(60)).await;
    patch_status(&source, "Server", None, &first, json!({"indicatorLED": "Blinking"})).await;
    let blinking = |s: &[(String, Value)]| status_of(s, &first)["indicatorLED"] == "Blinking";
    let chain = wait_point(&store, &base, &base_records, Duration::from_secs(30), blinking).await;
    let loaded_segments = chain.links.len();

    // The move; the second Server is not on the target yet.
    let target = bed.target().await;
    simulate_move(&source, &target, &spec.name, &|n| n.to_string()).await;
    api(&target, "Server", None).delete(&second, &Default::default()).await.unwrap();
    let run = ControllerRun::new(&bed, &storage, &cluster, &selector).snapshot_refresh("1s");
    let controller = run.start_ready().await;
    let source_status = |name: String| {
        let source = source.clone();
        async move { api(&source, "Server", None).get(&name).await.unwrap().data["status"].clone() }
    };
    let first_status = source_status(first.clone()).await;
    assert_eq!(first_status["indicatorLED"], "Blinking");
    wait_status(&target, "Server", &first, &first_status, Duration::from_secs(30), &controller.log).await;
    let segments = |n: usize| move |m: &str| metric(m, "restatus_snapshot_journal_segments") == n as f64;
    wait_metrics(&controller, Duration::from_secs(10), segments(loaded_segments)).await;
    let (_, ready) = controller.get("/readyz").await.unwrap();
    assert!(ready.contains(&format!("restoring to snapshot {base} + ")), "{ready}");

    // After the controller loaded its point: the second Server changes on the source; the
    // journal writes it; the controller's refresh (every second) takes up the new point.
    patch_status(&source, "Server", None, &second, json!({"indicatorLED": "Lit", "powerState": "On"})).await;
    let lit = |s: &[(String, Value)]| status_of(s, &second)["indicatorLED"] == "Lit";
    let chain = wait_point(&store, &base, &base_records, Duration::from_secs(30), lit).await;
    let now = chain.links.len();
    assert!(now > loaded_segments);
    // Within 30 s: refreshes every second, with room for a slow, shared test bed.
    let metrics = wait_metrics(&controller, Duration::from_secs(30), segments(now)).await;
    let to = chain.links.last().unwrap().header.to.as_millisecond() as f64 / 1000.0;
    assert_eq!(metric(&metrics, "restatus_snapshot_timestamp_seconds"), to, "the gauge is the point's time");
    let advanced = log_of(&controller.log);
    assert!(advanced.contains("journal point advanced"), "{advanced}");
    assert_eq!(advanced.matches("using snapshot").count(), 1, "the base is not loaded again: {advanced}");

    // The second Server arrives on the target without status: it gets the segment's status.
    let object = api(&source, "Server", None).get(&second).await.unwrap();
    let copy = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": second, "labels": object.metadata.labels, "annotations": object.metadata.annotations},
        "spec": object.data["spec"]});
    api(&target, "Server", None).create(&PostParams::default(), &serde_json::from_value(copy).unwrap()).await.unwrap();
    let second_status = source_status(second.clone()).await;
    wait_status(&target, "Server", &second, &second_status, Duration::from_secs(30), &controller.log).await;

    // `snapshots show` names the same point; --no-journal the snapshot alone.
    let out = bed.restatus(&storage, &cluster, &["snapshots", "show", base.as_str(), "-o", "json"]);
    assert_success(&out, "snapshots show");
    let shown: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(shown["snapshotId"], base.as_str());
    assert_eq!(shown["journalPoint"]["segmentsApplied"], now as u64, "{shown}");
    let out = bed.restatus(&storage, &cluster, &["snapshots", "show", base.as_str(), "--no-journal", "-o", "json"]);
    let shown: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(shown.get("journalPoint").is_none(), "{shown}");

    stop(&mut journal, &log).await;
    assert!(controller.stop().await.success());
}

/// Item 3 of issue 23: compaction. With `--max-segments 2`, two changes make a chain of two
/// segments, which the journal folds into a new base snapshot (its log says so): its records
/// are the old base's with both segments applied, its time the last segment's `to`, its
/// verdict the last segment's, its `capturedFrom` the old base's; `snapshots diff` of the old
/// base's chain point against the new base alone shows no difference (and against the old
/// base alone, the two changes); the journal moves to the new base and its chain goes on there
/// (a third change is segment 1 of the new base).
#[tokio::test]
async fn a_chain_at_max_segments_is_folded_into_a_new_base_and_goes_on_there() {
    let bed = Bed::get();
    let Fleet { spec, source, storage, cluster, selector } = Fleet::on_source(&bed, "jrn-fold", 2, 2, 1).await;
    let base = backup(&bed, &storage, &cluster, &selector, &[]);
    let store = bed.store(&storage, &cluster);
    let (base_manifest, base_records) = records_of(&store, &base).await;
    // The base refresh far off: the journal moves to the folded base because it folded it.
    let args = ["--journal-interval", "1s", "--max-segments", "2", "--base-refresh", "1h"];
    let (mut journal, log) = start_journal_with(&bed, &storage, &cluster, &selector, &args);
    wait_log(&log, "every kind listed", 1, Duration::from_secs(60)).await;
    let (one, two) = (spec.server_name(0), spec.server_name(1));
    patch_status(&source, "Server", None, &one, json!({"indicatorLED": "Blinking"})).await;
    let blinking = |s: &[(String, Value)]| status_of(s, &one)["indicatorLED"] == "Blinking";
    wait_point(&store, &base, &base_records, Duration::from_secs(30), blinking).await;
    patch_status(&source, "Server", None, &two, json!({"indicatorLED": "Lit"})).await;
    wait_log(&log, "journal chain folded into a new base snapshot", 1, Duration::from_secs(30)).await;
    wait_log(&log, "a newer base snapshot", 1, Duration::from_secs(30)).await;

    let chain = store.read_chain(&base, base_manifest.created_at, None).await.unwrap();
    assert_eq!(chain.links.len(), 2, "folded at two segments");
    let folded = store.list().await.unwrap().into_iter().rev().find(|e| e.complete).unwrap().id;
    assert_ne!(folded, base);
    let (manifest, folded_records) = records(&store, folded.as_str()).await;
    let expected = point(&base_records, &chain.links).unwrap();
    let statuses = |records: &[restatus::format::Record]| {
        let mut s: Vec<(String, String)> =
            records.iter().map(|r| (r.name.clone(), r.status.get().to_string())).collect();
        s.sort();
        s
    };
    assert_eq!(statuses(&folded_records), statuses(&expected), "the folded base holds base + segments");
    assert_eq!(manifest.created_at, chain.links[1].header.to);
    assert!(manifest.is_consistent());
    assert_eq!(manifest.captured_from, base_manifest.captured_from);
    assert_eq!(manifest.payload.records as usize, expected.len());

    // The old base's chain point and the new base alone: no difference. The old base alone:
    // the two changes.
    let diff = |args: &[&str]| {
        let mut all = vec!["snapshots", "diff"];
        all.extend(args);
        all.extend(["-o", "json"]);
        let out = bed.restatus(&storage, &cluster, &all);
        assert_success(&out, "snapshots diff");
        serde_json::from_str::<Value>(&stdout(&out)).unwrap()
    };
    let alone = format!("{folded}@{}", manifest.created_at);
    let same = diff(&[base.as_str(), &alone]);
    assert_eq!(same["changed"].as_array().unwrap().len(), 0, "{same}");
    assert_eq!(same["onlyInA"].as_array().unwrap().len() + same["onlyInB"].as_array().unwrap().len(), 0, "{same}");
    assert_eq!(same["aPoint"]["segmentsApplied"], 2, "{same}");
    assert!(same["bPoint"].is_null() || same["bPoint"]["segmentsApplied"] == 0, "the new base alone: {same}");
    let before = diff(&[base.as_str(), &alone, "--no-journal"]);
    assert_eq!(before["changed"].as_array().unwrap().len(), 2, "{before}");

    // The chain goes on on the new base.
    patch_status(&source, "Server", None, &one, json!({"indicatorLED": "Off"})).await;
    let off = |s: &[(String, Value)]| status_of(s, &one)["indicatorLED"] == "Off";
    let records_of_folded = Records::from_records(folded_records);
    let chain = wait_point(&store, &folded, &records_of_folded, Duration::from_secs(30), off).await;
    assert_eq!(chain.links[0].header.sequence, 1);
    assert_eq!(chain.links[0].header.base_snapshot_id, folded);
    stop(&mut journal, &log).await;
    assert_eq!(log_of(&log).matches("journal chain folded").count(), 1, "{}", log_of(&log));
}

/// F164 (issue 38, item 13): a segment header created at the next sequence number by someone
/// else before the journal could write it (one object, the one any writer to the bucket can
/// create) stops the chain. Before, the journal then wrote nothing until the next backup; now,
/// once a change is pending, it starts a new chain by itself on a base of its own capture (the
/// base's records, its readable segments, the changes pending, dated now), says so, and goes on
/// writing segments on it; a restore goes to the newest point and exits 0.
#[tokio::test]
async fn a_pre_created_segment_header_makes_the_journal_start_a_new_chain_by_itself() {
    let bed = Bed::get();
    let Fleet { spec, source, storage, cluster, selector } = Fleet::on_source(&bed, "jpre", 2, 2, 1).await;
    let base = backup(&bed, &storage, &cluster, &selector, &[]);
    let store = bed.store(&storage, &cluster);
    let header = store.segment_object_path(&base, 1, restatus::format::SEGMENT_HEADER_SUFFIX);
    object_store::ObjectStoreExt::put(store.object_store().as_ref(), &header, bytes::Bytes::from_static(b"{}").into())
        .await
        .unwrap();
    // A base refresh no wait reaches: only the journal's own restart brings a newer base.
    let args = ["--journal-interval", "1s", "--base-refresh", "1h"];
    let (mut journal, log) = start_journal_with(&bed, &storage, &cluster, &selector, &args);
    wait_log(&log, "every kind listed", 1, Duration::from_secs(60)).await;
    let server = spec.server_name(spec.claims);
    patch_status(&source, "Server", None, &server, json!({"indicatorLED": "Blinking"})).await;
    // Within 30 s: a 1 s interval, with room for a slow, shared test bed.
    wait_log(&log, "a new chain starts on snapshot", 1, Duration::from_secs(30)).await;
    let newest = || async { store.list().await.unwrap().into_iter().rev().find(|e| e.complete).map(|e| e.id).unwrap() };
    let own = newest().await;
    assert_ne!(own, base);
    let (manifest, records) = records_of(&store, &own).await;
    assert_eq!(records.len(), spec.total(), "{manifest:?}");
    let status = |records: &Records, name: &str| {
        (0..records.len())
            .map(|i| records.record(i).unwrap())
            .find(|r| r.name == name)
            .map(|r| serde_json::from_str::<Value>(r.status.get()).unwrap())
            .unwrap_or(Value::Null)
    };
    assert_eq!(status(&records, &server)["indicatorLED"], "Blinking", "the pending change is in the new base");
    wait_log(&log, &format!("journal chained to its base base={own}"), 1, Duration::from_secs(30)).await;

    // It goes on: the next change is a segment of the new chain.
    patch_status(&source, "Server", None, &server, json!({"indicatorLED": "Off"})).await;
    let off = |s: &[(String, Value)]| status_of(s, &server)["indicatorLED"] == "Off";
    let chain = wait_point(&store, &own, &records, Duration::from_secs(30), off).await;
    assert_eq!(chain.stop, None);
    stop(&mut journal, &log).await;
    let out = bed.restatus(
        &storage,
        &cluster,
        &["restore", "--dry-run", "--allow-same-cluster", "--selector", &selector, "-o", "json"],
    );
    assert_success(&out, "restore --dry-run");
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["snapshot"], own.as_str(), "{report}");
    assert!(report.get("behind").is_none(), "{report}");
}

/// The complete snapshots of `store` but `known`.
async fn other_snapshots(store: &SnapshotStore, known: &[&SnapshotId]) -> Vec<SnapshotId> {
    let entries = store.list().await.unwrap();
    entries.into_iter().filter(|e| e.complete && !known.contains(&&e.id)).map(|e| e.id).collect()
}

/// Issue 38 item 1 (F130, F131): a journal that signs, deployed as the chart and
/// manifests/journal deploy it without `signing.trustedKeys` (`--signing-key`, no
/// `--trusted-key`), trusts its own key. Two snapshots newer than its signed base are put in
/// the bucket: one unsigned, every status `Forged` (anyone who can write the bucket), one
/// signed with the key but dated an hour ahead (a backup machine's clock gone wrong). The
/// journal passes both over, saying why; the changes made after them go into the signed base's
/// chain, and its fold (`--max-segments 2`) is a snapshot signed with the key holding the
/// signed base and those changes, no `Forged` status; it then moves to that fold, never to
/// either planted one.
#[tokio::test]
async fn a_signing_journal_never_takes_a_forged_or_future_snapshot_as_its_base() {
    let bed = Bed::get();
    let Fleet { spec, source, storage, cluster, selector } = Fleet::on_source(&bed, "jrn-trust", 2, 2, 1).await;
    let (key_path, _, key_id) = generate_keys(&bed, &unique("journal-trust"));
    let key_file = key_path.display().to_string();
    let base = backup(&bed, &storage, &cluster, &selector, &["--signing-key", &key_file]);
    let store = bed.store(&storage, &cluster);
    let (base_manifest, base_records) = records_of(&store, &base).await;
    let args = ["--journal-interval", "1s", "--base-refresh", "1s", "--max-segments", "2", "--signing-key", &key_file];
    let (mut journal, log) = start_journal_with(&bed, &storage, &cluster, &selector, &args);
    wait_log(&log, "every kind listed", 1, Duration::from_secs(60)).await;

    let forged = crate::bed::forge(&store, base.as_str()).await;
    let key = restatus::format::SigningKey::load(&key_path).unwrap();
    let planted: Vec<_> = (0..base_records.len()).map(|i| base_records.record(i).unwrap()).collect();
    let ahead = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    let future = restatus::fixtures::snapshot(&planted)
        .at(ahead)
        .profile(&base_manifest.profile)
        .signed_with(&key)
        .write(&store)
        .await
        .snapshot_id;
    // Each base refresh (every second) passes both over, naming them.
    wait_log(&log, &format!("snapshot={forged}"), 1, Duration::from_secs(30)).await;
    wait_log(&log, &format!("snapshot={future}"), 1, Duration::from_secs(30)).await;
    let text = log_of(&log);
    assert!(text.contains("not signed, and only signed snapshots are trusted"), "{text}");
    assert!(text.contains("ahead of this clock by more than the clock-skew tolerance"), "{text}");

    let (one, two) = (spec.server_name(0), spec.server_name(1));
    patch_status(&source, "Server", None, &one, json!({"indicatorLED": "Blinking"})).await;
    let blinking = |s: &[(String, Value)]| status_of(s, &one)["indicatorLED"] == "Blinking";
    wait_point(&store, &base, &base_records, Duration::from_secs(30), blinking).await;
    patch_status(&source, "Server", None, &two, json!({"indicatorLED": "Lit"})).await;
    wait_log(&log, "journal chain folded into a new base snapshot", 1, Duration::from_secs(30)).await;
    wait_log(&log, "a newer base snapshot", 1, Duration::from_secs(30)).await;
    stop(&mut journal, &log).await;

    let folded = other_snapshots(&store, &[&base, &forged, &future]).await;
    assert_eq!(folded.len(), 1, "one fold, nothing else: {folded:?}");
    let (manifest, folded_records) = records(&store, folded[0].as_str()).await;
    assert_eq!(manifest.signed_by.as_ref().map(|k| k.as_str()), Some(key_id.as_str()));
    assert!(manifest.created_at < ahead - jiff::SignedDuration::from_mins(30), "{}", manifest.created_at);
    let states: Vec<String> = folded_records.iter().map(|r| r.status.get().to_string()).collect();
    assert!(!states.iter().any(|s| s.contains("Forged")), "a forged status in the fold: {states:?}");
    let find = |name: &str| folded_records.iter().find(|r| r.name == name).map(|r| r.status.get().to_string());
    assert!(find(&one).is_some_and(|s| s.contains("Blinking")) && find(&two).is_some_and(|s| s.contains("Lit")));
    assert!(store.list_segments(&forged).await.unwrap().is_empty(), "nothing chained to the forged snapshot");
    assert!(store.list_segments(&future).await.unwrap().is_empty(), "nothing chained to the future one");
    let moved = log_of(&log);
    assert!(moved.contains(&format!("new={}", folded[0])), "it moved to its fold: {moved}");
}

/// A ServiceAccount `name` in namespace restatus, bound to a ClusterRole that may get, list and
/// watch the metal-operator kinds of `resources` only; a kubeconfig with its token. Applied
/// again with other resources, the role changes.
fn account_watching(bed: &Bed, name: &str, resources: &[&str]) -> PathBuf {
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: restatus}}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {name}, namespace: restatus}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: {name}}}\n\
         rules: [{{apiGroups: [metal.ironcore.dev], resources: [{}], verbs: [get, list, watch]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {name}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {name}}}\n\
         subjects: [{{kind: ServiceAccount, name: {name}, namespace: restatus}}]\n",
        resources.join(", ")
    );
    let file = bed.scratch.path().join(format!("{name}.yaml"));
    std::fs::write(&file, yaml).unwrap();
    assert_success(&bed.kubectl(&bed.source_kubeconfig, &["apply", "-f", file.to_str().unwrap()]), "apply account");
    let token = bed.kubectl(&bed.source_kubeconfig, &["-n", "restatus", "create", "token", name]);
    assert_success(&token, "create token");
    bed.kubeconfig_with_token(&bed.source_kubeconfig, name, stdout(&token).trim())
}

/// Issue 38 item 11 (F134): one kind's watch sees nothing (its watch forbidden: the BMCs, as a
/// journal whose role lost a kind). A Server's change is journaled, but its segment claims no
/// time after the base's capture, the last time anything was known of the BMCs (before: `to`
/// was the wall clock at the cut, so a restore took any live BMC status written before it for
/// older than the base's record). Once the BMCs may be watched again the journal lists them
/// (its log says so) and the next segment's `to` is the time of its cut again.
#[tokio::test]
async fn a_kind_whose_watch_sees_nothing_holds_the_segments_time_back() {
    let bed = Bed::get();
    let Fleet { spec, source, storage, cluster, selector } = Fleet::on_source(&bed, "jrn-to", 2, 2, 1).await;
    let base = backup(&bed, &storage, &cluster, &selector, &[]);
    let store = bed.store(&storage, &cluster);
    let (base_manifest, base_records) = records_of(&store, &base).await;
    let name = unique("journal-no-bmcs");
    let others = ["servers", "serverclaims", "endpoints", "servermaintenances", "serverbootconfigurations"];
    let kubeconfig = account_watching(&bed, &name, &others);
    let (mut journal, log) =
        start_journal_as(&bed, &kubeconfig, &storage, &cluster, &selector, &["--journal-interval", "1s"]);
    wait_log(&log, "every kind listed", 1, Duration::from_secs(60)).await;
    assert!(log_of(&log).contains("kind cannot be watched"), "{}", log_of(&log));

    let server = spec.server_name(0);
    patch_status(&source, "Server", None, &server, json!({"indicatorLED": "Blinking"})).await;
    let blinking = |s: &[(String, Value)]| status_of(s, &server)["indicatorLED"] == "Blinking";
    let chain = wait_point(&store, &base, &base_records, Duration::from_secs(30), blinking).await;
    for link in &chain.links {
        let header = &link.header;
        assert_eq!(
            (header.from, header.to),
            (base_manifest.created_at, base_manifest.created_at),
            "segment {} claims a time the BMCs' watch never saw",
            header.sequence
        );
    }

    // The BMCs may be watched again: listed (within the watch's backoff, at most 30 s), then
    // the segments' time is the cut's again.
    let mut all = others.to_vec();
    all.push("bmcs");
    account_watching(&bed, &name, &all);
    wait_log(&log, "kind watched again", 1, Duration::from_secs(60)).await;
    let watched = jiff::Timestamp::now();
    patch_status(&source, "Server", None, &server, json!({"indicatorLED": "Off"})).await;
    let off = |s: &[(String, Value)]| status_of(s, &server)["indicatorLED"] == "Off";
    let chain = wait_point(&store, &base, &base_records, Duration::from_secs(30), off).await;
    stop(&mut journal, &log).await;
    let last = &chain.links.last().unwrap().header;
    assert!(last.to >= watched, "{} is before the BMCs were watched again ({watched})", last.to);
    assert_success(&bed.kubectl(&bed.source_kubeconfig, &["delete", "clusterrolebinding", &name]), "clean up");
    assert_success(&bed.kubectl(&bed.source_kubeconfig, &["delete", "clusterrole", &name]), "clean up");
}

/// The store of `storage`/`cluster` that decrypts with the age key in `agekey`.
fn decrypting_store(bed: &Bed, storage: &str, cluster: &str, agekey: &str) -> SnapshotStore {
    let keys = restatus::format::DecryptionKeys::load(&[PathBuf::from(agekey)]).unwrap().map(std::sync::Arc::new);
    bed.store(storage, cluster).with_decryption_keys(keys)
}

/// Whether the stored bytes of `path` hold `name` in clear.
async fn readable_in_bucket(store: &SnapshotStore, path: &object_store::path::Path, name: &str) -> bool {
    let stored = object_store::ObjectStoreExt::get(store.object_store().as_ref(), path).await.unwrap();
    let stored = stored.bytes().await.unwrap();
    stored.windows(name.len()).any(|w| w == name.as_bytes())
}

/// Issue 38 item 2 (F132): the backups are encrypted; the journal reads its base with
/// `--decryption-key` and is given no `--encrypt-to` (before: every changed status went to the
/// bucket in clear, and its fold wrote the whole decrypted fleet as a plain snapshot). Its
/// segments and its fold (`--max-segments 2`) are encrypted to the base's recipient: no object
/// name readable in the bucket.
#[tokio::test]
async fn a_journal_without_recipients_encrypts_to_its_encrypted_base() {
    let bed = Bed::get();
    let Fleet { spec, source, storage, cluster, selector } = Fleet::on_source(&bed, "jrn-inherit", 2, 2, 1).await;
    let (agekey, _, recipient) = generate_age_keys(&bed, &unique("journal-inherit"));
    let agekey = agekey.display().to_string();
    let base = backup(&bed, &storage, &cluster, &selector, &["--encrypt-to", &recipient]);
    let args = ["--journal-interval", "1s", "--max-segments", "2", "--decryption-key", &agekey];
    let (mut journal, log) = start_journal_with(&bed, &storage, &cluster, &selector, &args);
    wait_log(&log, "every kind listed", 1, Duration::from_secs(60)).await;
    let store = decrypting_store(&bed, &storage, &cluster, &agekey);
    let (_, base_records) = records_of(&store, &base).await;
    let (one, two) = (spec.server_name(0), spec.server_name(1));
    patch_status(&source, "Server", None, &one, json!({"indicatorLED": "Blinking"})).await;
    let blinking = |s: &[(String, Value)]| status_of(s, &one)["indicatorLED"] == "Blinking";
    let chain = wait_point(&store, &base, &base_records, Duration::from_secs(30), blinking).await;
    patch_status(&source, "Server", None, &two, json!({"indicatorLED": "Lit"})).await;
    wait_log(&log, "journal chain folded into a new base snapshot", 1, Duration::from_secs(30)).await;
    stop(&mut journal, &log).await;

    let header = &chain.links[0].header;
    let to = header.encryption.as_ref().map(|e| e.recipients.clone());
    assert_eq!(to, Some(vec![recipient.clone()]), "segment 1 encrypted to the base's recipient");
    let path = store.segment_object_path(&base, 1, SEGMENT_PAYLOAD_SUFFIX);
    assert!(!readable_in_bucket(&store, &path, &one).await, "an object name readable in segment 1");
    let folded = other_snapshots(&store, &[&base]).await;
    assert_eq!(folded.len(), 1, "{folded:?}");
    let manifest = store.manifest(&folded[0]).await.unwrap();
    let to = manifest.encryption.as_ref().map(|e| e.recipients.clone());
    assert_eq!(to, Some(vec![recipient.clone()]), "the fold encrypted to the base's recipient");
    assert!(!readable_in_bucket(&store, &store.payload_path(&folded[0]), &one).await, "the fold in clear");
    let (_, records) = records(&store, folded[0].as_str()).await;
    assert!(records.iter().any(|r| r.name == two && r.status.get().contains("Lit")), "the fold holds the chain");
}

/// Issue 38 item 2 (F133): the backups switch to encryption while the journal runs, and the
/// journal, on the source, holds no private age key and was not reconfigured (before: it
/// passed the encrypted snapshot over and stayed on the last plain base, writing in clear,
/// forever, with no alert). It captures a base of its own, encrypted to the new snapshot's
/// recipient (read from its manifest), says so, and chains its segments, encrypted, to it; a
/// restore with the key goes to that base's newest point. At `--max-segments 2` it cannot fold
/// what it cannot read: it captures again.
#[tokio::test]
async fn backups_switched_to_encryption_move_the_journal_to_an_encrypted_base_of_its_own() {
    let bed = Bed::get();
    let Fleet { spec, source, storage, cluster, selector } = Fleet::on_source(&bed, "jrn-own", 2, 2, 1).await;
    let (agekey, _, recipient) = generate_age_keys(&bed, &unique("journal-own"));
    let agekey = agekey.display().to_string();
    let plain = backup(&bed, &storage, &cluster, &selector, &[]);
    let args = ["--journal-interval", "1s", "--base-refresh", "1s", "--max-segments", "2"];
    let (mut journal, log) = start_journal_with(&bed, &storage, &cluster, &selector, &args);
    wait_log(&log, "every kind listed", 1, Duration::from_secs(60)).await;

    let encrypted = backup(&bed, &storage, &cluster, &selector, &["--encrypt-to", &recipient]);
    wait_log(&log, "journal chained to a base of its own capture", 1, Duration::from_secs(60)).await;
    assert!(log_of(&log).contains("the newest snapshot is encrypted and this journal holds no key"));
    let store = decrypting_store(&bed, &storage, &cluster, &agekey);
    let own = other_snapshots(&store, &[&plain, &encrypted]).await;
    assert_eq!(own.len(), 1, "{own:?}");
    let own = own[0].clone();
    let (manifest, own_records) = records_of(&store, &own).await;
    assert_eq!(manifest.encryption.as_ref().map(|e| e.recipients.clone()), Some(vec![recipient.clone()]));
    assert_eq!(own_records.len(), spec.total(), "the whole fleet");
    let server = spec.server_name(0);
    assert!(!readable_in_bucket(&store, &store.payload_path(&own), &server).await, "its base in clear");

    patch_status(&source, "Server", None, &server, json!({"indicatorLED": "Blinking"})).await;
    let blinking = |s: &[(String, Value)]| status_of(s, &server)["indicatorLED"] == "Blinking";
    let chain = wait_point(&store, &own, &own_records, Duration::from_secs(30), blinking).await;
    assert!(chain.links.iter().all(|l| l.header.encryption.is_some()), "every segment encrypted");
    assert!(store.list_segments(&plain).await.unwrap().is_empty(), "nothing written in clear on the plain base");
    let out = bed.restatus(
        &storage,
        &cluster,
        &[
            "restore",
            "--dry-run",
            "--allow-same-cluster",
            "--selector",
            &selector,
            "--decryption-key",
            &agekey,
            "-o",
            "json",
        ],
    );
    assert_success(&out, "restore --dry-run");
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["restoredTo"]["base"], own.as_str(), "{}", report["restoredTo"]);

    // Two segments: a new capture instead of a fold it cannot read.
    patch_status(&source, "Server", None, &server, json!({"indicatorLED": "Off"})).await;
    wait_log(&log, "journal chained to a base of its own capture", 2, Duration::from_secs(30)).await;
    stop(&mut journal, &log).await;
    assert!(!log_of(&log).contains("cannot fold"), "{}", log_of(&log));
}
