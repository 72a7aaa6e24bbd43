"""The Redis store: leases, fencing and the ledger in one Redis database.

Every write is one Lua script, so each contract step is atomic and one round
trip (the common cases have lean scripts of their own, below): ``acquire``
(lease check, abandoned detection, fencing, ``started`` or
the refusal event, policy branch, retention), ``finish`` (terminal record,
release, the queued ``then`` start), ``renew`` (owner-checked ``PEXPIRE``)
and ``record``. Every key a script touches is passed in ``KEYS``. Key layout,
retention and what is not guaranteed are in ``docs/stores/redis.md``.

A lease is two keys. ``lease:<key>`` is a hash that never expires: owner,
fencing token, pending count, revocation, and the open run's start (job,
host, pid, start time, slot), so a later start can still name and close an
owner whose lease ran out (G6, G7). ``live:<key>`` holds the owner's run id
with ``PX``: while the hash names an owner, the lease is live while this key
exists (every grant sets both in one script), so expiry is judged by the
server's clock (G4). A release removes the owner and leaves the live key to
expire: nothing reads it without an owner.

Fencing (G2): a grant takes the stored token + 1 while the server process that
granted the previous token is still the one answering (its ``run_id`` is
stored with the token). Otherwise -- first grant of a key, a restart that lost
the data, a restore of an older snapshot, a failover to a replica -- the token
is ``max(stored + 1, server TIME in microseconds)``. Every grant takes more
than a microsecond of server time, so ``first TIME + grants`` never overtakes
the clock: tokens never go backwards unless the server's clock steps back
across the restart.

The scripts make few calls, because on a busy host each ``redis.call`` costs
microseconds: writes are batched per script (one ``HSET`` of all new event
records, one ``ZADD`` of all index entries of a job), and one lexicographic
index per job holds its runs, its events by time and its events by kind.

The ``clock`` given to the store is kept for the interface but never read for
expiry: only the server's clock decides (G4).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import select
import struct
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    AuthorizationError,
    ClusterDownError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.durations import parse_duration
from cronwarden.errors import (
    LeaseLost,
    LeaseRevoked,
    StoreError,
    StoreUnavailable,
    StoreUrlError,
    UsageError,
    mask_password,
)
from cronwarden.events import Event, EventKind, JobInfo, Outcome, RunRecord, new_id
from cronwarden.lease import Lease, margin
from cronwarden.policy import Policy
from cronwarden.stores.base import (
    NEW_SINK_BACKFILL,
    End,
    EventQuery,
    Finished,
    Granted,
    Holder,
    LeaseInfo,
    Refusal,
    Refused,
    Start,
    Store,
)

DEFAULT_PREFIX = "cronwarden:"
DEFAULT_RUNS_PER_JOB = 1000
DEFAULT_EVENTS_PER_JOB = 10_000
RECORDED_IDS_KEPT = 86_400
"""Seconds ``record`` remembers an event id, so that a retried call is a
no-op (the contract): a day, far longer than any retry takes."""
DEFAULT_TIMEOUT = 3.0
"""Socket and connect timeout: long enough for a loaded server, short enough
that no call hangs and the heartbeat thread gets control back."""

SEP = "\x1f"
"""Separates the fields packed into one script argument (one argument costs
the client far less than fifteen)."""

_LEASE_FIELDS = ("owner", "token", "job", "host", "pid", "started", "slot")

# -- Lua ------------------------------------------------------------------
#
# Numbers that must stay exact (times, tokens) travel as text: Lua formats
# numbers it passes to redis.call with "%.14g", and cjson.encode rounds to 14
# digits, which would cut microseconds off a timestamp. So JSON is assembled
# by concatenation from the client's own number texts, and strings are
# quoted with cjson.encode (exact for strings).
#
# The job index (a sorted set, every score 0, read by lex ranges) holds:
#   '#|' .. ordhex(started_at) .. '|' .. run_id                 runs by start
#   '@|' .. ordhex(at) .. '|' .. seq .. '|' .. kind .. '|' .. run_id   events by time
#   kind .. '|' .. ordhex(at) .. '|' .. seq                     events by kind
# ordhex is a float as 16 hex digits in numeric order (see _ordhex below).

_RETENTION = r"""
-- The limits, their trim batches and the check interval: see _retention().
local RUNS_MAX, EVENTS_MAX = tonumber('{runs_max}'), tonumber('{events_max}')
local RUNS_BATCH, EVENTS_BATCH = tonumber('{runs_batch}'), tonumber('{events_batch}')
local CHECK = tonumber('{check}')

