-- The check every script makes before it writes: each of its KEYS holds
-- nothing yet or the type the store keeps there. Redis does not undo a
-- script's writes when a later command fails, so a key of another type (a
-- key of another program's under the prefix) met half-way would leave half
-- a step written. scripts.py calls it with the types of the script's
-- `-- types:` line; with `cycle`, that list repeats over the KEYS.
-- Returns the one-line refusal, or nil.
local function wrong_type(types, cycle)
  local n = #types
  for i = 1, #KEYS do
    local want = types[i]
    if cycle then want = types[(i - 1) % n + 1] end
    if want then
      local held = redis.call('TYPE', KEYS[i])['ok']
      if held ~= 'none' and held ~= want then
        return 'the key ' .. KEYS[i] .. ' holds a ' .. held .. ' where the store keeps a ' .. want ..
          ': another program writes under this prefix; give the store a prefix of its own (?prefix=NAME:)'
      end
    end
  end
  return nil
end
