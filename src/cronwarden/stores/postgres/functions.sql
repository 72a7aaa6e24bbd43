-- The PostgreSQL store's functions as they are now: what a new schema gets,
-- after schema.sql. Each serves one Store method in one round trip and one
-- transaction (the method's contract is on stores/base.py). A migration that
-- changes a function replaces it (CREATE OR REPLACE) and changes it here too:
-- tests/stores/test_postgres_schema.py compares every function's definition
-- in a migrated schema with a new one's. {s} is the store's schema.

-- A run row and its `started` event.
CREATE FUNCTION {s}.start_run(
    p_key text, p_job text, p_run_id text, p_host text, p_pid integer, p_token bigint,
    p_slot double precision, p_at double precision, p_ttl double precision
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    WITH r AS (
        INSERT INTO {s}.runs (run_id, job, key, host, pid, token, slot, started_at)
        VALUES (p_run_id, p_job, p_key, p_host, p_pid, p_token, p_slot, p_at)
    )
    INSERT INTO {s}.events (kind, job, run_id, at, data)
    VALUES ('started', p_job, p_run_id, p_at, jsonb_build_object(
        'host', p_host, 'pid', p_pid, 'token', p_token, 'key', p_key, 'slot', p_slot, 'ttl', p_ttl));
END $$;

-- Store.acquire in one statement (see stores/base.py). Time is read
-- only from clock_timestamp(), after the lease row is locked, so a lock
-- wait cannot make a decision on a stale time.
CREATE FUNCTION {s}.acquire(
    p_key text, p_job text, p_run_id text, p_host text, p_pid integer, p_ttl double precision,
    p_at double precision, p_slot double precision, p_policy text, p_max_pending integer,
    OUT out_status text, OUT out_token bigint, OUT out_abandoned text,
    OUT out_holder_run_id text, OUT out_holder_host text, OUT out_holder_pid integer,
    OUT out_holder_started_at double precision, OUT out_holder_token bigint,
    OUT out_holder_expires_in double precision
) LANGUAGE plpgsql AS $$
DECLARE
    l {s}.leases%ROWTYPE;
    v_now timestamptz;
    v_ttl interval := make_interval(secs => p_ttl);
    v_data jsonb;
BEGIN
    -- The common case, a released lease, in one statement: the UPDATE
    -- locks the row and re-checks `owner IS NULL` on its latest version.
    WITH g AS (
        UPDATE {s}.leases
        SET owner = p_run_id, token = token + 1, expires = clock_timestamp() + v_ttl, revoked_by = NULL
        WHERE key = p_key AND owner IS NULL
        RETURNING token
    ), r AS (
        INSERT INTO {s}.runs (run_id, job, key, host, pid, token, slot, started_at)
        SELECT p_run_id, p_job, p_key, p_host, p_pid, g.token, p_slot, p_at FROM g
    ), e AS (
        INSERT INTO {s}.events (kind, job, run_id, at, data)
        SELECT 'started', p_job, p_run_id, p_at, jsonb_build_object(
            'host', p_host, 'pid', p_pid, 'token', g.token, 'key', p_key, 'slot', p_slot, 'ttl', p_ttl)
        FROM g
    )
    SELECT g.token INTO out_token FROM g;
    IF FOUND THEN
        out_status := 'granted';
        RETURN;
    END IF;

    SELECT * INTO l FROM {s}.leases WHERE key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO {s}.leases (key, job, owner, token, expires)
        VALUES (p_key, p_job, p_run_id, 1, clock_timestamp() + v_ttl)
        ON CONFLICT (key) DO NOTHING;
        IF FOUND THEN
            PERFORM {s}.start_run(p_key, p_job, p_run_id, p_host, p_pid, 1, p_slot, p_at, p_ttl);
            out_status := 'granted';
            out_token := 1;
            RETURN;
        END IF;
        -- A concurrent first grant won the insert; judge its row instead.
        SELECT * INTO l FROM {s}.leases WHERE key = p_key FOR UPDATE;
    END IF;
    v_now := clock_timestamp();
    IF l.owner IS NULL OR l.expires IS NULL OR l.expires <= v_now THEN
        IF l.owner IS NOT NULL THEN
            UPDATE {s}.runs
            SET outcome = 'abandoned', ended_at = p_at,
                detail = 'lease expired with no terminal record; found by run ' || p_run_id
            WHERE run_id = l.owner AND outcome IS NULL;
            IF FOUND THEN
                INSERT INTO {s}.events (kind, job, run_id, at, data)
                VALUES ('abandoned', p_job, l.owner, p_at, jsonb_build_object('found_by', p_run_id));
                out_abandoned := l.owner;
            END IF;
        END IF;
        out_token := l.token + 1;
        UPDATE {s}.leases
        SET owner = p_run_id, token = out_token, expires = v_now + v_ttl, revoked_by = NULL
        WHERE key = p_key;
        PERFORM {s}.start_run(p_key, p_job, p_run_id, p_host, p_pid, out_token, p_slot, p_at, p_ttl);
        out_status := 'granted';
        RETURN;
    END IF;

    -- Live: the holder, as every refusal reports it.
    SELECT r.host, r.pid, r.started_at INTO out_holder_host, out_holder_pid, out_holder_started_at
    FROM {s}.runs r WHERE r.run_id = l.owner;
    out_holder_run_id := l.owner;
    out_holder_host := coalesce(out_holder_host, '?');
    out_holder_pid := coalesce(out_holder_pid, 0);
    out_holder_started_at := coalesce(out_holder_started_at, 0.0);
    out_holder_token := l.token;
    out_holder_expires_in := extract(epoch FROM l.expires - v_now);
    v_data := jsonb_build_object(
        'slot', p_slot, 'host', p_host, 'pid', p_pid, 'policy', p_policy,
        'holder_run_id', out_holder_run_id,
        'holder_host', out_holder_host,
        'holder_pid', out_holder_pid,
        'holder_started_at', out_holder_started_at,
        'holder_age', round((p_at - out_holder_started_at)::numeric, 3),
        'holder_token', out_holder_token);

    IF p_policy = 'replace' THEN
        UPDATE {s}.leases SET revoked_by = p_run_id WHERE key = p_key AND revoked_by IS NULL;
        out_status := 'revoking';
    ELSIF p_policy = 'allow' THEN
        INSERT INTO {s}.leases (key, job, owner, token, expires)
        VALUES (p_key || '+' || p_run_id, p_job, p_run_id, 1, v_now + v_ttl);
        PERFORM {s}.start_run(
            p_key || '+' || p_run_id, p_job, p_run_id, p_host, p_pid, 1, p_slot, p_at, p_ttl);
        INSERT INTO {s}.events (kind, job, run_id, at, data)
        VALUES ('overlap', p_job, p_run_id, p_at, v_data);
        out_status := 'overlap';
        out_token := 1;
    ELSIF p_policy = 'queue' THEN
        IF l.pending < p_max_pending THEN
            UPDATE {s}.leases SET pending = pending + 1 WHERE key = p_key;
            INSERT INTO {s}.events (kind, job, run_id, at, data)
            VALUES ('queued', p_job, p_run_id, p_at,
                    v_data || jsonb_build_object('pending', l.pending + 1));
            out_status := 'queued';
        ELSE
            INSERT INTO {s}.events (kind, job, run_id, at, data)
            VALUES ('queue_full', p_job, p_run_id, p_at,
                    v_data || jsonb_build_object('pending', l.pending));
            out_status := 'queue_full';
        END IF;
    ELSE
        INSERT INTO {s}.events (kind, job, run_id, at, data)
        VALUES ('skipped', p_job, p_run_id, p_at, v_data);
        out_status := 'skipped';
    END IF;
END $$;

-- Store.finish in one statement: the terminal record (at most one per
-- run), then the release iff still owned, or the hand-over to p_then_*.
CREATE FUNCTION {s}.finish(
    p_key text, p_job text, p_run_id text, p_token bigint, p_outcome text, p_at double precision,
    p_exit_code integer, p_detail text, p_replaced_by text, p_side boolean,
    p_then_key text, p_then_job text, p_then_run_id text, p_then_host text, p_then_pid integer,
    p_then_ttl double precision, p_then_at double precision, p_then_slot double precision,
    OUT out_owned boolean, OUT out_recorded boolean, OUT out_next_token bigint
) LANGUAGE plpgsql AS $$
DECLARE
    v_pending integer;
BEGIN
    -- The common case, a plain release, in one statement with the record.
    WITH u AS (
        UPDATE {s}.runs
        SET outcome = p_outcome, ended_at = p_at, exit_code = p_exit_code, detail = p_detail
        WHERE run_id = p_run_id AND outcome IS NULL
        RETURNING started_at
    ), e AS (
        INSERT INTO {s}.events (kind, job, run_id, at, data)
        SELECT p_outcome, p_job, p_run_id, p_at,
               jsonb_build_object('exit_code', p_exit_code, 'token', p_token,
                                  'duration', round((p_at - u.started_at)::numeric, 6))
               || CASE WHEN p_detail <> '' THEN jsonb_build_object('detail', p_detail)
                       ELSE '{}' END
               || CASE WHEN p_replaced_by <> '' THEN jsonb_build_object('replaced_by', p_replaced_by)
                       ELSE '{}' END
        FROM u
    ), l AS (
        UPDATE {s}.leases SET owner = NULL, expires = NULL, revoked_by = NULL
        WHERE key = p_key AND owner = p_run_id AND NOT p_side AND (p_then_run_id IS NULL OR pending = 0)
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM u), EXISTS (SELECT FROM l) INTO out_recorded, out_owned;
    IF out_owned THEN
        RETURN;
    END IF;

    SELECT pending INTO v_pending FROM {s}.leases WHERE key = p_key AND owner = p_run_id FOR UPDATE;
    out_owned := FOUND;
    IF NOT out_owned THEN
        -- A retried finish whose first try (reply lost) handed the lease
        -- to the queued run: report that hand-over again, not lose it.
        IF p_then_run_id IS NOT NULL THEN
            SELECT token INTO out_next_token FROM {s}.leases WHERE key = p_key AND owner = p_then_run_id;
            out_owned := FOUND;
        END IF;
        RETURN;
    END IF;
    IF p_side THEN
        DELETE FROM {s}.leases WHERE key = p_key;  -- allow's side lease
    ELSIF p_then_run_id IS NOT NULL AND v_pending > 0 THEN
        UPDATE {s}.leases
        SET owner = p_then_run_id, token = token + 1,
            expires = clock_timestamp() + make_interval(secs => p_then_ttl),
            pending = pending - 1, revoked_by = NULL
        WHERE key = p_key
        RETURNING token INTO out_next_token;
        PERFORM {s}.start_run(p_then_key, p_then_job, p_then_run_id, p_then_host, p_then_pid,
                              out_next_token, p_then_slot, p_then_at, p_then_ttl);
    ELSE
        UPDATE {s}.leases SET owner = NULL, expires = NULL, revoked_by = NULL WHERE key = p_key;
    END IF;
END $$;

-- Sequence values are drawn at insert and become visible at commit, so
-- a slow writer's event can appear below events already acknowledged.
-- A SHARE lock on events waits for every writer in flight (each holds
-- ROW EXCLUSIVE from before it draws a seq until it commits) and holds
-- new ones off for the few statements that follow: under it, every seq
-- drawn so far is committed or dead, and the mark may move over any
-- acknowledged prefix. If the lock does not come quickly the mark stays
-- where it is, which is always safe.
CREATE FUNCTION {s}.outbox_settled() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lock_timeout', '250ms', true);
    LOCK TABLE {s}.events IN SHARE MODE;
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN false;
END $$;

-- A new sink's mark: just before the first event within the backfill.
CREATE FUNCTION {s}.outbox_register(p_sink text, p_now double precision, p_backfill double precision)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_mark bigint;
BEGIN
    IF NOT {s}.outbox_settled() THEN
        -- Once per sink, so worth the session's full lock_timeout (an
        -- error here only delays the registration to the next call).
        SET LOCAL lock_timeout TO DEFAULT;
        LOCK TABLE {s}.events IN SHARE MODE;
    END IF;
    SELECT min(seq) - 1 INTO v_mark FROM {s}.events WHERE at >= p_now - p_backfill;
    IF v_mark IS NULL THEN
        SELECT coalesce(max(seq), 0) INTO v_mark FROM {s}.events;
    END IF;
    INSERT INTO {s}.outbox_marks (sink, mark, registered_at) VALUES (p_sink, v_mark, p_now)
    ON CONFLICT (sink) DO NOTHING;
    SELECT mark INTO v_mark FROM {s}.outbox_marks WHERE sink = p_sink;
    RETURN v_mark;
END $$;

CREATE FUNCTION {s}.undelivered(
    p_sink text, p_limit integer, p_now double precision, p_backfill double precision
) RETURNS TABLE (
    seq bigint, event_id text, kind text, job text, run_id text, at double precision, data jsonb
)
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM {s}.outbox_marks m WHERE m.sink = p_sink) THEN
        PERFORM {s}.outbox_register(p_sink, p_now, p_backfill);
    END IF;
    -- One statement: the mark and the events are read in one snapshot.
    RETURN QUERY
        SELECT e.seq, e.event_id, e.kind, e.job, e.run_id, e.at, e.data
        FROM {s}.outbox_marks m JOIN {s}.events e ON e.seq > m.mark
        WHERE m.sink = p_sink AND NOT EXISTS (
            SELECT FROM {s}.outbox_acks a WHERE a.sink = m.sink AND a.seq = e.seq)
        ORDER BY e.seq LIMIT p_limit;
