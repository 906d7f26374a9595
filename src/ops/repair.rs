//! `qbridge diff --repair`: fills what the diff found missing on one side,
//! idempotently by job key.
//!
//! - Waiting in Redis but never mirrored: stored in Postgres as mirror
//!   copies (a known key is a duplicate, so a second repair adds nothing).
//! - Mirrored but gone from Redis (no Redis outcome, not held): the mirror
//!   copy's original bytes are pushed back to the route's list **only on
//!   evidence that Redis lost it** ([`crate::ops::evidence`]: a restart,
//!   flush or failover after its push, on a route run by qbridge's consumer)
//!   or on an operator's audited decision ([`Assumption`], `--assume-lost`).
//!   The rest is reported as unaccounted, with the reason. A marker
//!   `qbridge:repushed:<route>:<key>` is set in the same Lua step as the
//!   push, so a second repair before the Redis side reports the job pushes
//!   nothing; for a fresh copy of a text the marker also names the key's
//!   last recorded push-back (`…#<µs>`, [`push_back`]). One repair of a
//!   route runs at a time ([`one_at_a_time`]).
//! - With an operator's assumption, held re-pushes of the selected keys
//!   ([`crate::ingest`]) are released as live jobs too.
//!
//! Items that ran on Redis without ever being mirrored are not touched: they
//! ran live once, which is the promise; the diff only counts them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use redis::aio::ConnectionManager;
use serde::Serialize;
use sqlx::{Connection, PgConnection, PgPool};

use crate::config::PushEnd;
use crate::error::Result;
use crate::ingest::{self, Item, Via};
use crate::model::formats::decode_bytes;
use crate::model::Phase;
use crate::ops::diff::{ONLY_POSTGRES_SQL, UNKNOWN_KEYS_SQL};
use crate::ops::evidence;
use crate::ops::redis_view::{self, RedisView};
use crate::queue::JobCopy;
use crate::redis::consumer::numbering;
use crate::redis::keys::RouteKeys;
use crate::redis::rq_jobs;
use crate::routes::Route;

/// How long a re-push marker lives: longer than any sane Redis backlog, so
/// the same loss is never re-pushed twice, short enough to forget. A fresh
/// copy's marker lives no longer than the route's dedup window, after which
/// the push-back record it is named after is pruned.
const MARKER_TTL: Duration = Duration::from_secs(7 * 86400);

/// Sets the marker and pushes, or does nothing if the marker exists.
/// KEYS: list, marker. ARGV: item, ttl seconds, push command.
const REPUSH_LUA: &str = r#"
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[2]) then
  redis.call(ARGV[3], KEYS[1], ARGV[1])
  return 1
end
return 0
"#;

mod assume;
mod readings;

pub use assume::Assumption;
pub use readings::MOST_READINGS;

/// What a repair did.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct RepairReport {
    /// Redis items newly stored in Postgres as mirror copies.
    pub mirrored: usize,
    /// Mirror copies pushed back to Redis.
    pub repushed: usize,
    /// Mirror copies a previous repair already pushed back.
    pub already_repushed: usize,
    /// Why they were pushed back: each line of evidence (or the operator's
    /// decision) with how many jobs it covered.
    pub evidence: BTreeMap<String, usize>,
    /// Mirror copies with no outcome and in no structure qbridge reads, and
    /// no evidence that Redis lost them: not pushed back, listed by the diff.
    pub unaccounted: usize,
    pub unaccounted_sample: Vec<String>,
    /// Why qbridge cannot tell the unaccounted ones lost.
    pub unaccounted_reason: Option<String>,
    /// Mirror copies Redis's readings kept disagreeing on (its consumers
    /// were busy): neither pushed back nor counted unaccounted; a repair
    /// when the Redis side is quieter judges them.
    pub not_judged: usize,
    /// Even the last reading was taken while identical copies were pushed
    /// or popped, so a loss of one of their texts may be hidden: run the
    /// repair again when the Redis side is quieter.
    pub read_while_moving: bool,
    /// Held re-pushes an operator's assumption released as live jobs.
    pub released: u64,
    /// Why a part was not repaired, if one was not.
    pub skipped: Option<String>,
}

/// Repairs one route on evidence alone. `since` and `held` are those the
/// diff used.
pub async fn repair(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    phase: Phase,
    since: DateTime<Utc>,
    held: &RedisView,
    payload_limit: usize,
) -> Result<RepairReport> {
    let input = RepairInput {
        route,
        phase,
        since,
        held,
        payload_limit,
        assume: None,
    };
    repair_with(db, redis, input).await
}

