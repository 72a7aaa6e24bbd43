-- Version 4: the scheduler's slot claims. A new table only: the upgrade rewrites nothing.

CREATE TABLE slot_claims (
    job        TEXT NOT NULL,
    slot       REAL NOT NULL,
    owner      TEXT NOT NULL,
    claimed_at REAL NOT NULL,
    boot_id    TEXT NOT NULL,
    PRIMARY KEY (job, slot)
) WITHOUT ROWID;
