//! The Helm chart (charts/restatus) and the alert rules (monitoring/): `helm lint`; the values
//! schema refusing a misspelt value; each role's
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

mod fits;

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

/// The values every render sets: the chart has no default for them (it fails without them).
const REQUIRED: [&str; 3] =
    ["storage=s3://restatus-chart/test", "clusterId=chart-source", "controller.restoreFrom=chart-origin"];

/// `helm template` of the chart as release `release` in namespace `release`, with
/// [`REQUIRED`] and then `--set`s.
fn render(release: &str, sets: &[&str]) -> String {
    render_with(release, &sets.iter().flat_map(|set| ["--set", set]).collect::<Vec<_>>())
}

/// `helm template` as [`render`], with further arguments (`--set-file`, `-f`, ...) after [`REQUIRED`].
fn render_with(release: &str, extra: &[&str]) -> String {
    let mut args = vec!["template", release, CHART, "--namespace", release, "--kube-version", KUBE_VERSION];
    for set in REQUIRED {
        args.extend(["--set", set]);
    }
    args.extend(extra);
    let out = run(&tool("helm"), &args);
    assert_success(&out, &format!("helm template {extra:?}"));
    // Values Helm cannot merge into the defaults (a string over a table) it warns of and drops.
    assert!(!stderr(&out).contains("warning"), "helm template {extra:?}: {}", stderr(&out));
    stdout(&out)
}

/// `helm template` with exactly `sets` (nothing required added): its output, which must be a failure.
fn render_fails(sets: &[&str]) -> String {
    let mut args = vec!["template", "x", CHART, "--kube-version", KUBE_VERSION];
    for set in sets {
        args.extend(["--set", set]);
    }
    let out = run(&tool("helm"), &args);
    assert!(!out.status.success(), "helm template {sets:?} rendered:\n{}", stdout(&out));
    stderr(&out)
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
    ["backup", "controller", "source", "journal"].iter().map(|r| format!("{r}.enabled={}", *r == role)).collect()
}

fn sets(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn chart_lints_clean_with_every_role_and_monitoring() {
    let helm = tool("helm");
    // The values scripts/release renders the chart with: the defaults and the required values.
    let ci = format!("{CHART}/ci/release-values.yaml");
    assert_success(&run(&helm, &["lint", "--strict", CHART, "-f", &ci]), "helm lint (defaults)");
    let everything = [
        "storage=s3://b/p",
        "clusterId=mgmt-eu1",
        "controller.restoreFrom=mgmt-eu1",
        "networkPolicy.enabled=true",
        "networkPolicy.egress.apiServer.cidrs={10.0.0.1/32}",
        "networkPolicy.egress.s3.cidrs={192.0.2.0/24}",
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",
        "controller.enabled=true",
        "source.enabled=true",
        "journal.enabled=true",
        "journal.interval=2s",
        "metrics.podMonitor.enabled=true",
        "metrics.serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "prometheusRule.journalMaxLagSeconds=30",
        "metrics.podMonitor.force=true",
        "metrics.serviceMonitor.force=true",
        "prometheusRule.force=true",
        "s3.existingSecret=my-s3",
        "controller.existingSecret=my-s3-readonly",
        "s3.caBundle.configMap=my-ca",
        "signing.keySecret=my-signing-key",
        "signing.trustedKeys={ed25519:AAAA,ed25519:BBBB}",
        "signing.trustedKeysConfigMap=my-trusted-keys",
        "encryption.recipients={age1aaaa}",
        "encryption.recipientsConfigMap=my-recipients",
        "encryption.decryptionKeySecret=my-decryption-key",
    ];
    let mut args = vec!["lint", "--strict", CHART];
    for set in everything {
        args.extend(["--set", set]);
    }
    assert_success(&run(&helm, &args), "helm lint (every role, monitoring)");
    // values.schema.json: a misspelt value (top level or in a role) fails instead of being ignored.
    for typo in [
        "stroage=s3://b/p",
        "controller.replica=3",
        "logFormat=text",
        "networkPolicy.enable=true",
        "journal.intervall=5s",
        "journal.interval=often",
        "journal.replicas=2",
    ] {
        let out = run(&helm, &["template", "x", CHART, "--kube-version", KUBE_VERSION, "--set", typo]);
        assert!(
            !out.status.success() && stderr(&out).contains("values don't meet the specifications"),
            "{typo}: {out:?}"
        );
    }
    // Before 1.30 no ValidatingAdmissionPolicy narrows the roles' RBAC: the chart refuses.
    let out = run(&helm, &["template", "x", CHART, "--kube-version", "1.29.9", "-f", &ci]);
    assert!(!out.status.success() && stderr(&out).contains("requires kubeVersion: >=1.30"), "{out:?}");
}

/// Issue 25: no default pretends to be a bucket or a cluster id. Each value a role needs and
/// lacks fails the render with a message naming it; the target role alone needs only storage
/// and controller.restoreFrom (not clusterId), and restores from that id while the backup of
/// the same cluster writes under clusterId.
#[test]
fn chart_fails_at_render_naming_each_value_to_set_and_the_target_needs_only_restore_from() {
    let err = render_fails(&[]);
    assert!(err.contains("set storage: the bucket and prefix of the snapshots, s3://bucket/prefix"), "{err}");
    let err = render_fails(&["storage=s3://b/p"]);
    assert!(err.contains("set clusterId: this cluster's id, the one the backup role's"), "{err}");
    let err = render_fails(&["storage=s3://b/p", "backup.enabled=false", "source.enabled=true"]);
    assert!(err.contains("set clusterId: this cluster's id, the one the source role's"), "{err}");
    let err = render_fails(&["storage=s3://b/p", "backup.enabled=false", "controller.enabled=true"]);
    assert!(err.contains("set controller.restoreFrom: the id of the cluster whose snapshots"), "{err}");
    assert!(!err.contains("clusterId:"), "the target role asked for clusterId: {err}");
    // Even with this cluster's id set, the controller needs the id to restore from.
    let err = render_fails(&["storage=s3://b/p", "clusterId=tgt", "controller.enabled=true"]);
    assert!(err.contains("set controller.restoreFrom"), "{err}");
    let err = render_fails(&["storage=b/p", "clusterId=c"]);
    assert!(err.contains("values don't meet the specifications") && err.contains("storage"), "{err}");

    // The target role alone: storage and restoreFrom, nothing else.
    let mut args = vec!["template", "t", CHART, "--kube-version", KUBE_VERSION, "--namespace", "t"];
    for set in
        ["storage=s3://b/p", "backup.enabled=false", "controller.enabled=true", "controller.restoreFrom=mgmt-eu1"]
    {
        args.extend(["--set", set]);
    }
    let out = run(&tool("helm"), &args);
    assert_success(&out, "helm template of the controller alone");
    let target = objects(&stdout(&out));
    let spec = pod_spec(&target, "Deployment", "controller");
    assert_eq!(env(&spec, "RESTATUS_CLUSTER_ID"), Some(json!("mgmt-eu1")));
    assert_eq!(env(&spec, "RESTATUS_STORAGE"), Some(json!("s3://b/p")));
    assert!(!target.iter().any(|o| o["kind"] == "CronJob"), "{:?}", kinds(&target));

    // Both on one cluster: the backup under clusterId, the controller from restoreFrom.
    let both = objects(&render("r", &["controller.enabled=true", "clusterId=here", "controller.restoreFrom=there"]));
    assert_eq!(env(&pod_spec(&both, "CronJob", "backup"), "RESTATUS_CLUSTER_ID"), Some(json!("here")));
    assert_eq!(env(&pod_spec(&both, "Deployment", "controller"), "RESTATUS_CLUSTER_ID"), Some(json!("there")));
}

/// NOTES.txt (`helm install --dry-run` against the test bed prints it) tells each role what it
/// did and what to check, and the controller which Secret its keys come from and that it must
/// be read-only.
#[test]
fn chart_notes_tell_each_role_what_it_did_and_what_to_check() {
    let bed = Bed::get();
    let kubeconfig = bed.source_kubeconfig.to_str().unwrap();
    let notes = |sets: &[&str]| {
        let mut args = vec!["install", "r", CHART, "--dry-run=client", "--namespace", "ns", "--kubeconfig", kubeconfig];
        for set in REQUIRED.iter().chain(sets) {
            args.extend(["--set", set]);
        }
        let out = run(&tool("helm"), &args);
        assert_success(&out, &format!("helm install --dry-run {sets:?}"));
        let text = stdout(&out);
        text[text.find("NOTES:").expect("NOTES printed")..].to_string()
    };
    let all = notes(&[
        "controller.enabled=true",
        "source.enabled=true",
        "journal.enabled=true",
        "controller.existingSecret=s3-ro",
    ]);
    for line in [
        "backup: CronJob r-restatus-backup takes a snapshot under cluster id chart-source",
        "kubectl -n ns create job --from=cronjob/r-restatus-backup r-restatus-backup-manual",
        "source: Deployment r-restatus-source holds `clusterctl move -n default`",
        "controller: Deployment r-restatus-controller restores status from the snapshots of cluster chart-origin",
        "kubectl -n ns rollout status deployment/r-restatus-controller",
        "journal: Deployment r-restatus-journal writes every status change under cluster id chart-source to the bucket within 5s",
        "Its keys: Secret s3-ro, which must be READ-ONLY",
        "metal.ironcore.dev: servers, bmcs, serverclaims, endpoints, servermaintenances, serverbootconfigurations",
    ] {
        assert!(all.contains(line), "{line:?} not in\n{all}");
    }
    // The controller sharing the writers' Secret is warned about.
    let shared = notes(&["backup.enabled=false", "controller.enabled=true", "s3.existingSecret=s3-rw"]);
    assert!(shared.contains("WARNING: its keys are Secret s3-rw, the same as the writing roles'"), "{shared}");
    assert!(!shared.contains("backup:"), "{shared}");
}

/// networkPolicy: off by default; on, one NetworkPolicy per enabled role selecting only its
/// pods: ingress only to the metrics port from `metricsFrom` (none for the backup Job), egress
/// only to DNS, the API server's and S3's CIDRs and ports and `extraEgress`. Without the API
/// server's or S3's addresses it fails at render, naming the value.
#[test]
fn chart_network_policy_is_off_by_default_and_allows_only_metrics_dns_api_server_and_s3() {
    let all = ["controller.enabled=true", "source.enabled=true"];
    let defaults = objects(&render("r", &all));
    assert!(!defaults.iter().any(|o| o["kind"] == "NetworkPolicy"), "{:?}", kinds(&defaults));

    let on = [
        &all[..],
        &[
            "networkPolicy.enabled=true",
            "networkPolicy.egress.apiServer.cidrs={10.96.0.1/32,172.18.0.2/32}",
            "networkPolicy.egress.apiServer.ports={6443}",
            "networkPolicy.egress.s3.cidrs={192.0.2.0/24}",
            "networkPolicy.egress.s3.ports={9000}",
            "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring",
            "networkPolicy.extraEgress[0].to[0].podSelector.matchLabels.app=proxy",
            "metrics.port=9090",
        ],
    ]
    .concat();
    let rendered = objects(&render("r", &on));
    let policies: Vec<&Value> = rendered.iter().filter(|o| o["kind"] == "NetworkPolicy").collect();
    assert_eq!(policies.len(), 3, "{:?}", kinds(&rendered));
    for (role, kind) in [("backup", "CronJob"), ("controller", "Deployment"), ("source", "Deployment")] {
        let name = format!("r-restatus-{role}");
        let policy = find(&rendered, "NetworkPolicy", &name);
        let workload = find(&rendered, kind, &name);
        let pod_labels = match kind {
            "CronJob" => &workload["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"],
            _ => &workload["spec"]["template"]["metadata"]["labels"],
        };
        let selector = policy["spec"]["podSelector"]["matchLabels"].as_object().unwrap();
        assert!(selector.iter().all(|(k, v)| &pod_labels[k] == v), "{role}: {selector:?} vs {pod_labels}");
        assert_eq!(selector["app.kubernetes.io/component"], role, "{role}: selects only its own pods");
        assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]), "{role}");
        let ingress = &policy["spec"]["ingress"];
        if role == "backup" {
            assert_eq!(ingress, &json!([]), "{role}: no ingress");
        } else {
            assert_eq!(
                ingress,
                &json!([{"from": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
                         "ports": [{"port": 9090, "protocol": "TCP"}]}]),
                "{role}"
            );
        }
        assert_eq!(
            policy["spec"]["egress"],
            json!([
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                         "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                 "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
                {"to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}, {"ipBlock": {"cidr": "172.18.0.2/32"}}],
                 "ports": [{"port": 6443, "protocol": "TCP"}]},
                {"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}], "ports": [{"port": 9000, "protocol": "TCP"}]},
                {"to": [{"podSelector": {"matchLabels": {"app": "proxy"}}}]},
            ]),
            "{role}"
        );
    }
    // A disabled role gets none.
    let backup_only = objects(&render("r", &on[2..]));
    let names: Vec<&str> = backup_only
        .iter()
        .filter(|o| o["kind"] == "NetworkPolicy")
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["r-restatus-backup"]);

    let base = [REQUIRED[0], REQUIRED[1], "networkPolicy.enabled=true"];
    let err = render_fails(&base);
    assert!(err.contains("set networkPolicy.egress.apiServer.cidrs"), "{err}");
    let err = render_fails(&[&base[..], &["networkPolicy.egress.apiServer.cidrs={10.0.0.1/32}"]].concat());
    assert!(err.contains("set networkPolicy.egress.s3.cidrs"), "{err}");
}

