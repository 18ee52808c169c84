//! S3 over TLS with a private CA, end to end: a versitygw of its own serving HTTPS with a
//! certificate from a CA made for this test (openssl). With `--s3-ca-file` a backup (with
//! `--s3-sse AES256`) and a restore through it succeed; without the CA both fail naming the
//! endpoint and the certificate, and nothing is written. Runs in the default pass: it needs
//! only the bed's clusters and the versitygw binary, not the bed's S3.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use restatus::fleet::{self, FLEET_LABEL, FleetSpec};

use crate::bed::{Bed, TARGET, assert_success, env, fleet_state, simulate_move, stderr, stdout, unique};
use crate::metrics::free_port;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("run openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA and a server certificate for 127.0.0.1 signed by it: (ca.pem, server.pem, server.key).
fn private_ca(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    openssl(
        dir,
        &[
            &["req", "-x509"],
            &ec[..],
            &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=restatus test CA"],
        ]
        .concat(),
    );
    openssl(
        dir,
        &[&["req"], &ec[..], &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]].concat(),
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("write san.ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
    (dir.join("ca.pem"), dir.join("server.pem"), dir.join("server.key"))
}

/// versitygw serving `https://127.0.0.1:<port>` from a posix directory of its own; killed on drop.
struct TlsS3 {
    child: Child,
    endpoint: String,
}

impl Drop for TlsS3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TlsS3 {
    /// Starts it and creates `bucket` through S3 (curl, SigV4, trusting the CA), polling until
    /// it answers.
    fn start(dir: &Path, ca: &Path, cert: &Path, key: &Path, (access, secret): (&str, &str), bucket: &str) -> TlsS3 {
        let port = free_port();
        let data = dir.join("data");
        std::fs::create_dir_all(&data).expect("versitygw data dir");
        let versitygw = Path::new(&env("RESTATUS_BIN")).join("versitygw");
        let child = Command::new(versitygw)
            .args(["--port", &format!("127.0.0.1:{port}"), "--access", access, "--secret", secret])
            .args(["--region", "us-east-1", "--cert"])
            .arg(cert)
            .arg("--key")
            .arg(key)
            .arg("posix")
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start versitygw");
        let s3 = TlsS3 { child, endpoint: format!("https://127.0.0.1:{port}") };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new("curl")
                .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT", "--cacert"])
                .arg(ca)
                .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "--aws-sigv4", "aws:amz:us-east-1:s3"])
                .args(["--user", &format!("{access}:{secret}"), &format!("{}/{bucket}", s3.endpoint)])
                .output()
                .expect("run curl");
            let code = String::from_utf8_lossy(&out.stdout).into_owned();
            if code == "200" {
                return s3;
            }
            assert!(Instant::now() < deadline, "versitygw over TLS did not create the bucket: HTTP {code:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The error restatus ends with (its last `error:` line) names the endpoint and the certificate.
fn assert_certificate_error(stderr: &str, port: &str) {
    let error = stderr.lines().rfind(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(error.contains(&format!("https://127.0.0.1:{port}/")), "the error does not name the endpoint: {error}");
    assert!(error.contains("invalid peer certificate: UnknownIssuer"), "not a certificate error: {error}");
}

#[tokio::test]
async fn backup_and_restore_through_tls_with_a_private_ca_and_fail_clearly_without_it() {
    let _target = TARGET.read().await;
    let bed = Bed::get();
    let dir = tempfile::tempdir_in(env("RESTATUS_STATE")).expect("temp dir in the bed's state");
    let (ca, cert, key) = private_ca(dir.path());
    let (access, secret) = ("restatus-tls", "restatus-tls-secret");
    let bucket = "restatus-tls";
    let s3 = TlsS3::start(dir.path(), &ca, &cert, &key, (access, secret), bucket);
    let port = s3.endpoint.rsplit(':').next().unwrap_or_default().to_string();
    let tls_env = [
        ("S3_ENDPOINT", s3.endpoint.as_str()),
        ("AWS_ENDPOINT_URL_S3", s3.endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", access),
        ("AWS_SECRET_ACCESS_KEY", secret),
    ];
    let ca_file = ca.to_str().expect("utf-8 path");

    let spec = FleetSpec::new(&unique("tls"), 4, 4, 2);
    fleet::create(&bed.source().await, &spec, 8).await.expect("create fleet");
    let selector = format!("{FLEET_LABEL}={}", spec.name);
    let storage = format!("s3://{bucket}/{}", spec.name);
    let cluster = spec.name.as_str();
    let run = |kubeconfig: &Path, args: &[&str]| bed.restatus_with(kubeconfig, &storage, cluster, args, &tls_env);

    // Without the CA: refused at the TLS handshake, naming the endpoint; nothing written.
    let untrusted = run(&bed.source_kubeconfig, &["backup", "--selector", &selector]);
    assert!(!untrusted.status.success(), "a backup trusted a certificate of an unknown CA");
    let why = stderr(&untrusted);
    assert_certificate_error(&why, &port);
    assert!(!why.contains(secret), "the secret leaked: {why}");
    assert!(
        !dir.path().join("data").join(bucket).join(&spec.name).exists(),
        "the refused backup wrote under its prefix"
    );

    // With it (and SSE-S3 asked for): a backup, then a restore of the moved fleet.
    let backup = run(
        &bed.source_kubeconfig,
        &["backup", "--selector", &selector, "--s3-ca-file", ca_file, "--s3-sse", "AES256"],
    );
    assert_success(&backup, "backup over TLS with the private CA");
    let snapshot = stdout(&backup).trim().to_string();
    assert!(dir.path().join("data").join(bucket).join(&spec.name).join(cluster).join(&snapshot).is_dir());

    simulate_move(&bed.source().await, &bed.target().await, &spec.name, &|n| n.to_string()).await;
    let untrusted = run(&bed.target_kubeconfig, &["restore", "--selector", &selector]);
    assert!(!untrusted.status.success(), "a restore trusted a certificate of an unknown CA");
    assert_certificate_error(&stderr(&untrusted), &port);
    let restored = fleet_state(&bed.target().await, &spec.name).await;
    assert!(restored.values().all(|(status, _)| status.is_null()), "the refused restore wrote status");

    let restore =
        run(&bed.target_kubeconfig, &["restore", "--selector", &selector, "-o", "json", "--s3-ca-file", ca_file]);
    assert_success(&restore, "restore over TLS with the private CA");
    let report: serde_json::Value = serde_json::from_str(&stdout(&restore)).expect("restore -o json");
    assert_eq!(report["snapshot"], snapshot.as_str());
    assert_eq!(report["counts"]["restore"], 10, "{report}");
    let restored = fleet_state(&bed.target().await, &spec.name).await;
    assert_eq!(restored.len(), 10);
    assert!(restored.values().all(|(status, _)| !status.is_null()), "a status was not restored");
}
