//! Every Redis key qbridge reads or writes, built in one place. Decommission,
//! repair and the diff must find exactly what the consumer, the mirror and
//! the outbox wrote: one misspelled name and jobs are stranded in a key
//! nothing reads. So no other file spells a `qbridge:` key.
//!
//! | key | type | written by | read by |
//! | --- | --- | --- | --- |
//! | the route's `redis_key` | list | producers, the outbox, repair | the consumer, the diff, decommission |
//! | `qbridge:gap:<route>` | list | the mirror (Postgres down) | gap repair, the diff, decommission, stats |
//! | `qbridge:gap:<route>:lock` | string | gap repair | gap repair |
//! | `qbridge:processing:<route>:<consumer>:<n>` | list | the consumer (BLMOVE) | the consumer's recovery, the diff, decommission |
//! | `qbridge:inflight:<route>:<consumer>:<n>` | hash | the consumer | the consumer, the diff, decommission |
//! | `qbridge:consumer:<route>:<consumer>` | hash (TTL) | the consumer (its heartbeat) | decommission |
//! | `qbridge:dead:<route>` | list | the consumer | decommission |
//! | `qbridge:ran:<route>` | sorted set | the consumer (ack, dead), the ran set's refill | the consumer, the diff, repair, decommission |
//! | `qbridge:running:<route>` | hash | the consumer (its claims) | the consumer |
//! | `qbridge:repushed:<route>:<job key>` | string (TTL) | repair | repair, decommission |
//! | `qbridge:repushed:<route>:<job key>#<µs>` | string (TTL) | repair (an identical copy) | repair, decommission |
//! | `qbridge:archiving:<route>:<id>` | list | decommission | decommission |
//! | `qbridge:archiving-inflight:<route>:<id>` | hash | decommission (a renamed inflight hash) | decommission |
//! | `qbridge:archiving-gap:<route>:<id>` | list | decommission | decommission |
//! | `qbridge:archiving-dead:<route>:<id>` | list | decommission | decommission |
//! | `qbridge:paid:<outbox token>` | string (TTL) | the outbox | the outbox |
//! | `qbridge:epoch:<route>` | string | the epoch observer | the epoch observer (gone = Redis lost its data) |
//! | `qbridge:live:<route>` | sorted set | the live-key guard's publisher | the fleets' adapters, the consumer |
//! | `qbridge:live-through:<route>` | string | the live-key guard's publisher | the publisher, the consumer |
//! | `qbridge:ran-through:<route>` | string | the ran set's refill | the refill, the consumer |
//!
//! Route and consumer names are held to `A-Z a-z 0-9 _ . -` by the config
//! (no `:`, no glob characters), so one route's keys never match another's
//! pattern; patterns still escape them in case a name ever widens.

use crate::routes::Route;

const PREFIX: &str = "qbridge:";

/// How long `qbridge:ran:<route>` remembers a finished job: longer than any
/// diff window or repair an operator runs (7 days).
pub const RAN_RETENTION_MS: i64 = 7 * 24 * 3600 * 1000;

/// The keys of one route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteKeys {
    route: String,
}

impl RouteKeys {
    /// The keys of `route`.
    pub fn of(route: &Route) -> RouteKeys {
        RouteKeys::named(&route.name)
    }

    /// The keys of the route named `route`.
    pub fn named(route: &str) -> RouteKeys {
        RouteKeys {
            route: route.to_string(),
        }
    }

    /// `qbridge:gap:<route>`: items Redis took whose mirror write failed
    /// (Postgres down), waiting for gap repair.
    pub fn gap(&self) -> String {
        format!("{PREFIX}gap:{}", self.route)
    }

    /// `qbridge:gap:<route>:lock`: one process at a time repairs the gap.
    pub fn gap_lock(&self) -> String {
        format!("{}:lock", self.gap())
    }

    /// `qbridge:dead:<route>`: items the consumer gave up on.
    pub fn dead(&self) -> String {
        format!("{PREFIX}dead:{}", self.route)
    }

    /// `qbridge:live:<route>`: a sorted set of the job keys Postgres holds
    /// live (stored by the proxy, the producer API, promotion or a released
    /// re-push), scored by when (ms). The fleets' adapters and qbridge's
    /// consumer skip a fetched item whose key is in it: a re-push of a job
    /// Postgres ran or will run. See `redis::live_guard`.
    pub fn live(&self) -> String {
        format!("{PREFIX}live:{}", self.route)
    }

    /// `qbridge:live-through:<route>`: the time (ms, Postgres's clock) up to
    /// which every live key is in [`RouteKeys::live`]; gone together with the
    /// set when Redis loses its data, which makes the publisher write the
    /// whole set again.
    pub fn live_through(&self) -> String {
        format!("{PREFIX}live-through:{}", self.route)
    }

