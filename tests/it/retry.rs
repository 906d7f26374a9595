//! Retries and dead letters: the backoff schedule lands in run_at, a failing
//! handler is retried until max_attempts and then dead-lettered, and permanent
//! failures (configured exit code, HTTP 4xx) go straight to the dead letters.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use qbridge::config::{Dur, HandlerConfig};
use qbridge::queue::backoff::Backoff;
use qbridge::queue::completer::{self, CompleterConfig, Finished, Outcome};
use qbridge::queue::{fence, NewJob};
use serde_json::json;
use sqlx::PgPool;

use crate::support::{self, PoolBuilder, RunningPool};

/// Seconds from now until the job's run_at, by the database clock.
async fn run_at_in(pool: &PgPool, id: i64) -> f64 {
    sqlx::query_scalar(
        "SELECT extract(epoch FROM run_at - now())::float8 FROM qbridge.jobs WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// After each failed attempt the job's run_at is now + a delay in
/// [ceiling/2, ceiling], and the ceiling doubles per attempt up to the cap.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn retry_delay_follows_the_backoff_schedule(pool: PgPool) {
    let backoff = Backoff {
        base: Duration::from_secs(20),
        cap: Duration::from_secs(60),
    };
    let id = support::enqueue_ids(&pool, &[NewJob::new("q", json!({}))]).await[0];
    // Slack for the time between the retry statement and the query below.
    let slack = 2.0;
    for (attempt, ceiling) in [(1, 20.0), (2, 40.0), (3, 60.0), (4, 60.0)] {
        let jobs = support::claim(&pool, "q", 1, Duration::from_secs(60)).await;
        assert_eq!(jobs.len(), 1, "attempt {attempt}: job not claimable");
        assert_eq!(jobs[0].attempts, attempt);
        let delay = backoff.delay(jobs[0].attempts);
        let r = fence::retry(
            &pool,
            &[(jobs[0].job_ref(), delay, format!("fail {attempt}"))],
        )
        .await
        .unwrap();
        assert_eq!(r.applied, vec![id]);
        let wait = run_at_in(&pool, id).await;
        assert!(
            wait <= ceiling && wait >= ceiling / 2.0 - slack,
            "attempt {attempt}: run_at is {wait}s away, want [{}, {ceiling}]",
            ceiling / 2.0
        );
        let (state, err): (String, Option<String>) =
            sqlx::query_as("SELECT state, last_error FROM qbridge.jobs WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(state, "ready");
        assert_eq!(err.as_deref(), Some(format!("fail {attempt}").as_str()));
        // Not claimable while backing off.
        assert!(support::claim(&pool, "q", 1, Duration::from_secs(60))
            .await
            .is_empty());
        sqlx::query("UPDATE qbridge.jobs SET run_at = now() WHERE id = $1")
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
    }
}

/// A worker pool's failing handler: the retry lands in run_at per the pool's
/// backoff (ceiling of attempt 1 = base).
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn pool_schedules_retry_with_its_backoff(pool: PgPool) {
    let id = support::enqueue_ids(&pool, &[NewJob::new("q", json!({}))]).await[0];
    let cfg = PoolBuilder::new("q")
        .backoff(Duration::from_secs(30), Duration::from_secs(3600))
        .handler(support::sh("exit 3", &[]))
        .build();
    let running = RunningPool::start(&pool, cfg);
    support::wait_for_count(
        &pool,
        "the failed attempt to be recorded",
        "SELECT count(*) FROM qbridge.jobs WHERE state = 'ready' AND attempts = 1",
        1,
    )
    .await;
    let wait = run_at_in(&pool, id).await;
    running.stop().await;
    assert!(
        (13.0..=30.0).contains(&wait),
        "run_at is {wait}s away, want [15, 30]"
    );
    let err: String = sqlx::query_scalar("SELECT last_error FROM qbridge.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(err.contains("exit code 3"), "{err}");
}

/// A handler that always fails runs max_attempts times, then the job is in
/// jobs_dead with its attempts and error.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn failing_job_is_dead_lettered_after_max_attempts(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs");
    let log = log.to_str().unwrap();
    let ids = support::enqueue_ids(
        &pool,
        &[
            NewJob::new("q", json!({"n": 1})).with_max_attempts(3),
            NewJob::new("q", json!({"n": 2})).with_max_attempts(1),
        ],
    )
    .await;
    let cfg = PoolBuilder::new("q")
        .handler(support::sh(
            "echo \"$QBRIDGE_JOB_ID $QBRIDGE_ATTEMPT\" >> \"$1\"; echo boom >&2; exit 1",
            &[log],
        ))
        .build();
    let running = RunningPool::start(&pool, cfg);
    support::wait_for(
        "both jobs to be dead-lettered",
        Duration::from_secs(20),
        || async { support::dead(&pool).await == 2 },
    )
    .await;
    let (_, report) = running.stop().await;
    assert_eq!(support::jobs(&pool).await, 0);
    assert_eq!(report.dead, 2);
    assert_eq!(report.retried, 2);

    let rows: Vec<(i64, i32, i32, String)> = sqlx::query_as(
        "SELECT id, attempts, max_attempts, last_error FROM qbridge.jobs_dead ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!((rows[0].0, rows[0].1, rows[0].2), (ids[0], 3, 3));
    assert_eq!((rows[1].0, rows[1].1, rows[1].2), (ids[1], 1, 1));
    for r in &rows {
        assert!(r.3.contains("attempts exhausted"), "{}", r.3);
        assert!(r.3.contains("exit code 1: boom"), "{}", r.3);
    }
    let runs = std::fs::read_to_string(log).unwrap();
    let mut runs: Vec<&str> = runs.lines().collect();
    runs.sort();
    let want = [
        format!("{} 1", ids[0]),
        format!("{} 2", ids[0]),
        format!("{} 3", ids[0]),
        format!("{} 1", ids[1]),
    ];
    let mut want: Vec<&str> = want.iter().map(|s| s.as_str()).collect();
    want.sort();
    assert_eq!(runs, want);
}

/// The completer writes completes, retries and dead letters of one batch, and
/// discards a stale attempt's outcome that shares the batch with the current
/// attempt of the same job.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn completer_writes_every_outcome(pool: PgPool) {
    // Job X: claimed with a tiny lease, reaped and claimed again.
    let x = support::enqueue_ids(&pool, &[NewJob::new("x", json!({}))]).await[0];
    let stale = support::claim(&pool, "x", 1, Duration::from_millis(1)).await[0].job_ref();
    support::wait_for_count(
        &pool,
        "the lease to expire",
        "SELECT count(*) FROM qbridge.jobs WHERE lease_until < now()",
        1,
    )
    .await;
    assert_eq!(
        qbridge::queue::reaper::run_once(&pool, 10)
            .await
            .unwrap()
            .requeued,
        1
    );
    let current = support::claim(&pool, "x", 1, Duration::from_secs(60)).await[0].job_ref();
    assert_eq!(current.id, x);

    support::enqueue_ids(&pool, &support::plain_jobs("q", 3)).await;
    let jobs = support::claim(&pool, "q", 3, Duration::from_secs(60)).await;
    let (tx, done) = completer::spawn(
        pool.clone(),
        CompleterConfig {
            tick: Duration::from_millis(50),
            ..Default::default()
        },
    );
    let mut items: Vec<(qbridge::queue::JobRef, Outcome)> = jobs
        .iter()
        .map(|j| j.job_ref())
        .zip([
            Outcome::Complete,
            Outcome::Retry {
                delay: Duration::from_secs(100),
                error: "later".into(),
            },
            Outcome::Dead {
                error: "never".into(),
            },
        ])
        .collect();
    items.push((stale, Outcome::Complete));
    items.push((current, Outcome::Complete));
    for (job, outcome) in items {
        tx.send(Finished {
            job,
            queue: Arc::from("q"),
            outcome,
        })
        .await
        .unwrap();
    }
    drop(tx);
    let report = done.await.unwrap();
    assert_eq!(
        (
            report.completed,
            report.retried,
            report.dead,
            report.lost_lease
        ),
        (2, 1, 1, 1),
        "{report:?}"
    );
    let left: Vec<(i64, String, String)> =
        sqlx::query_as("SELECT id, state, last_error FROM qbridge.jobs")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(left, vec![(jobs[1].id, "ready".into(), "later".into())]);
    let dead: Vec<(i64, String)> = sqlx::query_as("SELECT id, last_error FROM qbridge.jobs_dead")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(dead, vec![(jobs[2].id, "never".into())]);
}

/// Within one fenced call, the stale attempt of a job is reported lost even
/// when the current attempt of the same job is applied.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn stale_and_current_attempt_in_one_call(pool: PgPool) {
    let id = support::enqueue_ids(&pool, &[NewJob::new("x", json!({}))]).await[0];
    let stale = support::claim(&pool, "x", 1, Duration::from_millis(1)).await[0].job_ref();
    support::wait_for_count(
        &pool,
        "the lease to expire",
        "SELECT count(*) FROM qbridge.jobs WHERE lease_until < now()",
        1,
    )
    .await;
    qbridge::queue::reaper::run_once(&pool, 10).await.unwrap();
    let current = support::claim(&pool, "x", 1, Duration::from_secs(60)).await[0].job_ref();
    let r = fence::heartbeat(&pool, &[current, stale], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!((r.applied, r.lost), (vec![id], vec![stale]));
    let r = fence::complete(&pool, &[stale, current], false)
        .await
        .unwrap();
    assert_eq!((r.applied, r.lost), (vec![id], vec![stale]));
}

/// A command exiting with a configured permanent code is dead-lettered on its
/// first attempt, whatever max_attempts says.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn permanent_exit_code_goes_straight_to_dead_letter(pool: PgPool) {
    let id = support::enqueue_ids(&pool, &[NewJob::new("q", json!({}))]).await[0];
    let cfg = PoolBuilder::new("q")
        .handler(HandlerConfig::Command {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), "echo 'bad record' >&2; exit 75".into()],
            timeout: Dur(Duration::from_secs(30)),
            permanent_exit_codes: vec![75],
        })
        .build();
    let running = RunningPool::start(&pool, cfg);
    support::wait_for(
        "the job to be dead-lettered",
        Duration::from_secs(10),
        || async { support::dead(&pool).await == 1 },
    )
    .await;
    running.stop().await;
    let (dead_id, attempts, err): (i64, i32, String) =
        sqlx::query_as("SELECT id, attempts, last_error FROM qbridge.jobs_dead")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((dead_id, attempts), (id, 1));
    assert!(
        err.contains("exit code 75") && err.contains("bad record"),
        "{err}"
    );
    assert_eq!(support::jobs(&pool).await, 0);
}

