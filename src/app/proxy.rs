//! `qbridge proxy`: the RESP proxy on its own, with its mirror writers, gap
//! repair, the route maintenance (outbox repair, key pruning, diff gauges)
//! and the HTTP listener (metrics, health, enqueue, the admin API). Stops
//! like `qbridge run`: SIGINT/SIGTERM stop accepting, every connection
//! answers what it already read, queued mirror items are written.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::redis_side::RedisSide;
use crate::config::Config;
use crate::error::Result;
use crate::http::AppState;
use crate::periodic::Services;

/// How long background services (HTTP included) get to stop at the end.
const SERVICES_GRACE: Duration = Duration::from_secs(5);

/// Runs the proxy until `stop` is cancelled. `listen` overrides
/// `[proxy] listen`.
pub async fn run(config: Config, listen: Option<&str>, stop: CancellationToken) -> Result<()> {
    let db = config.open_db(config.max_connections).await?;
    crate::db::check_schema(&db).await?;
    let mut services = Services::new();
    let mut side = RedisSide::start(&config, &db, true, &mut services).await?;
    let addr = side.start_proxy(&config, listen, stop.clone()).await?;
    let state = AppState::from_config(&config, db.clone(), side.producer.clone());
    let http = crate::http::serve(&config.http.listen, state, services.token().clone()).await?;
    services.adopt("http listener", http);
    tracing::info!(listen = %addr, routes = config.routes.len(), "proxy running");
    stop.cancelled().await;
    side.finish(config.shutdown_deadline).await;
    services.stop(SERVICES_GRACE).await;
    db.close().await;
    tracing::info!("proxy stopped");
    Ok(())
}
