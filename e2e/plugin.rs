//! The kubectl plugin: the restatus binary installed as `kubectl-restatus` on `PATH` (as the
//! release archives and the krew manifest install it) is found by the bed's real kubectl and
//! runs every command as `kubectl restatus …`.

use std::path::Path;
use std::process::{Command, Output};

use restatus::fleet::{self, FLEET_LABEL, FleetSpec};
use serde_json::Value;

use crate::bed::{Bed, assert_success, stdout, unique};

/// Runs the bed's kubectl with `dir` first on `PATH` and the bed's S3 settings for `storage`.
fn kubectl_with_plugin(bed: &Bed, dir: &Path, storage: &str, args: &[&str]) -> Output {
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    Command::new(&bed.kubectl)
        .args(args)
        .env("PATH", path)
        .env("RESTATUS_STORAGE", storage)
        .env("RESTATUS_CLUSTER_ID", "plugin")
        .output()
        .expect("run kubectl")
}

#[tokio::test]
async fn the_binary_runs_as_kubectl_restatus() {
    let bed = Bed::get();
    let dir = tempfile::tempdir().expect("temp dir");
    let plugin = dir.path().join("kubectl-restatus");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_restatus"), &plugin).expect("link kubectl-restatus");
    let storage = bed.storage("plugin");

    // kubectl finds it.
    let list = kubectl_with_plugin(&bed, dir.path(), &storage, &["plugin", "list", "--name-only"]);
    let listed = stdout(&list);
    assert!(listed.lines().any(|l| l.trim() == "kubectl-restatus"), "kubectl plugin list: {listed}");

    // Help and usage errors name the command as it was typed.
    let help = kubectl_with_plugin(&bed, dir.path(), &storage, &["restatus", "--help"]);
    assert_success(&help, "kubectl restatus --help");
    assert!(stdout(&help).contains("Usage: kubectl restatus"), "help: {}", stdout(&help));
    let typo = kubectl_with_plugin(&bed, dir.path(), &storage, &["restatus", "snapshots", "lst"]);
    assert!(!typo.status.success(), "a typo must fail");
    let said = String::from_utf8_lossy(&typo.stderr);
    assert!(said.contains("kubectl restatus snapshots"), "usage error: {said}");

    // And it works: a backup through the plugin, then the snapshot listed through it.
    let client = bed.source().await;
    let spec = FleetSpec::new(&unique("plugin"), 2, 2, 1);
    fleet::create(&client, &spec, 4).await.expect("create fleet");
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let kubeconfig = bed.source_kubeconfig.to_string_lossy().into_owned();
    let backup = kubectl_with_plugin(
        &bed,
        dir.path(),
        &storage,
        &["restatus", "--kubeconfig", &kubeconfig, "backup", "--selector", &selector],
    );
    assert_success(&backup, "kubectl restatus backup");
    let id = stdout(&backup).trim().to_string();
    let listed = kubectl_with_plugin(&bed, dir.path(), &storage, &["restatus", "snapshots", "list", "-o", "json"]);
    assert_success(&listed, "kubectl restatus snapshots list");
    let snapshots: Value = serde_json::from_str(&stdout(&listed)).expect("snapshots list -o json");
    let text = snapshots.to_string();
    assert!(text.contains(&id), "the backup's snapshot {id} is listed: {text}");
}
