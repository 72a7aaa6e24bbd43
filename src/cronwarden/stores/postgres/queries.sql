-- The PostgreSQL store's statements (stores/postgres/__init__.py). The read
-- side the SQLite store shares is in stores/queries.sql. {s} is the store's
-- schema, in every statement: nothing depends on the session's search_path,
-- so each statement means the same on any connection a pooler hands out.
-- Every statement is one autocommit round trip; expiry is judged by
-- clock_timestamp() only.

-- name: acquire --
SELECT * FROM {s}.acquire(%s::text, %s::text, %s::text, %s::text, %s::integer, %s::float8, %s::float8,
                          %s::float8, %s::text, %s::integer);

-- name: finish --
-- A finish with no queued start to hand the lease to (then=None).
SELECT * FROM {s}.finish(%s::text, %s::text, %s::text, %s::bigint, %s::text, %s::float8, %s::integer,
                         %s::text, %s::text, %s::boolean,
                         NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);

-- name: finish_then --
SELECT * FROM {s}.finish(%s::text, %s::text, %s::text, %s::bigint, %s::text, %s::float8, %s::integer,
                         %s::text, %s::text, %s::boolean,
                         %s::text, %s::text, %s::text, %s::text, %s::integer, %s::float8, %s::float8,
                         %s::float8);

-- name: end_data --
-- An end event's further fields (End.data: an interrupted run's signal, a
-- stopped run's who and why), in the transaction of the finish that wrote
-- it (the one exception to one statement per call: only a run stopped by a
-- signal or by cronwarden stop pays for it).
UPDATE {s}.events SET data = data || %s::jsonb
WHERE job = %s AND kind = %s AND run_id = %s;

-- name: renew --
UPDATE {s}.leases SET expires = clock_timestamp() + make_interval(secs => %s::float8)
WHERE key = %s AND owner = %s AND expires > clock_timestamp() AND revoked_by IS NULL;

-- name: renew_many --
-- One heartbeat's renewals: the arrays are the leases' keys, owners and ttls,
-- in order. Each lease is renewed as by renew, found by its key in the
-- primary key (key = ANY: one index probe per lease, however many rows the
-- table holds). One row back per lease, in order: NULL if renewed, else why
-- not: '' lost, or the run that revoked it. The refused rows (rare) read the
-- lease as the statement began; a renewed one's is never read. The arrays
-- travel in binary (placeholders ending in b): in text each element costs the client a quoting
-- check and the server a parse (3x the time for 1,000 leases, bench/renew_batch.py).
WITH asked AS (
    SELECT a.key, a.owner, a.ttl, a.i
    FROM unnest(%(keys)b::text[], %(owners)b::text[], %(ttls)b::float8[]) WITH ORDINALITY AS a(key, owner, ttl, i)
), renewed AS (
    UPDATE {s}.leases l SET expires = clock_timestamp() + make_interval(secs => a.ttl)
    FROM asked a
    WHERE l.key = ANY(%(keys)b::text[]) AND l.key = a.key AND l.owner = a.owner
      AND l.expires > clock_timestamp() AND l.revoked_by IS NULL
    RETURNING l.key, l.owner
)
SELECT CASE WHEN r.key IS NULL THEN coalesce(
    (SELECT v.revoked_by FROM {s}.leases v WHERE v.key = a.key AND v.owner = a.owner), '') END
FROM asked a
LEFT JOIN renewed r ON r.key = a.key AND r.owner = a.owner
ORDER BY a.i;

-- name: lease_owner --
-- Why a renewal matched nothing: revoked (LeaseRevoked) or lost (LeaseLost).
SELECT owner, revoked_by FROM {s}.leases WHERE key = %s;

-- name: lock --
-- The expiry in SET is read after the row is locked (excluded's was read
-- before any wait), like the judgement in WHERE.
INSERT INTO {s}.locks AS l (key, owner, token, expires)
VALUES (%s, %s, 1, clock_timestamp() + make_interval(secs => %s::float8))
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = l.token + 1,
    expires = clock_timestamp() + make_interval(secs => %s::float8)
