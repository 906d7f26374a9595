//! Push rates, sampled over a window (`--sample 5s`) with reads only.
//!
//! Per list: at the start, its length and its newest item (the push end:
//! `LINDEX 0` for an LPUSHed list, `LINDEX -1` for an RPUSHed one); at the
//! end, its length and where that item is now (`LPOS`, from the push end).
//! Every item between it and the push end arrived in the window, so while
//! that item is still there the count is exact. When workers consumed it
//! (or the list was empty at the start) every item now in the list is new:
//! the count is a lower bound, and pushes consumed within the window are
//! not seen at all — a queue its workers keep empty shows about 0.
//!
//! Beside them, `INFO commandstats` read at both ends gives the server's
//! LPUSH/RPUSH/LPUSHX/RPUSHX calls in the window: every list, and calls
//! not items (one call may push many). Scripts (EVAL, EVALSHA, FCALL) are
//! counted apart: a script may push unseen by those counters.
//!
//! What it cannot see: pushes consumed within the window (above), pushes
//! at the other end of a list (a requeue at the front), and identical
//! items pushed after the marker (`LPOS` finds the newest copy, so the
//! count is short by the copies pushed after it).

use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

use super::read;
use super::report::{QueueRow, Rate, ServerPushes};
use crate::config::PushEnd;
use crate::error::Result;

const PUSHES: [&str; 4] = ["lpush", "rpush", "lpushx", "rpushx"];
const SCRIPTS: [&str; 3] = ["eval", "evalsha", "fcall"];

/// One list at the start of the window.
struct Start {
    len: u64,
    marker: Option<Vec<u8>>,
}

/// Samples every row's lists over `window` and sets each row's
/// `push_rate`; returns the server's push calls over the same window, or
/// `None` when `INFO` is refused (a note in `notes` says so).
pub async fn sample(
    conn: &mut ConnectionManager,
    rows: &mut [QueueRow],
    window: Duration,
    notes: &mut Vec<String>,
) -> Result<Option<ServerPushes>> {
    let lists: Vec<(usize, Vec<u8>, PushEnd)> = rows
        .iter()
        .enumerate()
        .flat_map(|(i, r)| r.lists.iter().map(move |l| (i, l.clone(), r.push)))
        .collect();
    let stats_before = commandstats(conn).await;
    let began = Instant::now();
    let mut pipe = redis::pipe();
    for (_, list, push) in &lists {
        pipe.cmd("LINDEX").arg(list).arg(newest(*push));
    }
    let markers: Vec<Option<Vec<u8>>> = if lists.is_empty() {
        Vec::new()
    } else {
        pipe.query_async(conn).await?
    };
    let keys: Vec<&[u8]> = lists.iter().map(|(_, l, _)| l.as_slice()).collect();
    let starts: Vec<Start> = read::lengths(conn, &keys)
        .await?
        .into_iter()
        .zip(markers)
        .map(|(len, marker)| Start { len, marker })
        .collect();
    tokio::time::sleep(window).await;
    let mut counted: Vec<(u64, bool)> = vec![(0, true); rows.len()];
    let mut lpos_refused = false;
    for ((row, list, push), start) in lists.iter().zip(&starts) {
        let (n, exact) = pushed(conn, list, *push, start, &mut lpos_refused).await?;
        counted[*row].0 += n;
        counted[*row].1 &= exact;
    }
    let elapsed = began.elapsed().as_secs_f64().max(f64::EPSILON);
    for (row, (pushed, exact)) in rows.iter_mut().zip(counted) {
        row.push_rate = Some(Rate {
            per_second: pushed as f64 / elapsed,
            pushed,
            exact,
        });
    }
    if lpos_refused {
        notes.push("LPOS is refused or unknown (Redis before 6.0.6): rates are from length changes only, lower bounds".into());
    }
    let stats_after = commandstats(conn).await;
    let (Some(before), Some(after)) = (stats_before, stats_after) else {
        notes.push("INFO commandstats is refused: no server-wide push counters".into());
        return Ok(None);
    };
    let calls = |names: &[&str]| {
        names
            .iter()
            .map(|n| calls_of(&after, n).saturating_sub(calls_of(&before, n)))
            .sum::<u64>() as f64
            / elapsed
    };
    Ok(Some(ServerPushes {
        push_calls_per_second: calls(&PUSHES),
        script_calls_per_second: calls(&SCRIPTS),
    }))
}

/// The index of a list's newest item.
fn newest(push: PushEnd) -> i64 {
    match push {
        PushEnd::Lpush => 0,
        PushEnd::Rpush => -1,
    }
}

/// Items pushed to `list` since `start`, and whether the count is exact.
async fn pushed(
    conn: &mut ConnectionManager,
    list: &[u8],
    push: PushEnd,
    start: &Start,
    lpos_refused: &mut bool,
) -> Result<(u64, bool)> {
    let len: u64 = read::lengths(conn, &[list]).await?[0];
    let Some(marker) = &start.marker else {
        return Ok((len, false));
    };
    if *lpos_refused {
        return Ok((len.saturating_sub(start.len), false));
    }
    let rank = if push == PushEnd::Lpush { 1 } else { -1 };
    let at: redis::RedisResult<Option<u64>> = redis::cmd("LPOS")
        .arg(list)
        .arg(marker)
        .arg("RANK")
        .arg(rank)
        .query_async(conn)
        .await;
    match at {
        Ok(Some(i)) => Ok((
            match push {
                PushEnd::Lpush => i,
                PushEnd::Rpush => len.saturating_sub(i + 1),
            },
            true,
        )),
        Ok(None) => Ok((len, false)),
        Err(e) if read::refused(&e) => {
            *lpos_refused = true;
            Ok((len.saturating_sub(start.len), false))
        }
        Err(e) => Err(e.into()),
    }
}

/// `INFO commandstats`, or `None` when refused.
async fn commandstats(conn: &mut ConnectionManager) -> Option<String> {
    redis::cmd("INFO")
        .arg("commandstats")
        .query_async::<String>(conn)
        .await
        .ok()
}

/// The `calls` of `cmdstat_<name>` in an `INFO commandstats` text.
pub(super) fn calls_of(info: &str, name: &str) -> u64 {
    let prefix = format!("cmdstat_{name}:");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_read_per_command() {
        let info = "# Commandstats\r\ncmdstat_lpush:calls=12,usec=30,usec_per_call=2.50,rejected_calls=0,failed_calls=0\r\ncmdstat_lpushx:calls=3,usec=1\r\n";
        assert_eq!(calls_of(info, "lpush"), 12);
        assert_eq!(calls_of(info, "lpushx"), 3);
        assert_eq!(calls_of(info, "rpush"), 0);
    }
}
