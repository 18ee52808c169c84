//! The CLI as a person uses it, on the test bed: `snapshots clusters`, `show --objects`,
//! `diff`, `-o yaml`, `completion`, `--version`, and a restore whose log (stderr piped) has
//! progress lines and no colour codes.

use kube::api::{Patch, PatchParams};
use restatus::domain::identity::Profile;
use restatus::fleet::{self, FLEET_LABEL, FleetSpec};
use serde_json::{Value, json};

use crate::bed::{Bed, TARGET, assert_success, simulate_move, stderr, stdout, unique};

fn json_of(out: &std::process::Output, what: &str) -> Value {
    assert_success(out, what);
    serde_json::from_str(&stdout(out)).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", stdout(out)))
}

#[tokio::test]
async fn cli_lists_clusters_shows_objects_and_diffs_two_snapshots() {
    let bed = Bed::get();
    let client = bed.source().await;
    let spec = FleetSpec::new(&unique("cli"), 6, 6, 2);
    fleet::create(&client, &spec, 8).await.expect("create fleet");
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage("cli");
    let backup = |cluster: &str| {
        let out = bed.restatus(&storage, cluster, &["backup", "--selector", &selector]);
        assert_success(&out, "backup");
        stdout(&out).trim().to_string()
    };
    let first = backup("cli-a");
    // A status that moves on between two backups: a Server that was off is powered on.
    let servers = restatus::k8s::api_for(&client, Profile::metal_operator().kind("Server").unwrap(), None);
    let name = (0..6)
        .find(|i| spec.server(*i).1["powerState"] == "Off")
        .map(|i| spec.server_name(i))
        .expect("the fleet has a Server that is off");
    servers
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({"status": {"powerState": "On"}})))
        .await
        .expect("power the Server on");
    let second = backup("cli-a");
    let other = backup("cli-b");

    // clusters: both ids under the prefix, each with its newest complete snapshot.
    let clusters = json_of(&bed.restatus(&storage, "whatever", &["snapshots", "clusters", "-o", "json"]), "clusters");
    let by_id = |id: &str| clusters.as_array().unwrap().iter().find(|c| c["clusterId"] == id).cloned();
    let a = by_id("cli-a").unwrap_or_else(|| panic!("cli-a not listed: {clusters}"));
    assert_eq!((a["snapshots"].as_u64(), a["complete"].as_u64()), (Some(2), Some(2)));
    assert_eq!(a["newest"], second.as_str());
    assert!(a["newestAt"].as_str().is_some_and(|t| t.starts_with("20")), "{a}");
    assert_eq!(by_id("cli-b").unwrap()["newest"], other.as_str());
    assert_eq!(clusters.as_array().unwrap().len(), 2, "{clusters}");
    let table = bed.restatus(&storage, "whatever", &["snapshots", "clusters"]);
    assert_success(&table, "clusters table");
    assert!(stdout(&table).starts_with("CLUSTER ID") && stdout(&table).contains(&second), "{}", stdout(&table));

    // show --objects: every record, or those of a kind, or those matching a filter.
    let show = |extra: &[&str]| {
        let mut args = vec!["snapshots", "show", first.as_str(), "--objects", "-o", "json"];
        args.extend_from_slice(extra);
        json_of(&bed.restatus(&storage, "cli-a", &args), "show --objects")
    };
    assert_eq!(show(&[]).as_array().unwrap().len(), spec.total());
    let bmcs = show(&["--kind", "bmc"]);
    assert_eq!(bmcs.as_array().unwrap().len(), 6);
    assert!(bmcs.as_array().unwrap().iter().all(|r| r["kind"] == "BMC"), "{bmcs}");
    let filtered = show(&["--filter", &name]);
    let rows = filtered.as_array().unwrap();
    assert!(!rows.is_empty() && rows.iter().all(|r| r["name"].as_str().unwrap().contains(&name)), "{filtered}");
    let server_row = rows.iter().find(|r| r["kind"] == "Server").expect("the Server is listed");
    assert!(server_row["key"].as_str().unwrap().starts_with("spec.systemUUID="), "{server_row}");

    // diff: the one Server whose power state changed, per field; nothing only in one.
    let diff =
        json_of(&bed.restatus(&storage, "cli-a", &["snapshots", "diff", &first, "latest", "-o", "json"]), "diff");
    assert_eq!(diff["a"], first.as_str());
    assert_eq!(diff["b"], second.as_str());
    let changed = diff["changed"].as_array().unwrap();
    assert_eq!(changed.len(), 1, "{diff}");
    assert_eq!(changed[0]["kind"], "Server");
    assert_eq!(changed[0]["nameInA"], name.as_str());
    assert_eq!(changed[0]["changes"], json!([{"field": "powerState", "from": "\"Off\"", "to": "\"On\""}]));
    assert_eq!(diff["onlyInA"], json!([]));
    assert_eq!(diff["onlyInB"], json!([]));
    assert_eq!(diff["unchanged"].as_u64(), Some(spec.total() as u64 - 1));
    let table = bed.restatus(&storage, "cli-a", &["snapshots", "diff", &first, &second]);
    assert_success(&table, "diff table");
    assert!(stdout(&table).contains(r#"status.powerState: "Off" -> "On""#), "{}", stdout(&table));
    assert!(stdout(&table).contains("1 changed, 0 only in A, 0 only in B"), "{}", stdout(&table));

    // -o yaml says the same as -o json.
    let yaml = bed.restatus(&storage, "cli-a", &["snapshots", "diff", &first, &second, "-o", "yaml"]);
    assert_success(&yaml, "diff -o yaml");
    let parsed: Value = serde_saphyr::from_str(&stdout(&yaml)).expect("diff -o yaml is YAML");
    assert_eq!(parsed, diff);
    let list = bed.restatus(&storage, "cli-a", &["snapshots", "list", "-o", "yaml"]);
    assert_success(&list, "list -o yaml");
    let parsed: Value = serde_saphyr::from_str(&stdout(&list)).expect("list -o yaml is YAML");
    assert_eq!(parsed.as_array().map(Vec::len), Some(2), "{}", stdout(&list));
}

#[tokio::test]
async fn cli_prints_completions_and_its_commit() {
    let bed = Bed::get();
    let completion = bed.restatus("memory://", "c", &["completion", "bash"]);
    assert_success(&completion, "completion bash");
    let script = stdout(&completion);
    assert!(script.contains("_restatus()") && script.contains("snapshots") && script.contains("--cluster-id"));
    for shell in ["zsh", "fish"] {
        assert_success(&bed.restatus("memory://", "c", &["completion", shell]), shell);
    }
    let version = bed.restatus("memory://", "c", &["--version"]);
    assert_success(&version, "--version");
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git");
    let commit = String::from_utf8_lossy(&head.stdout).trim().to_string();
    assert_eq!(
        stdout(&version).trim(),
        format!("restatus {} (commit {commit})", env!("CARGO_PKG_VERSION")),
        "built from this checkout's HEAD"
    );
}

#[tokio::test]
async fn restore_and_backup_log_progress_without_colours_when_stderr_is_a_pipe() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let (source, target) = (bed.source().await, bed.target().await);
    let spec = FleetSpec::new(&unique("prog"), 20, 20, 5);
    fleet::create(&source, &spec, 8).await.expect("create fleet");
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage("progress");
    let backup = bed.restatus(&storage, "prog", &["backup", "--selector", &selector]);
    assert_success(&backup, "backup");
    let log = stderr(&backup);
    assert!(log.contains(&format!("backup progress: {} objects", spec.total())), "{log}");
    assert!(!log.contains('\x1b'), "ANSI escape codes in a piped log: {log:?}");

    simulate_move(&source, &target, &spec.name, &|n| n.to_string()).await;
    let restore = bed.restatus_with(
        &bed.target_kubeconfig,
        &storage,
        "prog",
        &["restore", "--selector", &selector, "--progress-interval", "1ms", "--concurrency", "4"],
        &[],
    );
    assert_success(&restore, "restore");
    let log = stderr(&restore);
    let total = spec.total();
    assert!(log.contains(&format!("restore progress: {total}/{total} objects (100%)")), "{log}");
    let periodic = log.lines().filter(|l| l.contains("restore progress: ") && !l.contains("(done)")).count();
    assert!(periodic >= 1, "no periodic progress line with --progress-interval 1ms: {log}");
    assert!(!log.contains("\x1b["), "ANSI escape codes in a piped log: {log:?}");
}
