//! `qbridge enqueue`: jobs from arguments or a JSON-lines file. Every line is
//! validated before anything is written, and all jobs go in one transaction:
//! a bad line means nothing is enqueued.

use std::io::{BufRead, Read};
use std::path::Path;

use chrono::{DateTime, Utc};

use crate::cli::EnqueueArgs;
use crate::config::{parse_duration, Config};
use crate::error::{Error, Result};
use crate::output;
use crate::queue::{enqueue, validate, EnqueueOutcome, NewJob};

/// Rows per statement (and per progress step).
const BATCH: usize = 10_000;

pub async fn run(config: &Config, args: &EnqueueArgs, as_json: bool) -> Result<()> {
    validate::queue_name(&args.queue)?;
    let run_at = run_at(args)?;
    let key_path = args.key_pointer.clone();
    let payloads = match &args.file {
        Some(path) => read_lines(path, config.payload_limit)?,
        None if args.payloads.is_empty() => {
            return Err(Error::InvalidInput(
                "give one or more JSON payloads, or --file jobs.jsonl".into(),
            ))
        }
        None => args
            .payloads
            .iter()
            .enumerate()
            .map(|(i, p)| {
                validate::payload_text(p, config.payload_limit)
                    .map_err(|e| Error::InvalidInput(format!("payload {}: {e}", i + 1)))
            })
            .collect::<Result<Vec<_>>>()?,
    };
    if args.key.is_some() && payloads.len() > 1 {
        return Err(Error::InvalidInput(
            "--key names one job; use --key-pointer for many".into(),
        ));
    }
    let mut jobs = Vec::with_capacity(payloads.len());
    for (i, payload) in payloads.into_iter().enumerate() {
        let key = match &key_path {
            Some(ptr) => Some(key_at(&payload, ptr).ok_or_else(|| {
                Error::InvalidInput(format!(
                    "job {}: no string or number at key pointer {ptr}",
                    i + 1
                ))
            })?),
            None => args.key.clone(),
        };
        let job = NewJob {
            queue: args.queue.clone(),
            kind: args.kind.clone(),
            key,
            payload,
            priority: args.priority,
            run_at,
            max_attempts: args.max_attempts,
            lock_key: args.lock_key.clone(),
            copy: crate::queue::JobCopy::Live,
            original: None,
        };
        // Refuse before connecting; enqueue checks again.
        validate::job_fields(&job).map_err(|e| {
            Error::InvalidInput(format!("job {}: {e}; nothing was enqueued", i + 1))
        })?;
        jobs.push(job);
    }

    let db = config.open_db(2).await?;
    crate::db::check_schema(&db).await?;
    let bar = output::progress(jobs.len() as u64, as_json || jobs.len() < BATCH, "enqueue");
    let mut tx = db.begin().await?;
    let mut outcomes = Vec::with_capacity(jobs.len());
    for chunk in jobs.chunks(BATCH) {
        outcomes.extend(enqueue::enqueue(&mut tx, chunk, config.payload_limit).await?);
        bar.inc(chunk.len() as u64);
    }
    tx.commit().await?;
    bar.finish_and_clear();

    let inserted: Vec<i64> = outcomes
        .iter()
        .filter_map(|o| match o {
            EnqueueOutcome::Inserted(id) => Some(*id),
            _ => None,
        })
        .collect();
    let duplicates = outcomes.iter().filter(|o| o.is_duplicate()).count();
    if as_json {
        let per_job: Vec<serde_json::Value> = outcomes
            .iter()
            .map(|o| match o {
                EnqueueOutcome::Inserted(id) => serde_json::json!({ "id": id, "duplicate": false }),
                EnqueueOutcome::Duplicate(id) => serde_json::json!({ "id": id, "duplicate": true }),
            })
            .collect();
        output::json(&serde_json::json!({
            "queue": args.queue, "inserted": inserted.len(), "duplicates": duplicates, "jobs": per_job
        }));
    } else if inserted.len() == 1 && duplicates == 0 {
        println!("enqueued job {} on {}", inserted[0], args.queue);
    } else {
        println!(
            "enqueued {} job(s) on {} ({} duplicate(s) skipped)",
            inserted.len(),
            args.queue,
            duplicates
        );
    }
    Ok(())
}

