-- The fence check every fenced Redis script starts with (prepended to each
-- script). KEYS[1] is the fence key, ARGV[1] the writer's token. Tokens
-- are compared as Lua numbers: exact up to 2^53, and cronwarden's tokens
-- (counters, or the server's clock in microseconds) stay far below.
-- Returns nil when the token may write (the fence now holds it), else the
-- newest token the fence has seen.
local function fence(fence_key, token_text)
  local token = tonumber(token_text)
  local newest = tonumber(redis.call('GET', fence_key) or '')
  if newest and token < newest then
    return newest
  end
  if newest ~= token then
    redis.call('SET', fence_key, token_text)
  end
  return nil
end
