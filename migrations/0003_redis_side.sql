-- The Redis side of a migration: live and mirror copies, the original bytes
-- of mirrored list items, the ledger of job keys per queue, occurrence numbers
-- for items that carry no id, the outbox of Redis pushes still owed, and the
-- outcomes both consumers report for the shadow comparison.

-- Which copy of a job this row is. `live` runs its handler for real;
-- `mirror` is the Postgres copy of a job whose live run happens on the Redis
-- side, and must never run live (DESIGN.md). Fixed at enqueue.
ALTER TABLE qbridge.jobs ADD COLUMN copy text NOT NULL DEFAULT 'live'
    CHECK (copy IN ('live', 'mirror'));
-- The list item exactly as it was pushed to Redis (NULL for jobs that never
-- came from or go to Redis), so a rollback can push it back byte for byte.
ALTER TABLE qbridge.jobs ADD COLUMN original bytea;
ALTER TABLE qbridge.jobs_dead ADD COLUMN copy text NOT NULL DEFAULT 'live';
ALTER TABLE qbridge.jobs_dead ADD COLUMN original bytea;

-- Every job key a route has enqueued, kept after the job itself is done, so
-- a re-push of the same key (a Sidekiq retry, a producer retry) is not a new
-- job even when its first copy has long left the hot table. Pruned after the
-- route's dedup window. `flagged` says why an item was stored raw.
CREATE TABLE qbridge.job_keys (
    queue     text        NOT NULL,
    key       text        NOT NULL,
    copy      text        NOT NULL CHECK (copy IN ('live', 'mirror')),
    via       text        NOT NULL,
    flagged   text,
    seen_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key)
);
CREATE INDEX job_keys_seen_idx ON qbridge.job_keys (queue, seen_at);
CREATE INDEX job_keys_flagged_idx ON qbridge.job_keys (queue) WHERE flagged IS NOT NULL;

-- Items with no id are keyed by content hash plus an occurrence number.
-- `side` keeps the pushes' count apart from the Redis consumer's count, so
-- the n-th push and the n-th pop of identical bytes get the same key.
CREATE TABLE qbridge.key_occurrences (
    queue text   NOT NULL,
    side  text   NOT NULL CHECK (side IN ('push', 'pop')),
    hash  text   NOT NULL,
    n     bigint NOT NULL,
    PRIMARY KEY (queue, side, hash)
);

-- Redis pushes owed by the producer API. Written in the caller's transaction
-- with the job, deleted once Redis took the item: a crash or a Redis outage
-- between commit and push leaves the row here for the repair loop.
CREATE TABLE qbridge.redis_outbox (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue      text        NOT NULL,
    key        text        NOT NULL,
    original   bytea       NOT NULL,
    attempts   integer     NOT NULL DEFAULT 0,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- What a handler did with a job, on either side. The diff joins these by
-- (queue, key). `digest` is a hex SHA-256 of the handler's response (or of
-- the detail text reported by an outside worker), never the response itself.
CREATE TABLE qbridge.outcomes (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text        NOT NULL,
    key         text        NOT NULL,
    side        text        NOT NULL CHECK (side IN ('redis', 'postgres')),
    mode        text        NOT NULL CHECK (mode IN ('live', 'shadow')),
    outcome     text        NOT NULL CHECK (outcome IN ('ok', 'failed', 'dead')),
    error_class text,
    digest      text,
    attempt     integer,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outcomes_key_idx ON qbridge.outcomes (queue, key);
CREATE INDEX outcomes_time_idx ON qbridge.outcomes (queue, recorded_at);

-- How a Sidekiq or Celery fleet qbridge does not run reports an outcome:
--   SELECT qbridge.report_outcome('emails', 'jid-123', 'ok', 'sent');
-- `detail` is digested, never stored, so it may hold a response body.
CREATE FUNCTION qbridge.report_outcome(p_queue text, p_key text, p_outcome text, p_detail text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint;
BEGIN
    IF p_outcome IS NULL OR p_outcome NOT IN ('ok', 'failed', 'dead') THEN
        RAISE EXCEPTION 'qbridge.report_outcome: outcome must be ok, failed or dead, got %', coalesce(p_outcome, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_queue IS NULL OR p_queue = '' OR p_key IS NULL OR p_key = '' THEN
        RAISE EXCEPTION 'qbridge.report_outcome: queue and key must be non-empty'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO qbridge.outcomes (queue, key, side, mode, outcome, error_class, digest)
    VALUES (p_queue, p_key, 'redis', 'live', p_outcome,
            CASE WHEN p_outcome = 'ok' THEN NULL ELSE 'reported' END,
            CASE WHEN p_detail IS NULL THEN NULL
                 ELSE encode(sha256(convert_to(p_detail, 'UTF8')), 'hex') END)
    RETURNING id INTO new_id;
    RETURN new_id;
END $$;
