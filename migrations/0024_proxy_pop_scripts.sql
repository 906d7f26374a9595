-- Lua scripts a proxy saw loaded (SCRIPT LOAD or EVAL) that take members out
-- of a framework's schedule or retry set (they call ZREM): their SHA-1s,
-- so every proxy recognises an EVALSHA of one — also a proxy started after
-- the script was loaded, or one the client reached after another (a
-- framework's poller loads its script once per process and then sends only
-- EVALSHA). Only the digest is kept, never the script.
CREATE TABLE qbridge.proxy_pop_scripts (
    sha        text PRIMARY KEY CHECK (sha ~ '^[0-9a-f]{40}$'),
    learned_at timestamptz NOT NULL DEFAULT now()
);
