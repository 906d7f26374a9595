//! A live item (postgres_only, or a key inside a flipped share) whose key
//! the route recorded as a mirror copy: a re-push after the flip of a job
//! the Redis side was running — a framework retry, a retry from a dead set,
//! or a client retrying an LPUSH whose reply it never got. Redis will not see
//! this push, so it may have to run here; but if the Redis side still holds
//! or owes the original, running it here runs the job twice.
//!
//! The rule (never infer from silence): the re-push becomes live only on
//! positive evidence that the Redis side let go of the original — its last
//! reported outcome is `dead` (a retry from the dead set), or, for an
//! outside fleet, `failed` (Sidekiq, Celery and RQ re-push the same id to
//! retry; the failed attempt has ended) — and nothing of it is owed to Redis
//! by the outbox. A reported `ok` makes it a duplicate of a job that ran.
//! Anything else is held in `qbridge.held_repushes`, counted, shown by the
//! diff, and settled when the evidence arrives ([`super::held`]).
//!
//! A mirror copy still waiting in the queue becomes the live job itself; a
//! mirror copy being drained (running) stays as it is and a new live job is
//! enqueued beside it (migration 0010: a mirror row never holds the key).

use std::collections::{HashMap, HashSet};

use sqlx::PgConnection;

use super::release::{released_sql, use_up};
use super::{new_job, Item, Via};
use crate::config::RedisSideKind;
use crate::error::Result;
use crate::metrics as m;
use crate::model::formats::attempts_so_far;
use crate::queue::JobCopy;

/// What a live re-push of a recorded key becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It runs live in Postgres.
    Promote,
    /// A duplicate: the key is live already, or the Redis side ran it.
    Duplicate,
    /// Kept back until there is evidence either way, with the reason.
    Hold(&'static str),
}

/// The evidence one key has, as [`EVIDENCE_SQL`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// `job_keys.copy` of the key: `live` or `mirror`.
    pub copy: String,
    /// The Redis side's last reported outcome of the key, if any.
    pub last_redis_outcome: Option<String>,
    /// The outbox still owes Redis a push of the key.
    pub owed: bool,
    /// Redis handed the key's job out of a framework's set after the flip,
    /// so its push did not reach Redis ([`super::release`]).
    pub released: bool,
}

/// Decides one re-push. `fleet`: the route's Redis side is an outside fleet
/// (its retries re-push the same id), not qbridge's consumer (which retries
/// a failed job in place, from its processing list).
pub fn decide(evidence: &Evidence, fleet: bool) -> Verdict {
    if evidence.copy == "live" {
        return Verdict::Duplicate;
    }
    if evidence.owed {
        return Verdict::Hold("the original push is still owed to Redis by the outbox");
    }
    if evidence.last_redis_outcome.as_deref() == Some("ok") {
        // The Redis side ran it: a second copy, whatever else happened.
        return Verdict::Duplicate;
    }
    if evidence.released {
        // Redis took it out of its schedule or retry set, and the push that
        // moves it on was answered here: no Redis structure holds it.
        return Verdict::Promote;
    }
    match evidence.last_redis_outcome.as_deref() {
        Some("dead") => Verdict::Promote,
        Some("failed") if fleet => Verdict::Promote,
        Some("ok") => Verdict::Duplicate,
        Some(_) => Verdict::Hold(
            "qbridge's Redis consumer retries a failed job in place: the original may still run there",
        ),
        None => Verdict::Hold(
            "no outcome from the Redis side yet: the original may still be waiting, running or retrying there",
        ),
    }
}

