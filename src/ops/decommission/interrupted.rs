//! A consumer that died inside its handler may have done the job's work,
//! but its outcome died with it. Its item is still in its processing list,
//! and decommission archives it into a live Postgres job — which then runs
//! again: at least once under a crash, as promised, but it must be visible.
//! So before archiving, each item whose consumer had begun an attempt (the
//! inflight hash counts attempts before the handler is called) and whose
//! key is not in the ran set (a finished run is recorded there) gets a
//! Redis-side live attempt on record: `failed`, error class `interrupted`.
//! Once Postgres runs the job, the diff counts it as run live on both sides.
//!
//! Recorded once per key and attempt: a decommission run again after a
//! failure midway finds the row.

use redis::aio::ConnectionManager;
use sqlx::PgPool;

use crate::error::Result;
use crate::ops::redis_view::scan;
use crate::redis::keys::RouteKeys;
use crate::routes::Route;

/// The error class of an attempt a crash interrupted.
pub const INTERRUPTED: &str = "interrupted";

const RECORD_SQL: &str = r#"
INSERT INTO qbridge.outcomes (queue, key, side, mode, outcome, error_class, attempt)
SELECT $1, $2, 'redis', 'live', 'failed', $3, $4
 WHERE NOT EXISTS (SELECT 1 FROM qbridge.outcomes
                    WHERE queue = $1 AND key = $2 AND side = 'redis'
                      AND error_class = $3 AND attempt = $4)
"#;

/// Records the interrupted attempts of the route's gone consumers; returns
/// how many were recorded now.
pub(super) async fn record(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    keys: &RouteKeys,
) -> Result<usize> {
    let mut recorded = 0;
    for inflight in scan(redis, &keys.any_inflight()).await? {
        let (key, attempts): (Option<String>, Option<i32>) = redis::cmd("HMGET")
            .arg(&inflight)
            .arg("key")
            .arg("attempts")
            .query_async(redis)
            .await?;
        let (Some(key), Some(attempt)) = (key, attempts) else {
            continue;
        };
        if attempt < 1 {
            continue;
        }
        let finished: Option<f64> = redis::cmd("ZSCORE")
            .arg(keys.ran())
            .arg(&key)
            .query_async(redis)
            .await?;
        if finished.is_some() {
            continue;
        }
        let done = sqlx::query(RECORD_SQL)
            .bind(&route.queue)
            .bind(&key)
            .bind(INTERRUPTED)
            .bind(attempt)
            .execute(db)
            .await?;
        recorded += done.rows_affected() as usize;
    }
    Ok(recorded)
}
