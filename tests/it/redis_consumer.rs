//! The Redis consumer on the shared Redis (a random key prefix per test) and
//! the test's own database: reliable pop and ack, retries into the dead
//! list, recovery after a crash, pop-side key numbering that matches the
//! push side, and the phases it runs in.

use std::sync::Arc;
use std::time::Duration;

use ::redis::AsyncCommands;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use qbridge::config::{HandlerConfig, PushEnd, RedisConsumerConfig, RouteConfig};
use qbridge::handler::Handler;
use qbridge::model::Phase;
use qbridge::redis::consumer::{ConsumerOptions, ConsumerReport, RedisConsumer};
use qbridge::routes::{Route, Routes};
use qbridge::shadow::{OutcomeRecorder, RecorderOptions};

use crate::support::{sh, wait_for_count};

mod celery_priorities;
mod decommission;
mod phases;
mod ran_on_record;
mod recovery;

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
            db: 0,
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
            redis_side: qbridge::config::RedisSideKind::Qbridge,
            keys: Default::default(),
            cutover: Default::default(),
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

    /// The route's ran set: the keys the consumer finished, kept on purpose
    /// (ARCHITECTURE.md, "Durable outcomes").
    fn ran(&self) -> String {
        format!("qbridge:ran:{}", self.name)
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
            &Default::default(),
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

    /// Waits (10 s at most) until the list and the first slot's processing
    /// list are empty: every item pushed was run or dropped.
    async fn wait_handled(&self, what: &str) {
        crate::support::wait_for(what, Duration::from_secs(10), || async {
            redis().await.llen::<_, i64>(&self.list).await.unwrap() == 0
                && redis()
                    .await
                    .llen::<_, i64>(self.processing(0))
                    .await
                    .unwrap()
                    == 0
        })
        .await;
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
    // Source, processing list and inflight state are all gone; the ran set
    // remembers the jobs.
    assert_eq!(fx.leftovers().await, vec![fx.ran()]);
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
    // The dead list holds the item byte for byte; the ran set remembers
    // it ran; nothing else is left.
    let dead: Vec<Vec<u8>> = redis().await.lrange(fx.dead(), 0, -1).await.unwrap();
    assert_eq!(dead, vec![item.as_bytes().to_vec()]);
    assert_eq!(fx.leftovers().await, vec![fx.dead(), fx.ran()]);
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

/// Two consumers under one name would share — and each recover — one set
/// of processing lists. The second refuses to start, in one line, while
/// the first beats; a heartbeat nobody renews (this consumer's own run,
/// killed before it could delete it) does not stop it, after two beats.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_consumer_name_in_use_is_refused_and_a_stale_heartbeat_is_not(pool: PgPool) {
    let fx = Fixture::new(
        "json:/id",
        Phase::DualWrite,
        PushEnd::Lpush,
        sh("true", &[]),
        1,
        3,
    );
    let heartbeat = format!("qbridge:consumer:{}:{}", fx.name, fx.consumer);
    let running = fx.start(&pool).await;
    crate::support::wait_for("the first heartbeat", Duration::from_secs(10), || async {
        redis().await.exists::<_, bool>(&heartbeat).await.unwrap()
    })
    .await;
    let refused = fx.consumer(&pool, REDIS).await.err().expect("refused");
    let line = refused.to_string();
    assert!(
        line.contains("in use by another running consumer"),
        "{line}"
    );
    assert!(!line.contains('\n'), "{line}");
    running.stop().await;

    let _: () = ::redis::pipe()
        .hset_multiple(
            &heartbeat,
            &[("phase", "dual_write"), ("holding", "0"), ("at", "1")],
        )
        .pexpire(&heartbeat, 10_000)
        .query_async(&mut redis().await)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    fx.consumer(&pool, REDIS)
        .await
        .expect("a stale heartbeat is not a running consumer");
    assert!(started.elapsed() >= Duration::from_secs(2));
}
