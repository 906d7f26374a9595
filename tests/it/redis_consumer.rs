//! The Redis consumer on the shared Redis (a random key prefix per test) and
//! the test's own database: reliable pop and ack, retries into the dead
//! list, recovery after a crash, pop-side key numbering that matches the
//! push side, and the phases it runs in.

use std::sync::Arc;
use std::time::Duration;

use ::redis::AsyncCommands;
use bytes::Bytes;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use qbridge::config::{HandlerConfig, PushEnd, RedisConsumerConfig, RouteConfig};
use qbridge::cutover::Phase;
use qbridge::queue::JobCopy;
use qbridge::redis::consumer::{ConsumerOptions, ConsumerReport, RedisConsumer};
use qbridge::redis::formats::decode_bytes;
use qbridge::redis::routes::{Route, Routes};
use qbridge::redis::store::{self, Item, Via};
use qbridge::shadow::{OutcomeRecorder, RecorderOptions};
use qbridge::worker::Handler;

use crate::support::{self, sh, wait_for, wait_for_count};

const REDIS: &str = "redis://127.0.0.1:6379";

async fn redis() -> ::redis::aio::MultiplexedConnection {
    ::redis::Client::open(REDIS)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("shared Redis on 6379")
}

/// One route on fresh random Redis keys, with its consumer's settings.
struct Fixture {
    routes: Routes,
    route: Arc<Route>,
    /// The route's source list.
    list: String,
    /// Prefix of every key the consumer owns.
    name: String,
    consumer: String,
}

impl Fixture {
    fn new(
        format: &str,
        phase: Phase,
        push: PushEnd,
        handler: HandlerConfig,
        concurrency: usize,
        max_attempts: u32,
    ) -> Fixture {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let name = format!("rc-{id}");
        let list = format!("qbt:{id}:list");
        let consumer = format!("c-{}", &id[..8]);
        let cfg = RouteConfig {
            name: name.clone(),
            redis_key: list.clone(),
            queue: "q".into(),
            format: format.parse().expect("format"),
            phase,
            push,
            dedup_window: Duration::from_secs(3600),
            max_attempts: None,
            handler: Some(handler),
            redis_consumer: Some(RedisConsumerConfig {
                concurrency,
                max_attempts,
                retry_delay: Duration::from_millis(20),
                consumer_name: consumer.clone(),
            }),
        };
        let routes = Routes::from_config(&[cfg]);
        let route = Arc::clone(routes.by_name(&name).expect("route"));
        Fixture {
            routes,
            route,
            list,
            name,
            consumer,
        }
    }

    fn processing(&self, n: usize) -> String {
        format!("qbridge:processing:{}:{}:{n}", self.name, self.consumer)
    }

    fn dead(&self) -> String {
        format!("qbridge:dead:{}", self.name)
    }

    async fn consumer(&self, pool: &PgPool, url: &str) -> qbridge::Result<RedisConsumer> {
        let handler = Handler::from_config(self.route.config.handler.as_ref().expect("handler"))
            .expect("handler");
        let (recorder, _writer) = OutcomeRecorder::spawn(
            pool.clone(),
            RecorderOptions::default(),
            CancellationToken::new(),
        );
        let c = RedisConsumer::new(
            Arc::clone(&self.route),
            self.routes.clone(),
            url,
            pool.clone(),
            handler,
            recorder,
        )
        .await?;
        Ok(c.with_options(ConsumerOptions {
            block: Duration::from_millis(200),
            drain: Duration::from_secs(5),
            reconnect_delay: Duration::from_millis(100),
            phase_poll: Duration::from_millis(50),
        }))
    }

    async fn start(&self, pool: &PgPool) -> Running {
        let consumer = self.consumer(pool, REDIS).await.expect("consumer starts");
        Running::start(consumer)
    }

    /// Every key this test's consumer left (source, processing, inflight, dead).
    async fn leftovers(&self) -> Vec<String> {
        let mut keys: Vec<String> = redis()
            .await
            .keys(format!("qbridge:*:{}*", self.name))
            .await
            .unwrap();
        if redis().await.exists::<_, bool>(&self.list).await.unwrap() {
            keys.push(self.list.clone());
        }
        keys.sort();
        keys
    }

