-- The cutover's measurements: what the diff, its repair and the gates need.

-- The bytes of a mirror copy, kept beside its key until the Redis side
-- reports an outcome for it. If Redis loses the item (a restart without
-- persistence), `qbridge diff --repair` pushes these bytes back; once the
-- Redis side ran the job they are cleared, so the table does not hold every
-- payload for the whole dedup window.
ALTER TABLE qbridge.job_keys ADD COLUMN original bytea;
CREATE INDEX job_keys_unconfirmed_idx ON qbridge.job_keys (queue, seen_at)
    WHERE original IS NOT NULL;

-- Whatever reports a Redis-side outcome (qbridge's consumer, POST
-- /v1/outcomes, qbridge.report_outcome) confirms the Redis copy existed.
CREATE FUNCTION qbridge.confirm_redis_copies() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE qbridge.job_keys k SET original = NULL
      FROM (SELECT DISTINCT queue, key FROM new_rows WHERE side = 'redis') r
     WHERE k.queue = r.queue AND k.key = r.key AND k.original IS NOT NULL;
    RETURN NULL;
END $$;
CREATE TRIGGER outcomes_confirm_redis_copies
    AFTER INSERT ON qbridge.outcomes
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION qbridge.confirm_redis_copies();

-- `noise`: a second shadow call of the same job, sampled, so the diff can
-- tell a handler that answers differently every time (timestamps, random ids
-- not covered by the ignore rules) from a real difference between sides.
ALTER TABLE qbridge.outcomes DROP CONSTRAINT outcomes_mode_check;
ALTER TABLE qbridge.outcomes ADD CONSTRAINT outcomes_mode_check
    CHECK (mode IN ('live', 'shadow', 'noise'));
CREATE INDEX outcomes_side_time_idx ON qbridge.outcomes (queue, side, recorded_at);

-- The gradual flip: in postgres_only, this share of job keys (sticky by a
-- hash of the key) goes Postgres-only; the rest stay as in shadow. 100 in
-- every other phase.
ALTER TABLE qbridge.route_phases ADD COLUMN percent smallint NOT NULL DEFAULT 100
    CHECK (percent BETWEEN 0 AND 100);
ALTER TABLE qbridge.phase_audit ADD COLUMN percent smallint;
