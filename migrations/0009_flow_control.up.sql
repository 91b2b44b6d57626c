-- Flow control (Queue.SetLimit): per job type, a global concurrency limit,
-- a concurrency limit per concurrency key, and a rate limit (per type or
-- per key); and round-robin claiming across concurrency keys. Enforced by
-- the claim function itself, under a per-type advisory lock, so limits
-- hold across any number of processes with no leader.

-- A job's concurrency key (EnqueueOption ConcurrencyKey): a tenant, a
-- customer, an account. Finished jobs keep theirs (a retry restores it).
ALTER TABLE jobs ADD COLUMN concurrency_key text;
ALTER TABLE job_history ADD COLUMN concurrency_key text;

-- Available jobs are split between two claim indexes: those without a key
-- (claimed first in, first out, as before) and those with one, ordered by
-- key within a priority, so that a claim can visit keys in turn and find
-- the next job of a key in one probe. Each job is in exactly one of them:
-- a job without a key costs what it cost before.
DROP INDEX jobs_claim_idx;
CREATE INDEX jobs_claim_idx ON jobs (type, priority, run_at, id)
    WHERE state = 'available' AND concurrency_key IS NULL;
CREATE INDEX jobs_key_claim_idx ON jobs (type, priority, concurrency_key, run_at, id)
    WHERE state = 'available' AND concurrency_key IS NOT NULL;
-- Running jobs by type and key: a limited claim counts them (the index had
-- the worker; everything that reads running jobs by worker reads them all).
DROP INDEX jobs_running_idx;
CREATE INDEX jobs_running_idx ON jobs (type, concurrency_key) WHERE state = 'running';

-- One row per limited job type (Queue.SetLimit). NULL: no such limit.
-- rate starts per rate_period_ms, with bursts of up to burst starts;
-- rate_per_key: the rate applies to each concurrency key instead of the
-- type.
CREATE TABLE job_limits (
    type            text        PRIMARY KEY,
    concurrency     integer     CHECK (concurrency > 0),
    key_concurrency integer     CHECK (key_concurrency > 0),
    rate            integer     CHECK (rate > 0),
    rate_period_ms  bigint      CHECK (rate_period_ms > 0),
    burst           integer     CHECK (burst > 0),
    rate_per_key    boolean     NOT NULL DEFAULT false,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    -- At least the number of jobs of the type running (claims add what they
    -- take; finishes do not subtract): while it leaves room, a claim need
    -- not count them. A claim that counts sets it to the count.
    running_bound   integer     NOT NULL DEFAULT 1073741824,
    CHECK ((rate IS NULL) = (rate_period_ms IS NULL) AND (rate IS NULL) = (burst IS NULL))
);

-- Rate limits are a generic cell rate algorithm: tat, the theoretical
-- arrival time of the next start, moves rate_period_ms/rate ahead per
-- start; a start is allowed while tat is at most (burst-1) intervals
-- ahead of now. key is '' for a limit on the whole type. Rows whose tat
-- has passed carry nothing and are deleted by the cleaner.
CREATE TABLE job_rates (
    type text        NOT NULL,
    key  text        NOT NULL,
    tat  timestamptz NOT NULL,
    PRIMARY KEY (type, key)
);

-- Round-robin across keys: the last key a claim served, per type.
CREATE TABLE job_key_cursors (
    type text PRIMARY KEY,
    key  text NOT NULL
);

-- How many starts the rate limit allows now for (p_type, p_key), and in
-- how many milliseconds the start after those will be allowed. A tat less than
-- one interval in the past is kept rather than reset to now, so that
-- starts stay on their grid however late the claim that takes them comes.
CREATE FUNCTION rate_allowance(p_type text, p_key text, p_rate integer, p_period_ms bigint, p_burst integer,
                               OUT allowed integer, OUT wait_ms bigint)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_t   float8 := p_period_ms::float8 / p_rate;
    v_tat timestamptz;
    v_d   float8;
