//! Leadership for maintenance passes. A pass runs inside a transaction that holds
//! `pg_try_advisory_xact_lock(key)`: at most one process per database runs a
//! given pass at a time, and the lock cannot leak — it ends with the
//! transaction, also when the process dies or its connection drops.

use sqlx::PgConnection;

use crate::error::Result;

/// Advisory lock key of the reaper pass.
pub const REAPER: i64 = 0x7162_7200_0001;
/// Advisory lock key of the recurring-schedule pass.
pub const SCHEDULER: i64 = 0x7162_7200_0002;
/// Advisory lock key of the history partition pass.
pub const HISTORY: i64 = 0x7162_7200_0003;

/// Advisory lock key of the diff gauges (held by a transaction of its own
/// while the pass runs on other connections: `ops::diff_metrics`).
pub const DIFF_GAUGES: i64 = 0x7162_7200_0004;

/// Tries to become this pass's leader inside the caller's open transaction.
/// `Some` while this process leads: call [`Led::done`] just before the
/// transaction ends, so the logged interval lies inside the lock's hold.
pub async fn try_lead(tx: &mut PgConnection, key: i64) -> Result<Option<Led>> {
    let led: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(key)
        .fetch_one(tx)
        .await?;
    Ok(led.then(|| Led {
        task: task_name(key),
        since: chrono::Utc::now(),
    }))
}

/// One pass this process led: `done` logs it (debug, target
/// `qbridge::queue::leader`: "led", task, since, until), the record a
/// many-process deployment — and its test — reads to see who ran what.
#[must_use = "call done() before the transaction ends"]
pub struct Led {
    task: &'static str,
    since: chrono::DateTime<chrono::Utc>,
}

impl Led {
    /// The pass is over; its transaction (and so the lock) ends next.
    pub fn done(self) {
        tracing::debug!(
            task = self.task,
            since = %self.since.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            until = %chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "led"
        );
    }
}

fn task_name(key: i64) -> &'static str {
    match key {
        REAPER => "reaper",
        SCHEDULER => "schedules",
        HISTORY => "history",
        DIFF_GAUGES => "diff-gauges",
        _ => "other",
    }
}
