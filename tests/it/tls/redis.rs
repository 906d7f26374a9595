//! Redis over `rediss://` with a private CA (a throwaway redis-server that
//! speaks only TLS): the producer API pushes and the Redis consumer pops and
//! runs through the redis crate's rustls, the proxy splices clients to a TLS
//! upstream and still mirrors their pushes, and a CA that did not sign the
//! server's certificate is a one-line error naming the URL without its
//! password. A survey reads over TLS and its draft config keeps the CA.

use std::sync::Arc;
use std::time::Duration;

use ::redis::AsyncCommands;
use bytes::Bytes;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use qbridge::config::tls::RedisTls;
use qbridge::config::{Config, Overrides};
use qbridge::handler::Handler;
use qbridge::mirror::{Mirror, MirrorOptions};
use qbridge::model::Phase;
use qbridge::proxy::{ProxyDeps, ProxyServer};
use qbridge::redis::connect::connect_redis_with;
use qbridge::redis::consumer::RedisConsumer;
use qbridge::redis::producer::Producer;
use qbridge::routes::Routes;
use qbridge::shadow::{OutcomeRecorder, RecorderOptions};

use super::certs::Certs;
use crate::proxy::harness;
use crate::servers::ThrowawayRedis;
use crate::support;

/// A route `r` on list `jobs` → queue `q`, with a noop handler and a
/// Redis consumer, in `phase`.
fn routes(phase: Phase) -> Routes {
    let toml = format!(
        "[[routes]]\nname = \"r\"\nredis_key = \"jobs\"\nqueue = \"q\"\nformat = \"json:/id\"\nphase = \"{phase}\"\n\
         handler = {{ type = \"noop\" }}\n\
         redis_consumer = {{ concurrency = 1, consumer_name = \"tls\" }}\n"
    );
    let cfg = Config::from_toml(&toml, &Overrides::default()).expect("route config");
    Routes::from_config(&cfg.routes)
}

