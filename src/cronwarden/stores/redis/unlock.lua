-- types: string
-- Store.unlock: release the lock iff the owner holds it.
-- KEYS: 1 the lock. ARGV: 1 owner
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