END $$;

CREATE FUNCTION {s}.mark_delivered(
    p_sink text, p_ids text[], p_now double precision, p_backfill double precision
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_mark bigint;
    v_new bigint;
BEGIN
    -- One acknowledger per sink at a time.
    SELECT mark INTO v_mark FROM {s}.outbox_marks WHERE sink = p_sink FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM {s}.outbox_register(p_sink, p_now, p_backfill);
        SELECT mark INTO v_mark FROM {s}.outbox_marks WHERE sink = p_sink FOR UPDATE;
    END IF;
    INSERT INTO {s}.outbox_acks (sink, seq)
    SELECT p_sink, e.seq FROM {s}.events e WHERE e.event_id = ANY (p_ids) AND e.seq > v_mark
    ON CONFLICT DO NOTHING;
    IF NOT {s}.outbox_settled() THEN
        RETURN;
    END IF;
    SELECT e.seq - 1 INTO v_new FROM {s}.events e
    WHERE e.seq > v_mark AND NOT EXISTS (
        SELECT FROM {s}.outbox_acks a WHERE a.sink = p_sink AND a.seq = e.seq)
    ORDER BY e.seq LIMIT 1;
    IF v_new IS NULL THEN
        SELECT coalesce(max(e.seq), 0) INTO v_new FROM {s}.events e;
    END IF;
    IF v_new > v_mark THEN
        UPDATE {s}.outbox_marks SET mark = v_new WHERE sink = p_sink;
        DELETE FROM {s}.outbox_acks WHERE sink = p_sink AND seq <= v_new;
    END IF;
END $$;

-- Store.reject in one call: the rejection's event, the acknowledgement (as
-- mark_delivered), the dead letter and the trim to p_keep per sink, in one
-- transaction. p_kind NULL records no event. The event goes first: its
-- insert takes ROW EXCLUSIVE on events before mark_delivered asks for SHARE,
-- the order every finish and record follow, so two concurrent rejects
-- cannot hold SHARE each and wait for each other's ROW EXCLUSIVE (the
-- settle step's lock_timeout ends any wait that remains, safely).
CREATE FUNCTION {s}.reject(
    p_sink text, p_event_id text, p_keep integer, p_now double precision, p_backfill double precision,
    p_rejection_id text, p_kind text, p_job text, p_run_id text, p_at double precision, p_data jsonb
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_kind IS NOT NULL THEN
        INSERT INTO {s}.events (event_id, kind, job, run_id, at, data)
        VALUES (p_rejection_id, p_kind, p_job, p_run_id, p_at, p_data)
        ON CONFLICT (event_id) DO NOTHING;
    END IF;
    PERFORM {s}.mark_delivered(p_sink, ARRAY[p_event_id], p_now, p_backfill);
    INSERT INTO {s}.outbox_rejected (sink, seq)
    SELECT p_sink, e.seq FROM {s}.events e WHERE e.event_id = p_event_id
    ON CONFLICT DO NOTHING;
    DELETE FROM {s}.outbox_rejected
    WHERE sink = p_sink AND seq <= (
        SELECT r.seq FROM {s}.outbox_rejected r WHERE r.sink = p_sink
        ORDER BY r.seq DESC LIMIT 1 OFFSET p_keep);
END $$;

-- Store.claim_slot in one call. Age is judged by clock_timestamp()
-- read after the claim's row is locked (the ON CONFLICT path locks it,
-- whether or not its WHERE holds), as for leases.
CREATE FUNCTION {s}.claim_slot(
    p_job text, p_slot double precision, p_owner text, p_keep double precision
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_keep interval := make_interval(secs => p_keep);
    v_owner text;
BEGIN
    -- First: the only statement that waits for another claim, so it
    -- waits while this transaction holds no row lock (no deadlock).
    INSERT INTO {s}.slot_claims AS c (job, slot, owner) VALUES (p_job, p_slot, p_owner)
    ON CONFLICT (job, slot) DO UPDATE SET owner = excluded.owner, claimed_at = clock_timestamp()
    WHERE c.claimed_at < clock_timestamp() - v_keep
    RETURNING c.owner INTO v_owner;
    IF NOT FOUND THEN
        -- Held and not expired. The row stays locked by the statement
        -- above until commit, so this reads the owner it keeps.
        SELECT c.owner INTO v_owner FROM {s}.slot_claims c WHERE c.job = p_job AND c.slot = p_slot;
    END IF;
    -- The job's other expired claims. SKIP LOCKED: pruning never waits
    -- (a row another claim holds is left for a later call).
    DELETE FROM {s}.slot_claims d
    WHERE d.job = p_job AND d.slot IN (
        SELECT o.slot FROM {s}.slot_claims o
        WHERE o.job = p_job AND o.slot <> p_slot AND o.claimed_at < clock_timestamp() - v_keep
        FOR UPDATE SKIP LOCKED);
    RETURN v_owner;
END $$;

-- The q-quantile of ascending values: stores/rollup.py's quantile,
-- operation for operation (so the rollup agrees with its rebuild): lo is
-- floor((n - 1) q), and an empty array's elements are null. One
-- expression, so that it is inlined where it is called.
CREATE FUNCTION {s}.rollup_quantile(p_sorted double precision[], p_q double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT p_sorted[floor((cardinality(p_sorted) - 1) * p_q)::integer + 1]
        + (p_sorted[least(floor((cardinality(p_sorted) - 1) * p_q)::integer + 1, cardinality(p_sorted) - 1) + 1]
           - p_sorted[floor((cardinality(p_sorted) - 1) * p_q)::integer + 1])
          * ((cardinality(p_sorted) - 1) * p_q - floor((cardinality(p_sorted) - 1) * p_q)::integer)
$$;

-- A rebuilt window's entries (stores/rollup.py's [start, end, outcome,
-- flagged], oldest ending first) as rollups' four window columns, and the
-- completed runs' durations ascending (w_sorted).
CREATE FUNCTION {s}.rollup_entries(p_recent jsonb, OUT starts double precision[],
    OUT ends double precision[], OUT results text[], OUT flags integer[], OUT sorted double precision[])
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg((e->>0)::double precision ORDER BY i), '{}'),
           coalesce(array_agg((e->>1)::double precision ORDER BY i), '{}'),
           coalesce(array_agg(e->>2 ORDER BY i), '{}'),
           coalesce(array_agg((e->>3)::integer ORDER BY i), '{}'),
           coalesce(array_agg((e->>1)::double precision - (e->>0)::double precision
                              ORDER BY (e->>1)::double precision - (e->>0)::double precision)
                    FILTER (WHERE e->>2 IN ('succeeded', 'failed', 'timed_out')), '{}')
    FROM jsonb_array_elements(p_recent) WITH ORDINALITY AS t(e, i)
