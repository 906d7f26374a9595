-- The hint trigger's WHEN, cheaper per row (issue 17, the enqueue's cost).
--
-- WHEN runs for every row an enqueue inserts. Since 0020 it called the
-- PL/pgSQL function qbridge.first_row_of_queue for each row, about 2 µs a
-- row, to let only a queue's first row of a transaction through. Now a
-- built-in comparison with the setting that function keeps answers for
-- every row after the first, and the function runs only when the queue
-- differs from the one remembered: once per transaction and queue for a
-- bulk enqueue (tests/it/wakeup.rs counts the calls). What passes the
-- filter is unchanged: the function still decides, and still remembers.
DROP TRIGGER jobs_hint_at_commit ON qbridge.jobs;

CREATE CONSTRAINT TRIGGER jobs_hint_at_commit AFTER INSERT ON qbridge.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.run_at <= now()
                       AND current_setting('qbridge.hinted_queue', true) IS DISTINCT FROM NEW.queue
                       AND qbridge.first_row_of_queue(NEW.queue))
    EXECUTE FUNCTION qbridge.hint_jobs_at_commit();