BEGIN
    SELECT r.tat INTO v_tat FROM job_rates r WHERE r.type = p_type AND r.key = p_key;
    IF v_tat IS NULL OR v_tat <= now() - v_t * interval '1 millisecond' THEN
        v_tat := now();
    END IF;
    v_d := extract(epoch FROM v_tat - now()) * 1000; -- ms ahead of now (at most one interval behind)
    allowed := least(p_burst, greatest(0, floor(((p_burst - 1) * v_t + v_t - v_d) / v_t)::integer));
    -- When the start after the allowed ones will be allowed.
    wait_ms := greatest(1, ceil(v_d + allowed * v_t - (p_burst - 1) * v_t))::bigint;
END
$$;

-- Charges p_n starts to (p_type, p_key).
CREATE FUNCTION rate_charge(p_type text, p_key text, p_rate integer, p_period_ms bigint, p_n integer) RETURNS void
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $$
    INSERT INTO job_rates AS r (type, key, tat)
    VALUES (p_type, p_key, now() + p_n * (p_period_ms::float8 / p_rate) * interval '1 millisecond')
    ON CONFLICT (type, key) DO UPDATE
    SET tat = CASE WHEN r.tat <= now() - (p_period_ms::float8 / p_rate) * interval '1 millisecond' THEN now() ELSE r.tat END
              + p_n * (p_period_ms::float8 / p_rate) * interval '1 millisecond'
$$;

-- The jobs of one type a claim takes when the type has a limit or keyed
-- jobs wait: up to p_need (p_now of them for callers waiting now: when
-- slots are short, none are taken ahead of demand), within the type's
-- limits, visiting concurrency keys in turn. The caller holds the type's
-- advisory lock, so counting running jobs and taking more is atomic
-- against every other claim of the type. Returns the jobs' IDs (locked,
-- not yet running); slot: the type has a concurrency limit (its finishes
-- announce a freed slot); limited: 0 no limit held jobs back, 1 only jobs
-- beyond p_now were held back (no prefetch), 2 a limit held jobs back that
-- callers wait for; wait_ms: when a rate limit did, how long until it
-- allows the next start.
--
-- Keys are visited round-robin within a priority: the keys after the last
-- one served (job_key_cursors), then the jobs without a key as one more
-- group, then the keys from the first; one job a group a round, until the
-- claim has what it needs. A lone group left takes the rest at once.
CREATE FUNCTION claim_type(p_type text, p_tags jsonb, p_need integer, p_now integer,
                           OUT ids uuid[], OUT slot boolean, OUT limited smallint, OUT wait_ms bigint)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    l        job_limits%ROWTYPE;
    v_need   integer := p_need;
    v_n      integer;
    v_wait   bigint;
    v_got    uuid[];
    v_cursor text;
    v_prio   integer := -1000000;
    v_p      integer;
    v_k      text;
    v_last   text;
    g_key    text[];
    g_quota  integer[];
    g_taken  integer[];
    v_active integer;
    v_take   integer;
    v_round  boolean;
