-- A lean hot table: finished jobs move to job_history, and jobs due later
-- wait in their own state, out of the claim path.
--
-- Measured before choosing (bench/cmd/hotdesign): finishing by moving the
-- row into a history table partitioned by expiry costs the burn-down about
-- what updating it in place costs, and retiring it later is a DROP of a
-- whole partition instead of a DELETE and a VACUUM per row.

-- 'scheduled': waiting for a future run_at. Every 'available' job is due,
-- so a claim that comes back short never walks jobs due next week; the
-- promoter (promote()) makes scheduled jobs available when they are due.
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check,
    ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('blocked', 'scheduled', 'available', 'running', 'completed', 'failed', 'cancelled'));
UPDATE jobs SET state = 'scheduled' WHERE state = 'available' AND run_at > now();
DROP INDEX jobs_run_at_idx;
CREATE INDEX jobs_scheduled_idx ON jobs (run_at) WHERE state = 'scheduled';

-- Live now includes scheduled.
DROP INDEX jobs_unique_key_idx;
CREATE UNIQUE INDEX jobs_unique_key_idx ON jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('blocked', 'scheduled', 'available', 'running');
DROP INDEX jobs_ordering_live_idx;
CREATE INDEX jobs_ordering_live_idx ON jobs (ordering_key)
    WHERE ordering_key IS NOT NULL AND state IN ('blocked', 'scheduled', 'available', 'running');

-- Finished jobs, kept until expires_at (finished_at plus the retention of
-- their state). Partitioned by expiry, one partition a UTC day
-- (job_history_pYYYYMMDD), created ahead by history_partition() and
-- dropped whole by drop_expired_history(); the default partition only
-- catches rows no day partition takes (normally none).
CREATE TABLE job_history (
    id           uuid        NOT NULL,
    type         text        NOT NULL,
    args         jsonb       NOT NULL,
    tags         jsonb       NOT NULL,
    state        text        NOT NULL,
    priority     smallint    NOT NULL,
    run_at       timestamptz NOT NULL,
    attempt      integer     NOT NULL,
    max_attempts integer     NOT NULL,
    timeout_ms   bigint      NOT NULL,
    worker       text,
    ordering_key text,
    unique_key   text,
    result       jsonb,
    last_error   text,
    errors       jsonb       NOT NULL,
    created_at   timestamptz NOT NULL,
    started_at   timestamptz,
    finished_at  timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL
) PARTITION BY RANGE (expires_at);
-- Lookups by ID: job IDs are UUIDv7s, ordered by creation time, and jobs
-- mostly finish in the order they were created, so a BRIN index finds a
-- job in a few pages and costs next to nothing to keep up (measured, raw
-- SQL burn-down of 100,000 jobs: 29 us of server CPU per job against 37
-- with a btree; minmax-multi keeps jobs that finish late from widening
-- every range).
CREATE INDEX job_history_id_idx ON job_history USING brin (id uuid_minmax_multi_ops) WITH (pages_per_range = 16, autosummarize = on);
CREATE TABLE job_history_default PARTITION OF job_history DEFAULT;

-- Finished jobs per minute (the last two hours) and per hour (older), by
-- type and state: throughput charts and finished-job counts read these,
-- never job_history. Counted where jobs enter job_history (finish() and
-- retire()), so each finished job is counted once. shard spreads
-- concurrent writers (pg_backend_pid() % 32) over separate rows; the
-- cleaner folds minutes into hours. wait_ms and run_ms sum, over the
-- jobs counted, the wait from run_at to the last start and the last run.
CREATE TABLE job_counts (
    bucket  timestamptz NOT NULL,
    type    text        NOT NULL,
    state   text        NOT NULL,
    shard   smallint    NOT NULL,
    n       bigint      NOT NULL,
    wait_ms bigint      NOT NULL,
    run_ms  bigint      NOT NULL,
    PRIMARY KEY (bucket, type, state, shard)
);
CREATE TABLE job_counts_hourly (
    bucket  timestamptz NOT NULL,
    type    text        NOT NULL,
    state   text        NOT NULL,
    n       bigint      NOT NULL,
    wait_ms bigint      NOT NULL,
    run_ms  bigint      NOT NULL,
    PRIMARY KEY (bucket, type, state)
);

-- Job types whose jobs are not claimed (Queue.Pause).
CREATE TABLE paused_types (
    type      text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);

