-- Which phase change every process that routes a route's pushes has
-- followed (model/following.rs). A process may still be writing a push it
-- routed under the old phase (a mirror copy being committed) when another
-- process routes a re-push of the same job under the new one; judged
-- against what Postgres holds then, the re-push was taken for a new job
-- and both sides ran it. So every change of a route's phase or share gets
-- a revision, every process running the proxy records the revision it
-- follows once the pushes it routed before are written, and a push is
-- routed only once every live one follows the revision its process holds.

ALTER TABLE qbridge.route_phases ADD COLUMN revision bigint NOT NULL DEFAULT 1;

CREATE FUNCTION qbridge.next_phase_revision() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.phase IS DISTINCT FROM OLD.phase OR NEW.percent IS DISTINCT FROM OLD.percent THEN
        NEW.revision := OLD.revision + 1;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER route_phases_revision BEFORE UPDATE ON qbridge.route_phases
    FOR EACH ROW EXECUTE FUNCTION qbridge.next_phase_revision();

-- One row per (process, route): the revision the process follows, and when
-- it last said so (a process silent for longer than the expiry in
-- cutover/follow.rs is taken for gone: a crash must not hold every push).
CREATE TABLE qbridge.phase_followers (
    process  uuid        NOT NULL,
    route    text        NOT NULL,
    followed bigint      NOT NULL,
    beat     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (process, route)
);
