//! The adaptive write limit (issue 22, item 4), on one bench bed (run by `scripts/bench` with
//! `BENCH_ONLY=adaptive`, which creates the fleets): a fleet of `BENCH_ADAPTIVE_OBJECTS`
//! Servers and ServerClaims (two to one) moved to the target without status, six times over.
//! On each set, one of:
//! - a bare write loop at a fixed concurrency of 4, 16 and 64: the writes `restatus restore`
//!   makes per object (quiesce patch, replace of the status subresource, release as a replace of
//!   the object as that write answered it), made the same way, with no planning and no Events;
//! - `xargs -P16 kubectl patch --subresource=status --type=merge` (one process per object, the
//!   status alone: one write per object, fewer than the others make);
//! - `restatus restore` as users run it (its own process, the defaults: the limit starts at 16
//!   and grows to at most 64).
//!
//! Order: bare 64, bare 16, restore, bare 4, bare 64 again, kubectl (on a sample of
//! `BENCH_ADAPTIVE_KUBECTL` objects, default 1000, scaled): the API server's speed drifts, and
//! the restore sits in the middle of the bare loops; the best concurrency's time is its mean.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use jiff::Timestamp;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use restatus::backup::{self, BackupOptions};
use restatus::domain::annotations::{
    OPERATION_ANNOTATION, OPERATION_IGNORE, QUIESCED_BY_ANNOTATION, RESTORED_FROM_ANNOTATION,
};
use restatus::domain::identity::Profile;
use restatus::fleet::FLEET_LABEL;
use restatus::format::Record;
use restatus::store::SnapshotStore;
use serde_json::json;

/// The fleet on the source; the target's sets are it renamed (`adapt4-server-00000`, …).
const FLEET: &str = "adapt";

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} unset: run BENCH_ONLY=adaptive scripts/bench"))
}

fn servers_and_claims() -> Profile {
    let all = Profile::metal_operator();
    Profile {
        name: "servers-and-claims".into(),
        kinds: all.kinds.into_iter().filter(|k| k.kind == "Server" || k.kind == "ServerClaim").collect(),
    }
}

fn renamed(record: &Record, set: &str) -> String {
    record.name.replacen(&format!("{FLEET}-"), &format!("{set}-"), 1)
}

/// The writes restatus makes per object, the way it makes them, `concurrency` objects at a
/// time: a LIST of the set, then per object quiesce, status, release. Returns the writes made.
async fn bare_loop(
    client: &kube::Client,
    profile: &Profile,
    records: &[Record],
    set: &str,
    concurrency: usize,
) -> usize {
    let mut writes = 0;
    for kind in &profile.kinds {
        let listed: HashMap<String, String> = restatus::k8s::api_for(client, kind, None)
            .list_metadata(&ListParams::default().labels(&format!("{FLEET_LABEL}={set}")))
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|o| (o.metadata.name.unwrap_or_default(), o.metadata.resource_version.unwrap_or_default()))
            .collect();
        let listed = &listed;
        let of_kind: Vec<&Record> = records.iter().filter(|r| r.kind == kind.kind).collect();
        let done: Vec<usize> = stream::iter(of_kind)
            .map(|record| async move {
                let name = renamed(record, set);
                let api = restatus::k8s::api_for(client, kind, record.namespace.as_deref());
                let params = PatchParams { field_manager: Some("bare".into()), ..Default::default() };
                let post = PostParams { field_manager: Some("bare".into()), ..Default::default() };
                let version = listed.get(&name).unwrap_or_else(|| panic!("{name} not on the target")).clone();
                let quiesce = json!({"metadata": {"resourceVersion": version, "annotations": {OPERATION_ANNOTATION: OPERATION_IGNORE, QUIESCED_BY_ANNOTATION: "bare"}}});
                let answer = api.patch(&name, &params, &Patch::Merge(&quiesce)).await.unwrap();
                let version = answer.metadata.resource_version.unwrap_or_default();
                let mut object: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": kind.api_version(), "kind": kind.kind,
                    "metadata": {"name": name, "namespace": record.namespace, "resourceVersion": version},
                }))
                .unwrap();
                object.data = json!({"status": serde_json::from_str::<serde_json::Value>(record.status.get()).unwrap()});
                let mut object = api.replace_status(&name, &post, &object).await.unwrap();
                object.metadata.managed_fields = None;
                let annotations = object.metadata.annotations.get_or_insert_default();
                annotations.remove(OPERATION_ANNOTATION);
                annotations.remove(QUIESCED_BY_ANNOTATION);
                annotations.insert(RESTORED_FROM_ANNOTATION.into(), "bare".into());
                if let Some(data) = object.data.as_object_mut() {
                    data.remove("status");
                }
                api.replace(&name, &post, &object).await.unwrap();
                3
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        writes += done.iter().sum::<usize>();
    }
    writes
}

