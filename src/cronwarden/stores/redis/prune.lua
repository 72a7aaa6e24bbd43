-- types: zset hash zset hash hash
-- Retention's step for one job (Store.prune): the job's finished runs that
-- started before the cutoff, and its events before it, oldest first, at
-- most `budget` of each. Never an open run (its record is not in the
-- finished runs hash yet) or an open run's events, never a kind retention
-- keeps. The members follow ledger.lua's layout of the job index.
-- KEYS: 1 the job index, 2 event records, 3 run id index, 4 finished runs,
-- 5 open runs.
-- ARGV: 1 cutoff as ordhex ('' for none), 2 keep_runs (0 for none), 3 budget,
-- 4 the kinds kept, each between commas (',stuck,slow,'), 5 '1' for a dry run.
-- Returns {runs, events, more}: deleted (or, dry, due) and 1 if the budget
-- ran out with more due.
local index, evk, runk, runsk, openk = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local cutoff, keep, budget, kept = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local dry = ARGV[5] == '1'

-- keep_runs: the bound is the start of the oldest run kept, if it is older.
if keep > 0 then
  local n = redis.call('ZLEXCOUNT', index, '[#|', '(#}')
  if n > keep then
    local oldest_kept = redis.call('ZRANGEBYLEX', index, '[#|', '(#}', 'LIMIT', n - keep, 1)[1]
    local hex = string.match(oldest_kept, '^#|(%x+)|')
    if cutoff == '' or hex < cutoff then cutoff = hex end
  end
end
if cutoff == '' then return {0, 0, 0} end

local more = 0
local runs = redis.call('ZRANGEBYLEX', index, '[#|', '(#|' .. cutoff, 'LIMIT', 0, budget + 1)
if #runs > budget then more = 1; runs[#runs] = nil end
local ids = {}
for i, m in ipairs(runs) do ids[i] = string.match(m, '^#|%x+|(.*)$') end
local drop, fields = {}, {}
if #ids > 0 then
  local done = redis.call('HMGET', runsk, unpack(ids))
  for i, id in ipairs(ids) do
    if done[i] then
      drop[#drop + 1] = runs[i]
      fields[#fields + 1] = id
    end
  end
end

local events = redis.call('ZRANGEBYLEX', index, '[@|', '(@|' .. cutoff, 'LIMIT', 0, budget + 1)
if #events > budget then more = 1; events[#events] = nil end
local edrop, seqs, byrun, seen, n_events = {}, {}, {}, {}, 0
for _, m in ipairs(events) do
  local hex, seq, kind, run = string.match(m, '^@|(%x+)|(%d+)|([^|]*)|(.*)$')
  local open = run ~= '' and redis.call('HEXISTS', openk, run) == 1
  if not open and not string.find(kept, ',' .. kind .. ',', 1, true) then
    n_events = n_events + 1
    edrop[#edrop + 1] = m
    edrop[#edrop + 1] = kind .. '|' .. hex .. '|' .. seq
    seqs[#seqs + 1] = seq
    if run ~= '' then
      byrun[#byrun + 1] = run .. '|' .. seq
      -- A run's link field goes with its oldest event (see add_event).
      if not seen[run] then seen[run] = true; seqs[#seqs + 1] = 'r:' .. run end
    end
  end
end

if not dry then
  if #drop > 0 then
    redis.call('ZREM', index, unpack(drop))
    redis.call('HDEL', runsk, unpack(fields))
  end
  if #edrop > 0 then
    redis.call('ZREM', index, unpack(edrop))
    redis.call('HDEL', evk, unpack(seqs))
    if #byrun > 0 then redis.call('ZREM', runk, unpack(byrun)) end
  end
end
return {#drop, n_events, more}
