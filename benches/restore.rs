//! Restore benchmark on the bench test bed (run by `scripts/bench`, which creates the fleets):
//! after a simulated move of 10k Servers + 5k ServerClaims (objects on the target without
//! status), `restatus restore` (the CLI, its own process) against a bare loop that issues the
//! same API writes the same way at the same concurrency on an identical set of objects, once for objects
//! that arrive bare and once for objects that arrive quiesced by the source-role handshake;
//! against a `kubectl patch --subresource=status` loop (today's manual way; timed on a sample
//! and scaled); and the controller's delay from an object's creation to its restored status.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::PostParams;
use kube::runtime::watcher;
use restatus::domain::identity::Profile;
use restatus::fleet::{FLEET_LABEL, FleetSpec};
use restatus::format::Record;
use serde_json::json;

// Only a part of it: the environment, a timed run and the bare restore.
#[allow(dead_code)]
mod support;

use support::bare::{BareLoop, assert_not_restored, backed_up, servers_and_claims};
use support::{client, env, run_store, timed_output};

const CONCURRENCY: usize = 16;

/// The bare restore of `records` (the fleet `bench`) onto the set `set`, `CONCURRENCY` objects at
/// a time, quiesced first unless they arrive quiesced.
async fn bare_loop(client: &kube::Client, profile: &Profile, records: &[Record], set: &str, quiesce: bool) -> Run {
    let started = Instant::now();
    let bare_loop = BareLoop { profile, records, fleet: "bench", set, concurrency: CONCURRENCY, quiesce };
    let writes = bare_loop.run(client).await;
    Run { time: started.elapsed(), writes, events: 0, peak_rss_kib: 0 }
}

/// One timed pass: wall time, API writes (patches and replaces), Events, peak RSS (restatus only).
struct Run {
    time: Duration,
    writes: usize,
    events: usize,
    peak_rss_kib: u64,
}

/// `restatus restore` as users run it (its own process), on the fleet `fleet` of the target.
fn restatus_restore(kubeconfig: &str, storage: &str, cluster: &str, snapshot: &str, fleet: &str) -> Run {
    let (selector, concurrency) = (format!("{FLEET_LABEL}={fleet}"), CONCURRENCY.to_string());
    let args = ["restore", "--kubeconfig", kubeconfig, "--selector", &selector, "--snapshot", snapshot];
    let args: Vec<&str> =
        args.into_iter().chain(["--concurrency", &concurrency, "--profile", "metal-operator", "-o", "json"]).collect();
    let (time, peak_rss_kib, stdout) = timed_output(&args, storage, cluster);
    let report: serde_json::Value = serde_json::from_slice(&stdout).expect("restore -o json");
    assert_eq!(report["pairing"].as_array().map(Vec::len), Some(0), "pairing violations: {}", report["pairing"]);
    assert!(report["outcomes"].as_array().unwrap().iter().all(|o| o["error"].is_null()), "restore errors");
    let restored = report["counts"]["restore"].as_u64().unwrap() as usize;
    Run { time, writes: report["writes"].as_u64().unwrap() as usize, events: restored, peak_rss_kib }
}

