//! The keyspace walk: every list and set of the database, by name, from
//! `SCAN` (never `KEYS`: the server keeps serving while it runs).
//!
//! One `SCAN … TYPE <type>` pass per type (Redis 6.0 and later) lets the
//! server skip everything else, so a keyspace of a million RQ job hashes
//! costs two walks of the dictionary and almost no traffic. Lists are all
//! needed (any may be a hand-rolled queue) and sets name the frameworks'
//! queues (`queues`, kombu's bindings, under any prefix); every other key
//! a recogniser reads — sorted sets, hashes, strings — it finds by a name
//! those give it, so they are never listed. An older server refuses the
//! `TYPE` option: then one plain pass asks `TYPE` of every key in a
//! pipeline per page.
//!
//! Keys are bytes: kombu's priority lists hold `\x06\x16`, and nothing says
//! a key is UTF-8.

use std::collections::BTreeSet;

use redis::aio::ConnectionManager;

use crate::error::Result;

/// Keys asked for per SCAN step (a hint to the server).
const COUNT: u64 = 1000;

/// The names of the lists and sets of the database.
#[derive(Debug, Default)]
pub struct Keyspace {
    /// DBSIZE when the walk began.
    pub keys: u64,
    pub lists: BTreeSet<Vec<u8>>,
    pub sets: BTreeSet<Vec<u8>>,
}

impl Keyspace {
    /// Lists whose name starts with `prefix`.
    pub fn lists_under<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        under(&self.lists, prefix)
    }

    /// Sets whose name starts with `prefix`.
    pub fn sets_under<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        under(&self.sets, prefix)
    }
}

fn under<'a>(keys: &'a BTreeSet<Vec<u8>>, prefix: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
    keys.range(prefix.to_vec()..)
        .take_while(move |k| k.starts_with(prefix))
        .map(|k| k.as_slice())
}

/// Walks the database. `progress(done, total)` is called after every SCAN
/// step with an estimate of the steps in all (DBSIZE / COUNT per pass).
pub async fn scan(
    conn: &mut ConnectionManager,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Keyspace> {
    let keys: u64 = redis::cmd("DBSIZE").query_async(conn).await?;
    let total = keys.div_ceil(COUNT).max(1) * 2;
    let mut done = 0u64;
    let mut step = |_: ()| {
        done += 1;
        progress(done.min(total), total);
    };
    let Some(lists) = typed_pass(conn, "list", &mut step).await? else {
        return untyped(conn, keys, progress).await;
    };
    let sets = typed_pass(conn, "set", &mut step)
        .await?
        .unwrap_or_default();
    Ok(Keyspace { keys, lists, sets })
}

/// The names of every key of type `kind`; `None` when the server has no
/// `TYPE` option on SCAN (before Redis 6.0).
async fn typed_pass(
    conn: &mut ConnectionManager,
    kind: &str,
    step: &mut dyn FnMut(()),
) -> Result<Option<BTreeSet<Vec<u8>>>> {
    let (mut cursor, mut out) = (0u64, BTreeSet::new());
    loop {
        let reply: redis::RedisResult<(u64, Vec<Vec<u8>>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(COUNT)
            .arg("TYPE")
            .arg(kind)
            .query_async(conn)
            .await;
        let (next, names) = match reply {
            Ok(page) => page,
            Err(e) if cursor == 0 && super::read::refused(&e) && !no_perm(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        out.extend(names);
        step(());
        if next == 0 {
            return Ok(Some(out));
        }
        cursor = next;
    }
}

fn no_perm(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
}

/// One plain pass asking `TYPE` of every key (servers before 6.0).
async fn untyped(
    conn: &mut ConnectionManager,
    keys: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Keyspace> {
    let mut space = Keyspace {
        keys,
        ..Keyspace::default()
    };
    let total = keys.div_ceil(COUNT).max(1);
    let (mut cursor, mut done) = (0u64, 0u64);
    loop {
        let (next, names): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(COUNT)
            .query_async(conn)
            .await?;
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.cmd("TYPE").arg(name);
        }
        let types: Vec<String> = if names.is_empty() {
            Vec::new()
        } else {
            pipe.query_async(conn).await?
        };
        for (name, kind) in names.into_iter().zip(types) {
            match kind.as_str() {
                "list" => space.lists.insert(name),
                "set" => space.sets.insert(name),
                _ => false,
            };
        }
        done += 1;
        progress(done.min(total), total);
        if next == 0 {
            return Ok(space);
        }
        cursor = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_under_a_prefix_are_found_in_order() {
        let lists: BTreeSet<Vec<u8>> = [&b"queue:a"[..], b"queue:b", b"queues", b"other"]
            .iter()
            .map(|k| k.to_vec())
            .collect();
        let space = Keyspace {
            lists,
            ..Keyspace::default()
        };
        let found: Vec<&[u8]> = space.lists_under(b"queue:").collect();
        assert_eq!(found, [&b"queue:a"[..], b"queue:b"]);
    }
}
