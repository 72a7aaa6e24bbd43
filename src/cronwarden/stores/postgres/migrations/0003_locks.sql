-- Version 3: the bare lock.

-- The bare lock (Store.lock): a fenced lease with no ledger, apart from
-- job leases. A row is never deleted, so its token keeps counting and a token is never handed out twice.
CREATE TABLE {s}.locks (
    key     text PRIMARY KEY,
    owner   text,
    token   bigint NOT NULL,
    expires timestamptz
);
