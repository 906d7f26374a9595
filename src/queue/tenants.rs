//! Tenant settings. A queue whose pools cap jobs per tenant records its JSON
//! pointer in `qbridge.queue_settings`; enqueue then stores each job's tenant
//! in `jobs.tenant` (see `jobs_claim_tenant_idx`), which is what lets a claim
//! visit tenants one by one instead of reading a burst row by row.
//!
//! Jobs that were enqueued before the setting existed, or by a statement that
//! raced with it, have no tenant yet; [`backfill`] gives them one, at start-up
//! and then periodically from the runtime.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use sqlx::PgPool;

use crate::error::Result;

/// (database, queue, path) triples this process has already registered.
type Registered = HashSet<(String, String, Vec<String>)>;

fn registered() -> &'static Mutex<Registered> {
    static SEEN: OnceLock<Mutex<Registered>> = OnceLock::new();
    SEEN.get_or_init(Default::default)
}

/// Records `path` as the tenant pointer of `queue` (once per process) and
/// backfills the queue's jobs that have no tenant yet.
pub async fn ensure(pool: &PgPool, queue: &str, path: &[String]) -> Result<()> {
    let opts = pool.connect_options();
    let database = format!(
        "{}:{}/{}",
        opts.get_host(),
        opts.get_port(),
        opts.get_database().unwrap_or("")
    );
    let key = (database, queue.to_string(), path.to_vec());
    if registered()
        .lock()
        .map(|s| s.contains(&key))
        .unwrap_or(false)
    {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO qbridge.queue_settings (queue, tenant_path) VALUES ($1, $2) \
         ON CONFLICT (queue) DO UPDATE SET tenant_path = excluded.tenant_path \
         WHERE queue_settings.tenant_path IS DISTINCT FROM excluded.tenant_path",
    )
    .bind(queue)
    .bind(path)
    .execute(pool)
    .await?;
    backfill_queue(pool, queue).await?;
    if let Ok(mut seen) = registered().lock() {
        seen.insert(key);
    }
    Ok(())
}

/// Gives every ready job of a tenant-capped queue its tenant, in batches.
/// Returns how many rows were filled.
pub async fn backfill(pool: &PgPool) -> Result<u64> {
    let queues: Vec<String> = sqlx::query_scalar("SELECT queue FROM qbridge.queue_settings")
        .fetch_all(pool)
        .await?;
    let mut filled = 0;
    for q in queues {
        filled += backfill_queue(pool, &q).await?;
    }
    Ok(filled)
}

async fn backfill_queue(pool: &PgPool, queue: &str) -> Result<u64> {
    let mut filled = 0;
    loop {
        let done = sqlx::query(
            "UPDATE qbridge.jobs j SET tenant = coalesce(j.payload #>> s.tenant_path, '') \
               FROM qbridge.queue_settings s \
              WHERE s.queue = $1 AND j.id IN ( \
                    SELECT id FROM qbridge.jobs \
                     WHERE queue = $1 AND state = 'ready' AND tenant IS NULL \
                     LIMIT 5000 FOR NO KEY UPDATE SKIP LOCKED)",
        )
        .bind(queue)
        .execute(pool)
        .await?;
        filled += done.rows_affected();
        if done.rows_affected() < 5000 {
            return Ok(filled);
        }
    }
}
