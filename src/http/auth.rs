//! The bearer token in front of the admin API (and, with
//! `[http] enqueue_requires_token`, in front of enqueue and outcomes).
//!
//! - No token configured: the admin endpoints answer 403 and say how to
//!   enable them. The API is never open by default.
//! - No `Authorization: Bearer …` header, or a wrong token: 401 with
//!   `WWW-Authenticate: Bearer`. The token is compared in constant time
//!   ([`Secret::matches`]); neither the offered nor the configured token
//!   ever reaches a log line or a reply.
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
    match state.admin_token.as_ref() {
        None => error_reply(StatusCode::FORBIDDEN, DISABLED).into_response(),
        Some(token) => check(token, req, next).await,
    }
}

/// Middleware of enqueue and outcomes: open unless
/// `[http] enqueue_requires_token` (the config refuses that setting
/// without a token, so a missing one here means open).
pub(super) async fn require_for_enqueue(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    match state.admin_token.as_ref() {
        Some(token) if state.enqueue_requires_token => check(token, req, next).await,
        _ => next.run(req).await,
    }
}

async fn check(token: &Secret, mut req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_else(|| "unknown".into());
    match bearer(req.headers()) {
        Some(offered) if token.matches(offered) => {
            req.extensions_mut().insert(Caller(format!("http:{peer}")));
            next.run(req).await
        }
        offered => {
            let why = if offered.is_some() {
                "wrong bearer token"
            } else {
                "missing bearer token"
            };
            // The path and the peer, never the header: a near-miss token is
            // still most of a secret.
            tracing::warn!(peer = %peer, path = %req.uri().path(), "refused an HTTP request: {why}");
            unauthorized(why)
        }
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
        &format!("{why}: send Authorization: Bearer <the admin token>"),
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
