//! Kubernetes clients: from an explicit kubeconfig file (tests use two clusters at once) or
//! inferred the usual way (`KUBECONFIG`, `~/.kube/config`, in-cluster service account).

use std::future::Future;
use std::path::Path;
use std::task::Poll;
use std::time::Duration;

use futures::future::{self, BoxFuture};
use kube::client::ClientBuilder;
use kube::client::retry::RetryPolicy;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::buffer::BufferLayer;
use tower::retry::RetryLayer;
use tower::{BoxError, Layer, Service};
use tracing::debug;

use crate::domain::identity::Profile;
use crate::k8s::leader::{Fence, LeaseTiming, NotLeading};
use crate::k8s::limit::{LimitLayer, WriteLimit};
use crate::k8s::proxy;
use crate::{Error, Result};

/// What restatus calls itself to an API server: `restatus/<version>`.
pub const USER_AGENT: &str = concat!("restatus/", env!("CARGO_PKG_VERSION"));

pub async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<kube::Client> {
    let builder =
        ClientBuilder::try_from(config(kubeconfig, context).await?).map_err(|e| Error::kube("build client", e))?;
    Ok(builder.with_layer(&BufferLayer::new(REQUESTS_IN_FLIGHT)).with_layer(&RetryLayer::new(retry_policy())).build())
}

/// As [`client`], and every write (each try of it) passes `limit` first: at most its current
/// limit of writes are in flight, and each answer (a 429 the retry layer then retries, too)
/// tells the limit how the API server copes (see [`crate::k8s::limit`]). The one-shot
/// restore's client.
pub async fn limited_client(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    limit: &WriteLimit,
) -> Result<kube::Client> {
    let builder =
        ClientBuilder::try_from(config(kubeconfig, context).await?).map_err(|e| Error::kube("build client", e))?;
    Ok(builder
        .with_layer(&BufferLayer::new(REQUESTS_IN_FLIGHT))
        .with_layer(&LimitLayer(limit.clone()))
        .with_layer(&RetryLayer::new(retry_policy()))
        .build())
}

/// The controller's client: as [`client`], and every write passes `fence` just before it is
/// sent, each retry again (a request refused there fails with [`NotLeading`]). Reads (and
/// watches) pass always. Below that, its connections are driven by a [`FencedExecutor`]: once
/// the replica led and its lease is over, no connection sends another byte, so a write that
/// passed the fence just before the process was stopped, and waited in the connection (for a
/// TLS handshake, say), is never sent after it continues. Its writes pass `limit`, as
/// [`limited_client`]'s do.
pub async fn fenced_client(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    fence: &Fence,
    limit: &WriteLimit,
) -> Result<kube::Client> {
    let config = config(kubeconfig, context).await?;
    let builder =
        ClientBuilder::try_from((config, FencedExecutor(fence.clone()))).map_err(|e| Error::kube("build client", e))?;
    Ok(builder
        .with_layer(&FenceLayer(fence.clone()))
        .with_layer(&BufferLayer::new(REQUESTS_IN_FLIGHT))
        .with_layer(&LimitLayer(limit.clone()))
        .with_layer(&RetryLayer::new(retry_policy()))
        .build())
}

/// The client of the leader election's Lease: no retries, and every request given up after
/// `timing`'s attempt timeout (connecting and reading alike), so that a renewal is tried again
/// every few seconds instead of waiting on an API server that sheds load or does not answer.
pub async fn lease_client(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    timing: &LeaseTiming,
) -> Result<kube::Client> {
    let mut config = config(kubeconfig, context).await?;
    let timeout = timing.attempt_timeout();
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    let builder = ClientBuilder::try_from(config).map_err(|e| Error::kube("build the lease's client", e))?;
    Ok(builder.build())
}

