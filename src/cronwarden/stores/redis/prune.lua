-- types: zset hash zset hash hash
-- Retention's step for one job (Store.prune): the job's finished runs that
-- started before the cutoff, and its events before it, oldest first, at
-- most `budget` of each. Never an open run (its record is not in the
-- finished runs hash yet) or an open run's events, never a kind retention
-- keeps. The members follow ledger.lua's layout of the job index.
-- KEYS: 1 the job index, 2 event records, 3 run id index, 4 finished runs,
-- 5 open runs.
-- ARGV: 1 cutoff as ordhex ('' for none), 2 keep_runs (0 for none), 3 budget,
-- 4 the kinds pruned, each between commas (',started,succeeded,'), 5 '1'
-- for a dry run.
-- Returns {runs, events, more}: deleted (or, dry, due) and 1 if the budget
-- ran out with more due.
local index, evk, runk, runsk, openk = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local cutoff, keep, budget, pruned = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local dry = ARGV[5] == '1'

-- keep_runs: the bound is the start of the oldest run kept, if it is later
-- (whichever prunes more, as Retention says).
if keep > 0 then
  local n = redis.call('ZLEXCOUNT', index, '[#|', '(#}')
  if n > keep then
    -- By rank: a LIMIT offset would walk the n - keep runs before it.
    local at = redis.call('ZLEXCOUNT', index, '-', '(#|') + n - keep
    local oldest_kept = redis.call('ZRANGE', index, at, at)[1]
    local hex = string.match(oldest_kept, '^#|(%x+)|')
    if cutoff == '' or hex > cutoff then cutoff = hex end
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

-- The events through each pruned kind's members ('kind|t|seq'), so the
-- kinds kept, however many and old, take no part of the budget (in the
-- '@|' range, a job's oldest findings would fill every step and block the
-- rest). The oldest `budget` of all kinds go.
local due = {}
for kind in string.gmatch(pruned, '[^,]+') do
  local got = redis.call('ZRANGEBYLEX', index, '[' .. kind .. '|', '(' .. kind .. '|' .. cutoff,
    'LIMIT', 0, budget + 1)
  if #got > budget then more = 1; got[#got] = nil end
  for _, m in ipairs(got) do
    local hex, seq = string.match(m, '|(%x+)|(%d+)$')
    due[#due + 1] = {hex .. '|' .. seq, kind, hex, seq, m}
  end
end
table.sort(due, function(a, b) return a[1] < b[1] end)
if #due > budget then more = 1; for i = #due, budget + 1, -1 do due[i] = nil end end
local edrop, seqs, byrun, seen, n_events = {}, {}, {}, {}, 0
if #due > 0 then
  local eseqs = {}
  for i, d in ipairs(due) do eseqs[i] = d[4] end
  local records = redis.call('HMGET', evk, unpack(eseqs))
  for i, d in ipairs(due) do
    local _, kind, hex, seq, m = unpack(d)
    -- The run id as the record holds it (ledger.lua writes "r" as JSON).
    local run = records[i] and cjson.decode(records[i]).r
    if type(run) ~= 'string' then run = '' end
    local open = run ~= '' and redis.call('HEXISTS', openk, run) == 1
    if not open then
      n_events = n_events + 1
      edrop[#edrop + 1] = '@|' .. hex .. '|' .. seq .. '|' .. kind .. '|' .. run
      edrop[#edrop + 1] = m
      seqs[#seqs + 1] = seq
      if run ~= '' then
        byrun[#byrun + 1] = run .. '|' .. seq
        -- A run's link field goes with its oldest event (see add_event).
        if not seen[run] then seen[run] = true; seqs[#seqs + 1] = 'r:' .. run end
      end
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
