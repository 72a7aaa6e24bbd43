-- Version 8: each sink's dead letters. A new table only: the upgrade rewrites nothing.

CREATE TABLE outbox_rejected (
    sink TEXT NOT NULL,
    seq  INTEGER NOT NULL,
    PRIMARY KEY (sink, seq)
) WITHOUT ROWID;
