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
    recent         TEXT NOT NULL DEFAULT '[]',  -- the window: [start, end, outcome, flagged], oldest first
    w_runs         INTEGER NOT NULL DEFAULT 0,
    w_oldest       REAL,
    w_flagged      INTEGER NOT NULL DEFAULT 0,
    w_completed    INTEGER NOT NULL DEFAULT 0,
    w_outcomes     TEXT NOT NULL DEFAULT '{}',
    w_durations    TEXT NOT NULL DEFAULT '[]',
    p50            REAL,
    p95            REAL,
    w_max          REAL,
    w_last_success REAL
) WITHOUT ROWID;

-- A run ends (finish's terminal record, or an abandon): the lifetime
-- counters, the window (the last 50 ended runs) and its statistics. The
-- quantiles are stores/rollup.py's quantile, operation for operation; times and
-- durations go into JSON as 17 significant digits (json_array alone keeps 15).
CREATE TRIGGER rollup_end AFTER UPDATE OF outcome ON runs
    WHEN old.outcome IS NULL AND new.outcome IS NOT NULL
BEGIN
    INSERT INTO rollups (job) VALUES (new.job) ON CONFLICT (job) DO NOTHING;
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
        recent = json_insert(
            CASE WHEN json_array_length(recent) >= 50 THEN json_remove(recent, '$[0]') ELSE recent END,
            '$[#]',
            json_array(json(printf('%!.17g', new.started_at)), json(printf('%!.17g', new.ended_at)), new.outcome,
                       new.outcome = 'abandoned' OR new.key <> new.job
                       OR EXISTS (SELECT 1 FROM json_each(recent) WHERE json_extract(value, '$[1]') > new.started_at)))
    WHERE job = new.job;
    UPDATE rollups SET
        w_runs = (SELECT count(*) FROM json_each(recent)),
        w_oldest = (SELECT min(json_extract(value, '$[0]')) FROM json_each(recent)),
        w_flagged = (SELECT coalesce(sum(json_extract(value, '$[3]')), 0) FROM json_each(recent)),
        w_outcomes = (SELECT json_group_object(o, n) FROM (
            SELECT json_extract(value, '$[2]') AS o, count(*) AS n FROM json_each(recent) GROUP BY 1)),
        w_last_success = (SELECT max(json_extract(value, '$[1]')) FROM json_each(recent)
                          WHERE json_extract(value, '$[2]') = 'succeeded'),
        (w_completed, w_durations, w_max, p50, p95) = (
            SELECT count(*), json_group_array(json(printf('%!.17g', v))), max(v),
                   max(CASE WHEN i = lo50 THEN v END)
                   + (max(CASE WHEN i = hi50 THEN v END) - max(CASE WHEN i = lo50 THEN v END)) * (h50 - lo50),
                   max(CASE WHEN i = lo95 THEN v END)
                   + (max(CASE WHEN i = hi95 THEN v END) - max(CASE WHEN i = lo95 THEN v END)) * (h95 - lo95)
            FROM (SELECT v, i, h50, CAST(h50 AS INTEGER) AS lo50, min(CAST(h50 AS INTEGER) + 1, n - 1) AS hi50,
                         h95, CAST(h95 AS INTEGER) AS lo95, min(CAST(h95 AS INTEGER) + 1, n - 1) AS hi95
                  FROM (SELECT v, i, n, (n - 1) * 0.5 AS h50, (n - 1) * 0.95 AS h95
                        FROM (SELECT v, row_number() OVER (ORDER BY v) - 1 AS i, count(*) OVER () AS n
                              FROM (SELECT json_extract(value, '$[1]') - json_extract(value, '$[0]') AS v
                                    FROM json_each(recent)
                                    WHERE json_extract(value, '$[2]') IN ('succeeded', 'failed', 'timed_out')))
                        ORDER BY v)))
    WHERE job = new.job;
END;

-- A run starts: the latest start, and the skips at or after it.
CREATE TRIGGER rollup_start AFTER INSERT ON runs
BEGIN
    INSERT INTO rollups (job) VALUES (new.job) ON CONFLICT (job) DO NOTHING;
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
        skip_times = CASE WHEN new.kind <> 'skipped' THEN skip_times ELSE json_insert(
            CASE WHEN json_array_length(skip_times) >= 50 THEN json_remove(skip_times, '$[0]') ELSE skip_times END,
            '$[#]', json(printf('%!.17g', new.at))) END
    WHERE job = new.job;
END;

INSERT INTO rollups (job, stale) SELECT DISTINCT job FROM runs WHERE true ON CONFLICT (job) DO NOTHING;
INSERT INTO rollups (job, stale) SELECT DISTINCT job FROM events WHERE kind IN ('skipped', 'queued', 'queue_full', 'overlap')
ON CONFLICT (job) DO NOTHING;
