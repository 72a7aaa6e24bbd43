-- with: limits, fence, rollup, ledger
-- types: hash string hash hash zset hash zset hash hash hash hash hash string
-- Store.acquire: judge the lease by the server's clock, record an expired
-- owner abandoned, grant with the next token, or act by the policy.
-- KEYS: 1 lease, 2 live, 3 open runs, 4 finished runs, 5 job index, 6 event records,
--       7 run id index, 8 jobs -> events written, 9-11 rollups (rollup.lua), and for policy allow:
--       12 side lease, 13 side live
-- ARGV[1]: a JSON array of texts: 1-11 the start (read_start), 12 policy, 13 max_pending,
--          14 a second event id, 15 side key
ROLLUPS = {KEYS[9], KEYS[10], KEYS[11]}
local a = cjson.decode(ARGV[1])
local s = read_start(a, 1)
local policy, eid2 = a[12], a[14]
local h = redis.call('HMGET', KEYS[1], 'owner', 'token', 'srv', 'pending', 'job', 'host', 'pid', 'started',
  'slot', 'revoked_by', 'rseq', 'sid')
local owner = h[1]
-- Every grant sets the owner field and the live key in one script, and a
-- release removes the owner field: while there is an owner, the live key
-- names it if it exists, so its PTTL says it all.
local pttl = -2
if owner then pttl = redis.call('PTTL', KEYS[2]) end
local live = pttl ~= -2

-- This very call again (redis-py retried it after a lost reply): the lease
-- is this run's by this start's `started` (its event id), so answer the grant.
if live and owner == s.run_id and h[12] == s.eid then return {'G', h[2], ''} end

-- This very call again after the lease changed since its first try (the
-- holder released it, it expired): answer what the first try did, from the
-- events it recorded under this call's event ids, never a second decision.
local prior = redis.call('HGET', KEYS[6], 'r:' .. s.run_id)
if prior then
  local started, refused = nil, nil
  for seq in string.gmatch(prior, '%d+') do
    local rec = redis.call('HGET', KEYS[6], seq) or ''
    local i = string.match(rec, '^{"i":("[^"]*")')
    if i == jstr(s.eid) then started = rec elseif i == jstr(eid2) then refused = rec end
  end
  if refused then
    -- Strings through cjson (exact), numbers as the record's own text (cjson
    -- would round them to 14 digits).
    local d = cjson.decode(refused).d
    local function number(name) return string.match(refused, ',"' .. name .. '":([-%d.eE+]+)') end
    local kind = string.match(refused, '"k":"([%w_]+)"')
    local left = (live and owner == d.holder_run_id) and pttl or 0
    return {kind == 'overlap' and 'O' or 'R', kind == 'overlap' and '1' or kind, d.holder_run_id,
      d.holder_host, number('holder_pid'), number('holder_started_at'), number('holder_token'), left}
  end
  if started then
    -- Granted by the first try; if the lease has moved on since, the run
    -- learns it at its first renewal, as any holder would.
    return {'G', string.match(started, ',"token":(%d+)'), ''}
  end
end

if not live then
  local abandoned = ''
  -- An expired owner still in the open runs has no terminal record yet: it gets one, abandoned.
  if owner and redis.call('HDEL', KEYS[3], owner) == 1 then
    local ending = '"outcome":"abandoned","ended_at":' .. s.at .. ',"exit_code":null,"detail":'
      .. jstr('lease expired with no terminal record; found by run ' .. s.run_id)
    redis.call('HSET', KEYS[4], owner, run_record(h[5] or s.job, s.key, h[6] or '?', h[7] or '0', h[2],
      h[9] or 'null', h[8] or s.at, ending))
    add_event(KEYS[5], eid2, 'abandoned', s.job, owner, s.at, s.athex,
      '{"found_by":' .. jstr(s.run_id) .. '}', h[11] ~= '' and h[11] or nil, {h[8] or s.at, s.key})
    abandoned = owner
  end
  local ts = grant(KEYS[1], KEYS[2], KEYS[3], KEYS[5], h[2], h[3], s, true)
  flush(KEYS[6], KEYS[7], KEYS[8], KEYS[4])
  return {'G', ts, abandoned}
end

local hhost, hpid, hstarted, htoken = h[6] or '?', h[7] or '0', h[8] or '0', h[2] or '0'

if policy == 'replace' then
  -- No event: the holder records `replaced` when its next renew is refused.
  if (h[10] or '') == '' then redis.call('HSET', KEYS[1], 'revoked_by', s.run_id) end
  return {'R', 'revoking', owner, hhost, hpid, hstarted, htoken, pttl}
end

-- What a refusal or an overlap records of the holder and of this start.
local data = '{"holder_run_id":' .. jstr(owner) .. ',"holder_host":' .. jstr(hhost) .. ',"holder_pid":' .. hpid
  .. ',"holder_started_at":' .. hstarted .. ',"holder_age":'
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
  start_run(KEYS[12], KEYS[13], KEYS[3], KEYS[5], side, '1',
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
    kind, data = 'queued', data .. ',"pending":' .. (pending + 1)
  else
    kind, data = 'queue_full', data .. ',"pending":' .. pending
  end
end
add_event(KEYS[5], eid2, kind, s.job, s.run_id, s.at, s.athex, data .. '}', 'new')
flush(KEYS[6], KEYS[7], KEYS[8], KEYS[4])
return {'R', kind, owner, hhost, hpid, hstarted, htoken, pttl}
