-- The SQL floor's table: the least a Postgres queue needs (identity key, the
-- claim-ordered partial index, room for HOT updates). Lives in its own schema
-- so it never touches qbridge's tables.
DROP SCHEMA IF EXISTS qbridge_floor CASCADE;
CREATE SCHEMA qbridge_floor;
CREATE TABLE qbridge_floor.jobs (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue      text        NOT NULL DEFAULT 'default',
    payload    jsonb       NOT NULL DEFAULT '{}',
    state      text        NOT NULL DEFAULT 'ready',
    priority   int         NOT NULL DEFAULT 0,
    run_at     timestamptz NOT NULL DEFAULT now(),
    locked_by  text,
    attempts   int         NOT NULL DEFAULT 0
) WITH (fillfactor = 80);
CREATE INDEX ON qbridge_floor.jobs (queue, priority DESC, run_at, id) WHERE state = 'ready';