/// `kubectl kustomize` of an overlay of `manifests/ROLE` with the given components of
/// `manifests/components/`, written into the bed's scratch folder `PREFIX+ROLE` (kustomize
/// takes only relative paths to other folders: from the overlay up to `/`).
fn kustomize_overlay(bed: &Bed, prefix: &str, role: &str, components: &[&str]) -> Vec<Value> {
    let dir = bed.scratch.path().join(format!("{prefix}{role}"));
    std::fs::create_dir_all(&dir).unwrap();
    let up = "../".repeat(dir.components().count() - 1);
    let repo = format!("{up}{}", env!("CARGO_MANIFEST_DIR").trim_start_matches('/'));
    let components: Vec<String> = components.iter().map(|c| format!("{repo}/manifests/components/{c}")).collect();
    let text = format!("resources: [{repo}/manifests/{role}]\ncomponents: [{}]\n", components.join(", "));
    std::fs::write(dir.join("kustomization.yaml"), text).unwrap();
    let out = run(&bed.kubectl, &["kustomize", dir.to_str().unwrap()]);
    assert_success(&out, &format!("kubectl kustomize of an overlay of manifests/{role} with {components:?}"));
    objects(&stdout(&out))
}

/// The pod spec of the first workload of `kind` (a CronJob's or a Deployment's).
fn first_pod(objects: &[Value], kind: &str) -> Value {
    let workload = objects.iter().find(|o| o["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"));
    match kind {
        "CronJob" => workload["spec"]["jobTemplate"]["spec"]["template"]["spec"].clone(),
        _ => workload["spec"]["template"]["spec"].clone(),
    }
}

/// A pod spec's volume `name`.
fn volume(spec: &Value, name: &str) -> Option<Value> {
    spec["volumes"].as_array().into_iter().flatten().find(|v| v["name"] == name).cloned()
}

