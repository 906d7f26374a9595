//! `POST /v1/queues/{queue}/jobs` and `POST /v1/outcomes` over a real socket:
//! plain queues take jobs as live copies, routed queues follow their phase,
//! bad input is a 400 with a one-line JSON error and stores nothing.

use ::redis::AsyncCommands;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;

use qbridge::http::{router, AppState};
use qbridge::ingest::Via;
use qbridge::model::Phase;

use crate::producer::route_table;
use crate::support;

async fn serve(state: AppState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router(state)).await;
    });
    format!("http://{addr}")
}

async fn app(pool: &PgPool, phase: Phase) -> (String, String) {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let (routes, key) = route_table("json:/id", phase);
    let producer = crate::producer::producer(pool, &routes)
        .await
        .with_via(Via::Http);
    let mut state = AppState::new(pool.clone(), prometheus);
    state.producer = Some(producer);
    state.max_body = 64 * 1024;
    (serve(state).await, key)
}

async fn post(url: &str, body: impl Into<reqwest::Body>) -> (StatusCode, Value) {
    let resp = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn plain_queues_take_one_job_or_a_batch(pool: PgPool) {
    let (base, _) = app(&pool, Phase::DualWrite).await;
    let (status, body) = post(
        &format!("{base}/v1/queues/emails/jobs"),
        json!({"payload": {"to": "a"}, "key": "k1", "priority": 3}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["jobs"][0]["duplicate"], false);
    let (status, body) = post(
        &format!("{base}/v1/queues/emails/jobs"),
        json!({"jobs": [{"payload": 1, "key": "k1"}, {"payload": 2}]}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["jobs"][0]["duplicate"], true);
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.jobs WHERE queue = 'emails' AND copy = 'live'"
        )
        .await,
        2
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn routed_queues_follow_the_phase(pool: PgPool) {
    let (base, key) = app(&pool, Phase::DualWrite).await;
    let (status, body) = post(
        &format!("{base}/v1/queues/q/jobs"),
        json!([{"payload": {"id": "h1"}}, {"payload": {"id": "h2"}}]).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        (body["phase"].as_str(), body["pushed"].as_u64()),
        (Some("dual_write"), Some(2))
    );
    assert_eq!(body["jobs"][1]["key"], "h2");
    let mut redis = ::redis::Client::open("redis://127.0.0.1:6379")
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let items: Vec<String> = redis.lrange(&key, 0, -1).await.unwrap();
    assert_eq!(items, vec![r#"{"id":"h2"}"#, r#"{"id":"h1"}"#]);
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.jobs WHERE queue = 'q' AND copy = 'mirror'"
        )
        .await,
        2
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn bad_requests_are_one_line_errors_and_store_nothing(pool: PgPool) {
    let (base, _) = app(&pool, Phase::PostgresOnly).await;
    let cases = [
        ("emails", "not json".to_string(), StatusCode::BAD_REQUEST),
        (
            "emails",
            json!({"payload": 1, "bogus": 2}).to_string(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "emails",
            json!([{"payload": 1}, {"key": "no payload"}]).to_string(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "emails",
            json!({"payload": 1, "run_at": "tomorrow"}).to_string(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "bad;name",
            json!({"payload": 1}).to_string(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "q",
            json!({"payload": {"id": 1}, "key": "x"}).to_string(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "q",
            json!({"item_b64": "***"}).to_string(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "emails",
            json!({"payload": "x".repeat(70_000)}).to_string(),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
    ];
    for (queue, body, expected) in cases {
        let (status, reply) = post(&format!("{base}/v1/queues/{queue}/jobs"), body).await;
        assert_eq!(status, expected, "{queue}: {reply}");
        let error = reply["error"].as_str().unwrap_or_default();
        assert!(!error.is_empty() && !error.contains('\n'), "{reply}");
    }
    assert_eq!(support::jobs(&pool).await, 0);
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn outside_workers_report_outcomes(pool: PgPool) {
    let (base, _) = app(&pool, Phase::Shadow).await;
    let (status, body) = post(
        &format!("{base}/v1/outcomes"),
        json!([{"queue": "q", "key": "jid-1", "outcome": "ok", "detail": "secret response"},
               {"queue": "q", "key": "jid-2", "outcome": "dead"}])
        .to_string(),
    )
    .await;
    assert_eq!(
        (status, body["recorded"].as_u64()),
        (StatusCode::CREATED, Some(2)),
        "{body}"
    );
    let (status, body) = post(
        &format!("{base}/v1/outcomes"),
        json!({"queue": "q", "key": "jid-3", "outcome": "maybe"}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let rows: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT key, outcome, digest FROM qbridge.outcomes ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!((rows[0].1.as_str(), rows[1].1.as_str()), ("ok", "dead"));
    // The detail is digested, never stored.
    assert_eq!(rows[0].2.as_ref().map(String::len), Some(64));
}
