//! Configuration: a TOML file plus flags/env, validated into [`Config`]. Unknown
//! keys and wrong types are errors that name the key; durations are strings like
//! `"250ms"`, `"30s"`, `"5m"`, `"1h"`; sizes like `"1MiB"`, `"512KiB"` or bytes
//! (see [`units`]). Anything that would only fail once jobs run (a bad handler
//! header, a schedule that can never fire) fails here instead.

mod cutover;
mod routes;
pub mod tls;
mod units;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::queue::backoff::Backoff;
use crate::queue::claim::TenantCap;
use crate::queue::schedule::{Cadence, Schedule};
use crate::queue::{validate, NewJob};
use crate::secret::Secret;

pub use cutover::{CutoverConfig, DiffConfig, DualWriteMirrors, GatesConfig, ShadowConfig};
pub use routes::{check_redis_url, ProxyConfig, PushEnd, RedisConsumerConfig, RouteConfig};
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
    /// Also require the admin token for enqueue and outcomes (open by
    /// default: producers and worker fleets post there).
    #[serde(default)]
    pub enqueue_requires_token: bool,
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
    worker_id: Option<String>,
    #[serde(default)]
    shutdown_deadline: Option<Dur>,
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
    proxy: Option<routes::ProxyFile>,
}

/// Everything `qbridge run` needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub database_url: String,
    pub max_connections: u32,
    /// `locked_by` of this process's claims.
    pub worker_id: String,
    /// Longest a graceful shutdown waits for running handlers.
    pub shutdown_deadline: Duration,
    pub payload_limit: usize,
    pub reaper_interval: Duration,
    pub completer_batch: usize,
    pub completer_tick: Duration,
    pub http: HttpConfig,
    /// The admin API's bearer token (`QBRIDGE_ADMIN_TOKEN`, else
    /// `[http] admin_token_file`); `None` disables the admin API.
    pub admin_token: Option<Secret>,
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
    pub http_listen: Option<String>,
    pub redis_url: Option<String>,
    /// `QBRIDGE_ADMIN_TOKEN`: wins over `[http] admin_token_file`.
    pub admin_token: Option<Secret>,
    /// `QBRIDGE_PROXY_PASSWORD`: wins over `[proxy] password_file`.
    pub proxy_password: Option<Secret>,
}

impl Overrides {
    /// The secrets of the environment (`QBRIDGE_ADMIN_TOKEN`,
    /// `QBRIDGE_PROXY_PASSWORD`). Environment only, never flags: a flag's
    /// value shows in `ps` to every user of the machine.
    pub fn with_env_secrets(mut self) -> Result<Overrides> {
        self.admin_token = Secret::from_env("QBRIDGE_ADMIN_TOKEN")?;
        self.proxy_password = Secret::from_env("QBRIDGE_PROXY_PASSWORD")?;
        Ok(self)
    }
}

