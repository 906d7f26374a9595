//! The web console at `/ui`: where each route stands and why a gate
//! refuses, the queues, a job by id or key, and the dead letters, with the
//! operator's actions (advance, rollback, flipped share, requeue).
//!
//! How it is built, and why: server-rendered HTML written by Rust functions
//! ([`html`]) and one small script of our own (`console.js`, served from the
//! binary) that refreshes the parts of a page marked `data-refresh` every
//! few seconds. No build step, no template or front-end dependency, nothing
//! fetched from the internet at run time; every dynamic value is escaped by
//! construction. It reads and acts through the same functions as the CLI
//! and the admin API (`ops::gates`, `ops::operate`, `ops::diff`,
//! `queue::dlq`): one implementation of gates, diff and actions.
//!
//! Security ([`session`]): off, with a page saying how to turn it on, when
//! no admin token is configured; otherwise a login form takes the token and
//! opens a cookie session (HttpOnly, SameSite=Strict, idle and absolute
//! expiry); every POST carries the session's CSRF token; every action needs
//! a reason and is audited as `console:<peer>` like the CLI's changes; no
//! payload, token or password reaches a log.

mod actions;
mod html;
mod jobs;
mod requeues;
mod routes;
pub mod session;

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Form, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{Html as HtmlBody, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;

use super::AppState;
use html::{esc, page};
use session::{Session, LOGIN_COOKIE, SESSION_COOKIE};

/// The console's routes (merged into the listener's router).
pub(super) fn router(state: AppState) -> Router<AppState> {
    let signed_in = Router::new()
        .route("/ui", get(routes::overview))
        .route("/ui/fragment/routes", get(routes::overview_fragment))
        .route("/ui/routes/{route}", get(routes::detail))
        .route("/ui/routes/{route}/advance", post(actions::advance))
        .route("/ui/routes/{route}/rollback", post(actions::rollback))
        .route("/ui/routes/{route}/percent", post(actions::percent))
        .route("/ui/routes/{route}/repair", post(actions::repair))
        .route("/ui/queues", get(jobs::queues))
        .route("/ui/jobs", get(jobs::find))
        .route("/ui/dead", get(jobs::dead))
        .route("/ui/dead/requeue", post(jobs::requeue))
        .route("/ui/fragment/requeue/{id}", get(jobs::requeue_progress))
        .route("/ui/logout", post(logout))
        .layer(axum::middleware::from_fn_with_state(state, require_session));
    Router::new()
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/static/console.js", get(script))
        .merge(signed_in)
        .layer(axum::middleware::from_fn(server_timing))
}

/// `Server-Timing: app;dur=<ms>` on every console response: the server's
/// time for the page, what `bench/console/run.sh` measures.
async fn server_timing(req: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let mut resp = next.run(req).await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if let Ok(v) = axum::http::HeaderValue::from_str(&format!("app;dur={ms:.1}")) {
        resp.headers_mut().insert("server-timing", v);
    }
    resp
}

/// The console's state in a process: signed-in sessions, the dead-letter
/// requeues started from it, and each route's last next-gate summary
/// (with the phase it was for and when).
#[derive(Clone, Default)]
pub struct Console {
    pub sessions: session::Sessions,
    pub requeues: requeues::Requeues,
    gates: GateSummaries,
}

type GateSummaries = std::sync::Arc<
    std::sync::Mutex<
        std::collections::HashMap<String, (crate::model::Phase, std::time::Instant, String)>,
    >,
>;

impl Console {
    /// `route`'s summary if it was made for `phase` less than `max_age` ago.
    fn gate_summary(
        &self,
        route: &str,
        phase: crate::model::Phase,
        max_age: std::time::Duration,
    ) -> Option<String> {
        let all = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        all.get(route)
            .filter(|(p, at, _)| *p == phase && at.elapsed() < max_age)
            .map(|(_, _, s)| s.clone())
    }

    fn keep_gate_summary(&self, route: &str, phase: crate::model::Phase, summary: String) {
        let mut all = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        all.insert(
            route.to_string(),
            (phase, std::time::Instant::now(), summary),
        );
    }
}

/// An HTML response.
pub(super) fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CACHE_CONTROL, "no-store"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; style-src 'unsafe-inline'; script-src 'self'; frame-ancestors 'none'; \
                 form-action 'self'; base-uri 'none'; object-src 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        HtmlBody(body),
    )
        .into_response()
}

