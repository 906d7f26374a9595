//! Where a framework keeps a queue's jobs outside the list qbridge mirrors
//! (issue 14): jobs scheduled for later, waiting to be retried, or dead. No
//! I/O here, only the layout; `ops::structures` reads it.
//!
//! **Sidekiq** (6.x, `lib/sidekiq/client.rb` and `job_retry.rb`): a job with
//! `at` goes to the sorted set `schedule` (score: when), a failed job to
//! `retry` (score: the next attempt, the job carrying `retry_count`), a job
//! out of retries to `dead`. The three sets are shared by every queue; each
//! member is the job's JSON with its `queue`, so a route owns the members
//! naming its queue. With a `redis-namespace` prefix (`ns:queue:default`)
//! the sets carry the same prefix (`ns:schedule`).
//!
//! **Celery** with kombu's Redis transport (`kombu/transport/redis.py`,
//! `_q_for_pri`): a task sent with a priority goes to a list of its own,
//! `<queue>\x06\x16<step>`, the priority rounded down to a step of
//! `priority_steps` (`[0, 3, 6, 9]` by default; step 0 is the queue's own
//! list). Workers read the lists in that order: a lower number runs first.
//! Those lists are the route's too ([`priority_lists`]).
//!
//! **RQ** (`rq/registry.py`): `rq:scheduled:<queue>` and `rq:failed:<queue>`,
//! sets of job ids of the queue's own ([`of_route`]).
//!
//! The other formats' structures (Celery's `unacked` hash, resque-scheduler's
//! `delayed_queue_schedule`) are not read yet: the runbook says so
//! (`cutover/frameworks.md`).

use std::fmt;

use super::formats::Format;

/// kombu's separator between a queue's name and its priority step.
pub const CELERY_PRIORITY_SEP: &[u8] = b"\x06\x16";

/// kombu's default `priority_steps` above 0 (0 is the queue's own list).
pub const CELERY_PRIORITY_STEPS: [u8; 3] = [3, 6, 9];

/// The other lists a route's ready jobs wait in besides `redis_key`: for
/// Celery the priority lists (`<queue>\x06\x16<step>`), none otherwise.
pub fn priority_lists(format: &Format, redis_key: &[u8]) -> Vec<Vec<u8>> {
    if *format != Format::Celery {
        return Vec::new();
    }
    CELERY_PRIORITY_STEPS
        .iter()
        .map(|step| [redis_key, CELERY_PRIORITY_SEP, step.to_string().as_bytes()].concat())
        .collect()
}

/// What the jobs of a structure are waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Holding {
    /// To run at a time (Sidekiq `perform_in`/`perform_at`).
    Scheduled,
    /// Their next attempt after a failure.
    Retrying,
    /// Nothing: out of attempts, kept for an operator.
    Dead,
}

impl fmt::Display for Holding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Holding::Scheduled => "scheduled",
            Holding::Retrying => "retrying",
            Holding::Dead => "dead",
        })
    }
}

/// A sorted set scored by time. A set shared by every queue (Sidekiq's)
/// holds JSON jobs naming their queue in `queue_field`, and the route owns
/// the members naming `queue`; a set of the queue's own (RQ's registries,
/// `queue_field` `None`) is the route's whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Structure {
    pub holding: Holding,
    /// The Redis key of the sorted set.
    pub key: String,
    /// The member field that names the job's queue (`None`: the set is the
    /// queue's own).
    pub queue_field: Option<&'static str>,
    /// The queue name this route's jobs carry there.
    pub queue: String,
}

impl Structure {
    /// Whether a member belongs to this route's queue: every member of a
    /// set of the queue's own; in a shared set, a JSON job naming the queue
    /// (anything else belongs to none).
    pub fn owns(&self, member: &[u8]) -> bool {
        let Some(queue_field) = self.queue_field else {
            return true;
        };
        serde_json::from_slice::<serde_json::Value>(member)
            .ok()
            .and_then(|job| {
                job.get(queue_field)
                    .and_then(|q| q.as_str())
                    .map(|q| q == self.queue)
            })
            .unwrap_or(false)
    }
}

