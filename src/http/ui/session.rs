//! Console sessions: the login form takes the admin token (compared in
//! constant time, never logged) and opens a session — a random id in an
//! HttpOnly, SameSite=Strict cookie scoped to `/ui`, kept in memory for
//! [`IDLE`] since its last use and [`LIFETIME`] at most. Each session has a
//! CSRF token every console form carries; a POST without the right one is
//! refused. The login form itself is guarded the same way by a short-lived
//! cookie it sets (double submit). Sessions live in the process: a restart
//! or another process behind a balancer asks to log in again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, HeaderValue};
use subtle::ConstantTimeEq;

/// A session ends this long after its last request.
pub const IDLE: Duration = Duration::from_secs(30 * 60);
/// And this long after it began, whatever its use.
pub const LIFETIME: Duration = Duration::from_secs(8 * 3600);
/// Sessions kept at most (the oldest go first): memory stays bounded
/// whoever hammers the login form.
const MAX_SESSIONS: usize = 1000;

pub const SESSION_COOKIE: &str = "qb_session";
pub const LOGIN_COOKIE: &str = "qb_login";

/// One signed-in operator.
#[derive(Debug, Clone)]
pub struct Session {
    pub csrf: String,
    /// Who they are in the audit log: `console:<peer address>`.
    pub who: String,
    started: Instant,
    last: Instant,
}

/// The process's console sessions.
#[derive(Clone, Default)]
pub struct Sessions(Arc<Mutex<HashMap<String, Session>>>);

impl Sessions {
    /// Opens a session for `who`; returns its id.
    pub fn open(&self, who: String) -> String {
        let id = random_token();
        let now = Instant::now();
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|_, s| alive(s, now));
        if all.len() >= MAX_SESSIONS {
            if let Some(oldest) = all
                .iter()
                .min_by_key(|(_, s)| s.started)
                .map(|(k, _)| k.clone())
            {
                all.remove(&oldest);
            }
        }
        all.insert(
            id.clone(),
            Session {
                csrf: random_token(),
                who,
                started: now,
                last: now,
            },
        );
        id
    }

    /// The live session named by the request's cookie; `touch` marks its
    /// use (an operator's request does, a background refresh does not).
    pub fn get(&self, headers: &HeaderMap, touch: bool) -> Option<Session> {
        let id = cookie(headers, SESSION_COOKIE)?;
        let now = Instant::now();
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match all.get_mut(&id) {
            Some(s) if alive(s, now) => {
                if touch {
                    s.last = now;
                }
                Some(s.clone())
            }
            Some(_) => {
                all.remove(&id);
                None
            }
            None => None,
        }
    }

    /// Ends the request's session.
    pub fn close(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, SESSION_COOKIE) {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        }
    }
}

fn alive(s: &Session, now: Instant) -> bool {
    now.duration_since(s.last) < IDLE && now.duration_since(s.started) < LIFETIME
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
    fn a_session_is_found_by_its_cookie_and_ends_at_logout() {
        let sessions = Sessions::default();
        let id = sessions.open("console:test".into());
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {SESSION_COOKIE}={id}")).unwrap(),
        );
        let s = sessions.get(&headers, true).expect("the session");
        assert_eq!(s.who, "console:test");
        assert_eq!(s.csrf.len(), 64);
        sessions.close(&headers);
        assert!(sessions.get(&headers, true).is_none());
    }

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
    fn a_background_refresh_does_not_keep_a_session_alive() {
        let sessions = Sessions::default();
        let id = sessions.open("console:test".into());
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("{SESSION_COOKIE}={id}")).unwrap(),
        );
        let before = sessions.0.lock().unwrap()[&id].last;
        std::thread::sleep(Duration::from_millis(5));
        sessions.get(&headers, false).unwrap();
        assert_eq!(sessions.0.lock().unwrap()[&id].last, before);
        sessions.get(&headers, true).unwrap();
        assert!(sessions.0.lock().unwrap()[&id].last > before);
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("ab", "abc"));
    }
}
