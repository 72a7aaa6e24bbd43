-- with: fence
-- types: hash string ...
-- Store.renew_many: renew.lua for each lease of one heartbeat, in one script.
-- KEYS: the leases' hash and live key, in pairs (2i-1, 2i).
-- ARGV: 1 the leases' run ids then their ttls in ms, as one JSON array (one
-- argument costs the client far less than 2n).
-- Returns a string with one character per lease, in order: '1' renewed, '0'
-- lost, 'r' revoked; then, for each revoked lease, the run that revoked it.
local n = #KEYS / 2
local args = cjson.decode(ARGV[1])
local now = now_ms()
local out, revokers = {}, {}
for i = 1, n do
  local lease, owner, ttl = KEYS[2 * i - 1], args[i], args[n + i]
  local h = redis.call('HMGET', lease, 'owner', 'revoked_by')
  if h[1] ~= owner then
    out[i] = '0'
  elseif h[2] and h[2] ~= '' then
    out[i] = 'r'
    revokers[#revokers + 1] = h[2]
  -- The hash names this run, so the live key, if it is still there, is this
  -- grant's (every grant sets both): PEXPIRE answers 0 once it has expired.
  elseif redis.call('PEXPIRE', KEYS[2 * i], ttl) == 1 then
    redis.call('HSET', lease, 'exp', string.format('%d', now + ttl))
    out[i] = '1'
  else
    out[i] = '0'
  end
end
table.insert(revokers, 1, table.concat(out))
return revokers
