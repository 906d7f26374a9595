//! The Redis keys the writers make are the keys the readers read: the real
//! consumer (processing list, inflight hash, dead list), the mirror's spool
//! (gap list), repair (its re-push marker) and the outbox (paid marker)
//! write them, and the consumer's heartbeat is found by decommission's
//! reader; the diff's view of Redis finds every item they hold, and
//! decommission archives them and leaves not one key of the route behind.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use qbridge::config::{Config, Overrides};
use qbridge::cutover::watch;
use qbridge::handler::Handler;
use qbridge::mirror::{Mirror, MirrorOptions};
use qbridge::model::Phase;
use qbridge::ops::{decommission, redis_view, repair};
use qbridge::redis::connect::connect_redis;
use qbridge::redis::consumer::{heartbeat, ConsumerOptions, RedisConsumer};
use qbridge::redis::keys::{self, RouteKeys};
use qbridge::redis::producer::Producer;
use qbridge::routes::Routes;
use qbridge::shadow::{OutcomeRecorder, RecorderOptions};

use crate::support;

const REDIS: &str = "redis://127.0.0.1:6379";

/// `slow…` takes a minute (it is still running when the consumer stops),
/// `bad…` fails for good, anything else succeeds.
async fn handler() -> String {
    let app = axum::Router::new().route(
        "/run",
        axum::routing::post(|headers: HeaderMap| async move {
            let key = headers
                .get("qbridge-job-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            if key.starts_with("slow") {
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            match key.starts_with("bad") {
                true => StatusCode::BAD_REQUEST,
                false => StatusCode::OK,
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/run")
}

/// The route's consumer heartbeats, as decommission finds and reads them.
async fn heartbeats(
    conn: &mut ::redis::aio::ConnectionManager,
    route: &RouteKeys,
) -> Vec<heartbeat::Heartbeat> {
    let found: Vec<String> = ::redis::cmd("KEYS")
        .arg(route.any_heartbeat())
        .query_async(conn)
        .await
        .unwrap();
    heartbeat::read(conn, route, &found).await.unwrap()
}

/// Every key on the shared Redis whose name holds `part`.
async fn keys_holding(conn: &mut ::redis::aio::ConnectionManager, part: &str) -> Vec<String> {
    let mut found: Vec<String> = ::redis::cmd("KEYS")
        .arg(format!("*{part}*"))
        .query_async(conn)
        .await
        .unwrap();
    found.sort();
    found
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn what_the_writers_write_the_readers_find_and_decommission_clears(pool: PgPool) {
    let url = handler().await;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (name, list) = (format!("k{}", &id[..12]), format!("qbt:{id}:list"));
    let toml = format!(
        r#"[[routes]]
name = "{name}"
redis_key = "{list}"
queue = "{name}"
format = "json:/id"
phase = "dual_write"
handler = {{ type = "http", url = "{url}" }}
redis_consumer = {{ concurrency = 1, consumer_name = "c{id}", max_attempts = 1 }}
diff = {{ settle = "0s" }}
"#
    );
    let overrides = Overrides {
        database_url: Some(support::db_url(&pool)),
        redis_url: Some(REDIS.into()),
        ..Overrides::default()
    };
    let config = Config::from_toml(&toml, &overrides).expect("config");
    let stop_watch = CancellationToken::new();
    let (view, _) = watch::attach(
        &pool,
        Some(&crate::support::db_url(&pool)),
        &config.routes,
        "test",
        &stop_watch,
    )
    .await
    .unwrap();
    let routes = Routes::new(&config.routes, view);
    let route = Arc::clone(routes.by_name(&name).unwrap());
    let route_keys = RouteKeys::of(&route);
    let mut redis = connect_redis(REDIS).await.unwrap();

    // The consumer: one item fails for good (dead list), one is still
    // running when the consumer stops (processing list + inflight hash).
    let producer = Producer::connect(pool.clone(), Some(REDIS), routes.clone(), 1 << 20)
        .await
        .unwrap();
    for item in [r#"{"id":"bad-1"}"#, r#"{"id":"slow-1"}"#] {
        let done = producer
            .enqueue(&name, vec![Bytes::from(item)])
            .await
            .unwrap();
        assert_eq!(done.pushed, 1);
    }
    let (recorder, writer) = OutcomeRecorder::spawn(
        pool.clone(),
        RecorderOptions::default(),
        CancellationToken::new(),
    );
    let consumer = RedisConsumer::new(
        Arc::clone(&route),
        routes.clone(),
        REDIS,
        &config.redis_tls,
        pool.clone(),
        Handler::from_config(config.routes[0].handler.as_ref().unwrap()).unwrap(),
        recorder.clone(),
    )
    .await
    .unwrap()
    .with_options(ConsumerOptions {
        block: Duration::from_millis(100),
        drain: Duration::ZERO,
        ..ConsumerOptions::default()
    });
    let intake = CancellationToken::new();
    let running = tokio::spawn(consumer.run(intake.clone()));
    let consumer_keys = route_keys.consumer(&format!("c{id}"));
    let started = Instant::now();
    loop {
        let held: i64 = ::redis::cmd("LLEN")
            .arg(consumer_keys.processing(0))
            .query_async(&mut redis)
            .await
            .unwrap();
        let dead: i64 = ::redis::cmd("LLEN")
            .arg(route_keys.dead())
            .query_async(&mut redis)
            .await
            .unwrap();
        if held == 1 && dead == 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "consumer did not get there"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Its heartbeat, found by the pattern decommission scans and read by
    // decommission's reader: the phase it acts on and the item it holds
    // (from its next beat on).
    let started = Instant::now();
    let beats = loop {
        let beats = heartbeats(&mut redis, &route_keys).await;
        if beats.iter().any(|b| b.holding == 1) {
            break beats;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no beat says it holds the item: {beats:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(beats.len(), 1, "{beats:?}");
    assert_eq!(beats[0].consumer, format!("c{id}"));
    assert_eq!(
        (beats[0].phase, beats[0].holding),
        (Some(Phase::DualWrite), 1)
    );
    intake.cancel();
    running.await.unwrap();
    // A clean exit takes the heartbeat with it (the item stays for the next
    // start, or for decommission).
    assert!(heartbeats(&mut redis, &route_keys).await.is_empty());
    drop(recorder);
    writer.await.unwrap();

    // The mirror's spool: Postgres is unreachable, so the item is parked.
    let nowhere = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy("postgres://postgres@127.0.0.1:1/none")
        .unwrap();
    let (mirror, mut writers) = Mirror::start(
        nowhere,
        Some(redis.clone()),
        MirrorOptions {
            buffer_bytes: 1 << 20,
            batch_items: 10,
            writers: 1,
            linger: qbridge::config::DEFAULT_MIRROR_LINGER,
            payload_limit: 1 << 20,
        },
    );
    mirror
        .mirror(
            Arc::clone(&route),
            vec![Bytes::from(r#"{"id":"parked-1"}"#)],
            Instant::now(),
        )
        .await
        .unwrap();
    drop(mirror);
    while writers.join_next().await.is_some() {}

    // Repair: a mirror copy Redis lost is pushed back, with its marker.
    let lost = producer
        .enqueue(&name, vec![Bytes::from(r#"{"id":"lost-1"}"#)])
        .await
        .unwrap();
    assert_eq!(lost.pushed, 1);
    let _: i64 = ::redis::cmd("LREM")
        .arg(&list)
        .arg(0)
        .arg(r#"{"id":"lost-1"}"#)
        .query_async(&mut redis)
        .await
        .unwrap();
    // One item still waits in the list; its outbox row's token names the
    // paid marker.
    let mut tx = pool.begin().await.unwrap();
    let pending = producer
        .enqueue_in(&mut tx, &name, vec![Bytes::from(r#"{"id":"waiting-1"}"#)])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let token: uuid::Uuid =
        sqlx::query_scalar("SELECT token FROM qbridge.redis_outbox WHERE queue = $1")
            .bind(&name)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(pending.push(&producer).await.unwrap().pushed, 1);
    let since = chrono::Utc::now() - chrono::Duration::minutes(5);
    let held = redis_view::read(&mut redis, &pool, &route).await.unwrap();
    // Deleted by hand, so qbridge has no evidence of the loss: the
    // operator's decision pushes it back.
    let assume = repair::Assumption {
        keys: vec!["lost-1".into()],
        by: "keys-test".into(),
        reason: "deleted by the test with LREM".into(),
        ..repair::Assumption::default()
    };
    let repaired = repair::repair_with(
        &pool,
        &mut redis,
        repair::RepairInput {
            route: &route,
            phase: Phase::DualWrite,
            since,
            held: &held,
            payload_limit: 1 << 20,
            assume: Some(&assume),
        },
    )
    .await
    .unwrap();
    assert_eq!(repaired.repushed, 1, "{repaired:?}");
    // Lost again before the consumer ran it: the marker (read by repair
    // itself) keeps a second repair from pushing it twice.
    let _: i64 = ::redis::cmd("LREM")
        .arg(&list)
        .arg(0)
        .arg(r#"{"id":"lost-1"}"#)
        .query_async(&mut redis)
        .await
        .unwrap();
    let again = redis_view::read(&mut redis, &pool, &route).await.unwrap();
    let second = repair::repair_with(
        &pool,
        &mut redis,
        repair::RepairInput {
            route: &route,
            phase: Phase::DualWrite,
            since,
            held: &again,
            payload_limit: 1 << 20,
            assume: Some(&assume),
        },
    )
    .await
    .unwrap();
    assert_eq!(
        (second.repushed, second.already_repushed),
        (0, 1),
        "{second:?}"
    );

    // Everything the writers made, by name.
    let written = keys_holding(&mut redis, &name).await;
    let expected = [
        route_keys.gap(),
        route_keys.dead(),
        route_keys.ran(),
        // The claim of the item slot 0 still holds.
        route_keys.running(),
        route_keys.repushed("lost-1"),
        route_keys.epoch(),
        consumer_keys.processing(0),
        consumer_keys.inflight(0),
    ];
    for key in &expected {
        assert!(written.contains(key), "{key} missing from {written:?}");
    }
    assert_eq!(
        written.len(),
        expected.len(),
        "unexpected keys: {written:?}"
    );

    // The outbox's paid marker (only the outbox reads it) expires.
    let ttl: i64 = ::redis::cmd("TTL")
        .arg(keys::paid(&token))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(ttl > 0, "the paid marker exists and expires: {ttl}");

    // The diff's view of Redis finds every item they hold, keyed.
    let view = redis_view::read(&mut redis, &pool, &route).await.unwrap();
    let waiting: Vec<&str> = view.waiting.iter().map(|h| h.key.as_str()).collect();
    let processing: Vec<&str> = view.processing.iter().map(|h| h.key.as_str()).collect();
    assert_eq!(waiting, ["waiting-1"]);
    assert_eq!(processing, ["slow-1"]);
    assert_eq!(view.parked, 1);
    // The consumer's ran set (written with the dead item) is what the diff
    // and repair read as "ran on Redis".
    assert!(!view.ran.is_empty(), "the view reads the ran set");

    // A consumer that acknowledged decommissioned (the consumer's own
    // writer): decommission reads it as idle and deletes it with the rest.
    heartbeat::write(&mut redis, &consumer_keys, Phase::Decommissioned, 0)
        .await
        .unwrap();

    // Decommission archives them all and leaves no key of the route.
    let archived = decommission::archive_and_delete(&pool, &mut redis, &route, 1 << 20)
        .await
        .unwrap();
    assert_eq!(archived.dead, 1, "{archived:?}");
    assert_eq!(archived.consumers_acknowledged, [format!("c{id}")]);
    // slow-1 and waiting-1, each archived once; parked-1 as the mirror
    // copy it is (Redis had it).
    assert_eq!(archived.enqueued + archived.duplicates, 2, "{archived:?}");
    assert_eq!(
        archived.parked.mirrored + archived.parked.known,
        1,
        "{archived:?}"
    );
    let left = keys_holding(&mut redis, &name).await;
    assert!(left.is_empty(), "decommission left {left:?}");
    let _: i64 = ::redis::cmd("DEL")
        .arg(&list)
        .query_async(&mut redis)
        .await
        .unwrap();
    stop_watch.cancel();
}
