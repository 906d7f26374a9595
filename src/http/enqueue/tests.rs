//! The enqueue body on hostile input: arbitrary bytes and JSON-shaped soup
//! never panic, every refusal is one line naming the job, and a malformed
//! `run_at` is refused by name.

use super::*;
use proptest::prelude::*;

fn error_of(reply: (StatusCode, Json<Value>)) -> (StatusCode, String) {
    let text = reply.1 .0["error"].as_str().unwrap_or_default().to_string();
    (reply.0, text)
}

fn one_line(text: &str) -> Result<(), TestCaseError> {
    prop_assert!(
        !text.is_empty() && !text.contains(['\r', '\n']),
        "{:?}",
        text
    );
    Ok(())
}

/// Bytes made of the pieces a job body is made of.
fn body_soup() -> impl Strategy<Value = Vec<u8>> {
    const PIECES: &[&[u8]] = &[
        b"{",
        b"}",
        b"[",
        b"]",
        b",",
        b":",
        b"\"payload\"",
        b"\"jobs\"",
        b"\"run_at\"",
        b"\"key\"",
        b"\"priority\"",
        b"\"item_b64\"",
        b"\"max_attempts\"",
        b"\"x\"",
        b"1",
        b"-1",
        b"null",
        b"\"2026-11-21T18:00:00Z\"",
        b"\"tomorrow\"",
        b"\"\\u0000\"",
        b"\xff",
        b" ",
        b"\n",
        b"99999999999",
    ];
    proptest::collection::vec(proptest::sample::select(PIECES), 0..30).prop_map(|p| p.concat())
}

proptest! {
    #[test]
    fn any_body_is_jobs_or_a_one_line_error(body in prop_oneof![proptest::collection::vec(any::<u8>(), 0..200), body_soup()]) {
        match parse(&body) {
            Ok(jobs) => {
                prop_assert!(!jobs.is_empty());
                for (i, job) in jobs.into_iter().enumerate() {
                    if let Err(reply) = plain_job(i, job, "q", 1 << 20) {
                        let (status, text) = error_of(reply);
                        prop_assert!(status == StatusCode::BAD_REQUEST || status == StatusCode::PAYLOAD_TOO_LARGE);
                        one_line(&text)?;
                        prop_assert!(text.starts_with(&format!("job {}: ", i + 1)), "{:?}", text);
                    }
                }
            }
            Err(reply) => {
                let (status, text) = error_of(reply);
                prop_assert_eq!(status, StatusCode::BAD_REQUEST);
                one_line(&text)?;
            }
        }
    }

    /// Any text that is not an RFC 3339 time is refused, naming run_at and
    /// without echoing the text.
    #[test]
    fn malformed_run_at_is_refused_by_name(text in "[^\"\\\\]{0,40}") {
        prop_assume!(chrono::DateTime::parse_from_rfc3339(&text).is_err());
        let body = json!({"payload": 1, "run_at": text}).to_string();
        let jobs = parse(body.as_bytes()).map_err(|r| TestCaseError::fail(error_of(r).1))?;
        let job = jobs.into_iter().next().unwrap();
        let (status, message) = error_of(plain_job(0, job, "q", 1 << 20).unwrap_err());
        prop_assert_eq!(status, StatusCode::BAD_REQUEST);
        prop_assert!(message.starts_with("job 1: run_at is not an RFC 3339 time"), "{:?}", message);
        one_line(&message)?;
    }
}

#[test]
fn well_formed_run_at_is_kept() {
    let body = br#"{"payload": 1, "run_at": "2026-11-21T19:00:00+01:00"}"#;
    let job = parse(body).unwrap().into_iter().next().unwrap();
    let new = plain_job(0, job, "q", 1 << 20).unwrap();
    assert_eq!(
        new.run_at.map(|t| t.to_rfc3339()),
        Some("2026-11-21T18:00:00+00:00".to_string())
    );
}

#[test]
fn errors_name_the_job_and_the_field() {
    let (status, text) = error_of(parse(br#"[{"payload":1},{"payload":2,"prio":3}]"#).unwrap_err());
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(text.starts_with("job 2: unknown field `prio`"), "{text}");
    let (_, text) = error_of(parse(br#"{"jobs": 5}"#).unwrap_err());
    assert_eq!(text, "\"jobs\" must be a list of jobs");
    let (_, text) = error_of(parse(b"[]").unwrap_err());
    assert_eq!(text, "no jobs in the body");
}

#[test]
fn a_payload_over_the_limit_is_413() {
    let body = json!({"payload": "x".repeat(100)}).to_string();
    let job = parse(body.as_bytes()).unwrap().into_iter().next().unwrap();
    let (status, text) = error_of(plain_job(0, job, "q", 64).unwrap_err());
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(text.starts_with("job 1: "), "{text}");
}