/// A command that runs past its timeout is killed and retried.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn command_timeout_is_a_retry(pool: PgPool) {
    let id = support::enqueue_ids(&pool, &[NewJob::new("q", json!({}))]).await[0];
    let cfg = PoolBuilder::new("q")
        .backoff(Duration::from_secs(60), Duration::from_secs(60))
        .handler(HandlerConfig::Command {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), "sleep 30".into()],
            timeout: Dur(Duration::from_millis(200)),
            permanent_exit_codes: vec![],
        })
        .build();
    let running = RunningPool::start(&pool, cfg);
    support::wait_for_count(
        &pool,
        "the timed-out attempt to be retried",
        "SELECT count(*) FROM qbridge.jobs WHERE state = 'ready' AND attempts = 1",
        1,
    )
    .await;
    running.stop().await;
    let err: String = sqlx::query_scalar("SELECT last_error FROM qbridge.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(err.contains("timed out"), "{err}");
}

/// Starts an HTTP server answering POST /ok with 204, /bad with 422 and /flaky
/// with 503, recording the headers of each request.
async fn http_server() -> (String, Arc<Mutex<Vec<(String, String, String)>>>) {
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;
    let seen: Arc<Mutex<Vec<(String, String, String)>>> = Arc::default();
    let record = |status: StatusCode, seen: Arc<Mutex<Vec<(String, String, String)>>>| {
        move |headers: HeaderMap, body: String| async move {
            let h = |k: &str| {
                headers
                    .get(k)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string()
            };
            seen.lock()
                .unwrap()
                .push((h("qbridge-job-id"), h("qbridge-attempt"), body));
            status
        }
    };
    let app = axum::Router::new()
        .route("/ok", post(record(StatusCode::NO_CONTENT, seen.clone())))
        .route(
            "/bad",
            post(record(StatusCode::UNPROCESSABLE_ENTITY, seen.clone())),
        )
        .route(
            "/flaky",
            post(record(StatusCode::SERVICE_UNAVAILABLE, seen.clone())),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen)
}

