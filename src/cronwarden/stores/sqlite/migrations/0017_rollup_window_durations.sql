-- Version 17: the window's rows carry their run's duration (completed runs
-- only), in a partial index by job and duration, and a run's end recomputes
-- the window's statistics over its rows again: aggregates over at most 50
-- rows, the quantiles read from the index at their offsets. It replaces
-- version 16's fixed-width cells of w_durations and its 51st place, which
-- cost an end more CPU (bench/README.md) and were harder to read. The ring
-- goes back to 50 places (the run's end counted from 0, mod 50): the entry
-- that leaves is the row the new one replaces.

CREATE TEMP TABLE rollup_window_v16 AS
SELECT w.job, r.ended - 1 - ((r.ended - 1 - w.place) % 51) AS n, w.started_at, w.ended_at, w.outcome, w.flagged
FROM rollup_window w JOIN rollups r ON r.job = w.job;
DROP TABLE rollup_window;
CREATE TABLE rollup_window (
    job        TEXT NOT NULL,
    place      INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at   REAL NOT NULL,
    outcome    TEXT NOT NULL,
    flagged    INTEGER NOT NULL,
    duration   REAL,
    PRIMARY KEY (job, place)
) WITHOUT ROWID;
CREATE INDEX rollup_window_durations ON rollup_window (job, duration) WHERE duration IS NOT NULL;
INSERT INTO rollup_window (job, place, started_at, ended_at, outcome, flagged, duration)
SELECT w.job, w.n % 50, w.started_at, w.ended_at, w.outcome, w.flagged,
       CASE WHEN w.outcome IN ('succeeded', 'failed', 'timed_out') THEN w.ended_at - w.started_at END
FROM rollup_window_v16 w JOIN rollups r ON r.job = w.job
WHERE w.n >= r.ended - 50;
DROP TABLE rollup_window_v16;

UPDATE rollups SET w_durations = (
    SELECT '[' || coalesce(group_concat(printf('%!.17g', duration), ','), '') || ']'
    FROM (SELECT duration FROM rollup_window WHERE job = rollups.job AND duration IS NOT NULL ORDER BY duration));

DROP TRIGGER rollup_end;
-- A run ends (finish's terminal record, or an abandon): its window entry
-- over the one that leaves (flagged when an entry that stays ended after
-- this run started), then the lifetime counters and the window's
-- statistics over its rows, then the quantiles (rollup.py's quantile:
-- elements lo and lo + 1 of the ascending durations, through the index).
CREATE TRIGGER rollup_end AFTER UPDATE OF outcome ON runs
    WHEN old.outcome IS NULL AND new.outcome IS NOT NULL
BEGIN
    INSERT INTO rollups (job) VALUES (new.job) ON CONFLICT (job) DO NOTHING;
    INSERT OR REPLACE INTO rollup_window (job, place, started_at, ended_at, outcome, flagged, duration)
    SELECT new.job, r.ended % 50, new.started_at, new.ended_at, new.outcome,
           new.outcome = 'abandoned' OR new.key <> new.job OR EXISTS (
               SELECT 1 FROM rollup_window w
               WHERE w.job = new.job AND w.place <> r.ended % 50 AND w.ended_at > new.started_at),
           CASE WHEN new.outcome IN ('succeeded', 'failed', 'timed_out') THEN new.ended_at - new.started_at END
    FROM rollups r WHERE r.job = new.job;
    UPDATE rollups SET
        ended = ended + 1,
        outcomes = json_set(outcomes, '$.' || new.outcome, coalesce(outcomes ->> new.outcome, 0) + 1),
        completed = completed + (new.outcome IN ('succeeded', 'failed', 'timed_out')),
        duration_sum = duration_sum + CASE WHEN new.outcome IN ('succeeded', 'failed', 'timed_out')
                                           THEN new.ended_at - new.started_at ELSE 0 END,
        last_success = CASE WHEN new.outcome <> 'succeeded' THEN last_success
                            WHEN last_success IS NULL OR new.ended_at > last_success THEN new.ended_at
                            ELSE last_success END,
        bad_in_a_row = CASE WHEN new.outcome = 'succeeded' THEN 0
                            WHEN new.outcome IN ('failed', 'lease_lost', 'timed_out', 'abandoned', 'interrupted')
                            THEN bad_in_a_row + 1 ELSE bad_in_a_row END,
        good_in_a_row = CASE WHEN new.outcome = 'succeeded' THEN good_in_a_row + 1
                             WHEN new.outcome IN ('failed', 'lease_lost', 'timed_out', 'abandoned', 'interrupted')
                             THEN 0 ELSE good_in_a_row END,
        (w_runs, w_oldest, w_flagged, w_last_success, w_completed, w_max) = (
            SELECT count(*), min(started_at), sum(flagged), max(CASE WHEN outcome = 'succeeded' THEN ended_at END),
                   count(duration), max(duration)
            FROM rollup_window WHERE job = new.job),
        w_outcomes = (SELECT json_group_object(outcome, n) FROM (
            SELECT outcome, count(*) AS n FROM rollup_window WHERE job = new.job GROUP BY outcome)),
        w_durations = (SELECT '[' || coalesce(group_concat(printf('%!.17g', duration), ','), '') || ']'
                       FROM (SELECT duration FROM rollup_window WHERE job = new.job AND duration IS NOT NULL
                             ORDER BY duration))
    WHERE job = new.job;
    UPDATE rollups SET
        p50 = (SELECT duration FROM rollup_window WHERE job = new.job AND duration IS NOT NULL ORDER BY duration
               LIMIT 1 OFFSET (SELECT CAST((w_completed - 1) * 0.5 AS INTEGER) FROM rollups WHERE job = new.job))
              + ((SELECT duration FROM rollup_window WHERE job = new.job AND duration IS NOT NULL ORDER BY duration
                  LIMIT 1 OFFSET (SELECT min(CAST((w_completed - 1) * 0.5 AS INTEGER) + 1, w_completed - 1)
                                  FROM rollups WHERE job = new.job))
                 - (SELECT duration FROM rollup_window WHERE job = new.job AND duration IS NOT NULL ORDER BY duration
                    LIMIT 1 OFFSET (SELECT CAST((w_completed - 1) * 0.5 AS INTEGER) FROM rollups WHERE job = new.job)))
                * ((w_completed - 1) * 0.5 - CAST((w_completed - 1) * 0.5 AS INTEGER)),
        p95 = (SELECT duration FROM rollup_window WHERE job = new.job AND duration IS NOT NULL ORDER BY duration
               LIMIT 1 OFFSET (SELECT CAST((w_completed - 1) * 0.95 AS INTEGER) FROM rollups WHERE job = new.job))
              + ((SELECT duration FROM rollup_window WHERE job = new.job AND duration IS NOT NULL ORDER BY duration
                  LIMIT 1 OFFSET (SELECT min(CAST((w_completed - 1) * 0.95 AS INTEGER) + 1, w_completed - 1)
                                  FROM rollups WHERE job = new.job))
                 - (SELECT duration FROM rollup_window WHERE job = new.job AND duration IS NOT NULL ORDER BY duration
                    LIMIT 1 OFFSET (SELECT CAST((w_completed - 1) * 0.95 AS INTEGER) FROM rollups WHERE job = new.job)))
                * ((w_completed - 1) * 0.95 - CAST((w_completed - 1) * 0.95 AS INTEGER))
    WHERE job = new.job;
END;