fn item(i: usize) -> Bytes {
    Bytes::from(format!(r#"{{"id":"job-{i}"}}"#))
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn producer_api_and_redis_consumer_work_over_rediss_with_the_private_ca(pool: PgPool) {
    let certs = Certs::generate();
    let redis = ThrowawayRedis::start_tls(&certs.server);
    let url = redis.url();
    assert!(url.starts_with("rediss://"));
    let tls = RedisTls::from_ca_file(&certs.server.ca).expect("CA file");
    let routes = routes(Phase::RedisOnly);

    let conn = connect_redis_with(&url, &tls)
        .await
        .expect("TLS with the private CA");
    let producer = Producer::from_parts(pool.clone(), Some(conn.clone()), routes.clone(), 1 << 20);
    for i in 0..5 {
        let done = producer.enqueue("r", vec![item(i)]).await.expect("enqueue");
        assert_eq!(done.pushed, 1);
    }
    let mut check = conn.clone();
    let listed: Vec<Vec<u8>> = check.lrange("jobs", 0, -1).await.unwrap();
    assert_eq!(listed.len(), 5, "the pushes went over TLS into the list");

    let route = Arc::clone(routes.by_name("r").expect("route"));
    let handler = Handler::from_config(route.config.handler.as_ref().expect("handler")).unwrap();
    let (recorder, _writer) = OutcomeRecorder::spawn(
        pool.clone(),
        RecorderOptions::default(),
        CancellationToken::new(),
    );
    let consumer = RedisConsumer::new(
        route,
        routes.clone(),
        &url,
        &tls,
        pool.clone(),
        handler,
        recorder,
    )
    .await
    .expect("the consumer trusts the same CA");
    let token = CancellationToken::new();
    let running = tokio::spawn(consumer.run(token.clone()));
    support::wait_for_count(
        &pool,
        "5 Redis-side outcomes",
        "SELECT count(*) FROM qbridge.outcomes WHERE side = 'redis' AND outcome = 'ok'",
        5,
    )
    .await;
    token.cancel();
    let report = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("consumer stops")
        .unwrap();
    assert_eq!(report.ok, 5);
    let left: i64 = check.llen("jobs").await.unwrap();
    assert_eq!(left, 0, "every item was popped and acked over TLS");
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_proxy_spliced_to_a_rediss_upstream_mirrors_a_push(pool: PgPool) {
    let certs = Certs::generate();
    let redis = ThrowawayRedis::start_tls(&certs.server);
    let tls = RedisTls::from_ca_file(&certs.server.ca).unwrap();
    let config = qbridge::config::ProxyConfig {
        upstream: redis.url(),
        upstream_tls: tls.clone(),
        ..harness::proxy_config()
    };
    let proxy = harness::start_with(
        &pool,
        "tls",
        vec![harness::route("jobs", "tls:jobs", Phase::DualWrite)],
        config,
    )
    .await;
    let mut client = proxy.conn().await;
    // The client speaks plain RESP to the proxy; the proxy speaks TLS on.
    assert_eq!(
        client
            .call(&["LPUSH", "tls:jobs", &harness::item("a1")])
            .await,
        b":1\r\n"
    );
    assert_eq!(client.call(&["PING"]).await, b"+PONG\r\n");
    harness::wait_for_jobs(&pool, "jobs", 1).await;
    let jobs = harness::jobs(&pool, "jobs").await;
    assert_eq!(
        jobs,
        vec![(
            "a1".to_string(),
            "mirror".to_string(),
            harness::item("a1").into_bytes()
        )]
    );
    let mut direct = connect_redis_with(&redis.url(), &tls).await.unwrap();
    let listed: Vec<String> = direct.lrange("tls:jobs", 0, -1).await.unwrap();
    assert_eq!(listed, vec![harness::item("a1")], "Redis has the push");
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_wrong_ca_is_a_one_line_error_naming_the_url_without_its_password(pool: PgPool) {
    let certs = Certs::generate();
    let redis = ThrowawayRedis::start_tls(&certs.server);
    let url = format!("rediss://:s3cret-pw@127.0.0.1:{}/0", redis.port);
    let shown = format!("rediss://:***@127.0.0.1:{}/0", redis.port);
    let wrong = RedisTls::from_ca_file(&certs.wrong_ca).unwrap();
    let check = |err: String, key: &str| {
        assert!(err.contains(&shown), "names the URL: {err}");
        assert!(
            err.contains("certificate") && err.contains(key),
            "says what to check: {err}"
        );
        assert!(!err.contains("s3cret-pw") && !err.contains('\n'), "{err}");
    };

    let Err(err) = connect_redis_with(&url, &wrong).await else {
        panic!("a certificate from another CA was accepted");
    };
    check(err.to_string(), "redis_ca_file");

    let options = MirrorOptions {
        buffer_bytes: 1 << 20,
        batch_items: 10,
        writers: 1,
        linger: qbridge::config::DEFAULT_MIRROR_LINGER,
        payload_limit: support::LIMIT,
    };
    let (mirror, _writers) = Mirror::start(pool.clone(), None, options);
    let deps = ProxyDeps {
        config: qbridge::config::ProxyConfig {
            upstream: url.clone(),
            upstream_tls: wrong,
            ..harness::proxy_config()
        },
        routes: Routes::from_config(&[]),
        mirror,
    };
    let err = ProxyServer::bind("127.0.0.1:0", deps)
        .await
        .err()
        .expect("refused");
    check(err.to_string(), "[proxy] upstream_ca_file");

    // The system's store does not know the private CA either.
    let Err(err) = connect_redis_with(&url, &RedisTls::default()).await else {
        panic!("the system's store trusted a private CA");
    };
    check(err.to_string(), "redis_ca_file");
}

#[tokio::test]
async fn a_survey_reads_over_rediss_with_the_private_ca_and_its_draft_keeps_it() {
    let certs = Certs::generate();
    let redis = ThrowawayRedis::start_tls(&certs.server);
    let tls = RedisTls::from_ca_file(&certs.server.ca).unwrap();
    let mut conn = connect_redis_with(&redis.url(), &tls).await.unwrap();
    let _: () = ::redis::pipe()
        .cmd("SADD")
        .arg("queues")
        .arg("default")
        .cmd("LPUSH")
        .arg("queue:default")
        .arg(r#"{"class":"Mail","args":[1],"jid":"0123456789abcdef01234567","queue":"default"}"#)
        .query_async(&mut conn)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tls.toml");
    std::fs::write(&config, format!("redis_ca_file = {:?}\n", certs.ca())).unwrap();
    let draft = dir.path().join("draft.toml");
    let url = format!("rediss://:s3cret-pw@127.0.0.1:{}/0", redis.port);
    let _: () = ::redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret-pw")
        .query_async(&mut conn)
        .await
        .unwrap();
    let out = support::qbridge(&[
        "survey",
        "--config",
        config.to_str().unwrap(),
        "--redis-url",
        &url,
        "--sample",
        "0s",
        "--write-config",
        draft.to_str().unwrap(),
    ])
    .await;
    assert!(out.status.success(), "{}", support::last_stderr_line(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("queue:default"), "{stdout}");
    let text = std::fs::read_to_string(&draft).unwrap();
    assert!(!text.contains("s3cret-pw"), "{text}");
    let loaded = Config::load(Some(&draft), &Overrides::default()).unwrap();
    assert_eq!(loaded.redis_tls.ca_file(), Some(certs.server.ca.as_path()));
    assert_eq!(loaded.routes[0].redis_key, "queue:default");
}
