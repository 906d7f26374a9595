//! Console sessions: the login form takes the admin token (compared in
//! constant time, never logged) and opens a session — a random id in an
//! HttpOnly, SameSite=Strict cookie scoped to `/ui`, alive for [`IDLE`]
//! since its last use and [`LIFETIME`] at most. Sessions are rows of
//! `qbridge.console_sessions` (the id's SHA-256, never the id), so every
//! process behind one address serves a signed-in operator, a restart signs
//! nobody out, and "sign out everywhere" ends them all. Each session has a
//! CSRF token every console form carries; a POST without the right one is
//! refused. The login form itself is guarded the same way by a short-lived
//! cookie it sets (double submit).

use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use subtle::ConstantTimeEq;

/// A session ends this long after its last request.
pub const IDLE: Duration = Duration::from_secs(30 * 60);
/// And this long after it began, whatever its use.
pub const LIFETIME: Duration = Duration::from_secs(8 * 3600);
/// Sessions kept at most (the oldest go first): the table stays bounded
/// whoever hammers the login form.
const MAX_SESSIONS: i64 = 1000;

pub const SESSION_COOKIE: &str = "qb_session";
pub const LOGIN_COOKIE: &str = "qb_login";

/// One signed-in operator.
#[derive(Debug, Clone)]
pub struct Session {
    pub csrf: String,
    /// Who they are in the audit log: `console:<peer address>`.
    pub who: String,
}

/// Drops ended sessions and the oldest beyond [`MAX_SESSIONS`], then adds
/// one. `$1` id hash, `$2` csrf, `$3` who, `$4`/`$5` idle/lifetime seconds.
const OPEN_SQL: &str = r#"
WITH ended AS (
    DELETE FROM qbridge.console_sessions
     WHERE last_at < now() - make_interval(secs => $4)
        OR started_at < now() - make_interval(secs => $5)),
over AS (
    DELETE FROM qbridge.console_sessions
     WHERE id_hash IN (SELECT id_hash FROM qbridge.console_sessions
                        ORDER BY started_at DESC OFFSET $6))
INSERT INTO qbridge.console_sessions (id_hash, csrf, who) VALUES ($1, $2, $3)
"#;

/// The live session of id hash `$1` (`$2`/`$3` idle/lifetime seconds),
/// its use recorded.
const TOUCH_SQL: &str = r#"
UPDATE qbridge.console_sessions SET last_at = now()
 WHERE id_hash = $1 AND last_at >= now() - make_interval(secs => $2)
   AND started_at >= now() - make_interval(secs => $3)
RETURNING csrf, who
"#;

/// The same without recording a use.
const PEEK_SQL: &str = r#"
SELECT csrf, who FROM qbridge.console_sessions
 WHERE id_hash = $1 AND last_at >= now() - make_interval(secs => $2)
   AND started_at >= now() - make_interval(secs => $3)
"#;

/// The console's sessions, in Postgres.
#[derive(Clone, Default)]
pub struct Sessions;

impl Sessions {
    /// Opens a session for `who`; returns its id (the cookie's value).
    pub async fn open(&self, db: &PgPool, who: String) -> sqlx::Result<String> {
        let id = random_token();
        sqlx::query(OPEN_SQL)
            .bind(hash(&id))
            .bind(random_token())
            .bind(who)
            .bind(IDLE.as_secs_f64())
            .bind(LIFETIME.as_secs_f64())
            .bind(MAX_SESSIONS - 1)
            .execute(db)
            .await?;
        Ok(id)
    }

    /// The live session named by the request's cookie; `touch` marks its
    /// use (an operator's request does, a background refresh does not).
    pub async fn get(
        &self,
        db: &PgPool,
        headers: &HeaderMap,
        touch: bool,
    ) -> sqlx::Result<Option<Session>> {
        let Some(id) = cookie(headers, SESSION_COOKIE) else {
            return Ok(None);
        };
        let sql = if touch { TOUCH_SQL } else { PEEK_SQL };
        let row: Option<(String, String)> = sqlx::query_as(sql)
            .bind(hash(&id))
            .bind(IDLE.as_secs_f64())
            .bind(LIFETIME.as_secs_f64())
            .fetch_optional(db)
            .await?;
        Ok(row.map(|(csrf, who)| Session { csrf, who }))
    }

    /// Ends the request's session.
    pub async fn close(&self, db: &PgPool, headers: &HeaderMap) -> sqlx::Result<()> {
        if let Some(id) = cookie(headers, SESSION_COOKIE) {
            sqlx::query("DELETE FROM qbridge.console_sessions WHERE id_hash = $1")
                .bind(hash(&id))
                .execute(db)
                .await?;
        }
        Ok(())
    }

    /// Ends every session, in every process: how many there were.
    pub async fn close_all(&self, db: &PgPool) -> sqlx::Result<u64> {
        let done = sqlx::query("DELETE FROM qbridge.console_sessions")
            .execute(db)
            .await?;
        Ok(done.rows_affected())
    }
}

/// What is stored of a session id.
fn hash(id: &str) -> Vec<u8> {
    Sha256::digest(id.as_bytes()).to_vec()
}

/// 32 random bytes, hex.
pub fn random_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `offered` is `expected` (constant time).
pub fn same(offered: &str, expected: &str) -> bool {
    offered.len() == expected.len() && bool::from(offered.as_bytes().ct_eq(expected.as_bytes()))
}

/// A cookie's value from the request.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// `Set-Cookie` for a console cookie: HttpOnly, SameSite=Strict, path
/// `/ui`; `max_age` 0 deletes it.
pub fn set_cookie(name: &str, value: &str, max_age: Duration) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{name}={value}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}",
        max_age.as_secs()
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("qb_session=; Path=/ui; Max-Age=0"))
}

/// `cookie` with the `Secure` attribute (sent over HTTPS only).
pub fn secure(cookie: HeaderValue) -> HeaderValue {
    let text = format!("{}; Secure", cookie.to_str().unwrap_or(""));
    HeaderValue::from_str(&text).unwrap_or(cookie)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_http_only_strict_and_secure_behind_https() {
        let c = set_cookie(SESSION_COOKIE, "abc", LIFETIME);
        let text = c.to_str().unwrap();
        assert!(
            text.contains("HttpOnly")
                && text.contains("SameSite=Strict")
                && text.contains("Path=/ui")
        );
        assert!(!text.contains("Secure"));
        assert!(secure(c).to_str().unwrap().ends_with("; Secure"));
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("ab", "abc"));
    }
}
