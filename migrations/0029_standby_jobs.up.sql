-- Standby jobs: a process whose concurrency limit binds hands a slot to
-- a job it claimed ahead, with no round trip (version 29).
--
-- Since version 28 a slot is free for its process's next claim once the
-- handler ends; the next handler of the slot still waited for that claim
-- (the claim lock, the count, a synchronous commit), which kept handlers of
-- a binding limit of 50 with 20 ms jobs running about 80 % of the time on a
-- slow machine.
--
-- Now a claim of a process whose limit binds may also take up to
-- p_standby jobs beyond the limit, as standby, when its type has a
-- concurrency limit and neither a key limit nor a rate, its jobs have no
-- concurrency keys, the limit is not exceeded (a lowered one), no slot is
-- left after the claim's own, and the process holds a slot of the type
-- and no more than its share of the slots (the limit over the live processes whose Work calls
-- take the type, from the processes table): a process hands its slots to
-- its own standby jobs, so beyond its share they would stay with it while
-- other processes wait. A standby job holds no slot and runs no
-- handler: its row is running under the process's lease like any claimed
-- job, and its process passes its token with the ended jobs' (p_ended), so
-- that its own claims leave it out of the count. It runs only in the slot
-- of a handler of its type that ended in the same process, in place of
-- that handler: the ended job's row then stands for the slot until the
-- standby job's own row is counted by the process's claims (every claim
-- that read its token as standby has ended, see lease.go), and only then
-- is the ended job's outcome written. Other processes count the standby
-- rows as running (a process of version 28 too): fewer slots for them, never more.
-- claim_jobs returns which jobs are standby (column standby); they are the
-- last its claim_type took, after the slots'.
--
-- running_bound still bounds the handlers that may run: a standby job is
-- left out of the count and out of what the claim adds.
--
-- Rolling upgrade: claim_jobs and claim_type get overloads with
-- p_standby; those of version 28 stay as they were.
--
-- Lock order: unchanged (internal/store/graph.go).
CREATE FUNCTION claim_type(p_type text, p_tags jsonb, p_need integer, p_now integer, p_ended uuid[], p_standby integer, p_worker text,
                           OUT ids uuid[], OUT slot boolean, OUT limited smallint, OUT wait_ms bigint,
                           OUT conc boolean, OUT saturated boolean, OUT standby integer)
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
    v_cursor   text;
    v_prio     integer := -1000000;
    v_p        integer;
    v_last     text;
    v_seen     text;
    v_examined integer;
    v_full     boolean;
    v_kt       jsonb := '{}'; -- jobs taken per key, over the priorities
    v_nullq    integer;
    v_perkey   boolean;
    g_key      text[];        -- the groups at a priority, in turn (NULL: the jobs without a key)
    g_room     integer[];     -- how many each may take
    g_got      integer[];     -- how many each took
    g_open     boolean[];     -- it may have more jobs
    v_share    integer;
    v_groups   integer;
    c_id       uuid[];        -- a take's candidates, round-robin
    c_pos      integer[];
    v_seenn    integer[];
    v_took     integer;
    v_from_ph  integer;       -- where a chunk of the walk starts (its first row, not a group)
    v_from_k   text;
    v_walked   integer;       -- groups walked at this priority
    v_wneed    integer;       -- the need a chunk of the walk covers
    c_examined integer;
    c_seen     text;
    c_steps    integer;
    c_end_ph   integer;       -- where a chunk of the walk ended
    c_end_k    text;
    c_end_room integer;       -- the room it counted
    v_sparse   boolean;       -- a chunk's keys held fewer jobs than room: count each for one
    v_sb       integer := 0;  -- standby jobs it may take beyond the slots (version 29)
    v_procs    integer;       -- live processes that work the type
    v_mine     integer;       -- the caller's jobs that hold slots
