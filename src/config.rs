//! Configuration: a TOML file plus flags/env, validated into [`Config`]. Unknown
//! keys and wrong types are errors that name the key; durations are strings like
//! `"250ms"`, `"30s"`, `"5m"`, `"1h"`; sizes like `"1MiB"`, `"512KiB"` or bytes
//! (see [`units`]). Anything that would only fail once jobs run (a bad handler
//! header, a schedule that can never fire) fails here instead.

mod assemble;
mod cutover;
mod database;
mod key_names;
mod pools;
mod proxy;
mod routes;
mod schedules;
mod sentinel_url;
pub mod tls;
mod units;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::queue::backoff::Backoff;
use crate::queue::claim::TenantCap;
use crate::queue::schedule::Schedule;
use crate::secret::Secret;

use assemble::validate_file;
pub use cutover::{CutoverConfig, DiffConfig, DualWriteMirrors, GatesConfig, ShadowConfig};
pub use database::{DatabaseConfig, Pooler};
pub(crate) use pools::{check_handler, validate_pool};
pub use pools::{header_map, DEFAULT_PREFETCH_WINDOW, MAX_PREFETCH_WINDOW};
pub use proxy::{check_redis_url, ProxyConfig, DEFAULT_MIRROR_LINGER};
pub use routes::{PushEnd, RedisConsumerConfig, RedisSideKind, RouteConfig};
pub use sentinel_url::{is_sentinel_url, SentinelUrl};
use tls::RedisTls;
pub use units::{parse_duration, parse_size, Bytes, Dur};

fn default_listen() -> String {
    "127.0.0.1:9187".into()
}

/// `[http]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Address of /metrics, /livez, /readyz. Loopback unless set otherwise.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Largest request body (enqueue batches).
    #[serde(default = "default_max_body")]
    pub max_body: Bytes,
    /// A file holding the admin API's bearer token (`QBRIDGE_ADMIN_TOKEN`
    /// wins over it). Without either, the admin endpoints answer 403.
    #[serde(default)]
    pub admin_token_file: Option<PathBuf>,
    /// Also require the admin token for enqueue and outcomes when no token
    /// of their own is set (open by default on loopback).
    #[serde(default)]
    pub enqueue_requires_token: bool,
    /// A file holding the token fleets report outcomes with
    /// (`QBRIDGE_REPORT_TOKEN` wins over it): `POST /v1/outcomes` then
    /// needs it (or the admin token), and it opens nothing else.
    #[serde(default)]
    pub report_token_file: Option<PathBuf>,
    /// A file holding the token producers enqueue with over HTTP
    /// (`QBRIDGE_ENQUEUE_TOKEN` wins over it): `POST /v1/queues/{queue}/jobs`
    /// then needs it (or the admin token), and it opens nothing else.
    #[serde(default)]
    pub enqueue_token_file: Option<PathBuf>,
    /// The queues the enqueue token may enqueue to; empty: every queue.
    #[serde(default)]
    pub enqueue_queues: Vec<String>,
}

fn default_max_body() -> Bytes {
    Bytes(16 << 20)
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: default_listen(),
            max_body: default_max_body(),
            admin_token_file: None,
            enqueue_requires_token: false,
            report_token_file: None,
            enqueue_token_file: None,
            enqueue_queues: Vec::new(),
        }
    }
}

/// A pool's handler.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum HandlerConfig {
    /// POST the payload to `url`.
    Http {
        url: String,
        #[serde(default = "default_handler_timeout")]
        timeout: Dur,
        #[serde(default)]
        headers: BTreeMap<String, String>,
    },
    /// Run `program` with the payload on stdin.
    Command {
        program: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default = "default_handler_timeout")]
        timeout: Dur,
        /// Exit codes that mean "permanent failure" (dead-letter at once).
        #[serde(default)]
        permanent_exit_codes: Vec<i32>,
    },
    /// Completes at once (benchmarks, demos). A struct variant, not a unit
    /// one: serde ignores unknown keys beside the tag of a unit variant.
    Noop {},
}

fn default_handler_timeout() -> Dur {
    Dur(Duration::from_secs(30))
}

