//! Every Redis key qbridge reads or writes, built in one place.

use crate::routes::Route;

/// The Redis list where a route's unmirrored items wait for Postgres.
pub fn gap_key(route: &Route) -> String {
    format!("qbridge:gap:{}", route.name)
}

/// Escapes Redis glob characters (a route or consumer name may hold them).
pub fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
