-- Coalesced wake-ups (issue 17, the steady state).
--
-- A transaction that calls pg_notify holds one cluster-wide lock from its
-- pre-commit through its commit record's flush, so every enqueue that woke
-- workers committed alone: no group commit, and at full speed enqueues
-- queued on that lock (pg_stat_activity: Lock:object) while the workers had
-- jobs in hand anyway.
--
-- Now the hint is decided at commit, once per transaction and queue, and
-- only by one committer at a time per queue: a transaction that finds
-- another one of the same queue in its commit (the per-queue advisory lock
-- taken) leaves the wake-up to it and commits without touching the notify
-- lock. That committer's hint arrives while this commit finishes its flush,
-- so a pool woken by a hint claims once more shortly after an empty claim
-- (worker::pool, FOLLOW_UP) to take what such a neighbour committed; the
-- poll interval stays the backstop. An idle queue's enqueue never meets a
-- neighbour and wakes workers exactly as before.
--
-- Decided at commit (a deferred constraint trigger), not at insert: a long
-- transaction holding the lock from its first insert would silence every
-- other producer of its queue until it commits. Two cases still cost a
-- neighbour's job up to one poll interval (never the job): the hinting
-- transaction fails at commit after deciding (a later deferred constraint,
-- a serialization failure), or a session runs SET CONSTRAINTS ALL IMMEDIATE
-- and then keeps its transaction open.
CREATE FUNCTION qbridge.hint_jobs_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A batch of rows for one queue: the first row decides, the rest return.
    IF current_setting('qbridge.hinted_queue', true) = NEW.queue THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('qbridge.hinted_queue', NEW.queue, true);
    IF pg_try_advisory_xact_lock(hashtextextended('qbridge:hint:' || NEW.queue, 7484)) THEN
        PERFORM qbridge.hint('qbridge_jobs', NEW.queue);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER jobs_notify ON qbridge.jobs;
DROP FUNCTION qbridge.notify_jobs();

-- WHEN is evaluated at insert (only deferred triggers' bodies wait for
-- commit): a job scheduled for later wakes nobody, as before.
CREATE CONSTRAINT TRIGGER jobs_hint_at_commit AFTER INSERT ON qbridge.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.run_at <= now())
    EXECUTE FUNCTION qbridge.hint_jobs_at_commit();
