//! The gradual flip: in postgres_only a share of job keys (sticky by a hash
//! of the key) goes Postgres-only first; the rest are produced as in shadow.
//! Every job still runs live exactly once, and decommissioning waits for 100%.

use std::time::Duration;

use sqlx::PgPool;

use qbridge::model::{bucket, Phase};
use qbridge::ops::operate::{self, Refusal, Request};

use super::rig::{Options, Rig};
use crate::support;

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_partial_flip_splits_by_key_and_every_job_still_runs_live_once(pool: PgPool) {
    let mut rig = Rig::new(
        &pool,
        Options {
            phase: Phase::Shadow,
            ..Options::default()
        },
    )
    .await;
    let route = rig.route();
    let mut conn = rig.redis().await;
    let req = Request {
        by: "test@ops",
        reason: Some("30% first"),
        force: true,
        percent: Some(30),
    };
    let done = operate::advance(&pool, Some(&mut conn), &route, &req, 1 << 20)
        .await
        .map_err(|_| "advance")
        .unwrap();
    assert_eq!(
        (done.state.phase, done.state.percent),
        (Phase::PostgresOnly, 30)
    );
    support::wait_for("the view has the share", Duration::from_secs(5), || {
        let p = rig.routes.phases().percent(&rig.name);
        async move { p == 30 }
    })
    .await;

    let keys: Vec<String> = (0..200).map(|i| format!("g{i}")).collect();
    rig.produce(&keys).await;
    let flipped: Vec<&String> = keys.iter().filter(|k| bucket(k) < 30).collect();
    assert!((30..=90).contains(&flipped.len()), "{}", flipped.len());
    let live: Vec<String> = sqlx::query_scalar(
        "SELECT key FROM qbridge.job_keys WHERE queue = $1 AND copy = 'live' ORDER BY key",
    )
    .bind(&rig.name)
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut expected: Vec<String> = flipped.iter().map(|k| k.to_string()).collect();
    expected.sort();
    assert_eq!(
        live, expected,
        "exactly the flipped share is live in Postgres"
    );
    let in_redis: i64 = redis::cmd("LLEN")
        .arg(&rig.list)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        in_redis as usize,
        200 - flipped.len(),
        "the rest went to Redis too"
    );

    // Decommissioning waits for 100%.
    match rig.advance(false).await {
        Err(Refusal::Gate(gate)) => {
            assert!(
                gate.failures().contains("keys flipped to Postgres: 30%"),
                "{}",
                gate.failures()
            )
        }
        other => panic!("must refuse: {:?}", other.map(|a| a.state)),
    }
    let ramp = Request {
        by: "test@ops",
        reason: Some("all clean"),
        force: false,
        percent: None,
    };
    let state = operate::ramp(&pool, None, &route, 100, &ramp)
        .await
        .unwrap();
    assert_eq!(state.percent, 100);
    support::wait_for("the view has 100%", Duration::from_secs(5), || {
        let p = rig.routes.phases().percent(&rig.name);
        async move { p == 100 }
    })
    .await;
    let more: Vec<String> = (0..20).map(|i| format!("h{i}")).collect();
    rig.produce(&more).await;

    rig.start().await;
    let calls = rig.calls.clone();
    support::wait_for("every job ran live", Duration::from_secs(30), || {
        let n = calls.live_counts().len();
        async move { n == 220 }
    })
    .await;
    support::wait_for_count(&pool, "queue empty", "SELECT count(*) FROM qbridge.jobs", 0).await;
    let live = rig.calls.live_counts();
    assert!(live.values().all(|n| *n == 1), "each job once: {live:?}");
    let audit: i64 = support::count(
        &pool,
        "SELECT count(*) FROM qbridge.phase_audit WHERE percent IN (30, 100) AND to_phase = 'postgres_only'",
    )
    .await;
    assert_eq!(audit, 2, "the flip and the ramp are audited");
    rig.finish().await;
}
