//! Backup benchmark on the real test bed (run by `scripts/bench`, which creates the fleets):
//! backup wall time against a bare paginated LIST of the same objects, peak RSS of the
//! `restatus backup` process at two fleet sizes, and snapshot bytes against raw status bytes.
//! Ratios are measured side by side in one run, alternating, so machine noise hits both.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use restatus::backup::{self, BackupOptions};
use restatus::domain::identity::{KindProfile, Profile};
use restatus::k8s::list::{ListPage, fetch_page};
use restatus::k8s::{PageRequest, list_objects};
use restatus::store::SnapshotStore;

const PAGE: u32 = 500;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} unset: run scripts/bench"))
}

/// Bare LIST: every page of every kind, bodies read and dropped. Returns (objects, body bytes).
async fn bare_list(client: &kube::Client, profile: &Profile) -> (usize, usize) {
    let (mut objects, mut bytes) = (0, 0);
    for kind in &profile.kinds {
        let mut token: Option<String> = None;
        while let Some(body) =
            fetch_page(client, kind, &PageRequest { size: PAGE, ..Default::default() }, token.as_deref()).await.unwrap()
        {
            bytes += body.len();
            let page = ListPage::parse(kind, &body).unwrap();
            objects += page.items.len();
            match page.next() {
                Some(t) => token = Some(t.to_string()),
                None => break,
            }
        }
    }
    (objects, bytes)
}

/// Raw status bytes of every object (untimed).
async fn status_bytes(client: &kube::Client, kinds: &[KindProfile]) -> usize {
    let mut total = 0;
    for kind in kinds {
        let page = PageRequest { size: PAGE, ..Default::default() };
        list_objects(client, kind, &page, |object| {
            total += object.status().map_or(0, |s| s.get().len());
            Ok(())
        })
        .await
        .unwrap();
    }
    total
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Peak RSS (KiB) of one `restatus backup` process.
fn backup_rss(kubeconfig: &str, profile: &Path, selector: &str, storage: &str) -> u64 {
    let out = Command::new("/usr/bin/time")
        .args(["-f", "%M", env!("CARGO_BIN_EXE_restatus"), "backup", "--kubeconfig", kubeconfig, "--profile"])
        .arg(profile)
        .args(["--selector", selector])
        .env("RESTATUS_STORAGE", storage)
        .env("RESTATUS_CLUSTER_ID", "bench-rss")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run /usr/bin/time restatus backup");
    assert!(out.status.success(), "backup failed: {}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    stderr.lines().last().and_then(|l| l.trim().parse().ok()).expect("peak RSS from /usr/bin/time")
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    let source = env("KUBECONFIG_SOURCE");
    let bucket = env("RESTATUS_BUCKET");
    let client = restatus::k8s::client(Some(Path::new(&source)), None).await.unwrap();
    let profile = Profile::metal_operator();
    let storage = format!("s3://{bucket}/bench");
    let store = SnapshotStore::open(&storage, "bench").unwrap();
    let options = BackupOptions::new(profile.clone());

    // Warm up both paths once (connections, apiserver watch caches).
    let (objects, list_bytes) = bare_list(&client, &profile).await;
    let warm = backup::run(&client, &store, &options).await.unwrap();

    let (mut lists, mut backups) = (Vec::new(), Vec::new());
    let mut manifest = warm;
    for _ in 0..rounds {
        let t = Instant::now();
        bare_list(&client, &profile).await;
        lists.push(t.elapsed());
        let t = Instant::now();
        manifest = backup::run(&client, &store, &options).await.unwrap();
        backups.push(t.elapsed());
    }
    let (list, backup) = (median(lists), median(backups));
    let raw_status = status_bytes(&client, &profile.kinds).await;

    // Peak RSS of `restatus backup` on Servers only, 1k ("small" fleet) against 10k ("bench").
    let dir = tempfile::tempdir().unwrap();
    let servers_only = dir.path().join("servers.yaml");
    std::fs::write(
        &servers_only,
        "name: servers\nkinds:\n- {group: metal.ironcore.dev, version: v1alpha1, kind: Server, plural: servers, keys: [{path: spec.systemUUID, lowercase: true}]}\n",
    )
    .unwrap();
    let full = dir.path().join("full.yaml");
    std::fs::write(&full, serde_json::to_string(&profile).unwrap()).unwrap();
    let rss_1k = backup_rss(&source, &servers_only, "restatus.ironcore.dev/sample-fleet=small", &storage);
    let rss_10k = backup_rss(&source, &servers_only, "restatus.ironcore.dev/sample-fleet=bench", &storage);
    let rss_all = backup_rss(&source, &full, "", &storage);

    println!("restatus backup benchmark ({rounds} alternating rounds, medians, page size {PAGE})");
    println!("objects listed                          {objects}");
    println!("LIST body bytes                         {list_bytes}");
    println!("bare paginated LIST                     {:.3} s", list.as_secs_f64());
    println!("backup (LIST + encode + upload to S3)   {:.3} s", backup.as_secs_f64());
    println!("backup / bare LIST                      {:.3}", backup.as_secs_f64() / list.as_secs_f64());
    println!("raw status JSON bytes                   {raw_status}");
    println!("payload records                         {}", manifest.payload.records);
    println!("payload uncompressed bytes              {}", manifest.payload.uncompressed_size);
    println!("snapshot bytes (payload + manifest)     {}", manifest.payload.size + manifest.to_json().len() as u64);
    println!(
        "snapshot bytes / raw status bytes       {:.4}",
        (manifest.payload.size + manifest.to_json().len() as u64) as f64 / raw_status as f64
    );
    println!("peak RSS, 1k Servers                    {rss_1k} KiB");
    println!("peak RSS, 10k Servers                   {rss_10k} KiB");
    println!("peak RSS, all {objects} objects           {rss_all} KiB");
    println!("peak RSS 10k / 1k                       {:.2}", rss_10k as f64 / rss_1k as f64);
}