    async fn cleanup(&self) {
        let mut keys = self.leftovers().await;
        keys.push(self.list.clone());
        let _: i64 = redis().await.del(keys).await.unwrap();
    }

    /// The client names of this consumer's open connections.
    async fn connections(&self) -> usize {
        let list: String = ::redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut redis().await)
            .await
            .unwrap();
        list.lines()
            .filter(|l| l.contains(&format!("name=qbridge-consumer:{}:", self.name)))
            .count()
    }
}

struct Running {
    token: CancellationToken,
    task: JoinHandle<ConsumerReport>,
}

impl Running {
    fn start(consumer: RedisConsumer) -> Running {
        let token = CancellationToken::new();
        let task = tokio::spawn(consumer.run(token.clone()));
        Running { token, task }
    }

    async fn stop(self) -> ConsumerReport {
        self.token.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("consumer stops")
            .expect("consumer task")
    }
}

async fn outcomes(pool: &PgPool) -> Vec<(String, String, Option<String>, i32)> {
    sqlx::query_as(
        "SELECT key, outcome, error_class, attempt FROM qbridge.outcomes
          WHERE side = 'redis' AND mode = 'live' ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

fn marker_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn pushed_items_are_run_acked_and_recorded_in_push_order(pool: PgPool) {
    let dir = marker_dir();
    let seen = dir.path().join("seen");
    let handler = sh(
        r#"echo "$QBRIDGE_JOB_KEY" >> "$1""#,
        &[seen.to_str().unwrap()],
    );
    let fx = Fixture::new("json:/id", Phase::Shadow, PushEnd::Lpush, handler, 1, 3);
    for i in 0..5 {
        let _: i64 = redis()
            .await
            .lpush(&fx.list, format!(r#"{{"id":"job-{i}"}}"#))
            .await
            .unwrap();
    }
    let running = fx.start(&pool).await;
    wait_for_count(
        &pool,
        "5 ok outcomes",
        "SELECT count(*) FROM qbridge.outcomes WHERE outcome = 'ok'",
        5,
    )
    .await;
    let report = running.stop().await;
    assert_eq!(
        (report.ok, report.failed, report.dead, report.recovered),
        (5, 0, 0, 0)
    );

    let want: Vec<String> = (0..5).map(|i| format!("job-{i}")).collect();
    // LPUSH producers: the consumer pops the right end, oldest first.
    let ran: Vec<String> = std::fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(ran, want);
    let got = outcomes(&pool).await;
    let keys: Vec<&str> = got.iter().map(|o| o.0.as_str()).collect();
    assert_eq!(keys, want);
    assert!(
        got.iter().all(|o| o.1 == "ok" && o.2.is_none() && o.3 == 1),
        "{got:?}"
    );
    // Source, processing list and inflight state are all gone.
    assert_eq!(fx.leftovers().await, Vec::<String>::new());
    fx.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn rpush_routes_are_popped_from_the_left(pool: PgPool) {
    let dir = marker_dir();
    let seen = dir.path().join("seen");
    let handler = sh(
        r#"echo "$QBRIDGE_JOB_KEY" >> "$1""#,
        &[seen.to_str().unwrap()],
    );
    let fx = Fixture::new("rq", Phase::DualWrite, PushEnd::Rpush, handler, 1, 3);
    let _: i64 = redis()
        .await
        .rpush(&fx.list, &["a", "b", "c"])
        .await
        .unwrap();
    let running = fx.start(&pool).await;
    wait_for_count(
        &pool,
        "3 outcomes",
        "SELECT count(*) FROM qbridge.outcomes",
        3,
    )
    .await;
    running.stop().await;
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "a\nb\nc\n");
    fx.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_failing_item_is_retried_then_moved_to_the_dead_list(pool: PgPool) {
    let fx = Fixture::new(
        "json:/id",
        Phase::Shadow,
        PushEnd::Lpush,
        sh("echo oops >&2; exit 3", &[]),
        2,
        3,
    );
    let item = r#"{"id":"bad-1", "x": [1, 2]}"#;
    let _: i64 = redis().await.lpush(&fx.list, item).await.unwrap();
    let running = fx.start(&pool).await;
    wait_for_count(
        &pool,
        "a dead outcome",
        "SELECT count(*) FROM qbridge.outcomes WHERE outcome = 'dead'",
        1,
    )
    .await;
    let report = running.stop().await;
    assert_eq!((report.ok, report.failed, report.dead), (0, 2, 1));

    let got = outcomes(&pool).await;
    let class = Some("exit_code".to_string());
    assert_eq!(
        got,
        vec![
            ("bad-1".into(), "failed".into(), class.clone(), 1),
            ("bad-1".into(), "failed".into(), class.clone(), 2),
            ("bad-1".into(), "dead".into(), class, 3),
        ]
    );
    // The dead list holds the item byte for byte; nothing else is left.
    let dead: Vec<Vec<u8>> = redis().await.lrange(fx.dead(), 0, -1).await.unwrap();
    assert_eq!(dead, vec![item.as_bytes().to_vec()]);
    assert_eq!(fx.leftovers().await, vec![fx.dead()]);
    fx.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_permanent_failure_goes_dead_at_once(pool: PgPool) {
    let mut handler = sh("exit 4", &[]);
    if let HandlerConfig::Command {
        permanent_exit_codes,
        ..
    } = &mut handler
    {
        permanent_exit_codes.push(4);
    }
    let fx = Fixture::new("sidekiq", Phase::Shadow, PushEnd::Lpush, handler, 1, 5);
    let _: i64 = redis()
        .await
        .lpush(&fx.list, r#"{"jid":"j1","class":"C","args":[]}"#)
        .await
        .unwrap();
    let running = fx.start(&pool).await;
    wait_for_count(
        &pool,
        "a dead outcome",
        "SELECT count(*) FROM qbridge.outcomes WHERE outcome = 'dead'",
        1,
    )
    .await;
    running.stop().await;
    assert_eq!(
        outcomes(&pool).await,
        vec![("j1".into(), "dead".into(), Some("exit_code".into()), 1)]
    );
    assert_eq!(redis().await.llen::<_, i64>(fx.dead()).await.unwrap(), 1);
    fx.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_consumer_killed_mid_job_recovers_the_item_at_restart(pool: PgPool) {
    let dir = marker_dir();
    let started = dir.path().join("started");
    // First run: mark and hang (the crash comes mid-job); later runs succeed.
    let script = r#"if [ -e "$1" ]; then exit 0; fi; touch "$1"; sleep 60"#;
    let fx = Fixture::new(
        "raw",
        Phase::Shadow,
        PushEnd::Lpush,
        sh(script, &[started.to_str().unwrap()]),
        2,
        3,
    );
    let _: i64 = redis()
        .await
        .lpush(&fx.list, b"\xffpayload".as_slice())
        .await
        .unwrap();

    let first = fx.start(&pool).await;
    wait_for("the handler to start", Duration::from_secs(10), || async {
        started.exists()
    })
    .await;
    first.task.abort();
    assert!(first.task.await.unwrap_err().is_cancelled());

    // The item is in one processing list, not in the source list.
    let mut held = 0;
    for n in 0..2 {
        held += redis()
            .await
            .llen::<_, i64>(fx.processing(n))
            .await
            .unwrap();
    }
    assert_eq!(
        (held, redis().await.llen::<_, i64>(&fx.list).await.unwrap()),
        (1, 0)
    );
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.outcomes").await,
        0
    );

    // Same consumer name: it finds the item and runs it again, as attempt 2
    // and under the same key.
    let second = fx.start(&pool).await;
    wait_for_count(
        &pool,
        "the recovered item's outcome",
        "SELECT count(*) FROM qbridge.outcomes",
        1,
    )
    .await;
    let report = second.stop().await;
    assert_eq!((report.recovered, report.ok), (1, 1));
    let got = outcomes(&pool).await;
    assert_eq!((got[0].1.as_str(), got[0].3), ("ok", 2), "{got:?}");
    let key: String = sqlx::query_scalar("SELECT key FROM qbridge.outcomes")
        .fetch_one(&pool)
        .await
        .unwrap();
    let pops: i64 = sqlx::query_scalar("SELECT n FROM qbridge.key_occurrences WHERE side = 'pop'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        key.ends_with(":1") && pops == 1,
        "numbered once: {key}, {pops} pops"
    );
    assert_eq!(fx.leftovers().await, Vec::<String>::new());
    fx.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn lists_of_a_former_larger_concurrency_are_recovered(pool: PgPool) {
    let fx = Fixture::new(
        "json:/id",
        Phase::Shadow,
        PushEnd::Lpush,
        sh("exit 0", &[]),
        1,
        3,
    );
    // Left by a run with four slots.
    let _: i64 = redis()
        .await
        .lpush(fx.processing(3), r#"{"id":"orphan"}"#)
        .await
        .unwrap();
    let running = fx.start(&pool).await;
    wait_for_count(
        &pool,
        "the orphan's outcome",
        "SELECT count(*) FROM qbridge.outcomes",
        1,
    )
    .await;
    let report = running.stop().await;
    assert_eq!(report.recovered, 1);
    assert_eq!(outcomes(&pool).await[0].0, "orphan");
    assert_eq!(fx.leftovers().await, Vec::<String>::new());
    fx.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn identical_items_get_the_keys_the_push_side_gave_them(pool: PgPool) {
    let fx = Fixture::new(
        "raw",
        Phase::DualWrite,
        PushEnd::Lpush,
        sh("exit 0", &[]),
        2,
        3,
    );
    let bytes = Bytes::from_static(b"same bytes \x00\xfe");
    let other = Bytes::from_static(b"other bytes");
    let items = [bytes.clone(), bytes.clone(), other.clone()];
    let mut tx = pool.begin().await.unwrap();
    let stored = store::store(
        &mut tx,
        items
            .iter()
            .map(|b| Item {
                route: &fx.route,
                decoded: decode_bytes(&fx.route.format, b.clone()),
                copy: JobCopy::Mirror,
                via: Via::Producer,
            })
            .collect(),
        support::LIMIT,
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let mut pushed: Vec<String> = stored.iter().map(|s| s.key().to_string()).collect();
    pushed.sort();
    assert_ne!(pushed[0], pushed[1]);
    for b in &items {
        let _: i64 = redis().await.lpush(&fx.list, b.as_ref()).await.unwrap();
    }

    let running = fx.start(&pool).await;
    wait_for_count(
        &pool,
        "3 outcomes",
        "SELECT count(*) FROM qbridge.outcomes WHERE outcome = 'ok'",
        3,
    )
    .await;
    running.stop().await;
    let mut popped: Vec<String> = outcomes(&pool).await.into_iter().map(|o| o.0).collect();
    popped.sort();
    assert_eq!(popped, pushed);
    fx.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn redis_only_leaves_content_hash_keys_unnumbered(pool: PgPool) {
    let fx = Fixture::new(
        "resque",
        Phase::RedisOnly,
        PushEnd::Rpush,
        sh("exit 0", &[]),
        1,
        3,
    );
    let _: i64 = redis()
        .await
        .rpush(&fx.list, r#"{"class":"Mail","args":[1]}"#)
        .await
        .unwrap();
    let running = fx.start(&pool).await;
    wait_for_count(
        &pool,
        "an outcome",
        "SELECT count(*) FROM qbridge.outcomes",
        1,
    )
    .await;
    running.stop().await;
    let key = &outcomes(&pool).await[0].0;
    assert!(key.starts_with("sha256:") && key.ends_with(":0"), "{key}");
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.key_occurrences").await,
        0
    );
    fx.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn decommissioned_opens_no_connection_until_the_phase_changes(pool: PgPool) {
    let fx = Fixture::new(
        "json:/id",
        Phase::Decommissioned,
        PushEnd::Lpush,
        sh("exit 0", &[]),
        2,
        3,
    );
    // No connection at construction: an unreachable Redis is no error then.
    let offline = fx.consumer(&pool, "redis://:s3cret@127.0.0.1:1").await;
    assert!(offline.is_ok());
    let offline_report = Running::start(offline.unwrap());

    let _: i64 = redis()
        .await
        .lpush(&fx.list, r#"{"id":"kept"}"#)
        .await
        .unwrap();
    let running = fx.start(&pool).await;
    // Proving an absence takes some time: a dozen phase polls.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(fx.connections().await, 0);
    assert_eq!(redis().await.llen::<_, i64>(&fx.list).await.unwrap(), 1);
    let report = offline_report.stop().await;
    assert!(!report.connected && report.redis_errors == 0, "{report:?}");

    // Not vacuous: once the route is live again the same consumer drains it...
    fx.routes.phases().set(&fx.name, Phase::Shadow);
    wait_for_count(
        &pool,
        "the item's outcome",
        "SELECT count(*) FROM qbridge.outcomes",
        1,
    )
    .await;
    assert_eq!(fx.connections().await, 2);
    // ...and decommissioning closes its connections.
    fx.routes.phases().set(&fx.name, Phase::Decommissioned);
    wait_for("connections to close", Duration::from_secs(10), || async {
        fx.connections().await == 0
    })
    .await;
    let report = running.stop().await;
    assert!(report.connected && report.ok == 1, "{report:?}");
    fx.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_unreachable_redis_is_a_clear_error_at_start(pool: PgPool) {
    let fx = Fixture::new(
        "json:/id",
        Phase::Shadow,
        PushEnd::Lpush,
        sh("exit 0", &[]),
        1,
        3,
    );
    let err = match fx.consumer(&pool, "redis://:s3cret@127.0.0.1:1").await {
        Ok(_) => panic!("connected to nothing"),
        Err(e) => e.to_string(),
    };
    assert!(err.starts_with("cannot connect to Redis at"), "{err}");
    assert!(!err.contains("s3cret") && !err.contains('\n'), "{err}");
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn postgres_only_keeps_draining(pool: PgPool) {
    let fx = Fixture::new(
        "json:/id",
        Phase::PostgresOnly,
        PushEnd::Lpush,
        sh("exit 0", &[]),
        2,
        3,
    );
    for i in 0..3 {
        let _: i64 = redis()
            .await
            .lpush(&fx.list, format!(r#"{{"id":"left-{i}"}}"#))
            .await
            .unwrap();
    }
    let running = fx.start(&pool).await;
    wait_for_count(
        &pool,
        "3 outcomes",
        "SELECT count(*) FROM qbridge.outcomes WHERE outcome = 'ok'",
        3,
    )
    .await;
    running.stop().await;
    assert_eq!(fx.leftovers().await, Vec::<String>::new());
    fx.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn shutdown_finishes_the_item_in_hand_within_the_drain_deadline(pool: PgPool) {
    let dir = marker_dir();
    let started = dir.path().join("started");
    let script = r#"touch "$1"; sleep 0.5"#;
    let fx = Fixture::new(
        "json:/id",
        Phase::Shadow,
        PushEnd::Lpush,
        sh(script, &[started.to_str().unwrap()]),
        1,
        3,
    );
    let _: i64 = redis()
        .await
        .lpush(&fx.list, r#"{"id":"a"}"#)
        .await
        .unwrap();
    let _: i64 = redis()
        .await
        .lpush(&fx.list, r#"{"id":"b"}"#)
        .await
        .unwrap();
    let running = fx.start(&pool).await;
    wait_for("the handler to start", Duration::from_secs(10), || async {
        started.exists()
    })
    .await;
    let report = running.stop().await;
    // The item in hand finished; the next one was never popped.
    assert_eq!(report.ok, 1);
    let left: Vec<String> = redis().await.lrange(&fx.list, 0, -1).await.unwrap();
    assert_eq!(left, vec![r#"{"id":"b"}"#.to_string()]);
    assert_eq!(
        redis()
            .await
            .llen::<_, i64>(fx.processing(0))
            .await
            .unwrap(),
        0
    );
    fx.cleanup().await;
}
