//! What the benches that drive the `restatus` binary on the bench test bed share: the
//! environment, timing a run, sampling a process's RSS, reading a controller's metrics.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} unset: run scripts/bench"))
}

/// Runs `restatus ARGS` under /usr/bin/time: wall time and peak RSS (KiB).
pub fn timed(args: &[&str], storage: &str, cluster: &str) -> (Duration, u64) {
    let (took, rss, _) = timed_output(args, storage, cluster);
    (took, rss)
}

/// [`timed`], with what restatus printed on stdout.
pub fn timed_output(args: &[&str], storage: &str, cluster: &str) -> (Duration, u64, Vec<u8>) {
    let started = Instant::now();
    let out = Command::new("/usr/bin/time")
        .args(["-f", "%M", env!("CARGO_BIN_EXE_restatus")])
        .args(args)
        .env("RESTATUS_STORAGE", storage)
        .env("RESTATUS_CLUSTER_ID", cluster)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run /usr/bin/time restatus");
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "restatus {args:?} failed: {stderr}");
    let rss = stderr.lines().last().and_then(|l| l.trim().parse().ok()).expect("peak RSS from /usr/bin/time");
    (elapsed, rss, out.stdout)
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
