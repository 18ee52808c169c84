//! The chart as people deploy charts (issue 39, item 7): as a subchart of a parent chart with
//! `global` values; `serviceAccount.create/name`, `priorityClassName`, `extraObjects`, the
//! PodDisruptionBudgets' `unhealthyPodEvictionPolicy` and the checksum of a chart-made Secret;
//! and kustomize's role folders, which never overwrite a Secret the user made.

use super::*;

/// `objects` of `kind` whose name ends with `suffix`.
fn named<'a>(objects: &'a [Value], kind: &str, suffix: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind && o["metadata"]["name"].as_str().unwrap().ends_with(suffix)).collect()
}

/// restatus as the subchart of a parent chart, which sets `global` (helm hands it to every
/// subchart, and a schema without `global` refused the install) and restatus's values under
/// `restatus:`; rendered with a `--set global...` too.
#[test]
fn chart_renders_as_a_subchart_with_global_values() {
    let parent = tempfile::tempdir().expect("temp dir");
    let charts = parent.path().join("charts");
    std::fs::create_dir_all(&charts).unwrap();
    assert_success(&run(Path::new("cp"), &["-r", CHART, charts.to_str().unwrap()]), "copy the chart");
    std::fs::write(
        parent.path().join("Chart.yaml"),
        "apiVersion: v2\nname: platform\nversion: 1.0.0\ndependencies:\n  - name: restatus\n    version: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        parent.path().join("values.yaml"),
        "global:\n  imageRegistry: registry.example.com\n  storageClass: fast\n\
         restatus:\n  storage: s3://b/p\n  clusterId: mgmt-eu1\n  controller:\n    enabled: true\n    restoreFrom: mgmt-eu0\n",
    )
    .unwrap();
    let dir = parent.path().to_str().unwrap();
    let args = ["template", "platform", dir, "--namespace", "ops", "--kube-version", KUBE_VERSION];
    let out = run(&tool("helm"), &[&args[..], &["--set", "global.team=metal"]].concat());
    assert_success(&out, "helm template of a parent chart with restatus as its subchart");
    let rendered = objects(&stdout(&out));
    find(&rendered, "CronJob", "platform-restatus-backup");
    find(&rendered, "Deployment", "platform-restatus-controller");
    assert!(rendered.iter().all(|o| o["metadata"]["namespace"].is_null() || o["metadata"]["namespace"] == "ops"));
    assert_success(&run(&tool("helm"), &["lint", "--strict", dir]), "helm lint of the parent chart");
    println!("as a subchart with global values: {} objects", rendered.len());
}

