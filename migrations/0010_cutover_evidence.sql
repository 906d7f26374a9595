-- Cutover evidence (issue 13): qbridge acts on a job across the two sides
-- (runs a re-push live, pushes a mirror copy back to Redis) only on positive
-- evidence that the other side let go of it, and keeps what it holds back.

-- 1. Only a live copy holds a job key among in-flight jobs. A mirror copy is
--    deduplicated by qbridge.job_keys when it is stored; in the hot table it
--    must never stop the live job of its key from being enqueued (a retry of
--    a dead Redis job arriving while the mirror copy is being drained was
--    dropped as a duplicate of that mirror row, and no live job existed).
DROP INDEX qbridge.jobs_key_idx;
CREATE UNIQUE INDEX jobs_key_idx ON qbridge.jobs (queue, key)
    WHERE key IS NOT NULL AND copy = 'live';

-- 2. Re-pushes held back. After the flip a re-push of a key whose original
--    was mirrored runs live in Postgres only when the Redis side reported
--    the original dead (or, for an outside fleet, the failed attempt that
--    the re-push retries). Without that evidence the original may still be
--    waiting, running or owed on the Redis side, so the re-push is kept here
--    instead of running twice: counted, shown by the diff, released live
--    when the evidence arrives (or by an operator's audited decision), or
--    resolved as a duplicate when the Redis side reports the original ok.
CREATE TABLE qbridge.held_repushes (
    queue        text        NOT NULL,
    key          text        NOT NULL,
    -- The latest re-push as it came in (a framework retry carries its
    -- retry count and error): what runs if it is released.
    original     bytea       NOT NULL,
    payload      jsonb       NOT NULL,
    kind         text,
    max_attempts integer,
    via          text        NOT NULL,
    -- The route's Redis side is an outside fleet: its failed report means
    -- the attempt ended and the re-push is the retry.
    fleet        boolean     NOT NULL,
    reason       text        NOT NULL,
    pushes       integer     NOT NULL DEFAULT 1,
    held_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key)
);

-- Promotion asks whether the outbox still owes a key's push; the outbox is
-- short unless Redis is down, which is exactly when it must stay cheap.
CREATE INDEX redis_outbox_key_idx ON qbridge.redis_outbox (queue, key);

-- 3. What Redis a route talked to, by epoch: the server's run_id and a
--    marker key qbridge keeps in the route's database. A new run_id (a
--    restart or a failover) or a missing marker (a flush, a restart without
--    persistence) after an item was pushed is the evidence that Redis may
--    have lost it. Observed by every process with a Redis side, the diff and
--    repair.
--    `started_at` is a lower bound of when that server started (its clock
--    minus its uptime, less a second for the uptime's rounding): an item
--    mirrored before it was pushed to an earlier server.
CREATE TABLE qbridge.redis_epochs (
    route      text        NOT NULL,
    run_id     text        NOT NULL,
    marker     text        NOT NULL,
    started_at timestamptz NOT NULL,
    first_seen timestamptz NOT NULL DEFAULT now(),
    last_seen  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (route, run_id, marker)
);

-- 4. Operators' decisions that a job is lost (`qbridge diff --repair
--    --assume-lost`): who, when, why, and what it released.
CREATE TABLE qbridge.repair_audit (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    route       text        NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    by          text        NOT NULL,
    reason      text        NOT NULL,
    keys        text[],
    before      timestamptz,
    pushed_back integer     NOT NULL,
    released    integer     NOT NULL
);
