-- A claim's candidates from where the previous claim found the head of the
-- queue, not from the start of the claim index (issue 17). Claimed rows
-- leave their entries at the start of `jobs_claim_idx` until vacuum removes
-- them; every walk from the start steps over all of them, and that walk was
-- most of the steady state's claim cost (`_bt_first` 31% of Postgres's
-- samples; 19-25 index and heap pages read per claimed job).
--
-- Three walks, in claim order, each from its own start in the index:
-- priorities above the head's (from their start: rare, and kept exact), the
-- head's priority from `p_from` on, and the priorities below. The outer
-- LIMIT stops pulling rows, and so stops locking them, once it has enough:
-- a later walk runs only when the earlier ones came up short.
--
-- Rows of the head's priority due before `p_from` are not seen here: a job
-- handed back with its old run_at, or an enqueue that committed long after
-- its run_at was taken. The caller passes the head's run_at less a margin
-- for slow commits, and walks the whole index again every few hundred
-- milliseconds (`queue::claim_head`), which finds them.
CREATE FUNCTION qbridge.ready_ids_from(p_queue text, p_limit bigint, p_priority integer,
                                       p_from timestamptz)
RETURNS TABLE (id bigint, priority integer, run_at timestamptz)
LANGUAGE sql
SET enable_indexscan = on SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off
AS $$
    SELECT * FROM (
        SELECT j.id, j.priority, j.run_at FROM qbridge.jobs j
         WHERE j.state = 'ready' AND j.queue = p_queue AND j.priority > p_priority
           AND j.run_at <= now()
         ORDER BY j.priority DESC, j.run_at, j.id
         LIMIT p_limit
         FOR NO KEY UPDATE SKIP LOCKED) above
    UNION ALL
    SELECT * FROM (
        SELECT j.id, j.priority, j.run_at FROM qbridge.jobs j
         WHERE j.state = 'ready' AND j.queue = p_queue AND j.priority = p_priority
           AND j.run_at >= p_from AND j.run_at <= now()
         ORDER BY j.priority DESC, j.run_at, j.id
         LIMIT p_limit
         FOR NO KEY UPDATE SKIP LOCKED) at_head
    UNION ALL
    SELECT * FROM (
        SELECT j.id, j.priority, j.run_at FROM qbridge.jobs j
         WHERE j.state = 'ready' AND j.queue = p_queue AND j.priority < p_priority
           AND j.run_at <= now()
         ORDER BY j.priority DESC, j.run_at, j.id
         LIMIT p_limit
         FOR NO KEY UPDATE SKIP LOCKED) below
    LIMIT p_limit
$$;