fn run_at(args: &EnqueueArgs) -> Result<Option<DateTime<Utc>>> {
    if let Some(text) = &args.run_at {
        return DateTime::parse_from_rfc3339(text)
            .map(|t| Some(t.with_timezone(&Utc)))
            .map_err(|e| {
                Error::InvalidInput(format!(
                    "--run-at {text:?} is not an RFC 3339 time ({e}); e.g. 2026-11-21T18:00:00Z"
                ))
            });
    }
    if let Some(text) = &args.delay {
        let d = parse_duration(text).map_err(|_| {
            Error::InvalidInput(format!("--delay {text:?} is not a duration; e.g. 30s, 10m"))
        })?;
        let d = chrono::Duration::from_std(d)
            .map_err(|_| Error::InvalidInput(format!("--delay {text:?} is too long")))?;
        return Ok(Some(Utc::now() + d));
    }
    Ok(None)
}

fn read_lines(path: &Path, limit: usize) -> Result<Vec<serde_json::Value>> {
    let reader: Box<dyn BufRead> = if path == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        let file = std::fs::File::open(path)
            .map_err(|e| Error::InvalidInput(format!("cannot open {}: {e}", path.display())))?;
        Box::new(std::io::BufReader::new(file))
    };
    parse_jsonl(reader, &path.display().to_string(), limit)
}

/// The characters JSON allows between tokens (RFC 8259 section 2).
pub(crate) const JSON_WHITESPACE: [char; 4] = [' ', '\t', '\n', '\r'];

/// Reads JSON lines (blank lines skipped), each a payload of at most `limit`
/// bytes. A line is never read past `limit` plus its line ending, so a file
/// with no line breaks costs `limit` bytes of memory, not its size. The first
/// bad line is the error, named by file and line number.
pub(crate) fn parse_jsonl(
    mut reader: impl BufRead,
    name: &str,
    limit: usize,
) -> Result<Vec<serde_json::Value>> {
    let refuse = |n: usize, what: String| {
        Error::InvalidInput(format!("{name} line {n}: {what}; nothing was enqueued"))
    };
    let mut out = Vec::new();
    let mut raw = Vec::new();
    // A payload of `limit` bytes, "\r\n", and one byte more to see it is over.
    let cap = limit.saturating_add(3) as u64;
    for n in 1.. {
        raw.clear();
        let read = (&mut reader)
            .take(cap)
            .read_until(b'\n', &mut raw)
            .map_err(|e| refuse(n, format!("cannot read: {e}")))?;
        if read == 0 {
            break;
        }
        if read as u64 == cap && raw.last() != Some(&b'\n') {
            return Err(refuse(
                n,
                format!("longer than the payload limit of {limit} bytes"),
            ));
        }
        let line = std::str::from_utf8(&raw).map_err(|_| refuse(n, "not UTF-8".into()))?;
        // The line ending is not part of the payload (nor of its size).
        let line = line.strip_suffix('\n').unwrap_or(line);
        let line = line.strip_suffix('\r').unwrap_or(line);
        // Blank means JSON's own whitespace only: a line of, say, a vertical
        // tab is not JSON and is refused rather than skipped in silence.
        if line.trim_matches(JSON_WHITESPACE).is_empty() {
            continue;
        }
        let value = validate::payload_text(line, limit).map_err(|e| refuse(n, e.to_string()))?;
        out.push(value);
    }
    Ok(out)
}

fn key_at(payload: &serde_json::Value, pointer: &str) -> Option<String> {
    match payload.pointer(pointer)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