/// A sorted-set score (seconds since the epoch, fractional, as Sidekiq
/// writes them) as a time; `None` when out of range.
pub fn score_time(score: f64) -> Option<chrono::DateTime<chrono::Utc>> {
    use chrono::TimeZone;
    chrono::Utc
        .timestamp_millis_opt((score * 1000.0) as i64)
        .single()
}

/// The structures a route's jobs may wait in besides its list, given its
/// format and list key. Empty for a list key that is not the framework's
/// own naming (the route is then a plain list).
pub fn of_route(format: &Format, redis_key: &[u8]) -> Vec<Structure> {
    match format {
        Format::Sidekiq => sidekiq(redis_key),
        Format::Rq => rq(redis_key),
        _ => Vec::new(),
    }
}

/// RQ's registries of the queue `rq:queue:<name>` that hold jobs not in
/// the list (`rq/registry.py`): `rq:scheduled:<name>` (`enqueue_in`/
/// `enqueue_at`, score: when) and `rq:failed:<name>` (jobs that failed;
/// score: when RQ forgets them). Members are job ids; the jobs are the
/// hashes `rq:job:<id>`. The started, finished, deferred and canceled
/// registries hold nothing to carry: running, done, waiting on another job,
/// or cancelled.
fn rq(redis_key: &[u8]) -> Vec<Structure> {
    let Some(queue) = std::str::from_utf8(redis_key)
        .ok()
        .and_then(|key| key.strip_prefix("rq:queue:"))
        .filter(|queue| !queue.is_empty())
    else {
        return Vec::new();
    };
    [(Holding::Scheduled, "scheduled"), (Holding::Dead, "failed")]
        .into_iter()
        .map(|(holding, registry)| Structure {
            holding,
            key: format!("rq:{registry}:{queue}"),
            queue_field: None,
            queue: queue.to_string(),
        })
        .collect()
}

/// Sidekiq's sets for the list `[<namespace>:]queue:<name>`.
fn sidekiq(redis_key: &[u8]) -> Vec<Structure> {
    let Ok(key) = std::str::from_utf8(redis_key) else {
        return Vec::new();
    };
    let (prefix, queue) = match key.rsplit_once("queue:") {
        Some((prefix, queue))
            if !queue.is_empty() && (prefix.is_empty() || prefix.ends_with(':')) =>
        {
            (prefix, queue)
        }
        _ => return Vec::new(),
    };
    [
        (Holding::Scheduled, "schedule"),
        (Holding::Retrying, "retry"),
        (Holding::Dead, "dead"),
    ]
    .into_iter()
    .map(|(holding, set)| Structure {
        holding,
        key: format!("{prefix}{set}"),
        queue_field: Some("queue"),
        queue: queue.to_string(),
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidekiq_queues_own_their_members_of_the_shared_sets() {
        let sets = of_route(&Format::Sidekiq, b"queue:mailers");
        let keys: Vec<&str> = sets.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, ["schedule", "retry", "dead"]);
        assert!(sets[0].owns(br#"{"class":"Mail","queue":"mailers","jid":"a"}"#));
        assert!(!sets[0].owns(br#"{"class":"Mail","queue":"default","jid":"b"}"#));
        assert!(!sets[0].owns(b"not json"));
    }

    #[test]
    fn a_namespace_prefixes_the_sets_and_other_keys_have_none() {
        let sets = of_route(&Format::Sidekiq, b"app:queue:default");
        assert_eq!(sets[1].key, "app:retry");
        assert_eq!(sets[1].queue, "default");
        assert!(of_route(&Format::Sidekiq, b"jobs").is_empty());
        assert!(of_route(&Format::Sidekiq, b"myqueue:x").is_empty());
        assert!(of_route(&Format::Raw, b"queue:default").is_empty());
    }

    #[test]
    fn rq_queues_have_their_own_scheduled_and_failed_registries() {
        let sets = of_route(&Format::Rq, b"rq:queue:reports");
        let keys: Vec<&str> = sets.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, ["rq:scheduled:reports", "rq:failed:reports"]);
        assert!(sets[0].owns(b"any-job-id"));
        assert!(of_route(&Format::Rq, b"reports").is_empty());
    }
}
