//! Decommission waits for the Redis side to be idle: a Redis consumer still
//! running a handler keeps its processing list (no live Postgres copy of a
//! job Redis is running), a consumer whose heartbeat expired has its lists
//! archived once, and items the mirror parked in the gap list are never
//! turned into second live copies of jobs the Redis side owned.

use std::time::Duration;

use sqlx::PgPool;

use qbridge::model::Phase;

use super::rig::{Options, Rig};
use crate::support::{self, wait_for, wait_for_count};

/// A job whose handler is still running when the route is decommissioned
/// runs once, on Redis: the archive waits until the consumer acked it, and
/// then has nothing to archive.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn decommission_waits_for_a_handler_still_running_on_redis(pool: PgPool) {
    let mut rig = Rig::new(
        &pool,
        Options {
            phase: Phase::PostgresOnly,
            // Longer than the flag's propagation wait: the old fixed wait
            // archived the processing list while this handler ran.
            handler_delay: Duration::from_secs(3),
            ..Options::default()
        },
    )
    .await;
    rig.start().await;
    rig.push_behind_qbridge(r#"{"id":"busy"}"#).await;
    let calls = rig.calls.clone();
    wait_for("the Redis handler starts", Duration::from_secs(10), || {
        let started = calls.live("busy") == 1;
        async move { started }
    })
    .await;

    // Forced: the gate refuses while an item is in a processing list.
    let done = rig.advance(true).await.map_err(|_| "advance").unwrap();
    assert_eq!(done.state.phase, Phase::Decommissioned);
    let archived = done.archived.expect("archived");
    assert_eq!(
        (archived.enqueued, archived.duplicates),
        (0, 0),
        "the running job was archived as a live Postgres job: {archived:?}"
    );
    wait_for_count(
        &pool,
        "busy acked on Redis",
        "SELECT count(*) FROM qbridge.outcomes WHERE side = 'redis' AND key = 'busy' AND outcome = 'ok'",
        1,
    )
    .await;
    rig.stop().await;
    assert_eq!(rig.calls.live("busy"), 1, "the job ran twice");
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.job_keys WHERE key = 'busy'"
        )
        .await,
        0,
        "no Postgres copy of a job Redis ran"
    );
    rig.finish().await;
}
