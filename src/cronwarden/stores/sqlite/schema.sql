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
-- Each job's newest manual start (triggered) since a time of its own, all jobs in
-- one read (Store.latest_since): whether the attempts a rollup keeps hold one.
CREATE INDEX events_triggered ON events (job, at) WHERE kind IN ('triggered');
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
-- 50 (the run's end counted from 0, mod 50: the entry that leaves is the
-- row the new one replaces), with its duration if it completed, so an
-- end's statistics are aggregates over at most 50 indexed rows.
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
