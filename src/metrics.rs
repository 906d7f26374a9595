//! Metric names, in one place, and their descriptions. Labels stay
//! low-cardinality: `queue`, `route`, `phase`, `via`, `outcome`, `reason`
//! (never ids, keys or payloads).

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

mod zero;
pub use zero::zero_series;

pub const JOBS_READY: &str = "qbridge_jobs_ready";
pub const JOBS_RUNNING: &str = "qbridge_jobs_running";
pub const JOBS_SCHEDULED: &str = "qbridge_jobs_scheduled";
pub const JOBS_DEAD: &str = "qbridge_jobs_dead";
pub const QUEUE_LAG: &str = "qbridge_queue_lag_seconds";

pub const CLAIM_SECONDS: &str = "qbridge_claim_duration_seconds";
pub const ENQUEUE_TO_START: &str = "qbridge_enqueue_to_start_seconds";
pub const JOBS_CLAIMED: &str = "qbridge_jobs_claimed_total";
pub const JOBS_COMPLETED: &str = "qbridge_jobs_completed_total";
pub const JOBS_RETRIED: &str = "qbridge_jobs_retried_total";
pub const JOBS_DEAD_LETTERED: &str = "qbridge_jobs_dead_lettered_total";
pub const JOBS_REAPED: &str = "qbridge_jobs_reaped_total";
pub const JOBS_LOST_LEASE: &str = "qbridge_jobs_lost_lease_total";
pub const LOCK_KEY_DEFERRED: &str = "qbridge_lock_key_deferred_total";
pub const PREFETCH_HANDED_BACK: &str = "qbridge_prefetch_handed_back_total";
pub const LISTENER_RECONNECTS: &str = "qbridge_listener_reconnects_total";

pub const TABLE_DEAD_TUPLES: &str = "qbridge_jobs_table_dead_tuples";
pub const TABLE_SINCE_VACUUM: &str = "qbridge_jobs_table_seconds_since_vacuum";
pub const OLDEST_XACT: &str = "qbridge_oldest_transaction_seconds";
pub const OLDEST_XMIN_AGE: &str = "qbridge_oldest_xmin_age_xids";
pub const NOTIFY_QUEUE_USAGE: &str = "qbridge_notify_queue_usage_ratio";

pub const MIRROR_DRAINED: &str = "qbridge_mirror_copies_drained_total";
pub const ROUTE_PUSHES: &str = "qbridge_route_pushes_total";
pub const MIRRORED: &str = "qbridge_mirrored_total";
pub const MIRROR_DUPLICATES: &str = "qbridge_mirror_duplicates_total";
pub const REPUSHES_PROMOTED: &str = "qbridge_repushes_promoted_total";
pub const REPUSHES_HELD: &str = "qbridge_repushes_held_total";
pub const REPUSHES_SETTLED: &str = "qbridge_repushes_settled_total";
pub const MIRROR_FAILURES: &str = "qbridge_mirror_failures_total";
pub const MIRROR_SPOOLED: &str = "qbridge_mirror_spooled_total";
pub const MIRROR_LOST: &str = "qbridge_mirror_lost_total";
pub const MIRROR_RETAIN_DROPPED: &str = "qbridge_mirror_retain_dropped_total";
pub const MIRROR_LAG: &str = "qbridge_mirror_lag_seconds";
pub const MIRROR_BATCH_ITEMS: &str = "qbridge_mirror_batch_items";
pub const ITEMS_FLAGGED: &str = "qbridge_items_flagged_total";
pub const OUTBOX_REPAIRED: &str = "qbridge_redis_outbox_repaired_total";
pub const PRODUCER_PUSH_FAILURES: &str = "qbridge_producer_push_failures_total";

pub const PROXY_CONNECTIONS: &str = "qbridge_proxy_connections";
pub const PROXY_COMMANDS: &str = "qbridge_proxy_commands_total";
pub const PROXY_ADDED_LATENCY: &str = "qbridge_proxy_added_latency_seconds";
pub const PROXY_PROTOCOL_ERRORS: &str = "qbridge_proxy_protocol_errors_total";
pub const PROXY_POSTGRES_WRITES: &str = "qbridge_proxy_postgres_writes_total";

