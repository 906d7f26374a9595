//! Wake-ups: with a 60 s poll interval a NOTIFY gets a job picked up at once;
//! when the listener's backend is killed the listener comes back, and the poll
//! backstop picks up jobs no NOTIFY announced.

use std::time::Duration;

use qbridge::app::Runtime;
use qbridge::config::{Config, Overrides};
use qbridge::queue::NewJob;
use serde_json::json;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::support::{self, LIMIT};

/// Generous bound for "at once": far below the 60 s poll interval.
const QUICK: Duration = Duration::from_secs(5);

/// Starts a runtime with one noop pool on `queue` polling every `poll`.
async fn start_runtime(
    pool: &PgPool,
    queue: &str,
    poll: &str,
) -> (CancellationToken, JoinHandle<()>) {
    start_pool(pool, queue, poll, "concurrency = 2").await
}

/// [`start_runtime`] with the pool's size settings given as TOML.
async fn start_pool(
    pool: &PgPool,
    queue: &str,
    poll: &str,
    size: &str,
) -> (CancellationToken, JoinHandle<()>) {
    let toml = format!(
        r#"
        max_connections = 4
        [[pools]]
        name = "p"
        queues = ["{queue}"]
        {size}
        poll_interval = "{poll}"
        handler = {{ type = "noop" }}
        "#
    );
    let config = Config::from_toml(
        &toml,
        &Overrides {
            database_url: Some(support::db_url(pool)),
            ..Overrides::default()
        },
    )
    .expect("config");
    let mut rt = Runtime::build(config).await.expect("runtime builds");
    rt.serve_http = false;
    rt.gauge_interval = Duration::from_secs(3600);
    let stop = CancellationToken::new();
    let token = stop.clone();
    let handle = tokio::spawn(async move {
        rt.run_until_stopped(token).await.expect("runtime run");
    });
    (stop, handle)
}

/// The pid of the LISTEN backend in this test's database, once there is one
/// (other than `not`).
async fn listener_pid(pool: &PgPool, not: Option<i32>) -> i32 {
    let db = support::db_name(pool);
    let started = std::time::Instant::now();
    loop {
        let found: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity \
              WHERE datname = $1 AND query ILIKE 'LISTEN%' AND pid <> coalesce($2, 0) LIMIT 1",
        )
        .bind(&db)
        .bind(not)
        .fetch_optional(pool)
        .await
        .unwrap();
        if let Some(pid) = found {
            return pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no LISTEN backend appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_drained(pool: &PgPool, what: &str, within: Duration) -> Duration {
    support::wait_for(what, within, || async { support::jobs(pool).await == 0 }).await
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn notify_wakes_an_idle_pool_and_survives_a_killed_listener(pool: PgPool) {
    let (stop, handle) = start_runtime(&pool, "wake", "60s").await;
    let first = listener_pid(&pool, None).await;

    // Idle pool, 60 s poll: only the NOTIFY can get this job picked up quickly.
    qbridge::queue::enqueue_many(&pool, &[NewJob::new("wake", json!({}))], LIMIT)
        .await
        .unwrap();
    wait_drained(&pool, "the notified job to run", QUICK).await;

    // Kill the listener's backend: it must reconnect and LISTEN again.
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(killed);
    let second = listener_pid(&pool, Some(first)).await;
    assert_ne!(first, second);

    qbridge::queue::enqueue_many(&pool, &[NewJob::new("wake", json!({}))], LIMIT)
        .await
        .unwrap();
    wait_drained(&pool, "a job notified after the listener came back", QUICK).await;

    stop.cancel();
    handle.await.unwrap();
}

/// A pool with room for four batches keeps four claims in flight, and its
/// claimers sleep when the queue is empty: each NOTIFY wakes one of them,
/// so jobs enqueued one at a time, again and again, are each picked up long
/// before the 60 s poll.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn every_notify_wakes_a_pool_with_several_claims_in_flight(pool: PgPool) {
    let (stop, handle) =
        start_pool(&pool, "claimers", "60s", "concurrency = 8\nbatch_size = 2").await;
    listener_pid(&pool, None).await;
    for i in 0..6 {
        qbridge::queue::enqueue_many(&pool, &[NewJob::new("claimers", json!({ "i": i }))], LIMIT)
            .await
            .unwrap();
        wait_drained(&pool, "a notified job to run", QUICK).await;
    }
    // A burst: the claimer that takes a full batch passes the wake-up on.
    let burst: Vec<NewJob> = (0..40)
        .map(|i| NewJob::new("claimers", json!({ "b": i })))
        .collect();
    qbridge::queue::enqueue_many(&pool, &burst, LIMIT)
        .await
        .unwrap();
    wait_drained(&pool, "a notified burst to run", QUICK).await;
    stop.cancel();
    handle.await.unwrap();
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn poll_backstop_picks_up_jobs_without_notify(pool: PgPool) {
    let (stop, handle) = start_runtime(&pool, "backstop", "300ms").await;
    let pid = listener_pid(&pool, None).await;
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(killed);

    // Right after the kill: whatever the listener is doing, the poll finds it.
    qbridge::queue::enqueue_many(&pool, &[NewJob::new("backstop", json!({}))], LIMIT)
        .await
        .unwrap();
    wait_drained(&pool, "a job enqueued while the listener was down", QUICK).await;

    // A job that becomes due later never sends a NOTIFY (the trigger only
    // announces jobs due now): only the poll can find it.
    let soon = chrono::Utc::now() + chrono::Duration::milliseconds(500);
    qbridge::queue::enqueue_many(
        &pool,
        &[NewJob::new("backstop", json!({})).with_run_at(soon)],
        LIMIT,
    )
    .await
    .unwrap();
    wait_drained(&pool, "a delayed job found by polling", QUICK).await;

    stop.cancel();
    handle.await.unwrap();
}
