-- Version 2: the outbox.

-- The outbox: per sink, a mark below which every event is
-- acknowledged, plus the acknowledged events above it.
CREATE TABLE {s}.outbox_marks (
    sink          text PRIMARY KEY,
    mark          bigint NOT NULL,
    registered_at double precision NOT NULL
);
CREATE TABLE {s}.outbox_acks (
    sink text NOT NULL,
    seq  bigint NOT NULL,
    PRIMARY KEY (sink, seq)
);

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
