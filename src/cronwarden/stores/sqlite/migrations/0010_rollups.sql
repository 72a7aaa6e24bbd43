-- Version 10: each job's rollup (stores/rollup.py), kept by triggers. Jobs already in
-- the ledger get a stale row: read from the ledger until rebuild_rollups (cronwarden
-- rollup --rebuild, or the monitor's next recording pass) folds their history in.

-- Each job's rollup (stores/rollup.py says what each column means): kept by
-- the triggers below in the transaction that writes the run or the event, so
-- every writer keeps it (finish, an abandon, a refused start, record). The
-- monitor reads all rows at once (rollups) instead of every job's window.
CREATE TABLE rollups (
    job            TEXT PRIMARY KEY,
    stale          INTEGER NOT NULL DEFAULT 0,
    ended          INTEGER NOT NULL DEFAULT 0,
    outcomes       TEXT NOT NULL DEFAULT '{}',
    completed      INTEGER NOT NULL DEFAULT 0,
    duration_sum   REAL NOT NULL DEFAULT 0,
    last_start     REAL,
    last_success   REAL,
    bad_in_a_row   INTEGER NOT NULL DEFAULT 0,
    good_in_a_row  INTEGER NOT NULL DEFAULT 0,
    skips          INTEGER NOT NULL DEFAULT 0,
    skips_in_a_row INTEGER NOT NULL DEFAULT 0,
    last_refusal   REAL,
    last_overlap   REAL,
    skip_times     TEXT NOT NULL DEFAULT '[]',  -- the latest 50 skipped times
    w_runs         INTEGER NOT NULL DEFAULT 0,
    w_oldest       REAL,
    w_flagged      INTEGER NOT NULL DEFAULT 0,
    w_completed    INTEGER NOT NULL DEFAULT 0,
    w_outcomes     TEXT NOT NULL DEFAULT '{}',
    w_durations    TEXT NOT NULL DEFAULT '[]',
    p50            REAL,
    p95            REAL,
    w_max          REAL,
    w_last_success REAL,
    attempts       TEXT NOT NULL DEFAULT '[]'  -- the latest 16 attempts: [time, slot or null]
) WITHOUT ROWID;
-- The window: each job's last 50 ended runs, one row per place in the ring
-- (the run's end counted from 0, mod 50), so the statistics are computed
-- over at most 50 indexed rows (SQLite's JSON functions re-parse an element
-- at every look, several times slower).
CREATE TABLE rollup_window (
    job        TEXT NOT NULL,
    place      INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at   REAL NOT NULL,
    outcome    TEXT NOT NULL,
    flagged    INTEGER NOT NULL,
    PRIMARY KEY (job, place)
) WITHOUT ROWID;

-- A run ends (finish's terminal record, or an abandon): the window's entry
-- (flagged when an entry that stays ended after this run started), the
-- lifetime counters, then the window's statistics.
CREATE TRIGGER rollup_end AFTER UPDATE OF outcome ON runs
    WHEN old.outcome IS NULL AND new.outcome IS NOT NULL
BEGIN
    INSERT INTO rollups (job) VALUES (new.job) ON CONFLICT (job) DO NOTHING;
    INSERT OR REPLACE INTO rollup_window (job, place, started_at, ended_at, outcome, flagged)
    SELECT new.job, r.ended % 50, new.started_at, new.ended_at, new.outcome,
           new.outcome = 'abandoned' OR new.key <> new.job OR EXISTS (
               SELECT 1 FROM rollup_window w
               WHERE w.job = new.job AND w.place <> r.ended % 50 AND w.ended_at > new.started_at)
    FROM rollups r WHERE r.job = new.job;
    UPDATE rollups SET
        ended = ended + 1,
        outcomes = json_set(outcomes, '$.' || new.outcome,
                            coalesce(json_extract(outcomes, '$.' || new.outcome), 0) + 1),
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
        (w_runs, w_oldest, w_flagged, w_last_success) = (
            SELECT count(*), min(started_at), sum(flagged),
                   max(CASE WHEN outcome = 'succeeded' THEN ended_at END)
            FROM rollup_window WHERE job = new.job),
        w_outcomes = (SELECT json_group_object(outcome, n) FROM (
            SELECT outcome, count(*) AS n FROM rollup_window WHERE job = new.job GROUP BY outcome)),
        (w_completed, w_durations, w_max) = (
            SELECT count(*), '[' || coalesce(group_concat(printf('%!.17g', v), ','), '') || ']', max(v)
            FROM (SELECT ended_at - started_at AS v FROM rollup_window
                  WHERE job = new.job AND outcome IN ('succeeded', 'failed', 'timed_out') ORDER BY v))
    WHERE job = new.job;
    -- The quantiles from the ascending durations just written: element lo,
    -- and lo + 1, of the JSON array, as rollup.py's quantile interpolates
    -- (none without a completed run).
    UPDATE rollups SET
        p50 = CASE WHEN w_completed = 0 THEN NULL ELSE
              json_extract(w_durations, '$[' || CAST((w_completed - 1) * 0.5 AS INTEGER) || ']')
              + (json_extract(w_durations, '$[' || min(CAST((w_completed - 1) * 0.5 AS INTEGER) + 1, w_completed - 1) || ']')
                 - json_extract(w_durations, '$[' || CAST((w_completed - 1) * 0.5 AS INTEGER) || ']'))
                * ((w_completed - 1) * 0.5 - CAST((w_completed - 1) * 0.5 AS INTEGER)) END,
        p95 = CASE WHEN w_completed = 0 THEN NULL ELSE
              json_extract(w_durations, '$[' || CAST((w_completed - 1) * 0.95 AS INTEGER) || ']')
              + (json_extract(w_durations, '$[' || min(CAST((w_completed - 1) * 0.95 AS INTEGER) + 1, w_completed - 1) || ']')
                 - json_extract(w_durations, '$[' || CAST((w_completed - 1) * 0.95 AS INTEGER) || ']'))
                * ((w_completed - 1) * 0.95 - CAST((w_completed - 1) * 0.95 AS INTEGER)) END
    WHERE job = new.job;
END;

-- A run starts: an attempt, the latest start, and the skips at or after it.
CREATE TRIGGER rollup_start AFTER INSERT ON runs
BEGIN
    INSERT INTO rollups (job) VALUES (new.job) ON CONFLICT (job) DO NOTHING;
    UPDATE rollups SET attempts = json_insert(
        CASE WHEN json_array_length(attempts) >= 16 THEN json_remove(attempts, '$[0]') ELSE attempts END,
        '$[#]', json_array(json(printf('%!.17g', new.started_at)),
                           CASE WHEN new.slot IS NULL THEN NULL ELSE json(printf('%!.17g', new.slot)) END))
    WHERE job = new.job;
    UPDATE rollups SET
        skips_in_a_row = (SELECT count(*) FROM json_each(skip_times) WHERE value >= new.started_at),
        last_start = new.started_at
    WHERE job = new.job AND (last_start IS NULL OR new.started_at >= last_start);
END;

-- A refused or overlapping start.
CREATE TRIGGER rollup_refusal AFTER INSERT ON events
    WHEN new.kind IN ('skipped', 'queued', 'queue_full', 'overlap')
BEGIN
    INSERT INTO rollups (job) VALUES (new.job) ON CONFLICT (job) DO NOTHING;
    UPDATE rollups SET
        last_overlap = CASE WHEN new.kind <> 'overlap' THEN last_overlap
                            WHEN last_overlap IS NULL OR new.at > last_overlap THEN new.at
                            ELSE last_overlap END,
        last_refusal = CASE WHEN new.kind = 'overlap' THEN last_refusal
                            WHEN last_refusal IS NULL OR new.at > last_refusal THEN new.at
                            ELSE last_refusal END,
        skips = skips + (new.kind = 'skipped'),
        skips_in_a_row = skips_in_a_row + (new.kind = 'skipped' AND (last_start IS NULL OR new.at >= last_start)),
        attempts = CASE WHEN new.kind NOT IN ('skipped', 'queue_full') THEN attempts ELSE json_insert(
            CASE WHEN json_array_length(attempts) >= 16 THEN json_remove(attempts, '$[0]') ELSE attempts END,
            '$[#]', json_array(json(printf('%!.17g', new.at)), NULL)) END,
        skip_times = CASE WHEN new.kind <> 'skipped' THEN skip_times ELSE json_insert(
            CASE WHEN json_array_length(skip_times) >= 50 THEN json_remove(skip_times, '$[0]') ELSE skip_times END,
            '$[#]', json(printf('%!.17g', new.at))) END
    WHERE job = new.job;
END;

INSERT INTO rollups (job, stale) SELECT DISTINCT job, 1 FROM runs WHERE true ON CONFLICT (job) DO NOTHING;
INSERT INTO rollups (job, stale) SELECT DISTINCT job, 1 FROM events WHERE kind IN ('skipped', 'queued', 'queue_full', 'overlap')
ON CONFLICT (job) DO NOTHING;
