//! Where a diff's window starts: what an operator typed (`--since 10m`, an
//! RFC 3339 time, `?since=` on the admin API).

use chrono::{DateTime, Utc};

use crate::error::{Error, Result};

/// A window start: a duration back from now (`10m`) or an RFC 3339 time.
pub fn parse_since(text: &str) -> Result<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let back = crate::config::parse_duration(text).map_err(|_| {
        Error::InvalidInput(format!(
            "since {text:?}: use a duration back from now (10m, 1h) or an RFC 3339 time"
        ))
    })?;
    Ok(Utc::now() - chrono::Duration::from_std(back).unwrap_or_default())
}
