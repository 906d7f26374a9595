-- Per-kind pools: a pool that claims only some kinds walks this index per
-- (queue, kind) instead of reading through other kinds' backlog. Only rows
-- with a kind pay for it.
CREATE INDEX jobs_claim_kind_idx ON qbridge.jobs (queue, kind, priority DESC, run_at, id)
    WHERE state = 'ready' AND kind IS NOT NULL;

-- A dead-lettered job keeps its lock key, so a requeued job is still
-- serialized with the other jobs of that key.
ALTER TABLE qbridge.jobs_dead ADD COLUMN lock_key text;

-- Requeue checks keys against the hot table and picks one dead row per key.
CREATE INDEX jobs_dead_key_idx ON qbridge.jobs_dead (queue, key) WHERE key IS NOT NULL;
