-- with: fence
-- types: string hash
-- Store.lock: the bare lock, no ledger. The owner is the value of a key with
-- PX, as any Redis lock; the fencing counter is a hash of server run id ->
-- last token, so a grant under a server process that has not granted this
-- key before (a restart, a failover, a restored snapshot) starts from the
-- server's clock like a job's lease does.
-- KEYS: 1 the lock (owner, PX), 2 its counter. ARGV: 1 owner, 2 ttl ms
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
local srv, us = server()
local token = redis.call('HINCRBY', KEYS[2], srv, 1)
if token == 1 then
  -- No grant yet under this server process: one more than any other
  -- process's counter, and at least the server's clock in microseconds.
  token = us
  for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
    if tonumber(v) >= token then token = tonumber(v) + 1 end
  end
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], srv, string.format('%d', token))
end
return string.format('%d', token)
