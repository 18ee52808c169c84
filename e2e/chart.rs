//! The Helm chart (charts/restatus) and the alert rules (monitoring/): `helm lint`; each role's
//! RBAC and admission policy the same as its kustomize folder's; each role rendered by
//! `helm template`, applied server-side to the test bed and tried with its ServiceAccount's
//! token; the monitoring objects accepted by the API server; the alert rules' promtool unit
//! tests, and the chart's PrometheusRule the same rules as the plain file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kube::api::{Patch, PatchParams, PostParams};
use restatus::domain::annotations::RESTORED_FROM_ANNOTATION;
use restatus::domain::identity::Profile;
use restatus::fleet::{self, FLEET_LABEL, FleetSpec};
use serde_json::{Value, json};

use crate::bed::{
    Bed, QUIESCE_PATCH, TARGET, assert_success, foreign_patches, merge_patch, records, stderr, stdout, unique,
};

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/restatus");
const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/monitoring/restatus-alerts.yaml");
const RULE_TESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/monitoring/restatus-alerts.test.yaml");

/// Release and namespace of the chart's objects on the test bed: apart from the kustomize
/// tests' `restatus` namespace and `restatus-*` cluster-wide names.
const RELEASE: &str = "restatus-chart";

/// A test-bed tool: `$RESTATUS_BIN/NAME` (scripts/testbed-build), else NAME from PATH.
fn tool(name: &str) -> PathBuf {
    std::env::var("RESTATUS_BIN").map(|bin| Path::new(&bin).join(name)).unwrap_or_else(|_| name.into())
}

fn run(program: &Path, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
}

/// The test bed's kube-apiserver (what `helm template` checks the chart's kubeVersion against).
const KUBE_VERSION: &str = "1.34.4";

/// `helm template` of the chart as release `release` in namespace `release`, with `--set`s.
fn render(release: &str, sets: &[&str]) -> String {
    let mut args = vec!["template", release, CHART, "--namespace", release, "--kube-version", KUBE_VERSION];
    for set in sets {
        args.extend(["--set", set]);
    }
    let out = run(&tool("helm"), &args);
    assert_success(&out, &format!("helm template {sets:?}"));
    stdout(&out)
}

/// The objects of a multi-document YAML stream.
fn objects(yaml: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("rendered YAML parses");
    docs.into_iter().filter(|d| d.is_object()).collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} among {:?}", kinds(objects)))
}

fn kinds(objects: &[Value]) -> Vec<String> {
    objects.iter().map(|o| format!("{} {}", o["kind"].as_str().unwrap(), o["metadata"]["name"])).collect()
}

/// `value` with every run of whitespace in its strings made one space: kustomize re-emits the
/// folded CEL expressions with other line breaks, which mean nothing to CEL.
fn squeeze(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(s.split_whitespace().collect::<Vec<_>>().join(" ")),
        Value::Array(items) => Value::Array(items.iter().map(squeeze).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), squeeze(v))).collect()),
        other => other.clone(),
    }
}

/// The kustomize folder `manifests/<dir>`, built by kubectl.
fn kustomize(bed: &Bed, dir: &str) -> Vec<Value> {
    let out = run(&bed.kubectl, &["kustomize", &format!("{}/manifests/{dir}", env!("CARGO_MANIFEST_DIR"))]);
    assert_success(&out, &format!("kubectl kustomize manifests/{dir}"));
    objects(&stdout(&out))
}

/// Only one role switched on.
fn only(role: &str) -> Vec<String> {
    ["backup", "controller", "source"].iter().map(|r| format!("{r}.enabled={}", *r == role)).collect()
}

