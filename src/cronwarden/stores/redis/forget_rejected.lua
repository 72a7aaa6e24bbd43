-- types: hash zset set
-- Store.forget_rejected: take events out of the sink's dead letters by id,
-- and the sink out of the set of sinks with dead letters once it has none.
-- KEYS: 1 event records, 2 the sink's dead letters, 3 the sinks with dead letters.
-- ARGV: 1 the sink, then the event ids
local want = {}
for i = 2, #ARGV do want[ARGV[i]] = true end
local seqs = redis.call('ZRANGE', KEYS[2], 0, -1)
local drop = {}
for from = 1, #seqs, 256 do
  local chunk = {}
  for i = from, math.min(#seqs, from + 255) do chunk[#chunk + 1] = seqs[i] end
  local records = redis.call('HMGET', KEYS[1], unpack(chunk))
  for i, seq in ipairs(chunk) do
    local record = records[i]
    if record then
      local id = string.match(record, '^{"i":"([^"]*)"')
      if not id or string.find(id, '\\', 1, true) then id = cjson.decode(record).i end
      if want[id] then drop[#drop + 1] = seq end
    end
  end
end
for from = 1, #drop, 256 do
  redis.call('ZREM', KEYS[2], unpack(drop, from, math.min(#drop, from + 255)))
end
if redis.call('ZCARD', KEYS[2]) == 0 then redis.call('SREM', KEYS[3], ARGV[1]) end
return #drop
