-- The PostgreSQL store's schema as it is now, whole: what a new schema gets,
-- with the functions of functions.sql. A schema written by an earlier
-- version is brought here by the files in migrations/ instead;
-- tests/stores/test_postgres_schema.py holds the two to the same catalog.
-- {s} is the store's schema (?schema= in the URL), filled in by the store.
-- The version (the number of the newest migration) is in {s}.meta, which the
-- store creates before it reads it.
--
-- Times: `expires`, `claimed_at` are the server's clock_timestamp(); `at`,
-- `started_at`, `ended_at`, `slot`, `updated_at` are the clients' wall-clock
-- epoch seconds, for people, never for expiry.

-- One row per lease key (a job, or job:shard, or policy allow's side lease
-- key+run_id). A row is never deleted on release: its token keeps counting.
-- Only a side lease's row goes when its run finishes. Every lease step reads
-- it by the primary key; open_runs() joins runs through it.
CREATE TABLE {s}.leases (
    key        text PRIMARY KEY,
    job        text NOT NULL,
    owner      text,                       -- run id; NULL when released
    token      bigint NOT NULL,            -- the fencing counter
    expires    timestamptz,
    pending    integer NOT NULL DEFAULT 0,  -- policy queue's waiting starts
    revoked_by text                        -- policy replace: the run taking over
);

-- One row per start. No index covers a column that finish() changes, so
-- recording the outcome is a HOT update (no index entries), and the room
-- fillfactor leaves in each page keeps the new row version on its page.
-- Open runs are found through their leases, not by an index on outcome.
CREATE TABLE {s}.runs (
    run_id     text PRIMARY KEY,  -- run(), finish's terminal record, acquire's holder
    job        text NOT NULL,
    key        text NOT NULL,
    host       text NOT NULL,
    pid        integer NOT NULL,
    token      bigint NOT NULL,
    slot       double precision,
    started_at double precision NOT NULL,
    ended_at   double precision,
    outcome    text,              -- NULL while the run is open
    exit_code  integer,
    detail     text NOT NULL DEFAULT ''
) WITH (fillfactor = 90);
-- runs(job, limit), newest first: `cronwarden history`, the monitor's and
-- `cronwarden audit`'s last runs, the dashboard.
CREATE INDEX runs_job_started ON {s}.runs (job, started_at);

-- The ledger. seq values are drawn at insert and become visible at commit,
-- out of order: the outbox's functions (functions.sql) allow for that.
-- The primary key serves the outbox (undelivered(), mark_delivered()); the
-- unique event_id serves record()'s ON CONFLICT (event_id) DO NOTHING and
-- mark_delivered()'s acknowledgement by id.
CREATE TABLE {s}.events (
    seq      bigserial PRIMARY KEY,
    event_id text NOT NULL UNIQUE DEFAULT gen_random_uuid()::text,
    kind     text NOT NULL,
    job      text NOT NULL,
    run_id   text,
    at       double precision NOT NULL,
    data     jsonb NOT NULL DEFAULT '{}'
);
-- Every read of events by job: the monitor's window (job, kinds, since),
-- `cronwarden history`'s refusals, the outbox's backoff (a sink's newest
-- failure: job, two kinds). Reads by run id or by kind alone, across jobs,
-- scan the table; nothing on a hot path makes them.
CREATE INDEX events_job_kind_at ON {s}.events (job, kind, at);
-- The dashboard's latest trouble across jobs. Partial: a run's own events
-- (started, succeeded) cost no entry. Used only by a query whose kind list is
-- the index's own, as written (stores/sql.py writes sorted literals).
CREATE INDEX events_trouble ON {s}.events (at)
    WHERE kind IN ('abandoned', 'failed', 'failing', 'grace_too_wide', 'interrupted', 'job_paused', 'job_resumed', 'lease_lost', 'misfired', 'missed', 'overlap', 'paused', 'policy_undecided', 'queue_full', 'replaced', 'sink_failed', 'sink_rejected', 'skipped', 'skips_in_a_row', 'slow', 'snoozed', 'stopped', 'stuck', 'timed_out', 'too_often', 'unsnoozed');
-- Every job's finding states and snoozes in one read (Store.latest_events):
-- partial, as above.
CREATE INDEX events_findings ON {s}.events (job, at)
    WHERE kind IN ('failing', 'grace_too_wide', 'missed', 'overlap', 'policy_undecided', 'skips_in_a_row', 'slow', 'snoozed', 'stuck', 'too_often', 'unsnoozed');
-- Each job's newest pause event (paused, job_paused, job_resumed), all jobs
-- in one read: whether a scheduled job is paused.
CREATE INDEX events_pauses ON {s}.events (job, at)
    WHERE kind IN ('job_paused', 'job_resumed', 'paused');

