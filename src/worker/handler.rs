//! Handlers: what running a job means. `http` POSTs the payload, `command` runs
//! a program with the payload on stdin, `noop` completes at once. Errors are
//! classified as retryable or permanent; their text never contains the payload.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::HandlerConfig;
use crate::error::{Error, Result};
use crate::queue::ClaimedJob;

/// What a handler made of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerResult {
    Done,
    /// Worth another attempt (5xx, timeout, crash, non-zero exit).
    Retry(String),
    /// Will never succeed (4xx, a configured exit code): dead-letter now.
    Permanent(String),
}

/// A configured handler.
#[derive(Debug, Clone)]
pub enum Handler {
    Http {
        client: reqwest::Client,
        url: String,
        headers: Vec<(String, String)>,
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
    inner: std::sync::Mutex<ProbeData>,
}

#[derive(Debug, Default)]
struct ProbeData {
    seen: std::collections::HashSet<i64>,
    latencies: Vec<f64>,
}

impl Probe {
    fn record(&self, job: &ClaimedJob) {
        let waited = (chrono::Utc::now() - job.run_at)
            .num_microseconds()
            .unwrap_or(0)
            .max(0);
        self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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

/// Most stderr kept as the error text of a failed command.
const STDERR_TAIL: usize = 2048;

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
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
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

    /// Runs one attempt.
    pub async fn run(&self, job: &ClaimedJob) -> HandlerResult {
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
            } => run_http(client, url, headers, job).await,
            Handler::Command {
                program,
                args,
                timeout,
                permanent_exit_codes,
            } => run_command(program, args, *timeout, permanent_exit_codes, job).await,
        }
    }
}

async fn run_http(
    client: &reqwest::Client,
    url: &str,
    headers: &[(String, String)],
    job: &ClaimedJob,
) -> HandlerResult {
    let mut req = client
        .post(url)
        .header("Qbridge-Queue", &job.queue)
        .header("Qbridge-Job-Id", job.id.to_string())
        .header("Qbridge-Attempt", job.attempts.to_string())
        .json(&job.payload);
    if let Some(key) = &job.key {
        req = req.header("Qbridge-Job-Key", key);
    }
    if let Some(kind) = &job.kind {
        req = req.header("Qbridge-Job-Kind", kind);
    }
    for (k, v) in headers {
        req = req.header(k, v);
    }
    match req.send().await {
        Ok(resp) => {
            let status = resp.status();
            if status.is_success() {
                HandlerResult::Done
            } else if status.is_client_error() {
                HandlerResult::Permanent(format!("http handler answered {status}"))
            } else {
                HandlerResult::Retry(format!("http handler answered {status}"))
            }
        }
        // without_url: a handler URL may carry credentials.
        Err(e) if e.is_timeout() => HandlerResult::Retry("http handler timed out".into()),
        Err(e) => HandlerResult::Retry(format!("http handler unreachable: {}", e.without_url())),
    }
}

async fn run_command(
    program: &str,
    args: &[String],
    timeout: Duration,
    permanent: &[i32],
    job: &ClaimedJob,
) -> HandlerResult {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env("QBRIDGE_QUEUE", &job.queue)
        .env("QBRIDGE_JOB_ID", job.id.to_string())
        .env("QBRIDGE_ATTEMPT", job.attempts.to_string())
        .env("QBRIDGE_JOB_KEY", job.key.as_deref().unwrap_or(""))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // A timeout or a cancelled attempt drops the child: kill it then.
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return HandlerResult::Retry(format!("cannot start {program:?}: {e}")),
    };
    let body = job.payload.to_string();
    let mut stdin = child.stdin.take();
    let mut stderr = child.stderr.take();
    let work = async {
        if let Some(mut s) = stdin.take() {
            // A program that exits without reading stdin is not an error.
            let _ = s.write_all(body.as_bytes()).await;
        }
        let mut err_buf = Vec::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_end(&mut err_buf).await;
        }
        (child.wait().await, err_buf)
    };
    match tokio::time::timeout(timeout, work).await {
        Err(_) => HandlerResult::Retry(format!("command timed out after {timeout:?}")),
        Ok((Err(e), _)) => HandlerResult::Retry(format!("command failed: {e}")),
        Ok((Ok(status), err_buf)) => {
            if status.success() {
                return HandlerResult::Done;
            }
            let tail_start = err_buf.len().saturating_sub(STDERR_TAIL);
            let tail = String::from_utf8_lossy(&err_buf[tail_start..])
                .trim()
                .to_string();
            let what = match status.code() {
                Some(code) => format!("exit code {code}"),
                None => "killed by a signal".to_string(),
            };
            let msg = if tail.is_empty() {
                what
            } else {
                format!("{what}: {tail}")
            };
            match status.code() {
                Some(code) if permanent.contains(&code) => HandlerResult::Permanent(msg),
                _ => HandlerResult::Retry(msg),
            }
        }
    }
}
