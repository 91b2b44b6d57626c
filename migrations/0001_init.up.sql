-- backlog schema, version 1.
--
-- Names are unqualified: the migration runner (Queue.Migrate) sets
-- search_path to the configured schema (default "backlog") before it runs this
-- file. golang-migrate users: put search_path in the connection string, e.g.
--   postgres://…/db?search_path=backlog&x-migrations-table=schema_migrations
-- and create the schema first.

CREATE TABLE jobs (
    id               uuid        PRIMARY KEY,
    type             text        NOT NULL,
    args             jsonb       NOT NULL,
    tags             jsonb       NOT NULL DEFAULT '{}'::jsonb,
    state            text        NOT NULL DEFAULT 'available'
                     CHECK (state IN ('blocked', 'available', 'running', 'completed', 'failed', 'cancelled')),
    priority         smallint    NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    attempt          integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL DEFAULT 25 CHECK (max_attempts >= 1),
    timeout_ms       bigint      NOT NULL DEFAULT 0,
    lease_token      uuid,
    lease_expires_at timestamptz,
    worker           text,
    ordering_key     text,
    unique_key       text,
    blocked_by       integer     NOT NULL DEFAULT 0,
    cancel_requested boolean     NOT NULL DEFAULT false,
    result           jsonb,
    last_error       text,
    errors           jsonb       NOT NULL DEFAULT '[]'::jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz
) WITH (fillfactor = 85);

-- The claim index: only available jobs, in the order claims read them.
-- lease_expires_at is deliberately in no index, so heartbeats are HOT updates.
CREATE INDEX jobs_claim_idx ON jobs (type, priority, run_at, id) WHERE state = 'available';

-- Earliest future run_at of a domain, read when a domain parks so it can arm a
-- timer for scheduled jobs and retry backoffs.
CREATE INDEX jobs_run_at_idx ON jobs (run_at) WHERE state = 'available';

-- Running jobs, for the expired-lease sweep and per-worker stats. Few rows.
CREATE INDEX jobs_running_idx ON jobs (worker) WHERE state = 'running';

-- Finished jobs, for retention.
CREATE INDEX jobs_finished_idx ON jobs (finished_at) WHERE state IN ('completed', 'failed', 'cancelled');
