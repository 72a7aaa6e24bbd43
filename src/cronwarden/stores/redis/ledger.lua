-- Shared by the scripts that write the ledger (acquire, finish, record):
-- retention, the rollups (rollup.lua, before this part), the event writes collected and flushed once per script, and a
-- run's start. The limits (RUNS_MAX, EVENTS_MAX, RUNS_BATCH, EVENTS_BATCH,
-- CHECK) are defined before it.
--
-- Numbers that must stay exact (times, tokens) travel as text: Lua formats
-- numbers it passes to redis.call with "%.14g", and cjson.encode rounds to 14
-- digits, which would cut microseconds off a timestamp. So JSON is assembled
-- by concatenation from the client's own number texts, and strings are
-- quoted with cjson.encode (exact for strings).
--
-- The job index (a sorted set, every score 0, read by lex ranges) holds:
--   '#|' .. t .. '|' .. run_id                           runs by start
--   '@|' .. t .. '|' .. seq .. '|' .. kind .. '|' .. run_id   events by time
--   kind .. '|' .. t .. '|' .. seq                       events by kind
-- t is a time as 16 hex digits in numeric order (the client's ordhex).

-- Retention is per job, so every key trimmed is one the call declared.
local function trim_events(index, evk, runk)
  local n = redis.call('ZLEXCOUNT', index, '[@|', '(@}')
  if n <= EVENTS_MAX then return end
  local old = redis.call('ZRANGEBYLEX', index, '[@|', '(@}', 'LIMIT', 0,
    math.min(n - EVENTS_MAX + EVENTS_BATCH, 1000))
  local drop, seqs, runs, seen = {}, {}, {}, {}
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

local jstr = cjson.encode

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
-- ends: for a terminal event, {the run's start, its lease key} (the rollup's).
local function add_event(index, eid, kind, job, run_id, at, athex, data, link, ends)
  EVENTS[#EVENTS + 1] = {index, eid, kind, job, run_id, at, athex, data, link, ends}
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
      local index, eid, kind, job, run_id, at, athex, data, link = unpack(e, 1, 9)
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
  rollup_apply(EVENTS)
  for job, c in pairs(per_job) do
    local total = redis.call('HINCRBY', jobsk, job, c[2])
    if math.floor(total / CHECK) ~= math.floor((total - c[2]) / CHECK) then
      trim_runs(c[1], runsk)
      trim_events(c[1], evk, runk)
    end
  end
end

-- A start's 11 fields from a[i] on (the client's _start_fields order).
local function read_start(a, i)
  return {run_id = a[i], job = a[i + 1], key = a[i + 2], host = a[i + 3], pid = a[i + 4], ttl_ms = a[i + 5],
    ttl = a[i + 6], at = a[i + 7], athex = a[i + 8], slot = a[i + 9], eid = a[i + 10]}
end

-- A finished run's record, from the start its lease kept and how it ended.
local function run_record(job, key, host, pid, token, slot, started, ending)
  return '{"job":' .. jstr(job) .. ',"key":' .. jstr(key) .. ',"host":' .. jstr(host) .. ',"pid":' .. pid
    .. ',"token":' .. token .. ',"slot":' .. slot .. ',"started_at":' .. started .. ',' .. ending .. '}'
end

-- Start run s on lease hash lk with token ts: the live key, the open entry,
-- the run's index entry and `started`; the lease hash (owner, token, the
-- run's start, and `sid`, the id of its `started`: a retried call is known
-- by it) is written by flush. new: whether these are the run's first events
-- (see add_event).
local function start_run(lk, livek, openk, index, s, ts, extra, new)
  LEASE = {lk, 'owner', s.run_id, 'token', ts, 'job', s.job, 'host', s.host, 'pid', s.pid,
    'started', s.at, 'slot', s.slot, 'revoked_by', '', 'sid', s.eid, unpack(extra)}
  LEASE.run_id, LEASE.linked = s.run_id, new
  redis.call('SET', livek, s.run_id, 'PX', s.ttl_ms)
  redis.call('HSET', openk, s.run_id, s.key)
  add_member(index, '#|' .. s.athex .. '|' .. s.run_id)
  add_event(index, s.eid, 'started', s.job, s.run_id, s.at, s.athex, '{"host":' .. jstr(s.host)
    .. ',"pid":' .. s.pid .. ',"token":' .. ts .. ',"key":' .. jstr(s.key) .. ',"slot":' .. s.slot
    .. ',"ttl":' .. s.ttl .. '}', new and 'new' or nil)
end

-- Grant lease lk to run s, fenced after the stored token (fence.lua).
local function grant(lk, livek, openk, index, old_token, old_srv, s, new)
  local ts, ms, srv = fence(old_token, old_srv)
  local exp = string.format('%d', ms + tonumber(s.ttl_ms))
  start_run(lk, livek, openk, index, s, ts, {'srv', srv, 'exp', exp}, new)
  return ts
end