/// The evidence of each (queue, key) that `job_keys` knows.
pub(crate) const EVIDENCE_SQL: &str = concat!(
    r#"
SELECT t.queue, t.key, k.copy,
       (SELECT o.outcome FROM qbridge.outcomes o
         WHERE o.queue = t.queue AND o.key = t.key AND o.side = 'redis' AND o.mode = 'live'
         ORDER BY o.recorded_at DESC, o.id DESC LIMIT 1),
       EXISTS (SELECT 1 FROM qbridge.redis_outbox b WHERE b.queue = t.queue AND b.key = t.key),
       "#,
    released_sql!(),
    r#"
  FROM unnest($1::text[], $2::text[]) AS t(queue, key)
  JOIN qbridge.job_keys k ON k.queue = t.queue AND k.key = t.key
"#
);

/// Reads the evidence of `pairs` on `conn`.
pub(crate) async fn evidence(
    conn: &mut PgConnection,
    pairs: &[(String, String)],
) -> Result<HashMap<(String, String), Evidence>> {
    let (queues, keys): (Vec<&str>, Vec<&str>) =
        pairs.iter().map(|(q, k)| (q.as_str(), k.as_str())).unzip();
    let rows: Vec<(String, String, String, Option<String>, bool, bool)> =
        sqlx::query_as(EVIDENCE_SQL)
            .bind(&queues)
            .bind(&keys)
            .fetch_all(&mut *conn)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(queue, key, copy, last, owed, released)| {
            let evidence = Evidence {
                copy,
                last_redis_outcome: last,
                owed,
                released,
            };
            ((queue, key), evidence)
        })
        .collect())
}

/// Marks keys live, by compare-and-swap from `mirror` (two racing re-pushes:
/// one wins, the other is a duplicate of it).
const PROMOTE_KEYS_SQL: &str = r#"
UPDATE qbridge.job_keys k SET copy = 'live', seen_at = now(), original = NULL
  FROM unnest($1::text[], $2::text[]) AS t(queue, key)
 WHERE k.queue = t.queue AND k.key = t.key AND k.copy = 'mirror'
RETURNING k.queue, k.key
"#;

/// A mirror copy still waiting becomes the live job, with the re-push's
/// state: its payload and bytes (a framework's retry carries newer headers)
/// and, when it says, its due time (a retry's countdown).
const UPGRADE_JOBS_SQL: &str = r#"
UPDATE qbridge.jobs j SET copy = 'live', payload = t.payload::jsonb, original = t.original,
                          run_at = COALESCE(t.run_at, j.run_at)
  FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::timestamptz[])
       AS t(queue, key, payload, original, run_at)
 WHERE j.queue = t.queue AND j.key = t.key AND j.copy = 'mirror' AND j.state = 'ready'
RETURNING j.queue, j.key, j.id
"#;

/// Keeps a re-push back; a second one of the same key replaces the bytes
/// (a framework's later retry carries its newer state) and is counted.
const HOLD_SQL: &str = r#"
INSERT INTO qbridge.held_repushes (queue, key, original, payload, kind, max_attempts, via, fleet, reason,
                                   run_at, attempts)
SELECT t.queue, t.key, t.original, t.payload::jsonb, t.kind, t.max_attempts, t.via, t.fleet,
       t.reason, t.run_at, t.attempts
  FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::text[], $6::int4[],
              $7::text[], $8::bool[], $9::text[], $10::timestamptz[], $11::int4[])
       AS t(queue, key, original, payload, kind, max_attempts, via, fleet, reason, run_at, attempts)
ON CONFLICT (queue, key) DO UPDATE
   SET original = excluded.original, payload = excluded.payload, kind = excluded.kind,
       max_attempts = excluded.max_attempts, reason = excluded.reason,
       run_at = excluded.run_at, attempts = excluded.attempts,
       pushes = held_repushes.pushes + 1
"#;

