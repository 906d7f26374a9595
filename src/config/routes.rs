//! `[[routes]]` and `[proxy]`: which Redis lists migrate to which Postgres
//! queues, in what format, with what handler, and how the RESP proxy runs.
//!
//! A route with a `handler` also gets a Postgres pool for its queue (named
//! `route:<name>`, settings from `[routes.pool]`), and with
//! `[routes.redis_consumer]` a Redis consumer that runs the same handler.

use std::collections::HashSet;
use std::time::Duration;

use serde::Deserialize;

use super::{validate_pool, Dur, HandlerConfig, PoolConfig, PoolFile};
use crate::error::{Error, Result};
use crate::model::formats::Format;
use crate::model::structures::KeyNames;
use crate::model::Phase;
use crate::queue::validate;

/// Which end of the list a producer pushes to (Redis consumers pop the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PushEnd {
    /// `LPUSH` (Sidekiq, Celery, most hand-rolled queues): consumers pop right.
    Lpush,
    /// `RPUSH` (Resque, RQ): consumers pop left.
    Rpush,
}

/// `[routes.pool]`: the Postgres consumer of the route's queue.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct RoutePoolFile {
    #[serde(default)]
    concurrency: Option<usize>,
    #[serde(default)]
    batch_size: Option<i64>,
    #[serde(default)]
    lease: Option<Dur>,
    #[serde(default)]
    poll_interval: Option<Dur>,
    #[serde(default)]
    prefetch_window: Option<Dur>,
    #[serde(default)]
    backoff_base: Option<Dur>,
    #[serde(default)]
    backoff_cap: Option<Dur>,
}

/// `[routes.redis_consumer]` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct RedisConsumerFile {
    #[serde(default)]
    concurrency: Option<usize>,
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    retry_delay: Option<Dur>,
    #[serde(default)]
    consumer_name: Option<String>,
}

/// The Redis consumer of a route, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisConsumerConfig {
    /// Items handled at once, each with its own connection and processing list.
    pub concurrency: usize,
    /// Attempts per item before it goes to the route's Redis dead list.
    pub max_attempts: u32,
    /// Pause before the next attempt of a failed item.
    pub retry_delay: Duration,
    /// Stable name of this consumer: its processing lists are
    /// `qbridge:processing:<route>:<name>:<n>`, so a restart with the same
    /// name finds and recovers them. Must be unique among running consumers
    /// of a route and the same after a restart. Defaults to the host name.
    pub consumer_name: String,
}

/// Who runs a route's jobs on the Redis side (`redis_side`; the default is
/// `qbridge` when the route has a `redis_consumer`, else `fleet`).
///
/// With `fleet` (the team's own Sidekiq/Celery/RQ workers) a job can be
/// running or done where qbridge never looks (popped by BRPOP, an unacked
/// hash, a retry set), and its outcome report may be late or never come: a
/// mirror copy with no outcome and in no list qbridge reads is "outcome
/// unknown", never "lost", and repair does not push it back.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RedisSideKind {
    Qbridge,
    Fleet,
}

/// `[[routes]]` as written in the file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteFile {
    #[serde(default)]
    name: Option<String>,
    redis_key: String,
    #[serde(default)]
    db: Option<i64>,
    queue: String,
    format: String,
    #[serde(default)]
    key_pointer: Option<String>,
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    push: Option<PushEnd>,
    #[serde(default)]
    dedup_window: Option<Dur>,
    #[serde(default)]
    max_attempts: Option<i32>,
    #[serde(default)]
    handler: Option<HandlerConfig>,
    #[serde(default)]
    pool: Option<RoutePoolFile>,
    #[serde(default)]
    redis_consumer: Option<RedisConsumerFile>,
    #[serde(default)]
    redis_side: Option<RedisSideKind>,
    #[serde(default)]
    priority_steps: Option<Vec<i64>>,
    #[serde(default)]
    key_prefix: Option<String>,
    #[serde(default)]
    priority_sep: Option<String>,
    #[serde(default)]
    unacked_key: Option<String>,
    #[serde(default)]
    unacked_index_key: Option<String>,
    #[serde(default)]
    shadow: Option<super::cutover::ShadowFile>,
    #[serde(default)]
    diff: Option<super::cutover::DiffFile>,
    #[serde(default)]
    gates: Option<super::cutover::GatesFile>,
}

