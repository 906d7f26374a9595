-- Console sessions, kept where every qbridge process behind one address can
-- read them: a session opened through one process works through any other,
-- and a restart signs nobody out. Only the SHA-256 of a session id is
-- stored (the id itself is the cookie's secret); `csrf` is the token the
-- session's forms carry, useless without the cookie. A session ends
-- `IDLE` after `last_at` or `LIFETIME` after `started_at` (ui/session.rs),
-- and "sign out everywhere" deletes every row.
CREATE TABLE qbridge.console_sessions (
    id_hash    bytea       PRIMARY KEY,
    csrf       text        NOT NULL,
    who        text        NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    last_at    timestamptz NOT NULL DEFAULT now()
);
