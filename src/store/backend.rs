//! Opening a backend: a storage URL (`s3://bucket/prefix`, `file:///path`, `memory://`) made
//! into an object store, the prefix inside it and a description free of secrets. S3 comes from
//! the standard `AWS_*` environment (and `S3_ENDPOINT`), with [`S3Options`] on top: server-side
//! encryption and a private CA. Credentials never reach an error or a log: URLs and endpoints
//! with user info are refused, and what is shown of them is [`redact`]ed.
//!
//! Nothing here knows what a snapshot is; [`super::snapshots::SnapshotStore`] opens its
//! backend through [`Backend::open`].

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::aws::AmazonS3ConfigKey;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::{Certificate, ClientOptions, ObjectStore, RetryConfig};
use tracing::warn;
use url::Url;

use crate::{Error, Result};

/// Where snapshots go when nothing is configured.
pub const DEFAULT_STORAGE: &str = "file://./restatus-snapshots";

/// An opened backend: the store, the prefix inside it, and where it is for messages (the URL
/// without credentials).
pub struct Backend {
    pub store: Arc<dyn ObjectStore>,
    pub prefix: String,
    pub location: String,
}

/// How `s3://` storage is reached beyond the `AWS_*` environment: server-side encryption
/// and CAs trusted on top of the system's. Set fields override `AWS_SERVER_SIDE_ENCRYPTION`,
/// `AWS_SSE_KMS_KEY_ID` and `AWS_SSE_BUCKET_KEY_ENABLED`, which object_store reads itself.
#[derive(Debug, Clone, Default)]
pub struct S3Options {
    /// `AES256` (SSE-S3) or `aws:kms` (SSE-KMS); `None`: the bucket's default.
    pub sse: Option<String>,
    /// The KMS key for SSE-KMS; without it S3 uses the account's default key.
    pub sse_kms_key_id: Option<String>,
    /// With SSE-KMS: use (or refuse) an S3 Bucket Key.
    pub sse_bucket_key: Option<bool>,
    /// A PEM file of CA certificates trusted for the endpoint, besides the system's.
    pub ca_file: Option<std::path::PathBuf>,
}

/// The server-side encryption modes restatus passes on (SSE-C would put a key in every
/// request and is not offered).
pub const SSE_MODES: [&str; 2] = ["AES256", "aws:kms"];

/// object_store's names of its SSE settings (its key enum is not exported).
const SSE: &str = "aws_server_side_encryption";
const SSE_KMS_KEY_ID: &str = "aws_sse_kms_key_id";
const SSE_BUCKET_KEY: &str = "aws_sse_bucket_key_enabled";

fn sse_key(name: &str) -> Result<AmazonS3ConfigKey> {
    name.parse().map_err(|e: object_store::Error| Error::StorageUrl { url: "s3 options".into(), reason: e.to_string() })
}

impl S3Options {
    fn apply(&self, mut builder: AmazonS3Builder) -> Result<AmazonS3Builder> {
        let err = |reason: String| Error::StorageUrl { url: "s3 options".into(), reason };
        if let Some(mode) = &self.sse {
            if !SSE_MODES.contains(&mode.as_str()) {
                return Err(err(format!("server-side encryption {mode:?}: use one of {}", SSE_MODES.join(", "))));
            }
            builder = builder.with_config(sse_key(SSE)?, mode);
        }
        if let Some(key) = &self.sse_kms_key_id {
            builder = builder.with_config(sse_key(SSE_KMS_KEY_ID)?, key);
        }
        if let Some(on) = self.sse_bucket_key {
            builder = builder.with_config(sse_key(SSE_BUCKET_KEY)?, on.to_string());
        }
        let mode = builder.get_config_value(&sse_key(SSE)?);
        let kms_only = builder.get_config_value(&sse_key(SSE_KMS_KEY_ID)?).is_some()
            || builder.get_config_value(&sse_key(SSE_BUCKET_KEY)?).is_some();
        if kms_only && mode.as_deref() != Some("aws:kms") {
            return Err(err("a KMS key id or bucket key needs server-side encryption aws:kms".into()));
        }
        Ok(builder)
    }

    /// Client options trusting the CA file's certificates besides the system's.
    fn client_options(&self) -> Result<ClientOptions> {
        let mut options = ClientOptions::new();
        if let Some(path) = &self.ca_file {
            let err = |reason: String| Error::StorageUrl { url: format!("CA file {}", path.display()), reason };
            let pem = std::fs::read(path).map_err(|e| err(format!("cannot read: {e}")))?;
            let certs = Certificate::from_pem_bundle(&pem).map_err(|_| err("not a PEM certificate bundle".into()))?;
            if certs.is_empty() {
                return Err(err("holds no PEM certificate".into()));
            }
            for cert in certs {
                options = options.with_root_certificate(cert);
            }
        }
        Ok(options)
    }
}