/// The pod spec of a role's workload (a CronJob's or a Deployment's).
fn pod_spec(objects: &[Value], kind: &str, role: &str) -> Value {
    let workload = objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"].as_str().unwrap().ends_with(role))
        .unwrap_or_else(|| panic!("no {kind} for {role} among {:?}", kinds(objects)));
    let spec = if kind == "CronJob" {
        &workload["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    } else {
        &workload["spec"]["template"]["spec"]
    };
    spec.clone()
}

/// The value of the first container's environment variable `name`.
fn env(spec: &Value, name: &str) -> Option<Value> {
    spec["containers"][0]["env"].as_array().unwrap().iter().find(|e| e["name"] == name).map(|e| e["value"].clone())
}

/// Server-side encryption settings and the private CA reach every role (all of them write or
/// read the bucket) and nothing of them is rendered by default.
#[test]
fn chart_sse_settings_and_the_ca_reach_every_role() {
    let all = ["backup.enabled=true", "controller.enabled=true", "source.enabled=true"];
    let defaults = render("restatus", &all);
    for word in ["RESTATUS_S3_SSE", "RESTATUS_S3_CA_FILE", "s3-ca"] {
        assert!(!defaults.contains(word), "{word} rendered by default");
    }
    let sse = [
        &all[..],
        &[
            "s3.sse.mode=aws:kms",
            "s3.sse.kmsKeyId=alias/restatus",
            "s3.sse.bucketKey=false",
            "s3.caBundle.configMap=my-ca",
        ],
    ]
    .concat();
    let objects = objects(&render("restatus", &sse));
    for (kind, role) in [("CronJob", "backup"), ("Deployment", "source"), ("Deployment", "controller")] {
        let spec = pod_spec(&objects, kind, role);
        assert_eq!(env(&spec, "RESTATUS_S3_SSE"), Some(json!("aws:kms")), "{role}");
        assert_eq!(env(&spec, "RESTATUS_S3_SSE_KMS_KEY_ID"), Some(json!("alias/restatus")), "{role}");
        assert_eq!(env(&spec, "RESTATUS_S3_SSE_BUCKET_KEY"), Some(json!("false")), "{role}");
        let ca = env(&spec, "RESTATUS_S3_CA_FILE").unwrap_or_else(|| panic!("no CA file in {role}"));
        let ca = ca.as_str().unwrap();
        let mounted = spec["containers"][0]["volumeMounts"].as_array().unwrap().iter().any(|m| {
            m["mountPath"].as_str().is_some_and(|dir| ca.starts_with(dir)) && {
                let volume = spec["volumes"].as_array().unwrap().iter().find(|v| v["name"] == m["name"]);
                volume.is_some_and(|v| v["configMap"]["name"] == "my-ca")
            }
        });
        assert!(mounted, "{role}: {ca} is not in a mount of ConfigMap my-ca");
    }
}

/// The two-replica roles (controller, source) get a PodDisruptionBudget and a spread over nodes
/// that select their own pods; one replica gets neither, and the backup CronJob never does.
#[test]
fn chart_two_replica_roles_have_a_disruption_budget_and_spread() {
    for role in ["controller", "source"] {
        let rendered = objects(&render("r", &sets(&only(role))));
        let name = format!("r-restatus-{role}");
        let selector = &find(&rendered, "Deployment", &name)["spec"]["selector"]["matchLabels"];
        let pdb = find(&rendered, "PodDisruptionBudget", &name);
        assert_eq!(pdb["spec"]["maxUnavailable"], 1, "{pdb}");
        assert_eq!(&pdb["spec"]["selector"]["matchLabels"], selector, "{pdb}");
        let spread = &find(&rendered, "Deployment", &name)["spec"]["template"]["spec"]["topologySpreadConstraints"];
        assert_eq!(spread[0]["topologyKey"], "kubernetes.io/hostname", "{spread}");
        assert_eq!(&spread[0]["labelSelector"]["matchLabels"], selector, "{spread}");
        assert_eq!(rendered.iter().filter(|o| o["kind"] == "PodDisruptionBudget").count(), 1, "{:?}", kinds(&rendered));

        let single = [only(role), vec![format!("{role}.replicas=1")]].concat();
        let rendered = objects(&render("r", &sets(&single)));
        assert!(!rendered.iter().any(|o| o["kind"] == "PodDisruptionBudget"), "{:?}", kinds(&rendered));
        let pod = &find(&rendered, "Deployment", &name)["spec"]["template"]["spec"];
        assert!(pod.get("topologySpreadConstraints").is_none(), "{pod}");
    }
    let backup = objects(&render("r", &sets(&only("backup"))));
    assert!(!backup.iter().any(|o| o["kind"] == "PodDisruptionBudget"), "{:?}", kinds(&backup));
}

/// The journal role (issue 23): off by default; on, one Deployment of one replica, strategy
/// Recreate, the same image, `journal` with the interval and the metrics address, its port and
/// probes; the ServiceAccount may only get/list/watch the profile's kinds (no namespace, no
/// Secret); the signing key and recipients reach it as where snapshots are written, the trusted
/// keys as every role; never the decryption key (issue 38 item 2: where backups run, no private
/// age key); a ServiceMonitor and a PodMonitor scrape it; NOTES say what it does.
#[test]
fn chart_journal_role_is_one_recreated_replica_that_watches_and_writes_segments() {
    let defaults = objects(&render("r", &[]));
    assert!(!defaults.iter().any(|o| o["metadata"]["name"] == "r-restatus-journal"), "{:?}", kinds(&defaults));
    let on = [
        "journal.enabled=true",
        "journal.interval=2s",
        "journal.extraArgs={--base-refresh=10s}",
        "metrics.port=9090",
        "signing.keySecret=sk",
        "signing.trustedKeys={ed25519:AAAA}",
        "signing.trustedKeysConfigMap=tk",
        "encryption.recipients={age1aaaa}",
        "encryption.recipientsConfigMap=rc",
        "encryption.decryptionKeySecret=dk",
        "metrics.podMonitor.enabled=true",
        "metrics.podMonitor.force=true",
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.force=true",
    ];
    let rendered = objects(&render("r", &on));
    let deployment = find(&rendered, "Deployment", "r-restatus-journal");
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(deployment["spec"]["strategy"], json!({"type": "Recreate"}));
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "r-restatus-journal");
    let container = &pod["containers"][0];
    assert_eq!(container["image"], "restatus:0.1.0");
    assert_eq!(
        container["args"],
        json!(["journal", "--journal-interval=2s", "--metrics-addr=0.0.0.0:9090", "--base-refresh=10s"])
    );
    assert_eq!(container["ports"], json!([{"name": "http", "containerPort": 9090}]));
    assert_eq!(container["livenessProbe"]["httpGet"], json!({"path": "/healthz", "port": "http"}));
    assert_eq!(container["readinessProbe"]["httpGet"], json!({"path": "/readyz", "port": "http"}));
    let spec = pod.clone();
    assert_eq!(env(&spec, "RESTATUS_CLUSTER_ID"), Some(json!("chart-source")), "the backup's cluster id");
    assert_eq!(env(&spec, "RESTATUS_SIGNING_KEY"), Some(json!("/etc/restatus/signing/signing.key")));
    assert_eq!(env(&spec, "RESTATUS_TRUSTED_KEYS"), Some(json!("ed25519:AAAA,/etc/restatus/trusted-keys")));
    assert_eq!(env(&spec, "RESTATUS_ENCRYPT_TO"), Some(json!("age1aaaa,/etc/restatus/encryption-recipients")));
    assert_eq!((env(&spec, "RESTATUS_DECRYPTION_KEY"), volume(&spec, "decryption-key")), (None, None));
    for (volume_name, source, name) in [
        ("signing-key", "secret", "sk"),
        ("trusted-keys", "configMap", "tk"),
        ("encryption-recipients", "configMap", "rc"),
    ] {
        let v = volume(&spec, volume_name).unwrap_or_else(|| panic!("no volume {volume_name}"));
        let key = if source == "secret" { "secretName" } else { "name" };
        assert_eq!(v[source][key], name, "{volume_name}");
    }
    assert!(volume(&spec, "tmp").is_some(), "the base's payload spills to /tmp");
    let role = find(&rendered, "ClusterRole", "r-restatus-journal");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": ["metal.ironcore.dev"],
                "resources": ["servers", "bmcs", "serverclaims", "endpoints", "servermaintenances", "serverbootconfigurations"],
                "verbs": ["get", "list", "watch"]}]),
        "the profile's kinds, read only; no namespace, no Secret"
    );
    let binding = find(&rendered, "ClusterRoleBinding", "r-restatus-journal");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "r-restatus-journal", "namespace": "r"}])
    );
    for kind in ["ServiceMonitor", "PodMonitor", "Service"] {
        let name = if kind == "Service" { "r-restatus-journal-metrics" } else { "r-restatus-journal" };
        find(&rendered, kind, name);
    }
    // The backup CronJob and the source role never get the decryption key, with the journal on.
    let both = objects(&render("r", &[&on[..], &["source.enabled=true"]].concat()));
    for (kind, role) in [("CronJob", "backup"), ("Deployment", "source")] {
        assert_eq!(volume(&pod_spec(&both, kind, role), "decryption-key"), None, "{role}");
    }
}