-- Listing finished jobs (Queue.List) in finish order: failed and
-- cancelled ones from an index only they pay for; all of them in windows
-- of finish time through a BRIN index (jobs enter job_history in finish
-- order, so a window is a run of adjacent pages).
CREATE INDEX job_history_failed_idx ON job_history (finished_at, id) WHERE state IN ('failed', 'cancelled');
-- Finished jobs by key: only jobs with the key pay for these.
CREATE INDEX job_history_unique_key_idx ON job_history (unique_key) WHERE unique_key IS NOT NULL;
CREATE INDEX job_history_ordering_key_idx ON job_history (ordering_key) WHERE ordering_key IS NOT NULL;
CREATE INDEX job_history_finished_idx ON job_history USING brin (finished_at) WITH (pages_per_range = 16, autosummarize = on);

-- A BRIN index only narrows a search to the page ranges it has
-- summarized; ranges filled since are read whole. Autovacuum summarizes
-- them (autosummarize), when it runs; the maintenance loop calls this too,
-- every few seconds while jobs finish, so that lookups of finished jobs
-- stay a few pages however autovacuum is set.
CREATE FUNCTION summarize_history() RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET lock_timeout = '5ms'
AS $$
DECLARE
    v_index regclass;
    v_ranges integer := 0;
BEGIN
    FOR v_index IN
        SELECT i.inhrelid::regclass FROM pg_inherits i
        WHERE i.inhparent IN ('job_history_id_idx'::regclass, 'job_history_finished_idx'::regclass)
    LOOP
        BEGIN
            v_ranges := v_ranges + brin_summarize_new_values(v_index);
        EXCEPTION WHEN lock_not_available THEN
            NULL; -- a vacuum or a partition being made: next time
        END;
    END LOOP;
    RETURN v_ranges;
END
$$;

-- Every job, live or finished, for people and tools reading the queue
-- with SQL.
CREATE VIEW all_jobs AS
    SELECT id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms, worker,
           ordering_key, unique_key, result, last_error, errors, created_at, started_at, finished_at, NULL::timestamptz AS expires_at
    FROM jobs
    UNION ALL
    SELECT id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms, worker,
           ordering_key, unique_key, result, last_error, errors, created_at, started_at, finished_at, expires_at
    FROM job_history;

-- Creates the partition of one UTC day of expiries, unless it exists, and
-- reports whether it did. The table is made on its own and attached
-- (SHARE UPDATE EXCLUSIVE on job_history: finishes and readers go on);
-- rows of that day that the default partition took meanwhile move into it
-- first. The attach's locks are only tried for a moment (lock_timeout),
-- so nothing queues behind it for longer: the next call tries again. (The
-- table is made without that bound: it conflicts with no one, but it may
-- wait an instant for the catalogs, which all sessions extend.) Safe to
-- call from many processes at once.
CREATE FUNCTION history_partition(p_day date) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET lock_timeout = '10s'
AS $$
DECLARE
    v_name text := 'job_history_p' || to_char(p_day, 'YYYYMMDD');
    v_from timestamptz := p_day::timestamp AT TIME ZONE 'UTC';
    v_to   timestamptz := (p_day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(current_schema()), hashtext('history_partition'));
    IF to_regclass(format('%I.%I', current_schema(), v_name)) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE job_history INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', v_name);
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (expires_at >= %L AND expires_at < %L)',
        v_name, v_name || '_range', v_from, v_to);
    EXECUTE format('WITH m AS (DELETE FROM job_history_default WHERE expires_at >= %L AND expires_at < %L RETURNING *)
        INSERT INTO %I SELECT * FROM m', v_from, v_to, v_name);
    PERFORM set_config('lock_timeout', '5ms', true); -- until the function returns
    EXECUTE format('ALTER TABLE job_history ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', v_name, v_from, v_to);
    RETURN true;
END
$$;

-- Drops the day partitions whose every row has expired, and deletes up to
-- p_limit expired rows from the default partition. A drop needs ACCESS
-- EXCLUSIVE on job_history; it is only tried for a moment (lock_timeout),
-- so finishes and readers queue behind it for at most that long, and a
-- partition someone is reading is left for the next call.
CREATE FUNCTION drop_expired_history(p_limit integer) RETURNS TABLE (partitions integer, rows_deleted integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET lock_timeout = '5ms'
AS $$
DECLARE
    v_name text;
    v_parts integer := 0;
    v_rows integer := 0;
BEGIN
    FOR v_name IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'job_history'::regclass AND c.relname ~ '^job_history_p[0-9]{8}$'
          AND to_date(substr(c.relname, 14), 'YYYYMMDD') + 1 <= (now() AT TIME ZONE 'UTC')::date
        ORDER BY c.relname
    LOOP
        BEGIN
            EXECUTE format('DROP TABLE %I', v_name);
            v_parts := v_parts + 1;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
    BEGIN
        DELETE FROM job_history_default WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM job_history_default WHERE expires_at < now() LIMIT p_limit));
        GET DIAGNOSTICS v_rows = ROW_COUNT;
    EXCEPTION WHEN lock_not_available THEN
        NULL;
    END;
    RETURN QUERY SELECT v_parts, v_rows;
