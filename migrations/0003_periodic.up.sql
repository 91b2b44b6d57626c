-- Periodic jobs: one row per (schedule name, plan time). The primary key,
-- written in the same transaction as the job, is what guarantees exactly one
-- job per plan across any number of processes.
CREATE TABLE periodic_runs (
    name       text        NOT NULL,
    plan_time  timestamptz NOT NULL,
    job_id     uuid        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, plan_time)
);
