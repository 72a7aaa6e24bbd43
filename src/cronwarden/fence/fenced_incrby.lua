-- INCRBY KEYS[2] ARGV[2] if token ARGV[1] passes the fence KEYS[1].
-- Returns {1, the new value} or {0, newest}.
local stale = fence(KEYS[1], ARGV[1])
if stale then return {0, string.format('%d', stale)} end
return {1, redis.call('INCRBY', KEYS[2], ARGV[2])}
