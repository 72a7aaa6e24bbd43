-- with: limits, rollup, ledger
-- types: zset hash zset hash hash string hash hash hash
-- Store.record: one event, once per event id.
-- KEYS: 1 job index, 2 event records, 3 run id index, 4 jobs -> events written, 5 finished runs,
--       6 the event id's mark (recorded ids are remembered, so that a retried record is a no-op),
--       7-9 rollups (rollup.lua)
-- ARGV[1]: a JSON array of texts: 1 event id, 2 kind, 3 job, 4 run id ('' for none), 5 at, 6 athex,
--          7 data, 8 how long the mark is kept, ms
if redis.call('EXISTS', KEYS[6]) == 1 then return 0 end
ROLLUPS = {KEYS[7], KEYS[8], KEYS[9]}
local a = cjson.decode(ARGV[1])
local run_id = a[4] ~= '' and a[4] or false
add_event(KEYS[1], a[1], a[2], a[3], run_id, a[5], a[6], a[7])
flush(KEYS[2], KEYS[3], KEYS[4], KEYS[5])
-- Last: a script that fails half-way keeps its writes, and a mark without
-- its event would turn the retry into a loss.
redis.call('SET', KEYS[6], '1', 'PX', a[8])
return 1
