//! Wake-ups: with a 60 s poll interval a NOTIFY gets a job picked up at once;
//! when the listener's backend is killed the listener comes back, and the poll
//! backstop picks up jobs no NOTIFY announced. Wake-ups are coalesced per
//! queue at commit (migration 0020), and a burst whose hints went to
//! neighbours still runs at once.

use std::time::Duration;

use qbridge::app::Runtime;
use qbridge::config::{Config, Overrides};
use qbridge::queue::NewJob;
use qbridge::queue::NOTIFY_CHANNEL;
use serde_json::json;
use sqlx::postgres::PgListener;
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
    enqueue_one(&pool, NewJob::new("wake", json!({}))).await;
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

    enqueue_one(&pool, NewJob::new("wake", json!({}))).await;
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
        enqueue_one(&pool, NewJob::new("claimers", json!({ "i": i }))).await;
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
    enqueue_one(&pool, NewJob::new("backstop", json!({}))).await;
    wait_drained(&pool, "a job enqueued while the listener was down", QUICK).await;

    // A job that becomes due later never sends a NOTIFY (the trigger only
    // announces jobs due now): only the poll can find it.
    let soon = chrono::Utc::now() + chrono::Duration::milliseconds(500);
    enqueue_one(&pool, NewJob::new("backstop", json!({})).with_run_at(soon)).await;
    wait_drained(&pool, "a delayed job found by polling", QUICK).await;

    stop.cancel();
    handle.await.unwrap();
}

/// A connection listening for the wake-up hints of the test's database.
async fn hint_listener(pool: &PgPool) -> PgListener {
    let mut listener = PgListener::connect_with(pool).await.unwrap();
    listener.listen(NOTIFY_CHANNEL).await.unwrap();
    listener
}

/// Enqueues one job on its own (one transaction, committed).
async fn enqueue_one(pool: &PgPool, job: NewJob) {
    qbridge::queue::enqueue_many(pool, &[job], LIMIT)
        .await
        .unwrap();
}

/// The next wake-up hint within half a second, if any.
async fn next_hint(listener: &mut PgListener) -> Option<String> {
    let n = tokio::time::timeout(Duration::from_millis(500), listener.recv()).await;
    n.ok()
        .map(|n| n.expect("LISTEN connection").payload().to_string())
}

/// A transaction that commits while another of its queue is committing
/// leaves the wake-up to that one; other queues, and a commit alone, are
/// hinted as before, once per transaction and queue.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_commit_beside_one_of_its_queue_leaves_the_wake_up_to_it(pool: PgPool) {
    let mut listener = hint_listener(&pool).await;

    // The first transaction takes its commit-time decision now (IMMEDIATE
    // fires the deferred trigger) and holds its queue's hint until it commits.
    let mut first = pool.begin().await.unwrap();
    qbridge::queue::enqueue(
        &mut first,
        &[NewJob::new("burst", json!({ "n": 1 }))],
        LIMIT,
    )
    .await
    .unwrap();
    sqlx::query("SET CONSTRAINTS qbridge.jobs_hint_at_commit IMMEDIATE")
        .execute(&mut *first)
        .await
        .unwrap();

    // A neighbour of the same queue commits meanwhile, then one of another queue.
    enqueue_one(&pool, NewJob::new("burst", json!({ "n": 2 }))).await;
    enqueue_one(&pool, NewJob::new("other", json!({}))).await;
    assert_eq!(next_hint(&mut listener).await.as_deref(), Some("other"));
    assert_eq!(
        next_hint(&mut listener).await,
        None,
        "the neighbour woke workers itself"
    );
    first.commit().await.unwrap();
    assert_eq!(next_hint(&mut listener).await.as_deref(), Some("burst"));
    assert_eq!(next_hint(&mut listener).await, None);

    // Only a queue's first row of a run decides (one deferred event per
    // transaction and queue, not one per row).
    let firsts: Vec<bool> = sqlx::query_scalar(
        "SELECT qbridge.first_row_of_queue(q) FROM unnest(ARRAY['a', 'a', 'b', 'b', 'a']) \
           WITH ORDINALITY AS t(q, i) ORDER BY i",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(firsts, [true, false, true, false, true]);

    // Alone: a 100-job commit wakes once; a job due later wakes nobody.
    let hundred: Vec<NewJob> = (0..100)
        .map(|i| NewJob::new("burst", json!({ "i": i })))
        .collect();
    qbridge::queue::enqueue_many(&pool, &hundred, LIMIT)
        .await
        .unwrap();
    assert_eq!(next_hint(&mut listener).await.as_deref(), Some("burst"));
    assert_eq!(next_hint(&mut listener).await, None);
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    enqueue_one(&pool, NewJob::new("burst", json!({})).with_run_at(later)).await;
    assert_eq!(
        next_hint(&mut listener).await,
        None,
        "a job due later woke workers"
    );
}