pub const REDIS_OUTCOMES: &str = "qbridge_redis_consumer_outcomes_total";
pub const REDIS_RECOVERED: &str = "qbridge_redis_consumer_recovered_total";
pub const REDIS_DROPPED_UNRUN: &str = "qbridge_redis_consumer_dropped_unrun_total";
pub const OUTCOMES_DROPPED: &str = "qbridge_outcomes_dropped_total";
pub const OUTCOMES_SPOOL_FAILURES: &str = "qbridge_outcomes_spool_failures_total";

pub const SHADOW_CALLS: &str = "qbridge_shadow_calls_total";
pub const ROUTE_PHASE: &str = "qbridge_route_phase";
pub const ROUTE_FOLLOWED: &str = "qbridge_route_followed";
pub const PUSHES_NOT_FOLLOWED: &str = "qbridge_pushes_not_followed_total";
pub const DIFF_JOBS: &str = "qbridge_diff_jobs";
pub const DIFF_ONE_SIDED: &str = "qbridge_diff_one_sided_jobs";
pub const DIFF_MISMATCHES: &str = "qbridge_diff_outcome_mismatches";
pub const DIFF_MISMATCH_RATE: &str = "qbridge_diff_mismatch_ratio";
pub const DIFF_NOISE_RATE: &str = "qbridge_diff_noise_ratio";
pub const DIFF_MIRROR_COMPLETENESS: &str = "qbridge_diff_mirror_completeness_ratio";
pub const DIFF_RAN_BOTH_SIDES: &str = "qbridge_diff_ran_both_sides";

/// Every metric qbridge exports (for the dashboard check in tests).
pub const ALL: &[&str] = &[
    JOBS_READY,
    JOBS_RUNNING,
    JOBS_SCHEDULED,
    JOBS_DEAD,
    QUEUE_LAG,
    CLAIM_SECONDS,
    ENQUEUE_TO_START,
    JOBS_CLAIMED,
    JOBS_COMPLETED,
    JOBS_RETRIED,
    JOBS_DEAD_LETTERED,
    JOBS_REAPED,
    JOBS_LOST_LEASE,
    LOCK_KEY_DEFERRED,
    PREFETCH_HANDED_BACK,
    LISTENER_RECONNECTS,
    TABLE_DEAD_TUPLES,
    TABLE_SINCE_VACUUM,
    OLDEST_XACT,
    OLDEST_XMIN_AGE,
    NOTIFY_QUEUE_USAGE,
    MIRROR_DRAINED,
    ROUTE_PUSHES,
    MIRRORED,
    MIRROR_DUPLICATES,
    REPUSHES_PROMOTED,
    REPUSHES_HELD,
    REPUSHES_SETTLED,
    MIRROR_FAILURES,
    MIRROR_SPOOLED,
    MIRROR_LOST,
    MIRROR_RETAIN_DROPPED,
    MIRROR_LAG,
    MIRROR_BATCH_ITEMS,
    ITEMS_FLAGGED,
    OUTBOX_REPAIRED,
    PRODUCER_PUSH_FAILURES,
    PROXY_CONNECTIONS,
    PROXY_COMMANDS,
    PROXY_ADDED_LATENCY,
    PROXY_PROTOCOL_ERRORS,
    PROXY_POSTGRES_WRITES,
    REDIS_OUTCOMES,
    REDIS_RECOVERED,
    REDIS_DROPPED_UNRUN,
    OUTCOMES_DROPPED,
    OUTCOMES_SPOOL_FAILURES,
    SHADOW_CALLS,
    ROUTE_PHASE,
    ROUTE_FOLLOWED,
    PUSHES_NOT_FOLLOWED,
    DIFF_JOBS,
    DIFF_ONE_SIDED,
    DIFF_MISMATCHES,
    DIFF_MISMATCH_RATE,
    DIFF_NOISE_RATE,
    DIFF_MIRROR_COMPLETENESS,
    DIFF_RAN_BOTH_SIDES,
];