/// `serviceAccount.create=false` with a name: no ServiceAccount made, and everything that binds
/// one (the pods, the ClusterRoleBinding, the Lease's RoleBinding, the admission policy's match)
/// names that one. A name for several roles at once, or `default`, fails at render.
#[test]
fn chart_service_account_create_and_name() {
    let controller_only = only("controller");
    let controller = sets(&controller_only);
    let rendered = objects(&render(
        "r",
        &[&controller[..], &["serviceAccount.create=false", "serviceAccount.name=ops-restatus"]].concat(),
    ));
    assert!(named(&rendered, "ServiceAccount", "").is_empty(), "{:?}", kinds(&rendered));
    assert_eq!(pod_spec(&rendered, "Deployment", "controller")["serviceAccountName"], "ops-restatus");
    for (kind, name) in
        [("ClusterRoleBinding", "r-restatus-controller"), ("RoleBinding", "r-restatus-controller-lease")]
    {
        let subjects = &find(&rendered, kind, name)["subjects"];
        assert_eq!(subjects, &json!([{"kind": "ServiceAccount", "name": "ops-restatus", "namespace": "r"}]), "{kind}");
    }
    let policy = find(&rendered, "ValidatingAdmissionPolicy", "r-restatus-controller-annotations-only");
    let matched = policy["spec"]["matchConditions"][0]["expression"].as_str().unwrap();
    assert!(matched.contains("endsWith(':ops-restatus')"), "{matched}");

    // A role's own name and create; the others keep theirs.
    let source_only = only("source");
    let two = [&sets(&source_only)[..], &["backup.enabled=true", "source.serviceAccount.name=handshake"]].concat();
    let rendered = objects(&render("r", &two));
    let accounts: Vec<&str> = rendered
        .iter()
        .filter(|o| o["kind"] == "ServiceAccount")
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(accounts, ["r-restatus-backup", "handshake"]);
    assert_eq!(pod_spec(&rendered, "Deployment", "source")["serviceAccountName"], "handshake");
    assert_eq!(pod_spec(&rendered, "CronJob", "backup")["serviceAccountName"], "r-restatus-backup");

    let required: Vec<&str> = REQUIRED.to_vec();
    let err = render_fails(&[&required[..], &two, &["serviceAccount.name=shared"]].concat());
    assert!(err.contains("set backup.serviceAccount.name, source.serviceAccount.name instead"), "{err}");
    let err = render_fails(&[&required[..], &controller[..], &["controller.serviceAccount.name=default"]].concat());
    assert!(err.contains(r#"the ServiceAccount "default" is every namespace's"#), "{err}");
}

/// `priorityClassName` for every role, a role's own replacing it; `extraObjects` as maps and
/// strings, templated; the PodDisruptionBudgets' `unhealthyPodEvictionPolicy` (AlwaysAllow by
/// default, accepted by the test bed's API server).
#[tokio::test]
async fn chart_priority_class_extra_objects_and_unhealthy_pod_eviction_policy() {
    let all: Vec<String> =
        ["backup", "controller", "source", "journal"].iter().map(|r| format!("{r}.enabled=true")).collect();
    let rendered = objects(&render(
        "r",
        &[&sets(&all)[..], &["priorityClassName=ops-high", "controller.priorityClassName=ops-critical"]].concat(),
    ));
    for (kind, role, class) in [
        ("CronJob", "backup", "ops-high"),
        ("Deployment", "controller", "ops-critical"),
        ("Deployment", "source", "ops-high"),
        ("Deployment", "journal", "ops-high"),
    ] {
        assert_eq!(pod_spec(&rendered, kind, role)["priorityClassName"], class, "{role}");
    }
    let none = objects(&render("r", &sets(&all)));
    assert!(pod_spec(&none, "Deployment", "controller").get("priorityClassName").is_none());

    let extra = r#"extraObjects=[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{{ .Release.Name }}-extra"},"data":{"ns":"{{ .Release.Namespace }}"}},"apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata:\n  name: ops-high\nvalue: 1000"]"#;
    let rendered = objects(&render_with("r", &["--set-json", extra]));
    assert_eq!(find(&rendered, "ConfigMap", "r-extra")["data"]["ns"], "r");
    assert_eq!(find(&rendered, "PriorityClass", "ops-high")["value"], 1000);

    let two = ["controller.enabled=true", "source.enabled=true"];
    for (set, want) in
        [(None, Some("AlwaysAllow")), (Some("IfHealthyBudget"), Some("IfHealthyBudget")), (Some(""), None)]
    {
        let policy: Vec<String> = set
            .map(|v| {
                ["controller", "source"]
                    .iter()
                    .map(|r| format!("{r}.podDisruptionBudget.unhealthyPodEvictionPolicy={v}"))
                    .collect()
            })
            .unwrap_or_default();
        let rendered = objects(&render("r", &[&two[..], &sets(&policy)].concat()));
        for role in ["controller", "source"] {
            let pdb = find(&rendered, "PodDisruptionBudget", &format!("r-restatus-{role}"));
            assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"].as_str(), want, "{set:?}: {pdb}");
        }
    }
    // The API server takes it: the rendered budget, applied server-side without storing it.
    let bed = Bed::get();
    let rendered = render("default", &two);
    let pdb = objects(&rendered).into_iter().find(|o| o["kind"] == "PodDisruptionBudget").expect("a budget");
    let file = bed.scratch.path().join("pdb.json");
    std::fs::write(&file, pdb.to_string()).unwrap();
    let out =
        bed.kubectl(&bed.source_kubeconfig, &["apply", "--dry-run=server", "-o", "json", "-f", file.to_str().unwrap()]);
    assert_success(&out, "server-side dry run of the PodDisruptionBudget");
    let answered: Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(answered["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow", "{answered}");
}

/// A Secret the chart makes (`s3.accessKeyId`/`secretAccessKey`) is checksummed into the pods
/// of every Deployment that reads it, so that changing a key rolls them; a role with a Secret
/// of its own, or a user's Secret, gets no checksum.
#[test]
fn chart_pods_roll_when_the_chart_made_secret_changes() {
    const ANNOTATION: &str = "restatus.ironcore.dev/s3-secret-sha256";
    let roles = ["controller.enabled=true", "source.enabled=true", "journal.enabled=true"];
    let checksums = |extra: &[&str]| -> Vec<Option<String>> {
        let rendered = objects(&render("r", &[&roles[..], extra].concat()));
        ["controller", "source", "journal"]
            .iter()
            .map(|role| {
                let deployment = named(&rendered, "Deployment", role)[0];
                deployment["spec"]["template"]["metadata"]["annotations"][ANNOTATION].as_str().map(str::to_string)
            })
            .collect()
    };
    let keys = |secret: &str| [format!("s3.accessKeyId=AKIA-{secret}"), format!("s3.secretAccessKey={secret}")];
    let (first, second) = (keys("one"), keys("two"));
    let one = checksums(&sets(&first));
    let two = checksums(&sets(&second));
    assert!(one.iter().all(Option::is_some), "{one:?}");
    assert!(one.iter().zip(&two).all(|(a, b)| a != b), "a changed key changes every checksum: {one:?} {two:?}");
    assert_eq!(one, checksums(&sets(&first)), "the same keys, the same checksum");
    // The controller with read-only keys of its own reads no chart-made Secret.
    let own = checksums(&[&sets(&first)[..], &["controller.existingSecret=ro"]].concat());
    assert_eq!((own[0].is_none(), own[1].is_some()), (true, true), "{own:?}");
    assert!(checksums(&["s3.existingSecret=mine"]).iter().all(Option::is_none));
}

/// No role's kustomize folder holds a Secret: `kubectl apply -k` of the backup (source cluster)
/// and the controller (target) leaves the S3 Secrets the user made as they were (the example
/// Secrets overwrote their keys with `replace-me`); the examples build on their own.
#[tokio::test]
async fn kustomize_apply_keeps_the_users_secrets() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    for dir in ["backup", "controller", "source", "journal"] {
        let built = kustomize(&bed, dir);
        assert!(!built.iter().any(|o| o["kind"] == "Secret"), "manifests/{dir} holds a Secret: {:?}", kinds(&built));
    }
    for (dir, secret) in [("s3-credentials", "restatus-s3"), ("s3-readonly-credentials", "restatus-s3-readonly")] {
        let built = kustomize(&bed, &format!("examples/{dir}"));
        assert_eq!(kinds(&built), [format!("Secret \"{secret}\"")]);
    }
    let mine = unique("mine");
    for (kubeconfig, dir, secret) in [
        (&bed.source_kubeconfig, "backup", "restatus-s3"),
        (&bed.target_kubeconfig, "controller", "restatus-s3-readonly"),
    ] {
        let kubectl = |args: &[&str]| bed.kubectl(kubeconfig, args);
        let _ = kubectl(&["create", "namespace", "restatus"]);
        let _ = kubectl(&["-n", "restatus", "delete", "secret", secret, "--ignore-not-found"]);
        let key = format!("--from-literal=AWS_ACCESS_KEY_ID={mine}");
        let created = kubectl(&[
            "-n",
            "restatus",
            "create",
            "secret",
            "generic",
            secret,
            &key,
            "--from-literal=AWS_SECRET_ACCESS_KEY=s",
        ]);
        assert_success(&created, "create the user's Secret");
        let path = format!("{}/manifests/{dir}", env!("CARGO_MANIFEST_DIR"));
        assert_success(&kubectl(&["apply", "-k", &path]), &format!("apply -k manifests/{dir}"));
        let out = kubectl(&["-n", "restatus", "get", "secret", secret, "-o", "jsonpath={.data.AWS_ACCESS_KEY_ID}"]);
        assert_success(&out, "read the Secret back");
        let kept = String::from_utf8(base64_decode(stdout(&out).trim())).unwrap_or_default();
        assert_eq!(kept, mine, "apply -k manifests/{dir} changed Secret {secret}");
        let _ = kubectl(&["-n", "restatus", "delete", "secret", secret, "--ignore-not-found"]);
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(text).unwrap_or_default()
}
