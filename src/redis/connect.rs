//! Connecting to Redis: a reconnecting connection with timeouts, trusting
//! the configured CA on `rediss://`, or a one-line start-up error that names
//! the URL (password redacted) and, for a certificate problem, the key to
//! check.

use ::redis::aio::ConnectionManager;

use crate::config::tls::RedisTls;
use crate::error::{Error, Result};

/// The one-line start-up error for a Redis at `url` that does not answer
/// (password redacted; a certificate problem says so).
pub fn unreachable(url: &str, e: ::redis::RedisError) -> Error {
    let reason = e
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let hint = crate::config::tls::hint(&reason, "redis_ca_file");
    Error::RedisUnreachable {
        url: crate::redact::redact_url(url),
        reason: format!("{reason}{hint}"),
    }
}

/// Connects to Redis with reconnects, or a clear one-line error; a
/// `rediss://` URL trusts the operating system's CAs (see
/// [`connect_redis_with`] for a private CA).
pub async fn connect_redis(url: &str) -> Result<ConnectionManager> {
    connect_redis_with(url, &RedisTls::default()).await
}

/// [`connect_redis`] trusting `tls`'s CA on `rediss://`.
pub async fn connect_redis_with(url: &str, tls: &RedisTls) -> Result<ConnectionManager> {
    let unreachable = |e| unreachable(url, e);
    let client = tls.client(url).map_err(unreachable)?;
    let config = ::redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(std::time::Duration::from_secs(3)))
        .set_response_timeout(Some(std::time::Duration::from_secs(5)))
        .set_number_of_retries(2);
    ::redis::aio::ConnectionManager::new_with_config(client, config)
        .await
        .map_err(unreachable)
}
