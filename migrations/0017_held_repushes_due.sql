-- A held re-push keeps what running it later needs from its framework: when
-- it is due (a Celery retry's eta) and the attempts the Redis side already
-- used (Celery's retries, Sidekiq's retry_count), so a release runs it at
-- its time and the route's max_attempts bounds the whole job. Issue 14.
ALTER TABLE qbridge.held_repushes ADD COLUMN run_at timestamptz;
ALTER TABLE qbridge.held_repushes ADD COLUMN attempts integer;
