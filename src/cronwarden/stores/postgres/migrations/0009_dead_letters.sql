-- Version 9: each sink's dead letters. A new table and function: it rewrites nothing.

-- Each sink's dead letters: the events it refused for good (reject), set
-- aside until a replay delivers them (forget_rejected). At most
-- DEAD_LETTERS_KEPT per sink: reject drops the oldest beyond it. Read and
-- written by the primary key (sink, seq).
CREATE TABLE {s}.outbox_rejected (
    sink text NOT NULL,
    seq  bigint NOT NULL,
    PRIMARY KEY (sink, seq)
);

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
