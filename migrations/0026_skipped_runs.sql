-- A fleet (or qbridge's own Redis consumer) that fetches a job whose key
-- Postgres already owns live does not run it: it is a re-push of a job
-- Postgres ran or will run (a producer's retry after a rollback or a
-- lowered share). The skip is recorded here, not in qbridge.outcomes: it is
-- not a run, and every rule that reads the Redis side's last outcome (held
-- re-pushes, promotion, repair) must keep seeing the runs alone. The diff
-- counts these rows as re-pushes skipped.
CREATE TABLE qbridge.skipped_runs (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text        NOT NULL,
    key         text        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX skipped_runs_time_idx ON qbridge.skipped_runs (queue, recorded_at);

-- report_outcome takes `skipped` too. CREATE OR REPLACE resets a function's
-- attributes, so it is stated again that it runs as its owner with a fixed
-- search_path; who may execute it (granted or revoked before) is kept.
CREATE OR REPLACE FUNCTION qbridge.report_outcome(p_queue text, p_key text, p_outcome text, p_detail text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = qbridge, pg_temp AS $$
DECLARE
    new_id bigint;
BEGIN
    IF p_outcome IS NULL OR p_outcome NOT IN ('ok', 'failed', 'dead', 'skipped') THEN
        RAISE EXCEPTION 'qbridge.report_outcome: outcome must be ok, failed, dead or skipped, got %', coalesce(p_outcome, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_queue IS NULL OR p_queue = '' OR p_key IS NULL OR p_key = '' THEN
        RAISE EXCEPTION 'qbridge.report_outcome: queue and key must be non-empty'
            USING ERRCODE = '22023';
    END IF;
    IF p_outcome = 'skipped' THEN
        INSERT INTO qbridge.skipped_runs (queue, key) VALUES (p_queue, p_key)
        RETURNING id INTO new_id;
        RETURN new_id;
    END IF;
    INSERT INTO qbridge.outcomes (queue, key, side, mode, outcome, error_class, digest)
    VALUES (p_queue, p_key, 'redis', 'live', p_outcome,
            CASE WHEN p_outcome = 'ok' THEN NULL ELSE 'reported' END,
            CASE WHEN p_detail IS NULL THEN NULL
                 ELSE encode(sha256(convert_to(p_detail, 'UTF8')), 'hex') END)
    RETURNING id INTO new_id;
    RETURN new_id;
END $$;
