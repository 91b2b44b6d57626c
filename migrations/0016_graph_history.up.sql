-- The graph of finished jobs (Queue.Graph). An edge of job_edges is
-- consumed when its prerequisite ends; what is kept of it is found from
-- the other side through these indexes of job_history, each paid for only
-- by the finished jobs it holds. (Built in the migration's transaction:
-- finishes that move jobs into job_history wait until it commits: 3.7 s
-- with 1,000,000 finished jobs, TestMeasureGraph.)
--
-- A dependency that completed is in the dependent's prereqs (0012): the
-- finished dependents of a job, as jobs_prereqs_idx finds the live ones.
CREATE INDEX job_history_prereqs_idx ON job_history USING gin (prereqs) WHERE prereqs IS NOT NULL;
-- A dependency that failed or was cancelled cancels its dependent with the
-- reason 'cancelled: prerequisite <id> <state>' (the release, and the
-- enqueue of a job whose prerequisite had already ended): the dependents
-- a job cancelled, by the ID in that reason. Text, not uuid: no reason
-- can make the expression fail a finish.
CREATE INDEX job_history_cancelled_by_idx ON job_history ((substr(last_error, 25, 36)))
    WHERE state = 'cancelled' AND last_error LIKE 'cancelled: prerequisite %';
-- The jobs before and after one in its ordering key (enqueue order is ID
-- order): one descent, where the index on ordering_key alone read every
-- finished job of the key. It serves the listing by key as well.
CREATE INDEX job_history_ordering_key_id_idx ON job_history (ordering_key, id) WHERE ordering_key IS NOT NULL;
DROP INDEX job_history_ordering_key_idx;
