DROP FUNCTION IF EXISTS finish(uuid[], uuid[], text[], bigint[], integer[], jsonb[], text[], uuid[], text, bigint, bigint, integer);
DROP FUNCTION IF EXISTS promote(integer);
DROP FUNCTION IF EXISTS summarize_history();
DROP FUNCTION IF EXISTS retire(integer, bigint, bigint);
DROP FUNCTION IF EXISTS drop_expired_history(integer);
DROP FUNCTION IF EXISTS history_partition(date);
DROP VIEW IF EXISTS all_jobs;
DROP TABLE IF EXISTS job_counts, job_counts_hourly, paused_types;

-- Finished jobs back into jobs.
INSERT INTO jobs (id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms, worker,
                  ordering_key, unique_key, result, last_error, errors, created_at, started_at, finished_at)
SELECT id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms, worker,
       ordering_key, unique_key, result, last_error, errors, created_at, started_at, finished_at
FROM job_history
ON CONFLICT (id) DO NOTHING;
DROP TABLE job_history;

-- Scheduled jobs become available jobs with a future run_at again.
UPDATE jobs SET state = 'available' WHERE state = 'scheduled';
DROP INDEX jobs_ordering_live_idx;
CREATE INDEX jobs_ordering_live_idx ON jobs (ordering_key)
    WHERE ordering_key IS NOT NULL AND state IN ('blocked', 'available', 'running');
DROP INDEX jobs_unique_key_idx;
CREATE UNIQUE INDEX jobs_unique_key_idx ON jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('blocked', 'available', 'running');
DROP INDEX jobs_scheduled_idx;
CREATE INDEX jobs_run_at_idx ON jobs (run_at) WHERE state = 'available';
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check,
    ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('blocked', 'available', 'running', 'completed', 'failed', 'cancelled'));

-- The claim of version 5 (migration 0004's), which reports next_ms.
DROP FUNCTION claim(text[], jsonb, integer, bigint, text);
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
    v_got := coalesce(cardinality(v_ids), 0);
    IF v_got < p_k THEN
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
