//! Metric names, in one place, and their descriptions. Labels stay
//! low-cardinality: `queue` only (never ids, keys or payloads).

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

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
pub const LISTENER_RECONNECTS: &str = "qbridge_listener_reconnects_total";

pub const TABLE_DEAD_TUPLES: &str = "qbridge_jobs_table_dead_tuples";
pub const TABLE_SINCE_VACUUM: &str = "qbridge_jobs_table_seconds_since_vacuum";
pub const OLDEST_XACT: &str = "qbridge_oldest_transaction_seconds";
pub const OLDEST_XMIN_AGE: &str = "qbridge_oldest_xmin_age_xids";
pub const NOTIFY_QUEUE_USAGE: &str = "qbridge_notify_queue_usage_ratio";

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
    LISTENER_RECONNECTS,
    TABLE_DEAD_TUPLES,
    TABLE_SINCE_VACUUM,
    OLDEST_XACT,
    OLDEST_XMIN_AGE,
    NOTIFY_QUEUE_USAGE,
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
}