fn http(url: String) -> HandlerConfig {
    HandlerConfig::Http {
        url,
        timeout: Dur(Duration::from_secs(10)),
        headers: Default::default(),
    }
}

/// HTTP handler: 2xx completes, 4xx dead-letters at once, 5xx retries.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn http_status_decides_the_outcome(pool: PgPool) {
    let (base, seen) = http_server().await;
    let ok = support::enqueue_ids(&pool, &[NewJob::new("ok", json!({"hello": "world"}))]).await[0];
    let bad = support::enqueue_ids(&pool, &[NewJob::new("bad", json!({}))]).await[0];
    let flaky = support::enqueue_ids(
        &pool,
        &[NewJob::new("flaky", json!({})).with_max_attempts(2)],
    )
    .await[0];
    let pools: Vec<RunningPool> = ["ok", "bad", "flaky"]
        .iter()
        .map(|q| {
            RunningPool::start(
                &pool,
                PoolBuilder::new(q)
                    .handler(http(format!("{base}/{q}")))
                    .build(),
            )
        })
        .collect();
    support::wait_for("every job to settle", Duration::from_secs(20), || async {
        support::jobs(&pool).await == 0
    })
    .await;
    for p in pools {
        p.stop().await;
    }
    let dead: Vec<(i64, i32, String)> =
        sqlx::query_as("SELECT id, attempts, last_error FROM qbridge.jobs_dead ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert_eq!((dead[0].0, dead[0].1), (bad, 1), "4xx must not be retried");
    assert!(dead[0].2.contains("422"), "{}", dead[0].2);
    assert_eq!((dead[1].0, dead[1].1), (flaky, 2), "5xx must be retried");
    assert!(dead[1].2.contains("503"), "{}", dead[1].2);

    let seen = seen.lock().unwrap().clone();
    let ok_calls: Vec<_> = seen.iter().filter(|c| c.0 == ok.to_string()).collect();
    assert_eq!(ok_calls.len(), 1);
    assert_eq!(ok_calls[0].1, "1");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&ok_calls[0].2).unwrap(),
        json!({"hello": "world"})
    );
}