BEGIN
    ids := '{}';
    limited := 0;
    saturated := false;
    standby := 0;
    SELECT * INTO l FROM job_limits WHERE type = p_type;
    slot := l.concurrency IS NOT NULL OR l.key_concurrency IS NOT NULL;
    conc := l.concurrency IS NOT NULL;
    v_perkey := l.rate IS NOT NULL AND l.rate_per_key;
    IF l.concurrency IS NOT NULL THEN
        -- The bound only grows between counts (finishes do not lower
        -- it): count again when it would hold the claim back, whether
        -- at the limit or in the share of free slots a buffer may take
        -- (version 26; before, a stale bound capped a limit far from
        -- binding). The caller's jobs whose handlers have ended
        -- (p_ended) hold no slot (version 28). It counts one beyond the
        -- limit: an exceeded limit (lowered) gives no standby jobs
        -- (version 29).
        IF l.running_bound + v_need > l.concurrency
           OR p_now + (l.concurrency - l.running_bound - p_now) / 4 < v_need THEN
            SELECT count(*) INTO l.running_bound
            FROM (SELECT 1 FROM jobs r WHERE r.state = 'running' AND r.type = p_type
                    AND NOT coalesce(r.lease_token = ANY(p_ended), false) LIMIT l.concurrency + 1) r;
        END IF;
        v_n := l.concurrency - l.running_bound; -- free slots (at least)
        -- No slot is left beyond the callers': the process's next claims
        -- pass the tokens of its jobs whose handlers end (version 28).
        saturated := v_n <= p_now;
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
        -- Standby jobs (version 29): only once this claim leaves no slot
        -- free, never beyond a limit already exceeded (lowered), and only
        -- while the caller holds a slot of the type (a handler whose end
        -- can hand it over) and no more than its share of the slots: the
        -- limit over the live processes that work the type. (A process
        -- hands its slots to its standby jobs: beyond its share, they would
        -- stay with it while others wait.)
        IF p_standby > 0 AND v_n >= 0 AND v_n <= v_need AND l.key_concurrency IS NULL AND l.rate IS NULL THEN
            SELECT count(*) INTO v_procs FROM processes p
            WHERE p.heartbeat_at >= now() - 3 * p.lease_ms * interval '1 millisecond'
              AND p.works @> jsonb_build_array(jsonb_build_object('types', jsonb_build_array(p_type)));
            SELECT count(*) INTO v_mine
            FROM (SELECT 1 FROM jobs r WHERE r.state = 'running' AND r.type = p_type AND r.worker = p_worker
                    AND NOT coalesce(r.lease_token = ANY(p_ended), false) LIMIT l.concurrency + 1) r;
            IF v_mine > 0 AND v_mine + v_need <= ceil(l.concurrency::numeric / greatest(v_procs, 1)) THEN
                v_sb := p_standby;
            END IF;
        END IF;
    END IF;
    IF l.key_concurrency IS NOT NULL AND p_now < v_need THEN
        -- A buffer takes a quarter of what it asks for beyond the
        -- callers' (version 9: none), so that a claim of keyed jobs is not
        -- one job a waiting worker; what it holds counts as running
        -- against every key's limit.
        v_need := p_now + (v_need - p_now) / 4;
        limited := greatest(limited, 1);
    END IF;
    IF l.rate IS NOT NULL AND NOT v_perkey AND v_need > 0 THEN
        SELECT a.allowed, a.wait_ms INTO v_n, v_wait FROM rate_allowance(p_type, '', l.rate, l.rate_period_ms, l.burst) a;
        IF v_n < v_need THEN
            v_need := v_n;
            limited := 2;
            wait_ms := v_wait;
        END IF;
    END IF;

    IF v_need + v_sb <= 0 THEN
        NULL;
    ELSIF NOT EXISTS (SELECT 1 FROM jobs f WHERE f.state = 'available' AND f.concurrency_key IS NOT NULL AND f.type = p_type)
          AND NOT v_perkey THEN
        -- No keys: first in, first out; the standby jobs are the last.
        SELECT coalesce(array_agg(n.id), '{}') INTO ids FROM (
            SELECT j.id FROM jobs j
            WHERE j.state = 'available' AND j.concurrency_key IS NULL AND j.type = p_type AND j.run_at <= now() AND j.tags <@ p_tags
            ORDER BY j.priority, j.run_at, j.id LIMIT v_need + v_sb FOR UPDATE SKIP LOCKED) n;
        standby := greatest(cardinality(ids) - v_need, 0);
    ELSIF v_need <= 0 THEN
        NULL; -- keys: no standby
    ELSE
        SELECT c.key INTO v_cursor FROM job_key_cursors c WHERE c.type = p_type;
        -- Jobs without a key: one group, under the '' bucket of a per-key
        -- rate.
        v_nullq := v_need;
        IF v_perkey THEN
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
            -- The next priority: read from the indexes' order (a min()
            -- aggregate, planned on stale statistics, read every entry).
            SELECT least(
                (SELECT j.priority FROM jobs j WHERE j.state = 'available' AND j.concurrency_key IS NOT NULL
                   AND j.type = p_type AND j.priority > v_prio ORDER BY j.priority LIMIT 1),
                (SELECT j.priority FROM jobs j WHERE j.state = 'available' AND j.concurrency_key IS NULL
                   AND j.type = p_type AND j.priority > v_prio ORDER BY j.priority LIMIT 1)) INTO v_p;
            EXIT WHEN v_p IS NULL;
            v_prio := v_p;

            -- The groups are walked in chunks (version 27): a chunk ends
            -- once the room it walked covers the need, a key under a key
            -- limit counting all the jobs it may take and any other group
            -- one, and its jobs are taken (2.); when its groups had fewer
            -- jobs than room, the walk goes on from where it stopped.
            -- Before, every group counted one job, so a claim of keyed jobs
            -- walked a key a job even when each key could take several
            -- (1,000 keys limited to 2: 2 x the walk's index probes).
            v_from_ph := 0;
            v_from_k := coalesce(v_cursor, '');
            v_walked := 0;
            v_examined := 0;
            v_seen := NULL;
            v_sparse := false;
            LOOP -- chunks of the walk
                v_wneed := v_need;
                -- 1. The groups of this chunk, in turn, with their room.
                -- phase 0: the keys after the cursor; 1: the jobs without a
                -- key; 2: the keys from the first up to the cursor (when there
                -- is one). room NULL: not a group (the jobs without a key, when
                -- there are none); room <= 0: a key its limits leave no room.
                WITH RECURSIVE walk(pos, phase, k, room, rwait, active) AS (
                    SELECT 0, v_from_ph, v_from_k, NULL::integer, NULL::bigint, 0
                    UNION ALL
                    SELECT w.pos + 1, n.phase, n.k, r.room, r.rwait,
                       -- The room walked so far: a key under a key limit
                       -- counts the jobs it may take, any other group one.
                       w.active + CASE WHEN coalesce(r.room, 0) <= 0 THEN 0
                                       WHEN n.phase <> 1 AND l.key_concurrency IS NOT NULL AND NOT v_sparse THEN r.room
                                       ELSE 1 END
                    FROM walk w
                    LEFT JOIN LATERAL (
                        -- The next key: after the last one (phase 0 and 2), or
                        -- the first (phase 1, when there is a cursor).
                        SELECT j.concurrency_key AS nk FROM jobs j
                        WHERE j.state = 'available' AND j.concurrency_key IS NOT NULL AND j.type = p_type AND j.priority = v_prio
                          AND j.concurrency_key > CASE WHEN w.phase = 1 THEN '' ELSE w.k END
                          AND (w.phase <> 1 OR v_cursor IS NOT NULL) AND j.run_at <= now() AND j.tags <@ p_tags
                        ORDER BY j.concurrency_key LIMIT 1) x ON true
                    CROSS JOIN LATERAL (
                        SELECT CASE
                            WHEN w.phase = 0 AND x.nk IS NOT NULL THEN 0
                            WHEN w.phase = 0 THEN 1
                            WHEN x.nk <= v_cursor THEN 2
                            END AS phase,
                            x.nk AS k
                        OFFSET 0) n
                    CROSS JOIN LATERAL (
                        SELECT CASE WHEN n.phase = 1 THEN
                                    CASE WHEN v_nullq > 0 AND EXISTS (SELECT 1 FROM jobs j WHERE j.state = 'available'
                                              AND j.concurrency_key IS NULL AND j.type = p_type AND j.priority = v_prio)
                                         THEN v_nullq END
                               ELSE least(kr.room, ra.allowed) END AS room,
                               CASE WHEN n.phase <> 1 AND ra.allowed < kr.room THEN ra.wait_ms END AS rwait
                        FROM (SELECT CASE WHEN n.phase = 1 OR l.key_concurrency IS NULL THEN v_need
                                     ELSE least(v_need, l.key_concurrency - coalesce((v_kt ->> n.k)::integer, 0)
                                         - (SELECT count(*) FROM (SELECT 1 FROM jobs rj WHERE rj.state = 'running' AND rj.type = p_type
                                                                   AND rj.concurrency_key = n.k LIMIT l.key_concurrency) rc)::integer)
                                     END AS room) kr
                        LEFT JOIN LATERAL (
                            SELECT a.allowed, a.wait_ms FROM rate_allowance(p_type, n.k, l.rate, l.rate_period_ms, l.burst) a
                            WHERE v_perkey AND n.phase <> 1 AND kr.room > 0) ra ON true) r
                    WHERE n.phase IS NOT NULL AND w.active < v_wneed AND w.pos < 256 - v_walked
                )
                SELECT array_agg(w.k ORDER BY w.pos) FILTER (WHERE w.room > 0),
                       array_agg(w.room ORDER BY w.pos) FILTER (WHERE w.room > 0),
                       coalesce(bool_or(w.room <= 0 OR w.rwait IS NOT NULL), false),
                       min(w.rwait),
                       count(*) FILTER (WHERE w.phase <> 1),
                       (array_agg(w.k ORDER BY w.pos DESC) FILTER (WHERE w.phase <> 1))[1],
                       count(*), (array_agg(w.phase ORDER BY w.pos DESC))[1], (array_agg(w.k ORDER BY w.pos DESC))[1],
                       max(w.active)
                INTO g_key, g_room, v_full, v_wait, c_examined, c_seen, c_steps, c_end_ph, c_end_k, c_end_room
                FROM walk w WHERE w.pos > 0;
                v_examined := v_examined + c_examined;
                v_seen := coalesce(c_seen, v_seen);
                v_walked := v_walked + c_steps;
                IF v_full THEN
                    limited := 2;
                    wait_ms := least(wait_ms, v_wait);
                END IF;

                -- 2. Round-robin: a share of the need from each open group at
                -- once, taken in rounds of one job a group.
                v_groups := coalesce(cardinality(g_key), 0);
                g_got := array_fill(0, ARRAY[v_groups]);
                g_open := array_fill(true, ARRAY[v_groups]);
                LOOP
                    SELECT count(*) INTO v_n FROM unnest(g_room, g_got, g_open) AS g(room, got, open) WHERE g.open AND g.got < g.room;
                    EXIT WHEN v_need <= 0 OR v_n = 0;
                    v_share := (v_need + v_n - 1) / v_n;
                    SELECT array_agg(t.id ORDER BY t.rn, t.pos), array_agg(t.pos ORDER BY t.rn, t.pos)
                    INTO c_id, c_pos
                    FROM (SELECT g.pos, c.id, c.rn
                          FROM unnest(g_key, g_room, g_got, g_open) WITH ORDINALITY AS g(k, room, got, open, pos)
                          CROSS JOIN LATERAL (
                              SELECT s.id, row_number() OVER (ORDER BY s.run_at, s.id) AS rn FROM (
                                  SELECT j.id, j.run_at FROM jobs j
                                  WHERE j.state = 'available' AND j.concurrency_key = g.k AND j.type = p_type
                                    AND j.priority = v_prio AND j.run_at <= now() AND j.tags <@ p_tags AND NOT (j.id = ANY(ids))
                                  ORDER BY j.run_at, j.id LIMIT least(g.room - g.got, v_share) FOR UPDATE SKIP LOCKED) s
                              WHERE g.k IS NOT NULL
                              UNION ALL
                              SELECT s.id, row_number() OVER (ORDER BY s.run_at, s.id) AS rn FROM (
                                  SELECT j.id, j.run_at FROM jobs j
                                  WHERE j.state = 'available' AND j.concurrency_key IS NULL AND j.type = p_type
                                    AND j.priority = v_prio AND j.run_at <= now() AND j.tags <@ p_tags AND NOT (j.id = ANY(ids))
                                  ORDER BY j.run_at, j.id LIMIT least(g.room - g.got, v_share) FOR UPDATE SKIP LOCKED) s
                              WHERE g.k IS NULL) c
                          WHERE g.open AND g.got < g.room) t;
                    -- A group that gave fewer than asked has no more.
                    v_seenn := array_fill(0, ARRAY[v_groups]);
                    FOR i IN 1 .. coalesce(cardinality(c_pos), 0) LOOP
                        v_seenn[c_pos[i]] := v_seenn[c_pos[i]] + 1;
                    END LOOP;
                    FOR i IN 1 .. v_groups LOOP
                        IF g_open[i] AND g_got[i] < g_room[i] AND v_seenn[i] < least(g_room[i] - g_got[i], v_share) THEN
                            g_open[i] := false;
                        END IF;
                    END LOOP;
                    -- Take them in rounds, up to the need; the rest are left
                    -- (their locks go with the claim's transaction).
                    v_took := least(coalesce(cardinality(c_id), 0), v_need);
                    EXIT WHEN v_took = 0;
                    ids := ids || c_id[1:v_took];
                    FOR i IN 1 .. v_took LOOP
                        g_got[c_pos[i]] := g_got[c_pos[i]] + 1;
                        IF g_key[c_pos[i]] IS NOT NULL THEN
                            v_last := g_key[c_pos[i]];
                        END IF;
                    END LOOP;
                    v_need := v_need - v_took;
                END LOOP;
                IF v_groups > 0 THEN
                    IF l.key_concurrency IS NOT NULL THEN
                        SELECT v_kt || coalesce(jsonb_object_agg(g.k, coalesce((v_kt ->> g.k)::integer, 0) + g.got), '{}')
                        INTO v_kt
                        FROM unnest(g_key, g_got) AS g(k, got) WHERE g.k IS NOT NULL AND g.got > 0;
                    END IF;
                    SELECT v_nullq - coalesce(sum(g.got), 0) INTO v_nullq FROM unnest(g_key, g_got) AS g(k, got) WHERE g.k IS NULL;
                    IF v_perkey THEN
                        INSERT INTO job_rates AS r (type, key, tat)
                        SELECT p_type, coalesce(g.k, ''), now() + g.got * (l.rate_period_ms::float8 / l.rate) * interval '1 millisecond'
                        FROM unnest(g_key, g_got) AS g(k, got) WHERE g.got > 0
                        ON CONFLICT (type, key) DO UPDATE SET tat = greatest(r.tat, now()) + (EXCLUDED.tat - now());
                    END IF;
                END IF;
                EXIT WHEN v_need <= 0 OR c_steps = 0 OR c_end_room < v_wneed OR v_walked >= 256;
                -- The chunk ended at the need but groups ran short: on from
                -- its last group, counting each for one job as before
                -- version 27 (keys this sparse would otherwise take a chunk,
                -- two statements, for every few jobs).
                v_sparse := true;
                v_from_ph := c_end_ph;
                v_from_k := c_end_k;
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
    IF l.rate IS NOT NULL AND NOT v_perkey AND cardinality(ids) > 0 THEN
        PERFORM rate_charge(p_type, '', l.rate, l.rate_period_ms, cardinality(ids));
    END IF;
    IF l.concurrency IS NOT NULL THEN
        UPDATE job_limits SET running_bound = l.running_bound + cardinality(ids) - standby WHERE type = p_type;
    END IF;
END
$$;

CREATE FUNCTION claim_jobs(p_types text[], p_tags jsonb, p_k integer, p_now integer, p_lease_ms bigint, p_worker text,
                           p_ended uuid[], p_standby integer)
RETURNS TABLE (id uuid, type text, args jsonb, tags jsonb, attempt integer, max_attempts integer,
               priority smallint, timeout_ms bigint, lease_token uuid, created_at timestamptz,
               run_at timestamptz, waited_us bigint, next_ms bigint, skipped boolean, limited smallint, slot boolean,
               meta jsonb, prereqs uuid[], conc boolean, saturated boolean, standby boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET synchronous_commit = on
-- The share's read of processes is a sequential scan, which enable_seqscan
-- prices out of every plan: its cost would cross jit_above_cost and have
-- each claim compile it (150 ms here).
SET jit = off
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
    v_conc    text[] := '{}';
    v_sat     boolean := false;
    v_start   integer;
    v_t       text;
    v_sb      uuid[] := '{}'; -- the standby jobs (version 29)
    v_took    integer := 0;   -- the jobs taken but those
    r         record;
BEGIN
    IF EXISTS (SELECT 1 FROM paused_types) THEN
        p_types := ARRAY(SELECT t FROM unnest(p_types) AS t WHERE NOT EXISTS (SELECT 1 FROM paused_types p WHERE p.type = t));
        IF cardinality(p_types) = 0 THEN
            RETURN QUERY SELECT NULL::uuid, NULL::text, NULL::jsonb, NULL::jsonb, NULL::integer, NULL::integer,
                NULL::smallint, NULL::bigint, NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::bigint,
                NULL::bigint, false, 0::smallint, false, NULL::jsonb, NULL::uuid[], false, false, false;
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
            EXIT WHEN v_took >= p_k AND cardinality(v_sb) >= p_standby;
            v_t := v_flow[(v_start + i) % cardinality(v_flow) + 1];
            SELECT * INTO r FROM claim_type(v_t, p_tags, p_k - v_took, greatest(p_now - v_took, 0),
                                            p_ended, p_standby - cardinality(v_sb), p_worker);
            v_ids := v_ids || r.ids;
            v_took := v_took + cardinality(r.ids) - r.standby;
            IF r.standby > 0 THEN
                v_sb := v_sb || r.ids[cardinality(r.ids) - r.standby + 1:];
            END IF;
            IF r.slot THEN
                v_slots := v_slots || v_t;
            END IF;
            IF r.conc THEN
                v_conc := v_conc || v_t;
            END IF;
            v_limited := greatest(v_limited, r.limited);
            v_sat := v_sat OR r.saturated;
            v_next := least(v_next, r.wait_ms);
        END LOOP;
        IF cardinality(v_ids) = 0 THEN
            v_ids := NULL;
        END IF;
    END IF;
    IF coalesce(cardinality(v_ids), 0) - cardinality(v_sb) < p_k AND v_limited = 0 THEN
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
            v_next, v_skipped, v_limited, false, NULL::jsonb, NULL::uuid[], false, v_sat, false;
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
                  j.type = ANY(v_slots) AS u_slot, j.meta AS u_meta, j.prereqs AS u_prereqs,
                  j.type = ANY(v_conc) AS u_conc, j.id = ANY(v_sb) AS u_standby)
    SELECT u.u_id, u.u_type, u.u_args, u.u_tags, u.u_attempt, u.u_max_attempts, u.u_priority, u.u_timeout_ms,
           u.u_lease_token, u.u_created_at, u.u_run_at, u.u_waited_us, v_next, v_skipped, v_limited, u.u_slot,
           u.u_meta, u.u_prereqs, u.u_conc, v_sat, u.u_standby
    FROM u JOIN unnest(v_ids) WITH ORDINALITY AS o(o_id, o_n) ON o.o_id = u.u_id
    ORDER BY o.o_n;
END
$$;
