CREATE TRIGGER rollup_end_old AFTER UPDATE OF outcome ON runs
    WHEN old.outcome IS NULL AND new.outcome IS NOT NULL
BEGIN
    INSERT INTO rollups (job) VALUES (new.job) ON CONFLICT (job) DO NOTHING;
    INSERT OR REPLACE INTO rollup_window (job, place, started_at, ended_at, outcome, flagged)
    SELECT new.job, r.ended % 51, new.started_at, new.ended_at, new.outcome,
           new.outcome = 'abandoned' OR new.key <> new.job OR EXISTS (
               SELECT 1 FROM rollup_window w
               WHERE w.job = new.job AND w.place NOT IN (r.ended % 51, (r.ended + 1) % 51)
                 AND w.ended_at > new.started_at)
    FROM rollups r WHERE r.job = new.job;
    UPDATE rollups SET
        ended = ended + 1,
        outcomes = json_set(outcomes, '$.' || new.outcome, coalesce(outcomes ->> new.outcome, 0) + 1),
        completed = completed + (e.n_duration IS NOT NULL),
        duration_sum = duration_sum + coalesce(e.n_duration, 0),
        last_success = CASE WHEN new.outcome <> 'succeeded' THEN last_success
                            WHEN last_success IS NULL OR new.ended_at > last_success THEN new.ended_at
                            ELSE last_success END,
        bad_in_a_row = CASE WHEN new.outcome = 'succeeded' THEN 0
                            WHEN new.outcome IN ('failed', 'lease_lost', 'timed_out', 'abandoned', 'interrupted')
                            THEN bad_in_a_row + 1 ELSE bad_in_a_row END,
        good_in_a_row = CASE WHEN new.outcome = 'succeeded' THEN good_in_a_row + 1
                             WHEN new.outcome IN ('failed', 'lease_lost', 'timed_out', 'abandoned', 'interrupted')
                             THEN 0 ELSE good_in_a_row END,
        w_runs = min(ended + 1, 50),
        w_flagged = w_flagged + e.n_flagged - coalesce(e.x_flagged, 0),
        w_outcomes = CASE WHEN e.x_outcome IS NULL OR e.x_outcome = new.outcome THEN e.outcomes_in
                          WHEN e.outcomes_in ->> e.x_outcome = 1 THEN json_remove(e.outcomes_in, '$.' || e.x_outcome)
                          ELSE json_set(e.outcomes_in, '$.' || e.x_outcome, (e.outcomes_in ->> e.x_outcome) - 1) END,
        -- The earliest start, or the latest success, leaves with x only if x had it.
        w_oldest = CASE WHEN e.x_started_at IS NULL OR e.x_started_at > w_oldest THEN min(coalesce(w_oldest, new.started_at), new.started_at)
                        ELSE (SELECT min(started_at) FROM rollup_window WHERE job = new.job AND place <> e.x_place) END,
        w_last_success = CASE WHEN e.x_outcome IS NOT 'succeeded' OR e.x_ended_at < w_last_success
                              THEN CASE WHEN new.outcome <> 'succeeded' THEN w_last_success
                                        ELSE max(coalesce(w_last_success, new.ended_at), new.ended_at) END
                              ELSE (SELECT max(ended_at) FROM rollup_window
                                    WHERE job = new.job AND place <> e.x_place AND outcome = 'succeeded') END,
        w_completed = e.completed_out,
        w_durations = CASE WHEN e.completed_out = 0 THEN '[]' ELSE CAST('[' || substr(e.cells, 2) || ']' AS TEXT) END,
        w_max = CASE WHEN e.completed_out > 0 THEN CAST(substr(e.cells, 25 * e.completed_out - 23) AS REAL) END,
        -- rollup.py's quantile: elements lo and lo + 1 (none without a completed run).
        (p50, p95) = (
            SELECT max(CASE WHEN q = 0.5 THEN v END), max(CASE WHEN q = 0.95 THEN v END) FROM (
                SELECT q, CAST(substr(e.cells, 25 * lo + 2, 24) AS REAL)
                          + (CAST(substr(e.cells, 25 * min(lo + 1, e.completed_out - 1) + 2, 24) AS REAL)
                             - CAST(substr(e.cells, 25 * lo + 2, 24) AS REAL)) * (h - lo) AS v
                FROM (SELECT q, h, CAST(h AS INTEGER) AS lo
                      FROM (SELECT column1 AS q, (e.completed_out - 1) * column1 AS h FROM (VALUES (0.5), (0.95))))
                WHERE e.completed_out > 0))
    FROM (
        -- The window's cells (as a blob: substr and instr count bytes, not
        -- characters; an empty blob's substr is null) with n's put in, then
        -- x's taken out.
        SELECT *, CASE WHEN x_cell IS NULL THEN cells_in
                       ELSE CAST(substr(cells_in, 1, instr(cells_in, x_cell) - 1)
                                 || substr(cells_in, instr(cells_in, x_cell) + 25) AS BLOB) END AS cells,
                  completed_in - (x_cell IS NOT NULL) AS completed_out
        FROM (
            SELECT *, CASE WHEN n_duration IS NULL THEN cells_before
                           WHEN completed_before = 0 THEN CAST(printf(',%24s', printf('%!.17g', n_duration)) AS BLOB)
                           ELSE CAST(substr(cells_before, 1, 25 * shorter) || printf(',%24s', printf('%!.17g', n_duration))
                                     || substr(cells_before, 25 * shorter + 1) AS BLOB) END AS cells_in,
                      completed_before + (n_duration IS NOT NULL) AS completed_in
            FROM (
                SELECT *, CASE WHEN x_duration IS NOT NULL
                               THEN CAST(printf(',%24s', printf('%!.17g', x_duration)) AS BLOB) END AS x_cell,
                          (SELECT count(*) FROM rollup_window s
                           WHERE s.job = new.job AND s.place <> n_place AND s.outcome IN ('succeeded', 'failed', 'timed_out')
                             AND s.ended_at - s.started_at < n_duration) AS shorter
                FROM (
                    SELECT r.w_completed AS completed_before, n.place AS n_place, n.flagged AS n_flagged,
                           CASE WHEN n.outcome IN ('succeeded', 'failed', 'timed_out') THEN n.ended_at - n.started_at END AS n_duration,
                           x.place AS x_place, x.started_at AS x_started_at, x.ended_at AS x_ended_at,
                           x.outcome AS x_outcome, x.flagged AS x_flagged,
                           CASE WHEN x.outcome IN ('succeeded', 'failed', 'timed_out') THEN x.ended_at - x.started_at END AS x_duration,
                           CASE WHEN r.w_completed = 0 THEN x'' ELSE CAST(',' || substr(CAST(r.w_durations AS BLOB), 2, length(CAST(r.w_durations AS BLOB)) - 2) AS BLOB) END AS cells_before,
                           CASE WHEN x.outcome IS n.outcome THEN r.w_outcomes
                                ELSE json_set(r.w_outcomes, '$.' || n.outcome, coalesce(r.w_outcomes ->> n.outcome, 0) + 1) END AS outcomes_in
                    FROM rollups r JOIN rollup_window n ON n.job = r.job AND n.place = r.ended % 51
                    LEFT JOIN rollup_window x ON x.job = r.job AND x.place = (r.ended + 1) % 51 AND r.ended >= 50
                    WHERE r.job = new.job LIMIT 1 OFFSET 0) LIMIT 1 OFFSET 0) LIMIT 1 OFFSET 0) LIMIT 1 OFFSET 0) AS e
    WHERE rollups.job = new.job;
END;