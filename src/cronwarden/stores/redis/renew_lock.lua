-- types: string
-- Store.renew_lock: extend the lock iff the owner holds it.
-- KEYS: 1 the lock. ARGV: 1 owner, 2 ttl ms
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
