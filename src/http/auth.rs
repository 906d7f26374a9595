//! The bearer tokens in front of the HTTP listener, one per scope, so each
//! caller holds only what it needs:
//!
//! - admin (`QBRIDGE_ADMIN_TOKEN`): the admin API and the console, and it
//!   passes the write endpoints too. No admin token: the admin endpoints
//!   answer 403 and say how to enable them, never open by default.
//! - report (`QBRIDGE_REPORT_TOKEN`): `POST /v1/outcomes` only — what a
//!   fleet's reporter gets. A forged `ok` or `dead` would drop or release a
//!   held re-push, so once it is set nothing else reports.
//! - enqueue (`QBRIDGE_ENQUEUE_TOKEN`): `POST /v1/queues/{queue}/jobs`, for
//!   the queues of `[http] enqueue_queues` (every queue when empty).
//!
//! A write endpoint without its token (and without `[http]
//! enqueue_requires_token`) is open; [`open_write_endpoints`] names them, and
//! a listener beyond loopback refuses to start while any is.
//!
//! No `Authorization: Bearer …` header, or a token of no scope: 401 with
//! `WWW-Authenticate: Bearer`; a token of another scope (or a queue its
//! token does not cover): 403. Tokens are compared in constant time
//! ([`Secret::matches`]); neither an offered nor a configured token ever
//! reaches a log line or a reply.
//!
//! A request that passes carries a [`Caller`] extension: who to write into
//! the audit log when the body names nobody.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{error_reply, AppState};
use crate::secret::Secret;

/// The 403 text when no token is configured.
pub const DISABLED: &str = "admin API disabled: set QBRIDGE_ADMIN_TOKEN or [http] admin_token_file";

/// Who made an authenticated request: `http:<peer address>`.
#[derive(Debug, Clone)]
pub struct Caller(pub String);

/// Middleware of the admin routes.
pub(super) async fn require_admin(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let Some(token) = state.admin_token.as_ref() else {
        return error_reply(StatusCode::FORBIDDEN, DISABLED).into_response();
    };
    let scoped = bearer(req.headers())
        .is_some_and(|offered| !token.matches(offered) && scoped_token(&state, offered));
    if scoped {
        tracing::warn!(path = %req.uri().path(), "refused an HTTP request: a token of another scope");
        return error_reply(
            StatusCode::FORBIDDEN,
            "this token may not use the admin API",
        )
        .into_response();
    }
    check(token, req, next).await
}

/// Middleware of `POST /v1/outcomes`: the reporting token (or the admin
/// token) once one is required.
pub(super) async fn require_for_outcomes(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let scope = Scope {
        token: state.report_token.as_ref(),
        covers: true,
        what: "report outcomes",
    };
    require_scope(&state, scope, req, next).await
}

/// Middleware of `POST /v1/queues/{queue}/jobs`: the enqueue token for that
/// queue (or the admin token) once one is required.
pub(super) async fn require_for_enqueue(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let queue = req.uri().path().split('/').nth(3).unwrap_or_default();
    let covers = state.enqueue_queues.is_empty() || state.enqueue_queues.iter().any(|q| q == queue);
    let scope = Scope {
        token: state.enqueue_token.as_ref(),
        covers,
        what: "enqueue to this queue",
    };
    require_scope(&state, scope, req, next).await
}

/// The token a write endpoint takes, whether it covers this request, and
/// what it would allow (for the 403).
struct Scope<'a> {
    token: Option<&'a Secret>,
    covers: bool,
    what: &'static str,
}

/// The write endpoints a request can reach without any token, each with the
/// setting that closes it.
pub fn open_write_endpoints(state: &AppState) -> Vec<(&'static str, &'static str)> {
    let closed = |token: &Option<Secret>| {
        token.is_some() || (state.enqueue_requires_token && state.admin_token.is_some())
    };
    let mut open = Vec::new();
    if !closed(&state.report_token) {
        open.push((
            "POST /v1/outcomes",
            "QBRIDGE_REPORT_TOKEN or [http] report_token_file",
        ));
    }
    if !closed(&state.enqueue_token) {
        open.push((
            "POST /v1/queues/{queue}/jobs",
            "QBRIDGE_ENQUEUE_TOKEN or [http] enqueue_token_file",
        ));
    }
    open
}

async fn require_scope(state: &AppState, scope: Scope<'_>, req: Request, next: Next) -> Response {
    if scope.token.is_none() && !state.enqueue_requires_token {
        return next.run(req).await;
    }
    let Some(offered) = bearer(req.headers()) else {
        return refuse(&req, "missing bearer token");
    };
    let admin = state
        .admin_token
        .as_ref()
        .is_some_and(|t| t.matches(offered));
    let scoped = scope.token.is_some_and(|t| t.matches(offered));
    if admin || (scoped && scope.covers) {
        return pass(req, next).await;
    }
    let known = scoped || scoped_token(state, offered);
    if known {
        tracing::warn!(path = %req.uri().path(), "refused an HTTP request: a token of another scope");
        let line = format!("this token may not {}", scope.what);
        return error_reply(StatusCode::FORBIDDEN, &line).into_response();
    }
    refuse(&req, "wrong bearer token")
}

/// Whether `offered` is the report or the enqueue token.
fn scoped_token(state: &AppState, offered: &[u8]) -> bool {
    [&state.report_token, &state.enqueue_token]
        .into_iter()
        .flatten()
        .any(|t| t.matches(offered))
}

/// Lets `req` through with its [`Caller`].
async fn pass(mut req: Request, next: Next) -> Response {
    let peer = peer(&req);
    req.extensions_mut().insert(Caller(format!("http:{peer}")));
    next.run(req).await
}

fn peer(req: &Request) -> String {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// 401 for `why`, logged with the path and the peer, never the header: a
/// near-miss token is still most of a secret.
fn refuse(req: &Request, why: &str) -> Response {
    tracing::warn!(peer = %peer(req), path = %req.uri().path(), "refused an HTTP request: {why}");
    unauthorized(why)
}

async fn check(token: &Secret, req: Request, next: Next) -> Response {
    match bearer(req.headers()) {
        Some(offered) if token.matches(offered) => pass(req, next).await,
        Some(_) => refuse(&req, "wrong bearer token"),
        None => refuse(&req, "missing bearer token"),
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme
/// case-insensitive, as RFC 7235 says).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at_checked(7)?;
    (scheme.eq_ignore_ascii_case(b"bearer ") && !token.is_empty()).then_some(token)
}

fn unauthorized(why: &str) -> Response {
    let mut resp = error_reply(
        StatusCode::UNAUTHORIZED,
        &format!("{why}: send Authorization: Bearer <a token of this endpoint's scope>"),
    )
    .into_response();
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"qbridge\""),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn bearer_tokens_are_read_with_any_scheme_case() {
        assert_eq!(bearer(&headers("Bearer abc")), Some(&b"abc"[..]));
        assert_eq!(bearer(&headers("bearer abc")), Some(&b"abc"[..]));
        assert_eq!(bearer(&headers("Bearer ")), None);
        assert_eq!(bearer(&headers("Basic abc")), None);
        assert_eq!(bearer(&headers("Bear")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }
}
