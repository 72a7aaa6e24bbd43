-- The SQLite store's statements (stores/sqlite/__init__.py). The read side
-- the PostgreSQL store shares is in stores/queries.sql.
--
-- The store's clock: `now` is CLOCK_BOOTTIME seconds and `boot` the boot id;
-- a lease is live while owner IS NOT NULL AND boot_id = boot AND expires > now.
-- Statements that name a parameter twice number them (?1, ?2, …).

-- name: grant_free --
-- Grant a lease that is new or released, in one statement: no row back when
-- the lease has an owner (live or expired: acquire then reads the holder).
INSERT INTO leases (key, job, owner, token, expires, boot_id) VALUES (?1, ?2, ?3, 1, ?4, ?5)
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = token + 1, expires = excluded.expires,
    boot_id = excluded.boot_id, revoked_by = NULL
WHERE owner IS NULL
RETURNING token;

-- name: lease_and_holder --
SELECT l.owner, l.token, l.expires, l.boot_id, l.pending, r.host, r.pid, r.started_at
FROM leases l LEFT JOIN runs r ON r.run_id = l.owner WHERE l.key = ?;

-- name: insert_lease --
-- A key's first grant, or policy allow's side lease.
INSERT INTO leases (key, job, owner, token, expires, boot_id) VALUES (?, ?, ?, ?, ?, ?);

-- name: grant_expired --
-- Grant a lease whose owner's has expired (acquire has read its token).
UPDATE leases SET owner = ?, token = ?, expires = ?, boot_id = ?, revoked_by = NULL WHERE key = ?;

-- name: revoke --
UPDATE leases SET revoked_by = ? WHERE key = ? AND revoked_by IS NULL;

-- name: request_stop --
-- Store.request_stop: mark a live lease of the run's revoked by a stop
-- request, unless a replacing start marked it first; a standing stop mark
-- is kept.
UPDATE leases SET revoked_by = coalesce(revoked_by, ?1)
WHERE key = ?2 AND owner = ?3 AND boot_id = ?4 AND expires > ?5
    AND (revoked_by IS NULL OR revoked_by LIKE 'stop:%');

-- name: queue --
UPDATE leases SET pending = pending + 1 WHERE key = ?;

-- name: insert_run --
INSERT INTO runs (run_id, job, key, host, pid, token, slot, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?);

-- name: insert_event --
-- Once per event id (record's contract): an id already in the ledger is no error.
INSERT INTO events (event_id, kind, job, run_id, at, data) VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (event_id) DO NOTHING;

-- name: abandon --
UPDATE runs SET outcome = 'abandoned', ended_at = ?, detail = ? WHERE run_id = ? AND outcome IS NULL;

-- name: renew --
UPDATE leases SET expires = ?1 WHERE key = ?2 AND owner = ?3 AND boot_id = ?4 AND expires > ?5
    AND revoked_by IS NULL;

-- name: lease_owner --
SELECT owner, revoked_by FROM leases WHERE key = ?;

-- name: end_run --
-- The terminal record, unless the run has one (no row back then).
UPDATE runs SET outcome = ?, ended_at = ?, exit_code = ?, detail = ?
WHERE run_id = ? AND outcome IS NULL
RETURNING started_at;

-- name: release --
-- Release iff still this run's; the row and its token stay.
UPDATE leases SET owner = NULL, expires = NULL, revoked_by = NULL WHERE key = ? AND owner = ?;

-- name: owned_lease --
SELECT pending, token FROM leases WHERE key = ? AND owner = ?;

-- name: delete_lease --
-- Only policy allow's side leases are deleted: nothing else grants their key.
DELETE FROM leases WHERE key = ?;

-- name: hand_over --
-- finish's hand-over to a queued start: the next token, one pending fewer.
UPDATE leases SET owner = ?, token = token + 1, expires = ?, boot_id = ?, pending = pending - 1,
    revoked_by = NULL
WHERE key = ?
RETURNING token;

-- name: lock --
-- The bare lock. Free: no owner, or expired by the store's clock. The token
-- survives unlock.
INSERT INTO locks (key, owner, token, expires, boot_id) VALUES (?1, ?2, 1, ?4, ?5)
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = token + 1, expires = excluded.expires,
    boot_id = excluded.boot_id
WHERE owner IS NULL OR boot_id IS NOT ?5 OR expires <= ?3
RETURNING token;

-- name: renew_lock --
UPDATE locks SET expires = ?1 WHERE key = ?2 AND owner = ?3 AND boot_id = ?4 AND expires > ?5;

-- name: unlock --
-- An expired lock is no longer its owner's to release: no row changes, as on
-- a server where the key is gone; the row stays, free for the next lock.
UPDATE locks SET owner = NULL, expires = NULL WHERE key = ?1 AND owner = ?2 AND boot_id = ?3 AND expires > ?4;

-- name: forget_claims --
-- The job's claims older than keep go first (the same slot's too, so it can
-- be claimed again), and an earlier boot's once this boot's clock is past
-- keep: CLOCK_BOOTTIME starts again at a reboot. The primary key serves it.
DELETE FROM slot_claims WHERE job = ?1 AND (claimed_at < ?2 - ?3 OR (boot_id <> ?4 AND ?2 > ?3));

