-- with: limits, rollup, ledger
-- types: hash string zset hash zset hash hash string hash hash hash
-- Store.request_stop: mark the run's live lease revoked by a stop request,
-- unless a replacing start marked it first (a standing stop mark is kept),
-- and record the request as record.lua does.
-- KEYS: 1 lease, 2 live, then record.lua's keys: 3 job index, 4 event records,
--       5 run id index, 6 jobs -> events written, 7 finished runs, 8 the event
--       id's mark, 9-11 rollups
-- ARGV: 1 run id, 2 the stop mark, 3 record.lua's ARGV[1]
local h = redis.call('HMGET', KEYS[1], 'owner', 'revoked_by')
if h[1] ~= ARGV[1] or redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
local revoked = h[2] or ''
if revoked ~= '' and string.sub(revoked, 1, 5) ~= 'stop:' then return 0 end
if revoked == '' then redis.call('HSET', KEYS[1], 'revoked_by', ARGV[2]) end
if redis.call('EXISTS', KEYS[8]) == 1 then return 1 end
ROLLUPS = {KEYS[9], KEYS[10], KEYS[11]}
local a = cjson.decode(ARGV[3])
local run_id = a[4] ~= '' and a[4] or false
add_event(KEYS[3], a[1], a[2], a[3], run_id, a[5], a[6], a[7])
flush(KEYS[4], KEYS[5], KEYS[6], KEYS[7])
redis.call('SET', KEYS[8], '1', 'PX', a[8])
return 1
