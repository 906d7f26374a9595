-- The phase flag of each route (DESIGN.md), changed only by compare-and-swap,
-- and the audit log of every change with the gate numbers of the moment.
CREATE TABLE qbridge.route_phases (
    route      text        PRIMARY KEY,
    phase      text        NOT NULL
               CHECK (phase IN ('redis_only', 'dual_write', 'shadow', 'postgres_only', 'decommissioned')),
    since      timestamptz NOT NULL DEFAULT now(),
    changed_by text        NOT NULL,
    reason     text        NOT NULL
);

CREATE TABLE qbridge.phase_audit (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    route      text        NOT NULL,
    from_phase text,
    to_phase   text        NOT NULL,
    changed_by text        NOT NULL,
    reason     text        NOT NULL,
    forced     boolean     NOT NULL DEFAULT false,
    gates      jsonb,
    changed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX phase_audit_route_idx ON qbridge.phase_audit (route, changed_at);