    /// `qbridge:ran-through:<route>`: the `run_id` of the server on which
    /// [`RouteKeys::ran`] was last written whole from the Redis-side runs
    /// Postgres has on record within [`RAN_RETENTION_MS`]; a set is trusted
    /// alone only on that server.
    pub fn ran_through(&self) -> String {
        format!("{PREFIX}ran-through:{}", self.route)
    }

    /// `qbridge:ran:<route>`: a sorted set of the job keys qbridge's Redis
    /// consumer finished (acked or moved to the dead list), scored by when
    /// (ms). Written in the same Lua step that removes the item, so a job
    /// that ran is known to have run even when its outcome report never
    /// reaches Postgres; kept for [`RAN_RETENTION_MS`].
    pub fn ran(&self) -> String {
        format!("{PREFIX}ran:{}", self.route)
    }

    /// `qbridge:running:<route>`: a hash of the id keys qbridge's Redis
    /// consumer is running now, each to the processing list that holds its
    /// item. A second item of a key (a client's retry reaching Redis while
    /// the first runs) waits until the first finishes and joins the ran
    /// set, and is then dropped unrun.
    pub fn running(&self) -> String {
        format!("{PREFIX}running:{}", self.route)
    }

    /// `qbridge:epoch:<route>`: a marker qbridge sets once in the route's
    /// database; finding it gone or changed means Redis lost its data (a
    /// flush, a restart without persistence) since it was last seen.
    pub fn epoch(&self) -> String {
        format!("{PREFIX}epoch:{}", self.route)
    }

    /// `qbridge:repushed:<route>:<job key>`: repair pushed this job back
    /// already (so a second repair does not push it twice).
    pub fn repushed(&self, job_key: &str) -> String {
        format!("{PREFIX}repushed:{}:{job_key}", self.route)
    }

    /// `qbridge:repushed:<route>:<job key>#<after>`: repair pushed back a
    /// fresh copy of a text under this key, after the push-back of that key
    /// recorded at `after` (µs since the epoch; 0 for the first). Identical
    /// copies are named by count, so a second loss of a text can be named
    /// like an earlier one: the marker names the push-back, not just the key.
    pub fn repushed_after(&self, job_key: &str, after: i64) -> String {
        format!("{PREFIX}repushed:{}:{job_key}#{after}", self.route)
    }

    /// A fresh `qbridge:archiving:<route>:<id>`: where decommission renames a
    /// list before archiving it, so a late push lands in a new list instead
    /// of being deleted unread.
    pub fn new_archiving(&self) -> String {
        format!(
            "{PREFIX}archiving:{}:{}",
            self.route,
            uuid::Uuid::new_v4().simple()
        )
    }

    /// `qbridge:archiving-inflight:<route>:<id>`: where decommission renames
    /// the inflight hash of a processing list it renamed to
    /// `qbridge:archiving:<route>:<id>`, so the held item is archived under
    /// the key its pop was given; `None` for a key that is no archiving list
    /// of this route.
    pub fn archiving_inflight(&self, archiving_list: &str) -> Option<String> {
        let id = archiving_list
            .strip_prefix(PREFIX)?
            .strip_prefix("archiving:")?
            .strip_prefix(self.route.as_str())?
            .strip_prefix(':')?;
        Some(format!("{PREFIX}archiving-inflight:{}:{id}", self.route))
    }

    /// A fresh `qbridge:archiving-gap:<route>:<id>`: where decommission
    /// renames the gap list. Its items are mirror copies of jobs Redis
    /// owned, archived differently from the runnable lists, so they must
    /// never be mixed with those.
    pub fn new_archiving_gap(&self) -> String {
        format!(
            "{PREFIX}archiving-gap:{}:{}",
            self.route,
            uuid::Uuid::new_v4().simple()
        )
    }

    /// A fresh `qbridge:archiving-dead:<route>:<id>`: where decommission
    /// renames the dead list before copying it into `qbridge.jobs_dead`.
    pub fn new_archiving_dead(&self) -> String {
        format!(
            "{PREFIX}archiving-dead:{}:{}",
            self.route,
            uuid::Uuid::new_v4().simple()
        )
    }

    /// The keys of one consumer of this route.
    pub fn consumer(&self, consumer: &str) -> ConsumerKeys {
        ConsumerKeys {
            route: self.route.clone(),
            consumer: consumer.to_string(),
        }
    }

    /// SCAN pattern: every processing list of every consumer of the route.
    pub fn any_processing(&self) -> String {
        self.pattern("processing")
    }

    /// SCAN pattern: every inflight hash of every consumer of the route.
    pub fn any_inflight(&self) -> String {
        self.pattern("inflight")
    }

    /// SCAN pattern: the heartbeat of every consumer of the route.
    pub fn any_heartbeat(&self) -> String {
        self.pattern("consumer")
    }

