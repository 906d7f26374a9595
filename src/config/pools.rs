//! `[[pools]]` (and the pool a route's handler brings): each checked into a
//! [`PoolConfig`], its handler's URL, headers and program included, so a bad
//! handler is a config error at load, never a failure of every job.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::{HandlerConfig, PoolConfig, PoolFile};
use crate::error::{Error, Result};
use crate::queue::backoff::Backoff;
use crate::queue::claim::TenantCap;
use crate::queue::validate;

/// Long enough that a fast pool's claims carry hundreds of jobs, short
/// enough that a held job starts within milliseconds (measured in
/// `bench/processes/run.sh`).
pub const DEFAULT_PREFETCH_WINDOW: Duration = Duration::from_millis(50);

/// The longest `prefetch_window`: held jobs not started within the worker's
/// hold (1 s) are handed back, so a longer window would claim jobs only to
/// return them.
pub const MAX_PREFETCH_WINDOW: Duration = Duration::from_millis(500);

pub(crate) fn validate_pool(index: usize, p: PoolFile) -> Result<PoolConfig> {
    let name = p.name.unwrap_or_else(|| format!("pool{index}"));
    let ctx = |msg: String| Error::Config(format!("pool {name:?}: {msg}"));
    if p.queues.is_empty() {
        return Err(ctx("queues must name at least one queue".into()));
    }
    for q in &p.queues {
        validate::queue_name(q).map_err(|e| ctx(e.to_string()))?;
    }
    let concurrency = p.concurrency.unwrap_or(10);
    if concurrency == 0 {
        return Err(ctx("concurrency must be at least 1".into()));
    }
    // Claims may carry more than the free handlers (prefetch), so the default
    // no longer follows concurrency.
    let batch_size = p.batch_size.unwrap_or(100);
    if batch_size < 1 {
        return Err(ctx("batch_size must be at least 1".into()));
    }
    let lease = p.lease.map(|d| d.0).unwrap_or(Duration::from_secs(60));
    if lease < Duration::from_secs(1) {
        return Err(ctx("lease must be at least 1s".into()));
    }
    let poll_interval = p
        .poll_interval
        .map(|d| d.0)
        .unwrap_or(Duration::from_secs(1));
    if poll_interval.is_zero() {
        return Err(ctx("poll_interval must be more than 0".into()));
    }
    let prefetch_window = p
        .prefetch_window
        .map(|d| d.0)
        .unwrap_or(DEFAULT_PREFETCH_WINDOW);
    if prefetch_window > MAX_PREFETCH_WINDOW {
        return Err(ctx(format!(
            "prefetch_window must be at most {}ms (held jobs are handed back after 1s)",
            MAX_PREFETCH_WINDOW.as_millis()
        )));
    }
    let backoff = Backoff {
        base: p
            .backoff_base
            .map(|d| d.0)
            .unwrap_or(Backoff::default().base),
        cap: p.backoff_cap.map(|d| d.0).unwrap_or(Backoff::default().cap),
    };
    if backoff.base > backoff.cap {
        return Err(ctx("backoff_base must not exceed backoff_cap".into()));
    }
    let tenant = match p.tenant {
        None => None,
        Some(t) => {
            if t.cap < 1 {
                return Err(ctx("tenant.cap must be at least 1".into()));
            }
            if p.queues.len() != 1 {
                return Err(ctx(
                    "a tenant cap needs a pool with exactly one queue (use one pool per queue)"
                        .into(),
                ));
            }
            let path = validate::json_pointer_path(&t.pointer).map_err(|e| ctx(e.to_string()))?;
            Some(TenantCap { path, cap: t.cap })
        }
    };
    check_handler(&p.handler).map_err(ctx)?;
    Ok(PoolConfig {
        name,
        queues: p.queues,
        kinds: p.kinds,
        concurrency,
        batch_size,
        lease,
        poll_interval,
        backoff,
        lock_retry_delay: p
            .lock_retry_delay
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(1)),
        prefetch_window,
        tenant,
        handler: p.handler,
    })
}

/// Checks an HTTP handler's configured headers and builds the map sent with
/// every request. Errors name the header, never its value (it may be a token);
/// values are marked sensitive so `Debug` does not show them either.
pub fn header_map(headers: &BTreeMap<String, String>) -> std::result::Result<HeaderMap, String> {
    let mut map = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("handler header name {name:?} is not a valid HTTP header name"))?;
        let mut value = HeaderValue::from_str(value).map_err(|_| {
            format!("handler header {name:?} has a value HTTP cannot carry (control characters?)")
        })?;
        value.set_sensitive(true);
        map.insert(header, value);
    }
    Ok(map)
}

/// A handler's URL scheme, headers and program, checked at load (a bad one
/// is a config error, never a failure of every job).
pub(crate) fn check_handler(handler: &HandlerConfig) -> std::result::Result<(), String> {
    match handler {
        HandlerConfig::Http { url, headers, .. } => {
            let parsed = url::Url::parse(url).map_err(|e| format!("handler url {url:?}: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(format!("handler url {url:?} must be http or https"));
            }
            header_map(headers)?;
        }
        HandlerConfig::Command { program, .. } if program.is_empty() => {
            return Err("handler program is empty".into());
        }
        _ => {}
    }
    Ok(())
}