/// The configuration every client of restatus starts from.
async fn config(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<kube::Config> {
    let options = KubeConfigOptions { context: context.map(str::to_string), ..Default::default() };
    let (mut config, file, path) = match kubeconfig {
        Some(path) => {
            let err = |reason: String| Error::Kubeconfig { path: path.to_path_buf(), reason };
            let file = Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
            let config =
                kube::Config::from_custom_kubeconfig(file.clone(), &options).await.map_err(|e| err(e.to_string()))?;
            (config, Some(file), path.to_path_buf())
        }
        None => {
            let config = match context {
                None => kube::Config::infer()
                    .await
                    .map_err(|e| Error::Kubeconfig { path: "(inferred)".into(), reason: e.to_string() })?,
                Some(_) => kube::Config::from_kubeconfig(&options)
                    .await
                    .map_err(|e| Error::Kubeconfig { path: "(default)".into(), reason: e.to_string() })?,
            };
            // In a pod without a kubeconfig there is none, and no proxy-url.
            (config, Kubeconfig::read().ok(), "(default)".into())
        }
    };
    // The proxy is restatus's choice, not kube's (see `proxy`).
    let explicit = file.as_ref().and_then(|file| proxy_url_of(file, context, &config.cluster_url));
    let proxy = proxy::choose(&config.cluster_url, explicit.as_deref(), &proxy::ProxyEnv::from_env())
        .map_err(|reason| Error::Kubeconfig { path, reason })?;
    if let Some(proxy) = &proxy {
        debug!(proxy = %proxy::redacted(&proxy.url.to_string()), from = proxy.source, "the API server is reached through a proxy");
    }
    config.proxy_url = proxy.map(|proxy| proxy.url);
    // Named in the API server's audit log (`userAgent`), as kubectl and client-go are.
    config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_static(USER_AGENT)));
    config.connect_timeout = Some(Duration::from_secs(10));
    // An API server that stops answering fails the request, but only after a watch's own
    // server-side timeout (kube's watcher asks for 290 s): a quiet watch hears nothing for
    // minutes, and at 60 s every watch of an idle controller was cut and counted an error
    // each minute. Timed from when a request is sent, not from when its pooled connection
    // went idle.
    config.read_timeout = Some(READ_TIMEOUT);
    config.reset_reader_on_write = true;
    // kube's own retry layer, replaced by a bounded one (see `retry_policy`). Retrying calls
    // the stack again, so it sits behind a buffer: kube's stack is one boxed service, not a
    // clonable one.
    config.default_retry = false;
    Ok(config)
}

/// The `proxy-url` of the kubeconfig cluster `context` (else the current context) names, if
/// that cluster is the one `server` came from.
fn proxy_url_of(file: &Kubeconfig, context: Option<&str>, server: &http::Uri) -> Option<String> {
    let name = context.or(file.current_context.as_deref())?;
    let context = file.contexts.iter().find(|c| c.name == name)?.context.as_ref()?;
    let cluster = file.clusters.iter().find(|c| c.name == context.cluster)?.cluster.as_ref()?;
    let same = cluster.server.as_deref().and_then(|s| s.parse::<http::Uri>().ok()).is_some_and(|s| &s == server);
    same.then(|| cluster.proxy_url.clone()).flatten()
}

/// Spawns the client's connection tasks (hyper's: they write requests to the socket and read
/// answers) so that each stops at its next poll once the replica's lease is over
/// ([`Fence::stopped`]): dropped, the connection closes without sending what it still held.
/// A replica that lost its lease steps down and exits, so its reads end with it.
#[derive(Clone)]
struct FencedExecutor(Fence);

impl<F> hyper::rt::Executor<F> for FencedExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, task: F) {
        let fence = self.0.clone();
        let mut task = Box::pin(task);
        tokio::spawn(future::poll_fn(move |cx| match fence.stopped() {
            true => Poll::Ready(()),
            false => task.as_mut().poll(cx),
        }));
    }
}

/// Puts a [`Fence`] in front of every write.
#[derive(Clone)]
struct FenceLayer(Fence);

impl<S> Layer<S> for FenceLayer {
    type Service = Fenced<S>;

    fn layer(&self, inner: S) -> Fenced<S> {
        Fenced { inner, fence: self.0.clone() }
    }
}

#[derive(Clone)]
struct Fenced<S> {
    inner: S,
    fence: Fence,
}

impl<S, B> Service<http::Request<B>> for Fenced<S>
where
    S: Service<http::Request<B>>,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, std::result::Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> Poll<std::result::Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let read = matches!(*request.method(), http::Method::GET | http::Method::HEAD | http::Method::OPTIONS);
        let fence = self.fence.clone();
        let refused = move |request: &str| Box::new(NotLeading { request: request.to_string() }) as BoxError;
        let what = format!("{} {}", request.method(), request.uri().path());
        if !read && !fence.may_write() {
            return Box::pin(future::ready(Err(refused(&what))));
        }
        let response = self.inner.call(request);
        Box::pin(async move {
            // Asked again as the request goes out (the future is polled), not only when it was
            // queued: a process stopped in between finds its lease over and sends nothing.
            if !read && !fence.may_write() {
                return Err(refused(&what));
            }
            response.await.map_err(Into::into)
        })
    }
}

/// How long a request may wait for the API server's next bytes.
const READ_TIMEOUT: Duration = Duration::from_secs(295);

/// Requests queued for the client's stack before a caller waits; far more than restatus
/// sends at once (its writes' limit, a watch per kind, the lease).
const REQUESTS_IN_FLIGHT: usize = 1024;

/// Wait before the first retry; the waits double from here.
const FIRST_RETRY_WAIT: Duration = Duration::from_millis(200);

/// The longest wait between two tries of one request, unless the API server asks for longer.
const LONGEST_RETRY_WAIT: Duration = Duration::from_secs(5);

