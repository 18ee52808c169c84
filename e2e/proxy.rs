//! restatus behind a proxy, through real ones on loopback: tinyproxy (HTTP CONNECT, and plain
//! HTTP for an `http://` S3 endpoint) and microsocks (SOCKS5), Debian's packages
//! (`scripts/prereqs`). Each test starts its own proxy on a free port with its log, runs a real
//! `restatus backup` (of nothing: a selector no object has, so it lists every kind of the
//! profile on the source's API server and exits 0 whatever other tests create) and reads from
//! the proxy's log which connections went through it.
//!
//! A test that proves that nothing went through a proxy states its window: from the proxy's log
//! as it was before the command started until a marker request, sent through the proxy by the
//! test after the command exited, is in the log. Every connection the command made was accepted
//! (and its request line logged) before the command exited, so before the marker.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kube::config::Kubeconfig;

use crate::bed::{Bed, assert_success, env, stderr, stdout, unique};

/// Every variable a proxy is read from; a test sets its own and inherits none.
const PROXY_VARS: [&str; 8] =
    ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"];

/// How long a proxy may take to listen, and a line to reach its log.
const WITHIN: Duration = Duration::from_secs(10);

struct Proxy {
    port: u16,
    log: PathBuf,
    child: Child,
}

impl Proxy {
    /// tinyproxy in the foreground on 127.0.0.1, logging every connection and request line;
    /// `basic_auth`: it asks for these credentials (407 without them).
    fn tinyproxy(bed: &Bed, basic_auth: Option<(&str, &str)>) -> Proxy {
        let port = free_port();
        let conf = bed.scratch.path().join(format!("tinyproxy-{port}.conf"));
        let mut text = format!(
            "Port {port}\nListen 127.0.0.1\nTimeout 60\nMaxClients 50\nLogLevel Connect\nDisableViaHeader Yes\n"
        );
        if let Some((user, password)) = basic_auth {
            text.push_str(&format!("BasicAuth {user} {password}\n"));
        }
        std::fs::write(&conf, text).expect("write tinyproxy.conf");
        Proxy::spawn(bed, "tinyproxy", &["-d", "-c", conf.to_str().expect("utf-8 path")], port)
    }

    /// microsocks on 127.0.0.1: it logs each connection it makes for a client.
    fn microsocks(bed: &Bed) -> Proxy {
        let port = free_port();
        Proxy::spawn(bed, "microsocks", &["-i", "127.0.0.1", "-p", &port.to_string()], port)
    }

