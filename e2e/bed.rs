//! Access to the test bed started by `scripts/testbed up`: clusters, S3, the restatus binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use kube::config::Kubeconfig;
use restatus::domain::annotations::{QUIESCED_BY_ANNOTATION, RESTORED_FROM_ANNOTATION};
use restatus::format::{Manifest, Record};
use restatus::store::SnapshotStore;

pub struct Bed {
    pub source_kubeconfig: PathBuf,
    pub target_kubeconfig: PathBuf,
    pub bucket: String,
    pub kubectl: PathBuf,
    pub scratch: tempfile::TempDir,
}

/// A variable of the test bed's environment (`scripts/testbed env`).
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: the e2e tests need the test bed. Run `scripts/test`, or \
             `scripts/testbed up && source \"$(scripts/testbed env)\"` and then `cargo test --features e2e`"
        )
    })
}

impl Bed {
    pub fn get() -> Bed {
        let kubectl = std::env::var("RESTATUS_BIN")
            .map(|bin| Path::new(&bin).join("kubectl"))
            .unwrap_or_else(|_| PathBuf::from("kubectl"));
        for var in ["S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
            env(var);
        }
        Bed {
            source_kubeconfig: env("KUBECONFIG_SOURCE").into(),
            target_kubeconfig: env("KUBECONFIG_TARGET").into(),
            bucket: env("RESTATUS_BUCKET"),
            kubectl,
            scratch: tempfile::tempdir().expect("temp dir"),
        }
    }

    pub async fn source(&self) -> kube::Client {
        restatus::k8s::client(Some(&self.source_kubeconfig), None).await.expect("source cluster client")
    }

    pub async fn target(&self) -> kube::Client {
        restatus::k8s::client(Some(&self.target_kubeconfig), None).await.expect("target cluster client")
    }

    /// A storage URL of its own for one test: tests share the bucket, never a prefix.
    pub fn storage(&self, test: &str) -> String {
        format!("s3://{}/{}", self.bucket, unique(test))
    }

    pub fn store(&self, storage: &str, cluster: &str) -> SnapshotStore {
        SnapshotStore::open(storage, cluster).expect("open S3 store")
    }

    /// Runs the restatus binary against the source cluster with the test bed's S3 environment.
    pub fn restatus(&self, storage: &str, cluster: &str, args: &[&str]) -> Output {
        self.restatus_with(&self.source_kubeconfig, storage, cluster, args, &[])
    }

    pub fn restatus_with(
        &self,
        kubeconfig: &Path,
        storage: &str,
        cluster: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Output {
        Self::command(kubeconfig, storage, cluster, args, env).output().expect("run restatus")
    }

    /// Starts `command` (a [`Bed::command`]), its stdout discarded and its stderr in a log file
    /// of its own, named after its first argument: the process and its log.
    pub fn spawn(&self, mut command: Command) -> (Child, PathBuf) {
        let name = command.get_args().next().map_or("restatus".into(), |a| a.to_string_lossy().into_owned());
        let log = self.scratch.path().join(format!("{}.log", unique(&name)));
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("a log file"))
            .spawn()
            .expect("start restatus");
        (child, log)
    }

    /// `restatus ARGS --kubeconfig KUBECONFIG` on `storage` under the cluster id `cluster`, with
    /// the test bed's S3 environment and `env`.
    pub fn command(kubeconfig: &Path, storage: &str, cluster: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_restatus"));
        cmd.args(args)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env("RESTATUS_STORAGE", storage)
            .env("RESTATUS_CLUSTER_ID", cluster)
            .envs(env.iter().copied());
        cmd
    }

    pub fn kubectl(&self, kubeconfig: &Path, args: &[&str]) -> Output {
        Command::new(&self.kubectl).arg("--kubeconfig").arg(kubeconfig).args(args).output().expect("run kubectl")
    }

    /// Applies `manifests/<dir>` for each of `dirs` with the admin kubeconfig `base`, and
    /// returns a kubeconfig that authenticates as the ServiceAccount `restatus/<account>`.
    pub fn deploy(&self, base: &Path, dirs: &[&str], account: &str) -> PathBuf {
        for dir in dirs {
            let path = format!("{}/manifests/{dir}", env!("CARGO_MANIFEST_DIR"));
            assert_success(&self.kubectl(base, &["apply", "-k", &path]), &format!("apply -k manifests/{dir}"));
        }
        let token = self.kubectl(base, &["-n", "restatus", "create", "token", account]);
        assert_success(&token, "create token");
        self.kubeconfig_with_token(base, account, stdout(&token).trim())
    }

