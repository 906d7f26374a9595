-- Positive evidence that Redis let go of a job scheduled while it owned the
-- route: the proxy saw Redis take the member out of a framework's schedule
-- or retry set (its reply named it) at a time the key was produced
-- Postgres-only, so the push that moves it on never reaches Redis. A re-push
-- of such a key runs live in Postgres (`ingest::promote`) instead of being
-- held; the row is used up by that promotion. Issue 14.
CREATE TABLE qbridge.redis_releases (
    queue       text        NOT NULL,
    key         text        NOT NULL,
    structure   text        NOT NULL,
    released_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key)
);
