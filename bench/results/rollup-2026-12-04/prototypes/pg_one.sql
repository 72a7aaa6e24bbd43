CREATE FUNCTION {s}.rollup_quantile2(p_sorted double precision[], p_q double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT p_sorted[floor((cardinality(p_sorted) - 1) * p_q)::integer + 1]
        + (p_sorted[least(floor((cardinality(p_sorted) - 1) * p_q)::integer + 1, cardinality(p_sorted) - 1) + 1]
           - p_sorted[floor((cardinality(p_sorted) - 1) * p_q)::integer + 1])
          * ((cardinality(p_sorted) - 1) * p_q - floor((cardinality(p_sorted) - 1) * p_q)::integer)
$$;
CREATE FUNCTION {s}.rollup_keep(p_window anyarray, p_entry anyelement) RETURNS anyarray LANGUAGE sql IMMUTABLE AS $$
    SELECT (p_window || p_entry)[greatest(cardinality(p_window) - 48, 1):]
$$;
CREATE OR REPLACE FUNCTION {s}.rollup_end() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_done boolean := NEW.outcome IN ('succeeded', 'failed', 'timed_out');
    v_bad boolean := NEW.outcome IN ('failed', 'lease_lost', 'timed_out', 'abandoned', 'interrupted');
BEGIN
    UPDATE {s}.rollups r SET
        ended = r.ended + 1,
        outcomes = jsonb_set(r.outcomes, ARRAY[NEW.outcome], to_jsonb(coalesce((r.outcomes->>NEW.outcome)::bigint, 0) + 1)),
        completed = r.completed + v_done::integer,
        duration_sum = r.duration_sum + CASE WHEN v_done THEN NEW.ended_at - NEW.started_at ELSE 0 END,
        last_success = CASE WHEN NEW.outcome <> 'succeeded' THEN r.last_success ELSE greatest(r.last_success, NEW.ended_at) END,
        bad_in_a_row = CASE WHEN NEW.outcome = 'succeeded' THEN 0 WHEN v_bad THEN r.bad_in_a_row + 1 ELSE r.bad_in_a_row END,
        good_in_a_row = CASE WHEN NEW.outcome = 'succeeded' THEN r.good_in_a_row + 1 WHEN v_bad THEN 0 ELSE r.good_in_a_row END,
        w_starts = w.starts, w_ends = w.ends, w_results = w.results, w_flags = w.flags,
        w_runs = cardinality(w.ends),
        w_oldest = (SELECT min(v) FROM unnest(w.starts) v),
        w_flagged = (SELECT sum(v) FROM unnest(w.flags) v),
        w_outcomes = (SELECT jsonb_object_agg(o, n) FROM (SELECT o, count(*) AS n FROM unnest(w.results) o GROUP BY o) t),
        w_last_success = (SELECT max(e) FROM unnest(w.ends, w.results) t(e, o) WHERE o = 'succeeded'),
        (w_completed, w_durations, w_max, p50, p95) = (
            SELECT cardinality(d), to_jsonb(d), d[cardinality(d)], {s}.rollup_quantile2(d, 0.5), {s}.rollup_quantile2(d, 0.95)
            FROM (SELECT coalesce(array_agg(e - s ORDER BY e - s), '{}') AS d FROM unnest(w.starts, w.ends, w.results) t(s, e, o)
                  WHERE o IN ('succeeded', 'failed', 'timed_out')) q)
    FROM (SELECT {s}.rollup_keep(x.w_starts, NEW.started_at) AS starts, {s}.rollup_keep(x.w_ends, NEW.ended_at) AS ends,
                 {s}.rollup_keep(x.w_results, NEW.outcome) AS results,
                 {s}.rollup_keep(x.w_flags, (NEW.outcome = 'abandoned' OR NEW.key <> NEW.job
                     OR NEW.started_at < ANY (x.w_ends[greatest(cardinality(x.w_ends) - 48, 1):]))::integer) AS flags
          FROM {s}.rollups x WHERE x.job = NEW.job FOR UPDATE) w
    WHERE r.job = NEW.job;
    IF NOT FOUND THEN
        INSERT INTO {s}.rollups (job) VALUES (NEW.job) ON CONFLICT (job) DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
