-- Version 2: the outbox (a mark per sink, and the acknowledged events above it).

CREATE TABLE outbox_marks (
    sink          TEXT PRIMARY KEY,
    mark          INTEGER NOT NULL,
    registered_at REAL NOT NULL
);
CREATE TABLE outbox_acks (
    sink TEXT NOT NULL,
    seq  INTEGER NOT NULL,
    PRIMARY KEY (sink, seq)
) WITHOUT ROWID;
