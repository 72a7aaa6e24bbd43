-- The server's clock and identity, and the fencing rule (see the store's
-- module docstring). Shared by the scripts that grant.

-- The server's clock in ms.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The run_id of the server process executing this script, and its clock in
-- microseconds, from one INFO (its server_time_usec; TIME on a server older
-- than 6.2, which has none). Asked here, not by the client: the script runs
-- on whichever connection the pool hands out, and only the script knows
-- which process runs it. A restart, a restored snapshot or a failover shows
-- as another id.
local function server()
  local info = redis.call('INFO', 'server')
  local us = tonumber(string.match(info, 'server_time_usec:(%d+)') or '')
  if not us then
    local t = redis.call('TIME')
    us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return string.match(info, 'run_id:(%x+)') or '', us
end

-- The token after old_token (nil: none stored), which server old_srv granted:
-- one more while the same server process answers, else at least the server's
-- clock in microseconds. Returns the token as text, the time in ms and the
-- server's id.
local function fence(old_token, old_srv)
  local srv, us = server()
  local token = old_token and tonumber(old_token) + 1
  if not token or old_srv ~= srv then
    if not token or us > token then token = us end
  end
  return string.format('%d', token), math.floor(us / 1000), srv
end