/// The diff of `route` from `since` (default: its gate's window) in its
/// stored phase, then the repair of what it found, with an operator's
/// assumption when given: what the admin API and the console run (the CLI
/// reads its own window and prints between the two).
pub async fn diff_and_repair(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    by: &str,
    since: Option<DateTime<Utc>>,
    assume: Option<&Assumption>,
    payload_limit: usize,
) -> Result<(crate::ops::diff::Diff, RepairReport)> {
    // The stored phase, as `qbridge diff --repair` reads it: a process's
    // view may be up to a poll behind a flip made a moment ago.
    let phase = crate::ops::operate::state_of(db, route, by).await?.phase;
    let since = match since {
        Some(t) => t,
        None => crate::ops::gates::default_since(db, route).await?,
    };
    let (diff, held) = crate::ops::gates::diff_since(db, redis, route, phase, since).await?;
    let input = RepairInput {
        route,
        phase,
        since,
        held: &held,
        payload_limit,
        assume,
    };
    let report = repair_with(db, redis, input).await?;
    Ok((diff, report))
}

/// What [`repair_with`] works on.
pub struct RepairInput<'a> {
    pub route: &'a Route,
    pub phase: Phase,
    /// The diff's window.
    pub since: DateTime<Utc>,
    /// What the diff read from Redis.
    pub held: &'a RedisView,
    pub payload_limit: usize,
    /// An operator's decision that jobs are lost, beyond the evidence.
    pub assume: Option<&'a Assumption>,
}

/// Repairs one route, with an operator's assumption when given (audited in
/// `qbridge.repair_audit`).
pub async fn repair_with(
    db: &PgPool,
    redis: &mut ConnectionManager,
    input: RepairInput<'_>,
) -> Result<RepairReport> {
    if let Some(assume) = input.assume {
        assume.check()?;
    }
    let lock = one_at_a_time(db, input.route).await?;
    let report = repair_alone(db, redis, input).await;
    lock.close().await?;
    report
}

/// One repair of a route at a time, in every process: two at once would
/// both read Redis before either pushed back and judge one loss twice (the
/// CLI, the admin API and the console each start one). A transaction-level
/// advisory lock (pooler-safe) on a connection of its own, outside the
/// pool the repair works with, so it cannot starve it; the next repair
/// waits, then reads Redis after this one's push-backs.
async fn one_at_a_time(db: &PgPool, route: &Route) -> Result<RepairLock> {
    let mut conn = PgConnection::connect_with(&db.connect_options()).await?;
    sqlx::query("BEGIN").execute(&mut conn).await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 7482))")
        .bind(format!("qbridge:repair:{}", route.name))
        .execute(&mut conn)
        .await?;
    Ok(RepairLock(conn))
}

/// Held while a repair runs; [`RepairLock::close`] lets the next one in
/// (so does dropping it: the server ends the session and its transaction).
struct RepairLock(PgConnection);

impl RepairLock {
    async fn close(mut self) -> Result<()> {
        sqlx::query("COMMIT").execute(&mut self.0).await?;
        self.0.close().await?;
        Ok(())
    }
}

/// [`repair_with`], under the route's repair lock.
async fn repair_alone(
    db: &PgPool,
    redis: &mut ConnectionManager,
    input: RepairInput<'_>,
) -> Result<RepairReport> {
    let RepairInput {
        route,
        phase,
        since,
        held,
        payload_limit,
        assume,
    } = input;
    let mut report = RepairReport {
        mirrored: mirror_waiting(db, redis, route, held, payload_limit).await?,
        ..RepairReport::default()
    };
    if !matches!(
        phase,
        Phase::DualWrite | Phase::Shadow | Phase::PostgresOnly
    ) {
        report.skipped = Some(format!(
            "nothing is pushed back to Redis in {phase}: the Redis side is not running jobs"
        ));
        return Ok(report);
    }
    let settled = Utc::now()
        - chrono::Duration::from_std(route.config.cutover.diff.settle).unwrap_or_default();
    // Its own reading, not the diff's: what Postgres held just before it is
    // the measure (`ONLY_POSTGRES_SQL`), and the diff's is older; taken once
    // a new server has had time to get its consumers' running items back.
    crate::redis::epoch::wait_until_settled(redis, db, route).await?;
    let view = redis_view::read(redis, db, route).await?;
    // See `readings`: only what two readings a moment apart both miss is
    // considered (the demo drill caught a running job pushed back without
    // this), reading again while they disagree.
    let first = owed(db, route, since, settled, &view).await?;
    let mut readings = readings::Rereads::new(first, view.moved_while_read);
    while readings.wants_another() {
        tokio::time::sleep(RECHECK_AFTER).await;
        let again = redis_view::read(redis, db, route).await?;
        let moved = again.moved_while_read;
        readings.add(owed(db, route, since, settled, &again).await?, moved);
    }
    let readings::Agreed {
        keys,
        popped,
        not_judged,
        moved,
    } = readings.finish();
    report.not_judged = not_judged;
    report.read_while_moving = moved;
    let accounting = evidence::classify(db, route, held.epoch.as_ref(), keys).await?;
    let mut push: Vec<(String, String)> = accounting.repairable;
    let mut unaccounted = accounting.unaccounted;
    if let Some(assume) = assume {
        // A named key with a held re-push runs once: in Postgres when Redis
        // does not hold its original (then it is not pushed back either),
        // else on Redis (the held re-push resolves when Redis reports it).
        let in_redis: HashSet<String> = held.keys().into_iter().collect();
        let named: Vec<String> = assume
            .keys
            .iter()
            .filter(|k| !in_redis.contains(*k))
            .cloned()
            .collect();
        let released = assume
            .release_held(db, route, &named, payload_limit)
            .await?;
        report.released = released.len() as u64;
        push.retain(|(k, _)| !released.contains(k));
        unaccounted.retain(|k| !released.contains(k));
        let (assumed, rest) = assume.split(db, route, unaccounted).await?;
        unaccounted = rest;
        push.extend(assumed.into_iter().map(|k| (k, assume.evidence_line())));
    }
    for key in &unaccounted {
        let (text, occurrence) =
            numbering::numbered(key).map_or(("", 0), |(hash, n)| (&hash[..12.min(hash.len())], n));
        tracing::debug!(route = %route.name, text, occurrence, "repair: unaccounted, not pushed back");
    }
    report.unaccounted = unaccounted.len();
    report.unaccounted_sample = unaccounted
        .into_iter()
        .take(route.config.cutover.diff.sample_keys)
        .collect();
    if report.unaccounted > 0 {
        report.unaccounted_reason = accounting.reason;
    }
    push_back(db, redis, route, &push, &popped, &mut report).await?;
    if let Some(assume) = assume {
        assume.audit(db, route, &report).await?;
    }
    Ok(report)
}

