//! The continuous journal (issue 23), run by `scripts/bench` with `BENCH_ONLY=journal`: what a
//! disaster may lose (RPO), what the journal costs, and its memory.
//!
//! A fleet of `BENCH_JOURNAL_OBJECTS` Servers (default 10000, a tenth of them claimed) with
//! realistic status is written into the source's etcd and backed up (the base). `restatus
//! journal` (default `--journal-interval 5s`) then runs against it:
//! - idle for `BENCH_JOURNAL_IDLE` seconds (default 60): the segments it writes (none expected);
//! - under load for `BENCH_JOURNAL_MINUTES` minutes (default 3) of `BENCH_JOURNAL_RATE` status
//!   changes a minute (default 1000), each a status patch of one Server (a new serial number),
//!   spread evenly, Servers picked at random.
//!
//! RPO of a change: from the moment its patch returned until the bucket lists the header of the
//! first segment that covers it (the header's resourceVersion for Servers at or past the
//! patch's). The bucket is listed every `POLL` (so a figure may be up to `POLL` late); the
//! issue asks p99 ≤ 10 s. Cost: the segments' PUT requests and bytes, per hour and per change.
//! Memory: the journal's RSS, sampled every second, at each third of the load (flat: it does not
//! grow with the number of changes) and its peak.

// Only a part of it: no controller metrics here.
#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use restatus::domain::identity::Profile;
use restatus::fleet::etcd::{EtcdTarget, load_servers, wait_listed};
use restatus::fleet::{self, FLEET_LABEL, FleetSpec};
use restatus::format::SnapshotId;
use restatus::store::SnapshotStore;
use serde_json::json;
use support::{env, rss_kib};

const POLL: Duration = Duration::from_millis(200);

fn var<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name}: not a number")))
}

/// The first time each segment's header was listed, by sequence number, from now until `until`
/// says stop; and the journal's RSS every second.
struct Watcher {
    seen: BTreeMap<u64, Instant>,
    rss: Vec<(Duration, u64)>,
}