/// `[pools.tenant]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// JSON pointer to the tenant in the payload, e.g. `/tenant_id`.
    pub pointer: String,
    /// Most jobs per tenant in one claim.
    pub cap: i64,
}

/// `[[pools]]` as written in the file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct PoolFile {
    pub(crate) name: Option<String>,
    pub(crate) queues: Vec<String>,
    #[serde(default)]
    pub(crate) kinds: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) concurrency: Option<usize>,
    #[serde(default)]
    pub(crate) batch_size: Option<i64>,
    #[serde(default)]
    pub(crate) lease: Option<Dur>,
    #[serde(default)]
    pub(crate) poll_interval: Option<Dur>,
    #[serde(default)]
    pub(crate) backoff_base: Option<Dur>,
    #[serde(default)]
    pub(crate) backoff_cap: Option<Dur>,
    #[serde(default)]
    pub(crate) lock_retry_delay: Option<Dur>,
    #[serde(default)]
    pub(crate) prefetch_window: Option<Dur>,
    #[serde(default)]
    pub(crate) tenant: Option<TenantConfig>,
    pub(crate) handler: HandlerConfig,
}

/// A validated pool.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: String,
    pub queues: Vec<String>,
    pub kinds: Option<Vec<String>>,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Most jobs per claim.
    pub batch_size: i64,
    pub lease: Duration,
    /// The backstop: claim at least this often even without a NOTIFY.
    pub poll_interval: Duration,
    pub backoff: Backoff,
    pub lock_retry_delay: Duration,
    /// Claim beyond the free handlers about as many jobs as the pool starts
    /// in this window (zero: off). See `worker::prefetch`.
    pub prefetch_window: Duration,
    pub tenant: Option<TenantCap>,
    pub handler: HandlerConfig,
}

/// `[[schedules]]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct ScheduleFile {
    name: String,
    queue: String,
    #[serde(default)]
    every: Option<Dur>,
    #[serde(default)]
    cron: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    payload: Option<serde_json::Value>,
    #[serde(default)]
    priority: i32,
}

/// `[history]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HistoryConfig {
    /// Days of completed-job history to keep in `jobs_done`; 0 keeps none.
    #[serde(default)]
    pub retention_days: u32,
}

/// The whole file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    database_url: Option<String>,
    #[serde(default)]
    max_connections: Option<u32>,
    #[serde(default)]
    database: database::DatabaseFile,
    #[serde(default)]
    worker_id: Option<String>,
    #[serde(default)]
    shutdown_deadline: Option<Dur>,
    #[serde(default)]
    state_dir: Option<std::path::PathBuf>,
    #[serde(default)]
    payload_limit: Option<Bytes>,
    #[serde(default)]
    reaper_interval: Option<Dur>,
    #[serde(default)]
    completer_batch: Option<usize>,
    #[serde(default)]
    completer_tick: Option<Dur>,
    #[serde(default)]
    http: HttpConfig,
    #[serde(default)]
    history: HistoryConfig,
    #[serde(default)]
    pools: Vec<PoolFile>,
    #[serde(default)]
    schedules: Vec<ScheduleFile>,
    #[serde(default)]
    redis_url: Option<String>,
    #[serde(default)]
    redis_ca_file: Option<std::path::PathBuf>,
    #[serde(default)]
    routes: Vec<routes::RouteFile>,
    #[serde(default)]
    proxy: Option<proxy::ProxyFile>,
}