-- name: claim --
INSERT INTO slot_claims (job, slot, owner, claimed_at, boot_id) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (job, slot) DO NOTHING;

-- name: slot_owner --
SELECT owner FROM slot_claims WHERE job = ? AND slot = ?;

-- name: open_runs --
-- Runs with no terminal record, through the partial index runs_open, with
-- their lease's expiry (NULL when the run no longer owns its lease row).
SELECT r.run_id, r.job, r.key, r.host, r.pid, r.token, r.slot, r.started_at, r.ended_at, r.outcome,
       r.exit_code, r.detail, l.expires, l.boot_id
FROM runs r LEFT JOIN leases l ON l.key = r.key AND l.owner = r.run_id
WHERE r.outcome IS NULL
ORDER BY r.started_at;

-- name: open_runs_of_job --
SELECT r.run_id, r.job, r.key, r.host, r.pid, r.token, r.slot, r.started_at, r.ended_at, r.outcome,
       r.exit_code, r.detail, l.expires, l.boot_id
FROM runs r LEFT JOIN leases l ON l.key = r.key AND l.owner = r.run_id
WHERE r.outcome IS NULL AND r.job = ?
ORDER BY r.started_at;

-- name: lease --
SELECT owner, token, expires, boot_id, pending, revoked_by FROM leases WHERE key = ?;

-- name: mark --
SELECT mark FROM outbox_marks WHERE sink = ?;

-- name: undelivered --
-- One statement, so the mark and the events are read in one snapshot.
SELECT e.seq, e.event_id, e.kind, e.job, e.run_id, e.at, e.data
FROM outbox_marks m JOIN events e ON e.seq > m.mark
WHERE m.sink = ? AND NOT EXISTS (SELECT 1 FROM outbox_acks a WHERE a.sink = m.sink AND a.seq = e.seq)
ORDER BY e.seq
LIMIT ?;

-- name: acknowledge --
-- {ids} is one ? per event id (at most ACK_CHUNK of them).
INSERT OR IGNORE INTO outbox_acks (sink, seq)
SELECT ?, seq FROM events WHERE event_id IN ({ids}) AND seq > ?;

-- name: first_unacknowledged --
SELECT seq FROM events e
WHERE seq > ? AND NOT EXISTS (SELECT 1 FROM outbox_acks a WHERE a.sink = ? AND a.seq = e.seq)
ORDER BY seq
LIMIT 1;

-- name: newest_seq --
SELECT coalesce(max(seq), 0) FROM events;

-- name: first_seq_since --
-- A new sink's mark: just before the first event within its backfill. One
-- scan of the ledger, once per sink name.
SELECT min(seq) FROM events WHERE at >= ?;

-- name: move_mark --
UPDATE outbox_marks SET mark = ? WHERE sink = ?;

-- name: prune_acks --
DELETE FROM outbox_acks WHERE sink = ? AND seq <= ?;

-- name: register_sink --
INSERT INTO outbox_marks (sink, mark, registered_at) VALUES (?, ?, ?);

-- name: set_aside --
-- {ids} as in acknowledge.
INSERT OR IGNORE INTO outbox_rejected (sink, seq)
SELECT ?, seq FROM events WHERE event_id IN ({ids});

-- name: trim_rejected --
-- The sink's oldest dead letters beyond the most it keeps.
DELETE FROM outbox_rejected
WHERE sink = ? AND seq <= (SELECT seq FROM outbox_rejected WHERE sink = ? ORDER BY seq DESC LIMIT 1 OFFSET ?);

-- name: forget_rejected --
-- {ids} as in acknowledge.
DELETE FROM outbox_rejected
WHERE sink = ? AND seq IN (SELECT seq FROM events WHERE event_id IN ({ids}));

-- name: foreign_tables --
-- Another program's tables, in a file with no cronwarden schema version.
SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'
ORDER BY name
LIMIT 4;

