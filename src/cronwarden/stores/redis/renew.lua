-- with: fence
-- types: hash string
-- Store.renew: extend the owner's live key by the server's clock.
-- KEYS: 1 lease, 2 live. ARGV: 1 run id, 2 ttl ms
local h = redis.call('HMGET', KEYS[1], 'owner', 'revoked_by')
-- The owner field first: a released lease's live key is left to expire.
if h[1] ~= ARGV[1] then return {'lost'} end
if h[2] and h[2] ~= '' then return {'revoked', h[2]} end
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {'lost'} end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
-- exp: the expiry, for the read side to report once the live key is gone.
redis.call('HSET', KEYS[1], 'exp', string.format('%d', now_ms() + tonumber(ARGV[2])))
return {'ok'}
