//! RQ 2.8+ enqueues a job with `unique=True` from a Lua script (check the
//! job hash does not exist, write it, push the id or add it to the
//! scheduled registry, all inside Redis): the proxy sees an `EVALSHA` and
//! `:1`, never the push. The proxy knows RQ's scripts by their SHA-1, so
//! real RQ's unique jobs through the proxy in `dual_write` are mirrored
//! once each (the refused duplicate is not), ready ones as jobs, scheduled
//! ones due at their time; and a decommissioned route refuses them with an
//! error rather than push into a list nobody reads.

use std::time::Duration;

use sqlx::PgPool;

use crate::exactly_once::ProxySide;
use crate::servers::ThrowawayRedis;
use crate::support;

fn route(phase: &str) -> (String, String, String) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (route, queue) = (format!("rqu{}", &id[..12]), format!("qbt_rqu_{id}"));
    let toml = format!(
        "[[routes]]\nname = \"{route}\"\nredis_key = \"rq:queue:{queue}\"\nqueue = \"{route}\"\n\
         format = \"rq\"\nphase = \"{phase}\"\n"
    );
    (route, queue, toml)
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn rq_unique_jobs_pushed_from_its_script_are_mirrored_once(pool: PgPool) {
    let redis = ThrowawayRedis::start();
    let (route, queue, toml) = route("dual_write");
    let side = ProxySide::start_on(&pool, &toml, &redis.url()).await;
    let (ok, now, err) = rq_app(&side.url(), &queue, &["unique", "3"]).await;
    assert!(ok, "{err}");
    let (ok, later, err) = rq_app(&side.url(), &queue, &["unique", "2", "3600"]).await;
    assert!(ok, "{err}");
    assert_eq!((now.len(), later.len()), (3, 2));
    support::wait_for_count(
        &pool,
        "each unique job mirrored once",
        &format!(
            "SELECT count(*) FROM qbridge.job_keys WHERE queue = '{route}' AND copy = 'mirror'"
        ),
        5,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rows: Vec<(String, chrono::DateTime<chrono::Utc>, bool)> = sqlx::query_as(
        "SELECT key, run_at, coalesce(payload -> 'rq_job' ? 'data', false) \
           FROM qbridge.jobs WHERE queue = $1 ORDER BY key",
    )
    .bind(&route)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        rows.len(),
        5,
        "one row per job, none for the refused duplicates"
    );
    for (key, run_at, has_job) in &rows {
        assert!(has_job, "{key} carries its job hash");
        let ahead = *run_at - chrono::Utc::now();
        if later.contains(key) {
            assert!(
                ahead > chrono::Duration::minutes(59),
                "{key} is due in an hour"
            );
        } else {
            assert!(now.contains(key));
            assert!(ahead < chrono::Duration::minutes(1), "{key} is due now");
        }
    }
    side.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_decommissioned_route_refuses_rqs_unique_enqueue(pool: PgPool) {
    let redis = ThrowawayRedis::start();
    let (route, queue, toml) = route("dual_write");
    let side = ProxySide::start_on(&pool, &toml, &redis.url()).await;
    side.force_to(&route, &redis.url(), qbridge::model::Phase::Decommissioned)
        .await;
    let (ok, _, err) = rq_app(&side.url(), &queue, &["unique", "1"]).await;
    assert!(!ok, "the enqueue fails");
    assert!(err.contains("decommissioned"), "{err}");
    let mut conn = qbridge::redis::connect::connect_redis(&redis.url())
        .await
        .unwrap();
    let waiting: i64 = ::redis::cmd("LLEN")
        .arg(format!("rq:queue:{queue}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(waiting, 0, "nothing pushed into a list nobody reads");
    side.stop().await;
}

/// Runs `rq_app.py args…` against `broker`: (success, stdout lines, stderr).
async fn rq_app(broker: &str, queue: &str, args: &[&str]) -> (bool, Vec<String>, String) {
    let args: Vec<&str> = ["rq_app.py"]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    support::python_script(&support::python(), &args, broker, queue).await
}
