//! `[proxy]` and the Redis URLs: the proxy's limits, its password and
//! upstream trust, and the checks every `redis://` URL passes at load (scheme,
//! host, database number, the `#insecure` fragment).

use serde::Deserialize;

use super::{Bytes, Dur, RedisTls};
use crate::config::tls::is_tls_url;
use crate::error::{Error, Result};

/// `[proxy]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct ProxyFile {
    #[serde(default)]
    enabled: bool,
    #[serde(default)]
    listen: Option<String>,
    #[serde(default)]
    upstream: Option<String>,
    #[serde(default)]
    upstream_ca_file: Option<std::path::PathBuf>,
    #[serde(default)]
    max_bulk_len: Option<Bytes>,
    #[serde(default)]
    max_elements: Option<usize>,
    #[serde(default)]
    max_clients: Option<usize>,
    #[serde(default)]
    mirror_buffer: Option<Bytes>,
    #[serde(default)]
    mirror_batch: Option<usize>,
    #[serde(default)]
    mirror_writers: Option<usize>,
    #[serde(default)]
    mirror_linger: Option<Dur>,
    #[serde(default)]
    password_file: Option<std::path::PathBuf>,
}

/// The RESP proxy, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyConfig {
    /// Whether `qbridge run` also runs the proxy (`qbridge proxy` always does).
    pub enabled: bool,
    /// Where producers connect.
    pub listen: String,
    /// The Redis every client connection is spliced to.
    pub upstream: String,
    /// Which CA a `rediss://` upstream is trusted by.
    pub upstream_tls: RedisTls,
    /// Longest bulk string a client may send; longer ones close the connection.
    pub max_bulk_len: usize,
    /// Most arguments in one client command.
    pub max_elements: usize,
    /// Client connections served at once; more wait in the accept backlog.
    pub max_clients: usize,
    /// Bytes of pushed items waiting for their Postgres write; when full, the
    /// proxy stops reading from clients (backpressure) instead of growing.
    pub mirror_buffer: usize,
    /// Most items per group-commit transaction.
    pub mirror_batch: usize,
    /// Group-commit transactions in flight at once.
    pub mirror_writers: usize,
    /// How long a group commit of mirror copies that is not full waits for
    /// more (the mirror writers' linger: fewer, fuller transactions).
    pub mirror_linger: std::time::Duration,
    /// The proxy's own password (`QBRIDGE_PROXY_PASSWORD`, else
    /// `[proxy] password_file`): when set, a client must AUTH to the proxy
    /// before anything else, and the upstream connection authenticates with
    /// the upstream URL's credentials. See `src/proxy/auth.rs`.
    pub password: Option<crate::secret::Secret>,
}

pub(super) fn default_redis_url() -> String {
    "redis://127.0.0.1:6379".into()
}

pub(super) fn validate_proxy(
    file: Option<ProxyFile>,
    redis_url: &str,
    redis_url_tls: &RedisTls,
    env_password: Option<crate::secret::Secret>,
) -> Result<ProxyConfig> {
    let file = file.unwrap_or(ProxyFile {
        enabled: false,
        listen: None,
        upstream: None,
        upstream_ca_file: None,
        max_bulk_len: None,
        max_elements: None,
        max_clients: None,
        mirror_buffer: None,
        mirror_batch: None,
        mirror_writers: None,
        mirror_linger: None,
        password_file: None,
    });
    let ctx = |m: &str| Error::Config(format!("proxy: {m}"));
    let positive = |v: Option<usize>, default: usize, name: &str| match v {
        Some(0) => Err(ctx(&format!("{name} must be more than 0"))),
        Some(v) => Ok(v),
        None => Ok(default),
    };
    let upstream = file.upstream.unwrap_or_else(|| redis_url.to_string());
    check_redis_url(&upstream).map_err(|e| ctx(&format!("upstream: {e}")))?;
    let password = match (env_password, &file.password_file) {
        (Some(password), _) => Some(password),
        (None, Some(path)) => Some(crate::secret::Secret::from_file(
            "proxy.password_file",
            path,
        )?),
        (None, None) => None,
    };
    // The upstream is usually redis_url's Redis, so it trusts redis_ca_file
    // unless told otherwise; a plain upstream simply has no use for it.
    let upstream_tls = match file.upstream_ca_file {
        Some(path) => {
            redis_tls(Some(&path), &upstream).map_err(|e| ctx(&format!("upstream_ca_file: {e}")))?
        }
        None if is_tls_url(&upstream) => redis_url_tls.clone(),
        None => RedisTls::default(),
    };
    Ok(ProxyConfig {
        enabled: file.enabled,
        listen: file.listen.unwrap_or_else(|| "127.0.0.1:6380".into()),
        upstream,
        upstream_tls,
        max_bulk_len: positive(file.max_bulk_len.map(|b| b.0), 16 << 20, "max_bulk_len")?,
        max_elements: positive(file.max_elements, 1 << 20, "max_elements")?,
        max_clients: positive(file.max_clients, 10_000, "max_clients")?,
        mirror_buffer: positive(file.mirror_buffer.map(|b| b.0), 64 << 20, "mirror_buffer")?,
        mirror_batch: positive(file.mirror_batch, 1000, "mirror_batch")?,
        mirror_writers: positive(file.mirror_writers, 2, "mirror_writers")?,
        mirror_linger: mirror_linger(file.mirror_linger)?,
        password,
    })
}

