DROP INDEX IF EXISTS jobs_ordering_running_idx;
DROP INDEX IF EXISTS jobs_ordering_live_idx;
DROP INDEX IF EXISTS jobs_unique_key_idx;
DROP TABLE IF EXISTS job_edges;
ALTER TABLE jobs DROP COLUMN IF EXISTS notify_done, DROP COLUMN IF EXISTS has_dependents;
