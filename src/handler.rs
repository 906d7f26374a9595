//! Handlers: what running a job means. `http` POSTs the payload, `command` runs
//! a program with the payload on stdin, `noop` completes at once. Errors are
//! classified as retryable or permanent; their text never contains the payload.

mod command;

use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::StatusCode;

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

async fn run_http(
    client: &reqwest::Client,
    url: &str,
    headers: &HeaderMap,
    job: &ClaimedJob,
    mode: Mode,
) -> HandlerResult {
    match http_request(client, url, headers, job, mode).send().await {
        Ok(resp) => classify_status(resp.status()),
        Err(e) => http_error(e),
    }
}

/// Bodies up to this size are held to apply the ignore rules; a longer one
/// is digested as it streams, without them.
const MAX_NORMALIZED_BODY: usize = 4 << 20;

/// [`run_http`] that also reads the response body into its digest. Without
/// ignore rules (or past [`MAX_NORMALIZED_BODY`]) the body is hashed as it
/// streams in. The client's timeout covers the body too.
async fn run_http_digest(
    client: &reqwest::Client,
    url: &str,
    headers: &HeaderMap,
    job: &ClaimedJob,
    mode: Mode,
    digester: &Digester,
) -> (HandlerResult, Option<String>) {
    use sha2::{Digest, Sha256};
    let mut resp = match http_request(client, url, headers, job, mode).send().await {
        Ok(resp) => resp,
        Err(e) => return (http_error(e), None),
    };
    let result = classify_status(resp.status());
    let mut held: Option<Vec<u8>> = digester.has_rules().then(Vec::new);
    let mut hasher = Sha256::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => match &mut held {
                Some(body) if body.len() + chunk.len() <= MAX_NORMALIZED_BODY => {
                    body.extend_from_slice(&chunk)
                }
                Some(body) => {
                    hasher.update(&body[..]);
                    hasher.update(&chunk);
                    held = None;
                }
                None => hasher.update(&chunk),
            },
            Ok(None) => break,
            // The status decided the outcome; a body cut short has no digest.
            Err(_) => return (result, None),
        }
    }
    if let Some(body) = held {
        return (result, Some(digester.digest(&body)));
    }
    let digest = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    (result, Some(digest))
}

/// A send error as a retryable result; `without_url`: a handler URL may
/// carry credentials.
fn http_error(e: reqwest::Error) -> HandlerResult {
    if e.is_timeout() {
        HandlerResult::Retry("http handler timed out".into())
    } else {
        HandlerResult::Retry(format!("http handler unreachable: {}", e.without_url()))
    }
}

fn http_request(
    client: &reqwest::Client,
    url: &str,
    headers: &HeaderMap,
    job: &ClaimedJob,
    mode: Mode,
) -> reqwest::RequestBuilder {
    let mut req = client
        .post(url)
        .header("Qbridge-Mode", wire_mode(mode))
        .header("Qbridge-Queue", &job.queue)
        .header("Qbridge-Job-Id", job.id.to_string())
        .header("Qbridge-Attempt", job.attempts.to_string())
        .json(&job.payload);
    // The fencing token of a Postgres attempt (Redis items have none): a
    // handler with side effects can store it beside them and ignore a
    // late call from an attempt whose lease was already handed on.
    if job.id != 0 {
        req = req.header("Qbridge-Lease", job.lease.to_string());
    }
    if let Some(key) = &job.key {
        req = req.header("Qbridge-Job-Key", key);
    }
    if let Some(kind) = &job.kind {
        req = req.header("Qbridge-Job-Kind", kind);
    }
    if !headers.is_empty() {
        req = req.headers(headers.clone());
    }
    req
}

