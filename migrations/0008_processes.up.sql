-- What an operator asks of a running system (Queue.Processes and
-- Queue.Schedules): the live worker processes, and the periodic schedules
-- the processes register.

-- One row per process running Work, keyed by its worker ID (WithWorkerID;
-- jobs.worker names the same process). The process writes it: when its
-- first Work call starts, when Work calls come and go, and with its
-- heartbeat every lease/3; Close deletes it. A process whose heartbeat is
-- older than three of its own leases (lease_ms) is dead: it is not listed,
-- and the cleaner of any process deletes the row. instance is random per
-- Queue, so that two live processes given the same worker ID do not take
-- turns overwriting one row: the first keeps it until it stops.
-- The row is rewritten every heartbeat and no index covers what changes,
-- so updates are HOT; the fillfactor leaves them room.
CREATE TABLE processes (
    worker       text        PRIMARY KEY,
    instance     text        NOT NULL,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    lease_ms     bigint      NOT NULL,
    works        jsonb       NOT NULL, -- one object per Work call: types, tags, concurrency, prefetch, running
    running      integer     NOT NULL, -- handlers running at the last heartbeat
    leased       integer     NOT NULL  -- leases held: running, prefetched, outcomes being written
) WITH (fillfactor = 50);

-- Periodic schedules as registered in code (Every, Cron), so that any
-- process, one that runs no schedule too, can list them. A registration
-- writes the definition (the last one written wins when processes
-- disagree); every process running the schedule confirms it
-- (registered_at) every few minutes. A schedule no process confirms any
-- more stays, listed as stale, until it is deleted by hand: its plans live
-- on in periodic_runs.
CREATE TABLE schedules (
    name          text        PRIMARY KEY,
    kind          text        NOT NULL CHECK (kind IN ('every', 'cron')),
    spec          text        NOT NULL, -- every: a Go duration ("1h0m0s"); cron: the expression
    type          text        NOT NULL,
    args          jsonb       NOT NULL,
    tags          jsonb       NOT NULL,
    options       jsonb       NOT NULL, -- priority, max_attempts, timeout_ms, ordering_key, unique_key, catch_up
    registered_by text        NOT NULL, -- worker ID of the last registration
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(), -- the definition last changed
    registered_at timestamptz NOT NULL DEFAULT now()  -- last registered or confirmed
);
