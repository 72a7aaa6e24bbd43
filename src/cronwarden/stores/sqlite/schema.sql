-- The SQLite store's schema as it is now, whole: what a new file gets. A file
-- written by an earlier version is brought here by the files in migrations/
-- instead; tests/stores/test_sqlite_schema.py holds the two to the same
-- catalog. The version (the number of the newest migration) is kept in the
-- file header's user_version, not in a table.
--
-- Times: `expires`, `claimed_at` are the store's clock (CLOCK_BOOTTIME seconds)
-- and only mean something with their `boot_id`; `at`, `started_at`,
-- `ended_at`, `slot`, `updated_at` are wall-clock epoch seconds, for people.

-- One row per lease key (a job, or job:shard, or policy allow's side lease
-- key+run_id). A row is never deleted on release: its token keeps counting.
-- Only a side lease's row goes when its run finishes.
CREATE TABLE leases (
    key        TEXT PRIMARY KEY,  -- every lease step reads by key: acquire, renew, finish, lease()
    job        TEXT NOT NULL,
    owner      TEXT,              -- run id; NULL when released
    token      INTEGER NOT NULL,  -- the fencing counter
    expires    REAL,
    boot_id    TEXT,
    pending    INTEGER NOT NULL DEFAULT 0,  -- policy queue's waiting starts
    revoked_by TEXT               -- policy replace: the run taking over
);

-- One row per start. WITHOUT ROWID: one b-tree keyed by run id, where a rowid
-- table would add a second one for the primary key (a page per commit).
CREATE TABLE runs (
    run_id     TEXT PRIMARY KEY,  -- run(), finish's terminal record, acquire's holder
    job        TEXT NOT NULL,
    key        TEXT NOT NULL,
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    token      INTEGER NOT NULL,
    slot       REAL,
    started_at REAL NOT NULL,
    ended_at   REAL,
    outcome    TEXT,              -- NULL while the run is open
    exit_code  INTEGER,
    detail     TEXT NOT NULL DEFAULT ''
) WITHOUT ROWID;
-- runs(job, limit), newest first: `cronwarden history`, the monitor's and
-- `cronwarden audit`'s last runs, the dashboard.
CREATE INDEX runs_job_started ON runs (job, started_at);
-- open_runs(job): `cronwarden status`, the monitor's stuck and abandoned
-- checks, policy allow's look at the other open runs, `cronwarden report`.
CREATE INDEX runs_open ON runs (job, started_at) WHERE outcome IS NULL;

-- The ledger. `seq` is the rowid (no AUTOINCREMENT, which wrote the
-- sqlite_sequence page in every commit): with one writer at a time it is
-- commit order, and the outbox reads by it.
CREATE TABLE events (
    seq      INTEGER PRIMARY KEY,
    event_id TEXT NOT NULL,
    kind     TEXT NOT NULL,
    job      TEXT NOT NULL,
    run_id   TEXT,
    at       REAL NOT NULL,
    data     TEXT NOT NULL  -- a JSON object
);
-- record() writes an event once per id (ON CONFLICT (event_id) DO NOTHING);
-- mark_delivered() acknowledges by id.
CREATE UNIQUE INDEX events_event_id ON events (event_id);
-- events(job=…, kinds, since): the monitor's window, `cronwarden history`'s
-- refusals, the outbox's backoff (a sink's newest failure). Reads by run id
-- or kind alone, across jobs, scan the table; nothing on a hot path makes them.
CREATE INDEX events_job_at ON events (job, at);
-- The monitor's finding states and snoozes, per job (every pass reads them for
-- every job), and the dashboard's latest trouble across jobs. Partial: a run's
-- own events (started, succeeded) cost no entry. Used only by a query whose kind
-- list is the index's own, as written (stores/sql.py writes sorted literals).
CREATE INDEX events_findings ON events (job, at)
    WHERE kind IN ('failing', 'grace_too_wide', 'missed', 'overlap', 'policy_undecided', 'skips_in_a_row', 'slow', 'snoozed', 'stuck', 'too_often', 'unsnoozed');
-- Each job's newest pause event (paused, job_paused, job_resumed), all jobs
-- in one read: whether a scheduled job is paused.
CREATE INDEX events_pauses ON events (job, at)
    WHERE kind IN ('job_paused', 'job_resumed', 'paused');
