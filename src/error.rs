//! The crate's error type. Every message is one line that names the problem and,
//! where there is one, what to do about it. Connection URLs inside messages are
//! redacted before they get here (see [`crate::redact`]).

use thiserror::Error;

/// Errors at qbridge's module boundaries. `anyhow` is only used in `main`.
#[derive(Debug, Error)]
pub enum Error {
    /// A queue name outside 1–128 characters of `[A-Za-z0-9_.:-]`.
    #[error("invalid queue name {0:?}: use 1-128 characters of A-Z a-z 0-9 _ . : -")]
    InvalidQueueName(String),

    /// A payload that is not valid JSON.
    #[error("payload is not valid JSON ({0}); qbridge stores payloads as jsonb")]
    PayloadNotJson(String),

    /// A payload over the configured size limit.
    #[error("payload is {size} bytes, over the limit of {limit} bytes (raise payload_limit in the config if this is intended)")]
    PayloadTooLarge { size: usize, limit: usize },

    /// Anything else wrong with what a caller asked for.
    #[error("{0}")]
    InvalidInput(String),

    /// A configuration file or flag that does not validate.
    #[error("config: {0}")]
    Config(String),

    /// The database could not be reached at all.
    #[error("cannot connect to Postgres at {url}: {reason} (is it running? check --database-url / QBRIDGE_DATABASE_URL)")]
    Unreachable { url: String, reason: String },

    /// Redis could not be reached.
    #[error("cannot connect to Redis at {url}: {reason} (is it running? check --redis-url / QBRIDGE_REDIS_URL)")]
    RedisUnreachable { url: String, reason: String },

    /// A Redis command failed.
    #[error("Redis: {0}")]
    Redis(String),

    /// The schema is older than this binary.
    #[error("database schema is not current: run `qbridge migrate` first")]
    SchemaNotCurrent,

    /// A database error during an operation.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),

    /// A migration failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),

    /// The RESP proxy could not start.
    #[error("proxy: {0}")]
    Proxy(#[from] ProxyError),

    /// Local I/O (files, sockets).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e.to_string())
    }
}

/// Why the RESP proxy could not start. Each message is one line naming the
/// address (passwords redacted) and what to do, because these are what an
/// operator sees when `qbridge proxy` exits at start-up.
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

/// Shorthand used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
