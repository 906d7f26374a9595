//! Zero series for the counters an operator is told to watch. Prometheus
//! has no series for a counter that never counted, so a healthy process
//! looked as if it did not export `qbridge_outcomes_dropped_total` at all,
//! an alert on `increase(…)` had nothing to evaluate, and a dashboard
//! panel stayed empty. Each counter is touched at 0 with the labels its
//! real series carry, where those are known when the process starts (the
//! configured routes and queues, a fixed set of reasons); counters whose
//! labels name a path or a result known only when it happens (pushes per
//! `via`, settled re-pushes per `result`) appear with their first count.

use super::*;

/// Counters labelled by `route` alone.
const PER_ROUTE: &[&str] = &[
    REDIS_RECOVERED,
    OUTBOX_REPAIRED,
    PRODUCER_PUSH_FAILURES,
    MIRROR_DUPLICATES,
    REPUSHES_PROMOTED,
    REPUSHES_HELD,
    ITEMS_FLAGGED,
    MIRROR_RETAIN_DROPPED,
    MIRROR_LOST,
    MIRROR_FAILURES,
    MIRROR_SPOOLED,
    PUSHES_NOT_FOLLOWED,
];

/// Counters labelled by `queue` alone.
const PER_QUEUE: &[&str] = &[
    JOBS_CLAIMED,
    JOBS_COMPLETED,
    JOBS_RETRIED,
    JOBS_DEAD_LETTERED,
    JOBS_LOST_LEASE,
    JOBS_REAPED,
    SHADOW_CALLS,
    MIRROR_DRAINED,
];

/// Counters without labels.
const BARE: &[&str] = &[
    LISTENER_RECONNECTS,
    LOCK_KEY_DEFERRED,
    PROXY_COMMANDS,
    PROXY_PROTOCOL_ERRORS,
    OUTCOMES_SPOOL_FAILURES,
];

/// Why an outcome record is dropped (`shadow::outcomes`).
const OUTCOME_DROP_REASONS: &[&str] = &["full", "closed", "db"];

/// How the Redis consumer finishes a job (`redis::consumer::slot`).
const REDIS_OUTCOME_KINDS: &[&str] = &["ok", "failed", "dead"];

/// Touches every counter above at 0 for `routes` and `queues`.
pub fn zero_series(routes: &[String], queues: &[String]) {
    for name in BARE {
        metrics::counter!(*name).increment(0);
    }
    for reason in OUTCOME_DROP_REASONS {
        metrics::counter!(OUTCOMES_DROPPED, "reason" => *reason).increment(0);
    }
    for route in routes {
        for name in PER_ROUTE {
            metrics::counter!(*name, "route" => route.clone()).increment(0);
        }
        for outcome in REDIS_OUTCOME_KINDS {
            metrics::counter!(REDIS_OUTCOMES, "route" => route.clone(), "outcome" => *outcome)
                .increment(0);
        }
        for reason in ["live_in_postgres", "already_ran"] {
            metrics::counter!(REDIS_DROPPED_UNRUN, "route" => route.clone(), "reason" => reason)
                .increment(0);
        }
    }
    for queue in queues {
        for name in PER_QUEUE {
            metrics::counter!(*name, "queue" => queue.clone()).increment(0);
        }
    }
}
