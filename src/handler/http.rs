//! The `http` handler: POSTs the payload with `Qbridge-Mode` and the job's
//! headers, classifies the status (408 and 429 and 5xx retried, other 4xx
//! permanent), and for a recorded run digests the response body after the
//! route's ignore rules (none for a 204: nothing to compare).

use reqwest::header::HeaderMap;
use reqwest::StatusCode;

use super::{wire_mode, HandlerResult};
use crate::queue::ClaimedJob;
use crate::shadow::{Digester, Mode};

pub(super) async fn run_http(
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
pub(super) async fn run_http_digest(
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
    // 204 No Content: done, and nothing to compare (a fleet runner's shadow
    // "skip"): no digest, so the diff compares the outcome alone.
    if resp.status() == StatusCode::NO_CONTENT {
        return (result, None);
    }
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