/// A validated route.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    /// The route's name (metric label, CLI argument); defaults to the queue.
    pub name: String,
    /// The Redis list producers push to.
    pub redis_key: String,
    /// The Redis database (SELECT index) of that list; default 0. The proxy
    /// routes only pushes on this database's key.
    pub db: i64,
    /// The Postgres queue its jobs go to. One route per queue.
    pub queue: String,
    /// How list items are read (job key, kind, payload).
    pub format: Format,
    /// The phase a process starts from until a stored phase says otherwise.
    pub phase: Phase,
    /// How qbridge pushes to Redis (producer API, repair): the same end the
    /// route's producers use.
    pub push: PushEnd,
    /// How long a job key is remembered: a re-push within it is a duplicate.
    pub dedup_window: Duration,
    /// Attempts of the Postgres copy; `None` uses the queue default (25).
    pub max_attempts: Option<i32>,
    /// What runs a job of this route, on either side.
    pub handler: Option<HandlerConfig>,
    /// The route's Redis consumer, when qbridge runs it.
    pub redis_consumer: Option<RedisConsumerConfig>,
    /// Who runs the Redis side's jobs: what an absent outcome may mean.
    pub redis_side: RedisSideKind,
    /// How the framework names the route's keys where the team changed
    /// its defaults (kombu's `global_keyprefix`, `priority_steps`, `sep`,
    /// `unacked_key`, `unacked_index_key`; RQ's `RQ_KEY_PREFIX`).
    pub keys: KeyNames,
    /// Shadow calls, the diff and the gates.
    pub cutover: super::CutoverConfig,
}

/// Whether `s` may be one `:`-separated part of a Redis key name and of a
/// SCAN pattern: no `:` (route `a` with consumer `b:c` and route `a:b` with
/// consumer `c` would share processing lists), no glob characters, no
/// spaces, quotes or anything a shell or a log line would mangle.
fn is_key_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A route name goes into Redis keys (`qbridge:processing:<route>:...`), SCAN
/// patterns, metric labels and CLI arguments, so it is held to
/// [`is_key_part`]. `defaulted`: the name was taken from the queue.
fn route_name(name: &str, defaulted: bool) -> std::result::Result<(), String> {
    if is_key_part(name) {
        return Ok(());
    }
    let hint = if defaulted {
        " (it defaults to the queue name: set `name` to one without such characters)"
    } else {
        ""
    };
    Err(format!(
        "name must be 1 to 128 of A-Z a-z 0-9 _ . - because it is part of Redis key names and SCAN patterns{hint}"
    ))
}

/// The route's Redis database. The consumer, the producer API and repair
/// reach the list through redis_url, so a route lives in redis_url's
/// database; `db` only states it (the proxy matches pushes on it).
fn route_db(db: Option<i64>, redis_db: i64) -> std::result::Result<i64, String> {
    let db = db.unwrap_or(redis_db);
    if db < 0 {
        return Err("db must be 0 or more".into());
    }
    if db != redis_db {
        return Err(format!(
            "db {db} differs from the database of redis_url ({redis_db}); qbridge's consumer and repair use redis_url: point it at /{db} (one config per Redis database)"
        ));
    }
    Ok(db)
}

