//! Handlers: what running a job means. `http` POSTs the payload, `command` runs
//! a program with the payload on stdin, `noop` completes at once. Errors are
//! classified as retryable or permanent; their text never contains the payload.

mod command;
mod http;

use http::{run_http, run_http_digest};

use std::time::Duration;

use reqwest::header::HeaderMap;

use crate::config::{header_map, HandlerConfig};
use crate::error::{Error, Result};
use crate::queue::ClaimedJob;
use crate::shadow::{Digester, Mode};

/// What a handler made of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerResult {
    Done,
    /// Worth another attempt (5xx, 408, 429, timeout, crash, non-zero exit).
    Retry(String),
    /// Will never succeed (4xx but 408 and 429, a configured exit code):
    /// dead-letter now.
    Permanent(String),
}

/// A configured handler.
#[derive(Debug, Clone)]
pub enum Handler {
    Http {
        client: reqwest::Client,
        url: String,
        /// Configured extra headers, checked when the config was loaded (a bad
        /// one is a config error, not a failure of every job).
        headers: HeaderMap,
    },
    Command {
        program: String,
        args: Vec<String>,
        timeout: Duration,
        permanent_exit_codes: Vec<i32>,
    },
    Noop,
    /// Completes at once and records the attempt (benchmarks and tests).
    Probe(std::sync::Arc<Probe>),
}

/// Records every attempt a [`Handler::Probe`] saw: count, distinct jobs and
/// enqueue-to-start latency.
#[derive(Debug, Default)]
pub struct Probe {
    runs: std::sync::atomic::AtomicU64,
    /// Only count attempts: a long run (the soak) must not grow with every job
    /// it has seen, or the bench itself would look like a leak.
    count_only: bool,
    inner: std::sync::Mutex<ProbeData>,
}

#[derive(Debug, Default)]
struct ProbeData {
    seen: std::collections::HashSet<i64>,
    latencies: Vec<f64>,
}

impl Probe {
    /// A probe that counts attempts and keeps nothing per job.
    pub fn count_only() -> Probe {
        Probe {
            count_only: true,
            ..Probe::default()
        }
    }

    fn record(&self, job: &ClaimedJob) {
        let waited = (chrono::Utc::now() - job.run_at)
            .num_microseconds()
            .unwrap_or(0)
            .max(0);
        self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.count_only {
            return;
        }
        if let Ok(mut d) = self.inner.lock() {
            d.seen.insert(job.id);
            d.latencies.push(waited as f64 / 1e6);
        }
    }

    /// Attempts run so far.
    pub fn runs(&self) -> u64 {
        self.runs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Distinct jobs run so far.
    pub fn distinct(&self) -> usize {
        self.inner.lock().map(|d| d.seen.len()).unwrap_or(0)
    }

    /// Enqueue-to-start latencies in seconds, sorted.
    pub fn latencies(&self) -> Vec<f64> {
        let mut v = self
            .inner
            .lock()
            .map(|d| d.latencies.clone())
            .unwrap_or_default();
        v.sort_by(|a, b| a.total_cmp(b));
        v
    }
}

impl Handler {
    /// Builds a handler from its config.
    pub fn from_config(cfg: &HandlerConfig) -> Result<Handler> {
        Ok(match cfg {
            HandlerConfig::Http {
                url,
                timeout,
                headers,
            } => Handler::Http {
                client: reqwest::Client::builder()
                    .timeout(timeout.0)
                    .build()
                    .map_err(|e| Error::Config(format!("http handler: {e}")))?,
                url: url.clone(),
                headers: header_map(headers)
                    .map_err(|e| Error::Config(format!("http handler: {e}")))?,
            },
            HandlerConfig::Command {
                program,
                args,
                timeout,
                permanent_exit_codes,
            } => Handler::Command {
                program: program.clone(),
                args: args.clone(),
                timeout: timeout.0,
                permanent_exit_codes: permanent_exit_codes.clone(),
            },
            HandlerConfig::Noop {} => Handler::Noop,
        })
    }

    /// Runs one live attempt.
    pub async fn run(&self, job: &ClaimedJob) -> HandlerResult {
        self.run_as(job, Mode::Live).await
    }

    /// Runs one attempt in `mode`: an `http` handler gets the header
    /// `Qbridge-Mode: live|shadow`, a `command` the variable `QBRIDGE_MODE`.
    async fn run_as(&self, job: &ClaimedJob, mode: Mode) -> HandlerResult {
        match self {
            Handler::Noop => HandlerResult::Done,
            Handler::Probe(p) => {
                p.record(job);
                HandlerResult::Done
            }
            Handler::Http {
                client,
                url,
                headers,
            } => run_http(client, url, headers, job, mode).await,
            Handler::Command {
                program,
                args,
                timeout,
                permanent_exit_codes,
            } => {
                let mode = wire_mode(mode);
                command::run(program, args, *timeout, permanent_exit_codes, job, mode).await
            }
        }
    }

    /// Runs one attempt like [`Handler::run`], in `mode`, and also says what
    /// the shadow comparison needs: the digest of the response (the `http`
    /// handler's body, after the route's ignore rules; the other handlers
    /// have none) and the error class.
    pub async fn run_recorded(
        &self,
        job: &ClaimedJob,
        mode: Mode,
        digester: &Digester,
    ) -> HandlerRun {
        let (result, digest) = match self {
            Handler::Http {
                client,
                url,
                headers,
            } => run_http_digest(client, url, headers, job, mode, digester).await,
            _ => (self.run_as(job, mode).await, None),
        };
        let error_class = error_class(&result);
        HandlerRun {
            result,
            digest,
            error_class,
        }
    }
}

/// What a handler is told about the call: a noise call is a shadow call.
fn wire_mode(mode: Mode) -> &'static str {
    match mode {
        Mode::Live => "live",
        Mode::Shadow | Mode::Noise => "shadow",
    }
}

/// One attempt as [`Handler::run_recorded`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerRun {
    /// What the attempt came to.
    pub result: HandlerResult,
    /// Hex SHA-256 of the response body, when the handler has a response.
    pub digest: Option<String>,
    /// A short fixed text naming why it failed (`None` when done); safe to
    /// store and use as a label, unlike the error text.
    pub error_class: Option<&'static str>,
}

/// The class of a failed attempt, read off the fixed start of the handlers'
/// own error texts (never their variable tail, which may quote the program's
/// stderr).
pub fn error_class(result: &HandlerResult) -> Option<&'static str> {
    let msg = match result {
        HandlerResult::Done => return None,
        HandlerResult::Retry(m) | HandlerResult::Permanent(m) => m.as_str(),
    };
    let class = if msg.starts_with("http handler timed out") || msg.starts_with("command timed out")
    {
        "timeout"
    } else if msg.starts_with("http handler unreachable") {
        "unreachable"
    } else if let Some(code) = msg.strip_prefix("http handler answered ") {
        match code.as_bytes().first() {
            Some(b'4') => "http_4xx",
            Some(b'5') => "http_5xx",
            _ => "http_other",
        }
    } else if msg.starts_with("exit code") {
        "exit_code"
    } else if msg.starts_with("killed by a signal") {
        "signal"
    } else if msg.starts_with("cannot start") {
        "spawn_failed"
    } else if msg.starts_with("command failed") {
        "io"
    } else {
        "other"
    };
    Some(class)
}

#[cfg(test)]
mod tests;
