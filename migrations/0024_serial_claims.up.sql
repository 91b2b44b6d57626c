-- Claims of a type take turns (version 24).
--
-- Every claim now takes, after its types' limit locks, each type's claim
-- lock (pg_advisory_xact_lock on schema.job_claims and the type, in the
-- same ascending hashtext order), which until this version only the
-- claims of limited or keyed types took. So one claim of a type runs at a
-- time, across every process; the next starts on a snapshot that sees
-- the previous one's jobs as taken.
--
-- Why: with many worker processes claiming one type at once, a claim
-- whose snapshot predated another claim's commit met that claim's jobs in
-- the available-jobs index, and FOR UPDATE SKIP LOCKED, finding the row
-- updated by a committed transaction, followed it to its newest version,
-- locked it, rechecked it (running: not a match) and skipped it -- keeping
-- the lock until its own commit. The worker holding the job then found it
-- busy when it wrote its outcome and sent it through the slow lane (a
-- transaction of five statements a batch); and each claim walked past the
-- rows the claims in flight had locked. bench/cmd/scale, 32 worker
-- processes, 20,000 jobs: 1,984 jobs/s at 749 us of server CPU a job and
-- 2.2 statements a job before, 33,742 jobs/s, 41 us and 0.025 after
-- (one process: about 60,000 jobs/s either way). Claims of a type queue
-- on the lock instead; each is one short statement.
--
-- Lock order: unchanged (internal/store/graph.go): limit locks shared,
-- then claim locks, both in ascending hashtext(type) order, then the job
-- rows with SKIP LOCKED. No caller transaction takes a claim lock.
--
-- Rolling upgrade: same signature and columns as version 20's, so
-- processes of every version call it unchanged.
CREATE OR REPLACE FUNCTION claim_jobs(p_types text[], p_tags jsonb, p_k integer, p_now integer, p_lease_ms bigint, p_worker text)
RETURNS TABLE (id uuid, type text, args jsonb, tags jsonb, attempt integer, max_attempts integer,
               priority smallint, timeout_ms bigint, lease_token uuid, created_at timestamptz,
               run_at timestamptz, waited_us bigint, next_ms bigint, skipped boolean, limited smallint, slot boolean,
               meta jsonb, prereqs uuid[])
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET synchronous_commit = on
AS $$
#variable_conflict use_column
DECLARE
    v_ids     uuid[];
    v_skipped boolean;
    v_limited smallint := 0;
    v_next    bigint;
    v_types   text[];
    v_flow    text[];
    v_slots   text[] := '{}';
    v_start   integer;
    v_t       text;
    r         record;
BEGIN
    IF EXISTS (SELECT 1 FROM paused_types) THEN
        p_types := ARRAY(SELECT t FROM unnest(p_types) AS t WHERE NOT EXISTS (SELECT 1 FROM paused_types p WHERE p.type = t));
        IF cardinality(p_types) = 0 THEN
            RETURN QUERY SELECT NULL::uuid, NULL::text, NULL::jsonb, NULL::jsonb, NULL::integer, NULL::integer,
                NULL::smallint, NULL::bigint, NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::bigint,
                NULL::bigint, false, 0::smallint, false, NULL::jsonb, NULL::uuid[];
            RETURN;
        END IF;
    END IF;
    v_types := ARRAY(SELECT d.t FROM (SELECT DISTINCT t FROM unnest(p_types) AS t) d ORDER BY hashtext(d.t), d.t);
    PERFORM pg_advisory_xact_lock_shared(hashtext(current_schema() || '.job_limits'), hashtext(t))
    FROM unnest(v_types) WITH ORDINALITY AS u(t, i) ORDER BY u.i;
    -- One claim of a type at a time, whichever path it takes (version 24).
    PERFORM pg_advisory_xact_lock(hashtext(current_schema() || '.job_claims'), hashtext(t))
    FROM unnest(v_types) WITH ORDINALITY AS u(t, i) ORDER BY u.i;
    IF NOT EXISTS (SELECT 1 FROM job_limits l WHERE l.type = ANY(p_types))
       AND NOT EXISTS (SELECT 1 FROM jobs f WHERE f.state = 'available' AND f.concurrency_key IS NOT NULL AND f.type = ANY(p_types)) THEN
        IF cardinality(p_types) = 1 THEN
            SELECT array_agg(n.id) INTO v_ids FROM (
                SELECT j.id FROM jobs j
                WHERE j.state = 'available' AND j.concurrency_key IS NULL AND j.type = p_types[1] AND j.run_at <= now() AND j.tags <@ p_tags
                ORDER BY j.priority, j.run_at, j.id LIMIT p_k FOR UPDATE SKIP LOCKED) n;
        ELSE
            SELECT array_agg(c.id) INTO v_ids FROM (
                SELECT l.id FROM unnest(v_types) AS t(type) CROSS JOIN LATERAL (
                    SELECT j.id, j.priority, j.run_at FROM jobs j
                    WHERE j.state = 'available' AND j.concurrency_key IS NULL AND j.type = t.type AND j.run_at <= now() AND j.tags <@ p_tags
                    ORDER BY j.priority, j.run_at, j.id LIMIT p_k FOR UPDATE SKIP LOCKED) l
                ORDER BY l.priority, l.run_at, l.id LIMIT p_k) c;
        END IF;
    ELSE
        v_flow := v_types;
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
            v_next, v_skipped, v_limited, false, NULL::jsonb, NULL::uuid[];
        RETURN;
    END IF;
    -- In the order the jobs were chosen (v_ids): the UPDATE meets them in
    -- heap order.
    RETURN QUERY
    WITH u AS (
        UPDATE jobs j SET state = 'running', attempt = j.attempt + 1, lease_token = gen_random_uuid(),
               lease_expires_at = now() + p_lease_ms * interval '1 millisecond', worker = p_worker, started_at = now(),
               progress = NULL
        WHERE j.id = ANY(v_ids)
        RETURNING j.id AS u_id, j.type AS u_type, j.args AS u_args, j.tags AS u_tags, j.attempt AS u_attempt,
                  j.max_attempts AS u_max_attempts, j.priority AS u_priority, j.timeout_ms AS u_timeout_ms,
                  j.lease_token AS u_lease_token, j.created_at AS u_created_at, j.run_at AS u_run_at,
                  greatest(0, extract(epoch FROM now() - j.run_at) * 1e6)::bigint AS u_waited_us,
                  j.type = ANY(v_slots) AS u_slot, j.meta AS u_meta, j.prereqs AS u_prereqs)
    SELECT u.u_id, u.u_type, u.u_args, u.u_tags, u.u_attempt, u.u_max_attempts, u.u_priority, u.u_timeout_ms,
           u.u_lease_token, u.u_created_at, u.u_run_at, u.u_waited_us, v_next, v_skipped, v_limited, u.u_slot,
           u.u_meta, u.u_prereqs
    FROM u JOIN unnest(v_ids) WITH ORDINALITY AS o(o_id, o_n) ON o.o_id = u.u_id
    ORDER BY o.o_n;
END
$$;
