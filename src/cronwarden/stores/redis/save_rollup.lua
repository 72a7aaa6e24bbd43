-- types: hash hash hash
-- Store.rebuild_rollups: one job's rebuilt rollup, written only if its
-- summary is still the one the rebuild saw before it read the ledger.
-- KEYS: 1 summaries, 2 durations, 3 windows (rollup.lua)
-- ARGV: 1 job, 2 the summary seen ('' for none), 3 summary, 4 durations, 5 window
if (redis.call('HGET', KEYS[1], ARGV[1]) or '') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[5])
return 1
