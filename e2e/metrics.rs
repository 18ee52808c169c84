//! What an operator's Prometheus scrapes: `restatus schedule --metrics-addr` after a real
//! scheduled backup (its outcome, the bucket's newest snapshot) and a restore controller (the
//! bucket's newest snapshot), with real values and the OpenMetrics content type.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use restatus::fleet::{self, FLEET_LABEL, FleetSpec};

use crate::bed::{Bed, TARGET, stderr, unique};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A restatus process, killed when dropped; its log in a file.
pub(crate) struct Process {
    child: Child,
    log: std::path::PathBuf,
}

impl Process {
    /// Starts `command`, a [`Bed::command`].
    pub(crate) fn start(bed: &Bed, command: Command) -> Process {
        let (child, log) = bed.spawn(command);
        Process { child, log }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `GET /metrics`: the content type and the body, or None while nothing answers.
pub(crate) fn scrape(port: u16) -> Option<(String, String)> {
    let out =
        Command::new("curl").args(["-s", "-D", "-", &format!("http://127.0.0.1:{port}/metrics")]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let content_type = head.lines().find_map(|l| {
        l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-type")).map(|(_, v)| v.trim())
    })?;
    Some((content_type.to_string(), body.to_string()))
}

/// The value of the series that `series` starts (name and labels).
pub(crate) fn value(body: &str, series: &str) -> Option<f64> {
    body.lines().find(|l| l.starts_with(series)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

/// Scrapes until `done` holds for the body, or panics after `within` with the process's log.
pub(crate) async fn scrape_until(
    process: &Process,
    port: u16,
    within: Duration,
    done: impl Fn(&str) -> bool,
) -> (String, String) {
    let deadline = Instant::now() + within;
    let mut last = None;
    while Instant::now() < deadline {
        if let Some((content_type, body)) = scrape(port) {
            if done(&body) {
                return (content_type, body);
            }
            last = Some(body);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("metrics not as expected within {within:?}; last scrape:\n{last:?}\nlog:\n{}", process.log());
}

fn now() -> f64 {
    jiff::Timestamp::now().as_millisecond() as f64 / 1000.0
}

#[tokio::test]
async fn schedule_and_controller_export_backup_and_newest_snapshot_metrics() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let spec = FleetSpec::new(&unique("metrics"), 4, 4, 2);
    fleet::create(&bed.source().await, &spec, 8).await.expect("create fleet");
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage("metrics");
    let cluster = unique("metrics");
    let label = format!(r#"{{cluster_id="{cluster}"}}"#);

    // The schedule, every minute: the first run comes within 60 s.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let args = ["schedule", "--cron", "* * * * *", "--metrics-addr", &addr, "--selector", &selector];
    let schedule = Process::start(&bed, Bed::command(&bed.source_kubeconfig, &storage, &cluster, &args, &[]));
    // Before the first backup the series exist, at 0.
    let (content_type, before) = scrape_until(&schedule, port, Duration::from_secs(20), |_| true).await;
    assert_eq!(content_type, OPENMETRICS);
    assert_eq!(
        value(&before, &format!("restatus_backup_last_success_timestamp_seconds{label}")),
        Some(0.0),
        "{before}"
    );
    assert_eq!(value(&before, &format!("restatus_snapshot_newest_timestamp_seconds{label}")), Some(0.0), "{before}");
    assert_build_info(&before);

    // A second schedule on the same port stops at once, saying why.
    let taken = bed.restatus(&storage, &cluster, &["schedule", "--cron", "* * * * *", "--metrics-addr", &addr]);
    assert!(!taken.status.success());
    assert!(stderr(&taken).contains(&format!("--metrics-addr {addr}")), "{}", stderr(&taken));

    let success = format!(r#"restatus_backups_total{{cluster_id="{cluster}",outcome="success"}}"#);
    let (content_type, body) =
        scrape_until(&schedule, port, Duration::from_secs(100), |b| value(b, &success).is_some_and(|n| n >= 1.0)).await;
    assert_eq!(content_type, OPENMETRICS);
    assert!(body.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
    let get = |name: &str| value(&body, &format!("{name}{label}")).unwrap_or_else(|| panic!("{name} missing:\n{body}"));
    let records = get("restatus_backup_records");
    assert_eq!(records, spec.total() as f64, "records of the scheduled backup");
    assert!(get("restatus_backup_bytes") > 0.0);
    assert!(get("restatus_backup_duration_seconds") > 0.0);
    let last = get("restatus_backup_last_success_timestamp_seconds");
    assert!((now() - last).abs() < 120.0, "last success {last} is not about now ({})", now());
    let failure = format!(r#"restatus_backups_total{{cluster_id="{cluster}",outcome="failure"}}"#);
    assert_eq!(value(&body, &failure), Some(0.0));
    // The bucket's view, refreshed after the backup: the snapshot just written.
    assert_eq!(get("restatus_snapshot_newest_records"), records);
    assert_eq!(get("restatus_snapshot_newest_consistent"), 1.0);
    assert_eq!(get("restatus_snapshot_newest_bytes"), get("restatus_backup_bytes"));
    let newest = get("restatus_snapshot_newest_timestamp_seconds");
    assert!(newest > 0.0 && newest <= last, "newest snapshot taken at {newest}, backup done at {last}");
    drop(schedule);

    // The restore controller on the target reads the same from the bucket.
    let port = free_port();
    let args = [
        "controller",
        "--selector",
        &selector,
        "--snapshot-refresh",
        "2s",
        "--http-addr",
        &format!("127.0.0.1:{port}"),
        "--lease-namespace",
        "default",
        "--lease-name",
        &unique("lease"),
    ];
    let controller = Process::start(&bed, Bed::command(&bed.target_kubeconfig, &storage, &cluster, &args, &[]));
    let series = format!("restatus_snapshot_newest_records{label}");
    let (content_type, body) =
        scrape_until(&controller, port, Duration::from_secs(30), |b| value(b, &series).is_some_and(|n| n > 0.0)).await;
    assert_eq!(content_type, OPENMETRICS);
    assert_eq!(value(&body, &series), Some(records));
    assert_eq!(value(&body, &format!("restatus_snapshot_newest_timestamp_seconds{label}")), Some(newest));
    assert_eq!(value(&body, &format!("restatus_snapshot_newest_consistent{label}")), Some(1.0));
    assert_build_info(&body);
}

/// `restatus_build_info{version,commit,rustc,format_version} 1` on a role's /metrics.
fn assert_build_info(body: &str) {
    let line = body.lines().find(|l| l.starts_with("restatus_build_info{")).unwrap_or_else(|| panic!("{body}"));
    assert!(line.ends_with("} 1"), "{line}");
    let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
    for label in [version.as_str(), "commit=\"", "rustc=\"rustc ", "format_version=\""] {
        assert!(line.contains(label), "{label} in {line}");
    }
}

/// F144 on the bed: a forged manifest dated 2999 (unsigned, written by whoever can write the
/// bucket) beside a signed backup. A controller given the key exports the signed snapshot's
/// capture time as the newest (before: 2999, which silenced `RestatusBackupTooOld` for good).
#[tokio::test]
async fn with_a_key_a_forged_manifest_dated_2999_is_not_the_newest_snapshot_of_the_metrics() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (private, public, _) = crate::bed::generate_keys(&bed, "metrics");
    let (private, public) = (private.display().to_string(), public.display().to_string());
    let spec = FleetSpec::new(&unique("metricsk"), 2, 2, 1);
    fleet::create(&bed.source().await, &spec, 8).await.expect("create fleet");
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage("metrics");
    let cluster = unique("metricsk");
    let label = format!(r#"{{cluster_id="{cluster}"}}"#);
    let out = bed.restatus(&storage, &cluster, &["backup", "--selector", &selector, "--signing-key", &private]);
    assert!(out.status.success(), "backup: {}", stderr(&out));
    let store = bed.store(&storage, &cluster);
    let id: restatus::format::SnapshotId = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let signed = store.manifest(&id).await.unwrap().created_at.as_millisecond() as f64 / 1000.0;
    let forged = restatus::fixtures::snapshot(&[]).at("2999-01-01T00:00:00Z".parse().unwrap()).write(&store).await;

    let port = free_port();
    let args = [
        "controller",
        "--selector",
        &selector,
        "--snapshot-refresh",
        "2s",
        "--http-addr",
        &format!("127.0.0.1:{port}"),
        "--lease-namespace",
        "default",
        "--lease-name",
        &unique("lease"),
        "--trusted-key",
        &public,
    ];
    let controller = Process::start(&bed, Bed::command(&bed.target_kubeconfig, &storage, &cluster, &args, &[]));
    let series = format!("restatus_snapshot_newest_timestamp_seconds{label}");
    let (_, body) =
        scrape_until(&controller, port, Duration::from_secs(30), |b| value(b, &series).is_some_and(|t| t > 0.0)).await;
    assert_eq!(value(&body, &series), Some(signed), "the forgery {} is the newest snapshot", forged.snapshot_id);
}
