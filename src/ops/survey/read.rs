//! The reads every recogniser shares, all of them read-only commands:
//! lengths in one pipeline, a small sample of a list's items (to measure
//! sizes and read a queue name or a version field, never to print), and a
//! tally of a shared structure's members by the queue each names.
//!
//! A shared structure (Sidekiq's `retry` set, Celery's `unacked` hash,
//! Resque's `failed` list) is read page by page up to [`MAX_MEMBERS`];
//! past that the counts are scaled from what was read and marked estimated,
//! so a survey of a disaster-sized retry set still ends.

use std::collections::HashMap;

use redis::aio::ConnectionManager;

use crate::error::Result;

/// Members of one shared structure read to tally it by queue.
pub const MAX_MEMBERS: u64 = 100_000;
/// Members per ZRANGE, LRANGE or HSCAN step.
const PAGE: u64 = 1000;
/// Items sampled from each end of a list to measure sizes.
pub const SAMPLE_EACH_END: usize = 5;

/// A structure's members counted by the queue each names.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Tally {
    pub by_queue: HashMap<String, u64>,
    /// Members in the structure, and how many were read.
    pub total: u64,
    pub read: u64,
}

impl Tally {
    /// The count for `queue`, scaled up when only part was read.
    pub fn of(&self, queue: &str) -> u64 {
        let n = self.by_queue.get(queue).copied().unwrap_or(0);
        if self.read == 0 || self.read >= self.total {
            return n;
        }
        (n as f64 * self.total as f64 / self.read as f64).round() as u64
    }

    /// Whether the counts are scaled from part of the structure.
    pub fn estimated(&self) -> bool {
        self.read < self.total
    }

    /// Adds another structure's tally (the same queues' counts summed).
    pub fn merge(&mut self, other: Tally) {
        for (queue, n) in other.by_queue {
            *self.by_queue.entry(queue).or_default() += n;
        }
        self.total += other.total;
        self.read += other.read;
    }
}

/// How a structure keeps its members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    List,
    SortedSet,
    /// A hash's values (Celery's `unacked`).
    HashValues,
}

/// Counts `key`'s members by `queue_of(member)` (members naming no queue
/// are skipped), reading at most [`MAX_MEMBERS`].
pub async fn tally(
    conn: &mut ConnectionManager,
    key: &[u8],
    shape: Shape,
    queue_of: &mut dyn FnMut(&[u8]) -> Option<String>,
) -> Result<Tally> {
    let total: u64 = redis::cmd(match shape {
        Shape::List => "LLEN",
        Shape::SortedSet => "ZCARD",
        Shape::HashValues => "HLEN",
    })
    .arg(key)
    .query_async(conn)
    .await?;
    let mut tally = Tally {
        total,
        ..Tally::default()
    };
    let mut count = |member: &[u8], tally: &mut Tally| {
        tally.read += 1;
        if let Some(queue) = queue_of(member) {
            *tally.by_queue.entry(queue).or_default() += 1;
        }
    };
    if shape == Shape::HashValues {
        let mut cursor = 0u64;
        loop {
            let (next, pairs): (u64, Vec<Vec<u8>>) = redis::cmd("HSCAN")
                .arg(key)
                .arg(cursor)
                .arg("COUNT")
                .arg(PAGE)
                .query_async(conn)
                .await?;
            for value in pairs.iter().skip(1).step_by(2) {
                count(value, &mut tally);
            }
            if next == 0 {
                // HSCAN may return a member twice while the hash rehashes:
                // a full walk is a full count, not more.
                tally.read = tally.read.min(total);
                return Ok(tally);
            }
            if tally.read >= MAX_MEMBERS {
                return Ok(tally);
            }
            cursor = next;
        }
    }
    let mut start = 0u64;
    while start < total.min(MAX_MEMBERS) {
        let stop = (start + PAGE).min(MAX_MEMBERS) - 1;
        let page: Vec<Vec<u8>> = redis::cmd(if shape == Shape::List {
            "LRANGE"
        } else {
            "ZRANGE"
        })
        .arg(key)
        .arg(start)
        .arg(stop)
        .query_async(conn)
        .await?;
        if page.is_empty() {
            break;
        }
        for member in &page {
            count(member, &mut tally);
        }
        start += PAGE;
    }
    Ok(tally)
}

