//! Where a bench's database time goes: samples `pg_stat_activity` for the
//! bench's database every few milliseconds and reports, per kind of
//! statement (enqueue, claim, completion, other), how many backends were on
//! average running it, waiting inside it (by wait event), or idle after it.
//!
//! Why: a steady state below the SQL floor is either Postgres's CPU (the
//! backends are busy running) or the client side (they sit idle between
//! statements while the process prepares the next one), or a wait inside
//! Postgres (locks, WAL flushes). CPU totals alone cannot tell these apart.
//! Opt-in (`--activity`): its own query every few milliseconds is load too.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How often the sampler looks.
const EVERY: Duration = Duration::from_millis(5);

/// The client backends of this database other than the sampler, with their
/// current (or, when idle, last) statement.
const SAMPLE_SQL: &str = "\
    SELECT coalesce(state, ''), coalesce(wait_event_type || ':' || wait_event, ''), \
           query \
      FROM pg_stat_activity \
     WHERE datname = current_database() AND pid <> pg_backend_pid() \
       AND backend_type = 'client backend'";

/// Samples until `stop` is cancelled; the handle yields the report's lines.
pub fn sample(db: PgPool, stop: CancellationToken) -> JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut tally = Tally::default();
        while !stop.is_cancelled() {
            if let Ok(rows) = sqlx::query_as::<_, (String, String, String)>(SAMPLE_SQL)
                .fetch_all(&db)
                .await
            {
                tally.add(&rows);
            }
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(EVERY) => {}
            }
        }
        tally.lines()
    })
}

/// Counts of (statement kind, what the backend was doing) over the samples.
#[derive(Default)]
struct Tally {
    samples: u64,
    seen: BTreeMap<(&'static str, String), u64>,
}

impl Tally {
    fn add(&mut self, rows: &[(String, String, String)]) {
        self.samples += 1;
        for (state, wait, query) in rows {
            let doing = match state.as_str() {
                "active" if wait.is_empty() => "running".to_string(),
                "active" => format!("waiting {wait}"),
                "idle" => "idle after it".to_string(),
                other => other.to_string(),
            };
            *self.seen.entry((kind(query), doing)).or_default() += 1;
        }
    }

    /// One line per statement kind: average backends per activity.
    fn lines(&self) -> Vec<String> {
        let samples = self.samples.max(1) as f64;
        let mut by_kind: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for ((kind, doing), n) in &self.seen {
            let avg = *n as f64 / samples;
            if avg >= 0.005 {
                by_kind
                    .entry(kind)
                    .or_default()
                    .push(format!("{doing} {avg:.2}"));
            }
        }
        let mut out = vec![format!(
            "pg_stat_activity, {} samples every {} ms: backends on average, per statement",
            self.samples,
            EVERY.as_millis()
        )];
        out.extend(
            by_kind
                .into_iter()
                .map(|(kind, parts)| format!("{kind}: {}", parts.join(", "))),
        );
        out
    }
}

/// Which of qbridge's statements a query text is.
fn kind(query: &str) -> &'static str {
    if query.contains("SKIP LOCKED") {
        "claim"
    } else if query.contains("DELETE FROM qbridge.jobs") {
        "completion"
    } else if query.contains("INSERT INTO qbridge.jobs") {
        "enqueue"
    } else if query.contains("lease_until") {
        "heartbeat"
    } else {
        "other"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn averages_backends_per_statement_and_activity_over_the_samples() {
        let mut t = Tally::default();
        let row = |s: &str, w: &str, q: &str| (s.to_string(), w.to_string(), q.to_string());
        t.add(&[
            row("active", "", "WITH cand AS (SELECT id ... SKIP LOCKED)"),
            row("idle", "", "DELETE FROM qbridge.jobs j WHERE ..."),
        ]);
        t.add(&[
            row("active", "LWLock:WALWrite", "INSERT INTO qbridge.jobs ..."),
            row("idle", "", "DELETE FROM qbridge.jobs j WHERE ..."),
        ]);
        let lines = t.lines();
        assert!(lines[0].contains("2 samples"), "{lines:?}");
        assert_eq!(
            lines[1..],
            [
                "claim: running 0.50",
                "completion: idle after it 1.00",
                "enqueue: waiting LWLock:WALWrite 0.50",
            ]
        );
    }
}