    /// Each kubectl command fails, forbidden by RBAC or denied by an admission policy.
    pub fn assert_denied(&self, kubeconfig: &Path, commands: &[Vec<&str>]) {
        for args in commands {
            let out = self.kubectl(kubeconfig, args);
            assert!(!out.status.success(), "{args:?} was allowed: {}", stdout(&out));
            let err = stderr(&out);
            assert!(err.contains("forbidden") || err.contains("denied request"), "{args:?}: {err}");
        }
    }

    /// Waits (at most `within`) until an admission policy just applied is in force: the write
    /// `args` (a kubectl command it must deny) is sent with `--dry-run=server` (`dryRun=All`:
    /// admitted or denied, never stored) until the answer is a denial whose message holds
    /// `message`. The API server admits with the policies its informer has seen, a moment
    /// after they are written, and nothing on the bed reports when that is.
    pub async fn wait_denied(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        message: &str,
        within: Duration,
    ) -> Result<(), String> {
        let mut dry_run = args.to_vec();
        dry_run.push("--dry-run=server");
        let deadline = std::time::Instant::now() + within;
        loop {
            let out = self.kubectl(kubeconfig, &dry_run);
            let err = stderr(&out);
            if !out.status.success() && err.contains("denied request") && err.contains(message) {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(format!("the policy did not deny {args:?} within {within:?}: {}{err}", stdout(&out)));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits (at most `within`) until the write `args`, sent with `--dry-run=server` as
    /// [`Bed::wait_denied`] sends it, is allowed: a policy just removed is no longer in force.
    pub async fn wait_allowed(&self, kubeconfig: &Path, args: &[&str], within: Duration) -> Result<(), String> {
        let mut dry_run = args.to_vec();
        dry_run.push("--dry-run=server");
        let deadline = std::time::Instant::now() + within;
        loop {
            let out = self.kubectl(kubeconfig, &dry_run);
            if out.status.success() {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(format!("{args:?} still refused after {within:?}: {}", stderr(&out)));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Each kubectl command succeeds.
    pub fn assert_allowed(&self, kubeconfig: &Path, commands: &[Vec<&str>]) {
        for args in commands {
            assert_success(&self.kubectl(kubeconfig, args), &format!("{args:?}"));
        }
    }

    /// A copy of `base` (a cluster's admin kubeconfig) that authenticates with `token`.
    pub fn kubeconfig_with_token(&self, base: &Path, name: &str, token: &str) -> PathBuf {
        let mut config = Kubeconfig::read_from(base).expect("read kubeconfig");
        for auth in &mut config.auth_infos {
            if let Some(info) = auth.auth_info.as_mut() {
                *info = serde_json::from_value(serde_json::json!({ "token": token })).expect("auth info");
            }
        }
        let path = self.scratch.path().join(format!("{name}.kubeconfig"));
        std::fs::write(&path, serde_json::to_vec(&config).expect("kubeconfig json")).expect("write kubeconfig");
        path
    }
}

/// Tests that use the target cluster hold this shared; the test that restarts its API server
/// holds it exclusively, so no other test sees the outage.
pub static TARGET: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Tests that run `clusterctl move` hold this for their whole run: a move copies every
/// cluster-scoped object labelled for moving, whatever its namespace flag says, so two moves at
/// once would carry each other's fleets.
pub static MOVES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

/// kubectl arguments for a merge patch of `object` (`resource/name`), in `namespace` if given.
pub fn merge_patch<'a>(namespace: Option<&'a str>, object: &'a str, body: &'a str) -> Vec<&'a str> {
    let mut args = namespace.map(|ns| vec!["-n", ns]).unwrap_or_default();
    args.extend(["patch", object, "--type=merge", "-p", body]);
    args
}

/// The merge patch with which restatus quiesces an object.
pub const QUIESCE_PATCH: &str = r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":"ignore","restatus.ironcore.dev/quiesced-by":"restatus"}}}"#;

/// Patches of a metal-operator `object` that no restatus role may make: its spec, its
/// labels, an annotation that is not restatus's.
pub fn foreign_patches(object: &str) -> Vec<Vec<&str>> {
    [
        r#"{"spec":{"power":"Off"}}"#,
        r#"{"metadata":{"labels":{"x":"y"}}}"#,
        r#"{"metadata":{"annotations":{"other":"x"}}}"#,
    ]
    .into_iter()
    .map(|body| merge_patch(None, object, body))
    .collect()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[track_caller]
pub fn assert_success(out: &Output, what: &str) {
    assert!(out.status.success(), "{what} failed ({}):\nstdout: {}\nstderr: {}", out.status, stdout(out), stderr(out));
}

/// The snapshot `id`'s objects copied from `from` into `to` (payload, signature, manifest last),
/// byte for byte, as `aws s3 cp` copies them between two environments' prefixes.
pub async fn copy_snapshot(from: &SnapshotStore, to: &SnapshotStore, id: &str) {
    use object_store::ObjectStoreExt;
    let id = id.parse().unwrap();
    for (source, target) in [
        (from.payload_path(&id), to.payload_path(&id)),
        (from.signature_path(&id), to.signature_path(&id)),
        (from.manifest_path(&id), to.manifest_path(&id)),
    ] {
        let bytes = from.object_store().get(&source).await.unwrap().bytes().await.unwrap();
        to.object_store().put(&target, bytes.into()).await.unwrap();
    }
}

/// Loads a snapshot fully verified and returns its records.
pub async fn records(store: &SnapshotStore, manifest_id: &str) -> (Manifest, Vec<Record>) {
    let id = manifest_id.trim().parse().expect("snapshot id");
    let mut records = Vec::new();
    let manifest = store
        .load(&id, |r| {
            records.push(r);
            Ok(())
        })
        .await
        .expect("snapshot loads and verifies");
    (manifest, records)
}

/// What `clusterctl move` does to an object, simulated: the same spec, labels and annotations
/// on the target, created without status (and, through `rename`, optionally another name).
pub async fn simulate_move(source: &kube::Client, target: &kube::Client, fleet: &str, rename: &dyn Fn(&str) -> String) {
    use kube::api::{ListParams, PostParams};
    let profile = restatus::domain::identity::Profile::metal_operator();
    for kind in ["BMC", "Server", "ServerClaim"] {
        let kind = profile.kind(kind).unwrap();
        let selector = format!("{}={fleet}", restatus::fleet::FLEET_LABEL);
        let list =
            restatus::k8s::api_for(source, kind, None).list(&ListParams::default().labels(&selector)).await.unwrap();
        for object in list {
            let meta = &object.metadata;
            let copy = serde_json::json!({
                "apiVersion": kind.api_version(),
                "kind": kind.kind,
                "metadata": {"name": rename(meta.name.as_deref().unwrap()), "namespace": meta.namespace,
                             "labels": meta.labels, "annotations": meta.annotations},
                "spec": object.data["spec"],
            });
            let api = restatus::k8s::api_for(target, kind, meta.namespace.as_deref());
            if let Some(ns) = &meta.namespace {
                ensure_namespace(target, ns).await;
            }
            api.create(&PostParams::default(), &serde_json::from_value(copy).unwrap()).await.unwrap();
        }
    }
}

/// Creates namespace `name` unless it exists.
pub async fn ensure_namespace(client: &kube::Client, name: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: kube::Api<Namespace> = kube::Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    match api.create(&Default::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_already_exists() => {}
        Err(e) => panic!("create namespace {name}: {e}"),
    }
}

/// Status and annotations of every object of a fleet, by `Kind namespace/name`.
pub async fn fleet_state(
    client: &kube::Client,
    fleet: &str,
) -> std::collections::BTreeMap<String, (serde_json::Value, std::collections::BTreeMap<String, String>)> {
    use kube::api::ListParams;
    let profile = restatus::domain::identity::Profile::metal_operator();
    let mut out = std::collections::BTreeMap::new();
    for kind in ["BMC", "Server", "ServerClaim"] {
        let api = restatus::k8s::api_for(client, profile.kind(kind).unwrap(), None);
        let selector = format!("{}={fleet}", restatus::fleet::FLEET_LABEL);
        for obj in api.list(&ListParams::default().labels(&selector)).await.unwrap() {
            let name = match &obj.metadata.namespace {
                Some(ns) => format!("{kind} {ns}/{}", obj.metadata.name.clone().unwrap()),
                None => format!("{kind} {}", obj.metadata.name.clone().unwrap()),
            };
            let status = obj.data.get("status").cloned().unwrap_or(serde_json::Value::Null);
            out.insert(name, (status, obj.metadata.annotations.clone().unwrap_or_default()));
        }
    }
    out
}

/// A kube-apiserver of a test's own on one cluster's etcd, with the flags of the cluster's own
/// (`scripts/testbed apiserver-args`) and the test's `extra` ones (an audit policy, another token
/// file): the test may kill, restart and audit it while the other tests keep using the
/// cluster's main apiserver. Killed when dropped.
pub struct ExtraApiServer {
    pub port: u16,
    /// The cluster's admin kubeconfig, pointed at this apiserver.
    pub kubeconfig: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<std::process::Child>,
}

impl ExtraApiServer {
    /// Starts one on `cluster` ("source" or "target") on a free port and waits until it is ready.
    pub async fn start(bed: &Bed, cluster: &str, extra: &[String]) -> ExtraApiServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let certs = bed.scratch.path().join(format!("apiserver-{port}-certs"));
        let script = format!("{}/scripts/testbed", env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(script)
            .args(["apiserver-args", cluster, &port.to_string(), certs.to_str().unwrap()])
            .output()
            .expect("run scripts/testbed apiserver-args");
        assert_success(&out, "scripts/testbed apiserver-args");
        let mut args: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
        for flag in extra {
            let name = flag.split_once('=').map_or(flag.as_str(), |(name, _)| name);
            args.retain(|a| a.split_once('=').map_or(a.as_str(), |(n, _)| n) != name);
            args.push(flag.clone());
        }
        let base = if cluster == "source" { &bed.source_kubeconfig } else { &bed.target_kubeconfig };
        let mut config = Kubeconfig::read_from(base).expect("read kubeconfig");
        for c in &mut config.clusters {
            if let Some(c) = c.cluster.as_mut() {
                c.server = Some(format!("https://127.0.0.1:{port}"));
            }
        }
        let kubeconfig = bed.scratch.path().join(format!("apiserver-{port}.kubeconfig"));
        std::fs::write(&kubeconfig, serde_json::to_vec(&config).unwrap()).unwrap();
        let log = bed.scratch.path().join(format!("apiserver-{port}.log"));
        let mut server = ExtraApiServer { port, kubeconfig, args, log, child: None };
        server.spawn(bed).await;
        server
    }

    async fn spawn(&mut self, bed: &Bed) {
        // A just-killed apiserver may hold its port a moment longer.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpListener::bind(("127.0.0.1", self.port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "port {} stays taken", self.port);
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let binary = std::env::var("RESTATUS_BIN")
            .map(|bin| Path::new(&bin).join("kube-apiserver"))
            .unwrap_or_else(|_| PathBuf::from("kube-apiserver"));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new(binary)
            .args(&self.args)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start kube-apiserver");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let out = bed.kubectl(&self.kubeconfig, &["get", "--raw", "/readyz", "--request-timeout", "5s"]);
            if out.status.success() && stdout(&out).trim() == "ok" {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("kube-apiserver on {} exited ({status}): {}", self.port, self.log_tail());
            }
            assert!(
                std::time::Instant::now() < deadline,
                "kube-apiserver on {} not ready: {}",
                self.port,
                self.log_tail()
            );
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    }

    /// SIGKILL, as a crashed or OOM-killed apiserver: no graceful close of its watches.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again with the same flags, on the same port, and waits until it is ready.
    pub async fn restart(&mut self, bed: &Bed) {
        self.kill();
        self.spawn(bed).await;
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for ExtraApiServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The events of a kube-apiserver's JSON audit log (`--audit-log-path`), one per line.
pub fn audit_events(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// A plain-HTTP proxy on loopback in front of `upstream` (`host:port`) that records each
/// request's method and target, for tests that count requests to S3, and that stops answering
/// on command ([`CountingProxy::hold`]: requests are recorded as they arrive, then held, not
/// forwarded, until [`CountingProxy::resume`]), as a stalled store or network would. HTTP/1.1
/// only, as the object store speaks it over plain http: requests are told apart by their
/// Content-Length.
pub struct CountingProxy {
    pub port: u16,
    requests: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
    held: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    pub async fn start(upstream: &str) -> CountingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (held, gate) = tokio::sync::watch::channel(false);
        let (upstream, log) = (upstream.to_string(), requests.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, upstream.clone(), log.clone(), gate.clone()));
            }
        });
        CountingProxy { port, requests, held, task }
    }

    /// The proxy for the test bed's S3 endpoint (`S3_ENDPOINT`, plain http), and its URL.
    pub async fn for_s3() -> (CountingProxy, String) {
        let endpoint = std::env::var("S3_ENDPOINT").expect("S3_ENDPOINT");
        let upstream = endpoint.trim_start_matches("http://").trim_end_matches('/').to_string();
        assert!(!upstream.contains("://"), "the counting proxy speaks plain http only: {endpoint}");
        let proxy = CountingProxy::start(&upstream).await;
        let url = format!("http://127.0.0.1:{}", proxy.port);
        (proxy, url)
    }

    /// Method and target (path and query) of every request so far, held ones included.
    pub fn requests(&self) -> Vec<(String, String)> {
        self.requests.lock().unwrap().clone()
    }

    /// From now on no request is forwarded (nor answered) until [`CountingProxy::resume`].
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Forwards the held requests and those that follow.
    pub fn resume(&self) {
        self.held.send_replace(false);
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(
    client: tokio::net::TcpStream,
    upstream: String,
    log: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
    mut gate: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = tokio::net::TcpStream::connect(&upstream).await?;
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let back = tokio::spawn(async move { tokio::io::copy(&mut from_server, &mut to_client).await });
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let result = async {
        loop {
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let n = from_client.read(&mut chunk).await?;
                if n == 0 {
                    return Ok(());
                }
                buf.extend_from_slice(&chunk[..n]);
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
            let mut words = head.split_whitespace();
            let (method, target) = (words.next().unwrap_or("").to_string(), words.next().unwrap_or("").to_string());
            log.lock().unwrap().push((method, target));
            // Held: the request stays here, unanswered, until the proxy resumes.
            if gate.wait_for(|held| !*held).await.is_err() {
                return Ok(());
            }
            let header = |name: &str| {
                head.lines().find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_ascii_lowercase())
                })
            };
            to_server.write_all(&buf[..head_end]).await?;
            buf.drain(..head_end);
            if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
                // Not told apart any further: relay the rest of the connection as it comes.
                to_server.write_all(&buf).await?;
                tokio::io::copy(&mut from_client, &mut to_server).await?;
                return Ok(());
            }
            let mut remaining: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
            loop {
                let take = remaining.min(buf.len());
                to_server.write_all(&buf[..take]).await?;
                buf.drain(..take);
                remaining -= take;
                if remaining == 0 {
                    break;
                }
                let n = from_client.read(&mut chunk).await?;
                if n == 0 {
                    return Ok(());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
        }
    }
    .await;
    back.abort();
    result
}

/// Issue 21, item 7: the admission policy lets a restatus role (as `kubeconfig`) set
/// metal-operator's operation annotation on `object` only by restatus's own protocol: `ignore`
/// together with `quiesced-by` (the old value kept in `operation-was`), and on release exactly
/// what `operation-was` kept. A stolen token cannot issue `ForceReset` or any other operation.
/// `object` starts without any of these annotations (cleared as the admin of `admin`).
pub fn assert_only_the_quiesce_protocol(bed: &Bed, admin: &Path, kubeconfig: &Path, object: &str) {
    let clear = r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":null,"restatus.ironcore.dev/quiesced-by":null,"restatus.ironcore.dev/operation-was":null}}}"#;
    assert_success(&bed.kubectl(admin, &merge_patch(None, object, clear)), "clear the operation annotations");
    let patch = |body: &'static str| merge_patch(None, object, body);
    // Without restatus's quiesce: no operation, no mark of its own, no operation-was to replay.
    bed.assert_denied(
        kubeconfig,
        &[
            patch(r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":"ForceReset"}}}"#),
            patch(r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":"ignore"}}}"#),
            patch(r#"{"metadata":{"annotations":{"restatus.ironcore.dev/quiesced-by":"restatus"}}}"#),
            patch(
                r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":"ignore","restatus.ironcore.dev/quiesced-by":"restatus","restatus.ironcore.dev/operation-was":"ForceReset"}}}"#,
            ),
        ],
    );
    bed.assert_allowed(kubeconfig, &[patch(QUIESCE_PATCH)]);
    // While quiesced: the operation cannot be turned into another, nor released to one, nor
    // can operation-was be planted for the release to replay.
    bed.assert_denied(
        kubeconfig,
        &[
            patch(r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":"ForceReset"}}}"#),
            patch(
                r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":"ForceReset","restatus.ironcore.dev/quiesced-by":null}}}"#,
            ),
            patch(r#"{"metadata":{"annotations":{"restatus.ironcore.dev/operation-was":"ForceReset"}}}"#),
        ],
    );
    bed.assert_allowed(
        kubeconfig,
        &[patch(r#"{"metadata":{"annotations":{"metal.ironcore.dev/operation":null,"restatus.ironcore.dev/quiesced-by":null}}}"#)],
    );
}

/// Waits (at most `within`) until at least `n` objects of `fleet` on `client`'s cluster carry
/// restatus's restored-from mark: a restore is then under way.
pub async fn wait_some_restored(client: &kube::Client, fleet: &str, n: usize, within: std::time::Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let state = fleet_state(client, fleet).await;
        let restored = state.values().filter(|(_, a)| a.contains_key(RESTORED_FROM_ANNOTATION)).count();
        if restored >= n {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{restored} of {fleet} restored after {within:?}, not {n}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// After a restore stopped midway: no object is left quiesced by restatus, and each one is
/// either restored (status written, marked) or untouched (no status). Returns how many were
/// restored, and asserts some were not (else nothing was stopped).
pub fn assert_stopped_cleanly(state: &BTreeMap<String, (serde_json::Value, BTreeMap<String, String>)>) -> usize {
    for (name, (status, annotations)) in state {
        assert!(!annotations.contains_key(QUIESCED_BY_ANNOTATION), "{name} left quiesced by restatus");
        assert_eq!(
            annotations.contains_key(RESTORED_FROM_ANNOTATION),
            !status.is_null(),
            "{name}: a status written is released and marked; one not written is untouched"
        );
    }
    let restored = state.values().filter(|(_, a)| a.contains_key(RESTORED_FROM_ANNOTATION)).count();
    assert!(restored < state.len(), "everything was restored before the stop ({restored}): nothing was stopped");
    restored
}

/// An admission policy a test injects as a fault, on `kubeconfig`'s cluster: updates of
/// metal-operator `resources` (YAML list, `servers` among them) for which the CEL `condition`
/// holds are denied unless `validation` holds. Removed by [`InjectedPolicy::remove`].
pub struct InjectedPolicy {
    file: PathBuf,
    kubeconfig: PathBuf,
}

/// The label of the Server through which [`InjectedPolicy`] learns that its policy is in force.
const POLICY_PROBE_LABEL: &str = "restatus-test/policy-probe";

impl InjectedPolicy {
    /// Applies the policy and returns once the API server enforces it (at most 60 s).
    pub async fn deny_updates(
        bed: &Bed,
        kubeconfig: &Path,
        name: &str,
        resources: &str,
        condition: &str,
        validation: &str,
    ) -> InjectedPolicy {
        assert!(resources.contains("servers"), "the policy is probed through a Server: {resources}");
        // The policy also denies any update of a probe Server of its own, which no test
        // selects: a dry-run update of it is denied once the policy is in force.
        let probe = format!(
            "(has(object.metadata.labels) && '{POLICY_PROBE_LABEL}' in object.metadata.labels && \
             object.metadata.labels['{POLICY_PROBE_LABEL}'] == '{name}')"
        );
        let condition = format!("({condition}) || {probe}");
        let validation = format!("!{probe} && ({validation})");
        let spec = format!(
            "matchConstraints:\n  resourceRules:\n  - apiGroups: [metal.ironcore.dev]\n    apiVersions: [\"*\"]\n    \
             operations: [UPDATE]\n    resources: {resources}\nmatchConditions:\n- name: injected\n  \
             expression: {condition:?}\nvalidations:\n- expression: {validation:?}\n  message: injected fault\n"
        );
        let spec: String = spec.lines().map(|l| format!("  {l}\n")).collect();
        let policy = format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {{name: {name}}}\n\
             spec:\n  failurePolicy: Fail\n{spec}---\napiVersion: admissionregistration.k8s.io/v1\n\
             kind: ValidatingAdmissionPolicyBinding\nmetadata: {{name: {name}}}\n\
             spec: {{policyName: {name}, validationActions: [Deny]}}\n"
        );
        let file = bed.scratch.path().join(format!("{name}-policy.yaml"));
        std::fs::write(&file, policy).unwrap();
        let injected = InjectedPolicy { file, kubeconfig: kubeconfig.to_path_buf() };
        let server = format!("{name}-policy-probe");
        let object = serde_json::json!({
            "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": server, "labels": {POLICY_PROBE_LABEL: name}},
            "spec": {"systemUUID": format!("{:08x}-0000-4000-8000-{:012x}", rand::random::<u32>(), rand::random::<u64>() >> 16)},
        });
        let probe_file = bed.scratch.path().join(format!("{name}-policy-probe.json"));
        std::fs::write(&probe_file, object.to_string()).unwrap();
        assert_success(&bed.kubectl(kubeconfig, &["create", "-f", probe_file.to_str().unwrap()]), "create the probe");
        assert_success(&injected.kubectl(bed, "apply"), "apply the injected policy");
        let object = format!("servers.metal.ironcore.dev/{server}");
        let change = r#"{"metadata":{"annotations":{"restatus-test/probed":"yes"}}}"#;
        let probe = merge_patch(None, &object, change);
        bed.wait_denied(kubeconfig, &probe, "injected fault", Duration::from_secs(60))
            .await
            .expect("the policy in force");
        assert_success(&bed.kubectl(kubeconfig, &["delete", &object, "--wait=false"]), "delete the probe");
        injected
    }

    pub fn remove(&self, bed: &Bed) {
        assert_success(&self.kubectl(bed, "delete"), "delete the injected policy");
    }

    fn kubectl(&self, bed: &Bed, verb: &str) -> Output {
        bed.kubectl(&self.kubeconfig, &[verb, "-f", self.file.to_str().unwrap()])
    }
}

/// `restatus keys generate DIR/NAME`: the private and public key files, and the key id.
pub fn generate_keys(bed: &Bed, name: &str) -> (PathBuf, PathBuf, String) {
    let base = bed.scratch.path().join(name);
    let out = Command::new(env!("CARGO_BIN_EXE_restatus")).arg("keys").arg("generate").arg(&base).output().unwrap();
    assert_success(&out, "keys generate");
    // "key id <id>  ed25519:<base64>"
    let id = stdout(&out).split_whitespace().nth(2).expect("key id").to_string();
    let with = |ext: &str| PathBuf::from(format!("{}.{ext}", base.display()));
    (with("key"), with("pub"), id)
}

/// An age key pair from `restatus keys generate --age`: the private key file, the recipient
/// file, and the recipient (`age1…`).
pub fn generate_age_keys(bed: &Bed, name: &str) -> (PathBuf, PathBuf, String) {
    let base = bed.scratch.path().join(name);
    let out =
        Command::new(env!("CARGO_BIN_EXE_restatus")).args(["keys", "generate", "--age"]).arg(&base).output().unwrap();
    assert_success(&out, "keys generate --age");
    // "recipient age1…"
    let recipient = stdout(&out).split_whitespace().nth(1).expect("recipient").to_string();
    let with = |ext: &str| PathBuf::from(format!("{}.{ext}", base.display()));
    (with("agekey"), with("recipient"), recipient)
}

/// What someone who can write the bucket can do: a snapshot made from `from`'s records with
/// every status changed (`state: Forged`), its payload's size, sha256 and counts recomputed
/// into a manifest dated now, written beside the real ones, unsigned. Its id.
pub async fn forge(store: &SnapshotStore, from: &str) -> restatus::format::SnapshotId {
    let (real, mut records) = records(store, from).await;
    for record in &mut records {
        let mut status: serde_json::Value = serde_json::from_str(record.status.get()).unwrap();
        status["state"] = "Forged".into();
        record.status = serde_json::value::RawValue::from_string(status.to_string()).unwrap();
    }
    let capture =
        restatus::format::CaptureSummary { kinds: real.kinds.clone(), ..restatus::format::CaptureSummary::empty() };
    let forged = restatus::fixtures::snapshot(&records).at(jiff::Timestamp::now()).profile(&real.profile);
    forged.capture(capture).write(store).await.snapshot_id
}
