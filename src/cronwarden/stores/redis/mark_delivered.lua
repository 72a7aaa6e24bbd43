-- with: outbox
-- Store.mark_delivered: acknowledge events by id, move the mark over the
-- acknowledged prefix and prune the set below it; false for a sink not
-- registered yet.
-- KEYS: 1 event records, 2 the sink's mark, 3 its acknowledged set. ARGV: event ids
local mark = redis.call('GET', KEYS[2])
if not mark then return false end
mark = tonumber(mark)
local want, left = {}, 0
for _, id in ipairs(ARGV) do
  if not want[id] then want[id] = true; left = left + 1 end
end
local acked = acked_above(KEYS[3], mark)
local add, gap = {}, false
local top = walk(KEYS[1], mark, function(seq, record)
  local id = string.match(record, '^{"i":"([^"]*)"')
  if not id or string.find(id, '\\', 1, true) then id = cjson.decode(record).i end
  if want[id] then
    want[id] = nil
    left = left - 1
    if not acked[seq] then
      acked[seq] = true
      add[#add + 1] = tonumber(seq)
      add[#add + 1] = seq
    end
  end
  if not gap and not acked[seq] then gap = tonumber(seq) end
  return left == 0 and gap
end)
if #add > 0 then redis.call('ZADD', KEYS[3], unpack(add)) end
-- The mark moves over the acknowledged prefix (and over trimmed records).
local new = top
if gap then new = gap - 1 end
if new > mark then
  redis.call('SET', KEYS[2], string.format('%d', new))
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', new)
end
return 1
