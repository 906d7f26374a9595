//! Claim latency with history: fills `jobs_dead` and, when asked,
//! `jobs_done` with a large history (once; kept between runs, in the bench
//! queue), enqueues a backlog, and times sequential claim statements of
//! `batch` jobs and the completion of each batch (which appends to
//! `jobs_done`).

use std::time::{Duration, Instant};

use crate::bench::harness;
use crate::bench::{BenchReport, BENCH_QUEUE};
use crate::config::Config;
use crate::error::Result;
use crate::queue::{claim, enqueue, fence, ClaimRequest, NewJob};

/// History rows to have before timing.
pub struct History {
    /// In `jobs_dead`.
    pub dead: i64,
    /// In `jobs_done`.
    pub done: i64,
}

pub async fn run(
    config: &Config,
    history: History,
    samples: usize,
    batch: i64,
) -> Result<BenchReport> {
    let dead_history = history.dead;
    let db = harness::prepare(config).await?;
    fill_done(&db, history.done).await?;
    let have: i64 = sqlx::query_scalar("SELECT count(*) FROM qbridge.jobs_dead WHERE queue = $1")
        .bind(BENCH_QUEUE)
        .fetch_one(&db)
        .await?;
    if have < dead_history {
        // Ids far from the identity range of live jobs.
        sqlx::query(
            "INSERT INTO qbridge.jobs_dead (id, queue, payload, priority, attempts, max_attempts, last_error, created_at, failed_at) \
             SELECT -g, $1, jsonb_build_object('i', g), 0, 25, 25, 'bench history', now(), now() - g * interval '1 second' \
               FROM generate_series($2 + 1, $3) g ON CONFLICT (id) DO NOTHING",
        )
        .bind(BENCH_QUEUE)
        .bind(have)
        .bind(dead_history)
        .execute(&db)
        .await?;
        sqlx::query("VACUUM ANALYZE qbridge.jobs_dead")
            .execute(&db)
            .await?;
    }
    let backlog = samples as i64 * batch;
    let jobs: Vec<NewJob> = (0..backlog)
        .map(|i| NewJob::new(BENCH_QUEUE, serde_json::json!({ "i": i })))
        .collect();
    enqueue::enqueue_many(&db, &jobs, usize::MAX).await?;
    sqlx::query("ANALYZE qbridge.jobs").execute(&db).await?;

    let queues = vec![BENCH_QUEUE.to_string()];
    let mut times = Vec::with_capacity(samples);
    let mut completions = Vec::with_capacity(samples);
    let mut claimed = 0usize;
    for _ in 0..samples {
        let req = ClaimRequest {
            queues: &queues,
            kinds: None,
            limit: batch,
            worker: "bench",
            lease: Duration::from_secs(60),
            tenant: None,
            tenant_after: None,
            lock_retry_delay: Duration::from_secs(1),
            start: None,
        };
        let t = Instant::now();
        let got = claim(&db, &req).await?;
        times.push(t.elapsed().as_secs_f64());
        claimed += got.len();
        let refs: Vec<_> = got.iter().map(|j| j.job_ref()).collect();
        let t = Instant::now();
        fence::complete(&db, &refs, false).await?;
        completions.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    completions.sort_by(|a, b| a.total_cmp(b));
    let ms = |p: f64| harness::percentile(&times, p) * 1000.0;
    let complete_ms = |p: f64| harness::percentile(&completions, p) * 1000.0;
    // The floor under any committed write on this server: a transaction that
    // only takes an xid still waits for its commit record to reach disk.
    let mut commits = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        sqlx::query("SELECT pg_current_xact_id()")
            .execute(&db)
            .await?;
        commits.push(t.elapsed().as_secs_f64());
    }
    commits.sort_by(|a, b| a.total_cmp(b));
    let commit_ms = |p: f64| harness::percentile(&commits, p) * 1000.0;
    let dead_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM qbridge.jobs_dead")
        .fetch_one(&db)
        .await?;
    let done_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM qbridge.jobs_done")
        .fetch_one(&db)
        .await?;
    Ok(BenchReport {
        system: "qbridge".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        mode: "claim".into(),
        n: samples as u64,
        settings: serde_json::json!({
            "batch": batch, "dead_rows": dead_rows, "done_rows": done_rows, "backlog": backlog,
        }),
        numbers: vec![
            ("claim_p50_ms".into(), ms(50.0)),
            ("claim_p99_ms".into(), ms(99.0)),
            ("claim_max_ms".into(), ms(100.0)),
            ("complete_p50_ms".into(), complete_ms(50.0)),
            ("complete_p99_ms".into(), complete_ms(99.0)),
            ("commit_floor_p50_ms".into(), commit_ms(50.0)),
            ("commit_floor_p99_ms".into(), commit_ms(99.0)),
        ],
        ok: claimed as i64 == backlog,
        notes: vec![
            "commit_floor = an empty committed transaction (WAL flush) on the same connection pool"
                .into(),
        ],
    })
}

/// Tops `jobs_done` up to `want` rows of the bench queue, finished within
/// the last day (the partitions completions append to), in chunks of a
/// million so one statement's WAL stays bounded.
async fn fill_done(db: &sqlx::PgPool, want: i64) -> Result<()> {
    let mut have: i64 =
        sqlx::query_scalar("SELECT count(*) FROM qbridge.jobs_done WHERE queue = $1")
            .bind(BENCH_QUEUE)
            .fetch_one(db)
            .await?;
    while have < want {
        let to = want.min(have + 1_000_000);
        sqlx::query(
            "INSERT INTO qbridge.jobs_done (id, queue, attempts, created_at, finished_at) \
             SELECT -g, $1, 1, now() - interval '1 day', now() - (g % 86000) * interval '1 second' \
               FROM generate_series($2 + 1, $3) g",
        )
        .bind(BENCH_QUEUE)
        .bind(have)
        .bind(to)
        .execute(db)
        .await?;
        have = to;
    }
    if want > 0 {
        sqlx::query("VACUUM ANALYZE qbridge.jobs_done")
            .execute(db)
            .await?;
    }
    Ok(())
}
