//! Memory at scale (run by `scripts/bench` with `BENCH_ONLY=scale`, which creates the fleets):
//! for each fleet size of `BENCH_SCALE` (Servers with realistic status, on the source cluster
//! of the bench test bed), peak RSS and wall time of `restatus backup` against a bare
//! paginated LIST of the same objects, then peak RSS and wall time of `restatus restore` of
//! that snapshot onto the same objects (every status already equal: the whole read, verify,
//! list and plan path, no writes), peak RSS of `restatus restore --dry-run` with `-o json`
//! (one document: every object held) and with `-o jsonl` (every object streamed, none held;
//! issue 22's goal: at 100k within 1.2 times the 10k figure), and at the largest size the
//! restore controller's RSS,
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
use support::{Controller, env, get, metric, rss_kib, timed, timed_output};

/// The figures of one fleet size.
#[derive(Clone)]
struct Row {
    n: usize,
    backup: Duration,
    list: Duration,
    backup_rss: u64,
    restore_time: Duration,
    restore_rss: u64,
    /// `restore --dry-run -o json`, `restore --dry-run -o jsonl`: peak RSS, and the latter's time.
    dry_json_rss: u64,
    dry_jsonl_rss: u64,
    dry_jsonl_time: Duration,
    cluster: String,
    selector: String,
}

/// A dry run of the restore with `-o format`: wall time, peak RSS and stdout's lines.
fn dry_run(format: &str, servers_only: &[&str], storage: &str, cluster: &str) -> (Duration, u64, usize) {
    let args = [&["restore", "--allow-same-cluster", "--dry-run", "-o", format][..], servers_only].concat();
    let (took, rss, out) = timed_output(&args, storage, cluster);
    (took, rss, out.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count())
}

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
    let etcd = EtcdTarget {
        url: env("RESTATUS_ETCD_SOURCE"),
        prefix: "/registry".into(),
        managed_fields: true,
        one_per_revision: false,
    };
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
        // The bench restores onto the cluster it backed up.
        let restore = [&["restore", "--allow-same-cluster"][..], &servers_only[..]].concat();
        let (restore_time, restore_rss) = timed(&restore, &storage, &cluster);
        let (_, dry_json_rss, _) = dry_run("json", &servers_only, &storage, &cluster);
        let (dry_jsonl_time, dry_jsonl_rss, lines) = dry_run("jsonl", &servers_only, &storage, &cluster);
        assert_eq!(lines, n + 1, "restore --dry-run -o jsonl: a line per Server and the summary");
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
        println!(
            "{n:>7} Servers: restore --dry-run peak RSS -o json {dry_json_rss} KiB, -o jsonl {dry_jsonl_rss} KiB ({:.1} s)",
            dry_jsonl_time.as_secs_f64()
        );
        rows.push(Row {
            n,
            backup,
            list,
            backup_rss,
            restore_time,
            restore_rss,
            dry_json_rss,
            dry_jsonl_rss,
            dry_jsonl_time,
            cluster,
            selector,
        });
    }

    // The controller at the largest size: every object and record held, three new snapshots.
    let Row { n, cluster, selector, .. } = rows.last().cloned().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(env!("CARGO_BIN_EXE_restatus"))
        // It restores onto the cluster it backed up.
        .args(["controller", "--allow-same-cluster", "--kubeconfig", &source, "--selector", &selector])
        .args(["--snapshot-refresh", "5s"])
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
    println!(
        "| Servers (records) | backup / bare LIST | backup peak RSS | restore peak RSS | restore wall time \
         | dry run -o json peak RSS | dry run -o jsonl peak RSS | dry run -o jsonl wall time |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.3} | {:.1} MiB | {:.1} MiB | {:.1} s | {:.1} MiB | {:.1} MiB | {:.1} s |",
            r.n,
            r.backup.as_secs_f64() / r.list.as_secs_f64(),
            r.backup_rss as f64 / 1024.0,
            r.restore_rss as f64 / 1024.0,
            r.restore_time.as_secs_f64(),
            r.dry_json_rss as f64 / 1024.0,
            r.dry_jsonl_rss as f64 / 1024.0,
            r.dry_jsonl_time.as_secs_f64()
        );
    }
    if let [first, .., last] = rows.as_slice() {
        let (n0, r0, n1, r1) = (first.n, first.restore_rss, last.n, last.restore_rss);
        let per_record = (r1 as f64 - r0 as f64) * 1024.0 / (n1 as f64 - n0 as f64);
        println!("restore: {per_record:.0} bytes of peak RSS per record between {n0} and {n1}");
        if n1 < 100_000 {
            println!(
                "restore, extrapolated to 100k records: {:.1} MiB",
                (r1 as f64 * 1024.0 + per_record * (100_000.0 - n1 as f64)) / 1024.0 / 1024.0
            );
        }
        for (what, r0, r1) in
            [("-o json", first.dry_json_rss, last.dry_json_rss), ("-o jsonl", first.dry_jsonl_rss, last.dry_jsonl_rss)]
        {
            let per_record = (r1 as f64 - r0 as f64) * 1024.0 / (n1 as f64 - n0 as f64);
            println!("restore --dry-run {what}: {per_record:.0} bytes of peak RSS per record between {n0} and {n1}");
        }
    }
    // Issue 12's goals: restore peak RSS at 100k against 10k (<= 1.5), backup / bare LIST and
    // backup RSS at 100k.
    // Issue 22's: a dry run streaming its lines at 100k against 10k (<= 1.2).
    if let (Some(near10k), Some(largest)) =
        (rows.iter().min_by_key(|r| r.n.abs_diff(10_000)), rows.iter().max_by_key(|r| r.n))
        && largest.n != near10k.n
    {
        for (what, large, near) in [
            ("restore", largest.restore_rss, near10k.restore_rss),
            ("restore --dry-run -o json", largest.dry_json_rss, near10k.dry_json_rss),
            ("restore --dry-run -o jsonl", largest.dry_jsonl_rss, near10k.dry_jsonl_rss),
        ] {
            println!(
                "{what} peak RSS, {} records / {} records: {:.1} MiB / {:.1} MiB = {:.2}",
                largest.n,
                near10k.n,
                large as f64 / 1024.0,
                near as f64 / 1024.0,
                large as f64 / near as f64
            );
        }
    }
    if let Some(Row { n, backup, list, backup_rss, .. }) = rows.iter().max_by_key(|r| r.n) {
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
