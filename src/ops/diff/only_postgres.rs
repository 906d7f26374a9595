//! The query behind "only on Postgres": the mirror copies whose Redis copy
//! nothing accounts for, which the diff reports and repair judges. Apart
//! from the diff's other queries because it is the one that reasons about
//! identical items' numbers.

/// Mirror copies whose Redis copy is unaccounted for: no final Redis
/// outcome (ok or dead; a failed attempt is retried from a processing list,
/// which a Redis restart can lose too), not held in Redis now and not owed
/// to Redis by the outbox.
/// `original IS NOT NULL` narrows the scan (a final Redis outcome clears
/// it), but the outcome check itself is what counts:
/// the Redis consumer can finish a job before its mirror row commits, and
/// then nothing cleared that row's bytes.
///
/// Ids are matched by key. Content hashes are counted (a key names a
/// count, not a copy), in three classes per text:
/// - *popped* (a number a pop took, not a hole): unaccounted unless Redis
///   holds it under that key (a processing list, the ran set); an outbox row
///   naming it is the outbox's copy, which pops under a later number;
/// - *hole* (a number a push-back waits to be popped under): the same;
/// - *fresh* (no pop took it yet): as many as Redis has copies waiting (the
///   diff's view names them by the next pop numbers) plus the copies the
///   outbox owes are accounted for, the newest first; the older rest are
///   unaccounted. Copies pushed after a restart are the ones Redis has, so
///   the copies called missing are those pushed before it.
///
/// The settle time (`$3`) waits for a job's outcome to be recorded, so it
/// applies to ids and popped numbers, counted from when the job came due
/// (`due_at`: a countdown or scheduled job runs then, not at its push). A *fresh* key names a count, not a
/// copy — the oldest numbers no pop took — and under load those are always
/// the newest: filtered by their own push time, a copy Redis lost was never
/// judged while producers and the consumer went on (oracle seeds 3208,
/// 3568). Fresh keys are judged against what Postgres held just before
/// Redis was read instead (`RedisView::before`): only numbers up to the
/// text's push count then (`$6` texts, `$7` counts) — a copy numbered by
/// then was in Redis, popped (the pop count is read after Redis), owed by
/// the outbox (`$5`, its keys then) or lost — so a push written to both
/// while Redis was read never looks missing. An outbox row whose paid
/// marker Redis had then (`$8`, tokens) owes nothing: its copy is counted
/// in Redis or among the pops.
///
/// `$4`: the keys Redis accounts for (`RedisView::accounted_keys`).
///
/// Rows: the key, and whether a pop had taken its number when this reading
/// was made (*popped* or *hole*): repair pushes such a copy back under its
/// own number, and any other under the next one. That must be this
/// reading's answer, not a later one: pops go on while repair pushes back.
pub(crate) const ONLY_POSTGRES_SQL: &str = r#"
WITH silent AS (
    SELECT k.key, greatest(k.seen_at, COALESCE(k.due_at, k.seen_at)) AS due,
           COALESCE(k.pushed_at, k.seen_at) AS pushed,
           substring(k.key from '^sha256:([0-9a-f]+):[0-9]+$') AS hash,
           substring(k.key from '^sha256:[0-9a-f]+:([0-9]+)$')::bigint AS n
      FROM qbridge.job_keys k
     WHERE k.queue = $1 AND k.copy = 'mirror' AND k.original IS NOT NULL AND k.seen_at >= $2
       AND NOT EXISTS (SELECT 1 FROM qbridge.outcomes o
                        WHERE o.queue = k.queue AND o.key = k.key AND o.side = 'redis'
                          AND o.outcome IN ('ok', 'dead'))
       -- Due later: a framework's schedule or retry set holds it until then
       -- (mirrored from a ZADD, or imported), not a list qbridge reads.
       AND NOT EXISTS (SELECT 1 FROM qbridge.jobs j
                        WHERE j.queue = k.queue AND j.key = k.key AND j.copy = 'mirror'
                          AND j.run_at > now())),
classed AS (
    SELECT s.*, COALESCE(p.n, 0) AS pops,
           CASE WHEN s.hash IS NULL THEN 'id'
                WHEN EXISTS (SELECT 1 FROM qbridge.pop_holes h
                              WHERE h.queue = $1 AND h.hash = s.hash AND h.n = s.n) THEN 'hole'
                WHEN s.n <= COALESCE(p.n, 0) THEN 'popped'
                ELSE 'fresh' END AS class
      FROM silent s
      LEFT JOIN qbridge.key_occurrences p ON p.queue = $1 AND p.side = 'pop' AND p.hash = s.hash
      LEFT JOIN unnest($6::text[], $7::int8[]) AS b(hash, pushed) ON b.hash = s.hash
     -- A copy numbered after Redis was read may still be on its way there.
     WHERE s.hash IS NULL OR s.n <= COALESCE(p.n, 0) OR s.n <= COALESCE(b.pushed, 0)),
ranked AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.hash, c.class
                                   ORDER BY c.pushed DESC, c.n DESC) AS newest
      FROM classed c),
-- Per text with fresh copies: the copies Redis holds above its pop count,
-- and those the outbox owes. Counted once per text and joined, not once
-- per fresh copy: a backlog of N identical items made that N x N.
fresh_texts AS (
    SELECT DISTINCT hash, pops FROM classed WHERE class = 'fresh'),
listed AS (
    SELECT f.hash, count(*) AS copies
      FROM fresh_texts f
      JOIN (SELECT substring(a.key from '^sha256:([0-9a-f]+):') AS hash,
                   substring(a.key from '^sha256:[0-9a-f]+:([0-9]+)$')::bigint AS n
              FROM unnest($4::text[]) AS a(key)
             WHERE a.key LIKE 'sha256:%') a ON a.hash = f.hash AND a.n > f.pops
     GROUP BY f.hash),
-- The keys Redis accounts for, as a set to join (a lookup in the array
-- for each copy made a long backlog quadratic too).
accounted AS (
    SELECT DISTINCT a.key FROM unnest($4::text[]) AS a(key)),
owing AS (
    SELECT substring(owed.key from '^sha256:([0-9a-f]+):') AS hash, count(*) AS copies
      FROM (SELECT b.key FROM qbridge.redis_outbox b
             WHERE b.queue = $1 AND NOT (b.token = ANY($8::uuid[]))
            UNION
            SELECT o.key FROM unnest($5::text[]) AS o(key)) owed
     WHERE owed.key LIKE 'sha256:%'
     GROUP BY 1)
SELECT r.key, r.class IN ('popped', 'hole') AS popped FROM ranked r
  LEFT JOIN listed l ON l.hash = r.hash
  LEFT JOIN owing w ON w.hash = r.hash
  LEFT JOIN accounted acc ON acc.key = r.key
 WHERE (r.due < $3 OR r.class = 'fresh')
   AND CASE r.class
         WHEN 'id' THEN acc.key IS NULL
                        AND NOT (r.key = ANY($5::text[]))
                        AND NOT EXISTS (SELECT 1 FROM qbridge.redis_outbox b
                                         WHERE b.queue = $1 AND b.key = r.key
                                           AND NOT (b.token = ANY($8::uuid[])))
         WHEN 'fresh' THEN r.newest > COALESCE(l.copies, 0) + COALESCE(w.copies, 0)
         ELSE acc.key IS NULL
       END
 ORDER BY r.due, r.key
"#;
