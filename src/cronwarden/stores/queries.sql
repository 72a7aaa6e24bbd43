-- The read side and save_job, shared by the SQLite and the PostgreSQL store
-- (stores/sql.py). {s} is the store's schema (main on SQLite); %s is a
-- parameter, turned into the driver's own placeholder by the store.
-- Columns are listed in the order stores/sql.py reads them (RUN_COLUMNS,
-- EVENT_COLUMNS, and JobInfo's fields for jobs).

-- name: runs --
-- A job's runs, newest first, through the index runs (job, started_at).
SELECT run_id, job, key, host, pid, token, slot, started_at, ended_at, outcome, exit_code, detail
FROM {s}.runs WHERE job = %s ORDER BY started_at DESC LIMIT %s;

-- name: run --
SELECT run_id, job, key, host, pid, token, slot, started_at, ended_at, outcome, exit_code, detail
FROM {s}.runs WHERE run_id = %s;

-- name: events --
-- The start of every events() read: stores/sql.py adds the filters, the
-- order and the limit.
SELECT seq, event_id, kind, job, run_id, at, data FROM {s}.events;

-- name: save_job --
INSERT INTO {s}.jobs (name, schedule, period, policy, reason, ttl, grace, max_runtime, updated_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (name) DO UPDATE SET
    schedule = excluded.schedule, period = excluded.period, policy = excluded.policy,
    reason = excluded.reason, ttl = excluded.ttl, grace = excluded.grace,
    max_runtime = excluded.max_runtime, updated_at = excluded.updated_at;

-- name: jobs --
SELECT name, schedule, period, policy, reason, ttl, grace, max_runtime, updated_at
FROM {s}.jobs ORDER BY name;

-- name: ledger_jobs --
-- The distinct jobs of runs and of events, one index probe per job (a loose
-- index scan over runs (job, started_at) and events (job, at)), not a scan
-- of the ledger.
WITH RECURSIVE
    r(job) AS (
        SELECT min(job) FROM {s}.runs
        UNION ALL
        SELECT (SELECT min(job) FROM {s}.runs WHERE job > r.job) FROM r WHERE r.job IS NOT NULL
    ),
    e(job) AS (
        SELECT min(job) FROM {s}.events
        UNION ALL
        SELECT (SELECT min(job) FROM {s}.events WHERE job > e.job) FROM e WHERE e.job IS NOT NULL
    )
SELECT job FROM r WHERE job IS NOT NULL
UNION
SELECT job FROM e WHERE job IS NOT NULL
ORDER BY 1;

-- name: job --
-- One job by the primary key: every `cronwarden run` asks for its own.
SELECT name, schedule, period, policy, reason, ttl, grace, max_runtime, updated_at
FROM {s}.jobs WHERE name = %s;

-- name: rejected --
-- A sink's dead letters, oldest first, through the primary key (sink, seq).
SELECT e.seq, e.event_id, e.kind, e.job, e.run_id, e.at, e.data
FROM {s}.outbox_rejected r JOIN {s}.events e ON e.seq = r.seq
WHERE r.sink = %s
ORDER BY r.seq
LIMIT %s;

-- name: rejected_counts --
SELECT sink, count(*) FROM {s}.outbox_rejected GROUP BY sink ORDER BY sink;
