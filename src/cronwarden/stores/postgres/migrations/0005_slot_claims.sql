-- Version 5: the scheduler's slot claims. A new table and function: it rewrites nothing.

-- The scheduler's slot claims (Store.claim_slot: at most one run per slot): no ledger. Each
-- claim of a job forgets that job's claims older than keep, so the table
-- holds about keep seconds of claims per job.
CREATE TABLE {s}.slot_claims (
    job        text,
    slot       double precision,
    owner      text NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job, slot)
);

-- Store.claim_slot in one call. Age is judged by clock_timestamp()
-- read after the claim's row is locked (the ON CONFLICT path locks it,
-- whether or not its WHERE holds), as for leases.
CREATE FUNCTION {s}.claim_slot(
    p_job text, p_slot double precision, p_owner text, p_keep double precision
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_keep interval := make_interval(secs => p_keep);
    v_owner text;
BEGIN
    -- First: the only statement that waits for another claim, so it
    -- waits while this transaction holds no row lock (no deadlock).
    INSERT INTO {s}.slot_claims AS c (job, slot, owner) VALUES (p_job, p_slot, p_owner)
    ON CONFLICT (job, slot) DO UPDATE SET owner = excluded.owner, claimed_at = clock_timestamp()
    WHERE c.claimed_at < clock_timestamp() - v_keep
    RETURNING c.owner INTO v_owner;
    IF NOT FOUND THEN
        -- Held and not expired. The row stays locked by the statement
        -- above until commit, so this reads the owner it keeps.
        SELECT c.owner INTO v_owner FROM {s}.slot_claims c WHERE c.job = p_job AND c.slot = p_slot;
    END IF;
    -- The job's other expired claims. SKIP LOCKED: pruning never waits
    -- (a row another claim holds is left for a later call).
    DELETE FROM {s}.slot_claims d
    WHERE d.job = p_job AND d.slot IN (
        SELECT o.slot FROM {s}.slot_claims o
        WHERE o.job = p_job AND o.slot <> p_slot AND o.claimed_at < clock_timestamp() - v_keep
        FOR UPDATE SKIP LOCKED);
    RETURN v_owner;
END $$;
