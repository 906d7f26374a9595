//! RQ's layout (read in RQ 3.0's `queue.py`, `registry.py`,
//! `intermediate_queue.py`, `worker/base.py`, `worker_registration.py`),
//! under `rq:` (RQ 3.0 takes another prefix from `RQ_KEY_PREFIX`):
//!
//! - `rq:queues`: a set of the queues' list keys; `rq:queue:<name>`: a list
//!   of job ids, RPUSHed (LPUSHed with `at_front`);
//! - `rq:job:<id>`: the job, a hash (its `data` field: the function and
//!   arguments, serialized);
//! - per queue, sorted sets of job ids: `rq:scheduled:<q>` (`enqueue_in`,
//!   `enqueue_at`, retries with an interval), `rq:wip:<q>` (started),
//!   `rq:failed:<q>`, `rq:finished:<q>`, `rq:deferred:<q>` (waiting on
//!   another job), `rq:canceled:<q>`;
//! - `rq:queue:<q>:intermediate`: a list of ids a worker popped and has not
//!   yet registered as started;
//! - `rq:workers`: a set of worker keys; `rq:worker:<name>`: a hash with
//!   `queues` and `version` (the worker's RQ version).

use redis::aio::ConnectionManager;

use super::read;
use super::report::{Found, Framework, QueueRow, Sizes};
use super::scan::Keyspace;
use super::Recognised;
use crate::error::Result;

/// RQ retries nothing unless a job is enqueued with `Retry`: one run.
pub const MAX_ATTEMPTS: i32 = 1;

/// The registries of a queue, in the order [`counts`] returns them.
const REGISTRIES: [&str; 6] = [
    "scheduled",
    "wip",
    "failed",
    "finished",
    "deferred",
    "canceled",
];

/// The RQ installation under `prefix` (`rq:`) with the queues its
/// `queues` set names.
pub async fn recognise(
    conn: &mut ConnectionManager,
    space: &Keyspace,
    prefix: &str,
    names: &[String],
) -> Result<Recognised> {
    let mut found = Found::new(Framework::Rq, label(prefix));
    if prefix != "rq:" {
        found.options.push(format!(
            "RQ_KEY_PREFIX {:?}: qbridge's RQ support reads rq: keys (its job hashes and registries)",
            prefix.trim_end_matches(':')
        ));
    }
    let mut queues: std::collections::BTreeSet<String> = names.iter().cloned().collect();
    let list_prefix = format!("{prefix}queue:");
    let mut claimed = Vec::new();
    for list in space.lists_under(list_prefix.as_bytes()) {
        let Ok(name) = std::str::from_utf8(&list[list_prefix.len()..]) else {
            continue;
        };
        match name.strip_suffix(":intermediate") {
            Some(of) => {
                claimed.push(list.to_vec());
                queues.insert(of.to_string());
            }
            None => {
                queues.insert(name.to_string());
            }
        }
    }
    workers(conn, space, prefix, &mut found).await?;
    let mut rows = Vec::new();
    for queue in &queues {
        rows.push(queue_row(conn, prefix, queue).await?);
    }
    Ok(Recognised {
        found,
        rows,
        claimed,
    })
}

async fn queue_row(conn: &mut ConnectionManager, prefix: &str, queue: &str) -> Result<QueueRow> {
    let key = format!("{prefix}queue:{queue}").into_bytes();
    let intermediate = format!("{prefix}queue:{queue}:intermediate").into_bytes();
    let mut row = QueueRow::new(Framework::Rq, label(prefix), queue, key);
    let lengths = read::lengths(conn, &[&row.raw_key, &intermediate]).await?;
    row.waiting = lengths[0];
    let registry_keys: Vec<Vec<u8>> = REGISTRIES
        .iter()
        .map(|r| format!("{prefix}{r}:{queue}").into_bytes())
        .collect();
    let keys: Vec<&[u8]> = registry_keys.iter().map(Vec::as_slice).collect();
    let cards = read::zcards(conn, &keys).await?;
    let count = |registry: usize| cards[registry];
    row.scheduled = Some(count(0));
    row.in_flight = Some(count(1) + lengths[1]);
    row.dead = Some(count(2));
    for (i, what) in [
        (3, "finished (kept for their results)"),
        (4, "deferred (waiting on another job)"),
        (5, "canceled"),
    ] {
        if count(i) > 0 {
            row.notes.push(format!("{} {what}", count(i)));
        }
    }
    row.payload = sizes(conn, &row.raw_key, row.waiting, prefix).await?;
    Ok(row)
}

/// The prefix as a namespace to show: none for RQ's own `rq:`.
fn label(prefix: &str) -> &str {
    if prefix == "rq:" {
        ""
    } else {
        prefix.trim_end_matches(':')
    }
}

/// Sizes of the jobs of a sample of the queue's ids: `HSTRLEN
/// rq:job:<id> data` (the list holds ids only; the job is the hash).
async fn sizes(
    conn: &mut ConnectionManager,
    key: &[u8],
    len: u64,
    prefix: &str,
) -> Result<Option<Sizes>> {
    if len == 0 {
        return Ok(None);
    }
    let ids = read::sample(conn, key, len).await?;
    let mut pipe = redis::pipe();
    for id in &ids {
        pipe.cmd("HSTRLEN")
            .arg([format!("{prefix}job:").as_bytes(), id].concat())
            .arg("data");
    }
    let lengths: Vec<u64> = pipe.query_async(conn).await?;
    Ok(Sizes::of_lengths(
        lengths.into_iter().filter(|n| *n > 0).collect(),
        "rq job data",
    ))
}

/// The registered workers: counted, and their RQ versions noted.
async fn workers(
    conn: &mut ConnectionManager,
    space: &Keyspace,
    prefix: &str,
    found: &mut Found,
) -> Result<()> {
    let set = format!("{prefix}workers").into_bytes();
    if !space.sets.contains(&set) {
        return Ok(());
    }
    let keys: Vec<Vec<u8>> = redis::cmd("SMEMBERS").arg(&set).query_async(conn).await?;
    found.workers = keys.len() as u64;
    if keys.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for key in &keys {
        pipe.cmd("HGET").arg(key).arg("version");
    }
    let versions: Vec<Option<String>> = pipe.query_async(conn).await?;
    let mut seen: Vec<String> = versions.into_iter().flatten().collect();
    seen.sort();
    seen.dedup();
    for version in seen {
        found
            .version_hints
            .push(format!("RQ {version} (worker hash)"));
    }
    Ok(())
}
