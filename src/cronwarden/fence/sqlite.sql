-- The fences on SQLite (cronwarden.fence). {schema} is the quoted name of
-- the schema: main, temp or an attached database.

-- name: create --
CREATE TABLE IF NOT EXISTS {schema}.cronwarden_fences (
    resource   TEXT PRIMARY KEY,
    token      INTEGER NOT NULL,
    updated_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);

-- name: fence --
-- Advances the resource's token unless it has seen a newer one; then
-- nothing changes (no row written: the caller raises Fenced).
INSERT INTO {schema}.cronwarden_fences (resource, token) VALUES (?, ?)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token, updated_at = (julianday('now') - 2440587.5) * 86400.0
    WHERE token <= excluded.token;

-- name: newest --
SELECT token FROM {schema}.cronwarden_fences WHERE resource = ?;
