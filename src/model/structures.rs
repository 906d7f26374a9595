//! Where a framework keeps a queue's jobs outside the list qbridge mirrors:
//! jobs scheduled for later, waiting to be retried, held by a
//! worker, or dead. No I/O here, only the layout; `ops::structures` reads it.
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
//! Those lists are the route's too ([`priority_lists`]). A task a worker
//! took waits in the hash `unacked` (`QoS.append`: delivery tag →
//! `[message, exchange, routing_key]`, indexed by time in `unacked_index`)
//! until the worker acks it — an ETA or countdown task for as long as its
//! ETA is away; kombu puts it back on its list after `visibility_timeout`
//! if the worker is gone. The route owns the entries routed to its queue.
//!
//! A reliable fetch (Sidekiq Pro's `super_fetch`, gitlab-sidekiq-fetcher)
//! moves a job from the list into a private list of the worker process that
//! runs it: `queue:sq|<identity>|<name>` and `working:queue:<name>:<identity>`
//! under the same namespace, found by key pattern.
//!
//! **RQ** (`rq/registry.py`): `rq:scheduled:<queue>` and `rq:failed:<queue>`,
//! sets of job ids of the queue's own ([`of_route`]).
//!
//! **Resque** (`lib/resque/failure/redis.rb`, and resque-scheduler's
//! `lib/resque/scheduler/delaying_extensions.rb`), under the namespace its
//! lists carry (`resque:queue:<name>` → `resque:`): a failed job is an entry
//! `{"failed_at", "payload", "exception", "error", "backtrace", "worker",
//! "queue"}` appended to the list `failed`, shared by every queue (a
//! requeued one stays there with `retried_at` set: it is back in its queue);
//! a delayed job (`enqueue_at`/`enqueue_in`) is `{"class", "args", "queue"}`
//! appended to the list `delayed:<ts>`, and `<ts>` is a member (and the
//! score) of the sorted set `delayed_queue_schedule`. No Resque client runs
//! here: the tests write these structures as those files define them.

use std::fmt;

use super::formats::Format;

/// kombu's default separator between a queue's name and its priority step
/// (its transport option `sep`).
pub const CELERY_PRIORITY_SEP: &[u8] = b"\x06\x16";

/// kombu's default `priority_steps` above 0 (0 is the queue's own list).
pub const CELERY_PRIORITY_STEPS: [u8; 3] = [3, 6, 9];

/// How a route's framework names its keys where the team changed the
/// framework's defaults: the route's `key_prefix`, `priority_steps`,
/// `priority_sep`, `unacked_key` and `unacked_index_key`. Each `None` is
/// the framework's default.
///
/// kombu (5.4 to 5.7, `kombu/transport/redis.py`) takes them as transport
/// options: `global_keyprefix` goes before every key it sends (the queue's
/// lists, `unacked`, `unacked_index`, `_kombu.binding.*`), so `redis_key`
/// is the prefixed list; `sep` joins a queue and its priority step;
/// `unacked_key` and `unacked_index_key` name the hash and its index, both
/// prefixed too. RQ 3.0 reads `RQ_KEY_PREFIX` from the environment in place
/// of `rq` in every key (`<prefix>:queue:<name>`, `<prefix>:job:<id>`, its
/// registries); earlier RQ releases have no such option.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyNames {
    /// kombu's `global_keyprefix` (default none) or RQ's `RQ_KEY_PREFIX`
    /// (default `rq`).
    pub prefix: Option<String>,
    /// kombu's `priority_steps` above 0 (each has a list of its own);
    /// default 3, 6, 9.
    pub priority_steps: Option<Vec<u8>>,
    /// kombu's `sep`; default `\x06\x16`.
    pub priority_sep: Option<String>,
    /// kombu's `unacked_key`; default `unacked`.
    pub unacked_key: Option<String>,
    /// kombu's `unacked_index_key`; default `unacked_index`.
    pub unacked_index_key: Option<String>,
}

impl KeyNames {
    /// kombu's `global_keyprefix`: empty by default.
    fn kombu_prefix(&self) -> &str {
        self.prefix.as_deref().unwrap_or("")
    }

    /// RQ's key prefix, `rq` unless `RQ_KEY_PREFIX` changed it.
    pub fn rq_prefix(&self) -> &str {
        self.prefix.as_deref().unwrap_or("rq")
    }

    /// RQ's job hash of `id`: `<prefix>:job:<id>`.
    pub fn rq_job(&self, id: &str) -> String {
        format!("{}:job:{id}", self.rq_prefix())
    }
}

