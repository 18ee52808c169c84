//! The `restatus` binary on a `file://` storage (no cluster needed): every `snapshots` command's
//! `-o json` and `-o yaml` is one document that parses, `snapshots delete` end to end, and usage
//! errors (exit 2) as a JSON line with `--log-format json`. The commands that need a cluster
//! (backup, preflight, restore) are checked the same way in `e2e/cli.rs`.

use std::path::Path;
use std::process::{Command, Output};

use restatus::fixtures::{append_segment, server, snapshot, ts};
use restatus::format::{Manifest, Record};
use restatus::store::SnapshotStore;
use serde_json::Value;

/// Writes a snapshot the way a backup does (payload, then manifest) with `records` Servers.
async fn write(store: &SnapshotStore, at: &str, records: usize, state: &str) -> Manifest {
    let records: Vec<Record> = (0..records).map(|i| server(i, &format!(r#"{{"state":"{state}"}}"#))).collect();
    snapshot(&records).at(ts(at)).profile("test").write(store).await
}

/// Runs the binary with `args` and nothing from this environment (no `RESTATUS_*`).
fn restatus(storage: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_restatus"));
    cmd.env_clear().args(["--storage", storage, "--cluster-id", "c"]).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run restatus")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Parses stdout as one document of `format`; JSON must be pretty-printed.
fn document(out: &Output, format: &str, what: &str) -> Value {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{what} -o {format}: {stderr}");
    match format {
        "json" => {
            assert!(stdout.trim_end().contains('\n'), "{what}: pretty JSON: {stdout}");
            serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{what}: not one JSON document ({e}): {stdout}"))
        }
        _ => serde_saphyr::from_str(&stdout).unwrap_or_else(|e| panic!("{what}: not YAML ({e}): {stdout}")),
    }
}

fn file_storage(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

#[tokio::test]
async fn every_snapshots_command_prints_one_document_that_parses_in_json_and_yaml() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = file_storage(tmp.path());
    let store = SnapshotStore::open(&storage, "c").unwrap();
    let first = write(&store, "2026-11-30T08:00:00Z", 3, "Available").await;
    write(&store, "2026-11-30T09:00:00Z", 3, "Reserved").await;
    let newest = write(&store, "2026-11-30T10:00:00Z", 2, "Reserved").await;
    let (first, newest) = (first.snapshot_id.to_string(), newest.snapshot_id.to_string());
    for format in ["json", "yaml"] {
        let run = |args: &[&str]| {
            let mut args = args.to_vec();
            args.extend(["-o", format]);
            document(&restatus(&storage, &args, &[]), format, &args.join(" "))
        };
        assert_eq!(run(&["snapshots", "list"]).as_array().map(Vec::len), Some(3));
        assert_eq!(run(&["snapshots", "clusters"])[0]["newest"], newest.as_str());
        assert_eq!(run(&["snapshots", "show", "latest"])["snapshotId"], newest.as_str());
        assert_eq!(run(&["snapshots", "show", &first, "--objects"]).as_array().map(Vec::len), Some(3));
        let diff = run(&["snapshots", "diff", &first, "latest"]);
        assert_eq!(
            (diff["changed"].as_array().map(Vec::len), diff["onlyInA"].as_array().map(Vec::len)),
            (Some(2), Some(1))
        );
        let verify = run(&["snapshots", "verify", "latest"]);
        assert_eq!((&verify["snapshot"], &verify["ok"]), (&Value::from(newest.as_str()), &Value::Bool(true)));
        let plan = run(&["snapshots", "prune", "--keep-last", "2", "--dry-run"]);
        assert_eq!(plan["dryRun"], true);
        assert_eq!(plan["deletions"][0]["id"], first.as_str(), "{plan}");
        assert_eq!(plan["deletions"][0]["reason"], "beyond the newest 2");
    }
    assert_eq!(store.list().await.unwrap().len(), 3, "a dry run deletes nothing");

    // The table: prune's lines on stderr, as before; stdout empty.
    let table = restatus(&storage, &["snapshots", "prune", "--keep-last", "2", "--dry-run"], &[]);
    assert!(table.stdout.is_empty() && text(&table.stderr).contains(&format!("would delete {first}")));

    let pruned =
        document(&restatus(&storage, &["snapshots", "prune", "--keep-last", "2", "-o", "yaml"], &[]), "yaml", "prune");
    assert_eq!((&pruned["dryRun"], &pruned["deletions"][0]["id"]), (&Value::Bool(false), &Value::from(first.as_str())));
    assert_eq!(store.list().await.unwrap().len(), 2);
}

/// F92, B62, B63 through the binary: what was deleted is said (a table line or a document), the
/// newest snapshot is kept without --force, `latest` is a usage error and a missing id exit 1.
#[tokio::test]
async fn snapshots_delete_says_what_it_deleted_and_refuses_the_newest_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = file_storage(tmp.path());
    let store = SnapshotStore::open(&storage, "c").unwrap();
    let first = write(&store, "2026-11-30T08:00:00Z", 3, "Available").await.snapshot_id.to_string();
    let second = write(&store, "2026-11-30T09:00:00Z", 3, "Reserved").await.snapshot_id.to_string();
    let newest = write(&store, "2026-11-30T10:00:00Z", 3, "Reserved").await.snapshot_id.to_string();

    let deleted = document(&restatus(&storage, &["snapshots", "delete", &first, "-o", "json"], &[]), "json", "delete");
    assert_eq!(deleted["snapshot"], first.as_str());
    assert!(deleted["url"].as_str().is_some_and(|u| u.ends_with(&format!("/c/{first}/"))), "{deleted}");
    let names: Vec<&str> = deleted["files"].as_array().unwrap().iter().filter_map(|f| f["name"].as_str()).collect();
    assert_eq!(names, ["manifest.json", "payload.jsonl.zst"]);
    assert!(!tmp.path().join("c").join(&first).join("payload.jsonl.zst").exists());

    let table = restatus(&storage, &["snapshots", "delete", &second], &[]);
    assert_eq!(table.status.code(), Some(0), "{}", text(&table.stderr));
    let line = text(&table.stdout);
    assert!(line.starts_with(&format!("deleted snapshot {second} (")) && line.contains("manifest.json ("), "{line}");

    let refused = restatus(&storage, &["snapshots", "delete", &newest], &[]);
    let err = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("snapshot {newest}: not deleted: it is the newest complete")), "{err}");
    assert_eq!(err.matches("not deleted").count(), 1, "printed once: {err}");
    let latest = restatus(&storage, &["snapshots", "delete", "latest"], &[]);
    assert_eq!(latest.status.code(), Some(2), "a usage error: {}", text(&latest.stderr));
    assert!(text(&latest.stderr).contains("`latest` is not taken here"), "{}", text(&latest.stderr));
    let missing = restatus(&storage, &["snapshots", "delete", &first], &[]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains(&format!("snapshot {first}: not deleted: no such snapshot")));
    assert_eq!(store.list().await.unwrap().len(), 1, "the newest is left");

    let forced = document(
        &restatus(&storage, &["snapshots", "delete", &newest, "--force", "-o", "yaml"], &[]),
        "yaml",
        "delete --force",
    );
    assert_eq!((&forced["snapshot"], &forced["forced"]), (&Value::from(newest.as_str()), &Value::Bool(true)));
    assert!(store.list().await.unwrap().is_empty());
}

/// B64: a command line the parser refuses exits 2; with `--log-format json` (or
/// `RESTATUS_LOG_FORMAT=json`) its error is one JSON log line, so stderr stays JSON lines.
#[test]
fn a_usage_error_is_a_json_line_with_json_logs() {
    let json_line = |out: &Output, what: &str| -> Value {
        assert_eq!(out.status.code(), Some(2), "{what}: {}", text(&out.stderr));
        let lines: Vec<Value> = text(&out.stderr)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: stderr line not JSON ({e}): {l}")))
            .collect();
        assert_eq!(lines.len(), 1, "{what}: one line: {lines:?}");
        assert_eq!(lines[0]["level"], "ERROR", "{what}");
        lines.into_iter().next().unwrap()
    };
    let bad = ["snapshots", "list", "--bogus"];
    let flag: Vec<&str> = ["--log-format", "json"].into_iter().chain(bad).collect();
    let line = json_line(&restatus("memory://", &flag, &[]), "--log-format json");
    let error = line["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("unexpected argument '--bogus' found") && error.contains("Usage:"), "{line}");
    let line = json_line(&restatus("memory://", &bad, &[("RESTATUS_LOG_FORMAT", "json")]), "RESTATUS_LOG_FORMAT");
    assert!(line["error"].as_str().unwrap_or_default().contains("--bogus"), "{line}");
    let line = json_line(
        &restatus("memory://", &["--log-format=json", "snapshots", "delete", "latest"], &[]),
        "delete latest",
    );
    assert!(line["error"].as_str().unwrap_or_default().contains("`latest` is not taken here"), "{line}");

    // Plain logs: clap's own message, exit 2, as before; --help still prints to stdout, exit 0.
    let plain = restatus("memory://", &bad, &[]);
    assert_eq!(plain.status.code(), Some(2));
    assert!(text(&plain.stderr).starts_with("error: unexpected argument '--bogus'"), "{}", text(&plain.stderr));
    let help = restatus("memory://", &["--log-format", "json", "--help"], &[]);
    assert_eq!(help.status.code(), Some(0));
    let help = text(&help.stdout);
    assert!(help.contains("2 the command line was not understood") && help.contains("3 backup"), "{help}");
}

/// Appends a segment of `records` (tombstones for `gone`) to `base`'s chain, `secs` after its
/// point.
async fn append(store: &SnapshotStore, base: &Manifest, records: &[Record], gone: &[Record], secs: i64) {
    let mut all: Vec<Record> = records.to_vec();
    all.extend(gone.iter().map(restatus::format::tombstone));
    append_segment(store, base, &all, secs, true).await;
}

/// Item 2 of issue 23: `snapshots show` and `diff` read chains. By default the newest complete
/// point (named: base + segments, time), `--at` an earlier one, `ID@TIME` one per side of a
/// diff, `--no-journal` the snapshot alone; the table names the point. B30-B33: a time that is
/// not RFC 3339 after `@` (exit 1, named) or in `--at` (exit 2), `--at` with `--no-journal`
/// (exit 2), `latest@TIME` before every snapshot (exit 1, said so), `journal --max-segments 0`
/// (exit 2).
#[tokio::test]
async fn snapshots_show_and_diff_read_the_journal_to_a_point() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = file_storage(tmp.path());
    let store = SnapshotStore::open(&storage, "c").unwrap();
    let base = write(&store, "2026-11-30T09:00:00Z", 3, "Available").await;
    append(&store, &base, &[server(1, r#"{"state":"Reserved"}"#)], &[], 5).await;
    let first_to = "2026-11-30T09:00:05Z"; // the first segment's point: 5 s after the base's
    append(&store, &base, &[server(9, r#"{"state":"Initial"}"#)], &[server(0, "{}")], 5).await;
    let id = base.snapshot_id.to_string();
    let run = |args: &[&str]| {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        document(&restatus(&storage, &args, &[]), "json", &args.join(" "))
    };
    let shown = run(&["snapshots", "show", &id]);
    assert_eq!(shown["snapshotId"], id.as_str());
    let point = &shown["journalPoint"];
    assert_eq!((&point["segmentsApplied"], &point["segmentsVerified"]), (&Value::from(2), &Value::from(2)), "{shown}");
    assert_eq!(point["time"], "2026-11-30T09:00:10Z");
    assert!(run(&["snapshots", "show", &id, "--no-journal"]).get("journalPoint").is_none());
    assert_eq!(run(&["snapshots", "show", &id, "--at", first_to])["journalPoint"]["segmentsApplied"], 1);
    let names = |rows: Value| -> Vec<String> {
        rows.as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap_or_default().to_string()).collect()
    };
    assert_eq!(names(run(&["snapshots", "show", &id, "--objects"])), ["server-1", "server-2", "server-9"]);
    assert_eq!(
        names(run(&["snapshots", "show", &id, "--objects", "--no-journal"])),
        ["server-0", "server-1", "server-2"]
    );

    // The chain's point against the base alone: what the journal added.
    let alone = format!("{id}@2026-11-30T09:00:00Z");
    let diff = run(&["snapshots", "diff", &id, &alone]);
    let count = |field: &str| diff[field].as_array().map(Vec::len);
    assert_eq!((count("changed"), count("onlyInA"), count("onlyInB")), (Some(1), Some(1), Some(1)), "{diff}");
    assert_eq!(
        (&diff["aPoint"]["segmentsApplied"], &diff["bPoint"]["segmentsApplied"]),
        (&Value::from(2), &Value::from(0))
    );
    let same = run(&["snapshots", "diff", &id, &alone, "--no-journal"]);
    assert_eq!(same["changed"].as_array().map(Vec::len), Some(0), "{same}");

    // The table names the point.
    let table = text(&restatus(&storage, &["snapshots", "show", &id], &[]).stdout);
    assert!(
        table.contains(&format!(
            "Journal point: base {id} + 2 of 2 verified segments, at 2026-11-30T09:00:10Z (consistent)"
        )),
        "{table}"
    );

    // Bad inputs.
    let bad = restatus(&storage, &["snapshots", "show", &format!("{id}@yesterday")], &[]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stderr).contains(r#""yesterday" is not a time (RFC 3339)"#), "{}", text(&bad.stderr));
    assert_eq!(restatus(&storage, &["snapshots", "show", &id, "--at", "yesterday"], &[]).status.code(), Some(2));
    let both = restatus(&storage, &["snapshots", "show", &id, "--at", first_to, "--no-journal"], &[]);
    assert_eq!(both.status.code(), Some(2), "{}", text(&both.stderr));
    let before = restatus(&storage, &["snapshots", "show", "latest@2020-01-01T00:00:00Z"], &[]);
    assert_eq!(before.status.code(), Some(1));
    assert!(text(&before.stderr).contains("no complete snapshot captured at or before 2020-01-01T00:00:00Z"));
    let zero = restatus(&storage, &["journal", "--max-segments", "0"], &[]);
    assert_eq!(zero.status.code(), Some(2), "{}", text(&zero.stderr));
}

/// B36: `-o jsonl` is a restore's only (it streams one line per object); every other command
/// refuses it as a usage error, exit 2, naming the formats it takes. The restore takes it.
#[test]
fn only_a_restore_takes_jsonl() {
    for args in [
        &["snapshots", "list", "-o", "jsonl"][..],
        &["backup", "-o", "jsonl"],
        &["preflight", "-o", "jsonl"],
        &["snapshots", "verify", "x", "-o", "jsonl"],
    ] {
        let out = restatus("memory://", args, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("invalid value 'jsonl'") && stderr.contains("[possible values: table, json, yaml]"),
            "{args:?}: {stderr}"
        );
    }
    let help = restatus("memory://", &["restore", "--help"], &[]);
    assert!(text(&help.stdout).contains("jsonl"), "{}", text(&help.stdout));
    // Parsed, then refused for want of a cluster (exit 1), not as a usage error.
    let out = restatus("memory://", &["restore", "-o", "jsonl", "--kubeconfig", "/nonexistent"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty(), "nothing on stdout: {}", text(&out.stdout));
}

/// F150: a private key given where a path (or a public key) is expected, as people do it
/// (`RESTATUS_DECRYPTION_KEY="$(grep AGE-SECRET …)"`, `--signing-key "$(cat k.key)"`,
/// `--encrypt-to AGE-SECRET-KEY-…`), through each key-taking flag in each of its forms (`--flag
/// VALUE`, `--flag=VALUE`, its environment variable), plain and with JSON logs: the command
/// fails naming the flag, and stderr holds no line of the key (before: the whole key, quoted by
/// clap as an unexpected argument or by the key loader as a file that cannot be read).
#[test]
fn a_key_given_as_a_value_is_refused_naming_the_flag_never_the_key() {
    use restatus::format::{DecryptionKeys, SigningKey};
    let tmp = tempfile::tempdir().unwrap();
    let storage = file_storage(tmp.path());
    let pem = SigningKey::generate().to_pem().unwrap();
    let (age_file, _) = DecryptionKeys::generate(ts("2026-11-30T10:00:00Z"));
    let age = age_file.lines().find(|l| l.starts_with("AGE-SECRET-KEY-")).unwrap().to_string();
    // What must never be printed: the age key, and every line of the PEM's base64.
    let secrets: Vec<&str> =
        std::iter::once(age.as_str()).chain(pem.lines().filter(|l| !l.starts_with("-----"))).collect();
    assert!(secrets.len() >= 2);
    // (command, flag, environment variable, key, what the error says besides the flag)
    let cases = [
        (&["backup"][..], "--signing-key", "RESTATUS_SIGNING_KEY", pem.as_str(), "not repeated"),
        (&["backup"], "--signing-key", "RESTATUS_SIGNING_KEY", age.as_str(), "not repeated"),
        (&["backup"], "--encrypt-to", "RESTATUS_ENCRYPT_TO", age.as_str(), "takes public keys"),
        (&["snapshots", "list"], "--decryption-key", "RESTATUS_DECRYPTION_KEY", age.as_str(), "not repeated"),
        (&["snapshots", "list"], "--trusted-key", "RESTATUS_TRUSTED_KEYS", pem.as_str(), "takes public keys"),
    ];
    for (command, flag, env, key, says) in cases {
        let spaced = [command, &[flag, key]].concat();
        let joined_arg = format!("{flag}={key}");
        let joined = [command, &[joined_arg.as_str()]].concat();
        for (how, args, vars) in [
            ("--flag VALUE", spaced, vec![]),
            ("--flag=VALUE", joined, vec![]),
            (env, command.to_vec(), vec![(env, key)]),
        ] {
            for json in [false, true] {
                let args = match json {
                    true => [&["--log-format", "json"][..], &args].concat(),
                    false => args.clone(),
                };
                let out = restatus(&storage, &args, &vars);
                let stderr = text(&out.stderr);
                let what = format!("{command:?} {flag} as {how} (json logs: {json})");
                assert!(matches!(out.status.code(), Some(1 | 2)), "{what}: fails: {stderr}");
                for secret in &secrets {
                    assert!(!stderr.contains(secret), "{what}: key material in stderr:\n{stderr}");
                }
                assert!(stderr.contains(flag), "{what}: names the flag: {stderr}");
                // clap sees a value starting with `-` as an argument of its own: then the
                // message is the usage error's (exit 2), naming the flag before it.
                let says = if how == "--flag VALUE" && key.starts_with('-') { "not repeated" } else { says };
                assert!(stderr.contains(says), "{what}: says {says:?}: {stderr}");
                assert!(out.stdout.is_empty(), "{what}: nothing on stdout");
            }
        }
    }
}
