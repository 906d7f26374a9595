//! `[[schedules]]`: each checked into a [`Schedule`] at load, so a schedule
//! that can never fire or whose jobs would be refused is a config error now,
//! not once per tick.

use std::time::Duration;

use super::ScheduleFile;
use crate::error::{Error, Result};
use crate::queue::schedule::{Cadence, Schedule};
use crate::queue::{validate, NewJob};

pub(super) fn validate_schedule(s: ScheduleFile, payload_limit: usize) -> Result<Schedule> {
    let ctx = |msg: String| Error::Config(format!("schedule {:?}: {msg}", s.name));
    validate::queue_name(&s.queue).map_err(|e| ctx(e.to_string()))?;
    // Inner errors are config errors already: keep their text, not their prefix.
    let inner = |e: Error| match e {
        Error::Config(m) => m,
        other => other.to_string(),
    };
    let cadence = match (&s.every, &s.cron) {
        // Instance keys are unix seconds: a shorter period would collide.
        (Some(d), None) if d.0 < Duration::from_secs(1) => {
            return Err(ctx("every must be at least 1s".into()))
        }
        (Some(d), None) => Cadence::Every(d.0),
        (None, Some(expr)) => Cadence::cron(expr).map_err(|e| ctx(inner(e)))?,
        _ => return Err(ctx("set exactly one of `every` and `cron`".into())),
    };
    // A schedule that can never fire (a past year, 30 February, a period past
    // the calendar's end) is a typo; say so now rather than once per tick.
    let now = chrono::Utc::now();
    let fires = match &cadence {
        Cadence::Every(d) => chrono::Duration::from_std(*d)
            .ok()
            .and_then(|d| now.checked_add_signed(d))
            .is_some(),
        Cadence::Cron(_) => cadence.next_after(now).is_some(),
    };
    if !fires {
        return Err(ctx(match &s.cron {
            Some(expr) => format!("cron expression {expr:?} has no fire time in the future"),
            None => "every is too long: it would never fire".into(),
        }));
    }
    let mut job = NewJob::new(
        s.queue.clone(),
        s.payload.clone().unwrap_or(serde_json::json!({})),
    );
    job.kind = s.kind.clone();
    job.priority = s.priority;
    validate::payload_value(&job.payload, payload_limit).map_err(|e| ctx(e.to_string()))?;
    // Each instance gets the key `schedule:<name>:<unix seconds>`: check the
    // longest one along with the kind.
    let mut instance = job.clone();
    instance.key = Some(format!("schedule:{}:{}", s.name, i64::MAX));
    validate::job_fields(&instance).map_err(|e| ctx(e.to_string()))?;
    Ok(Schedule {
        name: s.name,
        cadence,
        job,
    })
}
