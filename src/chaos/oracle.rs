//! The oracle: what must hold after every scenario, read from the handler's
//! ledger and qbridge's own tables.
//!
//! - every acknowledged enqueue ran live with success or was dead-lettered
//!   (lost = neither);
//! - at most one applied completion per Postgres job (`jobs_done` once, and
//!   never both done and dead);
//! - a key ran live successfully more than once only for a reason the
//!   promise allows: a Postgres attempt whose lease had expired (or was gone
//!   when the handler was called), or a Redis-side re-run, counted by
//!   cause: the same item with its attempt counter continued (its consumer
//!   died, or its ack was lost), or a second item of a key whose first
//!   run never reached the record (see [`REDIS_RUN_UNRECORDED`]); a second
//!   item after the first run was on record is a violation; each of these
//!   Redis-side reasons holds only across a fault the run named
//!   ([`Fault`]): without one between the runs, a Redis
//!   job run twice is a violation;
//!   never on both sides — except a Redis attempt on record
//!   as interrupted (its consumer died holding the item, and decommission
//!   archived it into Postgres, which ran it: at least once under a crash,
//!   counted by the diff) — never while the earlier attempt's lease was
//!   valid;
//! - no result from a stale lease was applied: the lease a completion was
//!   recorded under is the newest the job was handed (`jobs_done.lease`);
//! - nothing sent inside a MULTI that never reached EXEC exists anywhere.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sqlx::PgPool;

pub use super::fault::Fault;
use super::load::{item, Items, UNSURE};
use super::rig::ROUTE;
use crate::error::Result;
use crate::model::formats::{decode_bytes, Format};

