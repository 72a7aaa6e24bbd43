-- Shared by undelivered, mark_delivered and reject. A sink's outbox is the ledger
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

-- Acknowledges the events with the given ids (a table of id -> true) on
-- the sink whose mark is `mark`, moves the mark over the acknowledged
-- prefix (and over trimmed records) and prunes the set below it. Returns
-- the seqs of the ids it found above the mark, by id.
local function acknowledge(evk, markk, acksk, mark, want)
  local left = 0
  for _ in pairs(want) do left = left + 1 end
  local found = {}
  local acked = acked_above(acksk, mark)
  local add, gap = {}, false
  local top = walk(evk, mark, function(seq, record)
    local id = string.match(record, '^{"i":"([^"]*)"')
    if not id or string.find(id, '\\', 1, true) then id = cjson.decode(record).i end
    if want[id] then
      want[id] = nil
      left = left - 1
      found[id] = seq
      if not acked[seq] then
        acked[seq] = true
        add[#add + 1] = tonumber(seq)
        add[#add + 1] = seq
      end
    end
    if not gap and not acked[seq] then gap = tonumber(seq) end
    return left == 0 and gap
  end)
  if #add > 0 then redis.call('ZADD', acksk, unpack(add)) end
  local new = top
  if gap then new = gap - 1 end
  if new > mark then
    redis.call('SET', markk, string.format('%d', new))
    redis.call('ZREMRANGEBYSCORE', acksk, '-inf', new)
  end
  return found
end
