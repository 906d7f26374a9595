//! A route's Postgres pool inside `qbridge run`: live copies run the handler
//! and their outcomes are recorded (side `postgres`, with the response
//! digest) for the shadow comparison; mirror copies are drained without a
//! call and without an outcome.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use qbridge::app::Runtime;
use qbridge::config::{Config, Overrides};
use qbridge::model::Phase;
use qbridge::routes::Routes;
use qbridge::shadow::digest_hex;

use crate::support;

/// key, side, mode, outcome, digest, attempt
type OutcomeRow = (String, String, String, String, Option<String>, Option<i32>);

/// An HTTP handler answering "sent" and counting its calls.
async fn handler() -> (String, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let app = axum::Router::new().route(
        "/run",
        axum::routing::post(move || {
            let counted = Arc::clone(&counted);
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                "sent"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/run"), calls)
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn live_copies_run_and_are_recorded_mirror_copies_are_not(pool: PgPool) {
    let (url, calls) = handler().await;
    let key = format!("qbt:{}:list", uuid::Uuid::new_v4());
    let toml = format!(
        "max_connections = 4\n[[routes]]\nname = \"r\"\nredis_key = \"{key}\"\nqueue = \"q\"\n\
         format = \"json:/id\"\nphase = \"dual_write\"\n\
         handler = {{ type = \"http\", url = \"{url}\" }}\npool = {{ poll_interval = \"100ms\" }}\n"
    );
    let overrides = Overrides {
        database_url: Some(support::db_url(&pool)),
        ..Overrides::default()
    };
    let config = Config::from_toml(&toml, &overrides).expect("config");
    let routes = Routes::from_config(&config.routes);
    let producer = crate::producer::producer(&pool, &routes).await;
    // Two mirror copies (their live run is Redis's), then two live ones.
    producer
        .enqueue(
            "r",
            vec![
                Bytes::from_static(br#"{"id":"m1"}"#),
                Bytes::from_static(br#"{"id":"m2"}"#),
            ],
        )
        .await
        .unwrap();
    routes.phases().set("r", Phase::PostgresOnly);
    producer
        .enqueue(
            "r",
            vec![
                Bytes::from_static(br#"{"id":"l1"}"#),
                Bytes::from_static(br#"{"id":"l2"}"#),
            ],
        )
        .await
        .unwrap();

    let mut rt = Runtime::build(config).await.expect("runtime builds");
    rt.serve_http = false;
    rt.gauge_interval = Duration::from_secs(3600);
    let stop = CancellationToken::new();
    let token = stop.clone();
    let run = tokio::spawn(async move { rt.run_until_stopped(token).await.expect("runtime run") });
    support::wait_for_count(
        &pool,
        "all four jobs finished",
        "SELECT 4 - count(*) FROM qbridge.jobs",
        4,
    )
    .await;
    stop.cancel();
    run.await.unwrap();

    assert_eq!(calls.load(Ordering::SeqCst), 2, "only the live copies ran");
    let rows: Vec<OutcomeRow> = sqlx::query_as(
        "SELECT key, side, mode, outcome, digest, attempt FROM qbridge.outcomes ORDER BY key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let sent = digest_hex(b"sent");
    let expected: Vec<_> = ["l1", "l2"]
        .iter()
        .map(|k| {
            (
                k.to_string(),
                "postgres".into(),
                "live".into(),
                "ok".into(),
                Some(sent.clone()),
                Some(1),
            )
        })
        .collect();
    assert_eq!(rows, expected);
    let _: () = ::redis::AsyncCommands::del(
        &mut ::redis::Client::open("redis://127.0.0.1:6379")
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap(),
        &key,
    )
    .await
    .unwrap();
}
