-- with: outbox
-- types: hash string zset
-- Store.mark_delivered: acknowledge events by id, move the mark over the
-- acknowledged prefix and prune the set below it; false for a sink not
-- registered yet.
-- KEYS: 1 event records, 2 the sink's mark, 3 its acknowledged set. ARGV: event ids
local mark = redis.call('GET', KEYS[2])
if not mark then return false end
local want = {}
for _, id in ipairs(ARGV) do want[id] = true end
acknowledge(KEYS[1], KEYS[2], KEYS[3], tonumber(mark), want)
return 1
