//! Memory at scale (run by `scripts/bench` with `BENCH_ONLY=scale`, which creates the fleets):
//! for each fleet size of `BENCH_SCALE` (Servers with realistic status, on the source cluster
//! of the bench test bed), peak RSS and wall time of `restatus backup` against a bare
//! paginated LIST of the same objects, then peak RSS and wall time of `restatus restore` of
//! that snapshot onto the same objects (every status already equal: the whole read, verify,
//! list and plan path, no writes), and at the largest size the restore controller's RSS,
//! sampled every second, while it holds every object and record through three new snapshots.
//! Per-record costs are the differences between sizes. The Servers are written straight into
//! the source's etcd (`restatus::fleet::etcd`, bench-only), each size's increment just before
//! that size is measured.

// Only a part of it: no test-bed CPU here.
#[allow(dead_code)]
mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use restatus::domain::identity::Profile;
use restatus::fleet::etcd::{EtcdTarget, load_servers, wait_listed};
use restatus::fleet::{FLEET_LABEL, FleetSpec};
use restatus::k8s::PageRequest;
use restatus::k8s::list::{ListPage, fetch_page};
use support::{Controller, env, get, metric, rss_kib, timed};

/// A bare paginated LIST of the selected Servers; returns the objects listed.
async fn bare_list(client: &kube::Client, selector: &str) -> usize {
    let profile = Profile::metal_operator();
    let kind = profile.kind("Server").unwrap();
    let (mut objects, mut token) = (0, None::<String>);
    let page = PageRequest { size: 500, selector: Some(selector), namespace: None };
    while let Some(body) = fetch_page(client, kind, &page, token.as_deref()).await.unwrap() {
        let page = ListPage::parse(kind, &body).unwrap();
        objects += page.items.len();
        match page.next() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    objects
}

/// Waits until the controller has decided `n` objects in all, sampling its RSS each second;
/// returns the highest sample.
async fn decided(controller: &Controller, n: f64, deadline: Duration) -> u64 {
    let started = Instant::now();
    let mut peak = 0;
    loop {
        peak = peak.max(rss_kib(controller.child.id()));
        let metrics = get(controller.port, "/metrics").unwrap_or_default();
        if metric(&metrics, "restatus_decisions_total") >= n {
            return peak;
        }
        assert!(started.elapsed() < deadline, "controller decided fewer than {n} objects in {deadline:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::main]
async fn main() {
    let sizes: Vec<usize> = env("BENCH_SCALE").split_whitespace().map(|s| s.parse().unwrap()).collect();
    let source = env("KUBECONFIG_SOURCE");
    let bucket = env("RESTATUS_BUCKET");
    let client = restatus::k8s::client(Some(Path::new(&source)), None).await.unwrap();
    let storage = format!("s3://{bucket}/scale");
    let stamp = jiff::Timestamp::now().as_second();
    let etcd = EtcdTarget { url: env("RESTATUS_ETCD_SOURCE"), prefix: "/registry".into(), managed_fields: true };
    let mut rows = Vec::new();
    let mut fleets = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        fleets.push(format!("scale{}", i + 1));
        // The fleet grows to n Servers only now, so that the cluster holds no more Servers than
        // are measured: a paginated LIST with a selector is read from etcd, and its last page
        // would otherwise scan every Server of the larger fleets (at 100k in etcd, a page of
        // the 10k fleet ran into the API server's 60 s request timeout).
        let previous = i.checked_sub(1).map_or(0, |p| sizes[p]);
        let spec = FleetSpec::new(fleets.last().unwrap(), n - previous, 0, 0);
        let started = Instant::now();
        let loaded = load_servers(&etcd, &spec, 8).await.unwrap();
        let wrote = started.elapsed();
        let listed = wait_listed(&client, &spec, Duration::from_secs(3600)).await.unwrap();
        println!(
            "fleet {}: {} Servers ({:.1} MiB) written into etcd in {:.1} s ({} there already); listed by the API server {:.1} s later",
            spec.name,
            loaded.written,
            loaded.bytes as f64 / 1048576.0,
            wrote.as_secs_f64(),
            loaded.existing,
            listed.as_secs_f64()
        );
        let selector = format!("{FLEET_LABEL} in ({})", fleets.join(","));
        let cluster = format!("scale-{n}-{stamp}");
        let servers_only = ["--kubeconfig", source.as_str(), "--selector", selector.as_str()];
        let listed = bare_list(&client, &selector).await;
        assert_eq!(listed, n, "fleet of {n} Servers expected for {selector}");
        // Alternating, twice: backup then bare LIST.
        let (mut backups, mut lists, mut backup_rss) = (Vec::new(), Vec::new(), 0);
        for _ in 0..2 {
            let (took, rss) = timed(&[&["backup"][..], &servers_only[..]].concat(), &storage, &cluster);
            backups.push(took);
            backup_rss = backup_rss.max(rss);
            let t = Instant::now();
            bare_list(&client, &selector).await;
            lists.push(t.elapsed());
        }
        let (restore_time, restore_rss) = timed(&[&["restore"][..], &servers_only[..]].concat(), &storage, &cluster);
        let backup: Duration = backups.iter().sum::<Duration>() / 2;
        let list: Duration = lists.iter().sum::<Duration>() / 2;
        println!(
            "{n:>7} Servers: backup {:.1} s / bare LIST {:.1} s = {:.3}, backup peak RSS {} KiB; restore (all equal) {:.1} s, peak RSS {} KiB",
            backup.as_secs_f64(),
            list.as_secs_f64(),
            backup.as_secs_f64() / list.as_secs_f64(),
            backup_rss,
            restore_time.as_secs_f64(),
            restore_rss
        );
        rows.push((n, backup, list, backup_rss, restore_time, restore_rss, cluster, selector));
    }

    // The controller at the largest size: every object and record held, three new snapshots.
    let (n, _, _, _, _, _, cluster, selector) = rows.last().cloned().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(env!("CARGO_BIN_EXE_restatus"))
        .args(["controller", "--kubeconfig", &source, "--selector", &selector, "--snapshot-refresh", "5s"])
        .args(["--lease-namespace", "default", "--lease-name", "restatus-scale-bench"])
        .args(["--http-addr", &format!("127.0.0.1:{port}")])
        .env("RESTATUS_STORAGE", &storage)
        .env("RESTATUS_CLUSTER_ID", &cluster)
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let controller = Controller { child, port };
    let deadline = Duration::from_secs(1800);
    let first = decided(&controller, n as f64, deadline).await;
    println!(
        "controller, {n} objects and records, synced: RSS {} KiB (peak while syncing {first} KiB)",
        rss_kib(controller.child.id())
    );
    let mut steady = 0;
    for round in 1..=3 {
        let servers_only = ["backup", "--kubeconfig", source.as_str(), "--selector", selector.as_str()];
        timed(&servers_only, &storage, &cluster);
        let peak = decided(&controller, (n * (round + 1)) as f64, deadline).await;
        steady = steady.max(peak);
        println!("controller, refresh {round}: every object decided again; peak RSS {peak} KiB");
    }
    println!();
    println!("| Servers (records) | backup / bare LIST | backup peak RSS | restore peak RSS | restore wall time |");
    println!("|---|---|---|---|---|");
    for (n, backup, list, backup_rss, restore_time, restore_rss, _, _) in &rows {
        println!(
            "| {n} | {:.3} | {:.1} MiB | {:.1} MiB | {:.1} s |",
            backup.as_secs_f64() / list.as_secs_f64(),
            *backup_rss as f64 / 1024.0,
            *restore_rss as f64 / 1024.0,
            restore_time.as_secs_f64()
        );
    }
    if let [(n0, .., r0, _, _), .., (n1, .., r1, _, _)] = rows.as_slice() {
        let per_record = (*r1 as f64 - *r0 as f64) * 1024.0 / (*n1 as f64 - *n0 as f64);
        println!("restore: {per_record:.0} bytes of peak RSS per record between {n0} and {n1}");
        if *n1 < 100_000 {
            println!(
                "restore, extrapolated to 100k records: {:.1} MiB",
                (*r1 as f64 * 1024.0 + per_record * (100_000.0 - *n1 as f64)) / 1024.0 / 1024.0
            );
        }
    }
    // Issue 12's goals: restore peak RSS at 100k against 10k (<= 1.5), backup / bare LIST and
    // backup RSS at 100k.
    if let (Some(near10k), Some(largest)) =
        (rows.iter().min_by_key(|r| r.0.abs_diff(10_000)), rows.iter().max_by_key(|r| r.0))
        && largest.0 != near10k.0
    {
        println!(
            "restore peak RSS, {} records / {} records: {:.1} MiB / {:.1} MiB = {:.2}",
            largest.0,
            near10k.0,
            largest.5 as f64 / 1024.0,
            near10k.5 as f64 / 1024.0,
            largest.5 as f64 / near10k.5 as f64
        );
    }
    if let Some((n, backup, list, backup_rss, ..)) = rows.iter().max_by_key(|r| r.0) {
        println!(
            "backup, {n} Servers: {:.1} s / bare LIST {:.1} s = {:.3}, peak RSS {:.1} MiB",
            backup.as_secs_f64(),
            list.as_secs_f64(),
            backup.as_secs_f64() / list.as_secs_f64(),
            *backup_rss as f64 / 1024.0
        );
    }
    println!(
        "controller steady peak RSS over three refreshes, {n} objects and records: {:.1} MiB",
        steady as f64 / 1024.0
    );
}
