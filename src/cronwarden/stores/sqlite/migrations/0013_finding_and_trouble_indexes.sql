-- Version 13: two partial indexes of events, for reads that were scans at fleet size.
-- Partial, so that a run's own events (started, succeeded: nearly all of them) cost
-- no index entry more to write. Each is used only by a query whose kind list is the
-- index's own, as written: stores/sql.py writes a query's kinds as sorted literals,
-- and tests/test_dashboard_front.py checks that the monitor's and the dashboard's
-- reads use them.

-- The monitor's finding states and snoozes, per job (Monitor._states): every pass of
-- check, monitor and the dashboard reads them for every job.
CREATE INDEX events_findings ON events (job, at)
    WHERE kind IN ('failing', 'grace_too_wide', 'missed', 'overlap', 'policy_undecided', 'skips_in_a_row', 'slow', 'snoozed', 'stuck', 'too_often', 'unsnoozed');
-- Each job's newest pause event (paused, job_paused, job_resumed), all jobs
-- in one read: whether a scheduled job is paused.
CREATE INDEX events_pauses ON events (job, at)
    WHERE kind IN ('job_paused', 'job_resumed', 'paused');

-- The dashboard's latest trouble across jobs: every event but a start, a success, a
-- queued start and a sink back up.
CREATE INDEX events_trouble ON events (at)
    WHERE kind IN ('abandoned', 'failed', 'failing', 'grace_too_wide', 'interrupted', 'job_paused', 'job_resumed', 'lease_lost', 'misfired', 'missed', 'overlap', 'paused', 'policy_undecided', 'queue_full', 'replaced', 'sink_failed', 'sink_rejected', 'skipped', 'skips_in_a_row', 'slow', 'snoozed', 'stopped', 'stuck', 'timed_out', 'too_often', 'unsnoozed');
