-- When a job scheduled for later is due (a Sidekiq schedule/retry member's
-- score, a Celery task's eta); NULL for a job due at its push. The diff's
-- push-to-outcome lag counts from the later of push and due time, so a
-- `perform_in` job in the window does not fail the shadow gate's
-- max_postgres_lag. Issue 14.
ALTER TABLE qbridge.job_keys ADD COLUMN due_at timestamptz;
