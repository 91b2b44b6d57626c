-- A job may both depend on its ordering-key predecessor (DependsOn) and
-- follow it in the key's chain: one edge of each kind, each counted in
-- blocked_by and consumed when the predecessor ends.
ALTER TABLE job_edges DROP CONSTRAINT job_edges_pkey, ADD PRIMARY KEY (prereq, job, kind);

-- Finishing jobs now read their edges (in a second statement, on a snapshot
-- taken once the row locks are held) instead of a flag that the enqueuing
-- transaction had to write, and so hold locked, on the prerequisite's row.
ALTER TABLE jobs DROP COLUMN has_dependents;
