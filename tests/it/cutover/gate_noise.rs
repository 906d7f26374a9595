//! A gate must not flip between refused and passed on noise. With a steady
//! producer in `shadow`, both sides run every job, a moment apart: counting
//! acks by when outcomes were recorded counted a job on one side whose
//! other outcome fell just outside the window, and a tolerance of 0.1%
//! meant "exactly equal" below 1,000 jobs. Paced producers at 1, 10 and 100
//! jobs/s, the shadow gate's ack check evaluated every 250 ms once a window
//! has filled: it must pass every time.

use std::time::{Duration, Instant};

use sqlx::PgPool;

use qbridge::model::Phase;
use qbridge::ops::{gates, operate};

use super::rig::{Options, Rig};

/// The shadow gate's ack check of `route` as it reads now.
async fn ack_check(
    pool: &PgPool,
    conn: &mut ::redis::aio::ConnectionManager,
    route: &qbridge::routes::Route,
) -> gates::Check {
    let state = operate::state_of(pool, route, "test@ops").await.unwrap();
    let gate = gates::evaluate(pool, Some(conn), route, &state)
        .await
        .unwrap()
        .expect("a gate out of shadow");
    gate.checks
        .into_iter()
        .find(|c| c.name == "ack counts")
        .expect("the ack check")
}

async fn ack_check_holds_steady_at(pool: PgPool, per_second: u32) {
    let mut rig = Rig::new(
        &pool,
        Options {
            phase: Phase::Shadow,
            window: "4s",
            min_jobs: 1,
            // Outcomes are recorded in batches, up to a second apart.
            settle: "3s",
            ..Options::default()
        },
    )
    .await;
    rig.start().await;
    let route = rig.route();
    let pace = Duration::from_secs(1) / per_second;
    let started = Instant::now();
    let producing = {
        let producer = rig.producer.clone();
        let name = rig.name.clone();
        tokio::spawn(async move {
            let mut n = 0u32;
            while started.elapsed() < Duration::from_secs(22) {
                let item = bytes::Bytes::from(format!(r#"{{"id":"p{n}"}}"#));
                producer.enqueue(&name, vec![item]).await.expect("enqueue");
                n += 1;
                if let Some(wait) = (started + pace * n).checked_duration_since(Instant::now()) {
                    tokio::time::sleep(wait).await;
                }
            }
        })
    };
    // Once a window has filled, every 250 ms.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let mut conn = rig.redis().await;
    let mut verdicts = Vec::new();
    while started.elapsed() < Duration::from_secs(22) {
        let ack = ack_check(&pool, &mut conn, &route).await;
        verdicts.push((ack.passed, ack.value));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    producing.await.unwrap();
    rig.finish().await;
    assert!(verdicts.len() >= 12, "{} evaluations", verdicts.len());
    let refused: Vec<&String> = verdicts
        .iter()
        .filter(|(passed, _)| !passed)
        .map(|(_, value)| value)
        .collect();
    assert!(
        refused.is_empty(),
        "{per_second} jobs/s: the ack check refused {} of {} times: {refused:?}",
        refused.len(),
        verdicts.len()
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_ack_check_holds_steady_at_1_job_per_second(pool: PgPool) {
    ack_check_holds_steady_at(pool, 1).await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_ack_check_holds_steady_at_10_jobs_per_second(pool: PgPool) {
    ack_check_holds_steady_at(pool, 10).await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_ack_check_holds_steady_at_100_jobs_per_second(pool: PgPool) {
    ack_check_holds_steady_at(pool, 100).await;
}

/// After a rollback from `postgres_only`, the jobs produced while the
/// route was flipped are live copies and still run on Postgres, inside the
/// new shadow window. They have no Redis run to compare with: the ack check
/// leaves them out. Before, their live runs counted as Postgres acks and
/// held the shadow gate shut ("redis 441, postgres 451").
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn live_runs_after_a_rollback_do_not_hold_the_ack_check(pool: PgPool) {
    let mut rig = Rig::new(
        &pool,
        Options {
            phase: Phase::PostgresOnly,
            window: "1m",
            min_jobs: 1,
            settle: "2s",
            handler_delay: Duration::from_millis(1500),
            ..Options::default()
        },
    )
    .await;
    rig.start().await;
    let flipped: Vec<String> = (0..20).map(|i| format!("live{i}")).collect();
    rig.produce(&flipped).await;
    assert_eq!(rig.rollback().await, Phase::Shadow);
    rig.until_phase(Phase::Shadow).await;
    let shadowed: Vec<String> = (0..10).map(|i| format!("both{i}")).collect();
    rig.produce(&shadowed).await;
    crate::support::wait_for_count(
        &pool,
        "the live jobs ran on Postgres after the rollback",
        &format!(
            "SELECT count(*) FROM qbridge.outcomes WHERE queue = '{}' AND mode = 'live' AND side = 'postgres'",
            rig.name
        ),
        20,
    )
    .await;
    crate::support::wait_for_count(
        &pool,
        "the shadowed jobs ran on both sides",
        &format!(
            "SELECT count(*) FROM qbridge.outcomes WHERE queue = '{}' AND key LIKE 'both%'",
            rig.name
        ),
        20,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let route = rig.route();
    let mut conn = rig.redis().await;
    let ack = ack_check(&pool, &mut conn, &route).await;
    assert!(ack.passed, "{ack:?}");
    assert!(
        ack.value.starts_with("redis 10, postgres 10 of 10"),
        "{ack:?}"
    );
    rig.finish().await;
}
