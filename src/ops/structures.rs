//! What a route's framework structures hold now (`model::structures`):
//! Sidekiq's `schedule`, `retry` and `dead` sets, counted for the route's
//! queue. Shown by `qbridge cutover status`; the gate into `decommissioned`
//! refuses while any holds a job of the route, since decommissioning carries
//! only the route's lists (issue 14).

use chrono::{DateTime, Utc};
use redis::aio::ConnectionManager;
use serde::Serialize;

use crate::error::Result;
use crate::model::structures::{self, Holding, Structure};
use crate::routes::Route;

/// Members read per ZSCAN step.
const PAGE: usize = 1000;

/// One structure's jobs of the route.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Held {
    pub holding: Holding,
    /// The sorted set's key.
    pub key: String,
    /// The route's jobs in it.
    pub jobs: u64,
    /// The earliest score among them (when the next is due).
    pub next_at: Option<DateTime<Utc>>,
}

impl Held {
    /// `schedule: 3 scheduled (next 2026-11-25 16:00:00)`.
    pub fn describe(&self) -> String {
        match self.next_at {
            Some(at) if self.holding != Holding::Dead => format!(
                "{}: {} {} (next {})",
                self.key,
                self.jobs,
                self.holding,
                at.format("%Y-%m-%d %H:%M:%S")
            ),
            _ => format!("{}: {} {}", self.key, self.jobs, self.holding),
        }
    }
}

/// The structures that hold any of the route's jobs, one description each.
pub fn non_empty(held: &[Held]) -> Vec<String> {
    held.iter()
        .filter(|h| h.jobs > 0)
        .map(Held::describe)
        .collect()
}

/// Reads every structure of `route` (nothing for formats without any).
pub async fn read(conn: &mut ConnectionManager, route: &Route) -> Result<Vec<Held>> {
    let mut out = Vec::new();
    for structure in structures::of_route(&route.format, &route.redis_key) {
        out.push(count(conn, &structure).await?);
    }
    Ok(out)
}

/// Counts the route's members of one sorted set and their earliest score,
/// page by page: a count keeps no member (this runs with every diff,
/// including the periodic gauges).
async fn count(conn: &mut ConnectionManager, structure: &Structure) -> Result<Held> {
    let (mut jobs, mut earliest) = (0u64, None::<f64>);
    scan_owned(conn, structure, |_, score| {
        jobs += 1;
        earliest = Some(earliest.map_or(score, |e| e.min(score)));
    })
    .await?;
    Ok(Held {
        holding: structure.holding,
        key: structure.key.clone(),
        jobs,
        next_at: earliest.and_then(structures::score_time),
    })
}

/// The route's members of one sorted set, with their scores.
pub(crate) async fn members(
    conn: &mut ConnectionManager,
    structure: &Structure,
) -> Result<Vec<(Vec<u8>, f64)>> {
    let mut out = Vec::new();
    scan_owned(conn, structure, |member, score| out.push((member, score))).await?;
    Ok(out)
}

/// Hands each of the route's members of one sorted set to `each`. ZSCAN,
/// never ZRANGE of the whole set: Sidekiq's dead set keeps 10,000 jobs by
/// default, shared by every queue.
async fn scan_owned(
    conn: &mut ConnectionManager,
    structure: &Structure,
    mut each: impl FnMut(Vec<u8>, f64),
) -> Result<()> {
    let mut cursor: u64 = 0;
    loop {
        let (next, page): (u64, Vec<(Vec<u8>, f64)>) = redis::cmd("ZSCAN")
            .arg(&structure.key)
            .arg(cursor)
            .arg("COUNT")
            .arg(PAGE)
            .query_async(conn)
            .await?;
        for (member, score) in page {
            if structure.owns(&member) {
                each(member, score);
            }
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}
