-- pgbench transaction of the SQL floor: insert :B jobs, claim :B with SKIP
-- LOCKED, delete the claimed ones. Three autocommit statements, like a queue
-- that enqueues, claims and completes in separate round trips.
INSERT INTO qbridge_floor.jobs (payload) SELECT jsonb_build_object('i', g) FROM generate_series(1, :B) g;
WITH picked AS (
    SELECT id FROM qbridge_floor.jobs
     WHERE queue = 'default' AND state = 'ready' AND run_at <= now()
     ORDER BY priority DESC, run_at, id
     LIMIT :B
     FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE qbridge_floor.jobs j SET state = 'running', locked_by = 'floor', attempts = j.attempts + 1
      FROM picked WHERE j.id = picked.id
    RETURNING j.id
)
SELECT coalesce(array_agg(id), '{}') AS ids FROM claimed
\gset
DELETE FROM qbridge_floor.jobs WHERE id = ANY (:ids::bigint[]);
