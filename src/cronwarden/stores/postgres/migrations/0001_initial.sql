-- Version 1: leases, runs, the ledger of events, jobs, and the functions
-- acquire, finish and start_run. {s} is the store's schema, filled in by the store.

CREATE TABLE {s}.leases (
    key        text PRIMARY KEY,
    job        text NOT NULL,
    owner      text,
    token      bigint NOT NULL,
    expires    timestamptz,
    pending    integer NOT NULL DEFAULT 0,
    revoked_by text
);
CREATE TABLE {s}.runs (
    run_id     text PRIMARY KEY,
    job        text NOT NULL,
    key        text NOT NULL,
    host       text NOT NULL,
    pid        integer NOT NULL,
    token      bigint NOT NULL,
    slot       double precision,
    started_at double precision NOT NULL,
    ended_at   double precision,
    outcome    text,
    exit_code  integer,
    detail     text NOT NULL DEFAULT ''
);
CREATE INDEX runs_job_started ON {s}.runs (job, started_at);
CREATE INDEX runs_open ON {s}.runs (job, started_at) WHERE outcome IS NULL;
CREATE TABLE {s}.events (
    seq      bigserial PRIMARY KEY,
    event_id text NOT NULL UNIQUE DEFAULT gen_random_uuid()::text,
    kind     text NOT NULL,
    job      text NOT NULL,
    run_id   text,
    at       double precision NOT NULL,
    data     jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX events_job_at ON {s}.events (job, at);
CREATE INDEX events_run ON {s}.events (run_id);
CREATE INDEX events_kind_at ON {s}.events (kind, at);
CREATE TABLE {s}.jobs (
    name        text PRIMARY KEY,
    schedule    text,
    period      double precision,
    policy      text NOT NULL,
    reason      text NOT NULL,
    ttl         double precision,
    grace       double precision,
    max_runtime double precision,
    updated_at  double precision NOT NULL
);

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
