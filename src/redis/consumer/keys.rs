//! The Redis keys a consumer owns, the Lua scripts that finish an item
//! atomically, and the pop-side numbering of content-hash job keys.

use std::time::Duration;

use sqlx::PgPool;

use crate::model::formats::{Decoded, KeySource};
use crate::model::Phase;
use crate::redis::keys::glob_escape;

/// Key names of one consumer of one route.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    route: String,
    consumer: String,
}

impl Keys {
    pub(super) fn new(route: &str, consumer: &str) -> Keys {
        Keys {
            route: route.to_string(),
            consumer: consumer.to_string(),
        }
    }

    /// `qbridge:processing:<route>:<consumer>:<n>`: the item slot `n` is
    /// working on, moved there by BLMOVE so a crash cannot lose it.
    pub(super) fn processing(&self, n: usize) -> String {
        format!("qbridge:processing:{}:{}:{n}", self.route, self.consumer)
    }

    /// `qbridge:inflight:<route>:<consumer>:<n>`: a hash beside the
    /// processing list with the item's job key and attempts so far, so both
    /// survive a crash (a content-hash key was numbered when it was popped;
    /// numbering it again after a restart would give it another key).
    pub(super) fn inflight(&self, n: usize) -> String {
        format!("qbridge:inflight:{}:{}:{n}", self.route, self.consumer)
    }

    /// `qbridge:dead:<route>`: items out of attempts or failed for good.
    pub(super) fn dead(&self) -> String {
        format!("qbridge:dead:{}", self.route)
    }

    /// SCAN pattern of every processing list of this consumer, whatever its
    /// concurrency was when it wrote them.
    pub(super) fn processing_pattern(&self) -> String {
        format!(
            "qbridge:processing:{}:{}:*",
            glob_escape(&self.route),
            glob_escape(&self.consumer)
        )
    }

    /// The slot number of a processing list found by the pattern.
    pub(super) fn slot_of(&self, list: &str) -> Option<usize> {
        let prefix = format!("qbridge:processing:{}:{}:", self.route, self.consumer);
        list.strip_prefix(&prefix)?.parse().ok()
    }

    /// The connection name shown by `CLIENT LIST` (operators, tests).
    pub(super) fn client_name(&self, n: usize) -> String {
        format!("qbridge-consumer:{}:{}:{n}", self.route, self.consumer)
    }
}

/// Ack: remove the item from the processing list and forget its state, in
/// one step. KEYS: processing, inflight. ARGV: item. Returns items removed.
pub(super) const ACK_LUA: &str = r#"
local n = redis.call('LREM', KEYS[1], -1, ARGV[1])
redis.call('DEL', KEYS[2])
return n
"#;

/// Dead: move the item from the processing list to the dead list and forget
/// its state, in one step; an item no longer in the processing list is not
/// pushed (it would be a second copy). KEYS: processing, inflight, dead.
/// ARGV: item. Returns items moved.
pub(super) const DEAD_LUA: &str = r#"
local n = redis.call('LREM', KEYS[1], -1, ARGV[1])
if n > 0 then redis.call('LPUSH', KEYS[3], ARGV[1]) end
redis.call('DEL', KEYS[2])
return n
"#;

const POP_OCCURRENCE_SQL: &str = r#"
INSERT INTO qbridge.key_occurrences (queue, side, hash, n)
VALUES ($1, 'pop', $2, 1)
ON CONFLICT (queue, side, hash) DO UPDATE SET n = key_occurrences.n + 1
RETURNING n
"#;

/// How long numbering a pop may wait for Postgres before the item runs
/// with an unnumbered key: the live run must not wait on the comparison.
const NUMBERING_TIMEOUT: Duration = Duration::from_secs(2);

/// The job key of a freshly popped item. Ids are keys as they are. A
/// content hash gets the next pop occurrence of its hash on the queue
/// (`key_occurrences`, side `pop`), so the n-th pop of some bytes gets the
/// key the n-th push of them got.
///
/// In `redis_only` the push side numbers nothing (nothing is mirrored), so
/// counting pops then would put the two counts out of step for good; the
/// key is then `sha256:<hex>:0`, as it is when Postgres cannot be reached in
/// time. Occurrence 0 is never a push's number, so such an outcome never
/// matches a wrong job.
pub(super) async fn job_key(db: &PgPool, queue: &str, phase: Phase, decoded: &Decoded) -> String {
    let KeySource::ContentHash(hash) = &decoded.key else {
        return decoded.key.with_occurrence(0);
    };
    if phase == Phase::RedisOnly {
        return decoded.key.with_occurrence(0);
    }
    let numbered = sqlx::query_scalar::<_, i64>(POP_OCCURRENCE_SQL)
        .bind(queue)
        .bind(hash)
        .fetch_one(db);
    match tokio::time::timeout(NUMBERING_TIMEOUT, numbered).await {
        Ok(Ok(n)) => decoded.key.with_occurrence(n.max(0) as u64),
        Ok(Err(e)) => {
            tracing::warn!(queue, error = %e, "cannot number a popped item; its outcome gets occurrence 0");
            decoded.key.with_occurrence(0)
        }
        Err(_) => {
            tracing::warn!(
                queue,
                "numbering a popped item timed out; its outcome gets occurrence 0"
            );
            decoded.key.with_occurrence(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_slots_round_trip() {
        let k = Keys::new("emails", "host-1");
        assert_eq!(k.processing(3), "qbridge:processing:emails:host-1:3");
        assert_eq!(k.slot_of(&k.processing(12)), Some(12));
        assert_eq!(k.slot_of("qbridge:processing:emails:host-1:x"), None);
        assert_eq!(k.slot_of("qbridge:processing:emails:host-10:1"), None);
        assert_eq!(
            Keys::new("r", "a*[b]").processing_pattern(),
            r"qbridge:processing:r:a\*\[b\]:*"
        );
    }
}
