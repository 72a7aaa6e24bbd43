-- Version 3: fewer pages per commit, and the bare lock.
-- runs becomes WITHOUT ROWID (one b-tree keyed by run_id); events.seq loses
-- AUTOINCREMENT (no sqlite_sequence page per event), and a trigger keeps the
-- newest event from being deleted so that a seq is never reused; the index
-- events (run_id) goes. The tables are rebuilt in key order and their indexes
-- (event_id's unique one too) built once at the end: row by row, the random
-- event ids made the copy several times slower. Still a rewrite of the ledger
-- under the write lock: about 20 s for 200,000 runs on a busy disk.
-- A mark above max(seq) (possible only if a v2 file's newest events were
-- deleted by hand) is lowered to max(seq), so no new event hides below it.

CREATE TABLE locks (
    key     TEXT PRIMARY KEY,
    owner   TEXT,
    token   INTEGER NOT NULL,
    expires REAL,
    boot_id TEXT
) WITHOUT ROWID;
CREATE TABLE runs_v3 (
    run_id     TEXT PRIMARY KEY,
    job        TEXT NOT NULL,
    key        TEXT NOT NULL,
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    token      INTEGER NOT NULL,
    slot       REAL,
    started_at REAL NOT NULL,
    ended_at   REAL,
    outcome    TEXT,
    exit_code  INTEGER,
    detail     TEXT NOT NULL DEFAULT ''
) WITHOUT ROWID;
INSERT INTO runs_v3 (run_id, job, key, host, pid, token, slot, started_at, ended_at, outcome,
                     exit_code, detail)
    SELECT run_id, job, key, host, pid, token, slot, started_at, ended_at, outcome, exit_code, detail
    FROM runs ORDER BY run_id;
DROP TABLE runs;
ALTER TABLE runs_v3 RENAME TO runs;
CREATE INDEX runs_job_started ON runs (job, started_at);
CREATE INDEX runs_open ON runs (job, started_at) WHERE outcome IS NULL;
CREATE TABLE events_v3 (
    seq      INTEGER PRIMARY KEY,
    event_id TEXT NOT NULL,
    kind     TEXT NOT NULL,
    job      TEXT NOT NULL,
    run_id   TEXT,
    at       REAL NOT NULL,
    data     TEXT NOT NULL
);
INSERT INTO events_v3 (seq, event_id, kind, job, run_id, at, data)
    SELECT seq, event_id, kind, job, run_id, at, data FROM events ORDER BY seq;
DROP TABLE events;
ALTER TABLE events_v3 RENAME TO events;
CREATE UNIQUE INDEX events_event_id ON events (event_id);
CREATE INDEX events_job_at ON events (job, at);
CREATE TRIGGER events_keep_newest BEFORE DELETE ON events
    WHEN old.seq = (SELECT max(seq) FROM events)
BEGIN
    SELECT RAISE(ABORT, 'the newest event must not be deleted: seq numbers would be reused');
END;
UPDATE outbox_marks SET mark = (SELECT coalesce(max(seq), 0) FROM events)
    WHERE mark > (SELECT coalesce(max(seq), 0) FROM events);
DELETE FROM outbox_acks WHERE seq > (SELECT coalesce(max(seq), 0) FROM events);
