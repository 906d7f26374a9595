-- When Redis took a mirrored push (the proxy: Redis's reply; NULL: the same
-- moment as seen_at, which is when Postgres stored the copy). The mirror
-- writer can store a copy seconds after Redis took it (a backlog, a batch it
-- kept through a Postgres outage); evidence that Redis lost data "after the
-- push" is judged against this time, not against the write (issue 13).
ALTER TABLE qbridge.job_keys ADD COLUMN pushed_at timestamptz;