/// 2xx is done; 4xx means the request itself is wrong, except 408 (the server
/// gave up waiting) and 429 (slow down), which a later attempt can pass.
fn classify_status(status: StatusCode) -> HandlerResult {
    let msg = || format!("http handler answered {status}");
    if status.is_success() {
        HandlerResult::Done
    } else if status == StatusCode::REQUEST_TIMEOUT || status == StatusCode::TOO_MANY_REQUESTS {
        HandlerResult::Retry(msg())
    } else if status.is_client_error() {
        HandlerResult::Permanent(msg())
    } else {
        HandlerResult::Retry(msg())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::config::Dur;

    /// A claimed job with `payload` and defaults elsewhere.
    pub(super) fn job(payload: serde_json::Value) -> ClaimedJob {
        ClaimedJob {
            id: 1,
            queue: "q".into(),
            kind: None,
            key: None,
            payload,
            priority: 0,
            attempts: 1,
            max_attempts: 25,
            lease: 1,
            run_at: chrono::Utc::now(),
            created_at: chrono::Utc::now(),
            lock_key: None,
            tenant: None,
            copy: crate::queue::JobCopy::Live,
        }
    }

    async fn status_server() -> String {
        use axum::extract::Path;
        use axum::routing::post;
        let app = axum::Router::new().route(
            "/{code}",
            post(|Path(code): Path<u16>| async move {
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn http_408_and_429_are_retried_other_4xx_are_permanent() {
        let base = status_server().await;
        for (code, want) in [
            (200, "done"),
            (204, "done"),
            (408, "retry"),
            (429, "retry"),
            (400, "permanent"),
            (404, "permanent"),
            (422, "permanent"),
            (500, "retry"),
            (503, "retry"),
        ] {
            let h = Handler::from_config(&HandlerConfig::Http {
                url: format!("{base}/{code}"),
                timeout: Dur(Duration::from_secs(10)),
                headers: BTreeMap::new(),
            })
            .unwrap();
            let got = match h.run(&job(json!({}))).await {
                HandlerResult::Done => "done",
                HandlerResult::Retry(m) => {
                    assert!(m.contains(&code.to_string()), "{m}");
                    "retry"
                }
                HandlerResult::Permanent(m) => {
                    assert!(m.contains(&code.to_string()), "{m}");
                    "permanent"
                }
            };
            assert_eq!(got, want, "status {code}");
        }
    }

    #[tokio::test]
    async fn recorded_runs_digest_the_body_and_classify_failures() {
        let base = status_server().await;
        let h = |code: u16| {
            Handler::from_config(&HandlerConfig::Http {
                url: format!("{base}/{code}"),
                timeout: Dur(Duration::from_secs(10)),
                headers: BTreeMap::new(),
            })
            .unwrap()
        };
        let ok = h(200)
            .run_recorded(&job(json!({})), Mode::Live, &Digester::default())
            .await;
        assert_eq!(ok.result, HandlerResult::Done);
        assert_eq!(ok.error_class, None);
        // The status server answers with an empty body.
        assert_eq!(
            ok.digest.as_deref(),
            Some("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        );
        assert_eq!(
            h(503)
                .run_recorded(&job(json!({})), Mode::Live, &Digester::default())
                .await
                .error_class,
            Some("http_5xx")
        );
        assert_eq!(
            h(404)
                .run_recorded(&job(json!({})), Mode::Live, &Digester::default())
                .await
                .error_class,
            Some("http_4xx")
        );
        assert_eq!(
            error_class(&HandlerResult::Retry("exit code 3: boom".into())),
            Some("exit_code")
        );
        assert_eq!(
            error_class(&HandlerResult::Retry("command timed out after 1s".into())),
            Some("timeout")
        );
    }

    #[test]
    fn bad_configured_header_is_a_config_error() {
        let mut headers = BTreeMap::new();
        headers.insert("Authorization".to_string(), "Bearer s3cret\n".to_string());
        let err = Handler::from_config(&HandlerConfig::Http {
            url: "http://127.0.0.1:1/".into(),
            timeout: Dur(Duration::from_secs(1)),
            headers,
        })
        .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err:?}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }
}