END
$$;

-- Moves finished rows of jobs into job_history: the ones written in place
-- by the graph paths (finishes with dependents, the sweep, cancels,
-- cascades). Rows still holding edges are left alone.
CREATE FUNCTION retire(p_limit integer, p_keep_completed_ms bigint, p_keep_failed_ms bigint) RETURNS integer
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $$
    WITH m AS (
        DELETE FROM jobs j WHERE j.id IN (
            SELECT f.id FROM jobs f
            WHERE f.state IN ('completed', 'failed', 'cancelled')
              AND NOT EXISTS (SELECT 1 FROM job_edges e WHERE e.prereq = f.id)
            ORDER BY f.finished_at LIMIT p_limit FOR UPDATE SKIP LOCKED)
        RETURNING j.*
    ), h AS (
        INSERT INTO job_history (id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms,
                                 worker, ordering_key, unique_key, result, last_error, errors, created_at, started_at,
                                 finished_at, expires_at)
        SELECT id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms,
               worker, ordering_key, unique_key, result, last_error, errors, created_at, started_at,
               COALESCE(finished_at, now()),
               COALESCE(finished_at, now()) + CASE WHEN state = 'completed' THEN p_keep_completed_ms ELSE p_keep_failed_ms END
                   * interval '1 millisecond'
        FROM m RETURNING type, state, run_at, started_at, finished_at
    ), c AS (
        -- In type and state order, like finish(): no two writers lock
        -- counters in opposite orders.
        INSERT INTO job_counts AS c (bucket, type, state, shard, n, wait_ms, run_ms)
        SELECT date_trunc('minute', h.finished_at), h.type, h.state, (pg_backend_pid() % 32)::smallint, count(*),
               COALESCE(sum(extract(epoch FROM h.started_at - h.run_at) * 1000), 0)::bigint,
               COALESCE(sum(extract(epoch FROM h.finished_at - h.started_at) * 1000), 0)::bigint
        FROM h GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (bucket, type, state, shard) DO UPDATE
        SET n = c.n + EXCLUDED.n, wait_ms = c.wait_ms + EXCLUDED.wait_ms, run_ms = c.run_ms + EXCLUDED.run_ms
    )
    SELECT count(*)::integer FROM h
$$;