-- What the store knows of each job's schedule and policy. job(name) reads
-- one row by the primary key on every `cronwarden run`; save_job upserts it.
CREATE TABLE {s}.jobs (
    name        text PRIMARY KEY,
    schedule    text,
    period      double precision,
    policy      text NOT NULL,
    reason      text NOT NULL,
    ttl         double precision,
    grace       double precision,
    max_runtime double precision,
    updated_at  double precision NOT NULL
);

-- The outbox: per sink, a mark below which every event is acknowledged, and
-- the acknowledged events above it. The outbox's functions read both by
-- their primary keys.
CREATE TABLE {s}.outbox_marks (
    sink          text PRIMARY KEY,
    mark          bigint NOT NULL,
    registered_at double precision NOT NULL
);
CREATE TABLE {s}.outbox_acks (
    sink text NOT NULL,
    seq  bigint NOT NULL,
    PRIMARY KEY (sink, seq)
);

-- Each sink's dead letters: the events it refused for good (reject), set
-- aside until a replay delivers them (forget_rejected). At most
-- DEAD_LETTERS_KEPT per sink: reject drops the oldest beyond it. Read and
-- written by the primary key (sink, seq).
CREATE TABLE {s}.outbox_rejected (
    sink text NOT NULL,
    seq  bigint NOT NULL,
    PRIMARY KEY (sink, seq)
);

-- The bare lock (lock, renew_lock, unlock: the scheduler's leader lease): a
-- fenced lease with no ledger, apart from job leases. A row is never
-- deleted, so its token keeps counting. Read by the primary key.
CREATE TABLE {s}.locks (
    key     text PRIMARY KEY,
    owner   text,
    token   bigint NOT NULL,
    expires timestamptz
);

-- The scheduler's slot claims (claim_slot): no ledger. Each claim of a job
-- forgets that job's claims older than keep, so the table holds about keep
-- seconds of claims per job. claim_slot reads and inserts by the primary
-- key, and finds the job's old claims through its first column.
CREATE TABLE {s}.slot_claims (
    job        text,
    slot       double precision,
    owner      text NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job, slot)
);

-- Each job's rollup (stores/rollup.py says what each column means): kept by
-- the triggers of functions.sql in the transaction that writes the run or
-- the event, so every writer keeps it (finish, an abandon, a refused start,
-- record). The monitor reads all rows at once (rollups) instead of every
-- job's window of the ledger.
CREATE TABLE {s}.rollups (
    job            text PRIMARY KEY,
    stale          boolean NOT NULL DEFAULT false,
    ended          bigint NOT NULL DEFAULT 0,
    outcomes       jsonb NOT NULL DEFAULT '{}',
    completed      bigint NOT NULL DEFAULT 0,
    duration_sum   double precision NOT NULL DEFAULT 0,
    last_start     double precision,
    last_success   double precision,
    bad_in_a_row   integer NOT NULL DEFAULT 0,
    good_in_a_row  integer NOT NULL DEFAULT 0,
    skips          bigint NOT NULL DEFAULT 0,
    skips_in_a_row integer NOT NULL DEFAULT 0,
    last_refusal   double precision,
    last_overlap   double precision,
    skip_times     jsonb NOT NULL DEFAULT '[]',  -- the latest 50 skipped times
    w_runs         integer NOT NULL DEFAULT 0,
    w_oldest       double precision,
    w_flagged      integer NOT NULL DEFAULT 0,
    w_completed    integer NOT NULL DEFAULT 0,
    w_outcomes     jsonb NOT NULL DEFAULT '{}',
    w_durations    jsonb NOT NULL DEFAULT '[]',
    p50            double precision,
    p95            double precision,
    w_max          double precision,
    w_last_success double precision,
    attempts       jsonb NOT NULL DEFAULT '[]',  -- the latest 16 attempts: [time, slot or null]
    -- The window's entries, oldest ending first, one array per field: an end
    -- shifts each by one element (a JSON array of entries was decoded and
    -- encoded whole at every end, most of what the end cost).
    w_starts       double precision[] NOT NULL DEFAULT '{}',
    w_ends         double precision[] NOT NULL DEFAULT '{}',
    w_results      text[] NOT NULL DEFAULT '{}',
    w_flags        integer[] NOT NULL DEFAULT '{}',
    -- The window's completed durations ascending (w_durations, as an array):
    -- where an end puts its duration in and takes the leaving one out.
    w_sorted       double precision[] NOT NULL DEFAULT '{}'
) WITH (toast_tuple_target = 8160);  -- kept whole in its page: not compressed at each write, read as is