fn sets(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn chart_lints_clean_with_every_role_and_monitoring() {
    let helm = tool("helm");
    assert_success(&run(&helm, &["lint", "--strict", CHART]), "helm lint (defaults)");
    let everything = [
        "controller.enabled=true",
        "source.enabled=true",
        "metrics.podMonitor.enabled=true",
        "metrics.serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "s3.existingSecret=my-s3",
        "controller.existingSecret=my-s3-readonly",
        "s3.caBundle.configMap=my-ca",
        "signing.keySecret=my-signing-key",
        "signing.trustedKeys={ed25519:AAAA,ed25519:BBBB}",
        "signing.trustedKeysConfigMap=my-trusted-keys",
    ];
    let mut args = vec!["lint", "--strict", CHART];
    for set in everything {
        args.extend(["--set", set]);
    }
    assert_success(&run(&helm, &args), "helm lint (every role, monitoring)");
    // No storage: a clear error, not a pod that fails at start.
    let out = run(&helm, &["template", "x", CHART, "--kube-version", KUBE_VERSION, "--set", "storage="]);
    assert!(!out.status.success() && stderr(&out).contains("storage (s3://bucket/prefix) is required"), "{out:?}");
    // Before 1.30 no ValidatingAdmissionPolicy narrows the roles' RBAC: the chart refuses.
    let out = run(&helm, &["template", "x", CHART, "--kube-version", "1.29.9", "--set", "storage=s3://b/p"]);
    assert!(!out.status.success() && stderr(&out).contains("requires kubeVersion: >=1.30"), "{out:?}");
}

/// The signing key is a Secret mounted only where snapshots are written (the backup CronJob and
/// the source role), the trusted public keys only where they are restored (the controller);
/// by default neither is anywhere.
#[test]
fn chart_signing_key_only_where_backups_run_and_trusted_keys_only_where_restores_run() {
    let all = ["backup.enabled=true", "controller.enabled=true", "source.enabled=true"];
    let defaults = render("restatus", &all);
    for word in ["RESTATUS_SIGNING_KEY", "RESTATUS_TRUSTED_KEYS", "signing-key", "trusted-keys"] {
        assert!(!defaults.contains(word), "{word} rendered by default");
    }
    let signed = [
        &all[..],
        &[
            "signing.keySecret=restatus-signing-key",
            "signing.trustedKeys={ed25519:AAAA,ed25519:BBBB}",
            "signing.trustedKeysConfigMap=restatus-trusted-keys",
        ],
    ]
    .concat();
    let objects = objects(&render("restatus", &signed));
    let pod = |kind: &str, role: &str| {
        let workload = objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"].as_str().unwrap().ends_with(role))
            .unwrap_or_else(|| panic!("no {kind} for {role} among {:?}", kinds(&objects)));
        let spec = if kind == "CronJob" {
            &workload["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        } else {
            &workload["spec"]["template"]["spec"]
        };
        spec.clone()
    };
    let env = |spec: &Value, name: &str| {
        spec["containers"][0]["env"].as_array().unwrap().iter().find(|e| e["name"] == name).map(|e| e["value"].clone())
    };
    let volume = |spec: &Value, name: &str| {
        spec["volumes"].as_array().into_iter().flatten().find(|v| v["name"] == name).cloned()
    };
    for (kind, role) in [("CronJob", "backup"), ("Deployment", "source")] {
        let spec = pod(kind, role);
        assert_eq!(env(&spec, "RESTATUS_SIGNING_KEY"), Some(json!("/etc/restatus/signing/signing.key")), "{role}");
        assert_eq!(volume(&spec, "signing-key").unwrap()["secret"]["secretName"], "restatus-signing-key", "{role}");
        assert_eq!((env(&spec, "RESTATUS_TRUSTED_KEYS"), volume(&spec, "trusted-keys")), (None, None), "{role}");
    }
    let spec = pod("Deployment", "controller");
    assert_eq!(
        (env(&spec, "RESTATUS_SIGNING_KEY"), volume(&spec, "signing-key")),
        (None, None),
        "no signing key where restores run"
    );
    assert_eq!(
        env(&spec, "RESTATUS_TRUSTED_KEYS"),
        Some(json!("ed25519:AAAA,ed25519:BBBB,/etc/restatus/trusted-keys"))
    );
    assert_eq!(volume(&spec, "trusted-keys").unwrap()["configMap"]["name"], "restatus-trusted-keys");
    let mounts = spec["containers"][0]["volumeMounts"].to_string();
    assert!(mounts.contains("/etc/restatus/trusted-keys") && !mounts.contains("/etc/restatus/signing"), "{mounts}");
}

/// The same with kustomize: the components `manifests/components/signing-key` and
/// `trusted-keys`, added to a user's overlay of each role, mount the signing key only where
/// snapshots are written and the trusted keys only where they are restored (a component that
/// does not fit the role changes nothing), as the chart does.
#[test]
fn kustomize_components_put_the_signing_key_only_where_backups_run_and_trusted_keys_only_where_restores_run() {
    let bed = Bed::get();
    // kustomize takes only relative paths to other folders: from the overlay up to `/`.
    let overlay = |role: &str| {
        let dir = bed.scratch.path().join(format!("overlay-{role}"));
        std::fs::create_dir_all(&dir).unwrap();
        let up = "../".repeat(dir.components().count() - 1);
        let repo = format!("{up}{}", env!("CARGO_MANIFEST_DIR").trim_start_matches('/'));
        let text = format!(
            "resources: [{repo}/manifests/{role}]\ncomponents: [{repo}/manifests/components/signing-key, \
             {repo}/manifests/components/trusted-keys]\n"
        );
        std::fs::write(dir.join("kustomization.yaml"), text).unwrap();
        let out = run(&bed.kubectl, &["kustomize", dir.to_str().unwrap()]);
        assert_success(&out, &format!("kubectl kustomize of an overlay of manifests/{role}"));
        objects(&stdout(&out))
    };
    let pod = |objects: &[Value], kind: &str| {
        let workload = objects.iter().find(|o| o["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"));
        match kind {
            "CronJob" => workload["spec"]["jobTemplate"]["spec"]["template"]["spec"].clone(),
            _ => workload["spec"]["template"]["spec"].clone(),
        }
    };
    let env = |spec: &Value, name: &str| {
        spec["containers"][0]["env"].as_array().unwrap().iter().find(|e| e["name"] == name).map(|e| e["value"].clone())
    };
    let volume = |spec: &Value, name: &str| {
        spec["volumes"].as_array().into_iter().flatten().find(|v| v["name"] == name).cloned()
    };
    for (role, kind) in [("backup", "CronJob"), ("source", "Deployment")] {
        let spec = pod(&overlay(role), kind);
        assert_eq!(env(&spec, "RESTATUS_SIGNING_KEY"), Some(json!("/etc/restatus/signing/signing.key")), "{role}");
        assert_eq!(volume(&spec, "signing-key").unwrap()["secret"]["secretName"], "restatus-signing-key", "{role}");
        let mounts = spec["containers"][0]["volumeMounts"].to_string();
        assert!(mounts.contains("/etc/restatus/signing"), "{role}: {mounts}");
        assert_eq!((env(&spec, "RESTATUS_TRUSTED_KEYS"), volume(&spec, "trusted-keys")), (None, None), "{role}");
    }
    let spec = pod(&overlay("controller"), "Deployment");
    assert_eq!((env(&spec, "RESTATUS_SIGNING_KEY"), volume(&spec, "signing-key")), (None, None), "the controller");
    assert_eq!(env(&spec, "RESTATUS_TRUSTED_KEYS"), Some(json!("/etc/restatus/trusted-keys")));
    assert_eq!(volume(&spec, "trusted-keys").unwrap()["configMap"]["name"], "restatus-trusted-keys");
}

/// Released as `restatus` in namespace `restatus`, each role has the names of its kustomize
/// folder: its ClusterRole, lease Role, admission policy and binding are equal to those, field
/// for field; its pods run as the same user with the same limits.
#[test]
fn chart_roles_mirror_the_kustomize_folders() {
    let bed = Bed::get();
    for (role, workload_kind) in [("backup", "CronJob"), ("controller", "Deployment"), ("source", "Deployment")] {
        let chart = objects(&render("restatus", &sets(&only(role))));
        let kustomize = kustomize(&bed, role);
        let name = format!("restatus-{role}");
        let mut compared = vec![];
        for (kind, name, field) in [
            ("ClusterRole", name.clone(), "rules"),
            ("ClusterRoleBinding", name.clone(), "subjects"),
            ("Role", format!("{name}-lease"), "rules"),
            ("ValidatingAdmissionPolicy", format!("{name}-annotations-only"), "spec"),
            ("ValidatingAdmissionPolicyBinding", format!("{name}-annotations-only"), "spec"),
        ] {
            let in_kustomize = kustomize.iter().find(|o| o["kind"] == kind && o["metadata"]["name"] == name.as_str());
            let Some(expected) = in_kustomize else { continue };
            assert_eq!(
                squeeze(&find(&chart, kind, &name)[field]),
                squeeze(&expected[field]),
                "{role}: {kind} {name} .{field}"
            );
            compared.push(kind);
        }
        let expected = match role {
            "backup" => vec!["ClusterRole", "ClusterRoleBinding"],
            _ => vec![
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
            ],
        };
        assert_eq!(compared, expected, "{role}: kinds compared");

        let pod = |objects: &[Value]| {
            let workload = find(objects, workload_kind, &name).clone();
            match workload_kind {
                "CronJob" => workload["spec"]["jobTemplate"]["spec"]["template"]["spec"].clone(),
                _ => workload["spec"]["template"]["spec"].clone(),
            }
        };
        let (chart_pod, kustomize_pod) = (pod(&chart), pod(&kustomize));
        for field in ["serviceAccountName", "securityContext", "volumes", "terminationGracePeriodSeconds"] {
            assert_eq!(chart_pod[field], kustomize_pod[field], "{role}: pod {field}");
        }
        for field in ["securityContext", "resources", "volumeMounts"] {
            assert_eq!(chart_pod["containers"][0][field], kustomize_pod["containers"][0][field], "{role}: {field}");
        }
        let kustomize_kinds: Vec<&str> = kustomize.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        let chart_kinds: Vec<&str> = chart.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        for kind in &chart_kinds {
            assert!(kustomize_kinds.contains(kind), "{role}: the chart renders a {kind} the kustomize folder has not");
        }
    }
}

/// Applies the rendered objects server-side (with `extra` arguments), in namespace RELEASE,
/// which is made first.
fn apply(bed: &Bed, kubeconfig: &Path, yaml: &str, extra: &[&str]) -> Output {
    let write = |what: &str, text: &str| {
        let path = bed.scratch.path().join(format!("{}.yaml", unique(what)));
        std::fs::write(&path, text).unwrap();
        path
    };
    let namespace = write("namespace", &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {RELEASE}\n"));
    let ssa = |path: &Path, extra: &[&str]| {
        let mut args =
            vec!["apply", "--server-side", "--field-manager=restatus-chart-test", "-f", path.to_str().unwrap()];
        args.extend(extra);
        bed.kubectl(kubeconfig, &args)
    };
    assert_success(&ssa(&namespace, &[]), "apply the namespace");
    ssa(&write("rendered", yaml), extra)
}

/// Applies one role of the chart and returns a kubeconfig with its ServiceAccount's token.
/// A role with an admission policy waits for it with [`policy_in_force`] before its checks.
fn deploy_role(bed: &Bed, kubeconfig: &Path, role: &str, sets: &[&str]) -> PathBuf {
    let yaml = render(RELEASE, sets);
    assert_success(&apply(bed, kubeconfig, &yaml, &[]), &format!("apply the chart's {role} role"));
    let account = format!("{RELEASE}-{role}");
    let token = bed.kubectl(kubeconfig, &["-n", RELEASE, "create", "token", &account]);
    assert_success(&token, "create token");
    bed.kubeconfig_with_token(kubeconfig, &account, stdout(&token).trim())
}

/// Waits until the role's admission policy is in force (it takes effect once it reaches the
/// API server's cache: a write checked before that would pass unchecked): a spec change of
/// `server` as the role (`kubeconfig`), sent as a dry run, is denied by it.
async fn policy_in_force(bed: &Bed, kubeconfig: &Path, server: &str) {
    let power_off = merge_patch(None, server, r#"{"spec":{"power":"Off"}}"#);
    let within = std::time::Duration::from_secs(60);
    bed.wait_denied(kubeconfig, &power_off, "may not change spec", within).await.unwrap();
}

#[tokio::test]
async fn chart_backup_role_backs_up_and_reads_nothing_else() {
    let bed = Bed::get();
    let kubeconfig = deploy_role(&bed, &bed.source_kubeconfig, "backup", &sets(&only("backup")));
    let cronjob = bed.kubectl(&bed.source_kubeconfig, &["-n", RELEASE, "get", "cronjob", "restatus-chart-backup"]);
    assert_success(&cronjob, "the CronJob exists");

    // Sufficient: a backup of a small fleet as the ServiceAccount.
    let spec = FleetSpec::new(&unique("chart-bk"), 3, 3, 2);
    fleet::create(&bed.source().await, &spec, 8).await.unwrap();
    let storage = bed.storage(&spec.name);
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let out = bed.restatus_with(&kubeconfig, &storage, &spec.name, &["backup", "--selector", &selector], &[]);
    assert_success(&out, "backup as the chart's backup ServiceAccount");
    let (manifest, records) = records(&bed.store(&storage, &spec.name), stdout(&out).trim()).await;
    assert_eq!(records.len(), 8, "{manifest:?}");

    // Nothing more.
    let server = format!("servers.metal.ironcore.dev/{}", spec.server_name(0));
    let mut denied = foreign_patches(&server);
    denied.extend([
        merge_patch(None, &server, QUIESCE_PATCH),
        vec!["delete", &server],
        vec!["get", "secrets", "-A"],
        vec!["get", "bmcsecrets.metal.ironcore.dev"],
        vec!["get", "configmaps", "-A"],
        vec!["get", "clusters.cluster.x-k8s.io", "-A"],
    ]);
    bed.assert_denied(&kubeconfig, &denied);
    bed.assert_allowed(&kubeconfig, &[vec!["get", "servers.metal.ironcore.dev", "-l", &selector]]);
}

#[tokio::test]
async fn chart_controller_role_writes_status_and_restatus_annotations_only() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let kubeconfig = deploy_role(
        &bed,
        &bed.target_kubeconfig,
        "controller",
        &sets(&[only("controller"), vec!["controller.existingSecret=restatus-s3-readonly".into()]].concat()),
    );
    // The controller role alone brings no CronJob to the target.
    let cronjobs = bed.kubectl(&bed.target_kubeconfig, &["-n", RELEASE, "get", "cronjobs", "-o", "name"]);
    assert_success(&cronjobs, "get cronjobs");
    assert_eq!(stdout(&cronjobs).trim(), "", "a CronJob reached the target");

    // A claimed Server: powered on, so that a power-off patch would change it.
    let spec = FleetSpec::new(&unique("chart-ctl"), 1, 1, 1);
    fleet::create(&bed.target().await, &spec, 8).await.unwrap();
    let server = format!("servers.metal.ironcore.dev/{}", spec.server_name(0));
    policy_in_force(&bed, &kubeconfig, &server).await;
    let mut denied = foreign_patches(&server);
    denied.extend([
        vec!["delete", &server],
        vec!["get", "secrets", "-A"],
        vec!["-n", RELEASE, "get", "secret", "restatus-s3-readonly"],
        vec!["get", "bmcsecrets.metal.ironcore.dev"],
        vec!["create", "namespace", "nope"],
        vec!["-n", "default", "get", "leases"],
    ]);
    bed.assert_denied(&kubeconfig, &denied);
    let release = r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":null,"restatus.ironcore.dev/quiesced-by":null}}}"#;
    bed.assert_allowed(
        &kubeconfig,
        &[
            merge_patch(None, &server, QUIESCE_PATCH),
            merge_patch(None, &server, release),
            vec!["-n", RELEASE, "get", "leases"],
        ],
    );
    // The writes of a restore: the status subresource, then the object with restatus's
    // annotation; a spec change is denied by the policy, a status patch by RBAC.
    let as_controller = restatus::k8s::client(Some(&kubeconfig), None).await.unwrap();
    let servers = restatus::k8s::api_for(&as_controller, Profile::metal_operator().kind("Server").unwrap(), None);
    let name = spec.server_name(0);
    let mut object = servers.get(&name).await.unwrap();
    object.data["status"] = json!({"indicatorLED": "Off"});
    let mut object = servers.replace_status(&name, &PostParams::default(), &object).await.expect("status replace");
    object.metadata.annotations.get_or_insert_default().insert(RESTORED_FROM_ANNOTATION.into(), "chart".into());
    let mut object = servers.replace(&name, &PostParams::default(), &object).await.expect("annotation replace");
    object.data["spec"]["power"] = json!("Off");
    let denied = servers.replace(&name, &PostParams::default(), &object).await.expect_err("spec replace denied");
    assert!(denied.to_string().contains("restatus-chart-controller may not change spec"), "{denied}");
    let status = json!({"status": {"indicatorLED": "On"}});
    let denied = servers.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await;
    assert!(matches!(denied, Err(kube::Error::Api(ref s)) if s.code == 403), "status patch: {denied:?}");
    for object in
        [format!("bmcs.metal.ironcore.dev/{}", spec.bmc_name(0)), format!("servers.metal.ironcore.dev/{name}")]
    {
        crate::bed::assert_only_the_quiesce_protocol(&bed, &bed.target_kubeconfig, &kubeconfig, &object);
    }
}

#[tokio::test]
async fn chart_source_role_sets_its_annotations_only() {
    let bed = Bed::get();
    let ns = unique("chart-capi");
    let kubeconfig = deploy_role(
        &bed,
        &bed.source_kubeconfig,
        "source",
        &sets(&[only("source"), vec![format!("source.clusterNamespace={ns}")]].concat()),
    );
    let spec = FleetSpec::new(&unique("chart-src"), 1, 1, 1);
    fleet::create(&bed.source().await, &spec, 8).await.unwrap();
    let cluster = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "workload", "namespace": ns},
        "spec": {"controlPlaneEndpoint": {"host": "10.0.0.10", "port": 6443},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "IroncoreMetalCluster", "name": "workload"}},
    });
    let file = bed.scratch.path().join(format!("{ns}.json"));
    std::fs::write(&file, cluster.to_string()).unwrap();
    assert_success(&bed.kubectl(&bed.source_kubeconfig, &["create", "namespace", &ns]), "create namespace");
    assert_success(&bed.kubectl(&bed.source_kubeconfig, &["create", "-f", file.to_str().unwrap()]), "create Cluster");

    let server = format!("servers.metal.ironcore.dev/{}", spec.server_name(0));
    policy_in_force(&bed, &kubeconfig, &server).await;
    let cluster = "clusters.cluster.x-k8s.io/workload";
    let mut denied = foreign_patches(&server);
    denied.extend([
        vec!["patch", &server, "--subresource=status", "--type=merge", "-p", r#"{"status":{"state":"Available"}}"#],
        merge_patch(Some(&ns), cluster, r#"{"spec":{"paused":true}}"#),
        merge_patch(Some(&ns), cluster, r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":"ignore"}}}"#),
        vec!["-n", &ns, "delete", cluster],
        vec!["delete", &server],
        vec!["get", "secrets", "-A"],
        vec!["get", "bmcsecrets.metal.ironcore.dev"],
        vec!["-n", &ns, "get", "machines.cluster.x-k8s.io"],
    ]);
    bed.assert_denied(&kubeconfig, &denied);
    bed.assert_allowed(
        &kubeconfig,
        &[
            merge_patch(
                Some(&ns),
                cluster,
                r#"{"metadata":{"annotations":{"clusterctl.cluster.x-k8s.io/block-move":"restatus"}}}"#,
            ),
            merge_patch(
                Some(&ns),
                cluster,
                r#"{"metadata":{"annotations":{"clusterctl.cluster.x-k8s.io/block-move":null}}}"#,
            ),
            merge_patch(None, &server, QUIESCE_PATCH),
            vec!["-n", RELEASE, "get", "leases"],
        ],
    );
    for object in [format!("bmcs.metal.ironcore.dev/{}", spec.bmc_name(0)), server] {
        crate::bed::assert_only_the_quiesce_protocol(&bed, &bed.source_kubeconfig, &kubeconfig, &object);
    }
}

/// Every role with ServiceMonitor, PodMonitor and PrometheusRule: the API server accepts all
/// of it (server-side dry run, validated against the prometheus-operator CRDs of the test bed).
#[test]
fn chart_monitoring_objects_pass_server_side_validation() {
    let bed = Bed::get();
    let yaml = render(
        RELEASE,
        &[
            "controller.enabled=true",
            "source.enabled=true",
            "metrics.podMonitor.enabled=true",
            "metrics.serviceMonitor.enabled=true",
            "prometheusRule.enabled=true",
            "s3.accessKeyId=AKIAEXAMPLE",
            "s3.secretAccessKey=secret",
            "s3.caBundle.configMap=s3-ca",
        ],
    );
    let rendered = objects(&yaml);
    for kind in ["PodMonitor", "ServiceMonitor", "Service", "PrometheusRule", "Secret", "CronJob"] {
        assert!(rendered.iter().any(|o| o["kind"] == kind), "no {kind} in {:?}", kinds(&rendered));
    }
    let out = apply(&bed, &bed.source_kubeconfig, &yaml, &["--dry-run=server"]);
    assert_success(&out, "server-side dry run of every role with monitoring");
}

/// promtool's unit tests of the alert rules, and the rules' syntax.
#[test]
fn alert_rules_pass_their_promtool_tests() {
    let promtool = tool("promtool");
    assert_success(&run(&promtool, &["check", "rules", RULES]), "promtool check rules");
    let out = run(&promtool, &["test", "rules", RULE_TESTS]);
    assert_success(&out, "promtool test rules");
    assert!(stdout(&out).contains("SUCCESS"), "{}", stdout(&out));
}

/// With its default thresholds the chart's PrometheusRule holds the plain file's rules; other
/// thresholds and names still make valid rules.
#[test]
fn chart_prometheus_rule_is_the_plain_rule_file() {
    let rule = |release: &str, extra: &[&str]| {
        let mut sets = vec!["prometheusRule.enabled=true"];
        sets.extend(extra);
        let objects = objects(&render(release, &sets));
        objects.into_iter().find(|o| o["kind"] == "PrometheusRule").expect("a PrometheusRule")
    };
    let plain: Value = serde_saphyr::from_str(&std::fs::read_to_string(RULES).unwrap()).unwrap();
    assert_eq!(rule("restatus", &[])["spec"], plain, "chart defaults vs monitoring/restatus-alerts.yaml");

    let custom = rule(
        "other",
        &[
            "prometheusRule.backupMaxAgeSeconds=90000",
            "prometheusRule.errorsFor=1h",
            "prometheusRule.additionalLabels.team=metal",
        ],
    );
    let text = serde_json::to_string(&custom["spec"]).unwrap();
    assert!(text.contains("> 90000") && text.contains(r#"cronjob=\"other-restatus-backup\""#), "{text}");
    let file = std::env::temp_dir().join(format!("{}.rules.json", unique("custom")));
    std::fs::write(&file, &text).unwrap();
    let out = run(&tool("promtool"), &["check", "rules", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    assert_success(&out, "promtool check rules (custom thresholds)");
    for group in custom["spec"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            assert_eq!(rule["labels"]["team"], "metal", "{rule}");
        }
    }
}
