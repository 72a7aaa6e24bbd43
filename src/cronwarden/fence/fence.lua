-- Advance the fence KEYS[1] to token ARGV[1] alone (a fenced read, or a
-- fence taken before writes made elsewhere). Returns {1} or {0, newest}.
local stale = fence(KEYS[1], ARGV[1])
if stale then return {0, string.format('%d', stale)} end
return {1}
