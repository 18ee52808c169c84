//! What the benches that drive the `restatus` binary on the bench test bed share: the
//! environment, timing a run, sampling a process's RSS, reading a controller's metrics, and the
//! bare restore the restore benches compare with (`bare`).

pub mod bare;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} unset: run scripts/bench"))
}

/// A client of the bench bed's cluster whose kubeconfig the variable `kubeconfig` names.
pub async fn client(kubeconfig: &str) -> kube::Client {
    restatus::k8s::client(Some(std::path::Path::new(&env(kubeconfig))), None).await.expect("a client of the bench bed")
}

/// A store of the bench bucket for one run: `s3://<bucket>/<prefix>`, under the cluster id
/// `<cluster>-<now>` (a snapshot of its own): its URL, the cluster id and the store.
pub fn run_store(prefix: &str, cluster: &str) -> (String, String, restatus::store::SnapshotStore) {
    let storage = format!("s3://{}/{prefix}", env("RESTATUS_BUCKET"));
    let cluster = format!("{cluster}-{}", jiff::Timestamp::now().as_second());
    let store = restatus::store::SnapshotStore::open(&storage, &cluster).expect("the bench bucket");
    (storage, cluster, store)
}

/// Runs `restatus ARGS` under /usr/bin/time: wall time and peak RSS (KiB).
pub fn timed(args: &[&str], storage: &str, cluster: &str) -> (Duration, u64) {
    let (elapsed, rss, _, _) = run_timed(args, storage, cluster);
    (elapsed, rss)
}

/// As [`timed`], and the CPU seconds (user + system) restatus used.
pub fn timed_cpu(args: &[&str], storage: &str, cluster: &str) -> (Duration, u64, f64) {
    let (elapsed, rss, cpu, _) = run_timed(args, storage, cluster);
    (elapsed, rss, cpu)
}

/// [`timed`], with what restatus printed on stdout.
pub fn timed_output(args: &[&str], storage: &str, cluster: &str) -> (Duration, u64, Vec<u8>) {
    let (elapsed, rss, _, stdout) = run_timed(args, storage, cluster);
    (elapsed, rss, stdout)
}

/// Wall time, peak RSS (KiB), CPU seconds and stdout of `restatus ARGS`.
fn run_timed(args: &[&str], storage: &str, cluster: &str) -> (Duration, u64, f64, Vec<u8>) {
    let started = Instant::now();
    let out = Command::new("/usr/bin/time")
        .args(["-f", "%U %S\n%M", env!("CARGO_BIN_EXE_restatus")])
        .args(args)
        .env("RESTATUS_STORAGE", storage)
        .env("RESTATUS_CLUSTER_ID", cluster)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run /usr/bin/time restatus");
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "restatus {args:?} failed: {stderr}");
    let mut last = stderr.lines().rev();
    let rss = last.next().and_then(|l| l.trim().parse().ok()).expect("peak RSS from /usr/bin/time");
    let cpu = last.next().map_or(0.0, |l| l.split_whitespace().filter_map(|t| t.parse::<f64>().ok()).sum());
    (elapsed, rss, cpu, out.stdout)
}

/// CPU seconds (user + system) a process has used so far (0 once it is gone).
pub fn cpu_seconds_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or_default().split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU seconds a process of the test bed (`apiserver-target`, `etcd-target`, ...) has used so
/// far.
pub fn bed_cpu_seconds(process: &str) -> f64 {
    let pid = std::fs::read_to_string(format!("{}/{process}.pid", env("RESTATUS_STATE"))).unwrap_or_default();
    pid.trim().parse().map_or(0.0, cpu_seconds_of)
}

pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or("VmRSS: 0 kB");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// The sum of a metric's samples (every label set) in an OpenMetrics text.
pub fn metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.split([' ', '{']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

pub fn get(port: u16, path: &str) -> Option<String> {
    let out = Command::new("curl").args(["-sf", &format!("http://127.0.0.1:{port}{path}")]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A controller the bench started; killed when dropped.
pub struct Controller {
    pub child: Child,
    pub port: u16,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
