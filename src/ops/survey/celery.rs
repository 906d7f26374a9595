//! Celery with kombu's Redis transport (read in kombu 5.7's
//! `kombu/transport/redis.py`), every key under the `global_keyprefix`
//! transport option when one is set (`acme:` before every key):
//!
//! - `_kombu.binding.<exchange>`: a set per exchange whose members are
//!   `<routing key>\x06\x16<pattern>\x06\x16<queue>`: the queues;
//! - `<queue>`: the queue's list, LPUSHed; `<queue>\x06\x16<step>`: its
//!   list for tasks sent with a priority, rounded down to a step of
//!   `priority_steps` (`[0, 3, 6, 9]` by default; 0 is the queue's own);
//! - `unacked`: a hash, delivery tag → `[message, exchange, routing key]`,
//!   of what workers took and have not acknowledged (ETA and countdown
//!   tasks wait here until due), indexed by time in `unacked_index`;
//! - `_kombu.binding.celery.pidbox` binds each worker's `<node>.celery.pidbox`
//!   queue (remote control, pub/sub: no list); `reply.celery.pidbox`'s
//!   queues are lists of replies; `celeryev` is the events exchange;
//! - kombu 5.7 keeps `_kombu.binding_permanent.<exchange>` sets beside the
//!   bindings (5.6 does not).
//!
//! A prefix is seen where a binding set's name has text before
//! `_kombu.binding.`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use redis::aio::ConnectionManager;

use super::read::{self, Shape};
use super::report::{Found, Framework, QueueRow, Sizes};
use super::scan::Keyspace;
use super::Recognised;
use crate::error::Result;
use crate::model::structures::CELERY_PRIORITY_SEP;

const BINDING: &str = "_kombu.binding.";

/// Celery's `Task.max_retries` default (3) plus the first run: what a task
/// that retries gets; a task that never calls `retry` runs once.
pub const MAX_ATTEMPTS: i32 = 4;

/// The binding sets by key prefix (`""` without `global_keyprefix`).
fn bindings_by_prefix(space: &Keyspace) -> BTreeMap<String, Vec<(Vec<u8>, String)>> {
    let mut out: BTreeMap<String, Vec<(Vec<u8>, String)>> = BTreeMap::new();
    for set in &space.sets {
        let Ok(name) = std::str::from_utf8(set) else {
            continue;
        };
        if let Some((prefix, exchange)) = name.split_once(BINDING) {
            out.entry(prefix.to_string())
                .or_default()
                .push((set.clone(), exchange.to_string()));
        }
    }
    out
}

/// Whether an exchange or queue is Celery's own plumbing (remote control,
/// replies, events) rather than a task queue.
fn plumbing(name: &str) -> bool {
    name.ends_with(".pidbox") || name == "celeryev" || name.starts_with("celeryev.")
}

/// A binding member's routing key and queue.
fn binding_member(member: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(member).ok()?;
    let sep = std::str::from_utf8(CELERY_PRIORITY_SEP).ok()?;
    let mut parts = text.split(sep);
    let routing_key = parts.next()?.to_string();
    let _pattern = parts.next()?;
    let queue = parts.next()?.to_string();
    Some((routing_key, queue))
}

/// Every Celery installation (one per key prefix).
pub async fn recognise(conn: &mut ConnectionManager, space: &Keyspace) -> Result<Vec<Recognised>> {
    let mut out = Vec::new();
    for (prefix, sets) in bindings_by_prefix(space) {
        out.push(one(conn, space, &prefix, &sets).await?);
    }
    Ok(out)
}

async fn one(
    conn: &mut ConnectionManager,
    space: &Keyspace,
    prefix: &str,
    sets: &[(Vec<u8>, String)],
) -> Result<Recognised> {
    let mut found = Found::new(Framework::Celery, prefix);
    if !prefix.is_empty() {
        found.options.push(format!(
            "global_keyprefix {prefix:?}: every key starts with it"
        ));
    }
    if space
        .sets_under(format!("{prefix}_kombu.binding_permanent.").as_bytes())
        .next()
        .is_some()
    {
        found
            .version_hints
            .push("kombu 5.7 or later (binding_permanent sets)".into());
    }
    let mut queues = BTreeSet::new();
    let mut route_of: HashMap<(String, String), String> = HashMap::new();
    for (set, exchange) in sets {
        let members: Vec<Vec<u8>> = redis::cmd("SMEMBERS").arg(set).query_async(conn).await?;
        if exchange == "celery.pidbox" {
            found.workers += members.len() as u64;
        }
        if plumbing(exchange) {
            continue;
        }
        for (routing_key, queue) in members.iter().filter_map(|m| binding_member(m)) {
            if !plumbing(&queue) && !queue.is_empty() {
                route_of.insert((exchange.clone(), routing_key), queue.clone());
                queues.insert(queue);
            }
        }
    }
    let unacked = unacked(conn, prefix, &route_of).await?;
    let mut claimed: Vec<Vec<u8>> = space
        .lists_under(prefix.as_bytes())
        .filter(|k| k.ends_with(b".reply.celery.pidbox"))
        .map(<[u8]>::to_vec)
        .collect();
    let mut rows = Vec::new();
    let mut steps_seen = BTreeSet::new();
    for queue in &queues {
        let mut row = queue_row(conn, space, prefix, queue, &mut found).await?;
        steps_seen.extend(row.priority_steps.iter().copied());
        claimed.extend(row.lists.iter().cloned());
        // kombu makes the hash on a worker's first take: none, none taken.
        row.in_flight = Some(unacked.as_ref().map_or(0, |t| t.of(queue)));
        if unacked.as_ref().is_some_and(read::Tally::estimated) {
            row.estimated.push("in_flight");
        }
        rows.push(row);
    }
    if !steps_seen.is_empty() {
        found
            .options
            .push(format!("priority lists for steps {steps_seen:?}"));
    }
    Ok(Recognised {
        found,
        rows,
        claimed,
    })
}

