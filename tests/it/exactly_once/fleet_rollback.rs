//! A fleet route after a rollback or a lowered share: a job stored live in
//! Postgres is pushed again (a producer's retry) and reaches Redis, where
//! the team's own Sidekiq fleet fetches it. The fleet must not run it: the
//! adapter's middleware finds its key in the route's live-key guard, skips
//! it and reports it as skipped. A new job pushed at the same time still
//! runs on the fleet (the guard skips only what Postgres owns).

use std::time::Duration;

use sqlx::PgPool;

use qbridge::demo::handler::{self, Ledger};
use qbridge::model::Phase;
use qbridge::ops::gates;
use qbridge::ops::operate::{self, Request};
use qbridge::redis::connect::connect_redis;

use super::ProxySide;
use crate::servers::ThrowawayRedis;
use crate::sidekiq_versions::Sidekiq;
use crate::support;

const APP: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/fleets/sidekiq_app.rb"
);

/// A Sidekiq job of the sample app's worker, as its client writes it.
fn sidekiq_job(jid: &str, queue: &str, user: u32) -> String {
    serde_json::json!({
        "class": "WelcomeEmail", "args": [user], "retry": true, "queue": queue,
        "jid": jid, "created_at": 1.7e9, "enqueued_at": 1.7e9,
    })
    .to_string()
}

/// A fresh Sidekiq jid (24 hex digits).
fn jid() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..24].to_string()
}

async fn lpush(url: &str, list: &str, item: &str) {
    let mut conn = connect_redis(url).await.unwrap();
    let _: i64 = ::redis::cmd("LPUSH")
        .arg(list)
        .arg(item)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// Runs the sample app's Sidekiq fleet on `redis` until `done` holds (60 s
/// at most), reporting outcomes to the test's database over SQL.
async fn run_fleet<F, Fut>(
    sidekiq: Sidekiq,
    pool: &PgPool,
    redis: &str,
    queue: &str,
    ledger: &str,
    done: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(APP, dir.path().join("sidekiq_app.rb")).unwrap();
    let mut worker = sidekiq.server();
    worker
        .args(["-r", "./sidekiq_app.rb", "-q", queue, "-c", "2"])
        .current_dir(dir.path())
        .env("REDIS_URL", redis)
        .env("SIDEKIQ_QUEUE", queue)
        .env("QBD_LEDGER", ledger)
        .env("QBD_SIDE", "redis")
        .env("QBRIDGE_OUTCOMES", support::db_url(pool))
        .env("QBRIDGE_ROUTE", queue)
        .env("QBRIDGE_QUEUE", queue)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true);
    let mut worker = worker.spawn().expect("the Sidekiq fleet starts");
    support::wait_for("the fleet handled both jobs", Duration::from_secs(60), done).await;
    let _ = tokio::process::Command::new("kill")
        .args(["-TERM", &worker.id().unwrap().to_string()])
        .status()
        .await;
    let _ = tokio::time::timeout(Duration::from_secs(15), worker.wait()).await;
    let _ = worker.kill().await;
}

