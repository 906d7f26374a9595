//! Per-route numbers for `qbridge stats`: the phase, the keys a route has
//! enqueued, items stored raw because they did not parse (flagged), mirror
//! copies still in the hot table, pushes owed to Redis, and — when Redis
//! answers — the list and gap-list lengths.

use ::redis::AsyncCommands;
use serde::Serialize;
use sqlx::PgPool;

use crate::error::Result;
use crate::redis::keys::RouteKeys;
use crate::routes::Routes;

/// One route's numbers.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RouteStats {
    pub route: String,
    pub queue: String,
    pub phase: String,
    /// Job keys remembered in `job_keys` (the dedup window).
    pub keys: i64,
    /// Items stored raw because they did not parse as the route's format.
    pub flagged: i64,
    /// Mirror copies not drained yet.
    pub mirror_in_flight: i64,
    /// Live copies not finished yet.
    pub live_in_flight: i64,
    /// Producer-API pushes still owed to Redis.
    pub owed_to_redis: i64,
    /// Length of the Redis list (`None` when Redis was not asked or did not answer).
    pub redis_list: Option<i64>,
    /// Items waiting in the gap list for Postgres.
    pub gap_list: Option<i64>,
}

const SQL: &str = r#"
SELECT q.queue,
       (SELECT count(*) FROM qbridge.job_keys k WHERE k.queue = q.queue),
       (SELECT count(*) FROM qbridge.job_keys k WHERE k.queue = q.queue AND k.flagged IS NOT NULL),
       (SELECT count(*) FROM qbridge.jobs j WHERE j.queue = q.queue AND j.copy = 'mirror'),
       (SELECT count(*) FROM qbridge.jobs j WHERE j.queue = q.queue AND j.copy = 'live'),
       (SELECT count(*) FROM qbridge.redis_outbox o WHERE o.queue = q.queue)
  FROM unnest($1::text[]) AS q(queue)
"#;

/// Numbers of every route; Redis lengths only when `redis` is given.
pub async fn collect(
    db: &PgPool,
    routes: &Routes,
    mut redis: Option<::redis::aio::ConnectionManager>,
) -> Result<Vec<RouteStats>> {
    let queues: Vec<&str> = routes.iter().map(|r| r.queue.as_str()).collect();
    let rows: Vec<(String, i64, i64, i64, i64, i64)> =
        sqlx::query_as(SQL).bind(&queues).fetch_all(db).await?;
    let mut out = Vec::new();
    for (route, (_, keys, flagged, mirror, live, owed)) in routes.iter().zip(rows) {
        let (mut redis_list, mut gap_list) = (None, None);
        if let Some(conn) = redis.as_mut() {
            // The route's list and its priority lists (Celery), together.
            let mut total = Some(0i64);
            for list in route.lists() {
                let n: Option<i64> = conn.llen(list.as_ref()).await.ok();
                total = total.zip(n).map(|(a, b)| a + b);
            }
            redis_list = total;
            gap_list = conn.llen(RouteKeys::of(route).gap()).await.ok();
        }
        out.push(RouteStats {
            route: route.name.clone(),
            queue: route.queue.clone(),
            phase: routes.phase(route).to_string(),
            keys,
            flagged,
            mirror_in_flight: mirror,
            live_in_flight: live,
            owed_to_redis: owed,
            redis_list,
            gap_list,
        });
    }
    Ok(out)
}