BEGIN
    ids := '{}';
    slot := false;
    limited := 0;
    SELECT * INTO l FROM job_limits WHERE type = p_type;
    slot := l.concurrency IS NOT NULL OR l.key_concurrency IS NOT NULL;
    IF l.concurrency IS NOT NULL THEN
        IF l.running_bound + v_need > l.concurrency THEN
            SELECT count(*) INTO l.running_bound
            FROM (SELECT 1 FROM jobs r WHERE r.state = 'running' AND r.type = p_type LIMIT l.concurrency) r;
        END IF;
        v_n := l.concurrency - l.running_bound;
        IF v_n < v_need THEN
            -- Slots are short: none goes to a prefetch buffer.
            limited := CASE WHEN v_n < p_now THEN 2 ELSE 1 END;
            v_need := least(v_n, p_now);
        END IF;
    END IF;
    IF l.key_concurrency IS NOT NULL AND p_now < v_need THEN
        v_need := p_now; -- keyed slots are not held in a prefetch buffer either
        limited := greatest(limited, 1);
    END IF;
    IF l.rate IS NOT NULL AND NOT l.rate_per_key AND v_need > 0 THEN
        SELECT a.allowed, a.wait_ms INTO v_n, v_wait FROM rate_allowance(p_type, '', l.rate, l.rate_period_ms, l.burst) a;
        IF v_n < v_need THEN
            v_need := v_n;
            limited := 2;
            wait_ms := v_wait;
        END IF;
    END IF;
    IF v_need <= 0 THEN
        IF l.concurrency IS NOT NULL THEN
            UPDATE job_limits SET running_bound = l.running_bound WHERE type = p_type;
        END IF;
        RETURN;
    END IF;

    IF NOT EXISTS (SELECT 1 FROM jobs f WHERE f.state = 'available' AND f.concurrency_key IS NOT NULL AND f.type = p_type) THEN
        -- No keys: first in, first out.
        SELECT coalesce(array_agg(n.id), '{}') INTO ids FROM (
            SELECT j.id FROM jobs j
            WHERE j.state = 'available' AND j.concurrency_key IS NULL AND j.type = p_type AND j.run_at <= now() AND j.tags <@ p_tags
            ORDER BY j.priority, j.run_at, j.id LIMIT v_need FOR UPDATE SKIP LOCKED) n;
    ELSE
        SELECT c.key INTO v_cursor FROM job_key_cursors c WHERE c.type = p_type;
        LOOP -- priorities, most urgent first
            EXIT WHEN v_need <= 0;
            SELECT least(
                (SELECT min(j.priority) FROM jobs j WHERE j.state = 'available' AND j.concurrency_key IS NOT NULL
                   AND j.type = p_type AND j.priority > v_prio),
                (SELECT min(j.priority) FROM jobs j WHERE j.state = 'available' AND j.concurrency_key IS NULL
                   AND j.type = p_type AND j.priority > v_prio)) INTO v_p;
            EXIT WHEN v_p IS NULL;
            v_prio := v_p;
            g_key := '{}'; g_quota := '{}'; g_taken := '{}';
            -- The groups, in turn from the cursor; those a limit leaves
            -- nothing to do not count towards the v_need groups visited.
            v_active := 0;
            v_k := coalesce(v_cursor, '');
            v_round := false; -- false: keys after the cursor; true: from the first
            LOOP
                EXIT WHEN v_active >= v_need;
                SELECT j.concurrency_key INTO v_k FROM jobs j
                WHERE j.state = 'available' AND j.concurrency_key IS NOT NULL AND j.type = p_type
                  AND j.priority = v_prio AND j.concurrency_key > v_k
                ORDER BY j.concurrency_key LIMIT 1;
                IF NOT FOUND OR (v_round AND v_cursor IS NOT NULL AND v_k > v_cursor) THEN
                    EXIT WHEN v_round OR v_cursor IS NULL;
                    -- The jobs without a key, then the keys from the first.
                    IF EXISTS (SELECT 1 FROM jobs j WHERE j.state = 'available' AND j.concurrency_key IS NULL
                               AND j.type = p_type AND j.priority = v_prio) THEN
                        g_key := g_key || NULL::text; g_quota := g_quota || v_need; g_taken := g_taken || 0;
                        v_active := v_active + 1;
                    END IF;
                    v_round := true;
                    v_k := '';
                    CONTINUE;
                END IF;
                v_n := v_need;
                IF l.key_concurrency IS NOT NULL THEN
                    SELECT least(v_n, l.key_concurrency - count(*)) INTO v_n FROM (
                        SELECT 1 FROM jobs r WHERE r.state = 'running' AND r.type = p_type AND r.concurrency_key = v_k
                        LIMIT l.key_concurrency) r;
                END IF;
                IF l.rate IS NOT NULL AND l.rate_per_key AND v_n > 0 THEN
                    SELECT a.allowed, a.wait_ms INTO v_take, v_wait
                    FROM rate_allowance(p_type, v_k, l.rate, l.rate_period_ms, l.burst) a;
                    IF v_take < v_n THEN
                        v_n := v_take; -- the key's rate holds jobs back
                        wait_ms := least(wait_ms, v_wait);
                        limited := 2;
                    END IF;
                END IF;
                IF v_n <= 0 THEN
                    limited := 2;
                    CONTINUE;
                END IF;
                g_key := g_key || v_k; g_quota := g_quota || v_n; g_taken := g_taken || 0;
                v_active := v_active + 1;
            END LOOP;
            IF v_cursor IS NULL AND v_active < v_need
               AND EXISTS (SELECT 1 FROM jobs j WHERE j.state = 'available' AND j.concurrency_key IS NULL
                           AND j.type = p_type AND j.priority = v_prio) THEN
                -- No cursor yet: the jobs without a key come last.
                g_key := g_key || NULL::text; g_quota := g_quota || v_need; g_taken := g_taken || 0;
                v_active := v_active + 1;
            END IF;
            -- Rounds: one job a group, or the rest from the last group.
            LOOP
                v_round := false;
                FOR i IN 1 .. coalesce(cardinality(g_key), 0) LOOP
                    EXIT WHEN v_need <= 0;
                    CONTINUE WHEN g_taken[i] >= g_quota[i];
                    v_take := CASE WHEN v_active = 1 THEN least(g_quota[i] - g_taken[i], v_need) ELSE 1 END;
                    IF g_key[i] IS NULL THEN
                        SELECT array_agg(n.id) INTO v_got FROM (
                            SELECT j.id FROM jobs j
                            WHERE j.state = 'available' AND j.concurrency_key IS NULL AND j.type = p_type
                              AND j.priority = v_prio AND j.run_at <= now() AND j.tags <@ p_tags AND NOT (j.id = ANY(ids))
                            ORDER BY j.run_at, j.id LIMIT v_take FOR UPDATE SKIP LOCKED) n;
                    ELSE
                        SELECT array_agg(n.id) INTO v_got FROM (
                            SELECT j.id FROM jobs j
                            WHERE j.state = 'available' AND j.concurrency_key = g_key[i] AND j.type = p_type
                              AND j.priority = v_prio AND j.run_at <= now() AND j.tags <@ p_tags AND NOT (j.id = ANY(ids))
                            ORDER BY j.run_at, j.id LIMIT v_take FOR UPDATE SKIP LOCKED) n;
                    END IF;
                    v_n := coalesce(cardinality(v_got), 0);
                    IF v_n < v_take THEN
                        g_quota[i] := g_taken[i] + v_n; -- nothing more there
                        v_active := v_active - 1;
                    END IF;
                    IF v_n > 0 THEN
                        ids := ids || v_got;
                        g_taken[i] := g_taken[i] + v_n;
                        v_need := v_need - v_n;
                        v_round := true;
                        IF g_key[i] IS NOT NULL THEN
                            v_last := g_key[i];
                        END IF;
                        IF g_taken[i] >= g_quota[i] AND v_n = v_take THEN
                            v_active := v_active - 1; -- its quota is used up
                        END IF;
                    END IF;
                END LOOP;
                EXIT WHEN NOT v_round OR v_need <= 0 OR v_active <= 0;
            END LOOP;
            IF l.rate IS NOT NULL AND l.rate_per_key THEN
                FOR i IN 1 .. coalesce(cardinality(g_key), 0) LOOP
                    IF g_key[i] IS NOT NULL AND g_taken[i] > 0 THEN
                        PERFORM rate_charge(p_type, g_key[i], l.rate, l.rate_period_ms, g_taken[i]);
                    END IF;
                END LOOP;
            END IF;
        END LOOP;
        IF v_last IS NOT NULL THEN
            INSERT INTO job_key_cursors AS c (type, key) VALUES (p_type, v_last)
            ON CONFLICT (type) DO UPDATE SET key = EXCLUDED.key;
        END IF;
    END IF;
    IF l.rate IS NOT NULL AND NOT l.rate_per_key AND cardinality(ids) > 0 THEN
        PERFORM rate_charge(p_type, '', l.rate, l.rate_period_ms, cardinality(ids));
    END IF;
    IF l.concurrency IS NOT NULL THEN
        UPDATE job_limits SET running_bound = l.running_bound + cardinality(ids) WHERE type = p_type;
    END IF;
