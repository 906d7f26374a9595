//! The web console in a real browser (Debian's chromium through
//! chromedriver, headless): log in (a wrong token refused), see the routes
//! and a refusing gate with its numbers, advance a route with a reason and
//! see the audit entry, roll back, requeue a dead letter, find a job by
//! key; a POST without the CSRF token refused; an HTML-injection payload
//! and error text rendered inert. And the console off without a token.

mod webdriver;

use std::net::SocketAddr;

use sqlx::PgPool;

use qbridge::http::{router, AppState};
use qbridge::model::Phase;
use qbridge::secret::Secret;

use crate::producer::route_table;
use webdriver::Browser;

const TOKEN: &str = "console-token-7d2e9f1a";
const INJECTION: &str =
    "<img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>";

/// The listener with the console, on a free port; its base URL and route.
async fn console(pool: &PgPool, token: Option<&str>) -> (String, String) {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let (routes, _key) = route_table("json:/id", Phase::DualWrite);
    let route = routes.iter().next().unwrap().name.clone();
    let producer = crate::producer::producer(pool, &routes).await;
    let mut state = AppState::new(pool.clone(), prometheus);
    state.producer = Some(producer);
    state.admin_token = token.map(|t| Secret::new("test token", t).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = router(state).into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move {
        let _ = axum::serve(listener, service).await;
    });
    (format!("http://{addr}"), route)
}

