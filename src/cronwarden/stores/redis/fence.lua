-- The server's clock and identity, and the fencing rule (see the store's
-- module docstring). Shared by the scripts that grant.

-- The server's clock: ms, and the TIME reply.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end

-- The run_id of the server process executing this script. Asked here, not by
-- the client: the script runs on whichever connection the pool hands out,
-- and only the script itself knows which process runs it. A restart, a
-- restored snapshot or a failover shows as another id.
local function server_id()
  return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
end

-- The token after old_token (nil: none stored), which server old_srv granted:
-- one more while the same server process answers, else at least the server's
-- clock in microseconds. Returns the token as text, the time in ms and the
-- server's id.
local function fence(old_token, old_srv)
  local srv = server_id()
  local ms, t = now_ms()
  local token = old_token and tonumber(old_token) + 1
  if not token or old_srv ~= srv then
    local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if not token or us > token then token = us end
  end
  return string.format('%d', token), ms, srv
end
