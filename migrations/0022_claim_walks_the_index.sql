-- A claim's candidates, found only by the ordered walk of a claim index.
-- Every other plan (a bitmap or sequential scan of all ready rows, then a
-- sort) reads the whole backlog on every claim. Statistics sampled while a
-- queue held about a hundred ready rows made such a plan look as cheap to
-- the planner: auto_explain caught every claim of a stalled `bench steady`
-- run planned that way, 300 ms a claim, and the backlog kept growing
-- (issue 17; tests/it/claim_plans.rs). The functions' SET clauses switch
-- the other plans off while their own query is planned, and for nothing
-- else on the connection.

-- One queue, in claim order.
CREATE FUNCTION qbridge.ready_ids(p_queue text, p_limit bigint)
RETURNS TABLE (id bigint, priority integer, run_at timestamptz)
LANGUAGE sql
SET enable_indexscan = on SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off
AS $$
    SELECT j.id, j.priority, j.run_at FROM qbridge.jobs j
     WHERE j.state = 'ready' AND j.queue = p_queue AND j.run_at <= now()
     ORDER BY j.priority DESC, j.run_at, j.id
     LIMIT p_limit
     FOR NO KEY UPDATE SKIP LOCKED
$$;

-- One kind of one queue, in claim order (`jobs_claim_kind_idx`).
CREATE FUNCTION qbridge.ready_ids_of_kind(p_queue text, p_kind text, p_limit bigint)
RETURNS TABLE (id bigint, priority integer, run_at timestamptz)
LANGUAGE sql
SET enable_indexscan = on SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off
AS $$
    SELECT j.id, j.priority, j.run_at FROM qbridge.jobs j
     WHERE j.state = 'ready' AND j.kind IS NOT NULL AND j.queue = p_queue
       AND j.kind = p_kind AND j.run_at <= now()
     ORDER BY j.priority DESC, j.run_at, j.id
     LIMIT p_limit
     FOR NO KEY UPDATE SKIP LOCKED
$$;