/// `kubectl patch --subresource=status` per object, one after the other, on the fleet
/// `fleet` (`sample` Servers without status).
fn kubectl_loop(kubeconfig: &str, records: &[Record], fleet: &str, sample: usize) -> Duration {
    let kubectl = Path::new(&env("RESTATUS_BIN")).join("kubectl");
    let started = Instant::now();
    for (i, record) in records.iter().filter(|r| r.kind == "Server").take(sample).enumerate() {
        let name = format!("{fleet}-server-{i:05}");
        let patch =
            json!({ "status": serde_json::from_str::<serde_json::Value>(record.status.get()).unwrap() }).to_string();
        let out = Command::new(&kubectl)
            .args([
                "--kubeconfig",
                kubeconfig,
                "patch",
                "servers.metal.ironcore.dev",
                &name,
                "--subresource=status",
                "--type=merge",
                "-p",
                &patch,
            ])
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "kubectl patch {name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    started.elapsed()
}

/// Controller mode: creates `n` objects without status, one every `pace`, and returns the
/// median time from each create's response to its restored status (seen by a watch).
async fn controller_latency(
    target: &kube::Client,
    kubeconfig: &str,
    storage: &str,
    cluster: &str,
    n: usize,
) -> (Duration, Duration) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_restatus"))
        .args(["controller", "--kubeconfig", kubeconfig, "--selector", &format!("{FLEET_LABEL}=ctl")])
        .args(["--lease-namespace", "default", "--http-addr", &format!("127.0.0.1:{port}")])
        .env("RESTATUS_STORAGE", storage)
        .env("RESTATUS_CLUSTER_ID", cluster)
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let ready = Instant::now();
    loop {
        let out = Command::new("curl").args(["-sf", &format!("http://127.0.0.1:{port}/readyz")]).output().unwrap();
        if out.status.success() {
            break;
        }
        assert!(ready.elapsed() < Duration::from_secs(60), "controller not ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let spec = FleetSpec::new("ctl", n, 0, 0);
    let servers = restatus::k8s::api_for(target, Profile::metal_operator().kind("Server").unwrap(), None);
    let watch = {
        let servers = servers.clone();
        tokio::spawn(async move {
            let mut restored: HashMap<String, Instant> = HashMap::new();
            let config = watcher::Config::default().labels(&format!("{FLEET_LABEL}=ctl"));
            let mut events = watcher(servers, config).boxed();
            while restored.len() < n {
                if let Some(watcher::Event::Apply(o)) = events.try_next().await.unwrap()
                    && o.data.get("status").and_then(|s| s.get("state")).is_some()
                {
                    restored.entry(o.metadata.name.clone().unwrap()).or_insert_with(Instant::now);
                }
            }
            restored
        })
    };
    let mut created = HashMap::new();
    for i in 0..n {
        let object = serde_json::from_value(spec.server(i).0).unwrap();
        servers.create(&PostParams::default(), &object).await.unwrap();
        created.insert(spec.server_name(i), Instant::now());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let restored =
        tokio::time::timeout(Duration::from_secs(120), watch).await.expect("controller restored all").unwrap();
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let _ = child.wait();
    let mut delays: Vec<Duration> =
        created.iter().map(|(name, t)| restored[name].saturating_duration_since(*t)).collect();
    delays.sort();
    (delays[delays.len() / 2], delays[delays.len() * 9 / 10])
}

const KUBECTL_SAMPLE: usize = 100;

/// The target, the snapshot, and what a comparison needs of them.
struct Bench {
    target: kube::Client,
    target_kc: String,
    profile: Profile,
    records: Vec<Record>,
    storage: String,
    cluster: String,
    snapshot: String,
}

/// One restore and what it is compared with.
struct Comparison {
    what: &'static str,
    restore: Run,
    bare: [Run; 2],
    kubectl: [Duration; 2],
}

impl Bench {
    /// `restatus restore` of the fleet `fleet`, between two bare loops of the same writes
    /// (on `<bare>` and `<bare>2`) and right between two kubectl samples (`manual<n>`,
    /// `manual<n+1>`): B K A K B. The API server slows as the cluster fills with statuses;
    /// this way its drift weighs on both sides of each ratio.
    async fn compare(&self, what: &'static str, fleet: &str, bare: &str, manual: usize, quiesce: bool) -> Comparison {
        let kubectl = |n: usize| kubectl_loop(&self.target_kc, &self.records, &format!("manual{n}"), KUBECTL_SAMPLE);
        let (first, second) = (bare.to_string(), format!("{bare}2"));
        let bare_before = bare_loop(&self.target, &self.profile, &self.records, &first, quiesce).await;
        let kubectl_before = kubectl(manual);
        let restore = restatus_restore(&self.target_kc, &self.storage, &self.cluster, &self.snapshot, fleet);
        let kubectl_after = kubectl(manual + 1);
        let bare_after = bare_loop(&self.target, &self.profile, &self.records, &second, quiesce).await;
        Comparison { what, restore, bare: [bare_before, bare_after], kubectl: [kubectl_before, kubectl_after] }
    }
}

#[tokio::main]
async fn main() {
    let (source, target) = (client("KUBECONFIG_SOURCE").await, client("KUBECONFIG_TARGET").await);
    let target_kc = env("KUBECONFIG_TARGET");
    let profile = servers_and_claims();
    let (storage, cluster, store) = run_store("bench-restore", "bench-src");

    // The snapshot: Servers and ServerClaims of the bench fleet, of the fleet that arrives
    // quiesced ("hand") and of the controller's fleet.
    let (snapshot, records) = backed_up(&source, &store, &profile, &format!("{FLEET_LABEL} in (bench,hand,ctl)")).await;
    let bench_records: Vec<Record> = records.into_iter().filter(|r| r.name.starts_with("bench-")).collect();
    let objects = bench_records.len();
    assert_not_restored(&target, &profile, "bench").await;

    // The controller first, on a target that holds the moved fleets without status.
    let (median, p90) = controller_latency(&target, &target_kc, &storage, &cluster, 200).await;

    let bench = Bench { target, target_kc, profile, records: bench_records, storage, cluster, snapshot };
    let mut comparisons =
        vec![bench.compare("objects arrive bare (quiesce, status, release)", "bench", "bare", 1, true).await];
    if std::env::var("BENCH_QUIESCED").as_deref() != Ok("0") {
        let what = "objects arrive quiesced by the handshake (status, release)";
        comparisons.push(bench.compare(what, "hand", "bareh", 3, false).await);
    }

    let secs = |d: Duration| d.as_secs_f64();
    println!("restatus restore benchmark (concurrency {CONCURRENCY}, {objects} objects: Servers + ServerClaims)");
    for c in &comparisons {
        let bare = (secs(c.bare[0].time) + secs(c.bare[1].time)) / 2.0;
        let per_object = |d: Duration| secs(d) / KUBECTL_SAMPLE as f64;
        let kubectl_scaled = (per_object(c.kubectl[0]) + per_object(c.kubectl[1])) / 2.0 * objects as f64;
        let run = &c.restore;
        println!("-- {}", c.what);
        println!("restatus restore wall time                   {:.1} s", secs(run.time));
        println!(
            "  writes per object                          {:.2} writes + {:.2} Event ({} + {})",
            run.writes as f64 / objects as f64,
            run.events as f64 / objects as f64,
            run.writes,
            run.events
        );
        println!("  peak RSS                                   {} KiB", run.peak_rss_kib);
        println!(
            "bare loop before / after                     {:.1} s / {:.1} s ({:.2} writes per object)",
            secs(c.bare[0].time),
            secs(c.bare[1].time),
            c.bare[0].writes as f64 / objects as f64
        );
        println!("restore / bare loop (mean)                   {:.3}", secs(run.time) / bare);
        println!(
            "kubectl patch, per object, before / after    {:.0} ms / {:.0} ms ({KUBECTL_SAMPLE} Servers each)",
            per_object(c.kubectl[0]) * 1000.0,
            per_object(c.kubectl[1]) * 1000.0
        );
        println!("kubectl loop scaled to {objects} objects     {kubectl_scaled:.1} s");
        println!("kubectl loop (scaled) / restore              {:.1}x", kubectl_scaled / secs(run.time));
    }
    println!("controller: creation -> restored, median     {:.3} s", median.as_secs_f64());
    println!("controller: creation -> restored, p90        {:.3} s", p90.as_secs_f64());
}
