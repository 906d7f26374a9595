//! The admin API over a real socket: the bearer token (missing, wrong, right,
//! none configured), phase changes gated and audited like the CLI's, repair
//! and dead-letter requeue on real data, enqueue behind the token when asked,
//! and — through the binary — the token never in the output. (A listener
//! beyond loopback: `scoped_tokens`.)

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use ::redis::AsyncCommands;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;

use qbridge::http::{router, AppState};
use qbridge::ingest::Via;
use qbridge::model::Phase;
use qbridge::queue::NewJob;
use qbridge::secret::Secret;

use crate::producer::route_table;
use crate::support;

const TOKEN: &str = "admin-token-4f1c9a0e7b2d";
/// Same length as [`TOKEN`], last character different.
const WRONG: &str = "admin-token-4f1c9a0e7b2e";

struct App {
    base: String,
    key: String,
}

async fn app(pool: &PgPool, token: Option<&str>, enqueue_requires_token: bool) -> App {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let (routes, key) = route_table("json:/id", Phase::DualWrite);
    let producer = crate::producer::producer(pool, &routes)
        .await
        .with_via(Via::Http);
    let mut state = AppState::new(pool.clone(), prometheus);
    state.producer = Some(producer);
    state.admin_token = token.map(|t| Secret::new("test token", t).unwrap());
    state.enqueue_requires_token = enqueue_requires_token;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = router(state).into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move {
        let _ = axum::serve(listener, service).await;
    });
    App {
        base: format!("http://{addr}"),
        key,
    }
}

/// A request with an optional bearer token; (status, WWW-Authenticate, body).
async fn call(
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Option<String>, Value) {
    let client = reqwest::Client::new();
    let mut req = match method {
        "GET" => client.get(url),
        _ => client.post(url),
    };
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    (status, challenge, resp.json().await.unwrap_or(Value::Null))
}

