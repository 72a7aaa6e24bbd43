-- Version 19: the window's durations ascending are also kept as an array
-- (w_sorted), where a run's end puts its duration in and takes the leaving
-- one out by a binary search (width_bucket) and reads the quantiles at
-- their places; w_durations, the same as JSON for the readers, is written
-- from it. Version 18 searched the JSON array with a jsonpath filter at
-- every end, which was most of what the end's function cost.

ALTER TABLE {s}.rollups ADD COLUMN w_sorted double precision[] NOT NULL DEFAULT '{}';
UPDATE {s}.rollups r SET w_sorted = coalesce((
    SELECT array_agg(e - s ORDER BY e - s) FROM unnest(r.w_starts, r.w_ends, r.w_results) AS t(s, e, o)
    WHERE o IN ('succeeded', 'failed', 'timed_out')), '{}');

DROP FUNCTION {s}.rollup_rank(jsonb, double precision);
DROP FUNCTION {s}.rollup_quantile(jsonb, double precision);
DROP FUNCTION {s}.rollup_entries(jsonb);
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
CREATE OR REPLACE FUNCTION {s}.rollup_end() RETURNS trigger LANGUAGE plpgsql AS $$
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