/// Retries of a request the API server answers 429, 503 or 504: a starting API server answers
/// 503 until its paths are installed, then 429 for a watch until its watch cache is filled;
/// API Priority and Fairness sheds load with 429. Up to 15 retries, each wait doubling from
/// 200 ms to at most 5 s, or the server's `Retry-After` when that is longer.
///
/// kube's default is the same but with waits doubling up to 1,000 s (from 5 ms, with up to
/// twice the wait added as jitter): an API server that answered 503 and 429 for half a minute
/// while it restarted could keep a watch waiting minutes after it was ready again.
fn retry_policy() -> RetryPolicy {
    RetryPolicy::new(FIRST_RETRY_WAIT, LONGEST_RETRY_WAIT, 15, true).expect("200 ms <= 5 s")
}

/// The identity of the cluster `client` talks to: the uid of its `kube-system` namespace (it
/// lives as long as the cluster; a restored etcd keeps it, a new cluster gets another). A
/// manifest records it (`capturedFrom`) so that a cluster never restores its own snapshots onto
/// itself by accident. `None`, with a warning, where the caller may not read it.
pub async fn cluster_uid(client: &kube::Client) -> Option<String> {
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    match namespaces.get_metadata("kube-system").await {
        Ok(ns) => ns.metadata.uid,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the kube-system namespace's uid: this cluster's identity is unknown");
            None
        }
    }
}

