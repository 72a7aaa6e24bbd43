-- Version 18: a partial index of the manual starts' events (triggered), for the
-- monitor's read of every job's newest one since a time of its own
-- (Store.latest_since): through events (job, at) that read walked each job's
-- window of events, all of them, to find the few triggered ones. Partial: no
-- other event costs an entry more to write.
CREATE INDEX events_triggered ON events (job, at) WHERE kind IN ('triggered');
