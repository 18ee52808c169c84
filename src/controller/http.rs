//! The controller's HTTP endpoints: `/metrics` (OpenMetrics text), `/healthz`, `/readyz`; and
//! [`serve_metrics`], `/metrics` and `/healthz` alone, for `restatus schedule`.

use std::sync::Arc;

use tracing::info;

use crate::controller::Context;
use crate::controller::metrics::OPENMETRICS_CONTENT_TYPE;
use crate::{Error, Result};

/// `/readyz`: ready or not, then one line per kind that cannot be watched.
fn readyz(ctx: &Context) -> (axum::http::StatusCode, String) {
    let mut body = if ctx.is_ready() { "ready\n".to_string() } else { "not ready\n".to_string() };
    if let Some(in_use) = ctx.in_use() {
        body += &format!("restoring to {in_use}\n");
    }
    for (kind, reason) in ctx.unavailable_kinds() {
        body += &format!("kind {kind} skipped: {reason}\n");
    }
    let code = if ctx.is_ready() { axum::http::StatusCode::OK } else { axum::http::StatusCode::SERVICE_UNAVAILABLE };
    (code, body)
}

/// A `/metrics` answer: `body` with the OpenMetrics content type.
fn metrics_response(body: String) -> impl axum::response::IntoResponse {
    ([(axum::http::header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], body)
}

/// Binds the endpoints' address: a port that cannot be bound is an error at start, not a
/// liveness probe that fails later.
pub async fn bind(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io(format!("listen on {addr} for /metrics, /healthz, /readyz"), e))
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the process ends.
pub async fn serve(ctx: Arc<Context>, listener: tokio::net::TcpListener) -> Result<()> {
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(|axum::extract::State(ctx): axum::extract::State<Arc<Context>>| async move {
                metrics_response(ctx.metrics.render())
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|axum::extract::State(ctx): axum::extract::State<Arc<Context>>| async move { readyz(&ctx) }),
        )
        .with_state(ctx);
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /healthz, /readyz");
    }
    axum::serve(listener, app).await.map_err(|e| Error::io("HTTP server", e))
}

/// Serves `/metrics` (what `render` returns at each scrape) and `/healthz` on `listener` until
/// the process ends.
pub async fn serve_metrics<R>(render: R, listener: tokio::net::TcpListener) -> Result<()>
where
    R: Fn() -> String + Clone + Send + Sync + 'static,
{
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/metrics", get(move || std::future::ready(metrics_response(render()))))
        .route("/healthz", get(|| async { "ok" }));
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /healthz");
    }
    axum::serve(listener, app).await.map_err(|e| Error::io("HTTP server", e))
}