/// The other lists a route's ready jobs wait in besides `redis_key`: for
/// Celery the priority lists (`<redis_key><sep><step>`, one per step of
/// kombu's `priority_steps` above 0), none otherwise. kombu prefixes the
/// whole name, so with a `global_keyprefix` they follow the prefixed
/// `redis_key`.
pub fn priority_lists(format: &Format, redis_key: &[u8], names: &KeyNames) -> Vec<Vec<u8>> {
    if *format != Format::Celery {
        return Vec::new();
    }
    let sep = names
        .priority_sep
        .as_deref()
        .map_or(CELERY_PRIORITY_SEP, str::as_bytes);
    names
        .priority_steps
        .as_deref()
        .unwrap_or(&CELERY_PRIORITY_STEPS)
        .iter()
        .map(|step| [redis_key, sep, step.to_string().as_bytes()].concat())
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
    /// Taken by a worker that has not acknowledged them yet (Celery's
    /// `unacked`: ETA tasks wait there until due). The worker runs them.
    Held,
    /// Nothing: out of attempts, kept for an operator.
    Dead,
}

impl fmt::Display for Holding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Holding::Scheduled => "scheduled",
            Holding::Retrying => "retrying",
            Holding::Held => "held by a worker",
            Holding::Dead => "dead",
        })
    }
}

/// How a structure keeps its jobs in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// A sorted set of jobs scored by time (Sidekiq's sets, RQ's registries).
    SortedSet,
    /// A list of entries, with no time (Resque's `failed`).
    List,
    /// resque-scheduler's index: a sorted set of timestamps (member and
    /// score), each naming a list `<lists>` + `<ts>` of jobs due then.
    DelayedIndex { lists: String },
    /// kombu's hash of taken messages (delivery tag → `[message, exchange,
    /// routing_key]`) with `index`, the sorted set of the tags by time taken.
    UnackedHash { index: String },
    /// The private lists of a reliable fetch, one per worker process: the
    /// lists whose keys match the glob `key` (found by `SCAN MATCH`), each
    /// holding jobs a worker took and has not finished.
    PrivateLists,
}

/// Which members of a structure are the route's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// All of them: the set is the queue's own (RQ's registries).
    Whole,
    /// The JSON objects whose field names the queue (Sidekiq's sets,
    /// resque-scheduler's delayed jobs).
    Field(&'static str),
    /// Resque's failed entries naming the queue and not requeued since
    /// (no `retried_at`: a requeued job is back in its list).
    Unrequeued,
    /// kombu's `[message, exchange, routing_key]` routed to the queue.
    RoutingKey,
}

/// A structure of a route: where, in what shape, holding what, and which
/// of its members are the route's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Structure {
    pub holding: Holding,
    /// The Redis key (of the index, for [`Shape::DelayedIndex`] and
    /// [`Shape::UnackedHash`]: the hash).
    pub key: String,
    pub shape: Shape,
    pub owner: Owner,
    /// The queue name this route's jobs carry there.
    pub queue: String,
}

impl Structure {
    /// Whether a member belongs to this route's queue (anything that does
    /// not read as the framework's shape belongs to none).
    pub fn owns(&self, member: &[u8]) -> bool {
        let field = |job: &serde_json::Value, name: &str| {
            job.get(name).and_then(|q| q.as_str()).map(str::to_owned)
        };
        let parse = || serde_json::from_slice::<serde_json::Value>(member).ok();
        match self.owner {
            Owner::Whole => true,
            Owner::Field(name) => parse()
                .and_then(|job| field(&job, name))
                .is_some_and(|q| q == self.queue),
            Owner::Unrequeued => parse().is_some_and(|entry| {
                field(&entry, "queue").is_some_and(|q| q == self.queue)
                    && entry.get("retried_at").is_none_or(|at| at.is_null())
            }),
            Owner::RoutingKey => parse()
                .and_then(|entry| entry.get(2).and_then(|rk| rk.as_str()).map(str::to_owned))
                .is_some_and(|rk| rk == self.queue),
        }
    }

    /// Whether qbridge carries this structure's jobs into Postgres (import,
    /// a forced decommission), or only counts them and holds the gate.
    /// Not carried: jobs a live worker holds (Celery's `unacked`, a reliable
    /// fetch's private lists: the worker runs them, or puts them back on the
    /// list when it finds their worker gone; a copy in Postgres would run
    /// them twice), and delayed
    /// jobs without an id (resque-scheduler's: one moved to its queue by the
    /// scheduler while qbridge carries it could not be told from the copy).
    pub fn carried(&self) -> bool {
        !matches!(
            self.shape,
            Shape::UnackedHash { .. } | Shape::DelayedIndex { .. } | Shape::PrivateLists
        )
    }

