-- with: fence
-- Store.renew_many: renew.lua for each lease of one heartbeat, in one script.
-- KEYS: the leases' hash and live key, in pairs (2i-1, 2i).
-- ARGV: the leases' run ids, then their ttls in ms (ARGV[n + i]).
-- Returns one entry per lease, in order: 1 renewed, 0 lost, or the run id
-- that revoked it.
local n = #KEYS / 2
local now = now_ms()
local out = {}
for i = 1, n do
  local lease, live, owner, ttl = KEYS[2 * i - 1], KEYS[2 * i], ARGV[i], ARGV[n + i]
  local h = redis.call('HMGET', lease, 'owner', 'revoked_by')
  if h[1] ~= owner then
    out[i] = 0
  elseif h[2] and h[2] ~= '' then
    out[i] = h[2]
  elseif redis.call('GET', live) ~= owner then
    out[i] = 0
  else
    redis.call('PEXPIRE', live, ttl)
    redis.call('HSET', lease, 'exp', string.format('%d', now + tonumber(ttl)))
    out[i] = 1
  end
end
return out
