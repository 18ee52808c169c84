//! The controller's HTTP endpoints: `/metrics` (Prometheus text), `/healthz`, `/readyz`.

use std::sync::Arc;

use tracing::info;

use crate::controller::Context;
use crate::{Error, Result};

/// Serves `/metrics`, `/healthz` and `/readyz` until the process ends.
pub async fn serve(ctx: Arc<Context>, addr: std::net::SocketAddr) -> Result<()> {
    use axum::http::StatusCode;
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(|axum::extract::State(ctx): axum::extract::State<Arc<Context>>| async move { ctx.metrics.render() }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|axum::extract::State(ctx): axum::extract::State<Arc<Context>>| async move {
                if ctx.is_ready() { (StatusCode::OK, "ready") } else { (StatusCode::SERVICE_UNAVAILABLE, "not ready") }
            }),
        )
        .with_state(ctx);
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| Error::io(format!("listen on {addr}"), e))?;
    info!(%addr, "serving /metrics, /healthz, /readyz");
    axum::serve(listener, app).await.map_err(|e| Error::io("HTTP server", e))
}
