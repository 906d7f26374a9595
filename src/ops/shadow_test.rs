//! `qbridge cutover shadow-test R [--key K]`: one shadow call of a route's
//! handler with a job qbridge stored, so an operator can check before the
//! route enters `shadow` that the handler does nothing irreversible when
//! told `Qbridge-Mode: shadow` (`QBRIDGE_MODE=shadow` for a command).
//!
//! The call is what the worker makes in `shadow`: the route's shadow
//! handler (`[routes.shadow] handler`), or else the handler of the pool that
//! runs the route's queue, with the job's stored payload as the body. The
//! job is a real one (the newest the route stored, or the key given): a
//! hand-written body would test a payload the handler never receives.
//! Nothing is recorded — no outcome, no attempt, no claim — and the payload
//! is never printed (it is personal data).

use serde::Serialize;
use sqlx::PgPool;

use crate::config::{Config, HandlerConfig};
use crate::error::{Error, Result};
use crate::handler::{Handler, HandlerResult};
use crate::model::formats::decode_bytes;
use crate::queue::{ClaimedJob, JobCopy};
use crate::routes::Route;
use crate::shadow::{Digester, Mode};

/// What the shadow call answered.
#[derive(Debug, Clone, Serialize)]
pub struct ShadowTest {
    pub route: String,
    /// The job key the call carried.
    pub key: String,
    pub kind: Option<String>,
    /// Where the call went (a URL with its password cut, or a program).
    pub handler: String,
    /// `done`, or `retry: …` / `failed for good: …` with the handler's reason.
    pub answer: String,
    pub done: bool,
    /// SHA-256 of the response body (an `http` handler's), as the diff
    /// compares it.
    pub digest: Option<String>,
}

/// The newest stored job of the route (or the one keyed `key`): its key,
/// kind and payload, from a job row or else from the mirror ledger's bytes.
async fn stored_job(
    db: &PgPool,
    route: &Route,
    key: Option<&str>,
) -> Result<(String, Option<String>, serde_json::Value)> {
    let row: Option<(String, Option<String>, serde_json::Value)> = sqlx::query_as(
        "SELECT key, kind, payload FROM qbridge.jobs \
          WHERE queue = $1 AND key IS NOT NULL AND ($2::text IS NULL OR key = $2) \
          ORDER BY id DESC LIMIT 1",
    )
    .bind(&route.queue)
    .bind(key)
    .fetch_optional(db)
    .await?;
    if let Some(job) = row {
        return Ok(job);
    }
    let kept: Option<(String, Vec<u8>)> = sqlx::query_as(
        "SELECT key, original FROM qbridge.job_keys \
          WHERE queue = $1 AND original IS NOT NULL AND ($2::text IS NULL OR key = $2) \
          ORDER BY seen_at DESC LIMIT 1",
    )
    .bind(&route.queue)
    .bind(key)
    .fetch_optional(db)
    .await?;
    match kept {
        Some((key, bytes)) => {
            let decoded = decode_bytes(&route.format, bytes.into());
            Ok((key, decoded.kind, decoded.payload))
        }
        None => Err(Error::Refused(match key {
            Some(k) => format!(
                "route {:?} has no stored job {k:?} (a job row or a mirror copy whose bytes are kept)",
                route.name
            ),
            None => format!(
                "route {:?} has no stored job yet: in dual_write producers' pushes are stored \
                 as they come; push one, or give --key",
                route.name
            ),
        })),
    }
}

/// The handler a shadow call of `route` goes to, as configured.
fn shadow_handler<'a>(config: &'a Config, route: &Route) -> Result<&'a HandlerConfig> {
    if let Some(h) = config
        .routes
        .iter()
        .find(|r| r.name == route.name)
        .and_then(|r| r.cutover.shadow.handler.as_ref())
    {
        return Ok(h);
    }
    config
        .pools
        .iter()
        .find(|p| p.queues.iter().any(|q| q == &route.queue))
        .map(|p| &p.handler)
        .ok_or_else(|| {
            Error::Refused(format!(
                "no pool runs queue {:?} and route {:?} has no [routes.shadow] handler: \
                 nothing would make its shadow calls",
                route.queue, route.name
            ))
        })
}

fn describe(handler: &HandlerConfig) -> String {
    match handler {
        HandlerConfig::Http { url, .. } => crate::redact::redact_url(url),
        HandlerConfig::Command { program, .. } => format!("command {program}"),
        HandlerConfig::Noop {} => "noop".into(),
    }
}

/// Makes one shadow call of `route`'s handler with a stored job.
pub async fn run(
    db: &PgPool,
    config: &Config,
    route: &Route,
    key: Option<&str>,
) -> Result<ShadowTest> {
    let handler_config = shadow_handler(config, route)?;
    let handler = Handler::from_config(handler_config)?;
    let (key, kind, payload) = stored_job(db, route, key).await?;
    let now = chrono::Utc::now();
    let job = ClaimedJob {
        id: 0,
        queue: route.queue.clone(),
        kind: kind.clone(),
        key: Some(key.clone()),
        payload,
        priority: 0,
        attempts: 1,
        max_attempts: 1,
        lease: 0,
        run_at: now,
        created_at: now,
        lock_key: None,
        tenant: None,
        copy: JobCopy::Mirror,
    };
    let digester = Digester::new(&route.config.cutover.diff);
    let run = handler.run_recorded(&job, Mode::Shadow, &digester).await;
    let (answer, done) = match &run.result {
        HandlerResult::Done => ("done".to_string(), true),
        HandlerResult::Retry(why) => (format!("retry: {why}"), false),
        HandlerResult::Permanent(why) => (format!("failed for good: {why}"), false),
    };
    Ok(ShadowTest {
        route: route.name.clone(),
        key,
        kind,
        handler: describe(handler_config),
        answer,
        done,
        digest: run.digest,
    })
}