/// How many times the fleet reported `key` as skipped.
async fn skipped(pool: &PgPool, queue: &str, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM qbridge.skipped_runs WHERE queue = $1 AND key = $2")
        .bind(queue)
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn outcomes_of(pool: &PgPool, queue: &str, key: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT outcome FROM qbridge.outcomes WHERE queue = $1 AND key = $2 AND side = 'redis' ORDER BY id",
    )
    .bind(queue)
    .bind(key)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// `rollback`: how the operator takes the route back (a rollback to
/// `shadow`, or the flipped share lowered to 0); `sidekiq`: the fleet's.
async fn a_retried_push_after_lowering_is_skipped_by_the_fleet(
    pool: PgPool,
    rollback: bool,
    sidekiq: Sidekiq,
) {
    let redis = ThrowawayRedis::start();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let name = format!("fg{}", &id[..12]);
    let list = format!("queue:{name}");
    let toml = format!(
        "[[routes]]\nname = \"{name}\"\nredis_key = \"{list}\"\nqueue = \"{name}\"\n\
         format = \"sidekiq\"\nphase = \"dual_write\"\nredis_side = \"fleet\"\n"
    );
    let since = chrono::Utc::now() - chrono::Duration::minutes(1);
    let side = ProxySide::start_on(&pool, &toml, &redis.url()).await;
    side.force_to(&name, &redis.url(), Phase::PostgresOnly)
        .await;
    let route = side.side_routes().by_name(&name).unwrap().clone();

    // Stored live in Postgres through the proxy: Postgres owns the job.
    let owned = jid();
    lpush(&side.url(), &list, &sidekiq_job(&owned, &name, 1)).await;
    support::wait_for_count(
        &pool,
        "the job stored live",
        &format!("SELECT count(*) FROM qbridge.job_keys WHERE queue = '{name}' AND copy = 'live'"),
        1,
    )
    .await;

    let mut conn = connect_redis(&redis.url()).await.unwrap();
    let req = Request::new("test@ops", Some("the test lowers the route"));
    if rollback {
        let state = operate::rollback(&pool, Some(&mut conn), &route, &req)
            .await
            .unwrap();
        assert_eq!(state.phase, Phase::Shadow);
    } else {
        let state = operate::ramp(&pool, Some(&mut conn), &route, 0, &req)
            .await
            .unwrap();
        assert_eq!(state.percent, 0);
    }
    let routes = side.side_routes();
    support::wait_for("the proxy follows", Duration::from_secs(10), || {
        let (routes, route) = (routes.clone(), route.clone());
        async move {
            if rollback {
                routes.phase(&route) == Phase::Shadow
            } else {
                routes.phases().percent(&route.name) == 0
            }
        }
    })
    .await;

    // The producer's retry of the owned job, and a new job: both reach Redis.
    let fresh = jid();
    lpush(&side.url(), &list, &sidekiq_job(&owned, &name, 1)).await;
    lpush(&side.url(), &list, &sidekiq_job(&fresh, &name, 2)).await;
    let waiting: i64 = ::redis::cmd("LLEN")
        .arg(&list)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(waiting, 2, "both pushes reached Redis");

    let ledger = Ledger::default();
    let ledger_url = handler::serve(ledger.clone()).await.unwrap();
    run_fleet(sidekiq, &pool, &redis.url(), &name, &ledger_url, || {
        let (pool, ledger, name, owned, fresh) = (
            pool.clone(),
            ledger.clone(),
            name.clone(),
            owned.clone(),
            fresh.clone(),
        );
        async move {
            ledger.live(&fresh) == 1
                && (skipped(&pool, &name, &owned).await > 0 || ledger.live(&owned) > 0)
        }
    })
    .await;
    assert_eq!(ledger.live(&owned), 0, "the fleet ran a job Postgres owns");
    assert_eq!(skipped(&pool, &name, &owned).await, 1);
    assert!(outcomes_of(&pool, &name, &owned).await.is_empty());
    assert_eq!(outcomes_of(&pool, &name, &fresh).await, vec!["ok"]);
    // The diff counts the skip and sees no job run on both sides.
    let phase = side.side_routes().phase(&route);
    let (diff, _) = gates::diff_since(&pool, &mut conn, &route, phase, since)
        .await
        .unwrap();
    assert_eq!(diff.skipped_repushes, 1, "{}", diff.verdict);
    assert_eq!(diff.ran_both_sides, 0, "{}", diff.verdict);
    assert!(diff.verdict.contains("skipped"), "{}", diff.verdict);
    side.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn after_a_rollback_a_sidekiq_6_fleet_skips_a_retried_push_of_a_job_postgres_owns(
    pool: PgPool,
) {
    a_retried_push_after_lowering_is_skipped_by_the_fleet(pool, true, Sidekiq::V6).await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn after_lowering_the_share_a_sidekiq_7_fleet_skips_a_retried_push_of_a_job_postgres_owns(
    pool: PgPool,
) {
    a_retried_push_after_lowering_is_skipped_by_the_fleet(pool, false, Sidekiq::V7).await;
}
