-- Back to version 21: claim_type of version 9 (keys visited one by one).
CREATE OR REPLACE FUNCTION claim_type(p_type text, p_tags jsonb, p_need integer, p_now integer,
                           OUT ids uuid[], OUT slot boolean, OUT limited smallint, OUT wait_ms bigint)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    l          job_limits%ROWTYPE;
    v_need     integer := p_need;
    v_n        integer;
    v_wait     bigint;
    v_got      uuid[];
    v_cursor   text;
    v_prio     integer := -1000000;
    v_p        integer;
    v_k        text;
    v_last     text;
    v_seen     text;
    v_examined integer;
    v_kt       jsonb := '{}'; -- jobs taken per key, over the priorities
    g_key      text[];
    g_quota    integer[];
    g_taken    integer[];
    v_active   integer;
    v_take     integer;
    v_round    boolean;
    v_nullq    integer;
BEGIN
    ids := '{}';
    limited := 0;
    SELECT * INTO l FROM job_limits WHERE type = p_type;
    slot := l.concurrency IS NOT NULL OR l.key_concurrency IS NOT NULL;
    IF l.concurrency IS NOT NULL THEN
        IF l.running_bound + v_need > l.concurrency THEN
            SELECT count(*) INTO l.running_bound
            FROM (SELECT 1 FROM jobs r WHERE r.state = 'running' AND r.type = p_type LIMIT l.concurrency) r;
        END IF;
        v_n := l.concurrency - l.running_bound; -- free slots (at least)
        IF v_n < v_need THEN
            -- Slots are short: none goes to a prefetch buffer.
            limited := CASE WHEN v_n < p_now THEN 2 ELSE 1 END;
            v_need := greatest(least(v_n, p_now), 0);
        ELSIF p_now + (v_n - p_now) / 4 < v_need THEN
            -- Room, but a buffer takes at most a quarter of the free slots
            -- beyond the callers', so that other processes find some.
            v_need := p_now + (v_n - p_now) / 4;
            limited := 1;
        END IF;
    END IF;
    IF l.key_concurrency IS NOT NULL AND p_now < v_need THEN
        v_need := p_now; -- keyed slots are not held in a prefetch buffer
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
        NULL;
    ELSIF NOT EXISTS (SELECT 1 FROM jobs f WHERE f.state = 'available' AND f.concurrency_key IS NOT NULL AND f.type = p_type)
          AND NOT (l.rate IS NOT NULL AND l.rate_per_key) THEN
        -- No keys: first in, first out.
        SELECT coalesce(array_agg(n.id), '{}') INTO ids FROM (
            SELECT j.id FROM jobs j
            WHERE j.state = 'available' AND j.concurrency_key IS NULL AND j.type = p_type AND j.run_at <= now() AND j.tags <@ p_tags
            ORDER BY j.priority, j.run_at, j.id LIMIT v_need FOR UPDATE SKIP LOCKED) n;
    ELSE
        SELECT c.key INTO v_cursor FROM job_key_cursors c WHERE c.type = p_type;
        -- Jobs without a key: one group, under the '' bucket of a per-key
        -- rate.
        v_nullq := v_need;
        IF l.rate IS NOT NULL AND l.rate_per_key THEN
            SELECT a.allowed, a.wait_ms INTO v_n, v_wait FROM rate_allowance(p_type, '', l.rate, l.rate_period_ms, l.burst) a;
            IF v_n < v_nullq THEN
                v_nullq := v_n;
                IF EXISTS (SELECT 1 FROM jobs j WHERE j.state = 'available' AND j.concurrency_key IS NULL AND j.type = p_type) THEN
                    limited := 2;
                    wait_ms := least(wait_ms, v_wait);
                END IF;
            END IF;
        END IF;
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
            -- The groups, in turn from the cursor; a key a limit leaves no
            -- room does not count towards the v_need groups visited.
            v_active := 0;
            v_examined := 0;
            v_k := coalesce(v_cursor, '');
            v_round := false; -- false: keys after the cursor; true: from the first
            LOOP
                EXIT WHEN v_active >= v_need OR v_examined >= 256;
                v_k := (SELECT j.concurrency_key FROM jobs j
                        WHERE j.state = 'available' AND j.concurrency_key IS NOT NULL AND j.type = p_type
                          AND j.priority = v_prio AND j.concurrency_key > v_k AND j.run_at <= now() AND j.tags <@ p_tags
                        ORDER BY j.concurrency_key LIMIT 1);
                IF v_k IS NULL OR (v_round AND v_cursor IS NOT NULL AND v_k > v_cursor) THEN
                    EXIT WHEN v_round OR v_cursor IS NULL;
                    -- The jobs without a key, then the keys from the first.
                    IF v_nullq > 0 AND EXISTS (SELECT 1 FROM jobs j WHERE j.state = 'available' AND j.concurrency_key IS NULL
                               AND j.type = p_type AND j.priority = v_prio) THEN
                        g_key := g_key || NULL::text; g_quota := g_quota || v_nullq; g_taken := g_taken || 0;
                        v_active := v_active + 1;
                    END IF;
                    v_round := true;
                    v_k := '';
                    CONTINUE;
                END IF;
                v_examined := v_examined + 1;
                v_seen := v_k;
                v_n := v_need;
                IF l.key_concurrency IS NOT NULL THEN
                    -- Running, and taken at a more urgent priority by this
                    -- claim.
                    SELECT least(v_n, l.key_concurrency - count(*) - coalesce((v_kt ->> v_k)::integer, 0)) INTO v_n FROM (
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
            IF v_cursor IS NULL AND v_active < v_need AND v_nullq > 0
               AND EXISTS (SELECT 1 FROM jobs j WHERE j.state = 'available' AND j.concurrency_key IS NULL
                           AND j.type = p_type AND j.priority = v_prio) THEN
                -- No cursor yet: the jobs without a key come last.
                g_key := g_key || NULL::text; g_quota := g_quota || v_nullq; g_taken := g_taken || 0;
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
            FOR i IN 1 .. coalesce(cardinality(g_key), 0) LOOP
                CONTINUE WHEN g_taken[i] = 0;
                IF g_key[i] IS NULL THEN
                    v_nullq := v_nullq - g_taken[i];
                    IF l.rate IS NOT NULL AND l.rate_per_key THEN
                        PERFORM rate_charge(p_type, '', l.rate, l.rate_period_ms, g_taken[i]);
                    END IF;
                ELSE
                    v_kt := v_kt || jsonb_build_object(g_key[i], coalesce((v_kt ->> g_key[i])::integer, 0) + g_taken[i]);
                    IF l.rate IS NOT NULL AND l.rate_per_key THEN
                        PERFORM rate_charge(p_type, g_key[i], l.rate, l.rate_period_ms, g_taken[i]);
                    END IF;
                END IF;
            END LOOP;
            IF v_last IS NULL AND v_examined >= 256 THEN
                v_last := v_seen; -- the next claim goes on from there
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
