//! Handlers: what running a job means. `http` POSTs the payload, `command` runs
//! a program with the payload on stdin, `noop` completes at once. Errors are
//! classified as retryable or permanent; their text never contains the payload.

use std::pin::pin;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStderr, ChildStdin};

use crate::config::{header_map, HandlerConfig};
use crate::error::{Error, Result};
use crate::queue::ClaimedJob;

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

/// Bytes read from a command's stderr at a time.
const STDERR_CHUNK: usize = 8192;

/// How long stderr is still read once the command exited: long enough to
/// collect what it wrote before exiting, short enough that a grandchild which
/// inherited the pipe cannot hold the job until the timeout.
const STDERR_GRACE: Duration = Duration::from_millis(100);

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
    headers: &HeaderMap,
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
    if !headers.is_empty() {
        req = req.headers(headers.clone());
    }
    match req.send().await {
        Ok(resp) => classify_status(resp.status()),
        // without_url: a handler URL may carry credentials.
        Err(e) if e.is_timeout() => HandlerResult::Retry("http handler timed out".into()),
        Err(e) => HandlerResult::Retry(format!("http handler unreachable: {}", e.without_url())),
    }
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
    let stdin = child.stdin.take();
    let stderr = child.stderr.take();
    let mut tail = Tail::default();
    let work = supervise(&mut child, stdin, stderr, body.as_bytes(), &mut tail);
    let status = match tokio::time::timeout(timeout, work).await {
        Err(_) => return HandlerResult::Retry(format!("command timed out after {timeout:?}")),
        Ok(Err(e)) => return HandlerResult::Retry(format!("command failed: {e}")),
        Ok(Ok(status)) => status,
    };
    if status.success() {
        return HandlerResult::Done;
    }
    let what = match status.code() {
        Some(code) => format!("exit code {code}"),
        None => "killed by a signal".to_string(),
    };
    let tail = tail.text();
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

/// Feeds the payload to stdin and keeps the tail of stderr while waiting for
/// the program to exit. All three run at once: a program may write a lot of
/// stderr before it reads its input, and either pipe fills up when nobody
/// drains it. The exit decides: stderr gets [`STDERR_GRACE`] more, and input
/// not yet written is dropped (a grandchild may hold either pipe open).
async fn supervise(
    child: &mut Child,
    stdin: Option<ChildStdin>,
    stderr: Option<ChildStderr>,
    body: &[u8],
    tail: &mut Tail,
) -> std::io::Result<ExitStatus> {
    let feed = async move {
        if let Some(mut s) = stdin {
            // A program that exits without reading stdin is not an error.
            let _ = s.write_all(body).await;
            // Dropping `s` closes the pipe: the program sees the end of input.
        }
    };
    let watch = async {
        let mut reading = pin!(tail.read_from(stderr));
        let mut exited = pin!(child.wait());
        tokio::select! {
            status = &mut exited => {
                let _ = tokio::time::timeout(STDERR_GRACE, &mut reading).await;
                status
            }
            () = &mut reading => exited.await,
        }
    };
    let mut feed = pin!(feed);
    let mut watch = pin!(watch);
    tokio::select! {
        status = &mut watch => status,
        () = &mut feed => watch.await,
    }
}

