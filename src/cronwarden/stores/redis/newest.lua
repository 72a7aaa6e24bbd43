-- Store.latest_events and Store.latest_since (the monitor's reads of every
-- job at once): for each job's index KEYS[i], from the ordhex time ARGV[2 + i]
-- (or "" for all), its newest ARGV[2] members of each kind of ARGV[1]
-- (comma-separated, the index's families), plus every member tied in time with
-- the last one taken (the caller orders ties by seq). One reply per key: the
-- reads are the pipeline's ZREVRANGEBYLEX, run here to spare the client a
-- reply per job and kind.
-- KEYS: job indexes. ARGV: 1 kinds, 2 limit, 3.. each key's low time.
local kinds = {}
for k in string.gmatch(ARGV[1], '[^,]+') do kinds[#kinds + 1] = k end
local limit = tonumber(ARGV[2])
local out = {}
for i, key in ipairs(KEYS) do
  local low = ARGV[2 + i]
  local got = {}
  for _, k in ipairs(kinds) do
    local m = redis.call('ZREVRANGEBYLEX', key, '(' .. k .. '}', '[' .. k .. '|' .. low, 'LIMIT', 0, ARGV[2])
    for _, x in ipairs(m) do got[#got + 1] = x end
    if #m == limit then
      local at = string.match(m[#m], '^[^|]*|([^|]*)|')
      local ties = redis.call('ZRANGEBYLEX', key, '[' .. k .. '|' .. at .. '|', '(' .. k .. '|' .. at .. '}')
      for _, x in ipairs(ties) do got[#got + 1] = x end
    end
  end
  out[i] = got
end
return out