/// Stores acknowledged pushes for the SQL checks: keys (repeats are
/// ignored: a re-push of an id is the same job), or on a content-hash route
/// one row per push of a text (identical bytes pushed twice are two jobs).
pub async fn record_acked(
    db: &PgPool,
    items: Items,
    acked: &[(String, &'static str)],
) -> Result<()> {
    if items.repeats_are_new_jobs() {
        return record_pushes(db, items, acked).await;
    }
    let acked: Vec<&(String, &str)> = acked.iter().filter(|(_, v)| *v != UNSURE).collect();
    for chunk in acked.chunks(5000) {
        let keys: Vec<&str> = chunk.iter().map(|(k, _)| k.as_str()).collect();
        let via: Vec<&str> = chunk.iter().map(|(_, v)| *v).collect();
        sqlx::query(
            "INSERT INTO chaos.acked (key, via) SELECT * FROM unnest($1::text[], $2::text[]) \
             ON CONFLICT DO NOTHING",
        )
        .bind(&keys)
        .bind(&via)
        .execute(db)
        .await?;
    }
    Ok(())
}

async fn record_pushes(db: &PgPool, items: Items, acked: &[(String, &'static str)]) -> Result<()> {
    for chunk in acked.chunks(5000) {
        let hashes: Vec<String> = chunk
            .iter()
            .map(|(name, _)| {
                let decoded = decode_bytes(&Format::Raw, item(items, name));
                let key = decoded.key.with_occurrence(0);
                key.trim_end_matches(":0").to_string()
            })
            .collect();
        let via: Vec<&str> = chunk.iter().map(|(_, v)| *v).collect();
        sqlx::query(
            "INSERT INTO chaos.pushes (hash, via) SELECT * FROM unnest($1::text[], $2::text[])",
        )
        .bind(&hashes)
        .bind(&via)
        .execute(db)
        .await?;
    }
    Ok(())
}

/// Texts pushed on a content-hash route more often than jobs of them ran
/// live with success (or died): each push is a job, keyed
/// `sha256:<hex>:<n>`, so as many distinct keys must have run.
const SHORT_RUNS_SQL: &str = r#"
SELECT p.hash || ' (' || p.pushes || ' pushed, ' || r.ran || ' ran)'
  FROM (SELECT hash, count(*) AS pushes FROM chaos.pushes
         WHERE via <> 'unacknowledged' GROUP BY hash) p
  CROSS JOIN LATERAL (
        SELECT (SELECT count(DISTINCT l.key) FROM chaos.ledger l
                 WHERE l.key LIKE p.hash || ':%' AND l.mode = 'live' AND l.ok)
             + (SELECT count(*) FROM qbridge.jobs_dead d
                 WHERE d.queue = $1 AND d.key LIKE p.hash || ':%' AND d.copy = 'live') AS ran) r
 WHERE r.ran < p.pushes
 ORDER BY p.hash
"#;

/// Texts whose jobs ran under more distinct keys than they were pushed
/// (acknowledged or not: an unanswered push may exist): one push run under
/// two keys (the sides' numbering drifted apart).
const EXTRA_KEYS_SQL: &str = r#"
SELECT p.hash || ' (' || p.pushes || ' pushed, ran under ' || r.keys || ' keys)'
  FROM (SELECT hash, count(*) AS pushes FROM chaos.pushes GROUP BY hash) p
  CROSS JOIN LATERAL (
        SELECT count(DISTINCT l.key) AS keys FROM chaos.ledger l
         WHERE l.key LIKE p.hash || ':%' AND l.mode = 'live' AND l.ok) r
 WHERE r.keys > p.pushes
 ORDER BY p.hash
"#;

/// Acknowledged keys that neither ran live with success nor were dead-lettered.
const MISSING_SQL: &str = r#"
SELECT a.key FROM chaos.acked a
 WHERE NOT EXISTS (SELECT 1 FROM chaos.ledger l WHERE l.key = a.key AND l.mode = 'live' AND l.ok)
   AND NOT EXISTS (SELECT 1 FROM qbridge.jobs_dead d
                    WHERE d.queue = $1 AND d.key = a.key AND d.copy = 'live')
   AND NOT EXISTS (SELECT 1 FROM qbridge.outcomes o
                    WHERE o.queue = $1 AND o.key = a.key AND o.side = 'redis' AND o.outcome = 'dead')
 ORDER BY a.key
"#;

/// Keys (and texts of a content-hash route) still owed, sorted.
pub async fn missing(db: &PgPool) -> Result<Vec<String>> {
    let mut owed: Vec<String> = sqlx::query_scalar(MISSING_SQL)
        .bind(ROUTE)
        .fetch_all(db)
        .await?;
    owed.extend(
        sqlx::query_scalar::<_, String>(SHORT_RUNS_SQL)
            .bind(ROUTE)
            .fetch_all(db)
            .await?,
    );
    Ok(owed)
}

/// Polls until nothing acknowledged is owed; the time it took, or `None`
/// at `patience`. Errors (Postgres restarting) count as "not yet".
pub async fn wait_until_done(db: &PgPool, patience: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < patience {
        if let Ok(keys) = missing(db).await {
            if keys.is_empty() {
                return Some(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// What the oracle found.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Verdict {
    pub jobs: u64,
    pub lost: u64,
    /// Extra live attempts by reason (allowed by the promise).
    pub extra: BTreeMap<String, u64>,
    /// Broken promises, each with a sample.
    pub violations: Vec<String>,
    /// Late results of attempts whose lease had been handed on, discarded.
    pub stale_discarded: u64,
}

/// Live successful runs of one key, in order.
#[derive(sqlx::FromRow)]
struct Run {
    key: String,
    job_id: i64,
    lease_until: Option<chrono::DateTime<chrono::Utc>>,
    at: chrono::DateTime<chrono::Utc>,
    /// The attempt the handler was told (a Redis item's counter lives in its
    /// inflight hash, so a run after a crash continues it).
    attempt: i32,
    /// When this Redis-side run's (job id 0) `ok` reached the record: from
    /// then on qbridge knew it ran, and nothing may run it again.
    on_record_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When this Redis-side run (job id 0) was put on record as interrupted:
    /// its consumer died holding the item, and decommission, archiving it,
    /// recorded this attempt (`ops/decommission/interrupted.rs`).
    interrupted_at: Option<chrono::DateTime<chrono::Utc>>,
}

const REPEATS_SQL: &str = r#"
SELECT l.key, l.job_id, l.lease_until, l.at, l.attempt,
       (SELECT min(o.recorded_at) FROM qbridge.outcomes o
         WHERE l.job_id = 0 AND o.queue = $1 AND o.key = l.key AND o.side = 'redis'
           AND o.mode = 'live' AND o.outcome = 'ok' AND o.attempt = l.attempt) AS on_record_at,
       (SELECT min(o.recorded_at) FROM qbridge.outcomes o
         WHERE l.job_id = 0 AND o.queue = $1 AND o.key = l.key AND o.side = 'redis'
           AND o.mode = 'live' AND o.error_class = 'interrupted'
           AND o.attempt = l.attempt) AS interrupted_at
  FROM chaos.ledger l
 WHERE mode = 'live' AND ok
   AND key IN (SELECT key FROM chaos.ledger WHERE mode = 'live' AND ok
                GROUP BY key HAVING count(*) > 1)
 ORDER BY key, at
"#;

const DOUBLE_COMPLETION_SQL: &str = r#"
SELECT id FROM qbridge.jobs_done GROUP BY id HAVING count(*) > 1
UNION ALL
SELECT d.id FROM qbridge.jobs_done d JOIN qbridge.jobs_dead x ON x.id = d.id
"#;

/// A completion recorded under an older lease than the job's newest call.
const STALE_ACCEPTED_SQL: &str = r#"
SELECT d.id FROM qbridge.jobs_done d
  JOIN (SELECT job_id, max(lease) AS newest FROM chaos.ledger WHERE job_id <> 0 GROUP BY job_id) l
    ON l.job_id = d.id
 WHERE d.lease < l.newest
"#;

const STALE_DISCARDED_SQL: &str = r#"
SELECT count(*) FROM chaos.ledger l JOIN qbridge.jobs_done d ON d.id = l.job_id
 WHERE l.ok AND l.lease < d.lease
"#;

const PHANTOM_SQL: &str = r#"
SELECT a.key FROM chaos.aborted a
 WHERE EXISTS (SELECT 1 FROM chaos.ledger l WHERE l.key = a.key)
    OR EXISTS (SELECT 1 FROM qbridge.job_keys k WHERE k.key = a.key)
"#;

/// Runs every check; `faults` are those caused on purpose, the only
/// reasons a Redis job may run twice.
pub async fn judge(db: &PgPool, faults: &[Fault]) -> Result<Verdict> {
    let mut v = Verdict {
        jobs: sqlx::query_scalar::<_, i64>(
            "SELECT (SELECT count(*) FROM chaos.acked) \
             + (SELECT count(*) FROM chaos.pushes WHERE via <> 'unacknowledged')",
        )
        .fetch_one(db)
        .await? as u64,
        ..Verdict::default()
    };
    let lost = missing(db).await?;
    v.lost = lost.len() as u64;
    if let Some(key) = lost.first() {
        let trace = match key.starts_with("sha256:") {
            true => "identical pushes: see the ledger by hash".to_string(),
            false => whereabouts(db, key).await?,
        };
        v.violations.push(format!(
            "{} acknowledged jobs lost, e.g. {key} ({trace})",
            lost.len()
        ));
    }
    let failed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM chaos.ledger WHERE mode = 'live' AND NOT ok")
            .fetch_one(db)
            .await?;
    if failed > 0 {
        v.extra
            .insert("retry after a handler failure".into(), failed as u64);
    }
    classify_repeats(db, faults, &mut v).await?;
    let drifted: Vec<String> = sqlx::query_scalar(EXTRA_KEYS_SQL).fetch_all(db).await?;
    if let Some(text) = drifted.first() {
        v.violations.push(format!(
            "{} texts ran under more keys than they were pushed, e.g. {text}",
            drifted.len()
        ));
    }
    let doubled: Vec<i64> = sqlx::query_scalar(DOUBLE_COMPLETION_SQL)
        .fetch_all(db)
        .await?;
    if let Some(id) = doubled.first() {
        v.violations.push(format!(
            "{} jobs completed twice (or completed and dead), e.g. job {id}",
            doubled.len()
        ));
    }
    let stale: Vec<i64> = sqlx::query_scalar(STALE_ACCEPTED_SQL).fetch_all(db).await?;
    if let Some(id) = stale.first() {
        v.violations.push(format!(
            "{} completions applied from a stale lease, e.g. job {id}",
            stale.len()
        ));
    }
    // The stale-lease check reads the lease each call carried: without it
    // (no Qbridge-Lease header) the check would pass blind.
    let blind: i64 =
        sqlx::query_scalar("SELECT count(*) FROM chaos.ledger WHERE job_id <> 0 AND lease <= 0")
            .fetch_one(db)
            .await?;
    if blind > 0 {
        v.violations.push(format!(
            "{blind} handler calls of Postgres jobs carried no lease token"
        ));
    }
    v.stale_discarded = sqlx::query_scalar::<_, i64>(STALE_DISCARDED_SQL)
        .fetch_one(db)
        .await? as u64;
    let phantoms: Vec<String> = sqlx::query_scalar(PHANTOM_SQL).fetch_all(db).await?;
    if let Some(key) = phantoms.first() {
        v.violations.push(format!(
            "{} pushes of a MULTI that never reached EXEC exist, e.g. {key}",
            phantoms.len()
        ));
    }
    Ok(v)
}

/// Where a key left traces, for a lost job's report.
const WHEREABOUTS_SQL: &str = r#"
SELECT concat_ws(', ',
  (SELECT 'job_keys ' || copy || ' via ' || via || CASE WHEN original IS NULL THEN '' ELSE ' (bytes kept)' END
     FROM qbridge.job_keys WHERE queue = $1 AND key = $2),
  (SELECT 'in jobs: ' || string_agg(state || '/' || copy, ' ') FROM qbridge.jobs WHERE queue = $1 AND key = $2),
  (SELECT 'done ' || count(*) FROM qbridge.jobs_done WHERE queue = $1 AND key = $2 HAVING count(*) > 0),
  (SELECT 'outcomes ' || string_agg(side || '/' || mode || '/' || outcome || ' ' || to_char(recorded_at, 'MI:SS.MS'), ' ' ORDER BY recorded_at)
     FROM qbridge.outcomes WHERE queue = $1 AND key = $2),
  (SELECT 'ledger ' || string_agg(mode || CASE WHEN ok THEN '/ok' ELSE '/failed' END || ' ' || to_char(at, 'MI:SS.MS') || ' a' || attempt, ' ' ORDER BY at)
     FROM chaos.ledger WHERE key = $2),
  (SELECT 'outbox ' || count(*) FROM qbridge.redis_outbox HAVING count(*) > 0)
)
"#;

async fn whereabouts(db: &PgPool, key: &str) -> Result<String> {
    let found: Option<String> = sqlx::query_scalar(WHEREABOUTS_SQL)
        .bind(ROUTE)
        .bind(key)
        .fetch_one(db)
        .await?;
    Ok(found
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "no trace anywhere".into()))
}

/// The reason a Redis item may run twice: the same item, its attempt
/// counter continued because the attempt before did not finish.
pub const REDIS_ATTEMPT_UNFINISHED: &str =
    "Redis item run again: its attempt did not finish (consumer killed or ack lost)";

/// The reason a Redis job may run twice as two items: its first run's
/// outcome was not on record when the second ran. Its consumer was killed
/// between the handler's end and the outcome's sync (at least once under a
/// crash: nothing on record said that run had ended), or a client's retry
/// reached Redis after it lost its ran set while Postgres did not answer.
/// (A run still going when Redis restarted is written back into the new
/// server by the consumer's keeper; the walk cannot yet tell that case
/// apart from these by the record's time, so it is counted here too.)
pub const REDIS_RUN_UNRECORDED: &str =
    "Redis job run again as a second item: its first run was not on record yet (still running, or its consumer killed before the sync)";

/// Identical texts are jobs told apart only by a pop's number: a number
/// run twice after a Redis restart (repair pushed a copy of the text back)
/// says nothing about which push ran twice. Their runs are judged per text
/// (none short of its pushes, none under more keys than pushed); a double
/// run within the pushed count of one text is not yet refused.
pub const IDENTICAL_TEXT_NUMBER_AGAIN: &str =
    "identical text: a copy run again under a number already run (judged per text)";

/// The reason a job may run on both sides: its Redis attempt is on record
/// as interrupted by a crash, and Postgres ran it from the archive.
pub const INTERRUPTED_THEN_ARCHIVED: &str =
    "Redis attempt interrupted by a crash, run again from the archive";

/// How long before a run's record a fault may have begun and still have
/// caused the run again: the record is written after the handler's work,
/// and a consumer killed meanwhile never acknowledged the item.
const FAULT_BEFORE_RECORD: chrono::Duration = chrono::Duration::seconds(1);

/// The fault that lasted into the window from just before run `a`'s record
/// to run `b`'s, if any: a Redis job run twice without one is a duplicate
/// qbridge let through, whatever the reason would otherwise be.
fn fault_between<'f>(faults: &'f [Fault], a: &Run, b: &Run) -> Option<&'f Fault> {
    faults
        .iter()
        .find(|f| f.from <= b.at && f.until >= a.at - FAULT_BEFORE_RECORD)
}

/// Sorts every second successful live run into a reason or a violation.
async fn classify_repeats(db: &PgPool, faults: &[Fault], v: &mut Verdict) -> Result<()> {
    let runs: Vec<Run> = sqlx::query_as(REPEATS_SQL)
        .bind(ROUTE)
        .fetch_all(db)
        .await?;
    let mut bad: BTreeMap<&'static str, (u64, String)> = BTreeMap::new();
    for pair in runs.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.key != b.key {
            continue;
        }
        let reason = match (a.job_id, b.job_id) {
            // Every reason below for a Redis job to run again needs a
            // crash or a restart between the runs: the walk names each.
            (0, 0) if fault_between(faults, a, b).is_none() => {
                Err("Redis job ran twice with no fault between its runs")
            }
            // The same item again, its attempt counter continued: its
            // attempt did not finish (the consumer died, or the ack was
            // lost). A second item of the key starts again at 1: a
            // duplicate the Redis side was handed, not at-least-once.
            (0, 0) if b.attempt > a.attempt => Ok(REDIS_ATTEMPT_UNFINISHED),
            // Not on record when the second item ran: still running, or
            // its consumer killed before the sync.
            (0, 0) if a.on_record_at.is_none_or(|t| t > b.at) => Ok(REDIS_RUN_UNRECORDED),
            (0, 0) if a.key.starts_with("sha256:") => Ok(IDENTICAL_TEXT_NUMBER_AGAIN),
            // qbridge knew the first run ended (its outcome is in Postgres,
            // or was in a spool repair replays): a second item must not
            // run, whether a client's retry or repair pushed it.
            (0, 0) => Err("Redis job ran again as a second item after its run was on record"),
            // At least once under a crash, and on record before Postgres ran
            // it: the diff counts it as run on both sides (the walk checks
            // that it does).
            (0, _) if a.interrupted_at.is_some_and(|t| t <= b.at) => Ok(INTERRUPTED_THEN_ARCHIVED),
            (0, _) | (_, 0) => Err("ran live on both sides"),
            _ => match a.lease_until {
                None => Ok("lease already gone when the handler was called"),
                Some(until) if b.at >= until => Ok("lease expired (worker lost)"),
                Some(_) => Err("second live run while the first lease was valid"),
            },
        };
        match reason {
            Ok(why) => *v.extra.entry(why.into()).or_default() += 1,
            Err(why) => {
                let e = bad.entry(why).or_insert((0, b.key.clone()));
                e.0 += 1;
            }
        }
    }
    for (why, (n, key)) in bad {
        v.violations.push(format!("{n}× {why}, e.g. {key}"));
    }
    Ok(())
}