/// `xargs -P16 kubectl patch --subresource=status` of every object of the set `set`: one
/// process per object, its status from a file written beforehand (not timed).
fn kubectl_xargs(kubeconfig: &str, profile: &Profile, records: &[Record], set: &str) -> Duration {
    let kubectl = Path::new(&env("RESTATUS_BIN")).join("kubectl");
    let dir = tempfile::tempdir().unwrap();
    let mut lines = String::new();
    for (i, record) in records.iter().enumerate() {
        let kind = profile.kinds.iter().find(|k| k.kind == record.kind).unwrap();
        let file = dir.path().join(format!("{i}.json"));
        let patch = json!({ "status": serde_json::from_str::<serde_json::Value>(record.status.get()).unwrap() });
        std::fs::write(&file, patch.to_string()).unwrap();
        let resource = format!("{}.{}", kind.plural, kind.group);
        let namespace = record.namespace.as_deref().unwrap_or("default");
        lines += &format!("{resource} {} -n {namespace} --patch-file {}\n", renamed(record, set), file.display());
    }
    let started = Instant::now();
    let mut xargs = Command::new("xargs")
        .args(["-P", "16", "-L", "1"])
        .arg(&kubectl)
        .args(["--kubeconfig", kubeconfig, "patch", "--subresource=status", "--type=merge"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("xargs");
    xargs.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
    let status = xargs.wait().unwrap();
    let time = started.elapsed();
    assert!(status.success(), "xargs kubectl patch failed");
    time
}

/// `restatus restore` as users run it, on the set `FLEET` of the target: wall time, writes,
/// the report's `writeLimit`.
fn restatus_restore(
    kubeconfig: &str,
    storage: &str,
    cluster: &str,
    snapshot: &str,
) -> (Duration, usize, serde_json::Value) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_restatus"))
        .args(["restore", "--kubeconfig", kubeconfig, "--selector", &format!("{FLEET_LABEL}={FLEET}")])
        .args(["--snapshot", snapshot, "--profile", "metal-operator", "-o", "json"])
        .env("RESTATUS_STORAGE", storage)
        .env("RESTATUS_CLUSTER_ID", cluster)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run restatus restore");
    let time = started.elapsed();
    assert!(out.status.success(), "restatus restore failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("restore -o json");
    assert_eq!(report["pairing"].as_array().map(Vec::len), Some(0), "pairing violations: {}", report["pairing"]);
    let writes = report["writes"].as_u64().unwrap() as usize;
    (time, writes, report["writeLimit"].clone())
}

#[tokio::main]
async fn main() {
    let source_kc = env("KUBECONFIG_SOURCE");
    let target_kc = env("KUBECONFIG_TARGET");
    let source = restatus::k8s::client(Some(Path::new(&source_kc)), None).await.unwrap();
    let target = restatus::k8s::client(Some(Path::new(&target_kc)), None).await.unwrap();
    let profile = servers_and_claims();
    let storage = format!("s3://{}/bench-adaptive", env("RESTATUS_BUCKET"));
    let cluster = format!("bench-adapt-{}", Timestamp::now().as_second());
    let store = SnapshotStore::open(&storage, &cluster).unwrap();
    let options =
        BackupOptions { selector: Some(format!("{FLEET_LABEL}={FLEET}")), ..BackupOptions::new(profile.clone()) };
    let manifest = backup::run(&source, &store, &options).await.unwrap();
    let snapshot = manifest.snapshot_id.to_string();
    let loaded =
        restatus::store::choose_snapshot(&store, Some(&manifest.snapshot_id), &Default::default()).await.unwrap();
    let records: Vec<Record> = (0..loaded.records.len()).map(|i| loaded.records.record(i).unwrap()).collect();
    let objects = records.len();
    let unset = restatus::k8s::api_for(&target, profile.kind("Server").unwrap(), None)
        .list(&ListParams::default().labels(&format!("{FLEET_LABEL}={FLEET}")).limit(1))
        .await
        .unwrap();
    assert!(
        unset.items.iter().all(|o| o.data.get("status").is_none()),
        "target fleet already restored: run scripts/bench without BENCH_KEEP"
    );

    // Bare loops at 64 before and after the restore: the API server's speed drifts (the
    // cluster fills with statuses, and the machine is shared), and the best fixed concurrency
    // is to weigh the same drift the restore does.
    let mut bare: Vec<(usize, Duration, usize)> = Vec::new();
    let mut run_bare = async |concurrency: usize, set: &str| {
        let started = Instant::now();
        let writes = bare_loop(&target, &profile, &records, &format!("{FLEET}{set}"), concurrency).await;
        let time = started.elapsed();
        eprintln!("bare loop at {concurrency} on {FLEET}{set}: {:.1} s", time.as_secs_f64());
        bare.push((concurrency, time, writes));
    };
    run_bare(64, "64").await;
    run_bare(16, "16").await;
    let (restore, restore_writes, limit) = restatus_restore(&target_kc, &storage, &cluster, &snapshot);
    eprintln!("restatus restore: {:.1} s, limit {limit}", restore.as_secs_f64());
    run_bare(4, "4").await;
    run_bare(64, "64b").await;
    let sample: usize =
        std::env::var("BENCH_ADAPTIVE_KUBECTL").ok().and_then(|v| v.parse().ok()).unwrap_or(1000).min(objects);
    let kubectl_sample = kubectl_xargs(&target_kc, &profile, &records[..sample], &format!("{FLEET}k"));
    let kubectl = kubectl_sample.mul_f64(objects as f64 / sample as f64);

    let secs = |d: Duration| d.as_secs_f64();
    let rate = |d: Duration| objects as f64 / secs(d);
    // Each concurrency's mean time.
    let mut means: Vec<(usize, Duration, usize, usize)> = Vec::new();
    for (concurrency, time, writes) in &bare {
        match means.iter_mut().find(|m| m.0 == *concurrency) {
            Some(m) => {
                m.1 += *time;
                m.3 += 1;
            }
            None => means.push((*concurrency, *time, *writes, 1)),
        }
    }
    let means: Vec<(usize, Duration, usize)> = means.into_iter().map(|(c, t, w, n)| (c, t / n as u32, w)).collect();
    let (best_c, best, _) = *means.iter().min_by(|a, b| a.1.cmp(&b.1)).unwrap();
    println!("adaptive write limit benchmark ({objects} objects: Servers + ServerClaims, snapshot {snapshot})");
    println!("order: bare 64, bare 16, restore, bare 4, bare 64, kubectl ({sample} objects, scaled)");
    println!("| run | wall time | objects/s | writes | time / best bare |");
    println!("|---|---|---|---|---|");
    for (concurrency, time, writes) in &bare {
        println!(
            "| bare loop, concurrency {concurrency} | {:.1} s | {:.0} | {writes} | {:.3} |",
            secs(*time),
            rate(*time),
            secs(*time) / secs(best)
        );
    }
    println!(
        "| xargs -P16 kubectl patch --subresource=status (status only; {sample} objects in {:.1} s, scaled) | {:.1} s | {:.0} | {objects} | {:.3} |",
        secs(kubectl_sample),
        secs(kubectl),
        rate(kubectl),
        secs(kubectl) / secs(best)
    );
    println!(
        "| restatus restore (adaptive: --concurrency 16 --max-concurrency 64) | {:.1} s | {:.0} | {restore_writes} | {:.3} |",
        secs(restore),
        rate(restore),
        secs(restore) / secs(best)
    );
    println!("restore write limit: {limit}");
    println!("best bare loop: concurrency {best_c} (mean {:.1} s)", secs(best));
    println!("restore / best bare loop (goal <= 1.1)                    {:.3}", secs(restore) / secs(best));
    println!("restore throughput / best bare loop's (goal >= 0.9)       {:.3}", secs(best) / secs(restore));
    println!("xargs -P16 kubectl (scaled) / restore                     {:.2}x", secs(kubectl) / secs(restore));
}
