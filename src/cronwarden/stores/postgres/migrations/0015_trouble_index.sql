-- Version 15: partial indexes of events for every job's finding states in one read
-- (Store.latest_events: each pass of the monitor) and for the dashboard's latest
-- trouble across jobs (every event but a start, a success, a queued start and a sink back up), a
-- scan of the table before. Partial, so that a run's own events (started,
-- succeeded: nearly all of them) cost no index entry more to write. Used only by a
-- query whose kind list is the index's own: stores/sql.py writes a query's kinds as
-- sorted literals, and tests/test_dashboard_front.py checks the plan.
CREATE INDEX events_trouble ON {s}.events (at)
    WHERE kind IN ('abandoned', 'failed', 'failing', 'grace_too_wide', 'interrupted', 'job_paused', 'job_resumed', 'lease_lost', 'misfired', 'missed', 'overlap', 'paused', 'policy_undecided', 'queue_full', 'replaced', 'sink_failed', 'sink_rejected', 'skipped', 'skips_in_a_row', 'slow', 'snoozed', 'stopped', 'stuck', 'timed_out', 'too_often', 'unsnoozed');

CREATE INDEX events_findings ON {s}.events (job, at)
    WHERE kind IN ('failing', 'grace_too_wide', 'missed', 'overlap', 'policy_undecided', 'skips_in_a_row', 'slow', 'snoozed', 'stuck', 'too_often', 'unsnoozed');
-- Each job's newest pause event (paused, job_paused, job_resumed), all jobs
-- in one read: whether a scheduled job is paused.
CREATE INDEX events_pauses ON {s}.events (job, at)
    WHERE kind IN ('job_paused', 'job_resumed', 'paused');