-- Retention is per job, so every key trimmed is one the call declared.
local function trim_events(index, evk, runk)
  local n = redis.call('ZLEXCOUNT', index, '[@|', '(@}')
  if n <= EVENTS_MAX then return end
  local old = redis.call('ZRANGEBYLEX', index, '[@|', '(@}', 'LIMIT', 0,
    math.min(n - EVENTS_MAX + EVENTS_BATCH, 1000))
  local drop, seqs, runs, links, seen = {}, {}, {}, {}, {}
  for _, m in ipairs(old) do
    local hex, seq, kind, run = string.match(m, '^@|(%x+)|(%d+)|([^|]*)|(.*)$')
    drop[#drop + 1] = m
    drop[#drop + 1] = kind .. '|' .. hex .. '|' .. seq
    seqs[#seqs + 1] = seq
    if run ~= '' then
      runs[#runs + 1] = run .. '|' .. seq
      -- A run's link field goes with its oldest event (see add_event).
      if not seen[run] then seen[run] = true; seqs[#seqs + 1] = 'r:' .. run end
    end
  end
  redis.call('ZREM', index, unpack(drop))
  redis.call('HDEL', evk, unpack(seqs))
  if #runs > 0 then redis.call('ZREM', runk, unpack(runs)) end
end

-- Only finished runs are dropped; open ones stay whatever their age.
local function trim_runs(index, runsk)
  local n = redis.call('ZLEXCOUNT', index, '[#|', '(#}')
  if n <= RUNS_MAX then return end
  local want = n - RUNS_MAX + RUNS_BATCH
  local old = redis.call('ZRANGEBYLEX', index, '[#|', '(#}', 'LIMIT', 0, math.min(want + 16, 1000))
  local ids = {}
  for i, m in ipairs(old) do ids[i] = string.match(m, '^#|%x+|(.*)$') end
  local done = redis.call('HMGET', runsk, unpack(ids))
  local drop, fields = {}, {}
  for i, id in ipairs(ids) do
    if #fields >= want then break end
    if done[i] then
      drop[#drop + 1] = old[i]
      fields[#fields + 1] = id
    end
  end
  if #drop > 0 then
    redis.call('ZREM', index, unpack(drop))
    redis.call('HDEL', runsk, unpack(fields))
  end
end

"""

_FENCING = r"""
-- The fencing rule of the module docstring: the token after old_token, and
-- the server's time in ms. srv: the run id of the server process executing
-- this script (the client learns it once per connection).
local function fence(old_token, old_srv, srv)
  local t = redis.call('TIME')
  local token
  if old_token then token = tonumber(old_token) + 1 end
  if not token or old_srv ~= srv then
    local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if not token or us > token then token = us end
  end
  return string.format('%d', token), tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

_COMMON = (
    _RETENTION
    + _FENCING
    + r"""
local function jstr(s) return cjson.encode(s) end

local function split(packed)
  local t, n = {}, 0
  for f in string.gmatch(packed, '([^\31]*)\31') do n = n + 1; t[n] = f end
  return t
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end

-- Writes are collected and flushed once per script.
local EVENTS, MEMBERS = {}, {}

local function add_member(index, member)
  local list = MEMBERS[index]
  if not list then list = {}; MEMBERS[index] = list end
  list[#list + 1] = 0
  list[#list + 1] = member
end

-- link: how the event is found by its run id. 'new': the run's first
-- events, written by this script: the field 'r:<run id>' of the records
-- hash lists their seqs (no write of its own: it rides in the records'
-- HSET). A string: that field's value so far (kept in the lease hash as
-- 'rseq' while the run is open), to which the seq is appended. nil: an
-- entry in the run id index (events recorded later by other calls).
local function add_event(index, eid, kind, job, run_id, at, athex, data, link)
  EVENTS[#EVENTS + 1] = {index, eid, kind, job, run_id, at, athex, data, link}
end

-- The lease hash write of a grant, done by flush once the seqs are known.
local LEASE = false

-- Flushes the collected writes: evk event records hash (its field 'seq' is the
-- counter), runk run id index, jobsk jobs -> events written (a counter per
-- job), runsk finished runs. Retention is checked when a job's counter
-- crosses a multiple of CHECK, so most calls only count (see trim_*).
local function flush(evk, runk, jobsk, runsk)
  local n = #EVENTS
  local per_job, linked = {}, {}
  if n > 0 then
    local last = redis.call('HINCRBY', evk, 'seq', n)
    local records, byrun = {}, {}
    for i, e in ipairs(EVENTS) do
      local index, eid, kind, job, run_id, at, athex, data = e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8]
      local link = e[9]
      local seq = string.format('%012d', last - n + i)
      local r = 'null'
      if run_id then
        r = jstr(run_id)
        if link then
          local so_far = linked[run_id] or (link ~= 'new' and link)
          linked[run_id] = so_far and (so_far .. ',' .. seq) or seq
        else
          byrun[#byrun + 1] = 0
          byrun[#byrun + 1] = run_id .. '|' .. seq
        end
      end
      records[#records + 1] = seq
      records[#records + 1] = '{"i":' .. jstr(eid) .. ',"k":"' .. kind .. '","j":' .. jstr(job)
        .. ',"r":' .. r .. ',"a":' .. at .. ',"d":' .. data .. '}'
      add_member(index, '@|' .. athex .. '|' .. seq .. '|' .. kind .. '|' .. (run_id or ''))
      add_member(index, kind .. '|' .. athex .. '|' .. seq)
      local c = per_job[job]
      if c then c[2] = c[2] + 1 else per_job[job] = {index, 1} end
    end
    for run_id, seqs in pairs(linked) do
      records[#records + 1] = 'r:' .. run_id
      records[#records + 1] = seqs
    end
    redis.call('HSET', evk, unpack(records))
    if #byrun > 0 then redis.call('ZADD', runk, unpack(byrun)) end
  end
  if LEASE then
    -- rseq: the run's link so far, for its later events (empty: they go to the index).
    LEASE[#LEASE + 1] = 'rseq'
    LEASE[#LEASE + 1] = LEASE.linked and linked[LEASE.run_id] or ''
    redis.call('HSET', unpack(LEASE))
  end
  for index, list in pairs(MEMBERS) do redis.call('ZADD', index, unpack(list)) end
  for job, c in pairs(per_job) do
    local total = redis.call('HINCRBY', jobsk, job, c[2])
    if math.floor(total / CHECK) ~= math.floor((total - c[2]) / CHECK) then
      trim_runs(c[1], runsk)
      trim_events(c[1], evk, runk)
    end
  end
end

local function read_start(a, i)
  return {run_id = a[i], job = a[i + 1], key = a[i + 2], host = a[i + 3], pid = a[i + 4], ttl_ms = a[i + 5],
    ttl = a[i + 6], at = a[i + 7], athex = a[i + 8], slot = a[i + 9], eid = a[i + 10]}
end

-- A finished run's record, from the start its lease kept and how it ended.
local function run_record(job, key, host, pid, token, slot, started, ending)
  return '{"job":' .. jstr(job) .. ',"key":' .. jstr(key) .. ',"host":' .. jstr(host) .. ',"pid":' .. pid
    .. ',"token":' .. token .. ',"slot":' .. slot .. ',"started_at":' .. started .. ',' .. ending .. '}'
end

-- Write lease hash lk (the start rides in it while the run is open; written
-- by flush), the live key, the open entry, the run's index entry and
-- `started`. new: whether this is the run's first event (see add_event).
local function start_run(lk, livek, openk, index, s, ts, extra, new)
  -- rec and hold: the run's record but its end, and its description in a
  -- skipped record, for the fast scripts (valid while recfor is the token).
  local rec = '{"job":' .. jstr(s.job) .. ',"key":' .. jstr(s.key) .. ',"host":' .. jstr(s.host) .. ',"pid":'
    .. s.pid .. ',"token":' .. ts .. ',"slot":' .. s.slot .. ',"started_at":' .. s.at .. ','
  local hold = '"holder_run_id":' .. jstr(s.run_id) .. ',"holder_host":' .. jstr(s.host) .. ',"holder_pid":'
    .. s.pid .. ',"holder_started_at":' .. s.at .. ',"holder_token":' .. ts
  LEASE = {lk, 'owner', s.run_id, 'token', ts, 'job', s.job, 'host', s.host, 'pid', s.pid,
    'started', s.at, 'slot', s.slot, 'revoked_by', '', 'recfor', ts, 'rec', rec, 'hold', hold, unpack(extra)}
  LEASE.run_id, LEASE.linked = s.run_id, new
  redis.call('SET', livek, s.run_id, 'PX', s.ttl_ms)
  redis.call('HSET', openk, s.run_id, s.key)
  add_member(index, '#|' .. s.athex .. '|' .. s.run_id)
  add_event(index, s.eid, 'started', s.job, s.run_id, s.at, s.athex, '{"host":' .. jstr(s.host)
    .. ',"pid":' .. s.pid .. ',"token":' .. ts .. ',"key":' .. jstr(s.key) .. ',"slot":' .. s.slot
    .. ',"ttl":' .. s.ttl .. '}', new and 'new' or nil)
end

local function grant(lk, livek, openk, index, old_token, old_srv, srv, s, new)
  local ts, ms = fence(old_token, old_srv, srv)
  local exp = string.format('%d', ms + tonumber(s.ttl_ms))
  start_run(lk, livek, openk, index, s, ts, {'srv', srv, 'exp', exp}, new)
  return ts
end
"""
)

_ACQUIRE = (
    _COMMON
    + r"""
-- KEYS: 1 lease, 2 live, 3 open runs, 4 finished runs, 5 job index, 6 event records,
--       7 run id index, 8 jobs -> events written, and for policy allow: 9 side lease, 10 side live
-- ARGV[1] packed: 1-11 start, 12 policy, 13 max_pending, 14 a second event id, 15 side key
-- ARGV[2]: the server's run id
local a = split(ARGV[1])
local s = read_start(a, 1)
local policy, eid2 = a[12], a[14]
local h = redis.call('HMGET', KEYS[1], 'owner', 'token', 'srv', 'pending', 'job', 'host', 'pid', 'started',
  'slot', 'revoked_by', 'rseq')
local owner = h[1]
-- Every grant sets the owner field and the live key in one script, and a
-- release removes the owner field: while there is an owner, the live key
-- names it if it exists, so its PTTL says it all.
local pttl = -2
if owner then pttl = redis.call('PTTL', KEYS[2]) end
local live = pttl ~= -2

if not live then
  local abandoned = ''
  -- An expired owner still in the open runs has no terminal record (G6).
  if owner and redis.call('HDEL', KEYS[3], owner) == 1 then
    local ending = '"outcome":"abandoned","ended_at":' .. s.at .. ',"exit_code":null,"detail":'
      .. jstr('lease expired with no terminal record; found by run ' .. s.run_id)
    redis.call('HSET', KEYS[4], owner, run_record(h[5] or s.job, s.key, h[6] or '?', h[7] or '0', h[2],
      h[9] or 'null', h[8] or s.at, ending))
    add_event(KEYS[5], eid2, 'abandoned', s.job, owner, s.at, s.athex,
      '{"found_by":' .. jstr(s.run_id) .. '}', h[11] ~= '' and h[11] or nil)
    abandoned = owner
  end
  local ts = grant(KEYS[1], KEYS[2], KEYS[3], KEYS[5], h[2], h[3], ARGV[2], s, true)
  flush(KEYS[6], KEYS[7], KEYS[8], KEYS[4])
  return {'G', ts, abandoned}
end

local hhost, hpid, hstarted, htoken = h[6] or '?', h[7] or '0', h[8] or '0', h[2] or '0'

if policy == 'replace' then
  -- No event: the holder records `replaced` when its next renew is refused.
  if (h[10] or '') == '' then redis.call('HSET', KEYS[1], 'revoked_by', s.run_id) end
  return {'R', 'revoking', owner, hhost, hpid, hstarted, htoken, pttl}
end

local data = '{"holder_run_id":' .. jstr(owner) .. ',"holder_host":' .. jstr(hhost)
  .. ',"holder_pid":' .. hpid .. ',"holder_started_at":' .. hstarted .. ',"holder_age":'
  .. string.format('%.3f', tonumber(s.at) - tonumber(hstarted)) .. ',"holder_token":' .. htoken
  .. ',"slot":' .. s.slot .. ',"host":' .. jstr(s.host) .. ',"pid":' .. s.pid .. ',"policy":' .. jstr(policy)

if policy == 'allow' then
  -- The run holds this lease already (a second start of the same run id):
  -- refused as the SQL stores refuse a second run row, before any write.
  if owner == s.run_id then return redis.error_reply('run ' .. s.run_id .. ' has already started') end
  local side = {}
  for k, v in pairs(s) do side[k] = v end
  side.key = a[15]
  local ms = now_ms()
  start_run(KEYS[9], KEYS[10], KEYS[3], KEYS[5], side, '1',
    {'exp', string.format('%d', ms + tonumber(s.ttl_ms))}, true)
  add_event(KEYS[5], eid2, 'overlap', s.job, s.run_id, s.at, s.athex, data .. '}', 'new')
  flush(KEYS[6], KEYS[7], KEYS[8], KEYS[4])
  return {'O', '1', owner, hhost, hpid, hstarted, htoken, pttl}
end

local kind = 'skipped'
if policy == 'queue' then
  local pending = tonumber(h[4] or '0')
  if pending < tonumber(a[13]) then
    redis.call('HINCRBY', KEYS[1], 'pending', 1)
    kind = 'queued'
    data = data .. ',"pending":' .. (pending + 1)
  else
    kind = 'queue_full'
    data = data .. ',"pending":' .. pending
  end
end
add_event(KEYS[5], eid2, kind, s.job, s.run_id, s.at, s.athex, data .. '}', 'new')
flush(KEYS[6], KEYS[7], KEYS[8], KEYS[4])
return {'R', kind, owner, hhost, hpid, hstarted, htoken, pttl}
"""
)

_FINISH = (
    _COMMON
    + r"""
-- KEYS: 1 lease, 2 live, 3 open runs, 4 finished runs, 5 job index, 6 event records,
--       7 run id index, 8 jobs -> events written, and with then: 9 then's job index
-- ARGV[1] packed: 1 run id, 2 job, 3 key, 4 outcome, 5 end of the run record, 6 at, 7 athex,
--                 8 event data without its closing brace, 9 event id, 10 side lease?
-- With then: ARGV[2] the server's run id, ARGV[3] packed: then's start
local a = split(ARGV[1])
local run_id, job, at = a[1], a[2], a[6]
local h = redis.call('HMGET', KEYS[1], 'owner', 'token', 'srv', 'pending', 'job', 'host', 'pid', 'started',
  'slot', 'rseq')
-- While a run is open its lease names it: abandonment, hand-over and
-- release all close the run in the same step that changes the owner.
-- So a run that does not own its lease has its terminal record already.
if h[1] ~= run_id then
  -- A retried finish whose first try (reply lost) handed the lease to the
  -- queued run: report that hand-over again instead of losing the run.
  if ARGV[3] and h[1] == split(ARGV[3])[1] then return {1, 0, h[2]} end
  return {0, 0}
end
local recorded = 0
if redis.call('HDEL', KEYS[3], run_id) == 1 then
  redis.call('HSET', KEYS[4], run_id, run_record(h[5] or job, a[3], h[6] or '?', h[7] or '0', h[2],
    h[9] or 'null', h[8] or at, a[5]))
  add_event(KEYS[5], a[9], a[4], job, run_id, at, a[7],
    a[8] .. ',"duration":' .. string.format('%.6f', tonumber(at) - tonumber(h[8] or at)) .. '}',
    h[10] ~= '' and h[10] or nil)
  recorded = 1
end
if a[10] == '1' then
  redis.call('DEL', KEYS[1], KEYS[2])
  flush(KEYS[6], KEYS[7], KEYS[8], KEYS[4])
  return {1, recorded}
end
if ARGV[3] and tonumber(h[4] or '0') > 0 then
  local s = read_start(split(ARGV[3]), 1)
  redis.call('HINCRBY', KEYS[1], 'pending', -1)
  local ts = grant(KEYS[1], KEYS[2], KEYS[3], KEYS[9], h[2], h[3], ARGV[2], s)
  flush(KEYS[6], KEYS[7], KEYS[8], KEYS[4])
  return {1, recorded, ts}
end
-- Released: the owner field goes. The live key is left to expire by its
-- PX: nothing reads it without an owner (acquire, renew and the read side
-- all start from the owner field), and the next grant overwrites it.
redis.call('HDEL', KEYS[1], 'owner', 'revoked_by', 'rseq')
flush(KEYS[6], KEYS[7], KEYS[8], KEYS[4])
return {1, recorded}
"""
)

# The two fast paths. Most cycles are a start on a free lease and a plain
# release, and most refusals a skip. The fast scripts make the writes the
# general ones make in these cases, in the same layout, with less Lua: the
# client sends the records' texts (no packed argument to split, no generic
# flush, no trim functions to define), and every grant keeps in the lease
# hash the run's record but its end (``rec``) and its description in a
# skipped record (``hold``), valid while ``recfor`` is the lease's token, so
# a release or a skip only appends. They return the job's event counter:
# at a multiple of CHECK the client sends _TRIM. Any other case (an owner
# whose lease expired, ``rec`` or ``hold`` missing or of an earlier grant,
# another policy, a queued ``then``, a side lease) returns false before any
# write, and the client sends the general script.

_GRANT_OR_SKIP = (
    _FENCING
    + r"""
-- KEYS: as _ACQUIRE's first 8. ARGV: 1 run id, 2 ttl ms, 3 the server's run id, 4 job, 5 key, 6 at,
-- 7 athex, 8-9 the started record around its token, 10-11 the run record's head around its token,
-- 12 the holder description up to its token, 13-14 the skipped record around the holder's,
-- 15 host, 16 pid, 17 slot
local h = redis.call('HMGET', KEYS[1], 'owner', 'token', 'srv', 'recfor', 'hold', 'host', 'pid', 'started')
local owner = h[1]
if owner then
  local pttl = redis.call('PTTL', KEYS[2])
  -- Expired: the general script records the owner abandoned. hold missing or
  -- not of this grant (recfor is the token that wrote it): the general script.
  if pttl == -2 or h[4] ~= h[2] or not h[5] or not tonumber(h[8]) then return false end
  local age = string.format('%.3f', tonumber(ARGV[6]) - tonumber(h[8]))
  local record = ARGV[13] .. h[5] .. ',"holder_age":' .. age .. ARGV[14]
  local seq = string.format('%012d', redis.call('HINCRBY', KEYS[6], 'seq', 1))
  redis.call('HSET', KEYS[6], seq, record, 'r:' .. ARGV[1], seq)
  redis.call('ZADD', KEYS[5], 0, '@|' .. ARGV[7] .. '|' .. seq .. '|skipped|' .. ARGV[1],
    0, 'skipped|' .. ARGV[7] .. '|' .. seq)
  local n = redis.call('HINCRBY', KEYS[8], ARGV[4], 1)
  return {'R', 'skipped', owner, h[6] or '?', h[7] or '0', h[8], h[2], pttl, n}
end
local ts, ms = fence(h[2], h[3], ARGV[3])
local exp = string.format('%d', ms + tonumber(ARGV[2]))
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[5])
local seq = string.format('%012d', redis.call('HINCRBY', KEYS[6], 'seq', 1))
redis.call('HSET', KEYS[6], seq, ARGV[8] .. ts .. ARGV[9], 'r:' .. ARGV[1], seq)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', ts, 'job', ARGV[4], 'host', ARGV[15], 'pid', ARGV[16],
  'started', ARGV[6], 'slot', ARGV[17], 'revoked_by', '', 'srv', ARGV[3], 'exp', exp, 'rseq', seq,
  'recfor', ts, 'rec', ARGV[10] .. ts .. ARGV[11], 'hold', ARGV[12] .. ts)
redis.call('ZADD', KEYS[5], 0, '#|' .. ARGV[7] .. '|' .. ARGV[1],
  0, '@|' .. ARGV[7] .. '|' .. seq .. '|started|' .. ARGV[1], 0, 'started|' .. ARGV[7] .. '|' .. seq)
return {'G', ts, '', redis.call('HINCRBY', KEYS[8], ARGV[4], 1)}
"""
)

_RELEASE = r"""
-- KEYS: as _FINISH's first 8. ARGV: 1 run id, 2 job, 3 the run record's end, 4 the terminal record up to
-- its duration, 5 at, 6 athex, 7 kind
local h = redis.call('HMGET', KEYS[1], 'owner', 'recfor', 'rec', 'started', 'rseq', 'token')
if h[1] ~= ARGV[1] then return {0, 0, 0} end
-- rec missing or not of this grant (recfor is the token that wrote it): the general script.
if h[2] ~= h[6] or not h[3] or not tonumber(h[4]) then return false end
-- Every text before the first write: nothing below can fail half-way.
local record = ARGV[4] .. string.format('%.6f', tonumber(ARGV[5]) - tonumber(h[4])) .. '}}'
local run = h[3] .. ARGV[3]
local recorded = 0
if redis.call('HDEL', KEYS[3], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[4], ARGV[1], run)
  local seq = string.format('%012d', redis.call('HINCRBY', KEYS[6], 'seq', 1))
  -- The run's link (see add_event): its field, or, for a run whose start was
  -- handed over, the run id index.
  if h[5] and h[5] ~= '' then
    redis.call('HSET', KEYS[6], seq, record, 'r:' .. ARGV[1], h[5] .. ',' .. seq)
  else
    redis.call('HSET', KEYS[6], seq, record)
    redis.call('ZADD', KEYS[7], 0, ARGV[1] .. '|' .. seq)
  end
  redis.call('ZADD', KEYS[5], 0, '@|' .. ARGV[6] .. '|' .. seq .. '|' .. ARGV[7] .. '|' .. ARGV[1],
    0, ARGV[7] .. '|' .. ARGV[6] .. '|' .. seq)
  recorded = 1
end
redis.call('HDEL', KEYS[1], 'owner', 'revoked_by', 'rseq')
if recorded == 0 then return {1, 0, 0} end
return {1, 1, redis.call('HINCRBY', KEYS[8], ARGV[2], 1)}
"""

_TRIM = (
    _RETENTION
    + r"""
-- KEYS: 1 job index, 2 event records, 3 run id index, 4 finished runs
trim_runs(KEYS[1], KEYS[4])
trim_events(KEYS[1], KEYS[2], KEYS[3])
return 1
"""
)

_RENEW = r"""
-- KEYS: 1 lease, 2 live. ARGV: 1 run id, 2 ttl ms
local h = redis.call('HMGET', KEYS[1], 'owner', 'revoked_by')
-- The owner field first: a released lease's live key is left to expire.
if h[1] ~= ARGV[1] then return {'lost'} end
if h[2] and h[2] ~= '' then return {'revoked', h[2]} end
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {'lost'} end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'exp',
  string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])))
return {'ok'}
"""

_RECORD = (
    _COMMON
    + r"""
-- KEYS: 1 job index, 2 event records, 3 run id index, 4 jobs -> events written, 5 finished runs,
--       6 the event id's mark (recorded ids are remembered, so that a retried record is a no-op)
-- ARGV[1] packed: 1 event id, 2 kind, 3 job, 4 run id, 5 has run id, 6 at, 7 athex. ARGV[2]: data,
-- ARGV[3]: how long the mark is kept, ms
if redis.call('EXISTS', KEYS[6]) == 1 then return 0 end
local a = split(ARGV[1])
local run_id = false
if a[5] == '1' then run_id = a[4] end
add_event(KEYS[1], a[1], a[2], a[3], run_id, a[6], a[7], ARGV[2])
flush(KEYS[2], KEYS[3], KEYS[4], KEYS[5])
-- Last: a script that fails half-way keeps its writes, and a mark without
-- its event would turn the retry into a loss.
redis.call('SET', KEYS[6], '1', 'PX', ARGV[3])
return 1
"""
)

# The outbox (G9): a sink's outbox is the ledger above its mark minus its
# acknowledged set. Scripts append events one at a time and number them in
# the same step, so seq order is commit order and the mark needs no settling.
# Seqs are dense: the scripts walk the records hash by seq (a trimmed record
# reads as nil and is passed over), so the outbox costs no write per event.

_OUTBOX_COMMON = r"""
local CHUNK = 256

-- Calls visit(seq, record) for each record above `from` up to the counter,
-- a chunk at a time, until visit returns true.
local function walk(evk, from, visit)
  local top = tonumber(redis.call('HGET', evk, 'seq') or '0')
  local pos = from + 1
  while pos <= top do
    local last = math.min(top, pos + CHUNK - 1)
    local fields = {}
    for q = pos, last do fields[#fields + 1] = string.format('%012d', q) end
    local records = redis.call('HMGET', evk, unpack(fields))
    for i = 1, #fields do
      if records[i] and visit(fields[i], records[i]) then return top end
    end
    pos = last + 1
  end
  return top
end

local function acked_above(acksk, mark)
  local acked = {}
  for _, seq in ipairs(redis.call('ZRANGEBYSCORE', acksk, '(' .. mark, '+inf')) do acked[seq] = true end
  return acked
end
"""

_UNDELIVERED = (
    _OUTBOX_COMMON
    + r"""
-- KEYS: 1 event records, 2 the sink's mark, 3 its acknowledged set. ARGV: 1 limit
local mark = redis.call('GET', KEYS[2])
if not mark then return false end
local limit = tonumber(ARGV[1])
local acked = acked_above(KEYS[3], mark)
local out = {}
walk(KEYS[1], tonumber(mark), function(seq, record)
  if not acked[seq] then
    out[#out + 1] = seq
    out[#out + 1] = record
  end
  return #out >= 2 * limit
end)
return out
"""
)

_MARK_DELIVERED = (
    _OUTBOX_COMMON
    + r"""
-- KEYS: 1 event records, 2 the sink's mark, 3 its acknowledged set. ARGV: event ids
local mark = redis.call('GET', KEYS[2])
if not mark then return false end
mark = tonumber(mark)
local want, left = {}, 0
for _, id in ipairs(ARGV) do
  if not want[id] then want[id] = true; left = left + 1 end
end
local acked = acked_above(KEYS[3], mark)
local add, gap = {}, false
local top = walk(KEYS[1], mark, function(seq, record)
  local id = string.match(record, '^{"i":"([^"]*)"')
  if not id or string.find(id, '\\', 1, true) then id = cjson.decode(record).i end
  if want[id] then
    want[id] = nil
    left = left - 1
    if not acked[seq] then
      acked[seq] = true
      add[#add + 1] = tonumber(seq)
      add[#add + 1] = seq
    end
  end
  if not gap and not acked[seq] then gap = tonumber(seq) end
  return left == 0 and gap
end)
if #add > 0 then redis.call('ZADD', KEYS[3], unpack(add)) end
-- The mark moves over the acknowledged prefix (and over trimmed records).
local new = top
if gap then new = gap - 1 end
if new > mark then
  redis.call('SET', KEYS[2], string.format('%d', new))
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', new)
end
return 1
"""
)

# The bare lock (Store.lock): no ledger, so none of the above. The owner is
# the value of a key with PX, as any Redis lock; the fencing counter is a
# hash of server run id -> last token, so a grant under a server process
# that has not granted this key before (a restart, a failover, a restored
# snapshot) starts from the server's clock like a job's lease does.

_LOCK = r"""
-- KEYS: 1 the lock (owner, PX), 2 its counter. ARGV: 1 owner, 2 ttl ms, 3 the server's run id
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
local token = redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
if token == 1 then
  -- No grant yet under this server process: one more than any other
  -- process's counter, and at least the server's clock in microseconds.
  local t = redis.call('TIME')
  token = tonumber(t[1]) * 1000000 + tonumber(t[2])
  for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
    if tonumber(v) >= token then token = tonumber(v) + 1 end
  end
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], ARGV[3], string.format('%d', token))
end
return string.format('%d', token)
"""

_RENEW_LOCK = r"""
-- KEYS: 1 the lock. ARGV: 1 owner, 2 ttl ms
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""

_UNLOCK = r"""
-- KEYS: 1 the lock. ARGV: 1 owner
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
"""

# The scheduler's slot claim (Store.claim_slot): the first owner, kept with
# PX, so it is forgotten by the server's clock and nothing else is written.

_CLAIM_SLOT = r"""
-- KEYS: 1 the claim. ARGV: 1 owner, 2 keep ms
local held = redis.call('GET', KEYS[1])
if held then return held end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
"""


class _Lua:
    """A script, sent by its SHA1 (``EVALSHA``), by its text on ``NOSCRIPT``."""

    __slots__ = ("sha", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()


_SSL_CERT_REQS = ("none", "optional", "required")


class RedisStore(Store):
    """A store in one Redis database, every key under ``prefix``.

    ``client`` may be given (and is then not closed by ``close``); a client
    used here should not retry commands on its own, since replaying an
    ``acquire`` whose reply was lost would refuse a run against itself.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        runs_per_job: int = DEFAULT_RUNS_PER_JOB,
        events_per_job: int = DEFAULT_EVENTS_PER_JOB,
        clock: Clock = SYSTEM_CLOCK,
        url: str | None = None,
        owns_client: bool = False,
    ) -> None:
        if runs_per_job < 1 or events_per_job < 1:
            raise ValueError("runs_per_job and events_per_job must be at least 1")
        self._client = client
        self._owns_client = owns_client
        self._clock = clock  # kept for the interface; expiry is the server's (G4)
        kwargs = client.connection_pool.connection_kwargs
        host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
        self.address = f"{host}:{port}"
        self.url = url or f"redis://{self.address}/{kwargs.get('db', 0)}?prefix={prefix}"
        self.prefix = prefix
        self.runs_per_job = runs_per_job
        self.events_per_job = events_per_job
        self._socket_timeout: float = kwargs.get("socket_timeout") or math.inf
        self._renewers: dict[float, redis.Redis] = {}
        self._renewers_lock = threading.Lock()
        p = prefix
        self._k_open, self._k_runs, self._k_ev, self._k_ev_run = p + "open", p + "runs", p + "ev", p + "ev:r"
        self._k_ledger_jobs, self._k_jobs = p + "jobs:ev", p + "jobs"
        self._k_job_counts = p + "jobs:n"
        self._servers: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._kept: tuple[Any, int] = (None, 0)
        self._kept_lock = threading.Lock()

        # Retention is part of the script text (one script per setting), not
        # an argument on every call. Scripts are sent by EVALSHA, by EVAL on
        # NOSCRIPT (first use, restart).
        limits = _retention(runs_per_job, events_per_job)
        self._check = limits["check"]

        def script(text: str) -> _Lua:
            for name, value in limits.items():
                text = text.replace(f"{{{name}}}", str(value))
            return _Lua(text)

        self._acquire = script(_ACQUIRE)
        self._finish = script(_FINISH)
        self._grant_or_skip = _Lua(_GRANT_OR_SKIP)
        self._release = _Lua(_RELEASE)
        self._trim = script(_TRIM)
        self._renew = script(_RENEW)
        self._record = script(_RECORD)
        self._undelivered = _Lua(_UNDELIVERED)
        self._mark_delivered = _Lua(_MARK_DELIVERED)
        self._lock, self._renew_lock, self._unlock = _Lua(_LOCK), _Lua(_RENEW_LOCK), _Lua(_UNLOCK)
        self._claim_slot = _Lua(_CLAIM_SLOT)

    @classmethod
    def from_url(cls, url: str, *, clock: Clock = SYSTEM_CLOCK) -> RedisStore:
        """``redis://[[user]:password@]host[:port][/db][?params]``, or
        ``rediss://`` for TLS. Params: ``prefix``, ``runs_per_job``,
        ``events_per_job``, ``socket_timeout``, ``connect_timeout``
        (durations such as ``3s``), and for TLS ``ssl_ca_certs`` and
        ``ssl_cert_reqs`` (none, optional, required)."""
        try:
            parts = urlsplit(url)
            port = parts.port or 6379
        except ValueError as e:
            raise StoreUrlError(url, str(e)) from None
        scheme = parts.scheme.lower()
        if scheme not in ("redis", "rediss"):
            raise StoreUrlError(url, "expected redis:// or rediss://")
        db_text = parts.path.strip("/") or "0"
        if not db_text.isdigit():
            raise StoreUrlError(url, f"the database must be a number like /0, got {parts.path!r}")
        params = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        prefix = params.pop("prefix", DEFAULT_PREFIX)
        if SEP in prefix:
            raise StoreUrlError(url, "prefix may not contain control characters")
        runs = _positive_int(url, params.pop("runs_per_job", None), "runs_per_job", DEFAULT_RUNS_PER_JOB)
        events = _positive_int(
            url, params.pop("events_per_job", None), "events_per_job", DEFAULT_EVENTS_PER_JOB
        )
        socket_timeout = _timeout(url, params.pop("socket_timeout", None), "socket_timeout")
        connect_timeout = _timeout(url, params.pop("connect_timeout", None), "connect_timeout")
        tls: dict[str, Any] = {}
        if scheme == "rediss":
            tls["ssl"] = True
            if "ssl_ca_certs" in params:
                tls["ssl_ca_certs"] = params.pop("ssl_ca_certs")
            if "ssl_cert_reqs" in params:
                reqs = params.pop("ssl_cert_reqs").lower()
                if reqs not in _SSL_CERT_REQS:
                    raise StoreUrlError(url, f"ssl_cert_reqs must be one of {', '.join(_SSL_CERT_REQS)}")
                tls["ssl_cert_reqs"] = reqs
        if params:
            raise StoreUrlError(url, f"unknown parameter(s) {', '.join(sorted(params))}")
        client = redis.Redis(
            host=parts.hostname or "localhost",
            port=port,
            db=int(db_text),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password is not None else None,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            # No automatic retries: a replayed acquire or finish whose reply
            # was lost would act twice. A connection that died while idle is
            # replaced when the pool hands it out; renew retries on its own.
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
            client_name="cronwarden",
            **tls,
        )
        return cls(
            client,
            prefix=prefix,
            runs_per_job=runs,
            events_per_job=events,
            clock=clock,
            url=mask_password(url),
            owns_client=True,
        )

    # -- plumbing ---------------------------------------------------------

    def _error(self, e: RedisError) -> StoreError:
        text = (str(e).strip().splitlines() or [type(e).__name__])[0]
        where = f"Redis store {self.address}"
        if isinstance(
            e,
            AuthenticationError
            | AuthorizationError
            | AuthenticationWrongNumberOfArgsError
            | NoPermissionError,
        ):
            return StoreError(f"{where} refused our credentials or permissions: {text}")
        if isinstance(e, RedisConnectionError | RedisTimeoutError):
            return StoreUnavailable(f"{where} is unreachable: {text}")
        if isinstance(
            e, ReadOnlyError | OutOfMemoryError | TryAgainError | ClusterDownError
        ) or text.startswith(("BUSY", "LOADING", "MASTERDOWN")):
            return StoreUnavailable(f"{where} cannot serve writes right now: {text}")
        if "DB index" in text:
            return StoreError(f"{where} has no such database: {text}")
        return StoreError(f"{where}: {text}")

    def _eval(
        self,
        script: _Lua,
        keys: list[str],
        args: list[str],
        *,
        server: int = -1,
        client: redis.Redis | None = None,
    ) -> Any:
        """Run ``script`` in one round trip (two on ``NOSCRIPT``). With
        ``server`` >= 0, the run id of the server process at the other end of
        the connection is inserted into ``args`` there (see ``_server_id``).

        This is redis-py's ``Script`` call without its per-command layers
        (retry wrapper, response callbacks, metrics), which cost more client
        CPU than the rest of a lock cycle; the client never retries anyway."""
        try:
            return self._send(script, keys, args, server, client or self._client)
        except RedisError as e:
            raise self._error(e) from None

    def _send(self, script: _Lua, keys: list[str], args: list[str], server: int, client: redis.Redis) -> Any:
        # One connection is kept out of the pool for whichever thread calls
        # first (taking one from the pool and giving it back costs a call
        # ~30 µs of CPU in redis-py 8); a concurrent caller uses the pool.
        if client is self._client and self._kept_lock.acquire(blocking=False):
            try:
                return self._send_on(self._kept_connection(), script, keys, args, server)
            finally:
                self._kept_lock.release()
        pool = client.connection_pool
        conn = pool.get_connection()
        try:
            return self._send_on(conn, script, keys, args, server)
        finally:
            pool.release(conn)

    def _kept_connection(self) -> Any:
        conn, pid = self._kept
        if conn is None or pid != os.getpid():  # first use, or a forked child: the pool resets itself
            conn = self._client.connection_pool.get_connection()
            self._kept = (conn, os.getpid())
            return conn
        # What the pool checks when it hands a connection out: one that died
        # while idle (CLIENT KILL, a restart, an idle timeout) or has stray
        # data is replaced, so the next call works. Between calls nothing is
        # owed on this connection (a call that failed half-way disconnected
        # it), so a socket with anything to read has been closed or holds
        # stray bytes: a zero-timeout poll of the socket asks that at a
        # fraction of the CPU of redis-py's can_read (which also looks into
        # its own buffer, empty here after whole replies). A connection class
        # with no socket of its own (a wrapper) gets can_read.
        sock = getattr(conn, "_sock", None)
        try:
            if sock is None:
                conn.connect()  # a no-op when connected; raises when the server cannot be reached
                stale = bool(conn.can_read())
            else:
                poll = select.poll()
                poll.register(sock, select.POLLIN)
                stale = bool(poll.poll(0))
        except (RedisConnectionError, RedisTimeoutError, OSError, ValueError):
            stale = True
        if stale:
            conn.disconnect()
            conn.connect()  # now, not when it sends: the server id is read after this
        return conn

    def _send_on(self, conn: Any, script: _Lua, keys: list[str], args: list[str], server: int) -> Any:
        # conn: Any, since redis-py's connection methods are untyped.
        try:
            if server >= 0:
                args = [*args[:server], self._server_id(conn), *args[server:]]
            try:
                conn.send_packed_command([_resp(["EVALSHA", script.sha, str(len(keys)), *keys, *args])])
                return conn.read_response()
            except NoScriptError:
                conn.send_packed_command([_resp(["EVAL", script.text, str(len(keys)), *keys, *args])])
                return conn.read_response()
        except ResponseError:
            raise  # the reply was read whole: the connection is fine
        except BaseException:
            # A reply may still be on its way: never use this connection again as is.
            conn.disconnect()
            raise

    def _server_id(self, conn: Any) -> str:
        """The ``run_id`` of the server process this connection talks to,
        asked once per connection (``INFO server``) and forgotten when it
        reconnects. A connection cannot outlive its server process, so this is
        the process that will execute the script sent on it: a restart, a
        failover or a restored snapshot shows as a different id, at the cost
        of one ``INFO`` per connection instead of one per grant."""
        conn.connect()  # a no-op when connected; a reconnect forgets the id first
        srv = self._servers.get(conn)
        if srv is None:
            conn.register_connect_callback(self._forget_server)
            conn.send_command("INFO", "server")
            info = conn.read_response()
            text = info.decode() if isinstance(info, bytes) else str(info)
            at = text.find("run_id:")
            srv = text[at + 7 :].split(None, 1)[0] if at >= 0 else ""
            self._servers[conn] = srv
        return srv

    def _forget_server(self, conn: Any) -> None:
        self._servers.pop(conn, None)

    def _index(self, job: str) -> str:
        return f"{self.prefix}job:{job}"

    @staticmethod
    def _check_start(start: Start) -> None:
        for text in (start.run_id, start.job, start.key, start.host):
            if SEP in text:
                raise UsageError(f"job, key, host and run id may not contain control characters: {text!r}")

    def _start_fields(self, start: Start) -> str:
        self._check_start(start)
        at = float(start.at)
        return _pack(
            start.run_id,
            start.job,
            start.key,
            start.host,
            str(int(start.pid)),
            str(_ttl_ms(start.ttl)),
            repr(float(start.ttl)),
            repr(at),
            _ordhex(at),
            "null" if start.slot is None else repr(float(start.slot)),
            new_id(),
        )

    def _fast_start(self, start: Start) -> list[str]:
        """``_GRANT_OR_SKIP``'s arguments but the server's run id (inserted
        at 2): the records a grant or a skip writes, around what only the
        script knows (the token, the holder)."""
        self._check_start(start)
        at = repr(float(start.at))
        job, key, host, run = _jstr(start.job), _jstr(start.key), _jstr(start.host), _jstr(start.run_id)
        pid = str(int(start.pid))
        slot = "null" if start.slot is None else repr(float(start.slot))
        return [
            start.run_id, str(_ttl_ms(start.ttl)), start.job, start.key, at, _ordhex(float(start.at)),
            f'{{"i":"{new_id()}","k":"started","j":{job},"r":{run},"a":{at},"d":{{"host":{host},"pid":{pid},'
            '"token":',
            f',"key":{key},"slot":{slot},"ttl":{float(start.ttl)!r}}}}}',
            f'{{"job":{job},"key":{key},"host":{host},"pid":{pid},"token":',
            f',"slot":{slot},"started_at":{at},',
            f'"holder_run_id":{run},"holder_host":{host},"holder_pid":{pid},"holder_started_at":{at},'
            '"holder_token":',
            f'{{"i":"{new_id()}","k":"skipped","j":{job},"r":{run},"a":{at},"d":{{',
            f',"slot":{slot},"host":{host},"pid":{pid},"policy":"skip"}}}}',
            start.host, pid, slot,
        ]  # fmt: skip

    def _retain(self, job: str, written: int) -> None:
        """After a fast script: trim the job's ledger when its counter of
        events written reached a multiple of the check interval. Best
        effort: the step it follows is done, and a trim that fails is caught
        up by the next check (each trims down to the limit)."""
        if written and written % self._check == 0:
            keys = [self._index(job), self._k_ev, self._k_ev_run, self._k_runs]
            try:
                self._eval(self._trim, keys, [])
            except StoreError:
                pass

    def _renewer(self, ttl: float) -> redis.Redis:
        """A client whose calls give up within the belief margin (the part
        of the ttl the holder does not trust, ``lease.margin``). A renew sent
        before the holder's deadline then returns, on a hung or paused server too, no later than the lease can
        expire server-side, so the heartbeat thread always gets control back
        in time to declare the lease lost (G3)."""
        timeout = round(max(0.01, margin(ttl)), 3)
        if timeout >= self._socket_timeout:
            return self._client
        with self._renewers_lock:
            client = self._renewers.get(timeout)
            if client is None:
                pool = self._client.connection_pool
                kwargs = dict(pool.connection_kwargs)
                kwargs["socket_timeout"] = timeout
                connect = kwargs.get("socket_connect_timeout")
                kwargs["socket_connect_timeout"] = timeout if connect is None else min(connect, timeout)
                kwargs["retry"] = Retry(NoBackoff(), 0)
                client = redis.Redis(
                    connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
                )
                self._renewers[timeout] = client
            return client

    # -- the contract -----------------------------------------------------

    def acquire(self, start: Start) -> Granted | Refused:
        p = self.prefix
        side = f"{start.key}+{start.run_id}"
        keys = [
            f"{p}lease:{start.key}",
            f"{p}live:{start.key}",
            self._k_open,
            self._k_runs,
            self._index(start.job),
            self._k_ev,
            self._k_ev_run,
            self._k_job_counts,
        ]
        if start.policy is Policy.SKIP:
            reply = self._eval(self._grant_or_skip, keys, self._fast_start(start), server=2)
            if reply is not None:  # else a case only the general script handles
                self._retain(start.job, reply[-1])
                return self._acquired(start, side, reply)
        if start.policy is Policy.ALLOW:  # the side lease: declared only when it may be touched
            keys += [f"{p}lease:{side}", f"{p}live:{side}"]
        packed = self._start_fields(start) + _pack(start.policy.value, str(start.max_pending), new_id(), side)
        return self._acquired(start, side, self._eval(self._acquire, keys, [packed], server=1))

    def _acquired(self, start: Start, side: str, reply: list[Any]) -> Granted | Refused:
        if reply[0] == "G":
            lease = Lease(
                key=start.key, job=start.job, run_id=start.run_id, token=int(reply[1]), ttl=start.ttl
            )
            return Granted(lease=lease, abandoned=(reply[2],) if reply[2] else ())
        holder = Holder(
            run_id=reply[2],
            host=reply[3],
            pid=int(reply[4]),
            started_at=float(reply[5]),
            token=int(reply[6]),
            expires_in=max(int(reply[7]), 0.5) / 1000,
        )
        if reply[0] == "O":
            lease = Lease(key=side, job=start.job, run_id=start.run_id, token=int(reply[1]), ttl=start.ttl)
            return Granted(lease=lease, overlapped=holder)
        return Refused(refusal=Refusal(reply[1]), holder=holder)

    def renew(self, lease: Lease) -> None:
        p = self.prefix
        keys = [f"{p}lease:{lease.key}", f"{p}live:{lease.key}"]
        args = [lease.run_id, str(_ttl_ms(lease.ttl))]
        client = self._renewer(lease.ttl)
        try:
            try:
                reply = self._send(self._renew, keys, args, -1, client)
            except RedisConnectionError:
                # The connection died under us; renew is idempotent, so one
                # more try on a fresh connection is safe. A timeout is not
                # retried: the heartbeat must get control back.
                reply = self._send(self._renew, keys, args, -1, client)
        except RedisError as e:
            raise self._error(e) from None
        if reply[0] == "ok":
            return
        if reply[0] == "revoked":
            raise LeaseRevoked(lease.key, reply[1])
        raise LeaseLost(lease.key, "expired or taken by another run")

    def finish(self, lease: Lease, end: End, then: Start | None = None) -> Finished:
        p = self.prefix
        keys = [
            f"{p}lease:{lease.key}",
            f"{p}live:{lease.key}",
            self._k_open,
            self._k_runs,
            self._index(lease.job),
            self._k_ev,
            self._k_ev_run,
            self._k_job_counts,
        ]
        if then is not None:
            keys.append(self._index(then.job))
        # Both JSON texts by hand: json.dumps costs more than the rest of the call.
        exit_code = "null" if end.exit_code is None else str(int(end.exit_code))
        detail = json.dumps(end.detail) if end.detail else '""'
        at = float(end.at)
        ending = (
            f'"outcome":"{end.outcome.value}","ended_at":{at!r},"exit_code":{exit_code},"detail":{detail}'
        )
        data = f'{{"exit_code":{exit_code},"token":{int(lease.token)}'
        if end.detail:
            data += f',"detail":{detail}'
        if end.replaced_by:
            data += f',"replaced_by":{json.dumps(end.replaced_by)}'
        side = "+" in lease.key and lease.key.endswith("+" + lease.run_id)
        for text in (lease.run_id, lease.job, lease.key):
            if SEP in text:
                raise UsageError(f"job, key and run id may not contain control characters: {text!r}")
        kind = end.outcome.event.value
        if then is None and not side:
            record = (
                f'{{"i":"{new_id()}","k":"{kind}","j":{_jstr(lease.job)},"r":{_jstr(lease.run_id)},"a":{at!r},'
                f'"d":{data},"duration":'
            )
            fast = [lease.run_id, lease.job, ending + "}", record, repr(at), _ordhex(at), kind]
            reply = self._eval(self._release, keys, fast)
            if reply is not None:  # else a case only the general script handles
                self._retain(lease.job, reply[2])
                return Finished(owned=reply[0] == 1, recorded=reply[1] == 1)
        args = [
            _pack(
                lease.run_id,
                lease.job,
                lease.key,
                kind,
                ending,
                repr(at),
                _ordhex(at),
                data,
                new_id(),
                "1" if side else "0",
            )
        ]
        if then is not None:
            args.append(self._start_fields(then))  # the server's run id goes between
        reply = self._eval(self._finish, keys, args, server=1 if then is not None else -1)
        nxt = None
        if len(reply) > 2 and then is not None:
            nxt = Lease(key=then.key, job=then.job, run_id=then.run_id, token=int(reply[2]), ttl=then.ttl)
        return Finished(owned=reply[0] == 1, recorded=reply[1] == 1, next=nxt)

    # -- the bare lock ----------------------------------------------------

    def _lock_key(self, key: str) -> str:
        return f"{self.prefix}lock:{key}"

    def lock(self, key: str, owner: str, ttl: float) -> int | None:
        keys = [self._lock_key(key), f"{self.prefix}lock-token:{key}"]
        reply = self._eval(self._lock, keys, [owner, str(_ttl_ms(ttl))], server=2)
        return None if reply is None else int(reply)

    def renew_lock(self, key: str, owner: str, ttl: float) -> bool:
        client = self._renewer(ttl)
        args = [owner, str(_ttl_ms(ttl))]
        try:
            try:
                reply = self._send(self._renew_lock, [self._lock_key(key)], args, -1, client)
            except RedisConnectionError:  # idempotent: as renew
                reply = self._send(self._renew_lock, [self._lock_key(key)], args, -1, client)
        except RedisError as e:
            raise self._error(e) from None
        return bool(reply)

    def unlock(self, key: str, owner: str) -> bool:
        return bool(self._eval(self._unlock, [self._lock_key(key)], [owner]))

    def record(self, event: Event) -> None:
        for text in (event.job, event.run_id or ""):
            if SEP in text:
                raise UsageError(f"job and run id may not contain control characters: {text!r}")
        at = float(event.at)
        packed = _pack(
            event.event_id,
            EventKind(event.kind).value,
            event.job,
            event.run_id or "",
            "0" if event.run_id is None else "1",
            repr(at),
            _ordhex(at),
        )
        data = json.dumps(dict(event.data), separators=(",", ":"), default=str)
        keys = [self._index(event.job), self._k_ev, self._k_ev_run, self._k_job_counts, self._k_runs,
                f"{self.prefix}eid:{event.event_id}"]  # fmt: skip
        self._eval(self._record, keys, [packed, data, str(RECORDED_IDS_KEPT * 1000)])

    # -- the scheduler's slot claim ---------------------------------------

    def claim_slot(self, job: str, slot: float, owner: str, keep: float) -> str:
        key = f"{self.prefix}slot:{job}:{float(slot)!r}"
        # Rounded up: the claim is kept at least ``keep``.
        keep_ms = max(1, math.ceil(keep * 1000))
        return str(self._eval(self._claim_slot, [key], [owner, str(keep_ms)]))

    # -- the read side ----------------------------------------------------

    def _read(self, build: Callable[[Pipeline], object], *, atomic: bool = False) -> list[Any]:
        """Run the commands ``build`` queues in one round trip (in MULTI when
        ``atomic``, for readings that must agree with each other)."""
        try:
            pipe = self._client.pipeline(transaction=atomic)
            build(pipe)
            replies: list[Any] = pipe.execute()
        except RedisError as e:
            raise self._error(e) from None
        return replies

    def _open_records(self, opened: dict[str, str], *, timed: bool) -> list[RunRecord]:
        """Records of open runs (run id -> lease key) from their leases."""
        if not opened:
            return []
        p = self.prefix
        keys = sorted(set(opened.values()))

        def build(pipe: Pipeline) -> None:
            for key in keys:
                pipe.hmget(f"{p}lease:{key}", [*_LEASE_FIELDS, "exp"])
                pipe.get(f"{p}live:{key}")
                pipe.pttl(f"{p}live:{key}")
            pipe.time()

        replies = self._read(build, atomic=True)
        now_ms = _ms(replies[-1])
        state = {key: replies[3 * i : 3 * i + 3] for i, key in enumerate(keys)}
        out = []
        for run_id, key in opened.items():
            fields, live, pttl = state[key]
            owner, token, job, host, pid, started, slot, exp = fields
            if owner != run_id or token is None:
                continue  # not open after all (changed between our reads)
            out.append(
                RunRecord(
                    run_id=run_id,
                    job=job,
                    key=key,
                    host=host,
                    pid=int(pid),
                    token=int(token),
                    slot=None if slot in (None, "null") else float(slot),
                    started_at=float(started),
                    expires_in=_expires_in(run_id, owner, exp, live, pttl, now_ms) if timed else None,
                )
            )
        return out

    def open_runs(self, job: str | None = None) -> list[RunRecord]:
        [opened] = self._read(lambda pipe: pipe.hgetall(self._k_open))
        runs = [r for r in self._open_records(opened, timed=True) if job is None or r.job == job]
        runs.sort(key=lambda r: (r.started_at, r.run_id))
        return runs

    def _records(self, ids: list[str]) -> dict[str, RunRecord]:
        if not ids:
            return {}
        done, keys = self._read(lambda pipe: (pipe.hmget(self._k_runs, ids), pipe.hmget(self._k_open, ids)))
        out = {rid: _run(rid, raw) for rid, raw in zip(ids, done, strict=True) if raw is not None}
        opened = {rid: key for rid, key in zip(ids, keys, strict=True) if key is not None and rid not in out}
        out.update((r.run_id, r) for r in self._open_records(opened, timed=False))
        return out

    def runs(self, job: str, limit: int = 50) -> list[RunRecord]:
        if limit == 0:
            return []
        count = limit if limit > 0 else -1
        [members] = self._read(
            lambda pipe: pipe.zrevrangebylex(self._index(job), "(#}", "[#|", start=0, num=count)
        )
        ids = [m.split("|", 2)[2] for m in members]
        found = self._records(ids)
        return [found[rid] for rid in ids if rid in found]

    def run(self, run_id: str) -> RunRecord | None:
        return self._records([run_id]).get(run_id)

    def events(self, query: EventQuery) -> list[Event]:
        if query.limit == 0:
            return []
        limit = query.limit if query.limit > 0 else 2**62
        kinds = sorted({EventKind(k).value for k in query.kinds}) if query.kinds else None
        if query.run_id is not None:
            return self._run_events(query.run_id, query, kinds, limit)
        jobs = [query.job] if query.job is not None else self._ledger_jobs()
        picks = self._picks([self._index(job) for job in jobs], kinds or ["@"], query, limit)
        if query.newest_first:
            picks.sort(key=lambda pick: (-pick[0], pick[1]))
        else:
            picks.sort()
        seqs = [seq for _, seq in picks[:limit]]
        if not seqs:
            return []
        [raw] = self._read(lambda pipe: pipe.hmget(self._k_ev, seqs))
        return [_event(seq, rec) for seq, rec in zip(seqs, raw, strict=True) if rec is not None]

    def _ledger_jobs(self) -> list[str]:
        """Jobs with a ledger: the keys of the per-job counters, and the set
        that earlier versions of this store kept instead (read, no longer
        written, so that their jobs stay visible)."""
        counted, listed = self._read(
            lambda pipe: (pipe.hkeys(self._k_job_counts), pipe.smembers(self._k_ledger_jobs))
        )
        return sorted({*counted, *listed})

    def _run_events(self, run_id: str, query: EventQuery, kinds: list[str] | None, limit: int) -> list[Event]:
        # Members are ``run_id|seq``; a run id with "|" in it could match
        # another run's members, so records are checked below.
        # A run's first events and those its lease recorded are listed in the
        # field "r:<run id>" of the records hash; others in the run id index.
        members, linked = self._read(
            lambda pipe: (
                pipe.zrangebylex(self._k_ev_run, f"[{run_id}|", f"({run_id}}}"),
                pipe.hget(self._k_ev, f"r:{run_id}"),
            )
        )
        seqs = sorted({*(m.rpartition("|")[2] for m in members), *(linked.split(",") if linked else ())})
        if not seqs:
            return []
        [raw] = self._read(lambda pipe: pipe.hmget(self._k_ev, seqs))
        found = [
            e
            for e in (_event(seq, rec) for seq, rec in zip(seqs, raw, strict=True) if rec is not None)
            if e.run_id == run_id
            and (query.job is None or e.job == query.job)
            and (kinds is None or e.kind.value in kinds)
            and (query.since is None or e.at >= query.since)
        ]
        sign = -1 if query.newest_first else 1
        found.sort(key=lambda e: (sign * e.at, e.seq or 0))
        return found[:limit]

    def _picks(
        self, indexes: list[str], families: list[str], query: EventQuery, limit: int
    ) -> list[tuple[float, str]]:
        """(at, seq) of the first ``limit`` events of each family (``@`` for
        all by time, or a kind) in each job index, plus every event tied with
        the last one taken, so that ties can be ordered by seq as SQLite does
        (newest first is ``at`` descending, then ``seq`` ascending)."""
        low = "" if query.since is None else _ordhex(float(query.since))
        ranges = [(index, family) for index in indexes for family in families]

        def first(pipe: Pipeline) -> None:
            for index, family in ranges:
                if query.newest_first:
                    pipe.zrevrangebylex(index, f"({family}}}", f"[{family}|{low}", start=0, num=limit)
                else:
                    pipe.zrangebylex(index, f"[{family}|{low}", f"({family}}}", start=0, num=limit)

        members: list[str] = []
        edges: list[tuple[str, str, str]] = []
        for (index, family), got in zip(ranges, self._read(first) if ranges else [], strict=True):
            members += got
            if query.newest_first and len(got) == limit:
                edges.append((index, family, got[-1].split("|", 2)[1]))

        def ties(pipe: Pipeline) -> None:
            for index, family, hexat in edges:
                pipe.zrangebylex(index, f"[{family}|{hexat}|", f"({family}|{hexat}}}")

        if edges:
            for got in self._read(ties):
                members += got
        picks: dict[str, tuple[float, str]] = {}
        for member in members:
            _, hexat, seq = member.split("|", 3)[:3]
            picks[seq] = (_unordhex(hexat), seq)
        return list(picks.values())

    def lease(self, key: str) -> LeaseInfo | None:
        p = self.prefix

        def build(pipe: Pipeline) -> None:
            pipe.hmget(f"{p}lease:{key}", ["owner", "token", "pending", "revoked_by", "exp"])
            pipe.get(f"{p}live:{key}")
            pipe.pttl(f"{p}live:{key}")
            pipe.time()

        (owner, token, pending, revoked_by, exp), live, pttl, now = self._read(build, atomic=True)
        if token is None:
            return None
        return LeaseInfo(
            key=key,
            owner=owner,
            token=int(token),
            expires_in=None if owner is None else _expires_in(owner, owner, exp, live, pttl, _ms(now)),
            pending=int(pending or 0),
            revoked_by=revoked_by or None,  # '' is "not revoked"
        )

    def save_job(self, job: JobInfo) -> None:
        record = json.dumps(job._asdict(), separators=(",", ":"))
        self._read(lambda pipe: pipe.hset(self._k_jobs, job.name, record))

    def jobs(self) -> list[JobInfo]:
        [raw] = self._read(lambda pipe: pipe.hgetall(self._k_jobs))
        return [JobInfo(**json.loads(raw[name])) for name in sorted(raw)]

    def job(self, name: str) -> JobInfo | None:
        [raw] = self._read(lambda pipe: pipe.hget(self._k_jobs, name))
        return None if raw is None else JobInfo(**json.loads(raw))

    # -- the outbox -------------------------------------------------------

    def _outbox_keys(self, sink: str) -> list[str]:
        return [self._k_ev, f"{self.prefix}outbox:{sink}:mark", f"{self.prefix}outbox:{sink}:acks"]

    def undelivered(self, sink: str, limit: int, *, backfill: float = NEW_SINK_BACKFILL) -> list[Event]:
        if limit < 1:
            return []
        keys = self._outbox_keys(sink)
        reply = self._eval(self._undelivered, keys, [str(limit)])
        if reply is None:
            self._register(sink, backfill)
            reply = self._eval(self._undelivered, keys, [str(limit)])
        return [_event(reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]

    def mark_delivered(self, sink: str, event_ids: Sequence[str]) -> None:
        ids = list(dict.fromkeys(event_ids))
        if not ids:
            return
        keys = self._outbox_keys(sink)
        if self._eval(self._mark_delivered, keys, ids) is None:
            self._register(sink, NEW_SINK_BACKFILL)
            self._eval(self._mark_delivered, keys, ids)

    def _register(self, sink: str, backfill: float) -> None:
        """A new sink's mark: just before the first event, in seq order, whose
        ``at`` is within ``backfill`` of now (the counter if none). Reads the
        events of that window once, per sink name; ``SET NX`` keeps the first
        registration if two race."""
        cutoff = _ordhex(self._clock.wall() - backfill)
        jobs = self._ledger_jobs()
        [top] = self._read(lambda pipe: pipe.hget(self._k_ev, "seq"))
        indexes = [self._index(job) for job in jobs]
        found = self._read(lambda pipe: [pipe.zrangebylex(i, f"[@|{cutoff}", "(@}") for i in indexes])
        seqs = [int(m.split("|", 3)[2]) for members in found for m in members]
        mark = min(seqs) - 1 if seqs else int(top or 0)
        self._read(lambda pipe: pipe.set(self._outbox_keys(sink)[1], str(mark), nx=True))

    def close(self) -> None:
        with self._renewers_lock:
            for client in self._renewers.values():
                client.connection_pool.disconnect()
            self._renewers.clear()
        with self._kept_lock:
            conn, pid = self._kept
            if conn is not None and pid == os.getpid():
                self._client.connection_pool.release(conn)
            self._kept = (None, 0)
        if self._owns_client:
            self._client.close()


# -- values ---------------------------------------------------------------


def _resp(parts: list[str]) -> bytes:
    """A command in RESP, as redis-py's ``pack_command`` would write it (for
    these arguments, all text) at a fifth of its CPU: it is most of the
    client's cost of a call. Lengths are in bytes: one string and one encode
    when all is ASCII, as it mostly is."""
    text = "".join([f"${len(part)}\r\n{part}\r\n" for part in parts])
    if text.isascii():
        return f"*{len(parts)}\r\n{text}".encode()
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part.encode()
        out += (b"$%d\r\n" % len(data), data, b"\r\n")
    return b"".join(out)


_PLAIN = re.compile(r"[ !#-\[\]-~]*")
"""Printable ASCII but the quote and the backslash: a JSON string as it is."""


def _jstr(text: str) -> str:
    """``text`` as a JSON string; most texts here (job names, run ids) need
    no escaping, and skipping ``json.dumps`` for them is most of the cost."""
    return f'"{text}"' if _PLAIN.fullmatch(text) else json.dumps(text)


def _retention(runs_per_job: int, events_per_job: int) -> dict[str, int]:
    """The retention constants the scripts are written with. Trims go in
    batches so that most calls only count; a job's retention is checked
    every ``check`` events written, so each limit is exceeded by at most
    that many between checks (exact when a limit is below 16)."""
    runs_batch, events_batch = min(32, runs_per_job // 8), min(32, events_per_job // 8)
    return {
        "runs_max": runs_per_job,
        "events_max": events_per_job,
        "runs_batch": runs_batch,
        "events_batch": events_batch,
        "check": max(1, min(runs_batch, events_batch)),
    }


def _pack(*fields: str) -> str:
    return SEP.join(fields) + SEP


def _ttl_ms(ttl: float) -> int:
    return max(1, round(ttl * 1000))


def _ms(time_reply: tuple[int, int]) -> int:
    seconds, micros = time_reply
    return int(seconds) * 1000 + int(micros) // 1000


def _expires_in(
    run_id: str, owner: str | None, exp: str | None, live: str | None, pttl: int, now_ms: int
) -> float | None:
    """Seconds left on ``run_id``'s lease; negative once it has expired, None
    when the lease is no longer this run's."""
    if owner != run_id:
        return None
    if live == owner and pttl >= 0:
        # PTTL rounds down: a key with 0 ms left is still live for up to a
        # millisecond, and must not read as expired.
        return max(pttl, 0.5) / 1000
    # Expired: the live key is gone, the hash remembers when.
    return min((int(exp) - now_ms) / 1000 if exp else -0.001, -0.001)


def _ordhex(x: float) -> str:
    """``x`` as 16 hex digits whose string order is the numeric order, so a
    lexicographic index can hold times exactly."""
    (bits,) = struct.unpack(">Q", struct.pack(">d", x + 0.0))
    bits = bits ^ 0xFFFF_FFFF_FFFF_FFFF if bits >> 63 else bits | 1 << 63
    return f"{bits:016x}"


def _unordhex(text: str) -> float:
    bits = int(text, 16)
    bits = bits ^ 1 << 63 if bits >> 63 else bits ^ 0xFFFF_FFFF_FFFF_FFFF
    value: float = struct.unpack(">d", struct.pack(">Q", bits))[0]
    return value


def _run(run_id: str, raw: str) -> RunRecord:
    rec: dict[str, Any] = json.loads(raw)
    return RunRecord(
        run_id=run_id,
        job=rec["job"],
        key=rec["key"],
        host=rec["host"],
        pid=rec["pid"],
        token=rec["token"],
        slot=None if rec["slot"] is None else float(rec["slot"]),
        started_at=float(rec["started_at"]),
        ended_at=float(rec["ended_at"]),
        outcome=Outcome(rec["outcome"]),
        exit_code=rec["exit_code"],
        detail=rec["detail"],
    )


def _event(seq: str, raw: str) -> Event:
    rec = json.loads(raw)
    return Event(
        seq=int(seq),
        event_id=rec["i"],
        kind=EventKind(rec["k"]),
        job=rec["j"],
        run_id=rec["r"],
        at=float(rec["a"]),
        data=rec["d"],
    )


def _positive_int(url: str, text: str | None, name: str, default: int) -> int:
    if text is None:
        return default
    if not text.isdigit() or int(text) < 1:
        raise StoreUrlError(url, f"{name} must be a whole number of at least 1, got {text!r}")
    return int(text)


def _timeout(url: str, text: str | None, name: str) -> float:
    if text is None:
        return DEFAULT_TIMEOUT
    try:
        seconds = parse_duration(text, what=name)
    except UsageError as e:
        raise StoreUrlError(url, str(e)) from None
    if seconds <= 0:
        raise StoreUrlError(url, f"{name} must be greater than zero, got {text!r}")
    return seconds
