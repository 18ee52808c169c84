//! The CLI as a person uses it, on the test bed: `snapshots clusters`, `show --objects`,
//! `diff`, `-o yaml`, `completion`, `--version`, a restore whose log (stderr piped) has
//! progress lines and no colour codes, `-o json|yaml` of backup, preflight and restore, and
//! `snapshots delete` on S3.

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

/// Every error is printed once, and with `--log-format json` stderr is pure JSON lines: a
/// succeeding backup (its progress lines too) and a failing command (its final error too).
#[tokio::test]
async fn errors_print_once_and_json_logs_keep_stderr_pure_json() {
    let bed = Bed::get();
    let cluster = unique("json-logs");
    let every_line_json = |out: &std::process::Output, what: &str| -> Vec<Value> {
        let err = stderr(out);
        let lines: Vec<Value> = err
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: stderr line not JSON ({e}): {l}")))
            .collect();
        assert!(!lines.is_empty(), "{what}: logs something");
        lines
    };

    // Of nothing: a backup of the whole source would be inconsistent (exit 3) while another
    // test creates its fleet there.
    let selector = format!("restatus.test/none={cluster}");
    let backup = bed.restatus("memory://", &cluster, &["--log-format", "json", "backup", "--selector", &selector]);
    assert_success(&backup, "backup --log-format json");
    let id = stdout(&backup).trim().to_string();
    let written = every_line_json(&backup, "backup");
    // It says where it wrote: the snapshot's URL and id.
    let url = format!("/{cluster}/{id}/");
    assert!(
        written.iter().any(|l| l["snapshot"] == id.as_str() && l["url"].as_str().is_some_and(|u| u.ends_with(&url))),
        "backup names {url}: {}",
        stderr(&backup)
    );

    let missing = "/nonexistent/restatus-trusted.pub";
    let args = ["--trusted-key", missing, "snapshots", "list"];
    let json_args: Vec<&str> = ["--log-format", "json"].into_iter().chain(args).collect();
    let failed = bed.restatus("memory://", &cluster, &json_args);
    assert_eq!(failed.status.code(), Some(1), "a failure exits 1: {}", stderr(&failed));
    let lines = every_line_json(&failed, "failing command");
    let errors: Vec<&Value> = lines.iter().filter(|l| l["level"] == "ERROR").collect();
    assert_eq!(errors.len(), 1, "the error once: {}", stderr(&failed));
    assert!(errors[0]["error"].as_str().is_some_and(|e| e.contains(missing)), "names the file: {}", stderr(&failed));

    let plain = bed.restatus("memory://", &cluster, &args);
    assert_eq!(plain.status.code(), Some(1));
    let err = stderr(&plain);
    assert_eq!(err.matches(missing).count(), 1, "the error once: {err}");
    assert_eq!(err.matches("error:").count(), 1, "one error line: {err}");
}

/// Reading commands on a `file://` storage that does not exist fail with a clear error and
/// create nothing.
#[tokio::test]
async fn reading_commands_never_create_a_missing_local_storage() {
    let bed = Bed::get();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("no-such-storage");
    let storage = format!("file://{}", dir.display());
    for args in [
        &["snapshots", "list"][..],
        &["snapshots", "show", "latest"],
        &["snapshots", "verify", "latest"],
        &["snapshots", "clusters"],
        &["restore", "--dry-run"],
    ] {
        let out = bed.restatus(&storage, "c", args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("does not exist"), "{args:?}: {}", stderr(&out));
        assert!(!dir.exists(), "{args:?} created {}", dir.display());
    }
}

/// An S3 call without credentials says that none were found and where they are looked for,
/// once, instead of the instance metadata error repeated.
#[tokio::test]
async fn s3_without_credentials_says_where_credentials_are_looked_for() {
    let bed = Bed::get();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_restatus"))
        .args(["--storage", &bed.storage("no-credentials"), "snapshots", "list"])
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .output()
        .expect("run restatus");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("no S3 credentials found").count(), 1, "{err}");
    for place in ["AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "instance metadata"] {
        assert!(err.contains(place), "{place}: {err}");
    }
    assert!(err.matches("169.254.169.254").count() <= 1, "the metadata error is not repeated: {err}");
}