$$;

-- A run ends (finish's terminal record, or an abandon): the lifetime
-- counters, the window (the last 50 ended runs) and its statistics, in the
-- transaction of the terminal record. The statistics are the previous ones
-- with the run's entry put in and, in a full window, the oldest-ending
-- entry x taken out, not recomputed over the window's entries: an array
-- comparison, a binary search (width_bucket) or an element read each, the
-- entries scanned only when x had the earliest start or the latest success
-- and another may tie it. The row lock orders two ends of one job.
CREATE FUNCTION {s}.rollup_end() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r {s}.rollups%ROWTYPE;
    v_done boolean := NEW.outcome IN ('succeeded', 'failed', 'timed_out');
    v_bad boolean := NEW.outcome IN ('failed', 'lease_lost', 'timed_out', 'abandoned', 'interrupted');
    v_flag boolean;
    x_start double precision;  -- the entry that leaves, if the window was full
    x_end double precision;
    x_result text;
    x_flag integer;
    k integer;
BEGIN
    -- The job's row is there since its run started (rollup_start): an insert
    -- first, even one that does nothing, cost the end more than the rest.
    SELECT * INTO r FROM {s}.rollups WHERE job = NEW.job FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO {s}.rollups (job) VALUES (NEW.job) ON CONFLICT (job) DO NOTHING;
        SELECT * INTO r FROM {s}.rollups WHERE job = NEW.job FOR UPDATE;
    END IF;
    IF cardinality(r.w_ends) >= 50 THEN
        x_start := r.w_starts[1];
        x_end := r.w_ends[1];
        x_result := r.w_results[1];
        x_flag := r.w_flags[1];
        r.w_starts := r.w_starts[2:];
        r.w_ends := r.w_ends[2:];
        r.w_results := r.w_results[2:];
        r.w_flags := r.w_flags[2:];
    END IF;
    v_flag := NEW.outcome = 'abandoned' OR NEW.key <> NEW.job OR NEW.started_at < ANY (r.w_ends);
    r.w_starts := r.w_starts || NEW.started_at;
    r.w_ends := r.w_ends || NEW.ended_at;
    r.w_results := r.w_results || NEW.outcome;
    r.w_flags := r.w_flags || v_flag::integer;
    r.w_flagged := r.w_flagged + v_flag::integer - coalesce(x_flag, 0);
    r.w_outcomes := jsonb_set(r.w_outcomes, ARRAY[NEW.outcome],
                              to_jsonb(coalesce((r.w_outcomes->>NEW.outcome)::integer, 0) + 1));
    -- The durations ascending: the new one after those not above it, the
    -- leaving one out at the place of the last not above it (itself, or an
    -- equal one).
    IF v_done THEN
        k := width_bucket(NEW.ended_at - NEW.started_at, r.w_sorted);
        r.w_sorted := r.w_sorted[1:k] || (NEW.ended_at - NEW.started_at) || r.w_sorted[k + 1:];
    END IF;
    IF x_result IS NOT NULL THEN
        r.w_outcomes := CASE WHEN (r.w_outcomes->>x_result)::integer = 1 THEN r.w_outcomes - x_result
            ELSE jsonb_set(r.w_outcomes, ARRAY[x_result], to_jsonb((r.w_outcomes->>x_result)::integer - 1)) END;
        IF x_result IN ('succeeded', 'failed', 'timed_out') THEN
            k := width_bucket(x_end - x_start, r.w_sorted);
            r.w_sorted := r.w_sorted[1:k - 1] || r.w_sorted[k + 1:];
        END IF;
    END IF;
    -- The earliest start: the new entry's or the one kept, unless x had it;
    -- then the oldest-ending entry's when none started before it.
    IF x_start IS NULL OR x_start > r.w_oldest THEN
        r.w_oldest := least(r.w_oldest, NEW.started_at);
    ELSIF r.w_starts[1] <= ALL (r.w_starts) THEN
        r.w_oldest := r.w_starts[1];
    ELSE
        r.w_oldest := (SELECT min(v) FROM unnest(r.w_starts) v);
    END IF;
    IF x_result IS DISTINCT FROM 'succeeded' OR x_end < r.w_last_success THEN
        IF NEW.outcome = 'succeeded' THEN
            r.w_last_success := greatest(r.w_last_success, NEW.ended_at);
        END IF;
    ELSE
        r.w_last_success := (SELECT max(e) FROM unnest(r.w_ends, r.w_results) AS t(e, o) WHERE o = 'succeeded');
    END IF;
    UPDATE {s}.rollups SET
        ended = r.ended + 1,
        outcomes = jsonb_set(r.outcomes, ARRAY[NEW.outcome],
                             to_jsonb(coalesce((r.outcomes->>NEW.outcome)::bigint, 0) + 1)),
        completed = r.completed + v_done::integer,
        duration_sum = r.duration_sum + CASE WHEN v_done THEN NEW.ended_at - NEW.started_at ELSE 0 END,
        last_success = CASE WHEN NEW.outcome <> 'succeeded' THEN r.last_success
                            ELSE greatest(r.last_success, NEW.ended_at) END,
        bad_in_a_row = CASE WHEN NEW.outcome = 'succeeded' THEN 0 WHEN v_bad THEN r.bad_in_a_row + 1
                            ELSE r.bad_in_a_row END,
        good_in_a_row = CASE WHEN NEW.outcome = 'succeeded' THEN r.good_in_a_row + 1 WHEN v_bad THEN 0
                             ELSE r.good_in_a_row END,
        w_starts = r.w_starts,
        w_ends = r.w_ends,
        w_results = r.w_results,
        w_flags = r.w_flags,
        w_runs = cardinality(r.w_ends),
        w_oldest = r.w_oldest,
        w_flagged = r.w_flagged,
        w_outcomes = r.w_outcomes,
        w_last_success = r.w_last_success,
        w_completed = cardinality(r.w_sorted),
        w_sorted = r.w_sorted,
        w_durations = to_jsonb(r.w_sorted),
        w_max = r.w_sorted[cardinality(r.w_sorted)],
        p50 = {s}.rollup_quantile(r.w_sorted, 0.5),
        p95 = {s}.rollup_quantile(r.w_sorted, 0.95)
    WHERE job = NEW.job;
    RETURN NULL;
END $$;

CREATE TRIGGER rollup_end AFTER UPDATE OF outcome ON {s}.runs
    FOR EACH ROW WHEN (OLD.outcome IS NULL AND NEW.outcome IS NOT NULL)
    EXECUTE FUNCTION {s}.rollup_end();

-- A run starts: an attempt, the latest start, and the skips at or after it.
-- One update of the row (it is rewritten whole, about 3 KB with a full
-- window), the insert only for a job's first start: an insert first, even
-- one that does nothing, and a second update cost more than the rest.
CREATE FUNCTION {s}.rollup_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        UPDATE {s}.rollups SET
            attempts = CASE WHEN jsonb_array_length(attempts) >= 16 THEN attempts - 0 ELSE attempts END
                       || jsonb_build_array(jsonb_build_array(NEW.started_at, NEW.slot)),
            skips_in_a_row = CASE WHEN last_start IS NULL OR NEW.started_at >= last_start
                                  THEN (SELECT count(*) FROM jsonb_array_elements(skip_times) t
                                        WHERE t::text::double precision >= NEW.started_at)
                                  ELSE skips_in_a_row END,
            last_start = greatest(last_start, NEW.started_at)
        WHERE job = NEW.job;
        EXIT WHEN FOUND;
        INSERT INTO {s}.rollups (job) VALUES (NEW.job) ON CONFLICT (job) DO NOTHING;
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER rollup_start AFTER INSERT ON {s}.runs
    FOR EACH ROW EXECUTE FUNCTION {s}.rollup_start();

-- A refused or overlapping start (one update, the insert only for a job's
-- first: as rollup_start).
CREATE FUNCTION {s}.rollup_refusal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        UPDATE {s}.rollups SET
            last_overlap = CASE WHEN NEW.kind = 'overlap' THEN greatest(last_overlap, NEW.at) ELSE last_overlap END,
            last_refusal = CASE WHEN NEW.kind = 'overlap' THEN last_refusal ELSE greatest(last_refusal, NEW.at) END,
            skips = skips + (NEW.kind = 'skipped')::integer,
            skips_in_a_row = skips_in_a_row
                + (NEW.kind = 'skipped' AND (last_start IS NULL OR NEW.at >= last_start))::integer,
            attempts = CASE WHEN NEW.kind NOT IN ('skipped', 'queue_full') THEN attempts
                            WHEN jsonb_array_length(attempts) >= 16
                            THEN (attempts - 0) || jsonb_build_array(jsonb_build_array(NEW.at, NULL))
                            ELSE attempts || jsonb_build_array(jsonb_build_array(NEW.at, NULL)) END,
            skip_times = CASE WHEN NEW.kind <> 'skipped' THEN skip_times
                              WHEN jsonb_array_length(skip_times) >= 50 THEN (skip_times - 0) || to_jsonb(NEW.at)
                              ELSE skip_times || to_jsonb(NEW.at) END
        WHERE job = NEW.job;
        EXIT WHEN FOUND;
        INSERT INTO {s}.rollups (job) VALUES (NEW.job) ON CONFLICT (job) DO NOTHING;
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER rollup_refusal AFTER INSERT ON {s}.events
    FOR EACH ROW WHEN (NEW.kind IN ('skipped', 'queued', 'queue_full', 'overlap'))
    EXECUTE FUNCTION {s}.rollup_refusal();
