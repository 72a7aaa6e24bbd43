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

-- name: latest_events --
-- Store.latest_events: each job's latest %s events of some kinds, newest
-- first, in one read. {kinds} is stores/sql.py's kind IN (...) of sorted
-- literals, so that SQLite reads its partial index of the finding kinds and
-- PostgreSQL its (job, kind, at) index, not the events table.
SELECT seq, event_id, kind, job, run_id, at, data FROM (
    SELECT seq, event_id, kind, job, run_id, at, data,
           row_number() OVER (PARTITION BY job ORDER BY at DESC, seq) AS n
    FROM {s}.events WHERE {kinds}
) AS latest WHERE n <= %s ORDER BY job, at DESC, seq;

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

-- name: tally_events --
-- A job's events by kind, through the index events (job, at).
SELECT kind, count(*) FROM {s}.events WHERE job = %s GROUP BY kind;

-- name: tally_durations --
-- A job's completed runs' durations, through the index runs (job, started_at).
SELECT ended_at - started_at FROM {s}.runs
WHERE job = %s AND outcome IN ('succeeded', 'failed', 'timed_out');

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

-- name: rollups --
-- Every job's rollup (stores/rollup.py), in Rollup's field order; the JSON
-- columns as text, decoded by the reader (w_durations only on demand). In no
-- order: the reader sorts them (rows this wide, thousands of them, are a sort
-- on disk for PostgreSQL's work_mem).
SELECT job, stale, ended, CAST(outcomes AS TEXT), completed, duration_sum, last_start, last_success,
       bad_in_a_row, good_in_a_row, skips, skips_in_a_row, last_refusal, last_overlap, CAST(skip_times AS TEXT),
       w_runs, w_oldest, w_flagged, w_completed, CAST(w_outcomes AS TEXT), CAST(w_durations AS TEXT), p50, p95,
       w_max, w_last_success, CAST(attempts AS TEXT)
FROM {s}.rollups;

-- name: rollup_version --
-- What a rebuild compares before it writes: a run that started or ended, or
-- a refusal, while it read the ledger changes one of these.
SELECT ended, last_start, skips, last_refusal, last_overlap FROM {s}.rollups WHERE job = %s;

-- name: rollup_jobs --
-- Every job with a run or a refused start: the jobs a rebuild folds.
SELECT job FROM {s}.runs UNION SELECT job FROM {s}.rollups ORDER BY 1;

-- name: keep_runs_cutoff --
-- keep_runs: the start of the oldest run a job keeps (OFFSET keep_runs - 1),
-- through the index runs (job, started_at).
SELECT started_at FROM {s}.runs WHERE job = %s ORDER BY started_at DESC LIMIT 1 OFFSET %s;

-- name: count_due --
-- prune's dry run for one job: its events due before its bound (only the
-- kinds retention prunes, {pruned}; never an open run's), and how many are
-- `started` (one per finished run that goes).
SELECT count(*), coalesce(sum(CASE WHEN e.kind = 'started' THEN 1 ELSE 0 END), 0)
FROM {s}.events e
WHERE e.job = %s AND e.at < %s AND e.kind IN ({pruned})
  AND (e.run_id IS NULL OR e.run_id NOT IN (SELECT run_id FROM {s}.runs WHERE outcome IS NULL));