/// The host of a plain `http://` endpoint that is not loopback: traffic, request signatures
/// and snapshots cross the network readable. `None` for `https://` and for loopback
/// (`localhost`, 127.0.0.0/8, `::1`).
pub fn plain_http_host(endpoint: &str) -> Option<String> {
    let url = Url::parse(endpoint).ok()?;
    if url.scheme() != "http" {
        return None;
    }
    let loopback = match url.host()? {
        url::Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    };
    (!loopback).then(|| url.host_str().unwrap_or_default().to_string())
}

/// Refuses an endpoint with user info: object_store puts the endpoint into its error
/// messages, so credentials there would reach logs.
fn check_endpoint(endpoint: &str) -> std::result::Result<(), String> {
    match Url::parse(endpoint) {
        Ok(url) if !url.username().is_empty() || url.password().is_some() => Err(format!(
            "the S3 endpoint {} has credentials in it; use AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
            redact(endpoint)
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("the S3 endpoint {} is not a URL: {e}", redact(endpoint))),
    }
}

/// Warns, once a process, that the S3 endpoint is plain HTTP outside loopback.
fn warn_plain_http(endpoint: &str) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if let Some(host) = plain_http_host(endpoint) {
        WARNED.call_once(|| {
            warn!(
                host,
                "the S3 endpoint is plain http:// outside loopback: snapshots and request signatures cross the network unencrypted; use https://"
            );
        });
    }
}

impl Backend {
    /// Opens `raw`. `create`: a `file://` directory that does not exist is created (a writer);
    /// otherwise it is an error, never created (a command that only reads).
    pub fn open(raw: &str, s3: &S3Options, create: bool) -> Result<Backend> {
        let err = |reason: String| Error::StorageUrl { url: redact(raw), reason };
        if let Some(rest) = raw.strip_prefix("file://") {
            let dir = std::path::absolute(if rest.is_empty() { "." } else { rest })
                .map_err(|e| err(format!("cannot resolve path: {e}")))?;
            if create {
                std::fs::create_dir_all(&dir).map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
            } else if !dir.is_dir() {
                return Err(err(format!(
                    "directory {} does not exist (a reading command does not create it)",
                    dir.display()
                )));
            }
            let store =
                LocalFileSystem::new_with_prefix(&dir).map_err(|e| err(e.to_string()))?.with_automatic_cleanup(true);
            let location = format!("file://{}", dir.display());
            return Ok(Backend { store: Arc::new(store), prefix: String::new(), location });
        }
        let url = Url::parse(raw).map_err(|e| err(format!("not a URL: {e}")))?;
        match url.scheme() {
            "memory" => {
                let prefix = url.path().trim_matches('/').to_string();
                Ok(Backend { store: Arc::new(InMemory::new()), prefix, location: "memory://".into() })
            }
            "s3" => {
                if !url.username().is_empty() || url.password().is_some() {
                    return Err(err(
                        "credentials do not belong in the URL; use AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY".into(),
                    ));
                }
                let bucket = url.host_str().filter(|b| !b.is_empty()).ok_or_else(|| err("no bucket".into()))?;
                let prefix = url.path().trim_matches('/').to_string();
                let mut builder = s3_builder(s3)?.with_bucket_name(bucket).with_retry(retry_config());
                let endpoint = std::env::var("AWS_ENDPOINT_URL_S3")
                    .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
                    .or_else(|_| std::env::var("AWS_ENDPOINT"))
                    .or_else(|_| std::env::var("S3_ENDPOINT"))
                    .ok()
                    .filter(|e| !e.is_empty());
                if let Some(endpoint) = &endpoint {
                    check_endpoint(endpoint).map_err(err)?;
                    warn_plain_http(endpoint);
                    builder = builder.with_endpoint(endpoint).with_allow_http(endpoint.starts_with("http://"));
                }
                if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() {
                    builder = builder.with_region("us-east-1");
                }
                let store = builder.build().map_err(|e| err(e.to_string()))?;
                let location = match &endpoint {
                    Some(endpoint) => format!("s3://{bucket}/{prefix} at {}", redact(endpoint)),
                    None => format!("s3://{bucket}/{prefix}"),
                };
                Ok(Backend { store: Arc::new(store), prefix, location })
            }
            other => Err(err(format!("unsupported scheme {other:?}; use s3://, file:// or memory://"))),
        }
    }
}

