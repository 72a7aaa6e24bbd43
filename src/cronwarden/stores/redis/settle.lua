-- with: outbox
-- types: hash string zset
-- Retention's step for one sink's outbox (Store.prune, after the ledger's):
-- move the sink's mark over the records deleted just above it, at most
-- `budget` seqs, and forget the acknowledgements below the new mark. A sink
-- that acknowledged nothing for longer than the retention (its receiver
-- down for good, a sink taken out of the config) then keeps no
-- acknowledgements of deleted events, and its next read of the outbox walks
-- no deleted records. The mark passes only records that are gone, as an
-- acknowledgement would (outbox.lua): never an event still to deliver.
-- KEYS: 1 event records, 2 the sink's mark, 3 its acknowledged set.
-- ARGV: 1 budget (seqs). Returns {seqs passed, 1 if the budget ran out first}.
local mark = redis.call('GET', KEYS[2])
if not mark then return {0, 0} end
mark = tonumber(mark)
local top = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
local last = math.min(top, mark + tonumber(ARGV[1]))
local new, found = mark, false
local pos = mark + 1
while pos <= last and not found do
  local upto = math.min(last, pos + CHUNK - 1)
  local fields = {}
  for q = pos, upto do fields[#fields + 1] = string.format('%012d', q) end
  local records = redis.call('HMGET', KEYS[1], unpack(fields))
  for i = 1, #fields do
    if records[i] then found = true; break end
    new = pos + i - 1
  end
  pos = upto + 1
end
if new > mark then
  redis.call('SET', KEYS[2], string.format('%d', new))
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', new)
end
local more = 0
if not found and new < top then more = 1 end
return {new - mark, more}
