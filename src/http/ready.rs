//! `/readyz`: 200 when this process can do its work, 503 otherwise, with
//! one line per thing checked so an operator sees which part is missing:
//! Postgres (reachable, schema neither older nor newer than the binary),
//! how workers are woken (LISTEN, or polling behind a transaction-mode
//! pooler without a direct URL), and each route's Redis (a PING within 1 s;
//! decommissioned routes need none).

use std::fmt::Write;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;

use super::AppState;
use crate::model::Phase;

/// How long each check may take before it counts as failed.
const CHECK_WITHIN: Duration = Duration::from_secs(2);

pub(super) async fn readyz(State(state): State<AppState>) -> (StatusCode, String) {
    let mut ready = true;
    let mut lines = String::new();
    let schema = tokio::time::timeout(CHECK_WITHIN, crate::db::check_schema(&state.db)).await;
    match schema {
        Ok(Ok(())) => lines.push_str("postgres: ok\n"),
        Ok(Err(e)) => {
            ready = false;
            let _ = writeln!(lines, "postgres: {e}");
        }
        Err(_) => {
            ready = false;
            lines.push_str("postgres: did not answer within 2s\n");
        }
    }
    let _ = writeln!(lines, "database: {}", state.database_mode);
    if let Some(producer) = &state.producer {
        let routes = producer.routes();
        let live: Vec<_> = routes
            .iter()
            .filter(|r| routes.phase(r) != Phase::Decommissioned)
            .collect();
        if !live.is_empty() {
            let redis = match producer.redis() {
                None => Err("no connection".to_string()),
                Some(conn) => ping(conn.clone()).await,
            };
            for route in live {
                match &redis {
                    Ok(()) => {
                        let _ = writeln!(lines, "route {}: redis ok", route.name);
                    }
                    Err(e) => {
                        ready = false;
                        let _ = writeln!(lines, "route {}: redis {e}", route.name);
                    }
                }
            }
        }
    }
    match ready {
        true => (StatusCode::OK, format!("ready\n{lines}")),
        false => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready\n{lines}"),
        ),
    }
}

/// One PING on the routes' connection; the error as one line.
async fn ping(mut conn: redis::aio::ConnectionManager) -> Result<(), String> {
    let ping = redis::cmd("PING");
    match tokio::time::timeout(CHECK_WITHIN, ping.query_async::<String>(&mut conn)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!(
            "unreachable: {}",
            e.to_string().lines().next().unwrap_or_default()
        )),
        Err(_) => Err("did not answer within 2s".into()),
    }
}