/// The `AWS_*` environment and `s3` on one builder. The CA goes into the client options
/// first: the environment's client settings (`AWS_ALLOW_HTTP`, timeouts, proxies) then add to
/// them, as `AmazonS3Builder::from_env` would (which would lose the CA).
fn s3_builder(s3: &S3Options) -> Result<AmazonS3Builder> {
    let mut builder = AmazonS3Builder::new().with_client_options(s3.client_options()?);
    for (key, value) in std::env::vars_os() {
        let (Some(key), Some(value)) = (key.to_str(), value.to_str()) else { continue };
        if key.starts_with("AWS_")
            && let Ok(key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>()
        {
            builder = builder.with_config(key, value);
        }
    }
    s3.apply(builder)
}

/// Bounded retries: an unreachable S3 fails a backup in seconds, not minutes.
fn retry_config() -> RetryConfig {
    RetryConfig { max_retries: 3, retry_timeout: Duration::from_secs(30), ..Default::default() }
}

/// A URL without user info or query (which may carry credentials).
pub fn redact(raw: &str) -> String {
    match Url::parse(raw) {
        Ok(mut url) => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.set_query(None);
            url.to_string()
        }
        Err(_) => raw.split('@').next_back().unwrap_or_default().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_credentials() {
        assert_eq!(redact("http://user:secret@minio:9000/"), "http://minio:9000/");
        assert_eq!(redact("s3://bucket/p?X-Amz-Signature=abc"), "s3://bucket/p");
    }

    fn kms(mode: Option<&str>, key: Option<&str>, bucket_key: Option<bool>) -> S3Options {
        S3Options {
            sse: mode.map(Into::into),
            sse_kms_key_id: key.map(Into::into),
            sse_bucket_key: bucket_key,
            ca_file: None,
        }
    }

    fn sse_value(builder: &AmazonS3Builder, key: &str) -> Option<String> {
        builder.get_config_value(&sse_key(key).unwrap())
    }

    #[test]
    fn sse_settings_reach_the_s3_config() {
        let builder = kms(Some("AES256"), None, None).apply(AmazonS3Builder::new()).unwrap();
        assert_eq!(sse_value(&builder, SSE).as_deref(), Some("AES256"));
        assert_eq!(sse_value(&builder, SSE_KMS_KEY_ID), None);

        let builder = kms(Some("aws:kms"), Some("alias/restatus"), Some(true)).apply(AmazonS3Builder::new()).unwrap();
        assert_eq!(sse_value(&builder, SSE).as_deref(), Some("aws:kms"));
        assert_eq!(sse_value(&builder, SSE_KMS_KEY_ID).as_deref(), Some("alias/restatus"));
        assert_eq!(sse_value(&builder, SSE_BUCKET_KEY).as_deref(), Some("true"));

        // A flag overrides what object_store read from the environment.
        let from_env = AmazonS3Builder::new().with_config(sse_key(SSE).unwrap(), "aws:kms");
        let builder = kms(Some("AES256"), None, None).apply(from_env).unwrap();
        assert_eq!(sse_value(&builder, SSE).as_deref(), Some("AES256"));
        let builder = S3Options::default().apply(AmazonS3Builder::new()).unwrap();
        assert_eq!(sse_value(&builder, SSE), None);
    }

    #[test]
    fn bad_sse_settings_are_refused_without_showing_the_key() {
        for (options, expected) in [
            (kms(Some("aes256"), None, None), "use one of AES256, aws:kms"),
            (kms(Some("sse-c"), None, None), "use one of AES256, aws:kms"),
            (kms(None, Some("arn:aws:kms:eu-1:1:key/k-123"), None), "needs server-side encryption aws:kms"),
            (kms(Some("AES256"), Some("arn:aws:kms:eu-1:1:key/k-123"), None), "needs server-side encryption aws:kms"),
            (kms(Some("AES256"), None, Some(true)), "needs server-side encryption aws:kms"),
        ] {
            let err = options.apply(AmazonS3Builder::new()).unwrap_err().to_string();
            assert!(err.contains(expected), "{options:?}: {err}");
            assert!(!err.contains("k-123"), "key id in the error: {err}");
        }
        // A key id given by flag while the environment asked for SSE-S3.
        let from_env = AmazonS3Builder::new().with_config(sse_key(SSE).unwrap(), "AES256");
        let err = kms(None, Some("k-123"), None).apply(from_env).unwrap_err().to_string();
        assert!(err.contains("needs server-side encryption aws:kms"), "{err}");
    }

    #[test]
    fn a_ca_file_is_read_or_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let with = |path: std::path::PathBuf| S3Options { ca_file: Some(path), ..Default::default() }.client_options();
        let ca = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/test-ca.pem");
        with(ca).unwrap();
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        let truncated = dir.path().join("truncated.pem");
        std::fs::write(&truncated, "-----BEGIN CERTIFICATE-----\nMIIB\n").unwrap();
        for path in [dir.path().join("missing.pem"), garbage, truncated] {
            let err = with(path.clone()).unwrap_err().to_string();
            assert!(err.contains(&path.display().to_string()), "{err}");
        }
    }

    #[test]
    fn endpoints_with_credentials_are_refused_without_showing_them() {
        for endpoint in ["http://user:secret@minio:9000", "https://secret@minio", "http://:secret@minio"] {
            let err = check_endpoint(endpoint).unwrap_err();
            assert!(err.contains("has credentials in it") && err.contains("minio"), "{endpoint}: {err}");
            assert!(!err.contains("secret"), "credentials leaked: {err}");
        }
        assert!(check_endpoint("not a url:secret@x").is_err_and(|e| !e.contains("secret")));
        check_endpoint("https://minio.example:9000").unwrap();
    }

    #[test]
    fn plain_http_is_flagged_only_outside_loopback() {
        for (endpoint, flagged) in [
            ("http://minio.minio.svc:9000", Some("minio.minio.svc")),
            ("http://10.0.0.5:9000/", Some("10.0.0.5")),
            ("http://[fd00::1]:9000", Some("[fd00::1]")),
            ("http://localhost:9000", None),
            ("http://LOCALHOST:9000", None),
            ("http://127.0.0.1:9000", None),
            ("http://127.8.9.10:9000", None),
            ("http://[::1]:9000", None),
            ("https://minio.minio.svc:9000", None),
            ("http://user:secret@s3.example:80", Some("s3.example")),
        ] {
            assert_eq!(plain_http_host(endpoint).as_deref(), flagged, "{endpoint}");
        }
    }

    /// Reads one HTTP request from a real socket, answers 200 with an ETag, and returns the
    /// request's head lowercased: what the S3 client actually sent.
    fn record_one_request(listener: std::net::TcpListener) -> std::thread::JoinHandle<String> {
        use std::io::{Read, Write};
        std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).unwrap();
                assert!(n > 0, "connection closed before the request head");
                seen.extend_from_slice(&buf[..n]);
            }
            socket
                .write_all(b"HTTP/1.1 200 OK\r\nETag: \"e\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .unwrap();
            let end = seen.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(seen.len());
            String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase()
        })
    }

    #[tokio::test]
    async fn the_sse_headers_are_sent_with_every_put() {
        for (options, expected) in [
            (kms(Some("AES256"), None, None), vec!["x-amz-server-side-encryption: aes256"]),
            (
                kms(Some("aws:kms"), Some("alias/restatus"), Some(true)),
                vec![
                    "x-amz-server-side-encryption: aws:kms",
                    "x-amz-server-side-encryption-aws-kms-key-id: alias/restatus",
                    "x-amz-server-side-encryption-bucket-key-enabled: true",
                ],
            ),
            (S3Options::default(), vec![]),
        ] {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let endpoint = format!("http://{}", listener.local_addr().unwrap());
            let recorder = record_one_request(listener);
            let store = options
                .apply(AmazonS3Builder::new())
                .unwrap()
                .with_endpoint(endpoint)
                .with_allow_http(true)
                .with_bucket_name("b")
                .with_region("us-east-1")
                .with_access_key_id("k")
                .with_secret_access_key("s")
                .with_retry(RetryConfig { max_retries: 0, ..Default::default() })
                .build()
                .unwrap();
            object_store::ObjectStoreExt::put(
                &store,
                &object_store::path::Path::from("p"),
                bytes::Bytes::from_static(b"x").into(),
            )
            .await
            .unwrap();
            let head = recorder.join().unwrap();
            assert!(head.starts_with("put /b/p "), "{head}");
            for header in &expected {
                assert!(head.lines().any(|l| l == *header), "{header} not sent: {head}");
            }
            if expected.is_empty() {
                assert!(!head.contains("x-amz-server-side-encryption"), "{head}");
            }
        }
    }
}