-- name: insert_rollup --
-- A rebuilt rollup (Store.rebuild_rollups) of a job that had no row when the
-- rebuild began; no row changes if one appeared since (the rebuild reads
-- that job again).
INSERT INTO rollups (job, stale, ended, outcomes, completed, duration_sum, last_start, last_success,
    bad_in_a_row, good_in_a_row, skips, skips_in_a_row, last_refusal, last_overlap, skip_times, w_runs,
    w_oldest, w_flagged, w_completed, w_outcomes, w_durations, p50, p95, w_max, w_last_success, attempts)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (job) DO NOTHING;

-- name: update_rollup --
-- A rebuilt rollup over the row the rebuild saw before it read the ledger
-- (?27-?31, its rollup_version): no row changes if a run started or ended,
-- or a refusal was recorded, since.
UPDATE rollups SET stale = ?2, ended = ?3, outcomes = ?4, completed = ?5, duration_sum = ?6,
    last_start = ?7, last_success = ?8, bad_in_a_row = ?9, good_in_a_row = ?10, skips = ?11,
    skips_in_a_row = ?12, last_refusal = ?13, last_overlap = ?14, skip_times = ?15, w_runs = ?16,
    w_oldest = ?17, w_flagged = ?18, w_completed = ?19, w_outcomes = ?20, w_durations = ?21, p50 = ?22,
    p95 = ?23, w_max = ?24, w_last_success = ?25, attempts = ?26
WHERE job = ?1 AND ended IS ?27 AND last_start IS ?28 AND skips IS ?29 AND last_refusal IS ?30
    AND last_overlap IS ?31;

-- name: forget_window --
-- A rebuilt rollup's window replaces the job's.
DELETE FROM rollup_window WHERE job = ?;

-- name: insert_window --
-- A rebuilt window's entry (start, end, outcome, flagged) at its place, with
-- its duration if it completed (as the trigger rollup_end writes it).
INSERT INTO rollup_window (job, place, started_at, ended_at, outcome, flagged, duration)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, CASE WHEN ?5 IN ('succeeded', 'failed', 'timed_out') THEN ?4 - ?3 END);

-- name: prune_due --
-- Retention's next step for one job: its oldest events before the cutoff
-- (the job's retention bound), through events (job, at), but only of the
-- kinds retention prunes ({pruned}), never an open run's, never the newest
-- event (see the trigger events_keep_newest).
SELECT e.seq, e.run_id, e.kind FROM events e
WHERE e.job = ? AND e.at < ? AND e.kind IN ({pruned})
  AND e.seq < (SELECT max(seq) FROM events)
  AND (e.run_id IS NULL OR e.run_id NOT IN (SELECT run_id FROM runs WHERE outcome IS NULL))
ORDER BY e.at, e.seq LIMIT ?;

-- name: prune_runs --
-- The finished runs whose `started` a step deletes ({ids}: run ids).
DELETE FROM runs WHERE run_id IN ({ids}) AND outcome IS NOT NULL;

-- name: prune_events --
DELETE FROM events WHERE seq IN ({ids});

-- name: prune_dead_letters --
-- Each sink's dead letters and acknowledgments of the deleted events.
DELETE FROM outbox_rejected WHERE seq IN ({ids});

-- name: prune_acks_of --
DELETE FROM outbox_acks WHERE seq IN ({ids});

-- name: latest_since --
-- Store.latest_since: each job's newest event of some kinds at or after its
-- own time (? is a JSON object of job: time), one bounded walk of the index
-- events (job, at) per job, newest first. {kinds} is stores/sql.py's kind IN (...).
SELECT e.seq, e.event_id, e.kind, e.job, e.run_id, e.at, e.data
FROM json_each(?) AS j
JOIN events AS e ON e.seq = (
    SELECT seq FROM events WHERE job = j.key AND at >= j.value AND {kinds} ORDER BY at DESC, seq LIMIT 1
);

-- name: latest_runs --
-- Store.latest_runs: each of the jobs' (? is a JSON array of them) latest ?
-- runs, newest first, in one read: one bounded walk of the index runs (job,
-- started_at) per job.
SELECT r.run_id, r.job, r.key, r.host, r.pid, r.token, r.slot, r.started_at, r.ended_at, r.outcome,
       r.exit_code, r.detail
FROM json_each(?1) AS j
JOIN runs AS r ON r.run_id IN (SELECT run_id FROM runs WHERE job = j.value ORDER BY started_at DESC LIMIT ?2)
ORDER BY j.key, r.started_at DESC;
