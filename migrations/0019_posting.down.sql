-- Back to version 18: enqueue_posting() of version 10, enqueue() of
-- version 18 and finish() of version 12, which build their payloads
-- themselves; posting() dropped.
CREATE FUNCTION enqueue_posting(p_type text, p_tags jsonb) RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN p.full IS NOT NULL AND octet_length(p.full) <= 7000 THEN p.full
                ELSE jsonb_build_object('type', p_type)::text END
    FROM (SELECT CASE WHEN p_tags IS NOT NULL AND p_tags <> '{}'::jsonb
                      THEN jsonb_build_object('type', p_type, 'tags', p_tags)::text END AS full) p
$$;

CREATE OR REPLACE FUNCTION finish(p_ids uuid[], p_tokens uuid[], p_states text[], p_delay_ms bigint[], p_attempt_delta integer[],
                       p_results jsonb[], p_errs text[], p_exclude uuid[], p_channel text, p_keep_completed_ms bigint,
                       p_keep_failed_ms bigint, p_max_errors integer, p_progress jsonb[])
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
        SELECT t.id, t.state AS fstate, t.delay_ms, t.attempt_delta, t.result, t.err, t.progress, x.cancel_requested, x.notify_done
        FROM unnest(p_ids, p_tokens, p_states, p_delay_ms, p_attempt_delta, p_results, p_errs, p_progress)
             AS t(id, token, state, delay_ms, attempt_delta, result, err, progress)
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
        RETURNING j.*, l.fstate, l.attempt_delta, l.result AS fresult, l.err, l.progress AS fprogress
    ), hist AS (
        INSERT INTO job_history (id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms,
                                 worker, ordering_key, unique_key, result, last_error, errors, created_at, started_at,
                                 finished_at, expires_at, concurrency_key, meta, progress, prereqs)
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
               m.concurrency_key, m.meta, COALESCE(m.fprogress, m.progress), m.prereqs
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
            progress = COALESCE(l.progress, j.progress),
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

CREATE OR REPLACE FUNCTION enqueue(
    type         text,
    args         jsonb       DEFAULT '{}',
    tags         jsonb       DEFAULT '{}',
    run_at       timestamptz DEFAULT now(),
    priority     integer     DEFAULT 0,
    max_attempts integer     DEFAULT 25,
    timeout      interval    DEFAULT '0',
    ordering_key text        DEFAULT NULL,
    unique_key   text        DEFAULT NULL,
    depends_on   uuid[]      DEFAULT NULL,
    concurrency_key text     DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    -- The parameters' names are the jobs table's columns: read them once.
    v_type     text        := $1;
    v_args     jsonb       := coalesce($2, '{}');
    v_tags     jsonb       := coalesce($3, '{}');
    v_run_at   timestamptz := coalesce($4, now());
    v_priority integer     := coalesce($5, 0);
    v_max      integer     := coalesce($6, 25);
    v_timeout  interval    := coalesce($7, interval '0');
    v_okey     text        := nullif($8, '');
    v_ukey     text        := nullif($9, '');
    v_ckey     text        := nullif($11, '');
    v_deps     uuid[]      := ARRAY(SELECT unnest($10));

    v_id       uuid        := new_job_id();
    v_n        bigint;
    v_key      text;
    v_val      jsonb;
    v_size     integer     := 2;
    v_timeout_ms bigint;
    v_state    text        := 'available';
    v_in_ms    bigint;
    v_blocked  integer     := 0;
    v_last_err text;
    v_tail     uuid;
    v_lock     uuid[];
    v_states   jsonb       := '{}';   -- prerequisite ID → its state once locked
    v_unknown  text;
    v_dep      uuid;
    v_dep_st   text;
    v_done     uuid[]      := '{}'; -- prerequisites that had already completed
    v_edge_p   uuid[]      := '{}';
    v_edge_k   text[]      := '{}';
    v_holder   uuid;
    v_posts    text[]      := '{}';
    v_inserted boolean     := false;
BEGIN
    -- Validation, in the order of spec.go's buildJob.
    IF v_type IS NULL OR v_type = '' THEN
        PERFORM enqueue_invalid('type', 'must not be empty');
    ELSIF octet_length(v_type) > 200 THEN
        PERFORM enqueue_invalid('type', format('%s bytes exceeds the 200-byte limit', octet_length(v_type)));
    END IF;
    v_n := octet_length(v_args::text);
    IF v_n > 1048576 THEN
        PERFORM enqueue_invalid('args', format('%s bytes exceeds the 1048576-byte limit', v_n));
    END IF;
    IF jsonb_typeof(v_tags) <> 'object' THEN
        PERFORM enqueue_invalid('tags', format('must be a JSON object of strings, got %s', jsonb_typeof(v_tags)));
    END IF;
    SELECT count(*) INTO v_n FROM jsonb_object_keys(v_tags);
    IF v_n > 32 THEN
        PERFORM enqueue_invalid('tags', format('%s tags exceeds the limit of 32', v_n));
    END IF;
    FOR v_key, v_val IN SELECT t.key, t.value FROM jsonb_each(v_tags) t ORDER BY t.key LOOP
        IF v_key = '' THEN
            PERFORM enqueue_invalid('tags', 'empty tag key');
        ELSIF jsonb_typeof(v_val) <> 'string' THEN
            PERFORM enqueue_invalid('tags', format('tag %s: value must be a string, got %s', to_json(v_key), jsonb_typeof(v_val)));
        ELSIF octet_length(v_key) > 200 OR octet_length(v_val #>> '{}') > 200 THEN
            PERFORM enqueue_invalid('tags', format('tag %s: key and value must be at most 200 bytes', to_json(v_key)));
        END IF;
        v_size := v_size + enqueue_json_bytes(v_key) + enqueue_json_bytes(v_val #>> '{}') + 2;
    END LOOP;
    IF v_size > 4096 THEN
        PERFORM enqueue_invalid('tags', format('%s bytes of tags (JSON) exceeds the 4096-byte limit', v_size));
    END IF;
    IF v_priority < 0 OR v_priority > 100 THEN
        PERFORM enqueue_invalid('priority', format('%s is outside [0, 100]', v_priority));
    END IF;
    IF v_max < 1 OR v_max > 1000000 THEN
        PERFORM enqueue_invalid('max_attempts', format('must be in [1, 1000000], got %s', v_max));
    END IF;
    -- Go's bounds: the years 1 to 9999 (its zero time, year 1's first
    -- instant, is refused too).
    IF NOT isfinite(v_run_at) OR v_run_at <= '0001-01-01 00:00:00+00' OR v_run_at > '9999-12-31 23:59:59+00' THEN
        PERFORM enqueue_invalid('run_at', format('%s is outside the years 1 to 9999', v_run_at));
    END IF;
    IF cardinality(v_deps) > 1000 THEN
        PERFORM enqueue_invalid('depends_on', format('%s prerequisites exceeds the limit of 1000', cardinality(v_deps)));
    END IF;
    IF v_timeout < interval '0' THEN
        PERFORM enqueue_invalid('timeout', format('must not be negative, got %s', v_timeout));
    ELSIF v_timeout > interval '0' AND v_timeout < interval '1 millisecond' THEN
        PERFORM enqueue_invalid('timeout', format('%s is shorter than the 1ms resolution (use 0 for none)', v_timeout));
    END IF;
    v_timeout_ms := ceil(extract(epoch FROM v_timeout) * 1000)::bigint;
    IF v_timeout_ms > 9223372036854 THEN
        -- Go reads it back as a time.Duration.
        PERFORM enqueue_invalid('timeout', format('%s exceeds the limit of 2562047h47m16.854s', v_timeout));
    END IF;
    IF octet_length(v_okey) > 255 THEN
        PERFORM enqueue_invalid('ordering_key', format('%s bytes exceeds the 255-byte limit', octet_length(v_okey)));
    END IF;
    IF octet_length(v_ukey) > 255 THEN
        PERFORM enqueue_invalid('unique_key', format('%s bytes exceeds the 255-byte limit', octet_length(v_ukey)));
    END IF;
    IF octet_length(v_ckey) > 255 THEN
        PERFORM enqueue_invalid('concurrency_key', format('%s bytes exceeds the 255-byte limit', octet_length(v_ckey)));
    END IF;
    IF array_position(v_deps, NULL) IS NOT NULL OR '00000000-0000-0000-0000-000000000000'::uuid = ANY(v_deps) THEN
        PERFORM enqueue_invalid('depends_on', 'nil job ID');
    END IF;

    IF v_okey IS NULL AND v_ukey IS NULL AND cardinality(v_deps) = 0 THEN
        -- A plain job: store.go's insert.
        INSERT INTO jobs (id, type, args, tags, priority, run_at, max_attempts, timeout_ms, state, concurrency_key)
        VALUES (v_id, v_type, v_args, v_tags, v_priority, v_run_at, v_max, v_timeout_ms,
                CASE WHEN v_run_at > now() THEN 'scheduled' ELSE 'available' END, v_ckey)
        RETURNING state, greatest(0, ceil(extract(epoch FROM run_at - now()) * 1000))::bigint INTO v_state, v_in_ms;
        v_inserted := true;
    ELSE
        -- A job in the graph: insert_graph.go's InsertGraph, in the lock
        -- order of graph.go (the ordering key, then the prerequisites in
        -- ID order, FOR KEY SHARE, their states read after the lock).
        v_deps := ARRAY(SELECT d FROM unnest(v_deps) WITH ORDINALITY AS u(d, i) GROUP BY d ORDER BY min(u.i));
        IF v_okey IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock(hashtext(current_schema()), hashtext(v_okey));
            -- The key's row, under the key's lock (version 14): at REPEATABLE
            -- READ or SERIALIZABLE, a job of the key enqueued after this
            -- transaction's snapshot makes this fail (serialization_failure)
            -- instead of leaving the job unseen and the chain forked.
            INSERT INTO job_ordering_keys AS k (key, tail) VALUES (v_okey, v_id)
            ON CONFLICT (key) DO UPDATE SET tail = EXCLUDED.tail;
            -- The tail of the key's chain: its live job with no live successor.
            SELECT j.id INTO v_tail FROM jobs j
            WHERE j.ordering_key = v_okey AND j.state IN ('blocked', 'scheduled', 'available', 'running')
              AND NOT EXISTS (SELECT 1 FROM job_edges e JOIN jobs n ON n.id = e.job
                              WHERE e.prereq = j.id AND e.kind = 'order' AND n.state IN ('blocked', 'scheduled', 'available', 'running'))
            ORDER BY j.created_at DESC, j.id DESC LIMIT 1;
        END IF;
        v_lock := ARRAY(SELECT DISTINCT x FROM unnest(v_deps || v_tail) AS x WHERE x IS NOT NULL);
        IF cardinality(v_lock) > 0 THEN
            SELECT coalesce(jsonb_object_agg(l.id::text, l.state), '{}'),
                   coalesce(array_agg(enqueue_posting(l.type, l.tags)) FILTER (WHERE l.state = 'available'), '{}')
            INTO v_states, v_posts
            FROM (SELECT j.id, j.state, j.type, j.tags FROM jobs j WHERE j.id = ANY(v_lock) ORDER BY j.id FOR KEY SHARE) l;
            -- Not live: finished (in job_history) or unknown.
            v_lock := ARRAY(SELECT x FROM unnest(v_lock) AS x WHERE NOT v_states ? x::text);
            IF cardinality(v_lock) > 0 THEN
                SELECT v_states || coalesce(jsonb_object_agg(h.id::text, h.state), '{}') INTO v_states
                FROM job_history h WHERE h.id = ANY(v_lock);
                SELECT string_agg(x::text, ' ' ORDER BY x::text) INTO v_unknown
                FROM unnest(v_lock) AS x WHERE NOT v_states ? x::text;
                IF v_unknown IS NOT NULL THEN
                    PERFORM enqueue_invalid('depends_on', format('unknown prerequisite job IDs: [%s]', v_unknown)
                        || CASE WHEN current_setting('transaction_isolation') <> 'read committed' THEN format(
                               ' (or committed after this %s transaction''s snapshot was taken, which it cannot see: retry the transaction)',
                               upper(current_setting('transaction_isolation'))) ELSE '' END);
                END IF;
            END IF;
        END IF;
        -- Dependencies first: a failed or cancelled prerequisite cancels
        -- the job, an unfinished one blocks it; then the chain.
        FOREACH v_dep IN ARRAY v_deps LOOP
            v_dep_st := v_states ->> v_dep::text;
            IF v_dep_st = 'completed' THEN
                v_done := v_done || v_dep;
                CONTINUE;
            ELSIF v_dep_st IN ('failed', 'cancelled') THEN
                IF v_last_err IS NULL THEN
                    v_last_err := format('cancelled: prerequisite %s %s', v_dep, v_dep_st);
                    v_state := 'cancelled';
                END IF;
            ELSE
                v_edge_p := v_edge_p || v_dep;
                v_edge_k := v_edge_k || 'depends'::text;
                v_blocked := v_blocked + 1;
            END IF;
        END LOOP;
        IF v_state <> 'cancelled' AND v_blocked > 0 THEN
            v_state := 'blocked';
        END IF;
        IF v_tail IS NOT NULL AND v_state <> 'cancelled'
           AND (v_states ->> v_tail::text) NOT IN ('completed', 'failed', 'cancelled') THEN
            v_edge_p := v_edge_p || v_tail;
            v_edge_k := v_edge_k || 'order'::text;
            v_blocked := v_blocked + 1;
            v_state := 'blocked';
        END IF;
        -- A unique job arriving cancelled is a duplicate when a live job
        -- holds its key (the unique index covers live jobs only).
        IF v_ukey IS NOT NULL AND v_state = 'cancelled' THEN
            SELECT j.id INTO v_holder FROM jobs j WHERE j.unique_key = v_ukey AND j.state IN ('blocked', 'scheduled', 'available', 'running');
        END IF;
        -- A holder that finishes between the insert and the look-up frees
        -- the key: insert again.
        FOR v_attempt IN 1..5 LOOP
            EXIT WHEN v_holder IS NOT NULL;
            INSERT INTO jobs (id, type, args, tags, priority, run_at, max_attempts, timeout_ms, state, blocked_by,
                              ordering_key, unique_key, last_error, finished_at, concurrency_key, prereqs)
            VALUES (v_id, v_type, v_args, v_tags, v_priority, v_run_at, v_max, v_timeout_ms,
                    CASE WHEN v_state = 'available' AND v_run_at > now() THEN 'scheduled' ELSE v_state END,
                    v_blocked, v_okey, v_ukey, v_last_err, CASE WHEN v_state = 'cancelled' THEN now() END, v_ckey,
                    CASE WHEN cardinality(v_deps) > 0 THEN v_deps END)
            ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('blocked', 'scheduled', 'available', 'running')
            DO NOTHING
            RETURNING state, greatest(0, ceil(extract(epoch FROM run_at - now()) * 1000))::bigint INTO v_state, v_in_ms;
            IF FOUND THEN
                v_inserted := true;
                EXIT;
            END IF;
            SELECT j.id INTO v_holder FROM jobs j WHERE j.unique_key = v_ukey AND j.state IN ('blocked', 'scheduled', 'available', 'running');
        END LOOP;
        IF NOT v_inserted AND v_holder IS NULL THEN
            RAISE EXCEPTION 'backlog: the job holding the unique key kept finishing during the insert'
                USING ERRCODE = 'serialization_failure', HINT = 'Transient: call enqueue again.';
        END IF;
        IF v_inserted AND cardinality(v_edge_p) > 0 THEN
            INSERT INTO job_edges (prereq, job, kind)
            SELECT e.p, v_id, e.k FROM unnest(v_edge_p, v_edge_k) AS e(p, k)
            ON CONFLICT DO NOTHING;
        END IF;
        IF v_inserted AND cardinality(v_done) > 0 THEN
            -- Their results are kept (the release that does it for the
            -- others will not come for these); the job lists them already.
            INSERT INTO job_inputs (id, type, result, finished_at)
            SELECT p.id, p.type, p.result, p.finished_at FROM (
                SELECT j.id, j.type, j.result, j.finished_at FROM jobs j WHERE j.id = ANY(v_done) AND j.state = 'completed'
                UNION ALL
                SELECT h.id, h.type, h.result, h.finished_at FROM job_history h WHERE h.id = ANY(v_done) AND h.state = 'completed') p
            WHERE NOT EXISTS (SELECT 1 FROM job_inputs k WHERE k.id = p.id AND k.finished_at IS NOT DISTINCT FROM p.finished_at
                              AND k.kept_at > now() - interval '30 minutes');
        END IF;
    END IF;

    IF v_inserted AND v_state = 'available' THEN
        v_posts := v_posts || enqueue_posting(v_type, v_tags);
    ELSIF v_inserted AND v_state = 'scheduled' THEN
        v_posts := v_posts || jsonb_build_object('sched', true, 'in', v_in_ms)::text;
    END IF;
    PERFORM pg_notify(current_schema() || '.backlog', p) FROM (SELECT DISTINCT p FROM unnest(v_posts) AS p) d;
    RETURN coalesce(v_holder, v_id);
END
$$;

DROP FUNCTION posting(text, jsonb, boolean, bigint, uuid, uuid);