/// The `queue` field of a JSON object (Sidekiq's jobs, Resque's entries).
pub fn queue_field(member: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(member).ok()?;
    value.get("queue")?.as_str().map(str::to_owned)
}

/// The lengths of `keys` (LLEN each, pipelined), in order.
pub async fn lengths(conn: &mut ConnectionManager, keys: &[&[u8]]) -> Result<Vec<u64>> {
    pipelined(conn, "LLEN", keys).await
}

/// The types of `keys` (TYPE each, pipelined; `"none"` for a missing key).
pub async fn types(conn: &mut ConnectionManager, keys: &[&[u8]]) -> Result<Vec<String>> {
    pipelined(conn, "TYPE", keys).await
}

/// The cardinality of each of `keys` that is a sorted set; 0 for a key
/// that is missing or of another type.
pub async fn zcards(conn: &mut ConnectionManager, keys: &[&[u8]]) -> Result<Vec<u64>> {
    let kinds = types(conn, keys).await?;
    let zsets: Vec<&[u8]> = keys
        .iter()
        .zip(&kinds)
        .filter(|(_, t)| *t == "zset")
        .map(|(k, _)| *k)
        .collect();
    let mut cards = pipelined::<u64>(conn, "ZCARD", &zsets).await?.into_iter();
    Ok(kinds
        .iter()
        .map(|t| {
            if t == "zset" {
                cards.next().unwrap_or(0)
            } else {
                0
            }
        })
        .collect())
}

/// `cmd key` for every key, [`PAGE`] to a pipeline (a keyspace of a
/// million lists is a thousand round trips, not one reply of a million).
async fn pipelined<T: redis::FromRedisValue>(
    conn: &mut ConnectionManager,
    cmd: &str,
    keys: &[&[u8]],
) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(PAGE as usize) {
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.cmd(cmd).arg(*key);
        }
        out.extend(pipe.query_async::<Vec<T>>(conn).await?);
    }
    Ok(out)
}

/// Up to [`SAMPLE_EACH_END`] items from each end of the list `key` (fewer
/// when it is shorter), for sizes and a field or two. The caller keeps
/// them in memory only.
pub async fn sample(conn: &mut ConnectionManager, key: &[u8], len: u64) -> Result<Vec<Vec<u8>>> {
    let n = SAMPLE_EACH_END as i64;
    if len as i64 <= 2 * n {
        return Ok(redis::cmd("LRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await?);
    }
    let (mut head, tail): (Vec<Vec<u8>>, Vec<Vec<u8>>) = redis::pipe()
        .cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(n - 1)
        .cmd("LRANGE")
        .arg(key)
        .arg(-n)
        .arg(-1)
        .query_async(conn)
        .await?;
    head.extend(tail);
    Ok(head)
}

/// The type of `key` (`"none"` when missing).
pub async fn key_type(conn: &mut ConnectionManager, key: &[u8]) -> Result<String> {
    Ok(redis::cmd("TYPE").arg(key).query_async(conn).await?)
}

/// Whether a Redis error is the server refusing the command itself (no
/// ACL permission, unknown to this version): the survey does without it.
pub fn refused(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::NoPerm)
            | ErrorKind::Server(ServerErrorKind::ResponseError)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_tally_is_scaled_and_marked() {
        let mut t = Tally {
            total: 1000,
            read: 100,
            ..Tally::default()
        };
        t.by_queue.insert("a".into(), 10);
        assert_eq!(t.of("a"), 100);
        assert_eq!(t.of("b"), 0);
        assert!(t.estimated());
        t.read = 1000;
        assert_eq!(t.of("a"), 10);
        assert!(!t.estimated());
    }

    #[test]
    fn the_queue_field_is_read_from_json_objects_only() {
        assert_eq!(
            queue_field(br#"{"queue":"mail","args":[1]}"#),
            Some("mail".into())
        );
        assert_eq!(queue_field(b"not json"), None);
        assert_eq!(queue_field(br#"{"queue":3}"#), None);
    }
}