END
$$;

-- The claim, with flow control. p_now: how many of the p_k jobs callers
-- wait for now (the rest fill a prefetch buffer). When none of the types
-- has a limit and no job with a concurrency key waits, it is the claim of
-- version 6 (two probes of empty ranges more). Otherwise each such type
-- goes through claim_type under its advisory lock (all taken first, in
-- type order, so two claims never wait on each other in a cycle), the
-- types in turn from a random one so that none starves the others.
--
-- Returns, besides the jobs: next_ms, when a rate limit held jobs back,
-- in how long it allows the next start; limited as claim_type's (0, 1, 2),
-- in every row; slot, per job: its finish frees a limited slot.
CREATE FUNCTION claim(p_types text[], p_tags jsonb, p_k integer, p_now integer, p_lease_ms bigint, p_worker text)
RETURNS TABLE (id uuid, type text, args jsonb, tags jsonb, attempt integer, max_attempts integer,
               priority smallint, timeout_ms bigint, lease_token uuid, created_at timestamptz,
               run_at timestamptz, waited_us bigint, next_ms bigint, skipped boolean, limited smallint, slot boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_ids     uuid[];
    v_skipped boolean;
    v_limited smallint := 0;
    v_next    bigint;
    v_flow    text[];
    v_slots   text[] := '{}';
    v_start   integer;
    v_t       text;
    r         record;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true); -- see version 6
    IF EXISTS (SELECT 1 FROM paused_types) THEN
        p_types := ARRAY(SELECT t FROM unnest(p_types) AS t WHERE NOT EXISTS (SELECT 1 FROM paused_types p WHERE p.type = t));
        IF cardinality(p_types) = 0 THEN
            RETURN QUERY SELECT NULL::uuid, NULL::text, NULL::jsonb, NULL::jsonb, NULL::integer, NULL::integer,
                NULL::smallint, NULL::bigint, NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::bigint,
                NULL::bigint, false, 0::smallint, false;
            RETURN;
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM job_limits l WHERE l.type = ANY(p_types))
       AND NOT EXISTS (SELECT 1 FROM jobs f WHERE f.state = 'available' AND f.concurrency_key IS NOT NULL AND f.type = ANY(p_types)) THEN
        IF cardinality(p_types) = 1 THEN
            SELECT array_agg(n.id) INTO v_ids FROM (
                SELECT j.id FROM jobs j
                WHERE j.state = 'available' AND j.concurrency_key IS NULL AND j.type = p_types[1] AND j.run_at <= now() AND j.tags <@ p_tags
                ORDER BY j.priority, j.run_at, j.id LIMIT p_k FOR UPDATE SKIP LOCKED) n;
        ELSE
            SELECT array_agg(c.id) INTO v_ids FROM (
                SELECT l.id FROM unnest(p_types) AS t(type) CROSS JOIN LATERAL (
                    SELECT j.id, j.priority, j.run_at FROM jobs j
                    WHERE j.state = 'available' AND j.concurrency_key IS NULL AND j.type = t.type AND j.run_at <= now() AND j.tags <@ p_tags
                    ORDER BY j.priority, j.run_at, j.id LIMIT p_k FOR UPDATE SKIP LOCKED) l
                ORDER BY l.priority, l.run_at, l.id LIMIT p_k) c;
        END IF;
    ELSE
        v_flow := ARRAY(SELECT DISTINCT t FROM unnest(p_types) AS t ORDER BY t);
        FOREACH v_t IN ARRAY v_flow LOOP
            PERFORM pg_advisory_xact_lock(hashtext(current_schema() || '.job_limits'), hashtext(v_t));
        END LOOP;
        v_ids := '{}';
        v_start := floor(random() * cardinality(v_flow))::integer;
        FOR i IN 0 .. cardinality(v_flow) - 1 LOOP
            EXIT WHEN cardinality(v_ids) >= p_k;
            v_t := v_flow[(v_start + i) % cardinality(v_flow) + 1];
            SELECT * INTO r FROM claim_type(v_t, p_tags, p_k - cardinality(v_ids), greatest(p_now - cardinality(v_ids), 0));
            v_ids := v_ids || r.ids;
            IF r.slot THEN
                v_slots := v_slots || v_t;
            END IF;
            v_limited := greatest(v_limited, r.limited);
            v_next := least(v_next, r.wait_ms);
        END LOOP;
        IF cardinality(v_ids) = 0 THEN
            v_ids := NULL;
        END IF;
    END IF;
    IF coalesce(cardinality(v_ids), 0) < p_k AND v_limited = 0 THEN
        -- Short: were due jobs skipped because another transaction held
        -- them? (A domain must not park on those.)
        SELECT EXISTS (SELECT 1 FROM jobs f
                WHERE f.state = 'available' AND f.concurrency_key IS NULL AND f.run_at <= now() AND f.type = ANY(p_types)
                  AND f.tags <@ p_tags AND NOT (f.id = ANY(coalesce(v_ids, '{}'))))
            OR EXISTS (SELECT 1 FROM jobs f
                WHERE f.state = 'available' AND f.concurrency_key IS NOT NULL AND f.run_at <= now() AND f.type = ANY(p_types)
                  AND f.tags <@ p_tags AND NOT (f.id = ANY(coalesce(v_ids, '{}'))))
            INTO v_skipped;
    END IF;
    IF v_ids IS NULL THEN
        RETURN QUERY SELECT NULL::uuid, NULL::text, NULL::jsonb, NULL::jsonb, NULL::integer, NULL::integer,
            NULL::smallint, NULL::bigint, NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::bigint,
            v_next, v_skipped, v_limited, false;
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE jobs j SET state = 'running', attempt = j.attempt + 1, lease_token = gen_random_uuid(),
           lease_expires_at = now() + p_lease_ms * interval '1 millisecond', worker = p_worker, started_at = now()
    WHERE j.id = ANY(v_ids)
    RETURNING j.id, j.type, j.args, j.tags, j.attempt, j.max_attempts, j.priority, j.timeout_ms, j.lease_token,
              j.created_at, j.run_at, greatest(0, extract(epoch FROM now() - j.run_at) * 1e6)::bigint, v_next, v_skipped,
              v_limited, j.type = ANY(v_slots);
