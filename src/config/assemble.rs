//! The whole file, validated into a [`Config`]: flags and environment over
//! the file over the defaults, each section checked by its own module
//! (`pools`, `schedules`, `routes`, `proxy`), then the checks that span
//! sections (unique names, a queue served by one pool, a token where one is
//! required).

use std::collections::HashSet;
use std::time::Duration;

use super::pools::validate_pool;
use super::schedules::validate_schedule;
use super::{
    proxy, routes, Config, FileConfig, HttpConfig, Overrides, PoolConfig, PoolFile, ScheduleFile,
};
use crate::error::{Error, Result};
use crate::queue::schedule::Schedule;
use crate::queue::validate;
use crate::secret::Secret;

pub(super) fn validate_file(file: FileConfig, overrides: &Overrides) -> Result<Config> {
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
    let mut pools = validate_pools(file.pools)?;
    let schedules = validate_schedules(file.schedules, payload_limit)?;
    let redis_url = overrides
        .redis_url
        .clone()
        .or(file.redis_url)
        .unwrap_or_else(proxy::default_redis_url);
    proxy::check_redis_url(&redis_url).map_err(|e| Error::Config(format!("redis_url: {e}")))?;
    let admin_token = admin_token(overrides, &http)?;
    let report_token = scoped_token(
        &overrides.report_token,
        &http.report_token_file,
        "http.report_token_file",
    )?;
    let enqueue_token = scoped_token(
        &overrides.enqueue_token,
        &http.enqueue_token_file,
        "http.enqueue_token_file",
    )?;
    let tokens = [
        ("admin", &admin_token),
        ("report", &report_token),
        ("enqueue", &enqueue_token),
    ];
    for (i, (a, ta)) in tokens.iter().enumerate() {
        for (b, tb) in &tokens[i + 1..] {
            if ta.is_some() && ta == tb {
                return Err(Error::Config(format!(
                    "the {a} and {b} tokens are the same: each scope needs its own token, or whoever holds the {b} token has the {a} token's rights"
                )));
            }
        }
    }
    if !http.enqueue_queues.is_empty() && enqueue_token.is_none() {
        return Err(Error::Config(
            "http.enqueue_queues names the queues of the enqueue token: set QBRIDGE_ENQUEUE_TOKEN or [http] enqueue_token_file".into(),
        ));
    }
    let redis_tls = proxy::redis_tls(file.redis_ca_file.as_deref(), &redis_url)
        .map_err(|e| Error::Config(format!("redis_ca_file: {e}")))?;
    let proxy = proxy::validate_proxy(
        file.proxy,
        &redis_url,
        &redis_tls,
        overrides.proxy_password.clone(),
    )?;
    let redis_db =
        proxy::redis_url_db(&redis_url).map_err(|e| Error::Config(format!("redis_url: {e}")))?;
    let (routes, route_pools) = routes::validate_routes(file.routes, redis_db)?;
    add_route_pools(&mut pools, route_pools)?;
    let worker_id = file.worker_id.unwrap_or_else(default_worker_id);
    let or = |d: Option<super::Dur>, default: Duration| d.map(|d| d.0).unwrap_or(default);
    let database = super::database::validate_database(file.database, overrides.pooler)?;
    Ok(Config {
        database_url,
        max_connections: file.max_connections.unwrap_or(10).max(2),
        database,
        worker_id,
        shutdown_deadline: or(file.shutdown_deadline, Duration::from_secs(30)),
        state_dir: file.state_dir.unwrap_or_else(default_state_dir),
        payload_limit,
        reaper_interval: or(file.reaper_interval, Duration::from_secs(5)),
        completer_batch: file.completer_batch.unwrap_or(1000).max(1),
        completer_tick: or(file.completer_tick, Duration::from_millis(2)),
        http,
        admin_token,
        report_token,
        enqueue_token,
        history: file.history,
        pools,
        schedules,
        redis_url,
        redis_tls,
        routes,
        proxy,
    })
}

fn validate_pools(files: Vec<PoolFile>) -> Result<Vec<PoolConfig>> {
    let mut names = HashSet::new();
    let mut pools = Vec::new();
    for (i, p) in files.into_iter().enumerate() {
        let pool = validate_pool(i, p)?;
        if !names.insert(pool.name.clone()) {
            return Err(Error::Config(format!(
                "two pools are named {:?}",
                pool.name
            )));
        }
        pools.push(pool);
    }
    Ok(pools)
}

fn validate_schedules(files: Vec<ScheduleFile>, payload_limit: usize) -> Result<Vec<Schedule>> {
    let mut schedules = Vec::new();
    let mut names = HashSet::new();
    for s in files {
        if !names.insert(s.name.clone()) {
            return Err(Error::Config(format!(
                "two schedules are named {:?}",
                s.name
            )));
        }
        schedules.push(validate_schedule(s, payload_limit)?);
    }
    Ok(schedules)
}

/// The admin token: `QBRIDGE_ADMIN_TOKEN` (the overrides) over
/// `[http] admin_token_file`; required when enqueueing requires one.
fn admin_token(overrides: &Overrides, http: &HttpConfig) -> Result<Option<Secret>> {
    let token = scoped_token(
        &overrides.admin_token,
        &http.admin_token_file,
        "http.admin_token_file",
    )?;
    if http.enqueue_requires_token && token.is_none() {
        return Err(Error::Config(
            "http.enqueue_requires_token needs an admin token: set QBRIDGE_ADMIN_TOKEN or [http] admin_token_file".into(),
        ));
    }
    Ok(token)
}

/// A scoped token: the environment's (`env`) over the file at `file`
/// (`setting` names it in errors).
fn scoped_token(
    env: &Option<Secret>,
    file: &Option<std::path::PathBuf>,
    setting: &str,
) -> Result<Option<Secret>> {
    match (env, file) {
        (Some(token), _) => Ok(Some(token.clone())),
        (None, Some(path)) => Ok(Some(Secret::from_file(setting, path)?)),
        (None, None) => Ok(None),
    }
}

/// A route with a handler brings its own pool; no queue may be served by two.
fn add_route_pools(pools: &mut Vec<PoolConfig>, route_pools: Vec<PoolConfig>) -> Result<()> {
    for route_pool in route_pools {
        if let Some(other) = pools
            .iter()
            .find(|p| p.queues.iter().any(|q| route_pool.queues.contains(q)))
        {
            return Err(Error::Config(format!(
                "queue {:?} is served by both pool {:?} and {:?}; a route with a handler brings its own pool",
                route_pool.queues[0], other.name, route_pool.name
            )));
        }
        pools.push(route_pool);
    }
    Ok(())
}

/// The usual place for a service's state: systemd's `StateDirectory=`,
/// then the XDG state folder, then the working directory.
fn default_state_dir() -> std::path::PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("STATE_DIRECTORY") {
        return dir.into();
    }
    if let Some(dir) = var("XDG_STATE_HOME") {
        return std::path::Path::new(&dir).join("qbridge");
    }
    match var("HOME") {
        Some(home) => std::path::Path::new(&home).join(".local/state/qbridge"),
        None => ".qbridge-state".into(),
    }
}

fn default_worker_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "qbridge".into());
    format!("{host}:{}", std::process::id())
}
