//! Decommission waits for the Redis side to be idle: a Redis consumer still
//! running a handler keeps its processing list (no live Postgres copy of a
//! job Redis is running), a consumer whose heartbeat expired has its lists
//! archived once, and items the mirror parked in the gap list are never
//! turned into second live copies of jobs the Redis side owned.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use qbridge::handler::Handler;
use qbridge::model::Phase;
use qbridge::ops::operate::Refusal;
use qbridge::redis::consumer::heartbeat::{self, Heartbeat};
use qbridge::redis::consumer::{ConsumerOptions, ConsumerReport, RedisConsumer};
use qbridge::redis::keys::RouteKeys;
use qbridge::shadow::{OutcomeRecorder, RecorderOptions};

use super::rig::{Options, Rig, REDIS};
use crate::support::{self, wait_for, wait_for_count};

/// The rig's Redis consumer name.
fn consumer_name(rig: &Rig) -> String {
    let route = rig.route();
    let consumer = route.config.redis_consumer.as_ref().expect("consumer");
    consumer.consumer_name.clone()
}

/// A Redis consumer of the rig's route outside the runtime, so a test can
/// kill it.
async fn consumer_of(rig: &Rig) -> RedisConsumer {
    let route = rig.route();
    let (recorder, _writer) = OutcomeRecorder::spawn(
        rig.pool.clone(),
        RecorderOptions::default(),
        CancellationToken::new(),
    );
    let handler = Handler::from_config(route.config.handler.as_ref().unwrap()).unwrap();
    RedisConsumer::new(
        route,
        rig.routes.clone(),
        REDIS,
        &rig.config.redis_tls,
        rig.pool.clone(),
        handler,
        recorder,
    )
    .await
    .expect("consumer")
    .with_options(ConsumerOptions {
        block: Duration::from_millis(200),
        drain: Duration::ZERO,
        reconnect_delay: Duration::from_millis(100),
        phase_poll: Duration::from_millis(50),
    })
}

/// The route's consumer heartbeats as decommission reads them.
async fn heartbeats(rig: &Rig) -> Vec<Heartbeat> {
    let mut conn = rig.redis().await;
    let keys = RouteKeys::of(&rig.route());
    let found: Vec<String> = redis::cmd("KEYS")
        .arg(keys.any_heartbeat())
        .query_async(&mut conn)
        .await
        .unwrap();
    heartbeat::read(&mut conn, &keys, &found).await.unwrap()
}

/// Waits until the consumer `running` holds an item, then kills it
/// mid-job: no clean exit, so its heartbeat stays until its TTL runs out.
async fn kill_once_holding(rig: &Rig, running: tokio::task::JoinHandle<ConsumerReport>) {
    wait_for(
        "the consumer holds the item",
        Duration::from_secs(10),
        || async move { heartbeats(rig).await.iter().any(|b| b.holding == 1) },
    )
    .await;
    running.abort();
    let _ = running.await;
}

/// Items in the route's processing lists.
async fn processing_items(rig: &Rig) -> i64 {
    let mut conn = rig.redis().await;
    let lists: Vec<String> = redis::cmd("KEYS")
        .arg(RouteKeys::of(&rig.route()).any_processing())
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut n = 0;
    for list in lists {
        let len: i64 = redis::cmd("LLEN")
            .arg(&list)
            .query_async(&mut conn)
            .await
            .unwrap();
        n += len;
    }
    n
}

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

/// A consumer that does not finish within `gates.decommission_wait`: the
/// archive is refused in one line naming it, nothing is archived, and
/// running the advance again once it finished archives nothing twice.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_consumer_still_busy_at_the_deadline_is_named_and_nothing_is_archived(pool: PgPool) {
    let mut rig = Rig::new(
        &pool,
        Options {
            phase: Phase::PostgresOnly,
            handler_delay: Duration::from_secs(4),
            decommission_wait: "500ms",
            ..Options::default()
        },
    )
    .await;
    rig.start().await;
    rig.push_behind_qbridge(r#"{"id":"slow"}"#).await;
    let calls = rig.calls.clone();
    wait_for("the Redis handler starts", Duration::from_secs(10), || {
        let started = calls.live("slow") == 1;
        async move { started }
    })
    .await;
    let err = match rig.advance(true).await {
        Err(Refusal::Error(e)) => e.to_string(),
        Err(Refusal::Gate(_)) => panic!("forced past the gate"),
        Ok(done) => panic!("archived while the handler ran: {:?}", done.archived),
    };
    assert!(err.contains(&consumer_name(&rig)), "{err}");
    assert!(err.contains("holding 1 items"), "{err}");
    assert!(err.contains("qbridge cutover advance"), "{err}");
    assert!(!err.contains('\n'), "{err}");
    // The flag flipped; the item is still where the consumer works on it.
    rig.until_phase(Phase::Decommissioned).await;
    assert_eq!(processing_items(&rig).await, 1);
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.job_keys").await,
        0
    );

    wait_for_count(
        &pool,
        "slow acked on Redis",
        "SELECT count(*) FROM qbridge.outcomes WHERE side = 'redis' AND key = 'slow' AND outcome = 'ok'",
        1,
    )
    .await;
    let done = rig.advance(false).await.map_err(|_| "advance").unwrap();
    let archived = done.archived.expect("archived");
    assert_eq!((archived.enqueued, archived.duplicates), (0, 0));
    assert_eq!(archived.consumers_acknowledged, [consumer_name(&rig)]);
    rig.stop().await;
    assert_eq!(rig.calls.live("slow"), 1);
    rig.finish().await;
}

