-- Least-privilege roles for qbridge. Run once per database, as a superuser
-- (or a role with CREATEROLE that owns the database), BEFORE the first
-- `qbridge migrate`:
--
--   psql "postgres://admin@db/app" -f sql/roles.sql
--   psql "postgres://admin@db/app" -c "ALTER ROLE qbridge_migrator PASSWORD '…'"
--   psql "postgres://admin@db/app" -c "ALTER ROLE qbridge_runtime PASSWORD '…'"
--
-- qbridge_migrator owns schema `qbridge` and everything in it; only
-- `qbridge migrate` uses it. qbridge_runtime is what every other command
-- (`run`, `proxy`, `enqueue`, `stats`, `dlq`, `cutover`, `diff`) connects as:
-- it reads and writes rows, uses the sequences, LISTENs and NOTIFYs, takes
-- advisory locks — and can create, alter or drop nothing.
--
-- Both roles get search_path = qbridge, so sqlx's bookkeeping table
-- `_sqlx_migrations` lives in schema qbridge too (not in public, where
-- PostgreSQL 15 lets no one but the owner create tables).
--
-- One exception: `[history] retention_days > 0` makes `qbridge run` create
-- and drop day partitions of qbridge.jobs_done, which needs ownership of that
-- table. With history on, also run (after `qbridge migrate`):
--   ALTER TABLE qbridge.jobs_done OWNER TO qbridge_runtime;
--   GRANT CREATE ON SCHEMA qbridge TO qbridge_runtime;

CREATE ROLE qbridge_migrator LOGIN;
CREATE ROLE qbridge_runtime LOGIN;
-- qbridge_reporter is what a fleet's SQL reporting connects as
-- (QBRIDGE_OUTCOMES=postgres://qbridge_reporter@…): it may call
-- qbridge.report_outcome, which records an outcome with its owner's rights,
-- and holds no privilege on any table. Give it a password like the others.
CREATE ROLE qbridge_reporter LOGIN;

CREATE SCHEMA IF NOT EXISTS qbridge AUTHORIZATION qbridge_migrator;
-- The first migration says CREATE SCHEMA IF NOT EXISTS, which PostgreSQL
-- checks against the database's CREATE privilege even when the schema exists.
DO $$ BEGIN
    EXECUTE format('GRANT CREATE ON DATABASE %I TO qbridge_migrator', current_database());
END $$;
ALTER ROLE qbridge_migrator SET search_path = qbridge;
ALTER ROLE qbridge_runtime SET search_path = qbridge;
ALTER ROLE qbridge_reporter SET search_path = qbridge;

GRANT USAGE ON SCHEMA qbridge TO qbridge_runtime;
-- Whatever the migrator creates from now on is usable, not ownable, by the runtime.
ALTER DEFAULT PRIVILEGES FOR ROLE qbridge_migrator IN SCHEMA qbridge
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO qbridge_runtime;
ALTER DEFAULT PRIVILEGES FOR ROLE qbridge_migrator IN SCHEMA qbridge
    GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO qbridge_runtime;
ALTER DEFAULT PRIVILEGES FOR ROLE qbridge_migrator IN SCHEMA qbridge
    GRANT EXECUTE ON FUNCTIONS TO qbridge_runtime;
-- The reporter sees the schema and may execute its functions; without a
-- table privilege only qbridge.report_outcome (a definer function) does
-- anything for it.
GRANT USAGE ON SCHEMA qbridge TO qbridge_reporter;
ALTER DEFAULT PRIVILEGES FOR ROLE qbridge_migrator IN SCHEMA qbridge
    GRANT EXECUTE ON FUNCTIONS TO qbridge_reporter;
