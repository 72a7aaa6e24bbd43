-- Version 12: each job's rollup (stores/rollup.py), kept by triggers. Jobs already in
-- the ledger get a stale row: read from the ledger until rebuild_rollups (cronwarden
-- rollup --rebuild, or the monitor's next recording pass) folds their history in.

-- Each job's rollup (stores/rollup.py says what each column means): kept by
-- the triggers of functions.sql in the transaction that writes the run or
-- the event, so every writer keeps it (finish, an abandon, a refused start,
-- record). The monitor reads all rows at once (rollups) instead of every
-- job's window of the ledger.
CREATE TABLE {s}.rollups (
    job            text PRIMARY KEY,
    stale          boolean NOT NULL DEFAULT false,
    ended          bigint NOT NULL DEFAULT 0,
    outcomes       jsonb NOT NULL DEFAULT '{}',
    completed      bigint NOT NULL DEFAULT 0,
    duration_sum   double precision NOT NULL DEFAULT 0,
    last_start     double precision,
    last_success   double precision,
    bad_in_a_row   integer NOT NULL DEFAULT 0,
    good_in_a_row  integer NOT NULL DEFAULT 0,
    skips          bigint NOT NULL DEFAULT 0,
    skips_in_a_row integer NOT NULL DEFAULT 0,
    last_refusal   double precision,
    last_overlap   double precision,
    skip_times     jsonb NOT NULL DEFAULT '[]',  -- the latest 50 skipped times
    recent         jsonb NOT NULL DEFAULT '[]',  -- the window: [start, end, outcome, flagged], oldest first
    w_runs         integer NOT NULL DEFAULT 0,
    w_oldest       double precision,
    w_flagged      integer NOT NULL DEFAULT 0,
    w_completed    integer NOT NULL DEFAULT 0,
    w_outcomes     jsonb NOT NULL DEFAULT '{}',
    w_durations    jsonb NOT NULL DEFAULT '[]',
    p50            double precision,
    p95            double precision,
    w_max          double precision,
    w_last_success double precision,
    attempts       jsonb NOT NULL DEFAULT '[]'  -- the latest 16 attempts: [time, slot or null]
);

-- The q-quantile of ascending values: stores/rollup.py's quantile,
-- operation for operation (so the rollup agrees with its rebuild).
CREATE FUNCTION {s}.rollup_quantile(p_sorted double precision[], p_q double precision)
RETURNS double precision LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_n integer := coalesce(array_length(p_sorted, 1), 0);
    v_h double precision;
    v_lo integer;
    v_hi integer;
BEGIN
    IF v_n = 0 THEN
        RETURN NULL;
    END IF;
    v_h := (v_n - 1) * p_q;
    v_lo := floor(v_h)::integer;
    v_hi := least(v_lo + 1, v_n - 1);
    RETURN p_sorted[v_lo + 1] + (p_sorted[v_hi + 1] - p_sorted[v_lo + 1]) * (v_h - v_lo);
END $$;

-- A run ends (finish's terminal record, or an abandon): the lifetime
-- counters, the window (the last 50 ended runs) and its statistics, in the
-- transaction of the terminal record. The row lock orders two ends of one job.
CREATE FUNCTION {s}.rollup_end() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r {s}.rollups%ROWTYPE;
    v_done boolean := NEW.outcome IN ('succeeded', 'failed', 'timed_out');
    v_bad boolean := NEW.outcome IN ('failed', 'lease_lost', 'timed_out', 'abandoned', 'interrupted');
    v_flag boolean;
    v_d double precision[];
BEGIN
    INSERT INTO {s}.rollups (job) VALUES (NEW.job) ON CONFLICT (job) DO NOTHING;
    SELECT * INTO r FROM {s}.rollups WHERE job = NEW.job FOR UPDATE;
    IF jsonb_array_length(r.recent) >= 50 THEN
        r.recent := r.recent - 0;  -- the oldest makes room
    END IF;
    v_flag := NEW.outcome = 'abandoned' OR NEW.key <> NEW.job OR EXISTS (
        SELECT FROM jsonb_array_elements(r.recent) e WHERE (e->>1)::double precision > NEW.started_at);
    r.recent := r.recent || jsonb_build_array(jsonb_build_array(
        NEW.started_at, NEW.ended_at, NEW.outcome, v_flag::integer));
    SELECT coalesce(array_agg(d ORDER BY d), '{}') INTO v_d FROM (
        SELECT (e->>1)::double precision - (e->>0)::double precision AS d
        FROM jsonb_array_elements(r.recent) e WHERE e->>2 IN ('succeeded', 'failed', 'timed_out')) x;
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
        recent = r.recent,
        w_runs = jsonb_array_length(r.recent),
        w_oldest = (SELECT min((e->>0)::double precision) FROM jsonb_array_elements(r.recent) e),
        w_flagged = (SELECT sum((e->>3)::integer) FROM jsonb_array_elements(r.recent) e),
        w_outcomes = (SELECT jsonb_object_agg(o, n) FROM (
            SELECT e->>2 AS o, count(*) AS n FROM jsonb_array_elements(r.recent) e GROUP BY 1) x),
        w_last_success = (SELECT max((e->>1)::double precision) FROM jsonb_array_elements(r.recent) e
                          WHERE e->>2 = 'succeeded'),
        w_completed = coalesce(array_length(v_d, 1), 0),
        w_durations = to_jsonb(v_d),
        w_max = v_d[array_upper(v_d, 1)],
        p50 = {s}.rollup_quantile(v_d, 0.5::double precision),
        p95 = {s}.rollup_quantile(v_d, 0.95::double precision)
    WHERE job = NEW.job;
    RETURN NULL;
END $$;

CREATE TRIGGER rollup_end AFTER UPDATE OF outcome ON {s}.runs
    FOR EACH ROW WHEN (OLD.outcome IS NULL AND NEW.outcome IS NOT NULL)
    EXECUTE FUNCTION {s}.rollup_end();

-- A run starts: an attempt, the latest start, and the skips at or after it.
CREATE FUNCTION {s}.rollup_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.rollups (job) VALUES (NEW.job) ON CONFLICT (job) DO NOTHING;
    UPDATE {s}.rollups SET attempts = CASE WHEN jsonb_array_length(attempts) >= 16 THEN attempts - 0
                                           ELSE attempts END
                                      || jsonb_build_array(jsonb_build_array(NEW.started_at, NEW.slot))
    WHERE job = NEW.job;
    UPDATE {s}.rollups SET
        skips_in_a_row = (SELECT count(*) FROM jsonb_array_elements(skip_times) t
                          WHERE t::text::double precision >= NEW.started_at),
        last_start = NEW.started_at
    WHERE job = NEW.job AND (last_start IS NULL OR NEW.started_at >= last_start);
    RETURN NULL;
END $$;

CREATE TRIGGER rollup_start AFTER INSERT ON {s}.runs
    FOR EACH ROW EXECUTE FUNCTION {s}.rollup_start();

-- A refused or overlapping start.
CREATE FUNCTION {s}.rollup_refusal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.rollups (job) VALUES (NEW.job) ON CONFLICT (job) DO NOTHING;
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
    RETURN NULL;
END $$;

CREATE TRIGGER rollup_refusal AFTER INSERT ON {s}.events
    FOR EACH ROW WHEN (NEW.kind IN ('skipped', 'queued', 'queue_full', 'overlap'))
    EXECUTE FUNCTION {s}.rollup_refusal();

INSERT INTO {s}.rollups (job, stale)
SELECT job, true FROM {s}.runs UNION SELECT job, true FROM {s}.events WHERE kind IN ('skipped', 'queued', 'queue_full', 'overlap')
ON CONFLICT (job) DO NOTHING;
