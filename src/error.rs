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

    /// A well-formed request that the current state refuses: a phase
    /// change a route's phase does not allow (no phase before it, a lost
    /// compare-and-swap, `--force` without a reason), a step that needs
    /// Redis when none is reachable. The admin API answers it with 409.
    #[error("{0}")]
    Refused(String),

    /// A check qbridge runs on itself failed: the drill lost or doubled a
    /// job, a fault scenario's fault did not show, a benchmark's invariant
    /// broke. Exits non-zero with what it saw.
    #[error("{0}")]
    CheckFailed(String),

    /// This machine lacks what a command needs to run at all (a server
    /// binary, a database it may create): says what to install or pass.
    #[error("{0}")]
    Environment(String),

    /// A configuration file or flag that does not validate.
    #[error("config: {0}")]
    Config(String),

    /// The database could not be reached at all.
    #[error("cannot connect to Postgres at {url}: {reason} (is it running? check --database-url / QBRIDGE_DATABASE_URL)")]
    Unreachable { url: String, reason: String },

    /// Redis could not be reached.
    #[error("cannot connect to Redis at {url}: {reason} (is it running? check --redis-url / QBRIDGE_REDIS_URL)")]
    RedisUnreachable { url: String, reason: String },

    /// A Redis command failed. Kept typed, so a caller can tell an outage
    /// from a refused command ([`Error::is_unavailable`]).
    #[error("Redis: {0}")]
    Redis(#[from] redis::RedisError),

    /// A Redis command failed while qbridge was `doing` something.
    #[error("Redis: {doing}: {source}")]
    RedisWhile {
        /// What qbridge was doing, for the message.
        doing: String,
        /// Redis's error.
        source: redis::RedisError,
    },

    /// The schema is older than this binary.
    #[error("database schema is not current: run `qbridge migrate` first")]
    SchemaNotCurrent,

    /// The schema is newer than this binary: a newer qbridge migrated it.
    #[error("database schema is newer than this qbridge (migration {applied} applied, this binary knows up to {known}): run the newer qbridge, or roll the deploy forward")]
    SchemaNewer { applied: i64, known: i64 },

    /// A database error during an operation.
    #[error("database: {0}{hint}", hint = undeclared_pooler_hint(&.0.to_string()))]
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

impl Error {
    /// A Redis error with what qbridge was doing when it happened.
    pub fn redis(doing: impl Into<String>, source: redis::RedisError) -> Error {
        Error::RedisWhile {
            doing: doing.into(),
            source,
        }
    }

    /// Whether this error means "the server is not there" (Postgres or
    /// Redis down, unreachable, restarting, or out of connections) as
    /// opposed to a request it refused: the first is worth waiting out and
    /// retrying, the second is not.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Db(e) => is_postgres_unavailable(e),
            Error::Unreachable { .. } | Error::RedisUnreachable { .. } => true,
            Error::Redis(e) | Error::RedisWhile { source: e, .. } => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
            }
            _ => false,
        }
    }
}

/// Postgres errors that mean "the server is not there": I/O, the pool,
/// TLS, the protocol, and the SQLSTATE classes 57 (operator intervention:
/// shutdown, admin termination), 08 (connection exception) and 55P03
/// (lock not available, which the mirror's `lock_timeout` raises when a
/// batch is stuck behind a lock).
/// What to change when a failure shows a transaction-mode pooler that was
/// not declared: PgBouncer's refusal of a startup parameter, or a named
/// statement that met another client's on a shared server connection
/// ("already exists", SQLSTATE 42P05) or is missing from the one it landed
/// on ("does not exist", 26000). Declared, statements are unnamed and
/// neither can happen.
pub fn undeclared_pooler_hint(reason: &str) -> &'static str {
    if reason.contains("prepared statement \"sqlx_s_")
        || reason.contains("unsupported startup parameter")
    {
        " (a transaction-mode pooler such as PgBouncer is in front of Postgres: set [database] pooler = \"pgbouncer-transaction\" or --pooler pgbouncer-transaction)"
    } else {
        ""
    }
}

fn is_postgres_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(e) => e
            .code()
            .is_some_and(|c| c.starts_with("57") || c.starts_with("08") || c == "55P03"),
        _ => false,
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
