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
