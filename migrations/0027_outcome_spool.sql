-- One row naming this database's qbridge installation. Processes keep local
-- files that must reach this database (the Redis consumer's outcome spool)
-- in a folder named after it, so two databases' files on one host never mix
-- and a database recreated on the same address never takes an old one's.
CREATE TABLE qbridge.installation (
    id     uuid    PRIMARY KEY DEFAULT gen_random_uuid(),
    single boolean NOT NULL DEFAULT true UNIQUE CHECK (single)
);
INSERT INTO qbridge.installation DEFAULT VALUES;

-- An outcome the Redis consumer spooled carries the id of its spool record:
-- the writer and a replay of the spool may both insert it, and the unique
-- index makes the second a no-op. Rows without one (Postgres-side runs,
-- fleets' reports) are untouched: two reports of one key stay two rows,
-- which is how the diff sees a job that ran twice.
ALTER TABLE qbridge.outcomes ADD COLUMN spool_id uuid;
CREATE UNIQUE INDEX outcomes_spool_id_idx ON qbridge.outcomes (spool_id)
    WHERE spool_id IS NOT NULL;
