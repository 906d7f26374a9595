//! Issue 14: a Sidekiq route's jobs also wait in Sidekiq's `schedule`,
//! `retry` and `dead` sets, shared by every queue. Real Sidekiq 6.4 puts
//! them there; qbridge counts the route's own, and the gate into
//! `decommissioned` refuses while any is left (decommissioning carries only
//! the route's lists, so they would be stranded).

use std::sync::Arc;

use sqlx::PgPool;

use qbridge::config::{Config, Overrides};
use qbridge::cutover::store::RouteState;
use qbridge::model::structures::Holding;
use qbridge::model::Phase;
use qbridge::ops::{gates, structures};
use qbridge::redis::connect::connect_redis;
use qbridge::routes::{Route, Routes};

use crate::servers::ThrowawayRedis;
use crate::support;

/// A throwaway Redis where real Sidekiq put jobs in its list and its three
/// sets (`tests/ruby/sidekiq_structures.rb`), and the route of queue
/// "default" in `postgres_only`.
fn sidekiq_jobs_everywhere() -> (ThrowawayRedis, Arc<Route>) {
    let server = ThrowawayRedis::start();
    support::ruby("sidekiq_structures.rb", &[("REDIS_URL", &server.url())]);
    let toml = "[[routes]]\nname = \"mail\"\nredis_key = \"queue:default\"\nqueue = \"mail\"\n\
                format = \"sidekiq\"\nphase = \"postgres_only\"\n";
    let cfg = Config::from_toml(toml, &Overrides::default()).expect("route config");
    let routes = Routes::from_config(&cfg.routes);
    let route = Arc::clone(routes.by_name("mail").unwrap());
    (server, route)
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn sidekiq_jobs_outside_the_list_are_counted_and_hold_decommission(pool: PgPool) {
    let (server, route) = sidekiq_jobs_everywhere();
    let mut conn = connect_redis(&server.url()).await.unwrap();

    let held = structures::read(&mut conn, &route).await.unwrap();
    let counts: Vec<(Holding, &str, u64)> = held
        .iter()
        .map(|h| (h.holding, h.key.as_str(), h.jobs))
        .collect();
    assert_eq!(
        counts,
        [
            (Holding::Scheduled, "schedule", 3),
            (Holding::Retrying, "retry", 1),
            (Holding::Dead, "dead", 1)
        ],
        "the job of queue \"other\" is not the route's"
    );
    let next = held[0].next_at.expect("scheduled jobs have a time");
    let ahead = next - chrono::Utc::now();
    assert!(
        ahead > chrono::Duration::minutes(59) && ahead < chrono::Duration::minutes(61),
        "perform_in(3600) is due in an hour: {next}"
    );

    let state = RouteState {
        route: "mail".into(),
        phase: Phase::PostgresOnly,
        percent: 100,
        since: chrono::Utc::now() - chrono::Duration::hours(1),
        changed_by: "test".into(),
        reason: "test".into(),
    };
    let gate = gates::evaluate(&pool, Some(&mut conn), &route, &state)
        .await
        .unwrap()
        .expect("a gate into decommissioned");
    let check = gate
        .checks
        .iter()
        .find(|c| c.name == "jobs in the framework's other structures")
        .expect("the check is there");
    assert!(!check.passed, "{check:?}");
    assert!(
        check.value.contains("schedule: 3 scheduled") && check.value.contains("retry: 1"),
        "{check:?}"
    );
    assert!(!gate.passed());
    // The diff says where they are, too.
    let since = chrono::Utc::now() - chrono::Duration::minutes(5);
    let (diff, _) = gates::diff_since(&pool, &mut conn, &route, Phase::PostgresOnly, since)
        .await
        .unwrap();
    assert!(
        diff.verdict
            .contains("also only on Redis, outside the list: schedule: 3 scheduled"),
        "{}",
        diff.verdict
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_forced_decommission_carries_them_into_postgres_due_at_their_times(pool: PgPool) {
    use qbridge::ops::operate::{self, Request};

    let (server, route) = sidekiq_jobs_everywhere();
    qbridge::cutover::store::register(&pool, "mail", Phase::PostgresOnly, "test")
        .await
        .unwrap();
    let mut conn = connect_redis(&server.url()).await.unwrap();
    let req = Request {
        by: "test@ops",
        reason: Some("carry Sidekiq's sets"),
        force: true,
        percent: None,
    };
    let done = operate::advance(&pool, Some(&mut conn), &route, &req, 1 << 20)
        .await
        .map_err(|_| "refused")
        .unwrap();
    let carried = done.archived.expect("archived").carried;
    assert_eq!(
        (carried.scheduled, carried.retrying, carried.dead),
        (3, 1, 1)
    );

    let due: Vec<(String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT key, run_at FROM qbridge.jobs WHERE queue = 'mail' AND copy = 'live' \
           AND run_at > now() + interval '10 seconds' ORDER BY run_at",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        due.len(),
        4,
        "3 scheduled in an hour and the retry: {due:?}"
    );
    assert_eq!(due[0].0, "retry-jid", "the retry is due first: {due:?}");
    let dead: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.jobs_dead WHERE queue = 'mail' AND key = 'dead-jid'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(dead, 1);
    // Only the route's members left Redis: the other queue's job stays.
    for (set, left) in [("schedule", 1), ("retry", 0), ("dead", 0)] {
        let n: i64 = ::redis::cmd("ZCARD")
            .arg(set)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(n, left, "{set}");
    }
}
