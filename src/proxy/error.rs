//! Why the proxy could not start. Each message is one line naming the
//! address (passwords redacted) and what to do, because these are what an
//! operator sees when `qbridge proxy` exits at start-up.

use thiserror::Error;

/// A start-up failure of the proxy.
#[derive(Debug, Error)]
pub enum ProxyError {
    /// The listen address is taken, not ours, or not an address.
    #[error("cannot listen on {addr}: {reason} (is another process on that port? change [proxy] listen)")]
    Listen {
        /// The address as configured.
        addr: String,
        /// The operating system's reason.
        reason: String,
    },
    /// The upstream URL cannot be used (not a `redis://` or `rediss://` URL
    /// with a host, or no CA certificates to check a `rediss://` one by).
    #[error("upstream {url}: {reason}")]
    UpstreamUrl {
        /// The URL, password redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The upstream Redis did not answer a PING at start-up.
    #[error(
        "upstream Redis at {url} does not answer: {reason} (is it running? check [proxy] upstream)"
    )]
    UpstreamUnreachable {
        /// The URL, password redacted.
        url: String,
        /// Refused, timed out, a TLS failure, or what it answered instead.
        reason: String,
    },
    /// The proxy has its own password, so clients' AUTH stops at the proxy,
    /// but the upstream URL carries no credentials for a Redis that needs them.
    #[error("upstream Redis at {url} requires a password, and with the proxy's own password set clients' AUTH stops at the proxy: put the upstream's credentials in [proxy] upstream (redis://user:password@host)")]
    UpstreamNeedsCredentials {
        /// The URL, password redacted.
        url: String,
    },
}
