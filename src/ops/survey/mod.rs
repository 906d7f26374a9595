//! `qbridge survey`: what a team's Redis holds, before anything else is set
//! up — which frameworks, their queues, how many jobs wait, are scheduled,
//! retrying, dead or in flight, how big the jobs are and how fast they
//! arrive — and a draft `qbridge.toml` with a route per queue.
//!
//! Strictly read-only: SCAN, TYPE, the length commands, INFO, reads of a
//! few sampled items (to measure them and read a queue name or a version
//! field; no payload is ever printed or logged), LINDEX and LPOS for the
//! rates. It runs with an ACL user that may only read (`tests/it/survey.rs`
//! proves it writes nothing).
//!
//! One job per file:
//! - [`scan`]: the keyspace's lists, sets and sorted sets, by name;
//! - [`layouts`]: which framework each `queues` set belongs to;
//! - [`sidekiq`], [`celery`], [`rq`], [`resque`]: each framework's layout,
//!   version hints and options, a row per queue; [`lists`]: the lists none
//!   of them explains;
//! - [`read`]: the reads they share; [`rate`]: push rates over a window;
//! - [`report`]: the result; [`render`]: the table; [`draft`]: the config.

pub mod draft;
pub mod render;
pub mod report;

mod celery;
mod layouts;
mod lists;
mod rate;
mod read;
mod resque;
mod rq;
mod scan;
mod sidekiq;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

pub use report::{Found, Framework, QueueRow, Survey};

use crate::error::Result;

/// What a recogniser found: the installation, its queues, and the lists
/// it explains that are not queues (private, bookkeeping), so they are not
/// taken for hand-rolled queues.
pub struct Recognised {
    pub found: Found,
    pub rows: Vec<QueueRow>,
    pub claimed: Vec<Vec<u8>>,
}

/// How a survey runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long push rates are sampled (zero: not sampled).
    pub sample: Duration,
}

/// Surveys the database `conn` is connected to. `progress(done, total)`
/// follows the keyspace walk.
pub async fn survey(
    conn: &mut ConnectionManager,
    options: &Options,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Survey> {
    let mut notes = Vec::new();
    let redis_version = redis_version(conn, &mut notes).await;
    let began = Instant::now();
    let space = scan::scan(conn, progress).await?;
    let scan_seconds = began.elapsed().as_secs_f64();
    let mut found = Vec::new();
    for layout in layouts::find(conn, &space).await? {
        found.push(match layout {
            layouts::Layout::Sidekiq { ns, names } => {
                sidekiq::recognise(conn, &space, &ns, &names).await?
            }
            layouts::Layout::Resque { ns, names } => {
                resque::recognise(conn, &space, &ns, &names).await?
            }
            layouts::Layout::Rq { prefix, names } => {
                rq::recognise(conn, &space, &prefix, &names).await?
            }
        });
    }
    found.extend(celery::recognise(conn, &space).await?);
    let taken: HashSet<Vec<u8>> = found
        .iter()
        .flat_map(|r| {
            r.claimed
                .iter()
                .cloned()
                .chain(r.rows.iter().flat_map(|q| q.lists.clone()))
        })
        .collect();
    found.extend(lists::recognise(conn, &space, &taken).await?);
    let mut frameworks = Vec::new();
    let mut queues = Vec::new();
    for r in found {
        frameworks.push(r.found);
        queues.extend(r.rows);
    }
    frameworks.sort_by(|a: &Found, b: &Found| {
        (a.framework, &a.namespace).cmp(&(b.framework, &b.namespace))
    });
    queues.sort_by(|a, b| {
        (a.framework, &a.namespace, &a.queue).cmp(&(b.framework, &b.namespace, &b.queue))
    });
    let server_pushes = if options.sample.is_zero() {
        None
    } else {
        rate::sample(conn, &mut queues, options.sample, &mut notes).await?
    };
    if queues.iter().any(|q| !q.estimated.is_empty()) {
        notes.push(format!(
            "counts marked ~ are scaled from the first {} members of a bigger shared structure",
            read::MAX_MEMBERS
        ));
    }
    Ok(Survey {
        redis_version,
        keys: space.keys,
        scan_seconds,
        frameworks: frameworks
            .into_iter()
            .filter(|f| f.framework != Framework::List || !f.options.is_empty())
            .collect(),
        queues,
        sample_seconds: options.sample.as_secs_f64(),
        server_pushes,
        notes,
    })
}

/// `redis_version` from `INFO server`, or `None` (noted) when refused.
async fn redis_version(conn: &mut ConnectionManager, notes: &mut Vec<String>) -> Option<String> {
    match redis::cmd("INFO")
        .arg("server")
        .query_async::<String>(conn)
        .await
    {
        Ok(info) => info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .map(|v| v.trim().to_string()),
        Err(e) => {
            notes.push(format!(
                "INFO is refused ({}): no server version",
                e.to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
            None
        }
    }
}