/// One queue: its list and priority lists, and a sample's sizes and
/// message protocol.
async fn queue_row(
    conn: &mut ConnectionManager,
    space: &Keyspace,
    prefix: &str,
    queue: &str,
    found: &mut Found,
) -> Result<QueueRow> {
    let key = format!("{prefix}{queue}").into_bytes();
    let mut row = QueueRow::new(Framework::Celery, prefix, queue, key.clone());
    let priority_prefix = [key.as_slice(), CELERY_PRIORITY_SEP].concat();
    for list in space.lists_under(&priority_prefix) {
        let step = std::str::from_utf8(&list[priority_prefix.len()..])
            .ok()
            .and_then(|s| s.parse::<u8>().ok());
        if let Some(step) = step {
            row.priority_steps.push(step);
            row.lists.push(list.to_vec());
        }
    }
    let lists: Vec<&[u8]> = row.lists.iter().map(Vec::as_slice).collect();
    let lengths = read::lengths(conn, &lists).await?;
    row.waiting = lengths.iter().sum();
    let mut items = Vec::new();
    for (list, len) in row.lists.iter().zip(&lengths) {
        if *len > 0 && items.len() < 2 * read::SAMPLE_EACH_END {
            items.extend(read::sample(conn, list, *len).await?);
        }
    }
    row.payload = Sizes::of_lengths(items.iter().map(|i| i.len() as u64).collect(), "items");
    if let Some(hint) = items.first().and_then(|m| protocol_hint(m)) {
        if !found.version_hints.contains(&hint) {
            found.version_hints.push(hint);
        }
    }
    Ok(row)
}

/// The task protocol of a message: version 2 (Celery 4 and later) keeps
/// the task's name in `headers.task`, version 1 in the body.
pub(super) fn protocol_hint(message: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(message).ok()?;
    if value.get("headers")?.get("task").is_some() {
        Some("task protocol 2 (Celery 4 or later)".into())
    } else {
        Some("task protocol 1 (Celery 3, or task_protocol = 1)".into())
    }
}

/// kombu's `unacked` hash tallied by queue: an entry's exchange and
/// routing key name the queue through the bindings (the routing key itself
/// when no binding says otherwise).
async fn unacked(
    conn: &mut ConnectionManager,
    prefix: &str,
    route_of: &HashMap<(String, String), String>,
) -> Result<Option<read::Tally>> {
    let key = format!("{prefix}unacked");
    if read::key_type(conn, key.as_bytes()).await? != "hash" {
        return Ok(None);
    }
    let mut queue_of = |entry: &[u8]| {
        let value: serde_json::Value = serde_json::from_slice(entry).ok()?;
        let exchange = value.get(1)?.as_str()?.to_string();
        let routing_key = value.get(2)?.as_str()?.to_string();
        Some(
            route_of
                .get(&(exchange, routing_key.clone()))
                .cloned()
                .unwrap_or(routing_key),
        )
    };
    Ok(Some(
        read::tally(conn, key.as_bytes(), Shape::HashValues, &mut queue_of).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_name_their_queue_and_plumbing_is_left_out() {
        assert_eq!(
            binding_member(b"orders\x06\x16\x06\x16orders"),
            Some(("orders".into(), "orders".into()))
        );
        assert_eq!(binding_member(b"no separator"), None);
        assert!(plumbing("celery@vm.celery.pidbox"));
        assert!(plumbing("celeryev"));
        assert!(!plumbing("orders"));
    }

    #[test]
    fn a_prefix_is_what_precedes_the_binding() {
        let sets = [
            &b"acme:_kombu.binding.orders"[..],
            b"_kombu.binding.celery",
            b"queues",
        ]
        .iter()
        .map(|k| k.to_vec())
        .collect();
        let space = Keyspace {
            sets,
            ..Keyspace::default()
        };
        let by = bindings_by_prefix(&space);
        let prefixes: Vec<&str> = by.keys().map(String::as_str).collect();
        assert_eq!(prefixes, ["", "acme:"]);
        assert_eq!(by["acme:"][0].1, "orders");
    }

    #[test]
    fn the_protocol_shows_in_the_headers() {
        let v2 = protocol_hint(br#"{"body":"W10=","headers":{"task":"t","id":"1"}}"#).unwrap();
        assert!(v2.contains("protocol 2"));
        let v1 = protocol_hint(br#"{"body":"W10=","headers":{}}"#).unwrap();
        assert!(v1.contains("protocol 1"));
    }
}
