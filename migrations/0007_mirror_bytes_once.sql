-- A mirror copy's bytes are kept once, in job_keys.original (its jobs row is
-- drained within moments and no longer carries them). The partial index on
-- unconfirmed keys cost every mirror write an index insert; the diff finds
-- them through job_keys_seen_idx (queue, seen_at) instead.
DROP INDEX qbridge.job_keys_unconfirmed_idx;
