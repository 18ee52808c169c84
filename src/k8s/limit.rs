//! The gate of the writes in flight to one API server, on the decisions of a pure
//! [`Limiter`] (`k8s/limiter.rs`: grow while latency stays flat, halve when the API server
//! sheds load). [`WriteLimit`] is the gate the clients' writes pass (see [`LimitLayer`], below
//! the clients' retry layer, so that every 429 a retry hides still reaches the limiter); reads
//! and watches pass without it.

use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Instant;

use futures::future::BoxFuture;
use http::{HeaderMap, StatusCode};
use tokio::sync::Notify;
use tower::{BoxError, Layer, Service, ServiceExt};

pub use super::limiter::{Answer, Change, DEFAULT_MAX, DEFAULT_START, LATENCY_TOLERANCE, LimitReport, Limiter, Sent};

/// The gate of the writes to one API server, shared by the client's clones (cheap to clone).
#[derive(Clone)]
pub struct WriteLimit {
    shared: Arc<Shared>,
}

struct Shared {
    gate: Mutex<Gate>,
    /// Woken when a write ends or the limit grows: the writes waiting look again.
    opened: Notify,
}

struct Gate {
    limiter: Limiter,
    in_flight: usize,
    peak: usize,
}

impl std::fmt::Debug for WriteLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let report = self.report();
        write!(f, "WriteLimit({}/{})", report.final_limit, report.max)
    }
}

impl WriteLimit {
    /// Starts at `start`, never above `max` (see [`Limiter::new`]).
    pub fn new(start: usize, max: usize) -> WriteLimit {
        let gate = Gate { limiter: Limiter::new(start, max), in_flight: 0, peak: 0 };
        WriteLimit { shared: Arc::new(Shared { gate: Mutex::new(gate), opened: Notify::new() }) }
    }

    fn gate(&self) -> std::sync::MutexGuard<'_, Gate> {
        self.shared.gate.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The limit now.
    pub fn current(&self) -> usize {
        self.gate().limiter.limit()
    }

    pub fn report(&self) -> LimitReport {
        let gate = self.gate();
        gate.limiter.report(gate.peak)
    }

    /// Waits until fewer writes than the limit are in flight, and counts this one in.
    pub async fn acquire(&self) -> Permit {
        loop {
            let opened = self.shared.opened.notified();
            tokio::pin!(opened);
            // Registered before looking, so that a write ending in between wakes this one.
            opened.as_mut().enable();
            {
                let mut gate = self.gate();
                if gate.in_flight < gate.limiter.limit() {
                    gate.in_flight += 1;
                    gate.peak = gate.peak.max(gate.in_flight);
                    let sent = Sent { epoch: gate.limiter.epoch(), in_flight: gate.in_flight };
                    return Permit { limit: self.clone(), sent, at: Instant::now(), answer: Answer::Unknown };
                }
            }
            opened.await;
        }
    }
}

/// One write let through: dropped when it is answered (or given up), telling the limiter.
pub struct Permit {
    limit: WriteLimit,
    sent: Sent,
    at: Instant,
    answer: Answer,
}

impl Permit {
    /// The write was answered with `status` and `headers`.
    pub fn answered(&mut self, status: StatusCode, headers: &HeaderMap) {
        self.answer = Answer::of(status, headers, self.at.elapsed());
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let change = {
            let mut gate = self.limit.gate();
            gate.in_flight -= 1;
            gate.limiter.answered(self.sent, self.answer)
        };
        match change {
            Change::Halved(limit) => tracing::info!(limit, "the API server shed load: write limit halved"),
            Change::Grew(limit) => tracing::debug!(limit, "latency flat: write limit raised"),
            Change::None => {}
        }
        self.limit.shared.opened.notify_waiters();
    }
}

/// Puts a [`WriteLimit`] in front of every write (any method but GET, HEAD, OPTIONS). Sits
/// below the retry layer (each try passes the gate, and its answer reaches the limiter) and
/// above the client's buffer, which it clones into each request.
#[derive(Clone)]
pub struct LimitLayer(pub WriteLimit);

impl<S> Layer<S> for LimitLayer {
    type Service = Limited<S>;

    fn layer(&self, inner: S) -> Limited<S> {
        Limited { inner, limit: self.0.clone() }
    }
}

#[derive(Clone)]
pub struct Limited<S> {
    inner: S,
    limit: WriteLimit,
}

impl<S, B, RB> Service<http::Request<B>> for Limited<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Send + 'static,
    RB: 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, std::result::Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> Poll<std::result::Result<(), BoxError>> {
        // The inner service is readied in each request, once it passed the gate: a write
        // waiting for the limit holds up no read.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let read = matches!(*request.method(), http::Method::GET | http::Method::HEAD | http::Method::OPTIONS);
        let inner = self.inner.clone();
        let limit = (!read).then(|| self.limit.clone());
        Box::pin(async move {
            let mut permit = match &limit {
                Some(limit) => Some(limit.acquire().await),
                None => None,
            };
            let response = inner.oneshot(request).await.map_err(Into::into)?;
            if let Some(permit) = permit.as_mut() {
                permit.answered(response.status(), response.headers());
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The gate lets `limit` writes through and holds the next until one ends.
    #[tokio::test]
    async fn the_gate_holds_writes_beyond_the_limit_until_one_ends() {
        let limit = WriteLimit::new(2, 2);
        let first = limit.acquire().await;
        let _second = limit.acquire().await;
        let third = tokio::spawn({
            let limit = limit.clone();
            async move { limit.acquire().await.sent }
        });
        // Polled for as long as the runtime has nothing else to do: it stays waiting.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!third.is_finished(), "a third write waits at a limit of 2");
        drop(first);
        let sent = tokio::time::timeout(Duration::from_secs(5), third).await.expect("let through").unwrap();
        assert_eq!(sent.in_flight, 2);
        assert_eq!(limit.report().peak_in_flight, 2);
    }
}