/// What every command that talks to a cluster starts from: its profile and a client.
pub async fn connect(
    profile: &str,
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<(Profile, kube::Client)> {
    let profile = Profile::load(profile)?;
    Ok((profile, client(kubeconfig, context).await?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response, StatusCode};
    use hyper::rt::Executor;
    use tokio::sync::oneshot;
    use tower::retry::Policy;

    /// F63, the last gap: a connection task that was sending when the process was stopped
    /// (a write past the fence, waiting for its connection's TLS handshake) is dropped at its
    /// next poll once the lease is over, not run on; one of a replica that never led, or that
    /// leads, runs.
    #[tokio::test]
    async fn a_connection_of_a_replica_whose_lease_is_over_sends_nothing_more() {
        let fence = Fence::default();
        let executor = FencedExecutor(fence.clone());
        let runs = |executor: &FencedExecutor| {
            let (done, ran) = oneshot::channel();
            executor.execute(async move {
                let _ = done.send(());
            });
            ran
        };
        assert!(runs(&executor).await.is_ok(), "a standby's connections run");
        fence.set(Some(std::time::Instant::now() + Duration::from_secs(60)));
        assert!(runs(&executor).await.is_ok(), "a leader's connections run");

        // A connection in the middle of its work (parked on `go`) when the lease runs out.
        let (go, wait) = oneshot::channel::<()>();
        let (done, ran) = oneshot::channel::<()>();
        executor.execute(async move {
            let _ = wait.await;
            let _ = done.send(());
        });
        tokio::task::yield_now().await;
        fence.set(Some(std::time::Instant::now()));
        assert!(fence.stopped());
        go.send(()).unwrap();
        assert!(ran.await.is_err(), "dropped at its next poll: it sent nothing more");
    }

    /// The waits `policy` asks for, one per answer, until it gives up.
    fn waits_for(answer: impl Fn() -> Response<()>) -> Vec<Duration> {
        let mut policy = retry_policy();
        let mut request = Request::new(kube::client::Body::from(Vec::new()));
        let mut waits = Vec::new();
        let start = tokio::time::Instant::now();
        while let Some(sleep) = policy.retry(&mut request, &mut Ok(answer())) {
            waits.push(sleep.deadline() - start);
        }
        waits
    }

    fn status(code: StatusCode, retry_after: Option<&str>) -> Response<()> {
        let mut response = Response::builder().status(code);
        if let Some(seconds) = retry_after {
            response = response.header("Retry-After", seconds);
        }
        response.body(()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn an_api_server_that_stays_unavailable_is_retried_15_times_never_waiting_more_than_5_s() {
        let waits = waits_for(|| status(StatusCode::SERVICE_UNAVAILABLE, None));
        assert_eq!(waits.len(), 15);
        assert!(waits.iter().all(|w| *w <= LONGEST_RETRY_WAIT), "{waits:?}");
        assert!(waits[0] >= FIRST_RETRY_WAIT, "{waits:?}");
        assert!(waits[14] >= LONGEST_RETRY_WAIT / 2, "the waits grow: {waits:?}");
        // A watch cache filling after a restart (429, Retry-After 1): the server's wait while
        // the policy's own is shorter, then the policy's, still at most 5 s.
        let waits = waits_for(|| status(StatusCode::TOO_MANY_REQUESTS, Some("1")));
        assert_eq!(waits[0], Duration::from_secs(1));
        assert!(waits.iter().all(|w| (Duration::from_secs(1)..=LONGEST_RETRY_WAIT).contains(w)), "{waits:?}");
    }

    /// Every write of the controller's client passes the fence; reads pass always.
    #[tokio::test]
    async fn a_write_is_not_sent_once_the_lease_is_over_and_reads_go_on() {
        use crate::fixtures::{self, api, uuid};
        let (service, mut handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let fence = Fence::default();
        let client = kube::Client::new(FenceLayer(fence.clone()).layer(service), "default");
        let profile = Profile::metal_operator();
        let kind = profile.kind("Server").unwrap();
        let object = fixtures::live("Server", "server-1", &[uuid("uuid-1")], None);
        let patch = serde_json::json!({"ignore": "me"});
        let annotate = || crate::k8s::annotate(&client, kind, None, &object.name, None, &patch);
        let api_server = tokio::spawn(async move {
            let mut seen = vec![];
            for _ in 0..2 {
                let answer = api::server("server-1", None).to_string();
                seen.push(api::answer(&mut handle, StatusCode::OK, answer).await.0);
            }
            seen
        });

        // Not leading yet, then a lease that ran out: refused before anything is sent.
        for deadline in [None, Some(std::time::Instant::now())] {
            fence.set(deadline);
            let error = annotate().await.expect_err("a write without the lease").to_string();
            assert!(error.contains("not sent: this replica's lease was not renewed in time"), "{error}");
        }
        // A read goes out all the same, and a write once the lease is renewed.
        crate::k8s::get_object(&client, kind, None, "server-1").await.unwrap();
        fence.set(Some(std::time::Instant::now() + Duration::from_secs(10)));
        annotate().await.unwrap();
        assert_eq!(
            api_server.await.unwrap(),
            [http::Method::GET, http::Method::PATCH],
            "only the read and the last write"
        );
    }

    /// F66: the API server sheds a write with 429 and `Retry-After` (API Priority and
    /// Fairness): the answer reaches the limit below the retry layer, which halves it, and the
    /// retry then succeeds; reads pass the gate untold.
    #[tokio::test(start_paused = true)]
    async fn a_429_with_retry_after_reaching_the_limit_halves_it_and_the_write_is_retried() {
        use crate::fixtures::{self, api};
        let (service, mut handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let limit = WriteLimit::new(16, 64);
        let stack = RetryLayer::new(retry_policy()).layer(LimitLayer(limit.clone()).layer(service));
        let client = kube::Client::new(stack, "default");
        let profile = Profile::metal_operator();
        let kind = profile.kind("Server").unwrap();
        let object = fixtures::live("Server", "server-1", &[fixtures::uuid("uuid-1")], None);
        let patch = serde_json::json!({"ignore": "me"});
        let api_server = tokio::spawn(async move {
            let mut seen = vec![];
            // A read first: it says nothing to the limit.
            seen.push(api::answer(&mut handle, StatusCode::OK, api::server("server-1", None).to_string()).await.0);
            let (request, send) = handle.next_request().await.expect("the write");
            seen.push(request.method().clone());
            let shed =
                r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429}"#;
            send.send_response(
                Response::builder()
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .header("Retry-After", "1")
                    .header("X-Kubernetes-PF-FlowSchema-UID", "flow")
                    .body(kube::client::Body::from(shed.as_bytes().to_vec()))
                    .unwrap(),
            );
            seen.push(api::answer(&mut handle, StatusCode::OK, api::server("server-1", None).to_string()).await.0);
            seen
        });
        crate::k8s::get_object(&client, kind, None, "server-1").await.unwrap();
        assert_eq!(limit.current(), 16, "a read leaves the limit alone");
        let annotated = crate::k8s::annotate(&client, kind, None, &object.name, None, &patch).await.unwrap();
        assert_eq!(annotated, crate::k8s::Annotated::Done, "retried after the server's wait, then written");
        assert_eq!(api_server.await.unwrap(), [http::Method::GET, http::Method::PATCH, http::Method::PATCH]);
        let report = limit.report();
        assert_eq!((report.final_limit, report.lowest, report.halvings), (8, 8, 1), "{report:?}");
        assert_eq!(report.peak_in_flight, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_longer_retry_after_is_honoured_and_other_answers_are_not_retried() {
        let waits = waits_for(|| status(StatusCode::TOO_MANY_REQUESTS, Some("20")));
        assert_eq!(waits, vec![Duration::from_secs(20); 15]);
        for code in [StatusCode::OK, StatusCode::NOT_FOUND, StatusCode::CONFLICT, StatusCode::INTERNAL_SERVER_ERROR] {
            assert!(waits_for(|| status(code, None)).is_empty(), "{code} retried");
        }
    }
}