/// Everything `qbridge run` needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub database_url: String,
    pub max_connections: u32,
    /// `[database]`: a pooler in front, a direct URL for sessions.
    pub database: DatabaseConfig,
    /// `locked_by` of this process's claims.
    pub worker_id: String,
    /// Longest a graceful shutdown waits for running handlers.
    pub shutdown_deadline: Duration,
    /// Where this process keeps what must outlive it (the Redis consumer's
    /// outcome spool): `state_dir`, else `$STATE_DIRECTORY` (systemd), else
    /// `$XDG_STATE_HOME/qbridge`, else `~/.local/state/qbridge`.
    pub state_dir: std::path::PathBuf,
    pub payload_limit: usize,
    pub reaper_interval: Duration,
    pub completer_batch: usize,
    pub completer_tick: Duration,
    pub http: HttpConfig,
    /// The admin API's bearer token (`QBRIDGE_ADMIN_TOKEN`, else
    /// `[http] admin_token_file`); `None` disables the admin API.
    pub admin_token: Option<Secret>,
    /// The reporting token (`QBRIDGE_REPORT_TOKEN` or `[http]
    /// report_token_file`).
    pub report_token: Option<Secret>,
    /// The enqueue token (`QBRIDGE_ENQUEUE_TOKEN` or `[http]
    /// enqueue_token_file`), for `[http] enqueue_queues`.
    pub enqueue_token: Option<Secret>,
    pub history: HistoryConfig,
    pub pools: Vec<PoolConfig>,
    pub schedules: Vec<Schedule>,
    /// The Redis of the routes (consumers, producer API, repair).
    pub redis_url: String,
    /// Which CA `rediss://` connections to `redis_url` trust.
    pub redis_tls: crate::config::tls::RedisTls,
    /// Redis lists migrating to Postgres queues.
    pub routes: Vec<RouteConfig>,
    /// The RESP proxy.
    pub proxy: ProxyConfig,
}

/// Values from flags/env that win over the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub database_url: Option<String>,
    /// `--pooler` / `QBRIDGE_POOLER`: wins over `[database] pooler`.
    pub pooler: Option<Pooler>,
    pub http_listen: Option<String>,
    pub redis_url: Option<String>,
    /// `QBRIDGE_ADMIN_TOKEN`: wins over `[http] admin_token_file`.
    pub admin_token: Option<Secret>,
    /// `QBRIDGE_PROXY_PASSWORD`: wins over `[proxy] password_file`.
    pub proxy_password: Option<Secret>,
    /// `QBRIDGE_REPORT_TOKEN`: wins over `[http] report_token_file`.
    pub report_token: Option<Secret>,
    /// `QBRIDGE_ENQUEUE_TOKEN`: wins over `[http] enqueue_token_file`.
    pub enqueue_token: Option<Secret>,
}

impl Overrides {
    /// The secrets of the environment (`QBRIDGE_ADMIN_TOKEN`,
    /// `QBRIDGE_REPORT_TOKEN`, `QBRIDGE_ENQUEUE_TOKEN`,
    /// `QBRIDGE_PROXY_PASSWORD`). Environment only, never flags: a flag's
    /// value shows in `ps` to every user of the machine.
    pub fn with_env_secrets(mut self) -> Result<Overrides> {
        self.admin_token = Secret::from_env("QBRIDGE_ADMIN_TOKEN")?;
        self.report_token = Secret::from_env("QBRIDGE_REPORT_TOKEN")?;
        self.enqueue_token = Secret::from_env("QBRIDGE_ENQUEUE_TOKEN")?;
        self.proxy_password = Secret::from_env("QBRIDGE_PROXY_PASSWORD")?;
        Ok(self)
    }
}

impl Config {
    /// The pool of a command or process: `database_url` through `[database]
    /// pooler`, at most `max_connections`.
    pub async fn open_db(&self, max_connections: u32) -> Result<sqlx::PgPool> {
        crate::db::connect_via(&self.database_url, self.database.pooler, max_connections).await
    }

    /// Reads and validates a config file (or none: defaults), then applies overrides.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config> {
        let text = match path {
            Some(p) => std::fs::read_to_string(p)
                .map_err(|e| Error::Config(format!("cannot read {}: {e}", p.display())))?,
            None => String::new(),
        };
        Config::from_toml(&text, overrides)
    }

    /// Parses and validates TOML text.
    pub fn from_toml(text: &str, overrides: &Overrides) -> Result<Config> {
        let file: FileConfig = toml::from_str(text).map_err(|e| {
            // toml's message spans lines (it quotes the source); keep it on one.
            Error::Config(
                e.to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" "),
            )
        })?;
        validate_file(file, overrides)
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;

#[cfg(test)]
mod access_tests;
