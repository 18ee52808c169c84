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

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use restatus::domain::identity::Profile;
use restatus::fleet::FLEET_LABEL;
use restatus::format::Record;
use serde_json::json;

// Only a part of it: the environment, the bench bed's clients and the bare restore.
#[allow(dead_code)]
mod support;

use support::bare::{BareLoop, assert_not_restored, backed_up, servers_and_claims};
use support::{client, env, run_store};

/// The fleet on the source; the target's sets are it renamed (`adapt4-server-00000`, …).
const FLEET: &str = "adapt";

fn renamed(record: &Record, set: &str) -> String {
    record.name.replacen(&format!("{FLEET}-"), &format!("{set}-"), 1)
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
    let (source, target) = (client("KUBECONFIG_SOURCE").await, client("KUBECONFIG_TARGET").await);
    let target_kc = env("KUBECONFIG_TARGET");
    let profile = servers_and_claims();
    let (storage, cluster, store) = run_store("bench-adaptive", "bench-adapt");
    let (snapshot, records) = backed_up(&source, &store, &profile, &format!("{FLEET_LABEL}={FLEET}")).await;
    let objects = records.len();
    assert_not_restored(&target, &profile, FLEET).await;

    // Bare loops at 64 before and after the restore: the API server's speed drifts (the
    // cluster fills with statuses, and the machine is shared), and the best fixed concurrency
    // is to weigh the same drift the restore does.
    let mut bare: Vec<(usize, Duration, usize)> = Vec::new();
    let mut run_bare = async |concurrency: usize, set: &str| {
        let started = Instant::now();
        let set = format!("{FLEET}{set}");
        let bare_loop =
            BareLoop { profile: &profile, records: &records, fleet: FLEET, set: &set, concurrency, quiesce: true };
        let writes = bare_loop.run(&target).await;
        let time = started.elapsed();
        eprintln!("bare loop at {concurrency} on {set}: {:.1} s", time.as_secs_f64());
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
