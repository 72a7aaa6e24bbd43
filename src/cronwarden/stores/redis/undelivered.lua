-- with: outbox
-- types: hash string zset set
-- Store.undelivered: up to `limit` events above the sink's mark it has not
-- acknowledged, as seq, record pairs; false for a sink not registered yet.
-- The sink is listed among the registered ones (retention settles each).
-- KEYS: 1 event records, 2 the sink's mark, 3 its acknowledged set, 4 the sinks.
-- ARGV: 1 limit, 2 the sink
local mark = redis.call('GET', KEYS[2])
if not mark then return false end
redis.call('SADD', KEYS[4], ARGV[2])
local limit = tonumber(ARGV[1])
local acked = acked_above(KEYS[3], mark)
local out = {}
walk(KEYS[1], tonumber(mark), function(seq, record)
  if not acked[seq] then
    out[#out + 1] = seq
    out[#out + 1] = record
  end
  return #out >= 2 * limit
end)
return out