fn error_line(body: &Value) -> String {
    let e = body["error"].as_str().unwrap_or_default().to_string();
    assert!(!e.is_empty() && !e.contains('\n'), "one-line error: {body}");
    e
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn admin_endpoints_need_the_right_bearer_token(pool: PgPool) {
    let app = app(&pool, Some(TOKEN), false).await;
    let routes = format!("{}/v1/routes", app.base);
    for (token, why) in [(None, "missing"), (Some(WRONG), "wrong")] {
        for (method, url) in [
            ("GET", routes.clone()),
            ("GET", format!("{}/v1/routes/r/diff", app.base)),
            ("POST", format!("{}/v1/routes/r/advance", app.base)),
            ("POST", format!("{}/v1/dlq/requeue", app.base)),
        ] {
            let (status, challenge, body) = call(method, &url, token, None).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {url}: {body}");
            assert!(challenge.unwrap().starts_with("Bearer"));
            let e = error_line(&body);
            assert!(e.starts_with(why), "{e}");
            assert!(!e.contains(TOKEN) && !e.contains(WRONG), "{e}");
        }
    }
    // Refused requests did nothing: the route was never registered.
    let stored = support::count(&pool, "SELECT count(*) FROM qbridge.route_phases").await;
    assert_eq!(stored, 0);
    let (status, _, body) = call("GET", &routes, Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["routes"][0]["state"]["phase"], "dual_write", "{body}");
    // Health and metrics stay open; enqueue is open by default.
    for path in ["/livez", "/metrics"] {
        let resp = reqwest::get(format!("{}{path}", app.base)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
    }
    let (status, _, body) = call(
        "POST",
        &format!("{}/v1/queues/plain/jobs", app.base),
        None,
        Some(json!({"payload": {"n": 1}})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn without_a_token_the_admin_api_is_disabled(pool: PgPool) {
    let app = app(&pool, None, false).await;
    for token in [None, Some(TOKEN)] {
        let (status, _, body) = call(
            "POST",
            &format!("{}/v1/routes/r/advance", app.base),
            token,
            Some(json!({"force": true, "reason": "x"})),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(
            error_line(&body),
            "admin API disabled: set QBRIDGE_ADMIN_TOKEN or [http] admin_token_file"
        );
    }
    let stored = support::count(&pool, "SELECT count(*) FROM qbridge.route_phases").await;
    assert_eq!(stored, 0, "a refused advance changed nothing");
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn enqueue_can_require_the_token_too(pool: PgPool) {
    let app = app(&pool, Some(TOKEN), true).await;
    let url = format!("{}/v1/queues/plain/jobs", app.base);
    let job = json!({"payload": {"n": 1}});
    let (status, _, _) = call("POST", &url, None, Some(job.clone())).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = call(
        "POST",
        &format!("{}/v1/outcomes", app.base),
        Some(WRONG),
        Some(json!({"queue": "plain", "key": "k", "outcome": "ok"})),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(support::jobs(&pool).await, 0);
    let (status, _, body) = call("POST", &url, Some(TOKEN), Some(job)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(support::jobs(&pool).await, 1);
}

/// (changed_by, reason, forced, from, to) of the route's audit rows, oldest first.
async fn audit(pool: &PgPool) -> Vec<(String, String, bool, Option<String>, String)> {
    sqlx::query_as(
        "SELECT changed_by, reason, forced, from_phase, to_phase FROM qbridge.phase_audit \
          WHERE route = 'r' ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn phase_changes_over_http_are_gated_and_audited(pool: PgPool) {
    let app = app(&pool, Some(TOKEN), false).await;
    let url = |action: &str| format!("{}/v1/routes/r/{action}", app.base);

    // The gate refuses (no jobs in the window): 409 with each failing check.
    let (status, _, body) = call("POST", &url("advance"), Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(error_line(&body).contains("gate dual_write → shadow refused"));
    let failing = body["failing"].as_array().unwrap();
    assert!(!failing.is_empty(), "{body}");
    assert!(failing.iter().all(|c| c["passed"] == false), "{body}");
    assert!(
        failing.iter().any(|c| c["name"].as_str().is_some()),
        "{body}"
    );

    // Bad input is a 400 that changes nothing.
    for (action, body) in [
        ("advance", json!({"force": true})),
        ("advance", json!({"percent": 150})),
        ("advance", json!({"reason": "x", "surprise": 1})),
        ("rollback", json!({})),
        ("percent", json!({"reason": "x"})),
    ] {
        let (status, _, reply) = call("POST", &url(action), Some(TOKEN), Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{action}: {reply}");
        error_line(&reply);
    }
    let (status, _, body) = call(
        "POST",
        &format!("{}/v1/routes/nope/advance", app.base),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // Forced with a reason: it happens, audited with who and from where.
    let (status, _, body) = call(
        "POST",
        &url("advance"),
        Some(TOKEN),
        Some(json!({"force": true, "reason": "drill", "by": "alice"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"]["phase"], "shadow", "{body}");
    assert_eq!(body["forced"], true, "{body}");

    // A rollback needs its reason; `by` defaults to the caller's address.
    let (status, _, body) = call(
        "POST",
        &url("rollback"),
        Some(TOKEN),
        Some(json!({"reason": "too early"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"]["phase"], "dual_write", "{body}");

    // The flipped share only exists in postgres_only: the state refuses it.
    let (status, _, body) = call(
        "POST",
        &url("percent"),
        Some(TOKEN),
        Some(json!({"percent": 10, "reason": "ramp"})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    error_line(&body);

    let rows = audit(&pool).await;
    let changes: Vec<_> = rows.iter().filter(|r| r.3.is_some()).collect();
    assert_eq!(changes.len(), 2, "{rows:?}");
    let (by, reason, forced, from, to) = changes[0];
    assert!(by.starts_with("alice (http:127.0.0.1:"), "{by}");
    assert_eq!((reason.as_str(), *forced), ("drill", true));
    assert_eq!(
        (from.as_deref(), to.as_str()),
        (Some("dual_write"), "shadow")
    );
    let (by, reason, forced, _, to) = changes[1];
    assert!(by.starts_with("http:127.0.0.1:"), "{by}");
    assert_eq!(
        (reason.as_str(), *forced, to.as_str()),
        ("too early", false, "dual_write")
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn repair_over_http_mirrors_what_only_redis_holds(pool: PgPool) {
    let app = app(&pool, Some(TOKEN), false).await;
    let mut redis = ::redis::Client::open("redis://127.0.0.1:6379")
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // Pushed behind qbridge's back: in Redis, never mirrored.
    let _: i64 = redis
        .lpush(&app.key, r#"{"id":"behind-its-back"}"#)
        .await
        .unwrap();
    let url = format!("{}/v1/routes/r/repair", app.base);
    let (status, _, body) = call("POST", &url, Some(TOKEN), Some(json!({"since": "10m"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["diff"]["only_redis_waiting"], 1, "{body}");
    assert_eq!(body["repair"]["mirrored"], 1, "{body}");
    let copies = support::count(
        &pool,
        "SELECT count(*) FROM qbridge.job_keys WHERE queue = 'q' AND key = 'behind-its-back'",
    )
    .await;
    assert_eq!(copies, 1);
    // Idempotent: a second repair finds nothing to do.
    let (status, _, body) = call("POST", &url, Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["repair"]["mirrored"], 0, "{body}");
    let (status, _, body) = call(
        "POST",
        &url,
        Some(TOKEN),
        Some(json!({"since": "yesterday"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let _: () = redis.del(&app.key).await.unwrap();
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn dlq_requeue_over_http_moves_only_what_matches(pool: PgPool) {
    let app = app(&pool, Some(TOKEN), false).await;
    crate::dlq::kill(
        &pool,
        &[
            (NewJob::new("mail", json!({"n": 1})), "smtp timeout"),
            (NewJob::new("mail", json!({"n": 2})), "mailbox full"),
            (NewJob::new("sms", json!({"n": 3})), "smtp timeout"),
        ],
    )
    .await;
    let url = format!("{}/v1/dlq/requeue", app.base);
    let (status, _, body) = call("POST", &url, Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no filter, no all: {body}");
    assert_eq!(support::dead(&pool).await, 3);
    let (status, _, body) = call(
        "POST",
        &url,
        Some(TOKEN),
        Some(json!({"queue": "mail", "error": "timeout", "rate": 1000})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"requeued": 1, "left_in_dlq": 0}));
    assert_eq!(support::dead(&pool).await, 2);
    let back = support::count(
        &pool,
        "SELECT count(*) FROM qbridge.jobs WHERE queue = 'mail' AND state = 'ready' AND attempts = 0",
    )
    .await;
    assert_eq!(back, 1);
    let (status, _, body) = call("POST", &url, Some(TOKEN), Some(json!({"all": true}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["requeued"], 2, "{body}");
    assert_eq!(support::dead(&pool).await, 0);
}

/// `qbridge run` with one noop pool (its config written into `dir`),
/// listening on `listen`, with no token or listener setting from the
/// environment.
pub(crate) fn idle_run(
    pool: &PgPool,
    dir: &std::path::Path,
    listen: &str,
) -> tokio::process::Command {
    let config = dir.join("qbridge.toml");
    std::fs::write(
        &config,
        "[[pools]]\nqueues = [\"idle\"]\nhandler = { type = \"noop\" }\n",
    )
    .unwrap();
    crate::redaction::qbridge(
        "text",
        &[
            "--database-url",
            &support::db_url(pool),
            "--config",
            &config.to_string_lossy(),
            "run",
            "--http-listen",
            listen,
        ],
    )
}

/// Starts `qbridge run` (one noop pool) listening on `listen`, with `token`
/// in QBRIDGE_ADMIN_TOKEN when given, waits for /livez, lets `probe` make
/// requests, stops it with SIGTERM and returns its whole output.
async fn run_binary<F, Fut>(pool: &PgPool, listen: &str, token: Option<&str>, probe: F) -> String
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = idle_run(pool, dir.path(), listen);
    if let Some(t) = token {
        cmd.env("QBRIDGE_ADMIN_TOKEN", t);
    }
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qbridge run starts");
    let port = listen.rsplit(':').next().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    support::wait_for(
        "qbridge run answers /livez",
        Duration::from_secs(30),
        || async {
            reqwest::get(format!("{base}/livez"))
                .await
                .is_ok_and(|r| r.status().is_success())
        },
    )
    .await;
    probe(base).await;
    let pid = child.id().expect("still running").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("qbridge run stops after SIGTERM")
        .expect("output");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_token_never_reaches_the_output(pool: PgPool) {
    let listen = format!("127.0.0.1:{}", crate::servers::free_port());
    let text = run_binary(&pool, &listen, Some(TOKEN), |base| async move {
        let url = format!("{base}/v1/dlq/requeue");
        let all = Some(json!({"all": true}));
        let (status, _, _) = call("POST", &url, Some(WRONG), all.clone()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _, body) = call("POST", &url, Some(TOKEN), all).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    })
    .await;
    assert!(
        text.contains("refused an HTTP request: wrong bearer token"),
        "{text}"
    );
    assert!(text.contains("dead-letter requeue over HTTP"), "{text}");
    for secret in [TOKEN, WRONG, "4f1c9a0e7b2"] {
        assert!(!text.contains(secret), "{secret:?} leaked:\n{text}");
    }
    assert!(!text.contains("reachable from other hosts"), "{text}");
}