/// `-o json` and `-o yaml` of the commands that need a cluster (backup, preflight, restore) are
/// one document each that parses (JSON pretty-printed), backup's exit code unchanged; and F92
/// on the real S3: `snapshots delete` removes one snapshot's objects, says which, and keeps the
/// newest without --force. (The `snapshots` commands' documents: `tests/cli.rs`.)
#[tokio::test]
async fn every_command_that_reports_prints_one_document_and_delete_works_on_s3() {
    let bed = Bed::get();
    let client = bed.source().await;
    let spec = FleetSpec::new(&unique("docs"), 3, 3, 1);
    fleet::create(&client, &spec, 8).await.expect("create fleet");
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = bed.storage("docs");
    let cluster = "docs";
    let document = |args: &[&str], format: &str, codes: &[i32]| -> Value {
        let mut args = args.to_vec();
        args.extend(["--selector", &selector, "-o", format]);
        let out = bed.restatus(&storage, cluster, &args);
        assert!(out.status.code().is_some_and(|c| codes.contains(&c)), "{args:?}: {:?} {}", out.status, stderr(&out));
        let text = stdout(&out);
        match format {
            "json" => {
                assert!(text.trim_end().contains('\n'), "{args:?}: pretty JSON: {text}");
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: not one JSON document ({e}): {text}"))
            }
            _ => serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: not YAML ({e}): {text}")),
        }
    };
    let first = document(&["backup"], "json", &[0]);
    let id = first["snapshot"].as_str().expect("the snapshot's id").to_string();
    assert!(first["url"].as_str().is_some_and(|u| u.starts_with("s3://") && u.ends_with(&format!("/{cluster}/{id}/"))));
    assert_eq!(first["records"].as_u64(), Some(spec.total() as u64), "{first}");
    assert_eq!((&first["consistency"], &first["exitCode"]), (&json!("consistent"), &json!(0)), "{first}");
    assert!(first.get("retention").is_none(), "no policy, no retention: {first}");
    let second = document(&["backup", "--keep-last", "5"], "yaml", &[0]);
    assert_eq!(second["retention"], json!({"dryRun": false, "deletions": [], "kept": []}), "{second}");
    let newest = second["snapshot"].as_str().unwrap().to_string();

    for format in ["json", "yaml"] {
        let preflight = document(&["preflight"], format, &[0, 1]);
        assert!(preflight["ready"].is_boolean() && preflight["blockers"].is_array(), "{preflight}");
        let restore = document(&["restore", "--dry-run", "--allow-same-cluster"], format, &[0]);
        assert_eq!((&restore["snapshot"], &restore["dryRun"]), (&json!(newest), &json!(true)), "{restore}");
        assert_eq!(restore["writes"], 0);
    }

    let store = bed.store(&storage, cluster);
    let deleted = json_of(&bed.restatus(&storage, cluster, &["snapshots", "delete", &id, "-o", "json"]), "delete");
    let names: Vec<&str> = deleted["files"].as_array().unwrap().iter().filter_map(|f| f["name"].as_str()).collect();
    assert_eq!(names, ["manifest.json", "payload.jsonl.zst"], "{deleted}");
    let parsed: restatus::format::SnapshotId = id.parse().unwrap();
    assert!(store.files(&parsed).await.unwrap().is_empty(), "nothing left of {id} in S3");
    let refused = bed.restatus(&storage, cluster, &["snapshots", "delete", &newest]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(stderr(&refused).contains(&format!("snapshot {newest}: not deleted: it is the newest complete")));
    let left: Vec<String> = store.list().await.unwrap().into_iter().map(|e| e.id.to_string()).collect();
    assert_eq!(left, [newest]);
}
