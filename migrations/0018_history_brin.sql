-- The console's chart of the last hour's completions per queue reads
-- qbridge.jobs_done by finished_at. History is appended in finished_at
-- order, so a BRIN index (a few pages per million rows, next to nothing per
-- insert) finds the last hour without scanning the day's partition.
CREATE INDEX jobs_done_finished_brin ON qbridge.jobs_done USING brin (finished_at);