/// `[proxy] mirror_linger`'s default: measured best at depth 1 on a small
/// machine (CHANGELOG.md, 2026-11-28).
pub const DEFAULT_MIRROR_LINGER: std::time::Duration = std::time::Duration::from_millis(2);

/// The longest `mirror_linger` taken: the wait adds to every mirror copy's
/// lag, and the cutover's completeness gate reads that lag.
const MAX_MIRROR_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

fn mirror_linger(v: Option<Dur>) -> Result<std::time::Duration> {
    match v {
        None => Ok(DEFAULT_MIRROR_LINGER),
        Some(Dur(d)) if d > MAX_MIRROR_LINGER => Err(Error::Config(format!(
            "proxy: mirror_linger must be at most {}ms (got {}ms)",
            MAX_MIRROR_LINGER.as_millis(),
            d.as_millis()
        ))),
        Some(Dur(d)) => Ok(d),
    }
}

/// The trust of `redis_url`: `redis_ca_file` when set (only with
/// `rediss://`, where it is used), else the operating system's store.
pub(super) fn redis_tls(
    ca_file: Option<&std::path::Path>,
    url: &str,
) -> std::result::Result<RedisTls, String> {
    match ca_file {
        None => Ok(RedisTls::default()),
        Some(_) if !is_tls_url(url) => Err(format!(
            "set, but {:?} is not a rediss:// URL (a CA is only used for TLS)",
            crate::redact::redact_url(url)
        )),
        Some(path) => RedisTls::from_ca_file(path),
    }
}

/// The database number of a Redis URL (`redis://host/2` → 2; none → 0).
pub(super) fn redis_url_db(url: &str) -> std::result::Result<i64, String> {
    if super::is_sentinel_url(url) {
        return super::SentinelUrl::parse(url).map(|u| u.db);
    }
    let parsed = url::Url::parse(url).map_err(|e| e.to_string())?;
    let path = parsed.path().trim_start_matches('/');
    if path.is_empty() {
        return Ok(0);
    }
    path.parse::<i64>()
        .ok()
        .filter(|db| *db >= 0)
        .ok_or_else(|| {
            format!(
                "{:?}: the path must be a database number",
                crate::redact::redact_url(url)
            )
        })
}

/// A Redis URL qbridge can connect to: `redis://` or `rediss://`, with a host.
pub fn check_redis_url(url: &str) -> std::result::Result<(), String> {
    if super::is_sentinel_url(url) {
        return super::SentinelUrl::parse(url).map(|_| ());
    }
    let parsed = url::Url::parse(url)
        .map_err(|e| format!("{:?} is not a URL: {e}", crate::redact::redact_url(url)))?;
    if !matches!(parsed.scheme(), "redis" | "rediss") {
        return Err(format!(
            "{:?} must start with redis://, rediss:// or redis+sentinel://",
            crate::redact::redact_url(url)
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("{:?} has no host", crate::redact::redact_url(url)));
    }
    // The only fragment the redis crate knows; anything else is a typo it
    // would report only at the first connection.
    if let Some(fragment) = parsed.fragment() {
        if fragment != "insecure" || parsed.scheme() != "rediss" {
            return Err(format!(
                "{:?}: the only fragment understood is #insecure, with rediss://",
                crate::redact::redact_url(url)
            ));
        }
    }
    Ok(())
}