/// A job whose commit left the hint to a neighbour and became visible just
/// after the pool's hinted claim looked: the pool claims again shortly
/// (`worker::follow_up`), not at the 60 s poll.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_job_committed_just_after_its_neighbours_hinted_claim_is_followed_up(pool: PgPool) {
    let (stop, handle) = start_runtime(&pool, "follow", "60s").await;
    listener_pid(&pool, None).await;
    // The follow-ups end about 250 ms after the claim: a neighbour whose
    // commit returned later than this (a stalled CI machine) tests nothing,
    // and its job waits for the next attempt's hint.
    let in_reach = Duration::from_millis(200);
    for attempt in 1..=3 {
        let gap = neighbour_commits_after_the_hinted_claim(&pool).await;
        if gap < in_reach {
            wait_drained(
                &pool,
                "the neighbour's job to be claimed before the poll",
                QUICK,
            )
            .await;
            stop.cancel();
            handle.await.unwrap();
            return;
        }
        eprintln!("attempt {attempt}: the neighbour committed {gap:?} after the claim; again");
    }
    panic!("in three attempts the neighbour never committed within {in_reach:?} of the claim");
}

/// One transaction takes the queue's hint, a neighbour leaves it to that
/// one; the first commits (its hint wakes the pool, whose claim sees its job
/// only), then the neighbour. Returns how long after the first job was seen
/// claimed the neighbour's commit returned.
async fn neighbour_commits_after_the_hinted_claim(pool: &PgPool) -> Duration {
    let job = |n: i32| [NewJob::new("follow", json!({ "n": n }))];
    // IMMEDIATE fires the deferred trigger now: the first decides, then the neighbour.
    let immediate = "SET CONSTRAINTS qbridge.jobs_hint_at_commit IMMEDIATE";
    let mut first = pool.begin().await.unwrap();
    let ids = qbridge::queue::enqueue(&mut first, &job(1), LIMIT)
        .await
        .unwrap();
    let qbridge::queue::EnqueueOutcome::Inserted(first_id) = ids[0] else {
        panic!("not inserted: {ids:?}")
    };
    sqlx::query(immediate).execute(&mut *first).await.unwrap();
    let mut neighbour = pool.begin().await.unwrap();
    qbridge::queue::enqueue(&mut neighbour, &job(2), LIMIT)
        .await
        .unwrap();
    sqlx::query(immediate)
        .execute(&mut *neighbour)
        .await
        .unwrap();

    first.commit().await.unwrap();
    let started = std::time::Instant::now();
    loop {
        let ready: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM qbridge.jobs WHERE id = $1 AND state = 'ready'",
        )
        .bind(first_id)
        .fetch_one(pool)
        .await
        .unwrap();
        if ready == 0 {
            break;
        }
        assert!(started.elapsed() < QUICK, "the hinted job was not claimed");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let claimed = std::time::Instant::now();
    // Announced by nobody: only a follow-up claim can find it before the poll.
    neighbour.commit().await.unwrap();
    claimed.elapsed()
}

/// Eight connections commit one job at a time into a queue whose pool polls
/// every 60 s: fewer hints than commits are sent, and every job still runs
/// at once, its hint sent or left to a neighbour (the pool then claims
/// again shortly after an empty claim, `worker::follow_up`).
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_burst_of_commits_sends_fewer_hints_and_every_job_runs_at_once(pool: PgPool) {
    const PRODUCERS: usize = 8;
    const EACH: usize = 50;
    let (stop, handle) = start_runtime(&pool, "burst", "60s").await;
    listener_pid(&pool, None).await;
    let mut listener = hint_listener(&pool).await;

    let producers = support::extra_pool(&pool, PRODUCERS as u32).await;
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..PRODUCERS {
        let producers = producers.clone();
        tasks.spawn(async move {
            for i in 0..EACH {
                let job = NewJob::new("burst", json!({ "p": p, "i": i }));
                enqueue_one(&producers, job).await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    wait_drained(&pool, "every job of the burst to run", QUICK).await;
    let mut hints = 0;
    while next_hint(&mut listener).await.is_some() {
        hints += 1;
    }
    assert!(
        hints < PRODUCERS * EACH,
        "{hints} hints for {} commits: none was coalesced",
        PRODUCERS * EACH
    );
    producers.close().await;
    stop.cancel();
    handle.await.unwrap();
}

/// The hint trigger's WHEN runs for every row an enqueue inserts, so what
/// it calls per row is paid per job: a 1,000-job enqueue into one queue
/// calls the PL/pgSQL function that remembers the queue once (for its first
/// row), not 1,000 times (migration 0021; about 2 µs a row before), and
/// still hints once.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_hint_trigger_calls_plpgsql_once_per_queue_not_per_row(pool: PgPool) {
    let mut listener = hint_listener(&pool).await;
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET track_functions = 'pl'")
        .execute(&mut *conn)
        .await
        .unwrap();
    let before = first_row_calls(&mut conn).await;
    let thousand: Vec<NewJob> = (0..1000)
        .map(|i| NewJob::new("rows", json!({ "i": i })))
        .collect();
    qbridge::queue::enqueue(&mut conn, &thousand, LIMIT)
        .await
        .unwrap();
    let after = first_row_calls(&mut conn).await;
    assert_eq!(
        after - before,
        1,
        "PL/pgSQL calls for 1,000 rows of one queue"
    );
    assert_eq!(next_hint(&mut listener).await.as_deref(), Some("rows"));
    assert_eq!(next_hint(&mut listener).await, None);
}

/// Calls of `qbridge.first_row_of_queue` counted so far (`track_functions`
/// must be on for the backends that call it): this backend's counters are
/// flushed to the shared statistics first, then read in a new transaction.
async fn first_row_calls(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_user_functions \
          WHERE schemaname = 'qbridge' AND funcname = 'first_row_of_queue'",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}