/// A dead letter whose payload, key and error text carry markup.
async fn plant_dead_letter(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO qbridge.jobs_dead (id, queue, key, payload, priority, attempts, max_attempts, last_error, created_at) \
         VALUES (987654, 'inbox', 'key-' || $1, jsonb_build_object('html', $1::text), 0, 3, 3, 'boom ' || $1, now()) RETURNING id",
    )
    .bind(INJECTION)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_operator_runs_the_cutover_and_the_dead_letters_from_the_console(pool: PgPool) {
    let (base, route) = console(&pool, Some(TOKEN)).await;
    let dead_id = plant_dead_letter(&pool).await;
    let b = Browser::start().await;

    // Signed out: to the login form; a wrong token is refused.
    b.goto(&format!("{base}/ui")).await;
    assert!(b.url().await.ends_with("/ui/login"));
    b.fill("#token", "not-the-token").await;
    b.submit("#login").await;
    let page = b.source().await;
    assert!(page.contains("Wrong token."), "{page}");

    // Signed in: the routes, and the next gate refusing with its numbers.
    b.fill("#token", TOKEN).await;
    b.submit("#login").await;
    let routes = b.text("#routes").await;
    assert!(
        routes.contains(&route) && routes.contains("dual_write"),
        "{routes}"
    );
    assert!(
        routes.contains("→ shadow:") && routes.contains("checks fail"),
        "{routes}"
    );
    if let Ok(path) = std::env::var("QBRIDGE_CONSOLE_SCREENSHOT") {
        std::fs::write(path, b.screenshot().await).unwrap();
    }
    b.goto(&format!("{base}/ui/routes/{route}")).await;
    let gate = b.text("#gate").await;
    assert!(
        gate.contains("FAIL") && gate.contains("needs") || gate.contains(">="),
        "{gate}"
    );

    // Advance: refused by the gate, with its numbers; then forced, with a
    // reason, and the audit shows it.
    b.fill("#advance-reason", "try the gate").await;
    b.submit("#advance").await;
    let flash = b.text("#flash").await;
    assert!(flash.contains("refuses"), "{flash}");
    assert_eq!(b.text("#phase").await, "dual_write");
    b.fill(
        "#advance-reason",
        "staging rehearsal, traffic too low for the gate",
    )
    .await;
    b.click("input[name=force]").await;
    b.submit("#advance").await;
    assert!(b
        .text("#flash")
        .await
        .contains("dual_write → shadow (forced)"));
    assert_eq!(b.text("#phase").await, "shadow");
    let audit = b.text("#audit").await;
    assert!(
        audit.contains("staging rehearsal, traffic too low for the gate")
            && audit.contains("(forced)"),
        "{audit}"
    );
    assert!(audit.contains("console:127.0.0.1"), "{audit}");
    assert!(
        audit.contains("FAIL"),
        "the gate's numbers the forced advance overrode: {audit}"
    );
    assert!(b.text("#diff-table").await.contains("only on this side"));

    // Roll back, with a reason.
    b.fill("#rollback-reason", "back to mirroring").await;
    b.submit("#rollback").await;
    assert_eq!(b.text("#phase").await, "dual_write");
    assert!(b.text("#audit").await.contains("back to mirroring"));

    // Repair: what it would do, then doing it (nothing to repair here).
    assert!(b.text("#repair-preview").await.contains("push back 0"));
    b.fill("#repair-reason", "after the rollback").await;
    b.submit("#repair").await;
    let flash = b.text("#flash").await;
    assert!(
        flash.contains("repair: 0 mirrored, 0 pushed back"),
        "{flash}"
    );

    // The routes page follows a change made elsewhere (the CLI, another
    // operator) without a reload.
    b.goto(&format!("{base}/ui")).await;
    b.run("window.__qbSamePage = true; return null").await;
    sqlx::query("UPDATE qbridge.route_phases SET phase = 'shadow' WHERE route = $1")
        .bind(&route)
        .execute(&pool)
        .await
        .unwrap();
    let mut followed = false;
    for _ in 0..40 {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        if b.text("#routes .phase").await == "shadow" {
            followed = true;
            break;
        }
    }
    assert!(followed, "the routes table refreshed within 10 s");
    assert_eq!(
        b.run("return window.__qbSamePage === true").await,
        true,
        "no reload"
    );
    sqlx::query("UPDATE qbridge.route_phases SET phase = 'dual_write' WHERE route = $1")
        .bind(&route)
        .execute(&pool)
        .await
        .unwrap();

    // The queues page: counts, the chart of the last hour, database health.
    b.goto(&format!("{base}/ui/queues")).await;
    assert!(b.text("#queues").await.contains("inbox"));
    assert!(b.text("#health").await.contains("NOTIFY queue use"));

    // The dead letter: its markup is text, not elements.
    b.goto(&format!("{base}/ui/dead")).await;
    assert_eq!(
        b.run("return document.querySelectorAll('#dead img, #dead script').length")
            .await,
        0
    );
    assert!(b.text("#dead").await.contains("<img src=x"));
    b.goto(&format!("{base}/ui/jobs?q={dead_id}")).await;
    assert!(b.text(".payload").await.contains("<script>"));
    assert_eq!(
        b.run("return document.querySelectorAll('main img, main script').length")
            .await,
        0
    );
    assert_ne!(b.run("return document.title").await, "pwned");

    // Requeue it from the list.
    b.goto(&format!("{base}/ui/dead")).await;
    b.click(".pick").await;
    b.submit("#requeue").await;
    let mut progress = String::new();
    for _ in 0..60 {
        progress = b.text("#requeue-progress").await;
        if progress.contains("Requeued 1 of 1") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(progress.contains("Requeued 1 of 1"), "{progress}");
    let live: i64 =
        sqlx::query_scalar("SELECT count(*) FROM qbridge.jobs WHERE key = 'key-' || $1")
            .bind(INJECTION)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(live, 1, "the dead letter is back in the queue");

    // Find it by key: in the queue again.
    b.goto(&format!("{base}/ui/jobs")).await;
    b.fill("#q", &format!("key-{INJECTION}")).await;
    b.submit("#find").await;
    let found = b.source().await;
    assert!(found.contains("In the queue"), "{found}");

    // A POST without the session's CSRF token is refused, with the cookie.
    let cookies = b.cookies().await;
    let session = cookies
        .iter()
        .find(|(name, _)| name == "qb_session")
        .map(|(_, v)| v.clone())
        .expect("the session cookie");
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for body in ["reason=sneaky", "reason=sneaky&csrf=0000"] {
        let resp = client
            .post(format!("{base}/ui/routes/{route}/rollback"))
            .header("cookie", format!("qb_session={session}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 403, "{body}");
    }
    let phase: String =
        sqlx::query_scalar("SELECT phase FROM qbridge.route_phases WHERE route = $1")
            .bind(&route)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(phase, "dual_write", "nothing changed");

    // Log out: the session is gone.
    b.submit(".logout button").await;
    b.goto(&format!("{base}/ui")).await;
    assert!(b.url().await.ends_with("/ui/login"));
    b.quit().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn without_an_admin_token_the_console_is_off_and_says_how_to_turn_it_on(pool: PgPool) {
    let (base, _) = console(&pool, None).await;
    for path in ["/ui", "/ui/login", "/ui/dead"] {
        let resp = reqwest::get(format!("{base}{path}")).await.unwrap();
        assert_eq!(resp.status(), 403, "{path}");
        assert!(
            resp.text().await.unwrap().contains("QBRIDGE_ADMIN_TOKEN"),
            "{path}"
        );
    }
}
