-- Fault tolerance (issue 6).
--
-- 1. Wake-ups that cannot fail a transaction. Postgres has one NOTIFY queue
--    per cluster (8 GB in 15). A listener stuck in an open transaction pins
--    it, and once it is full every transaction that calls pg_notify fails at
--    COMMIT: enqueues, completions, phase changes. Every qbridge wake-up is a
--    hint backed by polling, so past half full the hint is skipped instead.
--    The setting qbridge.notify_max_usage moves the threshold (the fault
--    suite lowers it to reach it without writing gigabytes).
CREATE FUNCTION qbridge.hint(p_channel text, p_payload text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_notification_queue_usage()
       < coalesce(nullif(current_setting('qbridge.notify_max_usage', true), '')::float8, 0.5) THEN
        PERFORM pg_notify(p_channel, p_payload);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION qbridge.notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM qbridge.hint('qbridge_jobs', q.queue)
       FROM (SELECT DISTINCT queue FROM new_jobs WHERE run_at <= now()) q;
    RETURN NULL;
END $$;

-- 2. The lease a completion was applied under, kept in the history, so the
--    fault suite (and an operator) can check that no stale attempt's result
--    was ever accepted: it must be the newest lease the job was handed.
ALTER TABLE qbridge.jobs_done ADD COLUMN lease bigint;

-- 3. A mirror copy keeps its bytes until the Redis side reports a *final*
--    outcome (ok or dead). A failed attempt is retried in place from a
--    processing list, and a Redis restart then loses the item: the fault
--    suite caught repair unable to push such jobs back, because the first
--    failure had already cleared their bytes.
CREATE OR REPLACE FUNCTION qbridge.confirm_redis_copies() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE qbridge.job_keys k SET original = NULL
      FROM (SELECT DISTINCT queue, key FROM new_rows
             WHERE side = 'redis' AND outcome IN ('ok', 'dead')) r
     WHERE k.queue = r.queue AND k.key = r.key AND k.original IS NOT NULL;
    RETURN NULL;
END $$;
