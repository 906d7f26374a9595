//! Recurring jobs. Each schedule (every N seconds, or a cron expression) has a
//! row in `qbridge.schedules` whose `next_run_at` is advanced under a row lock
//! in the same transaction that inserts the instance, keyed
//! `schedule:<name>:<unix seconds>`. Two processes, a failover or a retried pass
//! can therefore never fire one period twice. Missed periods (all processes
//! down) fire once, not once per missed period.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::error::{Error, Result};
use crate::queue::job::NewJob;
use crate::queue::{enqueue, leader};

/// When a schedule fires.
#[derive(Debug, Clone)]
pub enum Cadence {
    Every(Duration),
    Cron(Box<cron::Schedule>),
}

impl Cadence {
    /// Parses a cron expression (6 or 7 fields, seconds first).
    pub fn cron(expr: &str) -> Result<Self> {
        cron::Schedule::from_str(expr)
            .map(|s| Cadence::Cron(Box::new(s)))
            .map_err(|e| {
                // The cron crate's message quotes the expression with a caret
                // line under it; errors here are one line.
                let msg = e
                    .to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ");
                Error::Config(format!("bad cron expression {expr:?}: {msg}"))
            })
    }

    /// The first fire time strictly after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Cadence::Every(d) => chrono::Duration::from_std(*d).ok().map(|d| after + d),
            Cadence::Cron(s) => s.after(&after).next(),
        }
    }

    /// The next fire time after `due` that is later than `now`, so missed
    /// periods collapse into the one that already fired.
    pub fn next_from(&self, due: DateTime<Utc>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Cadence::Every(d) => {
                let step = chrono::Duration::from_std(*d).ok()?;
                if step <= chrono::Duration::zero() {
                    return None;
                }
                let behind = (now - due).num_milliseconds().max(0);
                let steps = behind / step.num_milliseconds().max(1) + 1;
                Some(due + step * steps as i32)
            }
            Cadence::Cron(_) => self.next_after(now.max(due)),
        }
    }
}

/// One recurring job.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub name: String,
    pub cadence: Cadence,
    /// Template of the job to insert; its key is replaced per period.
    pub job: NewJob,
}

/// Fires that one pass inserted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScheduleReport {
    pub led: bool,
    pub fired: Vec<(String, i64)>,
}

/// Fires every due schedule once.
pub async fn run_once(
    pool: &PgPool,
    schedules: &[Schedule],
    payload_limit: usize,
) -> Result<ScheduleReport> {
    let mut report = ScheduleReport::default();
    let mut tx = pool.begin().await?;
    let Some(led) = leader::try_lead(&mut tx, leader::SCHEDULER).await? else {
        return Ok(report);
    };
    report.led = true;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *tx)
        .await?;
    for s in schedules {
        // A savepoint per schedule: one that cannot fire (bad payload, no next
        // time) is skipped and logged; the others still fire.
        sqlx::query("SAVEPOINT schedule").execute(&mut *tx).await?;
        match fire_one(&mut tx, s, now, payload_limit).await {
            Ok(Some(id)) => report.fired.push((s.name.clone(), id)),
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(schedule = %s.name, error = %err, "schedule could not fire");
                sqlx::query("ROLLBACK TO SAVEPOINT schedule")
                    .execute(&mut *tx)
                    .await?;
                continue;
            }
        }
        sqlx::query("RELEASE SAVEPOINT schedule")
            .execute(&mut *tx)
            .await?;
    }
    led.done();
    tx.commit().await?;
    Ok(report)
}

/// Fires one schedule if it is due; returns the inserted job's id.
async fn fire_one(
    tx: &mut sqlx::PgConnection,
    s: &Schedule,
    now: DateTime<Utc>,
    payload_limit: usize,
) -> Result<Option<i64>> {
    let first = s.cadence.next_after(now).unwrap_or(now);
    // An `every` schedule fires at once the first time; cron waits for its slot.
    let first = if matches!(s.cadence, Cadence::Every(_)) {
        now
    } else {
        first
    };
    sqlx::query("INSERT INTO qbridge.schedules (name, next_run_at) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
            .bind(&s.name)
            .bind(first)
            .execute(&mut *tx)
            .await?;
    let due: DateTime<Utc> =
        sqlx::query_scalar("SELECT next_run_at FROM qbridge.schedules WHERE name = $1 FOR UPDATE")
            .bind(&s.name)
            .fetch_one(&mut *tx)
            .await?;
    if due > now {
        return Ok(None);
    }
    let mut job = s.job.clone();
    job.key = Some(format!("schedule:{}:{}", s.name, due.timestamp()));
    let outcome = enqueue::enqueue(tx, std::slice::from_ref(&job), payload_limit).await?;
    let job_id = match outcome.first() {
        Some(enqueue::EnqueueOutcome::Inserted(id)) => Some(*id),
        _ => None,
    };
    let next = s
        .cadence
        .next_from(due, now)
        .ok_or_else(|| Error::Config(format!("schedule {:?} has no next fire time", s.name)))?;
    sqlx::query(
            "UPDATE qbridge.schedules SET next_run_at = $2, last_run_at = $3, last_job_id = $4 WHERE name = $1",
        )
        .bind(&s.name)
        .bind(next)
        .bind(now)
        .bind(job_id)
        .execute(&mut *tx)
        .await?;
    Ok(job_id)
}

/// One pass of the schedule service (run every second): fires what is due
/// and logs it.
pub async fn pass(pool: &PgPool, schedules: &[Schedule], payload_limit: usize) {
    match run_once(pool, schedules, payload_limit).await {
        Ok(r) => {
            for (name, id) in r.fired {
                tracing::info!(schedule = %name, job.id = id, "schedule fired");
            }
        }
        Err(err) => tracing::warn!(error = %err, "schedule pass failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn every_skips_missed_periods() {
        let c = Cadence::Every(Duration::from_secs(10));
        let due = Utc.timestamp_opt(1000, 0).unwrap();
        assert_eq!(c.next_from(due, due).unwrap().timestamp(), 1010);
        let late = Utc.timestamp_opt(1055, 0).unwrap();
        assert_eq!(c.next_from(due, late).unwrap().timestamp(), 1060);
    }

    #[test]
    fn cron_parses_and_advances() {
        let c = Cadence::cron("0 */5 * * * *").unwrap();
        let t = Utc.with_ymd_and_hms(2026, 1, 1, 0, 2, 0).unwrap();
        assert_eq!(
            c.next_after(t).unwrap(),
            Utc.with_ymd_and_hms(2026, 1, 1, 0, 5, 0).unwrap()
        );
        assert!(Cadence::cron("not cron").is_err());
    }
}