    /// Whether `qbridge import` stores this structure's jobs as mirror
    /// copies: the carried ones, and the jobs a worker holds too. A mirror
    /// copy never runs in Postgres unless the Redis side lets go of the job
    /// (`ingest::promote`), so copying a held task runs nothing twice; it
    /// lets the diff and the gates account for the job when the worker runs
    /// it (a countdown task taken before `dual_write` and run after it
    /// otherwise counts as a push that bypassed qbridge). resque-scheduler's
    /// delayed jobs are left out: without an id, a copy could not be told
    /// from the job the scheduler moves to the queue.
    pub fn imported(&self) -> bool {
        !matches!(self.shape, Shape::DelayedIndex { .. })
    }

    /// Whether this is a hash of jobs a worker holds (kombu's `unacked`).
    pub fn is_held_hash(&self) -> bool {
        matches!(self.shape, Shape::UnackedHash { .. })
    }

    /// The job a member holds: kombu's `unacked` entries wrap the message
    /// (`[message, exchange, routing_key]`), every other member is the job.
    /// `None` for an entry that does not read as kombu's.
    pub fn job_of(&self, member: &[u8]) -> Option<Vec<u8>> {
        match self.shape {
            Shape::UnackedHash { .. } => {
                let entry: serde_json::Value = serde_json::from_slice(member).ok()?;
                let message = entry.get(0).filter(|m| m.is_object())?;
                serde_json::to_vec(message).ok()
            }
            _ => Some(member.to_vec()),
        }
    }
}

/// A sorted-set score (seconds since the epoch, fractional, as Sidekiq
/// writes them: `Time.now.to_f + interval`) as a time to the microsecond,
/// what Postgres keeps, so a copy is due when Sidekiq would run it; `None`
/// when out of range.
pub fn score_time(score: f64) -> Option<chrono::DateTime<chrono::Utc>> {
    if !score.is_finite() {
        return None;
    }
    chrono::DateTime::from_timestamp_micros((score * 1e6).round() as i64)
}

/// The structures a route's jobs may wait in besides its list, given its
/// format, list key and the framework's key names. Empty for a list key
/// that is not the framework's own naming (the route is then a plain list).
pub fn of_route(format: &Format, redis_key: &[u8], names: &KeyNames) -> Vec<Structure> {
    match format {
        Format::Sidekiq => sidekiq(redis_key),
        Format::Rq => rq(redis_key, names),
        Format::Resque => resque(redis_key),
        Format::Celery => celery(redis_key, names),
        _ => Vec::new(),
    }
}

/// The route's sets whose additions the proxy mirrors as jobs due later:
/// Sidekiq's `schedule` and `retry` (JSON jobs naming their queue, scored by
/// when they run) and RQ's scheduled registry (bare job ids scored by when
/// they run; the mirror reads each job's hash before it writes). Not the
/// dead sets (a dead job is carried into `jobs_dead` by the importer or
/// decommission).
pub fn mirrored_sets(format: &Format, redis_key: &[u8], names: &KeyNames) -> Vec<Structure> {
    let due_later = |s: &Structure| matches!(s.holding, Holding::Scheduled | Holding::Retrying);
    match format {
        Format::Sidekiq | Format::Rq => of_route(format, redis_key, names)
            .into_iter()
            .filter(due_later)
            .collect(),
        _ => Vec::new(),
    }
}

/// kombu's `unacked` hash, for the queue whose list is `redis_key` (the
/// queue's name after kombu's `global_keyprefix`: kombu names a queue's
/// list after it). Its entries name the queue by routing key, which kombu
/// never prefixes.
fn celery(redis_key: &[u8], names: &KeyNames) -> Vec<Structure> {
    let prefix = names.kombu_prefix();
    let Some(queue) = std::str::from_utf8(redis_key)
        .ok()
        .and_then(|key| key.strip_prefix(prefix))
        .filter(|q| !q.is_empty())
    else {
        return Vec::new();
    };
    let unacked = names.unacked_key.as_deref().unwrap_or("unacked");
    let index = names
        .unacked_index_key
        .as_deref()
        .unwrap_or("unacked_index");
    vec![Structure {
        holding: Holding::Held,
        key: format!("{prefix}{unacked}"),
        shape: Shape::UnackedHash {
            index: format!("{prefix}{index}"),
        },
        owner: Owner::RoutingKey,
        queue: queue.to_string(),
    }]
}