/// Registers help texts; call once after the recorder is installed.
pub fn describe() {
    describe_gauge!(JOBS_READY, "Jobs runnable now, per queue");
    describe_gauge!(JOBS_RUNNING, "Jobs claimed and running, per queue");
    describe_gauge!(
        JOBS_SCHEDULED,
        "Jobs waiting for a future run_at, per queue"
    );
    describe_gauge!(JOBS_DEAD, "Jobs in the dead-letter table, per queue");
    describe_gauge!(
        QUEUE_LAG,
        Unit::Seconds,
        "Age of the oldest runnable job, per queue"
    );
    describe_histogram!(
        CLAIM_SECONDS,
        Unit::Seconds,
        "Duration of one claim statement"
    );
    describe_histogram!(
        ENQUEUE_TO_START,
        Unit::Seconds,
        "From run_at to handler start"
    );
    describe_counter!(JOBS_CLAIMED, "Jobs claimed");
    describe_counter!(JOBS_COMPLETED, "Jobs completed");
    describe_counter!(
        JOBS_RETRIED,
        "Attempts that failed and were scheduled again"
    );
    describe_counter!(JOBS_DEAD_LETTERED, "Jobs moved to the dead-letter table");
    describe_counter!(
        JOBS_REAPED,
        "Expired leases returned to ready by the reaper"
    );
    describe_counter!(
        JOBS_LOST_LEASE,
        "Outcomes discarded because the lease was gone"
    );
    describe_counter!(
        LOCK_KEY_DEFERRED,
        "Claimed jobs put back because their lock key was busy"
    );
    describe_counter!(
        PREFETCH_HANDED_BACK,
        "Prefetched jobs handed back unstarted (held too long, claimed on their last attempt, or at shutdown)"
    );
    describe_counter!(LISTENER_RECONNECTS, "LISTEN connection losses");
    describe_gauge!(
        TABLE_DEAD_TUPLES,
        "Dead tuples in qbridge.jobs (vacuum debt)"
    );
    describe_gauge!(
        TABLE_SINCE_VACUUM,
        Unit::Seconds,
        "Seconds since qbridge.jobs was last vacuumed"
    );
    describe_gauge!(
        OLDEST_XACT,
        Unit::Seconds,
        "Age of the oldest transaction holding the xmin horizon"
    );
    describe_gauge!(OLDEST_XMIN_AGE, "Age in xids of the oldest backend xmin");
    describe_gauge!(NOTIFY_QUEUE_USAGE, "pg_notification_queue_usage(), 0..1");
    describe_redis_side();
}

