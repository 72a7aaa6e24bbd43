-- SET KEYS[2] ARGV[2] if token ARGV[1] passes the fence KEYS[1].
-- ARGV[3]: expiry in ms, or '' for none. Returns {1} or {0, newest}.
local stale = fence(KEYS[1], ARGV[1])
if stale then return {0, string.format('%d', stale)} end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
else
  redis.call('SET', KEYS[2], ARGV[2])
end
return {1}
