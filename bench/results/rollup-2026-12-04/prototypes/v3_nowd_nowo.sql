DELETE FROM rollup_window;
ALTER TABLE rollup_window ADD COLUMN duration REAL;
CREATE INDEX rollup_window_durations ON rollup_window (job, duration) WHERE duration IS NOT NULL;
INSERT INTO rollups (job) VALUES ('bench');
CREATE TRIGGER rollup_end2 AFTER UPDATE OF outcome ON runs
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
            FROM rollup_window WHERE job = new.job)
    WHERE job = new.job;
    UPDATE rollups SET
        p50 = (SELECT duration FROM rollup_window WHERE job = new.job AND duration IS NOT NULL ORDER BY duration LIMIT 1 OFFSET (SELECT CAST((w_completed - 1) * 0.5 AS INTEGER) FROM rollups WHERE job = new.job)) + ((SELECT duration FROM rollup_window WHERE job = new.job AND duration IS NOT NULL ORDER BY duration LIMIT 1 OFFSET (SELECT min(CAST((w_completed - 1) * 0.5 AS INTEGER) + 1, w_completed - 1) FROM rollups WHERE job = new.job)) - (SELECT duration FROM rollup_window WHERE job = new.job AND duration IS NOT NULL ORDER BY duration LIMIT 1 OFFSET (SELECT CAST((w_completed - 1) * 0.5 AS INTEGER) FROM rollups WHERE job = new.job))) * ((w_completed - 1) * 0.5 - CAST((w_completed - 1) * 0.5 AS INTEGER)),
        p95 = (SELECT duration FROM rollup_window WHERE job = new.job AND duration IS NOT NULL ORDER BY duration LIMIT 1 OFFSET (SELECT CAST((w_completed - 1) * 0.95 AS INTEGER) FROM rollups WHERE job = new.job)) + ((SELECT duration FROM rollup_window WHERE job = new.job AND duration IS NOT NULL ORDER BY duration LIMIT 1 OFFSET (SELECT min(CAST((w_completed - 1) * 0.95 AS INTEGER) + 1, w_completed - 1) FROM rollups WHERE job = new.job)) - (SELECT duration FROM rollup_window WHERE job = new.job AND duration IS NOT NULL ORDER BY duration LIMIT 1 OFFSET (SELECT CAST((w_completed - 1) * 0.95 AS INTEGER) FROM rollups WHERE job = new.job))) * ((w_completed - 1) * 0.95 - CAST((w_completed - 1) * 0.95 AS INTEGER))
    WHERE job = new.job;
END;
