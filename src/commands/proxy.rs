//! `qbridge proxy`: the RESP proxy on its own, with its mirror writers, gap
//! repair, the outbox repair and the HTTP listener (metrics, health,
//! enqueue). Stops like `qbridge run`: SIGINT/SIGTERM stop accepting, every
//! connection answers what it already read, queued mirror items are written.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::app::services::RedisSide;
use crate::config::Config;
use crate::error::Result;
use crate::ingest::Via;

pub async fn run(config: Config, listen: Option<&str>) -> Result<()> {
    crate::telemetry::prometheus();
    let db = crate::db::connect(&config.database_url, config.max_connections).await?;
    crate::db::check_schema(&db).await?;
    let maintenance = CancellationToken::new();
    let stop = crate::shutdown::on_signal();
    let mut side = RedisSide::start(&config, &db, true, &maintenance).await?;
    let addr = side.start_proxy(&config, listen, stop.clone()).await?;
    let mut state = crate::http::AppState::new(db.clone(), crate::telemetry::prometheus());
    state.producer = side.producer.clone().map(|p| p.with_via(Via::Http));
    state.payload_limit = config.payload_limit;
    state.max_body = config.http.max_body.0;
    state.admin_token = config.admin_token.clone();
    state.enqueue_requires_token = config.http.enqueue_requires_token;
    let http = crate::http::serve(&config.http.listen, state, maintenance.clone()).await?;
    tracing::info!(listen = %addr, routes = config.routes.len(), "proxy running");
    stop.cancelled().await;
    side.finish(&maintenance, config.shutdown_deadline).await;
    if tokio::time::timeout(Duration::from_secs(5), http)
        .await
        .is_err()
    {
        tracing::warn!("http listener did not stop in time");
    }
    db.close().await;
    tracing::info!("proxy stopped");
    Ok(())
}
