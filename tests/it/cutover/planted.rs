//! Planted discrepancies — a dropped mirror, an item Redis lost, a duplicate
//! push, a flipped outcome — each show up in the diff; the gate refuses with
//! the numbers; `--repair` fills the gaps, and a second repair does nothing.

use std::time::Duration;

use sqlx::PgPool;

use qbridge::model::Phase;
use qbridge::ops::diff::Diff;
use qbridge::ops::gates::diff_since;
use qbridge::ops::operate::Refusal;
use qbridge::ops::repair;

use super::rig::{Options, Rig};
use crate::support;

async fn diff(rig: &Rig) -> (Diff, qbridge::ops::redis_view::RedisView) {
    let mut conn = rig.redis().await;
    let since = chrono::Utc::now() - chrono::Duration::minutes(5);
    let route = rig.route();
    let phase = rig.routes.phase(&route);
    diff_since(&rig.pool, &mut conn, &route, phase, since)
        .await
        .expect("diff")
}

async fn repair(rig: &Rig) -> repair::RepairReport {
    repair_assuming(rig, None).await
}

async fn repair_assuming(rig: &Rig, assume: Option<&repair::Assumption>) -> repair::RepairReport {
    let (_, held) = diff(rig).await;
    let mut conn = rig.redis().await;
    let route = rig.route();
    let since = chrono::Utc::now() - chrono::Duration::minutes(5);
    let input = repair::RepairInput {
        route: &route,
        phase: rig.routes.phase(&route),
        since,
        held: &held,
        payload_limit: 1 << 20,
        assume,
    };
    repair::repair_with(&rig.pool, &mut conn, input)
        .await
        .expect("repair")
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn planted_discrepancies_show_up_block_the_gate_and_repair_fills_them(pool: PgPool) {
    let mut rig = Rig::new(&pool, Options::default()).await;

    // dual_write, consumers not running yet: 10 jobs on both sides, and one
    // pushed behind qbridge's back (its mirror is "dropped").
    rig.produce(&keys("a", 10)).await;
    rig.push_behind_qbridge(r#"{"id":"dropped"}"#).await;
    let (d, _) = diff(&rig).await;
    assert_eq!(d.only_redis_waiting, 1, "{}", d.verdict);
    assert_eq!(d.sample_only_redis, vec!["dropped".to_string()]);
    assert!(
        !d.matches() && d.verdict.contains("DIFFERS"),
        "{}",
        d.verdict
    );

    // The gate dual_write → shadow refuses and says why, with the numbers.
    match rig.advance(false).await {
        Err(Refusal::Gate(gate)) => {
            let failed = gate.failures();
            assert!(failed.contains("mirror completeness"), "{failed}");
            assert!(failed.contains("90.9091%"), "10 of 11 mirrored: {failed}");
            assert!(
                failed.contains("1 of 11 Redis-side jobs have no Postgres copy: 1 waiting")
                    && failed.contains("e.g. dropped"),
                "which jobs, and what to do: {failed}"
            );
        }
        other => panic!("the gate must refuse: {:?}", other.map(|a| a.state)),
    }

    // --repair mirrors the waiting item; a second repair adds nothing.
    assert_eq!(repair(&rig).await.mirrored, 1);
    assert_eq!(repair(&rig).await.mirrored, 0);
    let (d, _) = diff(&rig).await;
    assert_eq!(d.one_sided(), 0, "{}", d.verdict);

    // Run everything on Redis (live) and drain the mirrors in Postgres.
    rig.start().await;
    support::wait_for_count(
        &pool,
        "11 Redis-side outcomes",
        "SELECT count(DISTINCT key) FROM qbridge.outcomes WHERE side = 'redis'",
        11,
    )
    .await;
    support::wait_for_count(
        &pool,
        "mirrors drained",
        "SELECT 11 - count(*) FROM qbridge.jobs",
        11,
    )
    .await;
    let advanced = rig.advance(false).await.expect("the gate passes now");
    assert_eq!(advanced.state.phase, Phase::Shadow);
    rig.until_phase(Phase::Shadow).await;

    // A job Redis lost: mirrored, but its Redis push never happened (as
    // after a Redis restart without persistence).
    let route = rig.route();
    let mut tx = pool.begin().await.unwrap();
    let pending = rig
        .producer
        .enqueue_in(&mut tx, &route.name, vec![r#"{"id":"lost"}"#.into()])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    drop(pending);
    sqlx::query("DELETE FROM qbridge.redis_outbox")
        .execute(&pool)
        .await
        .unwrap();
    // A double run on the Redis side, planted as its second outcome report
    // (a second push of the id is no longer run: the consumer drops a key
    // its ran set holds, so a fleet's double report stands in for it).
    rig.produce(&["twice".to_string()]).await;
    support::wait_for_count(
        &pool,
        "the first run of twice",
        "SELECT count(*) FROM qbridge.outcomes WHERE key = 'twice' AND side = 'redis'",
        1,
    )
    .await;
    sqlx::query("SELECT qbridge.report_outcome((SELECT queue FROM qbridge.outcomes WHERE key = 'twice' LIMIT 1), 'twice', 'ok')")
        .execute(&pool)
        .await
        .unwrap();
    // A flipped outcome: the handler fails it in shadow mode only.
    rig.produce(&["flip1".to_string()]).await;
    rig.produce(&keys("b", 5)).await;

    // Redis: 11 earlier keys + twice, flip1, b0..b4; twice ran twice.
    support::wait_for_count(
        &pool,
        "every Redis copy ran",
        "SELECT count(*) FROM qbridge.outcomes WHERE side = 'redis'",
        19,
    )
    .await;
    // Postgres shadow calls: twice, flip1, b0..b4 and lost (its mirror copy exists).
    support::wait_for_count(
        &pool,
        "every mirror copy was shadowed",
        "SELECT count(DISTINCT key) FROM qbridge.outcomes WHERE side = 'postgres' AND mode = 'shadow'",
        8,
    )
    .await;
    // Past the settle time, "lost" counts as only in Postgres.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (d, _) = diff(&rig).await;
    assert_eq!(d.only_postgres, 1, "{}", d.verdict);
    assert_eq!(d.sample_only_postgres, vec!["lost".to_string()]);
    // No restart, flush or failover of Redis was seen after its push:
    // qbridge cannot tell it lost, so it is unaccounted, not repairable.
    assert_eq!((d.repairable, d.unaccounted), (0, 1), "{}", d.verdict);
    assert_eq!(d.sample_unaccounted, vec!["lost".to_string()]);
    assert!(d.verdict.contains("unaccounted"), "{}", d.verdict);
    assert_eq!(d.redis.ran_twice, 1, "{}", d.verdict);
    assert!(d.sample_ran_twice.contains(&"twice".to_string()));
    assert_eq!(d.mismatched, 1, "{}", d.verdict);
    assert_eq!(d.mismatches[0].key, "flip1");
    assert_eq!(
        (
            d.mismatches[0].redis.as_str(),
            d.mismatches[0].postgres.as_str()
        ),
        ("ok", "dead")
    );
    // Compared: b0..b4, twice, flip1. The ignored /at field differs on
    // every call, yet only flip1 mismatched.
    assert_eq!(d.compared, 7, "{}", d.verdict);

    // shadow → postgres_only refuses: too short in shadow, and the mismatch.
    match rig.advance(false).await {
        Err(Refusal::Gate(gate)) => {
            let failed = gate.failures();
            assert!(failed.contains("time in shadow"), "{failed}");
            assert!(failed.contains("outcome mismatch rate"), "{failed}");
        }
        other => panic!("the gate must refuse: {:?}", other.map(|a| a.state)),
    }

    // --repair alone pushes nothing back and says why; the operator's
    // audited --assume-lost pushes "lost" back to Redis, once; Redis then
    // runs it live.
    let silent = repair(&rig).await;
    assert_eq!((silent.repushed, silent.unaccounted), (0, 1), "{silent:?}");
    assert!(silent.unaccounted_reason.is_some(), "{silent:?}");
    let assume = repair::Assumption {
        keys: vec!["lost".into()],
        by: "planted-test".into(),
        reason: "its outbox row was deleted by the test".into(),
        ..repair::Assumption::default()
    };
    let first = repair_assuming(&rig, Some(&assume)).await;
    assert_eq!(first.repushed, 1, "{first:?}");
    assert_eq!(
        first.evidence.keys().collect::<Vec<_>>(),
        vec!["assumed lost by planted-test: its outbox row was deleted by the test"]
    );
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.repair_audit WHERE by = 'planted-test' AND pushed_back = 1"
        )
        .await,
        1,
        "the decision is audited"
    );
    support::wait_for_count(
        &pool,
        "lost ran on Redis",
        "SELECT count(*) FROM qbridge.outcomes WHERE side = 'redis' AND key = 'lost'",
        1,
    )
    .await;
    let second = repair(&rig).await;
    assert_eq!((second.repushed, second.mirrored), (0, 0), "{second:?}");
    let (d, _) = diff(&rig).await;
    assert_eq!(d.only_postgres, 0, "{}", d.verdict);
    assert_eq!(rig.calls.live("lost"), 1);
    assert_eq!(rig.calls.shadow("b0"), 1, "shadow calls happen in shadow");
    rig.finish().await;
}

/// The Redis consumer can finish a job (and report it) before the job's
/// mirror row commits: such a job is not "only in Postgres", and a repair
/// must not push it again.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_job_reported_by_redis_before_its_mirror_committed_is_not_repushed(pool: PgPool) {
    let rig = Rig::new(&pool, Options::default()).await;
    // The Redis side reported "early" before the mirror row exists.
    qbridge::shadow::record(
        &pool,
        &[qbridge::shadow::Outcome {
            queue: rig.name.clone(),
            key: "early".into(),
            side: qbridge::shadow::Side::Redis,
            mode: qbridge::shadow::Mode::Live,
            outcome: qbridge::shadow::OutcomeKind::Ok,
            error_class: None,
            digest: None,
            attempt: Some(1),
        }],
    )
    .await
    .unwrap();
    let route = rig.route();
    let mut tx = pool.begin().await.unwrap();
    let pending = rig
        .producer
        .enqueue_in(&mut tx, &route.name, vec![r#"{"id":"early"}"#.into()])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    drop(pending);
    sqlx::query("DELETE FROM qbridge.redis_outbox")
        .execute(&pool)
        .await
        .unwrap();
    let kept: Option<Vec<u8>> =
        sqlx::query_scalar("SELECT original FROM qbridge.job_keys WHERE key = 'early'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(kept.is_none(), "no bytes kept for a job Redis already ran");
    // Even if both had committed at once (bytes kept), the outcome decides.
    sqlx::query("UPDATE qbridge.job_keys SET original = 'x' WHERE key = 'early'")
        .execute(&pool)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (d, _) = diff(&rig).await;
    assert_eq!(d.only_postgres, 0, "{}", d.verdict);
    let r = repair(&rig).await;
    assert_eq!(r.repushed, 0, "{r:?}");
    rig.finish().await;
}
