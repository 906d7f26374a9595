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

-- Tenant fairness. A queue whose pools cap jobs per tenant has its JSON
-- pointer here; enqueue copies the tenant out of the payload into `tenant`
-- ('' when the payload has none), and the tenant claim walks this index one
-- tenant at a time, so a burst of one tenant cannot hide the others however
-- large it is. Queues without a setting leave `tenant` NULL and pay nothing.
CREATE TABLE qbridge.queue_settings (
    queue       text   PRIMARY KEY,
    tenant_path text[] NOT NULL
);
ALTER TABLE qbridge.jobs ADD COLUMN tenant text;
ALTER TABLE qbridge.jobs_dead ADD COLUMN tenant text;
CREATE INDEX jobs_claim_tenant_idx ON qbridge.jobs (queue, tenant, priority DESC, run_at, id)
    WHERE state = 'ready' AND tenant IS NOT NULL;
