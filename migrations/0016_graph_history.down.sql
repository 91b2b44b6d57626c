-- Back to the indexes of job_history before this migration.
CREATE INDEX job_history_ordering_key_idx ON job_history (ordering_key) WHERE ordering_key IS NOT NULL;
DROP INDEX job_history_ordering_key_id_idx;
DROP INDEX job_history_cancelled_by_idx;
DROP INDEX job_history_prereqs_idx;
