-- The user's own data in effects mode (chaos/effects.py): a counter that
-- every guarded run increments by read–modify–write, and one row per
-- committed increment. {schema} is the round's quoted schema.

-- name: create --
CREATE SCHEMA {schema};
CREATE TABLE {schema}.counter (id int PRIMARY KEY, value bigint NOT NULL);
INSERT INTO {schema}.counter VALUES (1, 0);
-- Committed in the same transaction as the counter's update: seq is the
-- order the increments were made in, value what each set the counter to.
CREATE TABLE {schema}.writes (
    seq   bigserial PRIMARY KEY,
    run   text NOT NULL,
    token bigint NOT NULL,
    step  int NOT NULL,
    value bigint NOT NULL
);

-- name: read --
SELECT value FROM {schema}.counter WHERE id = 1;

-- name: update --
UPDATE {schema}.counter SET value = %s WHERE id = 1;

-- name: record --
INSERT INTO {schema}.writes (run, token, step, value) VALUES (%s, %s, %s, %s);

-- name: history --
SELECT seq, run, token, step, value FROM {schema}.writes ORDER BY seq;

-- name: drop --
DROP SCHEMA IF EXISTS {schema} CASCADE;
