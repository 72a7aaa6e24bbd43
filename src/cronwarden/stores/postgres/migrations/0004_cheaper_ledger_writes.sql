-- Version 4: cheaper ledger writes.

-- Cheaper ledger writes (each cycle writes a run row and two events).
-- One events index for what is read by job: the monitor's and the
-- views' (job, kinds, since) and the outbox backoff's (job, kinds);
-- nothing reads events by run_id or by kind alone across jobs at scale.
DROP INDEX IF EXISTS {s}.events_run;
DROP INDEX IF EXISTS {s}.events_kind_at;
DROP INDEX IF EXISTS {s}.events_job_at;
CREATE INDEX events_job_kind_at ON {s}.events (job, kind, at);
-- No index on runs covers a column that finish() changes, so recording
-- the outcome is a HOT update (no index entries); the room left in each
-- page keeps the new version on its page. Open runs are found through
-- their leases instead of a partial index on outcome IS NULL.
DROP INDEX IF EXISTS {s}.runs_open;
ALTER TABLE {s}.runs SET (fillfactor = 90);
