-- qbridge queue core: the hot jobs table, the dead-letter table, day-partitioned
-- history, recurring schedules. Everything lives in schema `qbridge`.
CREATE SCHEMA IF NOT EXISTS qbridge;

-- Fencing tokens. A sequence never hands out the same value twice, so a lease
-- token can never go back to an old value, even across requeues and restarts.
CREATE SEQUENCE qbridge.lease_seq AS bigint;

CREATE TABLE qbridge.jobs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text        NOT NULL,
    kind         text,
    key          text,
    payload      jsonb       NOT NULL,
    priority     integer     NOT NULL DEFAULT 0,
    run_at       timestamptz NOT NULL DEFAULT now(),
    state        text        NOT NULL DEFAULT 'ready' CHECK (state IN ('ready', 'running')),
    attempts     integer     NOT NULL DEFAULT 0,
    max_attempts integer     NOT NULL DEFAULT 25 CHECK (max_attempts >= 1),
    lease        bigint      NOT NULL DEFAULT 0,
    locked_by    text,
    lease_until  timestamptz,
    last_error   text,
    lock_key     text,
    created_at   timestamptz NOT NULL DEFAULT now()
) WITH (
    -- Room on each page so heartbeats and retries stay HOT updates.
    fillfactor = 80,
    -- A queue table churns its whole content constantly: vacuum early and
    -- without throttling, or dead tuples pile up and claims slow down.
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- The claim index: only ready rows, in claim order. It stays as small as the
-- backlog, whatever the history. No bookkeeping column (lease, locked_by,
-- lease_until, attempts, last_error) is in any index, so heartbeats are HOT.
CREATE INDEX jobs_claim_idx ON qbridge.jobs (queue, priority DESC, run_at, id)
    WHERE state = 'ready';

-- Idempotency: every row here is in flight (done jobs leave the table), so a
-- key is unique among in-flight jobs of one queue.
CREATE UNIQUE INDEX jobs_key_idx ON qbridge.jobs (queue, key) WHERE key IS NOT NULL;

-- The way to running jobs without a scan of the hot table: the completer's,
-- heartbeat's and reaper's fenced statements all join through it (dropping it
-- made drains 15x slower). Heartbeats change no column it covers, so they stay HOT.
CREATE INDEX jobs_running_idx ON qbridge.jobs (id) WHERE state = 'running';

-- Wake-up hint, sent once per statement and queue, at commit (so a rolled-back
-- enqueue never wakes anybody). Jobs inserted by plain SQL wake workers too.
CREATE FUNCTION qbridge.notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('qbridge_jobs', q.queue)
       FROM (SELECT DISTINCT queue FROM new_jobs WHERE run_at <= now()) q;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_notify AFTER INSERT ON qbridge.jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION qbridge.notify_jobs();

-- Dead letters: out of the hot table so they cost claims nothing.
CREATE TABLE qbridge.jobs_dead (
    id           bigint      PRIMARY KEY,
    queue        text        NOT NULL,
    kind         text,
    key          text,
    payload      jsonb       NOT NULL,
    priority     integer     NOT NULL,
    attempts     integer     NOT NULL,
    max_attempts integer     NOT NULL,
    last_error   text,
    created_at   timestamptz NOT NULL,
    failed_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX jobs_dead_queue_idx ON qbridge.jobs_dead (queue, failed_at);
CREATE INDEX jobs_dead_failed_idx ON qbridge.jobs_dead (failed_at);

-- Completed-job history (optional, see [history] in the config). Range
-- partitioned by day: retention is DROP of a partition, never a mass DELETE.
CREATE TABLE qbridge.jobs_done (
    id          bigint      NOT NULL,
    queue       text        NOT NULL,
    kind        text,
    key         text,
    attempts    integer     NOT NULL,
    created_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (finished_at);
-- Safety net for a clock far off the pre-created days; maintenance warns when used.
CREATE TABLE qbridge.jobs_done_default PARTITION OF qbridge.jobs_done DEFAULT;

-- Recurring schedules: next_run_at is advanced under a row lock in the same
-- transaction that inserts the instance, so no failover can fire one twice.
CREATE TABLE qbridge.schedules (
    name        text        PRIMARY KEY,
    next_run_at timestamptz NOT NULL,
    last_run_at timestamptz,
    last_job_id bigint
);
