-- Job graph and control: dependencies, per-key ordering, unique jobs,
-- cancellation and waiting.

-- has_dependents: some job_edges row names this job as prerequisite. Set
-- under the prerequisite's row lock when a dependent is enqueued; a finish
-- of such a job runs in a transaction that releases its dependents.
-- notify_done: someone is waiting (Queue.Wait) for this job to finish.
ALTER TABLE jobs
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,
    ADD COLUMN notify_done    boolean NOT NULL DEFAULT false;

-- An edge is consumed (deleted) when its prerequisite reaches a terminal
-- state, so this table only holds pending edges.
CREATE TABLE job_edges (
    prereq uuid NOT NULL,
    job    uuid NOT NULL,
    kind   text NOT NULL CHECK (kind IN ('depends', 'order')),
    PRIMARY KEY (prereq, job)
);
CREATE INDEX job_edges_job_idx ON job_edges (job);

-- At most one live job per unique key.
CREATE UNIQUE INDEX jobs_unique_key_idx ON jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('blocked', 'available', 'running');

-- Live jobs of an ordering key, to find the tail of its chain.
CREATE INDEX jobs_ordering_live_idx ON jobs (ordering_key)
    WHERE ordering_key IS NOT NULL AND state IN ('blocked', 'available', 'running');

-- Safety net under the edges: never two running jobs of one ordering key.
CREATE UNIQUE INDEX jobs_ordering_running_idx ON jobs (ordering_key)
    WHERE ordering_key IS NOT NULL AND state = 'running';
