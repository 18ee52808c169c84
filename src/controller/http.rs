//! The controller's HTTP endpoints (`metrics::serve`): `/metrics` (OpenMetrics text),
//! `/healthz`, and `/readyz`, which says what the controller restores to and which kinds it
//! cannot watch.

use std::sync::Arc;

use crate::Result;
use crate::controller::Context;

/// `/readyz`: ready or not, then one line per kind that cannot be watched.
fn readyz(ctx: &Context) -> (bool, String) {
    let ready = ctx.is_ready();
    let mut body = if ready { "ready\n".to_string() } else { "not ready\n".to_string() };
    if let Some(in_use) = ctx.in_use() {
        body += &format!("restoring to {in_use}\n");
    }
    for (kind, reason) in ctx.unavailable_kinds() {
        body += &format!("kind {kind} skipped: {reason}\n");
    }
    (ready, body)
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the process ends.
pub async fn serve(ctx: Arc<Context>, listener: tokio::net::TcpListener) -> Result<()> {
    let (metrics, ready) = (ctx.clone(), ctx);
    crate::metrics::serve(listener, move || metrics.metrics.render(), move || readyz(&ready)).await
}