/// A consumer that died holding an item: its heartbeat is there (late, so
/// decommission waits) until it expires; then its processing list is
/// archived, once — running the archive again stores nothing more.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_dead_consumers_list_is_archived_once_after_its_heartbeat_expired(pool: PgPool) {
    let rig = Rig::new(
        &pool,
        Options {
            phase: Phase::PostgresOnly,
            handler_delay: Duration::from_secs(60),
            ..Options::default()
        },
    )
    .await;
    let consumer = tokio::spawn(consumer_of(&rig).await.run(CancellationToken::new()));
    rig.push_behind_qbridge(r#"{"id":"orphan"}"#).await;
    kill_once_holding(&rig, consumer).await;
    assert_eq!(heartbeats(&rig).await.len(), 1);

    let done = rig.advance(true).await.map_err(|_| "advance").unwrap();
    let archived = done.archived.expect("archived");
    assert_eq!(
        (archived.enqueued, archived.duplicates),
        (1, 0),
        "{archived:?}"
    );
    assert_eq!(archived.consumers_gone, [consumer_name(&rig)]);
    assert!(archived.consumers_acknowledged.is_empty());
    // Running the archive again finds nothing to store.
    let again = rig.advance(false).await.map_err(|_| "advance").unwrap();
    let again = again.archived.expect("archived");
    assert_eq!((again.enqueued, again.duplicates), (0, 0), "{again:?}");
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.jobs WHERE key = 'orphan' AND copy = 'live'"
        )
        .await,
        1
    );
    let mut conn = rig.redis().await;
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("qbridge:*:{}*", rig.name))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(left.is_empty(), "decommission left {left:?}");
    rig.finish().await;
}

/// A consumer that died inside its handler may have done the job's work.
/// When decommission archives its item into a live Postgres job, the Redis
/// side's interrupted attempt is recorded (a failed live attempt,
/// `interrupted`), so once Postgres runs the job the diff counts it as run
/// live on both sides: at least once under a crash, and visible. Before,
/// nothing recorded the Redis attempt (its outcome died with the process)
/// and the diff showed no double run — the class of the randomized
/// oracle's seed 3293 ("1 jobs ran live on both sides, the diff shows 0").
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_archived_item_whose_redis_run_was_interrupted_counts_on_both_sides(pool: PgPool) {
    let rig = Rig::new(
        &pool,
        Options {
            phase: Phase::PostgresOnly,
            handler_delay: Duration::from_secs(60),
            ..Options::default()
        },
    )
    .await;
    let since = chrono::Utc::now() - chrono::Duration::minutes(1);
    let consumer = tokio::spawn(consumer_of(&rig).await.run(CancellationToken::new()));
    rig.push_behind_qbridge(r#"{"id":"interrupted"}"#).await;
    wait_for(
        "the Redis handler has the job",
        Duration::from_secs(10),
        || {
            let calls = rig.calls.clone();
            async move { calls.live("interrupted") == 1 }
        },
    )
    .await;
    consumer.abort();
    let _ = consumer.await;
    rig.advance(true).await.map_err(|_| "advance").unwrap();

    let redis_side: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT mode, outcome, error_class FROM qbridge.outcomes \
          WHERE key = 'interrupted' AND side = 'redis'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        redis_side,
        [("live".into(), "failed".into(), Some("interrupted".into()))],
        "the Redis side's attempt is on record"
    );
    // Postgres runs the archived job live.
    sqlx::query(
        "INSERT INTO qbridge.outcomes (queue, key, side, mode, outcome) \
         VALUES ($1, 'interrupted', 'postgres', 'live', 'ok')",
    )
    .bind(&rig.name)
    .execute(&pool)
    .await
    .unwrap();
    let mut conn = rig.redis().await;
    let (diff, _) = qbridge::ops::gates::diff_since(
        &pool,
        &mut conn,
        &rig.route(),
        Phase::Decommissioned,
        since,
    )
    .await
    .unwrap();
    assert_eq!(diff.ran_both_sides, 1, "{}", diff.verdict);
    rig.finish().await;
}

/// A consumer that died holding an item of a route keyed by content hash:
/// the item was numbered when it was popped (its inflight hash keeps the
/// key), so decommission archives it under that key, where it meets its own
/// mirror copy — one job. Before, the archive numbered it as a pop of its
/// own and the text ran under one key more than it was pushed (the
/// randomized oracle's seed 60024: a worker killed after its handler ran).
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_archived_held_item_keeps_the_key_its_pop_was_given(pool: PgPool) {
    let rig = Rig::new(
        &pool,
        Options {
            phase: Phase::DualWrite,
            handler_delay: Duration::from_secs(60),
            format: "raw",
            ..Options::default()
        },
    )
    .await;
    let consumer = tokio::spawn(consumer_of(&rig).await.run(CancellationToken::new()));
    rig.producer
        .enqueue(&rig.name, vec![bytes::Bytes::from_static(b"the same text")])
        .await
        .expect("enqueue");
    kill_once_holding(&rig, consumer).await;

    for _ in 0..3 {
        rig.advance(true).await.map_err(|_| "advance").unwrap();
    }
    assert_eq!(rig.routes.phases().get(&rig.name), Phase::Decommissioned);
    let keys: Vec<String> =
        sqlx::query_scalar("SELECT key FROM qbridge.job_keys WHERE queue = $1 ORDER BY key")
            .bind(&rig.name)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        keys.len(),
        1,
        "one text pushed once is one job key: {keys:?}"
    );
    assert!(keys[0].ends_with(":1"), "{keys:?}");
    assert_eq!(
        support::count(
            &pool,
            &format!(
                "SELECT count(*) FROM qbridge.jobs WHERE queue = '{}' AND copy = 'live'",
                rig.name
            )
        )
        .await,
        1,
        "the archived item is the one live job"
    );
    rig.finish().await;
}