/// PodMonitor, ServiceMonitor and PrometheusRule, enabled, are rendered only where the cluster
/// serves monitoring.coreos.com/v1 (`--api-versions` stands for it in `helm template`), or
/// when `force` asks for one of them.
#[test]
fn chart_monitoring_objects_follow_the_api_or_force() {
    const MONITORING: [&str; 3] = ["PodMonitor", "ServiceMonitor", "PrometheusRule"];
    let rendered = |extra: &[&str]| {
        let mut args = vec!["template", "r", CHART, "--kube-version", KUBE_VERSION];
        for set in REQUIRED.into_iter().chain([
            "controller.enabled=true",
            "metrics.podMonitor.enabled=true",
            "metrics.serviceMonitor.enabled=true",
            "prometheusRule.enabled=true",
        ]) {
            args.extend(["--set", set]);
        }
        args.extend(extra);
        let out = run(&tool("helm"), &args);
        assert_success(&out, &format!("helm template {extra:?}"));
        let objects = objects(&stdout(&out));
        MONITORING.iter().filter(|k| objects.iter().any(|o| o["kind"] == **k)).copied().collect::<Vec<_>>()
    };
    assert_eq!(rendered(&[]), Vec::<&str>::new(), "no monitoring.coreos.com/v1: none");
    assert_eq!(rendered(&["--api-versions", "monitoring.coreos.com/v1"]), MONITORING, "the API served: all");
    assert_eq!(rendered(&["--set", "metrics.podMonitor.force=true"]), ["PodMonitor"], "forced: that one");
    assert_eq!(
        rendered(&["--api-versions", "monitoring.coreos.com/v1", "--set", "prometheusRule.enabled=false"]),
        ["PodMonitor", "ServiceMonitor"],
        "the API served, one disabled"
    );
}

/// `logLevel` and `logFormat` reach every role's container as RUST_LOG and RESTATUS_LOG_FORMAT
/// (default `info`, `json`).
#[test]
fn chart_log_level_and_format_reach_every_role() {
    let all = ["backup.enabled=true", "controller.enabled=true", "source.enabled=true"];
    let env = |objects: &[Value], kind: &str, name: &str, var: &str| {
        let workload = find(objects, kind, name);
        let pod = match kind {
            "CronJob" => &workload["spec"]["jobTemplate"]["spec"]["template"]["spec"],
            _ => &workload["spec"]["template"]["spec"],
        };
        let env = pod["containers"][0]["env"].as_array().expect("env").clone();
        env.into_iter().find(|e| e["name"] == var).map(|e| e["value"].clone())
    };
    let roles = [
        ("CronJob", "r-restatus-backup"),
        ("Deployment", "r-restatus-controller"),
        ("Deployment", "r-restatus-source"),
    ];
    let defaults = objects(&render("r", &all));
    let chosen = objects(&render("r", &[&all[..], &["logLevel=warn\\,restatus=debug", "logFormat=plain"]].concat()));
    for (kind, name) in roles {
        assert_eq!(env(&defaults, kind, name, "RUST_LOG"), Some(json!("info")), "{name}");
        assert_eq!(env(&defaults, kind, name, "RESTATUS_LOG_FORMAT"), Some(json!("json")), "{name}");
        assert_eq!(env(&chosen, kind, name, "RUST_LOG"), Some(json!("warn,restatus=debug")), "{name}");
        assert_eq!(env(&chosen, kind, name, "RESTATUS_LOG_FORMAT"), Some(json!("plain")), "{name}");
    }
}