-- Makes due scheduled jobs available, oldest first. Returns one row per
-- (type, tags) it promoted, with how many, and one last row with
-- more = whether due jobs are left (the limit, or rows locked by others)
-- and next_ms = the time until the earliest future scheduled job (NULL:
-- none). FOR NO KEY UPDATE does not conflict with the KEY SHARE of a
-- transaction adding a dependent to the job.
CREATE FUNCTION promote(p_limit integer)
RETURNS TABLE (type text, tags jsonb, n bigint, more boolean, next_ms bigint)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_n bigint := 0;
BEGIN
    RETURN QUERY
    WITH p AS (
        UPDATE jobs j SET state = 'available'
        WHERE j.id IN (SELECT s.id FROM jobs s WHERE s.state = 'scheduled' AND s.run_at <= now()
                       ORDER BY s.run_at LIMIT p_limit FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING j.type, j.tags
    )
    SELECT p.type, p.tags, count(*), NULL::boolean, NULL::bigint FROM p GROUP BY p.type, p.tags;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    -- A fresh snapshot: what is left.
    RETURN QUERY SELECT NULL::text, NULL::jsonb, NULL::bigint,
        EXISTS (SELECT 1 FROM jobs s WHERE s.state = 'scheduled' AND s.run_at <= now()),
        (SELECT ceil(extract(epoch FROM min(s.run_at) - now()) * 1000)::bigint FROM jobs s
         WHERE s.state = 'scheduled' AND s.run_at > now());
END
$$;

-- The finish of jobs without dependents, in one round trip and one pass
-- over their rows: locks the rows still held under the given lease tokens
-- (skipping rows another transaction holds), moves terminal outcomes to
-- job_history and writes retries in place. Jobs in p_exclude are left
-- alone (reported with status 3).
--
-- Returns one row per job: status 0 written (state: what was written),
-- 1 busy (still held under the token, but locked by another transaction),
-- 2 refused (the lease is gone), 3 excluded.
--
-- Dependents: after the write, a statement on a fresh snapshot (a
-- VOLATILE function's every statement takes one) looks for edges of the
-- jobs it ended. A transaction adding a dependent holds KEY SHARE on the
-- job's row until it commits, so the write either skipped the row or came
-- after that commit, whose edge the check then sees; a transaction that
-- comes later waits for this one and finds the job finished. When the
-- check finds edges (rare), it raises BLGRF with the jobs in DETAIL: the
-- whole call rolls back, and the caller calls again excluding them, and
-- finishes them in a transaction that also releases their dependents.
-- (The fresh snapshot needs READ COMMITTED: any other isolation is
-- refused.)
--
-- Every statement's cached plan suits any batch size: the batch drives
-- lookups of the primary key, row by row (LATERAL), and no statement joins
-- the batch with itself. A generic plan assumes 10 rows; with joins it
-- chose nested loops that read the batch once per row (measured: 150 ms
-- for 1,000 jobs instead of 10), and planning at every call instead cost
-- about a millisecond.
CREATE FUNCTION finish(p_ids uuid[], p_tokens uuid[], p_states text[], p_delay_ms bigint[], p_attempt_delta integer[],
                       p_results jsonb[], p_errs text[], p_exclude uuid[], p_channel text, p_keep_completed_ms bigint,
                       p_keep_failed_ms bigint, p_max_errors integer)
RETURNS TABLE (id uuid, state text, status smallint)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    w_ids    uuid[];  -- written, and the state written
    w_states text[];
    v_ended  uuid[];  -- written and moved to job_history
    v_graph  uuid[];
    v_notes  bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'backlog: finish needs READ COMMITTED, the session runs %', current_setting('transaction_isolation')
            USING ERRCODE = 'BLISO';
    END IF;
    WITH l AS (
        SELECT t.id, t.state AS fstate, t.delay_ms, t.attempt_delta, t.result, t.err, x.cancel_requested, x.notify_done
        FROM unnest(p_ids, p_tokens, p_states, p_delay_ms, p_attempt_delta, p_results, p_errs)
             AS t(id, token, state, delay_ms, attempt_delta, result, err)
        CROSS JOIN LATERAL (
            SELECT j.state, j.cancel_requested, j.notify_done FROM jobs j
            WHERE j.id = t.id AND j.lease_token = t.token AND NOT (j.id = ANY(p_exclude))
            LIMIT 1 FOR UPDATE SKIP LOCKED) x
        -- Tested here, not in the lookup (LIMIT keeps it out): there it
        -- would let the planner read the partial index of running jobs,
        -- all of them, once per job of the batch.
        WHERE x.state = 'running'
    ), moved AS (
        DELETE FROM jobs j USING l
        WHERE j.id = l.id AND (l.fstate IN ('completed', 'failed', 'cancelled') OR (l.cancel_requested AND l.fstate = 'available'))
        RETURNING j.*, l.fstate, l.attempt_delta, l.result AS fresult, l.err
    ), hist AS (
        INSERT INTO job_history (id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms,
                                 worker, ordering_key, unique_key, result, last_error, errors, created_at, started_at,
                                 finished_at, expires_at)
        SELECT m.id, m.type, m.args, m.tags, CASE WHEN m.fstate = 'available' THEN 'cancelled' ELSE m.fstate END,
               m.priority, m.run_at, m.attempt + m.attempt_delta, m.max_attempts, m.timeout_ms,
               m.worker, m.ordering_key, m.unique_key, m.fresult,
               CASE WHEN m.fstate = 'completed' THEN NULL
                    WHEN m.fstate = 'available' THEN 'cancelled by request' || COALESCE('; its last attempt ended with: ' || m.err, '')
                    ELSE COALESCE(m.err, m.last_error) END,
               CASE WHEN m.err IS NULL THEN m.errors
                    ELSE (CASE WHEN jsonb_array_length(m.errors) >= p_max_errors THEN m.errors - 0 ELSE m.errors END)
                         || jsonb_build_array(jsonb_build_object('attempt', m.attempt, 'at', now(), 'error', m.err)) END,
               m.created_at, m.started_at, now(),
               now() + CASE WHEN m.fstate = 'completed' THEN p_keep_completed_ms ELSE p_keep_failed_ms END
                   * interval '1 millisecond'
        FROM moved m
        RETURNING job_history.id, job_history.state, job_history.type, job_history.run_at, job_history.started_at
    ), cnt AS (
        -- In type and state order: no two writers lock counters in
        -- opposite orders.
        INSERT INTO job_counts AS c (bucket, type, state, shard, n, wait_ms, run_ms)
        SELECT date_trunc('minute', now()), h.type, h.state, (pg_backend_pid() % 32)::smallint, count(*),
               COALESCE(sum(extract(epoch FROM h.started_at - h.run_at) * 1000), 0)::bigint,
               COALESCE(sum(extract(epoch FROM now() - h.started_at) * 1000), 0)::bigint
        FROM hist h GROUP BY h.type, h.state ORDER BY h.type, h.state
        ON CONFLICT (bucket, type, state, shard) DO UPDATE
        SET n = c.n + EXCLUDED.n, wait_ms = c.wait_ms + EXCLUDED.wait_ms, run_ms = c.run_ms + EXCLUDED.run_ms
    ), upd AS (
        UPDATE jobs j SET
            state = CASE WHEN l.delay_ms > 0 THEN 'scheduled' ELSE 'available' END,
            run_at = CASE WHEN l.delay_ms >= 0 THEN now() + l.delay_ms * interval '1 millisecond' ELSE j.run_at END,
            attempt = j.attempt + l.attempt_delta,
            result = l.result,
            last_error = COALESCE(l.err, j.last_error),
            errors = CASE WHEN l.err IS NULL THEN j.errors
                          ELSE (CASE WHEN jsonb_array_length(j.errors) >= p_max_errors THEN j.errors - 0 ELSE j.errors END)
                               || jsonb_build_array(jsonb_build_object('attempt', j.attempt, 'at', now(), 'error', l.err)) END,
            lease_token = NULL, lease_expires_at = NULL
        FROM l WHERE j.id = l.id AND l.fstate = 'available' AND NOT l.cancel_requested
        RETURNING j.id, j.state
    ), notes AS (
        SELECT count(pg_notify(p_channel, json_build_object('done', m.id)::text)) AS n FROM moved m WHERE m.notify_done
    )
    SELECT coalesce(array_agg(w.id), '{}'), array_agg(w.state), coalesce(array_agg(w.id) FILTER (WHERE w.ended), '{}'),
           (SELECT n FROM notes) -- referenced, so that the notices are sent
    INTO w_ids, w_states, v_ended, v_notes
    FROM (SELECT h.id, h.state, true AS ended FROM hist h UNION ALL SELECT u.id, u.state, false FROM upd u) w;

    -- A fresh snapshot: dependents added before the rows were locked.
    SELECT coalesce(array_agg(DISTINCT e.prereq), '{}') INTO v_graph FROM job_edges e WHERE e.prereq = ANY(v_ended);
    IF cardinality(v_graph) > 0 THEN
        RAISE EXCEPTION 'backlog: finished jobs have dependents' USING ERRCODE = 'BLGRF', DETAIL = array_to_string(v_graph, ',');
    END IF;

    RETURN QUERY SELECT w.id, w.state, 0::smallint FROM unnest(w_ids, w_states) AS w(id, state);
    RETURN QUERY SELECT g, NULL::text, 3::smallint FROM unnest(p_exclude) AS g WHERE g = ANY(p_ids);
    IF cardinality(w_ids) + cardinality(p_exclude) < cardinality(p_ids) THEN
        -- Rows not written: busy (still ours, held by another transaction)
        -- or refused (the lease is gone).
        RETURN QUERY
        SELECT t.id, NULL::text, CASE WHEN (SELECT j.state FROM jobs j WHERE j.id = t.id AND j.lease_token = t.token LIMIT 1) = 'running'
                                      THEN 1::smallint ELSE 2::smallint END
        FROM unnest(p_ids, p_tokens) AS t(id, token)
        WHERE t.id IN (SELECT unnest(p_ids) EXCEPT SELECT unnest(w_ids) EXCEPT SELECT unnest(p_exclude));
    END IF;
END
$$;

-- The claim: every available job is due now, so no run_at timer comes
-- back from it any more (next_ms is always NULL; the column stays for the
-- callers of version 4). It still skips available jobs due later, which
-- only a process of an older version inserts.
CREATE OR REPLACE FUNCTION claim(p_types text[], p_tags jsonb, p_k integer, p_lease_ms bigint, p_worker text)
RETURNS TABLE (id uuid, type text, args jsonb, tags jsonb, attempt integer, max_attempts integer,
               priority smallint, timeout_ms bigint, lease_token uuid, created_at timestamptz,
               run_at timestamptz, waited_us bigint, next_ms bigint, skipped boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_ids uuid[];
    v_skipped boolean;
BEGIN
    -- The claim's commit does not wait for its WAL to reach disk (a
    -- millisecond or more on this project's machines, once per claim, on
    -- the path of every job). Nothing is lost by that: if the server
    -- crashes before the flush, the claim never happened, the job is
    -- available under its old attempt, and the worker's finish is refused
    -- by its token; the job runs again, as after any crash. The finish
    -- commits durably, and its flush carries the claim's WAL with it.
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Paused types are not claimed. With nothing paused this costs one
    -- probe of an empty table.
    IF EXISTS (SELECT 1 FROM paused_types) THEN
        p_types := ARRAY(SELECT t FROM unnest(p_types) AS t WHERE NOT EXISTS (SELECT 1 FROM paused_types p WHERE p.type = t));
        IF cardinality(p_types) = 0 THEN
            RETURN QUERY SELECT NULL::uuid, NULL::text, NULL::jsonb, NULL::jsonb, NULL::integer, NULL::integer,
                NULL::smallint, NULL::bigint, NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::bigint,
                NULL::bigint, false;
            RETURN;
        END IF;
    END IF;
    IF cardinality(p_types) = 1 THEN
        SELECT array_agg(n.id) INTO v_ids FROM (
            SELECT j.id FROM jobs j
            WHERE j.state = 'available' AND j.type = p_types[1] AND j.run_at <= now() AND j.tags <@ p_tags
            ORDER BY j.priority, j.run_at, j.id LIMIT p_k FOR UPDATE SKIP LOCKED) n;
    ELSE
        SELECT array_agg(c.id) INTO v_ids FROM (
            SELECT l.id FROM unnest(p_types) AS t(type) CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at FROM jobs j
                WHERE j.state = 'available' AND j.type = t.type AND j.run_at <= now() AND j.tags <@ p_tags
                ORDER BY j.priority, j.run_at, j.id LIMIT p_k FOR UPDATE SKIP LOCKED) l
            ORDER BY l.priority, l.run_at, l.id LIMIT p_k) c;
    END IF;
    IF coalesce(cardinality(v_ids), 0) < p_k THEN
        -- Short: were due jobs skipped because another transaction held
        -- them? (A domain must not park on those.)
        SELECT EXISTS (SELECT 1 FROM jobs f
            WHERE f.state = 'available' AND f.run_at <= now() AND f.type = ANY(p_types) AND f.tags <@ p_tags
              AND NOT (f.id = ANY(coalesce(v_ids, '{}')))) INTO v_skipped;
    END IF;
    IF v_ids IS NULL THEN
        RETURN QUERY SELECT NULL::uuid, NULL::text, NULL::jsonb, NULL::jsonb, NULL::integer, NULL::integer,
            NULL::smallint, NULL::bigint, NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::bigint,
            NULL::bigint, v_skipped;
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE jobs j SET state = 'running', attempt = j.attempt + 1, lease_token = gen_random_uuid(),
           lease_expires_at = now() + p_lease_ms * interval '1 millisecond', worker = p_worker, started_at = now()
    WHERE j.id = ANY(v_ids)
    RETURNING j.id, j.type, j.args, j.tags, j.attempt, j.max_attempts, j.priority, j.timeout_ms, j.lease_token,
              j.created_at, j.run_at, greatest(0, extract(epoch FROM now() - j.run_at) * 1e6)::bigint, NULL::bigint, v_skipped;
END
$$;

-- The days ahead; one whose attach could not have its locks at once is
-- left to the maintenance loop, which makes the missing days before the
-- first Work call starts.
DO $$
BEGIN
    FOR d IN 0..9 LOOP
        BEGIN
            PERFORM history_partition((now() AT TIME ZONE 'UTC')::date + d);
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
END
$$;