/// What turns the console on, when it is off.
const OFF: &str = "The console is off: no admin token is configured. Set QBRIDGE_ADMIN_TOKEN \
    (or [http] admin_token_file) and restart qbridge; then log in here with that token.";

/// The page of a console that is off.
fn off() -> Response {
    html(
        StatusCode::FORBIDDEN,
        page(
            "Console off",
            None,
            &format!("<p class=\"error\">{}</p>", esc(OFF)),
        ),
    )
}

/// A page whose data could not be read (Postgres or Redis down): 503 with
/// the reason, the operator still signed in.
pub(super) fn unavailable(session: &Session, what: &str, e: impl std::fmt::Display) -> Response {
    html(
        StatusCode::SERVICE_UNAVAILABLE,
        page(
            "Unavailable",
            Some(&session.csrf),
            &format!(
                "<p class=\"error\">Cannot read {}: {}</p>",
                esc(what),
                esc(&e.to_string())
            ),
        ),
    )
}

/// Every signed-in page: the session, or the login form (a GET) / 403 (a
/// POST without a session). With no admin token, the page that says so.
async fn require_session(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    if state.admin_token.is_none() {
        return off();
    }
    // The live refresh's requests do not keep a session alive: an open tab
    // nobody looks at still signs out after the idle time.
    let touch = req.headers().get("x-qbridge-refresh").is_none();
    let found = state
        .console
        .sessions
        .get(&state.db, req.headers(), touch)
        .await;
    match found {
        Err(e) => sessions_unreadable(e),
        Ok(Some(session)) => {
            req.extensions_mut().insert(session);
            next.run(req).await
        }
        Ok(None) if req.method() == axum::http::Method::GET => Redirect::to("/ui/login").into_response(),
        Ok(None) => html(
            StatusCode::FORBIDDEN,
            page("Signed out", None, "<p class=\"error\">Your session ended: <a href=\"/ui/login\">log in</a> again.</p>"),
        ),
    }
}

/// Sessions live in Postgres: while it does not answer, nobody is signed
/// in or out (503, with the reason).
fn sessions_unreadable(e: sqlx::Error) -> Response {
    // The reason goes to the log only: this page is shown before sign-in.
    tracing::warn!(error = %e, "console: cannot read or write sessions");
    let body = "<p class=\"error\">The console keeps its sessions in Postgres, which does not answer. Try again shortly.</p>";
    html(
        StatusCode::SERVICE_UNAVAILABLE,
        page("Unavailable", None, body),
    )
}

/// The answer of a request stopped early (a refusal, a redirect back with
/// the reason); boxed, as a response is large, so handlers can use `?`.
pub(super) struct Stop(pub(super) Box<Response>);

impl IntoResponse for Stop {
    fn into_response(self) -> Response {
        *self.0
    }
}

impl From<Response> for Stop {
    fn from(resp: Response) -> Stop {
        Stop(Box::new(resp))
    }
}

/// A POST's CSRF field checked against the session's.
pub(super) fn csrf_ok(session: &Session, offered: &str) -> Result<(), Stop> {
    if session::same(offered, &session.csrf) {
        Ok(())
    } else {
        Err(Stop(Box::new(html(
            StatusCode::FORBIDDEN,
            page("Refused", Some(&session.csrf), "<p class=\"error\">Refused: the form's CSRF token is missing or wrong. Reload the page and try again.</p>"),
        ))))
    }
}

async fn login_form(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if state.admin_token.is_none() {
        return off();
    }
    login_page(&headers, StatusCode::OK, None)
}

