-- Each job's rollup (stores/rollup.py says what each field means), kept by
-- the scripts that write the ledger: flush (ledger.lua) applies the events a
-- script wrote to their jobs' rollups, in the same script. Three hashes, one
-- field per job: the summary (JSON), the window's completed durations
-- ascending (a JSON array, read only by those who want them) and the window's
-- entries [start, end, outcome, flagged], oldest ending first.
-- Numbers are written with 17 significant digits: cjson would keep 14.
local ROLLUPS = false  -- the script sets {summary, durations, window}

local ROLLUP_RUNS, ROLLUP_SKIPS, ROLLUP_ATTEMPTS = 50, 50, 16
local COMPLETED = {succeeded = true, failed = true, timed_out = true}
local BAD = {failed = true, lease_lost = true, timed_out = true, abandoned = true, interrupted = true}
local TERMINAL = {succeeded = true, failed = true, lease_lost = true, replaced = true, timed_out = true,
  abandoned = true, interrupted = true, stopped = true}

local function num(x)
  if x == nil then return 'null' end
  return string.format('%.17g', x)
end

local function nums(a)
  local p = {}
  for i, v in ipairs(a) do p[i] = num(v) end
  return '[' .. table.concat(p, ',') .. ']'
end

local function counts(t)
  local p = {}
  for k, v in pairs(t) do p[#p + 1] = cjson.encode(k) .. ':' .. string.format('%d', v) end
  return '{' .. table.concat(p, ',') .. '}'
end

local function attempts_json(a)
  local p = {}
  for i, x in ipairs(a) do p[i] = '[' .. num(x[1]) .. ',' .. num(x[2]) .. ']' end
  return '[' .. table.concat(p, ',') .. ']'
end

local function no_nulls(t)
  for k, v in pairs(t) do if v == cjson.null then t[k] = nil end end
  return t
end

local function rollup_quantile(d, q)
  local h = (#d - 1) * q
  local lo = math.floor(h)
  local hi = math.min(lo + 1, #d - 1)
  return d[lo + 1] + (d[hi + 1] - d[lo + 1]) * (h - lo)
end

local LOADED = {}

local function rollup_of(job)
  local r = LOADED[job]
  if r then return r end
  local raw = redis.call('HGET', ROLLUPS[1], job)
  if raw then
    r = no_nulls(cjson.decode(raw))
    for _, a in ipairs(r.attempts) do if a[2] == cjson.null then a[2] = nil end end
    -- Their text as stored, written back as it was while they do not change
    -- (an end changes neither): not printed again, number by number.
    r.skip_times_json = string.match(raw, '"skip_times":(%b[])')
    r.attempts_json = string.match(raw, '"attempts":(%b[])')
    r.window_json = redis.call('HGET', ROLLUPS[3], job) or '[]'
    r.window = cjson.decode(r.window_json)
    r.durations = cjson.decode(redis.call('HGET', ROLLUPS[2], job) or '[]')
  else
    r = {stale = false, ended = 0, outcomes = {}, completed = 0, duration_sum = 0, bad_in_a_row = 0,
      good_in_a_row = 0, skips = 0, skips_in_a_row = 0, skip_times = {}, w_outcomes = {}, window = {},
      window_json = '[]', durations = {}, attempts = {}}
  end
  LOADED[job] = r
  return r
end

-- An attempt: [time, slot or nil]; the latest ROLLUP_ATTEMPTS are kept.
local function rollup_attempt(r, at, slot)
  local a = r.attempts
  r.attempts_json = nil
  if #a >= ROLLUP_ATTEMPTS then table.remove(a, 1) end
  a[#a + 1] = {at, slot}
end

local function rollup_start(r, at)
  if r.last_start == nil or at >= r.last_start then
    local n = 0
    for _, t in ipairs(r.skip_times) do if t >= at then n = n + 1 end end
    r.skips_in_a_row, r.last_start = n, at
  end
end

local function rollup_refusal(r, kind, at)
  if kind == 'overlap' then
    r.last_overlap = math.max(r.last_overlap or at, at)
    return
  end
  r.last_refusal = math.max(r.last_refusal or at, at)
  if kind == 'skipped' then
    r.skips = r.skips + 1
    if r.last_start == nil or at >= r.last_start then r.skips_in_a_row = r.skips_in_a_row + 1 end
    local times = r.skip_times
    r.skip_times_json = nil
    times[#times + 1] = at
    if #times > ROLLUP_SKIPS then table.remove(times, 1) end
  end
end

-- The place in ascending d of the first value not below v.
local function rank(d, v)
  local lo, hi = 1, #d + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if d[mid] < v then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- A run ends: the lifetime counters, then the window's statistics from the
-- entry that comes in and, in a full window, the oldest-ending entry x that
-- goes out, not recomputed over the window. The stored window (JSON) loses
-- x's text and gains the new entry's; the other 49 are not encoded again.
local function rollup_end(r, job, outcome, started, ended, key)
  r.ended = r.ended + 1
  r.outcomes[outcome] = (r.outcomes[outcome] or 0) + 1
  if COMPLETED[outcome] then
    r.completed = r.completed + 1
    r.duration_sum = r.duration_sum + (ended - started)
  end
  if outcome == 'succeeded' then
    r.last_success = math.max(r.last_success or ended, ended)
    r.bad_in_a_row, r.good_in_a_row = 0, r.good_in_a_row + 1
  elseif BAD[outcome] then
    r.bad_in_a_row, r.good_in_a_row = r.bad_in_a_row + 1, 0
  end
  local w, d = r.window, r.durations
  local x = nil
  if #w >= ROLLUP_RUNS then  -- the oldest makes room
    x = table.remove(w, 1)
    local close = string.find(r.window_json, ']', 3, true)  -- x's own: entries hold no brackets
    r.window_json = '[' .. string.sub(r.window_json, close + 2)
  end
  local flagged = (outcome == 'abandoned' or key ~= job) and 1 or 0
  for _, e in ipairs(w) do if e[2] > started then flagged = 1 break end end
  w[#w + 1] = {started, ended, outcome, flagged}
  local text = '[' .. num(started) .. ',' .. num(ended) .. ',"' .. outcome .. '",' .. num(flagged) .. ']'
  r.window_json = #w == 1 and '[' .. text .. ']' or string.sub(r.window_json, 1, -2) .. ',' .. text .. ']'
  local outs = r.w_outcomes
  outs[outcome] = (outs[outcome] or 0) + 1
  if COMPLETED[outcome] then table.insert(d, rank(d, ended - started), ended - started) end
  r.w_flagged = (r.w_flagged or 0) + flagged
  if x then
    outs[x[3]] = outs[x[3]] - 1
    if outs[x[3]] == 0 then outs[x[3]] = nil end
    if COMPLETED[x[3]] then table.remove(d, rank(d, x[2] - x[1])) end
    r.w_flagged = r.w_flagged - x[4]
  end
  -- The earliest start and the latest success leave with x only if x had them.
  if x == nil or x[1] > r.w_oldest then
    r.w_oldest = math.min(r.w_oldest or started, started)
  else
    local oldest = started
    for _, e in ipairs(w) do oldest = math.min(oldest, e[1]) end
    r.w_oldest = oldest
  end
  if x == nil or x[3] ~= 'succeeded' or x[2] < r.w_last_success then
    if outcome == 'succeeded' then r.w_last_success = math.max(r.w_last_success or ended, ended) end
  else
    local last_ok = nil
    for _, e in ipairs(w) do
      if e[3] == 'succeeded' then last_ok = math.max(last_ok or e[2], e[2]) end
    end
    r.w_last_success = last_ok
  end
  r.w_runs, r.w_completed, r.changed_window = #w, #d, true
  if #d > 0 then
    r.p50, r.p95, r.w_max = rollup_quantile(d, 0.5), rollup_quantile(d, 0.95), d[#d]
  else
    r.p50, r.p95, r.w_max = nil, nil, nil
  end
end

-- Apply flush's events (ledger.lua's EVENTS) and write the rollups they changed.
local function rollup_apply(events)
  if not ROLLUPS then return end
  local touched = false
  for _, e in ipairs(events) do
    local kind, job, at, ends = e[3], e[4], tonumber(e[6]), e[10]
    if kind == 'started' then
      local r = rollup_of(job)
      rollup_start(r, at)
      rollup_attempt(r, at, tonumber(string.match(e[8], '"slot":([^,}]+)')))
      touched = true
    elseif kind == 'skipped' or kind == 'queued' or kind == 'queue_full' or kind == 'overlap' then
      local r = rollup_of(job)
      rollup_refusal(r, kind, at)
      if kind ~= 'queued' and kind ~= 'overlap' then rollup_attempt(r, at, nil) end
      touched = true
    elseif TERMINAL[kind] and ends then
      rollup_end(rollup_of(job), job, kind, tonumber(ends[1]), at, ends[2]); touched = true
    end
  end
  if not touched then return end
  local summaries, durations, windows = {}, {}, {}
  for job, r in pairs(LOADED) do
    summaries[#summaries + 1] = job
    summaries[#summaries + 1] = '{"stale":' .. (r.stale and 'true' or 'false') .. ',"ended":' .. num(r.ended)
      .. ',"outcomes":' .. counts(r.outcomes) .. ',"completed":' .. num(r.completed)
      .. ',"duration_sum":' .. num(r.duration_sum) .. ',"last_start":' .. num(r.last_start)
      .. ',"last_success":' .. num(r.last_success) .. ',"bad_in_a_row":' .. num(r.bad_in_a_row)
      .. ',"good_in_a_row":' .. num(r.good_in_a_row) .. ',"skips":' .. num(r.skips)
      .. ',"skips_in_a_row":' .. num(r.skips_in_a_row) .. ',"last_refusal":' .. num(r.last_refusal)
      .. ',"last_overlap":' .. num(r.last_overlap) .. ',"skip_times":' .. (r.skip_times_json or nums(r.skip_times))
      .. ',"w_runs":' .. num(r.w_runs or 0) .. ',"w_oldest":' .. num(r.w_oldest)
      .. ',"w_flagged":' .. num(r.w_flagged or 0) .. ',"w_completed":' .. num(r.w_completed or 0)
      .. ',"w_outcomes":' .. counts(r.w_outcomes) .. ',"p50":' .. num(r.p50) .. ',"p95":' .. num(r.p95)
      .. ',"w_max":' .. num(r.w_max) .. ',"w_last_success":' .. num(r.w_last_success)
      .. ',"attempts":' .. (r.attempts_json or attempts_json(r.attempts)) .. '}'
    if r.changed_window then
      durations[#durations + 1] = job
      durations[#durations + 1] = nums(r.durations)
      windows[#windows + 1] = job
      windows[#windows + 1] = r.window_json
    end
  end
  redis.call('HSET', ROLLUPS[1], unpack(summaries))
  if #durations > 0 then
    redis.call('HSET', ROLLUPS[2], unpack(durations))
    redis.call('HSET', ROLLUPS[3], unpack(windows))
  end
end
