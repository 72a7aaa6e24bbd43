-- Shared by undelivered and mark_delivered. A sink's outbox is the ledger
-- above its mark minus its acknowledged set. Scripts append events one at a
-- time and number them in the same step, so seq order is commit order and
-- the mark needs no settling. Seqs are dense: the scripts walk the records
-- hash by seq (a trimmed record reads as nil and is passed over), so the
-- outbox costs no write per event.
local CHUNK = 256

-- Calls visit(seq, record) for each record above `from` up to the counter,
-- a chunk at a time, until visit returns true. Returns the counter.
local function walk(evk, from, visit)
  local top = tonumber(redis.call('HGET', evk, 'seq') or '0')
  local pos = from + 1
  while pos <= top do
    local last = math.min(top, pos + CHUNK - 1)
    local fields = {}
    for q = pos, last do fields[#fields + 1] = string.format('%012d', q) end
    local records = redis.call('HMGET', evk, unpack(fields))
    for i = 1, #fields do
      if records[i] and visit(fields[i], records[i]) then return top end
    end
    pos = last + 1
  end
  return top
end

local function acked_above(acksk, mark)
  local acked = {}
  for _, seq in ipairs(redis.call('ZRANGEBYSCORE', acksk, '(' .. mark, '+inf')) do acked[seq] = true end
  return acked
end