CREATE INDEX events_trouble ON events (at)
    WHERE kind IN ('abandoned', 'failed', 'failing', 'grace_too_wide', 'interrupted', 'job_paused', 'job_resumed', 'lease_lost', 'misfired', 'missed', 'overlap', 'paused', 'policy_undecided', 'queue_full', 'replaced', 'sink_failed', 'sink_rejected', 'skipped', 'skips_in_a_row', 'slow', 'snoozed', 'stopped', 'stuck', 'timed_out', 'too_often', 'unsnoozed');
-- A rowid is max(rowid) + 1, so deleting the newest event would hand its seq
-- out again, below a sink's mark that had passed it: the sink would never see
-- the new event. Older events may be deleted (retention); the newest may not.
CREATE TRIGGER events_keep_newest BEFORE DELETE ON events
    WHEN old.seq = (SELECT max(seq) FROM events)
BEGIN
    SELECT RAISE(ABORT, 'the newest event must not be deleted: seq numbers would be reused');
END;

-- What the store knows of each job's schedule and policy. job(name) reads
-- one row by the primary key on every `cronwarden run`; save_job upserts it.
CREATE TABLE jobs (
    name        TEXT PRIMARY KEY,
    schedule    TEXT,
    period      REAL,
    policy      TEXT NOT NULL,
    reason      TEXT NOT NULL,
    ttl         REAL,
    grace       REAL,
    max_runtime REAL,
    updated_at  REAL NOT NULL
);

-- The outbox: per sink, a mark below which every event is acknowledged, and
-- the acknowledged events above it. undelivered() and mark_delivered() read
-- both by their primary keys.
CREATE TABLE outbox_marks (
    sink          TEXT PRIMARY KEY,
    mark          INTEGER NOT NULL,
    registered_at REAL NOT NULL
);
CREATE TABLE outbox_acks (
    sink TEXT NOT NULL,
    seq  INTEGER NOT NULL,
    PRIMARY KEY (sink, seq)
) WITHOUT ROWID;

-- Each sink's dead letters: the events it refused for good (reject), set
-- aside until a replay delivers them (forget_rejected). At most
-- DEAD_LETTERS_KEPT per sink: reject drops the oldest beyond it. Every read
-- and write goes by (sink, seq).
CREATE TABLE outbox_rejected (
    sink TEXT NOT NULL,
    seq  INTEGER NOT NULL,
    PRIMARY KEY (sink, seq)
) WITHOUT ROWID;

-- The bare lock (lock, renew_lock, unlock: the scheduler's leader lease). A
-- row is never deleted, so its token keeps counting.
CREATE TABLE locks (
    key     TEXT PRIMARY KEY,
    owner   TEXT,
    token   INTEGER NOT NULL,
    expires REAL,
    boot_id TEXT
) WITHOUT ROWID;

-- The scheduler's slot claims: one row per claimed (job, slot). claim_slot
-- reads and inserts by the primary key, and forgets the job's old claims
-- through its first column.
CREATE TABLE slot_claims (
    job        TEXT NOT NULL,
    slot       REAL NOT NULL,
    owner      TEXT NOT NULL,
    claimed_at REAL NOT NULL,
    boot_id    TEXT NOT NULL,
    PRIMARY KEY (job, slot)
) WITHOUT ROWID;

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
-- The window: each job's last 50 ended runs, one row per place in a ring of
-- 51 (the run's end counted from 0, mod 51). The 51st place holds the entry
-- that left the window at the latest end, so an end's statistics are the
-- previous ones with one entry in and one out, not a recomputation over 50
-- rows (that was most of what an end cost).
CREATE TABLE rollup_window (
    job        TEXT NOT NULL,
    place      INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at   REAL NOT NULL,
    outcome    TEXT NOT NULL,
    flagged    INTEGER NOT NULL,
    PRIMARY KEY (job, place)
) WITHOUT ROWID;

-- rollups.w_durations here is a JSON array of cells of 25 characters: a
-- comma and the number (printf '%!.17g', 24 characters at most) padded on
-- the left with spaces; the first cell's comma is the array's '['. Fixed
-- cells let an end put its duration in (after the count of shorter ones) and
-- take the leaving one out (its cell, found by instr: commas start cells
-- only) with substr, and read the quantiles' elements at their offsets,
-- without parsing or printing the other 49 (that was most of an end's cost).
-- window_durations (queries.sql) writes the same from the window's rows.

-- A run ends (finish's terminal record, or an abandon): the window's entry n
-- (flagged when an entry that stays ended after this run started) over the
-- one that left 51 ends ago, then the lifetime counters and the window's
-- statistics from n and the entry x that leaves the window with this end.
CREATE TRIGGER rollup_end AFTER UPDATE OF outcome ON runs
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
