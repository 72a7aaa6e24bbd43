-- Version 1: leases, runs, the ledger of events, and what the store knows of jobs.

CREATE TABLE leases (
    key        TEXT PRIMARY KEY,
    job        TEXT NOT NULL,
    owner      TEXT,
    token      INTEGER NOT NULL,
    expires    REAL,
    boot_id    TEXT,
    pending    INTEGER NOT NULL DEFAULT 0,
    revoked_by TEXT
);
CREATE TABLE runs (
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
);
CREATE INDEX runs_job_started ON runs (job, started_at);
CREATE INDEX runs_open ON runs (job, started_at) WHERE outcome IS NULL;
CREATE TABLE events (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    kind     TEXT NOT NULL,
    job      TEXT NOT NULL,
    run_id   TEXT,
    at       REAL NOT NULL,
    data     TEXT NOT NULL
);
CREATE INDEX events_job_at ON events (job, at);
CREATE INDEX events_run ON events (run_id);
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
