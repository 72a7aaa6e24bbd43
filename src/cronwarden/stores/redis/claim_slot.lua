-- types: string
-- Store.claim_slot: the first owner of a fire time, kept with PX, so it is
-- forgotten by the server's clock; nothing else is written.
-- KEYS: 1 the claim. ARGV: 1 owner, 2 keep ms
local held = redis.call('GET', KEYS[1])
if held then return held end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