/// Resque's `failed` list and resque-scheduler's delayed jobs for the list
/// `[<namespace>:]queue:<name>` (Resque's default namespace is `resque`).
fn resque(redis_key: &[u8]) -> Vec<Structure> {
    let Some((prefix, queue)) = namespaced_queue(redis_key) else {
        return Vec::new();
    };
    vec![
        Structure {
            holding: Holding::Scheduled,
            key: format!("{prefix}delayed_queue_schedule"),
            shape: Shape::DelayedIndex {
                lists: format!("{prefix}delayed:"),
            },
            owner: Owner::Field("queue"),
            queue: queue.to_string(),
        },
        Structure {
            holding: Holding::Dead,
            key: format!("{prefix}failed"),
            shape: Shape::List,
            owner: Owner::Unrequeued,
            queue: queue.to_string(),
        },
    ]
}

/// `(<namespace>:, <name>)` of a list key `[<namespace>:]queue:<name>`.
fn namespaced_queue(redis_key: &[u8]) -> Option<(&str, &str)> {
    let key = std::str::from_utf8(redis_key).ok()?;
    match key.rsplit_once("queue:") {
        Some((prefix, queue))
            if !queue.is_empty() && (prefix.is_empty() || prefix.ends_with(':')) =>
        {
            Some((prefix, queue))
        }
        _ => None,
    }
}

/// RQ's registries of the queue `<prefix>:queue:<name>` (the prefix is
/// `rq` unless RQ 3's `RQ_KEY_PREFIX` changed it) that hold jobs not in the
/// list (`rq/registry.py`): `<prefix>:scheduled:<name>` (`enqueue_in`/
/// `enqueue_at`, score: when) and `<prefix>:failed:<name>` (jobs that
/// failed; score: when RQ forgets them). Members are job ids; the jobs are
/// the hashes `<prefix>:job:<id>`. The started, finished, deferred,
/// canceled and (RQ 3) ready registries hold nothing to carry: running,
/// done, waiting on another job, cancelled, or also in the list.
fn rq(redis_key: &[u8], names: &KeyNames) -> Vec<Structure> {
    let prefix = names.rq_prefix();
    let Some(queue) = std::str::from_utf8(redis_key)
        .ok()
        .and_then(|key| key.strip_prefix(prefix))
        .and_then(|key| key.strip_prefix(":queue:"))
        .filter(|queue| !queue.is_empty())
    else {
        return Vec::new();
    };
    [(Holding::Scheduled, "scheduled"), (Holding::Dead, "failed")]
        .into_iter()
        .map(|(holding, registry)| Structure {
            holding,
            key: format!("{prefix}:{registry}:{queue}"),
            shape: Shape::SortedSet,
            owner: Owner::Whole,
            queue: queue.to_string(),
        })
        .collect()
}

/// Sidekiq's sets for the list `[<namespace>:]queue:<name>`, and the
/// private lists of the reliable fetches that move a job out of the list
/// while a worker runs it: Sidekiq Pro's `super_fetch`
/// (`queue:sq|<identity>|<name>`, from its public changelog and issues: the
/// source is closed) and gitlab-sidekiq-fetcher's
/// (`working:queue:<name>:<identity>`, `Sidekiq::BaseReliableFetch`).
fn sidekiq(redis_key: &[u8]) -> Vec<Structure> {
    let Some((prefix, queue)) = namespaced_queue(redis_key) else {
        return Vec::new();
    };
    let mut sets: Vec<Structure> = [
        (Holding::Scheduled, "schedule"),
        (Holding::Retrying, "retry"),
        (Holding::Dead, "dead"),
    ]
    .into_iter()
    .map(|(holding, set)| Structure {
        holding,
        key: format!("{prefix}{set}"),
        shape: Shape::SortedSet,
        owner: Owner::Field("queue"),
        queue: queue.to_string(),
    })
    .collect();
    let glob = glob_escape(queue);
    for key in [
        format!("{prefix}queue:sq|*|{glob}"),
        format!("{prefix}working:queue:{glob}:*"),
    ] {
        sets.push(Structure {
            holding: Holding::Held,
            key,
            shape: Shape::PrivateLists,
            owner: Owner::Whole,
            queue: queue.to_string(),
        });
    }
    sets
}

/// `text` with the characters Redis's glob matching gives a meaning to
/// escaped, so it matches only itself.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests;