END
$$;

-- The claim of version 6, for processes of that version while a rolling
-- upgrade runs: the claim above, every job wanted now.
CREATE OR REPLACE FUNCTION claim(p_types text[], p_tags jsonb, p_k integer, p_lease_ms bigint, p_worker text)
RETURNS TABLE (id uuid, type text, args jsonb, tags jsonb, attempt integer, max_attempts integer,
               priority smallint, timeout_ms bigint, lease_token uuid, created_at timestamptz,
               run_at timestamptz, waited_us bigint, next_ms bigint, skipped boolean)
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $$
    SELECT c.id, c.type, c.args, c.tags, c.attempt, c.max_attempts, c.priority, c.timeout_ms, c.lease_token,
           c.created_at, c.run_at, c.waited_us, NULL::bigint, c.skipped
    FROM claim(p_types, p_tags, p_k, p_k, p_lease_ms, p_worker) c
$$;

CREATE OR REPLACE VIEW all_jobs AS
    SELECT id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms, worker,
           ordering_key, unique_key, result, last_error, errors, created_at, started_at, finished_at,
           NULL::timestamptz AS expires_at, concurrency_key
    FROM jobs
    UNION ALL
    SELECT id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms, worker,
           ordering_key, unique_key, result, last_error, errors, created_at, started_at, finished_at, expires_at,
           concurrency_key
    FROM job_history;

-- Finished jobs keep their concurrency key: finish() and retire() of
-- version 6, with the column.

CREATE OR REPLACE FUNCTION retire(p_limit integer, p_keep_completed_ms bigint, p_keep_failed_ms bigint) RETURNS integer
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
                                 finished_at, expires_at, concurrency_key)
        SELECT id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms,
               worker, ordering_key, unique_key, result, last_error, errors, created_at, started_at,
               COALESCE(finished_at, now()),
               COALESCE(finished_at, now()) + CASE WHEN state = 'completed' THEN p_keep_completed_ms ELSE p_keep_failed_ms END
                   * interval '1 millisecond',
               concurrency_key
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

CREATE OR REPLACE FUNCTION finish(p_ids uuid[], p_tokens uuid[], p_states text[], p_delay_ms bigint[], p_attempt_delta integer[],
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
                                 finished_at, expires_at, concurrency_key)
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
                   * interval '1 millisecond',
               m.concurrency_key
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