/// The last [`STDERR_TAIL`] bytes of a stream, in bounded memory however much
/// the program writes.
#[derive(Debug, Default)]
struct Tail {
    buf: Vec<u8>,
}

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        if bytes.len() >= STDERR_TAIL {
            self.buf.clear();
            self.buf
                .extend_from_slice(&bytes[bytes.len() - STDERR_TAIL..]);
            return;
        }
        let over = (self.buf.len() + bytes.len()).saturating_sub(STDERR_TAIL);
        self.buf.drain(..over);
        self.buf.extend_from_slice(bytes);
    }

    /// Reads `stream` to its end (or first error) in chunks.
    async fn read_from<R: AsyncRead + Unpin>(&mut self, stream: Option<R>) {
        let Some(mut stream) = stream else { return };
        let mut chunk = vec![0u8; STDERR_CHUNK];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => self.push(&chunk[..n]),
            }
        }
    }

    /// The tail as one line: its lines trimmed and joined with " | ".
    fn text(&self) -> String {
        // The cut may fall inside a UTF-8 character: skip its leftover bytes.
        let start = self
            .buf
            .iter()
            .position(|b| b & 0xC0 != 0x80)
            .unwrap_or(self.buf.len());
        String::from_utf8_lossy(&self.buf[start..])
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Instant;

    use serde_json::json;

    use super::*;
    use crate::config::Dur;

    fn job(payload: serde_json::Value) -> ClaimedJob {
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
        }
    }

    fn sh(script: &str, timeout: Duration) -> Handler {
        Handler::Command {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            timeout,
            permanent_exit_codes: vec![],
        }
    }

    /// A payload bigger than any pipe buffer.
    fn big_payload() -> serde_json::Value {
        json!({ "blob": "p".repeat(300_000) })
    }

    /// The program fills its stderr pipe before it reads stdin: writing all of
    /// stdin first would deadlock until the timeout.
    #[tokio::test]
    async fn stderr_written_before_stdin_is_read_does_not_deadlock() {
        let payload = big_payload();
        let len = payload.to_string().len();
        let h = sh(
            "head -c 200000 /dev/zero | tr '\\0' e >&2; n=$(wc -c); echo \"\ngot $((n))\" >&2; exit 7",
            Duration::from_secs(5),
        );
        let HandlerResult::Retry(msg) = h.run(&job(payload)).await else {
            panic!("want a retry");
        };
        assert!(msg.starts_with("exit code 7: e"), "{msg}");
        assert!(msg.ends_with(&format!(" | got {len}")), "{msg}");
        assert!(msg.len() <= STDERR_TAIL + 20, "{} bytes", msg.len());
    }

    /// A background process that inherited stderr must not hold the job after
    /// the command itself exited.
    #[tokio::test]
    async fn grandchild_holding_stderr_does_not_hold_the_job() {
        let h = sh(
            "sleep 10 & echo failing >&2; exit 1",
            Duration::from_secs(30),
        );
        let started = Instant::now();
        let r = h.run(&job(json!({}))).await;
        assert_eq!(r, HandlerResult::Retry("exit code 1: failing".into()));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
    }

    /// Nor one that inherited stdin and never reads it.
    #[tokio::test]
    async fn grandchild_holding_stdin_does_not_hold_the_job() {
        let h = sh("sleep 10 <&0 & exit 0", Duration::from_secs(30));
        let started = Instant::now();
        let r = h.run(&job(big_payload())).await;
        assert_eq!(r, HandlerResult::Done);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn large_stderr_keeps_only_its_tail() {
        let h = sh(
            "head -c 5000000 /dev/zero | tr '\\0' x >&2; printf '\\nlast words\\n' >&2; exit 1",
            Duration::from_secs(30),
        );
        let HandlerResult::Retry(msg) = h.run(&job(json!({}))).await else {
            panic!("want a retry");
        };
        assert!(msg.ends_with(" | last words"), "{msg}");
        assert!(msg.len() <= STDERR_TAIL + 20, "{} bytes", msg.len());
    }

    #[test]
    fn tail_memory_is_bounded() {
        let mut tail = Tail::default();
        let mut n = 0u64;
        for size in [1, 100, 2047, 2048, 2049, 8192, 1, 3000]
            .iter()
            .cycle()
            .take(5000)
        {
            let chunk: Vec<u8> = (0..*size)
                .map(|i| b'a' + ((n + i as u64) % 26) as u8)
                .collect();
            n += *size as u64;
            tail.push(&chunk);
            assert!(tail.buf.len() <= STDERR_TAIL);
            assert!(
                tail.buf.capacity() <= 2 * STDERR_TAIL,
                "{}",
                tail.buf.capacity()
            );
        }
        let want: Vec<u8> = (n - STDERR_TAIL as u64..n)
            .map(|i| b'a' + (i % 26) as u8)
            .collect();
        assert_eq!(tail.buf, want);
    }

    #[test]
    fn tail_text_is_one_line_and_skips_a_cut_character() {
        let mut tail = Tail::default();
        tail.push("é".repeat(STDERR_TAIL).as_bytes());
        tail.push(b"\nfirst\r\n\n  second  \n");
        let text = tail.text();
        assert!(!text.contains('\u{fffd}'), "{text}");
        assert!(text.ends_with("é | first | second"), "{text}");
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