    fn spawn(bed: &Bed, program: &str, args: &[&str], port: u16) -> Proxy {
        let log = bed.scratch.path().join(format!("{program}-{port}.log"));
        let file = std::fs::File::create(&log).expect("create the proxy's log");
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("start {program} ({e}): scripts/prereqs installs it"));
        let proxy = Proxy { port, log, child };
        let deadline = Instant::now() + WITHIN;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "{program} does not listen on {port} within {WITHIN:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        proxy
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (at most [`WITHIN`]) until the log holds a line with `needle`; the log on success.
    fn wait_for(&self, needle: &str) -> String {
        let deadline = Instant::now() + WITHIN;
        loop {
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            assert!(Instant::now() < deadline, "no {needle:?} in the proxy's log within {WITHIN:?}:\n{log}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends a CONNECT to a name that does not resolve through tinyproxy, and waits until the
    /// proxy has logged it: what the log holds then, everything before it logged too.
    fn mark(&self) -> String {
        let marker = format!("{}.invalid:1", unique("marker"));
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to the proxy");
        write!(stream, "CONNECT {marker} HTTP/1.1\r\nHost: {marker}\r\n\r\n").expect("send the marker");
        stream.set_read_timeout(Some(WITHIN)).expect("timeout");
        let _ = stream.read(&mut [0; 256]);
        self.wait_for(&format!("CONNECT {marker}"))
    }

    fn url(&self, host: &str) -> String {
        format!("http://{host}:{}", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// `host:port` of the source's API server and of the test bed's S3 endpoint.
fn bed_addresses(bed: &Bed) -> (String, String) {
    let config = Kubeconfig::read_from(&bed.source_kubeconfig).expect("read the source's kubeconfig");
    let server = config.clusters[0].cluster.as_ref().and_then(|c| c.server.clone()).expect("a server");
    let authority = |url: &str| url.split("://").nth(1).unwrap_or(url).trim_end_matches('/').to_string();
    (authority(&server), authority(&env("S3_ENDPOINT")))
}

/// `restatus backup` of nothing on the source, to `storage`, with only `proxy_env` of the proxy
/// variables set.
fn backup(kubeconfig: &Path, storage: &str, proxy_env: &[(&str, &str)], extra: &[(&str, &str)]) -> Output {
    let cluster = unique("proxy");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_restatus"));
    cmd.args(["backup", "--selector", &format!("restatus.test/none={cluster}"), "--kubeconfig"])
        .arg(kubeconfig)
        .env("RESTATUS_STORAGE", storage)
        .env("RESTATUS_CLUSTER_ID", &cluster);
    for var in PROXY_VARS {
        cmd.env_remove(var);
    }
    for (k, v) in proxy_env.iter().chain(extra) {
        cmd.env(k, v);
    }
    cmd.output().expect("run restatus")
}

/// The API server and S3 both go through an HTTP proxy given by `HTTPS_PROXY`/`HTTP_PROXY`
/// (the API server as a CONNECT tunnel, the test bed's plain-HTTP S3 as proxied requests); with
/// `NO_PROXY` covering their address, neither does, and the command still succeeds. The proxy
/// is named `localhost` and `NO_PROXY` says `127.0.0.1`: kube's own rule, which matches
/// `NO_PROXY` against the proxy's address, would have kept the proxy.
#[tokio::test]
async fn api_server_and_s3_go_through_an_http_proxy_unless_no_proxy_covers_them() {
    let bed = Bed::get();
    let (api, s3) = bed_addresses(&bed);
    let proxy = Proxy::tinyproxy(&bed, None);
    let url = proxy.url("localhost");
    let proxies = [("HTTPS_PROXY", url.as_str()), ("HTTP_PROXY", url.as_str())];
    let storage = bed.storage("proxy");

    let before = proxy.log().len();
    let out = backup(&bed.source_kubeconfig, &storage, &proxies, &[]);
    assert_success(&out, "backup through the proxy");
    let log = proxy.wait_for(&format!("CONNECT {api} HTTP/1.1"));
    let log = &log[before..];
    let tunnels = log.matches(&format!("CONNECT {api} ")).count();
    let s3_requests = log.lines().filter(|l| l.contains("Request (") && l.contains(&format!("http://{s3}/"))).count();
    assert!(s3_requests > 0, "the S3 requests went through the proxy: {log}");
    println!("through the proxy: {tunnels} CONNECT tunnel(s) to the API server {api}, {s3_requests} S3 request(s)");

    // The window: the log before the command started, up to the marker sent after it exited.
    let before = proxy.log().len();
    let bypass = [proxies[0], proxies[1], ("NO_PROXY", "example.org,127.0.0.1")];
    let out = backup(&bed.source_kubeconfig, &storage, &bypass, &[]);
    assert_success(&out, "backup with NO_PROXY covering the API server and S3");
    let log = proxy.mark();
    let window: Vec<&str> = log[before..].lines().collect();
    let requests: Vec<&&str> = window.iter().filter(|l| l.contains("Request (") && !l.contains(".invalid:1")).collect();
    assert!(requests.is_empty(), "NO_PROXY bypasses the proxy, yet it logged: {requests:#?}");
    println!(
        "with NO_PROXY: 0 requests of the command in the proxy's log from before it started to the marker ({} lines, the marker's included)",
        window.len()
    );
}

/// A kubeconfig cluster's `proxy-url` takes the API server through the proxy, whatever
/// `NO_PROXY` says (as kubectl reads it).
#[tokio::test]
async fn a_kubeconfig_proxy_url_is_used() {
    let bed = Bed::get();
    let (api, _) = bed_addresses(&bed);
    let proxy = Proxy::tinyproxy(&bed, None);
    let mut config = Kubeconfig::read_from(&bed.source_kubeconfig).expect("read kubeconfig");
    for cluster in &mut config.clusters {
        if let Some(cluster) = cluster.cluster.as_mut() {
            cluster.proxy_url = Some(proxy.url("127.0.0.1"));
        }
    }
    let kubeconfig = bed.scratch.path().join("proxy-url.kubeconfig");
    std::fs::write(&kubeconfig, serde_json::to_vec(&config).expect("json")).expect("write kubeconfig");
    let before = proxy.log().len();
    let out = backup(&kubeconfig, "memory://", &[("NO_PROXY", "*")], &[]);
    assert_success(&out, "backup with a kubeconfig proxy-url");
    let log = proxy.wait_for(&format!("CONNECT {api} HTTP/1.1"));
    println!("proxy-url: {} CONNECT tunnel(s) to {api}", log[before..].matches(&format!("CONNECT {api} ")).count());
}

/// `ALL_PROXY=socks5h://…`: the API server and S3 both connect through the SOCKS5 proxy.
#[tokio::test]
async fn api_server_and_s3_go_through_a_socks5_proxy() {
    let bed = Bed::get();
    let (api, s3) = bed_addresses(&bed);
    let proxy = Proxy::microsocks(&bed);
    let url = format!("socks5h://127.0.0.1:{}", proxy.port);
    let out = backup(&bed.source_kubeconfig, &bed.storage("socks"), &[("ALL_PROXY", &url)], &[]);
    assert_success(&out, "backup through the SOCKS5 proxy");
    proxy.wait_for(&format!("connected to {api}"));
    let log = proxy.wait_for(&format!("connected to {s3}"));
    let count = |to: &str| log.matches(&format!("connected to {to}")).count();
    println!("through SOCKS5: {} connection(s) to the API server, {} to S3", count(&api), count(&s3));
}

/// A proxy's password reaches no log line and no error: with the right one (debug logs on) the
/// command succeeds through the proxy; with a wrong one it fails, its error printed once.
#[tokio::test]
async fn proxy_credentials_reach_no_log_or_error() {
    let bed = Bed::get();
    let (api, _) = bed_addresses(&bed);
    let password = "s3cret-Proxy-pw";
    let proxy = Proxy::tinyproxy(&bed, Some(("restatus", password)));
    let with = |password: &str| format!("http://restatus:{password}@127.0.0.1:{}", proxy.port);
    let debug = [("RUST_LOG", "debug")];

    let right = with(password);
    let out = backup(&bed.source_kubeconfig, "memory://", &[("HTTPS_PROXY", &right)], &debug);
    assert_success(&out, "backup through a proxy that asks for credentials");
    proxy.wait_for(&format!("CONNECT {api} HTTP/1.1"));
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert!(!all.contains(password), "the proxy's password in the output:\n{all}");
    assert!(all.contains(&format!("proxy=http://127.0.0.1:{}", proxy.port)), "the debug log names the proxy: {all}");

    let wrong = with("wrong-pw-0b5e");
    let out = backup(&bed.source_kubeconfig, "memory://", &[("HTTPS_PROXY", &wrong)], &debug);
    assert!(!out.status.success(), "a wrong proxy password fails: {}", stderr(&out));
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert!(!all.contains("wrong-pw-0b5e") && !all.contains(password), "a password in the output:\n{all}");
    let err = stderr(&out);
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "the error once: {err}");
    println!("a wrong proxy password: {}", errors[0]);
}
