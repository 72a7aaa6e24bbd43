-- The fences on PostgreSQL (cronwarden.fence). {schema} is the quoted
-- schema the caller picked (its current schema when it picked none).

-- name: probe --
-- Is the schema there, and the function? One round trip, on a connection's
-- first fence: a user who may not create objects gets no DDL attempted.
SELECT to_regnamespace(%s) IS NOT NULL, to_regprocedure(%s) IS NOT NULL;

-- name: lock --
-- Serialises the creation across connections until this transaction ends,
-- so two first callers do not collide on the catalog.
SELECT pg_advisory_xact_lock(hashtext('cronwarden_fences'), hashtext(%s));

-- name: create_schema --
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: create --
-- One row per resource: the newest token it has accepted.
CREATE TABLE IF NOT EXISTS {schema}.cronwarden_fences (
    resource   text PRIMARY KEY,
    token      bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- The fence, as one call: advances the resource's token to p_token unless
-- it has seen a newer one, and then raises SQLSTATE CWF01 (its DETAIL is the
-- newest token), which aborts the caller's transaction. The upsert locks the
-- resource's row until that transaction ends, so writers of one resource
-- take turns from their fence to their commit.
CREATE OR REPLACE FUNCTION {schema}.cronwarden_fence(p_resource text, p_token bigint)
RETURNS bigint LANGUAGE plpgsql AS $fence$
DECLARE
    newest bigint;
BEGIN
    INSERT INTO {schema}.cronwarden_fences AS f (resource, token) VALUES (p_resource, p_token)
    ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
        WHERE f.token <= EXCLUDED.token
    RETURNING f.token INTO newest;
    IF newest IS NULL THEN
        SELECT f.token INTO newest FROM {schema}.cronwarden_fences AS f WHERE f.resource = p_resource;
        RAISE EXCEPTION USING
            ERRCODE = 'CWF01',
            MESSAGE = format('fenced: token %s is older than %s, the newest token resource %L has seen',
                             p_token, newest, p_resource),
            DETAIL = newest::text;
    END IF;
    RETURN newest;
END
$fence$;

-- name: fence --
SELECT {schema}.cronwarden_fence(%s, %s);

-- name: current_schema --
SELECT current_schema();
