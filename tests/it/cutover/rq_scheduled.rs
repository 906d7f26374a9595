//! RQ keeps a job scheduled with `enqueue_in`/`enqueue_at` in the sorted set
//! `rq:scheduled:<queue>` (member: the job id, score: when) and its job in
//! the hash `rq:job:<id>`. Real RQ schedules through the proxy in
//! `dual_write`, and each job is a mirror copy the moment Redis takes it,
//! due at its score and carrying its job hash, as Sidekiq's `perform_in`
//! jobs are. RQ up to 2.x sends the registry's `ZADD` on its own, before
//! the MULTI that writes the hash (3.0 sends it inside), so the mirror
//! reads the hash when it appears. After the flip, RQ's scheduler moving a
//! due job to the list is the job running live in Postgres, once: Redis
//! handed it out of the registry (`ZREM`), and its push is answered by the
//! proxy.

use std::time::Duration;

use sqlx::PgPool;

use crate::exactly_once::ProxySide;
use crate::servers::ThrowawayRedis;
use crate::support;

/// (route name, RQ queue name, the route's TOML in `phase`).
fn route(phase: &str) -> (String, String, String) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (route, queue) = (format!("rqs{}", &id[..12]), format!("qbt_rqs_{id}"));
    let toml = format!(
        "[[routes]]\nname = \"{route}\"\nredis_key = \"rq:queue:{queue}\"\nqueue = \"{route}\"\n\
         format = \"rq\"\nphase = \"{phase}\"\n"
    );
    (route, queue, toml)
}

async fn scheduled_jobs_are_mirrored_when_scheduled(pool: PgPool, python: std::path::PathBuf) {
    let redis = ThrowawayRedis::start();
    let (route, queue, toml) = route("dual_write");
    let side = ProxySide::start_on(&pool, &toml, &redis.url()).await;
    let before = chrono::Utc::now();
    let ids = rq_app(&python, &side.url(), &queue, &["schedule", "4", "3600"]).await;
    assert_eq!(ids.len(), 4);
    support::wait_for_count(
        &pool,
        "every scheduled RQ job mirrored while it is still scheduled",
        &format!("SELECT count(*) FROM qbridge.jobs WHERE queue = '{route}' AND copy = 'mirror'"),
        4,
    )
    .await;
    let due = before + chrono::Duration::seconds(3600);
    for id in &ids {
        let (run_at, job_id, has_hash): (chrono::DateTime<chrono::Utc>, Option<String>, bool) =
            sqlx::query_as(
                "SELECT run_at, payload ->> 'rq_job_id', coalesce(payload -> 'rq_job' ? 'data', false) \
                   FROM qbridge.jobs WHERE queue = $1 AND key = $2",
            )
            .bind(&route)
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(
            (run_at - due).num_seconds().abs() <= 5,
            "job {id} due at its score ({run_at}, expected about {due})"
        );
        assert_eq!(job_id.as_deref(), Some(id.as_str()));
        assert!(has_hash, "job {id}'s copy carries its job hash");
    }
    side.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn rq_3_scheduled_jobs_are_mirrored_when_scheduled(pool: PgPool) {
    scheduled_jobs_are_mirrored_when_scheduled(pool, support::python()).await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn rq_2_scheduled_jobs_are_mirrored_although_the_zadd_comes_before_the_hash(pool: PgPool) {
    scheduled_jobs_are_mirrored_when_scheduled(pool, support::matrix_python("rq-2.12")).await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn rq_schedulers_move_after_the_flip_runs_the_job_live_once(pool: PgPool) {
    let redis = ThrowawayRedis::start();
    let (route, queue, toml) = route("dual_write");
    let side = ProxySide::start_on(&pool, &toml, &redis.url()).await;
    let python = support::python();
    let ids = rq_app(&python, &side.url(), &queue, &["schedule", "3", "1"]).await;
    support::wait_for_count(
        &pool,
        "every scheduled RQ job mirrored",
        &format!("SELECT count(*) FROM qbridge.jobs WHERE queue = '{route}' AND copy = 'mirror'"),
        3,
    )
    .await;
    side.force_to(&route, &redis.url(), qbridge::model::Phase::PostgresOnly)
        .await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    rq_app(&python, &side.url(), &queue, &["scheduler"]).await;
    support::wait_for_count(
        &pool,
        "every moved job a live copy",
        &format!("SELECT count(*) FROM qbridge.jobs WHERE queue = '{route}' AND copy = 'live'"),
        3,
    )
    .await;
    for id in &ids {
        let live: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM qbridge.jobs WHERE queue = $1 AND key = $2 AND copy = 'live'",
        )
        .bind(&route)
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(live, 1, "{id} has one live job");
    }
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM qbridge.held_repushes WHERE queue = $1")
            .bind(&route)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(held, 0, "nothing held: Redis handed each job out");
    let mut conn = qbridge::redis::connect::connect_redis(&redis.url())
        .await
        .unwrap();
    let waiting: i64 = ::redis::cmd("LLEN")
        .arg(format!("rq:queue:{queue}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(waiting, 0, "the moves did not reach Redis's list");
    assert_eq!(ids.len(), 3);
    side.stop().await;
}

/// Runs `rq_app.py args…` with `python` against `broker`; its output lines.
async fn rq_app(python: &std::path::Path, broker: &str, queue: &str, args: &[&str]) -> Vec<String> {
    let args: Vec<&str> = ["rq_app.py"]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    support::python_script_ok(python, &args, broker, queue).await
}