/// Validates every route and returns them with the Postgres pools of the
/// routes that have a handler.
pub(super) fn validate_routes(
    files: Vec<RouteFile>,
    redis_db: i64,
) -> Result<(Vec<RouteConfig>, Vec<PoolConfig>)> {
    let (mut names, mut keys, mut queues) = (HashSet::new(), HashSet::new(), HashSet::new());
    let mut routes = Vec::new();
    let mut pools = Vec::new();
    for file in files {
        let name = file.name.clone().unwrap_or_else(|| file.queue.clone());
        let ctx = |m: String| Error::Config(format!("route {name:?}: {m}"));
        validate::queue_name(&file.queue).map_err(|e| ctx(e.to_string()))?;
        route_name(&name, file.name.is_none()).map_err(ctx)?;
        if file.redis_key.is_empty() {
            return Err(ctx("redis_key is empty".into()));
        }
        if !names.insert(name.clone()) {
            return Err(ctx("two routes have this name".into()));
        }
        let db = route_db(file.db, redis_db).map_err(ctx)?;
        if !keys.insert((db, file.redis_key.clone())) {
            return Err(ctx(format!(
                "redis_key {:?} in db {} already belongs to another route",
                file.redis_key, db
            )));
        }
        if !queues.insert(file.queue.clone()) {
            return Err(ctx(format!(
                "queue {:?} already belongs to another route",
                file.queue
            )));
        }
        let format = match &file.key_pointer {
            Some(pointer) => Format::from_parts(&file.format, Some(pointer)),
            None => file.format.parse(),
        }
        .map_err(|e| ctx(e.to_string()))?;
        let phase = match &file.phase {
            Some(p) => p.parse().map_err(ctx)?,
            None => Phase::RedisOnly,
        };
        if file.max_attempts.is_some_and(|m| m < 1) {
            return Err(ctx("max_attempts must be at least 1".into()));
        }
        let dedup_window = file
            .dedup_window
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(7 * 86400));
        if dedup_window < Duration::from_secs(60) {
            return Err(ctx("dedup_window must be at least 1m".into()));
        }
        if file.handler.is_none() && (file.pool.is_some() || file.redis_consumer.is_some()) {
            return Err(ctx(
                "[routes.pool] and [routes.redis_consumer] need the route's handler".into(),
            ));
        }
        let keys = super::key_names::validate(
            &format,
            &file.redis_key,
            super::key_names::KeyNamesFile {
                key_prefix: file.key_prefix,
                priority_steps: file.priority_steps,
                priority_sep: file.priority_sep,
                unacked_key: file.unacked_key,
                unacked_index_key: file.unacked_index_key,
            },
        )
        .map_err(ctx)?;
        let cutover = super::cutover::validate(file.shadow, file.diff, file.gates).map_err(ctx)?;
        let redis_consumer = file
            .redis_consumer
            .map(|c| validate_consumer(c).map_err(|m| ctx(m.into())))
            .transpose()?;
        if let Some(handler) = &file.handler {
            pools.push(route_pool(
                &name,
                &file.queue,
                handler,
                file.pool.unwrap_or_default(),
            )?);
        }
        routes.push(RouteConfig {
            name,
            redis_key: file.redis_key,
            db,
            queue: file.queue,
            format,
            phase,
            push: file.push.unwrap_or(PushEnd::Lpush),
            dedup_window,
            max_attempts: file.max_attempts,
            handler: file.handler,
            redis_side: file.redis_side.unwrap_or(if redis_consumer.is_some() {
                RedisSideKind::Qbridge
            } else {
                RedisSideKind::Fleet
            }),
            redis_consumer,
            keys,
            cutover,
        });
    }
    Ok((routes, pools))
}

fn validate_consumer(
    c: RedisConsumerFile,
) -> std::result::Result<RedisConsumerConfig, &'static str> {
    let concurrency = c.concurrency.unwrap_or(4);
    if concurrency == 0 {
        return Err("redis_consumer.concurrency must be at least 1");
    }
    let max_attempts = c.max_attempts.unwrap_or(3);
    if max_attempts == 0 {
        return Err("redis_consumer.max_attempts must be at least 1");
    }
    // The kernel's host name, not $HOSTNAME: shells do not export it and
    // systemd does not set it, and two replicas falling back to one shared
    // name would share processing lists. Set it explicitly where the host
    // name is not stable across restarts (a Kubernetes Deployment's pods).
    let consumer_name = c.consumer_name.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
            .unwrap_or_else(|| "qbridge".into())
    });
    if !is_key_part(&consumer_name) {
        return Err(
            "redis_consumer.consumer_name must be 1 to 128 of A-Z a-z 0-9 _ . - (it is part of Redis key names)",
        );
    }
    Ok(RedisConsumerConfig {
        concurrency,
        max_attempts,
        retry_delay: c.retry_delay.map(|d| d.0).unwrap_or(Duration::from_secs(1)),
        consumer_name,
    })
}

/// The Postgres pool serving a route's queue with the route's handler.
fn route_pool(
    name: &str,
    queue: &str,
    handler: &HandlerConfig,
    p: RoutePoolFile,
) -> Result<PoolConfig> {
    validate_pool(
        0,
        PoolFile {
            name: Some(format!("route:{name}")),
            queues: vec![queue.to_string()],
            kinds: None,
            concurrency: p.concurrency,
            batch_size: p.batch_size,
            lease: p.lease,
            poll_interval: p.poll_interval,
            backoff_base: p.backoff_base,
            backoff_cap: p.backoff_cap,
            lock_retry_delay: None,
            prefetch_window: p.prefetch_window,
            tenant: None,
            handler: handler.clone(),
        },
    )
}
