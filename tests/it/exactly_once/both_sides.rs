//! A job that ran live on both sides (the Redis side's run plus a live
//! Postgres copy of the same key) is the double run a cutover must never
//! hide: the diff counts it apart from one side's retries, the gauge shows
//! it, and every gate refuses while it is non-zero. A shadow call beside a
//! Redis run is the normal shadow comparison and is not counted.

use chrono::Utc;
use sqlx::PgPool;

use qbridge::config::{Config, Overrides};
use qbridge::cutover::store::RouteState;
use qbridge::model::Phase;
use qbridge::ops::gates;
use qbridge::redis::connect::connect_redis;
use qbridge::routes::Routes;

use super::REDIS;

/// The Postgres consumer's record of one attempt (what the worker's
/// recorder writes for a keyed job on a route).
async fn postgres_ran(pool: &PgPool, queue: &str, key: &str, mode: &str) {
    sqlx::query(
        "INSERT INTO qbridge.outcomes (queue, key, side, mode, outcome) \
         VALUES ($1, $2, 'postgres', $3, 'ok')",
    )
    .bind(queue)
    .bind(key)
    .bind(mode)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_job_run_live_on_both_sides_is_counted_and_refused_by_every_gate(pool: PgPool) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let route_name = format!("bs{}", &id[..12]);
    let toml = format!(
        "[[routes]]\nname = \"{route_name}\"\nredis_key = \"qbt:{id}:list\"\nqueue = \"{route_name}\"\n\
         format = \"json:/id\"\ndiff = {{ settle = \"0s\" }}\n\
         gates = {{ min_jobs = 1 }}\n"
    );
    let config = Config::from_toml(&toml, &Overrides::default()).unwrap();
    let routes = Routes::from_config(&config.routes);
    let route = routes.by_name(&route_name).unwrap().clone();
    let since = Utc::now() - chrono::Duration::minutes(5);

    // "twice": the Redis side ran it and a live Postgres copy ran it too.
    // "shadowed": Redis ran it, Postgres only called it in shadow mode.
    for key in ["twice", "shadowed"] {
        sqlx::query("SELECT qbridge.report_outcome($1, $2, 'ok', 'done')")
            .bind(&route_name)
            .bind(key)
            .execute(&pool)
            .await
            .unwrap();
    }
    postgres_ran(&pool, &route_name, "twice", "live").await;
    postgres_ran(&pool, &route_name, "shadowed", "shadow").await;

    let mut redis = connect_redis(REDIS).await.unwrap();
    let (diff, _) = gates::diff_since(&pool, &mut redis, &route, Phase::Shadow, since)
        .await
        .unwrap();
    assert_eq!(diff.ran_both_sides, 1, "{}", diff.verdict);
    assert_eq!(diff.sample_ran_both_sides, vec!["twice".to_string()]);
    assert!(!diff.matches(), "a double run is not a match");
    assert!(
        diff.verdict.contains("ran live on both sides 1"),
        "{}",
        diff.verdict
    );

    for phase in [Phase::DualWrite, Phase::Shadow, Phase::PostgresOnly] {
        let state = RouteState {
            route: route_name.clone(),
            phase,
            since: since - chrono::Duration::hours(1),
            changed_by: "test".into(),
            reason: "test".into(),
            percent: 100,
        };
        let gate = gates::evaluate(&pool, Some(&mut redis), &route, &state)
            .await
            .unwrap()
            .unwrap();
        let check = gate
            .checks
            .iter()
            .find(|c| c.name == "ran live on both sides")
            .unwrap_or_else(|| panic!("the {phase} gate has no double-run check: {gate:?}"));
        assert!(!check.passed, "{phase}: {check:?}");
        assert!(!gate.passed(), "{phase}");
    }
}

/// The Redis side's report of a job can be lost (the recorder drops what
/// it cannot write); qbridge's consumer still wrote the key to its ran set
/// in the step that acked it. A live Postgres run of that key is a double
/// run the diff must show, report or not (found by the randomized oracle's
/// "visible in the diff" check, written first here).
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_double_run_stays_visible_when_the_redis_report_was_lost(pool: PgPool) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let route_name = format!("bs{}", &id[..12]);
    let toml = format!(
        "[[routes]]\nname = \"{route_name}\"\nredis_key = \"qbt:{id}:list\"\nqueue = \"{route_name}\"\n\
         format = \"json:/id\"\nredis_side = \"qbridge\"\ndiff = {{ settle = \"0s\" }}\n"
    );
    let config = Config::from_toml(&toml, &Overrides::default()).unwrap();
    let routes = Routes::from_config(&config.routes);
    let route = routes.by_name(&route_name).unwrap().clone();
    let since = Utc::now() - chrono::Duration::minutes(5);
    let mut redis = connect_redis(REDIS).await.unwrap();
    let ran = qbridge::redis::keys::RouteKeys::of(&route).ran();
    let _: i64 = ::redis::cmd("ZADD")
        .arg(&ran)
        .arg(Utc::now().timestamp_millis())
        .arg("unreported")
        .query_async(&mut redis)
        .await
        .unwrap();
    postgres_ran(&pool, &route_name, "unreported", "live").await;

    let (diff, _) = gates::diff_since(&pool, &mut redis, &route, Phase::PostgresOnly, since)
        .await
        .unwrap();
    assert_eq!(diff.ran_both_sides, 1, "{}", diff.verdict);
    assert_eq!(diff.sample_ran_both_sides, vec!["unreported".to_string()]);
    super::delete_keys(&[&ran, &qbridge::redis::keys::RouteKeys::of(&route).epoch()]).await;
}