impl Config {
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

fn validate_file(file: FileConfig, overrides: &Overrides) -> Result<Config> {
    let database_url = overrides
        .database_url
        .clone()
        .or(file.database_url)
        .unwrap_or_else(|| "postgres://postgres:postgres@127.0.0.1:5432/postgres".into());
    let payload_limit = file
        .payload_limit
        .map(|b| b.0)
        .unwrap_or(validate::DEFAULT_PAYLOAD_LIMIT);
    if payload_limit == 0 {
        return Err(Error::Config("payload_limit must be more than 0".into()));
    }
    let mut http = file.http;
    if let Some(listen) = &overrides.http_listen {
        http.listen = listen.clone();
    }
    let mut names = HashSet::new();
    let mut pools = Vec::new();
    for (i, p) in file.pools.into_iter().enumerate() {
        let pool = validate_pool(i, p)?;
        if !names.insert(pool.name.clone()) {
            return Err(Error::Config(format!(
                "two pools are named {:?}",
                pool.name
            )));
        }
        pools.push(pool);
    }
    let mut schedules = Vec::new();
    let mut schedule_names = HashSet::new();
    for s in file.schedules {
        if !schedule_names.insert(s.name.clone()) {
            return Err(Error::Config(format!(
                "two schedules are named {:?}",
                s.name
            )));
        }
        schedules.push(validate_schedule(s, payload_limit)?);
    }
    let redis_url = overrides
        .redis_url
        .clone()
        .or(file.redis_url)
        .unwrap_or_else(routes::default_redis_url);
    check_redis_url(&redis_url).map_err(|e| Error::Config(format!("redis_url: {e}")))?;
    let admin_token = match (&overrides.admin_token, &http.admin_token_file) {
        (Some(token), _) => Some(token.clone()),
        (None, Some(path)) => Some(Secret::from_file("http.admin_token_file", path)?),
        (None, None) => None,
    };
    if http.enqueue_requires_token && admin_token.is_none() {
        return Err(Error::Config(
            "http.enqueue_requires_token needs an admin token: set QBRIDGE_ADMIN_TOKEN or [http] admin_token_file".into(),
        ));
    }
    let redis_tls = routes::redis_tls(file.redis_ca_file.as_deref(), &redis_url)
        .map_err(|e| Error::Config(format!("redis_ca_file: {e}")))?;
    let proxy = routes::validate_proxy(
        file.proxy,
        &redis_url,
        &redis_tls,
        overrides.proxy_password.clone(),
    )?;
    let redis_db =
        routes::redis_url_db(&redis_url).map_err(|e| Error::Config(format!("redis_url: {e}")))?;
    let (routes, route_pools) = routes::validate_routes(file.routes, redis_db)?;
    for route_pool in route_pools {
        if let Some(other) = pools
            .iter()
            .find(|p: &&PoolConfig| p.queues.iter().any(|q| route_pool.queues.contains(q)))
        {
            return Err(Error::Config(format!(
                "queue {:?} is served by both pool {:?} and {:?}; a route with a handler brings its own pool",
                route_pool.queues[0], other.name, route_pool.name
            )));
        }
        pools.push(route_pool);
    }
    let worker_id = file.worker_id.unwrap_or_else(default_worker_id);
    Ok(Config {
        database_url,
        max_connections: file.max_connections.unwrap_or(10).max(2),
        worker_id,
        shutdown_deadline: file
            .shutdown_deadline
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(30)),
        payload_limit,
        reaper_interval: file
            .reaper_interval
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(5)),
        completer_batch: file.completer_batch.unwrap_or(1000).max(1),
        completer_tick: file
            .completer_tick
            .map(|d| d.0)
            .unwrap_or(Duration::from_millis(2)),
        http,
        admin_token,
        history: file.history,
        pools,
        schedules,
        redis_url,
        redis_tls,
        routes,
        proxy,
    })
}

fn default_worker_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "qbridge".into());
    format!("{host}:{}", std::process::id())
}

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
    let batch_size = p.batch_size.unwrap_or(concurrency.min(100) as i64);
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

fn validate_schedule(s: ScheduleFile, payload_limit: usize) -> Result<Schedule> {
    let ctx = |msg: String| Error::Config(format!("schedule {:?}: {msg}", s.name));
    validate::queue_name(&s.queue).map_err(|e| ctx(e.to_string()))?;
    // Inner errors are config errors already: keep their text, not their prefix.
    let inner = |e: Error| match e {
        Error::Config(m) => m,
        other => other.to_string(),
    };
    let cadence = match (&s.every, &s.cron) {
        // Instance keys are unix seconds: a shorter period would collide.
        (Some(d), None) if d.0 < Duration::from_secs(1) => {
            return Err(ctx("every must be at least 1s".into()))
        }
        (Some(d), None) => Cadence::Every(d.0),
        (None, Some(expr)) => Cadence::cron(expr).map_err(|e| ctx(inner(e)))?,
        _ => return Err(ctx("set exactly one of `every` and `cron`".into())),
    };
    // A schedule that can never fire (a past year, 30 February, a period past
    // the calendar's end) is a typo; say so now rather than once per tick.
    let now = chrono::Utc::now();
    let fires = match &cadence {
        Cadence::Every(d) => chrono::Duration::from_std(*d)
            .ok()
            .and_then(|d| now.checked_add_signed(d))
            .is_some(),
        Cadence::Cron(_) => cadence.next_after(now).is_some(),
    };
    if !fires {
        return Err(ctx(match &s.cron {
            Some(expr) => format!("cron expression {expr:?} has no fire time in the future"),
            None => "every is too long: it would never fire".into(),
        }));
    }
    let mut job = NewJob::new(
        s.queue.clone(),
        s.payload.clone().unwrap_or(serde_json::json!({})),
    );
    job.kind = s.kind.clone();
    job.priority = s.priority;
    validate::payload_value(&job.payload, payload_limit).map_err(|e| ctx(e.to_string()))?;
    // Each instance gets the key `schedule:<name>:<unix seconds>`: check the
    // longest one along with the kind.
    let mut instance = job.clone();
    instance.key = Some(format!("schedule:{}:{}", s.name, i64::MAX));
    validate::job_fields(&instance).map_err(|e| ctx(e.to_string()))?;
    Ok(Schedule {
        name: s.name,
        cadence,
        job,
    })
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;

#[cfg(test)]
mod access_tests;

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
