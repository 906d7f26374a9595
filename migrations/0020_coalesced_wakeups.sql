-- Coalesced wake-ups (issue 17, the steady state).
--
-- A transaction that calls pg_notify holds one cluster-wide lock from its
-- pre-commit through its commit record's flush, so every enqueue that woke
-- workers committed alone: no group commit, and at full speed enqueues
-- queued on that lock (pg_stat_activity: Lock:object) while the workers had
-- jobs in hand anyway.
--
-- Now the hint is decided in the commit's deferred-trigger step, once per
-- transaction and queue, and only by one committer at a time per queue: a
-- transaction that finds another one of the same queue in its commit (the
-- per-queue advisory lock taken) leaves the wake-up to it and commits
-- without touching the notify lock. That committer's hint arrives while
-- this commit finishes its flush, so a pool woken by a hint claims again
-- shortly after an empty claim (worker::follow_up::FOLLOW_UPS, until about
-- 250 ms) to take what such a neighbour committed; the poll interval stays
-- the backstop. An idle queue's enqueue never meets a neighbour and wakes
-- workers exactly as before.
--
-- One deferred event per transaction and queue, not per row: the WHEN
-- clause (evaluated at insert) lets only a queue's first row of a
-- transaction through, so a 100,000-row enqueue does not hold the queue's
-- lock while 99,999 more trigger calls run at its commit.
--
-- Decided at commit, not at insert: a long transaction holding the lock
-- from its first insert would silence every other producer of its queue
-- until it commits. What still costs a neighbour's job up to one poll
-- interval (never the job): the hinting transaction failing at commit
-- after deciding (a later deferred constraint, a serialization failure), or
-- taking longer than the follow-ups from its decision to its commit's end
-- (deferred constraints queued after its jobs, a WAL flush stalled past
-- 250 ms), or a session that runs SET CONSTRAINTS ALL IMMEDIATE and keeps
-- its transaction open. Two-phase commit: PREPARE TRANSACTION is refused
-- after a NOTIFY, as before, but now only for the committer that hints, so
-- producers must not prepare transactions that enqueue. One advisory lock
-- per queue is taken at commit: a transaction enqueueing into thousands of
-- queues needs max_locks_per_transaction to match.

-- True for the first row of `p_queue` in a run of rows of one queue within
-- this transaction (rows of a rolled-back savepoint take their setting with
-- them).
CREATE FUNCTION qbridge.first_row_of_queue(p_queue text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('qbridge.hinted_queue', true) = p_queue THEN
        RETURN false;
    END IF;
    PERFORM set_config('qbridge.hinted_queue', p_queue, true);
    RETURN true;
END $$;

CREATE FUNCTION qbridge.hint_jobs_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_try_advisory_xact_lock(hashtextextended('qbridge:hint:' || NEW.queue, 7484)) THEN
        PERFORM qbridge.hint('qbridge_jobs', NEW.queue);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER jobs_notify ON qbridge.jobs;
DROP FUNCTION qbridge.notify_jobs();

-- WHEN is evaluated at insert (only a deferred trigger's body waits for
-- commit): a job scheduled for later wakes nobody, as before.
CREATE CONSTRAINT TRIGGER jobs_hint_at_commit AFTER INSERT ON qbridge.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.run_at <= now() AND qbridge.first_row_of_queue(NEW.queue))
    EXECUTE FUNCTION qbridge.hint_jobs_at_commit();