/// The login form. Its guard is the browser's login cookie when it has one
/// (two tabs, or a reload, keep one guard), else a new one.
fn login_page(headers: &HeaderMap, status: StatusCode, error: Option<&str>) -> Response {
    let guard = session::cookie(headers, LOGIN_COOKIE)
        .filter(|g| g.len() == 64 && g.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(session::random_token);
    let mut body = String::from("<h1>Log in</h1>");
    if let Some(e) = error {
        body.push_str(&format!("<p class=\"error\">{}</p>", esc(e)));
    }
    body.push_str(&format!(
        "<form method=\"post\" action=\"/ui/login\"><input type=\"hidden\" name=\"csrf\" value=\"{guard}\">\
         <label>Admin token <input type=\"password\" name=\"token\" id=\"token\" autocomplete=\"current-password\" required></label> \
         <button id=\"login\">Log in</button></form>"
    ));
    let mut resp = html(status, page("Log in", None, &body));
    resp.headers_mut().append(
        header::SET_COOKIE,
        session::set_cookie(LOGIN_COOKIE, &guard, std::time::Duration::from_secs(600)),
    );
    resp
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    csrf: String,
}

async fn login(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let Some(token) = state.admin_token.as_ref() else {
        return off();
    };
    let guard = session::cookie(&headers, LOGIN_COOKIE).unwrap_or_default();
    if guard.is_empty() || !session::same(&form.csrf, &guard) {
        return login_page(
            &headers,
            StatusCode::FORBIDDEN,
            Some("The login form expired: try again."),
        );
    }
    if !token.matches(form.token.as_bytes()) {
        // The peer, never the offered token.
        tracing::warn!(peer = %peer, "console: refused a login with a wrong token");
        return login_page(&headers, StatusCode::UNAUTHORIZED, Some("Wrong token."));
    }
    // A new session at every login: an earlier one of this browser ends.
    let sessions = &state.console.sessions;
    let opened = match sessions.close(&state.db, &headers).await {
        Ok(()) => sessions.open(&state.db, format!("console:{peer}")).await,
        Err(e) => Err(e),
    };
    let id = match opened {
        Ok(id) => id,
        Err(e) => return sessions_unreadable(e),
    };
    let mut resp = Redirect::to("/ui").into_response();
    let mut cookie = session::set_cookie(SESSION_COOKIE, &id, session::LIFETIME);
    if behind_https(&headers) {
        cookie = session::secure(cookie);
    }
    resp.headers_mut().append(header::SET_COOKIE, cookie);
    resp.headers_mut().append(
        header::SET_COOKIE,
        session::set_cookie(LOGIN_COOKIE, "", std::time::Duration::ZERO),
    );
    resp
}

/// Whether the browser reached the console over HTTPS through a proxy that
/// says so (`X-Forwarded-Proto: https`): the session cookie is then
/// `Secure`. qbridge's own listener is plain HTTP (loopback by default).
fn behind_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

#[derive(Deserialize)]
struct LogoutForm {
    #[serde(default)]
    csrf: String,
    /// Sign out every session, in every process.
    #[serde(default)]
    everywhere: Option<String>,
}

async fn logout(
    State(state): State<AppState>,
    axum::Extension(session): axum::Extension<Session>,
    headers: HeaderMap,
    Form(form): Form<LogoutForm>,
) -> Result<Response, Stop> {
    csrf_ok(&session, &form.csrf)?;
    let sessions = &state.console.sessions;
    let closed = if form.everywhere.is_some() {
        let ended = sessions.close_all(&state.db).await;
        if let Ok(n) = ended {
            tracing::info!(by = %session.who, sessions = n, "console: signed out everywhere");
        }
        ended.map(|_| ())
    } else {
        sessions.close(&state.db, &headers).await
    };
    closed.map_err(|e| Stop::from(sessions_unreadable(e)))?;
    let mut resp = Redirect::to("/ui/login").into_response();
    resp.headers_mut().append(
        header::SET_COOKIE,
        session::set_cookie(SESSION_COOKIE, "", std::time::Duration::ZERO),
    );
    Ok(resp)
}

async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        include_str!("console.js"),
    )
        .into_response()
}