/// The signing key is a Secret mounted only where snapshots are written (the backup CronJob and
/// the source role), the trusted public keys in every role (issue 38 item 1: each role that
/// signs judges what it reads by them too: retention, preflight, the journal's base); by
/// default neither is anywhere.
#[test]
fn chart_signing_key_only_where_backups_run_and_trusted_keys_in_every_role() {
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
    let pod = |kind: &str, role: &str| pod_spec(&objects, kind, role);
    for (kind, role) in [("CronJob", "backup"), ("Deployment", "source")] {
        let spec = pod(kind, role);
        assert_eq!(env(&spec, "RESTATUS_SIGNING_KEY"), Some(json!("/etc/restatus/signing/signing.key")), "{role}");
        assert_eq!(volume(&spec, "signing-key").unwrap()["secret"]["secretName"], "restatus-signing-key", "{role}");
        assert_eq!(
            env(&spec, "RESTATUS_TRUSTED_KEYS"),
            Some(json!("ed25519:AAAA,ed25519:BBBB,/etc/restatus/trusted-keys")),
            "{role}"
        );
        assert_eq!(volume(&spec, "trusted-keys").unwrap()["configMap"]["name"], "restatus-trusted-keys", "{role}");
        let mounts = spec["containers"][0]["volumeMounts"].to_string();
        assert!(mounts.contains("/etc/restatus/trusted-keys"), "{role}: {mounts}");
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
/// snapshots are written (a component that does not fit the role changes nothing) and the
/// trusted keys in every role, as the chart does.
#[test]
fn kustomize_components_put_the_signing_key_only_where_backups_run_and_trusted_keys_in_every_role() {
    let bed = Bed::get();
    // kustomize takes only relative paths to other folders: from the overlay up to `/`.
    let overlay = |role: &str| kustomize_overlay(&bed, "overlay-", role, &["signing-key", "trusted-keys"]);
    for (role, kind) in [("backup", "CronJob"), ("source", "Deployment")] {
        let spec = first_pod(&overlay(role), kind);
        assert_eq!(env(&spec, "RESTATUS_SIGNING_KEY"), Some(json!("/etc/restatus/signing/signing.key")), "{role}");
        assert_eq!(volume(&spec, "signing-key").unwrap()["secret"]["secretName"], "restatus-signing-key", "{role}");
        let mounts = spec["containers"][0]["volumeMounts"].to_string();
        assert!(mounts.contains("/etc/restatus/signing"), "{role}: {mounts}");
        assert_eq!(env(&spec, "RESTATUS_TRUSTED_KEYS"), Some(json!("/etc/restatus/trusted-keys")), "{role}");
        assert_eq!(volume(&spec, "trusted-keys").unwrap()["configMap"]["name"], "restatus-trusted-keys", "{role}");
        assert!(mounts.contains("/etc/restatus/trusted-keys"), "{role}: {mounts}");
    }
    let spec = first_pod(&overlay("controller"), "Deployment");
    assert_eq!((env(&spec, "RESTATUS_SIGNING_KEY"), volume(&spec, "signing-key")), (None, None), "the controller");
    assert_eq!(env(&spec, "RESTATUS_TRUSTED_KEYS"), Some(json!("/etc/restatus/trusted-keys")));
    assert_eq!(volume(&spec, "trusted-keys").unwrap()["configMap"]["name"], "restatus-trusted-keys");
}

/// Encrypted payloads: the recipients (public) reach only where snapshots are written (the
/// backup CronJob and the source role), the decryption key (a Secret) only the restore
/// controller; by default neither is anywhere.
#[test]
fn chart_recipients_only_where_backups_run_and_the_decryption_key_only_where_restores_run() {
    let all = ["backup.enabled=true", "controller.enabled=true", "source.enabled=true"];
    let defaults = render("restatus", &all);
    for word in ["RESTATUS_ENCRYPT_TO", "RESTATUS_DECRYPTION_KEY", "encryption-recipients", "decryption-key"] {
        assert!(!defaults.contains(word), "{word} rendered by default");
    }
    let encrypted = [
        &all[..],
        &[
            "encryption.recipients={age1aaaa,age1bbbb}",
            "encryption.recipientsConfigMap=restatus-encryption-recipients",
            "encryption.decryptionKeySecret=restatus-decryption-key",
        ],
    ]
    .concat();
    let objects = objects(&render("restatus", &encrypted));
    for (kind, role) in [("CronJob", "backup"), ("Deployment", "source")] {
        let spec = pod_spec(&objects, kind, role);
        assert_eq!(
            env(&spec, "RESTATUS_ENCRYPT_TO"),
            Some(json!("age1aaaa,age1bbbb,/etc/restatus/encryption-recipients")),
            "{role}"
        );
        let recipients = volume(&spec, "encryption-recipients").unwrap();
        assert_eq!(recipients["configMap"]["name"], "restatus-encryption-recipients", "{role}");
        assert_eq!((env(&spec, "RESTATUS_DECRYPTION_KEY"), volume(&spec, "decryption-key")), (None, None), "{role}");
        let mounts = spec["containers"][0]["volumeMounts"].to_string();
        assert!(!mounts.contains("/etc/restatus/decryption"), "{role}: {mounts}");
    }
    let spec = pod_spec(&objects, "Deployment", "controller");
    assert_eq!(
        (env(&spec, "RESTATUS_ENCRYPT_TO"), volume(&spec, "encryption-recipients")),
        (None, None),
        "no recipients where restores run"
    );
    assert_eq!(env(&spec, "RESTATUS_DECRYPTION_KEY"), Some(json!("/etc/restatus/decryption/decryption.agekey")));
    let key = volume(&spec, "decryption-key").unwrap();
    assert_eq!(key["secret"]["secretName"], "restatus-decryption-key");
    assert_eq!(key["secret"]["items"], json!([{"key": "decryption.agekey", "path": "decryption.agekey"}]));
    let mounts = spec["containers"][0]["volumeMounts"].to_string();
    assert!(mounts.contains("/etc/restatus/decryption") && !mounts.contains("encryption-recipients"), "{mounts}");
    // An unknown value under encryption is refused by the schema.
    let out =
        run(&tool("helm"), &["template", "x", CHART, "--kube-version", KUBE_VERSION, "--set", "encryption.key=x"]);
    assert!(!out.status.success() && stderr(&out).contains("values don't meet the specifications"), "{out:?}");
}

/// The same with kustomize: `manifests/components/encryption-recipients` and `decryption-key`,
/// added to each role's overlay, put the recipients only where snapshots are written and the
/// decryption key only where they are restored.
#[test]
fn kustomize_components_put_recipients_only_where_backups_run_and_the_decryption_key_only_where_restores_run() {
    let bed = Bed::get();
    let overlay =
        |role: &str| kustomize_overlay(&bed, "overlay-enc-", role, &["encryption-recipients", "decryption-key"]);
    for (role, kind) in [("backup", "CronJob"), ("source", "Deployment")] {
        let spec = first_pod(&overlay(role), kind);
        assert_eq!(env(&spec, "RESTATUS_ENCRYPT_TO"), Some(json!("/etc/restatus/encryption-recipients")), "{role}");
        let recipients = volume(&spec, "encryption-recipients").unwrap();
        assert_eq!(recipients["configMap"]["name"], "restatus-encryption-recipients", "{role}");
        assert_eq!((env(&spec, "RESTATUS_DECRYPTION_KEY"), volume(&spec, "decryption-key")), (None, None), "{role}");
    }
    let spec = first_pod(&overlay("controller"), "Deployment");
    assert_eq!((env(&spec, "RESTATUS_ENCRYPT_TO"), volume(&spec, "encryption-recipients")), (None, None));
    assert_eq!(env(&spec, "RESTATUS_DECRYPTION_KEY"), Some(json!("/etc/restatus/decryption/decryption.agekey")));
    assert_eq!(volume(&spec, "decryption-key").unwrap()["secret"]["secretName"], "restatus-decryption-key");
}

/// The kustomize component `manifests/components/s3-ca` mounts ConfigMap restatus-s3-ca and
/// names it by RESTATUS_S3_CA_FILE in every role, as the chart's `s3.caBundle` does.
#[test]
fn kustomize_s3_ca_component_reaches_every_role() {
    let bed = Bed::get();
    for (role, kind) in [("backup", "CronJob"), ("source", "Deployment"), ("controller", "Deployment")] {
        let spec = pod_spec(&kustomize_overlay(&bed, "overlay-ca-", role, &["s3-ca"]), kind, role);
        assert_eq!(env(&spec, "RESTATUS_S3_CA_FILE"), Some(json!("/etc/restatus/s3-ca/ca.crt")), "{role}");
        let ca = volume(&spec, "s3-ca").map(|v| v["configMap"]["name"].clone());
        assert_eq!(ca, Some(json!("restatus-s3-ca")), "{role}");
        let mounts = spec["containers"][0]["volumeMounts"].to_string();
        assert!(mounts.contains("/etc/restatus/s3-ca"), "{role}: {mounts}");
    }
}

/// manifests/journal with every component of manifests/components: the signing key and the
/// recipients (it writes segments), the trusted keys (it verifies its base) and the private CA
/// reach the journal's container, never the decryption key (where backups run, no private age
/// key), as the chart's values reach its journal role.
#[test]
fn kustomize_components_wire_the_journal_as_the_chart_does() {
    let bed = Bed::get();
    let all = ["signing-key", "trusted-keys", "encryption-recipients", "decryption-key", "s3-ca"];
    let spec = first_pod(&kustomize_overlay(&bed, "overlay-jrn-", "journal", &all), "Deployment");
    assert_eq!(spec["containers"][0]["name"], "journal");
    for (var, value) in [
        ("RESTATUS_SIGNING_KEY", "/etc/restatus/signing/signing.key"),
        ("RESTATUS_TRUSTED_KEYS", "/etc/restatus/trusted-keys"),
        ("RESTATUS_ENCRYPT_TO", "/etc/restatus/encryption-recipients"),
        ("RESTATUS_S3_CA_FILE", "/etc/restatus/s3-ca/ca.crt"),
    ] {
        assert_eq!(env(&spec, var), Some(json!(value)), "{var}");
        let dir = value.rsplit_once('/').map_or(value, |(d, _)| d);
        let dir = if var == "RESTATUS_TRUSTED_KEYS" || var == "RESTATUS_ENCRYPT_TO" { value } else { dir };
        let mounts = spec["containers"][0]["volumeMounts"].to_string();
        assert!(mounts.contains(dir), "{var}: {dir} not mounted: {mounts}");
    }
    for volume_name in ["signing-key", "trusted-keys", "encryption-recipients", "s3-ca", "tmp"] {
        assert!(volume(&spec, volume_name).is_some(), "no volume {volume_name}");
    }
    assert_eq!((env(&spec, "RESTATUS_DECRYPTION_KEY"), volume(&spec, "decryption-key")), (None, None));
}

/// Released as `restatus` in namespace `restatus`, each role has the names of its kustomize
/// folder: its ClusterRole, lease Role, admission policy and binding are equal to those, field
/// for field; its pods run as the same user with the same limits, spread and disruption budget.
#[test]
fn chart_roles_mirror_the_kustomize_folders() {
    let bed = Bed::get();
    for (role, workload_kind) in
        [("backup", "CronJob"), ("controller", "Deployment"), ("source", "Deployment"), ("journal", "Deployment")]
    {
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
            "backup" | "journal" => vec!["ClusterRole", "ClusterRoleBinding"],
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
        // The spread and the disruption budget alike, but for the chart's instance label.
        let spread = |pod: &Value| {
            pod["topologySpreadConstraints"].as_array().map(|c| {
                c.iter()
                    .map(|c| (c["maxSkew"].clone(), c["topologyKey"].clone(), c["whenUnsatisfiable"].clone()))
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(spread(&chart_pod), spread(&kustomize_pod), "{role}: topologySpreadConstraints");
        let budget = |objects: &[Value]| {
            objects.iter().find(|o| o["kind"] == "PodDisruptionBudget").map(|o| o["spec"]["maxUnavailable"].clone())
        };
        assert_eq!(budget(&chart), budget(&kustomize), "{role}: PodDisruptionBudget");
        assert_eq!(budget(&chart).is_some(), !["backup", "journal"].contains(&role), "{role}: PodDisruptionBudget");
        for field in ["securityContext", "resources", "volumeMounts", "ports", "livenessProbe", "readinessProbe"] {
            assert_eq!(chart_pod["containers"][0][field], kustomize_pod["containers"][0][field], "{role}: {field}");
        }
        let strategy = |objects: &[Value]| find(objects, workload_kind, &name)["spec"]["strategy"].clone();
        assert_eq!(strategy(&chart), strategy(&kustomize), "{role}: strategy");
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
    apply_in(bed, kubeconfig, RELEASE, yaml, extra)
}

/// [`apply`] in namespace `namespace`.
fn apply_in(bed: &Bed, kubeconfig: &Path, namespace: &str, yaml: &str, extra: &[&str]) -> Output {
    let write = |what: &str, text: &str| {
        let path = bed.scratch.path().join(format!("{}.yaml", unique(what)));
        std::fs::write(&path, text).unwrap();
        path
    };
    let namespace = write("namespace", &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n"));
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
        vec!["-n", &ns, "get", "clusterclasses.cluster.x-k8s.io"],
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

/// Every role with ServiceMonitor, PodMonitor and PrometheusRule, and NetworkPolicies: the API
/// server accepts all of it (server-side dry run, validated against the prometheus-operator CRDs
/// of the test bed).
#[test]
fn chart_monitoring_objects_pass_server_side_validation() {
    let bed = Bed::get();
    let yaml = render(
        RELEASE,
        &[
            "controller.enabled=true",
            "source.enabled=true",
            "journal.enabled=true",
            "metrics.podMonitor.enabled=true",
            "metrics.serviceMonitor.enabled=true",
            "prometheusRule.enabled=true",
            "metrics.podMonitor.force=true",
            "metrics.serviceMonitor.force=true",
            "prometheusRule.force=true",
            "s3.accessKeyId=AKIAEXAMPLE",
            "s3.secretAccessKey=secret",
            "s3.caBundle.configMap=s3-ca",
            "networkPolicy.enabled=true",
            "networkPolicy.egress.apiServer.cidrs={127.0.0.1/32}",
            "networkPolicy.egress.s3.cidrs={127.0.0.1/32}",
            "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",
            "networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus",
        ],
    );
    let rendered = objects(&yaml);
    for kind in ["PodMonitor", "ServiceMonitor", "Service", "PrometheusRule", "Secret", "CronJob", "NetworkPolicy"] {
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
        let mut sets = vec!["prometheusRule.enabled=true", "prometheusRule.force=true"];
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
            "prometheusRule.journalMaxLagSeconds=45",
            "prometheusRule.journalDownFor=45m",
            "prometheusRule.additionalLabels.team=metal",
        ],
    );
    let text = serde_json::to_string(&custom["spec"]).unwrap();
    assert!(text.contains("> 90000") && text.contains(r#"cronjob=\"other-restatus-backup\""#), "{text}");
    assert!(text.contains("(restatus_journal_lag_seconds) > 45") && text.contains(r#""for":"45m""#), "{text}");
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

/// A cluster-scoped CRD of the test's own (`kind`/`plural` in `group`, v1, with a status
/// subresource), installed on `kubeconfig`'s cluster and Established.
fn install_crd(bed: &Bed, kubeconfig: &Path, group: &str, kind: &str, plural: &str) {
    let preserve = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Cluster",
                 "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                 "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": preserve, "status": preserve}}}}]},
    });
    let file = bed.scratch.path().join(format!("crd-{plural}-{group}.json"));
    std::fs::write(&file, crd.to_string()).unwrap();
    assert_success(&bed.kubectl(kubeconfig, &["apply", "-f", file.to_str().unwrap()]), "install a CRD");
    let established = bed.kubectl(
        kubeconfig,
        &["wait", "--for=condition=Established", &format!("crd/{plural}.{group}"), "--timeout=60s"],
    );
    assert_success(&established, "the CRD established");
}

/// Issue 25: a custom profile works end to end. profile.custom (the built-in kinds, a Widget of
/// the test's own, and a Secret, which restatus never captures) reaches every role as a
/// ConfigMap named by RESTATUS_PROFILE, given as YAML or as a file's text alike; applied to the
/// test bed, each role's ServiceAccount may do on Widgets (and their status) exactly what it may
/// do on Servers, nothing on a Gadget of the same group that the profile does not list, nothing
/// on Secrets; the admission policies hold Widgets to restatus's annotations as they hold
/// Servers; a backup as the backup ServiceAccount with the rendered profile captures the
/// Widget, and a restore as the controller's ServiceAccount brings its status back. The default
/// profile's kinds are the built-in profile's.
#[tokio::test]
async fn chart_custom_profile_kinds_are_granted_and_guarded_like_the_built_in_ones() {
    const PROFILE_RELEASE: &str = "restatus-profile";
    let bed = Bed::get();
    let helm_kinds = |objects: &[Value], name: &str| {
        let role = find(objects, "ClusterRole", name);
        let mut plurals: Vec<String> = role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["apiGroups"] != json!([""]) && r["apiGroups"] != json!(["events.k8s.io"]))
            .flat_map(|r| r["resources"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()))
            .collect();
        plurals.sort();
        plurals
    };
    // The default: the built-in profile's kinds, no ConfigMap, no RESTATUS_PROFILE.
    let defaults = objects(&render("r", &sets(&only("backup"))));
    let mut builtin: Vec<String> = Profile::metal_operator().kinds.iter().map(|k| k.plural.clone()).collect();
    builtin.sort();
    assert_eq!(helm_kinds(&defaults, "r-restatus-backup"), builtin);
    assert!(!defaults.iter().any(|o| o["kind"] == "ConfigMap"), "{:?}", kinds(&defaults));
    assert_eq!(env(&pod_spec(&defaults, "CronJob", "backup"), "RESTATUS_PROFILE"), None);

    let spec = FleetSpec::new(&unique("chart-prof"), 1, 1, 0);
    let group = format!("{}.e2e.restatus.dev", spec.name);
    let mut profile = serde_json::to_value(Profile::metal_operator()).unwrap();
    profile["name"] = json!("metal-and-widgets");
    let kinds_of = profile["kinds"].as_array_mut().unwrap();
    kinds_of.push(json!({"group": group, "version": "v1", "kind": "Widget", "namespaced": false}));
    kinds_of.push(json!({"group": "", "version": "v1", "kind": "Secret", "namespaced": true}));
    let profile_file = bed.scratch.path().join(format!("{}-profile.json", spec.name));
    std::fs::write(&profile_file, profile.to_string()).unwrap();
    let values_file = bed.scratch.path().join(format!("{}-values.json", spec.name));
    std::fs::write(&values_file, json!({"profile": {"custom": profile}}).to_string()).unwrap();

    let ns = unique("chart-prof-capi");
    let roles = ["controller.enabled=true", "source.enabled=true", &format!("source.clusterNamespace={ns}")]
        .map(|set| ["--set".to_string(), set.to_string()]);
    let roles: Vec<String> = roles.into_iter().flatten().collect();
    let as_text = render_with(
        PROFILE_RELEASE,
        &[sets(&roles), vec!["--set-file", &format!("profile.custom={}", profile_file.display())]].concat(),
    );
    let as_yaml = render_with(PROFILE_RELEASE, &[sets(&roles), vec!["-f", values_file.to_str().unwrap()]].concat());
    let rendered = objects(&as_text);
    for kind in ["ClusterRole", "ValidatingAdmissionPolicy"] {
        let pick = |objects: &[Value]| -> Vec<Value> {
            objects.iter().filter(|o| o["kind"] == kind).map(|o| json!([o["rules"], o["spec"]])).collect()
        };
        assert_eq!(pick(&rendered), pick(&objects(&as_yaml)), "{kind}: the profile as text and as YAML");
    }
    // The ConfigMap holds the profile; every role mounts it and names it.
    let config_map = find(&rendered, "ConfigMap", &format!("{PROFILE_RELEASE}-profile"));
    let text = config_map["data"]["profile.yaml"].as_str().unwrap();
    let parsed = Profile::parse("ConfigMap", text).expect("the ConfigMap's profile parses");
    assert_eq!(parsed, Profile::load(profile_file.to_str().unwrap()).unwrap());
    for (kind, role) in [("CronJob", "backup"), ("Deployment", "controller"), ("Deployment", "source")] {
        let pod = pod_spec(&rendered, kind, role);
        let path = env(&pod, "RESTATUS_PROFILE").unwrap_or_else(|| panic!("{role}: no RESTATUS_PROFILE"));
        let mount = pod["containers"][0]["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "profile");
        assert_eq!(format!("{}/profile.yaml", mount.unwrap()["mountPath"].as_str().unwrap()), path.as_str().unwrap());
        let volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "profile").unwrap();
        assert_eq!(volume["configMap"]["name"], config_map["metadata"]["name"], "{role}");
    }
    let mut expected = builtin.clone();
    expected.push("widgets".into());
    expected.sort();
    assert_eq!(
        helm_kinds(&rendered, &format!("{PROFILE_RELEASE}-backup")),
        expected,
        "the backup role's kinds: the profile's, but Secret"
    );

    // On the test bed: the Widget CRD, and a Gadget CRD the profile does not list.
    let admin = &bed.source_kubeconfig;
    install_crd(&bed, admin, &group, "Widget", "widgets");
    install_crd(&bed, admin, &group, "Gadget", "gadgets");
    assert_success(&apply_in(&bed, admin, PROFILE_RELEASE, &as_text, &[]), "apply the chart with the profile");

    let widgets = format!("widgets.{group}");
    let can = |role: &str, verb: &str, resource: &str, sub: Option<&str>| {
        let account = format!("system:serviceaccount:{PROFILE_RELEASE}:{PROFILE_RELEASE}-{role}");
        let mut args = vec!["auth", "can-i", verb, resource, "--as", &account];
        let sub = sub.map(|s| format!("--subresource={s}"));
        args.extend(sub.as_deref());
        let out = bed.kubectl(admin, &args);
        match stdout(&out).trim() {
            "yes" => true,
            "no" => false,
            other => panic!("can-i {args:?}: {other} {}", stderr(&out)),
        }
    };
    let verbs = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"];
    for role in ["backup", "controller", "source"] {
        let mut granted = vec![];
        for verb in verbs {
            for sub in [None, Some("status")] {
                let server = can(role, verb, "servers.metal.ironcore.dev", sub);
                assert_eq!(can(role, verb, &widgets, sub), server, "{role}: {verb} {sub:?} on Widgets vs Servers");
                assert!(!can(role, verb, &format!("gadgets.{group}"), sub), "{role}: {verb} {sub:?} on Gadgets");
                assert!(!can(role, verb, "secrets", sub), "{role}: {verb} {sub:?} on Secrets");
                if server {
                    granted.push(format!("{verb}{}", sub.map(|s| format!("/{s}")).unwrap_or_default()));
                }
            }
        }
        let expected: &[&str] = match role {
            "backup" => &["get", "list", "watch"],
            "controller" => &["get", "list", "watch", "update", "update/status", "patch"],
            _ => &["get", "list", "watch", "patch"],
        };
        assert_eq!(granted, expected, "{role}: what it may do on a kind of its profile");
    }

    // The admission policies hold a Widget as they hold a Server.
    let widget = json!({
        "apiVersion": format!("{group}/v1"), "kind": "Widget",
        "metadata": {"name": "w1", "labels": {FLEET_LABEL: spec.name}}, "spec": {"size": 3},
    });
    let widget_file = bed.scratch.path().join(format!("{}-widget.json", spec.name));
    std::fs::write(&widget_file, widget.to_string()).unwrap();
    assert_success(&bed.kubectl(admin, &["create", "-f", widget_file.to_str().unwrap()]), "create a Widget");
    let status = r#"{"status":{"state":"Ready"}}"#;
    let set_status = ["patch", &format!("{widgets}/w1"), "--subresource=status", "--type=merge", "-p", status];
    assert_success(&bed.kubectl(admin, &set_status), "the Widget's status");
    let object = format!("{widgets}/w1");
    let kubeconfig_of = |role: &str| {
        let account = format!("{PROFILE_RELEASE}-{role}");
        let token = bed.kubectl(admin, &["-n", PROFILE_RELEASE, "create", "token", &account]);
        assert_success(&token, "create token");
        bed.kubeconfig_with_token(admin, &account, stdout(&token).trim())
    };
    for role in ["controller", "source"] {
        let kubeconfig = kubeconfig_of(role);
        let resize = merge_patch(None, &object, r#"{"spec":{"size":4}}"#);
        let within = std::time::Duration::from_secs(60);
        bed.wait_denied(&kubeconfig, &resize, "may not change spec", within).await.unwrap();
        let mut denied = foreign_patches(&object);
        denied.push(resize.clone());
        bed.assert_denied(&kubeconfig, &denied);
        crate::bed::assert_only_the_quiesce_protocol(&bed, admin, &kubeconfig, &object);
    }

    // A backup as the chart's backup ServiceAccount, with the profile its pods are given.
    fleet::create(&bed.source().await, &spec, 8).await.unwrap();
    let kubeconfig = kubeconfig_of("backup");
    let mounted = bed.scratch.path().join(format!("{}-mounted.yaml", spec.name));
    std::fs::write(&mounted, text).unwrap();
    let storage = bed.storage(&spec.name);
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let out = bed.restatus_with(
        &kubeconfig,
        &storage,
        &spec.name,
        &["backup", "--selector", &selector],
        &[("RESTATUS_PROFILE", mounted.to_str().unwrap())],
    );
    assert_success(&out, "backup with the custom profile as the chart's backup ServiceAccount");
    let (manifest, records) = records(&bed.store(&storage, &spec.name), stdout(&out).trim()).await;
    let captured: Vec<&str> = records.iter().map(|r| r.kind.as_str()).collect();
    assert!(captured.contains(&"Widget") && captured.contains(&"Server"), "{captured:?} {manifest:?}");

    // And a restore as the controller's ServiceAccount: the Widget's status, removed, comes back
    // (the snapshot is this cluster's own, restored onto it on purpose: --allow-same-cluster).
    let unset = ["patch", &object, "--subresource=status", "--type=merge", "-p", r#"{"status":null}"#];
    assert_success(&bed.kubectl(admin, &unset), "remove the Widget's status");
    let state = || stdout(&bed.kubectl(admin, &["get", &object, "-o", "jsonpath={.status.state}"]));
    assert_eq!(state(), "", "the Widget's status removed");
    let out = bed.restatus_with(
        &kubeconfig_of("controller"),
        &storage,
        &spec.name,
        &["restore", "--selector", &selector, "--allow-same-cluster"],
        &[("RESTATUS_PROFILE", mounted.to_str().unwrap())],
    );
    assert_success(&out, "restore with the custom profile as the chart's controller ServiceAccount");
    assert_eq!(state(), "Ready", "the Widget's status restored:\n{}{}", stdout(&out), stderr(&out));
}

/// F160 (issue 38, item 8): the source's fleet deleted by accident, then a day of the chart's
/// backup CronJob (its rendered arguments: `keepLast: 48`, `maxAge: 14d`, `maxRecordDrop: 50`).
/// The first capture after the deletion is written but marked and exits 4, every one after it
/// too (the drop is not acknowledged), and retention (in each backup and in a `snapshots prune`
/// with the chart's defaults) keeps the last snapshot that held the fleet; a person deleting it
/// by hand (refused without `--force`, naming the drop) acknowledges the drop, and the next
/// backup exits 0. Before: 48 empty snapshots later every snapshot of the fleet was gone.
#[tokio::test]
async fn chart_backups_keep_the_snapshot_before_a_drop_in_records() {
    let bed = Bed::get();
    let backup = objects(&render("restatus", &sets(&only("backup"))));
    let container = &pod_spec(&backup, "CronJob", "backup")["containers"][0];
    let mut args: Vec<String> =
        container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
    for default in ["--keep-last=48", "--max-age=14d", "--max-record-drop=50"] {
        assert!(args.iter().any(|a| a == default), "{default} not in the CronJob's {args:?}");
    }
    // The test's own fleet: the shared source holds other tests' objects.
    let spec = FleetSpec::new(&unique("drop"), 4, 2, 2);
    fleet::create(&bed.source().await, &spec, 8).await.expect("create fleet");
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    args.extend(["--selector".to_string(), selector.clone()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let storage = bed.storage("drop");
    let cluster = "drop";
    let store = bed.store(&storage, cluster);
    let backup = |expect: i32| {
        let out = bed.restatus(&storage, cluster, &args);
        assert_eq!(out.status.code(), Some(expect), "backup: {}", stderr(&out));
        stdout(&out).trim().to_string()
    };
    let good = backup(0);

    for kinds in ["servers,bmcs", "serverclaims"] {
        let out = bed.kubectl(&bed.source_kubeconfig, &["delete", kinds, "-A", "-l", &selector, "--wait=true"]);
        assert_success(&out, &format!("delete the fleet's {kinds}"));
    }
    let first = backup(4);
    let (manifest, captured) = records(&store, &first).await;
    assert!(captured.is_empty(), "{captured:?}");
    let drop = manifest.record_drop.expect("the capture after the deletion is marked");
    let held = records(&store, &good).await.0.payload.records;
    assert!(held >= 8, "the fleet's 4 Servers, 2 BMCs and 2 claims at least: {held}");
    assert_eq!((drop.previous.as_str(), drop.previous_records, drop.threshold_percent), (good.as_str(), held, 50));
    // A day of the schedule: 48 captures after the deletion, each marked against the good one.
    for _ in 1..48 {
        backup(4);
    }
    let ids = || async { store.list().await.unwrap().into_iter().map(|e| e.id.to_string()).collect::<Vec<_>>() };
    let left = ids().await;
    assert_eq!(left.len(), 49, "48 marked ones and the good one: {left:?}");
    assert_eq!(left[0], good, "the good snapshot survives a day of empty captures");
    let prune = bed.restatus(&storage, cluster, &["snapshots", "prune", "--keep-last", "48", "--max-age", "14d"]);
    assert_success(&prune, "prune with the chart's defaults");
    assert!(stderr(&prune).contains(&format!("drop in records that snapshot {first} marks")), "{}", stderr(&prune));
    assert_eq!(ids().await[0], good, "prune keeps it too");

    // A person decides the drop was meant: deleting the good one is refused without --force.
    let refused = bed.restatus(&storage, cluster, &["snapshots", "delete", &good]);
    assert!(
        !refused.status.success() && stderr(&refused).contains("last snapshot before the drop"),
        "{}",
        stderr(&refused)
    );
    assert_success(&bed.restatus(&storage, cluster, &["snapshots", "delete", &good, "--force"]), "delete by hand");
    let after = backup(0);
    assert_eq!(records(&store, &after).await.0.record_drop, None, "acknowledged: no mark");
}

/// F151, F152 as deployed: `controller.expectSource` and `controller.requireEncryption` reach
/// the controller (and only it) as `--expect-source` and `--require-encryption`, which the
/// binary takes; nothing of them by default; encryption required without a decryption key
/// fails at render, naming the value to set. Kustomize: the controller names the source by
/// RESTATUS_EXPECT_SOURCE (empty until set), and the component `require-encryption` sets
/// RESTATUS_REQUIRE_ENCRYPTION on the controller alone.
#[test]
fn chart_and_kustomize_let_the_controller_name_its_source_and_require_encryption() {
    let bed = Bed::get();
    let all = ["backup.enabled=true", "controller.enabled=true", "source.enabled=true", "journal.enabled=true"];
    let args = |objects: &[Value], kind: &str, role: &str| -> Vec<String> {
        let spec = pod_spec(objects, kind, role);
        spec["containers"][0]["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
    };
    let defaults = objects(&render("restatus", &all));
    let rendered = render("restatus", &all);
    assert!(!rendered.contains("--expect-source") && !rendered.contains("--require-encryption"), "by default");
    let demands = [
        &all[..],
        &[
            "controller.expectSource={11111111-aaaa-4bbb-8ccc-000000000001,22222222-aaaa-4bbb-8ccc-000000000002}",
            "controller.requireEncryption=true",
            "encryption.decryptionKeySecret=restatus-decryption-key",
        ],
    ]
    .concat();
    let objects = objects(&render("restatus", &demands));
    let controller = args(&objects, "Deployment", "controller");
    assert!(
        controller.contains(
            &"--expect-source=11111111-aaaa-4bbb-8ccc-000000000001,22222222-aaaa-4bbb-8ccc-000000000002".to_string()
        ),
        "{controller:?}"
    );
    assert!(controller.contains(&"--require-encryption".to_string()), "{controller:?}");
    for (kind, role) in [("CronJob", "backup"), ("Deployment", "source"), ("Deployment", "journal")] {
        assert_eq!(args(&objects, kind, role), args(&defaults, kind, role), "{role}: unchanged");
    }
    // The binary takes the rendered arguments (parsed; it stops at the missing kubeconfig).
    let mut run_args = controller.clone();
    run_args.extend(["--kubeconfig".into(), "/nonexistent".into()]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_restatus")).args(&run_args).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "parsed, then no cluster: {}", stderr(&out));

    let mut missing = vec!["controller.enabled=true", "controller.requireEncryption=true"];
    missing.extend(REQUIRED);
    let err = render_fails(&missing);
    assert!(err.contains("controller.requireEncryption needs encryption.decryptionKeySecret"), "{err}");
    assert!(render_fails(&[&REQUIRED[..], &["controller.expectSource=uid"]].concat()).contains("expectSource"));

    let plain = first_pod(&kustomize(&bed, "controller"), "Deployment");
    assert_eq!(env(&plain, "RESTATUS_EXPECT_SOURCE"), Some(json!("")), "named, empty until set");
    assert_eq!(env(&plain, "RESTATUS_REQUIRE_ENCRYPTION"), None);
    let overlay = |role: &str| kustomize_overlay(&bed, "overlay-req-", role, &["decryption-key", "require-encryption"]);
    let spec = first_pod(&overlay("controller"), "Deployment");
    assert_eq!(env(&spec, "RESTATUS_REQUIRE_ENCRYPTION"), Some(json!("true")));
    assert_eq!(env(&spec, "RESTATUS_DECRYPTION_KEY"), Some(json!("/etc/restatus/decryption/decryption.agekey")));
    for (role, kind) in [("backup", "CronJob"), ("source", "Deployment")] {
        assert_eq!(env(&first_pod(&overlay(role), kind), "RESTATUS_REQUIRE_ENCRYPTION"), None, "{role}");
    }
}