/// Decides every live item whose key is known (not in `fresh`): promotes
/// (returns the upgraded waiting mirror copies; adds the keys that need a
/// new live job to `fresh`), holds, or leaves it a duplicate.
pub(super) async fn promote_or_hold(
    conn: &mut PgConnection,
    items: &[Item<'_>],
    keys: &[String],
    oversize: &[bool],
    fresh: &mut HashSet<(String, String)>,
) -> Result<HashMap<(String, String), i64>> {
    // The first item of a key decides for the batch; later ones are
    // duplicates of it, as in `store`.
    let mut first: HashMap<(String, String), usize> = HashMap::new();
    for (i, (item, key)) in items.iter().zip(keys).enumerate() {
        let pair = (item.route.queue.clone(), key.clone());
        if item.copy == JobCopy::Live && !fresh.contains(&pair) {
            first.entry(pair).or_insert(i);
        }
    }
    if first.is_empty() {
        return Ok(HashMap::new());
    }
    let pairs: Vec<(String, String)> = first.keys().cloned().collect();
    let found = evidence(conn, &pairs).await?;
    let mut promote = Vec::new();
    let mut hold = Vec::new();
    for (pair, evidence) in &found {
        let i = first[pair];
        let fleet = items[i].route.config.redis_side == RedisSideKind::Fleet;
        let verdict = match items[i].via {
            // Decommission took the original out of Redis: nothing there
            // holds it any more, so it runs here (at least once: a consumer
            // that died holding it may have run part of it) — unless the
            // Redis side reported it done: then this is a second copy (a
            // client's retried push) of a job that ran.
            Via::Archive
                if evidence.copy == "mirror"
                    && evidence.last_redis_outcome.as_deref() != Some("ok") =>
            {
                Verdict::Promote
            }
            _ => decide(evidence, fleet),
        };
        match verdict {
            Verdict::Promote => promote.push(pair.clone()),
            Verdict::Hold(reason) => hold.push((i, reason)),
            Verdict::Duplicate => {}
        }
    }
    hold_back(conn, items, keys, oversize, &hold).await?;
    promote_keys(conn, items, (&first, oversize), promote, fresh).await
}

/// Marks `pairs` live and upgrades their waiting mirror copies; the rest
/// (drained or running mirror copies) get a new live job through `fresh`.
async fn promote_keys(
    conn: &mut PgConnection,
    items: &[Item<'_>],
    (first, oversize): (&HashMap<(String, String), usize>, &[bool]),
    pairs: Vec<(String, String)>,
    fresh: &mut HashSet<(String, String)>,
) -> Result<HashMap<(String, String), i64>> {
    if pairs.is_empty() {
        return Ok(HashMap::new());
    }
    let (queues, keys): (Vec<String>, Vec<String>) = pairs.into_iter().unzip();
    let promoted: Vec<(String, String)> = sqlx::query_as(PROMOTE_KEYS_SQL)
        .bind(&queues)
        .bind(&keys)
        .fetch_all(&mut *conn)
        .await?;
    for pair in &promoted {
        let route = &items[first[pair]].route.name;
        metrics::counter!(m::REPUSHES_PROMOTED, "route" => route.clone()).increment(1);
    }
    if promoted.is_empty() {
        return Ok(HashMap::new());
    }
    let (pq, pk): (Vec<String>, Vec<String>) = promoted.iter().cloned().unzip();
    let (uq, uk): (Vec<&str>, Vec<&str>) = promoted
        .iter()
        .map(|(q, k)| (q.as_str(), k.as_str()))
        .unzip();
    use_up(conn, &uq, &uk).await?;
    let jobs: Vec<_> = promoted
        .iter()
        .map(|pair| {
            let i = first[pair];
            new_job(&items[i], &pair.1, oversize[i])
        })
        .collect();
    let rows: Vec<(String, String, i64)> = sqlx::query_as(UPGRADE_JOBS_SQL)
        .bind(&pq)
        .bind(&pk)
        .bind(
            jobs.iter()
                .map(|j| j.payload.to_string())
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.original.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(jobs.iter().map(|j| j.run_at).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
    let upgraded: HashMap<(String, String), i64> =
        rows.into_iter().map(|(q, k, id)| ((q, k), id)).collect();
    fresh.extend(promoted.into_iter().filter(|p| !upgraded.contains_key(p)));
    Ok(upgraded)
}

/// Writes the held re-pushes (item index, reason) with what running them
/// later needs.
async fn hold_back(
    conn: &mut PgConnection,
    items: &[Item<'_>],
    keys: &[String],
    oversize: &[bool],
    held: &[(usize, &'static str)],
) -> Result<()> {
    if held.is_empty() {
        return Ok(());
    }
    let jobs: Vec<_> = held
        .iter()
        .map(|&(i, _)| new_job(&items[i], &keys[i], oversize[i]))
        .collect();
    sqlx::query(HOLD_SQL)
        .bind(jobs.iter().map(|j| j.queue.as_str()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.key.as_deref()).collect::<Vec<_>>())
        .bind(
            held.iter()
                .map(|&(i, _)| &items[i].decoded.original[..])
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.payload.to_string())
                .collect::<Vec<_>>(),
        )
        .bind(jobs.iter().map(|j| j.kind.as_deref()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.max_attempts).collect::<Vec<_>>())
        .bind(
            held.iter()
                .map(|&(i, _)| items[i].via.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            held.iter()
                .map(|&(i, _)| items[i].route.config.redis_side == RedisSideKind::Fleet)
                .collect::<Vec<_>>(),
        )
        .bind(held.iter().map(|&(_, why)| why).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.run_at).collect::<Vec<_>>())
        .bind(
            held.iter()
                .map(|&(i, _)| {
                    let item = &items[i];
                    attempts_so_far(&item.route.format, &item.decoded.payload)
                })
                .collect::<Vec<_>>(),
        )
        .execute(&mut *conn)
        .await?;
    for &(i, _) in held {
        let route = items[i].route.name.clone();
        metrics::counter!(m::REPUSHES_HELD, "route" => route).increment(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(copy: &str, last: Option<&str>, owed: bool) -> Evidence {
        Evidence {
            copy: copy.into(),
            last_redis_outcome: last.map(str::to_string),
            owed,
            released: false,
        }
    }

    #[test]
    fn redis_handing_the_job_out_of_its_set_promotes_unless_a_push_is_owed() {
        for fleet in [true, false] {
            let released = Evidence {
                released: true,
                ..ev("mirror", None, false)
            };
            assert_eq!(decide(&released, fleet), Verdict::Promote);
            let owed = Evidence {
                released: true,
                ..ev("mirror", None, true)
            };
            assert!(matches!(decide(&owed, fleet), Verdict::Hold(_)));
            let live = Evidence {
                released: true,
                ..ev("live", None, false)
            };
            assert_eq!(decide(&live, fleet), Verdict::Duplicate);
            // A job the Redis side ran is not run again on a release (a
            // ZREM that deleted it, then a client's re-push).
            let ran = Evidence {
                released: true,
                ..ev("mirror", Some("ok"), false)
            };
            assert_eq!(decide(&ran, fleet), Verdict::Duplicate);
        }
    }

    #[test]
    fn only_evidence_that_redis_let_go_promotes() {
        for fleet in [true, false] {
            assert_eq!(decide(&ev("live", None, false), fleet), Verdict::Duplicate);
            assert_eq!(
                decide(&ev("mirror", Some("dead"), false), fleet),
                Verdict::Promote
            );
            assert_eq!(
                decide(&ev("mirror", Some("ok"), false), fleet),
                Verdict::Duplicate
            );
            assert!(matches!(
                decide(&ev("mirror", None, false), fleet),
                Verdict::Hold(_)
            ));
            assert!(matches!(
                decide(&ev("mirror", Some("dead"), true), fleet),
                Verdict::Hold(_)
            ));
        }
        assert_eq!(
            decide(&ev("mirror", Some("failed"), false), true),
            Verdict::Promote
        );
        assert!(matches!(
            decide(&ev("mirror", Some("failed"), false), false),
            Verdict::Hold(_)
        ));
    }
}