/// Pushes back the original bytes of `push` (job key, why), each at most
/// once (the marker), counting the evidence of those pushed.
///
/// A content-hash copy in `popped` (a pop had taken its number when repair
/// read, and the copy was lost after) is popped again under that number: it
/// becomes a hole first. Any other copy is popped under the next number.
/// Comparing the number with the pop count at push time instead was wrong:
/// the consumer pops on meanwhile — copies waiting in Redis, copies pushed
/// back a moment before — and counts past numbers no pop had taken, which
/// then became holes as well, so two pops shared a number and one number
/// never ran (oracle seeds 3000, 3220, 3458, 3496). Pushing back in number
/// order keeps the pops' numbers close to the copies'.
async fn push_back(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    push: &[(String, String)],
    popped: &HashSet<String>,
    report: &mut RepairReport,
) -> Result<()> {
    if push.is_empty() {
        return Ok(());
    }
    let why: HashMap<&str, &str> = push.iter().map(|(k, w)| (k.as_str(), w.as_str())).collect();
    let keys: Vec<&str> = push.iter().map(|(k, _)| k.as_str()).collect();
    let rows: Vec<(String, Vec<u8>)> = sqlx::query_as(
        "SELECT key, original FROM qbridge.job_keys \
          WHERE queue = $1 AND key = ANY($2::text[]) AND original IS NOT NULL \
          ORDER BY substring(key from '^sha256:[0-9a-f]+:([0-9]+)$')::numeric NULLS FIRST, key",
    )
    .bind(&route.queue)
    .bind(&keys)
    .fetch_all(db)
    .await?;
    let list = String::from_utf8_lossy(&route.redis_key).into_owned();
    let command = match route.push {
        PushEnd::Lpush => "LPUSH",
        PushEnd::Rpush => "RPUSH",
    };
    let script = redis::Script::new(REPUSH_LUA);
    let route_keys = RouteKeys::of(route);
    for (key, original) in rows {
        let hole = match popped.contains(&key) {
            true => numbering::expect_again(db, &route.queue, &key).await?,
            false => false,
        };
        let (marker, ttl) = match numbering::numbered(&key).filter(|_| !popped.contains(&key)) {
            // A fresh number names a count, not a copy: every judgement of
            // the text names its missing copies from the same oldest
            // numbers, so a second loss can get the key of a copy pushed
            // back before (oracle seed 90000: dropped as pushed back
            // already). The marker names the key's last push-back recorded
            // in `text_repushes` as well: a crash between the push and its
            // record still finds it, a later loss does not. Records are
            // pruned oldest first and no sooner than the marker expires,
            // so a name never comes back while its marker lives.
            Some(_) => {
                let after: i64 = sqlx::query_scalar(
                    "SELECT COALESCE((extract(epoch FROM max(at)) * 1000000)::int8, 0) \
                       FROM qbridge.text_repushes WHERE queue = $1 AND key = $2",
                )
                .bind(&route.queue)
                .bind(&key)
                .fetch_one(db)
                .await?;
                let ttl = MARKER_TTL.min(route.config.dedup_window);
                (route_keys.repushed_after(&key, after), ttl)
            }
            None => (route_keys.repushed(&key), MARKER_TTL),
        };
        let pushed: Result<i64> = script
            .key(&list)
            .key(marker)
            .arg(original)
            .arg(ttl.as_secs().max(1))
            .arg(command)
            .invoke_async(redis)
            .await
            .map_err(Into::into);
        // Which copy of which text, by the hash's first 12 hex digits and
        // the number (equality only, nothing of the payload), so a failed
        // oracle seed can be followed push-back by push-back.
        let (text, occurrence) =
            numbering::numbered(&key).map_or(("", 0), |(hash, n)| (&hash[..12.min(hash.len())], n));
        tracing::debug!(route = %route.name, text, occurrence, hole, pushed = ?pushed.as_ref().ok(),
            "repair: pushed back a copy Redis lost (1: pushed; 0: an earlier repair had)");
        if hole && !matches!(pushed, Ok(1)) {
            numbering::unexpect(db, &route.queue, &key).await?;
        }
        if pushed? == 1 {
            // A fresh copy of a text stands in for one the text's evidence
            // counted lost: record it, so the count is used up
            // (`epoch::copies_before`). A hole is judged per key instead.
            if !hole && numbering::numbered(&key).is_some() {
                sqlx::query("INSERT INTO qbridge.text_repushes (queue, key) VALUES ($1, $2)")
                    .bind(&route.queue)
                    .bind(&key)
                    .execute(db)
                    .await?;
            }
            report.repushed += 1;
            let line = why.get(key.as_str()).copied().unwrap_or_default();
            *report.evidence.entry(line.to_string()).or_default() += 1;
        } else {
            report.already_repushed += 1;
        }
    }
    Ok(())
}

