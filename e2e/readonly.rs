//! Read-only S3 credentials for the target cluster (docs/S3.md), on versitygw, whose IAM can
//! express them: a user of role `user` owns nothing, and a bucket policy grants it only
//! s3:ListBucket and s3:GetObject. With those keys the restore controller, `restore` and
//! `snapshots list` work, and a `backup` fails saying that access was denied.
//!
//! Needs the versitygw environment (`source "$(scripts/testbed env versitygw)"`): s3s-fs has
//! no users. `scripts/test` runs it in its versitygw pass.

use std::process::Command;
use std::time::{Duration, Instant};

use restatus::domain::annotations::QUIESCED_BY_ANNOTATION;
use restatus::fleet::{self, FLEET_LABEL, FleetSpec};

use crate::bed::{Bed, TARGET, assert_success, env, fleet_state, simulate_move, stderr, stdout, unique};
use crate::metrics::{Process, free_port, scrape, value};

fn versitygw() -> std::path::PathBuf {
    std::path::Path::new(&env("RESTATUS_BIN")).join("versitygw")
}

/// `versitygw admin <args>` as the root account of the S3 server in the environment.
fn admin(args: &[&str]) -> std::process::Output {
    Command::new(versitygw())
        .args(["admin", "--access", &env("AWS_ACCESS_KEY_ID"), "--secret", &env("AWS_SECRET_ACCESS_KEY")])
        .args(["--endpoint-url", &env("S3_ENDPOINT")])
        .args(args)
        .output()
        .expect("run versitygw admin")
}

/// PUT (`Some(policy)`) or DELETE (`None`) the bucket's policy as the root account (SigV4 by curl).
fn bucket_policy(bucket: &str, policy: Option<&serde_json::Value>) {
    let mut curl = Command::new("curl");
    curl.args(["-s", "-o", "-", "-w", "\n%{http_code}", "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
        .args(["--aws-sigv4", "aws:amz:us-east-1:s3", "--user"])
        .arg(format!("{}:{}", env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")));
    match policy {
        Some(policy) => curl.args(["-X", "PUT", "--data-binary", &policy.to_string()]),
        None => curl.args(["-X", "DELETE"]),
    };
    // `policy=`: the canonical query string versitygw signs.
    let out = curl.arg(format!("{}/{bucket}?policy=", env("S3_ENDPOINT"))).output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = text.trim_end().rsplit('\n').next().unwrap_or_default().to_string();
    assert!(
        code == "204" || code == "200",
        "{} bucket policy: {text}",
        if policy.is_some() { "PUT" } else { "DELETE" }
    );
}

#[tokio::test]
async fn readonly_credentials_restore_and_list_but_cannot_back_up() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let created = admin(&["list-users"]);
    assert!(
        created.status.success(),
        "this test needs versitygw with IAM (source \"$(scripts/testbed env versitygw)\"): {}",
        String::from_utf8_lossy(&created.stderr)
    );

    // A snapshot, written with the full credentials.
    let source = bed.source().await;
    let spec = FleetSpec::new(&unique("ro"), 6, 6, 2);
    fleet::create(&source, &spec, 8).await.expect("create fleet");
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage("readonly");
    let cluster = "ro-src";
    let backup = bed.restatus(&storage, cluster, &["backup", "--selector", &selector]);
    assert_success(&backup, "backup with the full credentials");
    let snapshot = stdout(&backup).trim().to_string();

    // The read-only user: role `user` (owns no bucket), allowed to list and read the bucket.
    let (access, secret) = (unique("restatus-ro"), format!("{}-secret", unique("ro")));
    let out = admin(&["create-user", "--access", &access, "--secret", &secret, "--role", "user"]);
    assert!(out.status.success(), "create-user: {}", String::from_utf8_lossy(&out.stderr));
    let bucket = env("RESTATUS_BUCKET");
    bucket_policy(
        &bucket,
        Some(&serde_json::json!({"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"AWS": [access]}, "Action": ["s3:ListBucket"],
             "Resource": [format!("arn:aws:s3:::{bucket}")]},
            {"Effect": "Allow", "Principal": {"AWS": [access]}, "Action": ["s3:GetObject"],
             "Resource": [format!("arn:aws:s3:::{bucket}/*")]}
        ]})),
    );
    let readonly = [("AWS_ACCESS_KEY_ID", access.as_str()), ("AWS_SECRET_ACCESS_KEY", secret.as_str())];

    // snapshots list and verify read.
    let list =
        bed.restatus_with(&bed.source_kubeconfig, &storage, cluster, &["snapshots", "list", "-o", "json"], &readonly);
    assert_success(&list, "snapshots list with read-only credentials");
    assert!(stdout(&list).contains(&snapshot), "{}", stdout(&list));
    let verify =
        bed.restatus_with(&bed.source_kubeconfig, &storage, cluster, &["snapshots", "verify", &snapshot], &readonly);
    assert_success(&verify, "snapshots verify with read-only credentials");

    // A backup with them fails, and says why.
    let denied =
        bed.restatus_with(&bed.source_kubeconfig, &storage, cluster, &["backup", "--selector", &selector], &readonly);
    assert!(!denied.status.success(), "a backup with read-only credentials succeeded");
    let why = stderr(&denied);
    assert!(why.contains("backup failed; no snapshot was written"), "{why}");
    assert!(why.contains("AccessDenied") || why.contains("Access Denied") || why.contains("403"), "{why}");
    let after = bed.restatus(&storage, cluster, &["snapshots", "list", "-o", "json"]);
    let rows: serde_json::Value = serde_json::from_str(&stdout(&after)).unwrap();
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "the denied backup left a snapshot: {rows}");

    // The restore controller on the target, with the read-only keys, restores the moved fleet.
    let port = free_port();
    let (addr, lease) = (format!("127.0.0.1:{port}"), unique("lease"));
    let args = ["controller", "--selector", &selector, "--snapshot-refresh", "2s", "--http-addr", &addr]
        .into_iter()
        .chain(["--lease-namespace", "default", "--lease-name", &lease])
        .collect::<Vec<_>>();
    let controller = Process::start(&bed, Bed::command(&bed.target_kubeconfig, &storage, cluster, &args, &readonly));
    simulate_move(&source, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    let want = fleet_state(&source, &spec.name).await;
    let target = bed.target().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state = fleet_state(&target, &spec.name).await;
        let done = state.len() == want.len()
            && want.iter().all(|(name, (status, _))| {
                state.get(name).is_some_and(|(s, a)| s == status && !a.contains_key(QUIESCED_BY_ANNOTATION))
            });
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "not restored with read-only credentials; log:\n{}", controller.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, metrics) = scrape(port).expect("controller /metrics");
    let series = format!(r#"restatus_snapshot_newest_records{{cluster_id="{cluster}"}}"#);
    assert_eq!(value(&metrics, &series), Some(spec.total() as f64), "{metrics}");
    drop(controller);

    // One-shot restore with them: reads the snapshot, finds nothing left to write.
    let restore = bed.restatus_with(
        &bed.target_kubeconfig,
        &storage,
        cluster,
        &["restore", "--selector", &selector, "-o", "json"],
        &readonly,
    );
    assert_success(&restore, "restore with read-only credentials");
    let report: serde_json::Value = serde_json::from_str(&stdout(&restore)).unwrap();
    assert_eq!(report["snapshot"], snapshot.as_str());

    bucket_policy(&bucket, None);
    let out = admin(&["delete-user", "--access", &access]);
    assert!(out.status.success(), "delete-user: {}", String::from_utf8_lossy(&out.stderr));
}
