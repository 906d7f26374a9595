//! The handlers against real HTTP servers and configs: status classes, recorded
//! runs and their digests, header errors.

use std::collections::BTreeMap;

use serde_json::json;

use reqwest::StatusCode;

use super::*;
use crate::config::Dur;

/// A claimed job with `payload` and defaults elsewhere.
pub(super) fn job(payload: serde_json::Value) -> ClaimedJob {
    ClaimedJob {
        id: 1,
        queue: "q".into(),
        kind: None,
        key: None,
        payload,
        priority: 0,
        attempts: 1,
        max_attempts: 25,
        lease: 1,
        run_at: chrono::Utc::now(),
        created_at: chrono::Utc::now(),
        lock_key: None,
        tenant: None,
        copy: crate::queue::JobCopy::Live,
    }
}

async fn status_server() -> String {
    use axum::extract::Path;
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/{code}",
        post(|Path(code): Path<u16>| async move {
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn http_408_and_429_are_retried_other_4xx_are_permanent() {
    let base = status_server().await;
    for (code, want) in [
        (200, "done"),
        (204, "done"),
        (408, "retry"),
        (429, "retry"),
        (400, "permanent"),
        (404, "permanent"),
        (422, "permanent"),
        (500, "retry"),
        (503, "retry"),
    ] {
        let h = Handler::from_config(&HandlerConfig::Http {
            url: format!("{base}/{code}"),
            timeout: Dur(Duration::from_secs(10)),
            headers: BTreeMap::new(),
        })
        .unwrap();
        let got = match h.run(&job(json!({}))).await {
            HandlerResult::Done => "done",
            HandlerResult::Retry(m) => {
                assert!(m.contains(&code.to_string()), "{m}");
                "retry"
            }
            HandlerResult::Permanent(m) => {
                assert!(m.contains(&code.to_string()), "{m}");
                "permanent"
            }
        };
        assert_eq!(got, want, "status {code}");
    }
}

#[tokio::test]
async fn recorded_runs_digest_the_body_and_classify_failures() {
    let base = status_server().await;
    let h = |code: u16| {
        Handler::from_config(&HandlerConfig::Http {
            url: format!("{base}/{code}"),
            timeout: Dur(Duration::from_secs(10)),
            headers: BTreeMap::new(),
        })
        .unwrap()
    };
    let ok = h(200)
        .run_recorded(&job(json!({})), Mode::Live, &Digester::default())
        .await;
    assert_eq!(ok.result, HandlerResult::Done);
    assert_eq!(ok.error_class, None);
    // The status server answers with an empty body.
    assert_eq!(
        ok.digest.as_deref(),
        Some("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    );
    // 204: done with nothing to compare (a runner's shadow "skip"): no
    // digest, so the diff compares the outcome alone.
    let skipped = h(204)
        .run_recorded(&job(json!({})), Mode::Shadow, &Digester::default())
        .await;
    assert_eq!(skipped.result, HandlerResult::Done);
    assert_eq!(skipped.digest, None);
    assert_eq!(
        h(503)
            .run_recorded(&job(json!({})), Mode::Live, &Digester::default())
            .await
            .error_class,
        Some("http_5xx")
    );
    assert_eq!(
        h(404)
            .run_recorded(&job(json!({})), Mode::Live, &Digester::default())
            .await
            .error_class,
        Some("http_4xx")
    );
    assert_eq!(
        error_class(&HandlerResult::Retry("exit code 3: boom".into())),
        Some("exit_code")
    );
    assert_eq!(
        error_class(&HandlerResult::Retry("command timed out after 1s".into())),
        Some("timeout")
    );
}

#[test]
fn bad_configured_header_is_a_config_error() {
    let mut headers = BTreeMap::new();
    headers.insert("Authorization".to_string(), "Bearer s3cret\n".to_string());
    let err = Handler::from_config(&HandlerConfig::Http {
        url: "http://127.0.0.1:1/".into(),
        timeout: Dur(Duration::from_secs(1)),
        headers,
    })
    .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(!err.to_string().contains("s3cret"), "{err}");
}