/// Time between the two readings that must agree before a push-back:
/// longer than the outcome recorder takes to write what it was handed.
const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// Mirror copies unaccounted for on the Redis side given one reading, each
/// with whether a pop had taken its number (`ONLY_POSTGRES_SQL`).
async fn owed(
    db: &PgPool,
    route: &Route,
    since: DateTime<Utc>,
    settled: DateTime<Utc>,
    held: &RedisView,
) -> Result<HashMap<String, bool>> {
    let keys: Vec<(String, bool)> = sqlx::query_as(ONLY_POSTGRES_SQL)
        .bind(&route.queue)
        .bind(since)
        .bind(settled)
        .bind(held.accounted_keys())
        .bind(held.before.owed())
        .bind(&held.before.texts)
        .bind(&held.before.pushed)
        .bind(held.before.paid_tokens())
        .fetch_all(db)
        .await?;
    Ok(keys.into_iter().collect())
}

/// Stores the held items Postgres does not know as mirror copies (items
/// with an id only; see the filter below).
async fn mirror_waiting(
    db: &PgPool,
    redis: &mut ConnectionManager,
    route: &Route,
    held: &RedisView,
    payload_limit: usize,
) -> Result<usize> {
    let originals: Vec<Bytes> = held
        .waiting
        .iter()
        .chain(&held.processing)
        .map(|h| h.original.clone())
        .collect();
    if originals.is_empty() {
        return Ok(0);
    }
    let keys = held.keys();
    let unknown: Vec<String> = sqlx::query_scalar(UNKNOWN_KEYS_SQL)
        .bind(&route.queue)
        .bind(&keys)
        .fetch_all(db)
        .await?;
    if unknown.is_empty() {
        return Ok(0);
    }
    let unknown: HashSet<String> = unknown.into_iter().collect();
    let mut items: Vec<Item<'_>> = keys
        .iter()
        .zip(originals)
        .filter(|(k, _)| unknown.contains(*k))
        .map(|(key, original)| (key, decode_bytes(&route.format, original)))
        // Identical bytes cannot be matched to their pushes one by one: a
        // content-hash item's name here is a prediction, and it is the number
        // the next push of the same bytes takes (a mirror write in flight, a
        // producer about to commit), which would then be taken for a
        // duplicate and never pushed. Such items are left to the numbering
        // (decommission archives what is still waiting).
        .filter(|(_, decoded)| !decoded.key.is_content_hash())
        .map(|(key, decoded)| {
            let mut item = Item::new(route, decoded, JobCopy::Mirror, Via::Repair);
            item.known_key = Some(key.clone());
            item
        })
        .collect();
    rq_jobs::attach(
        redis,
        (&route.format, &route.config.keys),
        items.iter_mut().map(|i| &mut i.decoded),
    )
    .await;
    ingest::store_counting_new(db, items, payload_limit).await
}