fn describe_redis_side() {
    describe_counter!(
        MIRROR_DRAINED,
        "Mirror copies drained by the Postgres consumer without a live run, per queue"
    );
    describe_counter!(
        ROUTE_PUSHES,
        "Items pushed on a routed key, per route, phase and path (proxy, producer, http)"
    );
    describe_counter!(
        MIRRORED,
        "Items written to Postgres by the Redis side, per route and path"
    );
    describe_counter!(
        MIRROR_DUPLICATES,
        "Items not enqueued because their job key was already known, per route"
    );
    describe_counter!(
        REPUSHES_PROMOTED,
        "Re-pushes after the flip of a mirrored key that run live in Postgres: the Redis side reported the original dead (or a fleet its failed attempt), per route"
    );
    describe_counter!(
        REPUSHES_HELD,
        "Re-pushes after the flip of a mirrored key held back: no evidence yet that the Redis side let go of the original, per route"
    );
    describe_counter!(
        REPUSHES_SETTLED,
        "Held re-pushes settled on later evidence, per queue and result (released live, resolved as a duplicate, assumed lost by an operator)"
    );
    describe_counter!(
        MIRROR_FAILURES,
        "Items whose Postgres write failed, per route (spooled for repair when possible)"
    );
    describe_counter!(
        MIRROR_SPOOLED,
        "Items parked in the Redis gap list while Postgres was unavailable, per route"
    );
    describe_counter!(
        MIRROR_LOST,
        "Items neither mirrored nor spooled (the Redis copy still runs; the diff reports them)"
    );
    describe_counter!(
        MIRROR_RETAIN_DROPPED,
        "Parked items let go from the writers' memory past the mirror buffer (still in the gap list)"
    );
    describe_histogram!(
        MIRROR_LAG,
        Unit::Seconds,
        "From Redis acknowledging a push to its mirror committing in Postgres"
    );
    describe_histogram!(MIRROR_BATCH_ITEMS, "Items per group-commit transaction");
    describe_counter!(
        ITEMS_FLAGGED,
        "Items that did not parse as their route's format and were stored raw"
    );
    describe_counter!(
        OUTBOX_REPAIRED,
        "Redis pushes owed by the producer API and made by the repair loop"
    );
    describe_counter!(
        PRODUCER_PUSH_FAILURES,
        "Producer API pushes to Redis that failed after commit (left in the outbox)"
    );
    describe_gauge!(
        PROXY_CONNECTIONS,
        "Open client connections of the RESP proxy"
    );
    describe_counter!(
        PROXY_COMMANDS,
        "Commands forwarded or answered by the proxy"
    );
    describe_histogram!(
        PROXY_ADDED_LATENCY,
        Unit::Seconds,
        "Time the proxy itself spends on a command and its reply (excludes Redis)"
    );
    describe_counter!(
        PROXY_PROTOCOL_ERRORS,
        "Client connections closed for malformed or over-limit RESP"
    );
    describe_counter!(
        PROXY_POSTGRES_WRITES,
        "Pushes the proxy wrote to Postgres only (postgres_only, decommissioned), per route and result"
    );
    describe_counter!(
        REDIS_OUTCOMES,
        "Jobs finished by the Redis consumer, per route and outcome"
    );
    describe_counter!(
        REDIS_RECOVERED,
        "Items moved back from an orphaned processing list at start-up"
    );
    describe_counter!(
        REDIS_DROPPED_UNRUN,
        "Items the Redis consumer dropped unrun, per route and reason (live_in_postgres: a re-push of a key Postgres runs live; already_ran: a second push of a key the route's ran set holds)"
    );
    describe_counter!(
        OUTCOMES_DROPPED,
        "Outcome records dropped because the outcome buffer was full"
    );
    describe_counter!(
        OUTCOMES_SPOOL_FAILURES,
        "Redis consumer outcomes the local spool could not write (kept in memory only until Postgres has them)"
    );
    describe_cutover();
}

fn describe_cutover() {
    describe_counter!(
        SHADOW_CALLS,
        "Mirror copies whose handler the Postgres consumer called in shadow mode, per queue"
    );
    describe_gauge!(
        ROUTE_PHASE,
        "1 for the phase each route is in, 0 for the others (labels route, phase)"
    );
    describe_gauge!(
        ROUTE_FOLLOWED,
        "1 when every live proxy follows the route's latest phase change (pushes are routed), 0 while pushes wait for one"
    );
    describe_counter!(
        PUSHES_NOT_FOLLOWED,
        "Pushes refused because a proxy had not followed the route's latest phase change (TRYAGAIN after the wait, or a MULTI discarded), per route"
    );
    describe_gauge!(
        DIFF_JOBS,
        "Jobs in the diff window per route and side (redis: seen on Redis; postgres: enqueued in Postgres)"
    );
    describe_gauge!(
        DIFF_ONE_SIDED,
        "Jobs of the diff window seen on one side only, per route and the side they are on"
    );
    describe_gauge!(
        DIFF_MISMATCHES,
        "Jobs of the diff window whose outcome or response digest differs between sides"
    );
    describe_gauge!(
        DIFF_MISMATCH_RATE,
        "Outcome mismatches / jobs compared over the diff window, per route"
    );
    describe_gauge!(
        DIFF_NOISE_RATE,
        "How often two shadow calls of one job disagree (the noise baseline), per route"
    );
    describe_gauge!(
        DIFF_MIRROR_COMPLETENESS,
        "Share of Redis-side jobs of the diff window that have a Postgres copy, per route"
    );
    describe_gauge!(
        DIFF_RAN_BOTH_SIDES,
        "Jobs of the diff window that ran live on both sides (a double run across the cutover), per route; every gate refuses while it is not 0"
    );
}
