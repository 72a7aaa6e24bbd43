-- with: limits, rollup, ledger, outbox
-- types: hash string zset zset set zset zset hash hash string
-- Store.reject: record the rejection (once per event id), acknowledge the
-- event, keep it among the sink's dead letters (at most `keep`: the oldest
-- beyond are dropped) and list the sink among those with dead letters;
-- false for a sink not registered yet.
-- KEYS: 1 event records, 2 the sink's mark, 3 its acknowledged set, 4 its dead letters,
--       5 the sinks with dead letters, 6 the rejection's job index, 7 run id index,
--       8 jobs -> events written, 9 finished runs, 10 the rejection's event id mark
--       (6 to 10 only with a rejection)
-- ARGV: 1 the sink, 2 the event id, 3 keep, 4 the rejection as record.lua's one
--       argument (a JSON array of texts), or '' for none
local mark = redis.call('GET', KEYS[2])
if not mark then return false end
if ARGV[4] ~= '' and redis.call('EXISTS', KEYS[10]) == 0 then
  local a = cjson.decode(ARGV[4])
  local run_id = a[4] ~= '' and a[4] or false
  add_event(KEYS[6], a[1], a[2], a[3], run_id, a[5], a[6], a[7])
  flush(KEYS[1], KEYS[7], KEYS[8], KEYS[9])
  redis.call('SET', KEYS[10], '1', 'PX', a[8])
end
local found = acknowledge(KEYS[1], KEYS[2], KEYS[3], tonumber(mark), {[ARGV[2]] = true})
local seq = found[ARGV[2]]
if seq then
  redis.call('ZADD', KEYS[4], tonumber(seq), seq)
  local n = redis.call('ZCARD', KEYS[4])
  local keep = tonumber(ARGV[3])
  if n > keep then redis.call('ZREMRANGEBYRANK', KEYS[4], 0, n - keep - 1) end
  redis.call('SADD', KEYS[5], ARGV[1])
end
return 1
