ALTER TABLE jobs ADD COLUMN has_dependents boolean NOT NULL DEFAULT false;
UPDATE jobs SET has_dependents = true WHERE id IN (SELECT prereq FROM job_edges);
WITH d AS (
    DELETE FROM job_edges a USING job_edges b
    WHERE a.prereq = b.prereq AND a.job = b.job AND a.kind = 'order' AND b.kind = 'depends'
    RETURNING a.job
)
UPDATE jobs j SET blocked_by = j.blocked_by - c.n
FROM (SELECT job, count(*)::int AS n FROM d GROUP BY job) c WHERE j.id = c.job;
ALTER TABLE job_edges DROP CONSTRAINT job_edges_pkey, ADD PRIMARY KEY (prereq, job);
