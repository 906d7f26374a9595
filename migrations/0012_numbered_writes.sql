-- Content-hash keys that cannot drift (issue 13, class 2).
--
-- `live` counts live copies of some bytes stored while Postgres runs the
-- route: they never reach Redis, so they must not take the numbers the Redis
-- consumer counts its pops by (`push`/`pop`). Their keys are `sha256:<hex>:pg<n>`.
ALTER TABLE qbridge.key_occurrences DROP CONSTRAINT key_occurrences_side_check;
ALTER TABLE qbridge.key_occurrences
    ADD CONSTRAINT key_occurrences_side_check CHECK (side IN ('push', 'pop', 'live'));

-- One row per numbered write: a mirrored push (its write id travels with the
-- item into the gap list) or a pop (its id is kept in the consumer's inflight
-- hash). Writing or numbering the same write again finds its key here instead
-- of taking a new number: numbering is idempotent per write, not per attempt.
-- Pruned with job_keys, after the route's dedup window.
CREATE TABLE qbridge.numbered_writes (
    write_id text        PRIMARY KEY,
    queue    text        NOT NULL,
    key      text        NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX numbered_writes_at_idx ON qbridge.numbered_writes (queue, at);

-- Numbers the Redis consumer must give out again: a mirror copy pushed back
-- to Redis by repair (Redis lost it) whose number the pop count had already
-- passed (it was popped, then lost with a restart). The next pop of its bytes
-- takes the lowest such number before counting on, so a push-back does not
-- put the pop count one ahead of the pushes for good.
CREATE TABLE qbridge.pop_holes (
    queue text   NOT NULL,
    hash  text   NOT NULL,
    n     bigint NOT NULL,
    PRIMARY KEY (queue, hash, n)
);
