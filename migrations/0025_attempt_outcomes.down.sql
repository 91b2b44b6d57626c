-- Back to version 24: finish() and retire() of version 23 (the outcome
-- named from the error text, each figure computed twice), latency_hist()
-- of version 23 (its body, comment included, is what the catalog holds),
-- then finish() with outcomes and attempt_outcome() dropped. Error
-- entries written meanwhile keep the outcomes they were given.

-- The histogram of latencies p_ms (NULLs skipped; NULL when none).
CREATE OR REPLACE FUNCTION latency_hist(p_ms float8[]) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    h bigint[] := '{}';
    x float8;
    s integer;
BEGIN
    FOREACH x IN ARRAY p_ms LOOP
        CONTINUE WHEN x IS NULL;
        -- 4 * log2(ms + 1), as latency_slot, in float8 (no numeric per job).
        s := least(127, floor(4 * ln(greatest(x, 0) + 1) / 0.6931471805599453))::integer + 1;
        IF s > cardinality(h) THEN
            h := h || array_fill(0::bigint, ARRAY[s - cardinality(h)]);
        END IF;
        h[s] := h[s] + 1;
    END LOOP;
    RETURN CASE WHEN cardinality(h) = 0 THEN NULL ELSE h END;
END
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
        WHERE j.id = l.id AND (l.fstate IN ('completed', 'discarded', 'failed', 'cancelled') OR (l.cancel_requested AND l.fstate = 'available'))
        RETURNING j.*, CASE WHEN l.fstate = 'available' THEN 'cancelled'
                            WHEN l.fstate = 'discarded' THEN 'completed' ELSE l.fstate END AS end_state,
                  -- Deleted at completion, not moved: asked for, and
                  -- nobody needs it kept (no result, no Wait; jobs with
                  -- dependents never come here, see p_exclude).
                  l.fstate = 'discarded' AND l.result IS NULL AND NOT l.notify_done AS gone,
                  l.fstate, l.attempt_delta, l.result AS fresult, l.err, l.progress AS fprogress
    ), hist AS (
        INSERT INTO job_history (id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms,
                                 worker, ordering_key, unique_key, result, last_error, errors, created_at, started_at,
                                 finished_at, expires_at, concurrency_key, meta, progress, prereqs)
        SELECT m.id, m.type, m.args, m.tags, m.end_state,
               m.priority, m.run_at, m.attempt + m.attempt_delta, m.max_attempts, m.timeout_ms,
               m.worker, m.ordering_key, m.unique_key, m.fresult,
               CASE WHEN m.end_state = 'completed' THEN NULL
                    WHEN m.fstate = 'available' THEN 'cancelled by request' || COALESCE('; its last attempt ended with: ' || m.err, '')
                    ELSE COALESCE(m.err, m.last_error) END,
               CASE WHEN m.err IS NULL THEN m.errors
                    ELSE (CASE WHEN jsonb_array_length(m.errors) >= p_max_errors THEN m.errors - 0 ELSE m.errors END)
                         || jsonb_build_array(jsonb_build_object('attempt', m.attempt, 'at', now(), 'error', m.err,
                             'worker', m.worker, 'started_at', m.started_at,
                             'ms', round(extract(epoch FROM now() - m.started_at) * 1000)::bigint,
                             'outcome', CASE WHEN m.end_state = 'cancelled' OR m.err LIKE 'backlog: job cancelled%' THEN 'cancelled'
                                        WHEN m.err LIKE 'backlog: job timeout%' THEN 'timeout'
                                        WHEN m.err LIKE 'backlog: lease lost%' THEN 'lease lost'
                                        WHEN m.err LIKE 'panic:%' THEN 'panic' ELSE 'error' END)) END,
               m.created_at, m.started_at, now(),
               now() + CASE WHEN m.end_state = 'completed' THEN p_keep_completed_ms ELSE p_keep_failed_ms END
                   * interval '1 millisecond',
               m.concurrency_key, m.meta, COALESCE(m.fprogress, m.progress), m.prereqs
        FROM moved m WHERE NOT m.gone
    ), cnt AS (
        -- In type and state order: no two writers lock counters in
        -- opposite orders.
        INSERT INTO job_counts AS c (bucket, type, state, shard, n, wait_ms, run_ms, wait_hist, run_hist)
        -- Every job ended, deleted ones too, under the state 'discarded'
        -- (which readers count as completed; List sizes its windows of
        -- job_history by the other states' counts).
        SELECT date_trunc('minute', now()), m.type, CASE WHEN m.gone THEN 'discarded' ELSE m.end_state END,
               (pg_backend_pid() % 32)::smallint, count(*),
               COALESCE(sum(extract(epoch FROM m.started_at - m.run_at) * 1000), 0)::bigint,
               COALESCE(sum(extract(epoch FROM now() - m.started_at) * 1000), 0)::bigint,
               latency_hist(array_agg(extract(epoch FROM m.started_at - m.run_at)::float8 * 1000)),
               latency_hist(array_agg(extract(epoch FROM now() - m.started_at)::float8 * 1000))
        FROM moved m GROUP BY 2, 3 ORDER BY 2, 3
        ON CONFLICT (bucket, type, state, shard) DO UPDATE
        SET n = c.n + EXCLUDED.n, wait_ms = c.wait_ms + EXCLUDED.wait_ms, run_ms = c.run_ms + EXCLUDED.run_ms,
            wait_hist = hist_add(c.wait_hist, EXCLUDED.wait_hist), run_hist = hist_add(c.run_hist, EXCLUDED.run_hist)
    ), upd AS (
        UPDATE jobs j SET
            state = CASE WHEN l.delay_ms > 0 THEN 'scheduled' ELSE 'available' END,
            run_at = CASE WHEN l.delay_ms >= 0 THEN now() + l.delay_ms * interval '1 millisecond' ELSE j.run_at END,
            attempt = j.attempt + l.attempt_delta,
            result = l.result,
            last_error = COALESCE(l.err, j.last_error),
            errors = CASE WHEN l.err IS NULL THEN j.errors
                          ELSE (CASE WHEN jsonb_array_length(j.errors) >= p_max_errors THEN j.errors - 0 ELSE j.errors END)
                               || jsonb_build_array(jsonb_build_object('attempt', j.attempt, 'at', now(), 'error', l.err,
                                   'worker', j.worker, 'started_at', j.started_at,
                                   'ms', round(extract(epoch FROM now() - j.started_at) * 1000)::bigint,
                                   'outcome', CASE WHEN 'available' = 'cancelled' OR l.err LIKE 'backlog: job cancelled%' THEN 'cancelled'
                                        WHEN l.err LIKE 'backlog: job timeout%' THEN 'timeout'
                                        WHEN l.err LIKE 'backlog: lease lost%' THEN 'lease lost'
                                        WHEN l.err LIKE 'panic:%' THEN 'panic' ELSE 'error' END)) END,
            progress = COALESCE(l.progress, j.progress),
            lease_token = NULL, lease_expires_at = NULL
        FROM l WHERE j.id = l.id AND l.fstate = 'available' AND NOT l.cancel_requested
        RETURNING j.id, j.state
    ), notes AS (
        SELECT count(pg_notify(p_channel, posting(p_done => m.id))) AS n FROM moved m WHERE m.notify_done
    )
    SELECT coalesce(array_agg(w.id), '{}'), array_agg(w.state), coalesce(array_agg(w.id) FILTER (WHERE w.ended), '{}'),
           (SELECT n FROM notes) -- referenced, so that the notices are sent
    INTO w_ids, w_states, v_ended, v_notes
    FROM (SELECT m.id, m.end_state AS state, true AS ended FROM moved m UNION ALL SELECT u.id, u.state, false FROM upd u) w;

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
                                 finished_at, expires_at, concurrency_key, meta, progress, prereqs)
        SELECT id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms,
               worker, ordering_key, unique_key, result, last_error, errors, created_at, started_at,
               COALESCE(finished_at, now()),
               COALESCE(finished_at, now()) + CASE WHEN state = 'completed' THEN p_keep_completed_ms ELSE p_keep_failed_ms END
                   * interval '1 millisecond',
               concurrency_key, meta, progress, prereqs
        FROM m RETURNING type, state, run_at, started_at, finished_at
    ), c AS (
        -- In type and state order, like finish(): no two writers lock
        -- counters in opposite orders.
        INSERT INTO job_counts AS c (bucket, type, state, shard, n, wait_ms, run_ms, wait_hist, run_hist)
        SELECT date_trunc('minute', h.finished_at), h.type, h.state, (pg_backend_pid() % 32)::smallint, count(*),
               COALESCE(sum(extract(epoch FROM h.started_at - h.run_at) * 1000), 0)::bigint,
               COALESCE(sum(extract(epoch FROM h.finished_at - h.started_at) * 1000), 0)::bigint,
               latency_hist(array_agg(extract(epoch FROM h.started_at - h.run_at)::float8 * 1000)),
               latency_hist(array_agg(extract(epoch FROM h.finished_at - h.started_at)::float8 * 1000))
        FROM h GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (bucket, type, state, shard) DO UPDATE
        SET n = c.n + EXCLUDED.n, wait_ms = c.wait_ms + EXCLUDED.wait_ms, run_ms = c.run_ms + EXCLUDED.run_ms,
            wait_hist = hist_add(c.wait_hist, EXCLUDED.wait_hist), run_hist = hist_add(c.run_hist, EXCLUDED.run_hist)
    )
    SELECT count(*)::integer FROM h
$$;

DROP FUNCTION finish(uuid[], uuid[], text[], bigint[], integer[], jsonb[], text[], uuid[], text, bigint, bigint, integer, jsonb[], text[]);
DROP FUNCTION attempt_outcome(text);
