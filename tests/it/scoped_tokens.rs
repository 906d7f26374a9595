//! One token per scope on the HTTP listener: a fleet's reporting token
//! reports outcomes and opens nothing else, an enqueue token enqueues (to
//! its queues only), the admin token passes everything; a token of another
//! scope gets 403, no token or an unknown one 401. And through the binary:
//! a listener beyond loopback refuses to start while a write endpoint would
//! be open, naming the setting that closes it.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;

use qbridge::http::{router, AppState};
use qbridge::secret::Secret;

use crate::support;

const ADMIN: &str = "admin-token-0a6f3c9e21d4";
const REPORT: &str = "report-token-77b1e0c5a9f2";
const ENQUEUE: &str = "enqueue-token-3d8e6a1f0b47";

async fn app(pool: &PgPool) -> String {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let mut state = AppState::new(pool.clone(), prometheus);
    let secret = |v: &str| Some(Secret::new("test token", v).unwrap());
    state.admin_token = secret(ADMIN);
    state.report_token = secret(REPORT);
    state.enqueue_token = secret(ENQUEUE);
    state.enqueue_queues = vec!["emails".into()];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = router(state).into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move {
        let _ = axum::serve(listener, service).await;
    });
    format!("http://{addr}")
}

async fn post(url: &str, token: Option<&str>, body: Value) -> (StatusCode, Value) {
    let mut req = reqwest::Client::new().post(url).json(&body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn outcomes(pool: &PgPool) -> i64 {
    support::count(pool, "SELECT count(*) FROM qbridge.outcomes").await
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn each_token_opens_its_own_scope_only(pool: PgPool) {
    let base = app(&pool).await;
    let report = format!("{base}/v1/outcomes");
    let forged = json!({"queue": "emails", "key": "k1", "outcome": "ok"});
    // A forged outcome without the reporting scope is refused.
    for (token, want) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some("not-a-token-of-any-scope"), StatusCode::UNAUTHORIZED),
        (Some(ENQUEUE), StatusCode::FORBIDDEN),
    ] {
        let (status, body) = post(&report, token, forged.clone()).await;
        assert_eq!(status, want, "{token:?}: {body}");
    }
    assert_eq!(outcomes(&pool).await, 0, "nothing recorded");
    for token in [REPORT, ADMIN] {
        let (status, body) = post(&report, Some(token), forged.clone()).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    assert_eq!(outcomes(&pool).await, 2);

    // Enqueue: its token for its queue, the admin token anywhere.
    let job = json!({"payload": {"n": 1}});
    let emails = format!("{base}/v1/queues/emails/jobs");
    let other = format!("{base}/v1/queues/billing/jobs");
    let (status, body) = post(&emails, Some(REPORT), job.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let line = body["error"].as_str().unwrap_or_default();
    assert!(line.contains("may not enqueue"), "{line}");
    assert!(!line.contains(REPORT), "{line}");
    let (status, body) = post(&other, Some(ENQUEUE), job.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(support::jobs(&pool).await, 0);
    let (status, body) = post(&emails, Some(ENQUEUE), job.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = post(&other, Some(ADMIN), job.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(support::jobs(&pool).await, 2);

    // Neither scoped token reaches the admin API (403: a token, of
    // another scope).
    for token in [REPORT, ENQUEUE] {
        let resp = reqwest::Client::new()
            .get(format!("{base}/v1/routes"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    }
}

/// `qbridge run` on `listen` with `env`: its exit status and output once it
/// exits, or `None` while it is still running after 10 s (then stopped).
async fn start(pool: &PgPool, listen: &str, env: &[(&str, &str)]) -> Option<(bool, String)> {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = crate::admin_http::idle_run(pool, dir.path(), listen);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qbridge run starts");
    let port = listen.rsplit(':').next().unwrap();
    let livez = format!("http://127.0.0.1:{port}/livez");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().await.unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return Some((status.success(), text));
        }
        if reqwest::get(&livez)
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            let _ = child.kill().await;
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill().await;
    panic!("qbridge run neither answered nor exited");
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_listener_beyond_loopback_needs_a_token_for_each_write_endpoint(pool: PgPool) {
    let anywhere = || format!("0.0.0.0:{}", crate::servers::free_port());
    let (ok, text) = start(&pool, &anywhere(), &[("QBRIDGE_REPORT_TOKEN", REPORT)])
        .await
        .expect("refused to start");
    assert!(!ok, "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("reachable from other hosts"))
        .unwrap_or_else(|| panic!("no error line: {text}"));
    assert!(line.contains("POST /v1/queues/{queue}/jobs"), "{line}");
    assert!(
        line.contains("QBRIDGE_ENQUEUE_TOKEN or [http] enqueue_token_file"),
        "{line}"
    );
    assert!(!line.contains("/v1/outcomes"), "{line}");
    assert!(!text.contains(REPORT), "the token leaked: {text}");
    // With both tokens it starts; on loopback it starts without any.
    let both = [
        ("QBRIDGE_REPORT_TOKEN", REPORT),
        ("QBRIDGE_ENQUEUE_TOKEN", ENQUEUE),
    ];
    assert!(start(&pool, &anywhere(), &both).await.is_none());
    let loopback = format!("127.0.0.1:{}", crate::servers::free_port());
    assert!(start(&pool, &loopback, &[]).await.is_none());
}
