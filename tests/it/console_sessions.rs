//! Console sessions live in Postgres: a session opened through one qbridge
//! process works through another behind the same address, survives a
//! restart of both, is stored only as a hash, and "sign out everywhere"
//! ends every session in every process.

use std::net::SocketAddr;

use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use reqwest::redirect::Policy;
use reqwest::StatusCode;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tokio::task::JoinHandle;

use qbridge::http::{router, AppState};
use qbridge::secret::Secret;

const TOKEN: &str = "console-token-5b81c0e4d2";

/// One qbridge listener with the console; its base URL and its task (abort
/// it to stop the "process").
async fn process(pool: &PgPool) -> (String, JoinHandle<()>) {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let mut state = AppState::new(pool.clone(), prometheus);
    state.admin_token = Some(Secret::new("test token", TOKEN).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = router(state).into_make_service_with_connect_info::<SocketAddr>();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, service).await;
    });
    (format!("http://{addr}"), task)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap()
}

/// The value a response sets for cookie `name`.
fn set_cookie(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix(&format!("{name}=")))
        .map(|v| v.split(';').next().unwrap_or_default().to_string())
}

/// Logs in through `base`; the session id (the cookie's value).
async fn login(base: &str) -> String {
    let form = client()
        .get(format!("{base}/ui/login"))
        .send()
        .await
        .unwrap();
    let guard = set_cookie(&form, "qb_login").expect("the login guard");
    let resp = client()
        .post(format!("{base}/ui/login"))
        .header(COOKIE, format!("qb_login={guard}"))
        .form(&[("token", TOKEN), ("csrf", guard.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    set_cookie(&resp, "qb_session").expect("a session cookie")
}

/// `GET /ui` with session `id`: the page when signed in, `None` when sent
/// to the login form.
async fn overview(base: &str, id: &str) -> Option<String> {
    let resp = client()
        .get(format!("{base}/ui"))
        .header(COOKIE, format!("qb_session={id}"))
        .send()
        .await
        .unwrap();
    if resp.status().is_redirection() {
        assert_eq!(resp.headers()[LOCATION], "/ui/login");
        return None;
    }
    assert_eq!(resp.status(), StatusCode::OK);
    Some(resp.text().await.unwrap())
}

/// The CSRF token a signed-in page's forms carry.
fn csrf(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a form") + 19;
    page[at..at + 64].to_string()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_session_works_across_processes_and_restarts_until_signed_out_everywhere(pool: PgPool) {
    let (a, a_task) = process(&pool).await;
    let (b, b_task) = process(&pool).await;
    let first = login(&a).await;
    assert!(overview(&b, &first).await.is_some(), "B serves A's session");

    // Only the id's hash is stored.
    let stored: Vec<Vec<u8>> = sqlx::query_scalar("SELECT id_hash FROM qbridge.console_sessions")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(stored, vec![Sha256::digest(first.as_bytes()).to_vec()]);

    // Both processes restart: the operator stays signed in.
    a_task.abort();
    b_task.abort();
    let (c, _c_task) = process(&pool).await;
    let page = overview(&c, &first).await.expect("still signed in");
    let second = login(&c).await;
    assert!(overview(&c, &second).await.is_some());

    // Sign out everywhere, from one session: both end.
    let resp = client()
        .post(format!("{c}/ui/logout"))
        .header(COOKIE, format!("qb_session={first}"))
        .form(&[("csrf", csrf(&page).as_str()), ("everywhere", "1")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let (d, _d_task) = process(&pool).await;
    for id in [&first, &second] {
        assert!(
            overview(&d, id).await.is_none(),
            "a session outlived sign-out"
        );
    }
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM qbridge.console_sessions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}
