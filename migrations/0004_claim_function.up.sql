-- The claim as a function. PL/pgSQL keeps the plans of its statements for
-- the session, so a claim is no longer parsed and planned on every call
-- (planning took 0.55 ms against 0.25 ms of execution for a one-job claim).
-- A cached plan made while the table was empty could be a sequential scan
-- and stay one as the table grows (measured: 2-5x slower claims); with
-- enable_seqscan off while the function plans, every cached plan reads the
-- partial indexes, which is right whatever the table's size.
--
-- search_path is captured from the migration's session (the queue's schema).

CREATE FUNCTION claim(p_types text[], p_tags jsonb, p_k integer, p_lease_ms bigint, p_worker text)
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
    v_got integer;
    v_next bigint;
    v_skipped boolean;
BEGIN
    IF cardinality(p_types) = 1 THEN
        -- One type: a range scan of the claim index in claim order.
        SELECT array_agg(n.id) INTO v_ids FROM (
            SELECT j.id FROM jobs j
            WHERE j.state = 'available' AND j.type = p_types[1] AND j.run_at <= now() AND j.tags <@ p_tags
            ORDER BY j.priority, j.run_at, j.id LIMIT p_k FOR UPDATE SKIP LOCKED) n;
    ELSE
        -- Several types: one ordered range scan per type, merged (a single
        -- scan with type = ANY would sort every available job of the types).
        SELECT array_agg(c.id) INTO v_ids FROM (
            SELECT l.id FROM unnest(p_types) AS t(type) CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at FROM jobs j
                WHERE j.state = 'available' AND j.type = t.type AND j.run_at <= now() AND j.tags <@ p_tags
                ORDER BY j.priority, j.run_at, j.id LIMIT p_k FOR UPDATE SKIP LOCKED) l
            ORDER BY l.priority, l.run_at, l.id LIMIT p_k) c;
    END IF;
    v_got := coalesce(cardinality(v_ids), 0);
    IF v_got < p_k THEN
        -- Short: how long until the domain's next scheduled job, and
        -- whether due jobs were skipped because another transaction held
        -- them (a domain must not park on those).
        SELECT ceil(extract(epoch FROM f.run_at - now()) * 1000)::bigint INTO v_next FROM jobs f
        WHERE f.state = 'available' AND f.run_at > now() AND f.type = ANY(p_types) AND f.tags <@ p_tags
        ORDER BY f.run_at LIMIT 1;
        SELECT EXISTS (SELECT 1 FROM jobs f
            WHERE f.state = 'available' AND f.run_at <= now() AND f.type = ANY(p_types) AND f.tags <@ p_tags
              AND NOT (f.id = ANY(coalesce(v_ids, '{}')))) INTO v_skipped;
    END IF;
    IF v_got = 0 THEN
        RETURN QUERY SELECT NULL::uuid, NULL::text, NULL::jsonb, NULL::jsonb, NULL::integer, NULL::integer,
            NULL::smallint, NULL::bigint, NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::bigint, v_next, v_skipped;
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE jobs j SET state = 'running', attempt = j.attempt + 1, lease_token = gen_random_uuid(),
           lease_expires_at = now() + p_lease_ms * interval '1 millisecond', worker = p_worker, started_at = now()
    WHERE j.id = ANY(v_ids)
    RETURNING j.id, j.type, j.args, j.tags, j.attempt, j.max_attempts, j.priority, j.timeout_ms, j.lease_token,
              j.created_at, j.run_at, (extract(epoch FROM now() - j.run_at) * 1e6)::bigint, v_next, v_skipped;
END
$$;