impl Watcher {
    async fn poll(&mut self, store: &SnapshotStore, base: &SnapshotId, pid: u32, started: Instant) {
        for entry in store.list_segments(base).await.expect("list the journal") {
            if entry.header {
                self.seen.entry(entry.sequence).or_insert_with(Instant::now);
            }
        }
        let at = started.elapsed();
        if self.rss.last().is_none_or(|(t, _)| at - *t >= Duration::from_secs(1)) {
            self.rss.push((at, rss_kib(pid)));
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[tokio::main]
async fn main() {
    let n: usize = var("BENCH_JOURNAL_OBJECTS", 10_000);
    let idle = Duration::from_secs(var("BENCH_JOURNAL_IDLE", 60));
    let minutes: u64 = var("BENCH_JOURNAL_MINUTES", 3);
    let rate: u64 = var("BENCH_JOURNAL_RATE", 1000);
    let interval = std::env::var("BENCH_JOURNAL_INTERVAL").unwrap_or_else(|_| "5s".into());
    let source_config = env("KUBECONFIG_SOURCE");
    let source = restatus::k8s::client(Some(Path::new(&source_config)), None).await.unwrap();
    let stamp = jiff::Timestamp::now().as_second() % 100_000;
    let name = format!("jrn{n}-{stamp}");
    let storage = format!("s3://{}/journal", env("RESTATUS_BUCKET"));
    let store = SnapshotStore::open(&storage, &name).expect("open the bucket");

    // The fleet, and its base snapshot.
    let spec = FleetSpec::new(&name, n, 0, n / 10);
    let etcd = EtcdTarget {
        url: env("RESTATUS_ETCD_SOURCE"),
        prefix: "/registry".into(),
        managed_fields: true,
        one_per_revision: false,
    };
    load_servers(&etcd, &spec, 8).await.expect("load Servers into etcd");
    fleet::create_kinds(&source, &spec, 48, false).await.expect("create the claims");
    wait_listed(&source, &spec, Duration::from_secs(3600)).await.expect("the API server lists the Servers");
    let selector = format!("{FLEET_LABEL}={name}");
    let out = Command::new(env!("CARGO_BIN_EXE_restatus"))
        .args(["backup", "--kubeconfig", &source_config, "--selector", &selector])
        .env("RESTATUS_STORAGE", &storage)
        .env("RESTATUS_CLUSTER_ID", &name)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run restatus backup");
    assert!(out.status.success(), "backup failed: {}", String::from_utf8_lossy(&out.stderr));
    let base: SnapshotId = String::from_utf8_lossy(&out.stdout).trim().parse().expect("the base's id");

    // The journal, once its watches have listed the fleet (its log says so).
    let log = std::env::temp_dir().join(format!("{name}-journal.log"));
    let child = Command::new(env!("CARGO_BIN_EXE_restatus"))
        .args(["journal", "--kubeconfig", &source_config, "--selector", &selector, "--journal-interval", &interval])
        .env("RESTATUS_STORAGE", &storage)
        .env("RESTATUS_CLUSTER_ID", &name)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("the journal's log"))
        .spawn()
        .expect("start restatus journal");
    let journal = support::Controller { child, port: 0 };
    let pid = journal.child.id();
    let start = Instant::now();
    let listed = |text: &str| text.contains("every kind listed and diffed against the chain");
    while !listed(&std::fs::read_to_string(&log).unwrap_or_default()) {
        assert!(start.elapsed() < Duration::from_secs(300), "the journal did not start within 300 s");
        tokio::time::sleep(POLL).await;
    }
    let started = Instant::now();
    let mut watcher = Watcher { seen: BTreeMap::new(), rss: vec![] };

    // Idle.
    while started.elapsed() < idle {
        watcher.poll(&store, &base, pid, started).await;
        tokio::time::sleep(POLL).await;
    }
    let idle_segments = watcher.seen.len();
    let idle_rss = rss_kib(pid);

    // Under load: one patch every 60/rate s, each's resourceVersion and when it returned.
    let servers = restatus::k8s::api_for(&source, Profile::metal_operator().kind("Server").expect("Server"), None);
    let total = (rate * minutes) as usize;
    let every = Duration::from_secs_f64(60.0 / rate as f64);
    let load_started = Instant::now();
    // Each patch on its own task at its time, so that a slow answer does not slow the rate.
    let changes = tokio::spawn(async move {
        let mut patches = tokio::task::JoinSet::new();
        let mut pick: u64 = 0x9e37_79b9_7f4a_7c15;
        for k in 0..total {
            tokio::time::sleep_until((load_started + every * k as u32).into()).await;
            pick ^= pick << 13;
            pick ^= pick >> 7;
            pick ^= pick << 17;
            let server = spec.server_name((pick % n as u64) as usize);
            let servers = servers.clone();
            patches.spawn(async move {
                let patch = json!({"status": {"serialNumber": format!("J{k:08}")}});
                let o = servers
                    .patch_status(&server, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap_or_else(|e| panic!("patch the status of {server}: {e}"));
                let rv = o.metadata.resource_version.as_deref().and_then(|v| v.parse::<u64>().ok());
                (rv.expect("a resourceVersion"), Instant::now())
            });
        }
        patches.join_all().await
    });
    let mut thirds = Vec::new();
    while !changes.is_finished() {
        watcher.poll(&store, &base, pid, started).await;
        let third = load_started.elapsed().as_secs_f64() / (minutes as f64 * 20.0);
        if third as usize > thirds.len() {
            thirds.push(rss_kib(pid));
        }
        tokio::time::sleep(POLL).await;
    }
    let load = load_started.elapsed();
    thirds.push(rss_kib(pid));
    let changes = changes.await.expect("the load");
    let last_rv = changes.iter().map(|(rv, _)| *rv).max().unwrap_or(0);

    // Until a segment covers the last change (at most a minute), then the chain as written.
    let covered = |headers: &[(u64, u64)]| headers.iter().any(|(_, rv)| *rv >= last_rv);
    let wait = Instant::now();
    let (chain, headers) = loop {
        watcher.poll(&store, &base, pid, started).await;
        let chain = store.read_chain(&base, base.timestamp().expect("a timestamp"), None).await.expect("the chain");
        let headers: Vec<(u64, u64)> = chain
            .links
            .iter()
            .map(|l| {
                let rv = l.header.resource_versions.get("Server.metal.ironcore.dev").and_then(|v| v.parse().ok());
                (l.header.sequence, rv.unwrap_or(0))
            })
            .collect();
        for (sequence, _) in &headers {
            watcher.seen.entry(*sequence).or_insert_with(Instant::now);
        }
        if covered(&headers) {
            break (chain, headers);
        }
        assert!(wait.elapsed() < Duration::from_secs(60), "no segment covers the last change a minute after it");
        tokio::time::sleep(POLL).await;
    };
    let peak = watcher.rss.iter().map(|(_, r)| *r).max().unwrap_or(0);
    drop(journal);

    let mut rpo: Vec<Duration> = changes
        .iter()
        .map(|(rv, at)| {
            let (sequence, _) = headers.iter().find(|(_, covers)| covers >= rv).expect("a segment covers the change");
            watcher.seen.get(sequence).map_or(Duration::MAX, |seen| seen.saturating_duration_since(*at))
        })
        .collect();
    rpo.sort();
    let entries = store.list_segments(&base).await.expect("list the journal");
    let segments = chain.links.len();
    let bytes: u64 = entries.iter().filter_map(|e| e.payload_size).sum();
    let during = segments - idle_segments;
    let puts_per_segment = 2; // records, header (a signature is a third when signing)
    let per_hour = during as f64 * puts_per_segment as f64 * 3600.0 / load.as_secs_f64();

    println!("journal bench: {n} Servers + {} claims, --journal-interval {interval}", n / 10);
    println!("idle {:.0} s: {idle_segments} segments written, RSS {idle_rss} KiB", idle.as_secs_f64());
    println!(
        "load: {} changes in {:.1} s ({:.0} a minute); {during} segments, {bytes} payload bytes",
        changes.len(),
        load.as_secs_f64(),
        changes.len() as f64 * 60.0 / load.as_secs_f64()
    );
    println!(
        "RPO (change → its segment listed in the bucket, listed every {} ms): p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        POLL.as_millis(),
        percentile(&rpo, 0.5).as_secs_f64(),
        percentile(&rpo, 0.99).as_secs_f64(),
        rpo.last().map_or(0.0, |d| d.as_secs_f64())
    );
    println!(
        "cost: {per_hour:.0} segment PUTs an hour ({puts_per_segment} per segment, unsigned), {:.0} bytes per change, {:.1} MB an hour",
        bytes as f64 / changes.len() as f64,
        bytes as f64 * 3600.0 / load.as_secs_f64() / 1e6
    );
    println!(
        "RSS: idle {idle_rss} KiB; at each third of the load {:?} KiB; peak {peak} KiB",
        thirds.iter().take(3).collect::<Vec<_>>()
    );
    println!();
    println!(
        "| objects | changes/min | segments | RPO p50 | RPO p99 | RPO max | PUTs/h | bytes/change | idle segments | RSS idle → peak |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {n} + {} claims | {:.0} | {during} | {:.2} s | {:.2} s | {:.2} s | {per_hour:.0} | {:.0} | {idle_segments} in {:.0} s | {:.1} → {:.1} MiB |",
        n / 10,
        changes.len() as f64 * 60.0 / load.as_secs_f64(),
        percentile(&rpo, 0.5).as_secs_f64(),
        percentile(&rpo, 0.99).as_secs_f64(),
        rpo.last().map_or(0.0, |d| d.as_secs_f64()),
        bytes as f64 / changes.len() as f64,
        idle.as_secs_f64(),
        idle_rss as f64 / 1024.0,
        peak as f64 / 1024.0
    );
}