WHERE l.owner IS NULL OR l.expires <= clock_timestamp()
RETURNING token;

-- name: renew_lock --
UPDATE {s}.locks SET expires = clock_timestamp() + make_interval(secs => %s::float8)
WHERE key = %s AND owner = %s AND expires > clock_timestamp();

-- name: unlock --
-- An expired lock is no longer held (as with Redis's PX), so its owner's
-- unlock is stale: no row changes, and the row stays as it is.
UPDATE {s}.locks SET owner = NULL, expires = NULL
WHERE key = %s AND owner = %s AND expires > clock_timestamp();

-- name: claim_slot --
SELECT {s}.claim_slot(%s::text, %s::float8, %s::text, %s::float8);

-- name: request_stop --
-- Store.request_stop: mark a live lease of the run's revoked by a stop
-- request, unless a replacing start marked it first (a standing stop mark is
-- kept), and record the request if it did; 1 if it did, else 0.
WITH marked AS (
    UPDATE {s}.leases SET revoked_by = coalesce(revoked_by, %s)
    WHERE key = %s AND owner = %s AND expires > clock_timestamp()
      AND (revoked_by IS NULL OR revoked_by LIKE 'stop:%%')
    RETURNING key
), recorded AS (
    INSERT INTO {s}.events (event_id, kind, job, run_id, at, data)
    SELECT %s, %s, %s, %s, %s::float8, %s::jsonb FROM marked
    ON CONFLICT (event_id) DO NOTHING
)
SELECT count(*)::integer FROM marked;

-- name: record --
-- Once per event id (record's contract): an id already in the ledger is no error.
INSERT INTO {s}.events (event_id, kind, job, run_id, at, data)
VALUES (%s, %s, %s, %s, %s::float8, %s::jsonb)
ON CONFLICT (event_id) DO NOTHING;

-- name: lease --
SELECT owner, token, extract(epoch FROM expires - clock_timestamp())::float8, pending, revoked_by
FROM {s}.leases WHERE key = %s;

-- name: open_runs --
-- A run with no terminal record always owns its lease row: every step that
-- moves a lease to another owner or deletes it records the previous owner's
-- terminal record first (acquire's abandoned, finish). So the open runs are
-- among the lease owners, a table of one row per key, and runs needs no
-- index on outcome (finish stays a HOT update).
SELECT r.run_id, r.job, r.key, r.host, r.pid, r.token, r.slot, r.started_at, r.ended_at, r.outcome,
       r.exit_code, r.detail, extract(epoch FROM l.expires - clock_timestamp())::float8
FROM {s}.leases l JOIN {s}.runs r ON r.run_id = l.owner AND r.key = l.key
WHERE r.outcome IS NULL
ORDER BY r.started_at;

-- name: latest_runs --
-- Store.latest_runs: each of the jobs' latest %s runs, newest first, in one
-- round trip: one bounded read of the index runs (job, started_at) per job.
SELECT r.run_id, r.job, r.key, r.host, r.pid, r.token, r.slot, r.started_at, r.ended_at, r.outcome,
       r.exit_code, r.detail
FROM unnest(%s::text[]) AS j(job)
CROSS JOIN LATERAL (
    SELECT * FROM {s}.runs WHERE runs.job = j.job ORDER BY started_at DESC LIMIT %s
) AS r
ORDER BY r.job, r.started_at DESC;

-- name: latest_since --
-- Store.latest_since: each job's newest event of some kinds at or after its
-- own time (%s is a JSON object of job: time), in one round trip: one probe of
-- the index events (job, kind, at) per job. {kinds} is stores/sql.py's kind IN (...).
SELECT e.seq, e.event_id, e.kind, e.job, e.run_id, e.at, e.data
FROM jsonb_each_text(%s::jsonb) AS j(job, since)
CROSS JOIN LATERAL (
    SELECT seq, event_id, kind, job, run_id, at, data FROM {s}.events
    WHERE events.job = j.job AND at >= j.since::float8 AND {kinds}
    ORDER BY at DESC, seq LIMIT 1
) AS e;

-- name: open_runs_of_job --
SELECT r.run_id, r.job, r.key, r.host, r.pid, r.token, r.slot, r.started_at, r.ended_at, r.outcome,
       r.exit_code, r.detail, extract(epoch FROM l.expires - clock_timestamp())::float8
FROM {s}.leases l JOIN {s}.runs r ON r.run_id = l.owner AND r.key = l.key
WHERE r.outcome IS NULL AND r.job = %s
ORDER BY r.started_at;

-- name: undelivered --
SELECT * FROM {s}.undelivered(%s::text, %s::integer, %s::float8, %s::float8);

-- name: mark_delivered --
SELECT {s}.mark_delivered(%s::text, %s::text[], %s::float8, %s::float8);

-- name: reject --
SELECT {s}.reject(%s::text, %s::text, %s::integer, %s::float8, %s::float8,
                  %s::text, %s::text, %s::text, %s::text, %s::float8, %s::jsonb);

-- name: forget_rejected --
DELETE FROM {s}.outbox_rejected
WHERE sink = %s AND seq IN (SELECT e.seq FROM {s}.events e WHERE e.event_id = ANY (%s::text[]));

-- name: schema_version --
SELECT value FROM {s}.meta WHERE key = 'schema_version';

-- name: migration_timeouts --
-- Building an index on a large ledger takes longer than one call's
-- statement_timeout, and concurrent first opens wait for the one that
-- migrates rather than fail: both bounds for this transaction only.
SELECT set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true);

-- name: migration_lock --
-- The only advisory lock in cronwarden, and transaction-level: concurrent
-- first opens of one schema run the migration one after another (CREATE …
-- IF NOT EXISTS alone races). Released at commit; it guards no lease.
SELECT pg_advisory_xact_lock(%s, hashtext(%s));

-- name: create_schema --
CREATE SCHEMA IF NOT EXISTS {s};

-- name: create_meta --
CREATE TABLE IF NOT EXISTS {s}.meta (key text PRIMARY KEY, value text NOT NULL);

-- name: set_schema_version --
INSERT INTO {s}.meta (key, value) VALUES ('schema_version', %s)
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: insert_rollup --
-- A rebuilt rollup (Store.rebuild_rollups) of a job that had no row when the
-- rebuild began; no row changes if one appeared since (the rebuild reads
-- that job again).
INSERT INTO {s}.rollups (job, stale, ended, outcomes, completed, duration_sum, last_start, last_success,
    bad_in_a_row, good_in_a_row, skips, skips_in_a_row, last_refusal, last_overlap, skip_times, w_runs,
    w_oldest, w_flagged, w_completed, w_outcomes, w_durations, p50, p95, w_max, w_last_success, attempts,
    w_starts, w_ends, w_results, w_flags, w_sorted)
SELECT %s, %s::integer::boolean, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s,
    %s, %s, %s::jsonb, %s::jsonb, %s, %s, %s, %s, %s::jsonb, e.starts, e.ends, e.results, e.flags, e.sorted
FROM {s}.rollup_entries(%s::jsonb) e
ON CONFLICT (job) DO NOTHING;

-- name: update_rollup --
-- A rebuilt rollup over the row the rebuild saw before it read the ledger
-- (the last five parameters, its rollup_version): no row changes if a run
-- started or ended, or a refusal was recorded, since.
UPDATE {s}.rollups SET stale = v.stale, ended = v.ended, outcomes = v.outcomes, completed = v.completed,
    duration_sum = v.duration_sum, last_start = v.last_start, last_success = v.last_success,
    bad_in_a_row = v.bad, good_in_a_row = v.good, skips = v.skips, skips_in_a_row = v.in_a_row,
    last_refusal = v.last_refusal, last_overlap = v.last_overlap, skip_times = v.skip_times,
    w_runs = v.w_runs, w_oldest = v.w_oldest, w_flagged = v.w_flagged, w_completed = v.w_completed,
    w_outcomes = v.w_outcomes, w_durations = v.w_durations, p50 = v.p50, p95 = v.p95, w_max = v.w_max,
    w_last_success = v.w_last_success, attempts = v.attempts, w_starts = e.starts, w_ends = e.ends,
    w_results = e.results, w_flags = e.flags, w_sorted = e.sorted
FROM (SELECT %s AS job, %s::integer::boolean AS stale, %s::bigint AS ended, %s::jsonb AS outcomes,
             %s::bigint AS completed, %s::float8 AS duration_sum, %s::float8 AS last_start,
             %s::float8 AS last_success, %s::integer AS bad, %s::integer AS good, %s::bigint AS skips,
             %s::integer AS in_a_row, %s::float8 AS last_refusal, %s::float8 AS last_overlap,
             %s::jsonb AS skip_times, %s::integer AS w_runs, %s::float8 AS w_oldest, %s::integer AS w_flagged,
             %s::integer AS w_completed, %s::jsonb AS w_outcomes, %s::jsonb AS w_durations, %s::float8 AS p50,
             %s::float8 AS p95, %s::float8 AS w_max, %s::float8 AS w_last_success, %s::jsonb AS attempts,
             %s::jsonb AS recent) v, {s}.rollup_entries(v.recent) e
WHERE {s}.rollups.job = v.job AND {s}.rollups.ended = %s::bigint
    AND coalesce({s}.rollups.last_start, '-Infinity') = coalesce(%s::float8, '-Infinity')
    AND {s}.rollups.skips = %s::bigint
    AND coalesce({s}.rollups.last_refusal, '-Infinity') = coalesce(%s::float8, '-Infinity')
    AND coalesce({s}.rollups.last_overlap, '-Infinity') = coalesce(%s::float8, '-Infinity');

-- name: prune_due --
-- Retention's next step for one job, one statement: its oldest events
-- before the cutoff (the job's retention bound), never an open run's; with
-- them the finished runs whose `started` they are, and the sinks' dead
-- letters and acknowledgments of them. Returns the runs and events deleted
-- and the events chosen. The step's work is bounded by its limit (given
-- twice), whatever the backlog: the oldest of each kind
-- retention prunes ({pruned}) through events (job, kind, at), then the
-- oldest of those; whether its run is open, a probe of the runs' primary
-- key per event (a scalar subquery: as `NOT IN` or `NOT EXISTS` the planner
-- reads every open run first, and open runs have no index: a scan of runs).
-- (One range over all the kinds would be sorted whole before the
-- limit, and `NOT IN (open runs)` would read every run: each step would
-- read the whole backlog and the whole runs table.)
WITH due AS (
  SELECT d.seq, d.run_id, d.kind FROM unnest(ARRAY[{pruned}]::text[]) AS k (kind)
  CROSS JOIN LATERAL (
    SELECT e.seq, e.run_id, e.kind, e.at FROM {s}.events e
    WHERE e.job = %s AND e.kind = k.kind AND e.at < %s
      AND NOT coalesce((SELECT r.outcome IS NULL FROM {s}.runs r WHERE r.run_id = e.run_id), false)
    ORDER BY e.at, e.seq LIMIT %s
  ) d
  ORDER BY d.at, d.seq LIMIT %s
), gone_runs AS (
  DELETE FROM {s}.runs r USING due
  WHERE due.kind = 'started' AND r.run_id = due.run_id AND r.outcome IS NOT NULL RETURNING 1
), gone_letters AS (
  DELETE FROM {s}.outbox_rejected o USING due WHERE o.seq = due.seq RETURNING 1
), gone_acks AS (
  DELETE FROM {s}.outbox_acks o USING due WHERE o.seq = due.seq RETURNING 1
), gone AS (
  DELETE FROM {s}.events e USING due WHERE e.seq = due.seq RETURNING 1
)
SELECT (SELECT count(*) FROM gone_runs), (SELECT count(*) FROM gone), (SELECT count(*) FROM due);