    /// The consumer a heartbeat key found by [`RouteKeys::any_heartbeat`]
    /// belongs to.
    pub fn heartbeat_owner<'k>(&self, key: &'k str) -> Option<&'k str> {
        let prefix = format!("{PREFIX}consumer:{}:", self.route);
        key.strip_prefix(&prefix)
            .filter(|c| !c.is_empty() && !c.contains(':'))
    }

    /// The consumer a processing list found by [`RouteKeys::any_processing`]
    /// belongs to (`qbridge:processing:<route>:<consumer>:<n>`).
    pub fn processing_owner<'k>(&self, list: &'k str) -> Option<&'k str> {
        let prefix = format!("{PREFIX}processing:{}:", self.route);
        let (consumer, slot) = list.strip_prefix(&prefix)?.rsplit_once(':')?;
        (!consumer.contains(':') && slot.parse::<usize>().is_ok()).then_some(consumer)
    }

    /// SCAN pattern: every repushed marker of the route.
    pub fn any_repushed(&self) -> String {
        self.pattern("repushed")
    }

    /// SCAN pattern: every runnable list an interrupted decommission left
    /// renamed.
    pub fn any_archiving(&self) -> String {
        self.pattern("archiving")
    }

    /// SCAN pattern: every gap list an interrupted decommission left renamed.
    pub fn any_archiving_gap(&self) -> String {
        self.pattern("archiving-gap")
    }

    /// SCAN pattern: every dead list an interrupted decommission left renamed.
    pub fn any_archiving_dead(&self) -> String {
        self.pattern("archiving-dead")
    }

    /// SCAN pattern: every inflight hash decommission renamed.
    pub fn any_archiving_inflight(&self) -> String {
        self.pattern("archiving-inflight")
    }

    fn pattern(&self, kind: &str) -> String {
        format!("{PREFIX}{kind}:{}:*", glob_escape(&self.route))
    }
}

/// The keys of one consumer (`consumer_name`) of one route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerKeys {
    route: String,
    consumer: String,
}

impl ConsumerKeys {
    /// `qbridge:processing:<route>:<consumer>:<n>`: the item slot `n` is
    /// working on, moved there by BLMOVE so a crash cannot lose it.
    pub fn processing(&self, n: usize) -> String {
        format!("{}{n}", self.processing_prefix())
    }

    /// `qbridge:inflight:<route>:<consumer>:<n>`: a hash beside the
    /// processing list with the item's job key and attempts so far, so both
    /// survive a crash (a content-hash key was numbered when it was popped;
    /// numbering it again after a restart would give it another key).
    pub fn inflight(&self, n: usize) -> String {
        format!("{PREFIX}inflight:{}:{}:{n}", self.route, self.consumer)
    }

    /// `qbridge:consumer:<route>:<consumer>`: the consumer's heartbeat, a hash
    /// (the phase it acts on, the items it holds, when it last beat) that
    /// expires unless renewed. Decommission reads it to know that the
    /// consumer has stopped and holds nothing before it archives the lists.
    pub fn heartbeat(&self) -> String {
        format!("{PREFIX}consumer:{}:{}", self.route, self.consumer)
    }

    /// SCAN pattern of every processing list of this consumer, whatever its
    /// concurrency was when it wrote them.
    pub fn processing_pattern(&self) -> String {
        format!(
            "{PREFIX}processing:{}:{}:*",
            glob_escape(&self.route),
            glob_escape(&self.consumer)
        )
    }

    /// The slot number of a processing list found by the pattern.
    pub fn slot_of(&self, list: &str) -> Option<usize> {
        list.strip_prefix(&self.processing_prefix())?.parse().ok()
    }

    /// The connection name shown by `CLIENT LIST` (operators, tests).
    pub fn client_name(&self, n: usize) -> String {
        format!("qbridge-consumer:{}:{}:{n}", self.route, self.consumer)
    }

    fn processing_prefix(&self) -> String {
        format!("{PREFIX}processing:{}:{}:", self.route, self.consumer)
    }
}

/// The inflight hash beside a processing list (`qbridge:processing:r:c:3` →
/// `qbridge:inflight:r:c:3`); `None` for a key that is no processing list.
pub fn inflight_beside(processing_list: &str) -> Option<String> {
    let rest = processing_list
        .strip_prefix(PREFIX)?
        .strip_prefix("processing:")?;
    Some(format!("{PREFIX}inflight:{rest}"))
}

/// `qbridge:paid:<token>`: the outbox row with this token was pushed (its
/// reply may have been lost; the marker keeps a retry from pushing twice).
pub fn paid(token: &uuid::Uuid) -> String {
    format!("{PREFIX}paid:{token}")
}

/// Escapes Redis glob characters (a route or consumer name may hold them).
pub fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests;
