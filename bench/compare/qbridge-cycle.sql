-- pgbench transaction with qbridge's own statements on qbridge's own table:
-- the enqueue trigger and indexes, the claim as `queue::claim` writes it
-- (candidates from qbridge.ready_ids, the ordered walk only; fresh lease, bookkeeping
-- columns, candidates reached by id) and the fenced completion as
-- `queue::fence::complete` writes it. Payloads are built by the server, as
-- in floor.sql, so this row is the SQL's cost alone: the gap between it and
-- the floor is what the schema and statements cost, the gap between it and
-- `bench steady` is what the qbridge process (and its round trips) costs.
INSERT INTO qbridge.jobs (queue, payload) SELECT 'cycle', jsonb_build_object('i', g) FROM generate_series(1, :B) g;
WITH cand AS (
    SELECT id FROM qbridge.ready_ids('cycle', :B)
),
claimed AS (
    UPDATE qbridge.jobs j
       SET state = 'running', attempts = j.attempts + 1,
           lease = (SELECT nextval('qbridge.lease_seq')),
           locked_by = 'cycle', lease_until = now() + 60000 * interval '1 millisecond'
     WHERE j.id = ANY (ARRAY(SELECT id FROM cand))
    RETURNING j.id, j.queue, j.kind, j.key, j.payload, j.priority, j.attempts, j.max_attempts,
              j.lease, j.run_at, j.created_at, j.lock_key, j.tenant, j.copy
)
SELECT coalesce(array_agg(id), '{}') AS ids,
       coalesce(jsonb_object_agg(id::text, lease), '{}')::text AS leases,
       count(payload) AS n FROM claimed
\gset
DELETE FROM qbridge.jobs j
 WHERE j.id = ANY(:ids::int8[]) AND j.state = 'running'
   AND j.lease = (:leases::jsonb ->> j.id::text)::int8;
